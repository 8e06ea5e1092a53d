//! The staged phase's parameters as plain data: the limits
//! ([`MAX_STAGES`], [`MAX_THREADS_PER_VCPU`]), the command line's
//! [`StagedConfig`] and [`IdleConfig`], and the [`Job`] each thread carries
//! (fixed when it is created, read by the workloads). The runtime holds a
//! thread's `Job` without knowing the workload that fills and reads it.
//!
//! Depends on nothing else in `staged/`.

/// Most stages a workload has (the footprint workload's maximum).
pub const MAX_STAGES: usize = stage_workload::MAX_STAGES;
/// Largest number of guest threads per vCPU.
pub const MAX_THREADS_PER_VCPU: usize = 16;

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
    /// Reverse the weights once half of all requests (guest-wide) are done.
    pub phase: bool,
    /// How an idle vCPU waits for work (see [`super::runtime`]'s idle rule).
    pub idle: IdleConfig,
    /// Mixing iterations a vCPU pays when it runs a different stage than
    /// the one it ran last (`switch_cost=`, a synthetic i-cache refill).
    pub switch_cost: u64,
    /// Open loop (`arrival=`): the requests arrive at this pace instead of
    /// each thread running its `requests` back to back; their total is the
    /// closed loop's (threads × requests × vCPUs).
    pub arrival: Option<super::arrivals::ArrivalConfig>,
}

/// How long an idle vCPU polls its empty run queue before it parks with
/// WAIT: briefly when it shares its host core with other vCPUs, long when
/// the host says it is alone on its core (ABI minor 1, `StageMap::owned`),
/// where polling costs no other vCPU anything and saves the WAIT and WAKE
/// exits (seed 000 §5: busy-polling idle CPUs migrate in 1.3 µs and gave
/// +22 % TPC-C against +9 % with MWAIT).
#[derive(Clone, Copy, Debug)]
pub struct IdleConfig {
    /// Polling before parking on a shared core (µs; `idle_spin_us=`).
    pub shared_us: u64,
    /// Polling before parking on an owned core (µs; `owned_idle_us=`).
    pub owned_us: u64,
    /// Idle time after which a vCPU with no thread of its own stages to
    /// take may take a thread of another stage for the rest of its visit
    /// (a spill; µs; `spill_us=`; 0 = never, the default).
    pub spill_us: u64,
}

impl Default for IdleConfig {
    fn default() -> Self {
        Self {
            shared_us: 50,
            owned_us: 10_000,
            spill_us: 0,
        }
    }
}

/// What one thread runs, fixed when it is created.
pub(super) struct Job {
    /// Requests it runs.
    pub(super) requests: u64,
    /// Extra work iterations per stage: `[0]` before the phase change, `[1]`
    /// after it (the reversed weights with `phase=1`).
    pub(super) work: [[u64; 3]; 2],
    /// Requests completed guest-wide at which the phase changes (`u64::MAX`:
    /// no phase change): half of all requests, so every thread changes at
    /// the same moment.
    pub(super) half: u64,
    /// GPA of its data working set (the footprint workload's `data=` words;
    /// 0 when there is none).
    pub(super) data: u64,
    /// `switch_cost=`: mixing iterations charged when its vCPU changes stage.
    pub(super) switch_cost: u64,
}

impl Job {
    /// A thread's job under `cfg` on a guest of `num_vcpus` vCPUs, with its
    /// data working set at `data` (0: none; the workload allocates it, see
    /// `workload::new_job`).
    pub(super) fn new(cfg: &StagedConfig, num_vcpus: u32, data: u64) -> Self {
        let w = cfg.weights;
        let per = |k: u64| cfg.work.saturating_mul(k);
        Self {
            requests: cfg.requests,
            work: [
                [per(w[0]), per(w[1]), per(w[2])],
                [per(w[2]), per(w[1]), per(w[0])],
            ],
            half: if cfg.phase {
                cfg.requests * cfg.threads as u64 * u64::from(num_vcpus) / 2
            } else {
                u64::MAX
            },
            data,
            switch_cost: cfg.switch_cost,
        }
    }
}
