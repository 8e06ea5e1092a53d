//! Target 4: the virtio-mmio transport and virtio-blk request chains.
//!
//! A block device over a 64 KiB disk file has its queue set up through
//! the transport registers (at standard places, or at arbitrary ones), then
//! arbitrary register writes and reads, an arbitrary descriptor table,
//! available ring and request headers, and `MmioBlock::process`. Checked:
//! no panic; every chain served has one counted outcome (ok, error or
//! dropped); and when no descriptor points into the queue's own rings (a
//! guest may legally make the device overwrite them), the used index is the
//! number served, no more chains are served than offered, and a second pass
//! serves nothing.

use std::fs::File;
use std::os::unix::fs::FileExt;

use stagevm::devices::virtio::block::Block;
use stagevm::devices::virtio::mmio::reg::{
    self, QUEUE_DESC_LOW, QUEUE_DEVICE_LOW, QUEUE_DRIVER_LOW, QUEUE_NUM, QUEUE_READY, QUEUE_SEL,
    STATUS,
};
use stagevm::devices::virtio::mmio::MmioTransport;
use stagevm::devices::virtio::MmioBlock;
use stagevm_arch::layout::MMIO_BASE;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, ZeroOnDrop};
use crate::input::Input;

/// Guest RAM of the target's VMs (bytes).
pub const MEM: u64 = 0x2_0000;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
/// End of the queue's structures at their standard places.
const RINGS_END: u64 = 0x4000;
const DATA: u64 = 0x1_0000;
/// Disk size (bytes): 128 sectors.
const DISK: u64 = 64 * 1024;
const DISK_BYTE: u8 = 0xab;

/// Every register offset, for arbitrary transport accesses.
const REGS: [u64; 26] = reg::ALL;

struct Local {
    mem: GuestMemoryMmap,
    disk: File,
}

thread_local! {
    static LOCAL: Local = Local {
        mem: guest_memory(MEM),
        disk: disk_file(),
    };
}

fn disk_file() -> File {
    let path = std::env::temp_dir().join(format!(
        "stagevm-fuzz-blk-{}-{:?}.img",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, vec![DISK_BYTE; DISK as usize]).expect("cannot write the disk file");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("cannot open the disk file");
    let _ = std::fs::remove_file(&path);
    file
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    LOCAL.with(|l| run(l, data));
}

fn run(local: &Local, data: &[u8]) {
    let mem = &local.mem;
    let _clean = ZeroOnDrop::new(mem, MEM, 0, MEM);
    let mut inp = Input::new(data);
    let readonly = inp.bool();
    let file = local.disk.try_clone().expect("dup of the disk file");
    let dev = MmioBlock::new(
        "blk0".into(),
        "fuzz".into(),
        MMIO_BASE,
        Block::new(file, DISK, readonly),
    )
    .expect("eventfd");
    // The one virtio-mmio transport in front of it (KVM delivers the
    // notifications: a QueueNotify only names the queue).
    let dev = std::sync::Arc::new(dev);
    let regs = MmioTransport::new(dev.clone(), true);

    // Queue set-up as a driver does it, at standard or arbitrary places.
    let qsize: u16 = 1 << inp.below(9);
    let standard = !inp.one_in(4);
    let (desc, avail, used) = if standard {
        (DESC, AVAIL, USED)
    } else {
        let mut at = |align: u32| u64::from(inp.u32_near(0x1000) & !(align - 1));
        (at(16), at(2), at(4))
    };
    for (off, v) in [
        (QUEUE_SEL, 0u32),
        (QUEUE_NUM, u32::from(qsize)),
        (QUEUE_DESC_LOW, desc as u32),
        (QUEUE_DRIVER_LOW, avail as u32),
        (QUEUE_DEVICE_LOW, used as u32),
        (QUEUE_READY, 1),
        (STATUS, 0xf),
    ] {
        regs.write(off, &v.to_le_bytes());
    }
    // Arbitrary transport accesses.
    let accesses = if inp.one_in(4) { inp.below(8) } else { 0 };
    for _ in 0..accesses {
        let off = if inp.bool() {
            inp.pick(&REGS)
        } else {
            u64::from(inp.u16())
        };
        let len = inp.below(9) as usize;
        if inp.bool() {
            let mut buf = vec![0u8; len];
            regs.read(off, &mut buf);
        } else {
            let value = inp.u32_near(u32::from(qsize));
            let mut bytes = value.to_le_bytes().to_vec();
            bytes.resize(len, 0);
            regs.write(off, &bytes);
        }
    }
    let clean_queue = standard && accesses == 0;

    // Request headers: type and sector.
    for i in 0..4u64 {
        let kind = match inp.u8() % 8 {
            0 => inp.u32(),
            1 => 1,
            2 => 4,
            3 => 8,
            _ => 0,
        };
        let sector = match inp.u8() % 4 {
            0 => inp.u64_near(DISK / 512),
            _ => u64::from(inp.u8() % 130),
        };
        mem.write_obj(kind, GuestAddress(DATA + 0x2000 * i))
            .unwrap();
        mem.write_obj(sector, GuestAddress(DATA + 0x2000 * i + 8))
            .unwrap();
    }
    // The descriptor table, written in one piece.
    let mut points_into_rings = false;
    let mut table = vec![0u8; 16 * usize::from(qsize)];
    for entry in table.chunks_exact_mut(16) {
        let addr = match inp.u8() % 8 {
            0 => inp.u64_near(MEM),
            1 => u64::from(inp.u16()),
            2 => DATA + 0x2000 * u64::from(inp.u8() % 4),
            _ => DATA + u64::from(inp.u16() % 0x8000),
        };
        let len = match inp.u8() % 8 {
            0 => inp.u32_near(1 << 20),
            1 => 16,
            2 => 1,
            _ => 512 * (u32::from(inp.u8()) % 9),
        };
        entry.copy_from_slice(&crate::guest::descriptor(&mut inp, addr, len, qsize));
        points_into_rings |= addr < RINGS_END && addr.saturating_add(u64::from(len)) > DESC;
    }
    if desc
        .checked_add(table.len() as u64)
        .is_some_and(|end| end <= MEM)
    {
        mem.write_slice(&table, GuestAddress(desc)).unwrap();
    }
    // The available ring.
    let offered: u16 = match inp.u8() % 8 {
        0 => inp.u16(),
        _ => inp.below(u32::from(qsize) + 1) as u16,
    };
    let mut ring = vec![0u8; 4 + 2 * usize::from(qsize)];
    ring[0..2].copy_from_slice(&inp.u16().to_le_bytes());
    ring[2..4].copy_from_slice(&offered.to_le_bytes());
    for i in 0..usize::from(qsize) {
        let head = if inp.one_in(8) {
            inp.u16()
        } else {
            inp.below(u32::from(qsize) + 2) as u16
        };
        ring[4 + 2 * i..6 + 2 * i].copy_from_slice(&head.to_le_bytes());
    }
    if avail
        .checked_add(ring.len() as u64)
        .is_some_and(|end| end <= MEM)
    {
        mem.write_slice(&ring, GuestAddress(avail)).unwrap();
    }

    let served = dev.process(mem);
    let r = dev.report(false);
    assert_eq!((r.ok + r.errors + r.dropped) as usize, served, "{r:?}");
    if clean_queue && !points_into_rings {
        let used_idx: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(usize::from(used_idx), served, "used index");
        let offered = if offered > qsize {
            0
        } else {
            usize::from(offered)
        };
        assert!(
            served + r.bad_heads as usize <= offered,
            "{served} served of {offered}"
        );
        assert_eq!(dev.process(mem), 0, "a second pass served more");
    }

    // Leave the disk as it was (RAM: `_clean`).
    if r.bytes_written > 0 {
        local
            .disk
            .write_all_at(&vec![DISK_BYTE; DISK as usize], 0)
            .expect("disk reset");
    }
}
