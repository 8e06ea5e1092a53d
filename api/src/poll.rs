//! A plain `epoll` helper for the VMM's event loops (the main thread,
//! `stage-sched`, the I/O threads): a set of descriptors, each with a token,
//! and a wait that returns the ready tokens and retries on `EINTR`.

use std::os::fd::RawFd;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// Descriptors watched for readability.
pub struct Poller {
    epoll: Epoll,
    events: Vec<EpollEvent>,
}

impl Poller {
    /// Watches each `(fd, token)` for input. Errors: `epoll_create1` or
    /// `epoll_ctl` failed.
    pub fn new(fds: &[(RawFd, u64)]) -> std::io::Result<Self> {
        let epoll = Epoll::new()?;
        for (fd, token) in fds {
            epoll.ctl(
                ControlOperation::Add,
                *fd,
                EpollEvent::new(EventSet::IN, *token),
            )?;
        }
        Ok(Self {
            epoll,
            events: vec![EpollEvent::default(); fds.len().max(1)],
        })
    }

    /// Watches `fd` (already in the set) for input under `token` when
    /// `input`, else for nothing (errors and hang-ups are still reported,
    /// as epoll always does). Errors: `epoll_ctl` failed.
    pub fn watch(&self, fd: RawFd, token: u64, input: bool) -> std::io::Result<()> {
        let events = if input {
            EventSet::IN
        } else {
            EventSet::empty()
        };
        self.epoll
            .ctl(ControlOperation::Modify, fd, EpollEvent::new(events, token))
    }

    /// Adds `fd` to the set, watched for input under `token`. Errors:
    /// `epoll_ctl` failed.
    pub fn add(&mut self, fd: RawFd, token: u64) -> std::io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )?;
        self.events.push(EpollEvent::default());
        Ok(())
    }

    /// Takes `fd` out of the set. Errors: `epoll_ctl` failed.
    pub fn remove(&self, fd: RawFd) -> std::io::Result<()> {
        self.epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default())
    }

    /// Blocks until at least one descriptor is readable; returns the tokens
    /// of the readable ones. Errors: `epoll_wait` failed (not `EINTR`).
    pub fn wait(&mut self) -> std::io::Result<Vec<u64>> {
        Ok(self.wait_events()?.into_iter().map(|r| r.token).collect())
    }

    /// As [`Poller::wait`], with whether each descriptor hung up or failed
    /// (`EPOLLHUP`, `EPOLLERR`: reported even when it is watched for
    /// nothing, so a loop that stops reading must act on them or spin).
    pub fn wait_events(&mut self) -> std::io::Result<Vec<Ready>> {
        self.wait_events_for(None)
    }

    /// As [`Poller::wait`], for at most `timeout` (`None`: without end;
    /// rounded up to whole ms): no tokens when it passed. Errors:
    /// `epoll_wait` failed (not `EINTR`).
    pub fn wait_for(&mut self, timeout: Option<std::time::Duration>) -> std::io::Result<Vec<u64>> {
        Ok(self
            .wait_events_for(timeout)?
            .into_iter()
            .map(|r| r.token)
            .collect())
    }

    fn wait_events_for(
        &mut self,
        timeout: Option<std::time::Duration>,
    ) -> std::io::Result<Vec<Ready>> {
        // epoll_wait(2) takes ms (-1: none); round up so a short timeout
        // does not become a spin.
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        });
        loop {
            match self.epoll.wait(ms, &mut self.events) {
                Ok(n) => {
                    return Ok(self.events[..n]
                        .iter()
                        .map(|e| Ready {
                            token: e.data(),
                            hung_up: e
                                .event_set()
                                .intersects(EventSet::HANG_UP | EventSet::ERROR),
                        })
                        .collect())
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// One ready descriptor of [`Poller::wait_events`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// Its token.
    pub token: u64,
    /// It hung up or has an error pending.
    pub hung_up: bool,
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    use vmm_sys_util::eventfd::EventFd;

    use super::Poller;

    #[test]
    fn wait_for_ends_at_its_timeout_and_reports_what_is_ready() {
        let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut poller = Poller::new(&[(fd.as_raw_fd(), 7)]).unwrap();
        let t = Instant::now();
        assert!(poller
            .wait_for(Some(Duration::from_micros(1500)))
            .unwrap()
            .is_empty());
        // Rounded up to 2 ms, not down to a spin.
        assert!(t.elapsed() >= Duration::from_millis(2), "{:?}", t.elapsed());
        fd.write(1).unwrap();
        assert_eq!(poller.wait_for(Some(Duration::from_secs(5))).unwrap(), [7]);
        // Muted: a write is not reported until the fd is watched again.
        poller.watch(fd.as_raw_fd(), 7, false).unwrap();
        assert!(poller.wait_for(Some(Duration::ZERO)).unwrap().is_empty());
        poller.watch(fd.as_raw_fd(), 7, true).unwrap();
        assert_eq!(poller.wait_for(None).unwrap(), [7]);
    }
}
