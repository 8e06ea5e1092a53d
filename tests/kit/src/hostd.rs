//! `stagevm-hostd`, the host daemon, started the one way the tests and
//! benchmarks start it: its output captured, killed and reaped on drop.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{LaunchError, Running};

/// A `stagevm-hostd` command line.
#[derive(Clone, Debug)]
pub struct Hostd {
    binary: PathBuf,
    args: Vec<OsString>,
}

impl Hostd {
    /// The daemon at `binary` (the tests' `env!("CARGO_BIN_EXE_stagevm-hostd")`)
    /// for the VMs whose API sockets are in `vm_dir`.
    pub fn new(binary: impl Into<PathBuf>, vm_dir: &Path) -> Self {
        Self {
            binary: binary.into(),
            args: vec!["--vm-dir".into(), vm_dir.into()],
        }
    }

    /// `--config FILE` (host.toml).
    pub fn config(mut self, file: &Path) -> Self {
        self.args.extend(["--config".into(), file.into()]);
        self
    }

    /// `--api-socket PATH` (its own view).
    pub fn api_socket(mut self, path: &Path) -> Self {
        self.args.extend(["--api-socket".into(), path.into()]);
        self
    }

    /// Starts it, stdin `/dev/null`, stdout and stderr piped (its log is
    /// on stderr). The [`Running`] child is killed and reaped when dropped.
    ///
    /// # Errors
    /// [`LaunchError::Spawn`]: the binary cannot be started.
    pub fn spawn(self) -> Result<Running, LaunchError> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Running::spawn(cmd, self.binary, false)
    }
}
