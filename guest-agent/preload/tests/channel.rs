//! The guest path without a VM: the preload library in the small C server
//! reports through the stage channel, whose area lives in a memfd; the
//! VMM's real stage device registers it and the VMM's real stage
//! scheduling (`StageSched`: controller, accounting, host-sched policy)
//! plans its maps and reads its counters, as for a Linux guest — this
//! host's CPUs 0..n stand in for vCPUs 0..n (in a guest, CPU i is vCPU i),
//! as in the root `tests/libstage.rs`.
//!
//! Checked: the library opens the channel and registers the map's stages;
//! the first map the VMM plans (`pinned` with the `cohort` visit policy)
//! turns the gate on with that policy — threads bound, cohorts of more than
//! one thread; a FIFO map published mid-run turns it off and releases
//! every thread; the server's answer is unchanged; the VMM's report counts
//! exactly the library's visits per stage and its requests, every one of
//! them timed into the latency histogram, with no drop and no clamp.

mod common;

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use host_sched::config::{Config, Overrides};
use host_sched::topology::Topology;
use hypercall_abi::stage::{
    AreaHeader, Layout, Status, VisitPolicy, AREA_MAGIC, DOORBELL_REGISTER, DOORBELL_STATUS,
};
use stage_device::sched::StageSched;
use stage_device::stage::{host_tsc, StageDevice};
use stagevm_preload::control::mode;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

/// Guest-physical address of the area.
const AREA_GPA: u64 = 0x20_0000;
const STAGES: [&str; 3] = ["parse", "plan", "exec"];

/// This host's CPUs 0..n that stand in for vCPUs (the allowed CPUs counted
/// from 0 without a gap).
fn vcpus() -> u32 {
    let topo = Topology::detect().unwrap();
    (0..64)
        .take_while(|c| topo.allowed.contains(*c))
        .count()
        .max(1) as u32
}

/// The host's TSC rate (kHz), measured against the monotonic clock.
fn tsc_khz() -> u64 {
    let (t0, i0) = (host_tsc(), Instant::now());
    std::thread::sleep(Duration::from_millis(50));
    let us = i0.elapsed().as_micros().max(1);
    (u128::from(host_tsc() - t0) * 1000 / us) as u64
}

/// Polls `cond` every millisecond for up to `limit`; panics with `what`.
fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn in_a_guest_the_vmms_map_sets_the_gate_and_the_vmm_counts_every_visit() {
    let Some(f) = Fixture::new("channel") else {
        return;
    };
    let n = vcpus();
    let layout = Layout::new(n, STAGES.len() as u32, 256)
        .unwrap()
        .with_latency();
    let len = layout.area_size();
    // No MFD_CLOEXEC: the server inherits it (libstage's STAGEVM_FD).
    // SAFETY: a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"stagevm-area".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let memfd = unsafe { File::from_raw_fd(fd) };
    memfd.set_len(len).unwrap();
    let memory = GuestMemoryMmap::<()>::from_ranges_with_files([(
        GuestAddress(AREA_GPA),
        len as usize,
        Some(FileOffset::new(memfd.try_clone().unwrap(), 0)),
    )])
    .unwrap();
    let dev = Arc::new(StageDevice::new(
        Arc::new(memory),
        AREA_GPA + len,
        n,
        tsc_khz(),
        1000,
    ));
    let toml = format!(
        "[host]\ncores = \"0-{}\"\n[policy]\nname = \"pinned\"\nvisit = \"cohort\"\n{}",
        n - 1,
        STAGES
            .iter()
            .map(|s| format!("[[stage]]\nname = \"{s}\"\n"))
            .collect::<String>()
    );
    let config = Config::from_toml(&toml, "channel test").unwrap();
    let setup =
        host_sched::vm::Setup::new(config, &Overrides::default(), Topology::detect().unwrap())
            .unwrap();
    let sched = StageSched::new(&setup, n, Some(dev.clone())).unwrap();

    // 8 workers, one lane (so cohorts can form), every request timed.
    let lane = n as usize - 1;
    let args = ["8", "100000", "300", "--start-delay-ms", "300"];
    let env = [
        ("STAGEVM_FD", fd.to_string()),
        ("STAGEVM_LEN", len.to_string()),
        ("STAGEVM_VCPUS", n.to_string()),
        ("STAGEVM_LANES", lane.to_string()),
        ("STAGEVM_MAX_WAIT_US", "20000".to_string()),
        ("STAGE_TIMED_EVERY", "1".to_string()),
    ];
    let mut cmd = f.command(MAP, &args, &env);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for cpu in 0..n as usize {
                libc::CPU_SET(cpu, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();

    // libstage lays the area out from the library's constructor; the host
    // registers it (the module's doorbell, in a guest) before the workers
    // start.
    wait_for(Duration::from_secs(10), "the area laid out", || {
        let mut magic = [0u8; 8];
        memfd.read_exact_at(&mut magic, 0).is_ok() && u64::from_le_bytes(magic) == AREA_MAGIC
    });
    let register_tsc = std::mem::offset_of!(AreaHeader, register_tsc) as u64;
    memfd
        .write_all_at(&host_tsc().to_le_bytes(), register_tsc)
        .unwrap();
    let pfn = (AREA_GPA >> 12) as u32;
    let registered = dev
        .doorbell(0, DOORBELL_REGISTER, &pfn.to_le_bytes())
        .expect("REGISTER refused");
    assert_eq!(registered.names, STAGES);
    sched.on_register(&registered);
    let mut st = [0u8; 4];
    dev.read_status(0, DOORBELL_STATUS, &mut st);
    assert_eq!(Status::from_u32(u32::from_le_bytes(st)), Some(Status::Ok));

    // The VMM's first map (pinned, cohort) turns the gate on.
    let page = f.page();
    let c = page.get();
    // The library marks the channel open once its open returns, which
    // under load can come after the host's REGISTER above is answered.
    wait_for(Duration::from_secs(10), "the channel open", || {
        c.header.channel.load(Relaxed) == 1
    });
    wait_for(Duration::from_secs(10), "the gate on from the map", || {
        c.mode() == mode::TEMPORAL
    });
    assert_eq!(c.policy(), VisitPolicy::Cohort);
    wait_for(Duration::from_secs(10), "workers bound to the lane", || {
        let masks = worker_masks(pid);
        masks.len() == 8 && masks.iter().all(|m| *m == lane.to_string())
    });
    // Cohorts formed while every worker is bound (the counters' growth
    // over 300 ms).
    let l = &c.lanes[0];
    let counts = || (l.cohorts.load(Relaxed), l.cohort_threads.load(Relaxed));
    let before = counts();
    std::thread::sleep(Duration::from_millis(300));
    let after = counts();
    let (cohorts, served) = (after.0 - before.0, after.1 - before.1);
    // Threads gathered: more than one per cohort on average (~2.5 on an
    // idle machine; a busy neighbour on the lane's CPU delays the wakes
    // that gather them, never below one).
    assert!(
        cohorts > 0 && served > cohorts,
        "cohorts of more than one thread: {served} in {cohorts}"
    );

    // A FIFO map (unstaged, as `auto`'s unstaged epochs publish) turns it
    // off: every waiter released, every thread back on its own CPUs.
    let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    let epoch = c.header.map_epoch.load(Relaxed);
    dev.publish(&[all; 3], 0, VisitPolicy::Fifo);
    wait_for(Duration::from_secs(2), "released by the FIFO map", || {
        c.mode() == mode::OFF
            && c.header.releases.load(Relaxed) == 1
            && l.threads.load(Relaxed) == 0
            && worker_masks(pid).iter().all(|m| *m != lane.to_string())
    });
    assert!(c.header.map_epoch.load(Relaxed) > epoch);

    let out = wait_bounded(child, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stage channel open"), "{stderr}");
    assert_eq!(checksum(&out), f.reference(&args[..3]));

    // The VMM counted what the library counted.
    let report = sched.finish().0.expect("a channel report");
    let visits = c.stage_visits();
    assert_eq!(visits[..3], [800_000; 3]);
    let events: Vec<u64> = report.stages.iter().map(|s| s.events).collect();
    assert_eq!(events, visits[..3], "{report:#?}");
    // Each thread's first request marker ends no request.
    assert_eq!(report.requests, c.requests() - 8, "{report:#?}");
    assert_eq!(report.counter_clamps, 0);
    assert_eq!(report.dropped, 0);
    assert_eq!(c.header.channel_drops.load(Relaxed), 0);
    let latency = report.latency.as_ref().expect("request latency");
    assert_eq!(latency.samples, report.requests, "{latency:#?}");
    assert!(latency.p99_us > 0.0);
    eprintln!(
        "report: {} requests, p50 {:.1} µs, p99 {:.1} µs; {} maps followed",
        report.requests,
        latency.p50_us,
        latency.p99_us,
        c.header.map_changes.load(Relaxed)
    );
}
