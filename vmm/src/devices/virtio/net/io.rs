//! The I/O thread's work for one virtio-net device: frames from the tap to
//! the receive queue, frames from the transmit queue to the tap.
//!
//! Every chain is checked before use: its head names a descriptor of the
//! queue, no descriptor is indirect (`VIRTIO_F_INDIRECT_DESC` is not
//! offered), the chain does not loop and names no descriptor outside the
//! queue (virtio-queue stops such a walk; a chain still going then is
//! refused), every descriptor has the direction the queue needs and lies
//! in guest memory, and lengths add up without overflow. A refused chain is completed with
//! length 0 and counted (`bad_chains`); its guest-triggered log lines are
//! rate-limited.
//!
//! Notifications: each one is a VM exit (~26 µs on the project's machines,
//! longer than a frame's whole path), so after the transmit queue is empty,
//! and when the receive queue has no buffer, the thread watches the
//! available index for at most [`POLL_WINDOW`] before it asks for a
//! notification: at saturation the driver's next frame or buffer comes
//! within it and no notification is needed (vhost-net's busy-poll, bounded).
//!
//! The poll's limits, the thread's loop and its notification muting are
//! in [`super::serve`].
//!
//! No unbounded busy loops: past that window a frame read from the tap while
//! the guest posted no receive buffer waits in the device (one frame), the
//! tap leaves the epoll set until the guest's next receive notification,
//! and the device asks for that notification (`avail_event`). A full tap (`EAGAIN` on write)
//! drops the frame (counted), as a NIC with a full queue does. A tap whose
//! interface is deleted (`EBADFD`, `EPOLLERR`) leaves the epoll set for
//! good; the guest's frames are then dropped and counted.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemory, GuestMemoryMmap};

use super::tap::VNET_HDR_LEN;
use super::{MmioNet, MAX_FRAME, RX, TX};

/// Bytes of the host-side frame buffers: the largest frame a tap can hand
/// over (64 KiB with its header), so a longer one is read whole and dropped.
const BUF_LEN: usize = 65536 + VNET_HDR_LEN;
/// An Ethernet header (bytes): the shortest frame worth sending.
const ETH_HLEN: usize = 14;
/// How long the thread watches an empty queue's available index before it
/// asks the driver for a notification (an exit): a few frames' time at
/// saturation; idle, it costs this much CPU once per burst.
pub const POLL_WINDOW: std::time::Duration = std::time::Duration::from_micros(50);

/// The I/O thread's own state for one device.
pub struct NetIo {
    rx_buf: Vec<u8>,
    /// Length of a frame (with header) in `rx_buf` waiting for a receive
    /// buffer.
    rx_pending: Option<usize>,
    tx_buf: Vec<u8>,
    pub(super) poll: super::serve::PollBudget,
}

impl Default for NetIo {
    fn default() -> Self {
        Self::new()
    }
}

impl NetIo {
    /// Fresh buffers.
    pub fn new() -> Self {
        Self {
            rx_buf: vec![0; BUF_LEN],
            rx_pending: None,
            tx_buf: Vec::with_capacity(BUF_LEN),
            poll: super::serve::PollBudget::new(),
        }
    }

    /// Whether a received frame waits for a receive buffer.
    pub fn rx_stalled(&self) -> bool {
        self.rx_pending.is_some()
    }
}

/// Why a chain is refused.
enum Bad {
    /// The chain itself (shape, direction, memory).
    Chain(&'static str),
}

impl MmioNet {
    /// Whether the tap has gone.
    pub fn tap_gone(&self) -> bool {
        self.tap_gone.load(Ordering::Relaxed)
    }

    pub(super) fn mark_tap_gone(&self, e: &std::io::Error) {
        if !self.tap_gone.swap(true, Ordering::Relaxed) {
            tracing::warn!(device = %self.name, tap = %self.tap.name, "the tap has gone ({e}): frames are dropped from now on");
        }
    }

    /// Sets the used-buffer bit and raises the interrupt when the driver
    /// asked for one (`used_event`, or always without EVENT_IDX).
    fn signal_used(&self, queue: &mut Queue, mem: &GuestMemoryMmap) {
        self.interrupt_status
            .fetch_or(crate::devices::virtio::mmio::INT_VRING, Ordering::AcqRel);
        if queue.needs_notification(mem).unwrap_or(true) {
            if let Some(irq) = &self.irq {
                self.stats.interrupts.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = irq.write(1) {
                    tracing::warn!(device = %self.name, "cannot raise the interrupt: {e}");
                }
            }
        }
    }

    /// Asks the driver for no notification of `queue` while this thread
    /// serves it. Without `EVENT_IDX`: `VRING_USED_F_NO_NOTIFY`
    /// (virtio-queue's `disable_notification`). With it, virtio-queue leaves
    /// `avail_event` where it was, which suits a driver that notifies when
    /// its index *crosses* `avail_event` (VIRTIO 1.2 §2.7.10, Linux's
    /// `vring_need_event`) but not one that notifies whenever its index has
    /// *passed* it (virtio-drivers 0.13's `should_notify`, which then
    /// notifies on every entry); so `avail_event` becomes `0xfffe`, which the
    /// first kind crosses once per 65,536 entries and the second passes only
    /// at index `0xffff`. `enable_notification` sets it back to the next
    /// entry before the thread sleeps.
    fn quiet(&self, queue: &mut Queue, mem: &GuestMemoryMmap) {
        let _ = queue.disable_notification(mem);
        if !self.event_idx.load(Ordering::Acquire) {
            return;
        }
        // The used ring: flags, idx, `size` elements of 8 bytes, then
        // avail_event (VIRTIO 1.2 §2.7.8); checked arithmetic and a
        // bounds-checked store, as for every guest address.
        let at = 4u64
            .checked_add(8 * u64::from(queue.size()))
            .and_then(|off| queue.used_ring().checked_add(off));
        if let Some(at) = at {
            let _ = mem.write_obj(0xfffeu16.to_le(), vm_memory::GuestAddress(at));
        }
    }

    /// Whether the queue can be used at all; logs (rate-limited) if not.
    fn usable(&self, queue: &Queue, mem: &GuestMemoryMmap) -> bool {
        if !queue.ready() || !queue.is_valid(mem) {
            stage_device::guest_warn!(device = %self.name, "notified queue is not ready or lies outside guest memory");
            return false;
        }
        true
    }

    /// The descriptors of the chain at `head`, checked (module docs):
    /// every one device-writable (`writable`) or device-readable, in guest
    /// memory; returns them with their total length in bytes.
    fn checked_chain(
        queue: &Queue,
        mem: &GuestMemoryMmap,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
        writable: bool,
    ) -> Result<(Vec<Descriptor>, u64), Bad> {
        let head = chain.head_index();
        if head >= queue.size() {
            return Err(Bad::Chain("head names no descriptor of the queue"));
        }
        if super::super::uses_indirect(mem, queue.desc_table(), queue.size(), head) {
            return Err(Bad::Chain("indirect descriptor (not offered)"));
        }
        let descs: Vec<Descriptor> = chain.collect();
        if descs.is_empty() {
            return Err(Bad::Chain("empty or unreadable chain"));
        }
        // virtio-queue ends a walk after queue-size descriptors (a loop)
        // or at a next index outside the queue, leaving a last descriptor
        // that still says "next".
        if descs.last().is_some_and(|d| d.has_next()) {
            return Err(Bad::Chain("looping chain or next index out of range"));
        }
        let mut total = 0u64;
        for d in &descs {
            if d.is_write_only() != writable {
                return Err(Bad::Chain("descriptor direction"));
            }
            let access = if writable {
                vm_memory::Permissions::Write
            } else {
                vm_memory::Permissions::Read
            };
            if !mem.check_range(d.addr(), d.len() as usize, access) {
                return Err(Bad::Chain("buffer outside guest memory"));
            }
            total += u64::from(d.len());
        }
        Ok((descs, total))
    }

    fn refuse(&self, why: &str, queue: &str) {
        self.stats.bad_chains.fetch_add(1, Ordering::Relaxed);
        stage_device::guest_warn!(device = %self.name, queue, "descriptor chain refused: {why}");
    }

    /// Sends every frame of the transmit queue to the tap; returns how many
    /// chains were completed.
    pub fn process_tx(&self, mem: &GuestMemoryMmap, io: &mut NetIo) -> usize {
        let mut queue = self.lock_queue(TX);
        if !self.usable(&queue, mem) {
            return 0;
        }
        let mut done = 0;
        loop {
            self.quiet(&mut queue, mem);
            let mut popped = 0;
            while let Some(chain) = queue.pop_descriptor_chain(mem) {
                popped += 1;
                let head = chain.head_index();
                if head >= queue.size() {
                    // No such descriptor: nothing to send or complete.
                    self.refuse("head names no descriptor of the queue", "tx");
                    continue;
                }
                self.transmit(&queue, mem, chain, io);
                if queue.add_used(mem, head, 0).is_err() {
                    stage_device::guest_warn!(device = %self.name, "cannot complete transmit chain {head}");
                    self.signal_used(&mut queue, mem);
                    return done;
                }
                done += 1;
            }
            // The driver's next frame, without an exit, if it comes soon.
            if popped > 0 && self.poll_entries(&queue, mem, &mut io.poll, false) {
                continue;
            }
            // Re-arm the notification; entries added meanwhile are served
            // now (VIRTIO 1.2 §2.7.10). An unwritable ring ends the round,
            // and so does an available index that moved while nothing could
            // be taken (more than a queue ahead: virtio-queue refuses it),
            // which would otherwise spin here.
            let more = queue.enable_notification(mem).unwrap_or(false);
            if more && popped == 0 {
                stage_device::guest_warn!(device = %self.name, "transmit available index is more than a queue ahead");
            }
            if !more || popped == 0 {
                break;
            }
        }
        if done > 0 {
            self.signal_used(&mut queue, mem);
        }
        done
    }

    /// One transmit chain: header and frame, device-readable.
    fn transmit(
        &self,
        queue: &Queue,
        mem: &GuestMemoryMmap,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
        io: &mut NetIo,
    ) {
        let s = &self.stats;
        let (descs, total) = match Self::checked_chain(queue, mem, chain, false) {
            Ok(c) => c,
            Err(Bad::Chain(why)) => {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                return self.refuse(why, "tx");
            }
        };
        if total < (VNET_HDR_LEN + ETH_HLEN) as u64 {
            s.tx_errors.fetch_add(1, Ordering::Relaxed);
            return self.refuse("shorter than the headers (virtio-net, Ethernet)", "tx");
        }
        if total > (VNET_HDR_LEN + MAX_FRAME) as u64 {
            s.tx_dropped.fetch_add(1, Ordering::Relaxed);
            s.oversized.fetch_add(1, Ordering::Relaxed);
            stage_device::guest_warn!(device = %self.name, bytes = total - VNET_HDR_LEN as u64, "oversized frame dropped");
            return;
        }
        if self.tap_gone() {
            s.tx_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        io.tx_buf.clear();
        for d in &descs {
            let start = io.tx_buf.len();
            io.tx_buf.resize(start + d.len() as usize, 0);
            if mem.read_slice(&mut io.tx_buf[start..], d.addr()).is_err() {
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                return self.refuse("buffer outside guest memory", "tx");
            }
        }
        // No offloads were offered: the header must say "nothing to do";
        // the tap gets exactly that whatever the guest wrote (a forged
        // GSO or checksum request never reaches the host's stack).
        io.tx_buf[..VNET_HDR_LEN].fill(0);
        match self.tap.write_frame(&io.tx_buf) {
            Ok(_) => {
                s.tx_packets.fetch_add(1, Ordering::Relaxed);
                s.tx_bytes
                    .fetch_add((io.tx_buf.len() - VNET_HDR_LEN) as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                s.tx_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.raw_os_error() == Some(libc::EBADFD) => {
                s.tx_dropped.fetch_add(1, Ordering::Relaxed);
                self.mark_tap_gone(&e);
            }
            Err(e) => {
                // EIO: the interface is down; EINVAL: a frame it refused.
                s.tx_errors.fetch_add(1, Ordering::Relaxed);
                stage_device::guest_warn!(device = %self.name, "tap write failed: {e}");
            }
        }
    }

    /// Moves frames from the tap into receive buffers until the tap is
    /// empty or the guest has no buffer left (then one frame waits in `io`
    /// and the device asks for a notification). Returns frames delivered.
    pub fn process_rx(&self, mem: &GuestMemoryMmap, io: &mut NetIo) -> usize {
        let mut queue = self.lock_queue(RX);
        // Checked without a log line: frames may come before the driver
        // set the queue up, which is no fault of the guest.
        let usable = queue.ready() && queue.is_valid(mem);
        if usable {
            // The tap, not the driver, drives this queue: no notification
            // is needed until it runs out of buffers (then re-armed below).
            self.quiet(&mut queue, mem);
        }
        let s = &self.stats;
        let mut delivered = 0;
        let mut completed = 0;
        // Whether the notification was re-armed since the last buffer taken
        // (a second NoBuffer then ends the round: an available index more
        // than a queue ahead says "more" forever).
        let mut rearmed = false;
        loop {
            let len = match io.rx_pending {
                Some(len) => len,
                None if self.tap_gone() => break,
                None => match self.tap.read_frame(&mut io.rx_buf) {
                    Ok(len) => len,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.mark_tap_gone(&e);
                        break;
                    }
                },
            };
            io.rx_pending = None;
            if len <= VNET_HDR_LEN || len > VNET_HDR_LEN + MAX_FRAME {
                // A runt from the tap, or a frame longer than the guest's
                // buffers are sized for.
                s.rx_dropped.fetch_add(1, Ordering::Relaxed);
                if len > VNET_HDR_LEN + MAX_FRAME {
                    s.oversized.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            if !usable {
                // The queue is not set up: the frame is lost, as on a NIC
                // whose driver is not loaded.
                s.rx_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match self.deliver(&mut queue, mem, &mut io.rx_buf[..len]) {
                Deliver::Done => {
                    delivered += 1;
                    completed += 1;
                    if rearmed {
                        // Buffers came after all: quiet again.
                        self.quiet(&mut queue, mem);
                    }
                    rearmed = false;
                }
                Deliver::Skipped => {
                    io.rx_pending = Some(len);
                    rearmed = false;
                }
                Deliver::Refused => {
                    // The chain was returned empty; try the frame again
                    // with the next buffer.
                    completed += 1;
                    io.rx_pending = Some(len);
                    rearmed = false;
                }
                Deliver::NoBuffer => {
                    io.rx_pending = Some(len);
                    // Buffers the driver posts soon, without an exit.
                    if !rearmed && self.poll_entries(&queue, mem, &mut io.poll, true) {
                        rearmed = true;
                        continue;
                    }
                    // Ask for a notification when buffers come; if some
                    // came meanwhile, go on (once).
                    match queue.enable_notification(mem) {
                        Ok(true) if !rearmed => rearmed = true,
                        Ok(true) => {
                            stage_device::guest_warn!(device = %self.name, "receive available index is more than a queue ahead");
                            break;
                        }
                        _ => break,
                    }
                }
                Deliver::Broken => break,
            }
        }
        if completed > 0 {
            self.signal_used(&mut queue, mem);
        }
        delivered
    }

    /// Writes the frame in `frame` (virtio-net header included) into the
    /// next receive buffer.
    fn deliver(&self, queue: &mut Queue, mem: &GuestMemoryMmap, frame: &mut [u8]) -> Deliver {
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            return Deliver::NoBuffer;
        };
        let head = chain.head_index();
        if head >= queue.size() {
            self.refuse("head names no descriptor of the queue", "rx");
            return Deliver::Skipped;
        }
        let s = &self.stats;
        let outcome = match Self::checked_chain(queue, mem, chain, true) {
            Err(Bad::Chain(why)) => Err(why),
            Ok((_, total)) if total < frame.len() as u64 => Err("receive buffer too small"),
            Ok((descs, _)) => {
                // The header: no offloads, one buffer (`num_buffers`, which
                // VIRTIO 1.x sets even without MRG_RXBUF).
                frame[..VNET_HDR_LEN].fill(0);
                frame[10..12].copy_from_slice(&1u16.to_le_bytes());
                let mut rest: &[u8] = frame;
                let mut ok = true;
                for d in descs {
                    if rest.is_empty() {
                        break;
                    }
                    let n = rest.len().min(d.len() as usize);
                    if mem.write_slice(&rest[..n], d.addr()).is_err() {
                        ok = false;
                        break;
                    }
                    rest = &rest[n..];
                }
                if ok {
                    Ok(())
                } else {
                    Err("buffer outside guest memory")
                }
            }
        };
        let len = match outcome {
            Ok(()) => {
                s.rx_packets.fetch_add(1, Ordering::Relaxed);
                s.rx_bytes
                    .fetch_add((frame.len() - VNET_HDR_LEN) as u64, Ordering::Relaxed);
                frame.len() as u32
            }
            Err(why) => {
                s.rx_errors.fetch_add(1, Ordering::Relaxed);
                self.refuse(why, "rx");
                0
            }
        };
        if queue.add_used(mem, head, len).is_err() {
            stage_device::guest_warn!(device = %self.name, "cannot complete receive chain {head}");
            return Deliver::Broken;
        }
        if len == 0 {
            Deliver::Refused
        } else {
            Deliver::Done
        }
    }
}

/// What became of a frame offered to the receive queue.
enum Deliver {
    /// Written into a buffer and completed.
    Done,
    /// The buffer was refused (completed empty); the frame is still there.
    Refused,
    /// The available ring named no descriptor (nothing to complete); the
    /// frame is still there.
    Skipped,
    /// The guest has posted no buffer.
    NoBuffer,
    /// The used ring cannot be written.
    Broken,
}
