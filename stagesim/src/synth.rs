//! Synthetic stagetrace generator: a few threads each serve requests that
//! pass through `stages` stages; every stage executes its own code region of
//! `stage_kib` KiB, calling its functions in an irregular (random, mildly
//! skewed) order, so a stage's code fits a core's L2 while all stages
//! together may not. Between requests a thread runs a small common region
//! outside any stage. Data accesses go to a per-thread stack and a shared
//! heap. Deterministic for a given seed.

use std::io::Write;
use std::path::Path;

use crate::trace::{Sidecar, StageEntry, TraceWriter, NO_STAGE};

/// Parameters of a synthetic trace.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SynthConfig {
    /// Threads (connections).
    pub threads: u32,
    /// Stages per request (each with its own code region), 1..=1000.
    pub stages: u16,
    /// Code per stage in KiB.
    pub stage_kib: u64,
    /// Code outside any stage (between requests) in KiB.
    pub common_kib: u64,
    /// Requests per thread.
    pub requests: u32,
    /// Instructions per stage visit (±25 % jitter).
    pub visit_instrs: u64,
    /// Per stage, a factor on `visit_instrs` (missing entries: 1), so
    /// stages can carry unequal load.
    pub visit_weights: Vec<f64>,
    /// Shared heap in KiB (random data accesses).
    pub heap_kib: u64,
    /// Per-thread stack in KiB.
    pub stack_kib: u64,
    /// Probability that a basic block makes a data access (0..=1).
    pub data_per_block: f64,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            threads: 16,
            stages: 4,
            stage_kib: 320,
            common_kib: 16,
            requests: 24,
            visit_instrs: 25_000,
            visit_weights: Vec::new(),
            heap_kib: 128,
            stack_kib: 8,
            data_per_block: 0.4,
            seed: 1,
        }
    }
}

/// What [`write()`] produced.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SynthSummary {
    /// Instructions in the trace.
    pub instrs: u64,
    /// Records written (END included).
    pub records: u64,
    /// Decompressed size in bytes.
    pub raw_bytes: u64,
}

/// SplitMix64: a small deterministic generator (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// Names of the first synthetic stages (then `s4`, `s5`, …).
const NAMES: [&str; 4] = ["parse", "plan", "execute", "commit"];

/// A code region: functions made of basic blocks `(offset, bytes, instrs)`.
struct Region {
    functions: Vec<Vec<(u64, u16, u16)>>,
    /// Popularity rank → function index.
    order: Vec<usize>,
    base: u64,
}

impl Region {
    fn new(base: u64, bytes: u64, rng: &mut Rng) -> Self {
        let mut functions = Vec::new();
        let mut off = 0;
        while off < bytes {
            let size = rng.range(128, 2048).min(bytes - off).max(16);
            let mut blocks = Vec::new();
            let mut b = 0;
            while b < size {
                let len = rng.range(8, 48).min(size - b).max(1);
                let instrs = (len / 4).max(1);
                blocks.push((off + b, len as u16, instrs as u16));
                b += len;
            }
            functions.push(blocks);
            off += size;
        }
        let mut order: Vec<usize> = (0..functions.len()).collect();
        for i in (1..order.len()).rev() {
            let j = rng.range(0, i as u64 + 1) as usize;
            order.swap(i, j);
        }
        Self {
            functions,
            order,
            base,
        }
    }

    /// Executes random functions until `instrs` instructions have run.
    #[allow(clippy::too_many_arguments)]
    fn run<W: Write>(
        &self,
        w: &mut TraceWriter<W>,
        rng: &mut Rng,
        instrs: u64,
        cfg: &SynthConfig,
        stack: u64,
        heap: u64,
        count: &mut u64,
    ) -> std::io::Result<()> {
        let mut done = 0;
        while done < instrs {
            // Mild skew: rank = N·u^1.5 favours some functions.
            let rank = ((self.order.len() as f64) * rng.unit().powf(1.5)) as usize;
            let f = &self.functions[self.order[rank.min(self.order.len() - 1)]];
            let mut i = 0;
            while i < f.len() {
                let (off, bytes, n) = f[i];
                w.fetch(self.base + off, bytes, n)?;
                done += n as u64;
                *count += n as u64;
                if rng.unit() < cfg.data_per_block {
                    let r = rng.next_u64();
                    let (base, span) = if r & 3 == 0 {
                        (heap, cfg.heap_kib * 1024)
                    } else {
                        (stack, cfg.stack_kib * 1024)
                    };
                    let a = base + (r >> 8) % span.max(8) / 8 * 8;
                    if r & 4 == 0 {
                        w.load(a, 8)?;
                    } else {
                        w.store(a, 8)?;
                    }
                }
                // Forward branches skip a block now and then.
                i += if rng.unit() < 0.15 { 2 } else { 1 };
            }
        }
        Ok(())
    }
}

/// Writes a synthetic trace to `path` and its `.stages.toml` sidecar.
pub fn write(path: &Path, cfg: &SynthConfig) -> anyhow::Result<SynthSummary> {
    anyhow::ensure!(cfg.threads >= 1, "threads must be ≥ 1");
    anyhow::ensure!((1..=1000).contains(&cfg.stages), "stages must be 1..=1000");
    anyhow::ensure!(
        cfg.stage_kib >= 1 && cfg.common_kib >= 1,
        "code regions must be ≥ 1 KiB"
    );
    anyhow::ensure!(
        cfg.visit_weights.iter().all(|w| w.is_finite() && *w >= 0.0),
        "visit weights must be ≥ 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&cfg.data_per_block),
        "data accesses per block must be in 0..=1"
    );
    let mut w = TraceWriter::create(path)?;
    let instrs = generate(&mut w, cfg)?;
    let summary = SynthSummary {
        instrs,
        records: w.records() + 1,
        raw_bytes: w.raw_bytes() + 1,
    };
    w.finish()?;
    sidecar(cfg).write_for(path)?;
    Ok(summary)
}

/// The sidecar of a synthetic trace: stage ids 1..=S.
pub fn sidecar(cfg: &SynthConfig) -> Sidecar {
    Sidecar {
        stages: (0..cfg.stages)
            .map(|s| StageEntry {
                id: s + 1,
                name: NAMES
                    .get(s as usize)
                    .map_or(format!("s{s}"), |n| n.to_string()),
                symbols: Vec::new(),
            })
            .collect(),
        capture: None,
    }
}

/// Generates the records of a synthetic trace into `w` (no END); returns
/// the number of instructions.
pub fn generate<W: Write>(w: &mut TraceWriter<W>, cfg: &SynthConfig) -> anyhow::Result<u64> {
    let mut rng = Rng::new(cfg.seed);
    let regions: Vec<Region> = (0..cfg.stages as u64)
        .map(|s| Region::new(0x40_0000 + s * 0x100_0000, cfg.stage_kib * 1024, &mut rng))
        .collect();
    let common = Region::new(0x3000_0000, cfg.common_kib * 1024, &mut rng);
    let heap = 0x5000_0000_0000u64;
    // (requests left, next stage)
    let mut state: Vec<(u32, u16)> = vec![(cfg.requests, 0); cfg.threads as usize];
    let mut live: Vec<usize> = (0..cfg.threads as usize)
        .filter(|_| cfg.requests > 0)
        .collect();
    let mut last: Option<usize> = None;
    let mut instrs = 0u64;
    while !live.is_empty() {
        let li = rng.range(0, live.len() as u64) as usize;
        let t = live[li];
        if last != Some(t) {
            w.thread(1000 + t as u32)?;
            last = Some(t);
        }
        let stack = 0x7ff0_0000_0000u64 + t as u64 * 0x10_0000;
        let (left, stage) = state[t];
        let weight = cfg
            .visit_weights
            .get(stage as usize)
            .copied()
            .unwrap_or(1.0);
        let visit = ((cfg.visit_instrs as f64 * weight) as u64).max(4);
        let jitter = visit / 4;
        let n = visit - jitter + rng.range(0, 2 * jitter + 1);
        w.stage(stage + 1)?;
        regions[stage as usize].run(w, &mut rng, n, cfg, stack, heap, &mut instrs)?;
        if stage + 1 < cfg.stages {
            state[t] = (left, stage + 1);
        } else {
            w.stage(NO_STAGE)?;
            common.run(
                w,
                &mut rng,
                cfg.visit_instrs / 10,
                cfg,
                stack,
                heap,
                &mut instrs,
            )?;
            state[t] = (left - 1, 0);
            if left == 1 {
                live.swap_remove(li);
            }
        }
    }
    Ok(instrs)
}
