//! One daemon per VM directory: an exclusive `flock` on
//! `DIR/.stagevm-hostd.lock`, which holds the owner's pid. The lock goes
//! with the process, so a daemon that dies leaves nothing to clean up.
//! The file is opened without following a symbolic link and used only
//! when it is a regular file of the daemon's user with one link, so a
//! name planted in the directory never makes the daemon write elsewhere.

use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the VM directory.
pub const LOCK_FILE: &str = ".stagevm-hostd.lock";

/// Why the directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon holds it.
    #[error("--vm-dir {dir}: another stagevm-hostd manages it (pid {pid})")]
    Held {
        /// The directory.
        dir: String,
        /// The holder's pid as it wrote it (`?` if unreadable).
        pid: String,
    },
    /// The lock file's path is a symbolic link, or not a regular file of
    /// ours with one link: a planted name would make the daemon (often
    /// root) truncate and write another file.
    #[error("--vm-dir {dir}: {path} {why}; refusing to use it (remove it, and check who can write the directory)")]
    Unsafe {
        /// The directory.
        dir: String,
        /// The lock file's path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The directory may be written by others (group or world, without
    /// the sticky bit's protection for the group case): anyone who can
    /// write it can plant sockets the daemon would read and give cores to.
    #[error(
        "--vm-dir {dir}: mode {mode:04o} lets others write it; refusing to use it (chmod go-w)"
    )]
    Writable {
        /// The directory.
        dir: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The lock file cannot be opened or written.
    #[error("--vm-dir {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock (released on drop or exit).
pub struct DirLock(#[allow(dead_code)] Flock<std::fs::File>);

/// Takes `dir`'s lock. Errors: [`LockError`].
pub fn take(dir: &Path) -> Result<DirLock, LockError> {
    let name = dir.display().to_string();
    let io = |source: std::io::Error| LockError::Io {
        dir: name.clone(),
        source,
    };
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mode = std::fs::metadata(dir).map_err(io)?.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(LockError::Writable { dir: name, mode });
    }
    let path = dir.join(LOCK_FILE);
    let unsafe_file = |why: String| LockError::Unsafe {
        dir: name.clone(),
        path: path.display().to_string(),
        why,
    };
    // O_NOFOLLOW: a symbolic link in the last component fails (ELOOP)
    // instead of being followed; nothing is truncated before the checks.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => unsafe_file("is a symbolic link".into()),
            _ => io(e),
        })?;
    let meta = file.metadata().map_err(io)?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return Err(unsafe_file("is not a regular file".into()));
    }
    if meta.nlink() != 1 {
        return Err(unsafe_file(format!(
            "has {} hard links (another file's name)",
            meta.nlink()
        )));
    }
    if meta.uid() != euid {
        return Err(unsafe_file(format!(
            "belongs to uid {}, not to this daemon's {euid}",
            meta.uid()
        )));
    }
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0).map_err(io)?;
            lock.rewind().map_err(io)?;
            writeln!(lock, "{}", std::process::id()).map_err(io)?;
            Ok(DirLock(lock))
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            Err(LockError::Held {
                dir: name,
                pid: if pid.is_empty() {
                    "?".into()
                } else {
                    pid.into()
                },
            })
        }
        Err((_, e)) => Err(io(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("stagevm-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_planted_link_is_refused_and_its_target_left_alone() {
        let d = dir("links");
        let target = d.join("precious");
        std::fs::write(&target, "precious\n").unwrap();
        // A symbolic link.
        std::os::unix::fs::symlink(&target, d.join(LOCK_FILE)).unwrap();
        let e = take(&d).err().expect("a symbolic link was followed");
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
        // A hard link.
        std::fs::remove_file(d.join(LOCK_FILE)).unwrap();
        std::fs::hard_link(&target, d.join(LOCK_FILE)).unwrap();
        let e = take(&d).err().expect("a hard link was used");
        assert!(e.to_string().contains("2 hard links"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
        // Its own file: taken, the pid written, mode 0600.
        std::fs::remove_file(d.join(LOCK_FILE)).unwrap();
        let lock = take(&d).unwrap();
        let text = std::fs::read_to_string(d.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join(LOCK_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(lock);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("writable");
        for mode in [0o777, 0o1777, 0o775] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = take(&d)
                .err()
                .expect("a directory others can write was used");
            assert!(
                e.to_string().contains("lets others write it"),
                "{mode:o}: {e}"
            );
            assert!(!d.join(LOCK_FILE).exists());
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(take(&d).is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }
}
