//! One capture: the server under Valgrind's stgtrace tool, a load command
//! driving it inside a traced window, bounded in time (`--duration`) and in
//! traced instructions (`--max-instrs`), and the server stopped afterwards
//! whatever happens (an error, a panic or Ctrl-C: a drop guard over the children).
//!
//! The window opens when the control file exists at a request's start (the
//! tool checks it at every entry of a `T` function of its table) and closes
//! at the first request start after it is removed or after the bound; the
//! trace streams through a FIFO into a zstd-compressed file as it is made.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::server_proc::{listens, other_executables};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// How often the child processes are polled.
const POLL: Duration = Duration::from_millis(100);

/// Longest single try of the `--ready` command.
const READY_TRY: Duration = Duration::from_secs(10);

/// Lines of a failing program's output shown in an error.
const TAIL_LINES: usize = 20;

/// What to run and how far.
#[derive(Clone, Debug)]
pub struct CaptureSpec {
    /// The server's command line (program first).
    pub server: Vec<OsString>,
    /// The basename of the binary the table's addresses refer to (`--exe`).
    pub exe_name: String,
    /// That binary's path, links resolved: once the server is ready, a
    /// server that has not mapped it is named in a warning.
    pub binary: PathBuf,
    /// The tool's stage table (`HEXADDR STAGE FLAGS NAME` lines).
    pub table: String,
    /// Shell command retried every 0.5 s until it succeeds: the server is
    /// ready. `None`: ready once the server listens on a TCP port.
    pub ready: Option<String>,
    /// Shell command run before the window opens (not traced).
    pub warmup: Option<String>,
    /// The load: a shell command run while the window is open.
    pub load: String,
    /// Shell command run after the window is asked to close (a request
    /// that makes the server end the window at a request's start).
    pub close: Option<String>,
    /// Longest wait for readiness.
    pub ready_timeout: Duration,
    /// Longest load: a load still running then is stopped (not an error).
    pub duration: Duration,
    /// Longest wait for the server to exit after SIGTERM, then SIGKILL.
    pub stop_timeout: Duration,
    /// Bound on the traced instructions (0: none).
    pub max_instrs: u64,
    /// Folder for `trace.zst`, `stgtrace.stats`, `valgrind.log`,
    /// `server.out`, `load.out`.
    pub work: PathBuf,
    /// `VALGRIND_LIB` ([`crate::tools::ValgrindLib`]).
    pub valgrind_lib: PathBuf,
}

/// What a capture left.
#[derive(Clone, Debug)]
pub struct Captured {
    /// The zstd-compressed stagetrace v1 file.
    pub trace: PathBuf,
    /// The binary's load bias under Valgrind (trace address = file address + bias).
    pub text_bias: Option<u64>,
    /// The tool's counters (`stgtrace.stats`: `key = value`).
    pub stats: BTreeMap<String, u64>,
    /// Seconds the load ran (at most `--duration`).
    pub load_seconds: f64,
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The server exited before the capture was done.
    #[error("the server exited early ({status}) {when}; its output (last lines):\n{output}")]
    ServerExited {
        /// Its exit status.
        status: ExitStatus,
        /// In which step.
        when: &'static str,
        /// The tail of its output and of Valgrind's log.
        output: String,
    },
    /// The server was not ready in time.
    #[error(
        "the server was not ready within {secs} s ({how}); its output (last lines):\n{output}"
    )]
    NotReady {
        /// The timeout, s.
        secs: u64,
        /// What was waited for.
        how: String,
        /// The tail of its output.
        output: String,
    },
    /// A command (warm-up, load, close) failed.
    #[error("the {which} command `{cmd}` failed ({status}); its output (last lines):\n{output}")]
    CommandFailed {
        /// Which command.
        which: &'static str,
        /// The command.
        cmd: String,
        /// Its exit status, or why it was stopped.
        status: String,
        /// The tail of its output.
        output: String,
    },
    /// Interrupted by SIGINT or SIGTERM.
    #[error("interrupted")]
    Interrupted,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CaptureError {
    let what = what.into();
    move |source| CaptureError::Io { what, source }
}

/// Set by SIGINT/SIGTERM; the polling loops stop on it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM so a capture stops its children before exiting.
pub fn catch_interrupts() {
    let action = signal::SigAction::new(
        signal::SigHandler::Handler(on_signal),
        signal::SaFlags::empty(),
        signal::SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        let _ = unsafe { signal::sigaction(s, &action) };
    }
}

/// The last `n` lines of the file at `path` (at most its last 64 KiB).
pub fn tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A shell command's child, its process group killed on drop.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            if let Ok(pid) = i32::try_from(self.0.id()) {
                let _ = signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = self.0.wait();
        }
    }
}

/// The server and the load, stopped on drop: the load's process group
/// killed, the server sent SIGTERM, then SIGKILL after the stop timeout.
struct Children {
    server: Option<Child>,
    load: Option<Group>,
    stop_timeout: Duration,
}

impl Children {
    /// Kills the load's process group if it still runs ([`Group`]'s drop).
    fn stop_load(&mut self) {
        self.load = None;
    }

    /// SIGTERM (Valgrind passes it to the server), then SIGKILL.
    fn stop_server(&mut self) -> Option<ExitStatus> {
        let mut c = self.server.take()?;
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < self.stop_timeout {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(POLL);
        }
        tracing::warn!(
            "the server did not exit within {} s of SIGTERM: killed",
            self.stop_timeout.as_secs()
        );
        let _ = c.kill();
        c.wait().ok()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop_load();
        self.stop_server();
    }
}

/// A shell command with its output to `out`, in a process group of its own.
fn shell(cmd: &str, out: &Path) -> Result<Command, CaptureError> {
    let f = File::create(out).map_err(io(out.display().to_string()))?;
    let e = f.try_clone().map_err(io(out.display().to_string()))?;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(e);
    c.process_group(0);
    Ok(c)
}

/// Runs a shell command to its end, at most `limit` (the server must stay
/// up meanwhile): `Ok(None)` when it ran out of time (its process group is
/// killed), else its exit status.
fn run_bounded(
    ch: &mut Children,
    which: &'static str,
    cmd: &str,
    out: &Path,
    limit: Duration,
    spec: &CaptureSpec,
) -> Result<Option<ExitStatus>, CaptureError> {
    let mut c = Group(
        shell(cmd, out)?
            .spawn()
            .map_err(io(format!("{which}: sh -c")))?,
    );
    let t0 = Instant::now();
    loop {
        if let Some(status) = c.0.try_wait().map_err(io(which))? {
            return Ok(Some(status));
        }
        check_server(ch, which, spec)?;
        if t0.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// Runs a step's shell command (warm-up, close): it must succeed within
/// `--ready-timeout`.
fn run_step(
    ch: &mut Children,
    which: &'static str,
    cmd: &str,
    out: &Path,
    spec: &CaptureSpec,
) -> Result<(), CaptureError> {
    match run_bounded(ch, which, cmd, out, spec.ready_timeout, spec)? {
        Some(status) if status.success() => Ok(()),
        status => Err(CaptureError::CommandFailed {
            which,
            cmd: cmd.to_string(),
            status: status.map_or_else(
                || {
                    format!(
                        "still running after {} s: stopped",
                        spec.ready_timeout.as_secs()
                    )
                },
                |s| s.to_string(),
            ),
            output: tail(out, TAIL_LINES),
        }),
    }
}

/// Fails if the server has exited or the user interrupted.
fn check_server(
    ch: &mut Children,
    when: &'static str,
    spec: &CaptureSpec,
) -> Result<(), CaptureError> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(CaptureError::Interrupted);
    }
    let server = ch.server.as_mut().expect("server running");
    if let Some(status) = server.try_wait().map_err(io("waiting for the server"))? {
        ch.server = None;
        return Err(CaptureError::ServerExited {
            status,
            when,
            output: server_output(spec),
        });
    }
    Ok(())
}

/// The tails of the server's output and of Valgrind's log.
fn server_output(spec: &CaptureSpec) -> String {
    format!(
        "{}\n--- valgrind.log:\n{}",
        tail(&spec.work.join("server.out"), TAIL_LINES),
        tail(&spec.work.join("valgrind.log"), 8)
    )
}

/// Reads the FIFO into a zstd file until the writer closes it.
fn compressor(fifo: PathBuf, out: PathBuf) -> JoinHandle<std::io::Result<u64>> {
    std::thread::spawn(move || {
        let mut r = File::open(&fifo)?;
        let f = File::create(&out)?;
        let mut enc = zstd::Encoder::new(f, 3)?;
        let n = std::io::copy(&mut r, &mut enc)?;
        enc.finish()?;
        Ok(n)
    })
}

/// Lets a compressor still blocked in `open` (the tool never opened the
/// FIFO) see end of file: opens the writing end without blocking and
/// closes it (`ENXIO` when nobody reads: nothing to do).
fn release_fifo(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
}

/// Runs the capture described by `spec`; `progress` gets a line per step.
///
/// Errors: [`CaptureError`] — the server exiting early or not getting
/// ready, a failing command, an interrupt, or a file operation.
pub fn run(spec: &CaptureSpec, progress: &mut dyn FnMut(&str)) -> Result<Captured, CaptureError> {
    let w = &spec.work;
    std::fs::create_dir_all(w).map_err(io(w.display().to_string()))?;
    let (table, fifo, ctl) = (w.join("stages.tbl"), w.join("trace.fifo"), w.join("ctl"));
    let (stats, vglog, trace) = (
        w.join("stgtrace.stats"),
        w.join("valgrind.log"),
        w.join("trace.zst"),
    );
    std::fs::write(&table, &spec.table).map_err(io(table.display().to_string()))?;
    for p in [&fifo, &ctl, &stats] {
        let _ = std::fs::remove_file(p);
    }
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(|e| {
        CaptureError::Io {
            what: format!("mkfifo {}", fifo.display()),
            source: e.into(),
        }
    })?;
    let comp = compressor(fifo.clone(), trace.clone());

    let mut cmd = Command::new("valgrind");
    cmd.env("VALGRIND_LIB", &spec.valgrind_lib)
        .arg("--tool=stgtrace")
        .arg(format!("--log-file={}", vglog.display()))
        .arg(format!("--out={}", fifo.display()))
        .arg(format!("--stages={}", table.display()))
        .arg(format!("--exe={}", spec.exe_name))
        .arg(format!("--ctl-file={}", ctl.display()))
        .arg(format!("--stats-file={}", stats.display()))
        .arg(format!("--max-instrs={}", spec.max_instrs))
        .args(&spec.server)
        .stdin(Stdio::null());
    let out = File::create(w.join("server.out")).map_err(io("server.out"))?;
    let err = out.try_clone().map_err(io("server.out"))?;
    cmd.stdout(out).stderr(err);
    let server = cmd
        .spawn()
        .map_err(io("valgrind (install Debian's valgrind package)"))?;
    let mut ch = Children {
        server: Some(server),
        load: None,
        stop_timeout: spec.stop_timeout,
    };
    let result = drive(spec, &mut ch, &ctl, progress);
    // The server stops in any case; the window is closed by its exit.
    let _ = std::fs::remove_file(&ctl);
    ch.stop_load();
    if result.is_ok() {
        progress("stopping the server (SIGTERM)");
    }
    let status = ch.stop_server();
    release_fifo(&fifo);
    let written = comp.join().map_err(|_| CaptureError::Io {
        what: "the trace compressor".into(),
        source: std::io::Error::other("panicked"),
    });
    let _ = std::fs::remove_file(&fifo);
    let load_seconds = result?;
    let written = written?.map_err(io(format!("writing {}", trace.display())))?;
    tracing::debug!("server exit {status:?}; {written} trace bytes before compression");
    let log = std::fs::read_to_string(&vglog).unwrap_or_default();
    Ok(Captured {
        trace,
        text_bias: text_bias(&log),
        stats: parse_stats(&std::fs::read_to_string(&stats).unwrap_or_default()),
        load_seconds,
    })
}

/// Readiness, warm-up, the window with the load, and the close command;
/// returns the seconds the load ran.
fn drive(
    spec: &CaptureSpec,
    ch: &mut Children,
    ctl: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<f64, CaptureError> {
    let w = &spec.work;
    let how = spec
        .ready
        .as_ref()
        .map_or("a listening TCP socket".to_string(), |c| {
            format!("`{c}` succeeding")
        });
    progress(&format!(
        "starting the server under Valgrind; waiting for {how}"
    ));
    let t0 = Instant::now();
    loop {
        check_server(ch, "before it was ready", spec)?;
        let pid = ch.server.as_ref().map_or(0, Child::id);
        let ready = match &spec.ready {
            None => listens(pid),
            // One try at most READY_TRY; a hung one counts as not ready.
            Some(c) => run_bounded(ch, "ready", c, &w.join("ready.out"), READY_TRY, spec)?
                .is_some_and(|s| s.success()),
        };
        if ready {
            break;
        }
        if t0.elapsed() > spec.ready_timeout {
            return Err(CaptureError::NotReady {
                secs: spec.ready_timeout.as_secs(),
                how,
                output: server_output(spec),
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    progress(&format!(
        "server ready after {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    if let Some(mapped) = other_executables(ch.server.as_ref().map_or(0, Child::id), &spec.binary) {
        progress(&format!(
            "warning: the server has not mapped {} (--binary): its executable mappings are {}; \
             nothing will be traced unless --binary names the file the server runs",
            spec.binary.display(),
            if mapped.is_empty() {
                "none".to_string()
            } else {
                mapped.join(", ")
            }
        ));
    }
    if let Some(c) = &spec.warmup {
        progress("warm-up (not traced)");
        run_step(ch, "warm-up", c, &w.join("warmup.out"), spec)?;
    }
    File::create(ctl).map_err(io(ctl.display().to_string()))?;
    progress(&format!(
        "window open; load `{}` (at most {} s)",
        spec.load,
        spec.duration.as_secs()
    ));
    let load_out = w.join("load.out");
    ch.load = Some(Group(
        shell(&spec.load, &load_out)?
            .spawn()
            .map_err(io("the load: sh -c"))?,
    ));
    let t1 = Instant::now();
    loop {
        let load = ch.load.as_mut().expect("load running");
        if let Some(status) = load.0.try_wait().map_err(io("the load"))? {
            ch.load = None;
            if !status.success() {
                return Err(CaptureError::CommandFailed {
                    which: "load",
                    cmd: spec.load.clone(),
                    status: status.to_string(),
                    output: tail(&load_out, TAIL_LINES),
                });
            }
            break;
        }
        check_server(ch, "while the load ran", spec)?;
        if t1.elapsed() > spec.duration {
            progress(&format!(
                "--duration {} s reached: the load is stopped",
                spec.duration.as_secs()
            ));
            ch.stop_load();
            break;
        }
        std::thread::sleep(POLL);
    }
    let secs = t1.elapsed().as_secs_f64();
    std::fs::remove_file(ctl).map_err(io(ctl.display().to_string()))?;
    if let Some(c) = &spec.close {
        run_step(ch, "close", c, &w.join("close.out"), spec)?;
    }
    progress(&format!("window closed after {secs:.1} s of load"));
    Ok(secs)
}

/// The load bias the tool logged (`stgtrace: … text bias 0x…`).
pub fn text_bias(log: &str) -> Option<u64> {
    let at = log.find("text bias 0x")? + "text bias 0x".len();
    let hex: String = log[at..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&hex, 16).ok()
}

/// `key = value` lines with integer values.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_log_and_stats_are_read() {
        let log = "==1== stgtrace: /srv/a.out text bias 0x108000, stage functions 0x1..0x2\n";
        assert_eq!(text_bias(log), Some(0x108000));
        assert_eq!(text_bias("nothing"), None);
        let s = parse_stats("windows = 1\nraw_bytes = 42\nbad = x\n");
        assert_eq!(s.get("windows"), Some(&1));
        assert_eq!(s.get("raw_bytes"), Some(&42));
        assert!(!s.contains_key("bad"));
    }
}
