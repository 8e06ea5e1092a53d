//! The daemon's decisions without VMs: a lying or hung peer, an untrusted
//! one, the hold, the back-off.

use super::*;

/// A fresh scratch folder for test `name`.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stagevm-hostd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `[host]` keys with `extra`, believing this test's binary as a VMM (its
/// fake peers are read).
fn trusting_this_test(extra: &str) -> String {
    let me = std::env::current_exe().unwrap();
    format!("[host]\n{extra}vmm = [{:?}]\n", me.display().to_string())
}

fn known(dir: &Path, name: &str, cores: &str, given: Option<&str>, answered: bool) -> Known {
    Known {
        cores: CpuSet::parse(cores).unwrap(),
        demand: 1.0,
        vcpus: 2,
        given: given.map(|g| CpuSet::parse(g).unwrap()),
        answered,
        ..Known::new(Vm::new(name, &dir.join(format!("{name}.sock"))).unwrap())
    }
}

/// A daemon for `dir` on a host of CPUs `cpus` with host.toml `text`.
fn daemon(dir: &Path, cpus: &str, text: &str) -> Daemon {
    let cpus = CpuSet::parse(cpus).unwrap();
    let topology = host_sched::topology::Topology {
        allowed: cpus.clone(),
        online: cpus,
        isolated: CpuSet::new(),
    };
    let config = HostConfig::parse(text, "host.toml", &topology).unwrap();
    Daemon::new(config, dir, None)
}

/// The cores of `name` in `plan`.
fn cores_of(plan: &[(String, host_sched::host::VmCores, Option<u32>)], name: &str) -> String {
    plan.iter()
        .find(|(n, ..)| n == name)
        .map_or("-".into(), |(_, c, _)| c.cores.to_string())
}

/// A peer that answered once claiming every core but one, then hangs:
/// found after the first period, it was never given cores, so it holds
/// none; adopted at the first period with them (a daemon restarted
/// beside it), it keeps at most its share of the pool; either way the
/// two honest VMs get cores of their own. Before the fix its claim was
/// fixed and both honest VMs were put on the one core left.
#[test]
fn a_peer_that_claims_every_core_but_one_then_hangs_holds_no_more_than_its_share() {
    let dir = scratch("liar");
    for adopted in [None, Some("1-3")] {
        let mut d = daemon(&dir, "0-3", "[host]\ncores = \"0-3\"\n");
        d.vms
            .insert("a".into(), known(&dir, "a", "0", Some("0"), true));
        d.vms
            .insert("b".into(), known(&dir, "b", "0", Some("0"), true));
        d.vms
            .insert("liar".into(), known(&dir, "liar", "1-3", adopted, false));
        let plan = d.plan().unwrap();
        let (a, b) = (
            CpuSet::parse(&cores_of(&plan, "a")).unwrap(),
            CpuSet::parse(&cores_of(&plan, "b")).unwrap(),
        );
        let liar = cores_of(&plan, "liar");
        assert!(
            !a.is_empty() && !b.is_empty() && a.intersection(&b).is_empty(),
            "adopted {adopted:?}: a {a}, b {b}, liar {liar}"
        );
        match adopted {
            None => assert_eq!(liar, "-", "a claim it was never given"),
            Some(_) => assert_eq!(CpuSet::parse(&liar).unwrap().len(), 1, "{liar}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hung_peers_are_read_side_by_side_not_one_after_another() {
    let dir = scratch("hung");
    // 128 peers that accept (the kernel's backlog) and never answer.
    let n = 128;
    let _peers: Vec<_> = (0..n)
        .map(|i| {
            std::os::unix::net::UnixListener::bind(dir.join(format!("vm{i:03}.sock"))).unwrap()
        })
        .collect();
    let mut d = daemon(&dir, "0-1", &trusting_this_test("timeout_ms = 200\n"));
    let t0 = Instant::now();
    d.period().unwrap();
    let took = t0.elapsed();
    // One after another: 128 × 200 ms = 25.6 s; side by side: 2 × 200 ms.
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    let v = d.view();
    assert_eq!(v.vms.len(), n);
    assert!(v.vms.iter().all(|vm| vm.skipped == 1), "{v:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A socket served by a process that is not a trusted VMM (this test's
/// binary, not the `stagevm` beside it): refused, counted, no cores —
/// before the fix it was read and believed.
#[test]
fn a_peer_that_is_not_a_trusted_vmm_is_refused() {
    let dir = scratch("untrusted");
    let _peer = std::os::unix::net::UnixListener::bind(dir.join("impostor.sock")).unwrap();
    let mut d = daemon(&dir, "0-1", "[host]\ntimeout_ms = 200\n");
    let t0 = Instant::now();
    for _ in 0..2 {
        d.period().unwrap();
    }
    // Refused at once: no request was sent, so no timeout was waited.
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(200),
        "{:?}",
        t0.elapsed()
    );
    let v = d.view();
    let vm = &v.vms[0];
    assert_eq!(
        (vm.refused, vm.skipped, vm.cores.as_str()),
        (2, 0, ""),
        "{v:?}"
    );
    assert_eq!(d.plan().unwrap().len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// After a move the allocation holds for the hold, whatever the
/// demands say meanwhile; after it, cores may move again (issue 50,
/// S5: a guest that swings its demand every period moves another VM's
/// cores at most once per hold).
#[test]
fn cores_just_moved_are_held_for_hold_periods() {
    let dir = scratch("hold");
    let mut d = daemon(&dir, "0-1", "[host]\ncores = \"0-1\"\nhold_periods = 3\n");
    d.periods = 10;
    d.last_move = Some(10);
    let mut a = known(&dir, "a", "0-1", Some("0-1"), true);
    a.demand = 0.0;
    // What the last allocation gave it (replayed during the hold).
    a.planned = Some(host_sched::host::VmCores {
        cores: CpuSet::parse("0-1").unwrap(),
        owned: CpuSet::parse("0-1").unwrap(),
        shared: false,
    });
    let mut b = known(&dir, "b", "", Some(""), true);
    b.demand = 2.0;
    d.vms.insert("a".into(), a);
    d.vms.insert("b".into(), b);
    for (period, a_keeps) in [(10, true), (12, true), (13, false)] {
        d.periods = period;
        let plan = d.plan().unwrap();
        let (ca, cb) = (cores_of(&plan, "a"), cores_of(&plan, "b"));
        assert_eq!(ca == "0-1", a_keeps, "period {period}: a {ca}, b {cb}");
        if !a_keeps {
            assert_ne!(cb, "", "period {period}: b still has no core");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer that keeps hanging is read less and less often (after n
/// hung reads in a row, 2^n periods later, at most [`MAX_BACKOFF`]):
/// over 40 periods it costs 5 timeouts, not 40 (issue 50, S3).
#[test]
fn a_peer_that_keeps_hanging_is_read_less_and_less_often() {
    let dir = scratch("backoff");
    let _hung = std::os::unix::net::UnixListener::bind(dir.join("hung.sock")).unwrap();
    let mut d = daemon(
        &dir,
        "0-1",
        &trusting_this_test("period_ms = 10\ntimeout_ms = 10\n"),
    );
    for _ in 0..40 {
        d.period().unwrap();
    }
    // Read at periods 0, 2, 6, 14, 30 (then every 32): 5 reads.
    let v = d.view();
    assert_eq!(v.vms[0].skipped, 5, "{v:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A VM that shares a core it was given (more VMs than cores) and misses
/// one read stays in the allocation as it was: the VM that owns both
/// cores keeps them, and the sharer still shares one. Before, the
/// sharer's stale set was fixed and the owner lost a core at one slow
/// answer (seen in hostd/tests/weight.rs, where the light VMs' API threads
/// answer slowly in their low-weight cgroups).
#[test]
fn a_sharer_that_misses_a_read_takes_no_core_from_its_owner() {
    let dir = scratch("sharer");
    let mut d = daemon(&dir, "0-1", "[host]\ncores = \"0-1\"\n");
    let mut heavy = known(&dir, "heavy", "0-1", Some("0-1"), true);
    heavy.demand = 2.0;
    heavy.vcpus = 2;
    let mut light = known(&dir, "light", "0", Some("0"), false);
    light.shared = true;
    d.vms.insert("heavy".into(), heavy);
    d.vms.insert("light".into(), light);
    let mut other = known(&dir, "other", "1", Some("1"), true);
    other.shared = true;
    d.vms.insert("other".into(), other);
    let plan = d.plan().unwrap();
    assert_eq!(cores_of(&plan, "heavy"), "0-1");
    let light = CpuSet::parse(&cores_of(&plan, "light")).unwrap();
    assert_eq!(light.len(), 1, "the sharer still shares a core");
    let _ = std::fs::remove_dir_all(&dir);
}
