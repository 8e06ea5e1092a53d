//! The harness of the network tests (`tests/net.rs`), over the test kit's
//! network helpers: a network namespace of the test's own with a tap in it
//! ([`in_netns`]), the `AF_PACKET` peer on that tap ([`Peer`]),
//! checksummed frames, the echo guest and its echo, and what the tests
//! read from `/proc` and the API socket.

use std::time::Duration;

use crate::common::*;
use stagevm_testkit::api::Api;
use stagevm_testkit::checksum::{fnv1a, fnv1a_continue, FNV1A_START};
use stagevm_testkit::net::{mac_text, Netns, Packet};
pub use stagevm_testkit::net::{ETHERTYPE, GUEST_MAC, PEER_MAC};
use stagevm_testkit::{LaunchError, Lines};

/// The tap every test makes in its namespace.
pub const TAP: &str = "svmtap0";

/// Runs `f` on the thread of a new network namespace with the tap [`TAP`]
/// up in it (the kit's `Netns`); `Err(why)` when the namespace or the tap
/// cannot be made here. A panic in `f` is the caller's.
pub fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let ns = Netns::with_tap(TAP).map_err(|e| e.to_string())?;
    Ok(ns.run(f).expect("the namespace's thread"))
}

/// The peer: the kit's `AF_PACKET` socket on an interface, for
/// [`ETHERTYPE`] frames, a receive giving up after 200 ms.
pub struct Peer(Packet);

impl Peer {
    /// Opens it on interface `name` (the calling thread's namespace).
    pub fn open(name: &str) -> Self {
        Self(Packet::open(name, Duration::from_millis(200)).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Sends `frame`; panics when it is not sent whole.
    pub fn send(&self, frame: &[u8]) {
        let sent = self.0.send(frame).unwrap_or_else(|e| panic!("{e}"));
        assert!(sent, "send: the interface's queue is full");
    }

    /// The next frame from the guest (source MAC = the guest's), or `None`
    /// after `timeout`.
    pub fn recv_from_guest(&self, timeout: Duration) -> Option<Vec<u8>> {
        self.0.recv_from(GUEST_MAC, timeout)
    }
}

/// Frame `seq` of `len` bytes (14-byte header; payload: seq, pseudo-random
/// bytes, and the FNV-1a of everything before it in its last 8 bytes).
pub fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&GUEST_MAC);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    let mut x = u64::from(seq).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while f.len() < len - 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.push(x as u8);
    }
    let sum = fnv1a(&f[14..]);
    f.extend_from_slice(&sum.to_le_bytes());
    f
}

/// Frame sizes 60…1514, all of them touched in a cycle.
pub fn size_of_frame(seq: u32) -> usize {
    60 + (seq as usize * 7) % (1514 - 60 + 1)
}

/// `--net` for the guest on [`TAP`] with [`GUEST_MAC`].
pub fn mac_arg() -> String {
    format!("tap={TAP},mac={}", mac_text(&GUEST_MAC))
}

/// Spawns the echo guest on the tap and waits for its `net ready` line;
/// returns the child and the rest of its stdout (a channel of lines).
pub fn start_echo_guest(report: &std::path::Path, extra: &[&str]) -> (Running, Lines) {
    let net = mac_arg();
    let mut args = guest_args_with_report(
        report,
        &[
            "--cpus",
            "boot=1",
            "--net",
            &net,
            "--cmdline",
            "netecho=1 iters=1000 requests=0",
        ],
    );
    args.extend_from_slice(extra);
    let mut child = spawn(&args);
    let lines = child.stdout_lines().unwrap();
    match lines.wait_for(
        "testguest: net ready",
        Duration::from_secs(30),
        &["net: ", "no network card"],
    ) {
        Ok(_) => {}
        Err(LaunchError::Refused { line, .. }) => panic!("{line}"),
        Err(_) => {
            let run = child.kill().unwrap();
            panic!("the guest never got its network card ready: {run:#?}");
        }
    }
    (child, lines)
}

/// `GET path` on the API socket at `socket` (through `api::client`),
/// expecting 200; the response's body.
pub fn api_get(socket: &std::path::Path, path: &str) -> String {
    Api::new(socket)
        .and_then(|api| api.get(path))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The value of the sample `name{device="net0"}` in Prometheus text.
pub fn metric(text: &str, name: &str) -> u64 {
    stagevm_testkit::api::metric(text, name, "device=\"net0\"")
        .unwrap_or_else(|| panic!("no {name}{{device=\"net0\"}} in {text}")) as u64
}

/// Echo of `count` frames, one at a time, then a STOP frame; `before_stop`
/// runs between them (the VM still running). Returns the payload bytes and
/// their FNV-1a as the guest should count them (the STOP frame included),
/// and the frames.
pub fn echo(peer: &Peer, count: u32, before_stop: impl FnOnce()) -> (u64, u64, u32) {
    let mut h = FNV1A_START;
    let mut bytes = 0u64;
    let mut fold = |f: &[u8]| {
        bytes += (f.len() - 14) as u64;
        h = fnv1a_continue(h, &f[14..]);
    };
    for seq in 0..count {
        let sent = frame(seq, size_of_frame(seq));
        peer.send(&sent);
        let echo = peer
            .recv_from_guest(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no echo of frame {seq} ({} bytes)", sent.len()));
        assert_eq!(echo.len(), sent.len(), "frame {seq}: length");
        assert_eq!(echo[..6], PEER_MAC, "frame {seq}: destination");
        let sum = u64::from_le_bytes(echo[echo.len() - 8..].try_into().unwrap());
        assert_eq!(
            sum,
            fnv1a(&echo[14..echo.len() - 8]),
            "frame {seq}: checksum"
        );
        assert_eq!(echo[12..], sent[12..], "frame {seq}: payload");
        fold(&sent);
    }
    before_stop();
    let mut stop = frame(u32::MAX, 60);
    stop[14..18].copy_from_slice(b"STOP");
    peer.send(&stop);
    assert!(
        peer.recv_from_guest(Duration::from_secs(5)).is_some(),
        "no echo of STOP"
    );
    fold(&stop);
    (bytes, h, count + 1)
}

/// CPU time (clock ticks) of the thread named `comm` of `pid`.
pub fn thread_ticks(pid: u32, comm: &str) -> Option<u64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.trim() != comm {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // After the ")" closing comm: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        return Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?);
    }
    None
}
