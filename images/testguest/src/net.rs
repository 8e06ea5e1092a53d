//! An Ethernet echo over virtio-net from ring 3 with `virtio-drivers`' raw
//! net driver (`netecho=1`; the first `virtio_mmio.device=` whose device id
//! is 1, a network card).
//!
//! Every frame of ethertype [`ETHERTYPE`] that arrives goes back out with
//! its source and destination MACs swapped and nothing else changed; other
//! frames (the host's IPv6 neighbour discovery, …) are ignored. A frame
//! whose payload starts with `BIG!` is echoed after the guest sent a frame
//! of [`BIG`] bytes, longer than any the device carries (a hostile guest's
//! frame: the device drops and counts it). A frame
//! whose payload starts with `STOP` is echoed too and ends the echo; the
//! guest then prints `testguest: net echoed N frames, B bytes, fnv1a H`
//! (B and H over the echoed frames' payloads, after the Ethernet header).
//! Interrupts are off: the driver polls the used rings.

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};

use crate::disk::GuestHal;
use crate::print_line;
use crate::staged::alloc_pages;
use core::ptr::NonNull;

/// The echo's ethertype: IEEE 802 local experimental ethertype 1.
pub const ETHERTYPE: u16 = 0x88b5;
/// Queue size of both queues, and receive buffers posted.
const QUEUE: usize = 16;
/// Bytes per receive buffer: header (12) and the largest frame (1518).
const RX_BUF: usize = 2048;
/// Bytes of the transmit buffer.
const TX_BUF: usize = 8192;
/// The oversized frame a `BIG!` frame asks for (bytes).
pub const BIG: usize = 4000;

/// The VMM's virtio-mmio window (one 2 MiB page the VMM maps for ring 3).
const WINDOW: core::ops::Range<u64> = 0xd000_0000..0xd020_0000;

/// The virtio device id at the device's register window `base` (a read
/// of its `DeviceID` register); 0 for an address outside the VMM's window,
/// which is not read.
pub fn device_id(base: u64) -> u32 {
    if !WINDOW.contains(&base) || !WINDOW.contains(&(base + 0xfff)) {
        return 0;
    }
    // SAFETY: the VMM maps its virtio-mmio window readable in ring 3
    // (checked above); offset 8 is the DeviceID register (VIRTIO 1.2
    // §4.2.2), and reads of a window without a device return ones.
    unsafe { core::ptr::read_volatile((base + 8) as *const u32) }
}

/// FNV-1a (64-bit) over `bytes`, continuing from `h`.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Runs the echo on the network card at `base` (`size` bytes of registers)
/// until a `STOP` frame; prints its totals.
pub fn echo(base: u64, size: usize) {
    let Some(header) = NonNull::new(base as *mut VirtIOHeader) else {
        return;
    };
    // SAFETY: the VMM maps `size` bytes of virtio-mmio registers at `base`
    // (user-accessible, identity-mapped); nothing else uses them.
    let transport = match unsafe { MmioTransport::new(header, size) } {
        Ok(t) => t,
        Err(e) => {
            println!(
                "testguest: net at {:#x}: no virtio-mmio device ({:?})",
                base, e
            );
            return;
        }
    };
    let mut net = match VirtIONetRaw::<GuestHal, _, QUEUE>::new(transport) {
        Ok(n) => n,
        Err(e) => {
            println!("testguest: net at {:#x}: init failed ({:?})", base, e);
            return;
        }
    };
    let Some(mem) = alloc_pages((QUEUE * RX_BUF + TX_BUF) as u64) else {
        println!("testguest: net: out of memory");
        return;
    };
    // SAFETY: freshly allocated pages, used only here: QUEUE receive
    // buffers and one transmit buffer.
    let all = unsafe { core::slice::from_raw_parts_mut(mem as *mut u8, QUEUE * RX_BUF + TX_BUF) };
    let (rx_all, tx) = all.split_at_mut(QUEUE * RX_BUF);
    let mut tokens = [u16::MAX; QUEUE];
    for (i, buf) in rx_all.chunks_exact_mut(RX_BUF).enumerate() {
        // SAFETY: the buffer is not touched again before its completion.
        match unsafe { net.receive_begin(buf) } {
            Ok(t) => tokens[i] = t,
            Err(e) => {
                println!("testguest: net: cannot post a receive buffer ({:?})", e);
                return;
            }
        }
    }
    let mac = net.mac_address();
    println!(
        "testguest: net ready, mac {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    );
    let (mut frames, mut bytes, mut h) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    loop {
        let Some(token) = net.poll_receive() else {
            core::hint::spin_loop();
            continue;
        };
        let Some(i) = tokens.iter().position(|t| *t == token) else {
            println!("testguest: net: unknown receive token {}", token);
            return;
        };
        let buf = &mut rx_all[i * RX_BUF..(i + 1) * RX_BUF];
        // SAFETY: the same buffer `receive_begin` got for this token.
        let (hdr, len) = match unsafe { net.receive_complete(token, buf) } {
            Ok(r) => r,
            Err(e) => {
                println!("testguest: net: receive failed ({:?})", e);
                return;
            }
        };
        let frame = &buf[hdr..hdr + len];
        let mut stop = false;
        if len >= 14 && u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE {
            if frame[14..].starts_with(b"BIG!") {
                tx[..BIG].fill(0x42);
                tx[..6].copy_from_slice(&frame[6..12]);
                tx[6..12].copy_from_slice(&frame[..6]);
                tx[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
                // The device completes the chain without sending it.
                if let Err(e) = net.send(&tx[..BIG]) {
                    println!("testguest: net: oversized send failed ({:?})", e);
                }
            }
            let out = &mut tx[..len];
            out[..6].copy_from_slice(&frame[6..12]);
            out[6..12].copy_from_slice(&frame[..6]);
            out[12..].copy_from_slice(&frame[12..]);
            stop = frame[14..].starts_with(b"STOP");
            frames += 1;
            bytes += (len - 14) as u64;
            h = fnv1a(h, &frame[14..]);
            // `send` puts the virtio-net header in front itself.
            if let Err(e) = net.send(&tx[..len]) {
                println!("testguest: net: send failed ({:?})", e);
                return;
            }
        }
        // SAFETY: as above; the buffer is posted again.
        match unsafe { net.receive_begin(buf) } {
            Ok(t) => tokens[i] = t,
            Err(e) => {
                println!("testguest: net: cannot post a receive buffer ({:?})", e);
                return;
            }
        }
        if stop {
            break;
        }
    }
    println!(
        "testguest: net echoed {} frames, {} bytes, fnv1a {:#018x}",
        frames, bytes, h
    );
}
