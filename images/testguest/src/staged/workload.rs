//! What the guest threads run. The default workload passes each request
//! through parse → plan → execute ([`STAGES`]), three functions with code
//! of their own plus optional extra work per stage (`work=`, `weights=`,
//! `phase=1`, see [`Job`]); its requests are generated, or taken from the
//! disk after vCPU 0 read it ([`set_request_source`]). The footprint
//! workload (`workload=footprint`, [`stage_workload`]) runs the headline
//! benchmark's generated, i-cache-bound stages instead. Both switch stages
//! through the agent glue and fold every request into the thread's
//! checksum, which the host recomputes.

use core::sync::atomic::{AtomicU64, Ordering};

use super::agent::{stage_leave, stage_switch};
use super::hopper;
use super::runtime::{alloc_pages, finish, Thread};
use super::{num_vcpus, StagedConfig, MAX_STAGES};
use crate::print_line;

/// Stage names of the default workload, in id order.
pub(super) const STAGES: [&str; 3] = ["parse", "plan", "execute"];
const _: () = assert!(STAGES.len() <= MAX_STAGES);

/// The footprint workload's parameters (stages, funcs, calls, data words),
/// all 0 for the default workload; set by vCPU 0 in [`set_footprint`].
static FOOTPRINT: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Makes the threads run the footprint workload with `p` (vCPU 0, before
/// any thread is created).
pub(super) fn set_footprint(p: &stage_workload::Params) {
    for (slot, v) in FOOTPRINT
        .iter()
        .zip([p.stages, p.funcs, p.calls as usize, p.data_words])
    {
        slot.store(v as u64, Ordering::Relaxed);
    }
}

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

/// Names of the running workload's stages, in id order (hopper's with
/// `hopper=N`).
pub(super) fn stage_names() -> &'static [&'static str] {
    if let Some(names) = hopper::stage_names() {
        return names;
    }
    match footprint() {
        Some(p) => &stage_workload::STAGE_NAMES[..p.stages],
        None => &STAGES,
    }
}

/// Per vCPU, the stage it ran last (`u32::MAX`: none yet), for `switch_cost`.
static LAST_STAGE: [core::sync::atomic::AtomicU32; super::MAX_VCPUS] =
    [const { core::sync::atomic::AtomicU32::new(u32::MAX) }; super::MAX_VCPUS];

/// `switch_cost=N`: a synthetic refill cost, N iterations of the mixing
/// loop whenever a vCPU runs a different stage than the one it ran last —
/// what a cold instruction cache costs a core that switches stage, and what
/// stage scheduling saves. A test fixture: it makes staging win by
/// construction (the tests of `--policy auto` use it); 0 (default) is off.
fn cold_start(t: &Thread, stage: u32) {
    let cost = t.job.switch_cost;
    let vcpu = t.vcpu.load(Ordering::Relaxed) as usize;
    let Some(last) = LAST_STAGE.get(vcpu) else {
        return;
    };
    if cost != 0 && last.swap(stage, Ordering::Relaxed) != stage {
        let mut scratch = [u64::from(stage); 8];
        mix::<0x2545_f491_4f6c_dd1d>(&mut scratch, cost);
        core::hint::black_box(scratch);
    }
}

/// What one thread runs, fixed when it is created.
pub(super) struct Job {
    /// Requests it runs.
    pub(super) requests: u64,
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
    /// `switch_cost=`: mixing iterations charged when its vCPU changes stage.
    switch_cost: u64,
}

impl Job {
    /// A thread's job under `cfg`; allocates its data working set (ends the
    /// VM with exit code 5 when memory runs out).
    pub(super) fn new(cfg: &StagedConfig) -> Self {
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
        Self {
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
            switch_cost: cfg.switch_cost,
        }
    }
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

/// The footprint workload (`workload=footprint`, see [`stage_workload`]):
/// every request passes through the workload's stages, each a large body of
/// generated code called in a data-dependent order, reporting each stage
/// switch; the checksum is the one `stage_workload::thread_checksum`
/// computes on the host for the same thread id and parameters.
fn footprint_main(t: &Thread, p: &stage_workload::Params) -> ! {
    let data: &mut [u64] = if t.job.data == 0 {
        &mut []
    } else {
        // SAFETY: `p.data_words` words allocated for this thread alone in
        // `Job::new`; only the thread itself touches them.
        unsafe { core::slice::from_raw_parts_mut(t.job.data as *mut u64, p.data_words) }
    };
    stage_workload::init_data(t.id, data);
    let mut checksum = 0;
    for r in 0..t.job.requests {
        let mut x = stage_workload::request_seed(t.id, r);
        for s in 0..p.stages {
            stage_switch(t, s as u32);
            cold_start(t, s as u32);
            x = stage_workload::run_stage(s, x, p, data);
        }
        stage_leave(t);
        COMPLETED.fetch_add(1, Ordering::Relaxed);
        checksum = stage_workload::fold(checksum, x);
    }
    finish(t, checksum)
}

/// Body of every guest thread (entered through the runtime's trampoline):
/// runs its job's requests, then marks it done.
pub(super) extern "C" fn thread_main(t: *const Thread) {
    // SAFETY: the scheduler passes a live Thread; its mutable state is atomic.
    let t = unsafe { &*t };
    if let Some(stages) = hopper::stages() {
        hopper::thread_main(t, stages);
    }
    if let Some(p) = footprint() {
        footprint_main(t, &p);
    }
    let mut table = [0u64; 512];
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(t.id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut checksum = 0u64;
    let source = REQUEST_SOURCE[0].load(Ordering::Acquire);
    let span = REQUEST_SOURCE[1].load(Ordering::Relaxed) / 64 * 64;
    for r in 0..t.job.requests {
        let work = &t.job.work[usize::from(COMPLETED.load(Ordering::Relaxed) >= t.job.half)];
        let mut req = [0u64; 8];
        if source != 0 && span != 0 {
            let at = (u64::from(t.id) * t.job.requests + r) * 64 % span;
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
        cold_start(t, 0);
        let a = parse(&mut req, work[0]);
        stage_switch(t, 1);
        cold_start(t, 1);
        let b = plan(&mut req, work[1]);
        stage_switch(t, 2);
        cold_start(t, 2);
        let c = execute(&mut req, &mut table, work[2]);
        stage_leave(t);
        COMPLETED.fetch_add(1, Ordering::Relaxed);
        checksum = checksum.rotate_left(3) ^ a ^ b.wrapping_mul(3) ^ c;
    }
    finish(t, checksum)
}
