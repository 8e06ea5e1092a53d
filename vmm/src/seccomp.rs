//! seccomp filters, one per thread kind, built with `seccompiler` (the
//! rust-vmm crate Firecracker and Cloud Hypervisor use) and installed by
//! each thread before it touches guest data (after its own set-up: pinning,
//! creating its descriptors).
//!
//! A syscall outside a thread's list raises SIGSYS (`--seccomp true`, the
//! default): the handler writes the syscall number to stderr and ends the
//! VMM with status 2. `--seccomp log` lets it through and has the kernel log
//! it; `--seccomp false` installs nothing. The lists (x86-64):
//!
//! * every thread — memory (`mmap`, `munmap`, `mremap`, `madvise`, `brk`,
//!   `mprotect`), `futex`, `sched_yield`, `clock_gettime`, `nanosleep`,
//!   `clock_nanosleep`, `getrandom` (hash-map keys), `write`/`writev`
//!   (stderr, logs), `rt_sigreturn`, `rt_sigprocmask`, `sigaltstack`,
//!   `exit`, `exit_group`, `gettid`, `getpid`, `close` (a thread's own
//!   descriptors when it ends), and `fcntl(fd, F_GETFD)` (the
//!   standard library's debug-build check of a descriptor it closes);
//! * `vcpu` — `ioctl` (KVM_RUN and the register ioctls of failure reports
//!   and emulation assists), `read` (serial input is not used; kept for
//!   eventfds), `sched_getaffinity`/`sched_setaffinity` (the REGISTER path
//!   applies the first plan's pins);
//! * `stage-sched` — `epoll_wait`/`epoll_pwait`, `read` (timerfd, eventfd),
//!   `openat`, `getdents64`, `close`, `newfstatat`, `fstat`, `statx`,
//!   `lseek`, `fcntl` (adopting threads from `/proc/self/task`),
//!   `sched_getaffinity`/`sched_setaffinity` (pins);
//! * `io-blk` — `epoll_create1`, `epoll_ctl`, `epoll_wait`/`epoll_pwait`, `read` (eventfd), `pread64`,
//!   `pwrite64`, `fdatasync`, `fsync`;
//! * `api` (with `--api-socket`; after its tokio runtime and listener
//!   exist) — `epoll_ctl`, `epoll_wait`/`epoll_pwait`, `accept4`, `read`,
//!   `recvfrom`, `sendto`, `shutdown` (the connections), `ioctl` (`FIONBIO`
//!   on an accepted socket); `openat` fails with `EACCES` (a second filter;
//!   glibc's malloc tries to read `/proc/sys/vm/overcommit_memory` once);
//! * `vmm-main` (installed once every thread runs, before it waits for the
//!   exit) — `epoll_create1`, `epoll_ctl`, `epoll_wait`/`epoll_pwait`, `read` (signalfd), `tgkill` (the
//!   vCPU kick), `close`, `fsync`, `ioctl` (dropping KVM objects),
//!   `sched_getaffinity`, `openat`, `getdents64`, `newfstatat`, `fstat`,
//!   `statx`, `lseek`, `fcntl`, `unlink` (removing the `--api-socket`
//!   path once the VM ended).
//!
//! KVM's own worker thread (`kvm-nx-lpage-recovery`) is a kernel thread:
//! no filter applies to it.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// `--seccomp`: what a syscall outside a thread's list does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// SIGSYS: the VMM ends with status 2, naming the syscall (default).
    Trap,
    /// Allowed, and logged by the kernel (audit log).
    Log,
    /// No filter.
    Off,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "true" => Ok(Self::Trap),
            "log" => Ok(Self::Log),
            "false" => Ok(Self::Off),
            _ => Err(format!("'{s}': expected true, false or log")),
        }
    }
}

/// The kinds of VMM thread, each with its own filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// `vcpu<N>`.
    Vcpu,
    /// `stage-sched`.
    StageSched,
    /// `io-blk<N>`.
    IoBlk,
    /// `vmm-main`, once every other thread runs.
    Main,
    /// `api`, the operator API's server (`--api-socket`).
    Api,
}

const COMMON: &[i64] = &[
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mprotect,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_getrandom,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_close,
];

const PROC_READ: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_getdents64,
    libc::SYS_close,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_fcntl,
    libc::SYS_read,
];

fn allowed(kind: ThreadKind) -> Vec<i64> {
    let own: &[i64] = match kind {
        ThreadKind::Vcpu => &[
            libc::SYS_ioctl,
            libc::SYS_read,
            libc::SYS_sched_getaffinity,
            libc::SYS_sched_setaffinity,
        ],
        ThreadKind::StageSched => &[
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            // The loop's timer follows the rings' need for draining.
            libc::SYS_timerfd_settime,
            libc::SYS_sched_getaffinity,
            libc::SYS_sched_setaffinity,
        ],
        ThreadKind::IoBlk => &[
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_read,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_fdatasync,
            libc::SYS_fsync,
        ],
        ThreadKind::Main => &[
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_tgkill,
            libc::SYS_fsync,
            libc::SYS_ioctl,
            libc::SYS_sched_getaffinity,
            libc::SYS_unlink,
        ],
        ThreadKind::Api => &[
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_accept4,
            libc::SYS_read,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_shutdown,
            libc::SYS_ioctl,
            // Passed by this filter and refused by `DENIED` (EACCES).
            libc::SYS_openat,
        ],
    };
    let proc_read: &[i64] = match kind {
        ThreadKind::StageSched | ThreadKind::Main => PROC_READ,
        ThreadKind::Vcpu | ThreadKind::IoBlk | ThreadKind::Api => &[],
    };
    COMMON.iter().chain(own).chain(proc_read).copied().collect()
}

/// The BPF program of `kind` under `mode` (`None` for [`SeccompMode::Off`]).
/// Errors: seccompiler refused the filter (a bug, reported as text).
pub fn program(kind: ThreadKind, mode: SeccompMode) -> Result<Option<BpfProgram>, String> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Trap => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed(kind)
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    // Rust's standard library checks, in debug builds, that a descriptor it
    // closes is open (`fcntl(fd, F_GETFD)`): allow that form everywhere.
    if let std::collections::btree_map::Entry::Vacant(slot) = rules.entry(libc::SYS_fcntl) {
        let getfd = SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::F_GETFD as u64,
        )
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(|e| format!("seccomp rule for {kind:?}: {e}"))?;
        slot.insert(vec![getfd]);
    }
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|e| format!("seccomp filter for {kind:?}: {e}"))?;
    filter
        .try_into()
        .map(Some)
        .map_err(|e: seccompiler::BackendError| format!("seccomp filter for {kind:?}: {e}"))
}

/// Syscalls a thread kind may make that fail with `EACCES` instead of
/// ending the VMM: `openat` in `api`, because glibc's malloc opens
/// `/proc/sys/vm/overcommit_memory` once, the first time it shrinks a
/// thread's heap (after a burst of connections), and goes on without it when
/// the open fails.
fn denied(kind: ThreadKind) -> &'static [i64] {
    match kind {
        ThreadKind::Api => &[libc::SYS_openat],
        _ => &[],
    }
}

/// A second filter that answers [`denied`]'s syscalls with `EACCES`
/// (seccomp takes the strictest action of all installed filters: the first
/// filter's Allow loses to this Errno).
fn deny_program(kind: ThreadKind) -> Result<Option<BpfProgram>, String> {
    if denied(kind).is_empty() {
        return Ok(None);
    }
    let rules = denied(kind).iter().map(|nr| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp deny filter for {kind:?}: {e}"))?;
    filter
        .try_into()
        .map(Some)
        .map_err(|e: seccompiler::BackendError| format!("seccomp deny filter for {kind:?}: {e}"))
}

/// Installs the filter of `kind` on the calling thread (no-op for
/// [`SeccompMode::Off`]). Errors: the filter cannot be built or applied.
pub fn install(kind: ThreadKind, mode: SeccompMode) -> Result<(), String> {
    KIND.with(|k| k.set(kind_name(kind)));
    if let Some(prog) = program(kind, mode)? {
        // The deny filter first: the main one forbids the `prctl` and
        // `seccomp` calls that installing a filter makes.
        if let Some(deny) = deny_program(kind)? {
            seccompiler::apply_filter(&deny)
                .map_err(|e| format!("installing the seccomp filter for {kind:?}: {e}"))?;
        }
        seccompiler::apply_filter(&prog)
            .map_err(|e| format!("installing the seccomp filter for {kind:?}: {e}"))?;
    }
    test_forbidden_syscall_hook(kind);
    Ok(())
}

/// Debug builds only: when `STAGEVM_TEST_SYSCALL` names the thread kind
/// (`vcpu`, `stage-sched`, `io-blk`, `vmm-main`, `api`), the thread makes a
/// syscall outside its seccomp filter (`getppid`) right after installing
/// it, so tests can check that the filter ends the VMM; with `api-openat`
/// the `api` thread tries to open a file and prints the outcome.
fn test_forbidden_syscall_hook(kind: ThreadKind) {
    let name = std::str::from_utf8(kind_name(kind)).unwrap_or("?");
    if !cfg!(debug_assertions) {
        return;
    }
    let test = std::env::var("STAGEVM_TEST_SYSCALL").unwrap_or_default();
    if test == name {
        // SAFETY: getppid(2) has no arguments and touches no memory.
        unsafe { libc::getppid() };
    }
    if test == "api-openat" && kind == ThreadKind::Api {
        // What glibc's malloc meets: openat fails, the thread goes on.
        let r = std::fs::File::open("/proc/sys/vm/overcommit_memory");
        let outcome = r.map_or_else(|e| e.to_string(), |_| "opened".into());
        eprintln!("stagevm: test hook: openat in api: {outcome}");
    }
}

thread_local! {
    /// The filtered thread's kind, for the SIGSYS message (const-initialised:
    /// no allocation, readable from the handler).
    static KIND: std::cell::Cell<&'static [u8]> = const { std::cell::Cell::new(b"?") };
}

fn kind_name(kind: ThreadKind) -> &'static [u8] {
    match kind {
        ThreadKind::Vcpu => b"vcpu",
        ThreadKind::StageSched => b"stage-sched",
        ThreadKind::IoBlk => b"io-blk",
        ThreadKind::Main => b"vmm-main",
        ThreadKind::Api => b"api",
    }
}

extern "C" fn sigsys_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // siginfo for SIGSYS (x86-64): the syscall number is the int at byte 24
    // (`_sifields._sigsys._syscall`, after `_call_addr`).
    // SAFETY: the kernel passes a valid siginfo_t for this SIGSYS; the read
    // stays inside it (siginfo_t is 128 bytes).
    let nr = unsafe { info.cast::<u8>().add(24).cast::<i32>().read_unaligned() };
    let mut number = [b'0'; 10];
    let mut n = i64::from(nr).unsigned_abs();
    for d in number.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let kind = KIND.with(|k| k.get());
    let parts: [&[u8]; 5] = [
        b"stagevm: error: seccomp: thread ",
        kind,
        b" made forbidden syscall ",
        &number,
        b"; ending the VM\n",
    ];
    for part in parts {
        // SAFETY: write(2) is async-signal-safe; `part` is live memory.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: _exit(2) is async-signal-safe and does not return.
    unsafe { libc::_exit(i32::from(hypercall_abi::platform::EXIT_GUEST_FAILURE)) }
}

/// Installs the SIGSYS handler that reports a forbidden syscall and ends
/// the VMM (once, before any filter). Errors: `sigaction` failed.
pub fn install_sigsys_handler() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(libc::SIGSYS, sigsys_handler)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_kind_has_a_filter_and_modes_parse() {
        for kind in [
            ThreadKind::Vcpu,
            ThreadKind::StageSched,
            ThreadKind::IoBlk,
            ThreadKind::Main,
            ThreadKind::Api,
        ] {
            assert!(program(kind, SeccompMode::Trap).unwrap().is_some());
            assert!(program(kind, SeccompMode::Off).unwrap().is_none());
            assert!(!allowed(kind).contains(&libc::SYS_execve));
        }
        assert_eq!("log".parse(), Ok(SeccompMode::Log));
        assert!("yes".parse::<SeccompMode>().unwrap_err().contains("'yes'"));
    }
}
