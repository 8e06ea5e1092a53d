//! The default workload: each request passes through parse → plan →
//! execute ([`STAGES`]), three functions with code of their own plus
//! optional extra work per stage (`work=`, `weights=`, `phase=1`, see
//! [`Job`](crate::staged::config::Job)); its requests are generated, or taken
//! from the disk after vCPU 0 read it ([`set_request_source`]).
//! `tests/disk.rs` recomputes its checksums on the host.
//!
//! Depends on [`super::shared`] (what the workloads share) and the layers below:
//! the stage switch, the runtime and the config.

use core::sync::atomic::{AtomicU64, Ordering};

use super::shared::{cold_start, mix, next_request, request_done, COMPLETED};
use crate::staged::config::MAX_STAGES;
use crate::staged::runtime::{finish, Thread};
use crate::staged::switch::stage_switch;

/// Stage names of the default workload, in id order.
pub(super) const STAGES: [&str; 3] = ["parse", "plan", "execute"];
const _: () = assert!(STAGES.len() <= MAX_STAGES);

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

/// Body of a thread of the default workload: its job's requests through
/// parse → plan → execute, then it is done with their checksum.
pub(super) fn thread_main(t: &Thread) -> ! {
    let mut table = [0u64; 512];
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(t.id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut checksum = 0u64;
    let source = REQUEST_SOURCE[0].load(Ordering::Acquire);
    let span = REQUEST_SOURCE[1].load(Ordering::Relaxed) / 64 * 64;
    let mut r = 0;
    while next_request(t, r) {
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
        request_done(t);
        checksum = checksum.rotate_left(3) ^ a ^ b.wrapping_mul(3) ^ c;
        r += 1;
    }
    finish(t, checksum)
}
