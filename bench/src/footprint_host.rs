//! `footprint-host`: the headline's footprint workload (`stage_workload`)
//! as an ordinary multi-threaded host program, for tracing with
//! `bench/capture/capture-footprint.sh` (the stgtrace Valgrind tool) and
//! replaying in the cache simulator next to the MariaDB traces.
//!
//! `threads` threads each run `requests` requests through the workload's
//! stages; every stage is entered through an exported, never-inlined
//! function `stage_workload_stage<N>` so the tracer's symbol map
//! (`bench/capture/footprint-stages.toml`) marks stage switches. The threads
//! print their checksums, which equal `stage_workload::thread_checksum` (the
//! test guest's, for the same parameters).

use anyhow::{ensure, Result};
use clap::Parser;
use stage_workload::{fold, init_data, request_seed, run_stage, Params};

/// Runs the footprint workload on host threads (no pinning: the OS places them).
#[derive(Parser, Debug)]
#[command(name = "footprint-host", about)]
struct Args {
    /// Threads.
    #[arg(long, default_value_t = 8)]
    threads: u32,
    /// Requests per thread.
    #[arg(long, default_value_t = 200)]
    requests: u64,
    /// Stages per request (≤ 4).
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Total code footprint over all stages (KiB).
    #[arg(long, default_value_t = 1024)]
    footprint_kib: usize,
    /// Function calls per stage and request.
    #[arg(long, default_value_t = 400)]
    calls: u32,
    /// Data working set per thread (8-byte words).
    #[arg(long, default_value_t = 512)]
    data_words: usize,
}

macro_rules! stage_entry {
    ($name:ident, $stage:expr) => {
        /// Runs stage `$stage` of a request (an exported entry point that the
        /// tracer's stage map names).
        #[no_mangle]
        #[inline(never)]
        pub fn $name(x: u64, params: &Params, data: &mut [u64]) -> u64 {
            run_stage($stage, x, params, data)
        }
    };
}
stage_entry!(stage_workload_stage0, 0);
stage_entry!(stage_workload_stage1, 1);
stage_entry!(stage_workload_stage2, 2);
stage_entry!(stage_workload_stage3, 3);

type Entry = fn(u64, &Params, &mut [u64]) -> u64;

const ENTRIES: [Entry; 4] = [
    stage_workload_stage0,
    stage_workload_stage1,
    stage_workload_stage2,
    stage_workload_stage3,
];

fn main() -> Result<()> {
    let a = Args::parse();
    let params = Params {
        stages: a.stages,
        funcs: stage_workload::funcs_for_bytes(a.stages, a.footprint_kib * 1024),
        calls: a.calls,
        data_words: a.data_words,
    };
    params.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(a.threads > 0, "--threads must be at least 1");
    eprintln!(
        "footprint-host: {} threads x {} requests, {} stages, {} bytes of code, {} calls, {} data words",
        a.threads,
        a.requests,
        params.stages,
        stage_workload::code_bytes(params.stages, params.funcs),
        params.calls,
        params.data_words
    );
    let handles: Vec<_> = (0..a.threads)
        .map(|id| {
            std::thread::spawn(move || {
                let mut data = vec![0u64; params.data_words];
                init_data(id, &mut data);
                let mut sum = 0;
                for r in 0..a.requests {
                    let mut x = request_seed(id, r);
                    for entry in ENTRIES.iter().take(params.stages) {
                        x = entry(x, &params, &mut data);
                    }
                    sum = fold(sum, x);
                }
                (id, sum)
            })
        })
        .collect();
    for h in handles {
        let (id, sum) = h.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?;
        println!("thread {id}: requests {}, checksum {sum:#018x}", a.requests);
    }
    Ok(())
}
