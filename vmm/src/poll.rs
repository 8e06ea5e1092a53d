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
        loop {
            match self.epoll.wait(-1, &mut self.events) {
                Ok(n) => return Ok(self.events[..n].iter().map(EpollEvent::data).collect()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
