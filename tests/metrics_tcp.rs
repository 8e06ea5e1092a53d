//! End-to-end: `GET /metrics` over TCP (`--metrics-listen`) for a
//! Prometheus server: it parses as Prometheus text, equals the API
//! socket's scrape of the same moment, carries the build info, the disk
//! counters and the ring back-off counter, and nothing but `/metrics` is
//! served on TCP; Prometheus' own linter (`promtool check metrics`) finds
//! nothing to say about it.

mod common;
#[path = "api/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::*;
use harness::*;

/// `METHOD path` over TCP to 127.0.0.1:`port`; status and body.
fn tcp_http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    parse_answer(&String::from_utf8_lossy(&answer))
}

/// Every sample of a scrape: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{text}"));
    scrape
        .samples
        .iter()
        .flat_map(|s| {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let key = |extra: Option<String>| {
                let mut l = labels.clone();
                l.extend(extra);
                format!("{}{{{}}}", s.metric, l.join(","))
            };
            match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => vec![(key(None), *v)],
                // A histogram's cumulative buckets, one sample each.
                prometheus_parse::Value::Histogram(buckets) => buckets
                    .iter()
                    .map(|b| (key(Some(format!("le={}", b.less_than))), b.count))
                    .collect(),
                other => panic!("{}: {other:?}", s.metric),
            }
        })
        .collect()
}

#[test]
fn metrics_over_tcp_parse_and_equal_the_api_socket_scrape() {
    // A free port of this host's loopback.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let disk = report_path("metrics-disk").with_extension("img");
    std::fs::write(&disk, vec![7u8; 1 << 20]).unwrap();
    let listen = format!("127.0.0.1:{port}");
    let disk_arg = format!("path={},readonly=on", disk.display());
    let vm = Vm::boot_with(
        "iters=1000 threads=2 requests=500",
        &["--metrics-listen", &listen, "--disk", &disk_arg],
    );
    vm.wait_requests(2 * 2 * 500);
    // The guest holds: let the last counter reads land.
    std::thread::sleep(Duration::from_millis(300));
    let (status, unix) = http(&vm.socket, "GET", "/metrics", b"");
    assert_eq!(status, 200, "{unix}");
    let (status, tcp) = tcp_http(port, "GET", "/metrics");
    assert_eq!(status, 200, "{tcp}");
    let (u, t) = (samples(&unix), samples(&tcp));
    assert_eq!(
        u.keys().collect::<Vec<_>>(),
        t.keys().collect::<Vec<_>>(),
        "the same metrics and labels"
    );
    for (key, value) in &u {
        // Idle time and WAIT exits grow while the guest holds (a held vCPU
        // parks 1 s at a time); everything else stands.
        if !key.starts_with("stagevm_vcpu_idle_seconds_total")
            && !key.starts_with("stagevm_waits_total")
        {
            assert_eq!(t[key], *value, "{key}");
        }
    }
    let version = format!("version={}", env!("CARGO_PKG_VERSION"));
    assert!(
        t.iter().any(|(k, v)| k.starts_with("stagevm_build_info{")
            && k.contains(&version)
            && *v == 1.0),
        "{tcp}"
    );
    assert_eq!(
        t["stagevm_disk_read_bytes_total{device=blk0}"],
        (1u64 << 20) as f64
    );
    assert!(t["stagevm_disk_requests_total{device=blk0}"] > 0.0);
    assert_eq!(t["stagevm_ring_full_backoffs_total{}"], 0.0);
    // TCP serves /metrics only: no reading the VM's facts, no shutdown.
    for (method, path) in [("GET", "/api/v1/vm.info"), ("PUT", "/api/v1/vm.shutdown")] {
        let (status, body) = tcp_http(port, method, path);
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(body.contains("serves GET /metrics only"), "{body}");
    }
    let (run, _) = vm.shutdown();
    assert!(
        run.stderr.contains(&format!(
            "stagevm: metrics on http://127.0.0.1:{port}/metrics"
        )),
        "{}",
        run.stderr
    );
    let _ = std::fs::remove_file(&disk);
}

#[test]
fn a_bad_metrics_address_is_named() {
    let guest = guest_image().to_str().unwrap();
    expect_vmm_error(
        &["--kernel", guest, "--metrics-listen", "localhost"],
        &["--metrics-listen localhost: not PORT or ADDR:PORT"],
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    expect_vmm_error(
        &["--kernel", guest, "--metrics-listen", &addr],
        &[&format!("--metrics-listen {addr}: ")],
    );
}

/// `promtool check metrics` (Debian's `prometheus` package), the
/// Prometheus project's own linter, on a scrape of a staged guest with
/// request-latency histograms and CPU figures: no problem reported.
/// Skipped, saying so, where promtool is not installed.
#[test]
fn the_exposition_passes_promtool() {
    let Ok(probe) = Command::new("promtool").arg("--version").output() else {
        eprintln!("skipped: promtool is not installed (Debian's prometheus package; `just setup` installs it)");
        return;
    };
    assert!(probe.status.success());
    let vm = Vm::boot("iters=1000 threads=2 requests=20000");
    vm.wait_requests(2 * 2 * 20_000);
    // Two more policy periods: CPU figures for the last one.
    std::thread::sleep(Duration::from_millis(100));
    let (status, scrape) = http(&vm.socket, "GET", "/metrics", b"");
    assert_eq!(status, 200, "{scrape}");
    for name in [
        "stagevm_request_latency_seconds_bucket",
        "stagevm_request_latency_seconds_count",
        "stagevm_request_cpu_seconds_total",
        "stagevm_vcpu_utilisation_ratio",
        "stagevm_stage_clamps_total",
    ] {
        assert!(scrape.contains(name), "{name} missing:\n{scrape}");
    }
    let (ok, said) = stagevm_testkit::api::promtool_check(&scrape).expect("promtool runs");
    assert!(ok, "promtool: {said}\n{scrape}");
    vm.shutdown();
}

/// A read is a read (issue 36): eight clients scraping `/metrics` over TCP
/// in tight loops beside an honest guest that times every visit must not
/// make the VMM clamp any of its counters (scrapes once read the guest's
/// blocks into the accounting, shrinking the load windows to microseconds),
/// nor change its stage map more often than without them. 4 million
/// requests: ~3.5 s, ~24,000 scrapes here.
#[test]
fn scrape_loops_do_not_disturb_the_accounting() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let vm = Vm::boot_with(
        "iters=1000 threads=2 requests=1000000 timed_every=1",
        &["--metrics-listen", &listen],
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scrapers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _) = tcp_http(port, "GET", "/metrics");
                    assert_eq!(status, 200);
                    n += 1;
                }
                n
            })
        })
        .collect();
    vm.wait_requests(2 * 2 * 1_000_000);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scrapes: u64 = scrapers.into_iter().map(|t| t.join().unwrap()).sum();
    let (_, report) = vm.shutdown();
    let ch = report.stage_channel.unwrap();
    assert!(scrapes > 100, "only {scrapes} scrapes");
    assert_eq!(ch.counter_clamps, 0, "{scrapes} scrapes: {:?}", ch.vcpus);
    assert_eq!(ch.latency.map_or(0, |l| l.clamps), 0);
    // `static` publishes its map once (at REGISTER).
    assert_eq!(report.sched.map_changes, 1);
    eprintln!("{scrapes} scrapes, 0 clamps");
}

/// Issue 36, item 1: TCP clients (no credentials on loopback) hold 300
/// connections open, re-opening each one the server closes, every one
/// with a `GET /metrics` half sent, and 8 more pipeline whole requests
/// without reading the answers. The owner-only API socket keeps its own
/// slots: `vm.info`, a policy change and `vm.shutdown` are answered as
/// fast as before the flood (before the fix they shared one budget of
/// 256 connections: 10 of 10 `vm.info` got `503`).
#[test]
fn a_metrics_flood_leaves_the_api_socket_free() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let vm = Vm::boot_with(
        "iters=1000 threads=2 requests=200",
        &["--metrics-listen", &listen],
    );
    vm.wait_requests(2 * 2 * 200);
    let info = |what: &str| {
        let t = Instant::now();
        let (status, body) = http(&vm.socket, "GET", "/api/v1/vm.info", b"");
        assert_eq!(status, 200, "{what}: {body}");
        t.elapsed()
    };
    let before: Vec<Duration> = (0..10).map(|_| info("before the flood")).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let holder = {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                // Drop the connections the server closed or answered.
                held.retain(|s| {
                    let mut b = [0u8; 256];
                    matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                while held.len() < 300 {
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                        break;
                    };
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
                    s.set_nonblocking(true).unwrap();
                    held.push(s);
                    opened.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            held.len()
        })
    };
    let pipeliners: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    s.set_write_timeout(Some(Duration::from_millis(500)))
                        .unwrap();
                    let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
                    while !stop.load(Ordering::Relaxed) && s.write_all(&req).is_ok() {}
                }
            })
        })
        .collect();
    // The flood is on: 300 held before the operator's requests.
    let deadline = Instant::now() + Duration::from_secs(10);
    while opened.load(Ordering::Relaxed) < 300 {
        assert!(
            Instant::now() < deadline,
            "the flood never reached 300 connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let during: Vec<Duration> = (0..10).map(|_| info("during the flood")).collect();
    let t = vm.put("/api/v1/stages.policy", r#"{"name":"pinned"}"#);
    let (took, view) = follow_map(&vm, t, &[vec![0, 1], vec![0, 1], vec![0, 1]]);
    within_two_periods(took, "stage map, static -> pinned, during the flood");
    assert_eq!(view.sched.policy, "pinned");
    let t0 = Instant::now();
    let (run, report) = vm.shutdown();
    let shutdown = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let still_held = holder.join().unwrap();
    for p in pipeliners {
        p.join().unwrap();
    }
    let max = |v: &[Duration]| v.iter().max().copied().unwrap();
    eprintln!(
        "vm.info before the flood ≤ {:?}, during ≤ {:?}; {} TCP connections opened, {still_held} held at the end; shutdown in {shutdown:?}",
        max(&before),
        max(&during),
        opened.load(Ordering::Relaxed)
    );
    // "Within their usual latency": a few ms here; 250 ms is a loaded
    // machine's margin, far below what a 503 or a queue behind the flood
    // would show.
    assert!(max(&during) < Duration::from_millis(250), "{during:?}");
    assert!(shutdown < Duration::from_secs(5), "{shutdown:?}");
    assert_eq!(report.sched.policy, "pinned", "{run:?}");
}
