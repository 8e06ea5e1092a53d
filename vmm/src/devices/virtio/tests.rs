//! Unit and property tests of the virtio-mmio transport and virtio-blk.

use super::*;
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const DATA: u64 = 0x10000;
const QSIZE: u16 = 16;

type Dev = mmio::TestDriver<MmioBlock>;

fn device(readonly: bool) -> (GuestMemoryMmap, Dev) {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let path = std::env::temp_dir().join(format!(
        "stagevm-blk-unit-{}-{:?}.img",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, vec![0xabu8; 64 * 1024]).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let dev = MmioBlock::new(
        "blk0".into(),
        "unit".into(),
        MMIO_BASE,
        Block::new(file, 64 * 1024, readonly),
    )
    .unwrap();
    let dev = Dev::new(dev);
    // Set the queue up through the registers, as a driver does.
    for (off, v) in [
        (reg::QUEUE_SEL, 0u32),
        (reg::QUEUE_NUM, u32::from(QSIZE)),
        (reg::QUEUE_DESC_LOW, DESC as u32),
        (reg::QUEUE_DRIVER_LOW, AVAIL as u32),
        (reg::QUEUE_DEVICE_LOW, USED as u32),
        (reg::QUEUE_READY, 1),
    ] {
        dev.write(off, &v.to_le_bytes());
    }
    (mem, dev)
}

fn desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let at = DESC + 16 * u64::from(i);
    mem.write_obj(addr, GuestAddress(at)).unwrap();
    mem.write_obj(len, GuestAddress(at + 8)).unwrap();
    mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
    mem.write_obj(next, GuestAddress(at + 14)).unwrap();
}

fn offer(mem: &GuestMemoryMmap, heads: &[u16]) {
    for (i, h) in heads.iter().enumerate() {
        mem.write_obj(*h, GuestAddress(AVAIL + 4 + 2 * i as u64))
            .unwrap();
    }
    mem.write_obj(heads.len() as u16, GuestAddress(AVAIL + 2))
        .unwrap();
}

fn used_idx(mem: &GuestMemoryMmap) -> u16 {
    mem.read_obj(GuestAddress(USED + 2)).unwrap()
}

/// header (type, sector) at DATA, then one data descriptor, then status.
fn request(mem: &GuestMemoryMmap, kind: u32, sector: u64, len: u32, data_write: bool) {
    mem.write_obj(kind, GuestAddress(DATA)).unwrap();
    mem.write_obj(sector, GuestAddress(DATA + 8)).unwrap();
    desc(mem, 0, DATA, 16, 1, 1);
    desc(
        mem,
        1,
        DATA + 0x1000,
        len,
        1 | if data_write { 2 } else { 0 },
        2,
    );
    desc(mem, 2, DATA + 0x100, 1, 2, 0);
    offer(mem, &[0]);
}

/// An indirect descriptor (never offered) is refused, not followed
/// (issue 14 D16), and the request is completed so the driver is not
/// stuck.
#[test]
fn indirect_descriptors_are_refused() {
    let (mem, dev) = device(true);
    // The head points at an "indirect table" holding a valid request.
    desc(&mem, 0, DATA + 0x2000, 48, DESC_F_INDIRECT, 0);
    offer(&mem, &[0]);
    assert_eq!(dev.process(&mem), 1);
    assert_eq!(used_idx(&mem), 1);
    let r = dev.report(true);
    assert_eq!((r.ok, r.errors, r.dropped), (0, 0, 1));
}

#[test]
fn transport_identifies_a_version_2_block_device() {
    let (_, dev) = device(true);
    let mut b = [0u8; 4];
    dev.read(reg::MAGIC, &mut b);
    assert_eq!(&b, b"virt");
    dev.read(reg::DEVICE_ID, &mut b);
    assert_eq!(u32::from_le_bytes(b), 2);
    dev.write(reg::DEVICE_FEATURES_SEL, &0u32.to_le_bytes());
    dev.read(reg::DEVICE_FEATURES, &mut b);
    assert_ne!(u32::from_le_bytes(b) & (1 << 5), 0, "RO offered");
    dev.write(reg::DEVICE_FEATURES_SEL, &1u32.to_le_bytes());
    dev.read(reg::DEVICE_FEATURES, &mut b);
    assert_eq!(u32::from_le_bytes(b), 1, "VERSION_1 offered");
    let mut cap = [0u8; 8];
    dev.read(reg::CONFIG, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 128);
}

/// Bad queue register writes are refused before virtio-queue sees them
/// (it logs each without a limit) and logged rate-limited (issue 14 D2).
#[test]
fn bad_queue_writes_are_refused_and_logged_rate_limited() {
    let (mem, dev) = device(true);
    let before = stage_device::ratelimit::suppressed();
    for _ in 0..10_000 {
        dev.write(reg::QUEUE_NUM, &3u32.to_le_bytes());
        dev.write(reg::QUEUE_NUM, &512u32.to_le_bytes());
        dev.write(reg::QUEUE_DESC_LOW, &0x1001u32.to_le_bytes());
        dev.write(reg::QUEUE_DRIVER_LOW, &0x1001u32.to_le_bytes());
        dev.write(reg::QUEUE_DEVICE_LOW, &0x1002u32.to_le_bytes());
    }
    let suppressed = stage_device::ratelimit::suppressed() - before;
    assert!(suppressed >= 50_000 - 10, "{suppressed}");
    // The queue set up by `device` still works.
    request(&mem, 0, 2, 1024, true);
    assert_eq!(dev.process(&mem), 1);
}

#[test]
fn read_write_and_refusals() {
    let (mem, dev) = device(true);
    request(&mem, 0, 2, 1024, true);
    assert_eq!(dev.process(&mem), 1);
    assert_eq!(
        block::read_status(&mem, GuestAddress(DATA + 0x100)),
        Some(0)
    );
    let mut data = [0u8; 1024];
    mem.read_slice(&mut data, GuestAddress(DATA + 0x1000))
        .unwrap();
    assert!(data.iter().all(|b| *b == 0xab));
    // A write to the read-only disk: IOERR.
    request(&mem, 1, 0, 512, false);
    mem.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
    mem.write_obj(0u16, GuestAddress(AVAIL + 6)).unwrap();
    assert_eq!(dev.process(&mem), 1);
    assert_eq!(
        block::read_status(&mem, GuestAddress(DATA + 0x100)),
        Some(1)
    );
    // Past the end of the disk, then an unknown type.
    for (i, (kind, sector, want)) in [(0u32, 127u64, 1u8), (77, 0, 2)].into_iter().enumerate() {
        request(&mem, kind, sector, 1024, true);
        mem.write_obj(3 + i as u16, GuestAddress(AVAIL + 2))
            .unwrap();
        mem.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * (2 + i as u64)))
            .unwrap();
        assert_eq!(dev.process(&mem), 1);
        assert_eq!(
            block::read_status(&mem, GuestAddress(DATA + 0x100)),
            Some(want)
        );
    }
    let r = dev.report(false);
    assert_eq!((r.ok, r.errors, r.dropped), (1, 3, 0));
}

#[test]
fn a_looping_chain_ends_and_is_answered() {
    let (mem, dev) = device(false);
    // 0 -> 1 -> 0 -> … with no writable tail.
    desc(&mem, 0, DATA, 16, 1, 1);
    desc(&mem, 1, DATA + 0x1000, 512, 1, 0);
    offer(&mem, &[0]);
    assert_eq!(dev.process(&mem), 1);
    assert_eq!(used_idx(&mem), 1);
    assert_eq!(dev.report(false).dropped, 1);
}

proptest! {
    /// Arbitrary descriptor tables and available rings: no panic, no host
    /// access outside guest memory (vm-memory checks every access), and
    /// every chain the device takes gets exactly one used entry and one
    /// counted outcome.
    #[test]
    fn arbitrary_descriptor_chains(
        descs in proptest::collection::vec(
            (prop_oneof![DATA..DATA + 0x8000, any::<u64>()], prop_oneof![0u32..4096, any::<u32>()], 0u16..8, 0u16..24),
            QSIZE as usize,
        ),
        heads in proptest::collection::vec(0u16..20, 0..12),
        kinds in proptest::collection::vec((0u32..10, 0u64..200), 4),
    ) {
        let (mem, dev) = device(false);
        for (i, (kind, sector)) in kinds.iter().enumerate() {
            mem.write_obj(*kind, GuestAddress(DATA + 0x2000 * i as u64)).unwrap();
            mem.write_obj(*sector, GuestAddress(DATA + 0x2000 * i as u64 + 8)).unwrap();
        }
        for (i, (addr, len, flags, next)) in descs.iter().enumerate() {
            desc(&mem, i as u16, *addr, *len, *flags, *next);
        }
        offer(&mem, &heads);
        let served = dev.process(&mem);
        let r = dev.report(false);
        prop_assert_eq!(usize::from(used_idx(&mem)), served);
        prop_assert_eq!((r.ok + r.errors + r.dropped) as usize, served);
        prop_assert!(served + r.bad_heads as usize <= heads.len());
    }
}
