//! The `AF_PACKET` peer: raw Ethernet frames of [`ETHERTYPE`] on one
//! interface, sent and received as they are.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{recv, send, setsockopt, sockopt, MsgFlags};
use nix::sys::time::{TimeVal, TimeValLike};

use super::{NetError, ETHERTYPE};

/// An `AF_PACKET` socket bound to one interface for [`ETHERTYPE`] frames.
#[derive(Debug)]
pub struct Packet {
    fd: OwnedFd,
}

/// What [`Packet::count`] counted.
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

fn socket_error(what: impl Into<String>) -> impl FnOnce(nix::Error) -> NetError {
    let what = what.into();
    move |e| NetError::Socket {
        what,
        source: e.into(),
    }
}

impl Packet {
    /// Opens one on interface `name` (in the calling thread's namespace);
    /// a receive gives up after `recv_timeout` without a frame.
    ///
    /// # Errors
    /// [`NetError::Socket`] (the socket, the interface's index, `bind`, the
    /// timeout).
    pub fn open(name: &str, recv_timeout: Duration) -> Result<Self, NetError> {
        let proto = libc::c_int::from(ETHERTYPE.to_be());
        // nix's `SockProtocol` has no value for an arbitrary ethertype, so
        // this socket and its `sockaddr_ll` are made through libc.
        // SAFETY: socket(2) with plain integer arguments; checked below.
        let fd =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(NetError::Socket {
                what: "AF_PACKET socket".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let index = nix::net::if_::if_nametoindex(name)
            .map_err(socket_error(format!("no interface {name}")))?;
        // SAFETY: an all-zero sockaddr_ll is valid; fields set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = index as i32;
        // SAFETY: bind(2) reads `addr`, of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r != 0 {
            return Err(NetError::Socket {
                what: format!("bind to {name}"),
                source: std::io::Error::last_os_error(),
            });
        }
        let tv = TimeVal::microseconds(recv_timeout.as_micros().try_into().unwrap_or(i64::MAX));
        setsockopt(&fd, sockopt::ReceiveTimeout, &tv).map_err(socket_error("SO_RCVTIMEO"))?;
        Ok(Self { fd })
    }

    /// Sends without the interface's queueing discipline
    /// (`PACKET_QDISC_BYPASS`): as fast as the driver takes frames.
    ///
    /// # Errors
    /// [`NetError::Socket`].
    pub fn bypass_qdisc(&self) -> Result<(), NetError> {
        let one: libc::c_int = 1;
        // nix has no PACKET_QDISC_BYPASS option.
        // SAFETY: setsockopt(2) reads one int at `one`.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        if r != 0 {
            return Err(NetError::Socket {
                what: "PACKET_QDISC_BYPASS".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Sets the receive buffer to `bytes`, above the system's limit
    /// (`SO_RCVBUFFORCE`, needs `CAP_NET_ADMIN`).
    ///
    /// # Errors
    /// [`NetError::Socket`].
    pub fn set_recv_buffer(&self, bytes: usize) -> Result<(), NetError> {
        setsockopt(&self.fd, sockopt::RcvBufForce, &bytes).map_err(socket_error("SO_RCVBUFFORCE"))
    }

    /// Sends one frame; `false` when the interface's queue is full
    /// (`ENOBUFS`/`EAGAIN`: the frame is lost).
    ///
    /// # Errors
    /// [`NetError::Socket`]: any other failure.
    pub fn send(&self, frame: &[u8]) -> Result<bool, NetError> {
        match send(self.fd.as_raw_fd(), frame, MsgFlags::empty()) {
            Ok(n) if n == frame.len() => Ok(true),
            Err(nix::Error::ENOBUFS | nix::Error::EAGAIN) => Ok(false),
            Ok(n) => Err(NetError::Socket {
                what: format!("send of {} bytes", frame.len()),
                source: std::io::Error::other(format!("only {n} bytes sent")),
            }),
            Err(e) => Err(socket_error(format!("send of {} bytes", frame.len()))(e)),
        }
    }

    /// The next frame received, or `None` after the socket's receive
    /// timeout.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()).ok()
    }

    /// The next frame whose source MAC is `src`, or `None` after
    /// `timeout` (other frames are skipped).
    pub fn recv_from(&self, src: [u8; 6], timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        while Instant::now() < deadline {
            let Some(n) = self.recv(&mut buf) else {
                continue;
            };
            let frame = &buf[..n];
            if frame.len() >= 14 && frame[6..12] == src {
                return Some(frame.to_vec());
            }
        }
        None
    }

    /// Sends copies of `frame` with a sequence number at bytes 14..18 for
    /// `time`; returns how many the socket took.
    ///
    /// # Errors
    /// As [`Packet::send`].
    pub fn blast(&self, frame: &mut [u8], time: Duration) -> Result<u64, NetError> {
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
            let n = self.recv(&mut buf);
            let now = Instant::now();
            let Some(n) = n else {
                let limit = if first.is_some() { idle } else { wait };
                if now.duration_since(last.max(start)) > limit {
                    break;
                }
                continue;
            };
            let f = &buf[..n];
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

/// A frame of `len` bytes (at least 60) from `src` to `dst` of
/// [`ETHERTYPE`], its payload `0x5a` after a 4-byte sequence number 0.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0x5a; len.max(60)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f[14..18].fill(0);
    f
}

/// A 60-byte [`frame`] with `STOP` as its payload's first bytes: the end
/// of a stream for the guest's sink and for [`Packet::count`].
pub fn stop_frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = frame(dst, src, 60);
    f[14..18].copy_from_slice(b"STOP");
    f
}
