//! The API's listening socket: bound before the VM boots (so a bad path
//! fails at start), readable and writable by the owner only, never taken
//! from a live server, and removed when the VMM ends.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why `--api-socket PATH` cannot be used; each message names the path.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another process serves on the path.
    #[error("--api-socket {0}: in use by a running process (a connection to it succeeded)")]
    InUse(String),
    /// The path exists and is not a socket.
    #[error("--api-socket {0}: exists and is not a socket")]
    NotASocket(String),
    /// Binding, removing a stale socket or setting the mode failed (the
    /// path, and why: `crate::paths::describe_path_error`).
    #[error("--api-socket {0}: {1}")]
    Io(String, String),
}

/// A bound API socket; its path is removed when this is dropped.
#[derive(Debug)]
pub struct ApiSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl ApiSocket {
    /// Binds `path` with mode 0600. A socket file left by a VMM that ended
    /// (nothing accepts on it) is replaced. Errors: a live server holds the
    /// path, the path is not a socket, or the bind fails (each naming it).
    ///
    /// Call it while the process has one thread: the bind runs under
    /// `umask(0o177)`, so the socket is never reachable with wider
    /// permissions, and `umask` is process-wide.
    pub fn bind(path: &Path) -> Result<Self, SocketError> {
        let name = path.display().to_string();
        let io = |e: std::io::Error| {
            SocketError::Io(name.clone(), crate::paths::describe_path_error(path, &e))
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => return Err(SocketError::NotASocket(name)),
            Ok(_) => match UnixStream::connect(path) {
                Ok(_) => return Err(SocketError::InUse(name)),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    tracing::info!("--api-socket {name}: replacing a stale socket");
                    std::fs::remove_file(path).map_err(io)?;
                }
                Err(e) => return Err(io(e)),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = crate::paths::bind_owner_only(path).map_err(io)?;
        Ok(Self {
            path: path.to_path_buf(),
            listener: Some(listener),
        })
    }

    /// The listener, for the `api` thread (once).
    pub fn take_listener(&mut self) -> Option<UnixListener> {
        self.listener.take()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != ErrorKind::NotFound {
                tracing::warn!("--api-socket {}: cannot remove: {e}", self.path.display());
            }
        }
    }
}

/// Binds `--metrics-listen VALUE`: `PORT` (on 127.0.0.1) or `ADDR:PORT`
/// (any address, only when given explicitly; `[::1]:PORT` for IPv6).
/// Errors name the value: not an address, or the bind failed (in use, not
/// an address of this host, a port below 1024 without the right).
pub fn bind_metrics(value: &str) -> Result<std::net::TcpListener, MetricsListenError> {
    let addr: std::net::SocketAddr = match value.parse::<u16>() {
        Ok(port) => (std::net::Ipv4Addr::LOCALHOST, port).into(),
        Err(_) => value
            .parse()
            .map_err(|_| MetricsListenError::BadValue(value.to_string()))?,
    };
    std::net::TcpListener::bind(addr).map_err(|source| MetricsListenError::Bind {
        value: value.to_string(),
        source,
    })
}

/// Why `--metrics-listen VALUE` cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsListenError {
    /// Neither a port nor a socket address.
    #[error("--metrics-listen {0}: not PORT or ADDR:PORT (e.g. 9100 or 127.0.0.1:9100)")]
    BadValue(String),
    /// The bind failed.
    #[error("--metrics-listen {value}: {source}")]
    Bind {
        /// The value given.
        value: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}
