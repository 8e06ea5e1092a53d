//! The tap backend of virtio-net: a `/dev/net/tun` queue opened with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` (Linux's
//! `Documentation/networking/tuntap.rst`), non-blocking, its virtio-net
//! header 12 bytes long (`TUNSETVNETHDRSZ`: the VIRTIO 1.x header with
//! `num_buffers`). No crate for this was available offline, so the two
//! documented ioctls are made through `libc`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Length of the virtio-net header in front of every frame on the tap and in
/// the queues (bytes; `struct virtio_net_hdr_v1`, VIRTIO 1.2 §5.1.6).
pub const VNET_HDR_LEN: usize = 12;

/// Why a tap cannot be used (the caller names the `--net` option).
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// Not a Linux interface name.
    #[error("'{0}' is not an interface name (1 to {max} bytes)", max = libc::IFNAMSIZ - 1)]
    BadName(String),
    /// `/dev/net/tun` cannot be opened.
    #[error("/dev/net/tun: {0}")]
    Tun(#[source] std::io::Error),
    /// The kernel refused the interface (`TUNSETIFF`).
    #[error("TUNSETIFF: {0}")]
    SetIff(#[source] std::io::Error),
    /// `fd=N` is not an open descriptor, or cannot be made non-blocking.
    #[error("fd {fd}: {source}")]
    Fd {
        /// The descriptor given.
        fd: RawFd,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Not a tap with `IFF_VNET_HDR` (`TUNSETVNETHDRSZ` refused).
    #[error("TUNSETVNETHDRSZ (not a tap with IFF_VNET_HDR?): {0}")]
    HeaderLen(#[source] std::io::Error),
    /// Neither `tap=` nor `fd=` was given.
    #[error("no tap= or fd=")]
    Missing,
}

/// An open tap queue.
pub struct Tap {
    file: File,
    /// The interface's name (`tap0`), or `fd=N` for a descriptor given on
    /// the command line.
    pub name: String,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags (the
/// union is 24 bytes on x86-64).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tap {
    /// Opens (or creates, with `CAP_NET_ADMIN`) the tap interface `name`.
    /// Errors: the name is empty or longer than 15 bytes, `/dev/net/tun`
    /// cannot be opened, or the kernel refuses the interface (it exists as
    /// another kind, or is owned by another user).
    pub fn open(name: &str) -> Result<Self, TapError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(TapError::BadName(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::Tun)?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which
        // `req` is (40 bytes, the layout above), live for the call.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if r < 0 {
            return Err(TapError::SetIff(std::io::Error::last_os_error()));
        }
        let tap = Self {
            file,
            name: name.to_string(),
        };
        tap.set_header_len()?;
        Ok(tap)
    }

    /// Takes over `fd`, a tap queue the caller opened with `IFF_TAP |
    /// IFF_NO_PI | IFF_VNET_HDR` (`--net fd=N`), and makes it
    /// non-blocking. Errors: `fd` is not an open descriptor, or not a tap
    /// that accepts a 12-byte virtio-net header.
    pub fn from_fd(fd: RawFd) -> Result<Self, TapError> {
        let fd_err = || TapError::Fd {
            fd,
            source: std::io::Error::last_os_error(),
        };
        // SAFETY: F_GETFD only reads the descriptor's flags; it fails with
        // EBADF if `fd` is not open, before we take ownership.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(fd_err());
        }
        // SAFETY: `fd` is open (checked above) and the command line hands
        // it to the VMM: nothing else in the process uses or closes it.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: F_GETFL/F_SETFL on an open descriptor; no memory involved.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(fd_err());
        }
        let tap = Self {
            file,
            name: format!("fd={fd}"),
        };
        tap.set_header_len()?;
        Ok(tap)
    }

    /// A stand-in for a tap, for tests and the fuzz target: any descriptor
    /// that carries one frame (with its 12-byte header) per read and write,
    /// such as one end of a `SOCK_DGRAM` socket pair (non-blocking).
    pub fn from_datagram_socket(fd: OwnedFd, name: &str) -> Self {
        Self {
            file: File::from(fd),
            name: name.to_string(),
        }
    }

    fn set_header_len(&self) -> Result<(), TapError> {
        let len: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int, `len`, live for the call.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &len) };
        if r < 0 {
            return Err(TapError::HeaderLen(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Reads one frame with its virtio-net header into `buf`; returns its
    /// length in bytes (a frame longer than `buf` is cut). Errors:
    /// `WouldBlock` when no frame is queued; others mean the tap is gone.
    pub fn read_frame(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame with its virtio-net header. Errors: `WouldBlock`
    /// when the tap's queue is full; others mean the tap is gone or refused
    /// the frame.
    pub fn write_frame(&self, frame: &[u8]) -> std::io::Result<usize> {
        (&self.file).write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
