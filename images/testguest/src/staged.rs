//! The staged workload: cooperative guest threads whose requests pass
//! through three stages with distinct code (parse → plan → execute), every
//! stage switch reported through the guest agent's ring in ring 3, without a
//! VM exit.
//!
//! Threads migrate between vCPUs as in the seeds (`../shared/seeds/000_*`,
//! §4.3/§4.5): a thread is only dispatched on vCPUs the host's stage map
//! gives its current stage. Each vCPU has a run queue in guest memory
//! ([`RUNQ`], spinlocked, usable from any vCPU). At a stage switch the thread
//! picks the least-loaded vCPU serving the stage (loads = published run-queue
//! depths) unless its own vCPU serves it, and yields to its vCPU's scheduler
//! loop, which — once the thread's context is saved — queues it on the chosen
//! vCPU (waking that vCPU if it is parked); when its own vCPU serves the
//! stage it goes on running, as a thread of an OS would. Threads on a vCPU
//! take turns at the end of each request (a yield to the back of the local
//! queue). The thread reports `stage_enter` on the vCPU that resumed it, right
//! before running the stage's code, so the host's per-vCPU occupancy follows
//! what each vCPU really executes. A stage no vCPU serves runs where the
//! thread is (a counted fallback). The published per-vCPU state (run-queue
//! depth, runnable threads per stage, parked) feeds the host's policy and its
//! wake-up safety net.
//!
//! Idle vCPUs spin with back-off for [`IDLE_SPIN_US`], then park with the
//! channel's WAIT (no lost wake-ups: `parked = 1`, re-check, WAIT; a pusher
//! raises the target's run-queue depth, pushes, then WAKEs it if parked).

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::fmt::Write as _;
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use guest_agent::{choose_from_map, Agent, Platform, Report};
use hypercall_abi::stage::{
    AreaHeader, Layout, Status, DOORBELL_REGISTER, DOORBELL_STATUS, MAX_VCPUS, STAGE_NONE,
};

use crate::{inl, outl, print_line};

/// Stage names of the default workload, in id order.
pub const STAGES: [&str; 3] = ["parse", "plan", "execute"];
/// Most stages a workload has (the footprint workload's maximum).
pub const MAX_STAGES: usize = stage_workload::MAX_STAGES;
const _: () = assert!(STAGES.len() <= MAX_STAGES);
/// Largest number of guest threads per vCPU.
pub const MAX_THREADS_PER_VCPU: usize = 16;
/// Bytes of stack per guest thread.
const THREAD_STACK: u64 = 64 << 10;

/// Port I/O and TSC for the agent.
pub struct PortIo;

impl Platform for PortIo {
    fn doorbell(&self, port: u16, value: u32) {
        outl(port, value);
    }
    fn doorbell_status(&self) -> u32 {
        inl(DOORBELL_STATUS)
    }
    fn tsc(&self) -> u64 {
        let (lo, hi): (u32, u32);
        // SAFETY: rdtsc is allowed in ring 3 (CR4.TSD clear, see hypercall_abi::boot).
        unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
        (u64::from(hi) << 32) | u64::from(lo)
    }
}

/// Memory from the boot info's free range, handed out by a bump pointer.
static FREE_NEXT: AtomicU64 = AtomicU64::new(0);
static FREE_END: AtomicU64 = AtomicU64::new(0);

/// Sets the free range (vCPU 0, before other vCPUs allocate).
pub fn init_free(start: u64, end: u64) {
    FREE_NEXT.store(start, Ordering::Relaxed);
    FREE_END.store(end, Ordering::Release);
}

/// Allocates `size` bytes aligned to 4 KiB; `None` when memory is exhausted.
pub fn alloc_pages(size: u64) -> Option<u64> {
    let size = size.next_multiple_of(4096);
    let start = FREE_NEXT.fetch_add(size, Ordering::Relaxed);
    (start + size <= FREE_END.load(Ordering::Acquire)).then_some(start)
}

/// The global agent, set by vCPU 0 before it releases the other vCPUs.
struct AgentCell(UnsafeCell<MaybeUninit<Agent<PortIo>>>);
// SAFETY: written once by vCPU 0 before READY is released; read-only after.
unsafe impl Sync for AgentCell {}
static AGENT: AgentCell = AgentCell(UnsafeCell::new(MaybeUninit::uninit()));
static READY: AtomicBool = AtomicBool::new(false);

fn agent() -> &'static Agent<PortIo> {
    assert!(READY.load(Ordering::Acquire));
    // SAFETY: initialised before READY was set (see `setup`).
    unsafe { (*AGENT.0.get()).assume_init_ref() }
}

/// Guest-side counts of what was reported, per stage, plus exits and
/// full-ring back-offs.
static STAGE_EVENTS: [AtomicU64; MAX_STAGES] = [const { AtomicU64::new(0) }; MAX_STAGES];
static EXIT_EVENTS: AtomicU64 = AtomicU64::new(0);
static BACKOFFS: AtomicU64 = AtomicU64::new(0);

/// Stage switches that stayed on their vCPU (`[0]`) or migrated (`[1]`), and
/// the TSC cycles from yielding to running again, summed.
static SWITCHES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static SWITCH_CYCLES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Idle markers reported (not part of the stage counts).
static IDLE_EVENTS: AtomicU64 = AtomicU64::new(0);

fn count(report: Report, counter: &AtomicU64) {
    if let Report::Written { backoffs } = report {
        counter.fetch_add(1, Ordering::Relaxed);
        BACKOFFS.fetch_add(u64::from(backoffs), Ordering::Relaxed);
    }
}

fn raw_register(pfn: u64) -> Status {
    outl(DOORBELL_REGISTER, pfn as u32);
    Status::from_u32(inl(DOORBELL_STATUS)).unwrap_or(Status::NoDevice)
}

/// Bad REGISTERs a hostile guest could send: outside RAM, wrong magic, size
/// not page-aligned. Prints the status the VMM answered each with.
fn abuse_register(mem_size: u64, area: u64, layout: &Layout) {
    let outside = raw_register((mem_size >> 12) + 16);
    let header = area as *mut AreaHeader;
    let good = layout.header();
    // SAFETY: `area` is this guest's own, identity-mapped, allocated memory.
    unsafe {
        header.write_volatile(AreaHeader {
            magic: 0x0bad,
            ..good
        })
    };
    let magic = raw_register(area >> 12);
    // SAFETY: as above.
    unsafe {
        header.write_volatile(AreaHeader {
            area_size: good.area_size + 100,
            ..good
        })
    };
    let unaligned = raw_register(area >> 12);
    println!(
        "abuse: register outside RAM -> {:?}, wrong magic -> {:?}, unaligned size -> {:?}",
        outside, magic, unaligned
    );
}

/// Corrupt ring entries from vCPU 0: one with a wrong sequence number (a
/// torn or forged slot), one with an out-of-range stage, then a head that
/// jumps four rings ahead. Waits for the host to consume each step so every
/// corruption is seen on its own.
fn abuse_ring(ring_entries: u32) {
    let a = agent();
    let wait_drained = || {
        while !a.ring_drained(0) {
            core::hint::spin_loop();
        }
    };
    let event = hypercall_abi::stage::StageEvent {
        seq: 0xdead_beef,
        tsc: a.platform().tsc(),
        stage: 0,
        thread: 999,
        reserved: 0,
    };
    a.write_raw_event(0, event, false);
    a.write_raw_event(
        0,
        hypercall_abi::stage::StageEvent { stage: 99, ..event },
        true,
    );
    wait_drained();
    a.corrupt_head(0, 4 * u64::from(ring_entries));
    wait_drained();
    println!("abuse: wrote 1 bad-sequence entry, 1 bad-stage entry and 1 head jump on vCPU 0");
}

/// vCPU 0's part before the other vCPUs start the staged phase: the free
/// range, the workload, the area and the agent (registered with the
/// workload's stage names).
pub fn setup(
    info: &hypercall_abi::boot::BootInfo,
    ring_entries: u32,
    abuse: bool,
    footprint: Option<stage_workload::Params>,
) {
    init_free(info.free_start, info.free_end);
    if let Some(p) = footprint {
        for (slot, v) in FOOTPRINT
            .iter()
            .zip([p.stages, p.funcs, p.calls as usize, p.data_words])
        {
            slot.store(v as u64, Ordering::Relaxed);
        }
    }
    let names = stage_names();
    NUM_VCPUS.store(info.num_vcpus.min(MAX_VCPUS as u32), Ordering::Relaxed);
    TSC_KHZ.store(info.tsc_khz, Ordering::Relaxed);
    let agent = match Layout::new(info.num_vcpus, names.len() as u32, ring_entries) {
        Some(layout) => {
            let size = layout.area_size();
            match alloc_pages(size) {
                Some(area) => {
                    if abuse {
                        abuse_register(info.mem_size, area, &layout);
                    }
                    // SAFETY: `area` is `size` bytes of our own memory, page aligned.
                    unsafe {
                        Agent::register(
                            PortIo,
                            area as *mut u8,
                            area,
                            size,
                            info.num_vcpus,
                            names,
                            ring_entries,
                        )
                    }
                    .unwrap_or_else(|_| Agent::inactive(PortIo))
                }
                None => Agent::inactive(PortIo),
            }
        }
        None => Agent::inactive(PortIo),
    };
    println!(
        "testguest: stage channel {:?} ({} stages, {} ring entries)",
        agent.status(),
        names.len(),
        ring_entries
    );
    // SAFETY: only vCPU 0 writes, before READY is released.
    unsafe { (*AGENT.0.get()).write(agent) };
    READY.store(true, Ordering::Release);
    if abuse && self::agent().is_active() {
        abuse_ring(ring_entries);
    }
}

global_asm!(
    r#"
    .global testguest_ctx_switch
testguest_ctx_switch:
    push rbp
    push rbx
    push r12
    push r13
    push r14
    push r15
    mov [rdi], rsp
    mov rsp, rsi
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    pop rbp
    ret
    .global testguest_thread_trampoline
testguest_thread_trampoline:
    mov rdi, r12
    call r13
    ud2
"#
);

extern "C" {
    /// Saves callee-saved registers and RSP into `*save`, switches to `to`.
    fn testguest_ctx_switch(save: *mut u64, to: u64);
    fn testguest_thread_trampoline();
}

/// Thread id and vCPU value meaning "none".
const NONE: u32 = u32::MAX;
/// Bytes at the top of each thread's stack allocation that hold its
/// [`Thread`] (the stack grows down from below them).
const THREAD_HEADER: u64 = 256;
const _: () = assert!(core::mem::size_of::<Thread>() as u64 <= THREAD_HEADER);
/// Longest back-off between two checks of an empty run queue (PAUSEs).
const IDLE_MAX_SPIN: u32 = 64;
/// Spinning on an empty run queue before the vCPU parks (µs).
const IDLE_SPIN_US: u64 = 50;
/// Timeout of one WAIT of an idle vCPU (µs).
const IDLE_WAIT_US: u32 = 1000;

/// A cooperative guest thread. It lives at the top of its own stack
/// allocation and moves between vCPUs' run queues: whoever popped it from a
/// queue owns it until it is pushed again (the queue locks order the
/// accesses), so every mutable field is an atomic used as a plain cell.
#[repr(C, align(64))]
struct Thread {
    /// Saved stack pointer while the thread is not running (written by
    /// `testguest_ctx_switch`).
    rsp: AtomicU64,
    /// Next thread in the run queue it is on (under the queue's lock).
    next: AtomicPtr<Thread>,
    /// vCPU that runs it now or last ran it (set by the scheduler that resumes it).
    vcpu: AtomicU32,
    /// vCPU it asked to move to at its last stage switch, or [`NONE`]; taken by
    /// the scheduler once the thread's context is saved.
    migrate_to: AtomicU32,
    /// Stage it is in, or `STAGE_NONE` between requests.
    stage: AtomicU32,
    /// Set when all its requests are done.
    done: AtomicBool,
    /// Checksum of its requests (final once `done`).
    checksum: AtomicU64,
    /// Unique id (`vcpu + num_vcpus × i` of the vCPU that created it).
    id: u32,
    /// Requests it runs.
    requests: u64,
    /// Extra work iterations per stage: `[0]` before the phase change, `[1]`
    /// after it (the reversed weights with `phase=1`).
    work: [[u64; 3]; 2],
    /// Requests completed guest-wide at which the phase changes (`u64::MAX`:
    /// no phase change): half of all requests, so every thread changes at
    /// the same moment.
    half: u64,
    /// GPA of its data working set (the footprint workload's `data=` words;
    /// 0 when there is none).
    data: u64,
}

/// A vCPU's run queue: a FIFO of threads linked through [`Thread::next`],
/// under a spinlock, usable from any vCPU.
#[repr(C, align(64))]
struct RunQueue {
    lock: AtomicBool,
    len: AtomicU32,
    head: AtomicPtr<Thread>,
    tail: AtomicPtr<Thread>,
}

impl RunQueue {
    const fn new() -> Self {
        Self {
            lock: AtomicBool::new(false),
            len: AtomicU32::new(0),
            head: AtomicPtr::new(ptr::null_mut()),
            tail: AtomicPtr::new(ptr::null_mut()),
        }
    }

    fn lock(&self) {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.lock.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
    }

    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }

    /// Lock-free check; sequentially consistent so that a vCPU that published
    /// `parked = 1` and then sees an empty queue cannot miss a pusher that
    /// then reads `parked` (no lost wake-ups).
    fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    fn push(&self, t: &'static Thread) {
        let p = t as *const Thread as *mut Thread;
        t.next.store(ptr::null_mut(), Ordering::Relaxed);
        self.lock();
        let tail = self.tail.load(Ordering::Relaxed);
        if tail.is_null() {
            self.head.store(p, Ordering::Relaxed);
        } else {
            // SAFETY: threads on a queue are live (they are never freed).
            unsafe { (*tail).next.store(p, Ordering::Relaxed) };
        }
        self.tail.store(p, Ordering::Relaxed);
        self.len.fetch_add(1, Ordering::SeqCst);
        self.unlock();
    }

    fn pop(&self) -> Option<&'static Thread> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock();
        let head = self.head.load(Ordering::Relaxed);
        if head.is_null() {
            self.unlock();
            return None;
        }
        // SAFETY: threads on a queue are live and never freed.
        let t: &'static Thread = unsafe { &*head };
        let next = t.next.load(Ordering::Relaxed);
        self.head.store(next, Ordering::Relaxed);
        if next.is_null() {
            self.tail.store(ptr::null_mut(), Ordering::Relaxed);
        }
        self.len.fetch_sub(1, Ordering::SeqCst);
        self.unlock();
        Some(t)
    }
}

/// Per-vCPU run queues.
static RUNQ: [RunQueue; MAX_VCPUS] = [const { RunQueue::new() }; MAX_VCPUS];
/// Per vCPU, the scheduler loop's saved stack pointer while a thread runs
/// (written and read only on that vCPU).
static SCHED_RSP: [AtomicU64; MAX_VCPUS] = [const { AtomicU64::new(0) }; MAX_VCPUS];

/// Guest-side per-vCPU counts, one cache line each.
#[repr(C, align(64))]
struct VcpuCounts {
    /// `stage_enter` calls executed on this vCPU, per stage.
    ran: [AtomicU64; MAX_STAGES],
    /// WAITs sent while idle.
    waits: AtomicU64,
    /// WAKEs sent to parked vCPUs.
    wakes: AtomicU64,
}

static VCPU_COUNTS: [VcpuCounts; MAX_VCPUS] = [const {
    VcpuCounts {
        ran: [const { AtomicU64::new(0) }; MAX_STAGES],
        waits: AtomicU64::new(0),
        wakes: AtomicU64::new(0),
    }
}; MAX_VCPUS];

/// Migrations decided at stage switches, in total and per stage entered
/// (`in`) and left (`out`, not counted when the thread was between requests).
static MIGRATIONS: AtomicU64 = AtomicU64::new(0);
static MIGRATIONS_IN: [AtomicU64; MAX_STAGES] = [const { AtomicU64::new(0) }; MAX_STAGES];
static MIGRATIONS_OUT: [AtomicU64; MAX_STAGES] = [const { AtomicU64::new(0) }; MAX_STAGES];
/// Stage switches that stayed because the map gives the stage no vCPU.
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
/// `stage_enter`s on a vCPU the map read at that moment does not give the
/// stage although some vCPU serves it.
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// The footprint workload's parameters (stages, funcs, calls, data words),
/// all 0 for the default workload; set by vCPU 0 in [`setup`].
static FOOTPRINT: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// The footprint workload's parameters, if it runs (`workload=footprint`).
fn footprint() -> Option<stage_workload::Params> {
    let v = |k: usize| FOOTPRINT[k].load(Ordering::Relaxed);
    (v(0) != 0).then(|| stage_workload::Params {
        stages: v(0) as usize,
        funcs: v(1) as usize,
        calls: v(2) as u32,
        data_words: v(3) as usize,
    })
}

/// Names of the running workload's stages, in id order.
pub fn stage_names() -> &'static [&'static str] {
    match footprint() {
        Some(p) => &stage_workload::STAGE_NAMES[..p.stages],
        None => &STAGES,
    }
}

/// vCPU count and TSC frequency, set by vCPU 0 in [`setup`].
static NUM_VCPUS: AtomicU32 = AtomicU32::new(1);
static TSC_KHZ: AtomicU64 = AtomicU64::new(0);
/// vCPUs that created and queued their threads; vCPU 0 releases them all
/// once every vCPU has.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
static RELEASED: AtomicBool = AtomicBool::new(false);
/// Threads of the whole guest not done yet.
static LIVE: AtomicU32 = AtomicU32::new(0);
/// Requests of all threads, and the TSC at release and when the last thread
/// finished (0: the staged phase did not run).
static TOTAL_REQUESTS: AtomicU64 = AtomicU64::new(0);
static START_TSC: AtomicU64 = AtomicU64::new(0);
static END_TSC: AtomicU64 = AtomicU64::new(0);

fn num_vcpus() -> u32 {
    NUM_VCPUS.load(Ordering::Relaxed)
}

/// Parameters of the staged phase, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct StagedConfig {
    /// Guest threads per vCPU (≤ [`MAX_THREADS_PER_VCPU`]).
    pub threads: usize,
    /// Requests per thread.
    pub requests: u64,
    /// Extra work iterations per stage and request, times the stage's weight.
    pub work: u64,
    /// Per-stage weights (parse, plan, execute).
    pub weights: [u64; 3],
    /// Reverse the weights for the second half of each thread's requests.
    pub phase: bool,
}

/// Yields back to the scheduler loop of the vCPU running `t`.
fn yield_now(t: &Thread) {
    let vcpu = t.vcpu.load(Ordering::Relaxed) as usize;
    // SAFETY: switches to this vCPU's scheduler context (saved when it
    // resumed us); a scheduler resumes us later through `t.rsp`.
    unsafe {
        testguest_ctx_switch(t.rsp.as_ptr(), SCHED_RSP[vcpu].load(Ordering::Relaxed));
    }
}

/// Switches `t` to `stage`. Picks the vCPU for the stage from the host's map
/// (the least loaded of the stage's vCPUs unless the current one serves it),
/// and if that is another vCPU yields to the scheduler, which moves the
/// thread there once its context is saved; it reports the stage on the vCPU
/// that runs it, right before the stage's code runs.
/// If the map changed while the thread waited and its new vCPU no longer
/// serves the stage, it moves again: a stage only runs where the current map
/// puts it, or as a counted fallback when no vCPU serves it.
fn stage_switch(t: &Thread, stage: u32) {
    let a = agent();
    let mut cur = t.vcpu.load(Ordering::Relaxed);
    let old = t.stage.swap(stage, Ordering::Relaxed);
    if old != STAGE_NONE {
        a.runnable_add(cur, old, -1);
    }
    let mut first = true;
    loop {
        let mut target = cur;
        if let Some(map) = a.read_map() {
            if map.vcpus[stage as usize] == 0 {
                // No vCPU serves the stage: run it here and say so.
                if first {
                    a.count_fallback(cur);
                    FALLBACKS.fetch_add(1, Ordering::Relaxed);
                }
            } else if !map.serves(stage, cur) {
                // `Agent::choose_vcpu` on the snapshot just read, so the
                // fallback test and the choice see the same map.
                let n = num_vcpus() as usize;
                let mut loads = [0u32; MAX_VCPUS];
                for (v, load) in loads.iter_mut().enumerate().take(n) {
                    *load = a.runq_depth(v as u32);
                }
                target = choose_from_map(&map, stage, cur, &loads[..n]);
            }
        }
        a.runnable_add(target, stage, 1);
        if target == cur {
            // This vCPU serves the stage: go on running, as a thread of an
            // OS would (threads take turns at request ends, `stage_leave`).
            break;
        }
        MIGRATIONS.fetch_add(1, Ordering::Relaxed);
        MIGRATIONS_IN[stage as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(out) = MIGRATIONS_OUT.get(old as usize).filter(|_| first) {
            out.fetch_add(1, Ordering::Relaxed);
        }
        t.migrate_to.store(target, Ordering::Relaxed);
        // Time from giving up the vCPU to running on the target vCPU,
        // through its queue.
        timed_yield(t, 1);
        cur = t.vcpu.load(Ordering::Relaxed);
        match a.read_map() {
            Some(map) if map.vcpus[stage as usize] != 0 && !map.serves(stage, cur) => {
                // The map moved under us while we waited: go again.
                a.runnable_add(cur, stage, -1);
                first = false;
            }
            _ => break,
        }
    }
    count(
        a.stage_enter(cur, stage, t.id),
        &STAGE_EVENTS[stage as usize],
    );
    VCPU_COUNTS[cur as usize].ran[stage as usize].fetch_add(1, Ordering::Relaxed);
    if let Some(map) = a.read_map() {
        if map.vcpus[stage as usize] != 0 && !map.serves(stage, cur) {
            VIOLATIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Yields `t` and adds the time until it runs again to the switch
/// statistics `k` (0: through its own vCPU's queue, 1: a migration).
fn timed_yield(t: &Thread, k: usize) {
    let t0 = PortIo.tsc();
    yield_now(t);
    let waited = PortIo.tsc().wrapping_sub(t0);
    SWITCH_CYCLES[k].fetch_add(waited, Ordering::Relaxed);
    SWITCHES[k].fetch_add(1, Ordering::Relaxed);
}

/// `t` finished its request: reports the exit, leaves its stage and yields
/// so the threads on its vCPU take turns, a request each.
fn stage_leave(t: &Thread) {
    let a = agent();
    let vcpu = t.vcpu.load(Ordering::Relaxed);
    count(a.stage_exit(vcpu, t.id), &EXIT_EVENTS);
    let old = t.stage.swap(STAGE_NONE, Ordering::Relaxed);
    if old != STAGE_NONE {
        a.runnable_add(vcpu, old, -1);
    }
    timed_yield(t, 0);
}

/// `n` rounds of xorshift64 mixing (with the stage's constant `K`, so each
/// stage has its own code) folded into the request: the `work=` option's
/// extra per-stage work (its result is only kept from being optimised
/// away). Nothing when `n` is 0.
#[inline(always)]
fn mix<const K: u64>(req: &mut [u64; 8], n: u64) {
    if n == 0 {
        return;
    }
    let mut x = req[(K & 7) as usize] | 1;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(K ^ i);
    }
    // Only the time counts: the result stays out of the checksum, so checksums
    // do not depend on work=, weights= or when a phase change happens.
    core::hint::black_box(x);
}

#[inline(never)]
fn parse(req: &mut [u64; 8], work: u64) -> u64 {
    mix::<0x9e37_79b9_7f4a_7c15>(req, work);
    // FNV-1a over the request bytes.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in req.iter() {
        for b in w.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    req[0] ^= h;
    h
}

#[inline(never)]
fn plan(req: &mut [u64; 8], work: u64) -> u64 {
    mix::<0xbf58_476d_1ce4_e5b9>(req, work);
    // An insertion sort of the request words: data-dependent branches.
    for i in 1..req.len() {
        let mut j = i;
        while j > 0 && req[j - 1] > req[j] {
            req.swap(j - 1, j);
            j -= 1;
        }
    }
    req[3] ^ req[5]
}

#[inline(never)]
fn execute(req: &mut [u64; 8], table: &mut [u64; 512], work: u64) -> u64 {
    mix::<0x94d0_49bb_1331_11eb>(req, work);
    let mut acc = 0u64;
    for (i, w) in req.iter().enumerate() {
        let j = ((*w >> 7) as usize ^ i) % table.len();
        table[j] = table[j].wrapping_add(*w).rotate_left(11);
        acc ^= table[j];
    }
    acc
}

/// Where the threads' requests come from when a disk was read: GPA and
/// length (bytes) of its first part in memory; 0 = generate them.
static REQUEST_SOURCE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Makes the threads read request `r` of thread `id` as the 64 bytes at
/// offset `((id × requests + r) × 64) mod (len rounded down to 64)` of the
/// `len` bytes at `addr` (8 little-endian words), instead of generating it.
pub fn set_request_source(addr: u64, len: u64) {
    REQUEST_SOURCE[1].store(len, Ordering::Relaxed);
    REQUEST_SOURCE[0].store(addr, Ordering::Release);
}

/// Requests completed by all threads (drives `phase=1`).
static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// Marks `t` done with `checksum` and yields for good.
fn finish(t: &Thread, checksum: u64) -> ! {
    t.checksum.store(checksum, Ordering::Relaxed);
    t.done.store(true, Ordering::Release);
    loop {
        yield_now(t);
    }
}

/// The footprint workload (`workload=footprint`, see [`stage_workload`]):
/// every request passes through the workload's stages, each a large body of
/// generated code called in a data-dependent order, reporting each stage
/// switch; the checksum is the one `stage_workload::thread_checksum`
/// computes on the host for the same thread id and parameters.
fn footprint_main(t: &Thread, p: &stage_workload::Params) -> ! {
    let data: &mut [u64] = if t.data == 0 {
        &mut []
    } else {
        // SAFETY: `p.data_words` words allocated for this thread alone in
        // `new_thread`; only the thread itself touches them.
        unsafe { core::slice::from_raw_parts_mut(t.data as *mut u64, p.data_words) }
    };
    stage_workload::init_data(t.id, data);
    let mut checksum = 0;
    for r in 0..t.requests {
        let mut x = stage_workload::request_seed(t.id, r);
        for s in 0..p.stages {
            stage_switch(t, s as u32);
            x = stage_workload::run_stage(s, x, p, data);
        }
        stage_leave(t);
        COMPLETED.fetch_add(1, Ordering::Relaxed);
        checksum = stage_workload::fold(checksum, x);
    }
    finish(t, checksum)
}

extern "C" fn thread_main(t: *const Thread) {
    // SAFETY: the scheduler passes a live Thread; its mutable state is atomic.
    let t = unsafe { &*t };
    if let Some(p) = footprint() {
        footprint_main(t, &p);
    }
    let mut table = [0u64; 512];
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(t.id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut checksum = 0u64;
    let source = REQUEST_SOURCE[0].load(Ordering::Acquire);
    let span = REQUEST_SOURCE[1].load(Ordering::Relaxed) / 64 * 64;
    for r in 0..t.requests {
        let work = &t.work[usize::from(COMPLETED.load(Ordering::Relaxed) >= t.half)];
        let mut req = [0u64; 8];
        if source != 0 && span != 0 {
            let at = (u64::from(t.id) * t.requests + r) * 64 % span;
            for (k, w) in req.iter_mut().enumerate() {
                // SAFETY: inside the `span` bytes kept from the disk.
                *w = unsafe { ((source + at) as *const u64).add(k).read_unaligned() };
            }
        } else {
            for w in req.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *w = x ^ r;
            }
        }
        stage_switch(t, 0);
        let a = parse(&mut req, work[0]);
        stage_switch(t, 1);
        let b = plan(&mut req, work[1]);
        stage_switch(t, 2);
        let c = execute(&mut req, &mut table, work[2]);
        stage_leave(t);
        COMPLETED.fetch_add(1, Ordering::Relaxed);
        checksum = checksum.rotate_left(3) ^ a ^ b.wrapping_mul(3) ^ c;
    }
    finish(t, checksum)
}

/// Creates a thread on a fresh stack, to start on `vcpu`.
fn new_thread(id: u32, vcpu: u32, cfg: &StagedConfig) -> &'static Thread {
    let Some(stack) = alloc_pages(THREAD_STACK) else {
        println!("testguest: out of memory for thread stacks");
        crate::shutdown(5);
    };
    let w = cfg.weights;
    let per = |k: u64| cfg.work.saturating_mul(k);
    let data_words = footprint().map_or(0, |p| p.data_words);
    let data = if data_words == 0 {
        0
    } else {
        let Some(data) = alloc_pages(data_words as u64 * 8) else {
            println!("testguest: out of memory for data working sets");
            crate::shutdown(5);
        };
        data
    };
    let slot = (stack + THREAD_STACK - THREAD_HEADER) as *mut Thread;
    // SAFETY: the top THREAD_HEADER bytes of our freshly allocated, 4 KiB
    // aligned stack; nothing else uses them.
    unsafe {
        slot.write(Thread {
            rsp: AtomicU64::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            vcpu: AtomicU32::new(vcpu),
            migrate_to: AtomicU32::new(NONE),
            stage: AtomicU32::new(STAGE_NONE),
            done: AtomicBool::new(false),
            checksum: AtomicU64::new(0),
            id,
            requests: cfg.requests,
            work: [
                [per(w[0]), per(w[1]), per(w[2])],
                [per(w[2]), per(w[1]), per(w[0])],
            ],
            half: if cfg.phase {
                cfg.requests * cfg.threads as u64 * u64::from(num_vcpus()) / 2
            } else {
                u64::MAX
            },
            data,
        })
    };
    // SAFETY: initialised just above, never freed.
    let t: &'static Thread = unsafe { &*slot };
    // Initial frame popped by testguest_ctx_switch: r15, r14, r13 (entry),
    // r12 (argument), rbx, rbp, then the return address (the trampoline),
    // placed so RSP is 16-byte aligned at the trampoline's `call`.
    let top = slot as u64;
    let frame = (top - 56) as *mut u64;
    let words = [
        0,
        0,
        thread_main as *const () as u64,
        slot as u64,
        0,
        0,
        testguest_thread_trampoline as *const () as u64,
    ];
    for (k, word) in words.iter().enumerate() {
        // SAFETY: inside the freshly allocated stack, below the Thread.
        unsafe { frame.add(k).write(*word) };
    }
    t.rsp.store(frame as u64, Ordering::Relaxed);
    t
}

/// Queues `t` on `vcpu` (called by the scheduler of `from`, after `t`'s
/// context is saved): the published depth first (never below the queue's
/// length when `vcpu` looks), then the queue, then a WAKE if `vcpu` idles.
fn enqueue(t: &'static Thread, vcpu: u32, from: u32) {
    let a = agent();
    a.runq_add(vcpu, 1);
    RUNQ[vcpu as usize].push(t);
    if vcpu != from && a.is_parked(vcpu) {
        a.wake(vcpu);
        VCPU_COUNTS[from as usize]
            .wakes
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits for work on `vcpu`'s empty queue (or the end of the phase): spins
/// with exponential back-off, then, with an active channel, parks the vCPU
/// (`parked = 1`, re-check, WAIT) until a WAKE or the timeout.
fn idle(vcpu: u32, spin_cycles: u64) {
    let a = agent();
    let q = &RUNQ[vcpu as usize];
    // The host counts this vCPU's time as idle from here, not as the last
    // stage's (the policy's load is vCPU time per stage).
    count(a.vcpu_idle(vcpu), &IDLE_EVENTS);
    let start = PortIo.tsc();
    let mut spin = 1u32;
    while q.is_empty() && LIVE.load(Ordering::SeqCst) != 0 {
        if a.is_active() && PortIo.tsc().wrapping_sub(start) >= spin_cycles {
            a.set_parked(vcpu, true);
            if q.is_empty() && LIVE.load(Ordering::SeqCst) != 0 {
                a.wait(IDLE_WAIT_US);
                VCPU_COUNTS[vcpu as usize]
                    .waits
                    .fetch_add(1, Ordering::Relaxed);
            }
            a.set_parked(vcpu, false);
            continue;
        }
        for _ in 0..spin {
            core::hint::spin_loop();
        }
        spin = (spin * 2).min(IDLE_MAX_SPIN);
    }
}

/// `vcpu`'s scheduler loop: runs the threads of its queue until every thread
/// of the guest is done. A thread that yields is queued again here, or on
/// the vCPU it asked to move to.
fn schedule(vcpu: u32, spin_cycles: u64) {
    let a = agent();
    let n = num_vcpus();
    let sched_rsp = SCHED_RSP[vcpu as usize].as_ptr();
    loop {
        let Some(t) = RUNQ[vcpu as usize].pop() else {
            if LIVE.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle(vcpu, spin_cycles);
            continue;
        };
        a.runq_add(vcpu, -1);
        t.vcpu.store(vcpu, Ordering::Relaxed);
        // SAFETY: resumes the thread; it switches back into `sched_rsp`.
        unsafe { testguest_ctx_switch(sched_rsp, t.rsp.load(Ordering::Relaxed)) };
        // Only now, with its context saved, may the thread become visible to
        // another vCPU.
        if t.done.load(Ordering::Acquire) {
            if LIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
                END_TSC.store(PortIo.tsc(), Ordering::Relaxed);
                for v in (0..n).filter(|v| *v != vcpu) {
                    if a.is_parked(v) {
                        a.wake(v);
                        VCPU_COUNTS[vcpu as usize]
                            .wakes
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            continue;
        }
        let target = t.migrate_to.swap(NONE, Ordering::Relaxed);
        enqueue(t, if target < n { target } else { vcpu }, vcpu);
    }
}

/// This vCPU's part of the staged phase: creates `cfg.threads` threads (ids
/// `vcpu + num_vcpus × i`) on its own queue, waits until vCPU 0 releases all
/// vCPUs' threads together, schedules until every thread of the guest is done
/// (threads move between vCPUs at stage switches, following the host's
/// stage map), then prints the checksums of the threads it created.
/// vCPUs past [`MAX_VCPUS`] (no ring, no queue) take no part.
pub fn run_vcpu(vcpu: u32, num_vcpus: u32, cfg: &StagedConfig, tsc_khz: u64) {
    let num_vcpus = num_vcpus.min(MAX_VCPUS as u32);
    if vcpu >= num_vcpus {
        return;
    }
    let threads = cfg.threads.min(MAX_THREADS_PER_VCPU);
    let a = agent();
    let mut own: [Option<&'static Thread>; MAX_THREADS_PER_VCPU] = [None; MAX_THREADS_PER_VCPU];
    for (i, slot) in own.iter_mut().enumerate().take(threads) {
        let id = vcpu + num_vcpus * i as u32;
        let home = id % num_vcpus;
        let t = new_thread(id, home, cfg);
        *slot = Some(t);
        a.runq_add(home, 1);
        RUNQ[home as usize].push(t);
    }
    LIVE.fetch_add(threads as u32, Ordering::SeqCst);
    TOTAL_REQUESTS.fetch_add(threads as u64 * cfg.requests, Ordering::Relaxed);
    ARRIVED.fetch_add(1, Ordering::AcqRel);
    if vcpu == 0 {
        while ARRIVED.load(Ordering::Acquire) < num_vcpus {
            core::hint::spin_loop();
        }
        START_TSC.store(PortIo.tsc().max(1), Ordering::Relaxed);
        RELEASED.store(true, Ordering::Release);
    } else {
        while !RELEASED.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
    }
    schedule(vcpu, tsc_khz.saturating_mul(IDLE_SPIN_US) / 1000);
    for t in own.iter().flatten() {
        println!(
            "thread {}: vcpu {}, requests {}, checksum {:#018x}",
            t.id,
            t.vcpu.load(Ordering::Relaxed),
            t.requests,
            t.checksum.load(Ordering::Relaxed)
        );
    }
}

/// A line of at most 256 bytes built with `write!` (no allocator here);
/// what does not fit is cut.
struct LineBuf {
    buf: [u8; 256],
    len: usize,
}

impl LineBuf {
    const fn new() -> Self {
        Self {
            buf: [0; 256],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl core::fmt::Write for LineBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        // Cut at a character boundary that fits.
        let room = self.buf.len() - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Prints the guest's own per-stage counts (compared with the VMM's by the
/// tests), per-vCPU stage counts, migrations and the staged phase's
/// throughput.
pub fn print_counts() {
    let a = agent();
    let layout_vcpus = a.layout().map_or(0, |l| l.num_vcpus);
    let ring_full: u64 = (0..layout_vcpus).map(|v| a.ring_full_backoffs(v)).sum();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let names = stage_names();
    // "name count name count …" over the workload's stages.
    let per_stage = |counts: &[AtomicU64; MAX_STAGES]| {
        let mut line = LineBuf::new();
        for (k, (name, c)) in names.iter().zip(counts).enumerate() {
            let sep = if k == 0 { "" } else { " " };
            let _ = write!(line, "{sep}{name} {}", load(c));
        }
        line
    };
    println!(
        "testguest: stage events {} exit {}; ring-full back-offs {} (ring headers {})",
        per_stage(&STAGE_EVENTS).as_str(),
        load(&EXIT_EVENTS),
        load(&BACKOFFS),
        ring_full
    );
    let n = num_vcpus() as usize;
    for (v, c) in VCPU_COUNTS.iter().enumerate().take(n) {
        println!("testguest: vcpu {} ran {}", v, per_stage(&c.ran).as_str());
    }
    println!(
        "testguest: migrations {}, fallbacks {}, violations {}",
        load(&MIGRATIONS),
        load(&FALLBACKS),
        load(&VIOLATIONS)
    );
    let mut line = LineBuf::new();
    for (k, name) in names.iter().enumerate() {
        let sep = if k == 0 { "" } else { ", " };
        let _ = write!(
            line,
            "{sep}{name} in {} out {}",
            load(&MIGRATIONS_IN[k]),
            load(&MIGRATIONS_OUT[k])
        );
    }
    println!("testguest: stage migrations {}", line.as_str());
    let (waits, wakes) = VCPU_COUNTS
        .iter()
        .take(n)
        .fold((0, 0), |(w, k), c| (w + load(&c.waits), k + load(&c.wakes)));
    println!("testguest: idle waits {}, wakes sent {}", waits, wakes);
    let khz = TSC_KHZ.load(Ordering::Relaxed).max(1);
    let ns = |k: usize| {
        let n = SWITCHES[k].load(Ordering::Relaxed).max(1);
        SWITCH_CYCLES[k]
            .load(Ordering::Relaxed)
            .saturating_mul(1_000_000)
            / khz
            / n
    };
    println!(
        "testguest: migration latency {} ns ({} migrations), local switch {} ns ({} switches)",
        ns(1),
        SWITCHES[1].load(Ordering::Relaxed),
        ns(0),
        SWITCHES[0].load(Ordering::Relaxed)
    );
    let start = START_TSC.load(Ordering::Relaxed);
    if start != 0 {
        let cycles = END_TSC.load(Ordering::Relaxed).saturating_sub(start).max(1);
        let khz = TSC_KHZ.load(Ordering::Relaxed).max(1);
        let requests = TOTAL_REQUESTS.load(Ordering::Relaxed);
        let rps = u128::from(requests) * u128::from(khz) * 1000 / u128::from(cycles);
        println!(
            "testguest: staged phase {} requests in {} ms, {} requests/s",
            requests,
            cycles / khz,
            rps
        );
    }
}

/// `bench=1`: measures, on this vCPU in ring 3, the cost of one
/// `stage_enter` (batches that fit the ring, waiting for the host to drain
/// between batches, waits not timed), a plain loop doing the same bookkeeping
/// without the report, and one doorbell exit (a WAKE of this vCPU). Prints
/// one `bench:` line with ns figures from the TSC and `tsc_khz`.
pub fn bench(vcpu: u32, tsc_khz: u64) {
    let a = agent();
    let Some(layout) = a.layout() else {
        println!("bench: stage channel inactive");
        return;
    };
    let tsc = || PortIo.tsc();
    let batch = u64::from(layout.ring_entries - 1);
    let batches = (1_000_000 / batch).max(1);
    let mut cycles = 0u64;
    for b in 0..batches {
        while !a.ring_drained(vcpu) {
            core::hint::spin_loop();
        }
        let t0 = tsc();
        for i in 0..batch {
            a.stage_enter(vcpu, ((b + i) % 3) as u32, 0);
        }
        cycles += tsc() - t0;
    }
    let events = batches * batch;
    // Plain loop: the same iteration count and stage arithmetic, a volatile
    // store instead of the report.
    let mut sink = 0u64;
    let t0 = tsc();
    for b in 0..batches {
        for i in 0..batch {
            // SAFETY: a local variable.
            unsafe { core::ptr::write_volatile(&mut sink, (b + i) % 3) };
        }
    }
    let plain = tsc() - t0;
    let exits = 200u64;
    let t0 = tsc();
    for _ in 0..exits {
        outl(hypercall_abi::stage::DOORBELL_WAKE, vcpu);
    }
    let exit_cycles = tsc() - t0;
    // Hundredths of a ns: cycles * 1e6 / kHz * 100.
    let centi_ns = |c: u64, n: u64| c.saturating_mul(100_000_000) / tsc_khz.max(1) / n.max(1);
    let (s, p, d) = (
        centi_ns(cycles, events),
        centi_ns(plain, events),
        centi_ns(exit_cycles, exits),
    );
    println!(
        "bench: stage_enter {}.{:02} ns/event ({} events), plain loop {}.{:02} ns/iter, doorbell exit {}.{:02} us ({} exits)",
        s / 100,
        s % 100,
        events,
        p / 100,
        p % 100,
        d / 100_000,
        (d / 1000) % 100,
        exits
    );
}
