//! What the stagevm-hostd end-to-end tests share: the daemon, test-guest
//! VMs with their API sockets in a directory, and reads of their vCPU
//! threads from /proc.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stagevm_report::api::HostView;
use stagevm_testkit::api::Api;
use stagevm_testkit::machine::{test_guest, workspace_binary};
use stagevm_testkit::{Hostd, Running, Stagevm};

pub const HOSTD: &str = env!("CARGO_BIN_EXE_stagevm-hostd");
/// The daemon's period in these tests (ms).
pub const PERIOD_MS: u64 = 200;
/// A workload that outlasts every test.
pub const FOREVER: &str = "iters=1000 threads=4 requests=1000000000000 work=200 hold=1";
/// One that is done at once, then holds (parked: no demand).
pub const IDLE: &str = "iters=1000 threads=4 requests=100 work=200 hold=1";

pub fn skip_without_kvm() -> bool {
    if std::fs::metadata("/dev/kvm").is_err() {
        eprintln!("skipped: no /dev/kvm");
        return true;
    }
    false
}

/// A fresh VM directory, and a host.toml beside it (`extra` appended).
pub fn setup(extra: &str) -> (PathBuf, PathBuf) {
    let dir = stagevm_testkit::temp_path("hostd-vms", "d");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.with_extension("toml");
    // The VMM and this test's binary (whose fake peers, hung or flooding,
    // the daemon must read to show how it copes) are believed.
    let vmm = workspace_binary("stagevm", "stagevm");
    let me = std::env::current_exe().unwrap();
    std::fs::write(
        &config,
        format!(
            "[host]\ncores = \"0-1\"\nperiod_ms = {PERIOD_MS}\ntimeout_ms = 100\nhysteresis = 0.25\nvmm = [{:?}, {:?}]\n{extra}",
            vmm.display().to_string(),
            me.display().to_string()
        ),
    )
    .unwrap();
    (dir, config)
}

/// `stagevm` arguments for the busy VMs whose demand the sharing tests
/// follow: a staged guest on a core shared with another VM waits on its
/// own preempted vCPUs at each migration and idles, so its demand shows
/// less than it would use on a core of its own (docs/design.md, "Several
/// VMs on one host"); with `off` its guest shows the demand it has.
pub const OFF: [&str; 2] = ["--policy", "off"];

/// Boots a 2-vCPU test guest with its API socket `dir/NAME.sock`.
pub fn boot(dir: &Path, name: &str, cmdline: &str) -> Running {
    boot_with(dir, name, cmdline, &[])
}

/// [`boot`] with more `stagevm` arguments.
pub fn boot_with(dir: &Path, name: &str, cmdline: &str, args: &[&str]) -> Running {
    let socket = dir.join(format!("{name}.sock"));
    let vm = Stagevm::new(workspace_binary("stagevm", "stagevm"))
        .kernel(test_guest())
        .vcpus(2)
        .memory("128M")
        .api_socket(&socket)
        .cmdline(cmdline)
        .args(args)
        .spawn()
        .expect("start stagevm");
    Api::wait_ready(&socket, Duration::from_secs(10)).expect("the VM's API socket");
    vm
}

/// The cores the VMM's vCPU threads may run on: the union of the
/// `Cpus_allowed_list` of its tasks named `vcpu*` (a staged policy pins
/// each vCPU to one of the VM's cores, `off` floats them over all).
pub fn vcpu_affinity(vm: &Running) -> String {
    let mut cores = host_sched::cpuset::CpuSet::new();
    for tid in vcpu_tids(vm) {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
        if let Some(l) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        {
            let set = host_sched::cpuset::CpuSet::parse(l.trim()).unwrap();
            set.iter().for_each(|c| cores.insert(c));
        }
    }
    cores.to_string()
}

/// The VMM's vCPU threads' ids.
pub fn vcpu_tids(vm: &Running) -> Vec<i32> {
    stagevm_testkit::machine::vcpu_tids(vm.vmm_pid().as_raw() as u32)
}

/// The nice level of each vCPU thread, from /proc.
pub fn vcpu_nice(vm: &Running) -> Vec<i32> {
    stagevm_testkit::machine::vcpu_nice(vm.vmm_pid().as_raw() as u32)
}

/// The CPU time of a VM's vCPU threads so far (ns; `/proc/TID/schedstat`).
pub fn vcpu_cpu_ns(vm: &Running) -> u64 {
    vcpu_tids(vm)
        .iter()
        .filter_map(|t| {
            let s = std::fs::read_to_string(format!("/proc/{t}/schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Whether `a` is one core and `b` another.
pub fn one_each(a: &str, b: &str) -> bool {
    a.len() == 1 && b.len() == 1 && a != b
}

/// Starts the daemon on `dir` with `config` and its API socket `api`;
/// returns it, once its socket answers, with its log as it comes.
pub fn start_daemon(dir: &Path, config: &Path, api: &Path) -> (Running, Arc<Mutex<String>>) {
    let mut daemon = Hostd::new(HOSTD, dir)
        .config(config)
        .api_socket(api)
        .spawn()
        .unwrap();
    let log = log_of(&mut daemon);
    Api::wait_ready(api, Duration::from_secs(10)).unwrap();
    (daemon, log)
}

/// Runs the daemon on `dir` with `config` to its end (at most 10 s): for
/// a start that must be refused.
pub fn refused(dir: &Path, config: &Path) -> stagevm_testkit::Run {
    let daemon = Hostd::new(HOSTD, dir).config(config).spawn().unwrap();
    daemon.wait(Duration::from_secs(10)).unwrap()
}

/// The daemon's log (stderr), collected as it comes.
pub fn log_of(daemon: &mut Running) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let stderr = daemon.take_stderr().expect("stderr piped");
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    log
}

/// Polls `check` every 20 ms until it holds, for at most `periods` daemon
/// periods plus one VM policy period and the reads' slack; panics with
/// `what` and the last state after.
pub fn within(periods: u64, what: &str, check: impl FnMut() -> Result<(), String>) {
    let timeout = Duration::from_millis(periods * PERIOD_MS + 100);
    stagevm_testkit::machine::until(
        timeout,
        &format!("{what} ({periods} periods of {PERIOD_MS} ms)"),
        check,
    );
}

/// `promtool check metrics` on `scrape`: clean (says "skipped" where
/// promtool is not installed).
pub fn promtool_check(scrape: &str) {
    match stagevm_testkit::api::promtool_check(scrape) {
        None => eprintln!(
            "skipped: promtool is not installed (Debian's prometheus package; `just setup` installs it)"
        ),
        Some((ok, said)) => assert!(ok, "promtool: {said}\n{scrape}"),
    }
}

pub fn view(api: &Path) -> HostView {
    Api::new(api).unwrap().get_json("/api/v1/host").unwrap()
}

/// VM `name` in the daemon's view, or what the view holds instead (for
/// [`within`]'s checks, while the daemon has not found it yet).
pub fn find_vm<'a>(v: &'a HostView, name: &str) -> Result<&'a stagevm_report::api::HostVm, String> {
    v.vms
        .iter()
        .find(|vm| vm.name == name)
        .ok_or_else(|| format!("no VM {name} in {v:?}"))
}

pub fn vm<'a>(v: &'a HostView, name: &str) -> &'a stagevm_report::api::HostVm {
    find_vm(v, name).unwrap_or_else(|e| panic!("{e}"))
}

/// The file `file` of the cgroup v1 `cpu` or `cpuset` group (`hierarchy`)
/// VMM `vm` is in (from `/proc/PID/cgroup`; mounts at
/// `/sys/fs/cgroup/HIERARCHY`), trimmed; `None` when not found.
pub fn group_file(vm: &Running, hierarchy: &str, file: &str) -> Option<String> {
    let pid = vm.vmm_pid().as_raw();
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, c, p) = (f.next()?, f.next()?, f.next()?);
        c.split(',')
            .any(|x| x == hierarchy)
            .then_some(p.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup")
        .join(hierarchy)
        .join(path.trim_start_matches('/'));
    std::fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_string())
}
