//! The stagevm operator API's transport, shared by the VMM (`stagevm
//! --api-socket`) and the host daemon (`stagevm-hostd`), which serve their
//! own routes through it ([`Handler`]), and by every client (the VMM's
//! `stagevm-remote`, the daemon, the test kit, the benchmarks):
//!
//! * [`socket`] — binding the socket (mode 0600, refused when a live server
//!   holds the path, removed at exit), and the TCP metrics listener;
//! * [`server`] — the `api` helper thread: hyper on a current-thread tokio
//!   runtime, with the limits a hostile client meets (body size, header and
//!   body time-outs, concurrent connections);
//! * [`client`] — the client `stagevm-remote`, the daemon and the
//!   benchmarks use;
//! * [`metrics`] — the Prometheus text exposition of a
//!   [`StagesView`](stagevm_report::api::StagesView);
//! * [`poll`] — the epoll helper of the event loops (the VMM's and the
//!   daemon's);
//! * [`paths`] — host path helpers (an error naming what is missing; a
//!   socket bound owner-only), leaf functions the VMM's configuration and
//!   devices use as well.
//!
//! The routes and bodies are listed in [`stagevm_report::api`].

pub mod client;
pub mod metrics;
pub mod paths;
pub mod poll;
pub mod server;
pub mod socket;

use serde::Serialize;
use stagevm_report::api::ApiError;

/// One answer: HTTP status, content type and body.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body (JSON, or Prometheus text for `/metrics`).
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON answer: `value` serialised (a `500` if it cannot be).
    pub fn json<T: Serialize>(status: u16, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status,
                content_type: "application/json",
                body,
            },
            Err(e) => Self::error(500, format!("encoding the answer: {e}")),
        }
    }

    /// An error answer: `status` with an [`ApiError`] body.
    pub fn error(status: u16, error: impl Into<String>) -> Self {
        let body = ApiError {
            error: error.into(),
        };
        Self {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(&body).unwrap_or_default(),
        }
    }
}

/// What a server of [`server::serve`] answers with: the routes of one
/// program. A handler runs on the `api` thread and must not block long
/// (every connection shares that thread).
pub trait Handler: Send + Sync + 'static {
    /// The answer to `method path?query` with `body` (read within the
    /// server's limits; `GET /metrics` on TCP shares one rendering per
    /// 100 ms).
    fn handle(&self, method: &str, path: &str, query: Option<&str>, body: &[u8]) -> Response;
}
