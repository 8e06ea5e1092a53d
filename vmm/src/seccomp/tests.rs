//! The filters against what the threads use, and a forbidden call ending
//! a process with the seccomp message.

use super::*;

const KINDS: [ThreadKind; 8] = [
    ThreadKind::Vcpu,
    ThreadKind::StageSched,
    ThreadKind::IoBlk,
    ThreadKind::IoNet,
    ThreadKind::Main,
    ThreadKind::Api,
    ThreadKind::SerialIn,
    ThreadKind::SerialOut,
];

#[test]
fn every_thread_kind_has_a_filter_and_modes_parse() {
    for kind in KINDS {
        assert!(program(kind, SeccompMode::Trap, &[]).unwrap().is_some());
        assert!(program(kind, SeccompMode::Off, &[7]).unwrap().is_none());
        let numbers: Vec<i64> = allowed(kind).iter().map(|s| s.0).collect();
        assert!(!numbers.contains(&libc::SYS_execve));
        // No entry twice (in its own list or the common one).
        let mut unique = numbers.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), numbers.len(), "{kind:?}: {numbers:?}");
        // `ioctl` is allowed with its requests or not at all (an empty
        // rule list would allow every request).
        assert_eq!(
            numbers.contains(&libc::SYS_ioctl),
            !allowed_ioctls(kind).is_empty(),
            "{kind:?}"
        );
        let names = allowed_syscalls(kind);
        assert!(names.contains(&"fcntl") && names.contains(&"exit_group"));
        // `openat` passes the first filter; only stage-sched's succeeds.
        assert!(names.contains(&"openat"));
        // The deny filter: every openat, or (stage-sched) one that writes.
        let deny = denied(kind).unwrap();
        let conditional = !deny[&libc::SYS_openat].is_empty();
        assert_eq!(conditional, kind == ThreadKind::StageSched, "{kind:?}");
        assert!(deny_program(kind).is_ok());
    }
    assert!(!allowed_syscalls(ThreadKind::Api).contains(&"ioctl"));
    // vmm-main: only the terminal's settings (`--serial tty` restored).
    let main: Vec<&str> = allowed_ioctls(ThreadKind::Main)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(main, ["TCSETS", "TCGETS"]);
    assert!(matches!("log".parse(), Ok(SeccompMode::Log)));
    assert!(matches!("yes".parse::<SeccompMode>(), Err(SeccompError::BadMode(s)) if s == "yes"));
    assert!("yes"
        .parse::<SeccompMode>()
        .unwrap_err()
        .to_string()
        .contains("'yes'"));
}

#[test]
fn vcpu_ioctl_numbers_are_the_kernels() {
    // From <linux/kvm.h> (x86-64).
    let expected = [
        ("KVM_RUN", 0xae80),
        ("KVM_GET_REGS", 0x8090_ae81),
        ("KVM_SET_REGS", 0x4090_ae82),
        ("KVM_GET_SREGS", 0x8138_ae83),
        ("KVM_GET_FPU", 0x81a0_ae8c),
        ("KVM_GET_MP_STATE", 0x8004_ae98),
        ("KVM_GET_VCPU_EVENTS", 0x8040_ae9f),
        ("KVM_SET_VCPU_EVENTS", 0x4040_aea0),
    ];
    assert_eq!(allowed_ioctls(ThreadKind::Vcpu), &expected[..]);
}

/// Runs `call` in a forked child under `kind`'s filter (SIGSYS without
/// a handler: the child dies of it) and returns the child's wait status.
fn under_filter(kind: ThreadKind, call: fn() -> i32) -> i32 {
    under_filter_with(kind, &[], call)
}

/// [`under_filter`] with the vCPU thread ids `renice` for `stage-sched`'s
/// priority rules.
fn under_filter_with(kind: ThreadKind, renice: &[i32], call: fn() -> i32) -> i32 {
    let prog = program(kind, SeccompMode::Trap, renice).unwrap().unwrap();
    // SAFETY: the child makes only async-signal-safe calls (prctl,
    // seccomp, the call under test, _exit) and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = match seccompiler::apply_filter(&prog) {
            Ok(()) => call(),
            Err(_) => 100,
        };
        // SAFETY: _exit(2) ends the child without running anything else.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child; `status` outlives the call.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

#[test]
fn the_vcpu_filter_checks_the_ioctl_request() {
    // KVM_RUN on a closed descriptor: allowed, fails with EBADF.
    let run = under_filter(ThreadKind::Vcpu, || {
        // SAFETY: an ioctl on descriptor -1 touches no memory.
        let r = unsafe { libc::ioctl(-1, 0xae80, 0) };
        i32::from(r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF))
    });
    assert!(
        libc::WIFEXITED(run) && libc::WEXITSTATUS(run) == 1,
        "status {run:#x}"
    );
    // Any other request: SIGSYS.
    let other = under_filter(ThreadKind::Vcpu, || {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, to `n`.
        unsafe { libc::ioctl(libc::STDERR_FILENO, libc::FIONREAD, &mut n) };
        0
    });
    assert!(
        libc::WIFSIGNALED(other) && libc::WTERMSIG(other) == libc::SIGSYS,
        "status {other:#x}"
    );
    // No ioctl at all in the api thread.
    let api = under_filter(ThreadKind::Api, || {
        // SAFETY: as above.
        unsafe { libc::ioctl(-1, 0xae80, 0) };
        0
    });
    assert!(libc::WIFSIGNALED(api) && libc::WTERMSIG(api) == libc::SIGSYS);
}

/// A thread id no process has (above the kernel's `pid_max` limit of
/// 2^22), so a `getpriority` on it that the filter lets through fails with
/// `ESRCH` and touches no one.
const NO_THREAD: i32 = (1 << 22) + 7;

#[test]
fn stage_sched_reads_and_sets_the_nice_of_the_vcpu_threads_only() {
    let sigsys = |s: i32| libc::WIFSIGNALED(s) && libc::WTERMSIG(s) == libc::SIGSYS;
    // One of the listed threads, PRIO_PROCESS: allowed (no such thread).
    let listed = under_filter_with(ThreadKind::StageSched, &[NO_THREAD], || {
        // SAFETY: getpriority reads no memory of ours.
        let r = unsafe { libc::getpriority(libc::PRIO_PROCESS, NO_THREAD as libc::id_t) };
        i32::from(r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
    });
    assert!(
        libc::WIFEXITED(listed) && libc::WEXITSTATUS(listed) == 1,
        "status {listed:#x}"
    );
    // Another process (the parent), a whole user, a thread not listed: SIGSYS.
    let parent = under_filter_with(ThreadKind::StageSched, &[NO_THREAD], || {
        // SAFETY: setpriority reads no memory of ours; the filter stops it.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::getppid() as libc::id_t, 19) };
        0
    });
    assert!(sigsys(parent), "status {parent:#x}");
    let user = under_filter_with(ThreadKind::StageSched, &[NO_THREAD], || {
        // SAFETY: as above.
        unsafe { libc::setpriority(libc::PRIO_USER, 0, 19) };
        0
    });
    assert!(sigsys(user), "status {user:#x}");
    let unlisted = under_filter_with(ThreadKind::StageSched, &[NO_THREAD], || {
        // SAFETY: as above.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, (NO_THREAD + 1) as libc::id_t) };
        0
    });
    assert!(sigsys(unlisted), "status {unlisted:#x}");
    // No vCPU thread listed: no priority call at all (an empty rule list
    // would have allowed every argument).
    let none = under_filter_with(ThreadKind::StageSched, &[], || {
        // SAFETY: as above.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, NO_THREAD as libc::id_t) };
        0
    });
    assert!(sigsys(none), "status {none:#x}");
}

/// SECURITY.md's seccomp table agrees with the filters (issue 50, S9): per
/// row, the syscall names in backticks (`name` or `name(…)`) are exactly
/// the common set (with `fcntl`) or, common ones aside, that thread kind's
/// own list.
#[test]
fn the_security_md_table_lists_what_the_filters_allow() {
    let doc = include_str!("../../../SECURITY.md");
    let rows: Vec<(&str, ThreadKind)> = vec![
        ("`vcpu<N>`", ThreadKind::Vcpu),
        ("`stage-sched`", ThreadKind::StageSched),
        ("`io-blk<N>`", ThreadKind::IoBlk),
        ("`io-net<N>`", ThreadKind::IoNet),
        ("`serial-in`", ThreadKind::SerialIn),
        ("`serial-out`", ThreadKind::SerialOut),
        ("`vmm-main`", ThreadKind::Main),
        ("`api`", ThreadKind::Api),
    ];
    let names_in = |row: &str| -> std::collections::BTreeSet<String> {
        row.split('`')
            .skip(1)
            .step_by(2)
            .map(|span| span.split('(').next().unwrap_or_default().to_string())
            .filter(|n| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            })
            .collect()
    };
    let row_of = |head: &str| -> &str {
        let line = doc
            .lines()
            .find(|l| l.starts_with(&format!("| {head} |")))
            .unwrap_or_else(|| panic!("SECURITY.md has no seccomp table row for {head}"));
        // The second cell: what the thread may call.
        line.split(" | ").nth(1).unwrap_or_default()
    };
    let mut common: std::collections::BTreeSet<String> =
        COMMON.iter().map(|s| s.name().to_string()).collect();
    common.insert("fcntl".into());
    assert_eq!(names_in(row_of("common")), common, "the common row");
    for (head, kind) in rows {
        // (`fcntl` beyond F_GETFD, serial-in's, is a common name.)
        let own: std::collections::BTreeSet<String> =
            own(kind).iter().map(|s| s.name().to_string()).collect();
        // A row may name a common call where it says how the thread uses it.
        let named: std::collections::BTreeSet<String> = names_in(row_of(head))
            .difference(&common)
            .cloned()
            .collect();
        assert_eq!(named, own, "the row of {head} ({kind:?})");
    }
}
