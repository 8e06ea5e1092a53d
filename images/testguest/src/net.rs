//! Raw Ethernet over virtio-net from ring 3 with `virtio-drivers`' raw net
//! driver, on the first `virtio_mmio.device=` whose device id is 1 (a
//! network card). Interrupts are off: the driver polls the used rings.
//!
//! Three modes ([`Mode`]), each on frames of ethertype [`ETHERTYPE`] (other
//! frames, e.g. the host's IPv6 neighbour discovery, are ignored):
//! * `netecho=1` — every frame goes back out with its source and
//!   destination MACs swapped and nothing else changed. A frame whose
//!   payload starts with `BIG!` is echoed after the guest sent a frame of
//!   [`BIG`] bytes, longer than any the device carries (a hostile guest's
//!   frame: the device drops and counts it). A `STOP` frame is echoed too
//!   and ends the echo; the guest then prints `testguest: net echoed N
//!   frames, B bytes, fnv1a H` (B and H over the payloads, after the
//!   Ethernet header).
//! * `netsink=1` — frames are counted until a `STOP` frame; prints
//!   `testguest: net sink N frames, B bytes in T ns` (T from the first
//!   counted frame to the last, guest TSC), and `, first seq F, last seq L,
//!   out of order O` from the 4-byte little-endian sequence number at the
//!   start of each payload: `net-bench`'s receive direction.
//! * `netsource=SIZE:COUNT` — waits for a `GO!` frame (its source MAC is
//!   the peer's), then sends COUNT frames of SIZE bytes (60…1514; payload:
//!   the sequence number, then `0x5a` bytes) as fast as the transmit queue
//!   takes them, then three `STOP` frames; prints `testguest: net source N
//!   frames, B bytes in T ns, queue full Q` (Q: times every transmit
//!   buffer was in flight): `net-bench`'s transmit direction.

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};

use crate::disk::GuestHal;
use crate::print_line;
use crate::staged::alloc_pages;
use crate::staged::platform::PortIo;
use core::ptr::NonNull;
use guest_agent::Platform;

/// The frames' ethertype: IEEE 802 local experimental ethertype 1.
pub const ETHERTYPE: u16 = 0x88b5;
/// Queue size of both queues: receive buffers posted, transmit buffers in
/// flight.
const QUEUE: usize = 256;
/// Bytes per receive and transmit buffer: header (12) and the largest
/// frame (1518), rounded up.
const BUF: usize = 2048;
/// Bytes of the echo's transmit buffer (room for [`BIG`]).
const ECHO_TX: usize = 8192;
/// The oversized frame a `BIG!` frame asks for (bytes).
pub const BIG: usize = 4000;
/// Smallest and largest frame `netsource=` sends (bytes, Ethernet header
/// included, no FCS).
const SOURCE_FRAME: core::ops::RangeInclusive<usize> = 60..=1514;

/// The VMM's virtio-mmio window (one 2 MiB page the VMM maps for ring 3).
const WINDOW: core::ops::Range<u64> = 0xd000_0000..0xd020_0000;

/// What the guest does on its network card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `netecho=1`.
    Echo,
    /// `netsink=1`.
    Sink,
    /// `netsource=SIZE:COUNT`: frames of `size` bytes, `count` of them.
    Source { size: usize, count: u32 },
}

impl Mode {
    /// The mode a command-line word sets (`None` for a bad value).
    pub fn parse(key: &str, value: &str) -> Option<Option<Mode>> {
        match (key, value) {
            ("netecho" | "netsink", "0") => Some(None),
            ("netecho", "1") => Some(Some(Mode::Echo)),
            ("netsink", "1") => Some(Some(Mode::Sink)),
            ("netsource", v) => {
                let (size, count) = v.split_once(':')?;
                let size: usize = size.parse().ok()?;
                let count: u32 = count.parse().ok()?;
                SOURCE_FRAME
                    .contains(&size)
                    .then_some(Some(Mode::Source { size, count }))
            }
            _ => None,
        }
    }
}

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

type Net = VirtIONetRaw<GuestHal, MmioTransport<'static>, QUEUE>;

/// An initialised card with every receive buffer posted.
struct Card {
    net: Net,
    /// `QUEUE` receive buffers of `BUF` bytes.
    rx: &'static mut [u8],
    /// The token of each receive buffer.
    tokens: [u16; QUEUE],
    /// Transmit memory: `QUEUE` buffers of `BUF` bytes (at least
    /// `ECHO_TX`).
    tx: &'static mut [u8],
}

/// A received frame: its buffer's index and its bytes' range in it.
struct Rx {
    index: usize,
    start: usize,
    len: usize,
}

impl Card {
    /// Initialises the card at `base` (`size` bytes of registers) and posts
    /// its receive buffers; prints why not and returns `None` on failure.
    fn open(base: u64, size: usize) -> Option<Card> {
        let header = NonNull::new(base as *mut VirtIOHeader)?;
        // SAFETY: the VMM maps `size` bytes of virtio-mmio registers at
        // `base` (user-accessible, identity-mapped); nothing else uses them.
        let transport = match unsafe { MmioTransport::new(header, size) } {
            Ok(t) => t,
            Err(e) => {
                println!(
                    "testguest: net at {:#x}: no virtio-mmio device ({:?})",
                    base, e
                );
                return None;
            }
        };
        let net = match Net::new(transport) {
            Ok(n) => n,
            Err(e) => {
                println!("testguest: net at {:#x}: init failed ({:?})", base, e);
                return None;
            }
        };
        let (rx_len, tx_len) = (QUEUE * BUF, (QUEUE * BUF).max(ECHO_TX));
        let Some(mem) = alloc_pages((rx_len + tx_len) as u64) else {
            println!("testguest: net: out of memory");
            return None;
        };
        // SAFETY: freshly allocated pages, used only by this card for as
        // long as the guest runs.
        let all = unsafe { core::slice::from_raw_parts_mut(mem as *mut u8, rx_len + tx_len) };
        let (rx, tx) = all.split_at_mut(rx_len);
        let mut card = Card {
            net,
            rx,
            tokens: [u16::MAX; QUEUE],
            tx,
        };
        for i in 0..QUEUE {
            card.post(i).ok()?;
        }
        let mac = card.net.mac_address();
        println!(
            "testguest: net ready, mac {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
        );
        Some(card)
    }

    /// Posts receive buffer `i` (again).
    fn post(&mut self, i: usize) -> Result<(), ()> {
        let buf = &mut self.rx[i * BUF..(i + 1) * BUF];
        // SAFETY: the buffer is not touched again before its completion.
        match unsafe { self.net.receive_begin(buf) } {
            Ok(t) => {
                self.tokens[i] = t;
                Ok(())
            }
            Err(e) => {
                println!("testguest: net: cannot post a receive buffer ({:?})", e);
                Err(())
            }
        }
    }

    /// The next received frame of [`ETHERTYPE`], polling; frames of other
    /// types are returned to the device. `Err` when the driver fails.
    fn receive(&mut self) -> Result<Rx, ()> {
        loop {
            let Some(token) = self.net.poll_receive() else {
                core::hint::spin_loop();
                continue;
            };
            let Some(index) = self.tokens.iter().position(|t| *t == token) else {
                println!("testguest: net: unknown receive token {}", token);
                return Err(());
            };
            let buf = &mut self.rx[index * BUF..(index + 1) * BUF];
            // SAFETY: the same buffer `receive_begin` got for this token.
            let (start, len) = match unsafe { self.net.receive_complete(token, buf) } {
                Ok(r) => r,
                Err(e) => {
                    println!("testguest: net: receive failed ({:?})", e);
                    return Err(());
                }
            };
            let frame = &buf[start..start + len];
            if len >= 14 && u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE {
                return Ok(Rx { index, start, len });
            }
            self.post(index)?;
        }
    }

    /// The bytes of a received frame.
    fn frame(&self, rx: &Rx) -> &[u8] {
        &self.rx[rx.index * BUF + rx.start..][..rx.len]
    }
}

/// Runs `mode` on the network card at `base` (`size` bytes of registers);
/// `tsc_khz` converts the guest's TSC to time.
pub fn run(mode: Mode, base: u64, size: usize, tsc_khz: u64) {
    let Some(mut card) = Card::open(base, size) else {
        return;
    };
    let _ = match mode {
        Mode::Echo => echo(&mut card),
        Mode::Sink => sink(&mut card, tsc_khz),
        Mode::Source { size, count } => source(&mut card, size, count, tsc_khz),
    };
}

fn ns(ticks: u64, tsc_khz: u64) -> u64 {
    (u128::from(ticks) * 1_000_000 / u128::from(tsc_khz.max(1))) as u64
}

/// The echo (module docs).
fn echo(card: &mut Card) -> Result<(), ()> {
    let (mut frames, mut bytes, mut h) = (0u64, 0u64, stage_workload::checksum::FNV1A_START);
    loop {
        let rx = card.receive()?;
        let len = rx.len;
        let frame = &card.rx[rx.index * BUF + rx.start..][..len];
        let tx = &mut card.tx[..ECHO_TX];
        if frame[14..].starts_with(b"BIG!") {
            tx[..BIG].fill(0x42);
            tx[..6].copy_from_slice(&frame[6..12]);
            tx[6..12].copy_from_slice(&frame[..6]);
            tx[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
            // The device completes the chain without sending it.
            if let Err(e) = card.net.send(&tx[..BIG]) {
                println!("testguest: net: oversized send failed ({:?})", e);
            }
        }
        let out = &mut tx[..len];
        out[..6].copy_from_slice(&frame[6..12]);
        out[6..12].copy_from_slice(&frame[..6]);
        out[12..].copy_from_slice(&frame[12..]);
        let stop = frame[14..].starts_with(b"STOP");
        frames += 1;
        bytes += (len - 14) as u64;
        h = stage_workload::checksum::fnv1a_continue(h, &frame[14..]);
        // `send` puts the virtio-net header in front itself.
        if let Err(e) = card.net.send(&tx[..len]) {
            println!("testguest: net: send failed ({:?})", e);
            return Err(());
        }
        card.post(rx.index)?;
        if stop {
            break;
        }
    }
    println!(
        "testguest: net echoed {} frames, {} bytes, fnv1a {:#018x}",
        frames, bytes, h
    );
    Ok(())
}

/// The receive direction's sink (module docs).
fn sink(card: &mut Card, tsc_khz: u64) -> Result<(), ()> {
    let (mut frames, mut bytes) = (0u64, 0u64);
    let (mut first, mut last) = (0u64, 0u64);
    let (mut first_seq, mut last_seq, mut disorder) = (0u32, 0u32, 0u64);
    loop {
        let rx = card.receive()?;
        let frame = card.frame(&rx);
        let stop = frame[14..].starts_with(b"STOP");
        if !stop && frame.len() >= 18 {
            let now = PortIo.tsc();
            let seq = u32::from_le_bytes([frame[14], frame[15], frame[16], frame[17]]);
            if frames == 0 {
                (first, first_seq) = (now, seq);
            } else if seq <= last_seq {
                disorder += 1;
            }
            last = now;
            last_seq = seq;
            frames += 1;
            bytes += frame.len() as u64;
        }
        card.post(rx.index)?;
        if stop {
            break;
        }
    }
    println!(
        "testguest: net sink {} frames, {} bytes in {} ns, first seq {}, last seq {}, out of order {}",
        frames,
        bytes,
        ns(last.wrapping_sub(first), tsc_khz),
        first_seq,
        last_seq,
        disorder
    );
    Ok(())
}

/// The transmit direction's source (module docs).
fn source(card: &mut Card, size: usize, count: u32, tsc_khz: u64) -> Result<(), ()> {
    // The peer: the source MAC of its GO! frame.
    let mut peer = [0u8; 6];
    loop {
        let rx = card.receive()?;
        let frame = card.frame(&rx);
        let go = frame[14..].starts_with(b"GO!");
        if go {
            peer.copy_from_slice(&frame[6..12]);
        }
        card.post(rx.index)?;
        if go {
            break;
        }
    }
    let mac = card.net.mac_address();
    let hdr = card
        .net
        .fill_buffer_header(&mut [0u8; 64])
        .map_err(|_| ())?;
    // Every transmit buffer: virtio-net header, Ethernet header, 0x5a.
    for slot in card.tx[..QUEUE * BUF].chunks_exact_mut(BUF) {
        card.net.fill_buffer_header(slot).map_err(|_| ())?;
        let f = &mut slot[hdr..];
        f[..6].copy_from_slice(&peer);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        f[14..SOURCE_FRAME.end() + 1].fill(0x5a);
    }
    // The slot of each token in flight (tokens are descriptor indices
    // below QUEUE) and the frame length each slot was started with.
    let mut slot_of = [u16::MAX; QUEUE];
    let mut frame_len = [0usize; QUEUE];
    let mut free: [u16; QUEUE] = core::array::from_fn(|i| i as u16);
    let mut nfree = QUEUE;
    let (mut sent, mut stops, mut full) = (0u32, 0u32, 0u64);
    let t0 = PortIo.tsc();
    loop {
        // Reclaim what the device completed.
        while let Some(token) = card.net.poll_transmit() {
            let t = usize::from(token);
            let slot = match slot_of.get(t) {
                Some(&s) if usize::from(s) < QUEUE => usize::from(s),
                _ => {
                    println!("testguest: net: unknown transmit token {}", token);
                    return Err(());
                }
            };
            let buf = &card.tx[slot * BUF..][..hdr + frame_len[slot]];
            // SAFETY: the buffer this token was started with.
            if let Err(e) = unsafe { card.net.transmit_complete(token, buf) } {
                println!("testguest: net: transmit completion failed ({:?})", e);
                return Err(());
            }
            slot_of[t] = u16::MAX;
            free[nfree] = slot as u16;
            nfree += 1;
        }
        if sent == count && stops == 3 {
            if nfree == QUEUE {
                break;
            }
            core::hint::spin_loop();
            continue;
        }
        if nfree == 0 {
            full += 1;
            while card.net.poll_transmit().is_none() {
                core::hint::spin_loop();
            }
            continue;
        }
        nfree -= 1;
        let slot = usize::from(free[nfree]);
        let buf = &mut card.tx[slot * BUF..(slot + 1) * BUF];
        let len = if sent < count {
            buf[hdr + 14..hdr + 18].copy_from_slice(&sent.to_le_bytes());
            sent += 1;
            size
        } else {
            buf[hdr + 14..hdr + 18].copy_from_slice(b"STOP");
            stops += 1;
            60
        };
        frame_len[slot] = len;
        // SAFETY: the slot is not written again before its completion.
        match unsafe { card.net.transmit_begin(&buf[..hdr + len]) } {
            Ok(token) => match slot_of.get_mut(usize::from(token)) {
                Some(s) => *s = slot as u16,
                None => {
                    println!("testguest: net: transmit token {} out of range", token);
                    return Err(());
                }
            },
            Err(e) => {
                println!("testguest: net: transmit failed ({:?})", e);
                return Err(());
            }
        }
    }
    let t = ns(PortIo.tsc().wrapping_sub(t0), tsc_khz);
    println!(
        "testguest: net source {} frames, {} bytes in {} ns, queue full {}",
        sent,
        u64::from(sent) * size as u64,
        t,
        full
    );
    Ok(())
}
