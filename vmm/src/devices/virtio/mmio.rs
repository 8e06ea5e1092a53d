//! The virtio-mmio transport (VIRTIO 1.2 §4.2, version 2 "modern" register
//! layout): the one implementation of the register protocol, over any
//! [`VirtioDevice`] (block, network), as Firecracker's
//! `devices/virtio/transport/mmio.rs` does.
//!
//! The transport owns the registers the driver negotiates with (feature
//! selection, driver features, queue selection, device status) and checks
//! every value before it reaches a device or `virtio-queue`; a device
//! gives its type, features, queues, notification `EventFd`s, interrupt
//! status and config space, and hears of activation ([`VirtioDevice::
//! activate`]). Register offsets are `virtio_bindings`'
//! (`linux/virtio_mmio.h`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FAILED};
use virtio_bindings::virtio_mmio as b;
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::QUEUE_MAX;

/// Register offsets in the device's 4 KiB window (VIRTIO 1.2 §4.2.2,
/// table "MMIO Device Register Layout"; `virtio_bindings::virtio_mmio`).
pub mod reg {
    use super::b;

    /// "virt".
    pub const MAGIC: u64 = b::VIRTIO_MMIO_MAGIC_VALUE as u64;
    /// 2: the modern layout.
    pub const VERSION: u64 = b::VIRTIO_MMIO_VERSION as u64;
    /// The virtio device id (1 network, 2 block).
    pub const DEVICE_ID: u64 = b::VIRTIO_MMIO_DEVICE_ID as u64;
    /// Our vendor id.
    pub const VENDOR_ID: u64 = b::VIRTIO_MMIO_VENDOR_ID as u64;
    /// 32 feature bits of the device, selected by `DEVICE_FEATURES_SEL`.
    pub const DEVICE_FEATURES: u64 = b::VIRTIO_MMIO_DEVICE_FEATURES as u64;
    /// Which 32 bits `DEVICE_FEATURES` shows.
    pub const DEVICE_FEATURES_SEL: u64 = b::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
    /// 32 feature bits the driver accepts, selected by `DRIVER_FEATURES_SEL`.
    pub const DRIVER_FEATURES: u64 = b::VIRTIO_MMIO_DRIVER_FEATURES as u64;
    /// Which 32 bits `DRIVER_FEATURES` sets.
    pub const DRIVER_FEATURES_SEL: u64 = b::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
    /// The queue the queue registers address.
    pub const QUEUE_SEL: u64 = b::VIRTIO_MMIO_QUEUE_SEL as u64;
    /// Largest size of the selected queue.
    pub const QUEUE_NUM_MAX: u64 = b::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
    /// Size of the selected queue.
    pub const QUEUE_NUM: u64 = b::VIRTIO_MMIO_QUEUE_NUM as u64;
    /// The selected queue is ready.
    pub const QUEUE_READY: u64 = b::VIRTIO_MMIO_QUEUE_READY as u64;
    /// A queue notification (the value names the queue).
    pub const QUEUE_NOTIFY: u64 = b::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
    /// Why the device interrupted.
    pub const INTERRUPT_STATUS: u64 = b::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
    /// Bits of `INTERRUPT_STATUS` the driver handled.
    pub const INTERRUPT_ACK: u64 = b::VIRTIO_MMIO_INTERRUPT_ACK as u64;
    /// Device status (VIRTIO 1.2 §2.1); 0 resets.
    pub const STATUS: u64 = b::VIRTIO_MMIO_STATUS as u64;
    /// Descriptor table GPA, low 32 bits.
    pub const QUEUE_DESC_LOW: u64 = b::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
    /// Descriptor table GPA, high 32 bits.
    pub const QUEUE_DESC_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
    /// Driver (available) area GPA, low 32 bits.
    pub const QUEUE_DRIVER_LOW: u64 = b::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
    /// Driver (available) area GPA, high 32 bits.
    pub const QUEUE_DRIVER_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
    /// Device (used) area GPA, low 32 bits.
    pub const QUEUE_DEVICE_LOW: u64 = b::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
    /// Device (used) area GPA, high 32 bits.
    pub const QUEUE_DEVICE_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
    /// Config space generation (always 0: the config never changes).
    pub const CONFIG_GENERATION: u64 = b::VIRTIO_MMIO_CONFIG_GENERATION as u64;
    /// Start of the device's config space.
    pub const CONFIG: u64 = b::VIRTIO_MMIO_CONFIG as u64;

    /// Every register above and the first three words of config space:
    /// the offsets the fuzz targets pick from.
    pub const ALL: [u64; 26] = [
        MAGIC,
        VERSION,
        DEVICE_ID,
        VENDOR_ID,
        DEVICE_FEATURES,
        DEVICE_FEATURES_SEL,
        DRIVER_FEATURES,
        DRIVER_FEATURES_SEL,
        QUEUE_SEL,
        QUEUE_NUM_MAX,
        QUEUE_NUM,
        QUEUE_READY,
        QUEUE_NOTIFY,
        INTERRUPT_STATUS,
        INTERRUPT_ACK,
        STATUS,
        QUEUE_DESC_LOW,
        QUEUE_DESC_HIGH,
        QUEUE_DRIVER_LOW,
        QUEUE_DRIVER_HIGH,
        QUEUE_DEVICE_LOW,
        QUEUE_DEVICE_HIGH,
        CONFIG_GENERATION,
        CONFIG,
        CONFIG + 4,
        CONFIG + 8,
    ];
}

/// "virt" in little endian.
pub const MAGIC: u32 = 0x7472_6976;
/// Our vendor id ("SVM ").
pub const VENDOR: u32 = 0x2053_564d;
/// `InterruptStatus` bit: the device used buffers (VIRTIO 1.2 §4.2.2).
pub const INT_VRING: u32 = b::VIRTIO_MMIO_INT_VRING;

/// What the transport needs of a device.
pub trait VirtioDevice: Send + Sync {
    /// virtio device id (VIRTIO 1.2 §5: 1 network card, 2 block device).
    fn device_type(&self) -> u32;
    /// The device's name in log lines (`blk0`, `net0`).
    fn name(&self) -> &str;
    /// GPA of its 4 KiB register window.
    fn base(&self) -> u64;
    /// Feature bits offered (VIRTIO 1.2 §6).
    fn device_features(&self) -> u64;
    /// Its queues, by index.
    fn queues(&self) -> &[Mutex<Queue>];
    /// The `EventFd` a `QueueNotify` of queue `index` writes (through a KVM
    /// ioeventfd, or the MMIO exit when KVM refused one).
    fn notify(&self, index: usize) -> &EventFd;
    /// `InterruptStatus`, which the device's I/O thread sets.
    fn interrupt_status(&self) -> &AtomicU32;
    /// Fills `data` from config space at `offset` (bytes past the end
    /// read as zeros).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver wrote a status with `DRIVER_OK` having accepted
    /// `features` (a subset of [`VirtioDevice::device_features`], checked);
    /// may come more than once.
    fn activate(&self, _features: u64) {}
}

/// The kernel command-line word (`virtio_mmio.device=4K@BASE:IRQ`, Linux's
/// `virtio_mmio` driver) of the window at GPA `base` interrupting on `irq`.
pub fn cmdline_word(base: u64, irq: u32) -> String {
    format!("virtio_mmio.device=4K@{base:#x}:{irq}")
}

/// The copy of `bytes` at `offset` of `space` into `data`, zeros past its
/// end (a config space read).
pub fn read_bytes(space: &[u8], offset: u64, data: &mut [u8]) {
    for (i, d) in data.iter_mut().enumerate() {
        let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
        *d = at.and_then(|a| space.get(a)).copied().unwrap_or(0);
    }
}

/// Register state the driver negotiates with.
#[derive(Default)]
struct Regs {
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
}

/// One device's register window.
pub struct MmioTransport {
    device: Arc<dyn VirtioDevice>,
    regs: Mutex<Regs>,
    /// Whether KVM delivers the queue notifications itself (ioeventfd);
    /// else [`MmioTransport::write`] writes the device's `EventFd`.
    ioeventfd: bool,
}

impl MmioTransport {
    /// The window of `device`; `ioeventfd` tells whether KVM signals its
    /// queue notifications itself.
    pub fn new(device: Arc<dyn VirtioDevice>, ioeventfd: bool) -> Self {
        Self {
            device,
            regs: Mutex::default(),
            ioeventfd,
        }
    }

    /// The device behind the window.
    pub fn device(&self) -> &Arc<dyn VirtioDevice> {
        &self.device
    }

    /// Whether KVM delivers its notifications (ioeventfd).
    pub fn ioeventfd(&self) -> bool {
        self.ioeventfd
    }

    fn lock_regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn queue(&self, index: u32) -> Option<MutexGuard<'_, Queue>> {
        let q = self.device.queues().get(usize::try_from(index).ok()?)?;
        Some(q.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A guest read of `data.len()` bytes at `offset` in the window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            return self.device.read_config(offset - reg::CONFIG, data);
        }
        let regs = self.lock_regs();
        let features = self.device.device_features();
        let value: u32 = match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => 2,
            reg::DEVICE_ID => self.device.device_type(),
            reg::VENDOR_ID => VENDOR,
            reg::DEVICE_FEATURES => match regs.device_features_sel {
                0 => features as u32,
                1 => (features >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => self
                .queue(regs.queue_sel)
                .map_or(0, |_| u32::from(QUEUE_MAX)),
            reg::QUEUE_READY => self
                .queue(regs.queue_sel)
                .map_or(0, |q| u32::from(q.ready())),
            reg::INTERRUPT_STATUS => self.device.interrupt_status().load(Ordering::Acquire),
            reg::STATUS => regs.status,
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    /// A guest write of `data` at `offset` in the window. A `QueueNotify`
    /// naming one of the device's queues writes that queue's `EventFd`
    /// when KVM does not (no ioeventfd); returns the queue notified.
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
            reg::QUEUE_NOTIFY => {
                let index = usize::try_from(v).ok()?;
                if index >= self.device.queues().len() {
                    return None;
                }
                if !self.ioeventfd {
                    let _ = self.device.notify(index).write(1);
                }
                return Some(index);
            }
            reg::INTERRUPT_ACK => {
                self.device
                    .interrupt_status()
                    .fetch_and(!v, Ordering::AcqRel);
            }
            reg::STATUS => self.write_status(&mut regs, v),
            _ => {
                if let Some(q) = self.queue(regs.queue_sel) {
                    self.write_queue(q, offset, v);
                }
            }
        }
        None
    }

    /// A `Status` write: 0 resets the device (VIRTIO 1.2 §2.1.2);
    /// `DRIVER_OK` with features never offered fails it, else activates it.
    fn write_status(&self, regs: &mut Regs, v: u32) {
        if v == 0 {
            regs.driver_features = 0;
            for q in self.device.queues() {
                q.lock().unwrap_or_else(|p| p.into_inner()).reset();
            }
        } else if v & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            if regs.driver_features & !self.device.device_features() != 0 {
                stage_device::guest_warn!(device = %self.device.name(), "driver accepted unoffered features");
                regs.status = v | VIRTIO_CONFIG_S_FAILED;
                return;
            }
            self.device.activate(regs.driver_features);
        }
        regs.status = v;
    }

    /// A write to the selected queue's registers. Values virtio-queue would
    /// refuse (and log without a limit) are refused here first, with one
    /// rate-limited line (VIRTIO 1.2 §2.7: size a power of two ≤
    /// `QueueNumMax`; descriptor table 16-, driver area 2-, device area
    /// 4-byte aligned).
    fn write_queue(&self, mut q: MutexGuard<'_, Queue>, offset: u64, v: u32) {
        let bad = |what: &str| {
            stage_device::guest_warn!(device = %self.device.name(), value = v, "queue register write refused: {what}");
        };
        match offset {
            // Drivers write 0 when they tear a queue down; keep the size.
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
}

/// For the devices' unit tests: a device behind its register window, as a
/// driver sees both (KVM delivers notifications: a `QueueNotify` only
/// names the queue); the device's own methods through `Deref`.
#[cfg(test)]
pub(crate) struct TestDriver<D> {
    dev: Arc<D>,
    regs: MmioTransport,
}

#[cfg(test)]
impl<D: VirtioDevice + 'static> TestDriver<D> {
    /// `dev` behind a window.
    pub(crate) fn new(dev: D) -> Self {
        let dev = Arc::new(dev);
        Self {
            regs: MmioTransport::new(dev.clone(), true),
            dev,
        }
    }

    /// A read of the window at `offset`.
    pub(crate) fn read(&self, offset: u64, data: &mut [u8]) {
        self.regs.read(offset, data)
    }

    /// A write to the window at `offset`; the queue a `QueueNotify` named.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Option<usize> {
        self.regs.write(offset, data)
    }
}

#[cfg(test)]
impl<D> std::ops::Deref for TestDriver<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.dev
    }
}
