//! The request metrics of `GET /metrics`: the guest's timed requests as a
//! Prometheus histogram, the CPU their work cost and the vCPUs'
//! utilisation (see the table in the parent module).

use std::collections::HashMap;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, Metric, MetricFamily, MetricType};
use prometheus::{GaugeVec, Opts};
use stagevm_report::api::StagesView;
use stagevm_report::LatencyReport;

use super::Builder;

/// A histogram whose buckets were counted elsewhere (the guest's): the
/// `prometheus` crate's own `Histogram` only counts observations it makes.
struct Counted {
    desc: Desc,
    family: MetricFamily,
}

impl Collector for Counted {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![self.family.clone()]
    }
}

/// `stagevm_request_latency_seconds`: the timed requests' cumulative
/// counts at every power of two of ns (`le` in seconds), `_sum` and
/// `_count`.
fn latency_histogram(l: &LatencyReport) -> prometheus::Result<Counted> {
    let name = "stagevm_request_latency_seconds";
    let help = "Latency of the requests the guest timed, from their start to their stage_exit (s; one request in N)";
    let desc = Desc::new(name.into(), help.into(), Vec::new(), HashMap::new())?;
    let mut h = Histogram::default();
    h.set_sample_count(l.samples);
    h.set_sample_sum(l.sum_ns as f64 / 1e9);
    h.set_bucket(
        l.buckets
            .iter()
            .map(|b| {
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(b.le_ns as f64 / 1e9);
                bucket.set_cumulative_count(b.count);
                bucket
            })
            .collect(),
    );
    let mut m = Metric::default();
    m.set_histogram(h);
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(MetricType::HISTOGRAM);
    family.set_metric(vec![m]);
    Ok(Counted { desc, family })
}

/// Registers the request metrics of `view` in `b`: the latency histogram
/// and its clamps (a guest with latency histograms), the work CPU and the
/// per-vCPU utilisation (when the host measured them).
pub(super) fn request_metrics(b: &Builder, view: &StagesView) -> prometheus::Result<()> {
    if let Some(l) = view.stage_channel.as_ref().and_then(|c| c.latency.as_ref()) {
        b.registry.register(Box::new(latency_histogram(l)?))?;
        b.counter(
            "stagevm_latency_clamps_total",
            "Impossible request-latency histogram values clamped",
            l.clamps,
        )?;
    }
    let Some(cpu) = &view.sched.cpu else {
        return Ok(());
    };
    let seconds = prometheus::Counter::new(
        "stagevm_request_cpu_seconds_total",
        "CPU the vCPU threads spent on the guest's work, less idle spinning (s); over stagevm_requests_total: CPU per request",
    )?;
    seconds.inc_by(cpu.work_ns as f64 / 1e9);
    b.registry.register(Box::new(seconds))?;
    let util = GaugeVec::new(
        Opts::new(
            "stagevm_vcpu_utilisation_ratio",
            "Share of the last policy period a vCPU spent on work (work CPU / period)",
        ),
        &["vcpu"],
    )?;
    b.registry.register(Box::new(util.clone()))?;
    for (v, u) in cpu.vcpu_utilisation.iter().enumerate() {
        util.with_label_values(&[&v.to_string()]).set(*u);
    }
    Ok(())
}
