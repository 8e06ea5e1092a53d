//! The mechanism's costs on this host, timed in this process with the
//! library's own stage points and gate: what `stagevm-discover` gives the
//! model as the cost of a stage switch under temporal staging (issue 48,
//! item 4), and `stagevm-gatectl measure` prints.
//!
//! The same measurement as `just bench-native-server`'s mechanism rounds
//! (bench/native/bench_native_server.py, `point_bench.c`), in process:
//! two probe functions whose first instruction is a RIP-relative store (so
//! the detour must relocate it) get real entry detours ([`hooks::install`])
//! into two stages, and are called alternately — every call a stage
//! switch:
//!
//! * **call**: the two unhooked twins, per call, ns;
//! * **point, gate off**: the hooked pair minus the call, per point, ns;
//! * **point, gate on, alone**: one thread through the gate on one lane
//!   (work-conserving: it runs on, no handoff), minus the call, ns;
//! * **handoff**: 4 threads on the lane's CPU, the gate on, minus the same
//!   4 threads calling the unhooked twins on that CPU, divided by the
//!   gate's handoffs: everything a switch that hands the CPU to another
//!   thread costs (its stage point, the gate, the futex wake and wait, the
//!   context switch), ns. This is the switch cost the model charges.
//!
//! Each figure is the median of `rounds` rounds; the spread (max − min) is
//! kept beside it. The process keeps the detours on the probes afterwards
//! (they are only called from here), and the gate runtime stays installed
//! and off, so this runs at most once per process, and never in one where
//! the library is active.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::time::Instant;

use crate::control::{mode, Mapping};
use crate::gate;
use crate::hooks::{self, PointKind};

/// Threads in the handoff rounds (as `bench-native-server`'s).
pub const HANDOFF_THREADS: usize = 4;

/// Tries of a handoff round that hands off nothing.
const RETRIES: u32 = 5;

static SINK: AtomicI32 = AtomicI32::new(0);
static USED: AtomicBool = AtomicBool::new(false);

std::arch::global_asm!(
    ".pushsection .text.stagevm_costs_probes,\"ax\",@progbits",
    ".balign 16",
    ".globl stagevm_costs_probe_a",
    ".hidden stagevm_costs_probe_a",
    "stagevm_costs_probe_a:",
    "    mov dword ptr [rip + {sink}], edi",
    "    lea eax, [rdi + 1]",
    "    ret",
    ".globl stagevm_costs_probe_a_end",
    ".hidden stagevm_costs_probe_a_end",
    "stagevm_costs_probe_a_end:",
    ".balign 16",
    ".globl stagevm_costs_probe_b",
    ".hidden stagevm_costs_probe_b",
    "stagevm_costs_probe_b:",
    "    mov dword ptr [rip + {sink}], edi",
    "    lea eax, [rdi + 2]",
    "    ret",
    ".globl stagevm_costs_probe_b_end",
    ".hidden stagevm_costs_probe_b_end",
    "stagevm_costs_probe_b_end:",
    ".balign 16",
    ".globl stagevm_costs_plain_a",
    ".hidden stagevm_costs_plain_a",
    "stagevm_costs_plain_a:",
    "    mov dword ptr [rip + {sink}], edi",
    "    lea eax, [rdi + 1]",
    "    ret",
    ".balign 16",
    ".globl stagevm_costs_plain_b",
    ".hidden stagevm_costs_plain_b",
    "stagevm_costs_plain_b:",
    "    mov dword ptr [rip + {sink}], edi",
    "    lea eax, [rdi + 2]",
    "    ret",
    ".popsection",
    sink = sym SINK,
);

extern "C" {
    fn stagevm_costs_probe_a(x: i32) -> i32;
    fn stagevm_costs_probe_a_end();
    fn stagevm_costs_probe_b(x: i32) -> i32;
    fn stagevm_costs_probe_b_end();
    fn stagevm_costs_plain_a(x: i32) -> i32;
    fn stagevm_costs_plain_b(x: i32) -> i32;
}

/// Which pair a loop calls.
#[derive(Clone, Copy)]
enum Pair {
    Plain,
    Hooked,
}

/// `n` iterations of both calls of `pair` (2n calls); returns the result
/// so the loop is not removed.
fn calls(pair: Pair, n: u64) -> i32 {
    let mut x = 0i32;
    for _ in 0..n {
        // SAFETY: the probes read nothing and write one static i32.
        x = unsafe {
            match pair {
                Pair::Plain => stagevm_costs_plain_b(stagevm_costs_plain_a(x)),
                Pair::Hooked => stagevm_costs_probe_b(stagevm_costs_probe_a(x)),
            }
        };
        x = std::hint::black_box(x);
    }
    x
}

/// ns per call of `n` iterations (2n calls) of `pair` on this thread.
fn per_call(pair: Pair, n: u64) -> f64 {
    let t0 = Instant::now();
    std::hint::black_box(calls(pair, n));
    t0.elapsed().as_nanos() as f64 / (2 * n) as f64
}

/// Pins the calling thread to `cpu` (`sched_setaffinity(2)` through nix).
fn pin_to(cpu: usize) -> std::io::Result<()> {
    let mut one = nix::sched::CpuSet::new();
    one.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one)?;
    Ok(())
}

/// ns for [`HANDOFF_THREADS`] threads on `cpu`, each `n` iterations of `pair`.
/// The threads start together (a barrier, once each is on `cpu`): else
/// the first could finish its calls before the next arrives, and the gate,
/// work-conserving, would hand off nothing.
fn threads_on(cpu: usize, pair: Pair, n: u64) -> Result<f64, CostError> {
    let start = std::sync::Barrier::new(HANDOFF_THREADS + 1);
    std::thread::scope(|s| {
        let start = &start;
        let hs: Vec<_> = (0..HANDOFF_THREADS)
            .map(|_| {
                s.spawn(move || {
                    let bound = pin_to(cpu);
                    start.wait();
                    bound?;
                    std::hint::black_box(calls(pair, n));
                    Ok::<(), std::io::Error>(())
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        for h in hs {
            h.join()
                .map_err(|_| CostError::Thread)?
                .map_err(|e| CostError::Affinity(cpu, e))?;
        }
        Ok(t0.elapsed().as_nanos() as f64)
    })
}

/// One figure: the median of its rounds and their spread (max − min), ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Figure {
    /// Median, ns.
    pub median_ns: f64,
    /// Max − min over the rounds, ns.
    pub spread_ns: f64,
}

impl Figure {
    fn of(mut xs: Vec<f64>) -> Self {
        xs.sort_by(f64::total_cmp);
        let (lo, hi) = (xs[0], xs[xs.len() - 1]);
        Self {
            median_ns: xs[xs.len() / 2],
            spread_ns: hi - lo,
        }
    }
}

/// The mechanism's costs on this host (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Costs {
    /// The CPU of the gate's lane (the handoff rounds run there).
    pub cpu: usize,
    /// Rounds each figure is the median of.
    pub rounds: usize,
    /// A call of an unhooked probe, ns.
    pub call: Figure,
    /// A stage point with the gate off, ns (issue 48 N1's figure).
    pub point_off: Figure,
    /// A stage point through the gate, alone on the lane, ns.
    pub point_on: Figure,
    /// A switch that hands the CPU to another thread, ns.
    pub handoff: Figure,
    /// Handoffs counted in the last handoff round.
    pub handoffs: u64,
}

/// Why the costs could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// This process already measured, or runs the preload library.
    #[error("the stage points are already in use in this process (measured before, or the preload library is loaded)")]
    InUse,
    /// The CPU has neither XSAVE nor FXSAVE.
    #[error("this CPU has neither XSAVE nor FXSAVE, which stage points need")]
    NoSave,
    /// A probe could not be patched.
    #[error("a probe could not be patched: {0}")]
    Hook(#[from] hooks::HookError),
    /// The control page could not be mapped.
    #[error("the control page: {0}")]
    Control(std::io::Error),
    /// A thread could not be bound to the lane's CPU.
    #[error("binding a thread to CPU {0}: {1}")]
    Affinity(usize, std::io::Error),
    /// A measuring thread panicked.
    #[error("a measuring thread panicked")]
    Thread,
    /// The gate handed off nothing in a round (so no cost per handoff).
    #[error("the gate handed off nothing with {HANDOFF_THREADS} threads on CPU {0} ({1})")]
    NoHandoff(usize, String),
}

/// The last CPU the calling thread may use: the lane [`measure`]'s callers
/// default to (`stagevm-gatectl measure`, `stagevm-discover`).
///
/// Errors: the thread's affinity cannot be read, or it holds no CPU.
pub fn default_cpu() -> std::io::Result<usize> {
    host_sched::topology::thread_affinity(0)?
        .iter()
        .last()
        .ok_or_else(|| std::io::Error::other("this thread may use no CPU"))
}

/// Measures the costs with the gate's lane on `cpu`: `rounds` rounds
/// (at least 1) of `calls` iterations alone (2 × `calls` stage points per
/// figure) and `calls / 10` per thread in the handoff rounds. About 3 s
/// for 5 rounds of 200 000 on these machines.
///
/// Errors: [`CostError`]; [`CostError::InUse`] on a second call.
pub fn measure(cpu: usize, rounds: usize, calls: u64) -> Result<Costs, CostError> {
    if gate::control().is_some() || USED.swap(true, Relaxed) {
        return Err(CostError::InUse);
    }
    let rounds = rounds.max(1);
    let calls = calls.max(1000);
    hooks::init_xsave(false).ok_or(CostError::NoSave)?;
    let control = Mapping::anonymous(|_| {}).map_err(CostError::Control)?;
    gate::install_runtime(control, &[cpu], 2);
    let c = gate::control().ok_or(CostError::InUse)?;
    let probe = |start: unsafe extern "C" fn(i32) -> i32, end: unsafe extern "C" fn()| {
        (
            start as usize,
            (end as usize).saturating_sub(start as usize),
        )
    };
    for (i, (addr, size)) in [
        probe(stagevm_costs_probe_a, stagevm_costs_probe_a_end),
        probe(stagevm_costs_probe_b, stagevm_costs_probe_b_end),
    ]
    .into_iter()
    .enumerate()
    {
        // SAFETY: our own probe functions, `size` bytes each; no thread
        // calls them until the detours are in.
        unsafe { hooks::install(addr, size, PointKind::Stage(i as u8)) }?;
    }
    let n = calls / 10;
    let (mut call, mut off, mut on, mut handoff) = (vec![], vec![], vec![], vec![]);
    let mut handoffs = 0;
    for _ in 0..rounds {
        c.header.mode.store(mode::OFF, Relaxed);
        let plain = per_call(Pair::Plain, calls);
        call.push(plain);
        off.push(per_call(Pair::Hooked, calls) - plain);
        c.header.mode.store(mode::TEMPORAL, Relaxed);
        on.push(per_call(Pair::Hooked, calls / 10) - plain);
        // The measuring thread leaves the lane before the handoff rounds.
        c.header.mode.store(mode::OFF, Relaxed);
        calls_once();
        // A round in which the gate handed off nothing (the threads ran
        // one after another: another process on the CPU can make the
        // scheduler run them so) is tried again, a few times, each with
        // twice the calls (longer than a time slice, so they interleave).
        let mut tries = 0;
        let mut n = n;
        let (base, gated) = loop {
            let base = threads_on(cpu, Pair::Plain, n)?;
            let before = c.lanes[0].handoffs.load(Relaxed);
            c.header.mode.store(mode::TEMPORAL, Relaxed);
            let gated = threads_on(cpu, Pair::Hooked, n);
            c.header.mode.store(mode::OFF, Relaxed);
            let gated = gated?;
            handoffs = c.lanes[0].handoffs.load(Relaxed).saturating_sub(before);
            tries += 1;
            if handoffs > 0 {
                break (base, gated);
            }
            n = n.saturating_mul(2);
            if tries == RETRIES {
                let l = &c.lanes[0];
                return Err(CostError::NoHandoff(
                    cpu,
                    format!(
                        "{tries} tries; visits {}, timeouts {}, threads bound {}; \
                         is another process busy on that CPU?",
                        l.visits.load(Relaxed),
                        l.timeouts.load(Relaxed),
                        l.threads.load(Relaxed),
                    ),
                ));
            }
        };
        handoff.push((gated - base) / handoffs as f64);
    }
    Ok(Costs {
        cpu,
        rounds,
        call: Figure::of(call),
        point_off: Figure::of(off),
        point_on: Figure::of(on),
        handoff: Figure::of(handoff),
        handoffs,
    })
}

/// One stage point with the gate off: the thread sees the mode and leaves
/// its lane (unbinds) if it was bound.
fn calls_once() {
    std::hint::black_box(calls(Pair::Hooked, 1));
}
