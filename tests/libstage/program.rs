//! The C side of the libstage test: libstage's test program and `stagectl`
//! built with their Makefiles ([`binaries`]), a running program driven line
//! by line ([`Driver`]), its lines read, and where its threads may run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::Duration;

use host_sched::cpuset::CpuSet;

/// How long one line from the C program may take.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The programs [`binaries`] built.
pub struct Binaries {
    pub e2e: PathBuf,
    pub stagectl: PathBuf,
}

/// Builds libstage, its test program and stagectl with their Makefiles (once).
pub fn binaries() -> &'static Binaries {
    static BINS: OnceLock<Binaries> = OnceLock::new();
    BINS.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("linux-agent");
        let linux = repo_root().join("guest-agent/linux");
        for target in ["libstage", "stagectl"] {
            let r = Command::new("make")
                .arg("-s")
                .arg("-C")
                .arg(&linux)
                .arg(format!("BUILD={}", out.display()))
                .arg(target)
                .output()
                .expect("run make (build-essential)");
            assert!(
                r.status.success(),
                "make {target} failed:\n{}{}",
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
        }
        Binaries {
            e2e: out.join("libstage/libstage_e2e"),
            stagectl: out.join("stagectl/stagectl"),
        }
    })
}

/// Talks to the C program line by line; kills it if the test fails.
pub struct Driver {
    pub child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    transcript: Vec<String>,
}

impl Driver {
    /// Takes over a program spawned with piped stdin and stdout; a thread
    /// reads its lines.
    pub fn new(mut child: Child) -> Self {
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines: rx,
            transcript: Vec::new(),
        }
    }

    fn line(&mut self) -> String {
        match self.lines.recv_timeout(LINE_TIMEOUT) {
            Ok(l) => {
                self.transcript.push(l.clone());
                l
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "the C program said nothing for {LINE_TIMEOUT:?}; so far:\n{}",
                self.transcript.join("\n")
            ),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "the C program ended early ({:?}); so far:\n{}",
                self.child.wait(),
                self.transcript.join("\n")
            ),
        }
    }

    pub fn expect(&mut self, prefix: &str) -> String {
        let l = self.line();
        assert!(
            l.starts_with(prefix),
            "expected '{prefix}…', got '{l}'; so far:\n{}",
            self.transcript.join("\n")
        );
        l
    }

    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn wait_ok(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the C program exited with {status}");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() && std::thread::panicking() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `key value key value …` after a leading word, as numbers by key.
pub fn fields(line: &str) -> std::collections::HashMap<String, Vec<u64>> {
    let mut out: std::collections::HashMap<String, Vec<u64>> = Default::default();
    let mut key = String::new();
    for w in line.split_whitespace().skip(1) {
        match w.parse::<u64>() {
            Ok(n) => out.entry(key.clone()).or_default().push(n),
            Err(_) => key = w.to_string(),
        }
    }
    out
}

/// The number after the word `key` (the kit's `word_field`); panics
/// without one.
pub fn field(line: &str, key: &str) -> u64 {
    stagevm_testkit::console::word_field(line, key)
        .unwrap_or_else(|| panic!("no '{key}' in '{line}'"))
}

/// "map epoch E stage0 0xM stage1 0xM" → (epoch, masks).
pub fn parse_map(line: &str) -> (u64, Vec<u64>) {
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[0], "map", "{line}");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    (w[2].parse().unwrap(), vec![hex(w[4]), hex(w[6])])
}

pub fn mask_cpus(mask: u64) -> CpuSet {
    (0..64).filter(|v| mask >> v & 1 != 0).collect()
}

/// `Cpus_allowed_list` of every worker thread named in "phase P done tids …".
pub fn thread_affinities(pid: u32, phase_line: &str) -> Vec<(String, CpuSet)> {
    let tids: Vec<&str> = phase_line.split_whitespace().skip(4).collect();
    assert!(!tids.is_empty(), "{phase_line}");
    tids.into_iter()
        .map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
                .unwrap_or_else(|e| panic!("thread {tid} of {pid}: {e}"));
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim();
            (tid.to_string(), CpuSet::parse(list).unwrap())
        })
        .collect()
}

pub fn check_affinity(pid: u32, phase_line: &str, expect: &CpuSet) {
    for (tid, set) in thread_affinities(pid, phase_line) {
        assert_eq!(set, *expect, "thread {tid}: Cpus_allowed_list");
    }
}

/// The word after `key` in a line of words.
pub fn word_after<'a>(line: &'a str, key: &str) -> &'a str {
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w
        .iter()
        .position(|x| *x == key)
        .unwrap_or_else(|| panic!("no '{key}' in '{line}'"));
    w[i + 1]
}
