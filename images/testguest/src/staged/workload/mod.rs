//! What the guest threads run, and which of the workloads it is: the
//! default parse → plan → execute requests ([`pipeline`]), the footprint
//! workload ([`footprint`], `workload=footprint`) or hopper
//! ([`super::hopper`], `hopper=N`). [`thread_main`] is the entry every
//! thread starts in (handed to the runtime by `staged::run_vcpu`, with
//! [`new_job`]), [`stage_names`] the names registered for the running one.
//! Every workload switches stages through [`super::switch`] and folds every
//! request into the thread's checksum, which the host recomputes; what they
//! share is in [`shared`].
//!
//! Depends on its workloads and the layers below them: [`super::runtime`],
//! [`super::platform`] and [`super::config`]. Adding a workload: a file
//! here, a branch in [`thread_main`] and in [`stage_names`].

pub(super) mod footprint;
pub(super) mod pipeline;
mod shared;

use super::config::{Job, StagedConfig};
use super::hopper;
use super::platform::{alloc_pages, num_vcpus};
use super::runtime::Thread;
use crate::print_line;

/// Names of the running workload's stages, in id order (hopper's with
/// `hopper=N`).
pub(super) fn stage_names() -> &'static [&'static str] {
    if let Some(names) = hopper::stage_names() {
        return names;
    }
    match footprint::params() {
        Some(p) => &stage_workload::STAGE_NAMES[..p.stages],
        None => &pipeline::STAGES,
    }
}

/// A thread's job under `cfg` (the runtime's `NewJob`); allocates its data
/// working set (ends the VM with exit code 5 when memory runs out).
pub(super) fn new_job(cfg: &StagedConfig) -> Job {
    let data_words = footprint::params().map_or(0, |p| p.data_words);
    let data = if data_words == 0 {
        0
    } else {
        let Some(data) = alloc_pages(data_words as u64 * 8) else {
            println!("testguest: out of memory for data working sets");
            crate::shutdown(5);
        };
        data
    };
    Job::new(cfg, num_vcpus(), data)
}

/// Body of every guest thread (entered through the runtime's trampoline):
/// runs its job's requests in the running workload, then marks it done.
pub(super) extern "C" fn thread_main(t: *const Thread) {
    // SAFETY: the scheduler passes a live Thread; its mutable state is atomic.
    let t = unsafe { &*t };
    if let Some(stages) = hopper::stages() {
        hopper::thread_main(t, stages);
    }
    if let Some(p) = footprint::params() {
        footprint::thread_main(t, &p);
    }
    pipeline::thread_main(t)
}
