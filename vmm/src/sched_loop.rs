//! The `stage-sched` thread: the VMM's epoll loop around the stage
//! scheduling of the `stage-device` crate. The crate decides what each
//! wake-up does and how often the loop must wake ([`Pacer`]); this loop
//! owns the thread's descriptors and its seccomp filter, as every other
//! thread of the VMM does.

use std::os::fd::AsRawFd;
use std::time::Duration;

use stage_device::sched::{Pacer, StageSched};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::seccomp::{SeccompMode, ThreadKind};
use stagevm_api::poll::Poller;

/// Epoll tokens of the `stage-sched` loop.
const TOKEN_EXIT: u64 = 0;
const TOKEN_TIMER: u64 = 1;
const TOKEN_REGISTERED: u64 = 2;

/// Runs the `stage-sched` thread's loop for `sched`: a policy period
/// right after a served REGISTER and then every policy period, the rings
/// drained every `drain_period` while they need it (a `timerfd` whose
/// interval follows [`Pacer::wake`]); returns as soon as `exit` is
/// readable (it is never reset: every loop of the VM sees it). Installs
/// the thread's seccomp filter (`seccomp`) once its descriptors exist.
/// Errors: the epoll or timer descriptors cannot be set up, or the filter
/// is refused.
pub fn run(
    sched: &StageSched,
    drain_period: Duration,
    exit: &EventFd,
    seccomp: SeccompMode,
) -> std::io::Result<()> {
    sched.pinner().start_helper_thread("stage-sched");
    crate::exit::test_panic_hook("stage-sched");
    let mut pacer = Pacer::new(sched, drain_period);
    let mut timer = TimerFd::new()?;
    timer.reset(pacer.tick(), Some(pacer.tick()))?;
    let registered_fd = sched.registered_fd();
    let mut poller = Poller::new(&[
        (exit.as_raw_fd(), TOKEN_EXIT),
        (timer.as_raw_fd(), TOKEN_TIMER),
        (registered_fd.as_raw_fd(), TOKEN_REGISTERED),
    ])?;
    // The vCPU threads whose nice this thread may set (host.cpu_weight):
    // their ids go into its filter's priority rules. The VMM waited for
    // them to start before it started this thread (a vCPU later than that
    // sets its own nice when it starts); an embedder without vCPU threads
    // (tests/libstage.rs) gets no priority call at all.
    let renice = sched.pinner().seal_renice();
    crate::seccomp::install_with(ThreadKind::StageSched, seccomp, &renice)
        .map_err(std::io::Error::other)?;
    loop {
        let mut registered = false;
        for token in poller.wait()? {
            match token {
                TOKEN_EXIT => return Ok(()),
                TOKEN_TIMER => {
                    let _ = timer.wait();
                }
                _ => {
                    let _ = registered_fd.read();
                    registered = true;
                }
            }
        }
        if let Some(tick) = pacer.wake(sched, registered) {
            timer.reset(tick, Some(tick))?;
        }
    }
}
