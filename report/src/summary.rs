//! The human summary of a report, printed by `stagevm` on stderr.

use std::fmt::Write as _;

use crate::{escape, BlockReport, ChannelReport, NetReport, SchedReport};

/// A human summary: scheduling, per stage, per thread, per disk; one
/// `stagevm:` line each, newline-terminated.
pub fn summary(c: Option<&ChannelReport>, sc: &SchedReport, disks: &[BlockReport]) -> String {
    let mut s = String::new();
    // An older report has no visit policy: its guests served FIFO.
    let visit = if sc.visit.is_empty() {
        "fifo"
    } else {
        &sc.visit
    };
    let _ = writeln!(
        s,
        "stagevm: policy {} (period {} ms, visit {}), stage cores {}, housekeeping {}",
        sc.policy, sc.period_ms, visit, sc.stage_cores, sc.housekeeping
    );
    for w in &sc.warnings {
        let _ = writeln!(s, "stagevm: warning: {w}");
    }
    if let Some(c) = c.filter(|c| c.registrations > 0) {
        let events: u64 = c.vcpus.iter().map(|v| v.events).sum();
        if c.mode == "counters" {
            let trace = match c.trace_every {
                0 => String::new(),
                n => format!(
                    "; trace every {n}: {} events kept in {} drains, {} dropped on full rings, {} invalid",
                    c.traced_events, c.drains, c.trace_dropped, c.dropped
                ),
            };
            let _ = writeln!(
                s,
                "stagevm: stage channel (counters): {events} switches, {} requests ({:.0} requests/s), {} impossible values clamped{trace}",
                c.requests, c.requests_per_s, c.counter_clamps
            );
        } else {
            let _ = writeln!(
                s,
                "stagevm: stage channel (rings): {events} events in {} drains ({} µs period), {} dropped, {} ring-full back-offs, {} requests ({:.0} requests/s)",
                c.drains, c.drain_period_us, c.dropped, c.ring_full_backoffs, c.requests, c.requests_per_s
            );
        }
        if let Some(line) = requests_line(c, sc) {
            let _ = writeln!(s, "{line}");
        }
        let vcpu_ns = (c.busy_ns as f64 * c.vcpus.len() as f64).max(1.0);
        for st in &c.stages {
            let place = sc.stages.iter().find(|p| p.name == st.name);
            let _ = writeln!(
                s,
                "stagevm:   stage {:<8} events {:>8}  migrations in {:>7} out {:>7}  occupancy {:>5.1} %  vCPUs {:<10} cores {}",
                escape(&st.name),
                st.events,
                st.migrations_in,
                st.migrations_out,
                st.occupancy_ns as f64 * 100.0 / vcpu_ns,
                place.map_or("-".into(), |p| format!("{:?}", p.vcpus)),
                place.map_or("-", |p| p.cores.as_str()),
            );
        }
        if let Some(line) = cohorts_line(c) {
            let _ = writeln!(s, "{line}");
        }
    }
    for v in &sc.vcpus {
        let _ = writeln!(
            s,
            "stagevm:   vcpu{} tid {} affinity {} cpu {:.1} ms",
            v.index, v.tid, v.affinity, v.cpu_ms
        );
    }
    for h in &sc.helpers {
        let _ = writeln!(
            s,
            "stagevm:   helper {} tid {} affinity {} cpu {:.1} ms",
            h.name, h.tid, h.affinity, h.cpu_ms
        );
    }
    for d in disks {
        let _ = writeln!(
            s,
            "stagevm:   disk {} ({}{}, notify {}): {} requests ok, {} errors, {} dropped, {} bytes read, {} written",
            d.name,
            d.path,
            if d.readonly { ", read-only" } else { "" },
            d.notify,
            d.ok,
            d.errors,
            d.dropped + d.bad_heads,
            d.bytes_read,
            d.bytes_written
        );
    }
    let _ = writeln!(
        s,
        "stagevm: {} map changes, {} vCPU re-pins (mean {:.1} µs)",
        sc.map_changes, sc.repins, sc.repin_mean_us
    );
    if let Some(a) = &sc.auto {
        let _ = writeln!(
            s,
            "stagevm: auto: {} trials ({} of {} periods; {} on a change point), {} periods in losing slices ({:.2} % of the run, costing {:.2} % of its objective), {} switches of mode (all by trials); {} duels ({} at the cap on pairs), {} modes skipped",
            a.trials,
            a.trial_periods,
            a.periods,
            a.change_points,
            a.losing_periods,
            a.losing_share * 100.0,
            a.cost_share * 100.0,
            a.mode_switches,
            a.duels,
            a.duels_capped,
            a.modes_skipped
        );
        if let Some(t) = &a.last_trial {
            let _ = writeln!(s, "{}", trial_line(t));
        }
    }
    s
}

/// `stagevm: cohorts (threads per visit of a stage on a vCPU): parse 2.41
/// (1200 cohorts), …`, when the event stream showed any
/// ([`crate::StageStats::cohorts`]).
fn cohorts_line(c: &ChannelReport) -> Option<String> {
    let parts: Vec<String> = c
        .stages
        .iter()
        .filter(|st| st.cohorts > 0)
        .map(|st| {
            format!(
                "{} {:.2} ({} cohorts)",
                escape(&st.name),
                st.cohort_entries as f64 / st.cohorts as f64,
                st.cohorts
            )
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "stagevm: cohorts (threads per visit of a stage on a vCPU, from the {}): {}",
            if c.mode == "counters" {
                "trace"
            } else {
                "events"
            },
            parts.join(", ")
        )
    })
}

/// `stagevm: requests: latency p50 … µs, p99 … µs, p99.9 … µs (N timed),
/// CPU per request … µs, utilisation … %`, when the guest timed requests
/// or the host measured CPU.
fn requests_line(c: &ChannelReport, sc: &SchedReport) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(l) = c.latency.as_ref().filter(|l| l.samples > 0) {
        parts.push(format!(
            "latency p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs ({} timed, {} clamped)",
            l.p50_us, l.p99_us, l.p999_us, l.samples, l.clamps
        ));
    }
    if let Some(cpu) = sc.cpu.as_ref().filter(|c| c.requests > 0.0) {
        parts.push(format!(
            "CPU per request {:.2} µs, utilisation {:.1} %",
            cpu.cpu_per_request_us,
            cpu.utilisation * 100.0
        ));
    }
    (!parts.is_empty()).then(|| format!("stagevm: requests: {}", parts.join(", ")))
}

/// `stagevm: auto: last trial kept M by …: unstaged … µs/request … p99 …`.
fn trial_line(t: &crate::TrialReport) -> String {
    let modes: Vec<String> = t
        .modes
        .iter()
        .map(|m| {
            let mut part = m.mode.clone();
            if let Some(r) = m.requests_per_s {
                let _ = write!(part, " {r:.0}/s");
            }
            if let Some(c) = m.cpu_per_request_us {
                let _ = write!(part, " {c:.2} µs CPU");
            }
            if let Some(p) = m.p99_us {
                let _ = write!(part, " p99 {p:.0} µs");
            }
            if m.dropped {
                part += " dropped";
            }
            if m.over_latency_bound {
                part += " over the bound";
            }
            part
        })
        .collect();
    let util = t.unstaged_utilisation.map_or(String::new(), |u| {
        format!(", unstaged utilisation {:.0} %", u * 100.0)
    });
    let bound = t
        .p99_limit_us
        .map_or(String::new(), |b| format!(", p99 bound {b:.0} µs"));
    let duels: Vec<String> = t
        .duels
        .iter()
        .map(|d| {
            let mut s = format!("{} vs {}: {}", d.candidate, d.incumbent, d.outcome);
            if let (Some(m), Some(se)) = (d.mean_pct, d.se_pct) {
                let _ = write!(s, " ({m:+.1} % ± {se:.1} %, {} pairs", d.pairs);
                if let Some(c) = d.confidence {
                    let _ = write!(s, ", confidence {:.1} %", c * 100.0);
                }
                s += ")";
            }
            if let Some(v) = &d.veto {
                let _ = write!(s, ", refused: {v}");
            }
            s
        })
        .chain(
            t.skipped
                .iter()
                .map(|k| format!("{} skipped ({})", k.mode, k.why)),
        )
        .collect();
    format!(
        "stagevm: auto: last trial kept {} (decided by {}, objective {}{util}{bound}, settling {} periods): {}; duels: {}",
        t.kept,
        t.decided_by,
        t.objective,
        t.settle_periods,
        modes.join("; "),
        duels.join("; ")
    )
}

/// One line per virtio-net device (`stagevm:   net …`), printed after
/// [`summary`].
pub fn net_summary(nets: &[NetReport]) -> String {
    let mut s = String::new();
    for n in nets {
        let _ = writeln!(
            s,
            "stagevm:   net {} (tap {}, mac {}, notify {}{}): rx {} frames {} bytes {} dropped {} errors, tx {} frames {} bytes {} dropped {} errors, {} bad chains, {} oversized, notifications rx {} tx {}, {} interrupts",
            n.name,
            n.tap,
            n.mac,
            n.notify,
            if n.tap_gone { ", tap gone" } else { "" },
            n.rx_packets,
            n.rx_bytes,
            n.rx_dropped,
            n.rx_errors,
            n.tx_packets,
            n.tx_bytes,
            n.tx_dropped,
            n.tx_errors,
            n.bad_chains,
            n.oversized,
            n.rx_notifications,
            n.tx_notifications,
            n.interrupts
        );
    }
    s
}
