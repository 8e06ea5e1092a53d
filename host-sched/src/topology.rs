//! Host CPU topology and thread affinity.
//!
//! The CPUs stagevm may use start from `sched_getaffinity` of the process
//! (which reflects a cgroup cpuset), then `/sys/devices/system/cpu/isolated`
//! (`isolcpus`); an explicit core set from the configuration or the command
//! line overrides the isolated set (these machines cannot set `isolcpus`,
//! `docs/design.md`).

use std::io;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet as NixCpuSet};
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

/// Pins thread `tid` (0 = the calling thread) to `cpus` with
/// `sched_setaffinity(2)`; errors for an empty set or a refused call.
pub fn set_thread_affinity(tid: i32, cpus: &CpuSet) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU set"));
    }
    let mut set = NixCpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu).map_err(io::Error::from)?;
    }
    sched_setaffinity(Pid::from_raw(tid), &set).map_err(io::Error::from)
}

/// The calling thread's kernel thread id (`gettid(2)`).
pub fn gettid() -> i32 {
    nix::unistd::gettid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_this_host_and_pins_a_thread() {
        let topo = Topology::detect().unwrap();
        assert!(!topo.allowed.is_empty());
        assert!(topo.allowed.is_subset(&topo.online));
        let first = topo.allowed.iter().next().unwrap();
        let pinned = std::thread::spawn(move || {
            let one: CpuSet = [first].into_iter().collect();
            set_thread_affinity(0, &one).unwrap();
            // Read back from /proc, not from our own call.
            let status =
                std::fs::read_to_string(format!("/proc/self/task/{}/status", gettid())).unwrap();
            let line = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_string();
            (line, thread_affinity(0).unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(pinned.0, first.to_string());
        assert_eq!(pinned.1.to_string(), first.to_string());
        assert!(set_thread_affinity(0, &CpuSet::new()).is_err());
    }
}
