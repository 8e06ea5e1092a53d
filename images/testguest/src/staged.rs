//! The staged workload: several cooperative guest threads per vCPU, each
//! request passing through three stages with distinct code (parse → plan →
//! execute), every stage switch reported through the guest agent's ring in
//! ring 3, without a VM exit.
//!
//! A stage switch is `yield, then stage_enter(stage)`: the thread reports the
//! stage on the vCPU that runs it, right before running the stage's code, so
//! the host's per-vCPU occupancy follows what each vCPU really executes.

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use guest_agent::{Agent, Platform, Report};
use hypercall_abi::stage::{AreaHeader, Layout, Status, DOORBELL_REGISTER, DOORBELL_STATUS};

use crate::{inl, outl, print_line};

/// Stage names, in id order.
pub const STAGES: [&str; 3] = ["parse", "plan", "execute"];
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
static STAGE_EVENTS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static EXIT_EVENTS: AtomicU64 = AtomicU64::new(0);
static BACKOFFS: AtomicU64 = AtomicU64::new(0);

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
/// range, the area and the agent.
pub fn setup(info: &hypercall_abi::boot::BootInfo, ring_entries: u32, abuse: bool) {
    init_free(info.free_start, info.free_end);
    let agent = match Layout::new(info.num_vcpus, STAGES.len() as u32, ring_entries) {
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
                            &STAGES,
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
        STAGES.len(),
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

/// A cooperative guest thread.
struct Thread {
    rsp: u64,
    id: u32,
    vcpu: u32,
    sched_rsp: *mut u64,
    requests: u64,
    checksum: u64,
    done: bool,
}

/// Yields back to the vCPU's scheduler loop.
fn yield_now(t: &mut Thread) {
    // SAFETY: switches to the scheduler's saved context; it resumes us later
    // through `t.rsp`.
    unsafe { testguest_ctx_switch(&mut t.rsp, *t.sched_rsp) };
}

/// Switches `t` to `stage`: yield, then report the stage on the vCPU that
/// resumed it.
fn stage_switch(t: &mut Thread, stage: u32) {
    yield_now(t);
    count(
        agent().stage_enter(t.vcpu, stage, t.id),
        &STAGE_EVENTS[stage as usize],
    );
}

#[inline(never)]
fn parse(req: &mut [u64; 8]) -> u64 {
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
fn plan(req: &mut [u64; 8]) -> u64 {
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
fn execute(req: &mut [u64; 8], table: &mut [u64; 512]) -> u64 {
    let mut acc = 0u64;
    for (i, w) in req.iter().enumerate() {
        let j = ((*w >> 7) as usize ^ i) % table.len();
        table[j] = table[j].wrapping_add(*w).rotate_left(11);
        acc ^= table[j];
    }
    acc
}

extern "C" fn thread_main(t: *mut Thread) {
    // SAFETY: the scheduler passes a live Thread that only this thread uses
    // while it runs.
    let t = unsafe { &mut *t };
    let mut table = [0u64; 512];
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(t.id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for r in 0..t.requests {
        let mut req = [0u64; 8];
        for w in req.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *w = x ^ r;
        }
        stage_switch(t, 0);
        let a = parse(&mut req);
        stage_switch(t, 1);
        let b = plan(&mut req);
        stage_switch(t, 2);
        let c = execute(&mut req, &mut table);
        count(agent().stage_exit(t.vcpu, t.id), &EXIT_EVENTS);
        t.checksum = t.checksum.rotate_left(3) ^ a ^ b.wrapping_mul(3) ^ c;
    }
    t.done = true;
    loop {
        yield_now(t);
    }
}

/// Runs `threads` guest threads of `requests` requests each on this vCPU
/// until all are done; prints each thread's checksum.
pub fn run_vcpu(vcpu: u32, num_vcpus: u32, threads: usize, requests: u64) {
    let threads = threads.min(MAX_THREADS_PER_VCPU);
    let mut sched_rsp = 0u64;
    let mut pool: [MaybeUninit<Thread>; MAX_THREADS_PER_VCPU] =
        [const { MaybeUninit::uninit() }; MAX_THREADS_PER_VCPU];
    for (i, slot) in pool.iter_mut().enumerate().take(threads) {
        let Some(stack) = alloc_pages(THREAD_STACK) else {
            println!("testguest: out of memory for thread stacks");
            crate::shutdown(5);
        };
        let t = slot.write(Thread {
            rsp: 0,
            id: vcpu + num_vcpus * i as u32,
            vcpu,
            sched_rsp: &mut sched_rsp,
            requests,
            checksum: 0,
            done: false,
        });
        // Initial frame popped by testguest_ctx_switch: r15, r14, r13 (entry),
        // r12 (argument), rbx, rbp, then the return address (the trampoline),
        // placed so RSP is 16-byte aligned at the trampoline's `call`.
        let top = stack + THREAD_STACK;
        let frame = (top - 56) as *mut u64;
        let words = [
            0,
            0,
            thread_main as *const () as u64,
            t as *mut Thread as u64,
            0,
            0,
            testguest_thread_trampoline as *const () as u64,
        ];
        for (k, w) in words.iter().enumerate() {
            // SAFETY: inside the freshly allocated stack.
            unsafe { frame.add(k).write(*w) };
        }
        t.rsp = frame as u64;
    }
    // SAFETY: the first `threads` entries were initialised above.
    let pool =
        unsafe { core::slice::from_raw_parts_mut(pool.as_mut_ptr() as *mut Thread, threads) };
    loop {
        let mut live = 0;
        for t in pool.iter_mut() {
            if t.done {
                continue;
            }
            live += 1;
            // SAFETY: resumes the thread; it switches back into `sched_rsp`.
            unsafe { testguest_ctx_switch(&mut sched_rsp, t.rsp) };
        }
        if live == 0 {
            break;
        }
    }
    for t in pool.iter() {
        println!(
            "thread {}: vcpu {}, requests {}, checksum {:#018x}",
            t.id, t.vcpu, t.requests, t.checksum
        );
    }
}

/// Prints the guest's own per-stage counts (compared with the VMM's by the
/// tests).
pub fn print_counts() {
    let a = agent();
    let layout_vcpus = a.layout().map_or(0, |l| l.num_vcpus);
    let ring_full: u64 = (0..layout_vcpus).map(|v| a.ring_full_backoffs(v)).sum();
    println!(
        "testguest: stage events parse {} plan {} execute {} exit {}; ring-full back-offs {} (ring headers {})",
        STAGE_EVENTS[0].load(Ordering::Relaxed),
        STAGE_EVENTS[1].load(Ordering::Relaxed),
        STAGE_EVENTS[2].load(Ordering::Relaxed),
        EXIT_EVENTS.load(Ordering::Relaxed),
        BACKOFFS.load(Ordering::Relaxed),
        ring_full
    );
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
