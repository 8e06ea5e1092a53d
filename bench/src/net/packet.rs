//! The benchmark's network plumbing: network namespaces of its own, a tap
//! and a veth pair made there with `ip` (iproute2), and raw `AF_PACKET`
//! sockets that send and count frames of one ethertype. No IP address is
//! ever used: every frame is a raw Ethernet frame inside a namespace this
//! process made, and the namespaces go when their threads end.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The frames' ethertype: IEEE 802 local experimental ethertype 1 (the
/// test guest's `ETHERTYPE`).
pub const ETHERTYPE: u16 = 0x88b5;

/// A thread living in a network namespace of its own: runs the closures
/// sent to it there, one after another.
pub struct Netns {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    /// The thread's id: its namespace is `/proc/<tid>/ns/net`.
    pub tid: i32,
}

impl Netns {
    /// A new namespace with its loopback up. Errors: `unshare` refused
    /// (no `CAP_SYS_ADMIN`), or `ip` missing.
    pub fn new() -> Result<Netns> {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread
            // into a new network namespace; no memory is involved.
            let r = if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
                // SAFETY: gettid(2) has no arguments.
                Ok(unsafe { libc::gettid() })
            } else {
                Err(std::io::Error::last_os_error())
            };
            let ok = r.is_ok();
            let _ = ready_tx.send(r);
            if ok {
                for job in rx {
                    job();
                }
            }
        });
        let tid = ready_rx
            .recv()
            .context("the namespace thread ended")?
            .context("cannot create a network namespace (unshare CLONE_NEWNET)")?;
        let ns = Netns { jobs, tid };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs `f` in the namespace and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| anyhow::anyhow!("the namespace thread ended"))?;
        rx.recv().context("the namespace job panicked")
    }

    /// Runs `f` on a new thread in the namespace (joined by the caller).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<T>> {
        let path = format!("/proc/self/task/{}/ns/net", self.tid);
        let ns = std::fs::File::open(&path).with_context(|| path.clone())?;
        Ok(std::thread::spawn(move || {
            // SAFETY: setns(2) on a namespace descriptor moves only this
            // new thread; it runs nothing else.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            drop(ns);
            f()
        }))
    }

    /// `ip ARGS…` in the namespace. Errors: `ip` failed (its stderr).
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.run(move || -> Result<()> {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .context("running ip (apt-get install iproute2)")?;
            if !out.status.success() {
                bail!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        })?
    }
}

/// An `AF_PACKET` socket bound to one interface for [`ETHERTYPE`] frames.
pub struct Packet {
    fd: OwnedFd,
}

/// What a receiver counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    /// Frames of the ethertype (`STOP` frames not counted).
    pub frames: u64,
    /// Their bytes (Ethernet header included).
    pub bytes: u64,
    /// From the first counted frame to the last.
    pub span: Duration,
    /// Whether a `STOP` frame ended the count (else the idle timeout).
    pub stopped: bool,
}

impl Counted {
    /// Frames per second over the span (NaN with fewer than 2 frames).
    pub fn pps(&self) -> f64 {
        if self.frames < 2 {
            return f64::NAN;
        }
        (self.frames - 1) as f64 / self.span.as_secs_f64().max(1e-9)
    }
}

fn check(r: libc::c_int, what: &str) -> Result<()> {
    if r < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Packet {
    /// Opens one on interface `name` (in the calling thread's namespace),
    /// bypassing the qdisc on send, with a 4 MiB receive buffer. Errors:
    /// the socket, the interface or an option.
    pub fn open(name: &str) -> Result<Packet> {
        let proto = ETHERTYPE.to_be() as libc::c_int;
        // SAFETY: socket(2); the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
        check(fd, "AF_PACKET socket")?;
        // SAFETY: `fd` was just opened and is owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cname = std::ffi::CString::new(name)?;
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            bail!("no interface {name}");
        }
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
        check(r, "bind")?;
        let p = Packet { fd };
        p.set(libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &1i32)?;
        p.set(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(4i32 << 20))?;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        p.set(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        Ok(p)
    }

    fn set<T>(&self, level: libc::c_int, name: libc::c_int, v: &T) -> Result<()> {
        // SAFETY: setsockopt(2) reads `size_of::<T>()` bytes at `v`.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (v as *const T).cast(),
                std::mem::size_of::<T>() as u32,
            )
        };
        check(r, "setsockopt")
    }

    /// Sends one frame; `false` when the interface's queue is full
    /// (`ENOBUFS`/`EAGAIN`: the frame is lost). Errors: anything else.
    pub fn send(&self, frame: &[u8]) -> Result<bool> {
        // SAFETY: send(2) reads `frame`.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n == frame.len() as isize {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOBUFS | libc::EAGAIN) => Ok(false),
            _ => bail!("send of {} bytes: {e}", frame.len()),
        }
    }

    /// Sends copies of `frame` with a sequence number at bytes 14..18 for
    /// `time`; returns how many the socket took.
    pub fn blast(&self, frame: &mut [u8], time: Duration) -> Result<u64> {
        let end = Instant::now() + time;
        let mut seq = 0u32;
        let mut taken = 0u64;
        while Instant::now() < end {
            for _ in 0..64 {
                frame[14..18].copy_from_slice(&seq.to_le_bytes());
                seq = seq.wrapping_add(1);
                taken += u64::from(self.send(frame)?);
            }
        }
        Ok(taken)
    }

    /// Counts frames of the ethertype whose source is `from` (any source
    /// when `None`) until a `STOP` frame, or until none came for `idle`
    /// once counting started (`wait` before the first).
    pub fn count(&self, from: Option<[u8; 6]>, wait: Duration, idle: Duration) -> Counted {
        let mut buf = vec![0u8; 65536];
        let mut c = Counted::default();
        let start = Instant::now();
        let (mut first, mut last) = (None::<Instant>, start);
        loop {
            // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let now = Instant::now();
            if n < 0 {
                let limit = if first.is_some() { idle } else { wait };
                if now.duration_since(last.max(start)) > limit {
                    break;
                }
                continue;
            }
            let f = &buf[..n as usize];
            if f.len() < 18 || from.is_some_and(|m| f[6..12] != m) {
                continue;
            }
            if &f[14..18] == b"STOP" {
                c.stopped = true;
                break;
            }
            first.get_or_insert(now);
            last = now;
            c.frames += 1;
            c.bytes += f.len() as u64;
        }
        c.span = first.map_or(Duration::ZERO, |f| last - f);
        c
    }
}

/// A frame of `len` bytes (≥ 60) from `src` to `dst` of [`ETHERTYPE`],
/// its payload `0x5a` after the 4-byte sequence number.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0x5a; len.max(60)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f[14..18].fill(0);
    f
}

/// The same with `STOP` as its payload's first bytes.
pub fn stop_frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = frame(dst, src, 60);
    f[14..18].copy_from_slice(b"STOP");
    f
}
