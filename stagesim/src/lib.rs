//! stagesim: a trace-driven multi-core cache simulator for stagevm.
//!
//! It replays a "stagetrace v1" trace ([`trace`], specified in
//! `stagesim/TRACE-FORMAT.md`) — basic-block instruction fetches, data
//! accesses, thread switches and stage markers of a multi-threaded server —
//! on N simulated cores with private L1i/L1d/L2 and an optional shared L3
//! ([`cache`]), under a scheduling model ([`sim`]): an OS-like `baseline`,
//! `pinned`, and the stage policies of the `host-sched` crate (`static`,
//! `proportional`) — the very code the VMM runs. It reports instruction and
//! data misses per kilo-instruction per core and per stage and a modelled
//! throughput ([`sim::CycleModel`]). [`synth`] writes synthetic traces and
//! [`plot`] draws the results.
//!
//! * [`cache`] — set-associative LRU caches, non-inclusive hierarchy,
//! * [`trace`] — the trace format: reader, writer, stage sidecar,
//! * [`stream`] — the trace demultiplexed into packed per-thread events,
//! * [`sim`] — the scheduling models, the replay loop and the cycle model,
//! * [`report`] — tables and the JSON report,
//! * [`synth`] — synthetic traces,
//! * [`plot`] — PNG plots,
//! * [`groups`] — merging stages into coarser groups at replay,
//! * [`analysis`] — per-stage visit lengths, footprints and transitions,
//! * [`discover`] — automatic stage discovery by simulation (seed 004): stage merging and request-level migration points,
//! * [`symbols`] — function entries of the traced binary,
//! * [`stagemap`] — stage-map files (stage → entry symbols) for the Linux agent,
//! * [`results`] — the `bench/RESULTS.md` section.

pub mod analysis;
pub mod cache;
pub mod discover;
pub mod groups;
pub mod plot;
pub mod report;
pub mod results;
pub mod sim;
pub use stagemap_file as stagemap;
pub mod stream;
pub mod symbols;
pub mod synth;
pub mod trace;
