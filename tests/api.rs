//! End-to-end: the operator API (`--api-socket`) on a running staged guest.
//! Changes of policy and budgets are followed by the stage map and by the
//! thread affinities read back from `/proc` within 2 policy periods and
//! recorded in the timeline with source `api`; `/metrics` parses as
//! Prometheus text with the client library's parser and its counters equal
//! the final JSON report's; bad requests are answered with the right status
//! and change nothing; `stagevm-remote` talks to the same socket.

mod common;
#[path = "api/harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use harness::*;
use stagevm_report::api::VmInfo;
use stagevm_report::Report;

#[test]
fn changes_follow_within_two_periods_and_metrics_equal_the_report() {
    // 2 vCPUs × 2 threads × 40,000 requests: a few seconds of staged work.
    let vm = Vm::boot("iters=1000 threads=2 requests=40000 work=100");
    let pid = vm.pid();
    let info: VmInfo = vm.get("/api/v1/vm.info");
    assert_eq!(
        (info.policy.as_str(), info.vcpu_count, info.state.as_str()),
        ("static", 2, "running")
    );
    assert!(info.helpers.iter().any(|h| h.name == "api"), "{info:?}");
    let mode = std::fs::metadata(&vm.socket).unwrap();
    assert!(mode.file_type().is_socket());
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);

    // static: parse on vCPU 0 (core 0), plan and execute on vCPU 1 (core 1).
    let staged = [vec![0], vec![1], vec![1]];
    let all = [vec![0, 1], vec![0, 1], vec![0, 1]];
    follow_map(&vm, Instant::now(), &staged);
    let t = vm.put("/api/v1/stages.policy", r#"{"name":"pinned"}"#);
    let (took, view) = follow_map(&vm, t, &all);
    within_two_periods(took, "stage map, static -> pinned");
    assert_eq!(view.sched.policy, "pinned");
    let t = vm.put("/api/v1/stages.policy", r#"{"name":"static"}"#);
    let (took, _) = follow_map(&vm, t, &staged);
    within_two_periods(took, "stage map, pinned -> static");
    follow(pid, Instant::now(), &[("vcpu0", "0"), ("vcpu1", "1")]);
    // static and pinned pin vCPU v to core v; off lets both float.
    let t = vm.put("/api/v1/stages.policy", r#"{"name":"off"}"#);
    let took = follow(pid, t, &[("vcpu0", "0-1"), ("vcpu1", "0-1")]);
    within_two_periods(took, "affinities, static -> off");
    let t = vm.put("/api/v1/stages.policy", r#"{"name":"static"}"#);
    let took = follow(pid, t, &[("vcpu0", "0"), ("vcpu1", "1")]);
    within_two_periods(took, "affinities, off -> static");

    // A budget change that moves a core: stage cores 1, housekeeping 0.
    // Every vCPU goes to core 1, every helper (the API's own thread among
    // them) to core 0: the API thread uses no stage core.
    let budgets = r#"{"host":{"cores":"1","housekeeping":"0"},"stage":[{"name":"parse","max_cores":1},{"name":"plan"},{"name":"execute"}]}"#;
    let t = vm.put("/api/v1/stages.budgets", budgets);
    let took = follow(
        pid,
        t,
        &[
            ("vcpu0", "1"),
            ("vcpu1", "1"),
            ("api", "0"),
            ("stage-sched", "0"),
            ("stagevm", "0"),
        ],
    );
    within_two_periods(took, "affinities, budgets cores 1 / housekeeping 0");
    // And back: both cores serve stages again.
    let t = vm.put("/api/v1/stages.budgets", r#"{"host":{"cores":"0-1"}}"#);
    let took = follow(pid, t, &[("vcpu0", "0"), ("vcpu1", "1"), ("api", "0-1")]);
    within_two_periods(took, "affinities, budgets back to cores 0-1");

    vm.wait_requests(2 * 2 * 40_000);
    // The guest holds: let the last drains land, then read the metrics.
    std::thread::sleep(Duration::from_millis(300));
    let (status, text) = http(&vm.socket, "GET", "/metrics", b"");
    assert_eq!(status, 200, "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{text}"));
    let (run, report) = vm.shutdown();

    // The timeline records each change with source `api`.
    let api: Vec<&str> = report
        .sched
        .timeline
        .iter()
        .filter(|t| t.source.as_deref() == Some("api"))
        .filter_map(|t| t.decision.as_deref())
        .collect();
    let expected = [
        "applied: policy pinned",
        "applied: policy static",
        "applied: policy off",
        "applied: policy static",
        "applied: budgets: cores 1, housekeeping 0",
        "applied: budgets: cores 0-1",
    ];
    assert_eq!(api.len(), expected.len(), "{api:?}");
    for (got, want) in api.iter().zip(expected) {
        assert!(got.starts_with(want), "{api:?}");
    }

    // Every counter of the scrape equals the final report's.
    let ch = report.stage_channel.as_ref().unwrap();
    let value = |name: &str, stage: Option<&str>| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && stage.is_none_or(|st| s.labels.get("stage") == Some(st)))
            .unwrap_or_else(|| panic!("no {name} {stage:?} in\n{text}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    for st in &ch.stages {
        assert_eq!(
            value("stagevm_stage_events_total", Some(&st.name)),
            st.events as f64,
            "{}",
            st.name
        );
        assert_eq!(
            value("stagevm_stage_migrations_total", Some(&st.name)),
            st.migrations_in as f64,
            "{}",
            st.name
        );
        assert!(st.events > 0);
    }
    assert_eq!(value("stagevm_requests_total", None), ch.requests as f64);
    assert_eq!(ch.requests, 2 * 2 * 40_000, "{}", run.stdout);
    assert_eq!(value("stagevm_ring_dropped_total", None), ch.dropped as f64);
    assert_eq!(
        value("stagevm_ring_events_total", None),
        ch.vcpus.iter().map(|v| v.events).sum::<u64>() as f64
    );
    assert_eq!(
        value("stagevm_map_changes_total", None),
        report.sched.map_changes as f64
    );
    assert_eq!(value("stagevm_map_epoch", None), ch.map_epoch as f64);
}

#[test]
fn remote_cli_reads_and_changes_the_vm() {
    let vm = Vm::boot("iters=1000 threads=1 requests=2000");
    vm.wait_requests(2 * 2000);
    let client = Remote::new(env!("CARGO_BIN_EXE_stagevm-remote"), &vm.socket);
    let remote = |args: &[&str]| {
        let out = client.run(args).unwrap();
        (out.status.code().unwrap(), out.stdout, out.stderr)
    };
    let (code, out, _) = remote(&["stages"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("policy static"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("parse ")), "{out}");
    let (code, out, _) = remote(&["info"]);
    assert_eq!(code, 0);
    assert!(serde_json::from_str::<VmInfo>(&out).is_ok(), "{out}");
    // A refused change: exit 1 and the key and value on one line.
    let (code, _, err) = remote(&["policy", "fastest"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("policy.name = 'fastest': unknown policy") && err.lines().count() == 1,
        "{err}"
    );
    let budgets = report_path("api-budgets").with_extension("toml");
    std::fs::write(&budgets, "[host]\ncores = \"0-7\"\n").unwrap();
    let (code, _, err) = remote(&["budgets", budgets.to_str().unwrap()]);
    let _ = std::fs::remove_file(&budgets);
    assert_eq!(code, 1);
    assert!(err.contains("host.cores = '0-7'"), "{err}");
    // auto's latency bound, refused naming key and value.
    let (code, _, err) = remote(&["policy", "auto", "--max-p99-increase", "-1"]);
    assert_eq!(code, 1);
    assert!(err.contains("policy.max_p99_increase = -1"), "{err}");
    let (code, out, _) = remote(&["policy", "pinned", "--period-ms", "50"]);
    assert_eq!(
        (code, out.trim()),
        (0, r#"{"accepted":"policy pinned, period_ms 50"}"#)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while vm.stages().sched.policy != "pinned" {
        assert!(Instant::now() < deadline, "the change was never applied");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, out, _) = remote(&["stages"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("policy pinned · visit fifo · period 50 ms"),
        "{out}"
    );
    assert!(
        out.contains("[api]: applied: policy pinned, period_ms 50"),
        "{out}"
    );
    // The CPU weight: its own change; a bad one named by the client or
    // the VM.
    let (code, out, _) = remote(&["cpu-weight", "200"]);
    assert_eq!((code, out.trim()), (0, r#"{"accepted":"cpu_weight 200"}"#));
    let (code, _, err) = remote(&["cpu-weight", "heavy"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cpu-weight 'heavy'"), "{err}");
    let (code, _, err) = remote(&["cpu-weight", "20000"]);
    assert_eq!(code, 1);
    assert!(err.contains("host.cpu_weight = 20000"), "{err}");
    let (code, out, _) = remote(&["cpu-weight", "none"]);
    assert_eq!((code, out.trim()), (0, r#"{"accepted":"cpu_weight none"}"#));
    let (code, out, _) = remote(&["metrics"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("stagevm_stage_events_total{stage=\"parse\"} 4000"),
        "{out}"
    );
    assert!(out.contains("stagevm_trace_every 0"), "{out}");
    // The trace, live: asked of the guest at once, in the view and metrics.
    let (code, out, _) = remote(&["trace", "every=4"]);
    assert_eq!(
        (code, out.trim()),
        (0, r#"{"accepted":"trace every 4th event"}"#)
    );
    assert_eq!(vm.stages().stage_channel.unwrap().trace_every, 4);
    let (code, out, _) = remote(&["metrics"]);
    assert_eq!(code, 0);
    assert!(out.contains("stagevm_trace_every 4"), "{out}");
    let (code, _, err) = remote(&["trace", "every=0"]);
    assert_eq!(code, 2, "a bad setting is refused by the client: {err}");
    assert!(err.contains("every=0"), "{err}");
    let (code, out, _) = remote(&["trace", "off"]);
    assert_eq!((code, out.trim()), (0, r#"{"accepted":"trace off"}"#));
    // Unreachable socket: exit 2.
    let out = Remote::new(env!("CARGO_BIN_EXE_stagevm-remote"), "/nonexistent/socket")
        .run(&["info"])
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let (code, _, _) = remote(&["shutdown"]);
    assert_eq!(code, 0);
    let (_, report) = {
        let mut vm = vm;
        let run = wait(vm.child.take().unwrap(), Duration::from_secs(30));
        assert_eq!(run.code(), 0, "{run:#?}");
        (run, Report::read(&vm.report).unwrap())
    };
    assert_eq!(report.sched.policy, "pinned");
    assert_eq!(report.sched.period_ms, 50);
}

/// The stage-visit policy (temporal staging) end to end: the `--stages`
/// file's `visit = "cohort"` shows in `vm.info`, `/stages`, `/metrics` and
/// the guest uses it; a live change of the visit policy alone (the same
/// `static` plan otherwise) is published in a new stage map within 2
/// policy periods, the guest uses it from that very map, and the timeline
/// and the final report record it; an unknown visit policy is refused
/// naming it.
#[test]
fn visit_policy_is_shown_and_changed_live() {
    // Long enough (~10 s) that the guest still schedules when the visit
    // policy changes: it prints each policy its map names.
    // The visit policy of the `--stages` file (`[policy] visit`).
    let config = CONFIG.replace("period_ms = 100\n", "period_ms = 100\nvisit = \"cohort\"\n");
    assert!(config.contains("visit = \"cohort\""));
    let vm = Vm::boot_config(&config, "iters=1000 threads=2 requests=1500000", &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vm.stages().stage_channel.is_some_and(|c| c.registered) {
        assert!(Instant::now() < deadline, "the guest never registered");
        std::thread::sleep(Duration::from_millis(10));
    }
    let info: VmInfo = vm.get("/api/v1/vm.info");
    assert_eq!(
        (info.policy.as_str(), info.visit.as_str()),
        ("static", "cohort")
    );
    assert_eq!(vm.stages().sched.visit, "cohort");
    let metrics = || {
        let (status, text) = http(&vm.socket, "GET", "/metrics", b"");
        assert_eq!(status, 200, "{text}");
        text
    };
    let text = metrics();
    // Info gauges carry `_info` (Prometheus' naming rule), the vCPUs'
    // cores among them.
    assert!(
        text.contains("# TYPE stagevm_vcpu_core_info gauge")
            && text.contains("stagevm_vcpu_core_info{core=\"0\",vcpu=\"0\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE stagevm_visit_policy_info gauge")
            && text.contains("stagevm_visit_policy_info{policy=\"cohort\"} 1"),
        "{text}"
    );

    // An unknown visit policy: 400, one line naming key and value, nothing
    // queued.
    let body = br#"{"name":"static","visit":"lifo"}"#;
    let (status, answer) = http(&vm.socket, "PUT", "/api/v1/stages.policy", body);
    assert_eq!(status, 400, "{answer}");
    let error: stagevm_report::api::ApiError = serde_json::from_str(&answer).unwrap();
    assert!(
        error
            .error
            .contains("policy.visit = 'lifo': unknown visit policy")
            && !error.error.contains('\n'),
        "{error:?}"
    );
    assert_eq!(vm.stages().pending, None);

    // The visit policy alone changes: the stage map is published again.
    let epoch = vm.stages().stage_channel.unwrap().map_epoch;
    let t = vm.put(
        "/api/v1/stages.policy",
        r#"{"name":"static","visit":"srpt"}"#,
    );
    let deadline = t + Duration::from_secs(5);
    loop {
        let view = vm.stages();
        let now_epoch = view.stage_channel.map_or(0, |c| c.map_epoch);
        if view.sched.visit == "srpt" && now_epoch > epoch {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "visit {} epoch {now_epoch} (was {epoch})",
            view.sched.visit
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    within_two_periods(t.elapsed(), "visit policy, cohort -> srpt");
    let new_epoch = vm.stages().stage_channel.map_or(0, |c| c.map_epoch);
    let info: VmInfo = vm.get("/api/v1/vm.info");
    assert_eq!(info.visit, "srpt");
    let text = metrics();
    assert!(
        text.contains("stagevm_visit_policy_info{policy=\"srpt\"} 1")
            && !text.contains("policy=\"cohort\""),
        "{text}"
    );

    // Let the guest's vCPU 0 print what its next pick read.
    std::thread::sleep(Duration::from_millis(200));
    let (run, report) = vm.shutdown();
    // The guest used the policy of the file and then the API's, from the
    // very map that carried it (its scheduler reads the map at every pick).
    let said: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("testguest: visit policy"))
        .collect();
    assert_eq!(
        said,
        [
            "testguest: visit policy cohort (map epoch 2)".to_string(),
            format!("testguest: visit policy srpt (map epoch {new_epoch})"),
        ],
        "{}",
        run.stdout
    );
    assert_eq!(report.sched.visit, "srpt");
    assert!(
        run.stderr
            .contains("stagevm: policy static (period 100 ms, visit srpt)"),
        "{}",
        run.stderr
    );
    // The timeline: cohort until the change, srpt from the period that
    // applied it on.
    let tl = &report.sched.timeline;
    let at = tl
        .iter()
        .position(|e| e.source.as_deref() == Some("api"))
        .unwrap_or_else(|| panic!("no api entry: {tl:?}"));
    assert_eq!(
        tl[at].decision.as_deref(),
        Some("applied: policy static, visit srpt")
    );
    assert!(tl[..at].iter().all(|e| e.visit == "cohort"), "{tl:?}");
    assert!(tl[at..].iter().all(|e| e.visit == "srpt"), "{tl:?}");
    assert!(tl[at].map_changed, "{:?}", tl[at]);
}

#[test]
fn bad_requests_are_answered_and_change_nothing() {
    let vm = Vm::boot("iters=1000 threads=1 requests=1000");
    vm.wait_requests(2 * 1000);
    let before = vm.stages();
    let big = vec![b' '; 64 * 1024 + 1];
    let policy = "/api/v1/stages.policy";
    let budgets = "/api/v1/stages.budgets";
    // (what, method, path, body, status, text the answer must contain)
    type Case<'a> = (&'a str, &'a str, &'a str, &'a [u8], u16, &'a str);
    let cases: Vec<Case> = vec![
        ("malformed JSON", "PUT", policy, br#"{"name":"#, 400, "body: EOF"),
        ("not JSON", "PUT", policy, b"hello", 400, "body: expected"),
        ("empty body", "PUT", policy, b"", 400, "body: EOF"),
        ("wrong type", "PUT", policy, br#"{"name":5}"#, 400, "invalid type"),
        ("unknown field", "PUT", policy, br#"{"name":"static","speed":1}"#, 400, "unknown field `speed`"),
        ("unknown field in a stage", "PUT", budgets, br#"{"stage":[{"name":"parse","cores":1}]}"#, 400, "unknown field `cores`"),
        ("body over 64 KiB", "PUT", policy, &big, 413, "larger than 65536 bytes"),
        ("no such policy", "PUT", policy, br#"{"name":"fastest"}"#, 400, "policy.name = 'fastest': unknown policy"),
        ("period 0", "PUT", policy, br#"{"name":"static","period_ms":0}"#, 400, "policy.period_ms = 0"),
        ("smoothing 2", "PUT", policy, br#"{"name":"proportional","smoothing":2.0}"#, 400, "policy.smoothing = 2"),
        ("negative hysteresis", "PUT", policy, br#"{"name":"proportional","hysteresis":-1}"#, 400, "policy.hysteresis = -1"),
        ("negative p99 increase", "PUT", policy, br#"{"name":"auto","max_p99_increase":-0.5}"#, 400, "policy.max_p99_increase = -0.5"),
        ("SLO beyond 1000 s", "PUT", policy, br#"{"name":"auto","latency_slo_us":2e9}"#, 400, "policy.latency_slo_us = 2000000000"),
        ("unknown stage", "PUT", budgets, br#"{"stage":[{"name":"nosuch"}]}"#, 400, "'nosuch'"),
        ("cores not online", "PUT", budgets, br#"{"host":{"cores":"0-99"}}"#, 400, "host.cores = '0-99': CPU 2 is not online"),
        ("not a cpulist", "PUT", budgets, br#"{"host":{"cores":"x"}}"#, 400, "host.cores = 'x'"),
        ("housekeeping overlaps", "PUT", budgets, br#"{"host":{"cores":"0-1","housekeeping":"1"}}"#, 400, "host.housekeeping = '1': overlaps"),
        ("min above max", "PUT", budgets, br#"{"stage":[{"name":"parse","min_cores":2,"max_cores":1}]}"#, 400, "min_cores = 2 > max_cores = 1"),
        ("negative weight", "PUT", budgets, br#"{"stage":[{"name":"parse","weight":-1}]}"#, 400, "weight"),
        ("stage twice", "PUT", budgets, br#"{"stage":[{"name":"parse"},{"name":"parse"}]}"#, 400, "defined twice"),
        ("max cores too few", "PUT", budgets, br#"{"stage":[{"name":"parse","max_cores":0},{"name":"plan","max_cores":0},{"name":"execute","max_cores":1}]}"#, 400, "max_cores"),
        ("GET of a PUT path", "GET", policy, b"", 405, "accepts PUT only"),
        ("PUT of a GET path", "PUT", "/api/v1/stages", b"{}", 405, "accepts GET only"),
        ("unknown path", "GET", "/api/v2/stages", b"", 404, "no such path"),
        ("bad timeline count", "GET", "/api/v1/stages?timeline=x", b"", 400, "timeline = 'x'"),
        ("unknown query", "GET", "/api/v1/stages?verbose=1", b"", 400, "unknown query parameter 'verbose=1'"),
        ("trace every too large", "PUT", "/api/v1/stages.trace", br#"{"every":1000000001}"#, 400, "every = 1000000001: at most 1000000000"),
        ("trace not a count", "PUT", "/api/v1/stages.trace", br#"{"every":"on"}"#, 400, "invalid type"),
        ("trace unknown field", "PUT", "/api/v1/stages.trace", br#"{"every":1,"file":"x"}"#, 400, "unknown field `file`"),
    ];
    for (what, method, path, body, status, needle) in &cases {
        let (got, answer) = http(&vm.socket, method, path, body);
        assert_eq!(got, *status, "{what}: {answer}");
        let error: stagevm_report::api::ApiError =
            serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{what}: {e}: {answer}"));
        assert!(
            error.error.contains(needle),
            "{what}: {:?} lacks {needle:?}",
            error.error
        );
    }
    // Over 64 KiB without Content-Length (chunked): 413 as well.
    let mut chunked = format!("PUT {policy} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
    for _ in 0..17 {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend_from_slice(&[b' '; 0x1000]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(raw(&vm.socket, &chunked).0, 413, "chunked body over 64 KiB");
    // Not HTTP at all.
    assert_eq!(
        raw(&vm.socket, b"GARBAGE\r\n\r\n").0,
        400,
        "a request line that is not HTTP"
    );

    // A client that connects and never sends, and one that never sends its
    // body: both are closed by the server's time-outs, while 100 concurrent
    // connections are all answered meanwhile.
    let silent = UnixStream::connect(&vm.socket).unwrap();
    let mut stalled = UnixStream::connect(&vm.socket).unwrap();
    stalled
        .write_all(
            format!("PUT {policy} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{").as_bytes(),
        )
        .unwrap();
    let t0 = Instant::now();
    let clients: Vec<_> = (0..100)
        .map(|_| {
            let socket = vm.socket.clone();
            std::thread::spawn(move || http(&socket, "GET", "/api/v1/stages", b"").0)
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), 200);
    }
    let closed_after = |mut s: UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        (t0.elapsed(), String::from_utf8_lossy(&answer).into_owned())
    };
    let (t, answer) = closed_after(silent);
    assert!(
        answer.is_empty() && t < Duration::from_secs(10),
        "silent client: {t:?} {answer:?}"
    );
    let (t, answer) = closed_after(stalled);
    assert!(
        t < Duration::from_secs(12),
        "stalled body closed after {t:?}"
    );
    assert!(
        answer.is_empty() || parse_answer(&answer).0 == 408,
        "{answer}"
    );

    // Nothing was applied, half-way or otherwise, and the VM still runs.
    let after = vm.stages();
    assert_eq!(after.pending, None);
    assert_eq!(after.sched.policy, before.sched.policy);
    assert_eq!(after.sched.stage_cores, before.sched.stage_cores);
    assert_eq!(after.sched.map_changes, before.sched.map_changes);
    assert_eq!(
        after.stage_channel.as_ref().map(|c| c.trace_every),
        before.stage_channel.as_ref().map(|c| c.trace_every),
        "a refused trace body changed the trace"
    );
    assert!(after.sched.timeline.iter().all(|t| t.source.is_none()));
    let info: VmInfo = vm.get("/api/v1/vm.info");
    assert_eq!(info.state, "running");
    let (_, report) = vm.shutdown();
    assert!(report.sched.timeline.iter().all(|t| t.source.is_none()));
    assert_eq!(report.sched.policy, "static");
    assert!(cases.len() + 4 >= 20);
}

#[test]
fn a_socket_in_use_is_refused_and_a_stale_one_replaced() {
    let vm = Vm::boot("iters=1000 threads=1 requests=10");
    let args = [
        "--kernel",
        guest_image().to_str().unwrap(),
        "--api-socket",
        vm.socket.to_str().unwrap(),
    ];
    // A second VMM on the same path is refused before boot (exit 1)...
    expect_vmm_error(&args, &["--api-socket", "in use by a running process"]);
    drop(vm);
    // ...a regular file is not replaced...
    let file = report_path("api-file").with_extension("sock");
    std::fs::write(&file, "x").unwrap();
    let args = [
        "--kernel",
        guest_image().to_str().unwrap(),
        "--api-socket",
        file.to_str().unwrap(),
    ];
    expect_vmm_error(&args, &["exists and is not a socket"]);
    let _ = std::fs::remove_file(&file);
    // ...and a socket nobody serves (a VMM that was killed) is.
    let stale = report_path("api-stale").with_extension("sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let _lock = vm_lock();
    let run = run(&[
        "--kernel",
        guest_image().to_str().unwrap(),
        "--api-socket",
        stale.to_str().unwrap(),
        "--cmdline",
        "iters=1000 requests=10",
    ]);
    assert_eq!(run.code(), 0, "{run:#?}");
    assert!(!stale.exists());
}
