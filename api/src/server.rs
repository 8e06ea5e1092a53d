//! The `api` helper thread: hyper's HTTP/1.1 server on a current-thread
//! tokio runtime (every connection runs on this one thread, which the
//! pinner keeps on the housekeeping cores), answering through a
//! [`Handler`]: the VMM's routes (`stagevm::api::handle`) or another program's
//! (`stagevm-hostd`'s), under the same limits.
//!
//! Limits a hostile or broken client meets, none of which stops the VM:
//! request headers must arrive within [`HEADER_TIMEOUT`] (a client that
//! connects and never sends is closed), a body within [`BODY_TIMEOUT`] and
//! at most [`MAX_BODY_BYTES`] (`413` beyond, checked on `Content-Length`
//! before reading), a connection lives at most [`CONNECTION_LIFETIME`], and
//! at most [`MAX_CONNECTIONS`] are open at once (further ones are answered
//! `503` and closed).
//!
//! With `--metrics-listen` the same thread also accepts TCP connections,
//! which get `GET /metrics` only (anything else `404`): the changes and
//! the shutdown stay on the owner-only Unix socket. Each listener has its
//! own [`Limits`]: TCP needs no credentials on loopback, so its clients
//! get a budget of their own ([`METRICS_LIMITS`]: 16 connections, 10 s and
//! 100 requests each) and can never take the Unix socket's slots
//! (`tests/metrics_tcp.rs` holds 300 TCP clients open while the operator
//! changes the policy and shuts the VM down). Connections beyond a budget
//! are answered `503` by at most [`MAX_REFUSING`] tasks per listener; the
//! rest are closed unanswered, so a connection flood costs bounded memory.

use std::convert::Infallible;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use stagevm_report::api::MAX_BODY_BYTES;
use tokio::io::{unix::AsyncFd, AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::sync::Semaphore;
use vmm_sys_util::eventfd::EventFd;

use crate::{metrics, Handler, Response};

/// Time a client has to send a request's headers, from the connection (or
/// the previous answer) on.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to send a request's body once its headers arrived.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection stays open (keep-alive included).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Most connections the Unix socket serves at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Most refusals (`503` being written) in flight per listener.
pub const MAX_REFUSING: usize = 32;

/// How long TCP scrapes share one rendering of the exposition: a client
/// pipelining scrapes costs the `api` thread one rendering per 100 ms, not
/// one per request (the figures change once per policy period anyway).
pub const METRICS_SHARED_FOR: Duration = Duration::from_millis(100);

/// The last rendering TCP scrapes share ([`METRICS_SHARED_FOR`]).
#[derive(Default)]
struct SharedScrape {
    at: Option<Instant>,
    body: Bytes,
}

type Shared = Arc<Mutex<SharedScrape>>;

/// One listener's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Longest a connection stays open.
    pub lifetime: Duration,
    /// Requests one connection may make (the last answer closes it).
    pub requests: u32,
}

/// The operator API's Unix socket (owner-only).
pub const API_LIMITS: Limits = Limits {
    connections: MAX_CONNECTIONS,
    lifetime: CONNECTION_LIFETIME,
    requests: u32::MAX,
};

/// `--metrics-listen`'s TCP clients (no credentials: a small budget of
/// their own; Prometheus scrapes once per connection or keeps one alive).
pub const METRICS_LIMITS: Limits = Limits {
    connections: 16,
    lifetime: Duration::from_secs(10),
    requests: 100,
};

/// A listener's slots: connections served and refusals in flight.
#[derive(Clone)]
struct Budget {
    limits: Limits,
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
}

impl Budget {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            slots: Arc::new(Semaphore::new(limits.connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
        }
    }
}

/// What the `api` thread listens on.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The operator API (`--api-socket`): every route.
    pub unix: Option<UnixListener>,
    /// `--metrics-listen`: `GET /metrics` only.
    pub metrics: Option<TcpListener>,
}

/// Which routes a connection may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Routes {
    /// Every route (the owner-only Unix socket).
    All,
    /// `GET /metrics` only (TCP).
    Metrics,
}

/// Serves `listeners` until `exit` (a duplicate of the VM's exit `EventFd`,
/// watched and never read) is readable. `ready` runs once the
/// runtime and its descriptors exist, before the first connection is
/// accepted (the thread installs its seccomp filter there). Errors: the
/// runtime or a listener cannot be set up, or `ready` failed.
pub fn serve<H: Handler>(
    listeners: Listeners,
    ctx: Arc<H>,
    exit: EventFd,
    ready: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    runtime.block_on(async move {
        let unix = match listeners.unix {
            Some(l) => {
                l.set_nonblocking(true)?;
                Some(tokio::net::UnixListener::from_std(l)?)
            }
            None => None,
        };
        let tcp = match listeners.metrics {
            Some(l) => {
                l.set_nonblocking(true)?;
                Some(tokio::net::TcpListener::from_std(l)?)
            }
            None => None,
        };
        // SAFETY: the AsyncFd owns `exit`, so its descriptor stays open and
        // the same until the AsyncFd is dropped.
        let exit = unsafe { AsyncFd::register_with_interest(exit, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        ready()?;
        let api = Budget::new(API_LIMITS);
        let metrics = Budget::new(METRICS_LIMITS);
        let shared = Shared::default();
        loop {
            // `select!` polls its ready branches in random order: neither
            // listener's accept loop can starve the other's.
            tokio::select! {
                _ = exit.readable() => return Ok(()),
                accepted = async { unix.as_ref().unwrap().accept().await }, if unix.is_some() => {
                    match accepted {
                        Ok((stream, _)) => admit(stream, Routes::All, &api, &ctx, &shared),
                        Err(e) => accept_failed(e).await,
                    }
                }
                accepted = async { tcp.as_ref().unwrap().accept().await }, if tcp.is_some() => {
                    match accepted {
                        Ok((stream, _)) => admit(stream, Routes::Metrics, &metrics, &ctx, &shared),
                        Err(e) => accept_failed(e).await,
                    }
                }
            }
        }
    })
}

/// Serves `stream` when a slot of its listener's `budget` is free, else
/// answers `503` (or, with [`MAX_REFUSING`] refusals already in flight,
/// closes it unanswered).
fn admit<S, H: Handler>(stream: S, routes: Routes, budget: &Budget, ctx: &Arc<H>, shared: &Shared)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if let Ok(slot) = budget.slots.clone().try_acquire_owned() {
        let ctx = ctx.clone();
        let limits = budget.limits;
        let shared = shared.clone();
        tokio::spawn(async move {
            serve_connection(stream, routes, limits, ctx, shared).await;
            drop(slot);
        });
    } else if let Ok(refusing) = budget.refusing.clone().try_acquire_owned() {
        tokio::spawn(async move {
            refuse_busy(stream).await;
            drop(refusing);
        });
    }
}

/// An `accept` that failed (`EMFILE`, `ENFILE`, `ENOBUFS`, …): logged at
/// most [`stage_device::ratelimit::BURST`] times per 5 s (a descriptor shortage
/// fails every pass), then a 10 ms pause.
async fn accept_failed(e: std::io::Error) {
    static LIMIT: stage_device::ratelimit::RateLimit = stage_device::ratelimit::RateLimit::new();
    if LIMIT.allow() {
        tracing::warn!("operator API: accept failed: {e}");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

async fn serve_connection<S, H: Handler>(
    stream: S,
    routes: Routes,
    limits: Limits,
    ctx: Arc<H>,
    shared: Shared,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicU32::new(0));
    let service = service_fn(move |req| {
        let (ctx, shared) = (ctx.clone(), shared.clone());
        let n = served.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        async move {
            if routes == Routes::Metrics {
                // A pipelining client gives way to the other connections
                // (the operator's among them) after every request.
                tokio::task::yield_now().await;
            }
            let mut out = answer(&*ctx, routes, &shared, req).await;
            if n >= limits.requests {
                // hyper closes the connection after this answer.
                out.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(out)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BODY_BYTES.max(8192) * 2)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.lifetime, conn).await {
        Ok(Err(e)) => tracing::debug!("operator API: connection ended: {e}"),
        Err(_) => tracing::debug!(
            "operator API: connection closed after {:?}",
            limits.lifetime
        ),
        Ok(Ok(())) => {}
    }
}

/// `503` for a connection beyond [`MAX_CONNECTIONS`].
async fn refuse_busy<S: AsyncWrite + Unpin>(mut stream: S) {
    let body = r#"{"error":"too many connections"}"#;
    let text = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(HEADER_TIMEOUT, stream.write_all(text.as_bytes())).await;
}

/// Reads the request's body within the limits and routes it.
async fn answer<H: Handler>(
    ctx: &H,
    routes: Routes,
    shared: &Mutex<SharedScrape>,
    req: Request<Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let response = if routes == Routes::Metrics && parts.uri.path() != "/metrics" {
        Response::error(
            404,
            format!(
                "'{}': --metrics-listen serves GET /metrics only",
                parts.uri.path().escape_debug()
            ),
        )
    } else if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        too_large()
    } else {
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY_BYTES).collect()).await
        {
            Err(_) => Response::error(
                408,
                format!("the body did not arrive within {BODY_TIMEOUT:?}"),
            ),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => too_large(),
            Ok(Err(e)) => Response::error(400, format!("reading the body: {e}")),
            Ok(Ok(_)) if routes == Routes::Metrics && parts.method == Method::GET => {
                return scrape_shared(ctx, shared);
            }
            Ok(Ok(collected)) => ctx.handle(
                parts.method.as_str(),
                parts.uri.path(),
                parts.uri.query(),
                &collected.to_bytes(),
            ),
        }
    };
    reply(
        response.status,
        response.content_type,
        Bytes::from(response.body),
    )
}

/// The TCP scrape: the rendering of at most [`METRICS_SHARED_FOR`] ago,
/// or a fresh one (a failed rendering is answered as it is, not kept).
fn scrape_shared<H: Handler>(
    ctx: &H,
    shared: &Mutex<SharedScrape>,
) -> hyper::Response<Full<Bytes>> {
    let mut last = shared.lock().unwrap_or_else(|p| p.into_inner());
    if last.at.is_some_and(|at| at.elapsed() < METRICS_SHARED_FOR) {
        return reply(200, metrics::CONTENT_TYPE, last.body.clone());
    }
    let fresh = ctx.handle("GET", "/metrics", None, &[]);
    let body = Bytes::from(fresh.body);
    if fresh.status == 200 {
        *last = SharedScrape {
            at: Some(Instant::now()),
            body: body.clone(),
        };
    }
    reply(fresh.status, fresh.content_type, body)
}

/// An answer of `status` with `body` of `content_type`.
fn reply(status: u16, content_type: &'static str, body: Bytes) -> hyper::Response<Full<Bytes>> {
    let mut out = hyper::Response::new(Full::new(body));
    *out.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    out.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    out
}

fn too_large() -> Response {
    Response::error(
        413,
        format!("the body is larger than {MAX_BODY_BYTES} bytes"),
    )
}
