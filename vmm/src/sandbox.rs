//! Landlock for the VMM (issue 50): once the VM is built — its kernel and
//! disks read or open, `/dev/kvm`, taps, the console and the API socket
//! open, the report file created — the process restricts itself, before
//! its first thread starts (every thread inherits it), with the `landlock`
//! crate (the LSM's own Rust bindings). From then on it can reach in the
//! file system only:
//!
//! * `/proc/self` for reading (the `stage-sched` thread adopts the threads
//!   of `/proc/self/task` and reads their `schedstat`);
//! * `/proc/sys/vm/overcommit_memory` for reading (glibc's malloc reads it
//!   once, in whichever thread first shrinks a heap);
//! * the API socket's directory, to remove the socket when the VM ends;
//!
//! and no TCP port: binding and connecting are handled with no rule (a
//! `--metrics-listen` socket was bound before). Signals and abstract Unix
//! sockets are scoped to the process where the kernel offers it (ABI 6).
//! Everything is best effort, as the crate's default: a kernel without
//! Landlock (or with an older ABI) enforces what it has, and the VMM says
//! so in its log and goes on. The descriptors opened before keep working:
//! Landlock checks an access when a file is opened.

use std::path::Path;

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, LandlockStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// `--landlock`: whether the VMM restricts itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockMode {
    /// Restrict (default).
    On,
    /// Nothing.
    Off,
}

impl std::str::FromStr for LandlockMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "true" => Ok(Self::On),
            "false" => Ok(Self::Off),
            _ => Err(format!("'{s}': expected true or false")),
        }
    }
}

/// The newest Landlock ABI this code asks for; the crate falls back to
/// what the running kernel has.
const ABI_WANTED: ABI = ABI::V6;

/// Restricts this process as the module says, `api_socket` being the
/// operator API's socket path if any. Returns the line the VMM logs: how
/// much is enforced (`fully`, `partly`: an older ABI, `not`: no Landlock
/// in this kernel). Errors: the crate refused a rule of ours (a bug), as
/// text.
pub fn restrict(api_socket: Option<&Path>) -> Result<String, String> {
    let abi = ABI_WANTED;
    let err = |e: landlock::RulesetError| e.to_string();
    let mut writable: Vec<&Path> = Vec::new();
    if let Some(dir) = api_socket.and_then(Path::parent) {
        writable.push(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        });
    }
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(
            ["/proc/self", "/proc/sys/vm/overcommit_memory"],
            AccessFs::from_read(abi),
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(writable, AccessFs::RemoveFile))
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    let kernel = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => {
            format!("Landlock ABI {}", effective_abi as i32)
        }
        LandlockStatus::NotEnabled => "Landlock not enabled in this kernel".into(),
        LandlockStatus::NotImplemented => "no Landlock in this kernel".into(),
    };
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => format!("landlock: fully enforced ({kernel})"),
        RulesetStatus::PartiallyEnforced => {
            format!(
                "landlock: partly enforced ({kernel}: an older ABI than {})",
                abi as i32
            )
        }
        _ => format!("landlock: not enforced ({kernel}); going on without it"),
    })
}
