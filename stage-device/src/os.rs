//! The OS effects of a plan, beside the pinner that applies them: a
//! thread's CPU affinity (`sched_setaffinity(2)`) and nice level
//! (`setpriority(2)`, and its read-back). host-sched decides (its
//! policies, `cpuweight::nice_for`) and makes no such call; this crate
//! acts (the layering check in `just lint` holds host-sched to it).

use std::io;

use host_sched::cpuset::CpuSet;
use nix::sched::{sched_setaffinity, CpuSet as NixCpuSet};
use nix::unistd::Pid;

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

/// Thread `tid`'s nice level (`getpriority(PRIO_PROCESS, tid)`). Errors:
/// no such thread.
pub fn thread_nice(tid: i32) -> io::Result<i32> {
    // getpriority may return −1 legitimately: clear errno first.
    nix::errno::Errno::clear();
    // SAFETY: getpriority reads no memory of ours.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    if n == -1 && nix::errno::Errno::last_raw() != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n)
}

/// Sets thread `tid`'s nice level (`setpriority(PRIO_PROCESS, tid, nice)`;
/// Linux's nice is per thread). Errors: no such thread, or a lower nice
/// without `CAP_SYS_NICE` (`EACCES`/`EPERM`).
pub fn set_thread_nice(tid: i32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority reads no memory of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Held by the tests that set other threads' affinities (the pinner's
/// adoption pins every thread of the test process for a moment): a test
/// that reads its own back must not run beside them.
#[cfg(test)]
pub(crate) static AFFINITY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use host_sched::topology::{gettid, thread_affinity, Topology};

    #[test]
    fn pins_a_thread_and_reads_it_back_from_proc() {
        let _alone = AFFINITY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let topo = Topology::detect().unwrap();
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

    #[test]
    fn this_threads_nice_reads_back() {
        let tid = gettid();
        let now = thread_nice(tid).unwrap();
        // Raising one's own nice needs no privilege.
        let up = (now + 1).min(19);
        set_thread_nice(tid, up).unwrap();
        assert_eq!(thread_nice(tid).unwrap(), up);
        assert!(thread_nice(i32::MAX).is_err());
    }
}
