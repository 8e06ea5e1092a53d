//! The `stage-sched` thread: the `stage-device` crate's scheduling loop
//! ([`stage_device::sched::run_loop`]) with the thread's seccomp filter,
//! which the VMM owns as it does every other thread's.

use std::time::Duration;

use stage_device::sched::StageSched;
use vmm_sys_util::eventfd::EventFd;

use crate::seccomp::{SeccompMode, ThreadKind};

/// Runs the `stage-sched` thread's loop for `sched`
/// ([`stage_device::sched::run_loop`]: a policy period right after a
/// served REGISTER and then every policy period, the rings drained every
/// `drain_period` while they need it); returns as soon as `exit` is
/// readable. Installs the thread's seccomp filter (`seccomp`) once the
/// loop's descriptors exist. Errors: the epoll or timer descriptors cannot
/// be set up, or the filter is refused.
pub fn run(
    sched: &StageSched,
    drain_period: Duration,
    exit: &EventFd,
    seccomp: SeccompMode,
) -> std::io::Result<()> {
    sched.pinner().start_helper_thread("stage-sched");
    crate::exit::test_panic_hook("stage-sched");
    stage_device::sched::run_loop(sched, drain_period, exit, || {
        // The vCPU threads whose nice this thread may set
        // (host.cpu_weight): their ids go into its filter's priority
        // rules. The VMM waited for them to start before it started this
        // thread (a vCPU later than that sets its own nice when it
        // starts); an embedder without vCPU threads (tests/libstage.rs)
        // gets no priority call at all.
        let renice = sched.pinner().seal_renice();
        crate::seccomp::install_with(ThreadKind::StageSched, seccomp, &renice)
            .map_err(std::io::Error::other)
    })
}
