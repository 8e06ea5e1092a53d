//! Unit tests of virtio-net: the transport, both data paths over a datagram
//! socket pair standing in for the tap, and hostile chains.

use std::os::unix::net::UnixDatagram;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::io::NetIo;
use super::tap::{Tap, VNET_HDR_LEN};
use super::*;

/// Ring addresses of queue `q`.
fn rings(q: usize) -> (u64, u64, u64) {
    let base = 0x1000 + q as u64 * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}
const DATA: u64 = 0x20000;
const QSIZE: u16 = 16;
const MAC: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

type Dev = mmio::TestDriver<MmioNet>;

fn device() -> (GuestMemoryMmap, Dev, UnixDatagram) {
    device_with(|_| {})
}

/// [`device`], after `setup` on the device before it goes behind its
/// window.
fn device_with(setup: impl FnOnce(&mut MmioNet)) -> (GuestMemoryMmap, Dev, UnixDatagram) {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (ours, peer) = UnixDatagram::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    peer.set_nonblocking(true).unwrap();
    let tap = Tap::from_datagram_socket(ours.into(), "pair");
    let mut dev = MmioNet::new("net0".into(), super::super::MMIO_BASE, MAC, tap).unwrap();
    setup(&mut dev);
    let dev = Dev::new(dev);
    for q in [RX, TX] {
        let (desc, avail, used) = rings(q);
        for (off, v) in [
            (reg::QUEUE_SEL, q as u32),
            (reg::QUEUE_NUM, u32::from(QSIZE)),
            (reg::QUEUE_DESC_LOW, desc as u32),
            (reg::QUEUE_DRIVER_LOW, avail as u32),
            (reg::QUEUE_DEVICE_LOW, used as u32),
            (reg::QUEUE_READY, 1),
        ] {
            dev.write(off, &v.to_le_bytes());
        }
    }
    (mem, dev, peer)
}

fn desc(mem: &GuestMemoryMmap, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let at = rings(q).0 + 16 * u64::from(i);
    mem.write_obj(addr, GuestAddress(at)).unwrap();
    mem.write_obj(len, GuestAddress(at + 8)).unwrap();
    mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
    mem.write_obj(next, GuestAddress(at + 14)).unwrap();
}

/// Appends `heads` to queue `q`'s available ring (after `already` entries).
fn offer(mem: &GuestMemoryMmap, q: usize, already: u16, heads: &[u16]) {
    let avail = rings(q).1;
    for (i, h) in heads.iter().enumerate() {
        let slot = (usize::from(already) + i) % usize::from(QSIZE);
        mem.write_obj(*h, GuestAddress(avail + 4 + 2 * slot as u64))
            .unwrap();
    }
    mem.write_obj(already + heads.len() as u16, GuestAddress(avail + 2))
        .unwrap();
}

/// (used index, length of used entry `n`) of queue `q`.
fn used(mem: &GuestMemoryMmap, q: usize, n: u16) -> (u16, u32) {
    let used = rings(q).2;
    let idx = mem.read_obj(GuestAddress(used + 2)).unwrap();
    let len = mem
        .read_obj(GuestAddress(used + 4 + 8 * u64::from(n % QSIZE) + 4))
        .unwrap();
    (idx, len)
}

const NEXT: u16 = 1;
const WRITE: u16 = 2;

#[test]
fn transport_identifies_a_network_card_with_its_mac() {
    let (_, dev, _peer) = device();
    let mut b = [0u8; 4];
    dev.read(reg::DEVICE_ID, &mut b);
    assert_eq!(u32::from_le_bytes(b), 1);
    dev.write(reg::DEVICE_FEATURES_SEL, &0u32.to_le_bytes());
    dev.read(reg::DEVICE_FEATURES, &mut b);
    let low = u32::from_le_bytes(b);
    assert_eq!(low, (1 << 5) | (1 << 29), "MAC and EVENT_IDX, no MRG_RXBUF");
    dev.write(reg::DEVICE_FEATURES_SEL, &1u32.to_le_bytes());
    dev.read(reg::DEVICE_FEATURES, &mut b);
    assert_eq!(u32::from_le_bytes(b), 1, "VERSION_1");
    let mut mac = [0u8; 6];
    dev.read(reg::CONFIG, &mut mac);
    assert_eq!(mac, MAC);
    // Queue 2 does not exist.
    dev.write(reg::QUEUE_SEL, &2u32.to_le_bytes());
    dev.read(reg::QUEUE_NUM_MAX, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0);
    assert_eq!(dev.write(reg::QUEUE_NOTIFY, &1u32.to_le_bytes()), Some(TX));
    assert_eq!(dev.write(reg::QUEUE_NOTIFY, &7u32.to_le_bytes()), None);
    let g = generate_mac();
    assert_eq!(g[0] & 3, 2, "locally administered unicast: {g:x?}");
}

#[test]
fn a_transmitted_frame_reaches_the_tap_with_a_clean_header() {
    let (mem, dev, peer) = device();
    let mut io = NetIo::new();
    // A header with forged GSO fields, then a 60-byte frame in two parts.
    mem.write_slice(&[0xff; VNET_HDR_LEN], GuestAddress(DATA))
        .unwrap();
    let frame: Vec<u8> = (0..60u8).collect();
    mem.write_slice(&frame[..20], GuestAddress(DATA + 0x100))
        .unwrap();
    mem.write_slice(&frame[20..], GuestAddress(DATA + 0x200))
        .unwrap();
    desc(&mem, TX, 0, DATA, VNET_HDR_LEN as u32, NEXT, 1);
    desc(&mem, TX, 1, DATA + 0x100, 20, NEXT, 2);
    desc(&mem, TX, 2, DATA + 0x200, 40, 0, 0);
    offer(&mem, TX, 0, &[0]);
    assert_eq!(dev.process_tx(&mem, &mut io), 1);
    assert_eq!(used(&mem, TX, 0).0, 1);
    let mut got = [0u8; 2048];
    let n = peer.recv(&mut got).unwrap();
    assert_eq!(n, VNET_HDR_LEN + 60);
    assert_eq!(got[..VNET_HDR_LEN], [0; VNET_HDR_LEN]);
    assert_eq!(got[VNET_HDR_LEN..n], frame[..]);
    let r = dev.report(true);
    assert_eq!((r.tx_packets, r.tx_bytes, r.tx_errors), (1, 60, 0));
}

#[test]
fn a_received_frame_fills_one_buffer_or_waits_for_one() {
    let (mem, dev, peer) = device();
    let mut io = NetIo::new();
    let mut sent = vec![0xaau8; VNET_HDR_LEN];
    sent.extend((0..100u8).map(|b| b ^ 0x5a));
    peer.send(&sent).unwrap();
    // No buffer yet: the frame waits, nothing is lost.
    assert_eq!(dev.process_rx(&mem, &mut io), 0);
    assert!(io.rx_stalled());
    desc(&mem, RX, 0, DATA, 2048, WRITE, 0);
    offer(&mem, RX, 0, &[0]);
    assert_eq!(dev.process_rx(&mem, &mut io), 1);
    assert!(!io.rx_stalled());
    assert_eq!(used(&mem, RX, 0), (1, sent.len() as u32));
    let mut got = vec![0u8; sent.len()];
    mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    // The header says: no offloads, one buffer.
    assert_eq!(got[..10], [0; 10]);
    assert_eq!(got[10..12], 1u16.to_le_bytes());
    assert_eq!(got[VNET_HDR_LEN..], sent[VNET_HDR_LEN..]);
    let r = dev.report(true);
    assert_eq!((r.rx_packets, r.rx_bytes, r.rx_dropped), (1, 100, 0));
}

#[test]
fn hostile_chains_and_oversized_frames_are_counted_and_the_device_goes_on() {
    let (mem, dev, peer) = device();
    let mut io = NetIo::new();
    // Transmit: indirect, device-writable, looping, outside memory,
    // shorter than the header, oversized in one and in two descriptors;
    // then a good one.
    desc(&mem, TX, 0, DATA, 64, 4, 0);
    desc(&mem, TX, 1, DATA, 64, WRITE, 0);
    desc(&mem, TX, 2, DATA, 64, NEXT, 3);
    desc(&mem, TX, 3, DATA, 64, NEXT, 2);
    desc(&mem, TX, 4, 1 << 30, 64, 0, 0);
    desc(&mem, TX, 5, DATA, 4, 0, 0);
    desc(
        &mem,
        TX,
        6,
        DATA,
        (VNET_HDR_LEN + MAX_FRAME + 1) as u32,
        0,
        0,
    );
    desc(&mem, TX, 7, DATA, (VNET_HDR_LEN + 60) as u32, 0, 0);
    desc(&mem, TX, 8, DATA, 1000, NEXT, 9);
    desc(&mem, TX, 9, DATA, 1000, 0, 0);
    offer(&mem, TX, 0, &[0, 1, 2, 5, 4, 6, 8, 7]);
    assert_eq!(dev.process_tx(&mem, &mut io), 8);
    let mut got = [0u8; 4096];
    assert_eq!(peer.recv(&mut got).unwrap(), VNET_HDR_LEN + 60);
    assert!(peer.recv(&mut got).is_err(), "only the good frame went out");
    let r = dev.report(true);
    assert_eq!(r.tx_packets, 1);
    assert_eq!(r.bad_chains, 5, "{r:?}");
    assert_eq!(r.oversized, 2, "{r:?}");
    assert_eq!((r.tx_dropped, r.tx_errors), (2, 5));

    // Receive: a device-readable buffer, one too small, one outside
    // memory; the frame waits through them and lands in the good one.
    let frame = vec![7u8; VNET_HDR_LEN + 200];
    peer.send(&frame).unwrap();
    // Then an oversized frame from the tap: dropped.
    peer.send(&vec![1u8; VNET_HDR_LEN + MAX_FRAME + 1]).unwrap();
    desc(&mem, RX, 0, DATA, 2048, 0, 0);
    desc(&mem, RX, 1, DATA, 100, WRITE, 0);
    desc(&mem, RX, 2, 1 << 30, 2048, WRITE, 0);
    desc(&mem, RX, 3, DATA, 2048, WRITE, 0);
    offer(&mem, RX, 0, &[0, 1, 2, 3]);
    assert_eq!(dev.process_rx(&mem, &mut io), 1);
    assert_eq!(used(&mem, RX, 0), (4, 0));
    assert_eq!(used(&mem, RX, 3), (4, frame.len() as u32));
    let r = dev.report(true);
    assert_eq!(
        (r.rx_packets, r.rx_errors, r.rx_dropped),
        (1, 3, 1),
        "{r:?}"
    );
    assert_eq!(r.oversized, 3);
    assert!(!io.rx_stalled());
}

#[test]
fn an_unready_queue_serves_nothing() {
    let (mem, dev, _peer) = device();
    let mut io = NetIo::new();
    dev.write(reg::QUEUE_SEL, &(TX as u32).to_le_bytes());
    dev.write(reg::QUEUE_READY, &0u32.to_le_bytes());
    offer(&mem, TX, 0, &[0]);
    assert_eq!(dev.process_tx(&mem, &mut io), 0);
    // A reset makes both queues unready.
    dev.write(reg::STATUS, &0u32.to_le_bytes());
    let mut b = [0u8; 4];
    dev.write(reg::QUEUE_SEL, &(RX as u32).to_le_bytes());
    dev.read(reg::QUEUE_READY, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0);
}

/// An available index more than a queue ahead (virtio-queue refuses to
/// iterate it) ends the round instead of spinning on "more entries".
#[test]
fn an_available_index_far_ahead_does_not_spin() {
    let (mem, dev, peer) = device();
    let mut io = NetIo::new();
    mem.write_obj(QSIZE + 5, GuestAddress(rings(TX).1 + 2))
        .unwrap();
    assert_eq!(dev.process_tx(&mem, &mut io), 0);
    peer.send(&[0u8; VNET_HDR_LEN + 60]).unwrap();
    mem.write_obj(QSIZE + 5, GuestAddress(rings(RX).1 + 2))
        .unwrap();
    assert_eq!(dev.process_rx(&mem, &mut io), 0);
    assert!(io.rx_stalled());
}

/// With EVENT_IDX negotiated the device publishes `avail_event` (the driver
/// notifies only past it) and interrupts only when the driver's
/// `used_event` is crossed.
#[test]
fn event_idx_suppresses_notifications_both_ways() {
    let irq = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let (mem, dev, peer) = device_with(|d| d.set_irq(irq.try_clone().unwrap()));
    for (off, v) in [
        (reg::DRIVER_FEATURES_SEL, 0u32),
        (reg::DRIVER_FEATURES, (1 << 5) | (1 << 29)),
        (reg::DRIVER_FEATURES_SEL, 1),
        (reg::DRIVER_FEATURES, 1),
        (reg::STATUS, 0xf),
    ] {
        dev.write(off, &v.to_le_bytes());
    }
    let mut io = NetIo::new();
    let (_, avail, used) = rings(TX);
    let used_event = GuestAddress(avail + 4 + 2 * u64::from(QSIZE));
    let avail_event = GuestAddress(used + 4 + 8 * u64::from(QSIZE));
    // The driver wants an interrupt after the 3rd completion only.
    mem.write_obj(2u16, used_event).unwrap();
    for i in 0..3u16 {
        desc(&mem, TX, i, DATA, (VNET_HDR_LEN + 60) as u32, 0, 0);
    }
    offer(&mem, TX, 0, &[0]);
    assert_eq!(dev.process_tx(&mem, &mut io), 1);
    assert_eq!(mem.read_obj::<u16>(avail_event).unwrap(), 1, "avail_event");
    assert!(irq.read().is_err(), "no interrupt before used_event");
    offer(&mem, TX, 1, &[1, 2]);
    assert_eq!(dev.process_tx(&mem, &mut io), 2);
    assert_eq!(mem.read_obj::<u16>(avail_event).unwrap(), 3);
    assert_eq!(irq.read().unwrap(), 1, "one interrupt past used_event");
    let mut buf = [0u8; 128];
    for _ in 0..3 {
        assert_eq!(peer.recv(&mut buf).unwrap(), VNET_HDR_LEN + 60);
    }
}
