//! The `stagevm` and `stagevm-remote` command lines, and starting them.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::running::{Run, Running};

/// Why a `stagevm` (or `stagevm-remote`) run could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The program could not be started (missing, not executable).
    #[error("starting {}: {source}", program.display())]
    Spawn {
        /// The program run: `stagevm`, or the wrapper around it.
        program: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for the process, or reading its output, failed.
    #[error("waiting for stagevm: {0}")]
    Wait(#[source] std::io::Error),
    /// The process did not exit in time; it was killed and reaped.
    #[error("stagevm did not exit within {timeout:?}; stdout so far: {stdout}")]
    Timeout {
        /// The time it had.
        timeout: Duration,
        /// What it wrote to a captured stdout the caller had not taken.
        stdout: String,
    },
    /// A signal could not be sent.
    #[error("signal {signal} to {pid}: {source}")]
    Signal {
        /// The process.
        pid: i32,
        /// The signal.
        signal: nix::sys::signal::Signal,
        /// The system's error.
        #[source]
        source: nix::Error,
    },
    /// A captured stream was asked for that is not piped, or was taken.
    #[error("stagevm's {0} is not piped or was taken already")]
    NoStream(&'static str),
    /// No console line started with `prefix` within `timeout`, or the
    /// output ended first.
    #[error("no line starting with '{prefix}' within {timeout:?}")]
    NoLine {
        /// The awaited start of a line.
        prefix: String,
        /// The time it had.
        timeout: Duration,
    },
    /// A line that rules out the awaited one came first (say, a guest's
    /// driver error instead of "ready").
    #[error("'{line}' came instead of a line starting with '{prefix}'")]
    Refused {
        /// The awaited start of a line.
        prefix: String,
        /// The line that came.
        line: String,
    },
}

/// The `stagevm` command line, built option by option, then run.
///
/// Options come out in this order: `--kernel`, `--cpus`, `--memory`,
/// `--disk`…, `--net`…, `--api-socket`, `--report`, the extra arguments
/// ([`Stagevm::arg`], [`Stagevm::args`]) as given, `--cmdline`. Standard
/// input is `/dev/null` and both outputs are piped unless set otherwise.
///
/// ```no_run
/// # fn main() -> Result<(), stagevm_testkit::LaunchError> {
/// use std::time::Duration;
/// let run = stagevm_testkit::Stagevm::new("target/release/stagevm")
///     .kernel("testguest")
///     .vcpus(2)
///     .cmdline("iters=1000 requests=0")
///     .run(Duration::from_secs(60))?;
/// assert!(run.status.success(), "{run:#?}");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Stagevm {
    binary: PathBuf,
    kernel: Option<PathBuf>,
    vcpus: Option<u32>,
    memory: Option<String>,
    disks: Vec<OsString>,
    nets: Vec<OsString>,
    api_socket: Option<PathBuf>,
    report: Option<PathBuf>,
    extra: Vec<OsString>,
    cmdline: Option<String>,
    env: Vec<(OsString, OsString)>,
    wrapper: Option<(OsString, Vec<OsString>)>,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
}

impl Stagevm {
    /// A command line for the `stagevm` binary at `binary` (the tests'
    /// `env!("CARGO_BIN_EXE_stagevm")`, a benchmark's `--stagevm`), with
    /// no options yet.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            kernel: None,
            vcpus: None,
            memory: None,
            disks: Vec::new(),
            nets: Vec::new(),
            api_socket: None,
            report: None,
            extra: Vec::new(),
            cmdline: None,
            env: Vec::new(),
            wrapper: None,
            stdin: None,
            stdout: None,
            stderr: None,
        }
    }

    /// `--kernel path`: the guest image.
    pub fn kernel(mut self, path: impl AsRef<Path>) -> Self {
        self.kernel = Some(path.as_ref().to_path_buf());
        self
    }

    /// `--cpus boot=n`: the number of vCPUs.
    pub fn vcpus(mut self, n: u32) -> Self {
        self.vcpus = Some(n);
        self
    }

    /// `--memory size=size`: guest RAM, in the VMM's notation (`256M`,
    /// `1G`).
    pub fn memory(mut self, size: &str) -> Self {
        self.memory = Some(size.to_string());
        self
    }

    /// One more `--disk spec` (`path=FILE[,readonly=on]…`).
    pub fn disk(mut self, spec: impl AsRef<OsStr>) -> Self {
        self.disks.push(spec.as_ref().to_os_string());
        self
    }

    /// One more `--net spec` (`tap=NAME[,mac=MAC]`).
    pub fn net(mut self, spec: impl AsRef<OsStr>) -> Self {
        self.nets.push(spec.as_ref().to_os_string());
        self
    }

    /// `--api-socket path`: the operator API's Unix socket.
    pub fn api_socket(mut self, path: impl AsRef<Path>) -> Self {
        self.api_socket = Some(path.as_ref().to_path_buf());
        self
    }

    /// `--report path`: the JSON report written at exit.
    pub fn report(mut self, path: impl AsRef<Path>) -> Self {
        self.report = Some(path.as_ref().to_path_buf());
        self
    }

    /// `--cmdline text`: the guest's command line.
    pub fn cmdline(mut self, text: &str) -> Self {
        self.cmdline = Some(text.to_string());
        self
    }

    /// One more argument, passed as it is (after the typed options).
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.extra.push(arg.as_ref().to_os_string());
        self
    }

    /// More arguments, passed as they are (after the typed options): a
    /// whole command line when no typed option is used.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.extra
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets `key=value` in the VMM's environment (for a wrapped run, the
    /// wrapper's, which passes it on).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Runs `program args… stagevm <its arguments>` instead of stagevm:
    /// `strace -f -o FILE`, `setpriv --reuid=…`, or `unshare … sh -c
    /// 'mount … && exec "$0" "$@"'` (the shell's `$0` is then the stagevm
    /// binary and `$@` its arguments). The [`Running`] child is then the
    /// wrapper; [`Running::vmm_pid`] finds the VMM under it, and a kill
    /// reaches both.
    pub fn wrap<I, S>(mut self, program: impl AsRef<OsStr>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args = args.into_iter().map(|a| a.as_ref().to_os_string());
        self.wrapper = Some((program.as_ref().to_os_string(), args.collect()));
        self
    }

    /// The VMM's standard input (default: `/dev/null`).
    pub fn stdin(mut self, stdin: impl Into<Stdio>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }

    /// The VMM's standard output, the guest's console (default: piped,
    /// captured by [`Running::wait`]).
    pub fn stdout(mut self, stdout: impl Into<Stdio>) -> Self {
        self.stdout = Some(stdout.into());
        self
    }

    /// The VMM's standard error, its messages (default: piped, captured by
    /// [`Running::wait`]).
    pub fn stderr(mut self, stderr: impl Into<Stdio>) -> Self {
        self.stderr = Some(stderr.into());
        self
    }

    /// stagevm's arguments, in the order the type's documentation gives.
    pub fn arguments(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut opt = |name: &str, value: &OsStr| {
            a.push(name.into());
            a.push(value.to_os_string());
        };
        if let Some(k) = &self.kernel {
            opt("--kernel", k.as_os_str());
        }
        if let Some(n) = self.vcpus {
            opt("--cpus", format!("boot={n}").as_ref());
        }
        if let Some(m) = &self.memory {
            opt("--memory", format!("size={m}").as_ref());
        }
        for d in &self.disks {
            opt("--disk", d);
        }
        for n in &self.nets {
            opt("--net", n);
        }
        if let Some(s) = &self.api_socket {
            opt("--api-socket", s.as_os_str());
        }
        if let Some(r) = &self.report {
            opt("--report", r.as_os_str());
        }
        a.extend(self.extra.iter().cloned());
        if let Some(c) = &self.cmdline {
            a.push("--cmdline".into());
            a.push(c.into());
        }
        a
    }

    /// The prepared command (wrapped, with its environment and standard
    /// streams), for a caller that must start it itself. Prefer
    /// [`Stagevm::spawn`]: a child started from this is not killed on drop.
    pub fn into_command(mut self) -> Command {
        let args = self.arguments();
        let mut cmd = match self.wrapper.take() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        cmd.args(args)
            .envs(self.env.drain(..))
            .stdin(self.stdin.take().unwrap_or_else(Stdio::null))
            .stdout(self.stdout.take().unwrap_or_else(Stdio::piped))
            .stderr(self.stderr.take().unwrap_or_else(Stdio::piped));
        cmd
    }

    /// Starts the VMM (or its wrapper). The [`Running`] child is killed and
    /// reaped when dropped.
    ///
    /// # Errors
    /// [`LaunchError::Spawn`]: the binary (or wrapper) cannot be started.
    pub fn spawn(self) -> Result<Running, LaunchError> {
        let program = match &self.wrapper {
            Some((w, _)) => PathBuf::from(w),
            None => self.binary.clone(),
        };
        let wrapped = self.wrapper.is_some();
        Running::spawn(self.into_command(), program, wrapped)
    }

    /// Starts the VMM and waits at most `timeout` for it to exit, capturing
    /// the output.
    ///
    /// # Errors
    /// As [`Stagevm::spawn`] and [`Running::wait`] (on timeout the VMM is
    /// killed).
    pub fn run(self, timeout: Duration) -> Result<Run, LaunchError> {
        self.spawn()?.wait(timeout)
    }

    /// Starts the VMM and waits for it to exit however long it takes (as
    /// `Command::output`), capturing the output: for benchmark runs whose
    /// length is the point.
    ///
    /// # Errors
    /// As [`Stagevm::spawn`] and [`Running::finish`].
    pub fn output(self) -> Result<Run, LaunchError> {
        self.spawn()?.finish()
    }
}

/// `stagevm-remote`, the operator API's command-line client, against one
/// API socket.
#[derive(Clone, Debug)]
pub struct Remote {
    binary: PathBuf,
    socket: PathBuf,
}

impl Remote {
    /// The client at `binary` (the tests'
    /// `env!("CARGO_BIN_EXE_stagevm-remote")`) for the API served on
    /// `socket`.
    pub fn new(binary: impl Into<PathBuf>, socket: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            socket: socket.into(),
        }
    }

    /// Runs `stagevm-remote --api-socket SOCKET args…` to its end (at most
    /// 60 s), its output captured.
    ///
    /// # Errors
    /// The client cannot be started, or did not end in 60 s (it is then
    /// killed).
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<Run, LaunchError> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--api-socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Running::spawn(cmd, self.binary.clone(), false)?.wait(Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::Stagevm;

    #[test]
    fn options_come_out_in_their_documented_order() {
        let s = Stagevm::new("/bin/stagevm")
            .cmdline("iters=1")
            .arg("--policy")
            .report("/tmp/r.json")
            .net("tap=t0")
            .disk("path=/d")
            .memory("64M")
            .vcpus(2)
            .kernel("/g")
            .api_socket("/tmp/s")
            .args(["--stages", "/s.toml"]);
        let a: Vec<String> = s
            .arguments()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            a,
            [
                "--kernel",
                "/g",
                "--cpus",
                "boot=2",
                "--memory",
                "size=64M",
                "--disk",
                "path=/d",
                "--net",
                "tap=t0",
                "--api-socket",
                "/tmp/s",
                "--report",
                "/tmp/r.json",
                "--policy",
                "--stages",
                "/s.toml",
                "--cmdline",
                "iters=1"
            ]
        );
    }

    #[test]
    fn a_wrapper_comes_first_and_the_binary_after_its_arguments() {
        let cmd = Stagevm::new("/bin/stagevm")
            .kernel("/g")
            .wrap("strace", ["-f", "-o", "/tmp/t"])
            .into_command();
        assert_eq!(cmd.get_program(), "strace");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            ["-f", "-o", "/tmp/t", "/bin/stagevm", "--kernel", "/g"]
        );
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error() {
        let e = Stagevm::new("/nonexistent/stagevm").spawn().unwrap_err();
        assert!(
            e.to_string().starts_with("starting /nonexistent/stagevm: "),
            "{e}"
        );
    }
}
