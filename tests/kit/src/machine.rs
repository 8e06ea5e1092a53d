//! What every test that boots VMs needs besides the command line: the
//! test guest built, the workspace's binaries, and the right to boot a VM
//! (alone, or two at once in the suites that measure no time).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::fcntl::{Flock, FlockArg};

/// The repository's root (the kit lives in `tests/kit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/kit is two levels down")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs the cargo build `cmd` for `what`; panics with cargo's output when
/// it fails.
fn build(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run cargo to build {what}: {e}"));
    assert!(
        out.status.success(),
        "building {what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `images/testguest` (release, `x86_64-unknown-none`) once per
/// process and returns the ELF's path. Panics with cargo's output on
/// failure.
pub fn test_guest() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = repo_root().join("images/testguest");
        let mut cmd = cargo();
        cmd.args(["build", "--release", "--quiet"])
            .current_dir(&dir)
            // The guest's own .cargo/config.toml sets its target and flags;
            // the host build's settings must not leak into it.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("CARGO_TARGET_DIR");
        build(cmd, "the test guest");
        dir.join("target/x86_64-unknown-none/release/testguest")
    })
}

/// The workspace binary `name` of package `package`, for a test of another
/// package (cargo gives a test only its own package's binaries), in the
/// calling test's profile (debug or release), found beside the test's own
/// executable (`target/<profile>/deps/..`).
///
/// Built by `cargo test --workspace --no-run`, the build `./dev test` has
/// just done (a no-op there, ~0.2 s, once per test process), which builds
/// the binaries of every package with integration tests: `cargo build -p
/// package` would resolve the dependencies' features for that package
/// alone and compile 33 crates a second time (~30 s of a fresh clone's
/// test run). Run from one
/// package's tests alone, the first call builds the workspace's tests.
/// `package` must have integration tests (`stagevm` and `stagesim` do).
/// Panics with cargo's output on failure, or if the binary is missing.
pub fn workspace_binary(package: &str, name: &str) -> PathBuf {
    // One build serves every binary: run it once per test process.
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf();
        let mut cmd = cargo();
        cmd.args(["test", "--workspace", "--no-run", "--quiet"]);
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        cmd.current_dir(repo_root());
        build(cmd, "the workspace's binaries");
        dir
    });
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{}: not built by `cargo test --workspace --no-run` (has package {package} integration tests?)",
        bin.display()
    );
    bin
}

/// Test executables (cargo's target names) whose tests judge behaviour,
/// not time or CPU: their VMs may run two at once (cargo's 2 test threads
/// on these machines; see [`vm_lock`]), which takes net 10.6 s against
/// 14.5, api 5.2 against 6.8, seccomp 3.6 against 4.5. Not here: suites
/// with a bound on time, e.g. signals (a VM stops within 2 s of SIGTERM:
/// 6.7 s beside another VM) and hostile (500 ms; doorbells stay fast).
pub const FUNCTIONAL_SUITES: &[&str] = &["api", "net", "seccomp"];

/// Whether the running test executable is one of [`FUNCTIONAL_SUITES`]
/// (its file is `target/<profile>/deps/<name>-<hash>`).
fn functional_suite() -> bool {
    let exe = std::env::current_exe().unwrap_or_default();
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let name = stem.rsplit_once('-').map_or(stem, |(name, _hash)| name);
    FUNCTIONAL_SUITES.contains(&name)
}

/// The right to boot a VM in a test, held until dropped: the machines have
/// 2 cores, and a test that measures time or CPU must not share them with
/// another VM. A test of a [`FUNCTIONAL_SUITES`] executable shares an
/// `flock` on the lock file (beside others of its kind, in its process or
/// another runner's); any other test holds an in-process mutex and the
/// exclusive `flock`, so it runs alone.
pub struct VmLock {
    _alone: Option<MutexGuard<'static, ()>>,
    _file: Flock<File>,
}

/// Takes the [`VmLock`] (waits for it), shared in a functional suite,
/// exclusive in any other.
pub fn vm_lock() -> VmLock {
    static LOCK: Mutex<()> = Mutex::new(());
    let shared = functional_suite();
    let alone = (!shared).then(|| LOCK.lock().unwrap_or_else(|p| p.into_inner()));
    let file = File::create(std::env::temp_dir().join("stagevm-vm-tests.lock"))
        .expect("the VM test lock file");
    let how = if shared {
        FlockArg::LockShared
    } else {
        FlockArg::LockExclusive
    };
    let file = Flock::lock(file, how)
        .map_err(|(_, e)| e)
        .expect("flock the VM test lock");
    VmLock {
        _alone: alone,
        _file: file,
    }
}

/// The thread ids of VMM `pid`'s vCPU threads (its tasks named `vcpu*`),
/// in /proc's order; empty when the process is gone.
pub fn vcpu_tids(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .starts_with("vcpu")
        })
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect()
}

/// The nice level of each of VMM `pid`'s vCPU threads ([`vcpu_tids`],
/// [`thread_nice`]).
pub fn vcpu_nice(pid: u32) -> Vec<i32> {
    vcpu_tids(pid).into_iter().filter_map(thread_nice).collect()
}

/// Polls `check` every 20 ms until it holds, for at most `timeout`; panics
/// with `what` and the state the last check returned after.
pub fn until(
    timeout: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> Result<(), String>,
) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return,
            Err(state) if std::time::Instant::now() > deadline => {
                panic!("{what}: not within {timeout:?}: {state}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Thread `tid`'s nice level, from `/proc/TID/stat` (field 19, the 17th
/// after the command's closing parenthesis); `None` when it is gone.
pub fn thread_nice(tid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(16)?.parse().ok()
}
