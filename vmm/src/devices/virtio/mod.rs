//! virtio-mmio devices (VIRTIO 1.2 §4.2, version 2 "modern" register
//! layout) whose requests are served on a helper I/O thread per device.
//! One transport ([`mmio::MmioTransport`]) serves every device's
//! registers; a device ([`MmioBlock`], [`net::MmioNet`]) implements
//! [`mmio::VirtioDevice`].
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
pub mod mmio;
pub mod net;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use self::block::Block;
#[cfg(test)]
use self::mmio::reg;
use self::mmio::VirtioDevice;

use stagevm_arch::layout::{MMIO_BASE, MMIO_SIZE};
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

/// Feature bits of virtio-blk (VIRTIO 1.2 §5.2.3).
const BLK_F_RO: u64 = 1 << 5;
const BLK_F_FLUSH: u64 = 1 << 9;

/// A virtio-blk device (its registers are [`mmio::MmioTransport`]'s): its
/// one request queue, and the notification `EventFd` its I/O thread waits
/// on.
pub struct MmioBlock {
    /// Device name (`blk0`, …).
    pub name: String,
    /// Backing file path (for reports).
    pub path: String,
    /// GPA of its register window.
    pub base: u64,
    block: Block,
    queues: [Mutex<Queue>; 1],
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
            // QUEUE_MAX is a power of two ≤ 32768: never an error.
            queues: [Mutex::new(
                Queue::new(QUEUE_MAX).map_err(|e| std::io::Error::other(format!("{e:?}")))?,
            )],
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

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queues[0].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves every available request of the queue; returns how many. A
    /// queue the driver set up wrongly (outside memory, not ready) serves
    /// nothing.
    pub fn process(&self, mem: &GuestMemoryMmap) -> usize {
        let mut queue = self.lock_queue();
        // `is_valid` logs (unlimited, through `log`) why a queue is unusable;
        // main.rs silences virtio_queue's own lines and this one is limited.
        if !queue.ready() || !queue.is_valid(mem) {
            stage_device::guest_warn!(device = %self.name, "notified queue is not ready or lies outside guest memory");
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
                stage_device::guest_warn!(device = %self.name, "request {head} uses indirect descriptors, which were not offered");
                if queue.add_used(mem, head, 0).is_err() {
                    break;
                }
                served += 1;
                continue;
            }
            let len = self.block.handle(mem, chain);
            if queue.add_used(mem, head, len).is_err() {
                stage_device::guest_warn!(device = %self.name, "cannot complete request {head}");
                break;
            }
            served += 1;
        }
        if served > 0 {
            // Used-buffer notification: the bit the ring-3 guest polls, and
            // the interrupt of a Linux guest (see module docs).
            self.interrupt_status
                .fetch_or(mmio::INT_VRING, Ordering::AcqRel);
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
        let mut poller = stagevm_api::poll::Poller::new(&[
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

impl VirtioDevice for MmioBlock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn base(&self) -> u64 {
        self.base
    }

    fn device_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1) | BLK_F_FLUSH;
        if self.block.readonly() {
            f |= BLK_F_RO;
        }
        f
    }

    fn queues(&self) -> &[Mutex<Queue>] {
        &self.queues
    }

    fn notify(&self, _index: usize) -> &EventFd {
        &self.notify
    }

    fn interrupt_status(&self) -> &AtomicU32 {
        &self.interrupt_status
    }

    /// Config space (VIRTIO 1.2 §5.2.4): the capacity (le64, 512-byte
    /// sectors), then zeros.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        mmio::read_bytes(&self.block.sectors().to_le_bytes(), offset, data);
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
