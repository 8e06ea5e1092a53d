//! stagevm-discover end to end on a small multi-stage C server built here
//! (`tests/server/stageserver.c`): the server traced under the real
//! stgtrace Valgrind tool while its own load drives it, the request-level
//! discovery and replays in the real `stagesim`, a stage map the Linux
//! agent's parser (`stagectl --map-file`) accepts, and the server stopped
//! afterwards; then each bad input's error.
//!
//! Needs a C compiler, make and Valgrind (Debian's `valgrind`, `just setup`
//! installs it); without them the tests say "skipped" (under CI they fail).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use stagevm_testkit::machine::{repo_root, workspace_binary};

/// What the tests need, built once: the server (with symbols, and
/// stripped), the stgtrace tool, stagesim and stagectl.
struct Kit {
    dir: PathBuf,
    server: PathBuf,
    stripped: PathBuf,
    renamed: PathBuf,
    tool: PathBuf,
    stagesim: PathBuf,
    stagectl: PathBuf,
}

fn need(ok: bool, what: &str) -> Option<()> {
    if ok {
        return Some(());
    }
    assert!(std::env::var("CI").is_err(), "{what} missing under CI");
    eprintln!("skipped: needs {what}");
    None
}

fn sh(cmd: &mut Command, what: &str) -> bool {
    match cmd.output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => panic!(
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => false,
    }
}

fn kit() -> Option<&'static Kit> {
    static KIT: OnceLock<Option<Kit>> = OnceLock::new();
    KIT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("discover-e2e");
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/stageserver.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let build = |out: &Path, extra: &[&str]| {
            sh(
                Command::new(&cc)
                    .args(["-O1", "-pthread"])
                    .args(extra)
                    .arg("-o")
                    .arg(out)
                    .arg(&src),
                "cc stageserver.c",
            )
        };
        let server = dir.join("stageserver");
        let stripped = dir.join("stageserver-stripped");
        let renamed = dir.join("stageserver-renamed");
        need(build(&server, &[]), "a C compiler (cc)")?;
        need(build(&stripped, &["-s"]), "a C compiler (cc)")?;
        need(
            build(&renamed, &["-Dhandle_request=serve_one"]),
            "a C compiler (cc)",
        )?;
        need(
            Path::new("/usr/include/valgrind/pub_tool_tooliface.h").exists(),
            "valgrind (apt-get install valgrind)",
        )?;
        let root = repo_root();
        sh(
            &mut Command::new(root.join("discover/stgtrace/build_tool.sh")),
            "discover/stgtrace/build_tool.sh",
        );
        let tool = root.join("target/capture-build/stgtrace-amd64-linux");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("discover-stagectl");
        need(
            sh(
                Command::new("make")
                    .args(["-s", "-C"])
                    .arg(root.join("guest-agent/linux"))
                    .arg(format!("BUILD={}", out.display()))
                    .arg("stagectl"),
                "make stagectl",
            ),
            "make",
        )?;
        Some(Kit {
            dir,
            server,
            stripped,
            renamed,
            tool,
            stagesim: workspace_binary("stagesim", "stagesim"),
            stagectl: out.join("stagectl/stagectl"),
        })
    })
    .as_ref()
}

/// A TCP port free on loopback now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs stagevm-discover with `args`.
fn discover(k: &Kit, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stagevm-discover"))
        .args(args)
        .env("STAGEVM_STGTRACE", &k.tool)
        .env("STAGEVM_STAGESIM", &k.stagesim)
        .output()
        .expect("run stagevm-discover")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_small_server_is_traced_and_discovered_and_stagectl_accepts_its_map() {
    let Some(k) = kit() else { return };
    let port = free_port().to_string();
    let srv = k.server.display().to_string();
    let map = k.dir.join("stageserver.stagemap");
    let work = k.dir.join("work");
    let _ = std::fs::remove_file(&map);
    let load = format!("{srv} load {port} 4 100");
    let o = discover(
        k,
        &[
            "--binary",
            &srv,
            "--stages",
            "2..3",
            "--cores",
            "2",
            "--l2",
            "256K",
            "--load",
            &load,
            "--out",
            &map.display().to_string(),
            "--work-dir",
            &work.display().to_string(),
            "--",
            &srv,
            "serve",
            &port,
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "stagevm-discover failed:\n{out}\n{err}");
    eprintln!("{out}");
    // The report: 400 requests (4 clients × 100), the marker found by
    // default, the points among the stage entries, a verdict.
    let traced = out
        .lines()
        .find(|l| l.contains("traced:"))
        .unwrap_or_else(|| panic!("{out}"));
    let requests: u64 = traced
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!((300..=400).contains(&requests), "{traced}");
    assert!(traced.contains("marker handle_request"), "{traced}");
    assert!(
        out.contains("verdict:") && out.contains("throughput"),
        "{out}"
    );
    // By default the model is temporal staging, its switch cost the gate's
    // handoff measured on this host, and the verdict names the mechanism.
    assert!(
        err.contains("measuring the stage point and the gate's handoff")
            && out.contains("temporal staging by the preload library's gate (SRPT), a switch")
            && out.contains("the gate's handoff measured here")
            && out.contains("stage switches"),
        "{out}\n{err}"
    );
    let verdict = out.lines().find(|l| l.contains("verdict:")).unwrap();
    assert!(
        verdict.contains("temporal staging (the preload library's gate)"),
        "{verdict}"
    );
    assert!(out.contains("LD_PRELOAD=libstagevm_preload.so"), "{out}");
    // The map: 2 or 3 stages, each starting at a function a request calls once.
    let text = std::fs::read_to_string(&map).unwrap();
    let m = stagesim::stagemap::StageMapFile::parse(&text).unwrap();
    assert!((2..=3).contains(&m.stages.len()), "{text}");
    let once = [
        "handle_request",
        "parse_request",
        "plan_request",
        "execute_request",
        "read_line",
    ];
    for s in &m.stages {
        assert!(
            s.symbols.iter().all(|f| once.contains(&f.as_str())),
            "{text}"
        );
    }
    let c = Command::new(&k.stagectl)
        .arg("--map-file")
        .arg(&map)
        .output()
        .unwrap();
    assert!(
        c.status.success(),
        "stagectl --map-file:\n{}",
        String::from_utf8_lossy(&c.stderr)
    );
    // The trace and its sidecar stayed in --work-dir; the server is gone
    // (its port binds again).
    assert!(work.join("trace.zst").metadata().unwrap().len() > 0);
    assert!(std::fs::read_to_string(work.join("trace.zst.stages.toml"))
        .unwrap()
        .contains("handle_request"));
    TcpListener::bind(format!("127.0.0.1:{port}")).expect("the server was stopped");
}

#[test]
fn bad_inputs_get_errors_that_say_what_is_wrong_and_what_to_do() {
    let Some(k) = kit() else { return };
    let port = free_port().to_string();
    let srv = k.server.display().to_string();
    let load = format!("{srv} load {port} 1 5");
    let run = |bin: &Path, load: &str, extra: &[&str], server_args: &[&str]| {
        let b = bin.display().to_string();
        let mut a: Vec<&str> = vec!["--binary", &b, "--load", load, "--ready-timeout", "60"];
        a.extend(extra);
        a.push("--");
        a.push(&b);
        a.extend(server_args);
        let o = discover(k, &a);
        assert!(!o.status.success(), "{a:?} succeeded");
        text(&o).1
    };
    let serve = ["serve", port.as_str()];
    let e = run(&k.stripped, &load, &[], &serve);
    assert!(
        e.contains(".symtab") && e.contains(".dynsym") && e.contains("stripped"),
        "{e}"
    );
    let e = run(&k.renamed, &load, &[], &serve);
    assert!(
        e.contains("no request marker found") && e.contains("--request SYMBOL"),
        "{e}"
    );
    let e = run(&k.server, &load, &["--request", "request"], &serve);
    assert!(
        e.contains("--request request: no function") && e.contains("handle_request"),
        "{e}"
    );
    let e = run(&k.server, &load, &[], &["serve", "notaport"]);
    assert!(
        e.contains("exited early") && e.contains("bad port 'notaport'"),
        "{e}"
    );
    let e = run(&k.server, "echo boom; exit 3", &[], &serve);
    assert!(e.contains("load command") && e.contains("boom"), "{e}");
    let e = run(&k.server, "true", &[], &serve);
    assert!(
        e.contains("no request was traced") && e.contains("--request"),
        "{e}"
    );
    // Every failed capture stopped its server.
    TcpListener::bind(format!("127.0.0.1:{port}")).expect("the server was stopped");
    let e = run(&k.server, &load, &["--stages", "1..9"], &serve);
    assert!(e.contains("'1..9'"), "{e}");
    // A --ready command that never succeeds.
    let b = k.server.display().to_string();
    let o = discover(
        k,
        &[
            "--binary",
            &b,
            "--load",
            &load,
            "--ready",
            "false",
            "--ready-timeout",
            "2",
            "--",
            &b,
            "serve",
            &port,
        ],
    );
    let e = text(&o).1;
    assert!(
        !o.status.success() && e.contains("not ready within 2 s (`false` succeeding)"),
        "{e}"
    );
    // The model's settings are checked before the capture.
    let e = run(&k.server, &load, &["--l2", "100K"], &serve);
    assert!(
        e.contains("--l2: 100 KiB") && !e.contains("starting the server"),
        "{e}"
    );
    let e = run(&k.server, &load, &["--l2", "2G"], &serve);
    assert!(e.contains("'2G'"), "{e}");
    let e = run(&k.server, &load, &["--cores", "0"], &serve);
    assert!(e.contains("--cores 0"), "{e}");
    let e = run(&k.server, &load, &["--switch-ns", "2e6"], &serve);
    assert!(e.contains("--switch-ns 2000000: must be"), "{e}");
    let spatial = ["--mechanism", "linux", "--switch-ns", "3000"];
    let e = run(&k.server, &load, &spatial, &serve);
    assert!(e.contains("--switch-ns is the temporal"), "{e}");
}

#[test]
fn a_capture_is_bounded_in_traced_instructions_and_in_time() {
    let Some(k) = kit() else { return };
    let port = free_port().to_string();
    let srv = k.server.display().to_string();
    let trace = k.dir.join("bounded.zst");
    // 400 requests are ~9.6 M instructions; the bound stops tracing at the
    // first request start after 2 M. The load then sleeps: --duration stops it.
    let load = format!("{srv} load {port} 4 100; sleep 600");
    let t0 = std::time::Instant::now();
    let o = discover(
        k,
        &[
            "--binary",
            &srv,
            "--max-instrs",
            "2000000",
            "--duration",
            "3",
            "--trace-only",
            &trace.display().to_string(),
            "--load",
            &load,
            "--",
            &srv,
            "serve",
            &port,
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        err.contains("--duration 3 s reached: the load is stopped"),
        "{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("] traced "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("(--max-instrs reached)"), "{line}");
    let instrs: u64 = line
        .split("traced ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // At most one more request (~24 000 instructions) per connection thread past the bound.
    assert!((2_000_000..2_500_000).contains(&instrs), "{line}");
    assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());
    assert!(trace.metadata().unwrap().len() > 0);
    // The load's process group went with it: its sleep is gone.
    let sleeping = Command::new("pgrep")
        .args(["-f", "sleep 600"])
        .output()
        .unwrap();
    assert!(
        sleeping.stdout.is_empty(),
        "the load's sleep survived: {}",
        String::from_utf8_lossy(&sleeping.stdout)
    );
    TcpListener::bind(format!("127.0.0.1:{port}")).expect("the server was stopped");
}
