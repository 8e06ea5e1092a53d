//! One daemon per VM directory: an exclusive `flock` on
//! `DIR/.stagevm-hostd.lock`, which holds the owner's pid. The lock goes
//! with the process, so a daemon that dies leaves nothing to clean up.

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
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))
        .map_err(io)?;
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
