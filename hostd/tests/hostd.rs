//! stagevm-hostd end to end: real test-guest VMs on /dev/kvm under the real
//! daemon binary, their vCPU threads' affinities read back from /proc.

mod common;

use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use common::*;
use stagevm_testkit::api::{metric, Api};
use stagevm_testkit::machine::vm_lock;

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
    let text = log.lock().unwrap().clone();
    assert!(
        v.vms.iter().all(|vm| vm.errors == 0 && !vm.shared),
        "{v:?}\ndaemon log:\n{text}"
    );
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

/// A neighbour busy and idle in turn every second (its demand is its own
/// to show) moves the steady VM's cores at most once per hold, and never
/// restarts its `auto` trial (issue 50, S5): with `hold_periods = 10` (2 s)
/// the steady VM's set changes at least 10 daemon periods apart (14–16
/// here), where without the hold it followed the neighbour every 4–6
/// periods; each move (between 1 and 2 cores) keeps `auto`'s policy: its
/// periods only grow, its trial count stays, `policy_kept` counts it.
#[test]
fn a_neighbour_that_swings_its_demand_moves_cores_at_most_once_per_hold() {
    if skip_without_kvm() {
        return;
    }
    let _lock = vm_lock();
    // The swinger lends its core while idle, and takes one back when busy.
    let (dir, config) =
        setup("hold_periods = 10\n[[vm]]\nname = \"swinger\"\nlend_when_idle = true\n");
    let api = dir.with_extension("sock");
    let (_daemon, _log) = start_daemon(&dir, &config, &api);
    // `--policy off`: demand as the guest has it ([`OFF`]).
    // The steady VM under `auto`: its demand shows on the cores it owns.
    let steady = boot_with(&dir, "steady", FOREVER, &["--policy", "auto"]);
    let _swinger = boot_with(
        &dir,
        "swinger",
        "iters=1 work=1000 threads=4 requests=1000000 arrival=200000 phases=1000:1000 hold=1",
        &OFF,
    );
    // (daemon period, steady's cores) at each change seen, and auto's
    // (periods, trials, first trial over, policy kept) then.
    let mut changes: Vec<(u64, String)> = Vec::new();
    let mut autos: Vec<(u64, u64, bool, u64)> = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(12) {
        let v = view(&api);
        if let Ok(s) = find_vm(&v, "steady") {
            if changes.last().is_none_or(|(_, c)| *c != s.cores) {
                changes.push((v.periods, s.cores.clone()));
                let r: stagevm_report::api::StagesView = Api::new(&dir.join("steady.sock"))
                    .unwrap()
                    .get_json("/api/v1/stages?timeline=0")
                    .unwrap();
                let a = r.sched.auto.expect("auto's figures");
                autos.push((
                    a.periods,
                    a.trials,
                    a.last_trial.is_some(),
                    r.sched.policy_kept,
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    eprintln!("steady's cores by daemon period: {changes:?}");
    assert!(
        changes.len() >= 3,
        "the neighbour never moved the steady VM's cores: {changes:?}"
    );
    // The first entry is its set when first seen; each move after is at
    // least the hold after the one before (less one period: a view read
    // just before its period's allocation).
    for w in changes[1..].windows(2) {
        assert!(
            w[1].0 >= w[0].0 + 9,
            "moved again {} periods after: {changes:?}",
            w[1].0 - w[0].0
        );
    }
    // auto never started over: from its first trial's end on, each move
    // kept the policy (its periods and trials only grow). A new trial is
    // no start over: halving the VM's cores may fire a change point (1
    // run in ~4 here: trials 1 → 2 at period 594 of 600).
    eprintln!("auto at each change (periods, trials, decided, kept): {autos:?}");
    let decided: Vec<_> = autos.iter().filter(|a| a.2).collect();
    assert!(
        decided.len() >= 2,
        "too few moves after auto decided: {autos:?}"
    );
    for w in decided.windows(2) {
        assert!(
            w[1].0 > w[0].0 && w[1].1 >= w[0].1,
            "auto started over at a move: {autos:?}"
        );
    }
    // Every move after auto decided counted as kept (the VMM applies a
    // move at its next policy period, so the count read at a move may lag
    // it by one; a move during the first trial rebuilds the policy).
    std::thread::sleep(Duration::from_millis(300));
    let r: stagevm_report::api::StagesView = Api::new(&dir.join("steady.sock"))
        .unwrap()
        .get_json("/api/v1/stages?timeline=0")
        .unwrap();
    assert!(
        r.sched.policy_kept >= decided.len() as u64,
        "kept {}: {changes:?} {autos:?}",
        r.sched.policy_kept
    );
    drop(steady);
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
    // Each read of the flood has 100 ms (`timeout_ms`) beside the busy
    // VM's 4 spinning vCPUs on the 2 cores: now and then the timeout ends
    // it before 4 MiB arrive (1 full run in 6 here). The bound must show
    // in one of its next reads (backed off: 4, 8, 16 periods later).
    within(40, "the flood's answer cut at 4 MiB", || {
        let text = first_log.lock().unwrap().clone();
        text.contains("an answer over 4194304 bytes")
            .then_some(())
            .ok_or(text)
    });
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
