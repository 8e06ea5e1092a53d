//! stagevm-hostd end to end: real test-guest VMs on /dev/kvm under the real
//! daemon binary, their vCPU threads' affinities read back from /proc.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stagevm_report::api::HostView;
use stagevm_testkit::api::{metric, Api};
use stagevm_testkit::machine::{test_guest, vm_lock, workspace_binary};
use stagevm_testkit::{Hostd, Running, Stagevm};

const HOSTD: &str = env!("CARGO_BIN_EXE_stagevm-hostd");
/// The daemon's period in these tests (ms).
const PERIOD_MS: u64 = 200;
/// A workload that outlasts every test.
const FOREVER: &str = "iters=1000 threads=4 requests=1000000000000 work=200 hold=1";
/// One that is done at once, then holds (parked: no demand).
const IDLE: &str = "iters=1000 threads=4 requests=100 work=200 hold=1";

fn skip_without_kvm() -> bool {
    if std::fs::metadata("/dev/kvm").is_err() {
        eprintln!("skipped: no /dev/kvm");
        return true;
    }
    false
}

/// A fresh VM directory, and a host.toml beside it (`extra` appended).
fn setup(extra: &str) -> (PathBuf, PathBuf) {
    let dir = stagevm_testkit::temp_path("hostd-vms", "d");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[host]\ncores = \"0-1\"\nperiod_ms = {PERIOD_MS}\ntimeout_ms = 100\nhysteresis = 0.25\n{extra}"
        ),
    )
    .unwrap();
    (dir, config)
}

/// `stagevm` arguments for the busy VMs whose demand the sharing tests
/// follow: a staged guest on a core shared with another VM waits on its
/// own preempted vCPUs at each migration and idles, so its demand shows
/// less than it would use on a core of its own (docs/design.md, "Several
/// VMs on one host"); with `off` its guest shows the demand it has. (The
/// idle VMs keep the default policy: in one run with the idle VM under
/// `off` too it read 2 cores of demand while held, not explained yet;
/// held alone, or beside a busy VM on one core, it reads a steady 0.5
/// utilisation and no work CPU under either policy.)
const OFF: [&str; 2] = ["--policy", "off"];

/// Boots a 2-vCPU test guest with its API socket `dir/NAME.sock`.
fn boot(dir: &Path, name: &str, cmdline: &str) -> Running {
    boot_with(dir, name, cmdline, &[])
}

/// [`boot`] with more `stagevm` arguments.
fn boot_with(dir: &Path, name: &str, cmdline: &str, args: &[&str]) -> Running {
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
fn vcpu_affinity(vm: &Running) -> String {
    let pid = vm.vmm_pid();
    let mut cores = host_sched::cpuset::CpuSet::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with("vcpu") {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            if let Some(l) = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            {
                let set = host_sched::cpuset::CpuSet::parse(l.trim()).unwrap();
                set.iter().for_each(|c| cores.insert(c));
            }
        }
    }
    cores.to_string()
}

/// The VMM's vCPU threads' ids.
fn vcpu_tids(vm: &Running) -> Vec<i32> {
    stagevm_testkit::machine::vcpu_tids(vm.vmm_pid().as_raw() as u32)
}

/// The nice level of each vCPU thread, from /proc.
fn vcpu_nice(vm: &Running) -> Vec<i32> {
    vcpu_tids(vm)
        .into_iter()
        .filter_map(stagevm_testkit::machine::thread_nice)
        .collect()
}

/// The CPU time of a VM's vCPU threads so far (ns; `/proc/TID/schedstat`).
fn vcpu_cpu_ns(vm: &Running) -> u64 {
    vcpu_tids(vm)
        .iter()
        .filter_map(|t| {
            let s = std::fs::read_to_string(format!("/proc/{t}/schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Whether `a` is one core and `b` another.
fn one_each(a: &str, b: &str) -> bool {
    a.len() == 1 && b.len() == 1 && a != b
}

/// Starts the daemon on `dir` with `config` and its API socket `api`;
/// returns it, once its socket answers, with its log as it comes.
fn start_daemon(dir: &Path, config: &Path, api: &Path) -> (Running, Arc<Mutex<String>>) {
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
fn refused(dir: &Path, config: &Path) -> stagevm_testkit::Run {
    let daemon = Hostd::new(HOSTD, dir).config(config).spawn().unwrap();
    daemon.wait(Duration::from_secs(10)).unwrap()
}

/// The daemon's log (stderr), collected as it comes.
fn log_of(daemon: &mut Running) -> Arc<Mutex<String>> {
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
fn within(periods: u64, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_millis(periods * PERIOD_MS + 100);
    loop {
        match check() {
            Ok(()) => return,
            Err(state) if Instant::now() > deadline => {
                panic!("{what}: not within {periods} periods of {PERIOD_MS} ms: {state}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `promtool check metrics` on `scrape`: clean (says "skipped" where
/// promtool is not installed).
fn promtool_check(scrape: &str) {
    match stagevm_testkit::api::promtool_check(scrape) {
        None => eprintln!(
            "skipped: promtool is not installed (Debian's prometheus package; `just setup` installs it)"
        ),
        Some((ok, said)) => assert!(ok, "promtool: {said}\n{scrape}"),
    }
}

fn view(api: &Path) -> HostView {
    Api::new(api).unwrap().get_json("/api/v1/host").unwrap()
}

/// VM `name` in the daemon's view, or what the view holds instead (for
/// [`within`]'s checks, while the daemon has not found it yet).
fn find_vm<'a>(v: &'a HostView, name: &str) -> Result<&'a stagevm_report::api::HostVm, String> {
    v.vms
        .iter()
        .find(|vm| vm.name == name)
        .ok_or_else(|| format!("no VM {name} in {v:?}"))
}

fn vm<'a>(v: &'a HostView, name: &str) -> &'a stagevm_report::api::HostVm {
    find_vm(v, name).unwrap_or_else(|e| panic!("{e}"))
}

/// Weight with more VMs than cores: three busy VMs on the 2 cores, one of
/// weight 8. The heavy one has both cores as its own and the others share
/// them; on the shared cores the host splits time by the VMs' CPU weights
/// (the daemon's `host.cpu_weight`: vCPU threads' nice 0 and 9, read from
/// /proc), so the heavy VM gets several times the CPU of each light one
/// (equal weights give it no more than theirs), and the state holds: no
/// core moves for 6 periods. When the heavy VM ends, the two left get a
/// core each and their threads' nice is given back.
/// `--policy off`: see [`OFF`].
#[test]
fn weight_decides_who_owns_shared_cores_and_their_cpu() {
    if skip_without_kvm() {
        return;
    }
    let _lock = vm_lock();
    let (dir, config) = setup("[[vm]]\nname = \"heavy\"\nweight = 8\n");
    let api = dir.with_extension("sock");
    let heavy = boot_with(&dir, "heavy", FOREVER, &OFF);
    let light1 = boot_with(&dir, "light1", FOREVER, &OFF);
    let light2 = boot_with(&dir, "light2", FOREVER, &OFF);
    let (daemon, _log) = start_daemon(&dir, &config, &api);

    // Weights 8, 1, 1 at 2 vCPUs each: CPU weights 200, 25, 25; per vCPU
    // 100 and 12.5, nice 0 and 9 (host_sched::cpuweight).
    within(
        10,
        "the heavy VM owns both cores, the light ones share",
        || {
            let v = view(&api);
            let (h, l1, l2) = (
                find_vm(&v, "heavy")?,
                find_vm(&v, "light1")?,
                find_vm(&v, "light2")?,
            );
            let nice = (vcpu_nice(&heavy), vcpu_nice(&light1), vcpu_nice(&light2));
            let ok = h.owned == "0-1"
                && vcpu_affinity(&heavy) == "0-1"
                && [l1, l2].iter().all(|l| l.owned.is_empty() && l.shared)
                && (h.cpu_weight, l1.cpu_weight, l2.cpu_weight) == (Some(200), Some(25), Some(25))
                && nice == (vec![0, 0], vec![9, 9], vec![9, 9]);
            ok.then_some(()).ok_or(format!("nice {nice:?}, {v:?}"))
        },
    );
    let report: stagevm_report::api::StagesView = Api::new(&dir.join("light1.sock"))
        .unwrap()
        .get_json("/api/v1/stages?timeline=0")
        .unwrap();
    let w = report
        .sched
        .cpu_weight
        .expect("light1 reports its CPU weight");
    assert_eq!((w.weight, w.by.as_str()), (Some(25), "vCPU threads' nice"));
    assert!(
        report.sched.vcpus.iter().all(|t| t.nice == Some(9)),
        "{:?}",
        report.sched.vcpus
    );
    let scrape = Api::new(&api).unwrap().get("/metrics").unwrap();
    assert_eq!(
        metric(&scrape, "stagevm_host_vm_cpu_weight", "vm=\"light2\""),
        Some(25.0)
    );
    // The operator's table: the weight column.
    let remote = stagevm_testkit::Remote::new(workspace_binary("stagevm", "stagevm-remote"), &api);
    let table = remote.run(&["host"]).unwrap();
    assert_eq!(table.code(), 0, "{table:?}");
    let header = table.stdout.lines().find(|l| l.starts_with("vm ")).unwrap();
    let column = header.split_whitespace().position(|w| w == "cpu_weight");
    let weight_of = |name: &str| {
        let line = table.stdout.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(column.unwrap())
            .unwrap()
            .to_string()
    };
    assert_eq!(
        (weight_of("heavy "), weight_of("light1 ")),
        ("200".into(), "25".into()),
        "{}",
        table.stdout
    );

    // It holds for 6 periods, and the CPU follows the weights.
    let moves = |v: &HostView| v.vms.iter().map(|m| m.moves).collect::<Vec<_>>();
    let before = moves(&view(&api));
    let cpu0 = [&heavy, &light1, &light2].map(vcpu_cpu_ns);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(PERIOD_MS));
        let v = view(&api);
        assert_eq!(moves(&v), before, "a core moved: {v:?}");
        assert_eq!(vm(&v, "heavy").owned, "0-1", "{v:?}");
    }
    let cpu = [&heavy, &light1, &light2].map(vcpu_cpu_ns);
    let used: Vec<f64> = (0..3).map(|i| (cpu[i] - cpu0[i]) as f64).collect();
    eprintln!(
        "CPU over 6 periods (cores): heavy {:.2}, light1 {:.2}, light2 {:.2}",
        used[0] / (6 * PERIOD_MS) as f64 / 1e6,
        used[1] / (6 * PERIOD_MS) as f64 / 1e6,
        used[2] / (6 * PERIOD_MS) as f64 / 1e6
    );
    // 8 : 1 per thread gives the heavy VM ~1.5 cores to ~0.2 each here;
    // equal weights gave it 0.5 to their 0.5 and 0.9.
    assert!(
        used[0] > 3.0 * used[1] && used[0] > 3.0 * used[2],
        "heavy {} ns, light1 {} ns, light2 {} ns of CPU",
        used[0],
        used[1],
        used[2]
    );

    // The heavy VM ends: a core each, nothing shared, weights taken back.
    drop(heavy);
    within(
        10,
        "the light VMs have a core each and nice 0 again",
        || {
            let v = view(&api);
            let gone = !v.vms.iter().any(|m| m.name == "heavy");
            let (a, b) = (vcpu_affinity(&light1), vcpu_affinity(&light2));
            let nice = (vcpu_nice(&light1), vcpu_nice(&light2));
            let ok = gone
                && one_each(&a, &b)
                && v.vms.iter().all(|m| m.cpu_weight.is_none())
                && nice == (vec![0, 0], vec![0, 0]);
            ok.then_some(())
                .ok_or(format!("light1 {a}, light2 {b}, nice {nice:?}, {v:?}"))
        },
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three VMs on two cores as demand changes (`--policy off`, see
/// [`OFF`]): a VM arrives, one's workload
/// ends, one is killed. Exclusive sets while there is a core per VM; with
/// more VMs than cores the busy ones get a core each and the idle one
/// shares; each change followed within 5 periods.
#[test]
fn cores_follow_demand_arrivals_and_exits() {
    if skip_without_kvm() {
        return;
    }
    let _lock = vm_lock();
    let (dir, config) = setup("");
    let api = dir.with_extension("sock");
    let busy = boot_with(&dir, "busy", FOREVER, &OFF);
    let idle = boot(&dir, "idle", IDLE);
    let (daemon, log) = start_daemon(&dir, &config, &api);

    // Two VMs, two cores: one each, exclusive; the busy one's demand is
    // more than its core.
    within(5, "one core each", || {
        let (b, i) = (vcpu_affinity(&busy), vcpu_affinity(&idle));
        one_each(&b, &i)
            .then_some(())
            .ok_or(format!("busy {b}, idle {i}"))
    });
    within(5, "the busy VM asks for more than its core", || {
        let v = view(&api);
        let ok = v.vms.iter().all(|vm| !vm.shared) && vm(&v, "busy").demand >= 1.5;
        ok.then_some(()).ok_or(format!("{v:?}"))
    });

    // A second busy VM arrives, with a workload of a few seconds: the
    // busy ones get a core each, the idle one shares one.
    let mut busy2 = boot_with(
        &dir,
        "busy2",
        "iters=1000 threads=4 requests=1000000 work=200 hold=1",
        &OFF,
    );
    let busy2_out = busy2.stdout_lines().unwrap();
    within(5, "a core per busy VM, the idle one sharing", || {
        let (b, b2, i) = (
            vcpu_affinity(&busy),
            vcpu_affinity(&busy2),
            vcpu_affinity(&idle),
        );
        let ok = one_each(&b, &b2) && (i == b || i == b2);
        ok.then_some(()).ok_or(format!(
            "busy {b}, busy2 {b2}, idle {i}; {:?}; daemon log: {}",
            view(&api),
            log.lock().unwrap()
        ))
    });
    assert!(vm(&view(&api), "idle").shared);

    // busy2's workload ends (it holds, parked): busy takes both cores.
    busy2_out
        .wait_for("testguest: all ", Duration::from_secs(120), &[])
        .expect("busy2's workload ends");
    within(5, "the busy VM on both cores", || {
        let b = vcpu_affinity(&busy);
        (b == "0-1").then_some(()).ok_or(format!("busy {b}"))
    });

    // busy is killed: its cores are free, the two left get one each.
    drop(busy);
    // (Before the daemon sees the exit, busy holds both cores and the two
    // idle VMs may share one each: "one each" alone can hold too early.)
    within(5, "the VM that ended released its cores", || {
        let (b2, i) = (vcpu_affinity(&busy2), vcpu_affinity(&idle));
        let gone = !view(&api).vms.iter().any(|vm| vm.name == "busy");
        (gone && one_each(&b2, &i)).then_some(()).ok_or(format!(
            "busy2 {b2}, idle {i}, busy gone from the view: {gone}"
        ))
    });
    let v = view(&api);
    assert_eq!(v.vms.len(), 2, "{v:?}");
    assert!(v.vms.iter().all(|vm| vm.errors == 0 && !vm.shared), "{v:?}");
    let text = log.lock().unwrap().clone();
    assert!(
        text.contains("VM 'busy' ended: its cores are free"),
        "{text}"
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A VM that lends its core while idle (`lend_when_idle`): the busy VM
/// has both cores while the lender idles on a shared one, and the lender
/// has a core of its own again within 5 periods of getting busy.
#[test]
fn an_idle_lender_lends_its_core_and_takes_one_back() {
    if skip_without_kvm() {
        return;
    }
    let _lock = vm_lock();
    let (dir, config) = setup("lend_when_idle = true\n");
    let api = dir.with_extension("sock");
    let (_daemon, _log) = start_daemon(&dir, &config, &api);
    let busy = boot(&dir, "busy", FOREVER);
    // Idle for its first 4 s, then 1 M requests offered at 200,000/s.
    let lender = boot(
        &dir,
        "lender",
        "iters=1 work=200 threads=4 requests=125000 arrival=200000 phases=100000:0:4000 hold=1",
    );
    let booted = Instant::now();
    within(
        5,
        "the busy VM on both cores, the idle lender on one of them",
        || {
            let (b, l) = (vcpu_affinity(&busy), vcpu_affinity(&lender));
            let v = view(&api);
            let lv = find_vm(&v, "lender")?;
            (b == "0-1" && l.len() == 1 && lv.shared && lv.lent)
                .then_some(())
                .ok_or(format!("busy {b}, lender {l}: {lv:?}"))
        },
    );
    assert!(
        booted.elapsed() < Duration::from_millis(3500),
        "the lender's idle window is over already: the check above cannot tell"
    );
    // The operator sees it in /metrics, and the exposition lints clean.
    let scrape = Api::new(&api).unwrap().get("/metrics").unwrap();
    let sample = |name: &str, vm: &str| metric(&scrape, name, &format!("vm=\"{vm}\""));
    assert_eq!(
        sample("stagevm_host_vm_lent", "lender"),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        sample("stagevm_host_vm_lent", "busy"),
        Some(0.0),
        "{scrape}"
    );
    assert_eq!(
        sample("stagevm_host_vm_cores", "busy"),
        Some(2.0),
        "{scrape}"
    );
    promtool_check(&scrape);
    let wait_periods = 4000 / PERIOD_MS + 5;
    within(wait_periods, "the lender busy: a core of its own", || {
        let (b, l) = (vcpu_affinity(&busy), vcpu_affinity(&lender));
        let v = view(&api);
        let lv = find_vm(&v, "lender")?;
        (one_each(&b, &l) && !lv.shared && !lv.lent && lv.demand >= host_sched::host::RECLAIM_AT)
            .then_some(())
            .ok_or(format!("busy {b}, lender {l}: {lv:?}"))
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The budgets of host.toml hold (a minimum for the idle VM, a maximum for
/// the busy one); a socket that accepts and never answers is skipped and
/// counted; a second daemon on the directory is refused naming the first;
/// the daemon killed and restarted adopts the VMs without moving a core.
#[test]
fn budgets_hung_sockets_second_daemon_and_restart() {
    if skip_without_kvm() {
        return;
    }
    let _lock = vm_lock();
    let (dir, config) =
        setup("[[vm]]\nname = \"busy\"\nmax_cores = 1\n[[vm]]\nname = \"idle\"\nmin_cores = 1\n");
    let api = dir.with_extension("sock");
    let busy = boot(&dir, "busy", FOREVER);
    let idle = boot(&dir, "idle", IDLE);
    // Connections queue in the kernel's backlog and are never answered.
    let _hung = UnixListener::bind(dir.join("hung.sock")).unwrap();
    // A socket nobody listens on any more (a VM that died without removing
    // it): forgotten once, not tried every period.
    drop(UnixListener::bind(dir.join("stale.sock")).unwrap());
    // One that answers without end: read at most 4 MiB, counted as an error.
    let flood = UnixListener::bind(dir.join("flood.sock")).unwrap();
    std::thread::spawn(move || {
        for mut conn in flood.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n");
                let chunk = vec![b' '; 1 << 16];
                while conn.write_all(&chunk).is_ok() {}
            });
        }
    });
    let (first, first_log) = start_daemon(&dir, &config, &api);
    within(6, "exclusive cores, the hung socket skipped twice", || {
        let (b, i) = (vcpu_affinity(&busy), vcpu_affinity(&idle));
        let hung = view(&api)
            .vms
            .iter()
            .find(|vm| vm.name == "hung")
            .map_or(0, |vm| vm.skipped);
        let ok = one_each(&b, &i) && hung >= 2;
        ok.then_some(())
            .ok_or(format!("busy {b}, idle {i}, hung skipped {hung}"))
    });
    // Busy wants both cores; max_cores = 1 and idle's min_cores = 1 say no.
    std::thread::sleep(Duration::from_millis(3 * PERIOD_MS));
    assert_eq!(vcpu_affinity(&busy).len(), 1);
    let v = view(&api);
    let b = vm(&v, "busy");
    assert!(
        b.demand >= 1.5 && b.waited >= 1 && b.max_cores == Some(1),
        "{v:?}"
    );
    assert_eq!(vm(&v, "idle").min_cores, 1);

    let text = first_log.lock().unwrap().clone();
    assert_eq!(text.matches("VM 'stale' found").count(), 1, "{text}");
    let v = view(&api);
    assert!(vm(&v, "flood").errors >= 2, "{v:?}");
    assert!(text.contains("an answer over 4194304 bytes"), "{text}");
    assert!(!view(&api).vms.iter().any(|vm| vm.name == "stale"));

    // A second daemon on the same directory is refused, naming the first.
    let run = refused(&dir, &config);
    assert_ne!(run.code(), 0);
    let owner = format!("another stagevm-hostd manages it (pid {})", first.id());
    assert!(run.stderr.contains(&owner), "{}", run.stderr);

    // Killed: the VMs keep their cores; restarted: adopted as they are.
    let before = (vcpu_affinity(&busy), vcpu_affinity(&idle));
    drop(first);
    std::thread::sleep(Duration::from_millis(2 * PERIOD_MS));
    assert_eq!(
        (vcpu_affinity(&busy), vcpu_affinity(&idle)),
        before,
        "the VMs need no daemon"
    );
    let (again, log) = start_daemon(&dir, &config, &api);
    std::thread::sleep(Duration::from_millis(5 * PERIOD_MS));
    assert_eq!(
        (vcpu_affinity(&busy), vcpu_affinity(&idle)),
        before,
        "no core moved"
    );
    let text = log.lock().unwrap().clone();
    assert!(text.contains("adopted 4 VM(s) as they are"), "{text}");
    assert!(!text.contains(" -> "), "a restart moved a core:\n{text}");
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad host.toml is refused naming the key and value (no VM needed).
#[test]
fn bad_host_toml_is_refused_naming_the_key() {
    let dir = stagevm_testkit::temp_path("hostd-bad", "d");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "[[vm]]\nname = \"a\"\nweight = 0\n",
            "VM 'a': weight = 0 is not a positive number",
        ),
        (
            "[host]\nperiod_ms = 5\n",
            "[host] period_ms = 5: not within 10..=60000",
        ),
        (
            "[host]\ncores = \"0-1\"\nspeed = 1\n",
            "unknown field `speed`",
        ),
        (
            "[host]\ncores = \"1000\"\n",
            "host.cores = '1000': CPU 1000 is not online",
        ),
    ];
    let config = dir.with_extension("toml");
    for (text, needle) in cases {
        std::fs::write(&config, text).unwrap();
        let run = refused(&dir, &config);
        assert_ne!(run.code(), 0, "{text}");
        assert!(run.stderr.contains(needle), "{text}: {}", run.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
