//! `host.toml`: the host's stage cores and each VM's budget.
//!
//! ```toml
//! [host]
//! cores = "0-5"          # the stage cores the VMs share (default: the isolated CPUs, else every allowed one)
//! housekeeping = "6-7"   # every VM's helper threads (default: each VM's own)
//! period_ms = 1000       # how often demand is read and cores re-shared
//! hysteresis = 0.25      # cores × weight a VM's unmet demand must beat a holder's by
//! timeout_ms = 500       # a VM's socket that has not answered by then is skipped
//! lend_when_idle = false # every VM's default for the key below
//! vmm = ["/usr/bin/stagevm"] # the VMM executables believed (default: the stagevm beside stagevm-hostd)
//! hold_periods = 3       # after a move of any VM's cores, no core moves for this many periods
//! cgroups = true         # put each VM in a cgroup of its own and set its CPU weight and set there
//! only_listed = false    # serve only VMs with a [[vm]] entry (others are refused)
//!
//! [[vm]]
//! name = "db"            # the API socket's stem: --api-socket DIR/db.sock
//! weight = 2             # default 1; also its CPU weight on a core it shares with other VMs
//! min_cores = 1          # default 0
//! max_cores = 4          # default: all
//! # cores = "4-5"        # a fixed set instead
//! lend_when_idle = true  # idle (and min_cores 0): run on a shared core so a busy VM has this one
//! ```
//!
//! A VM without an entry gets the defaults. Errors name the key and value
//! (TOML errors: toml's line, column and caret).

use std::path::Path;

use host_sched::cpuset::CpuSet;
use serde::Deserialize;

/// Largest `host.toml` read (bytes).
pub const MAX_BYTES: u64 = 1 << 20;

/// A bad `host.toml`: one message naming the file, key and value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HostConfigError {
    /// The file cannot be read.
    #[error("{path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Not valid TOML, an unknown key or a wrong type.
    #[error("{path}: {message}")]
    Toml {
        /// The file.
        path: String,
        /// toml's message: line, column, the line with a caret.
        message: String,
    },
    /// `[host] cores` or `housekeeping` refused as host-sched refuses a
    /// `--stages` file's `[host]` (not a CPU list, not online, not allowed,
    /// overlapping).
    #[error("{path}: {source}")]
    Cpus {
        /// The file.
        path: String,
        /// host-sched's refusal, naming the key and value (boxed: it is
        /// large).
        #[source]
        source: Box<host_sched::config::StagesConfigError>,
    },
    /// A key's value is out of range or not a CPU list.
    #[error("{path}: {key} = {value}: {reason}")]
    Value {
        /// The file.
        path: String,
        /// The key (`[host] cores`, `[[vm]] 'db' weight`).
        key: String,
        /// Its value as written.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The VMs' settings do not fit the host's cores.
    #[error("{path}: {source}")]
    Budgets {
        /// The file.
        path: String,
        /// The allocator's refusal, with the numbers.
        #[source]
        source: host_sched::host::AllocError,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    host: HostFile,
    #[serde(default, rename = "vm")]
    vms: Vec<VmFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    cores: Option<String>,
    housekeeping: Option<String>,
    period_ms: Option<u64>,
    hysteresis: Option<f64>,
    timeout_ms: Option<u64>,
    lend_when_idle: Option<bool>,
    vmm: Option<Vec<std::path::PathBuf>>,
    hold_periods: Option<u64>,
    cgroups: Option<bool>,
    only_listed: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmFile {
    name: String,
    weight: Option<f64>,
    min_cores: Option<usize>,
    max_cores: Option<usize>,
    cores: Option<String>,
    lend_when_idle: Option<bool>,
}

/// One `[[vm]]` entry (or the defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct VmBudget {
    /// Weight (> 0).
    pub weight: f64,
    /// Fewest cores when the host allows.
    pub min_cores: usize,
    /// Most cores.
    pub max_cores: usize,
    /// A fixed set, if any.
    pub cores: Option<CpuSet>,
    /// Idle (and `min_cores` 0): runs on a shared core so that a busy VM
    /// can have its own (host-sched's allocator, rule 2).
    pub lend_when_idle: bool,
}

impl Default for VmBudget {
    fn default() -> Self {
        Self {
            weight: 1.0,
            min_cores: 0,
            max_cores: usize::MAX,
            cores: None,
            lend_when_idle: false,
        }
    }
}

/// The resolved `host.toml`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// The stage cores the VMs share.
    pub cores: CpuSet,
    /// Every VM's housekeeping cores, if set.
    pub housekeeping: Option<CpuSet>,
    /// The allocation period.
    pub period: std::time::Duration,
    /// The allocator's hysteresis (cores × weight).
    pub hysteresis: f64,
    /// How long a VM's socket has to answer.
    pub timeout: std::time::Duration,
    /// `lend_when_idle` of a VM that does not set it.
    pub lend_when_idle: bool,
    /// `[[vm]]` entries by name.
    pub vms: std::collections::BTreeMap<String, VmBudget>,
    /// The VMM executables whose sockets are believed (`[host] vmm`;
    /// empty: the `stagevm` beside the daemon's binary,
    /// [`crate::peer::Trust::new`]).
    pub vmm: Vec<std::path::PathBuf>,
    /// Periods the allocation holds after a move of any VM's cores
    /// (`[host] hold_periods`, 0..=100, default 3): a guest whose demand
    /// swings every period (its idle counters are its own to set) moves
    /// another VM's cores at most once per hold (issue 50, S5).
    pub hold_periods: u64,
    /// Whether the daemon puts each VM in a cgroup of its own and sets its
    /// CPU weight and CPU set there ([`crate::cgroup`]; default true).
    pub cgroups: bool,
    /// Serve only the VMs with a `[[vm]]` entry (an allowlist): a socket
    /// of another name is refused and gets no cores (default false: an
    /// unlisted VM gets the defaults, and at most the pool ÷ the VMs while
    /// it does not answer).
    pub only_listed: bool,
}

impl HostConfig {
    /// The budget of VM `name`: its entry, or the defaults.
    pub fn budget(&self, name: &str) -> VmBudget {
        self.vms.get(name).cloned().unwrap_or(VmBudget {
            lend_when_idle: self.lend_when_idle,
            ..VmBudget::default()
        })
    }

    /// Parses `text` (from `path`) against the host's CPUs (`topology`).
    /// Errors: [`HostConfigError`].
    pub fn parse(
        text: &str,
        path: &str,
        topology: &host_sched::topology::Topology,
    ) -> Result<Self, HostConfigError> {
        let file: File = toml::from_str(text).map_err(|e| HostConfigError::Toml {
            path: path.into(),
            message: e.to_string().trim_end().into(),
        })?;
        let value = |key: &str, value: String, reason: String| HostConfigError::Value {
            path: path.into(),
            key: key.into(),
            value,
            reason,
        };
        // `[host] cores` and `housekeeping` are a `--stages` file's `[host]`:
        // host-sched resolves them as for one VM (CPUs online and allowed,
        // housekeeping apart from the stage cores, the same defaults and
        // the same messages), so every VM accepts what the daemon gives.
        let host = host_sched::config::HostSection {
            cores: file.host.cores.clone(),
            housekeeping: file.host.housekeeping.clone(),
            cpu_weight: None,
        };
        let resolved = host_sched::config::resolve(
            &host_sched::config::Config {
                host,
                ..Default::default()
            },
            &host_sched::config::Overrides::default(),
            topology,
        )
        .map_err(|source| HostConfigError::Cpus {
            path: path.into(),
            source: Box::new(source),
        })?;
        let cores = resolved.stage_cores;
        let housekeeping = file
            .host
            .housekeeping
            .is_some()
            .then_some(resolved.housekeeping);
        let period_ms = file.host.period_ms.unwrap_or(1000);
        if !(10..=60_000).contains(&period_ms) {
            return Err(value(
                "[host] period_ms",
                period_ms.to_string(),
                "not within 10..=60000".into(),
            ));
        }
        let hysteresis = file.host.hysteresis.unwrap_or(0.25);
        if !(0.0..=16.0).contains(&hysteresis) {
            return Err(value(
                "[host] hysteresis",
                hysteresis.to_string(),
                "not within 0..=16 cores".into(),
            ));
        }
        let timeout_ms = file.host.timeout_ms.unwrap_or(500);
        if timeout_ms == 0 || timeout_ms > period_ms {
            return Err(value(
                "[host] timeout_ms",
                timeout_ms.to_string(),
                format!("not within 1..=period_ms ({period_ms})"),
            ));
        }
        let lend_when_idle = file.host.lend_when_idle.unwrap_or(false);
        let hold_periods = file.host.hold_periods.unwrap_or(3);
        if hold_periods > 100 {
            return Err(value(
                "[host] hold_periods",
                hold_periods.to_string(),
                "not within 0..=100".into(),
            ));
        }
        let vmm = file.host.vmm.clone().unwrap_or_default();
        if let Some(bad) = vmm.iter().find(|p| !p.is_absolute()) {
            return Err(value(
                "[host] vmm",
                format!("'{}'", bad.display()),
                "not an absolute path".into(),
            ));
        }
        let mut vms = std::collections::BTreeMap::new();
        for vm in &file.vms {
            let key = |k: &str| format!("[[vm]] '{}' {k}", vm.name);
            if vm.name.is_empty() || vm.name.contains('/') || vm.name.starts_with('.') {
                return Err(value(
                    "[[vm]] name",
                    format!("'{}'", vm.name),
                    "not a socket file's stem".into(),
                ));
            }
            // Within the stage cores: the allocator's check, below.
            let fixed = match &vm.cores {
                Some(text) => Some(
                    CpuSet::parse(text)
                        .ok()
                        .filter(|c| !c.is_empty())
                        .ok_or_else(|| {
                            value(
                                &key("cores"),
                                format!("'{text}'"),
                                "not a CPU list (e.g. 0-3,6)".into(),
                            )
                        })?,
                ),
                None => None,
            };
            let budget = VmBudget {
                weight: vm.weight.unwrap_or(1.0),
                min_cores: vm.min_cores.unwrap_or(0),
                max_cores: vm.max_cores.unwrap_or(usize::MAX),
                cores: fixed,
                lend_when_idle: vm.lend_when_idle.unwrap_or(lend_when_idle),
            };
            if vms.insert(vm.name.clone(), budget).is_some() {
                return Err(value(
                    "[[vm]] name",
                    format!("'{}'", vm.name),
                    "defined twice".into(),
                ));
            }
        }
        let config = Self {
            cores,
            housekeeping,
            period: std::time::Duration::from_millis(period_ms),
            hysteresis,
            timeout: std::time::Duration::from_millis(timeout_ms),
            lend_when_idle,
            vms,
            vmm,
            hold_periods,
            cgroups: file.host.cgroups.unwrap_or(true),
            only_listed: file.host.only_listed.unwrap_or(false),
        };
        // The entries against the cores, as the allocator will see them.
        let entries: Vec<_> = config
            .vms
            .iter()
            .map(|(name, b)| config.demand_of(name, b, 0.0, CpuSet::new()))
            .collect();
        host_sched::host::check(&config.cores, &entries).map_err(|source| {
            HostConfigError::Budgets {
                path: path.into(),
                source,
            }
        })?;
        Ok(config)
    }

    /// Reads and parses `path`. Errors: not a regular file, larger than
    /// [`MAX_BYTES`], unreadable, or [`HostConfig::parse`]'s.
    pub fn load(
        path: &Path,
        topology: &host_sched::topology::Topology,
    ) -> Result<Self, HostConfigError> {
        let name = path.display().to_string();
        let read = |reason: String| HostConfigError::Read {
            path: name.clone(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        if !meta.is_file() || meta.len() > MAX_BYTES {
            return Err(read(format!(
                "not a regular file of at most {MAX_BYTES} bytes"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        Self::parse(&text, &name, topology)
    }

    /// VM `name` as the allocator sees it, with `budget`, `demand` (cores)
    /// and its `current` set.
    pub fn demand_of(
        &self,
        name: &str,
        budget: &VmBudget,
        demand: f64,
        current: CpuSet,
    ) -> host_sched::host::VmDemand {
        host_sched::host::VmDemand {
            name: name.into(),
            weight: budget.weight,
            min_cores: budget.min_cores,
            max_cores: budget.max_cores,
            fixed: budget.cores.clone(),
            demand,
            current,
            owned: None,
            lend_when_idle: budget.lend_when_idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HostConfig, HostConfigError> {
        let cpus = CpuSet::parse("0-3").unwrap();
        let topology = host_sched::topology::Topology {
            allowed: cpus.clone(),
            online: cpus,
            isolated: CpuSet::new(),
        };
        HostConfig::parse(text, "host.toml", &topology)
    }

    #[test]
    fn defaults_and_entries() {
        let c = parse("[[vm]]\nname = \"db\"\nweight = 2\nmin_cores = 1\n").unwrap();
        assert_eq!(c.cores.to_string(), "0-3");
        assert_eq!(c.period, std::time::Duration::from_secs(1));
        assert_eq!(c.budget("db").weight, 2.0);
        assert_eq!(c.budget("db").min_cores, 1);
        assert_eq!(c.budget("other"), VmBudget::default());
        // lend_when_idle: the host's default, unless the entry says.
        let c = parse(
            "[host]\nlend_when_idle = true\n[[vm]]\nname = \"db\"\nlend_when_idle = false\n[[vm]]\nname = \"web\"\n",
        )
        .unwrap();
        assert!(!c.budget("db").lend_when_idle);
        assert!(c.budget("web").lend_when_idle);
        assert!(c.budget("other").lend_when_idle);
        assert!(
            c.demand_of("web", &c.budget("web"), 0.0, CpuSet::new())
                .lend_when_idle
        );
    }

    #[test]
    fn bad_files_name_the_key_and_value() {
        let cases = [
            (
                "[host]\ncores = \"9\"\n",
                "host.cores = '9': CPU 9 is not online (online: 0-3)",
            ),
            (
                "[host]\ncores = \"x\"\n",
                "host.cores = 'x': not a CPU list",
            ),
            (
                "[host]\ncores = \"0-1\"\nhousekeeping = \"1-2\"\n",
                "host.housekeeping = '1-2': overlaps the stage cores host.cores = '0-1' (CPU 1)",
            ),
            (
                "[host]\nperiod_ms = 1\n",
                "[host] period_ms = 1: not within 10..=60000",
            ),
            (
                "[host]\ntimeout_ms = 2000\n",
                "[host] timeout_ms = 2000: not within 1..=period_ms (1000)",
            ),
            (
                "[[vm]]\nname = \"a\"\n[[vm]]\nname = \"a\"\n",
                "[[vm]] name = 'a': defined twice",
            ),
            (
                "[[vm]]\nname = \"../a\"\n",
                "[[vm]] name = '../a': not a socket file's stem",
            ),
            (
                "[[vm]]\nname = \"a\"\nweight = 0\n",
                "VM 'a': weight = 0 is not a positive number",
            ),
            (
                "[[vm]]\nname = \"a\"\nmin_cores = 3\n[[vm]]\nname = \"b\"\nmin_cores = 2\n",
                "min_cores add up to 5 but the host has 4",
            ),
            (
                "[[vm]]\nname = \"a\"\ncores = \"1\"\n[[vm]]\nname = \"b\"\ncores = \"1-2\"\n",
                "VM 'b': cores = '1-2' meets another VM's fixed cores",
            ),
        ];
        for (text, needle) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.starts_with("host.toml: "), "{e}");
        }
        // A TOML error shows the line and a caret; an unknown key is one.
        let e = parse("[host]\ncores = \"0\"\nspeed = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3") && e.contains('^') && e.contains("unknown field `speed`"),
            "{e}"
        );
    }
}
