//! virtio-mmio devices (VIRTIO 1.2 §4.2, version 2 "modern" register
//! layout) whose requests are served on a helper I/O thread per device.
//!
//! Placement: device `i` occupies 4 KiB at [`MMIO_BASE`] + `i` × 4 KiB, above
//! the largest guest RAM (3 GiB); the VMM maps that window user-accessible in
//! the guest's page tables and describes each device on the kernel command
//! line in Linux's format, `virtio_mmio.device=4K@0xd0000000:5` (for a
//! Linux guest with ACPI: in the DSDT instead, `LNRO0005`).
//!
//! Notification: the driver's `QueueNotify` write is bound to an `EventFd`
//! with KVM's `ioeventfd` (no exit to user space on the vCPU thread); if KVM
//! refuses, the vCPU's MMIO exit writes the `EventFd` instead (documented
//! fallback). The I/O thread (`io-blk<N>`) waits on that `EventFd`.
//!
//! Completion: measured first (`just bench-irq`, `bench/src/irq.rs`, a raw
//! KVM guest on these machines, 5 runs of 500–5000 samples): delivering one
//! interrupt to a ring-3 guest — MSI, ring-0 handler (emulated), EOI,
//! `iretq` — takes 7–12 µs from the host's `KVM_SIGNAL_MSI` to the handler's
//! store, about one MMIO exit (8.6–9.6 µs in the same probe; ~26 µs through
//! stagevm's full exit path from the test guest). Polling the used ring from
//! ring 3 costs no exit at all and needs no irqchip, IDT, TSS or kernel-mode
//! code in the guest, and the guest's blocking driver calls wait for the
//! completion anyway; so the test guest runs with interrupts off and polls
//! (`virtio-drivers`' blocking calls do exactly that), and the device only
//! sets `InterruptStatus`. A Linux guest sleeps while its I/O is in flight:
//! for it the device also raises a GSI of the in-kernel I/O APIC through an
//! irqfd (described in the DSDT, [`crate::arch::x86_64::acpi`]).

pub mod block;
pub mod disk;
pub mod net;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use self::block::Block;

/// GPA of the first virtio-mmio device.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Bytes of MMIO space per device.
pub const MMIO_SIZE: u64 = 0x1000;
/// First (nominal) interrupt line announced on the command line.
pub const FIRST_IRQ: u32 = 5;
/// Where device `index` lives: the GPA of its register window
/// ([`MMIO_BASE`] + `index` × [`MMIO_SIZE`]) and its interrupt line
/// ([`FIRST_IRQ`] + `index`). The one place both are computed (the device,
/// the command line and the DSDT use it).
pub fn slot(index: usize) -> (u64, u32) {
    (
        MMIO_BASE + index as u64 * MMIO_SIZE,
        FIRST_IRQ + index as u32,
    )
}

/// Largest queue the device offers (`QueueNumMax`).
pub const QUEUE_MAX: u16 = 256;

/// Register offsets (VIRTIO 1.2 §4.2.2, table "MMIO Device Register Layout").
mod reg {
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

/// "virt" in little endian.
const MAGIC: u32 = 0x7472_6976;
/// Our vendor id ("SVM ").
const VENDOR: u32 = 0x2053_564d;
/// virtio device id of a block device.
const DEVICE_ID_BLOCK: u32 = 2;
/// Device status bits (VIRTIO 1.2 §2.1).
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FAILED: u32 = 128;
/// Feature bits of virtio-blk (VIRTIO 1.2 §5.2.3).
const BLK_F_RO: u64 = 1 << 5;
const BLK_F_FLUSH: u64 = 1 << 9;

/// Register state of one device's transport.
struct Regs {
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
}

/// A virtio-mmio block device: transport registers, its one request queue,
/// and the notification `EventFd` its I/O thread waits on.
pub struct MmioBlock {
    /// Device name (`blk0`, …).
    pub name: String,
    /// Backing file path (for reports).
    pub path: String,
    /// GPA of its register window.
    pub base: u64,
    block: Block,
    regs: Mutex<Regs>,
    queue: Mutex<Queue>,
    interrupt_status: AtomicU32,
    /// Written by the guest's `QueueNotify` (through ioeventfd or the MMIO
    /// exit fallback).
    pub notify: EventFd,
    /// The used-buffer interrupt: an irqfd on the in-kernel irqchip (Linux
    /// guests); `None` for the ring-3 guest, which polls.
    irq: Option<EventFd>,
}

impl MmioBlock {
    /// A block device named `name` at `base` over `block`. Errors: the
    /// notification `EventFd` cannot be created.
    pub fn new(name: String, path: String, base: u64, block: Block) -> std::io::Result<Self> {
        Ok(Self {
            name,
            path,
            base,
            block,
            regs: Mutex::new(Regs {
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                status: 0,
            }),
            // QUEUE_MAX is a power of two ≤ 32768: never an error.
            queue: Mutex::new(
                Queue::new(QUEUE_MAX).map_err(|e| std::io::Error::other(format!("{e:?}")))?,
            ),
            interrupt_status: AtomicU32::new(0),
            notify: EventFd::new(libc::EFD_NONBLOCK)?,
            irq: None,
        })
    }

    /// Raises `irq` (an irqfd) after each batch of completions, with the
    /// used-buffer bit in `InterruptStatus` (VIRTIO 1.2 §4.2.3.4).
    pub fn set_irq(&mut self, irq: EventFd) {
        self.irq = Some(irq);
    }

    /// The backend.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// The `virtio_mmio.device=` word for the kernel command line.
    pub fn cmdline_word(&self, irq: u32) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{irq}", self.base)
    }

    fn device_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1) | BLK_F_FLUSH;
        if self.block.readonly() {
            f |= BLK_F_RO;
        }
        f
    }

    fn lock_regs(&self) -> std::sync::MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A guest read of `data.len()` bytes at `offset` in the register window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            // Config space: capacity (le64 sectors) at 0, then zeros.
            let mut config = [0u8; 8];
            config.copy_from_slice(&self.block.sectors().to_le_bytes());
            let start = (offset - reg::CONFIG) as usize;
            for (i, b) in data.iter_mut().enumerate() {
                *b = config.get(start + i).copied().unwrap_or(0);
            }
            return;
        }
        let regs = self.lock_regs();
        let value: u32 = match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => 2,
            reg::DEVICE_ID => DEVICE_ID_BLOCK,
            reg::VENDOR_ID => VENDOR,
            reg::DEVICE_FEATURES => match regs.device_features_sel {
                0 => self.device_features() as u32,
                1 => (self.device_features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX if regs.queue_sel == 0 => u32::from(QUEUE_MAX),
            reg::QUEUE_READY if regs.queue_sel == 0 => u32::from(self.lock_queue().ready()),
            reg::INTERRUPT_STATUS => self.interrupt_status.load(Ordering::Acquire),
            reg::STATUS => regs.status,
            reg::CONFIG_GENERATION => 0,
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    /// A guest write at `offset`. Returns true for a queue notification
    /// (which the caller forwards to the I/O thread when no ioeventfd is
    /// bound).
    pub fn write(&self, offset: u64, data: &[u8]) -> bool {
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
            reg::QUEUE_NOTIFY => return true,
            reg::INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!v, Ordering::AcqRel);
            }
            reg::STATUS => {
                if v == 0 {
                    // Device reset (VIRTIO 1.2 §2.1.2).
                    regs.driver_features = 0;
                    self.lock_queue().reset();
                } else if v & STATUS_DRIVER_OK != 0
                    && regs.driver_features & !self.device_features() != 0
                {
                    // Features we never offered: refuse the device.
                    crate::guest_warn!(device = %self.name, "driver accepted unoffered features");
                    regs.status = v | STATUS_FAILED;
                    return false;
                }
                regs.status = v;
            }
            _ if regs.queue_sel != 0 => {}
            _ => self.write_queue(offset, v),
        }
        false
    }

    /// A write to the selected queue's registers. Values virtio-queue would
    /// refuse (and log without a limit) are refused here first, with one
    /// rate-limited line (VIRTIO 1.2 §2.7: size a power of two ≤
    /// `QueueNumMax`; descriptor table 16-, driver area 2-, device area
    /// 4-byte aligned).
    fn write_queue(&self, offset: u64, v: u32) {
        let bad = |what: &str| {
            crate::guest_warn!(device = %self.name, value = v, "queue register write refused: {what}");
        };
        let mut q = self.lock_queue();
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

    /// Serves every available request of the queue; returns how many. A
    /// queue the driver set up wrongly (outside memory, not ready) serves
    /// nothing.
    pub fn process(&self, mem: &GuestMemoryMmap) -> usize {
        let mut queue = self.lock_queue();
        // `is_valid` logs (unlimited, through `log`) why a queue is unusable;
        // main.rs silences virtio_queue's own lines and this one is limited.
        if !queue.ready() || !queue.is_valid(mem) {
            crate::guest_warn!(device = %self.name, "notified queue is not ready or lies outside guest memory");
            return 0;
        }
        let mut served = 0;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            if head >= queue.size() {
                // No such descriptor: nothing to serve, nothing to complete.
                self.block.stats.bad_heads.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(device = %self.name, "available ring names descriptor {head}");
                continue;
            }
            // VIRTIO_F_INDIRECT_DESC is not offered (VIRTIO 1.2 §2.7.5.3.1:
            // the driver MUST NOT use indirect descriptors then), but
            // virtio-queue would follow them: refuse such a chain.
            if uses_indirect(mem, queue.desc_table(), queue.size(), head) {
                self.block.stats.dropped.fetch_add(1, Ordering::Relaxed);
                crate::guest_warn!(device = %self.name, "request {head} uses indirect descriptors, which were not offered");
                if queue.add_used(mem, head, 0).is_err() {
                    break;
                }
                served += 1;
                continue;
            }
            let len = self.block.handle(mem, chain);
            if queue.add_used(mem, head, len).is_err() {
                crate::guest_warn!(device = %self.name, "cannot complete request {head}");
                break;
            }
            served += 1;
        }
        if served > 0 {
            // Used-buffer notification: the bit the ring-3 guest polls, and
            // the interrupt of a Linux guest (see module docs).
            self.interrupt_status.fetch_or(1, Ordering::AcqRel);
            if let Some(irq) = &self.irq {
                if let Err(e) = irq.write(1) {
                    tracing::warn!(device = %self.name, "cannot raise the interrupt: {e}");
                }
            }
        }
        served
    }

    /// The I/O thread's loop: waits (epoll) for notifications and serves
    /// the queue until the VM's `exit` `EventFd` is readable. Errors: the
    /// epoll set cannot be created.
    pub fn serve(&self, mem: &GuestMemoryMmap, exit: &EventFd) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        const EXIT: u64 = 0;
        const NOTIFY: u64 = 1;
        let mut poller = crate::poll::Poller::new(&[
            (exit.as_raw_fd(), EXIT),
            (self.notify.as_raw_fd(), NOTIFY),
        ])?;
        loop {
            if poller.wait()?.contains(&EXIT) {
                return Ok(());
            }
            let _ = self.notify.read();
            self.process(mem);
        }
    }

    /// Counters for the report; `ioeventfd` tells how notifications arrive.
    pub fn report(&self, ioeventfd: bool) -> block::BlockReport {
        let s = &self.block.stats;
        block::BlockReport {
            name: self.name.clone(),
            path: self.path.clone(),
            readonly: self.block.readonly(),
            notify: if ioeventfd { "ioeventfd" } else { "mmio-exit" }.into(),
            sectors: self.block.sectors(),
            ok: s.ok.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            bad_heads: s.bad_heads.load(Ordering::Relaxed),
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
            bytes_written: s.bytes_written.load(Ordering::Relaxed),
        }
    }
}

/// Descriptor flags (VIRTIO 1.2 §2.7.5): chained, indirect table.
const DESC_F_NEXT: u16 = 1;
const DESC_F_INDIRECT: u16 = 4;

/// Whether the chain from `head` in the descriptor table at `table` (a
/// queue of `size` entries) has a descriptor with the INDIRECT flag. Walks
/// at most `size` descriptors (a looping chain ends); unreadable entries
/// end the walk (virtio-queue then refuses the chain itself).
fn uses_indirect(mem: &GuestMemoryMmap, table: u64, size: u16, head: u16) -> bool {
    use vm_memory::Bytes;
    let mut index = head;
    for _ in 0..size {
        let Some(entry) = u64::from(index)
            .checked_mul(16)
            .and_then(|off| table.checked_add(off))
        else {
            return false;
        };
        let Ok(flags) = mem.read_obj::<u16>(vm_memory::GuestAddress(entry + 12)) else {
            return false;
        };
        if flags & DESC_F_INDIRECT != 0 {
            return true;
        }
        if flags & DESC_F_NEXT == 0 {
            return false;
        }
        let Ok(next) = mem.read_obj::<u16>(vm_memory::GuestAddress(entry + 14)) else {
            return false;
        };
        if next >= size {
            return false;
        }
        index = next;
    }
    false
}

/// Shared handle.
pub type SharedBlock = Arc<MmioBlock>;

#[cfg(test)]
mod tests;
