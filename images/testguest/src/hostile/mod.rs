//! `hostile=NAME[,NAME…][,forever]`: the guest attacks the VMM instead of
//! running its workload, so the end-to-end tests (`tests/hostile.rs`) can
//! check that the VMM survives, counts, rate-limits its log and bounds its
//! memory. vCPU 0 runs the named attacks in the order of [`ATTACKS`] after
//! the banner and the registration, prints `hostile: NAME start` before and
//! one `hostile: NAME …` result line after each, then `hostile: done`, and
//! shuts down with `exit=` (default 0). With `forever` it repeats the
//! attacks until the VMM is killed (lines are printed in the first round
//! only). vCPU 1 measures doorbell latency during `prefill`; every other
//! vCPU stops.
//!
//! The stage-channel attacks write the ring memory directly (the area's
//! address and layout come from the registration), as a hostile guest
//! would; the virtio attacks are in [`virtio`], the counter and
//! re-registration attacks in [`bad_counters`], and `abuse=1` (bad REGISTERs
//! and corrupt ring entries around the staged workload's registration) in
//! [`abuse`]; [`env`](mod@env) holds what they all use.
//!
//! Depends on [`crate::staged::platform`] (the agent, the registered area,
//! the page allocator, the TSC rate); `crate::staged` does not depend on
//! this module (`main.rs` hands [`abuse::bad_registers`] to
//! `staged::setup`).

pub mod abuse;
mod bad_counters;
mod env;
mod virtio;

use core::mem::offset_of;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hypercall_abi::boot::BootInfo;
use hypercall_abi::stage::{
    Layout, RingHeader, StageEvent, Status, DOORBELL_REGISTER, DOORBELL_STATUS, DOORBELL_WAKE,
    IDLE_THREAD, STAGE_NONE,
};

use crate::staged::platform::{agent, alloc_pages, area, TSC_KHZ};
use crate::{inl, outl, print_line, shutdown, stop_vcpu};
use env::{fail, tsc, Env};

/// One attack (its bit in [`Hostile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// 100,000 REGISTERs of bad PFNs, then 100,000 of the registered area.
    RegisterFlood,
    /// 100,000 WAKEs, half of valid vCPUs, half out of range.
    WakeFlood,
    /// vCPU 0's ring head moved next to `u64::MAX`, across the wrap and back.
    RingWrap,
    /// Every ring filled completely, all heads published at once.
    Prefill,
    /// Events whose TSC goes backwards, jumps to `u64::MAX`, stays equal.
    ForgedTsc,
    /// Bad virtio register writes and notification floods (`--disk`).
    VirtioBad,
    /// Looping descriptor chains and chains pointing outside RAM (`--disk`).
    VirtioChains,
    /// Impossible values in the counter blocks (ABI minor 2).
    Counters,
    /// UNREGISTER + REGISTER of a 16-stage area in a loop.
    Reregister,
    /// Bad transmit chains on the network card (`--net`).
    NetChains,
    /// A frame waiting for a receive buffer and QueueNotify every ~50 µs
    /// (`--net`).
    NetSpin,
}

/// Attack names on the command line, in the order they run.
pub const ATTACKS: [(&str, Attack); 11] = [
    ("register_flood", Attack::RegisterFlood),
    ("wake_flood", Attack::WakeFlood),
    ("ring_wrap", Attack::RingWrap),
    ("prefill", Attack::Prefill),
    ("forged_tsc", Attack::ForgedTsc),
    ("virtio_bad", Attack::VirtioBad),
    ("virtio_chains", Attack::VirtioChains),
    ("counters", Attack::Counters),
    ("reregister", Attack::Reregister),
    ("net_chains", Attack::NetChains),
    ("netspin", Attack::NetSpin),
];

/// The attacks chosen with `hostile=`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hostile {
    mask: u32,
    /// Repeat the attacks until killed.
    pub forever: bool,
}

impl Hostile {
    /// Parses `NAME[,NAME…][,forever]`; `None` for an unknown name or no
    /// attack at all.
    pub fn parse(value: &str) -> Option<Self> {
        let mut h = Self::default();
        for name in value.split(',') {
            if name == "forever" {
                h.forever = true;
                continue;
            }
            let (_, attack) = ATTACKS.iter().find(|(n, _)| *n == name)?;
            h.mask |= 1 << *attack as u32;
        }
        (h.mask != 0).then_some(h)
    }

    /// Whether any attack was chosen.
    pub fn is_active(&self) -> bool {
        self.mask != 0
    }

    /// Whether `attack` was chosen.
    pub fn has(&self, attack: Attack) -> bool {
        self.mask & (1 << attack as u32) != 0
    }
}

/// Doorbells per flood.
const FLOOD: u64 = 100_000;
/// One flood doorbell in this many has its status read back (an extra exit).
const CHECK_EVERY: u64 = 100;

/// A virtio-mmio device's register window (GPA, bytes), if there is one.
pub type Device = Option<(u64, usize)>;

/// Entry of every vCPU in hostile mode (after its checksum line); never
/// returns. vCPU 0 runs the attacks and shuts down with `exit`.
pub fn run(
    vcpu: u32,
    info: &BootInfo,
    h: Hostile,
    (virtio, net): (Device, Device),
    exit: u32,
) -> ! {
    if vcpu != 0 {
        if vcpu == 1 && h.has(Attack::Prefill) {
            latency_helper(info.num_vcpus);
        }
        stop_vcpu();
    }
    let env = Env {
        mem_size: info.mem_size,
        num_vcpus: info.num_vcpus,
        tsc_khz: khz(),
        virtio: virtio.map(|(base, _)| base),
        net: net.map(|(base, _)| base),
    };
    let mut first = true;
    loop {
        for (name, attack) in ATTACKS {
            if h.has(attack) {
                if first {
                    println!("hostile: {} start", name);
                }
                run_one(attack, &env, first);
            }
        }
        first = false;
        if !h.forever {
            break;
        }
    }
    PHASE.store(PHASE_DONE, Ordering::Release);
    println!("hostile: done");
    shutdown(exit)
}

/// Runs `attack` once; prints its result line when `verbose`.
fn run_one(attack: Attack, env: &Env, verbose: bool) {
    match attack {
        Attack::RegisterFlood => register_flood(env, verbose),
        Attack::WakeFlood => wake_flood(env, verbose),
        Attack::RingWrap => ring_wrap(&Rings::get(), verbose),
        Attack::Prefill => prefill(&Rings::get(), env, verbose),
        Attack::ForgedTsc => forged_tsc(&Rings::get(), verbose),
        Attack::VirtioBad => virtio::bad_registers(env, verbose),
        Attack::VirtioChains => virtio::bad_chains(env, verbose),
        Attack::NetChains => virtio::net_chains(env, verbose),
        Attack::NetSpin => virtio::net_spin(env, verbose),
        Attack::Counters => bad_counters::impossible_counters(env, verbose),
        Attack::Reregister => bad_counters::reregister_loop(env, verbose),
    }
}

/// The registered area's rings, written directly.
struct Rings {
    base: u64,
    layout: Layout,
}

impl Rings {
    /// The registered area; ends the VM (exit 6) when the channel is not
    /// registered: the ring attacks need it.
    fn get() -> Self {
        match agent().layout() {
            Some(layout) if area() != 0 => Self {
                base: area(),
                layout,
            },
            _ => fail(format_args!(
                "the ring attacks need a registered stage channel"
            )),
        }
    }

    fn word(&self, vcpu: u32, offset: usize) -> &'static AtomicU64 {
        let addr = self.base + self.layout.ring_offset(vcpu) + offset as u64;
        // SAFETY: a field of ring `vcpu` < num_vcpus in our own registered,
        // identity-mapped area, 8-byte aligned; the host accesses it
        // atomically too.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }
    }

    fn head(&self, vcpu: u32) -> &'static AtomicU64 {
        self.word(vcpu, offset_of!(RingHeader, head))
    }

    fn tail(&self, vcpu: u32) -> &'static AtomicU64 {
        self.word(vcpu, offset_of!(RingHeader, tail))
    }

    /// Writes `event` into the slot of free-running `index` (head untouched).
    fn write(&self, vcpu: u32, index: u64, event: StageEvent) {
        let addr = self.base + self.layout.slot_offset(vcpu, index);
        // SAFETY: a slot of ring `vcpu` in our own area, 32-byte aligned.
        unsafe { (addr as *mut StageEvent).write_volatile(event) };
    }

    /// Publishes `head` for `vcpu`'s ring.
    fn publish(&self, vcpu: u32, head: u64) {
        self.head(vcpu).store(head, Ordering::Release);
    }

    fn drained(&self, vcpu: u32) -> bool {
        self.tail(vcpu).load(Ordering::Acquire) == self.head(vcpu).load(Ordering::Relaxed)
    }

    /// Waits (parking 200 µs at a time) until the host consumed every ring;
    /// fails after 10 s.
    fn wait_drained(&self) {
        let start = tsc();
        let limit = 10_000 * khz();
        while !(0..self.layout.num_vcpus).all(|v| self.drained(v)) {
            if tsc() - start > limit {
                fail(format_args!("the VMM did not drain the rings within 10 s"));
            }
            agent().wait(200);
        }
    }

    /// Appends `event` (its `seq` set to the index) to `vcpu`'s ring,
    /// waiting while the ring is full.
    fn push(&self, vcpu: u32, event: StageEvent) {
        let head = self.head(vcpu).load(Ordering::Relaxed);
        while head.wrapping_sub(self.tail(vcpu).load(Ordering::Acquire))
            >= u64::from(self.layout.ring_entries)
        {
            self.wait_drained();
        }
        self.write(vcpu, head, StageEvent { seq: head, ..event });
        self.publish(vcpu, head.wrapping_add(1));
    }
}

/// TSC rate assumed when the VMM gave none (kHz).
const TSC_KHZ_GUESS: u64 = 3_000_000;

/// The guest's TSC rate (kHz), or [`TSC_KHZ_GUESS`].
fn khz() -> u64 {
    match TSC_KHZ.load(Ordering::Relaxed) {
        0 => TSC_KHZ_GUESS,
        k => k,
    }
}

/// A plausible event: entering `stage` (or leaving, `STAGE_NONE`).
fn event(seq: u64, tsc: u64, stage: u32, thread: u32) -> StageEvent {
    StageEvent {
        seq,
        tsc,
        stage,
        thread,
        reserved: 0,
    }
}

/// Sends REGISTER for `pfn`; reads the status back when `check`.
fn register(pfn: u32, check: bool) -> Option<Status> {
    outl(DOORBELL_REGISTER, pfn);
    check.then(|| Status::from_u32(inl(DOORBELL_STATUS)).unwrap_or(Status::NoDevice))
}

/// A zeroed page (no magic) for BadMagic REGISTERs, allocated once.
fn zero_page() -> u64 {
    static PAGE: AtomicU64 = AtomicU64::new(0);
    if PAGE.load(Ordering::Relaxed) == 0 {
        let page = alloc_pages(4096).unwrap_or_else(|| fail(format_args!("out of memory")));
        PAGE.store(page, Ordering::Relaxed);
    }
    PAGE.load(Ordering::Relaxed)
}

/// [`FLOOD`] bad REGISTERs — a quarter each below 1 MiB, past the end of
/// RAM, near the top of the 32-bit PFN space (`BadRange`), and of a zeroed
/// page (`BadMagic`) — then [`FLOOD`] REGISTERs of the registered area
/// (`AlreadyRegistered`). Checks one status in [`CHECK_EVERY`].
fn register_flood(env: &Env, verbose: bool) {
    let ram_pages = env.mem_size >> 12;
    let zero = zero_page() >> 12;
    let mut unexpected = 0u64;
    for i in 0..FLOOD {
        let (pfn, want) = match i % 4 {
            0 => (i % 256, Status::BadRange),
            1 => (ram_pages + i % 1000, Status::BadRange),
            2 => (u64::from(u32::MAX) - i % 1000, Status::BadRange),
            _ => (zero, Status::BadMagic),
        };
        if register(pfn as u32, i % CHECK_EVERY < 4).is_some_and(|s| s != want) {
            unexpected += 1;
        }
    }
    let own = area() >> 12;
    for i in 0..FLOOD {
        let check = i % CHECK_EVERY == 0;
        if register(own as u32, check).is_some_and(|s| s != Status::AlreadyRegistered) {
            unexpected += 1;
        }
    }
    if verbose {
        println!(
            "hostile: register_flood sent {} BadRange, {} BadMagic and {} AlreadyRegistered REGISTERs, {} unexpected statuses",
            FLOOD / 4 * 3,
            FLOOD / 4,
            FLOOD,
            unexpected
        );
    }
}

/// [`FLOOD`] WAKEs: even ones of valid vCPUs (round-robin), odd ones of
/// vCPUs past the VM's count or near `u32::MAX` (`BadVcpu`).
fn wake_flood(env: &Env, verbose: bool) {
    let n = env.num_vcpus;
    let mut unexpected = 0u64;
    for i in 0..FLOOD {
        let (target, want) = match i % 4 {
            0 | 2 => ((i / 2) as u32 % n, Status::Ok),
            1 => (n + (i % 1000) as u32, Status::BadVcpu),
            _ => (u32::MAX - (i % 7) as u32, Status::BadVcpu),
        };
        outl(DOORBELL_WAKE, target);
        if i % CHECK_EVERY < 4 && Status::from_u32(inl(DOORBELL_STATUS)) != Some(want) {
            unexpected += 1;
        }
    }
    if verbose {
        println!(
            "hostile: wake_flood sent {} valid and {} out-of-range WAKEs, {} unexpected statuses",
            FLOOD / 2,
            FLOOD / 2,
            unexpected
        );
    }
}

/// vCPU 0's ring: head jumped to `u64::MAX - 8` (bad index), 8 plausible
/// entries up to `u64::MAX`, one entry across the wrap (bad index), 8
/// entries after it, a head moved behind the tail (bad index) and 8 more.
/// Per round: 3 `bad_index`, 24 valid events.
fn ring_wrap(rings: &Rings, verbose: bool) {
    let stages = rings.layout.num_stages;
    let write_run = |from: u64, n: u64| {
        for i in 0..n {
            let seq = from.wrapping_add(i);
            rings.write(0, seq, event(seq, tsc(), (i % u64::from(stages)) as u32, 1));
        }
        rings.publish(0, from.wrapping_add(n));
        rings.wait_drained();
    };
    rings.wait_drained();
    rings.publish(0, u64::MAX - 8);
    rings.wait_drained();
    write_run(u64::MAX - 8, 8);
    // The slot of index u64::MAX, then head 0: the index wraps.
    write_run(u64::MAX, 1);
    write_run(0, 8);
    // Behind the tail.
    rings.publish(0, 3);
    rings.wait_drained();
    write_run(3, 8);
    if verbose {
        println!("hostile: ring_wrap made 3 bad indices and wrote 24 valid events on vCPU 0");
    }
}

/// Latency samples of one phase: count, maximum and sum (ns), and a
/// histogram of 10 µs buckets up to 10 ms (the last holds the rest).
struct Lat {
    n: AtomicU64,
    max_ns: AtomicU64,
    sum_ns: AtomicU64,
    hist: [AtomicU32; 1001],
}

impl Lat {
    const fn new() -> Self {
        Self {
            n: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            hist: [const { AtomicU32::new(0) }; 1001],
        }
    }

    fn record(&self, ns: u64) {
        self.n.fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.hist[((ns / 10_000) as usize).min(1000)].fetch_add(1, Ordering::Relaxed);
    }

    /// (samples, median upper bound, mean, max), all but the first in ns.
    fn summary(&self) -> (u64, u64, u64, u64) {
        let n = self.n.load(Ordering::Relaxed);
        let mut seen = 0u64;
        let mut p50 = 0;
        for (i, b) in self.hist.iter().enumerate() {
            seen += u64::from(b.load(Ordering::Relaxed));
            if seen * 2 >= n {
                p50 = (i as u64 + 1) * 10_000;
                break;
            }
        }
        let mean = self.sum_ns.load(Ordering::Relaxed) / n.max(1);
        (n, p50, mean, self.max_ns.load(Ordering::Relaxed))
    }
}

const PHASE_IDLE: u32 = 0;
const PHASE_BASELINE: u32 = 1;
const PHASE_DRAIN: u32 = 2;
const PHASE_DONE: u32 = 3;
/// What vCPU 1's [`latency_helper`] measures now.
static PHASE: AtomicU32 = AtomicU32::new(PHASE_IDLE);
static BASELINE: Lat = Lat::new();
static DRAINING: Lat = Lat::new();

/// vCPU 1 during `prefill`: while a phase is on, times a WAKE round trip
/// (`out` + status `in`, TSC before and after) every ~100 µs; the WAKE
/// goes to the last vCPU, which is stopped, so nobody's WAIT is cut short.
fn latency_helper(num_vcpus: u32) -> ! {
    let target = num_vcpus - 1;
    let khz = khz();
    loop {
        let lat = match PHASE.load(Ordering::Acquire) {
            PHASE_DONE => stop_vcpu(),
            PHASE_BASELINE => &BASELINE,
            PHASE_DRAIN => &DRAINING,
            _ => {
                agent().wait(1000);
                continue;
            }
        };
        let t0 = tsc();
        outl(DOORBELL_WAKE, target);
        let _ = inl(DOORBELL_STATUS);
        let ticks = tsc() - t0;
        lat.record((u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64);
        if target > 1 {
            agent().wait(100);
        } else {
            let until = tsc() + khz / 10;
            while tsc() < until {
                core::hint::spin_loop();
            }
        }
    }
}

/// Fills every ring completely with valid events (stage `i mod stages`,
/// thread `i mod 65536`, rising TSC), then publishes all heads at once and
/// waits until the host drained them all. vCPU 1 times WAKE round trips
/// while the rings are filled (baseline) and while they drain.
fn prefill(rings: &Rings, env: &Env, verbose: bool) {
    let l = rings.layout;
    let entries = u64::from(l.ring_entries);
    rings.wait_drained();
    PHASE.store(PHASE_BASELINE, Ordering::Release);
    let base = tsc();
    let mut heads = [0u64; hypercall_abi::stage::MAX_VCPUS];
    for v in 0..l.num_vcpus {
        let head = rings.head(v).load(Ordering::Relaxed);
        heads[v as usize] = head;
        for i in 0..entries {
            let seq = head.wrapping_add(i);
            let stage = (i % u64::from(l.num_stages)) as u32;
            rings.write(v, seq, event(seq, base + i, stage, (i & 0xffff) as u32));
        }
    }
    // At least 20 baseline samples (or 200 ms) before the flood.
    let wait_from = tsc();
    while BASELINE.n.load(Ordering::Relaxed) < 20 && tsc() - wait_from < env.ticks(200) {
        agent().wait(1000);
    }
    PHASE.store(PHASE_DRAIN, Ordering::Release);
    let t0 = tsc();
    for v in 0..l.num_vcpus {
        rings.publish(v, heads[v as usize].wrapping_add(entries));
    }
    rings.wait_drained();
    let drain_ns = env.ns(tsc() - t0);
    PHASE.store(PHASE_IDLE, Ordering::Release);
    if verbose {
        println!(
            "hostile: prefill published {} rings of {} entries ({} events) and the host drained them in {} us",
            l.num_vcpus,
            entries,
            u64::from(l.num_vcpus) * entries,
            drain_ns / 1000
        );
        for (name, lat) in [("baseline", &BASELINE), ("drain", &DRAINING)] {
            let (n, p50, mean, max) = lat.summary();
            println!(
                "hostile: prefill wake latency {}: {} samples, median <= {} ns, mean {} ns, max {} ns",
                name, n, p50, mean, max
            );
        }
    }
}

/// Valid events with forged timestamps. vCPU 0's ring: 500 going
/// backwards, 10 at `u64::MAX`, 10 at 0, 500 all equal, an exit at
/// `u64::MAX` and an idle marker at 0 (1022 events). vCPU 1's ring (with
/// 2+ vCPUs): 500 alternating `u64::MAX` and 0, threads shared with
/// vCPU 0's.
fn forged_tsc(rings: &Rings, verbose: bool) {
    let stages = u64::from(rings.layout.num_stages);
    let base = tsc();
    let stage = |i: u64| (i % stages) as u32;
    let mut n0 = 0u64;
    let mut push0 = |tsc: u64, stage: u32, thread: u32| {
        rings.push(0, event(0, tsc, stage, thread));
        n0 += 1;
    };
    for i in 0..500 {
        push0(base - 1000 * i, stage(i), 7);
    }
    for i in 0..10 {
        push0(u64::MAX, stage(i), 7);
    }
    for i in 0..10 {
        push0(0, stage(i), 7);
    }
    for i in 0..500 {
        push0(base, stage(i), 7);
    }
    push0(u64::MAX, STAGE_NONE, 7);
    push0(0, STAGE_NONE, IDLE_THREAD);
    let mut n1 = 0u64;
    if rings.layout.num_vcpus > 1 {
        for i in 0..500u64 {
            let t = if i % 2 == 0 { u64::MAX } else { 0 };
            rings.push(1, event(0, t, stage(i), 7 + (i % 2) as u32));
            n1 += 1;
        }
    }
    rings.wait_drained();
    if verbose {
        println!(
            "hostile: forged_tsc wrote {} events on vCPU 0 and {} on vCPU 1",
            n0, n1
        );
    }
}
