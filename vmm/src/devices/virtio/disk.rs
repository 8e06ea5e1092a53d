//! Opening a `--disk`: what a disk may be (a regular file or a block
//! device, nothing that would block the open or fail every request), its
//! size, and the advisory lock two VMMs use to keep off each other's
//! images. Errors name no path: the caller adds it (`VmmError::Disk`).

use std::fs::File;
use std::path::Path;

/// Why a `--disk` cannot be used (the path is named by the caller).
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The path cannot be examined or opened; `described` says why in the
    /// user's terms (a missing directory is named).
    #[error("{described}")]
    Open {
        /// [`stagevm_api::paths::describe_path_error`]'s text.
        described: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// `direct=on` on a file system without `O_DIRECT`.
    #[error("direct=on: this file system refuses O_DIRECT (EINVAL); use direct=off")]
    DirectRefused,
    /// The path is no regular file or block device (`what` it is).
    #[error("is {0}; a disk is a regular file or a block device")]
    NotADisk(&'static str),
    /// The opened file cannot be examined.
    #[error("{0}")]
    Metadata(#[source] std::io::Error),
    /// A block device's size cannot be read.
    #[error("block device size (BLKGETSIZE64): {0}")]
    Size(#[source] nix::Error),
    /// Another process holds a conflicting lock.
    #[error("locked by another process (another VMM uses this image)")]
    Locked,
    /// `flock` failed otherwise.
    #[error("cannot lock: {0}")]
    Lock(#[source] std::io::Error),
    /// Smaller than one sector (bytes).
    #[error("{0} bytes is smaller than one 512-byte sector")]
    TooSmall(u64),
    /// Two disks with one `id=`.
    #[error("id={0}: another --disk has this name")]
    DuplicateId(String),
}

/// Opens `path` as a disk, read-only or writable, and locks it: returns the
/// file and its size in bytes. The type is checked before the open (a FIFO
/// would block it, a directory would open read-only and fail every
/// request) and again on what was opened (the path may have changed
/// meanwhile).
///
/// # Errors
/// The path is missing (naming a missing directory), not a regular file
/// or block device, cannot be opened, sized or locked.
/// With `direct`, the file is opened `O_DIRECT` (a file system that
/// refuses it is named in the error).
pub fn open(path: &Path, readonly: bool, direct: bool) -> Result<(File, u64), DiskError> {
    use std::os::unix::fs::OpenOptionsExt;
    let why = |source: std::io::Error| DiskError::Open {
        described: stagevm_api::paths::describe_path_error(path, &source),
        source,
    };
    disk_kind(&std::fs::metadata(path).map_err(why)?.file_type())?;
    let direct_flag = if direct { libc::O_DIRECT } else { 0 };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(!readonly)
        .custom_flags(libc::O_NONBLOCK | direct_flag)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) if direct => DiskError::DirectRefused,
            _ => why(e),
        })?;
    let meta = file.metadata().map_err(DiskError::Metadata)?;
    let len = match disk_kind(&meta.file_type())? {
        DiskKind::File => meta.len(),
        DiskKind::BlockDevice => block_device_size(&file).map_err(DiskError::Size)?,
    };
    lock_disk(&file, readonly)?;
    Ok((file, len))
}

/// What a `--disk` path may be.
enum DiskKind {
    /// A regular file: its length is the disk's size.
    File,
    /// A block device: sized with `BLKGETSIZE64`.
    BlockDevice,
}

/// The kind of a `--disk` path, or why it cannot be a disk (a directory, a
/// FIFO, a socket, a character device).
fn disk_kind(t: &std::fs::FileType) -> Result<DiskKind, DiskError> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        return Ok(DiskKind::File);
    }
    if t.is_block_device() {
        return Ok(DiskKind::BlockDevice);
    }
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    };
    Err(DiskError::NotADisk(what))
}

nix::ioctl_read!(
    /// `BLKGETSIZE64` (linux/fs.h: `_IOR(0x12, 114, size_t)`): a block
    /// device's size in bytes.
    blkgetsize64,
    0x12,
    114,
    u64
);

/// A block device's size in bytes.
fn block_device_size(file: &File) -> nix::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at `size`; the descriptor is ours and open.
    unsafe { blkgetsize64(file.as_raw_fd(), &mut size) }?;
    Ok(size)
}

/// Takes an advisory lock on a disk image for as long as the VMM holds it
/// open: shared for a read-only disk, exclusive for a writable one (as
/// Cloud Hypervisor does), so two VMMs cannot write one image. The error
/// says who holds it.
fn lock_disk(file: &File, readonly: bool) -> Result<(), DiskError> {
    use std::os::fd::AsRawFd;
    let kind = if readonly {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    // SAFETY: flock(2) on a descriptor we own; it touches no memory.
    if unsafe { libc::flock(file.as_raw_fd(), kind | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        DiskError::Locked
    } else {
        DiskError::Lock(e)
    })
}
