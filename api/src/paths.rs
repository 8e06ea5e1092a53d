//! Host path helpers: leaf functions (std and libc only) that the API's
//! socket, the VMM's configuration, its devices and the daemon share.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Why opening or creating `path` failed, for an error naming the path: a
/// missing file says whether its directory is missing too, and which one
/// (the bare "No such file or directory" leaves the user to guess).
pub fn describe_path_error(path: &Path, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        return if dir.exists() {
            format!("no such file (its directory {} exists)", dir.display())
        } else {
            format!("its directory {} does not exist", dir.display())
        };
    }
    e.to_string()
}

/// Binds a Unix socket at `path` readable and writable by its owner only
/// (mode 0600) from the start: the bind runs under `umask(0o177)`, so there
/// is no window in which the umask's group or others could connect. Call it
/// while the process has one thread (`umask` is process-wide). Errors: the
/// bind or the chmod failed.
pub fn bind_owner_only(path: &Path) -> std::io::Result<UnixListener> {
    // SAFETY: umask only sets the process's file-mode mask; restored right
    // after the bind.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
