//! host-sched's errors: every one a line naming the key and the value.

/// A configuration or scheduling error: one line naming the key and the
/// value (a TOML syntax error: toml's message with the line and a caret).
/// The VMM wraps it with `#[source]`.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StagesConfigError {
    /// The file cannot be read.
    #[error("--stages {path}: {reason}")]
    Read {
        /// The `--stages` path.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is not valid TOML or has an unknown key or a wrong type.
    #[error("{origin}: {message}")]
    Toml {
        /// Where the text came from (a path).
        origin: String,
        /// toml's own message: line and column, the line with a caret, and
        /// what was expected (several lines).
        message: String,
    },
    /// A value is not a CPU list.
    #[error("{key} = '{value}': not a CPU list (expected e.g. 0-3,6)")]
    NotCpuList {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
    },
    /// A CPU list names no CPU.
    #[error("{key} = '{value}': no CPU given")]
    NoCpu {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
    },
    /// A CPU list names a CPU that is not online.
    #[error("{key} = '{value}': CPU {cpu} is not online (online: {online})")]
    CpuNotOnline {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
        /// The first CPU that is not online.
        cpu: usize,
        /// The online CPUs (cpulist).
        online: String,
    },
    /// A stage core is outside this process's affinity.
    #[error("{key} = '{value}': CPU {cpu} is not allowed for this process (allowed: {allowed})")]
    CpuNotAllowed {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
        /// The first CPU that is not allowed.
        cpu: usize,
        /// The allowed CPUs (cpulist).
        allowed: String,
    },
    /// Housekeeping cores overlap the stage cores.
    #[error("{key} = '{value}': overlaps the stage cores {cores_key} = '{cores}' (CPU {overlap})")]
    HousekeepingOverlap {
        /// The housekeeping key or option.
        key: String,
        /// Its value.
        value: String,
        /// The stage-cores key or option.
        cores_key: String,
        /// The stage cores (cpulist).
        cores: String,
        /// The CPUs in both (cpulist).
        overlap: String,
    },
    /// No such policy.
    #[error("{key} = '{value}': unknown policy (off, pinned, static, proportional, auto)")]
    UnknownPolicy {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
    },
    /// No such `auto` mode in `policy.auto_modes`.
    #[error("policy.auto_modes: '{value}' is not a mode auto trials (temporal, spatial, both; unstaged always is)")]
    UnknownAutoMode {
        /// The value.
        value: String,
    },
    /// No such stage-visit policy.
    #[error("{key} = '{value}': unknown visit policy (fifo, cohort, srpt, dbr, mg1, color)")]
    UnknownVisit {
        /// The key or option.
        key: String,
        /// Its value.
        value: String,
    },
    /// A key that this change does not set: another change does.
    #[error("{key}: not part of {change}; {instead}")]
    WrongChange {
        /// The key.
        key: &'static str,
        /// The change it came in.
        change: &'static str,
        /// What sets it.
        instead: &'static str,
    },
    /// A value outside its range.
    #[error("{key} = {value}: must be {expected}")]
    OutOfRange {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// The valid range, in words.
        expected: &'static str,
    },
    /// A stage name that is empty, too long, or given twice.
    #[error("stage[{index}].name = '{name}': {reason}")]
    BadStageName {
        /// Index of the `[[stage]]` entry.
        index: usize,
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A stage's `min_cores` is above its `max_cores`.
    #[error("stage '{name}': min_cores = {min} > max_cores = {max}")]
    MinAboveMax {
        /// Stage name.
        name: String,
        /// `min_cores`.
        min: usize,
        /// `max_cores`.
        max: usize,
    },
    /// A stage's weight is negative, NaN or infinite.
    #[error("stage '{name}': weight = {}: must be in 0..={}", short(*.weight), crate::config::MAX_WEIGHT)]
    BadWeight {
        /// Stage name.
        name: String,
        /// The weight.
        weight: f64,
    },
    /// The stages' `min_cores` need more cores than there are.
    #[error(
        "stage budgets cannot fit: min_cores sum to {sum} but {key} = '{cores}' has {n} core(s)"
    )]
    MinCoresTooMany {
        /// Sum of `min_cores` (saturating).
        sum: usize,
        /// The stage-cores key or option.
        key: String,
        /// The stage cores (cpulist).
        cores: String,
        /// How many.
        n: usize,
    },
    /// A configured stage the guest did not declare at REGISTER.
    #[error("stage '{name}': unknown stage; the guest declared {}", declared.iter().map(|d| d.escape_debug().to_string()).collect::<Vec<_>>().join(", "))]
    UnknownStage {
        /// The configured name.
        name: String,
        /// The names the guest declared.
        declared: Vec<String>,
    },
    /// The stages' `max_cores` cannot use every stage core.
    #[error("stage budgets cannot fit: max_cores sum to {sum} but there are {n} stage cores ('{cores}') to use")]
    MaxCoresTooFew {
        /// Sum of `max_cores` (saturating).
        sum: usize,
        /// Stage cores.
        n: usize,
        /// The stage cores (cpulist).
        cores: String,
    },
}

/// A number as the operator wrote it when it is short, else in scientific
/// notation (2e296 rather than 297 digits).
fn short(x: f64) -> String {
    if x.is_finite() && x.abs() < 1e15 {
        x.to_string()
    } else {
        format!("{x:e}")
    }
}
