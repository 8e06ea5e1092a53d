//! Host CPU topology and the calling thread's affinity: what the host
//! offers, read. Setting an affinity or a nice level is an effect, and
//! lives beside the pinner (`stage_device::os`): host-sched decides,
//! stage-device acts.
//!
//! The CPUs stagevm may use start from `sched_getaffinity` of the process
//! (which reflects a cgroup cpuset), then `/sys/devices/system/cpu/isolated`
//! (`isolcpus`); an explicit core set from the configuration or the command
//! line overrides the isolated set (these machines cannot set `isolcpus`,
//! `docs/design.md`).

use std::io;

use nix::sched::sched_getaffinity;
use nix::unistd::Pid;

use crate::cpuset::{CpuSet, MAX_CPU};

/// What the host offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// CPUs this process may run on (`sched_getaffinity(0)`).
    pub allowed: CpuSet,
    /// Online CPUs (`/sys/devices/system/cpu/online`).
    pub online: CpuSet,
    /// Isolated CPUs (`/sys/devices/system/cpu/isolated`), often empty.
    pub isolated: CpuSet,
}

fn read_cpulist(path: &str) -> io::Result<CpuSet> {
    let text = std::fs::read_to_string(path)?;
    CpuSet::parse(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

impl Topology {
    /// Reads the topology of this host (I/O errors from `/sys` or the
    /// affinity call are returned).
    pub fn detect() -> io::Result<Self> {
        let allowed = thread_affinity(0)?;
        let online = read_cpulist("/sys/devices/system/cpu/online")?;
        let isolated = match read_cpulist("/sys/devices/system/cpu/isolated") {
            Ok(set) => set,
            Err(e) if e.kind() == io::ErrorKind::NotFound => CpuSet::new(),
            Err(e) => return Err(e),
        };
        Ok(Self {
            allowed,
            online,
            isolated,
        })
    }
}

/// The affinity of thread `tid` (0 = the calling thread), from
/// `sched_getaffinity(2)`.
pub fn thread_affinity(tid: i32) -> io::Result<CpuSet> {
    let set = sched_getaffinity(Pid::from_raw(tid)).map_err(io::Error::from)?;
    Ok((0..=MAX_CPU)
        .filter(|c| set.is_set(*c).unwrap_or(false))
        .collect())
}

/// The calling thread's kernel thread id (`gettid(2)`).
pub fn gettid() -> i32 {
    nix::unistd::gettid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_this_host() {
        let topo = Topology::detect().unwrap();
        assert!(!topo.allowed.is_empty());
        assert!(topo.allowed.is_subset(&topo.online));
        assert_eq!(thread_affinity(gettid()).unwrap(), topo.allowed);
    }
}
