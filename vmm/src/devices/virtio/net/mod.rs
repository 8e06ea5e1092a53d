//! virtio-net (VIRTIO 1.2 §5.1) on the virtio-mmio transport, over a tap
//! ([`tap`]), served on its own helper I/O thread (`io-net<N>`, [`io`]).
//!
//! Queues: 0 is receiveq (frames to the guest), 1 is transmitq. Features
//! offered: `VIRTIO_F_VERSION_1`, `VIRTIO_NET_F_MAC` (the MAC in config
//! space) and `VIRTIO_RING_F_EVENT_IDX` (notification suppression both
//! ways: the device publishes `avail_event` and interrupts only past the
//! driver's `used_event`). No offloads and no `VIRTIO_NET_F_MRG_RXBUF`: the
//! driver posts receive buffers big enough for a whole frame (VIRTIO 1.2
//! §5.1.6.3.1: at least 1526 bytes without offloads), and frames are at most
//! [`MAX_FRAME`] bytes (1514 plus an 802.1Q tag) in both directions; longer
//! ones are dropped and counted (`oversized`).
//!
//! Each queue's `QueueNotify` write (value = the queue's index) is bound to
//! its own `EventFd` with a KVM ioeventfd with data match; if KVM refuses,
//! the vCPU's MMIO exit writes the `EventFd` instead (as virtio-blk does).

pub mod io;
pub mod serve;
pub mod tap;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

#[cfg(test)]
use super::mmio::reg;
use super::mmio::{self, VirtioDevice};
use super::QUEUE_MAX;
pub use stagevm_report::NetReport;
use tap::Tap;
/// `VIRTIO_NET_F_MAC` (VIRTIO 1.2 §5.1.3).
const NET_F_MAC: u64 = 1 << 5;
/// `VIRTIO_RING_F_EVENT_IDX` (VIRTIO 1.2 §6).
const RING_F_EVENT_IDX: u64 = 1 << 29;
/// Index of the receive queue.
pub const RX: usize = 0;
/// Index of the transmit queue.
pub const TX: usize = 1;
/// Largest Ethernet frame (bytes, without the virtio-net header) carried in
/// either direction: 1500 bytes of payload, the 14-byte header and an
/// 802.1Q tag.
pub const MAX_FRAME: usize = 1518;

/// Counters of one network device (frames count without the virtio-net
/// header; bytes are frame bytes).
#[derive(Debug, Default)]
pub struct NetStats {
    /// Frames delivered to the guest.
    pub rx_packets: AtomicU64,
    /// Bytes delivered to the guest.
    pub rx_bytes: AtomicU64,
    /// Frames from the tap not delivered (oversized, runt).
    pub rx_dropped: AtomicU64,
    /// Receive buffers the device could not use (bad chains).
    pub rx_errors: AtomicU64,
    /// Frames the guest sent that went out on the tap.
    pub tx_packets: AtomicU64,
    /// Bytes sent out on the tap.
    pub tx_bytes: AtomicU64,
    /// Frames the guest sent that were not sent (oversized, tap full or
    /// gone).
    pub tx_dropped: AtomicU64,
    /// Transmit chains the device refused (bad chains) or the tap refused.
    pub tx_errors: AtomicU64,
    /// Descriptor chains refused (either queue): indirect, looping, wrong
    /// direction, outside guest memory, a head outside the queue.
    pub bad_chains: AtomicU64,
    /// Frames longer than [`MAX_FRAME`] dropped (either direction).
    pub oversized: AtomicU64,
    /// The driver's `QueueNotify` writes for receiveq (each one a VM exit,
    /// handled in KVM with an ioeventfd or by the vCPU thread without).
    pub rx_notifications: AtomicU64,
    /// The driver's `QueueNotify` writes for transmitq.
    pub tx_notifications: AtomicU64,
    /// Used-buffer interrupts raised (irqfd writes).
    pub interrupts: AtomicU64,
    /// Polls of an empty queue not made (`io::PollBudget`): the
    /// notification brought nothing new since the last fruitless one, or
    /// the second's poll budget was spent.
    pub polls_skipped: AtomicU64,
    /// Receive notifications that brought no new buffer and let no frame
    /// through, each muting the receive notification for `io::RX_MUTE`.
    pub rx_muted: AtomicU64,
}

/// A virtio-net device (its registers are [`mmio::MmioTransport`]'s): its
/// two queues, its tap, and the notification `EventFd`s its I/O thread
/// waits on.
pub struct MmioNet {
    /// Device name (`net0`, …).
    pub name: String,
    /// GPA of its register window.
    pub base: u64,
    mac: [u8; 6],
    tap: Tap,
    queues: [Mutex<Queue>; 2],
    interrupt_status: AtomicU32,
    /// Written by the guest's `QueueNotify` of queue 0 (receiveq) and 1
    /// (transmitq).
    pub notify: [EventFd; 2],
    irq: Option<EventFd>,
    /// Counters.
    pub stats: NetStats,
    /// Set once the tap has gone (its interface deleted).
    tap_gone: std::sync::atomic::AtomicBool,
    /// Whether the driver negotiated `VIRTIO_RING_F_EVENT_IDX`.
    event_idx: std::sync::atomic::AtomicBool,
    /// How long an empty queue is watched before a notification is asked
    /// for ([`io::POLL_WINDOW`]; 0 in the fuzz target).
    poll_window: std::time::Duration,
}

impl MmioNet {
    /// A network device named `name` at `base` over `tap`, with `mac`.
    /// Errors: an `EventFd` cannot be created.
    pub fn new(name: String, base: u64, mac: [u8; 6], tap: Tap) -> std::io::Result<Self> {
        let queue = || {
            Queue::new(QUEUE_MAX)
                .map(Mutex::new)
                .map_err(|e| std::io::Error::other(format!("{e:?}")))
        };
        let efd = || EventFd::new(libc::EFD_NONBLOCK);
        Ok(Self {
            name,
            base,
            mac,
            tap,
            queues: [queue()?, queue()?],
            interrupt_status: AtomicU32::new(0),
            notify: [efd()?, efd()?],
            irq: None,
            stats: NetStats::default(),
            tap_gone: Default::default(),
            event_idx: Default::default(),
            poll_window: io::POLL_WINDOW,
        })
    }

    /// Raises `irq` (an irqfd) when the driver asks for a used-buffer
    /// notification (VIRTIO 1.2 §2.7.10).
    pub fn set_irq(&mut self, irq: EventFd) {
        self.irq = Some(irq);
    }

    /// Watches an empty queue for `window` (instead of [`io::POLL_WINDOW`])
    /// before asking for a notification; zero asks at once.
    pub fn set_poll_window(&mut self, window: std::time::Duration) {
        self.poll_window = window;
    }

    /// The MAC address offered in config space.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn lock_queue(&self, index: usize) -> MutexGuard<'_, Queue> {
        self.queues[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counters for the report; `ioeventfd` tells how notifications arrive.
    pub fn report(&self, ioeventfd: bool) -> NetReport {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetReport {
            name: self.name.clone(),
            tap: self.tap.name.clone(),
            mac: format_mac(&self.mac),
            notify: if ioeventfd { "ioeventfd" } else { "mmio-exit" }.into(),
            rx_packets: get(&s.rx_packets),
            rx_bytes: get(&s.rx_bytes),
            rx_dropped: get(&s.rx_dropped),
            rx_errors: get(&s.rx_errors),
            tx_packets: get(&s.tx_packets),
            tx_bytes: get(&s.tx_bytes),
            tx_dropped: get(&s.tx_dropped),
            tx_errors: get(&s.tx_errors),
            bad_chains: get(&s.bad_chains),
            oversized: get(&s.oversized),
            rx_notifications: get(&s.rx_notifications),
            tx_notifications: get(&s.tx_notifications),
            interrupts: get(&s.interrupts),
            polls_skipped: get(&s.polls_skipped),
            rx_muted: get(&s.rx_muted),
            tap_gone: self.tap_gone.load(Ordering::Relaxed),
        }
    }
}

impl VirtioDevice for MmioNet {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn base(&self) -> u64 {
        self.base
    }

    fn device_features(&self) -> u64 {
        (1u64 << VIRTIO_F_VERSION_1) | NET_F_MAC | RING_F_EVENT_IDX
    }

    fn queues(&self) -> &[Mutex<Queue>] {
        &self.queues
    }

    fn notify(&self, index: usize) -> &EventFd {
        &self.notify[index]
    }

    fn interrupt_status(&self) -> &AtomicU32 {
        &self.interrupt_status
    }

    /// Config space (VIRTIO 1.2 §5.1.4): `mac[6]`, then status (not offered:
    /// zeros).
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        mmio::read_bytes(&self.mac, offset, data);
    }

    /// Notification suppression both ways when the driver took
    /// `VIRTIO_RING_F_EVENT_IDX`.
    fn activate(&self, features: u64) {
        let event_idx = features & RING_F_EVENT_IDX != 0;
        for q in [RX, TX] {
            self.lock_queue(q).set_event_idx(event_idx);
        }
        self.event_idx.store(event_idx, Ordering::Release);
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A random locally administered unicast MAC (first byte `x2`, `x6`, `xa`
/// or `xe`), from the standard library's per-process random hash keys.
pub fn generate_mac() -> [u8; 6] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    let r = h.finish().to_le_bytes();
    [(r[0] & 0xfc) | 0x02, r[1], r[2], r[3], r[4], r[5]]
}

#[cfg(test)]
mod tests;
