//! The scheduling loop an embedder runs on a thread of its own
//! ([`run_loop`]): a `timerfd` at the [`Pacer`]'s interval, the
//! "registered" `EventFd` ([`StageSched::registered_fd`]) and the VMM's
//! exit `EventFd` in one epoll set. stagevm's `stage-sched` thread is this
//! loop plus its seccomp filter (`vmm/src/sched_loop.rs`).

use std::os::fd::AsRawFd;
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::{Pacer, StageSched};

/// Epoll tokens of the loop.
const TOKEN_EXIT: u64 = 0;
const TOKEN_TIMER: u64 = 1;
const TOKEN_REGISTERED: u64 = 2;

/// Runs the scheduling loop of `sched` on the calling thread: a policy
/// period right after a served REGISTER and then every policy period, the
/// rings drained every `drain_period` while they need them (the timer's
/// interval follows [`Pacer::wake`]). Returns once `exit` is readable. The
/// loop does not read it (so every loop of the VM sees it); nobody else
/// may either: a read resets an `EventFd`, and a reset before the loop
/// woke would leave it waiting (the example VMM gives the loop an
/// `EventFd` of its own, written once the VM has ended).
///
/// `ready` runs once, after the loop's descriptors exist and before its
/// first wait: where a VMM installs the thread's seccomp filter (its
/// descriptors are then open, and a filter can refuse opening more).
///
/// Errors: the epoll or timer descriptors cannot be set up, waiting fails
/// (other than `EINTR`, which is retried), or `ready` fails.
pub fn run_loop<M: crate::stage::StageMemory>(
    sched: &StageSched<M>,
    drain_period: Duration,
    exit: &EventFd,
    ready: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut pacer = Pacer::new(sched, drain_period);
    let mut timer = TimerFd::new()?;
    timer.reset(pacer.tick(), Some(pacer.tick()))?;
    let registered = sched.registered_fd();
    let epoll = Epoll::new()?;
    for (fd, token) in [
        (exit.as_raw_fd(), TOKEN_EXIT),
        (timer.as_raw_fd(), TOKEN_TIMER),
        (registered.as_raw_fd(), TOKEN_REGISTERED),
    ] {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )?;
    }
    ready()?;
    let mut events = [EpollEvent::default(); 3];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut served = false;
        for e in &events[..n] {
            match e.data() {
                TOKEN_EXIT => return Ok(()),
                TOKEN_TIMER => {
                    let _ = timer.wait();
                }
                _ => {
                    let _ = registered.read();
                    served = true;
                }
            }
        }
        if let Some(tick) = pacer.wake(sched, served) {
            timer.reset(tick, Some(tick))?;
        }
    }
}
