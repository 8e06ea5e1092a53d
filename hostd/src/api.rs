//! The daemon's operator view: `GET /api/v1/host` ([`HostView`]) on its own
//! API socket and `GET /metrics` there and on `--metrics-listen`, served
//! by the VMM's hardened server ([`stagevm_api::server`]: the same limits,
//! and TCP scrapers with a budget of their own).
//!
//! | metric | type | labels | view field |
//! |---|---|---|---|
//! | `stagevm_host_vm_cores` | gauge | `vm` | `vms[].cores` (count) |
//! | `stagevm_host_vm_demand` | gauge | `vm` | `vms[].demand` (cores) |
//! | `stagevm_host_vm_shared` | gauge | `vm` | `vms[].shared` (1: on a core another VM has too) |
//! | `stagevm_host_vm_lent` | gauge | `vm` | `vms[].lent` (1: it lent its core while idle and runs on a shared one) |
//! | `stagevm_host_vm_cpu_weight` | gauge | `vm` | `vms[].cpu_weight` (0: none, its cores are its own) |
//! | `stagevm_host_vm_moves_total` | counter | `vm` | `vms[].moves` |
//! | `stagevm_host_vm_errors_total` | counter | `vm` | `vms[].errors` |
//! | `stagevm_host_vm_skipped_total` | counter | `vm` | `vms[].skipped` |
//! | `stagevm_host_vm_waited_periods_total` | counter | `vm` | `vms[].waited` |
//! | `stagevm_host_periods_total` | counter | — | `periods` |

use std::sync::Mutex;

use host_sched::cpuset::CpuSet;
use prometheus::{Encoder, GaugeVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};
use stagevm_api::{Handler, Response};
use stagevm_report::api::HostView;

/// The view the period loop publishes and the `api` thread serves.
#[derive(Default)]
pub struct Shared(pub Mutex<HostView>);

impl Shared {
    fn view(&self) -> HostView {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Handler for Shared {
    fn handle(&self, method: &str, path: &str, _query: Option<&str>, _body: &[u8]) -> Response {
        match (method, path) {
            ("GET", "/api/v1/host") => Response::json(200, &self.view()),
            ("GET", "/metrics") => match exposition(&self.view()) {
                Ok(text) => Response {
                    status: 200,
                    content_type: stagevm_api::metrics::CONTENT_TYPE,
                    body: text,
                },
                Err(e) => Response::error(500, format!("metrics: {e}")),
            },
            (_, "/api/v1/host" | "/metrics") => {
                Response::error(405, format!("{method} {path}: only GET"))
            }
            _ => Response::error(404, format!("no such path '{}'", path.escape_debug())),
        }
    }
}

/// The view in Prometheus' text format (a fresh registry per scrape).
/// Errors: the `prometheus` crate refused a metric.
pub fn exposition(view: &HostView) -> prometheus::Result<Vec<u8>> {
    let registry = Registry::new();
    let gauge = |name: &str, help: &str| -> prometheus::Result<GaugeVec> {
        let g = GaugeVec::new(Opts::new(name, help), &["vm"])?;
        registry.register(Box::new(g.clone()))?;
        Ok(g)
    };
    let counter = |name: &str, help: &str| -> prometheus::Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(name, help), &["vm"])?;
        registry.register(Box::new(c.clone()))?;
        Ok(c)
    };
    let cores = gauge("stagevm_host_vm_cores", "Stage cores the VM has")?;
    let demand = gauge(
        "stagevm_host_vm_demand",
        "The VM's demand (cores of work CPU, one more when saturated)",
    )?;
    let shared = gauge(
        "stagevm_host_vm_shared",
        "1 when one of the VM's cores is in another VM's set too",
    )?;
    let lent = gauge(
        "stagevm_host_vm_lent",
        "1 when the VM lent its core while idle (lend_when_idle) and runs on a shared one",
    )?;
    let cpu_weight = gauge(
        "stagevm_host_vm_cpu_weight",
        "CPU weight given to the VM for the cores it shares (cgroup v2 scale; 0: none)",
    )?;
    let moves = counter("stagevm_host_vm_moves_total", "Cores moved to the VM")?;
    let errors = counter(
        "stagevm_host_vm_errors_total",
        "Changes the VM refused and failed requests",
    )?;
    let skipped = counter(
        "stagevm_host_vm_skipped_total",
        "Periods the VM's socket did not answer in time",
    )?;
    let waited = counter(
        "stagevm_host_vm_waited_periods_total",
        "Periods the VM's demand exceeded its cores by a core or more",
    )?;
    for vm in &view.vms {
        let l = [vm.name.as_str()];
        cores
            .with_label_values(&l)
            .set(CpuSet::parse(&vm.cores).map_or(0, |c| c.len()) as f64);
        demand.with_label_values(&l).set(vm.demand);
        shared
            .with_label_values(&l)
            .set(f64::from(u8::from(vm.shared)));
        lent.with_label_values(&l).set(f64::from(u8::from(vm.lent)));
        cpu_weight
            .with_label_values(&l)
            .set(f64::from(vm.cpu_weight.unwrap_or(0)));
        moves.with_label_values(&l).inc_by(vm.moves);
        errors.with_label_values(&l).inc_by(vm.errors);
        skipped.with_label_values(&l).inc_by(vm.skipped);
        waited.with_label_values(&l).inc_by(vm.waited);
    }
    let periods = IntCounter::new("stagevm_host_periods_total", "Allocation periods run")?;
    periods.inc_by(view.periods);
    registry.register(Box::new(periods))?;
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(out)
}
