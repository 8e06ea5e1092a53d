//! The VMM's operator API routes (`stagevm --api-socket PATH`): HTTP/1.1
//! on a Unix socket, in the style of Cloud Hypervisor's `--api-socket` and
//! Firecracker's API socket, to watch the stages live and change the policy
//! and budgets without a restart. The transport (socket, server, client,
//! the Prometheus exposition) is the `stagevm-api` crate, which
//! `stagevm-hostd` serves its own routes with; here is [`handle`], the
//! VMM's routes, independent of the HTTP library.
//!
//! `PUT /api/v1/stages.trace` turns the event trace of a counters guest on,
//! off or sampled at once (as `--stage-trace`). Changes (`PUT
//! /api/v1/stages.policy`, `PUT /api/v1/stages.budgets`, `PUT
//! /api/v1/stages.cpu_weight`) are validated by
//! host-sched exactly as a `--stages` file
//! ([`stage_device::sched::StageSched::propose`]), answered `400` with the same
//! one-line message naming key and value and nothing queued when invalid,
//! and `202` when valid; the `stage-sched` thread applies them at its next
//! policy period and records them in the timeline with `source = "api"`.
//! A policy change may carry the stage-visit policy (`"visit": "cohort"`),
//! published with the next stage map even when nothing else changed.
//! The routes and bodies are listed in [`stagevm_report::api`].

use std::sync::Arc;

use stagevm_api::{metrics, Handler, Response};
use stagevm_report::api::{
    Accepted, TraceUpdate, VmInfo, DEFAULT_DECISIONS, DEFAULT_TIMELINE, PREFIX, TRACE_EVERY_MAX,
};

use crate::exit::{ExitEvent, VmExit};
use stage_device::sched::{Change, StageSched};

/// What the API serves: the VM's scheduler, its exit and its fixed facts.
pub struct ApiContext {
    /// The VM's stage scheduling.
    pub sched: Arc<StageSched>,
    /// The VM's exit (`PUT /api/v1/vm.shutdown` requests it).
    pub exit: Arc<ExitEvent>,
    /// Kernel path, command line, vCPUs, RAM (bytes), stage device.
    pub vm: VmFacts,
    /// The VM's devices (the network cards' counters).
    pub bus: Arc<crate::devices::Bus>,
}

/// The VM's configuration that does not change while it runs.
#[derive(Clone, Debug)]
pub struct VmFacts {
    /// Guest kernel path.
    pub kernel: String,
    /// Kernel command line as given.
    pub cmdline: String,
    /// vCPUs.
    pub vcpu_count: u32,
    /// Guest RAM (bytes).
    pub memory_bytes: u64,
}

/// The routes: `(method, path)` → handler; `Some(methods)` names the
/// methods a known path accepts (for `405`).
fn allowed_methods(path: &str) -> Option<&'static str> {
    match path.strip_prefix(PREFIX) {
        Some("/vm.info" | "/stages") => Some("GET"),
        Some(
            "/stages.policy" | "/stages.budgets" | "/stages.cpu_weight" | "/stages.trace"
            | "/vm.shutdown",
        ) => Some("PUT"),
        _ if path == "/metrics" => Some("GET"),
        _ => None,
    }
}

impl Handler for ApiContext {
    fn handle(&self, method: &str, path: &str, query: Option<&str>, body: &[u8]) -> Response {
        handle(self, method, path, query, body)
    }
}

/// Answers one request: `method`, `path` and `query` of its URI and its
/// `body` (at most [`stagevm_report::api::MAX_BODY_BYTES`]; the server
/// refuses larger ones). Never panics on any input: every bad request gets
/// a 4xx answer naming what was wrong.
pub fn handle(
    ctx: &ApiContext,
    method: &str,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Response {
    let Some(allowed) = allowed_methods(path) else {
        return Response::error(404, format!("no such path '{}'", path.escape_debug()));
    };
    if method != allowed {
        return Response::error(
            405,
            format!(
                "{} {}: this path accepts {allowed} only",
                method.escape_debug(),
                path
            ),
        );
    }
    match path.strip_prefix(PREFIX).unwrap_or(path) {
        "/vm.info" => Response::json(200, &info(ctx)),
        "/stages" => match stages_query(query) {
            Ok((timeline, decisions)) => Response::json(200, &ctx.sched.view(timeline, decisions)),
            Err(e) => Response::error(400, e.to_string()),
        },
        "/metrics" => {
            let view = ctx.sched.view(0, 0);
            let (disks, nets) = (ctx.bus.block_reports(), ctx.bus.net_reports());
            let devices = metrics::Devices {
                disks: &disks,
                nets: &nets,
            };
            match metrics::render(&view, stage_device::ratelimit::suppressed(), devices) {
                Ok(text) => Response {
                    status: 200,
                    content_type: metrics::CONTENT_TYPE,
                    body: text.into_bytes(),
                },
                Err(e) => Response::error(500, format!("encoding the metrics: {e}")),
            }
        }
        "/vm.shutdown" => {
            if ctx.exit.reason().is_none() {
                tracing::info!("shutdown requested through the operator API");
            }
            ctx.exit.request(VmExit::ApiShutdown);
            Response::json(
                202,
                &Accepted {
                    accepted: "vm.shutdown".into(),
                },
            )
        }
        "/stages.policy" => change(ctx, body, Change::Policy),
        "/stages.cpu_weight" => change(ctx, body, Change::CpuWeight),
        "/stages.trace" => trace(ctx, body),
        _ => change(ctx, body, Change::Budgets),
    }
}

/// `PUT /api/v1/stages.trace`: the trace asked of the guest, applied at
/// once (the guest reads it at its next report).
fn trace(ctx: &ApiContext, body: &[u8]) -> Response {
    if let Some(refused) = refuse_changes(ctx) {
        return refused;
    }
    let update: TraceUpdate = match serde_json::from_slice(body) {
        Ok(u) => u,
        Err(e) => return Response::error(400, format!("body: {e}")),
    };
    if update.every > TRACE_EVERY_MAX {
        return Response::error(
            400,
            format!(
                "every = {}: at most {TRACE_EVERY_MAX} (0 = off, 1 = every event)",
                update.every
            ),
        );
    }
    ctx.sched.set_trace(update.every);
    let what = match update.every {
        0 => "trace off".to_string(),
        1 => "trace every event".to_string(),
        n => format!("trace every {n}th event"),
    };
    tracing::info!("operator API: {what}");
    Response::json(202, &Accepted { accepted: what })
}

/// `409` when the VM is stopping or has no stage device.
fn refuse_changes(ctx: &ApiContext) -> Option<Response> {
    if ctx.exit.reason().is_some() {
        return Some(Response::error(409, "the VM is stopping"));
    }
    if ctx.sched.device().is_none() {
        return Some(Response::error(
            409,
            "the VM runs without the stage device (--no-stage-device): there is no stage scheduling to change",
        ));
    }
    None
}

/// `?timeline=N|all&decisions=N|all`: how many timeline entries and
/// decisions to return.
fn stages_query(query: Option<&str>) -> Result<(usize, usize), QueryError> {
    let (mut timeline, mut decisions) = (DEFAULT_TIMELINE, DEFAULT_DECISIONS);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, slot) = match key {
            "timeline" => ("timeline", &mut timeline),
            "decisions" => ("decisions", &mut decisions),
            _ => return Err(QueryError::Unknown(pair.escape_debug().to_string())),
        };
        *slot = match value {
            "all" => usize::MAX,
            v => v.parse().map_err(|_| QueryError::BadCount {
                key,
                value: v.escape_debug().to_string(),
            })?,
        };
    }
    Ok((timeline, decisions))
}

/// Why a `GET /stages` query is refused (answered 400 with this text).
#[derive(Debug, thiserror::Error)]
enum QueryError {
    /// A parameter other than `timeline` and `decisions` (escaped).
    #[error("unknown query parameter '{0}' (expected timeline=N|all, decisions=N|all)")]
    Unknown(String),
    /// Not a count or `all` (the value escaped).
    #[error("{key} = '{value}': expected a count or 'all'")]
    BadCount {
        /// `timeline` or `decisions`.
        key: &'static str,
        /// The value given.
        value: String,
    },
}

/// A `PUT` of a change: the body parsed into `T` (unknown fields refused),
/// validated and queued by the controller.
fn change<T: serde::de::DeserializeOwned>(
    ctx: &ApiContext,
    body: &[u8],
    wrap: fn(T) -> Change,
) -> Response {
    if let Some(refused) = refuse_changes(ctx) {
        return refused;
    }
    let update: T = match serde_json::from_slice(body) {
        Ok(u) => u,
        Err(e) => return Response::error(400, format!("body: {e}")),
    };
    match ctx.sched.propose(&wrap(update)) {
        Ok(what) => {
            tracing::info!("operator API: accepted {what}");
            Response::json(202, &Accepted { accepted: what })
        }
        Err(e) => Response::error(400, e.to_string()),
    }
}

fn info(ctx: &ApiContext) -> VmInfo {
    let view = ctx.sched.view(0, 0);
    let s = view.sched;
    VmInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        state: if ctx.exit.reason().is_some() {
            "stopping"
        } else {
            "running"
        }
        .into(),
        kernel: ctx.vm.kernel.clone(),
        cmdline: ctx.vm.cmdline.clone(),
        vcpu_count: ctx.vm.vcpu_count,
        memory_bytes: ctx.vm.memory_bytes,
        stage_device: ctx.sched.device().is_some(),
        policy: s.policy,
        visit: s.visit,
        period_ms: s.period_ms,
        stage_cores: s.stage_cores,
        housekeeping: s.housekeeping,
        vcpus: s.vcpus,
        helpers: s.helpers,
        nets: ctx.bus.net_reports(),
    }
}

/// The request body types (host-sched's), re-exported for
/// `stagevm-remote` and the tests.
pub mod body {
    pub use host_sched::config::{BudgetsUpdate, CpuWeightUpdate, PolicyUpdate};
}
