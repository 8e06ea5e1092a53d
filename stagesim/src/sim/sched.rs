//! The scheduling model (module docs of [`crate::sim`]): simulated cores
//! with a clock, a current thread and a run queue (one global queue under
//! `baseline`), the discrete-event choice of the core that runs next, idle
//! stealing, the end of a slice, and the core a migrating thread goes to —
//! the guest agent's least-loaded rule ([`guest_agent::choose_from_map`]).

use std::collections::VecDeque;

use guest_agent::MapSnapshot;

use crate::cache::{CoreCaches, GeometryError, Hierarchy};
use crate::stream::Trace;

/// One simulated core.
pub(super) struct Core {
    pub caches: CoreCaches,
    /// Cycles.
    pub clock: f64,
    pub current: Option<usize>,
    pub queue: VecDeque<usize>,
}

/// One trace thread's replay state.
pub(super) struct ThreadState {
    /// Next event.
    pub pos: usize,
    /// Dense stage group ("no stage": the last index).
    pub stage: usize,
    /// When it was queued (cycles).
    pub ready_at: f64,
    /// Instructions since the thread entered its current stage (group).
    pub visit: u64,
    /// Times its stream was replayed from the start again
    /// ([`super::SimConfig::repeat`]).
    pub laps: u32,
    /// It migrated and the core it arrives on has not run it yet (that
    /// core pays [`super::SimConfig::migration_target_cycles`]).
    pub arriving: bool,
}

/// Where a core's next chunk comes from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Source {
    /// The core's current thread.
    Current,
    /// Position in the core's own queue.
    Own(usize),
    /// Position in the global queue (baseline).
    Global(usize),
    /// (core, position) in another core's queue (`steal`).
    Steal(usize, usize),
}

/// How a thread's slice ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum SliceEnd {
    /// The slice was used up (or the replay ended): the thread yields only
    /// if another has arrived.
    Used,
    /// The thread's stream ended.
    Done,
    /// The thread migrates to this core.
    Migrate(usize),
    /// The thread yields at a stage switch (temporal staging): it is
    /// queued on its own core, in the queue of the stage it entered.
    Yield,
    /// The thread blocks (waits for its client) for `delay` cycles, then
    /// is queued on core `target` (its own core when `None`; the global
    /// queue under `baseline`).
    Block {
        /// Cycles until it is runnable again.
        delay: f64,
        /// Where it is queued (a migration decided at the same marker).
        target: Option<usize>,
    },
}

/// The queued thread that arrived first (position, arrival); ties: the
/// earlier position (FIFO).
fn earliest(q: &VecDeque<usize>, threads: &[ThreadState]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, t) in q.iter().enumerate() {
        let r = threads[*t].ready_at;
        if best.is_none_or(|(_, b)| r < b) {
            best = Some((i, r));
        }
    }
    best
}

/// Cores, threads and run queues.
pub(super) struct Sched {
    pub cores: Vec<Core>,
    pub threads: Vec<ThreadState>,
    /// The global run queue (baseline).
    global: VecDeque<usize>,
    baseline: bool,
    /// Scratch: threads queued or running per core.
    loads: Vec<u32>,
    /// Cycles from a thread leaving its source core to being runnable on
    /// its target ([`super::SimConfig::migration_latency`]).
    latency: f64,
}

impl Sched {
    /// `n` idle cores; every thread with events queued on the global queue
    /// (`baseline`) or on core *i* mod `n` (thread *i*), in stage `none`.
    /// A migration makes its thread runnable `latency` cycles after it left.
    pub fn new(
        trace: &Trace,
        caches: &Hierarchy,
        n: usize,
        baseline: bool,
        none: usize,
        latency: u64,
    ) -> Result<Self, GeometryError> {
        let mut cores: Vec<Core> = (0..n)
            .map(|_| {
                Ok(Core {
                    caches: CoreCaches::new(caches)?,
                    clock: 0.0,
                    current: None,
                    queue: VecDeque::new(),
                })
            })
            .collect::<Result<_, GeometryError>>()?;
        let threads = trace
            .threads
            .iter()
            .map(|_| ThreadState {
                pos: 0,
                stage: none,
                ready_at: 0.0,
                visit: 0,
                laps: 0,
                arriving: false,
            })
            .collect();
        let mut global = VecDeque::new();
        for (i, t) in trace.threads.iter().enumerate() {
            if t.events.is_empty() {
                continue;
            }
            if baseline {
                global.push_back(i);
            } else {
                cores[i % n].queue.push_back(i);
            }
        }
        Ok(Self {
            cores,
            threads,
            global,
            baseline,
            loads: Vec::with_capacity(n),
            latency: latency as f64,
        })
    }

    /// For idle core `k` (staged policies with `steal`; `serve`: per stage
    /// the mask of cores serving it): the queued thread of another core
    /// whose current stage `k` serves and that arrived first: (core,
    /// position, arrival).
    fn stealable(&self, k: usize, serve: &[u64]) -> Option<(usize, usize, f64)> {
        let mut best: Option<(usize, usize, f64)> = None;
        for (j, c) in self.cores.iter().enumerate() {
            if j == k {
                continue;
            }
            for (i, t) in c.queue.iter().enumerate() {
                let th = &self.threads[*t];
                if serve[th.stage] >> k & 1 == 1 && best.is_none_or(|(.., b)| th.ready_at < b) {
                    best = Some((j, i, th.ready_at));
                }
            }
        }
        best
    }

    /// Discrete-event order: the core whose next chunk starts earliest, and
    /// where its thread comes from. A core with a current thread starts at
    /// its clock; an idle core at max(its clock, the arrival of the
    /// earliest-arrived thread it can take; with `steal_serve`, also from
    /// other cores' queues). Pushes happen at chunk ends, which are never
    /// earlier than the chunk's start, so no thread can later arrive
    /// anywhere before the start chosen here.
    pub fn next(&self, steal_serve: Option<&[u64]>) -> Option<(usize, Source)> {
        let mut pick: Option<(f64, usize, Source)> = None;
        for (k, c) in self.cores.iter().enumerate() {
            let cand = if c.current.is_some() {
                Some((c.clock, Source::Current))
            } else {
                let own = if self.baseline {
                    earliest(&self.global, &self.threads)
                        .map(|(i, r)| (c.clock.max(r), Source::Global(i)))
                } else {
                    earliest(&c.queue, &self.threads).map(|(i, r)| (c.clock.max(r), Source::Own(i)))
                };
                let other = steal_serve.and_then(|serve| {
                    self.stealable(k, serve)
                        .map(|(j, i, r)| (c.clock.max(r), Source::Steal(j, i)))
                });
                match (own, other) {
                    (Some(o), Some(x)) => Some(if x.0 < o.0 { x } else { o }),
                    (o, x) => o.or(x),
                }
            };
            if let Some((time, src)) = cand {
                if pick.is_none_or(|(pt, ..)| time < pt) {
                    pick = Some((time, k, src));
                }
            }
        }
        pick.map(|(_, k, src)| (k, src))
    }

    /// Makes core `k` run the thread `src` names (dequeued, not before it
    /// arrived); returns the thread.
    pub fn take(&mut self, k: usize, src: Source) -> Option<usize> {
        let (q, i) = match src {
            Source::Current => return Some(self.cores[k].current.unwrap_or_default()),
            Source::Global(i) => (&mut self.global, i),
            Source::Steal(j, i) => (&mut self.cores[j].queue, i),
            Source::Own(i) => (&mut self.cores[k].queue, i),
        };
        let t = q.remove(i)?;
        self.cores[k].current = Some(t);
        self.cores[k].clock = self.cores[k].clock.max(self.threads[t].ready_at);
        Some(t)
    }

    /// Where a thread on core `k` entering `stage` goes under the stage map
    /// `map`: the guest agent's choice ([`guest_agent::choose_from_map`])
    /// with each core's load = threads queued or running there. `None` when
    /// it stays: `k` serves the stage, or no core does.
    pub fn migration_target(&mut self, map: &MapSnapshot, stage: usize, k: usize) -> Option<usize> {
        self.loads.clear();
        self.loads.extend(
            self.cores
                .iter()
                .map(|c| (c.queue.len() + c.current.is_some() as usize) as u32),
        );
        let v = guest_agent::choose_from_map(map, stage as u32, k as u32, &self.loads) as usize;
        (v != k).then_some(v)
    }

    /// Ends thread `t`'s slice on core `k`.
    pub fn end_slice(&mut self, k: usize, t: usize, end: SliceEnd) {
        let core = &mut self.cores[k];
        match end {
            SliceEnd::Done => core.current = None,
            SliceEnd::Migrate(target) => {
                core.current = None;
                self.threads[t].ready_at = core.clock + self.latency;
                self.threads[t].arriving = true;
                self.cores[target].queue.push_back(t);
            }
            SliceEnd::Yield => {
                core.current = None;
                self.threads[t].ready_at = core.clock;
                core.queue.push_back(t);
            }
            SliceEnd::Block { delay, target } => {
                core.current = None;
                self.threads[t].ready_at = core.clock + delay;
                // A migration decided at the same marker: the target pays
                // its share (the think time hides the latency).
                self.threads[t].arriving = target.is_some_and(|j| j != k);
                match target {
                    _ if self.baseline => self.global.push_back(t),
                    Some(j) => self.cores[j].queue.push_back(t),
                    None => self.cores[k].queue.push_back(t),
                }
            }
            SliceEnd::Used => {
                // Only threads that have arrived by now compete for the core.
                let now = core.clock;
                let threads = &self.threads;
                let arrived = |q: &VecDeque<usize>| q.iter().any(|o| threads[*o].ready_at <= now);
                let others_wait = if self.baseline {
                    arrived(&self.global)
                } else {
                    arrived(&core.queue)
                };
                if others_wait {
                    core.current = None;
                    self.threads[t].ready_at = core.clock;
                    if self.baseline {
                        self.global.push_back(t);
                    } else {
                        core.queue.push_back(t);
                    }
                }
            }
        }
    }
}
