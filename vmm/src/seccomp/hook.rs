//! The seccomp tests' hook: in debug builds, a thread that just installed
//! its filter makes the call a test names (`tests/seccomp.rs`).

use super::{kind_name, ThreadKind};

/// Debug builds only: when `STAGEVM_TEST_SYSCALL` names the thread kind
/// (`vcpu`, `stage-sched`, `io-blk`, `io-net`, `vmm-main`, `api`), the thread makes a
/// syscall outside its seccomp filter (`getppid`) right after installing
/// it, so tests can check that the filter ends the VMM; with `<kind>-ioctl`
/// (`api-ioctl`, `vcpu-ioctl`, …) it makes an `ioctl` its filter refuses
/// (`FIONREAD` on stderr: harmless, and not one of a vCPU's KVM requests);
/// with `<kind>-renice-parent` it calls `setpriority(PRIO_PROCESS,
/// parent, 19)` (`parent`: the VMM's parent pid, read before the filter) and with `<kind>-renice-user` `setpriority(PRIO_USER, 0,
/// 19)` (issue 50, S2: both SIGSYS, on every thread);
/// with `<kind>-open-etc` it opens `/etc/passwd` for reading and
/// prints the outcome (Landlock's refusal, [`crate::sandbox`]);
/// with `<kind>-openat` the thread tries to open the file glibc's malloc
/// opens and prints the outcome; with `<kind>-openat-write` it tries to
/// open `/proc/self/comm` for appending.
pub(super) fn test_forbidden_syscall_hook(kind: ThreadKind, parent: u32) {
    let name = std::str::from_utf8(kind_name(kind)).unwrap_or("?");
    if !cfg!(debug_assertions) {
        return;
    }
    let test = std::env::var("STAGEVM_TEST_SYSCALL").unwrap_or_default();
    if test == name {
        // SAFETY: getppid(2) has no arguments and touches no memory.
        unsafe { libc::getppid() };
    }
    if test.strip_suffix("-ioctl") == Some(name) {
        let mut pending: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, to `pending`, which lives for
        // the call; on a descriptor that is not a socket, pipe or tty it
        // fails with ENOTTY and changes nothing.
        let r = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::FIONREAD, &mut pending) };
        eprintln!("stagevm: test hook: ioctl in {name} returned {r}");
    }
    if test.strip_suffix("-renice-parent") == Some(name) {
        // Another process's nice: SIGSYS.
        // SAFETY: setpriority reads no memory of ours.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, parent, 19) };
        eprintln!("stagevm: test hook: setpriority of the parent in {name} returned {r}");
    }
    if test.strip_suffix("-renice-user") == Some(name) {
        // Every process of this user: SIGSYS.
        // SAFETY: setpriority reads no memory of ours.
        let r = unsafe { libc::setpriority(libc::PRIO_USER, 0, 19) };
        eprintln!("stagevm: test hook: setpriority of the user in {name} returned {r}");
    }
    if test.strip_suffix("-open-etc") == Some(name) {
        // A file outside what Landlock leaves the VMM.
        let r = std::fs::File::open("/etc/passwd");
        let outcome = r.map_or_else(|e| e.to_string(), |_| "opened".into());
        eprintln!("stagevm: test hook: open /etc/passwd in {name}: {outcome}");
    }
    if test.strip_suffix("-openat") == Some(name) {
        // What glibc's malloc meets: openat fails, the thread goes on.
        let r = std::fs::File::open("/proc/sys/vm/overcommit_memory");
        let outcome = r.map_or_else(|e| e.to_string(), |_| "opened".into());
        eprintln!("stagevm: test hook: openat in {name}: {outcome}");
    }
    if test.strip_suffix("-openat-write") == Some(name) {
        // Opening for writing (without creating): refused in every thread.
        let r = std::fs::OpenOptions::new()
            .append(true)
            .open("/proc/self/comm");
        let outcome = r.map_or_else(|e| e.to_string(), |_| "opened".into());
        eprintln!("stagevm: test hook: openat for writing in {name}: {outcome}");
    }
}
