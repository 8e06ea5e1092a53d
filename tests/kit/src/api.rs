//! Calls to a running VMM's operator API (`--api-socket`) through the
//! VMM's own client, `stagevm_api::client` (the one `stagevm-remote`
//! uses): one HTTP/1.1 request per connection.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use stagevm_api::client::{Answer, ClientError};

/// Why an API call gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The client failed (socket unreachable, connection closed, bad
    /// request).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The socket did not accept a connection in time.
    #[error("the API socket {} did not answer within {timeout:?}", socket.display())]
    NotReady {
        /// The socket.
        socket: PathBuf,
        /// The time it had.
        timeout: Duration,
    },
    /// An answer with a status other than the one expected.
    #[error("{method} {path}: status {status}: {body}")]
    Status {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
        /// The status received.
        status: u16,
        /// The answer's body.
        body: String,
    },
    /// A body that is not the JSON expected.
    #[error("GET {path}: {source}: {body}")]
    Json {
        /// The request's path.
        path: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
        /// The answer's body.
        body: String,
    },
}

/// A client of one VMM's API socket.
pub struct Api {
    client: stagevm_api::client::Client,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

impl Api {
    /// A client of the API served on `socket` (nothing is sent yet).
    ///
    /// # Errors
    /// [`ApiError::Client`]: the client's runtime cannot be created.
    pub fn new(socket: &Path) -> Result<Self, ApiError> {
        Ok(Self {
            client: stagevm_api::client::Client::new(socket)?,
        })
    }

    /// Waits until `socket` accepts a connection (looking every 10 ms, at
    /// most `timeout`), then returns a client of it: for a VMM just
    /// started with `--api-socket`.
    ///
    /// # Errors
    /// [`ApiError::NotReady`], or as [`Api::new`].
    pub fn wait_ready(socket: &Path, timeout: Duration) -> Result<Self, ApiError> {
        let deadline = Instant::now() + timeout;
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if Instant::now() > deadline {
                return Err(ApiError::NotReady {
                    socket: socket.to_path_buf(),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Self::new(socket)
    }

    /// `method path` with `body` (JSON); the answer whatever its status.
    ///
    /// # Errors
    /// [`ApiError::Client`].
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Result<Answer, ApiError> {
        Ok(self.client.request(method, path, body.to_vec())?)
    }

    /// `method path` with `body`, expecting `status`; the answer's body as
    /// text.
    ///
    /// # Errors
    /// [`ApiError::Status`] for another status, or [`ApiError::Client`].
    pub fn expect(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        status: u16,
    ) -> Result<String, ApiError> {
        let a = self.request(method, path, body)?;
        let text = String::from_utf8_lossy(&a.body).into_owned();
        if a.status != status {
            return Err(ApiError::Status {
                method: method.to_string(),
                path: path.to_string(),
                status: a.status,
                body: text,
            });
        }
        Ok(text)
    }

    /// `GET path`, expecting 200; the body as text.
    ///
    /// # Errors
    /// As [`Api::expect`].
    pub fn get(&self, path: &str) -> Result<String, ApiError> {
        self.expect("GET", path, b"", 200)
    }

    /// `GET path`, expecting 200 and a JSON body that decodes as `T`.
    ///
    /// # Errors
    /// As [`Api::get`], or [`ApiError::Json`].
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let body = self.get(path)?;
        serde_json::from_str(&body).map_err(|source| ApiError::Json {
            path: path.to_string(),
            source,
            body,
        })
    }

    /// `PUT path body`, expecting 202 (accepted); the body as text.
    ///
    /// # Errors
    /// As [`Api::expect`].
    pub fn put(&self, path: &str, body: &[u8]) -> Result<String, ApiError> {
        self.expect("PUT", path, body, 202)
    }
}

/// The value of the sample `name{labels}` (`labels` as written between
/// the braces, e.g. `device="net0"`) in a Prometheus text exposition.
pub fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// What `promtool check metrics` (the Prometheus project's linter,
/// Debian's `prometheus` package) says of `scrape`: `None` when promtool
/// is not installed (the caller says "skipped"), else whether it passed —
/// exit 0 and nothing printed — and what it printed.
///
/// # Panics
/// When promtool starts but cannot be fed or waited for.
pub fn promtool_check(scrape: &str) -> Option<(bool, String)> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(scrape.as_bytes())
        .expect("promtool reads its input");
    let out = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success() && said.trim().is_empty(), said))
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_finds_one_labelled_sample() {
        let text = "# HELP x\nstagevm_net_tx_packets_total{device=\"net0\"} 42\nstagevm_net_tx_packets_total{device=\"net1\"} 7\n";
        assert_eq!(
            super::metric(text, "stagevm_net_tx_packets_total", "device=\"net1\""),
            Some(7.0)
        );
        assert_eq!(super::metric(text, "absent", ""), None);
    }

    #[test]
    fn a_socket_nobody_serves_is_not_ready() {
        let socket = crate::temp_path("kit-api", "sock");
        let e = super::Api::wait_ready(&socket, std::time::Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, super::ApiError::NotReady { .. }), "{e}");
    }
}
