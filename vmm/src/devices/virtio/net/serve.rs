//! The `io-net<N>` thread's loop ([`MmioNet::serve`]) and the limits of
//! its busy poll ([`super::io::POLL_WINDOW`]).
//!
//! The poll has limits ([`PollBudget`]): a receive notification that
//! brings nothing new since the last fruitless poll is not polled again (a
//! guest writing QueueNotify every 50 µs on a queue without buffers kept
//! this thread at 35 % of a core in a debug build), and polling takes at most
//! [`POLL_BUDGET`] a second; each poll not made is counted
//! (`polls_skipped`). A receive notification that brings no new buffer
//! (the available index where the last one left it) and lets no frame
//! through mutes the receive notification for [`RX_MUTE`]: the writes meanwhile
//! add up in its eventfd and wake the thread once (`rx_muted`), so a guest
//! notifying in a loop costs this thread at most one wake-up per
//! [`RX_MUTE`].

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::io::NetIo;
use super::{MmioNet, RX, TX};

/// Most time (per second, per device) spent polling empty queues: 5 % of
/// a core. A poll that finds an entry ends at once, so at saturation the
/// budget is rarely touched; a guest whose notifications never bring
/// anything (a spin, issue 36) meets it.
pub const POLL_BUDGET: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a receive notification that brought nothing is not listened
/// to (the writes meanwhile wake the thread once, after it).
pub const RX_MUTE: std::time::Duration = std::time::Duration::from_millis(1);

/// The busy poll's limits, per device: the second's budget, and the
/// receive queue's available index at its last fruitless poll (a
/// notification that brings nothing new since is not polled again).
#[derive(Debug)]
pub struct PollBudget {
    since: std::time::Instant,
    spent: std::time::Duration,
    rx_idle_at: Option<u16>,
}

impl PollBudget {
    pub(super) fn new() -> Self {
        Self {
            since: std::time::Instant::now(),
            spent: std::time::Duration::ZERO,
            rx_idle_at: None,
        }
    }

    /// Whether a poll may start now.
    fn allows(&mut self) -> bool {
        if self.since.elapsed() >= std::time::Duration::from_secs(1) {
            self.since = std::time::Instant::now();
            self.spent = std::time::Duration::ZERO;
        }
        self.spent < POLL_BUDGET
    }
}

/// Whether the driver made entries available in `queue` within `window`
/// (the queue's lock held: the driver writes the ring in guest memory, not
/// through the lock).
fn entries_come(queue: &Queue, mem: &GuestMemoryMmap, window: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + window;
    loop {
        match queue.avail_idx(mem, Ordering::Acquire) {
            Ok(idx) if idx.0 != queue.next_avail() => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::hint::spin_loop();
    }
}

impl MmioNet {
    /// [`entries_come`] within the poll window, unless the budget says no:
    /// for the receive queue (`rx`), not again while its available index
    /// is where the last fruitless poll left it, and never beyond the
    /// second's [`POLL_BUDGET`]. A poll not made is counted
    /// (`polls_skipped`) and answers false (the caller asks for a
    /// notification instead).
    pub(super) fn poll_entries(
        &self,
        queue: &Queue,
        mem: &GuestMemoryMmap,
        budget: &mut PollBudget,
        rx: bool,
    ) -> bool {
        let idx = queue.avail_idx(mem, Ordering::Acquire).ok().map(|i| i.0);
        let stale = rx && idx.is_some() && idx == budget.rx_idle_at;
        if stale || !budget.allows() {
            self.stats.polls_skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let t = std::time::Instant::now();
        let came = entries_come(queue, mem, self.poll_window);
        budget.spent += t.elapsed();
        if rx {
            budget.rx_idle_at = if came { None } else { idx };
        }
        came
    }

    /// The receive queue's available index, if the queue is set up and
    /// its ring readable.
    fn rx_avail_idx(&self, mem: &GuestMemoryMmap) -> Option<u16> {
        let queue = self.lock_queue(RX);
        if !queue.ready() {
            return None;
        }
        queue.avail_idx(mem, Ordering::Acquire).ok().map(|i| i.0)
    }

    /// The I/O thread's loop: waits (epoll) for the two queues'
    /// notifications and the tap, and serves them until the VM's `exit`
    /// `EventFd` is readable. Errors: the epoll set cannot be made or
    /// changed.
    pub fn serve(
        &self,
        mem: &GuestMemoryMmap,
        exit: &vmm_sys_util::eventfd::EventFd,
    ) -> std::io::Result<()> {
        const EXIT: u64 = 0;
        const RX_NOTIFY: u64 = 1;
        const TX_NOTIFY: u64 = 2;
        const TAP: u64 = 3;
        let tap_fd = self.tap.as_raw_fd();
        let mut poller = stagevm_api::poll::Poller::new(&[
            (exit.as_raw_fd(), EXIT),
            (self.notify[RX].as_raw_fd(), RX_NOTIFY),
            (self.notify[TX].as_raw_fd(), TX_NOTIFY),
            (tap_fd, TAP),
        ])?;
        let mut io = NetIo::new();
        // Whether the tap is in the set for input (not while a frame waits
        // for a buffer), and whether it is in the set at all.
        let (mut tap_in, mut tap_watched) = (true, true);
        // The receive queue's available index at the last notification,
        // and until when that notification is muted (`RX_MUTE`).
        let (mut rx_seen, mut rx_muted) = (None, None::<std::time::Instant>);
        let rx_fd = self.notify[RX].as_raw_fd();
        loop {
            let timeout = rx_muted.map(|t| t.saturating_duration_since(std::time::Instant::now()));
            let ready = poller.wait_for(timeout)?;
            if ready.contains(&EXIT) {
                return Ok(());
            }
            if rx_muted.is_some_and(|t| std::time::Instant::now() >= t) {
                // Level-triggered: writes made while muted wake us now.
                poller.watch(rx_fd, RX_NOTIFY, true)?;
                rx_muted = None;
            }
            if ready.contains(&TAP) && tap_watched && !tap_in {
                // Not watched for input, yet reported: EPOLLERR, which a
                // tap reports only once its interface is gone (it would be
                // reported again at every wait).
                self.mark_tap_gone(&std::io::Error::from_raw_os_error(libc::EBADFD));
            }
            if ready.contains(&TX_NOTIFY) {
                // An eventfd's value counts the writes since the last read.
                let n = self.notify[TX].read().unwrap_or(0);
                self.stats.tx_notifications.fetch_add(n, Ordering::Relaxed);
                self.process_tx(mem, &mut io);
            }
            if ready.contains(&RX_NOTIFY) {
                let n = self.notify[RX].read().unwrap_or(0);
                self.stats.rx_notifications.fetch_add(n, Ordering::Relaxed);
                let idx = self.rx_avail_idx(mem);
                let delivered = self.process_rx(mem, &mut io);
                if delivered == 0 && idx.is_some() && idx == rx_seen {
                    // Nothing new and nothing through: a notification in
                    // a loop. Listen again after RX_MUTE.
                    poller.watch(rx_fd, RX_NOTIFY, false)?;
                    rx_muted = Some(std::time::Instant::now() + RX_MUTE);
                    self.stats.rx_muted.fetch_add(1, Ordering::Relaxed);
                }
                rx_seen = idx;
            } else if ready.contains(&TAP) {
                self.process_rx(mem, &mut io);
            }
            if self.tap_gone() {
                if tap_watched {
                    poller.remove(tap_fd)?;
                    tap_watched = false;
                }
            } else if tap_in == io.rx_stalled() {
                // Stalled: stop reading the tap until the guest posts
                // buffers (its notification wakes us); else read again.
                tap_in = !io.rx_stalled();
                poller.watch(tap_fd, TAP, tap_in)?;
            }
        }
    }
}
