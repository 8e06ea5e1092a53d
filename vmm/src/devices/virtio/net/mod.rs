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
pub mod tap;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{reg, MAGIC, QUEUE_MAX, STATUS_DRIVER_OK, STATUS_FAILED, VENDOR};
pub use stagevm_report::NetReport;
use tap::Tap;

/// virtio device id of a network card.
const DEVICE_ID_NET: u32 = 1;
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

/// Register state of the transport.
struct Regs {
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
}

/// A virtio-mmio network device: transport registers, its two queues, its
/// tap, and the notification `EventFd`s its I/O thread waits on.
pub struct MmioNet {
    /// Device name (`net0`, …).
    pub name: String,
    /// GPA of its register window.
    pub base: u64,
    mac: [u8; 6],
    tap: Tap,
    regs: Mutex<Regs>,
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
            regs: Mutex::new(Regs {
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                status: 0,
            }),
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

    /// The `virtio_mmio.device=` word for the kernel command line.
    pub fn cmdline_word(&self, irq: u32) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{irq}", self.base)
    }

    fn device_features() -> u64 {
        (1u64 << VIRTIO_F_VERSION_1) | NET_F_MAC | RING_F_EVENT_IDX
    }

    fn lock_regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_queue(&self, index: usize) -> MutexGuard<'_, Queue> {
        self.queues[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A guest read of `data.len()` bytes at `offset` in the register window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            // Config space (VIRTIO 1.2 §5.1.4): mac[6], then status (not
            // offered: zeros).
            let start = (offset - reg::CONFIG) as usize;
            for (i, b) in data.iter_mut().enumerate() {
                *b = self.mac.get(start + i).copied().unwrap_or(0);
            }
            return;
        }
        let regs = self.lock_regs();
        let queue = match regs.queue_sel {
            0 => Some(RX),
            1 => Some(TX),
            _ => None,
        };
        let value: u32 = match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => 2,
            reg::DEVICE_ID => DEVICE_ID_NET,
            reg::VENDOR_ID => VENDOR,
            reg::DEVICE_FEATURES => match regs.device_features_sel {
                0 => Self::device_features() as u32,
                1 => (Self::device_features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX if queue.is_some() => u32::from(QUEUE_MAX),
            reg::QUEUE_READY => queue.map_or(0, |q| u32::from(self.lock_queue(q).ready())),
            reg::INTERRUPT_STATUS => self.interrupt_status.load(Ordering::Acquire),
            reg::STATUS => regs.status,
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    /// A guest write at `offset`. Returns the queue a `QueueNotify` names
    /// (which the caller forwards to the I/O thread when no ioeventfd is
    /// bound), if it names one of ours.
    pub fn write(&self, offset: u64, data: &[u8]) -> Option<usize> {
        let mut raw = [0u8; 4];
        let n = data.len().min(4);
        raw[..n].copy_from_slice(&data[..n]);
        let v = u32::from_le_bytes(raw);
        let mut regs = self.lock_regs();
        match offset {
            reg::DEVICE_FEATURES_SEL => regs.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => regs.driver_features_sel = v,
            reg::DRIVER_FEATURES => match regs.driver_features_sel {
                0 => regs.driver_features = (regs.driver_features & !0xffff_ffff) | u64::from(v),
                1 => {
                    regs.driver_features =
                        (regs.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                }
                _ => {}
            },
            reg::QUEUE_SEL => regs.queue_sel = v,
            reg::QUEUE_NOTIFY => return (v < 2).then_some(v as usize),
            reg::INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!v, Ordering::AcqRel);
            }
            reg::STATUS => {
                if v == 0 {
                    // Device reset (VIRTIO 1.2 §2.1.2).
                    regs.driver_features = 0;
                    for q in [RX, TX] {
                        self.lock_queue(q).reset();
                    }
                } else if v & STATUS_DRIVER_OK != 0 {
                    if regs.driver_features & !Self::device_features() != 0 {
                        crate::guest_warn!(device = %self.name, "driver accepted unoffered features");
                        regs.status = v | STATUS_FAILED;
                        return None;
                    }
                    let event_idx = regs.driver_features & RING_F_EVENT_IDX != 0;
                    for q in [RX, TX] {
                        self.lock_queue(q).set_event_idx(event_idx);
                    }
                    self.event_idx.store(event_idx, Ordering::Release);
                }
                regs.status = v;
            }
            _ => match regs.queue_sel {
                0 => self.write_queue(RX, offset, v),
                1 => self.write_queue(TX, offset, v),
                _ => {}
            },
        }
        None
    }

    /// A write to queue `index`'s registers, checked as virtio-blk's are
    /// (VIRTIO 1.2 §2.7: size a power of two ≤ `QueueNumMax`; descriptor
    /// table 16-, driver area 2-, device area 4-byte aligned).
    fn write_queue(&self, index: usize, offset: u64, v: u32) {
        let bad = |what: &str| {
            crate::guest_warn!(device = %self.name, value = v, "queue register write refused: {what}");
        };
        let mut q = self.lock_queue(index);
        match offset {
            reg::QUEUE_NUM if v == 0 => {}
            reg::QUEUE_NUM if v > u32::from(QUEUE_MAX) || !v.is_power_of_two() => {
                bad("size not a power of two up to 256")
            }
            reg::QUEUE_NUM => q.set_size(v as u16),
            reg::QUEUE_READY => q.set_ready(v == 1),
            reg::QUEUE_DESC_LOW if !v.is_multiple_of(16) => {
                bad("descriptor table not 16-byte aligned")
            }
            reg::QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
            reg::QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
            reg::QUEUE_DRIVER_LOW if !v.is_multiple_of(2) => bad("driver area not 2-byte aligned"),
            reg::QUEUE_DRIVER_LOW => q.set_avail_ring_address(Some(v), None),
            reg::QUEUE_DRIVER_HIGH => q.set_avail_ring_address(None, Some(v)),
            reg::QUEUE_DEVICE_LOW if !v.is_multiple_of(4) => bad("device area not 4-byte aligned"),
            reg::QUEUE_DEVICE_LOW => q.set_used_ring_address(Some(v), None),
            reg::QUEUE_DEVICE_HIGH => q.set_used_ring_address(None, Some(v)),
            _ => {}
        }
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
