//! seccomp filters, one per thread kind, built with `seccompiler` (the
//! rust-vmm crate Firecracker and Cloud Hypervisor use) and installed by
//! each thread before it touches guest data (after its own set-up: pinning,
//! creating its descriptors).
//!
//! A syscall outside a thread's list raises SIGSYS (`--seccomp true`, the
//! default): the handler writes the syscall number to stderr and ends the
//! VMM with status 2. `--seccomp log` lets it through and has the kernel log
//! it; `--seccomp false` installs nothing. The lists (x86-64, glibc) hold
//! what each thread calls after its filter is installed, checked against
//! `strace` of real runs by `tests/seccomp.rs` (every entry was seen there,
//! or is one of the code paths listed in that test with its reason):
//!
//! * every thread — memory (`mmap`, `munmap`, `madvise`, `mprotect`, `brk`),
//!   `futex`, `sched_yield` (parking_lot's spinning, the metrics' locks),
//!   `clock_gettime` (`CLOCK_THREAD_CPUTIME_ID`: each thread's CPU time at
//!   its end, `ThreadCpu`), `clock_nanosleep` (`std::thread::sleep`),
//!   `getrandom` (hash-map keys), `write`/`writev` (stderr, logs,
//!   eventfds), `close` (a thread's own descriptors when it ends),
//!   `rt_sigreturn` (the vCPU kick's handler), `rt_sigprocmask`,
//!   `sigaltstack`, `exit`, `exit_group` (a fail-stop exit from any
//!   thread), `gettid`, `getpid`, `fcntl(fd, F_GETFD)` only (the standard
//!   library's debug-build check of a descriptor it closes), and `openat`,
//!   which fails with `EACCES` in every thread but `stage-sched` (a second
//!   filter): glibc's malloc reads `/proc/sys/vm/overcommit_memory` once
//!   per process, in whichever thread first shrinks a heap — `vmm-main`
//!   freeing the run's buffers at exit, `api` after a burst of connections
//!   — and goes on without it;
//! * `vcpu` — `ioctl` with the requests `KVM_RUN`, `KVM_GET_REGS`,
//!   `KVM_GET_SREGS`, `KVM_GET_MP_STATE` (failure reports, the state of a
//!   vCPU the VMM stopped), `KVM_SET_REGS`, `KVM_GET_FPU`,
//!   `KVM_GET_VCPU_EVENTS`, `KVM_SET_VCPU_EVENTS` (the emulation assists
//!   of Linux guests) and no other (a rule on argument 1, the request;
//!   the descriptor is not checked): no VM-wide ioctl such as
//!   `KVM_SET_USER_MEMORY_REGION` or `KVM_CREATE_VCPU`, none on `/dev/kvm`;
//!   `sched_getaffinity`/`sched_setaffinity` (the REGISTER path applies the
//!   first plan's pins);
//! * `stage-sched` — `epoll_wait`, `read` (timerfd, eventfd),
//!   `timerfd_settime` (the drain interval follows the rings' need),
//!   `openat` (not refused here), `getdents64`, `newfstatat`, `statx`
//!   (adopting threads from `/proc/self/task` every 50 policy periods,
//!   `Pinner::adopt_threads`),
//!   `sched_getaffinity`/`sched_setaffinity` (pins), `getpriority` and
//!   `setpriority` only as `(PRIO_PROCESS, tid)` with the tid of one of the
//!   VM's vCPU threads (the VM's CPU weight on shared cores,
//!   `host.cpu_weight`, as its vCPU threads' nice, when `stagevm-hostd`
//!   cannot set the VM's group's weight; the VMM opens no group file): not
//!   `PRIO_USER`, `PRIO_PGRP`, another process or a helper thread;
//! * `io-blk` — `epoll_create1`, `epoll_ctl`, `epoll_wait`, `read`
//!   (eventfd), `pread64`, `pwrite64`, `fdatasync` (a guest's flush of a
//!   writable disk);
//! * `io-net` — `epoll_create1`, `epoll_ctl` (the tap leaves the set while
//!   the guest has no receive buffer, and for good once it has gone),
//!   `epoll_wait`, `read` (eventfds, the tap's frames; frames go out with
//!   `write`);
//! * `api` (with `--api-socket`; after its tokio runtime and listener
//!   exist) — `epoll_ctl`, `epoll_wait`, `accept4` (non-blocking sockets:
//!   no `ioctl`), `recvfrom`, `shutdown` (the connections; replies go
//!   out with `write`/`writev`, and on `--metrics-listen`'s TCP with
//!   `sendto`);
//! * `serial-in` (with an input console: `--serial pty`, `socket=`, or
//!   `tty` on a terminal) — `epoll_create1`, `epoll_ctl`, `epoll_wait`,
//!   `read` (the input), `accept4` (a socket client, non-blocking at once),
//!   `fcntl` (`F_DUPFD_CLOEXEC`: the client's copy for the output writer);
//! * `serial-out` (`--serial tty`) — `epoll_create1`, `epoll_ctl`,
//!   `epoll_wait`, `read` (its buffer's EventFd), and stdout with `write`;
//! * `vmm-main` (installed once every thread runs, before it waits for the
//!   exit) — `epoll_create1`, `epoll_ctl`, `epoll_wait`, `read` (signalfd),
//!   `tgkill` (the vCPU kick), `unlink` (removing the `--api-socket` path
//!   once the VM ended), `ioctl` only as `TCSETS` and `TCGETS` (`--serial
//!   tty` on a terminal: its settings restored at the end, which glibc's
//!   `tcsetattr` reads back). Dropping KVM objects
//!   only closes their descriptors.
//!
//! `mremap`, in the common set, is glibc's `realloc` of a block above the
//! mmap threshold (128 KiB at first): a buffer that grows past it — the
//! timeline (`stage-sched`), `GET /api/v1/stages?timeline=all` (`api`), the
//! last drain of rings a guest filled (`vmm-main`) or the events an
//! UNREGISTER keeps for the next drain (`vcpu`), a virtio-blk chain whose
//! descriptors grow (`io-blk`). It only moves the process's own mappings,
//! as `mmap`/`munmap` (allowed everywhere) can.
//!
//! KVM's NX huge page recovery worker (`kvm-nx-lpage-recovery`, shown as
//! `kvm-nx-lpage-re`) is, on the project's kernels (6.18), a vhost task of
//! this process that a vCPU thread's first `KVM_RUN` starts: it inherits
//! that vCPU thread's filter (`Seccomp: 2`, one filter, in its
//! `/proc/<pid>/task/<tid>/status`), and never returns to user space, so
//! it makes no syscalls the filter could see. (Older kernels ran it as a
//! kernel thread outside the process, which no filter covered.)

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
    type Err = SeccompError;
    fn from_str(s: &str) -> Result<Self, SeccompError> {
        match s {
            "true" => Ok(Self::Trap),
            "log" => Ok(Self::Log),
            "false" => Ok(Self::Off),
            _ => Err(SeccompError::BadMode(s.to_string())),
        }
    }
}

/// Why a filter cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// `--seccomp` given something else than `true`, `false` or `log`.
    #[error("'{0}': expected true, false or log")]
    BadMode(String),
    /// seccompiler refused a rule or a filter of ours (a bug).
    #[error("seccomp filter for {kind:?}: {source}")]
    Build {
        /// The thread kind whose filter it is.
        kind: ThreadKind,
        /// seccompiler's reason.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error("installing the seccomp filter for {kind:?}: {source}")]
    Install {
        /// The thread kind whose filter it is.
        kind: ThreadKind,
        /// seccompiler's reason.
        #[source]
        source: seccompiler::Error,
    },
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
    /// `io-net<N>`.
    IoNet,
    /// `vmm-main`, once every other thread runs.
    Main,
    /// `api`, the operator API's server (`--api-socket`, `--metrics-listen`).
    Api,
    /// `serial-in`, the console's input (`--serial tty|pty|socket=`).
    SerialIn,
    /// `serial-out`, the console's output to stdout (`--serial tty`).
    SerialOut,
}

/// A system call: its number and the name of its `libc::SYS_*` constant.
#[derive(Clone, Copy, Debug)]
struct Syscall(i64, &'static str);

impl Syscall {
    /// The syscall's name as `strace` prints it (`mmap`, `pread64`).
    fn name(self) -> &'static str {
        self.1.trim_start_matches("SYS_")
    }
}

/// `[Syscall(libc::SYS_x, "SYS_x"), …]` for the `SYS_` names given.
macro_rules! syscalls {
    ($($sys:ident),* $(,)?) => { &[$(Syscall(libc::$sys, stringify!($sys))),*] };
}

/// Every thread's (see the module documentation for why each is there).
const COMMON: &[Syscall] = syscalls![
    SYS_mmap,
    SYS_munmap,
    SYS_madvise,
    SYS_brk,
    SYS_mprotect,
    SYS_futex,
    SYS_sched_yield,
    SYS_clock_gettime,
    SYS_clock_nanosleep,
    SYS_getrandom,
    SYS_write,
    SYS_writev,
    SYS_rt_sigreturn,
    SYS_rt_sigprocmask,
    SYS_sigaltstack,
    SYS_exit,
    SYS_exit_group,
    SYS_gettid,
    SYS_getpid,
    SYS_close,
    // glibc's realloc of a block above the mmap threshold (module doc).
    SYS_mremap,
    // Passed by this filter; every thread but stage-sched gets EACCES from
    // a second filter (`denied`).
    SYS_openat,
];

fn own(kind: ThreadKind) -> &'static [Syscall] {
    match kind {
        // `ioctl` only with the requests of `VCPU_IOCTLS`.
        ThreadKind::Vcpu => syscalls![SYS_ioctl, SYS_sched_getaffinity, SYS_sched_setaffinity],
        ThreadKind::StageSched => syscalls![
            SYS_epoll_wait,
            SYS_read,
            // The loop's timer follows the rings' need for draining.
            SYS_timerfd_settime,
            // Adopting threads from /proc/self/task (`openat`, read_dir,
            // read_to_string).
            SYS_getdents64,
            SYS_newfstatat,
            SYS_statx,
            SYS_sched_getaffinity,
            SYS_sched_setaffinity,
            // host.cpu_weight (Pinner::set_cpu_weight): only PRIO_PROCESS
            // on the VM's vCPU threads (`priority_rules`).
            SYS_getpriority,
            SYS_setpriority,
        ],
        ThreadKind::IoBlk => syscalls![
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_read,
            SYS_pread64,
            SYS_pwrite64,
            SYS_fdatasync,
        ],
        // The tap's frames go through `read` and `write` (common).
        ThreadKind::IoNet => syscalls![SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_wait, SYS_read],
        ThreadKind::Main => syscalls![
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_read,
            SYS_tgkill,
            SYS_unlink,
            // Only TCSETS and TCGETS (`allowed_ioctls`): the terminal's settings
            // restored once the VM ended.
            SYS_ioctl,
        ],
        ThreadKind::Api => syscalls![
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_accept4,
            SYS_recvfrom,
            // Replies on TCP (`--metrics-listen`): send with MSG_NOSIGNAL.
            SYS_sendto,
            SYS_shutdown,
        ],
        // Input bytes with `read`; a socket client accepted non-blocking
        // (`accept4` flags) and its copy for the output writer (`fcntl`
        // F_DUPFD_CLOEXEC, in `fcntl_commands`).
        ThreadKind::SerialIn => syscalls![
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_read,
            SYS_accept4,
        ],
        // Its eventfd with `read`, stdout with `write` (common).
        ThreadKind::SerialOut => {
            syscalls![SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_wait, SYS_read]
        }
    }
}

/// `ioctl(2)` request number (vmm-sys-util's `_IOC` encoding, as
/// kvm-ioctls declares them).
const fn kvm_ioc(dir: u32, nr: u32, size: usize) -> u64 {
    vmm_sys_util::ioctl::ioctl_expr(dir, kvm_bindings::KVMIO, nr, size as u32) as u64
}

/// The only `ioctl` requests a vCPU thread may make (argument 1), with their
/// names: its own `KVM_RUN`, the registers and state a failure report reads
/// (`Vcpu::failure`, `Vcpu::log_stopped_state`) and what the emulation
/// assists of Linux guests read and write (`Vcpu::assist_emulation`).
const VCPU_IOCTLS: &[(&str, u64)] = {
    use std::mem::size_of;
    use vmm_sys_util::ioctl::{_IOC_NONE, _IOC_READ, _IOC_WRITE};
    &[
        ("KVM_RUN", kvm_ioc(_IOC_NONE, 0x80, 0)),
        (
            "KVM_GET_REGS",
            kvm_ioc(_IOC_READ, 0x81, size_of::<kvm_bindings::kvm_regs>()),
        ),
        (
            "KVM_SET_REGS",
            kvm_ioc(_IOC_WRITE, 0x82, size_of::<kvm_bindings::kvm_regs>()),
        ),
        (
            "KVM_GET_SREGS",
            kvm_ioc(_IOC_READ, 0x83, size_of::<kvm_bindings::kvm_sregs>()),
        ),
        (
            "KVM_GET_FPU",
            kvm_ioc(_IOC_READ, 0x8c, size_of::<kvm_bindings::kvm_fpu>()),
        ),
        (
            "KVM_GET_MP_STATE",
            kvm_ioc(_IOC_READ, 0x98, size_of::<kvm_bindings::kvm_mp_state>()),
        ),
        (
            "KVM_GET_VCPU_EVENTS",
            kvm_ioc(_IOC_READ, 0x9f, size_of::<kvm_bindings::kvm_vcpu_events>()),
        ),
        (
            "KVM_SET_VCPU_EVENTS",
            kvm_ioc(_IOC_WRITE, 0xa0, size_of::<kvm_bindings::kvm_vcpu_events>()),
        ),
    ]
};

fn allowed(kind: ThreadKind) -> Vec<Syscall> {
    COMMON.iter().chain(own(kind)).copied().collect()
}

/// The syscalls `kind`'s filter allows, by name (as `strace` prints them;
/// `fcntl` only as `fcntl(fd, F_GETFD)`, `ioctl` only with the requests of
/// [`allowed_ioctls`]): for `tests/seccomp.rs`, which checks them against
/// a traced run.
pub fn allowed_syscalls(kind: ThreadKind) -> Vec<&'static str> {
    let mut names: Vec<&str> = allowed(kind).into_iter().map(Syscall::name).collect();
    names.push("fcntl");
    names.sort_unstable();
    names.dedup();
    names
}

/// The `ioctl` requests `kind` may make, by name and number (empty: no
/// `ioctl` at all).
pub fn allowed_ioctls(kind: ThreadKind) -> &'static [(&'static str, u64)] {
    match kind {
        ThreadKind::Vcpu => VCPU_IOCTLS,
        // tcsetattr(3) with TCSANOW (glibc reads the settings back with
        // TCGETS): `--serial tty`'s terminal restored.
        ThreadKind::Main => &[("TCSETS", libc::TCSETS), ("TCGETS", libc::TCGETS)],
        _ => &[],
    }
}

/// The `fcntl` commands `kind` may use: `F_GETFD` everywhere (Rust's
/// standard library checks, in debug builds, that a descriptor it closes is
/// open), and `serial-in`'s `F_DUPFD_CLOEXEC` (a socket console client's
/// copy for the output writer).
pub fn fcntl_commands(kind: ThreadKind) -> &'static [u64] {
    match kind {
        ThreadKind::SerialIn => &[libc::F_GETFD as u64, libc::F_DUPFD_CLOEXEC as u64],
        _ => &[libc::F_GETFD as u64],
    }
}

/// One rule per value: argument `arg` (32 bits) equal to one of `values`.
fn arg_rules(kind: ThreadKind, arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    values
        .iter()
        .map(|v| {
            SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *v)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|source| SeccompError::Build { kind, source })
        })
        .collect()
}

/// `getpriority`/`setpriority(which, who, …)` rules: `which` =
/// `PRIO_PROCESS` and `who` = one of `tids` (one rule per thread id). No
/// thread id gives no rule, and the caller drops the syscall (an empty
/// rule list would allow every argument).
fn priority_rules(kind: ThreadKind, tids: &[i32]) -> Result<Vec<SeccompRule>, SeccompError> {
    let eq = |arg: u8, v: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)
            .map_err(|source| SeccompError::Build { kind, source })
    };
    tids.iter()
        .map(|tid| {
            SeccompRule::new(vec![
                eq(0, libc::PRIO_PROCESS as u64)?,
                eq(1, *tid as u32 as u64)?,
            ])
            .map_err(|source| SeccompError::Build { kind, source })
        })
        .collect()
}

/// The BPF program of `kind` under `mode` (`None` for [`SeccompMode::Off`]).
/// `renice` (stage-sched only): the vCPU threads whose nice it may read
/// and set (`PRIO_PROCESS` on exactly those thread ids). Errors: seccompiler refused the filter (a
/// bug, reported as text).
pub fn program(
    kind: ThreadKind,
    mode: SeccompMode,
    renice: &[i32],
) -> Result<Option<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Trap => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed(kind)
        .into_iter()
        .map(|sys| (sys.0, Vec::new()))
        .collect();
    rules.insert(libc::SYS_fcntl, arg_rules(kind, 1, fcntl_commands(kind))?);
    // `ioctl` only with the thread's requests (the kernel compares the
    // request's 32 bits).
    if let Some(ioctl) = rules.get_mut(&libc::SYS_ioctl) {
        let requests: Vec<u64> = allowed_ioctls(kind).iter().map(|(_, nr)| *nr).collect();
        *ioctl = arg_rules(kind, 1, &requests)?;
    }
    for sys in [libc::SYS_getpriority, libc::SYS_setpriority] {
        if let Some(rule) = rules.get_mut(&sys) {
            *rule = priority_rules(kind, renice)?;
            if rule.is_empty() {
                rules.remove(&sys);
            }
        }
    }
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|source| SeccompError::Build { kind, source })?;
    filter
        .try_into()
        .map(Some)
        .map_err(|source| SeccompError::Build { kind, source })
}

/// Syscalls a thread kind may make that fail with `EACCES` instead of
/// ending the VMM: `openat` in every thread but `stage-sched`, because
/// glibc's malloc opens `/proc/sys/vm/overcommit_memory` once per process,
/// in whichever thread first shrinks a thread's heap (`vmm-main` freeing
/// the run's buffers at exit, `api` after a burst of connections), and goes
/// on without it when the open fails. `stage-sched` reads `/proc/self/task`
/// and may open read-only: an `openat` that writes, creates, truncates or
/// appends fails there too.
fn denied(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let rules = match kind {
        ThreadKind::StageSched => {
            // openat(dirfd, path, flags): arg 2, any of these set.
            let flag = |mask: i32, value: i32| {
                SeccompCondition::new(
                    2,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(mask as u64),
                    value as u64,
                )
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|source| SeccompError::Build { kind, source })
            };
            vec![
                flag(libc::O_ACCMODE, libc::O_WRONLY)?,
                flag(libc::O_ACCMODE, libc::O_RDWR)?,
                flag(libc::O_CREAT, libc::O_CREAT)?,
                flag(libc::O_TRUNC, libc::O_TRUNC)?,
                flag(libc::O_APPEND, libc::O_APPEND)?,
            ]
        }
        ThreadKind::Vcpu
        | ThreadKind::IoBlk
        | ThreadKind::IoNet
        | ThreadKind::Main
        | ThreadKind::Api
        | ThreadKind::SerialIn
        | ThreadKind::SerialOut => Vec::new(),
    };
    Ok(BTreeMap::from([(libc::SYS_openat, rules)]))
}

/// A second filter that answers [`denied`]'s syscalls with `EACCES`
/// (seccomp takes the strictest action of all installed filters: the first
/// filter's Allow loses to this Errno).
fn deny_program(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        denied(kind)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )
    .map_err(|source| SeccompError::Build { kind, source })?;
    filter
        .try_into()
        .map_err(|source| SeccompError::Build { kind, source })
}

/// Installs the filter of `kind` on the calling thread (no-op for
/// [`SeccompMode::Off`]). Errors: the filter cannot be built or applied.
pub fn install(kind: ThreadKind, mode: SeccompMode) -> Result<(), SeccompError> {
    install_with(kind, mode, &[])
}

/// [`install`], with the vCPU thread ids whose nice the thread may read
/// and set (`stage-sched`: [`stage_device::sched::Pinner::seal_renice`]).
/// Errors: the filter cannot be built or applied.
pub fn install_with(
    kind: ThreadKind,
    mode: SeccompMode,
    renice: &[i32],
) -> Result<(), SeccompError> {
    KIND.with(|k| k.set(kind_name(kind)));
    // The test hook's target, read while getppid is still allowed (debug
    // builds only: release builds have no hook).
    let parent = if cfg!(debug_assertions) {
        std::os::unix::process::parent_id()
    } else {
        0
    };
    if let Some(prog) = program(kind, mode, renice)? {
        // The deny filter first: the main one forbids the `prctl` and
        // `seccomp` calls that installing a filter makes.
        seccompiler::apply_filter(&deny_program(kind)?)
            .map_err(|source| SeccompError::Install { kind, source })?;
        seccompiler::apply_filter(&prog)
            .map_err(|source| SeccompError::Install { kind, source })?;
    }
    hook::test_forbidden_syscall_hook(kind, parent);
    Ok(())
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
        ThreadKind::IoNet => b"io-net",
        ThreadKind::Main => b"vmm-main",
        ThreadKind::Api => b"api",
        ThreadKind::SerialIn => b"serial-in",
        ThreadKind::SerialOut => b"serial-out",
    }
}

extern "C" fn sigsys_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // siginfo for SIGSYS (x86-64): the syscall number is the int at byte 24
    // (`_sifields._sigsys._syscall`, after `_call_addr`).
    // SAFETY: the kernel passes a valid siginfo_t for this SIGSYS; the read
    // stays inside it (siginfo_t is 128 bytes).
    let nr = unsafe { info.cast::<u8>().add(24).cast::<i32>().read_unaligned() };
    // The number in decimal, without leading zeros (no allocation here).
    let mut digits = [b'0'; 10];
    let mut first = digits.len();
    let mut n = nr.unsigned_abs();
    loop {
        first -= 1;
        digits[first] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let number = &digits[first..];
    let kind = KIND.with(|k| k.get());
    let parts: [&[u8]; 5] = [
        b"stagevm: error: seccomp: thread ",
        kind,
        b" made forbidden syscall ",
        number,
        b"; ending the VM\n",
    ];
    // One write(2) for the whole line: two threads trapping at once (both
    // vCPUs) must not interleave their messages.
    let mut line = [0u8; 128];
    let mut len = 0;
    for part in parts {
        let n = part.len().min(line.len() - len);
        line[len..len + n].copy_from_slice(&part[..n]);
        len += n;
    }
    // SAFETY: write(2) is async-signal-safe; `line[..len]` is live memory.
    unsafe { libc::write(2, line.as_ptr().cast(), len) };
    // SAFETY: _exit(2) is async-signal-safe and does not return.
    unsafe { libc::_exit(i32::from(hypercall_abi::platform::EXIT_GUEST_FAILURE)) }
}

/// Installs the SIGSYS handler that reports a forbidden syscall and ends
/// the VMM (once, before any filter). Errors: `sigaction` failed.
pub fn install_sigsys_handler() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(libc::SIGSYS, sigsys_handler)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

mod hook;
#[cfg(test)]
mod tests;
