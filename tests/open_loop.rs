//! End-to-end: requests with a start and an end (ABI minor 4) and open-loop
//! load. The test guest under open-loop load runs at its arrival rate and
//! times its requests; the VMM reads the latency histograms and the vCPU
//! threads' CPU into the report; `auto` judges a guest below saturation by
//! CPU per request and a saturated one by rate, and says so in its report;
//! a guest without latency histograms (minor 3) keeps working without
//! latency figures.

mod common;

use common::*;
use stagevm_report::Report;

/// The number after `key` in `line`.
fn after(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit() && c != '.')
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// Boots the test guest with `config` as its `--stages` file on 2 vCPUs.
fn boot(config: &str, cmdline: &str) -> (Run, Report) {
    let conf = report_path("open-loop").with_extension("toml");
    std::fs::write(&conf, config).unwrap();
    let out = boot_with_report_within(
        &[
            "--cpus",
            "boot=2",
            "--stages",
            conf.to_str().unwrap(),
            "--cmdline",
            cmdline,
        ],
        std::time::Duration::from_secs(90),
    );
    let _ = std::fs::remove_file(&conf);
    out
}

/// The guest's `testguest: open loop: …` line.
fn open_line(run: &Run) -> String {
    run.stdout
        .lines()
        .find(|l| l.starts_with("testguest: open loop:"))
        .unwrap_or_else(|| panic!("no open-loop line:\n{}", run.stdout))
        .to_string()
}

#[test]
fn an_open_loop_guest_keeps_its_arrival_rate_and_its_requests_are_timed() {
    // 20,000 requests/s for 1.6 s, a fraction of what two vCPUs serve.
    let (run, report) = boot(
        "[host]\ncores = \"0-1\"\n[policy]\nname = \"pinned\"\n",
        "iters=1000 threads=4 requests=4000 workload=footprint stages=2 funcs=64 calls=50 arrival=20000",
    );
    let line = open_line(&run);
    assert_eq!(after(&line, "released "), Some(32_000.0), "{line}");
    assert_eq!(after(&line, "served "), Some(32_000.0), "{line}");
    assert_eq!(after(&line, "dropped "), Some(0.0), "{line}");
    let achieved = after(&line, "achieved ").unwrap();
    assert!((achieved / 20_000.0 - 1.0).abs() < 0.1, "{line}");
    let p99 = after(&line, " p99 ").unwrap();
    assert!(p99 > 0.0, "{line}");
    // The VMM timed requests too, with nothing clamped, and measured the
    // CPU they cost: far from saturation.
    let ch = report.stage_channel.as_ref().unwrap();
    let lat = ch
        .latency
        .as_ref()
        .expect("latency figures from a minor-4 guest");
    assert!(lat.samples > 1000 && lat.samples <= 32_000, "{lat:?}");
    assert_eq!(lat.clamps, 0, "{lat:?}");
    assert!(lat.p50_us > 0.0 && lat.p99_us >= lat.p50_us, "{lat:?}");
    assert_eq!(lat.buckets.last().unwrap().count, lat.samples);
    let cpu = report.sched.cpu.as_ref().expect("CPU figures");
    assert!(cpu.periods > 10, "{cpu:?}");
    assert!(cpu.cpu_per_request_us > 0.0, "{cpu:?}");
    assert!(cpu.utilisation > 0.02 && cpu.utilisation < 0.9, "{cpu:?}");
    assert_eq!(ch.counter_clamps, 0);
    // Per period too, in the timeline and the summary.
    assert!(
        report
            .sched
            .timeline
            .iter()
            .any(|e| e.p99_us.is_some() && e.cpu_per_request_us.is_some() && e.latency_samples > 0),
        "{:#?}",
        report.sched.timeline
    );
    assert!(
        run.stderr.contains("stagevm: requests: latency p50"),
        "{}",
        run.stderr
    );
}

/// `auto` over a guest where `switch_cost=` makes staging win by
/// construction (every change of stage on a vCPU costs 20,000 mixing
/// iterations: `pinned` pays it twice a request, `static` never), with
/// `policy_extra` appended to its `[policy]` table.
fn auto_with_switch_cost(policy_extra: &str, extra: &str) -> (Run, Report) {
    boot(
        // The latency bound is not what these tests judge (host-sched's
        // tests do): a debug VMM on 2 shared cores gives a staged mode's
        // first periods p99s of a few ms (a woken vCPU thread waits out the
        // host's wake-up granularity behind a spinning one; 1.6–3.4 ms
        // against unstaged's ~130 µs in 5 runs): the bound is set at its
        // largest, 100 × unstaged's p99.
        &format!(
            "[host]\ncores = \"0-1\"\n[policy]\nname = \"auto\"\nmax_p99_increase = 100.0\n{policy_extra}"
        ),
        &format!(
            "iters=1000 threads=2 workload=footprint stages=2 funcs=64 calls=50 switch_cost=20000 {extra}"
        ),
    )
}

#[test]
fn auto_judges_an_unsaturated_guest_by_cpu_per_request() {
    // Open loop at a load every mode keeps up with: the rate says nothing
    // (it is the arrival rate), the CPU a request costs decides.
    // 20,000 requests a thread (2 a vCPU) at 8,000 a second: 10 s, for
    // a trial of one duel (spatial against unstaged) of paired slices. One
    // duel at its cap on pairs takes 40 pairs of 2 slices of at most 5
    // periods, 8 s; all three candidates' duels could take 24 s, and did
    // not always end within the run on a CI machine.
    let (run, report) = auto_with_switch_cost(
        "auto_modes = [\"spatial\"]\n",
        "requests=20000 arrival=8000",
    );
    let line = open_line(&run);
    assert_eq!(after(&line, "dropped "), Some(0.0), "{line}");
    let trial = report
        .sched
        .auto
        .as_ref()
        .and_then(|a| a.last_trial.as_ref())
        .unwrap_or_else(|| panic!("no trial finished: {:#?}", report.sched.timeline));
    assert_eq!(trial.objective, "CPU per request", "{trial:#?}");
    assert!(
        trial.unstaged_utilisation.is_some_and(|u| u < 0.95),
        "{trial:#?}"
    );
    assert_ne!(trial.kept, "unstaged", "{trial:#?}");
    let unstaged = trial.modes[0].cpu_per_request_us.unwrap();
    let kept = trial.modes.iter().find(|m| m.mode == trial.kept).unwrap();
    assert!(
        kept.cpu_per_request_us.unwrap() < unstaged * 0.97,
        "{trial:#?}"
    );
    // The timeline's decision says so, and the summary line too.
    assert!(
        report.sched.timeline.iter().any(|e| e
            .decision
            .as_deref()
            .is_some_and(|d| d.starts_with("keep") && d.contains("by CPU per request"))),
        "{:#?}",
        report.sched.timeline
    );
    assert!(
        run.stderr.contains("stagevm: auto: last trial kept"),
        "{}",
        run.stderr
    );
}

#[test]
fn auto_judges_a_saturated_guest_by_rate() {
    // The same guest closed loop: every thread always has work.
    // As many requests as auto_stages_where_staging_is_forced_to_win
    // (sched.rs), for the same reason.
    let (_, report) = auto_with_switch_cost("", "requests=1000000");
    let trial = report
        .sched
        .auto
        .as_ref()
        .and_then(|a| a.last_trial.as_ref())
        .unwrap_or_else(|| panic!("no trial finished: {:#?}", report.sched.timeline));
    assert_eq!(trial.objective, "rate", "{trial:#?}");
    assert!(
        trial.unstaged_utilisation.is_some_and(|u| u >= 0.95),
        "{trial:#?}"
    );
    assert_ne!(trial.kept, "unstaged", "{trial:#?}");
}

#[test]
fn a_minor_3_guest_works_without_latency_figures() {
    let (run, report) = boot(
        "[host]\ncores = \"0-1\"\n[policy]\nname = \"static\"\n",
        "iters=1000 threads=2 requests=20000 latency=0",
    );
    assert!(
        run.stdout.contains("testguest: all 2 vCPUs done"),
        "{}",
        run.stdout
    );
    let ch = report.stage_channel.as_ref().unwrap();
    assert_eq!(ch.mode, "counters");
    assert!(ch.latency.is_none(), "{:?}", ch.latency);
    assert_eq!(ch.requests, 2 * 2 * 20_000);
    // The host's CPU figures do not need the guest's latency.
    assert!(report.sched.cpu.is_some());
    assert!(!run.stderr.contains("latency p50"), "{}", run.stderr);
}
