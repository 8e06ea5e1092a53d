//! A started `stagevm`: waiting for it with a time limit, its console
//! lines as they come, signals, and the kill on drop.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::launch::LaunchError;

/// How often a bounded wait looks whether the child has exited.
const POLL: Duration = Duration::from_millis(5);

/// What a finished run produced.
#[derive(Debug)]
pub struct Run {
    /// Exit status.
    pub status: ExitStatus,
    /// The guest's console (stdout), as far as it was captured and not
    /// taken by the caller.
    pub stdout: String,
    /// The VMM's messages (stderr), likewise.
    pub stderr: String,
    /// Wall time from the start of the process to its exit.
    pub elapsed: Duration,
}

impl Run {
    /// The exit code.
    ///
    /// # Panics
    /// When a signal ended the process (the message shows the run).
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("stagevm killed by a signal: {self:#?}"))
    }

    /// Whether the VMM's messages show a Rust panic.
    pub fn panicked(&self) -> bool {
        self.stderr.contains("panicked")
    }

    /// Asserts the VMM did not panic.
    ///
    /// # Panics
    /// When it did (the message shows its stderr).
    pub fn assert_no_panic(&self) {
        assert!(!self.panicked(), "stagevm panicked: {}", self.stderr);
    }
}

/// How a child ended, reaped with its resource usage (`wait4(2)`).
#[derive(Clone, Copy, Debug)]
pub struct Reaped {
    /// Exit status.
    pub status: ExitStatus,
    /// Peak resident set size (KiB, `ru_maxrss`): the VMM's, guest pages
    /// it touched included.
    pub max_rss_kib: u64,
    /// When `wait4` returned.
    pub at: Instant,
}

/// A running `stagevm` (or the program wrapping it). Dropping it kills the
/// process (and, for a wrapped run, the processes under it) with SIGKILL
/// and reaps it, unless it was already waited for: no test or benchmark
/// leaves a VM running behind it.
#[derive(Debug)]
pub struct Running {
    child: Child,
    program: PathBuf,
    wrapped: bool,
    started: Instant,
    reaped: bool,
}

/// Reads `stream` to its end on a thread of its own ("" without one).
fn collect(stream: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut stream) = stream {
            let mut bytes = Vec::new();
            let _ = stream.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    })
}

/// The processes under `pid`, deepest first (`/proc/<pid>/task/*/children`).
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in text.split_whitespace().filter_map(|c| c.parse().ok()) {
            out.extend(descendants(child));
            out.push(child);
        }
    }
    out
}

impl Running {
    /// Starts `cmd`; `program` names it in errors, `wrapped` says whether
    /// the VMM runs under it rather than being it.
    pub(crate) fn spawn(
        mut cmd: Command,
        program: PathBuf,
        wrapped: bool,
    ) -> Result<Self, LaunchError> {
        let started = Instant::now();
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            program: program.clone(),
            source,
        })?;
        Ok(Self {
            child,
            program,
            wrapped,
            started,
            reaped: false,
        })
    }

    /// The process id of the child (the wrapper, for a wrapped run).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The program started (`stagevm`, or its wrapper).
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// When the process was started (just before `fork`).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The VMM's process id: the child's own, or for a wrapped run the
    /// first process the wrapper started (`strace`'s tracee), or the
    /// wrapper's if it has none (`setpriv`, `unshare` and `sh -c 'exec …'`
    /// become stagevm).
    pub fn vmm_pid(&self) -> Pid {
        let pid = self.child.id();
        if self.wrapped {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(c) = children.split_whitespace().next() {
                if let Ok(c) = c.parse() {
                    return Pid::from_raw(c);
                }
            }
        }
        Pid::from_raw(pid as i32)
    }

    /// Sends `signal` to the VMM ([`Running::vmm_pid`]).
    ///
    /// # Errors
    /// [`LaunchError::Signal`]: `kill(2)` failed (the process is gone).
    pub fn signal(&self, signal: Signal) -> Result<(), LaunchError> {
        let pid = self.vmm_pid();
        kill(pid, signal).map_err(|source| LaunchError::Signal {
            pid: pid.as_raw(),
            signal,
            source,
        })
    }

    /// Takes the captured stdout (the guest's console) to read it
    /// directly; [`Running::wait`] then reports it empty. `None` when it
    /// is not piped or was taken.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes the captured stderr, as [`Running::take_stdout`].
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// The console's (stdout's) lines as they come, read to the end on a
    /// thread of their own.
    ///
    /// # Errors
    /// [`LaunchError::NoStream`]: stdout is not piped or was taken.
    pub fn stdout_lines(&mut self) -> Result<Lines, LaunchError> {
        let out = self.take_stdout().ok_or(LaunchError::NoStream("stdout"))?;
        Ok(Lines::read(out))
    }

    /// The VMM's messages (stderr) line by line, as [`Running::stdout_lines`].
    ///
    /// # Errors
    /// [`LaunchError::NoStream`]: stderr is not piped or was taken.
    pub fn stderr_lines(&mut self) -> Result<Lines, LaunchError> {
        let err = self.take_stderr().ok_or(LaunchError::NoStream("stderr"))?;
        Ok(Lines::read(err))
    }

    /// The exit status if the process has exited (and reaps it), else
    /// `None`.
    ///
    /// # Errors
    /// [`LaunchError::Wait`]: `waitpid` failed.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
        self.child.try_wait().map_err(LaunchError::Wait)
    }

    /// SIGKILL to the processes under a wrapped run, then to the child.
    fn kill_all(&mut self) {
        if self.wrapped {
            for pid in descendants(self.child.id()) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        let _ = self.child.kill();
    }

    /// Waits at most `timeout` for the exit, reading what is left of the
    /// captured outputs meanwhile.
    ///
    /// # Errors
    /// [`LaunchError::Timeout`] (the process was killed and reaped; the
    /// error holds the stdout so far), [`LaunchError::Wait`].
    pub fn wait(mut self, timeout: Duration) -> Result<Run, LaunchError> {
        let out = collect(self.child.stdout.take());
        let err = collect(self.child.stderr.take());
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.try_wait()? {
                break status;
            }
            if start.elapsed() > timeout {
                self.kill_all();
                let _ = self.child.wait();
                self.reaped = true;
                return Err(LaunchError::Timeout {
                    timeout,
                    stdout: out.join().unwrap_or_default(),
                });
            }
            std::thread::sleep(POLL);
        };
        self.reaped = true;
        Ok(self.ran(status, out, err))
    }

    /// Waits for the exit however long it takes, reading what is left of
    /// the captured outputs meanwhile.
    ///
    /// # Errors
    /// [`LaunchError::Wait`].
    pub fn finish(mut self) -> Result<Run, LaunchError> {
        let out = collect(self.child.stdout.take());
        let err = collect(self.child.stderr.take());
        let status = self.child.wait().map_err(LaunchError::Wait)?;
        self.reaped = true;
        Ok(self.ran(status, out, err))
    }

    /// Kills the process now (SIGKILL, the wrapped VMM too) and returns
    /// what it left.
    ///
    /// # Errors
    /// [`LaunchError::Wait`].
    pub fn kill(mut self) -> Result<Run, LaunchError> {
        self.kill_all();
        self.finish()
    }

    fn ran(&self, status: ExitStatus, out: JoinHandle<String>, err: JoinHandle<String>) -> Run {
        let elapsed = self.started.elapsed();
        Run {
            status,
            elapsed,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }

    /// Reaps the child with `wait4(2)` for its peak RSS: blocking without
    /// `timeout` (so the exit is timed exactly), else looking every
    /// millisecond for at most `timeout`. The outputs are left to the
    /// caller (take them first if piped: a full pipe stops the VMM).
    ///
    /// # Errors
    /// [`LaunchError::Timeout`] (killed and reaped; no stdout),
    /// [`LaunchError::Wait`].
    pub fn wait_rusage(mut self, timeout: Option<Duration>) -> Result<Reaped, LaunchError> {
        let pid = self.child.id() as libc::pid_t;
        let deadline = timeout.map(|t| Instant::now() + t);
        let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
        loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid out-parameter.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 writes one int and one rusage, both live
            // locals; `pid` is this child, not reaped yet (`reaped` is
            // false, and std's `Child` has not waited for it).
            let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
            let at = Instant::now();
            if r == pid {
                self.reaped = true;
                return Ok(Reaped {
                    status: ExitStatus::from_raw(status),
                    max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
                    at,
                });
            }
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(LaunchError::Wait(e));
            }
            if let (Some(deadline), Some(timeout)) = (deadline, timeout) {
                if at > deadline {
                    self.kill_all();
                    let _ = self.child.wait();
                    self.reaped = true;
                    return Err(LaunchError::Timeout {
                        timeout,
                        stdout: String::new(),
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Only an unreaped child: its pid cannot have been reused.
        if let Ok(None) = self.child.try_wait() {
            self.kill_all();
            let _ = self.child.wait();
        }
    }
}

/// Lines of one of a child's outputs as they come; the output is read to
/// its end (never left to fill its pipe) even when nobody takes them.
#[derive(Debug)]
pub struct Lines {
    rx: mpsc::Receiver<String>,
}

impl Lines {
    /// Reads `stream` line by line on a thread of its own.
    pub fn read(stream: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { rx }
    }

    /// The next line, if one comes within `timeout` (`None` also at the
    /// end of the output).
    pub fn next(&self, timeout: Duration) -> Option<String> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Skips lines until one starts with `prefix` and returns it.
    ///
    /// # Errors
    /// [`LaunchError::Refused`]: a line containing one of `refuse` came
    /// first; [`LaunchError::NoLine`]: none came within `timeout`, or the
    /// output ended.
    pub fn wait_for(
        &self,
        prefix: &str,
        timeout: Duration,
        refuse: &[&str],
    ) -> Result<String, LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(line) if refuse.iter().any(|r| line.contains(r)) => {
                    return Err(LaunchError::Refused {
                        prefix: prefix.to_string(),
                        line,
                    })
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(LaunchError::NoLine {
                        prefix: prefix.to_string(),
                        timeout,
                    })
                }
            }
        }
    }

    /// The lines already read and not yet taken.
    pub fn rest(&self) -> Vec<String> {
        self.rx.try_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn sh(script: &str) -> Running {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Running::spawn(cmd, "sh".into(), false).unwrap()
    }

    #[test]
    fn wait_captures_both_outputs_and_the_status() {
        let run = sh("echo out; echo err >&2; exit 3")
            .wait(Duration::from_secs(10))
            .unwrap();
        assert_eq!((run.code(), run.stdout.as_str()), (3, "out\n"));
        assert_eq!(run.stderr, "err\n");
        assert!(!run.panicked());
    }

    #[test]
    fn a_timeout_kills_and_keeps_the_output_so_far() {
        let e = sh("echo started; exec sleep 30")
            .wait(Duration::from_millis(300))
            .unwrap_err();
        match e {
            LaunchError::Timeout { stdout, .. } => assert_eq!(stdout, "started\n"),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn dropping_a_running_child_kills_and_reaps_it() {
        let child = sh("exec sleep 30");
        let pid = child.id();
        drop(child);
        // Reaped: no such process, not even a zombie.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn dropping_a_wrapped_run_kills_the_process_under_the_wrapper() {
        let mut cmd = Command::new("sh");
        // A shell that waits for its child: the child is the "VMM".
        cmd.args(["-c", "sleep 30 & echo $!; wait"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = Running::spawn(cmd, "sh".into(), true).unwrap();
        let lines = child.stdout_lines().unwrap();
        let inner: u32 = lines
            .next(Duration::from_secs(10))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(child.vmm_pid().as_raw() as u32, inner);
        drop(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        // The inner process, reparented and reaped by init, disappears.
        while std::path::Path::new(&format!("/proc/{inner}")).exists() {
            let stat = std::fs::read_to_string(format!("/proc/{inner}/stat")).unwrap_or_default();
            if stat.contains(") Z ") {
                break;
            }
            assert!(Instant::now() < deadline, "sleep {inner} survived");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn lines_wait_for_a_prefix_and_refuse_named_lines() {
        let mut child = sh("echo a; echo 'net: broken'; echo ready");
        let lines = child.stdout_lines().unwrap();
        let e = lines
            .wait_for("ready", Duration::from_secs(10), &["net: "])
            .unwrap_err();
        assert!(matches!(e, LaunchError::Refused { ref line, .. } if line == "net: broken"));
        assert_eq!(
            lines
                .wait_for("ready", Duration::from_secs(10), &[])
                .unwrap(),
            "ready"
        );
        assert!(matches!(
            lines.wait_for("more", Duration::from_secs(10), &[]),
            Err(LaunchError::NoLine { .. })
        ));
    }

    #[test]
    fn wait_rusage_reports_the_exit_and_peak_rss() {
        let r = sh("exit 4").wait_rusage(None).unwrap();
        assert_eq!(r.status.code(), Some(4));
        assert!(r.max_rss_kib > 0);
        let e = sh("exec sleep 30")
            .wait_rusage(Some(Duration::from_millis(100)))
            .unwrap_err();
        assert!(matches!(e, LaunchError::Timeout { .. }));
    }
}
