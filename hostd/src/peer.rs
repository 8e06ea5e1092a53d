//! Who serves a VM's socket, checked before anything it says is believed
//! (issue 50, S3): the peer's pid and uid from `SO_PEERCRED` (the kernel's,
//! set when the peer called `listen`), its executable from
//! `/proc/PID/exe`, and its vCPU threads' CPU time measured from
//! `/proc/PID/task/*/schedstat` rather than taken from its report.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};

/// The process that listens on a VM's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its pid.
    pub pid: u32,
    /// Its effective uid when it listened.
    pub uid: u32,
    /// Its executable (`/proc/PID/exe`; " (deleted)" taken off: a VMM
    /// whose binary a package upgrade replaced is still that VMM).
    pub exe: PathBuf,
}

/// Why a peer could not be identified or is not trusted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    /// Nothing listens (refused, or no such socket): the VM ended.
    #[error("nothing listens ({0})")]
    Gone(nix::errno::Errno),
    /// The listener's backlog is full: it does not accept.
    #[error("its backlog is full: it does not accept connections")]
    Busy,
    /// Any other failure of the socket calls or of `/proc`.
    #[error("{0}")]
    Failed(String),
    /// Its uid is not the daemon's (nor root's).
    #[error("served by uid {uid} (pid {pid}), not by this daemon's uid {want} or root")]
    Uid {
        /// The peer's pid.
        pid: u32,
        /// The peer's uid.
        uid: u32,
        /// The daemon's effective uid.
        want: u32,
    },
    /// Its executable is not a VMM the daemon trusts.
    #[error("served by {exe} (pid {pid}), which is not a trusted VMM ({trusted})")]
    Exe {
        /// The peer's pid.
        pid: u32,
        /// Its executable.
        exe: String,
        /// The trusted executables, comma-separated.
        trusted: String,
    },
}

/// Connects to `socket` without blocking (a listener whose backlog is full
/// gives [`PeerError::Busy`] at once, not a wait) and reads the peer's
/// credentials and executable. Errors: [`PeerError`].
pub fn identify(socket: &Path) -> Result<Peer, PeerError> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| PeerError::Failed(format!("socket: {e}")))?;
    let addr = UnixAddr::new(socket).map_err(|e| PeerError::Failed(format!("address: {e}")))?;
    match socket::connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        Err(nix::errno::Errno::EAGAIN) => return Err(PeerError::Busy),
        Err(e @ (nix::errno::Errno::ECONNREFUSED | nix::errno::Errno::ENOENT)) => {
            return Err(PeerError::Gone(e))
        }
        Err(e) => return Err(PeerError::Failed(format!("connect: {e}"))),
    }
    let cred = socket::getsockopt(&fd, sockopt::PeerCredentials)
        .map_err(|e| PeerError::Failed(format!("SO_PEERCRED: {e}")))?;
    let pid = u32::try_from(cred.pid())
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| PeerError::Failed(format!("SO_PEERCRED gave pid {}", cred.pid())))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| PeerError::Failed(format!("/proc/{pid}/exe: {e}")))?;
    let exe = match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(s) => PathBuf::from(s),
        None => exe,
    };
    Ok(Peer {
        pid,
        uid: cred.uid(),
        exe,
    })
}

/// Whom the daemon believes: peers of its own effective uid (or root)
/// whose executable is one of `vmm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trust {
    /// The daemon's effective uid.
    pub uid: u32,
    /// The VMM executables trusted (canonical paths).
    pub vmm: Vec<PathBuf>,
}

impl Trust {
    /// Trust for this daemon: its effective uid and `vmm` (`[host] vmm`),
    /// or, when empty, the `stagevm` beside the daemon's own binary (both
    /// are in `/usr/bin` from the package, in `target/<profile>` from a
    /// build). Paths are made canonical where they exist.
    pub fn new(vmm: &[PathBuf]) -> Self {
        let mut list: Vec<PathBuf> = vmm.to_vec();
        if list.is_empty() {
            if let Ok(me) = std::env::current_exe() {
                list.push(me.with_file_name("stagevm"));
            }
        }
        Self {
            uid: nix::unistd::geteuid().as_raw(),
            vmm: list
                .into_iter()
                .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
                .collect(),
        }
    }

    /// Whether `peer` is believed. Errors: [`PeerError::Uid`],
    /// [`PeerError::Exe`].
    pub fn check(&self, peer: &Peer) -> Result<(), PeerError> {
        if peer.uid != self.uid && peer.uid != 0 {
            return Err(PeerError::Uid {
                pid: peer.pid,
                uid: peer.uid,
                want: self.uid,
            });
        }
        let exe = std::fs::canonicalize(&peer.exe).unwrap_or_else(|_| peer.exe.clone());
        if !self.vmm.contains(&exe) {
            return Err(PeerError::Exe {
                pid: peer.pid,
                exe: exe.display().to_string(),
                trusted: self
                    .vmm
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(())
    }
}

/// Most threads read per VM (a VMM has its vCPUs and a few helpers; a
/// peer with more is not believed past them).
pub const MAX_TASKS: usize = 4096;

/// The CPU time of process `pid`'s vCPU threads so far (ns, the first
/// field of each `/proc/PID/task/TID/schedstat`) and how many there are:
/// threads whose name (`comm`) is `vcpu` and a number, as the VMM names
/// them. `None` when the process's tasks cannot be read.
pub fn vcpu_cpu(pid: u32) -> Option<(u64, usize)> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let (mut ns, mut n) = (0u64, 0usize);
    for task in dir.flatten().take(MAX_TASKS) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let is_vcpu = comm
            .trim_end()
            .strip_prefix("vcpu")
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
        if !is_vcpu {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        if let Some(on) = stat
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<u64>().ok())
        {
            ns = ns.saturating_add(on);
            n += 1;
        }
    }
    Some((ns, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_identified_and_judged() {
        let dir = std::env::temp_dir().join(format!("stagevm-peer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.sock");
        assert!(matches!(identify(&path), Err(PeerError::Gone(_))));
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let peer = identify(&path).unwrap();
        assert_eq!(peer.pid, std::process::id());
        assert_eq!(peer.uid, nix::unistd::geteuid().as_raw());
        let me = std::env::current_exe().unwrap();
        assert_eq!(
            std::fs::canonicalize(&peer.exe).unwrap(),
            std::fs::canonicalize(&me).unwrap()
        );
        // This test's binary is no VMM by default…
        let default = Trust::new(&[]);
        assert!(matches!(default.check(&peer), Err(PeerError::Exe { .. })));
        assert!(default
            .check(&peer)
            .unwrap_err()
            .to_string()
            .contains("not a trusted VMM"));
        // …and is one when listed; another uid is not believed either way.
        let listed = Trust::new(&[me]);
        assert_eq!(listed.check(&peer), Ok(()));
        let stranger = Peer {
            uid: peer.uid + 4242,
            ..peer.clone()
        };
        // (Another uid than ours and not root: uid + 4242 is never 0.)
        assert!(matches!(
            listed.check(&stranger),
            Err(PeerError::Uid { .. })
        ));
        // No vCPU threads here: read, none counted.
        assert_eq!(vcpu_cpu(std::process::id()).map(|(_, n)| n), Some(0));
        assert_eq!(vcpu_cpu(u32::MAX), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
