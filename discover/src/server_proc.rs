//! What `/proc` says about the server under the tool: whether it listens
//! on a TCP port (readiness) and whether it mapped the `--binary` file.

use std::path::Path;

/// `None` when process `pid` (the server under Valgrind) maps `binary`;
/// else the files it maps executable, other than shared libraries and
/// Valgrind's own (empty when its maps cannot be read).
pub fn other_executables(pid: u32, binary: &Path) -> Option<Vec<String>> {
    let maps = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.maps())
        .ok()?;
    let mut files: Vec<String> = Vec::new();
    for m in maps {
        if let procfs::process::MMapPath::Path(p) = &m.pathname {
            if p == binary {
                return None;
            }
            let name = p.to_string_lossy();
            let library = name.contains(".so") || name.contains("valgrind");
            if m.perms.contains(procfs::process::MMPermissions::EXECUTE)
                && !library
                && !files.iter().any(|f| *f == name)
            {
                files.push(name.into_owned());
            }
        }
    }
    Some(files)
}

/// Whether process `pid` has a listening TCP socket (IPv4 or IPv6).
pub fn listens(pid: u32) -> bool {
    let Ok(p) = procfs::process::Process::new(pid as i32) else {
        return false;
    };
    let Ok(fds) = p.fd() else { return false };
    let inodes: std::collections::HashSet<u64> = fds
        .filter_map(Result::ok)
        .filter_map(|f| match f.target {
            procfs::process::FDTarget::Socket(i) => Some(i),
            _ => None,
        })
        .collect();
    let listening = |v: procfs::ProcResult<Vec<procfs::net::TcpNetEntry>>| {
        v.unwrap_or_default()
            .iter()
            .any(|e| e.state == procfs::net::TcpState::Listen && inodes.contains(&e.inode))
    };
    !inodes.is_empty() && (listening(p.tcp()) || listening(p.tcp6()))
}
