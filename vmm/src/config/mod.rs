//! VM configuration: the parsed values of `stagevm`'s command-line options.
//!
//! Option values follow Cloud Hypervisor's `key=value[,key=value]` style
//! (`--cpus boot=4`, `--memory size=512M`, `--serial file=/tmp/log`). Every
//! parse error names the option and the bad value.

use std::path::PathBuf;
use std::str::FromStr;

mod devices;
pub use devices::{DiskConfig, NetConfig, DISK_ID_MAX};

/// Errors from parsing an option value. Each names the offending text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VmConfigError {
    /// A `key=value` list contained a key the option does not know.
    #[error("unknown key '{key}' in '{value}' (expected: {expected})")]
    UnknownKey {
        /// The unknown key.
        key: String,
        /// The whole option value.
        value: String,
        /// The keys the option accepts.
        expected: &'static str,
    },
    /// A required key is missing.
    #[error("missing '{key}=' in '{value}'")]
    MissingKey {
        /// The missing key.
        key: &'static str,
        /// The whole option value.
        value: String,
    },
    /// A value could not be parsed.
    #[error("invalid {what} '{value}': {reason}")]
    Invalid {
        /// What was being parsed (e.g. "vCPU count").
        what: &'static str,
        /// The bad text.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
}

fn key_values<'a>(
    value: &'a str,
    expected: &'static str,
) -> Result<Vec<(&'a str, &'a str)>, VmConfigError> {
    value
        .split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.split_once('=').ok_or_else(|| VmConfigError::Invalid {
                what: "option",
                value: value.to_string(),
                reason: format!("'{part}' is not key=value (expected: {expected})"),
            })
        })
        .collect()
}

/// `--cpus boot=N`: the number of vCPUs started at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpusConfig {
    /// Number of vCPUs (≥ 1; the upper bound is KVM's `KVM_CAP_MAX_VCPUS`,
    /// checked when the VM is created).
    pub boot: u32,
}

impl Default for CpusConfig {
    fn default() -> Self {
        Self { boot: 1 }
    }
}

impl FromStr for CpusConfig {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        let mut boot = None;
        for (key, v) in key_values(value, "boot=N")? {
            match key {
                "boot" => {
                    let n: u32 = v.parse().map_err(|e| VmConfigError::Invalid {
                        what: "vCPU count",
                        value: v.to_string(),
                        reason: format!("{e}"),
                    })?;
                    if n == 0 {
                        return Err(VmConfigError::Invalid {
                            what: "vCPU count",
                            value: v.to_string(),
                            reason: "a VM needs at least 1 vCPU".into(),
                        });
                    }
                    boot = Some(n);
                }
                _ => {
                    return Err(VmConfigError::UnknownKey {
                        key: key.into(),
                        value: value.into(),
                        expected: "boot",
                    })
                }
            }
        }
        boot.map(|boot| Self { boot })
            .ok_or(VmConfigError::MissingKey {
                key: "boot",
                value: value.into(),
            })
    }
}

/// Parses a byte size with an optional binary suffix: `4096`, `512K`, `256M`,
/// `1G` (K = KiB, M = MiB, G = GiB). Returns bytes.
pub fn parse_size(text: &str) -> Result<u64, VmConfigError> {
    let invalid = |reason: &str| VmConfigError::Invalid {
        what: "memory size",
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 10),
        Some((i, 'M' | 'm')) => (&text[..i], 20),
        Some((i, 'G' | 'g')) => (&text[..i], 30),
        Some(_) => (text, 0),
        None => return Err(invalid("empty")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| invalid("expected a number with an optional K, M or G suffix"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| invalid("too large"))
}

/// Formats a byte count the way [`parse_size`] reads it, with the largest
/// exact binary suffix (`268435456` → `256M`).
pub fn format_size(bytes: u64) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `--memory size=SIZE[,hugepages=on]`: guest RAM. Below 3 GiB it is one
/// range from GPA 0; more continues from 4 GiB, above the 32-bit MMIO hole
/// ([`stagevm_arch::layout::ram_ranges`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Guest RAM in bytes, a multiple of 4 KiB (2 MiB with huge pages), at
    /// most [`MAX_MEMORY`].
    pub size: u64,
    /// Back it with the host's huge pages (`MAP_HUGETLB`, 2 MiB).
    pub hugepages: bool,
}

/// Largest guest RAM stagevm accepts: 256 GiB (the ring-3 unikernel's own
/// page tables reach less: [`stagevm_arch::layout::UNIKERNEL_MAX_MEMORY`]).
pub const MAX_MEMORY: u64 = 256 << 30;

/// Bytes of one host huge page (`MAP_HUGETLB`'s default size on x86-64).
pub const HUGE_PAGE: u64 = 2 << 20;

impl Default for MemoryConfig {
    /// The default guest: 256 MiB of normal pages.
    fn default() -> Self {
        Self {
            size: 256 << 20,
            hugepages: false,
        }
    }
}

impl FromStr for MemoryConfig {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        let mut size = None;
        let mut hugepages = false;
        let mut size_text = "";
        for (key, v) in key_values(value, "size=SIZE[,hugepages=on]")? {
            match key {
                "size" => {
                    size = Some(parse_size(v)?);
                    size_text = v;
                }
                "hugepages" => hugepages = on_off("hugepages", v)?,
                _ => {
                    return Err(VmConfigError::UnknownKey {
                        key: key.into(),
                        value: value.into(),
                        expected: "size, hugepages",
                    })
                }
            }
        }
        let bytes = size.ok_or(VmConfigError::MissingKey {
            key: "size",
            value: value.into(),
        })?;
        let bad = |reason: String| VmConfigError::Invalid {
            what: "memory size",
            value: size_text.to_string(),
            reason,
        };
        if bytes == 0 || !bytes.is_multiple_of(4096) {
            return Err(bad("must be a non-zero multiple of 4 KiB".into()));
        }
        if hugepages && !bytes.is_multiple_of(HUGE_PAGE) {
            return Err(bad("must be a multiple of 2M with hugepages=on".into()));
        }
        if bytes > MAX_MEMORY {
            return Err(bad(format!(
                "more than the supported maximum of {}",
                format_size(MAX_MEMORY)
            )));
        }
        Ok(Self {
            size: bytes,
            hugepages,
        })
    }
}

/// `--serial tty|null|file=PATH`: where the guest's COM1 output goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SerialConfig {
    /// The VMM's standard output.
    #[default]
    Tty,
    /// Discarded.
    Null,
    /// Appended to a file (created if missing).
    File(PathBuf),
    /// A new pseudo-terminal, both ways (its path printed at start).
    Pty,
    /// A Unix socket at the path, both ways, one client at a time.
    Socket(PathBuf),
}

impl FromStr for SerialConfig {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        match value {
            "tty" => Ok(Self::Tty),
            "null" | "off" => Ok(Self::Null),
            "pty" => Ok(Self::Pty),
            _ => match (value.strip_prefix("file="), value.strip_prefix("socket=")) {
                (Some(path), _) if !path.is_empty() => Ok(Self::File(path.into())),
                (_, Some(path)) if !path.is_empty() => Ok(Self::Socket(path.into())),
                _ => Err(VmConfigError::Invalid {
                    what: "serial",
                    value: value.into(),
                    reason: "expected tty, pty, null, file=PATH or socket=PATH".into(),
                }),
            },
        }
    }
}

/// `on`/`true` or `off`/`false`, for the option key `what`.
pub(crate) fn on_off(what: &'static str, v: &str) -> Result<bool, VmConfigError> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(VmConfigError::Invalid {
            what,
            value: v.into(),
            reason: "expected on or off".into(),
        }),
    }
}

/// `--boot-mode auto|unikernel|pvh|bzimage`: which boot protocol starts the
/// guest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BootMode {
    /// Decide from the image: an ELF without a PVH entry note is a ring-3
    /// unikernel, an ELF with one is a Linux `vmlinux` (PVH), a file with the
    /// `HdrS` magic is a bzImage.
    #[default]
    Auto,
    /// stagevm's direct ring-3 boot ([`hypercall_abi::boot`]), for ELF images;
    /// a PVH note, if any, is ignored.
    Unikernel,
    /// PVH: 32-bit protected mode, paging off, at the ELF's
    /// `XEN_ELFNOTE_PHYS32_ENTRY`, `EBX` = `hvm_start_info` GPA.
    Pvh,
    /// Linux 64-bit boot protocol of a bzImage, `RSI` = `boot_params` GPA.
    BzImage,
}

impl BootMode {
    /// The name `--boot-mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            BootMode::Auto => "auto",
            BootMode::Unikernel => "unikernel",
            BootMode::Pvh => "pvh",
            BootMode::BzImage => "bzimage",
        }
    }
}

impl FromStr for BootMode {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        match value {
            "auto" => Ok(Self::Auto),
            "unikernel" => Ok(Self::Unikernel),
            "pvh" => Ok(Self::Pvh),
            "bzimage" => Ok(Self::BzImage),
            _ => Err(VmConfigError::Invalid {
                what: "boot mode",
                value: value.into(),
                reason: "expected auto, unikernel, pvh or bzimage".into(),
            }),
        }
    }
}

/// `--stage-trace off|on|every=N`: the event trace asked of a guest that
/// reports through per-vCPU counters (ABI minor 2): `on` = every event also
/// goes to its vCPU's ring, `every=N` = every Nth event of each kind per
/// vCPU, `off` = none (the rings stay empty and the VMM does no work per
/// event). A guest that reports through its rings is drained either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// 0 = off, N ≥ 1 = every Nth event.
    pub every: u64,
}

pub use stagevm_report::api::TRACE_EVERY_MAX;

impl FromStr for TraceConfig {
    type Err = VmConfigError;
    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        let every = match value {
            "off" => 0,
            "on" => 1,
            _ => {
                let (key, n) = value
                    .split_once('=')
                    .ok_or_else(|| VmConfigError::Invalid {
                        what: "stage trace",
                        value: value.into(),
                        reason: "expected off, on or every=N".into(),
                    })?;
                if key != "every" {
                    return Err(VmConfigError::UnknownKey {
                        key: key.into(),
                        value: value.into(),
                        expected: "every",
                    });
                }
                match n.parse::<u64>() {
                    Ok(n) if (1..=TRACE_EVERY_MAX).contains(&n) => n,
                    _ => {
                        return Err(VmConfigError::Invalid {
                            what: "stage trace",
                            value: value.into(),
                            reason: format!("every= takes 1 to {TRACE_EVERY_MAX}"),
                        })
                    }
                }
            }
        };
        Ok(Self { every })
    }
}

/// Everything needed to build and run one VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Path of the guest ELF64 kernel.
    pub kernel: PathBuf,
    /// Kernel command line, at most `CMDLINE_MAX - 1` bytes.
    pub cmdline: String,
    /// vCPUs.
    pub cpus: CpusConfig,
    /// Guest RAM.
    pub memory: MemoryConfig,
    /// Serial console output.
    pub serial: SerialConfig,
    /// Whether the VM has a stage device (`--no-stage-device` turns it off).
    pub stage_device: bool,
    /// How often the scheduler thread drains the stage rings (while they
    /// need draining: a rings guest, or a trace).
    pub drain_period: std::time::Duration,
    /// The event trace asked of a counters guest (`--stage-trace`).
    pub stage_trace: TraceConfig,
    /// Stage scheduling: cores, budgets, policy (`--stages`, `--policy`),
    /// as given and as resolved against the host.
    pub sched: host_sched::vm::Setup,
    /// virtio-blk disks, in order (`blk0`, `blk1`, …).
    pub disks: Vec<DiskConfig>,
    /// virtio-net devices, in order (`net0`, `net1`, …), placed after the
    /// disks.
    pub nets: Vec<NetConfig>,
    /// Boot protocol (`--boot-mode`).
    pub boot_mode: BootMode,
    /// Initial RAM disk for Linux boots (`--initramfs`), loaded at the top of
    /// guest RAM.
    pub initramfs: Option<PathBuf>,
    /// `--seccomp`: the per-thread seccomp filters' action.
    pub seccomp: crate::seccomp::SeccompMode,
}

/// Checks that `path` is a regular file of at most `max` bytes before the
/// VMM reads it whole (a FIFO, `/dev/zero` or a huge file would block or
/// exhaust memory); returns its size. The error says why, for the caller to
/// prefix with the option and path.
pub fn check_input_file(path: &std::path::Path, max: u64) -> Result<u64, InputFileError> {
    let meta = std::fs::metadata(path).map_err(|source| InputFileError::Open {
        described: stagevm_api::paths::describe_path_error(path, &source),
        source,
    })?;
    if !meta.is_file() {
        return Err(InputFileError::NotAFile);
    }
    if meta.len() > max {
        return Err(InputFileError::TooLarge {
            len: meta.len(),
            max,
        });
    }
    Ok(meta.len())
}

/// Why [`check_input_file`] refused a file (the caller names the option
/// and path).
#[derive(Debug, thiserror::Error)]
pub enum InputFileError {
    /// It cannot be examined; `described` says why in the user's terms.
    #[error("{described}")]
    Open {
        /// [`stagevm_api::paths::describe_path_error`]'s text.
        described: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A FIFO, a device, a directory.
    #[error("not a regular file")]
    NotAFile,
    /// Larger than the option accepts (bytes).
    #[error("{len} bytes is larger than the {max} bytes this option accepts")]
    TooLarge {
        /// The file's size.
        len: u64,
        /// The option's limit.
        max: u64,
    },
}

#[cfg(test)]
mod tests;
