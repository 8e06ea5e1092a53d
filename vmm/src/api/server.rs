//! The `api` helper thread: hyper's HTTP/1.1 server on a current-thread
//! tokio runtime (every connection runs on this one thread, which the
//! pinner keeps on the housekeeping cores), answering through
//! [`super::handle`].
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
//! the shutdown stay on the owner-only Unix socket.

use std::convert::Infallible;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use stagevm_report::api::MAX_BODY_BYTES;
use tokio::io::{unix::AsyncFd, AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::sync::Semaphore;
use vmm_sys_util::eventfd::EventFd;

use super::{handle, ApiContext, Response};

/// Time a client has to send a request's headers, from the connection (or
/// the previous answer) on.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to send a request's body once its headers arrived.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection stays open (keep-alive included).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

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
pub fn serve(
    listeners: Listeners,
    ctx: Arc<ApiContext>,
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
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            tokio::select! {
                _ = exit.readable() => return Ok(()),
                accepted = async { unix.as_ref().unwrap().accept().await }, if unix.is_some() => {
                    match accepted {
                        Ok((stream, _)) => admit(stream, Routes::All, &slots, &ctx),
                        Err(e) => accept_failed(e).await,
                    }
                }
                accepted = async { tcp.as_ref().unwrap().accept().await }, if tcp.is_some() => {
                    match accepted {
                        Ok((stream, _)) => admit(stream, Routes::Metrics, &slots, &ctx),
                        Err(e) => accept_failed(e).await,
                    }
                }
            }
        }
    })
}

/// Serves `stream` when a connection slot is free, else answers `503`.
fn admit<S>(stream: S, routes: Routes, slots: &Arc<Semaphore>, ctx: &Arc<ApiContext>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match slots.clone().try_acquire_owned() {
        Ok(slot) => {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                serve_connection(stream, routes, ctx).await;
                drop(slot);
            });
        }
        Err(_) => {
            tokio::spawn(refuse_busy(stream));
        }
    }
}

async fn accept_failed(e: std::io::Error) {
    tracing::warn!("operator API: accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

async fn serve_connection<S>(stream: S, routes: Routes, ctx: Arc<ApiContext>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(answer(&ctx, routes, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BODY_BYTES.max(8192) * 2)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
        Ok(Err(e)) => tracing::debug!("operator API: connection ended: {e}"),
        Err(_) => tracing::debug!("operator API: connection closed after {CONNECTION_LIFETIME:?}"),
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
async fn answer(
    ctx: &ApiContext,
    routes: Routes,
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
            Ok(Ok(collected)) => handle(
                ctx,
                parts.method.as_str(),
                parts.uri.path(),
                parts.uri.query(),
                &collected.to_bytes(),
            ),
        }
    };
    let mut out = hyper::Response::new(Full::new(Bytes::from(response.body)));
    *out.status_mut() =
        StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    out.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(response.content_type),
    );
    out
}

fn too_large() -> Response {
    Response::error(
        413,
        format!("the body is larger than {MAX_BODY_BYTES} bytes"),
    )
}
