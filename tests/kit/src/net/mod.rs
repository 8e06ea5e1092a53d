//! Networks of the caller's own: a network namespace ([`Netns`]) living on
//! a thread, a tap made there for a VMM to open by name ([`make_tap`]), an
//! `AF_PACKET` peer on an interface ([`Packet`]), and TCP from inside the
//! namespace ([`Netns::tcp_echo`]). No address of the host's namespace is
//! ever used, and a namespace, with its interfaces, goes when its
//! [`Netns`] is dropped (unless a process still runs in it).
//!
//! The interface helpers act in the calling thread's namespace: call them
//! through [`Netns::run`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

mod packet;

pub use packet::{frame, stop_frame, Counted, Packet};

/// The test guest's frames' ethertype: IEEE 802 local experimental
/// ethertype 1 (the guest's `ETHERTYPE`).
pub const ETHERTYPE: u16 = 0x88b5;
/// The MAC the tests and benchmarks give the guest's card.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x5e, 0x00, 0x01];
/// A peer's (locally administered) MAC.
pub const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x5e, 0x00, 0x02];

/// Why a namespace, an interface or a socket could not be had.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// No tun/tap driver here.
    #[error("no /dev/net/tun")]
    NoTun,
    /// `/dev/net/tun` cannot be opened.
    #[error("/dev/net/tun: {0}")]
    Tun(#[source] std::io::Error),
    /// `unshare(CLONE_NEWNET)` refused (no `CAP_SYS_ADMIN`).
    #[error("cannot create a network namespace: {0}")]
    Unshare(#[source] nix::Error),
    /// `setns` into the namespace failed, or its `/proc` entry is gone.
    #[error("cannot enter the network namespace: {0}")]
    Enter(#[source] std::io::Error),
    /// The namespace's thread has ended.
    #[error("the network namespace's thread has ended")]
    Gone,
    /// An interface request refused: `what` on interface `name`.
    #[error("{what} on {name}: {source}")]
    Interface {
        /// The request (`TUNSETIFF`, `SIOCSIFFLAGS`, …).
        what: &'static str,
        /// The interface.
        name: String,
        /// The system's error.
        #[source]
        source: nix::Error,
    },
    /// Not an interface name (empty, 16 bytes or more, or with a NUL).
    #[error("'{0}' is not an interface name")]
    BadName(String),
    /// `ip` (iproute2) could not be run.
    #[error("running ip (apt-get install iproute2): {0}")]
    IpMissing(#[source] std::io::Error),
    /// `ip args` failed; its stderr.
    #[error("ip {args}: {stderr}")]
    Ip {
        /// The arguments, space-separated.
        args: String,
        /// What `ip` said.
        stderr: String,
    },
    /// A socket call failed.
    #[error("{what}: {source}")]
    Socket {
        /// The call (`AF_PACKET socket`, `bind`, `send of 60 bytes`, …).
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A TCP connection to `addr` failed.
    #[error("TCP {addr}: {source}")]
    Tcp {
        /// The peer.
        addr: SocketAddr,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

type Job = Box<dyn FnOnce() + Send>;

/// A network namespace of its own, held by a thread that runs the closures
/// sent to it there, one after another. The namespace (with its
/// interfaces) goes when this is dropped and no process lives in it.
#[derive(Debug)]
pub struct Netns {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    tid: i32,
}

impl Netns {
    /// A new namespace with its loopback up.
    ///
    /// # Errors
    /// [`NetError::Unshare`] (no `CAP_SYS_ADMIN`), or the loopback cannot
    /// be brought up.
    pub fn new() -> Result<Self, NetError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            // Moves only this thread into a new network namespace.
            let r = nix::sched::unshare(CloneFlags::CLONE_NEWNET).map(|()| nix::unistd::gettid());
            let ok = r.is_ok();
            let _ = ready_tx.send(r);
            if ok {
                for job in rx {
                    job();
                }
            }
        });
        let tid = match ready_rx.recv() {
            Ok(Ok(tid)) => tid.as_raw(),
            Ok(Err(e)) => return Err(NetError::Unshare(e)),
            Err(_) => return Err(NetError::Gone),
        };
        let ns = Self {
            jobs: Some(jobs),
            thread: Some(thread),
            tid,
        };
        ns.run(|| set_up("lo"))??;
        Ok(ns)
    }

    /// A new namespace ([`Netns::new`]) with the tap `name` made and up
    /// in it ([`make_tap`]).
    ///
    /// # Errors
    /// [`NetError::NoTun`], or as [`Netns::new`] and [`make_tap`].
    pub fn with_tap(name: &str) -> Result<Self, NetError> {
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err(NetError::NoTun);
        }
        let ns = Self::new()?;
        let name = name.to_string();
        ns.run(move || make_tap(&name))??;
        Ok(ns)
    }

    /// The id of the namespace's thread: the namespace is
    /// `/proc/<tid>/ns/net`, and `ip link set X netns <tid>` moves an
    /// interface into it.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// Runs `f` in the namespace, on its thread, and returns its result.
    /// Processes `f` starts (a VMM) live in the namespace. A panic in `f`
    /// is resumed in the caller, the namespace staying usable.
    ///
    /// # Errors
    /// [`NetError::Gone`]: the namespace's thread has ended.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetError> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
        });
        let jobs = self.jobs.as_ref().ok_or(NetError::Gone)?;
        jobs.send(job).map_err(|_| NetError::Gone)?;
        match rx.recv().map_err(|_| NetError::Gone)? {
            Ok(v) => Ok(v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Runs `f` on a new thread in the namespace (joined by the caller),
    /// alongside whatever the namespace's own thread runs.
    ///
    /// # Errors
    /// [`NetError::Enter`]: the namespace cannot be opened.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<JoinHandle<T>, NetError> {
        let path = format!("/proc/self/task/{}/ns/net", self.tid);
        let ns = std::fs::File::open(&path).map_err(NetError::Enter)?;
        Ok(std::thread::spawn(move || {
            // Moves only this new thread, which runs nothing else.
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns into {path}: {e}"));
            drop(ns);
            f()
        }))
    }

    /// `ip args…` in the namespace (veth pairs, addresses).
    ///
    /// # Errors
    /// [`NetError::IpMissing`], [`NetError::Ip`] (its stderr).
    pub fn ip(&self, args: &[&str]) -> Result<(), NetError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.run(move || {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .map_err(NetError::IpMissing)?;
            if !out.status.success() {
                return Err(NetError::Ip {
                    args: args.join(" "),
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            Ok(())
        })?
    }

    /// Binds a TCP listener at `addr` in the namespace (usable from any
    /// thread afterwards).
    ///
    /// # Errors
    /// [`NetError::Tcp`].
    pub fn tcp_listen(&self, addr: SocketAddr) -> Result<TcpListener, NetError> {
        self.run(move || TcpListener::bind(addr))?
            .map_err(|source| NetError::Tcp { addr, source })
    }

    /// Connects to `addr` from the namespace within `timeout`, the stream's
    /// reads and writes limited to `timeout` each.
    ///
    /// # Errors
    /// [`NetError::Tcp`].
    pub fn tcp_connect(&self, addr: SocketAddr, timeout: Duration) -> Result<TcpStream, NetError> {
        let s = self
            .run(move || TcpStream::connect_timeout(&addr, timeout))?
            .map_err(|source| NetError::Tcp { addr, source })?;
        let tcp = |source| NetError::Tcp { addr, source };
        s.set_read_timeout(Some(timeout)).map_err(tcp)?;
        s.set_write_timeout(Some(timeout)).map_err(tcp)?;
        Ok(s)
    }

    /// An echo over TCP: connects to `addr` from the namespace, sends
    /// `data`, closes its sending side and returns all that came back
    /// until the peer closed (each step within `timeout`).
    ///
    /// # Errors
    /// [`NetError::Tcp`].
    pub fn tcp_echo(
        &self,
        addr: SocketAddr,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, NetError> {
        let mut s = self.tcp_connect(addr, timeout)?;
        let tcp = |source| NetError::Tcp { addr, source };
        s.write_all(data).map_err(tcp)?;
        s.shutdown(Shutdown::Write).map_err(tcp)?;
        let mut back = Vec::new();
        s.read_to_end(&mut back).map_err(tcp)?;
        Ok(back)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The thread ends with its job queue, and the namespace with it.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `struct ifreq` for interface `name`, its union zeroed.
fn ifreq(name: &str) -> Result<libc::ifreq, NetError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(NetError::BadName(name.to_string()));
    }
    // SAFETY: `ifreq` is plain data (a name and a union of integers,
    // addresses and one pointer), for which all-zero is valid.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

nix::ioctl_readwrite_bad!(
    /// `TUNSETIFF`: attaches a `/dev/net/tun` descriptor to an interface.
    tunsetiff,
    libc::TUNSETIFF,
    libc::ifreq
);
nix::ioctl_write_int_bad!(
    /// `TUNSETPERSIST`: keeps the interface when its descriptor closes.
    tunsetpersist,
    libc::TUNSETPERSIST
);
nix::ioctl_readwrite_bad!(
    /// `SIOCGIFFLAGS`: an interface's flags.
    siocgifflags,
    libc::SIOCGIFFLAGS,
    libc::ifreq
);
nix::ioctl_write_ptr_bad!(
    /// `SIOCSIFFLAGS`: sets an interface's flags.
    siocsifflags,
    libc::SIOCSIFFLAGS,
    libc::ifreq
);
nix::ioctl_write_ptr_bad!(
    /// `SIOCSIFMTU`: sets an interface's MTU.
    siocsifmtu,
    libc::SIOCSIFMTU,
    libc::ifreq
);

/// A datagram socket for interface requests in this thread's namespace.
fn control_socket() -> Result<OwnedFd, NetError> {
    socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| NetError::Socket {
        what: "interface control socket".into(),
        source: e.into(),
    })
}

/// Creates the persistent tap `name` (`IFF_TAP | IFF_NO_PI |
/// IFF_VNET_HDR`, as stagevm opens it) in this thread's namespace and
/// brings it up: a VMM started in the namespace opens it by name.
///
/// # Errors
/// [`NetError::BadName`], [`NetError::Tun`], [`NetError::Interface`]
/// (`TUNSETIFF`, `TUNSETPERSIST`, or bringing it up).
pub fn make_tap(name: &str) -> Result<(), NetError> {
    let mut req = ifreq(name)?;
    let iface = |what, source| NetError::Interface {
        what,
        name: name.to_string(),
        source,
    };
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(NetError::Tun)?;
    req.ifr_ifru.ifru_flags =
        (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, `req`.
    unsafe { tunsetiff(tun.as_raw_fd(), &mut req) }.map_err(|e| iface("TUNSETIFF", e))?;
    // SAFETY: TUNSETPERSIST takes an integer argument.
    unsafe { tunsetpersist(tun.as_raw_fd(), 1) }.map_err(|e| iface("TUNSETPERSIST", e))?;
    drop(tun);
    set_up(name)
}

/// Brings interface `name` of this thread's namespace up, its other flags
/// kept (as `ip link set NAME up`).
///
/// # Errors
/// [`NetError::BadName`], [`NetError::Socket`], [`NetError::Interface`].
pub fn set_up(name: &str) -> Result<(), NetError> {
    let sock = control_socket()?;
    let mut req = ifreq(name)?;
    let iface = |what, source| NetError::Interface {
        what,
        name: name.to_string(),
        source,
    };
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of `req`.
    unsafe { siocgifflags(sock.as_raw_fd(), &mut req) }.map_err(|e| iface("SIOCGIFFLAGS", e))?;
    // SAFETY: the kernel has just written the flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads one `struct ifreq`, `req`.
    unsafe { siocsifflags(sock.as_raw_fd(), &req) }.map_err(|e| iface("SIOCSIFFLAGS", e))?;
    Ok(())
}

/// Sets the MTU of interface `name` of this thread's namespace (bytes), so
/// a peer can send frames longer than a device carries.
///
/// # Errors
/// [`NetError::BadName`], [`NetError::Socket`], [`NetError::Interface`].
pub fn set_mtu(name: &str, mtu: i32) -> Result<(), NetError> {
    let sock = control_socket()?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_mtu = mtu;
    // SAFETY: SIOCSIFMTU reads one `struct ifreq`, `req`.
    unsafe { siocsifmtu(sock.as_raw_fd(), &req) }.map_err(|source| NetError::Interface {
        what: "SIOCSIFMTU",
        name: name.to_string(),
        source,
    })?;
    Ok(())
}

/// `m` as `52:54:00:5e:00:01`.
pub fn mac_text(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests;
