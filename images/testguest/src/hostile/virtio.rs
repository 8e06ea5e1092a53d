//! `hostile=virtio_bad` and `hostile=virtio_chains`: a raw virtio-mmio
//! driver (VIRTIO 1.2 §4.2, split queue of [`QSIZE`] entries, polled) that
//! writes bad register values and bad descriptor chains to the first
//! `--disk`, with good 512-byte reads in between that must still work;
//! `hostile=net_chains`: the same driver on the first `--net`'s transmit
//! queue; `hostile=netspin`: on its receive queue.
//! Register offsets are the VMM's (`vmm/src/devices/virtio/mmio.rs`).
//!
//! Depends on [`super::env`] and [`crate::staged::platform`]'s allocator.

use core::sync::atomic::{fence, AtomicU64, Ordering};

use super::env::{fail, tsc, Env};
use crate::print_line;
use crate::staged::platform::alloc_pages;

/// Register offsets (VIRTIO 1.2 §4.2.2).
mod reg {
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
}

/// Entries of the queue the driver sets up.
const QSIZE: u16 = 16;
/// Descriptor flags (VIRTIO 1.2 §2.7.5).
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;
/// Device status bits (VIRTIO 1.2 §2.1).
const S_ACK_DRIVER: u32 = 1 | 2;
const S_FEATURES_OK: u32 = 8;
const S_DRIVER_OK: u32 = 4;
const S_FAILED: u32 = 128;
/// A guest-physical address far outside RAM (256 GiB).
const OUTSIDE: u64 = 0x40_0000_0000;
/// Each bad queue-register value is written this many times.
const BAD_REPEAT: u32 = 1000;
/// QueueNotify writes of the notification flood.
const NOTIFY_FLOOD: u32 = 100_000;

/// Offsets in the driver's buffer page: request header (16 bytes), status
/// byte, and 512 bytes of data.
const HDR: u64 = 0;
const STATUS_BYTE: u64 = 64;
const DATA: u64 = 512;

/// The raw driver: register window and its queue memory (4 pages: table,
/// driver area, device area, buffers), allocated once for all rounds.
struct Raw {
    base: u64,
    desc: u64,
    avail: u64,
    used: u64,
    buf: u64,
    /// Next available index the driver publishes.
    next_avail: u16,
    /// Used index seen so far.
    used_seen: u16,
    /// Poll timeout for one completion (TSC ticks).
    timeout: u64,
    /// The queue driven: 0 (a disk's), or 1 (a network card's transmitq).
    queue: u32,
}

impl Raw {
    fn new(env: &Env) -> Self {
        static MEM: AtomicU64 = AtomicU64::new(0);
        let Some(base) = env.virtio else {
            fail(format_args!("the virtio attacks need --disk"));
        };
        if MEM.load(Ordering::Relaxed) == 0 {
            let mem = alloc_pages(4 * 4096).unwrap_or_else(|| fail(format_args!("out of memory")));
            MEM.store(mem, Ordering::Relaxed);
        }
        let mem = MEM.load(Ordering::Relaxed);
        Self {
            base,
            desc: mem,
            avail: mem + 4096,
            used: mem + 2 * 4096,
            buf: mem + 3 * 4096,
            next_avail: 0,
            used_seen: 0,
            timeout: env.ticks(200),
            queue: 0,
        }
    }

    fn w(&self, offset: u64, value: u32) {
        // SAFETY: the device's mapped register window (user-accessible).
        unsafe { ((self.base + offset) as *mut u32).write_volatile(value) };
    }

    fn r(&self, offset: u64) -> u32 {
        // SAFETY: as for `w`.
        unsafe { ((self.base + offset) as *const u32).read_volatile() }
    }

    fn w16(addr: u64, value: u16) {
        // SAFETY: our own identity-mapped queue memory, 2-byte aligned.
        unsafe { (addr as *mut u16).write_volatile(value) };
    }

    fn r16(addr: u64) -> u16 {
        // SAFETY: as for `w16`.
        unsafe { (addr as *const u16).read_volatile() }
    }

    /// Writes the 64-bit `value` as a LOW/HIGH register pair.
    fn w64(&self, low: u64, high: u64, value: u64) {
        self.w(low, value as u32);
        self.w(high, (value >> 32) as u32);
    }

    /// Resets the device and starts it with VERSION_1 and a [`QSIZE`]-entry
    /// queue; with `bad`, first writes every bad queue value
    /// [`BAD_REPEAT`] times after the good ones (before QueueReady): a
    /// value the device took would leave the queue unusable.
    fn setup(&mut self, bad: bool) {
        self.w(reg::STATUS, 0);
        for page in [self.avail, self.used] {
            // SAFETY: a page of our own queue memory.
            unsafe { core::ptr::write_bytes(page as *mut u8, 0, 4096) };
        }
        (self.next_avail, self.used_seen) = (0, 0);
        self.w(reg::STATUS, S_ACK_DRIVER);
        self.w(reg::DRIVER_FEATURES_SEL, 1);
        self.w(reg::DRIVER_FEATURES, 1);
        self.w(reg::DRIVER_FEATURES_SEL, 0);
        self.w(reg::DRIVER_FEATURES, 0);
        self.w(reg::STATUS, S_ACK_DRIVER | S_FEATURES_OK);
        self.w(reg::QUEUE_SEL, self.queue);
        self.w(reg::QUEUE_NUM, u32::from(QSIZE));
        self.w64(reg::QUEUE_DESC_LOW, reg::QUEUE_DESC_HIGH, self.desc);
        self.w64(reg::QUEUE_DRIVER_LOW, reg::QUEUE_DRIVER_HIGH, self.avail);
        self.w64(reg::QUEUE_DEVICE_LOW, reg::QUEUE_DEVICE_HIGH, self.used);
        if bad {
            for _ in 0..BAD_REPEAT {
                self.w(reg::QUEUE_NUM, 3);
                self.w(reg::QUEUE_NUM, 512);
                self.w(reg::QUEUE_DESC_LOW, self.desc as u32 + 8);
                self.w(reg::QUEUE_DRIVER_LOW, self.avail as u32 + 1);
                self.w(reg::QUEUE_DEVICE_LOW, self.used as u32 + 2);
            }
        }
        self.w(reg::QUEUE_READY, 1);
        self.w(reg::STATUS, S_ACK_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    }

    /// Writes descriptor `i`.
    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = self.desc + 16 * u64::from(i);
        // SAFETY: entry `i` < 256 of our own descriptor table page.
        unsafe {
            (d as *mut u64).write_volatile(addr);
            ((d + 8) as *mut u32).write_volatile(len);
        }
        Self::w16(d + 12, flags);
        Self::w16(d + 14, next);
    }

    /// Publishes `head` in the available ring and notifies the device.
    fn offer(&mut self, head: u16) {
        Self::w16(
            self.avail + 4 + 2 * u64::from(self.next_avail % QSIZE),
            head,
        );
        self.next_avail = self.next_avail.wrapping_add(1);
        fence(Ordering::SeqCst);
        Self::w16(self.avail + 2, self.next_avail);
        fence(Ordering::SeqCst);
        self.w(reg::QUEUE_NOTIFY, self.queue);
    }

    /// Waits up to `ticks` for the next used entry; true when it came.
    fn completed(&mut self, ticks: u64) -> bool {
        let start = tsc();
        let want = self.used_seen.wrapping_add(1);
        while tsc() - start < ticks {
            if Self::r16(self.used + 2) == want {
                self.used_seen = want;
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// The status byte the device wrote (0xff: untouched).
    fn status_byte(&self) -> u8 {
        // SAFETY: our own buffer page.
        unsafe { ((self.buf + STATUS_BYTE) as *const u8).read_volatile() }
    }

    /// Prepares a read (type IN) of `sector` in the header, clears the
    /// status byte to 0xff.
    fn prepare(&self, kind: u32, sector: u64) {
        // SAFETY: our own buffer page.
        unsafe {
            ((self.buf + HDR) as *mut u32).write_volatile(kind);
            ((self.buf + HDR + 4) as *mut u32).write_volatile(0);
            ((self.buf + HDR + 8) as *mut u64).write_volatile(sector);
            ((self.buf + STATUS_BYTE) as *mut u8).write_volatile(0xff);
        }
    }

    /// A good 512-byte read of sector 0: header, data, status. True when it
    /// completed with status OK.
    fn good_read(&mut self) -> bool {
        self.prepare(0, 0);
        self.desc(0, self.buf + HDR, 16, F_NEXT, 1);
        self.desc(1, self.buf + DATA, 512, F_NEXT | F_WRITE, 2);
        self.desc(2, self.buf + STATUS_BYTE, 1, F_WRITE, 0);
        self.offer(0);
        self.completed(self.timeout) && self.status_byte() == 0
    }
}

/// `virtio_bad`: bad queue-register values during setup, a bad available
/// index, a bad head (`bad_heads` + 1), QueueNotify floods on a ready and
/// on a stopped queue, unoffered features; 4 good reads in between.
pub fn bad_registers(env: &Env, verbose: bool) {
    let mut raw = Raw::new(env);
    raw.setup(true);
    let mut good = u32::from(raw.good_read());
    // An available index 1000 ahead of the device's (more than the queue).
    Raw::w16(raw.avail + 2, raw.next_avail.wrapping_add(1000));
    for _ in 0..100 {
        raw.w(reg::QUEUE_NOTIFY, 0);
    }
    Raw::w16(raw.avail + 2, raw.next_avail);
    good += u32::from(raw.good_read());
    // A head naming no descriptor: consumed, never completed.
    raw.offer(999);
    let bad_head_completed = raw.completed(env.ticks(20));
    good += u32::from(raw.good_read());
    for _ in 0..NOTIFY_FLOOD {
        raw.w(reg::QUEUE_NOTIFY, 0);
    }
    raw.w(reg::QUEUE_READY, 0);
    for i in 0..1000 {
        raw.w(reg::QUEUE_NOTIFY, i);
    }
    raw.w(reg::QUEUE_READY, 1);
    good += u32::from(raw.good_read());
    // Features the device never offered: it must refuse DRIVER_OK.
    raw.w(reg::STATUS, 0);
    raw.w(reg::STATUS, S_ACK_DRIVER);
    raw.w(reg::DRIVER_FEATURES_SEL, 1);
    raw.w(reg::DRIVER_FEATURES, u32::MAX);
    raw.w(reg::STATUS, S_ACK_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    let refused = raw.r(reg::STATUS) & S_FAILED != 0;
    raw.setup(false);
    good += u32::from(raw.good_read());
    if verbose {
        println!(
            "hostile: virtio_bad {} of 5 good reads OK, bad head completed {}, unoffered features refused {}, {} notifies",
            good,
            bad_head_completed,
            refused,
            NOTIFY_FLOOD + 1100
        );
    }
}

/// One bad chain: writes its descriptors (head 0) and returns its name.
fn write_chain(raw: &Raw, which: u32) -> &'static str {
    let (hdr, data, status) = (raw.buf + HDR, raw.buf + DATA, raw.buf + STATUS_BYTE);
    let good_tail = |data_addr: u64, data_len: u32, status_addr: u64| {
        raw.desc(1, data_addr, data_len, F_NEXT | F_WRITE, 2);
        raw.desc(2, status_addr, 1, F_WRITE, 0);
    };
    raw.prepare(0, 0);
    match which {
        0 => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            raw.desc(1, status, 1, F_NEXT | F_WRITE, 0);
            "loop of two"
        }
        1 => {
            raw.desc(0, hdr, 16, F_NEXT, 0);
            "self loop"
        }
        2 => {
            raw.desc(0, OUTSIDE, 16, F_NEXT, 1);
            good_tail(data, 512, status);
            "header outside RAM"
        }
        3 => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            good_tail(OUTSIDE, 512, status);
            "data outside RAM"
        }
        4 => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            good_tail(data, 512, OUTSIDE);
            "status outside RAM"
        }
        5 => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            good_tail(u64::MAX - 100, 512, status);
            "data address overflows"
        }
        6 => {
            raw.desc(0, hdr, 16, F_NEXT, 200);
            "next out of range"
        }
        7 => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            good_tail(data, 0xffff_fe00, status);
            "huge data length"
        }
        8 => {
            raw.desc(0, data, 48, F_INDIRECT, 0);
            "indirect descriptor"
        }
        _ => {
            raw.desc(0, hdr, 16, F_NEXT, 1);
            for i in 1..QSIZE {
                raw.desc(i, data, 512, F_NEXT, (i + 1) % QSIZE);
            }
            "full-size loop"
        }
    }
}

/// Bad chains [`write_chain`] knows.
const BAD_CHAINS: u32 = 10;

/// `virtio_chains`: [`BAD_CHAINS`] bad chains, each of which the device
/// must complete (used entry) with an error or without status; then the
/// descriptor table moved outside RAM (served nothing); a good read before
/// and after.
pub fn bad_chains(env: &Env, verbose: bool) {
    let mut raw = Raw::new(env);
    raw.setup(false);
    let mut good = u32::from(raw.good_read());
    let mut completed = 0;
    let mut statuses = [0u8; BAD_CHAINS as usize];
    for which in 0..BAD_CHAINS {
        let name = write_chain(&raw, which);
        raw.offer(0);
        if raw.completed(raw.timeout) {
            completed += 1;
        } else if verbose {
            println!("hostile: virtio_chains: '{}' was not completed", name);
        }
        statuses[which as usize] = raw.status_byte();
    }
    good += u32::from(raw.good_read());
    // The descriptor table outside RAM: nothing can be served.
    raw.w(reg::QUEUE_READY, 0);
    raw.w64(reg::QUEUE_DESC_LOW, reg::QUEUE_DESC_HIGH, OUTSIDE);
    raw.w(reg::QUEUE_READY, 1);
    raw.offer(0);
    let outside_completed = raw.completed(env.ticks(20));
    raw.setup(false);
    good += u32::from(raw.good_read());
    if verbose {
        println!(
            "hostile: virtio_chains {} of {} bad chains completed (status bytes {:?}), table outside RAM completed {}, {} of 3 good reads OK",
            completed, BAD_CHAINS, statuses, outside_completed, good
        );
    }
}

/// Bad transmit chains [`net_chains`] sends.
const NET_CHAINS: u32 = 9;

/// Writes bad transmit chain `which` from descriptor 0 (the frame is the
/// driver's data area: a zero header, then a broadcast frame).
fn write_net_chain(raw: &Raw, which: u32) -> &'static str {
    let frame = raw.buf + DATA;
    match which {
        0 => {
            raw.desc(0, frame, 12, F_NEXT, 1);
            raw.desc(1, frame + 12, 60, F_NEXT, 0);
            "loop of two"
        }
        1 => {
            raw.desc(0, frame, 72, F_NEXT, 0);
            "self loop"
        }
        2 => {
            raw.desc(0, frame, 12, F_NEXT, 200);
            "next out of range"
        }
        3 => {
            raw.desc(0, OUTSIDE, 72, 0, 0);
            "frame outside RAM"
        }
        4 => {
            raw.desc(0, frame, 72, F_WRITE, 0);
            "device-writable frame"
        }
        5 => {
            raw.desc(0, frame, 48, F_INDIRECT, 0);
            "indirect descriptor"
        }
        6 => {
            raw.desc(0, frame, 4, 0, 0);
            "shorter than the header"
        }
        7 => {
            raw.desc(0, frame, 12 + 4000, 0, 0);
            "4000-byte frame"
        }
        _ => {
            raw.desc(0, frame, 12, F_NEXT, 1);
            raw.desc(1, u64::MAX - 100, 60, 0, 0);
            "address overflows"
        }
    }
}

/// `net_chains`: [`NET_CHAINS`] bad transmit chains on the network card,
/// each of which the device must complete; then a good 60-byte frame
/// (broadcast from the card's MAC, ethertype 0x88b5), which must be
/// completed too.
pub fn net_chains(env: &Env, verbose: bool) {
    let Some(base) = env.net else {
        fail(format_args!("net_chains needs --net"));
    };
    let mut raw = Raw::new(&Env {
        virtio: Some(base),
        ..*env
    });
    raw.queue = 1;
    raw.setup(false);
    // SAFETY: 26 bytes at DATA of our own buffer page, and byte reads of
    // the card's MAC in its config space (offset 0x100, mapped). (The
    // 4000-byte chain reaches past the page; only the device would read
    // there, and it refuses that chain by its length first.)
    unsafe {
        core::ptr::write_bytes((raw.buf + DATA) as *mut u8, 0, 12);
        core::ptr::write_bytes((raw.buf + DATA + 12) as *mut u8, 0xff, 6);
        for i in 0..6 {
            let b = ((base + 0x100 + i) as *const u8).read_volatile();
            ((raw.buf + DATA + 18 + i) as *mut u8).write_volatile(b);
        }
        ((raw.buf + DATA + 24) as *mut u16).write_volatile(0xb588);
    }
    let mut completed = 0;
    for which in 0..NET_CHAINS {
        let name = write_net_chain(&raw, which);
        raw.offer(0);
        if raw.completed(raw.timeout) {
            completed += 1;
        } else if verbose {
            println!("hostile: net_chains: '{}' was not completed", name);
        }
    }
    raw.desc(0, raw.buf + DATA, 72, 0, 0);
    raw.offer(0);
    let good = raw.completed(raw.timeout);
    if verbose {
        println!(
            "hostile: net_chains {} of {} bad chains completed, good frame completed {}",
            completed, NET_CHAINS, good
        );
    }
}

/// How long [`net_spin`] notifies an empty receive queue (ms).
const NETSPIN_MS: u64 = 10_000;

/// `netspin`: the receive queue holds no buffer while the host sends
/// frames (the device keeps one waiting), and the driver writes
/// QueueNotify on it about every 50 µs for [`NETSPIN_MS`] — a few percent
/// of one vCPU, which the device must not turn into a host core's worth of
/// polling (issue 36). Then one 2 KiB receive buffer is posted: the frame
/// waiting must arrive in it.
pub fn net_spin(env: &Env, verbose: bool) {
    let Some(base) = env.net else {
        fail(format_args!("netspin needs --net"));
    };
    let mut raw = Raw::new(&Env {
        virtio: Some(base),
        ..*env
    });
    raw.queue = 0;
    raw.setup(false);
    if verbose {
        println!("hostile: netspin notifying an empty receive queue");
    }
    let gap = env.ticks(1) / 20;
    let end = tsc() + env.ticks(NETSPIN_MS);
    let mut notifications = 0u64;
    while tsc() < end {
        raw.w(reg::QUEUE_NOTIFY, 0);
        notifications += 1;
        let t = tsc();
        while tsc() - t < gap {
            core::hint::spin_loop();
        }
    }
    raw.desc(0, raw.buf + DATA, 2048, F_WRITE, 0);
    raw.offer(0);
    let got = raw.completed(env.ticks(1000));
    // The used element's length (VIRTIO 1.2 §2.7.8: id, then len).
    // SAFETY: our own used-ring page, entry 0.
    let len = unsafe { ((raw.used + 4 + 4) as *const u32).read_volatile() };
    if verbose {
        println!(
            "hostile: netspin {} notifications, then a frame received {} ({} bytes with the header)",
            notifications, got, len
        );
    }
}
