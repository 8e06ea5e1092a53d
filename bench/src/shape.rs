//! Shapes of the footprint workload (`images/workload`, crate
//! `stage-workload`) as the benchmarks take them on their command lines
//! (`KIB:CALLS:DATA`) and give them to the test guest (`workload=footprint`).

use anyhow::{anyhow, Result};
use stage_workload::{funcs_for_bytes, Params};

/// Parses `text`, `KIB:CALLS:DATA` (total code footprint in KiB, function
/// calls per stage and request, data words per thread), into the
/// workload's parameters with `stages` stages.
///
/// # Errors
/// Not three numbers, or parameters the workload refuses; the message
/// names `flag` and `text`.
pub fn parse(flag: &str, text: &str, stages: usize) -> Result<Params> {
    let bad = || anyhow!("{flag} {text}: expected KIB:CALLS:DATA, e.g. 4096:400:512");
    let mut it = text.split(':').map(str::parse::<usize>);
    let mut next = || it.next().ok_or_else(bad)?.map_err(|_| bad());
    let (kib, calls, data) = (next()?, next()?, next()?);
    if it.next().is_some() {
        return Err(bad());
    }
    let params = Params {
        stages,
        funcs: funcs_for_bytes(stages, kib.saturating_mul(1024)),
        calls: u32::try_from(calls).map_err(|_| bad())?,
        data_words: data,
    };
    params
        .validate()
        .map_err(|e| anyhow!("{flag} {text}: {e}"))?;
    Ok(params)
}

/// The test guest's command line for `p` with `threads` threads per vCPU
/// and `requests` requests each (closed loop; callers append open-loop
/// words).
pub fn cmdline(p: &Params, threads: u32, requests: u64) -> String {
    format!(
        "iters=1 workload=footprint stages={} funcs={} calls={} data={} threads={threads} requests={requests}",
        p.stages, p.funcs, p.calls, p.data_words
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn shapes_parse_and_name_the_flag_when_bad() {
        let p = super::parse("--shapes", "128:400:512", 2).unwrap();
        assert_eq!((p.stages, p.calls, p.data_words), (2, 400, 512));
        assert!(
            super::cmdline(&p, 8, 100).starts_with("iters=1 workload=footprint stages=2 funcs=")
        );
        for bad in ["128:400", "x:1:2", "1:2:3:4"] {
            let e = super::parse("--shapes", bad, 2).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--shapes {bad}: ")), "{e}");
        }
    }
}
