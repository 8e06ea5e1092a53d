//! A VM's CPU weight where its vCPU threads share a core with other VMs'
//! (`host.cpu_weight`, cgroup v2's scale: 100 is one ordinary process).
//!
//! The scheduler shares a core between task groups first, then between
//! the threads of a group (Documentation/scheduler/sched-design-CFS.rst
//! §7, sched-autogroup.rst), so [`governor`] looks where the VMM runs and
//! [`Governor`] says what decides its share:
//!
//! * the VMM alone in a cgroup with the CPU controller (a systemd unit's
//!   cgroup, `stagevm@NAME.service`): the group's weight, cgroup v2
//!   `cpu.weight` = the weight, or v1 `cpu.shares` = weight × 1024 ÷ 100
//!   (v1's default 1024 is v2's 100);
//! * else, where no cgroup of its own with the controller decides (the
//!   root group, or a group without the CPU controller), autogroup on and
//!   the VMM leading its own session (`setsid`, as systemd starts a
//!   service): its autogroup's nice, the level whose CFS weight is nearest
//!   the weight;
//! * else (VMs in one group, as a test harness or a shell starts them):
//!   each vCPU thread's nice, the level nearest weight ÷ vCPUs (a VM's
//!   threads together weigh its weight).
//!
//! A group's file is opened for writing when the VMM starts
//! ([`GroupKnob::open`]), before its threads' seccomp filters, which open
//! no file for writing. Only the weight's ratio to other VMs' matters;
//! `stagevm-hostd` scales the weights so the heaviest VM's vCPU threads
//! keep nice 0 (a raised nice needs no privilege; a lowered one, and an
//! autogroup's nice below its current one, need `CAP_SYS_NICE`).

use std::io;
use std::path::{Path, PathBuf};

/// The weight of one ordinary process (cgroup v2's default `cpu.weight`).
pub const DEFAULT: u32 = 100;

/// CFS load weight of nice −20..=19 (Linux, kernel/sched/core.c
/// `sched_prio_to_weight`): each level ≈ 1.25× the next.
const PRIO_TO_WEIGHT: [u32; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

/// The nice level (−20..=19) whose CFS weight is nearest (in ratio) to
/// `weight` on the cgroup v2 scale (100 ↔ nice 0's 1024). A weight that
/// is not a positive finite number gives 19.
pub fn nice_for(weight: f64) -> i32 {
    if !(weight.is_finite() && weight > 0.0) {
        return 19;
    }
    let target = (weight * 1024.0 / f64::from(DEFAULT)).ln();
    let (i, _) = PRIO_TO_WEIGHT
        .iter()
        .enumerate()
        .map(|(i, w)| (i, (f64::from(*w).ln() - target).abs()))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a non-empty table");
    i as i32 - 20
}

/// CFS load weight of nice level `nice` (clamped to −20..=19).
pub fn weight_of_nice(nice: i32) -> u32 {
    PRIO_TO_WEIGHT[(nice.clamp(-20, 19) + 20) as usize]
}

/// cgroup v1 `cpu.shares` for `weight` (v1's 1024 is v2's 100; v1's range
/// 2..=262144).
pub fn v1_shares(weight: u32) -> u64 {
    (u64::from(weight) * 1024 / u64::from(DEFAULT)).clamp(2, 262_144)
}

/// What decides the VM's share of a core it shares with other VMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Governor {
    /// Its own cgroup v2 group (this folder, with `cpu.weight`).
    CgroupV2(PathBuf),
    /// Its own cgroup v1 `cpu` group (this folder, with `cpu.shares`).
    CgroupV1(PathBuf),
    /// Its own autogroup (`/proc/self/autogroup`).
    Autogroup,
    /// Its vCPU threads' nice levels.
    Threads,
}

impl std::fmt::Display for Governor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Governor::CgroupV2(d) => write!(f, "cgroup v2 {}/cpu.weight", d.display()),
            Governor::CgroupV1(d) => write!(f, "cgroup v1 {}/cpu.shares", d.display()),
            Governor::Autogroup => write!(f, "autogroup nice"),
            Governor::Threads => write!(f, "vCPU threads' nice"),
        }
    }
}

/// The folder of this process's CPU cgroup from `/proc/self/cgroup`
/// (`proc_cgroup`) and `/proc/self/mountinfo` (`mountinfo`): a cgroup v1
/// hierarchy with the `cpu` controller if one is mounted (it then owns
/// the controller), else the v2 hierarchy. `None` in the root group (its
/// weight is not the VM's) or when the hierarchy is not mounted.
pub fn cgroup_dir(proc_cgroup: &str, mountinfo: &str) -> Option<(u8, PathBuf)> {
    // mountinfo: id parent dev root mountpoint options… - fstype source super
    let mounts: Vec<(&str, &str, &str, &str)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some((*pre.get(3)?, *pre.get(4)?, *post.first()?, *post.get(2)?))
        })
        .collect();
    let within = |root: &str, mountpoint: &str, path: &str| -> Option<PathBuf> {
        let rel = path.strip_prefix(root.trim_end_matches('/'))?;
        let rel = rel.trim_start_matches('/');
        (!rel.is_empty()).then(|| Path::new(mountpoint).join(rel))
    };
    let has_cpu = |list: &str| list.split(',').any(|c| c == "cpu");
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if has_cpu(controllers) {
            let (root, mp, _, _) = mounts
                .iter()
                .find(|(_, _, fs, sup)| *fs == "cgroup" && has_cpu(sup))?;
            return within(root, mp, path).map(|d| (1, d));
        }
    }
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (root, mp, _, _) = mounts.iter().find(|(_, _, fs, _)| *fs == "cgroup2")?;
    within(root, mp, path).map(|d| (2, d))
}

/// Whether `procs` (a `cgroup.procs` file's text) lists `pid` alone.
pub fn alone(procs: &str, pid: u32) -> bool {
    let mut any = false;
    for l in procs.lines().filter(|l| !l.trim().is_empty()) {
        if l.trim().parse::<u32>() != Ok(pid) {
            return false;
        }
        any = true;
    }
    any
}

/// Which knob decides this process's share of a shared core (the module's
/// rules), from `/proc/self` and the cgroup folders; [`Governor::Threads`]
/// when nothing else can be read.
pub fn governor() -> Governor {
    let pid = std::process::id();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    if let Some((v, dir)) = cgroup_dir(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo")) {
        let knob = if v == 1 { "cpu.shares" } else { "cpu.weight" };
        // Without the file the CPU controller is off for the group (a v2
        // group whose parent does not enable it): the group does not
        // decide, the autogroup rule below may.
        if dir.join(knob).exists() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            if !alone(&procs, pid) {
                // In a group with others: its threads compete inside it.
                return Governor::Threads;
            }
            return if v == 1 {
                Governor::CgroupV1(dir)
            } else {
                Governor::CgroupV2(dir)
            };
        }
    }
    let autogroup = read("/proc/sys/kernel/sched_autogroup_enabled").trim() == "1";
    let leader = nix::unistd::getsid(None).is_ok_and(|s| s.as_raw() as u32 == pid);
    if autogroup && leader && Path::new("/proc/self/autogroup").exists() {
        Governor::Autogroup
    } else {
        Governor::Threads
    }
}

/// A group's weight file (`cpu.weight`, `cpu.shares`, or
/// `/proc/self/autogroup`), opened for writing, with the value it held
/// when opened.
#[derive(Debug)]
pub struct GroupKnob {
    governor: Governor,
    file: std::fs::File,
    base: i64,
}

impl GroupKnob {
    /// Opens `governor`'s file for writing and reads its value now.
    /// Errors: [`Governor::Threads`] has none (`Unsupported`); the file
    /// cannot be read, parsed or opened for writing (not root: EACCES).
    pub fn open(governor: Governor) -> io::Result<Self> {
        let path = match &governor {
            Governor::CgroupV2(d) => d.join("cpu.weight"),
            Governor::CgroupV1(d) => d.join("cpu.shares"),
            Governor::Autogroup => PathBuf::from("/proc/self/autogroup"),
            Governor::Threads => return Err(io::ErrorKind::Unsupported.into()),
        };
        let text = std::fs::read_to_string(&path)?;
        // "/autogroup-94 nice 0" or a number.
        let word = text.split_whitespace().last().unwrap_or_default();
        let base = word.parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: '{word}': {e}", path.display()),
            )
        })?;
        let file = std::fs::OpenOptions::new().write(true).open(&path)?;
        Ok(Self {
            governor,
            file,
            base,
        })
    }

    /// What it is.
    pub fn governor(&self) -> &Governor {
        &self.governor
    }

    /// The value the group held when opened.
    pub fn base(&self) -> i64 {
        self.base
    }

    /// The value on this file's scale for VM weight `weight`: the weight
    /// (v2), [`v1_shares`] (v1), [`nice_for`] (autogroup).
    pub fn value_for(&self, weight: u32) -> i64 {
        match self.governor {
            Governor::CgroupV2(_) => i64::from(weight),
            Governor::CgroupV1(_) => v1_shares(weight) as i64,
            Governor::Autogroup | Governor::Threads => i64::from(nice_for(f64::from(weight))),
        }
    }

    /// Writes the value for `weight`, or the value found when opened for
    /// `None`; returns what it wrote. Errors: the write is refused (a
    /// value out of the file's range, an autogroup nice below its current
    /// one without `CAP_SYS_NICE`).
    pub fn set(&self, weight: Option<u32>) -> io::Result<i64> {
        use std::io::Write;
        let value = weight.map_or(self.base, |w| self.value_for(w));
        // One write per value: the kernel parses each write on its own.
        (&self.file).write_all(format!("{value}\n").as_bytes())?;
        Ok(value)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_levels_follow_the_kernels_table() {
        assert_eq!(nice_for(100.0), 0);
        assert_eq!(nice_for(50.0), 3);
        // One in eight of a default thread: 128 → nice 9 (137).
        assert_eq!(nice_for(12.5), 9);
        assert_eq!(nice_for(300.0), -5);
        assert_eq!(nice_for(1e9), -20);
        assert_eq!(nice_for(0.001), 19);
        assert_eq!(nice_for(0.0), 19);
        assert_eq!(nice_for(f64::NAN), 19);
        assert_eq!(weight_of_nice(0), 1024);
        assert_eq!(weight_of_nice(9), 137);
        assert_eq!(weight_of_nice(99), 15);
        assert_eq!(v1_shares(100), 1024);
        assert_eq!(v1_shares(1), 10);
        assert_eq!(v1_shares(10_000), 102_400);
    }

    const MOUNTS: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
";

    #[test]
    fn the_cgroup_that_holds_the_cpu_controller_is_found() {
        // Hybrid: v1 has `cpu`, so it decides.
        let cg = "4:memory:/x\n1:cpu:/vms/db\n0::/user.slice\n";
        assert_eq!(
            cgroup_dir(cg, MOUNTS),
            Some((1, PathBuf::from("/sys/fs/cgroup/cpu/vms/db")))
        );
        // Joined controllers.
        let joined = MOUNTS.replace("rw,cpu", "rw,cpu,cpuacct");
        assert_eq!(
            cgroup_dir("2:cpu,cpuacct:/a\n", &joined),
            Some((1, PathBuf::from("/sys/fs/cgroup/cpu/a")))
        );
        // Unified only.
        let v2 = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_dir("0::/system.slice/stagevm@db.service\n", v2),
            Some((
                2,
                PathBuf::from("/sys/fs/cgroup/system.slice/stagevm@db.service")
            ))
        );
        // The root group, nothing mounted, garbage: none.
        assert_eq!(cgroup_dir("1:cpu:/\n0::/\n", MOUNTS), None);
        assert_eq!(cgroup_dir("0::/a\n", ""), None);
        assert_eq!(cgroup_dir("garbage", MOUNTS), None);
        // A namespace's mount root is taken off the path.
        let ns = "25 1 0:22 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_dir("0::/outer/vm\n", ns),
            Some((2, PathBuf::from("/sys/fs/cgroup/vm")))
        );
    }

    #[test]
    fn a_group_is_the_vms_only_when_it_holds_the_vmm_alone() {
        assert!(alone("42\n", 42));
        assert!(!alone("42\n43\n", 42));
        assert!(!alone("", 42));
        assert!(!alone("x\n", 42));
    }

    #[test]
    fn this_threads_nice_reads_back() {
        let tid = nix::unistd::gettid().as_raw();
        let now = thread_nice(tid).unwrap();
        // Raising one's own nice needs no privilege.
        let up = (now + 1).min(19);
        set_thread_nice(tid, up).unwrap();
        assert_eq!(thread_nice(tid).unwrap(), up);
        assert!(thread_nice(i32::MAX).is_err());
    }
}
