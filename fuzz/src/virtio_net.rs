//! Target 8: the virtio-net device's transport and both queues.
//!
//! A network card over a datagram socket pair (standing in for the tap:
//! one frame per datagram) has its two queues set up through the transport
//! registers (at standard places, or at arbitrary ones), then arbitrary
//! register writes and reads, arbitrary descriptor tables and available
//! rings for both queues, frames of arbitrary lengths (runts, near the
//! largest, oversized) waiting on the "tap", and `process_tx` and
//! `process_rx`. Checked: no panic; every transmit chain completed has one
//! counted outcome (sent, dropped or error) and every frame sent is on the
//! peer's side with a zeroed header; every receive completion is a frame
//! delivered or a buffer refused; no more frames are taken than the peer
//! sent; and when no descriptor points into the queues' own rings (a guest
//! may legally make the device overwrite them), the used indices equal the
//! completions and a second transmit pass serves nothing.

use std::os::unix::net::UnixDatagram;

use stagevm::devices::virtio::mmio::reg::{
    self, QUEUE_DESC_LOW, QUEUE_DEVICE_LOW, QUEUE_DRIVER_LOW, QUEUE_NUM, QUEUE_READY, QUEUE_SEL,
    STATUS,
};
use stagevm::devices::virtio::mmio::MmioTransport;
use stagevm::devices::virtio::net::io::NetIo;
use stagevm::devices::virtio::net::tap::{Tap, VNET_HDR_LEN};
use stagevm::devices::virtio::net::{MmioNet, MAX_FRAME, RX, TX};
use stagevm_arch::layout::MMIO_BASE;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, ZeroOnDrop};
use crate::input::Input;

/// Guest RAM of the target's VMs (bytes).
pub const MEM: u64 = 0x2_0000;
/// Rings of queue `q` at their standard places: descriptors, driver
/// area, device area.
fn rings(q: usize) -> (u64, u64, u64) {
    let base = 0x1000 + q as u64 * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}
/// End of both queues' structures at their standard places.
const RINGS_END: u64 = 0x7000;
const DATA: u64 = 0x1_0000;

/// Every register offset, for arbitrary transport accesses.
const REGS: [u64; 26] = reg::ALL;

thread_local! {
    static MEMORY: GuestMemoryMmap = guest_memory(MEM);
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    MEMORY.with(|mem| run(mem, data));
}

/// One queue's descriptor table and available ring, written from `inp`;
/// returns whether a descriptor points into the standard rings.
fn write_queue(mem: &GuestMemoryMmap, inp: &mut Input, qsize: u16, desc: u64, avail: u64) -> bool {
    let mut points_into_rings = false;
    let mut table = vec![0u8; 16 * usize::from(qsize)];
    for entry in table.chunks_exact_mut(16) {
        let addr = match inp.u8() % 8 {
            0 => inp.u64_near(MEM),
            1 => u64::from(inp.u16()),
            _ => DATA + u64::from(inp.u16() % 0xf000),
        };
        let len = match inp.u8() % 8 {
            0 => inp.u32_near(1 << 16),
            1 => VNET_HDR_LEN as u32,
            2 => (VNET_HDR_LEN + MAX_FRAME) as u32 + inp.below(3) - 1,
            3 => 2048,
            _ => inp.below(1600),
        };
        entry.copy_from_slice(&crate::guest::descriptor(inp, addr, len, qsize));
        points_into_rings |= addr < RINGS_END && addr.saturating_add(u64::from(len)) > 0x1000;
    }
    if desc
        .checked_add(table.len() as u64)
        .is_some_and(|end| end <= MEM)
    {
        mem.write_slice(&table, GuestAddress(desc)).unwrap();
    }
    let offered: u16 = match inp.u8() % 8 {
        0 => inp.u16(),
        _ => inp.below(u32::from(qsize) + 1) as u16,
    };
    let mut ring = vec![0u8; 6 + 2 * usize::from(qsize)];
    ring[0..2].copy_from_slice(&inp.u16().to_le_bytes());
    ring[2..4].copy_from_slice(&offered.to_le_bytes());
    for i in 0..=usize::from(qsize) {
        // The heads, then `used_event`.
        let v = if inp.one_in(8) {
            inp.u16()
        } else {
            inp.below(u32::from(qsize) + 2) as u16
        };
        ring[4 + 2 * i..6 + 2 * i].copy_from_slice(&v.to_le_bytes());
    }
    if avail
        .checked_add(ring.len() as u64)
        .is_some_and(|end| end <= MEM)
    {
        mem.write_slice(&ring, GuestAddress(avail)).unwrap();
    }
    points_into_rings
}

fn run(mem: &GuestMemoryMmap, data: &[u8]) {
    let _clean = ZeroOnDrop::new(mem, MEM, 0, MEM);
    let mut inp = Input::new(data);
    let (ours, peer) = UnixDatagram::pair().expect("socketpair");
    ours.set_nonblocking(true).expect("non-blocking");
    peer.set_nonblocking(true).expect("non-blocking");
    let mut dev = MmioNet::new(
        "net0".into(),
        MMIO_BASE,
        [2, 0, 0, 0, 0, 1],
        Tap::from_datagram_socket(ours.into(), "fuzz"),
    )
    .expect("eventfd");
    // No driver runs beside the device here: watching an empty queue for
    // its next entries would only add 50 µs to every case.
    dev.set_poll_window(std::time::Duration::ZERO);
    // The one virtio-mmio transport in front of it (KVM delivers the
    // notifications: a QueueNotify only names the queue).
    let dev = std::sync::Arc::new(dev);
    let regs = MmioTransport::new(dev.clone(), true);

    // Both queues set up as a driver does it, at standard or arbitrary
    // places; EVENT_IDX negotiated or not.
    let standard = !inp.one_in(4);
    let mut places = [(0u64, 0u64, 0u64); 2];
    let mut sizes = [0u16; 2];
    for q in [RX, TX] {
        sizes[q] = 1 << inp.below(9);
        places[q] = if standard {
            rings(q)
        } else {
            let mut at = |align: u32| u64::from(inp.u32_near(0x1000) & !(align - 1));
            (at(16), at(2), at(4))
        };
        let (desc, avail, used) = places[q];
        for (off, v) in [
            (QUEUE_SEL, q as u32),
            (QUEUE_NUM, u32::from(sizes[q])),
            (QUEUE_DESC_LOW, desc as u32),
            (QUEUE_DRIVER_LOW, avail as u32),
            (QUEUE_DEVICE_LOW, used as u32),
            (QUEUE_READY, 1),
        ] {
            regs.write(off, &v.to_le_bytes());
        }
    }
    let event_idx = inp.bool();
    for (off, v) in [
        (reg::DRIVER_FEATURES_SEL, 0u32),
        (
            reg::DRIVER_FEATURES,
            (1 << 5) | if event_idx { 1 << 29 } else { 0 },
        ),
        (reg::DRIVER_FEATURES_SEL, 1),
        (reg::DRIVER_FEATURES, 1),
        (STATUS, 0xf),
    ] {
        regs.write(off, &u32::to_le_bytes(v));
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
            let value = inp.u32_near(16);
            let mut bytes = value.to_le_bytes().to_vec();
            bytes.resize(len, 0);
            regs.write(off, &bytes);
        }
    }
    let clean = standard && accesses == 0;
    let mut points_into_rings = false;
    for q in [RX, TX] {
        let (desc, avail, _) = places[q];
        points_into_rings |= write_queue(mem, &mut inp, sizes[q], desc, avail);
    }
    // Frames waiting on the tap.
    let frames = inp.below(5);
    for _ in 0..frames {
        let len = match inp.u8() % 4 {
            0 => inp.below(VNET_HDR_LEN as u32 + 2),
            1 => (VNET_HDR_LEN + MAX_FRAME) as u32 + inp.below(3) - 1,
            2 => inp.below(4000),
            _ => VNET_HDR_LEN as u32 + 60 + inp.below(200),
        };
        let frame = vec![inp.u8(); len as usize];
        peer.send(&frame).expect("a datagram to the device");
    }

    let mut io = NetIo::new();
    let tx_served = dev.process_tx(mem, &mut io);
    let delivered = dev.process_rx(mem, &mut io);
    let r = dev.report(true);
    assert_eq!(
        (r.tx_packets + r.tx_dropped + r.tx_errors) as usize,
        tx_served,
        "{r:?}"
    );
    assert_eq!(r.rx_packets as usize, delivered, "{r:?}");
    let taken = r.rx_packets + r.rx_dropped + u64::from(io.rx_stalled());
    assert!(
        taken <= u64::from(frames),
        "{taken} of {frames} frames: {r:?}"
    );
    // What went out: exactly the frames counted, each with a clean header.
    let mut out = 0;
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = peer.recv(&mut buf) {
        assert!(
            (VNET_HDR_LEN..=VNET_HDR_LEN + MAX_FRAME).contains(&n),
            "{n}"
        );
        assert_eq!(buf[..VNET_HDR_LEN], [0; VNET_HDR_LEN]);
        out += 1;
    }
    assert_eq!(out, r.tx_packets, "{r:?}");
    if clean && !points_into_rings {
        let used_idx = |q: usize| -> u16 { mem.read_obj(GuestAddress(rings(q).2 + 2)).unwrap() };
        assert_eq!(usize::from(used_idx(TX)), tx_served, "transmit used index");
        assert_eq!(
            u64::from(used_idx(RX)),
            r.rx_packets + r.rx_errors,
            "receive used index: {r:?}"
        );
        assert_eq!(dev.process_tx(mem, &mut io), 0, "a second pass served more");
    }
}
