//! The harness of the operator-API tests (`tests/api.rs`): a staged guest
//! booted with an API socket ([`Vm`]) and called through the test kit's
//! client (`stagevm_api::client`), raw HTTP on that socket for the tests
//! of the server's handling of the wire (bodies over its limit, garbage,
//! stalled clients: what a client library would not send or would fail
//! on), and the waits that time "within 2 policy periods". Shared with
//! `tests/metrics_tcp.rs`, which uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use stagevm_report::api::StagesView;
use stagevm_report::Report;
use stagevm_testkit::api::Api;

/// Policy period of these tests (ms): long enough to time "within 2
/// periods" on a loaded 2-core machine, short enough for a quick test.
pub(crate) const PERIOD_MS: u64 = 100;

pub(crate) const CONFIG: &str = "[host]\ncores = \"0-1\"\n[policy]\nname = \"static\"\nperiod_ms = 100\n\
                      [[stage]]\nname = \"parse\"\n[[stage]]\nname = \"plan\"\n[[stage]]\nname = \"execute\"\n";

/// A running `stagevm` with an API socket; killed if dropped unfinished.
pub(crate) struct Vm {
    pub(crate) child: Option<Running>,
    pub(crate) api: Api,
    pub(crate) socket: PathBuf,
    pub(crate) report: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) _lock: VmLock,
}

impl Vm {
    /// Boots the test guest on 2 vCPUs under [`CONFIG`] with `cmdline`
    /// (plus `hold=1`) and waits until the socket answers.
    pub(crate) fn boot(cmdline: &str) -> Self {
        Self::boot_with(cmdline, &[])
    }

    /// As [`Vm::boot`], with `extra` options for `stagevm`.
    pub(crate) fn boot_with(cmdline: &str, extra: &[&str]) -> Self {
        Self::boot_config(CONFIG, cmdline, extra)
    }

    /// As [`Vm::boot`], started through `wrapper` (a program and its
    /// arguments that exec the VMM: `setpriv …`, `prlimit …`).
    pub(crate) fn boot_wrapped(cmdline: &str, wrapper: &[&str]) -> Self {
        Self::launch(CONFIG, cmdline, &[], wrapper)
    }

    /// As [`Vm::boot_with`], with the `--stages` file's text `config`.
    pub(crate) fn boot_config(config_text: &str, cmdline: &str, extra: &[&str]) -> Self {
        Self::launch(config_text, cmdline, extra, &[])
    }

    fn launch(config_text: &str, cmdline: &str, extra: &[&str], wrapper: &[&str]) -> Self {
        let lock = vm_lock();
        let config = report_path("api-config").with_extension("toml");
        std::fs::write(&config, config_text).unwrap();
        let socket = report_path("api").with_extension("sock");
        let report = report_path("api-report");
        let cmdline = format!("{cmdline} hold=1");
        let mut args = vec![
            "--cpus",
            "boot=2",
            "--stages",
            config.to_str().unwrap(),
            "--api-socket",
            socket.to_str().unwrap(),
            "--cmdline",
            &cmdline,
        ];
        args.extend_from_slice(extra);
        let args = guest_args_with_report(&report, &args);
        let child = match wrapper.split_first() {
            None => spawn(&args),
            Some((program, wargs)) => stagevm()
                .wrap(program, wargs)
                .args(&args)
                .spawn()
                .expect("spawn the wrapped stagevm"),
        };
        let api = Api::wait_ready(&socket, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}: the API socket never answered"));
        Self {
            child: Some(child),
            api,
            socket,
            report,
            config,
            _lock: lock,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub(crate) fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        self.api.get_json(path).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(crate) fn stages(&self) -> StagesView {
        self.get("/api/v1/stages?timeline=all")
    }

    /// `PUT path body`, asserting `202`; returns when it was answered.
    pub(crate) fn put(&self, path: &str, body: &str) -> Instant {
        self.api
            .put(path, body.as_bytes())
            .unwrap_or_else(|e| panic!("{e} (PUT body {body})"));
        Instant::now()
    }

    /// Waits (at most 120 s) until the guest completed `total` requests.
    pub(crate) fn wait_requests(&self, total: u64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let done = self.stages().stage_channel.map_or(0, |c| c.requests);
            if done >= total {
                return;
            }
            assert!(Instant::now() < deadline, "{done} of {total} requests");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `PUT /api/v1/vm.shutdown`, then the exit and the final report.
    pub(crate) fn shutdown(mut self) -> (Run, Report) {
        self.put("/api/v1/vm.shutdown", "");
        let run = wait(self.child.take().unwrap(), Duration::from_secs(30));
        run.assert_no_panic();
        assert_eq!(run.code(), 0, "{run:#?}");
        let report = Report::read(&self.report).unwrap();
        assert!(!self.socket.exists(), "the socket outlived the VM");
        (run, report)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Killed and reaped (the kit's `Running`) before its files go.
        drop(self.child.take());
        let _ = std::fs::remove_file(&self.report);
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`): the
/// status and body of the answer.
pub(crate) fn http(socket: &Path, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    head.extend_from_slice(body);
    raw(socket, &head)
}

/// Sends `bytes` as they are and reads the answer to EOF (10 s at most).
pub(crate) fn raw(socket: &Path, bytes: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer (413) and close before it read everything.
    let _ = s.write_all(bytes);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    parse_answer(&String::from_utf8_lossy(&answer))
}

pub(crate) fn parse_answer(text: &str) -> (u16, String) {
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The affinity (`Cpus_allowed_list`) of each thread of `pid` by name, one
/// value per name (panics if threads of one name differ).
pub(crate) fn affinity_by_name(pid: u32) -> HashMap<String, String> {
    thread_affinities(pid)
        .into_iter()
        .filter(|(name, _)| {
            name.starts_with("vcpu") || ["api", "stage-sched", "stagevm"].contains(&name.as_str())
        })
        .map(|(name, lists)| {
            assert!(lists.windows(2).all(|w| w[0] == w[1]), "{name}: {lists:?}");
            (name, lists[0].clone())
        })
        .collect()
}

/// Polls `/proc` until `expected` (name → cpulist) holds; returns how long
/// it took from `since`. Panics after 5 s.
pub(crate) fn follow(pid: u32, since: Instant, expected: &[(&str, &str)]) -> Duration {
    let deadline = since + Duration::from_secs(5);
    loop {
        let seen = affinity_by_name(pid);
        if expected
            .iter()
            .all(|(n, c)| seen.get(*n).map(String::as_str) == Some(*c))
        {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "affinities never became {expected:?}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Polls `/api/v1/stages` until every stage's vCPUs are `expected`; returns
/// how long it took from `since`. Panics after 5 s.
pub(crate) fn follow_map(vm: &Vm, since: Instant, expected: &[Vec<u32>]) -> (Duration, StagesView) {
    let deadline = since + Duration::from_secs(5);
    loop {
        let view = vm.stages();
        let vcpus: Vec<Vec<u32>> = view.sched.stages.iter().map(|s| s.vcpus.clone()).collect();
        if vcpus == expected {
            return (since.elapsed(), view);
        }
        assert!(
            Instant::now() < deadline,
            "stage map never became {expected:?}: {vcpus:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Asserts a change was followed within 2 policy periods and prints the
/// time it took.
pub(crate) fn within_two_periods(took: Duration, what: &str) {
    let bound = Duration::from_millis(2 * PERIOD_MS);
    eprintln!("api: {what} followed in {took:?} (bound {bound:?})");
    assert!(took <= bound, "{what}: after {took:?}");
}
