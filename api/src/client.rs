//! A small client of the operator API, used by `stagevm-remote` and the
//! API benchmark: one HTTP/1.1 request per connection over the Unix socket,
//! with hyper's client on a current-thread tokio runtime.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The runtime could not be created.
    #[error("starting the client: {0}")]
    Runtime(std::io::Error),
    /// The socket could not be reached.
    #[error("--api-socket {0}: {1}")]
    Connect(String, std::io::Error),
    /// The request could not be built (a bad method or path).
    #[error("building the request: {0}")]
    Request(#[from] hyper::http::Error),
    /// The exchange failed (the VMM closed the connection, a bad answer).
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// No whole answer within the time given ([`Client::request_within`]).
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// An answer larger than [`MAX_BOUNDED_ANSWER`] bytes
    /// ([`Client::request_within`]).
    #[error("an answer over {0} bytes")]
    TooLarge(usize),
    /// The answer's body could not be read.
    #[error("reading the answer: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Largest answer [`Client::request_within`] reads (bytes): a peer it does
/// not trust (any socket in the host daemon's directory) can send no more
/// than this, and no longer than its timeout.
pub const MAX_BOUNDED_ANSWER: usize = 4 << 20;

/// An answer: HTTP status and body.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

/// A client of one VMM's API socket.
pub struct Client {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client of the API served on `socket`. Errors: the runtime cannot
    /// be created.
    pub fn new(socket: &Path) -> Result<Self, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        Ok(Self {
            socket: socket.to_path_buf(),
            runtime,
        })
    }

    /// Sends `method path` with `body` (JSON) on a new connection and waits
    /// for the whole answer. Errors: see [`ClientError`]; an error status
    /// is an [`Answer`], not an error.
    pub fn request(&self, method: &str, path: &str, body: Vec<u8>) -> Result<Answer, ClientError> {
        self.runtime
            .block_on(request(&self.socket, method, path, body, None))
    }

    /// [`Client::request`] bounded by `timeout` from connect to the last
    /// byte and by [`MAX_BOUNDED_ANSWER`] bytes (a socket that accepts and
    /// never answers, or answers without end, for the host daemon).
    /// Errors: as `request`, [`ClientError::Timeout`] and
    /// [`ClientError::TooLarge`].
    pub fn request_within(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        timeout: std::time::Duration,
    ) -> Result<Answer, ClientError> {
        self.runtime.block_on(async {
            let limit = Some(MAX_BOUNDED_ANSWER);
            tokio::time::timeout(timeout, request(&self.socket, method, path, body, limit))
                .await
                .map_err(|_| ClientError::Timeout(timeout))?
        })
    }
}

async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Vec<u8>,
    limit: Option<usize>,
) -> Result<Answer, ClientError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| ClientError::Connect(socket.display().to_string(), e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let res = sender.send_request(req).await?;
    let status = res.status().as_u16();
    let body = match limit {
        None => res.into_body().collect().await?.to_bytes(),
        Some(max) => http_body_util::Limited::new(res.into_body(), max)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ClientError::TooLarge(max)
                } else {
                    ClientError::Body(e)
                }
            })?
            .to_bytes(),
    };
    conn.abort();
    Ok(Answer { status, body })
}
