//! The test kit shared by stagevm's end-to-end tests (`tests/`) and its
//! benchmarks (`bench/`), so that each does one thing one way:
//!
//! * [`Stagevm`]: the `stagevm` command line (kernel, vCPUs, memory,
//!   disks, nets, API socket, report, extra arguments, environment), run
//!   with its output captured; the [`Running`] child is killed and reaped
//!   when dropped. [`Remote`] runs `stagevm-remote`. No other code of the
//!   tests or benchmarks spawns either binary; the few tests that need
//!   another program around the VMM (`strace`, `unshare`, `setpriv`) give
//!   it to [`Stagevm::wrap`]. The caller names the binaries (the tests
//!   `env!("CARGO_BIN_EXE_stagevm")`, the benchmarks their `--stagevm`):
//!   the kit assumes no path.
//! * [`net`]: network namespaces of the caller's own with a tap in them,
//!   an `AF_PACKET` peer on it, and TCP from inside a namespace.
//! * [`console`]: the figures the guests print (`key value` fields).
//! * [`checksum`]: FNV-1a as the guests compute it.
//! * [`api`]: calls to the operator API through `stagevm_api::client`.
//! * [`machine`]: the test guest built, the workspace's binaries for a
//!   test of another package, a VM test alone or two functional ones at once ([`machine::vm_lock`]).
//! * [`Hostd`]: `stagevm-hostd`, started the same way.

pub mod api;
pub mod console;
mod hostd;
mod launch;
pub mod machine;
pub mod net;
mod running;

pub use hostd::Hostd;
pub use launch::{LaunchError, Remote, Stagevm};
pub use running::{Lines, Reaped, Run, Running};

/// FNV-1a (64-bit), the checksum the guests print over disk bytes and
/// frame payloads: `stage-workload`'s, itself the `fnv` crate's.
pub mod checksum {
    pub use stage_workload::checksum::{fnv1a, fnv1a_continue, FNV1A_START};
}

/// A fresh path in the temporary directory,
/// `stagevm-<what>-<pid>-<n>.<ext>`: unique within this process (`n`
/// counts up) and between processes (`pid`). Nothing is created.
pub fn temp_path(what: &str, ext: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "stagevm-{what}-{}-{}.{ext}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}
