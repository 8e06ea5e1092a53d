//! What the preload library's native tests share: the small C server
//! (`tests/server/stage_server.c`, built with `cc`), its map, the library
//! the build made, and readers of the server's output and its threads'
//! CPU masks.
#![allow(dead_code)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use stagevm_preload::control::Mapping;

pub const MAP: &str = "stagemap 1
stage parse stage_parse
stage plan stage_plan tight_loop
stage exec stage_exec reg_probe
request exec req_wait
";

/// A temporary folder with the built server and a map.
pub struct Fixture {
    pub dir: PathBuf,
    pub server: PathBuf,
}

impl Fixture {
    /// `None` (the test prints why it is skipped) without a C compiler.
    pub fn new(name: &str) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("stagevm-preload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let server = dir.join("stage_server");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/stage_server.c");
        let cc = Command::new("cc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&server)
            .arg(&src)
            .output();
        match cc {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!("cc failed: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                eprintln!("skipped: no C compiler (cc: {e})");
                return None;
            }
        }
        std::fs::write(dir.join("map"), MAP).unwrap();
        Some(Self { dir, server })
    }

    pub fn library() -> PathBuf {
        // `cargo test` builds the cdylib beside the test binary
        // (target/<profile>/deps/), and does not copy it up to
        // target/<profile>/ as `cargo build` does: the one in deps/ is the
        // one built from this source.
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().join("libstagevm_preload.so");
        assert!(
            lib.exists(),
            "{} not built (cargo builds it with the crate)",
            lib.display()
        );
        lib
    }

    /// The server's command with the library, `map` and `env`.
    pub fn command(&self, map: &str, args: &[&str], env: &[(&str, String)]) -> Command {
        let map_path = self.dir.join("map.run");
        std::fs::write(&map_path, map).unwrap();
        let mut cmd = Command::new(&self.server);
        cmd.args(args)
            .env("LD_PRELOAD", Self::library())
            .env("STAGEVM_STAGEMAP", &map_path)
            .env("STAGEVM_CONTROL", self.control())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let _ = std::fs::remove_file(self.control());
        cmd
    }

    /// The server with the library, `map` and `env`, started.
    pub fn spawn(&self, map: &str, args: &[&str], env: &[(&str, String)]) -> Child {
        self.command(map, args, env).spawn().unwrap()
    }

    pub fn run(&self, map: &str, args: &[&str], env: &[(&str, String)]) -> (Output, String) {
        let child = self.spawn(map, args, env);
        let out = wait_bounded(child, Duration::from_secs(120));
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "server failed: {stderr}");
        (out, stderr)
    }

    pub fn control(&self) -> PathBuf {
        self.dir.join("control")
    }

    pub fn page(&self) -> Mapping {
        Mapping::open(&self.control(), |_| {
            panic!("the library did not lay the page out")
        })
        .unwrap()
    }

    /// The server alone (no library): its answer.
    pub fn reference(&self, args: &[&str]) -> String {
        let out = Command::new(&self.server).args(args).output().unwrap();
        checksum(&out)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            child.kill().unwrap();
            panic!("the server did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status: child.wait().unwrap(),
        stdout,
        stderr,
    }
}

/// The server's checksum (the third field of its `done` line).
pub fn checksum(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    let done = text
        .lines()
        .find(|l| l.starts_with("done "))
        .expect("no done line");
    done.split_whitespace().nth(3).unwrap().to_string()
}

/// `thread ID FINISH_MS MAX_US` lines: (finish ms, max request µs) by id.
pub fn threads(out: &Output) -> Vec<(u64, u64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("thread "))
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[1], f[2])
        })
        .collect()
}

/// A CPU this process may run on (the lane of the gated tests).
pub fn a_cpu() -> usize {
    stagevm_preload::costs::default_cpu().unwrap()
}

/// The CPU lists (`Cpus_allowed_list`) of the process's threads other than
/// its main thread, from /proc.
pub fn worker_masks(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            if t.file_name().to_str()? == pid.to_string() {
                return None;
            }
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            if comm.trim() == "stagevm-gate" {
                return None;
            }
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|s| s.trim().to_string())
        })
        .collect()
}
