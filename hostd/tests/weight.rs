//! stagevm-hostd end to end: weight with more VMs than cores — who owns
//! the shared cores, and the CPU each VM gets on them — with real
//! test-guest VMs on /dev/kvm under the real daemon binary.

mod common;

use std::time::Duration;

use common::*;
use stagevm_report::api::HostView;
use stagevm_testkit::api::{metric, Api};
use stagevm_testkit::machine::{vm_lock, workspace_binary};

/// Weight with more VMs than cores: three busy VMs on the 2 cores, one of
/// weight 8. The heavy one has both cores as its own and the others share
/// them; on the shared cores the host splits time by the VMs' CPU weights,
/// which the daemon writes in the cgroup it put each VMM in (cgroup v1
/// `cpu.shares` 2048 and 256 here, and each group's `cpuset.cpus`, read
/// back from the group the VMM's `/proc/PID/cgroup` names; where it cannot
/// make groups, the VMMs' vCPU threads' nice 0 and 9), so the heavy VM
/// gets several times the CPU of each light one
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
    let (daemon, log) = start_daemon(&dir, &config, &api);

    // Weights 8, 1, 1 at 2 vCPUs each: CPU weights 200, 25, 25: cgroup v1
    // shares 2048 and 256, or per vCPU 100 and 12.5, nice 0 and 9
    // (host_sched::cpuweight).
    let grouped = |v: &HostView| v.vms.iter().all(|m| m.enforced_by.starts_with("cgroup"));
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
            let shares = [&heavy, &light1, &light2].map(|vm| group_file(vm, "cpu", "cpu.shares"));
            let enforced = if grouped(&v) {
                shares == [Some("2048".into()), Some("256".into()), Some("256".into())]
                    && nice == (vec![0, 0], vec![0, 0], vec![0, 0])
            } else {
                nice == (vec![0, 0], vec![9, 9], vec![9, 9])
            };
            let ok = h.owned == "0-1"
                && vcpu_affinity(&heavy) == "0-1"
                && [l1, l2].iter().all(|l| l.owned.is_empty() && l.shared)
                && (h.cpu_weight, l1.cpu_weight, l2.cpu_weight) == (Some(200), Some(25), Some(25))
                && enforced;
            ok.then_some(())
                .ok_or(format!("nice {nice:?}, shares {shares:?}, {v:?}"))
        },
    );
    let report: stagevm_report::api::StagesView = Api::new(&dir.join("light1.sock"))
        .unwrap()
        .get_json("/api/v1/stages?timeline=0")
        .unwrap();
    let v = view(&api);
    let l1 = vm(&v, "light1");
    assert_eq!(l1.pid, light1.vmm_pid().as_raw() as u32, "{v:?}");
    if grouped(&v) {
        // The daemon's group holds the weight; the VMM was sent none, and
        // each group's CPU set is its cores (no housekeeping cores here:
        // the pool is every CPU).
        assert!(
            l1.enforced_by.ends_with("/stagevm-light1/cpu.shares"),
            "{v:?}"
        );
        assert_eq!(report.sched.cpu_weight, None);
        for (m, name) in [(&heavy, "heavy"), (&light1, "light1"), (&light2, "light2")] {
            let cores = vm(&v, name).cores.clone();
            assert_eq!(
                group_file(m, "cpuset", "cpuset.cpus"),
                Some(cores),
                "{name}: {v:?}"
            );
        }
    } else {
        eprintln!("the daemon could not make groups here: {}", l1.enforced_by);
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
    }
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
        assert_eq!(
            moves(&v),
            before,
            "a core moved: {v:?}\n{}",
            log.lock().unwrap()
        );
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
            let shares = [&light1, &light2].map(|vm| group_file(vm, "cpu", "cpu.shares"));
            let cpus = [&light1, &light2].map(|vm| group_file(vm, "cpuset", "cpuset.cpus"));
            let groups_back = !grouped(&v)
                || (shares == [Some("1024".into()), Some("1024".into())]
                    && cpus
                        .iter()
                        .all(|c| c.as_ref().is_some_and(|c| c.len() == 1))
                    && cpus[0] != cpus[1]);
            let ok = gone
                && one_each(&a, &b)
                && v.vms.iter().all(|m| m.cpu_weight.is_none())
                && nice == (vec![0, 0], vec![0, 0])
                && groups_back;
            ok.then_some(()).ok_or(format!(
                "light1 {a}, light2 {b}, nice {nice:?}, shares {shares:?}, cpus {cpus:?}, {v:?}"
            ))
        },
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
