//! The harness of the network tests (`tests/net.rs`): a network namespace
//! of the test's own with a tap in it ([`in_netns`]), the `AF_PACKET` peer
//! on that tap ([`Peer`]), checksummed frames, the echo guest and its
//! echo, and what the tests read from `/proc` and the API socket.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::*;
use stage_workload::checksum::fnv1a;

/// The guest's MAC on the command line.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x5e, 0x00, 0x01];
/// The peer's (locally administered) source MAC.
pub const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x5e, 0x00, 0x02];
/// The echo's ethertype (IEEE 802 local experimental 1).
pub const ETHERTYPE: u16 = 0x88b5;
pub const TAP: &str = "svmtap0";

/// Runs `f` on a thread in a new network namespace; `Err(why)` when the
/// namespace or the tap cannot be made here.
pub fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun".into());
    }
    std::thread::spawn(move || {
        // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread
        // into a new network namespace; no memory is involved.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!(
                "cannot create a network namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
        make_tap(TAP)?;
        Ok(f())
    })
    .join()
    .expect("the namespace thread panicked")
}

/// `struct ifreq` with the flags member (TUNSETIFF, SIOCSIFFLAGS).
#[repr(C)]
pub struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

pub fn ifreq(name: &str, flags: libc::c_int) -> IfReq {
    let mut r = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: flags as libc::c_short,
        _pad: [0; 22],
    };
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    r
}

/// Creates the persistent tap `name` in this thread's namespace and brings
/// it up (ioctls: no `ip` tool needed).
pub fn make_tap(name: &str) -> Result<(), String> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| format!("/dev/net/tun: {e}"))?;
    let mut req = ifreq(name, libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR);
    // SAFETY: TUNSETIFF and TUNSETPERSIST read (and write) `req` / an int.
    unsafe {
        if libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) < 0
            || libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1) < 0
        {
            return Err(format!(
                "cannot create a tap: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    drop(tun);
    // SAFETY: a plain datagram socket for the interface ioctl.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if sock < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `sock` was just opened and is owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut up = ifreq(name, libc::IFF_UP);
    // SAFETY: SIOCSIFFLAGS reads `up`, a `struct ifreq`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut up) } < 0 {
        return Err(format!(
            "cannot bring the tap up: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// An `AF_PACKET` socket on interface `name` for [`ETHERTYPE`] frames.
pub struct Peer {
    fd: OwnedFd,
}

impl Peer {
    pub fn open(name: &str) -> Self {
        let proto = ETHERTYPE.to_be() as libc::c_int;
        // SAFETY: socket(2); the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just opened and is owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cname = std::ffi::CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        assert!(index != 0, "no interface {name}");
        // SAFETY: an all-zero sockaddr_ll is valid; fields set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = index as i32;
        // SAFETY: bind(2) reads `addr` of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: setsockopt(2) reads one timeval.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Self { fd }
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: send(2) reads `frame`.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            frame.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The next frame from the guest (source MAC = the guest's), or `None`
    /// after `timeout`.
    pub fn recv_from_guest(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        while Instant::now() < deadline {
            // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                continue;
            }
            let frame = &buf[..n as usize];
            if frame.len() >= 14 && frame[6..12] == GUEST_MAC {
                return Some(frame.to_vec());
            }
        }
        None
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

pub fn mac_arg() -> String {
    let m = GUEST_MAC;
    format!(
        "tap={TAP},mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Spawns the echo guest on the tap and waits for its `net ready` line;
/// returns the child and the rest of its stdout (a channel of lines).
pub fn start_echo_guest(
    report: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, mpsc::Receiver<String>) {
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
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("testguest: net ready") => break,
            Ok(line) => assert!(
                !line.contains("net: ") && !line.contains("no network card"),
                "{line}"
            ),
            Err(_) => {
                let _ = child.kill();
                let run = wait(child, Duration::from_secs(5));
                panic!("the guest never got its network card ready: {run:#?}");
            }
        }
    }
    (child, rx)
}

/// `GET path` on the API socket at `socket`; the response's body.
pub fn api_get(socket: &std::path::Path, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect to the API");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: stagevm\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The value of the sample `name{device="net0"}` in Prometheus text.
pub fn metric(text: &str, name: &str) -> u64 {
    let prefix = format!("{name}{{device=\"net0\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        .parse()
        .unwrap()
}

/// Echo of `count` frames, one at a time, then a STOP frame; `before_stop`
/// runs between them (the VM still running). Returns the payload bytes and
/// their FNV-1a as the guest should count them (the STOP frame included),
/// and the frames.
pub fn echo(peer: &Peer, count: u32, before_stop: impl FnOnce()) -> (u64, u64, u32) {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut bytes = 0u64;
    let mut fold = |f: &[u8]| {
        bytes += (f.len() - 14) as u64;
        h = f[14..]
            .iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
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

/// `struct ifreq` with the MTU member (SIOCSIFMTU).
#[repr(C)]
pub struct IfReqMtu {
    name: [u8; libc::IFNAMSIZ],
    mtu: libc::c_int,
    _pad: [u8; 20],
}

/// Sets the MTU of `name` (bytes), so the peer can send frames longer than
/// the device carries.
pub fn set_mtu(name: &str, mtu: i32) {
    let mut r = IfReqMtu {
        name: [0; libc::IFNAMSIZ],
        mtu,
        _pad: [0; 20],
    };
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: a plain datagram socket for the interface ioctl.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    assert!(sock >= 0);
    // SAFETY: `sock` was just opened and is owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: SIOCSIFMTU reads `r`, a `struct ifreq`.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU, &mut r) };
    assert_eq!(rc, 0, "SIOCSIFMTU: {}", std::io::Error::last_os_error());
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
