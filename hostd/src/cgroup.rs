//! The VMs' cgroups, owned by the daemon as Firecracker's jailer owns its
//! microVMs' (issue 50, S2): each VM's VMM is put in a group of its own,
//! `stagevm-NAME`, beside (a child of) the group it was started in, and
//! the daemon writes the group's CPU weight and CPU set there. The
//! allocation is then enforced by the kernel, not merely honoured by a
//! cooperating VMM; the VMM opens no group file (and, under
//! `stagevm@.service`, cannot: `ProtectControlGroups=yes`).
//!
//! cgroup v2 (`cpu.weight`, `cpuset.cpus`): the group is created in the
//! VMM's group and the controllers enabled there, which the kernel allows
//! only when that group holds no other process (a unit's group, handed to
//! the `stagevm` user by `Delegate=` in `stagevm@.service`). cgroup v1
//! (`cpu.shares` = weight × 1024 ÷ 100, `cpuset.cpus`): one group per
//! hierarchy, the `cpuset` one given its parent's memory nodes first. Where
//! neither can be written (no permission, a v2 group shared with other
//! processes, no cgroup file system) [`Hierarchy::join`] says why, and the
//! daemon falls back to sending the weight to the VMM, which sets its vCPU
//! threads' nice (docs/design.md, "Several VMs on one host").

use std::io;
use std::path::{Path, PathBuf};

use host_sched::cpuset::CpuSet;
use host_sched::cpuweight;

/// The cgroup file systems mounted here (`/proc/self/mountinfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hierarchy {
    /// The v2 mount, if any: (mount root, mount point).
    v2: Option<(String, PathBuf)>,
    /// The v1 mount holding `cpu`, if any.
    cpu: Option<(String, PathBuf)>,
    /// The v1 mount holding `cpuset`, if any.
    cpuset: Option<(String, PathBuf)>,
}

/// One VM's group: the folders the daemon made for it and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmGroup {
    /// Where `cpu.weight` (v2) or `cpu.shares` (v1) is.
    weight_dir: PathBuf,
    /// cgroup version of `weight_dir`.
    version: u8,
    /// Where `cpuset.cpus` is, if the CPU set can be written.
    cpuset_dir: Option<PathBuf>,
}

/// The group folder of process `pid` in a hierarchy: the path after the
/// controllers field of its `/proc/PID/cgroup` line (`controller` for v1,
/// `None` for v2's `0::` line), under that mount.
fn current_dir(
    proc_cgroup: &str,
    controller: Option<&str>,
    mount: &(String, PathBuf),
) -> Option<PathBuf> {
    let path = proc_cgroup.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            Some(c) => controllers.split(',').any(|x| x == c),
            None => controllers.is_empty() && line.starts_with("0::"),
        };
        hit.then_some(path)
    })?;
    let rel = path.strip_prefix(mount.0.trim_end_matches('/'))?;
    Some(mount.1.join(rel.trim_start_matches('/')))
}

/// Writes `value` to `dir/file`, naming the file in the error.
fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Reads `dir/file`, trimmed, naming the file in the error.
fn read(dir: &Path, file: &str) -> io::Result<String> {
    let path = dir.join(file);
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl Hierarchy {
    /// The hierarchies in `mountinfo` (its text).
    pub fn parse(mountinfo: &str) -> Self {
        let mut h = Self::default();
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let (Some(root), Some(point), Some(fs), Some(options)) =
                (pre.get(3), pre.get(4), post.first(), post.get(2))
            else {
                continue;
            };
            let mount = Some((root.to_string(), PathBuf::from(point)));
            let has = |c: &str| options.split(',').any(|o| o == c);
            match *fs {
                "cgroup2" if h.v2.is_none() => h.v2 = mount,
                "cgroup" if has("cpu") && h.cpu.is_none() => h.cpu = mount,
                "cgroup" if has("cpuset") && h.cpuset.is_none() => h.cpuset = mount,
                _ => {}
            }
        }
        h
    }

    /// This host's (`/proc/self/mountinfo`).
    pub fn detect() -> Self {
        Self::parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
    }

    /// Puts process `pid` (VM `name`'s VMM) in a group of its own,
    /// `stagevm-NAME`, a child of the group it is in (or that group, when
    /// it is already that one: a restarted daemon), and returns it. v1's
    /// `cpu` hierarchy when mounted (it owns the controller), else v2.
    /// Errors: no hierarchy with the CPU controller; a folder cannot be
    /// made or a file written (named in the message).
    pub fn join(&self, name: &str, pid: u32) -> io::Result<VmGroup> {
        let leaf = format!("stagevm-{name}");
        let procs = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let place = |controller: Option<&str>,
                     mount: &(String, PathBuf)|
         -> io::Result<(PathBuf, bool)> {
            let now = current_dir(&procs, controller, mount).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("pid {pid}'s group under {}", mount.1.display()),
                )
            })?;
            if now.file_name().is_some_and(|f| f == leaf.as_str()) {
                return Ok((now, false));
            }
            let dir = now.join(&leaf);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
            }
            Ok((dir, true))
        };
        if let Some(cpu) = &self.cpu {
            let (dir, moved) = place(Some("cpu"), cpu)?;
            if moved {
                write(&dir, "cgroup.procs", &pid.to_string())?;
            }
            let cpuset_dir = match &self.cpuset {
                Some(m) => place(Some("cpuset"), m).and_then(|(d, moved)| {
                    if moved {
                        // A v1 cpuset group takes no task before it has
                        // CPUs and memory nodes: its parent's (the CPUs
                        // anew: a group left by an earlier run of the VM
                        // may hold a narrower set).
                        let parent = d.parent().unwrap_or(&d).to_path_buf();
                        write(&d, "cpuset.cpus", &read(&parent, "cpuset.cpus")?)?;
                        if read(&d, "cpuset.mems")?.is_empty() {
                            write(&d, "cpuset.mems", &read(&parent, "cpuset.mems")?)?;
                        }
                        write(&d, "cgroup.procs", &pid.to_string())?;
                    }
                    Ok(d)
                }),
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no cpuset hierarchy",
                )),
            };
            return Ok(VmGroup {
                weight_dir: dir,
                version: 1,
                cpuset_dir: cpuset_dir
                    .map_err(|e| tracing::debug!("VM '{name}': no CPU set of its own: {e}"))
                    .ok(),
            });
        }
        let Some(v2) = &self.v2 else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup hierarchy with the cpu controller",
            ));
        };
        let (dir, moved) = place(None, v2)?;
        if moved {
            write(&dir, "cgroup.procs", &pid.to_string())?;
            // Allowed only when the parent now holds no process; if not,
            // the VMM goes back where it was and the group goes.
            let parent = dir.parent().unwrap_or(&dir).to_path_buf();
            if let Err(e) = write(&parent, "cgroup.subtree_control", "+cpu") {
                let _ = write(&parent, "cgroup.procs", &pid.to_string());
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
            let _ = write(&parent, "cgroup.subtree_control", "+cpuset");
        }
        let cpuset_dir = dir.join("cpuset.cpus").exists().then(|| dir.clone());
        if !dir.join("cpu.weight").exists() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: the cpu controller is not enabled for it",
                    dir.display()
                ),
            ));
        }
        Ok(VmGroup {
            weight_dir: dir,
            version: 2,
            cpuset_dir,
        })
    }
}

impl VmGroup {
    /// What carries the weight, for the operator (`cgroup v1
    /// /sys/fs/cgroup/cpu/stagevm-db/cpu.shares`).
    pub fn describe(&self) -> String {
        let file = if self.version == 1 {
            "cpu.shares"
        } else {
            "cpu.weight"
        };
        format!(
            "cgroup v{} {}",
            self.version,
            self.weight_dir.join(file).display()
        )
    }

    /// Its `cpu.shares` (v1) or `cpu.weight` (v2) folder.
    pub fn weight_dir(&self) -> &Path {
        &self.weight_dir
    }

    /// Its `cpuset.cpus` folder, if it has one.
    pub fn cpuset_dir(&self) -> Option<&Path> {
        self.cpuset_dir.as_deref()
    }

    /// Sets its CPU weight (cgroup v2's scale, 1..=10000; `None`: the
    /// default 100): `cpu.weight`, or v1's `cpu.shares`
    /// ([`cpuweight::v1_shares`]). Errors: the write is refused.
    pub fn set_weight(&self, weight: Option<u32>) -> io::Result<()> {
        let w = weight.unwrap_or(cpuweight::DEFAULT);
        if self.version == 1 {
            write(
                &self.weight_dir,
                "cpu.shares",
                &cpuweight::v1_shares(w).to_string(),
            )
        } else {
            write(&self.weight_dir, "cpu.weight", &w.to_string())
        }
    }

    /// Confines the group to `cpus` (`cpuset.cpus`), when it has a CPU set.
    /// Errors: the write is refused (CPUs outside the parent's).
    pub fn set_cpus(&self, cpus: &CpuSet) -> io::Result<()> {
        match &self.cpuset_dir {
            Some(d) => write(d, "cpuset.cpus", &cpus.to_string()),
            None => Ok(()),
        }
    }

    /// Removes its folders once the VM ended (a folder that still holds a
    /// process stays: `EBUSY`).
    pub fn remove(&self) {
        for d in std::iter::once(&self.weight_dir).chain(self.cpuset_dir.iter()) {
            if let Err(e) = std::fs::remove_dir(d) {
                tracing::debug!("{}: not removed: {e}", d.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hierarchies_and_groups_are_found() {
        let h = Hierarchy::parse(HYBRID);
        assert_eq!(
            h.cpu,
            Some(("/".into(), PathBuf::from("/sys/fs/cgroup/cpu")))
        );
        assert_eq!(
            h.cpuset,
            Some(("/".into(), PathBuf::from("/sys/fs/cgroup/cpuset")))
        );
        assert_eq!(
            h.v2,
            Some(("/".into(), PathBuf::from("/sys/fs/cgroup/unified")))
        );
        let procs = "3:cpuset:/\n2:cpu,cpuacct:/vms\n0::/system.slice/stagevm@db.service\n";
        assert_eq!(
            current_dir(procs, Some("cpu"), h.cpu.as_ref().unwrap()),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/vms"))
        );
        assert_eq!(
            current_dir(procs, None, h.v2.as_ref().unwrap()),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/stagevm@db.service"
            ))
        );
        assert_eq!(current_dir("garbage", None, h.v2.as_ref().unwrap()), None);
        let ns = (String::from("/outer"), PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(
            current_dir("0::/outer/vm\n", None, &ns),
            Some(PathBuf::from("/sys/fs/cgroup/vm"))
        );
        assert_eq!(Hierarchy::parse("no mounts"), Hierarchy::default());
        assert!(Hierarchy::default().join("x", std::process::id()).is_err());
    }
}
