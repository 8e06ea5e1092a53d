//! The footprint workload (`workload=footprint`, [`stage_workload`]): the
//! headline benchmark's generated, i-cache-bound stages, with its
//! parameters ([`configure`], [`params`]) and its thread body
//! ([`thread_main`]); the checksums are `stage_workload::thread_checksum`'s.
//!
//! Depends on [`super::shared`] (what the workloads share) and the layers below:
//! the stage switch and the runtime.

use core::sync::atomic::{AtomicU64, Ordering};

use super::shared::{cold_start, next_request, request_done};
use crate::staged::runtime::{finish, Thread};
use crate::staged::switch::stage_switch;

/// The footprint workload's parameters (stages, funcs, calls, data words),
/// all 0 for the default workload; set by vCPU 0 in [`configure`].
static FOOTPRINT: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Makes the threads run the footprint workload with `p` (vCPU 0, before
/// any thread is created).
pub(in crate::staged) fn configure(p: &stage_workload::Params) {
    for (slot, v) in FOOTPRINT
        .iter()
        .zip([p.stages, p.funcs, p.calls as usize, p.data_words])
    {
        slot.store(v as u64, Ordering::Relaxed);
    }
}

/// The footprint workload's parameters, if it runs (`workload=footprint`).
pub(super) fn params() -> Option<stage_workload::Params> {
    let v = |k: usize| FOOTPRINT[k].load(Ordering::Relaxed);
    (v(0) != 0).then(|| stage_workload::Params {
        stages: v(0) as usize,
        funcs: v(1) as usize,
        calls: v(2) as u32,
        data_words: v(3) as usize,
    })
}

/// The footprint workload (`workload=footprint`, see [`stage_workload`]):
/// every request passes through the workload's stages, each a large body of
/// generated code called in a data-dependent order, reporting each stage
/// switch; the checksum is the one `stage_workload::thread_checksum`
/// computes on the host for the same thread id and parameters.
pub(super) fn thread_main(t: &Thread, p: &stage_workload::Params) -> ! {
    let data: &mut [u64] = if t.job.data == 0 {
        &mut []
    } else {
        // SAFETY: `p.data_words` words allocated for this thread alone in
        // `workload::new_job`; only the thread itself touches them.
        unsafe { core::slice::from_raw_parts_mut(t.job.data as *mut u64, p.data_words) }
    };
    stage_workload::init_data(t.id, data);
    let mut checksum = 0;
    let mut r = 0;
    while next_request(t, r) {
        let mut x = stage_workload::request_seed(t.id, r);
        for s in 0..p.stages {
            stage_switch(t, s as u32);
            cold_start(t, s as u32);
            x = stage_workload::run_stage(s, x, p, data);
        }
        request_done(t);
        checksum = stage_workload::fold(checksum, x);
        r += 1;
    }
    finish(t, checksum)
}
