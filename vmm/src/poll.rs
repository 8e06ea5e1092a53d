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
        loop {
            match self.epoll.wait(-1, &mut self.events) {
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
