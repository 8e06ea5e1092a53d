//! The layering check of `just lint` (issue 51): imports run one way.
//!
//! Three rules, each a table below and in docs/architecture.md
//! ("Layering"):
//!
//! 1. **Folders.** A crate in one top-level folder may depend (a `path`
//!    dependency in its `Cargo.toml`) only on crates of the folders
//!    [`ALLOWED`] lists for it; a dev-dependency also on the test support
//!    (`tests/`, `images/`) and on [`DEV_ALLOWED`]'s extra edges. The
//!    workspace's members and the test guest are read.
//! 2. **Modules of the VMM.** A module of `vmm/src/` imports (`crate::x`)
//!    no module of a higher rank in [`VMM_RANKS`] (devices and arch never
//!    reach the builder, the API or the event loop).
//! 3. **host-sched decides.** Its sources make none of the calls in
//!    [`HOST_SCHED_FORBIDDEN`] (a thread's affinity or nice level, a file
//!    written): those effects are stage-device's (`os.rs`) and the
//!    daemon's.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

/// What a VMM may depend on: `vmm/` and the example VMMs of `examples/`
/// stand at the same level.
const VMM_DEPENDS_ON: &[&str] = &[
    "hypercall-abi",
    "host-sched",
    "report",
    "stage-device",
    "api",
    "arch",
];

/// Per top-level folder, the folders its crates may depend on (besides
/// their own).
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("hypercall-abi", &[]),
    ("report", &[]),
    ("host-sched", &["hypercall-abi"]),
    ("guest-agent", &["hypercall-abi", "host-sched"]),
    ("images", &["hypercall-abi", "guest-agent"]),
    ("stage-device", &["hypercall-abi", "host-sched", "report"]),
    ("arch", &["hypercall-abi", "stage-device"]),
    (
        "api",
        &["hypercall-abi", "host-sched", "report", "stage-device"],
    ),
    ("stagesim", &["hypercall-abi", "host-sched", "guest-agent"]),
    ("vmm", VMM_DEPENDS_ON),
    ("examples", VMM_DEPENDS_ON),
    ("hostd", &["host-sched", "report", "stage-device", "api"]),
    ("discover", &["host-sched", "guest-agent", "stagesim"]),
    ("tests", &["host-sched", "report", "api", "images"]),
    // The VMM's own fuzz targets: its devices and kernel loader.
    (
        "fuzz",
        &["hypercall-abi", "host-sched", "stage-device", "arch", "vmm"],
    ),
    (
        "bench",
        &[
            "hypercall-abi",
            "host-sched",
            "report",
            "guest-agent",
            "images",
            "stage-device",
            "api",
            "stagesim",
            "tests",
        ],
    ),
];

/// Dev-dependencies beyond [`ALLOWED`] and the test support: tests that
/// run the guest agent against the real stage device.
pub const DEV_ALLOWED: &[(&str, &[&str])] = &[
    ("guest-agent", &["stage-device"]),
    ("stage-device", &["guest-agent"]),
    ("vmm", &["guest-agent"]),
];

/// The folders every dev-dependency may reach: the test kit and the guests.
pub const TEST_SUPPORT: &[&str] = &["tests", "images"];

/// The modules of `vmm/src/` by rank: a module imports none of a higher
/// rank (the same rank may: the builder builds a `Vmm`).
pub const VMM_RANKS: &[(&str, u8)] = &[
    ("arch", 0),
    ("exit", 0),
    ("sandbox", 0),
    ("seccomp", 1),
    ("config", 2),
    ("devices", 3),
    ("error", 4),
    ("vstate", 5),
    ("sched_loop", 5),
    ("api", 6),
    ("builder", 7),
    ("vmm", 7),
];

/// Calls host-sched's sources must not make (effects are stage-device's
/// and the daemon's).
pub const HOST_SCHED_FORBIDDEN: &[&str] = &[
    "sched_setaffinity",
    "setpriority",
    "fs::write",
    "File::create",
    "OpenOptions",
    "set_permissions",
    "remove_file",
];

/// One import against the documented direction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The file (relative to the root) that has it.
    pub file: String,
    /// What it imports or calls, and the rule.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.what)
    }
}

/// Why the tree could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayeringError {
    /// A file could not be read.
    #[error("{0}: {1}")]
    Read(String, std::io::Error),
    /// A `Cargo.toml` is not TOML.
    #[error("{0}: {1}")]
    Toml(String, toml::de::Error),
}

fn read(root: &Path, rel: &Path) -> Result<String, LayeringError> {
    std::fs::read_to_string(root.join(rel))
        .map_err(|e| LayeringError::Read(rel.display().to_string(), e))
}

/// The top-level folder of `rel` (a path relative to the root).
fn folder(rel: &Path) -> String {
    rel.components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn lookup<'a>(table: &[(&str, &'a [&'a str])], key: &str) -> &'a [&'a str] {
    table
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(&[], |(_, v)| v)
}

/// Checks everything under `root` (a checkout); returns the violations,
/// sorted. Errors: a file that cannot be read or parsed.
pub fn check(root: &Path) -> Result<Vec<Violation>, LayeringError> {
    let mut out = crate_edges(root)?;
    out.extend(vmm_modules(root)?);
    out.extend(host_sched_calls(root)?);
    out.sort();
    Ok(out)
}

/// Rule 1: the path dependencies of the workspace's members and the test
/// guest.
fn crate_edges(root: &Path) -> Result<Vec<Violation>, LayeringError> {
    let ws: toml::Table = toml::from_str(&read(root, Path::new("Cargo.toml"))?)
        .map_err(|e| LayeringError::Toml("Cargo.toml".into(), e))?;
    let mut members: Vec<String> = ws
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if root.join("images/testguest/Cargo.toml").exists() {
        members.push("images/testguest".into());
    }
    let mut out = Vec::new();
    for member in members {
        let rel = PathBuf::from(&member).join("Cargo.toml");
        let manifest: toml::Table = toml::from_str(&read(root, &rel)?)
            .map_err(|e| LayeringError::Toml(rel.display().to_string(), e))?;
        let from = folder(Path::new(&member));
        for (section, dev) in [("dependencies", false), ("dev-dependencies", true)] {
            let Some(deps) = manifest.get(section).and_then(|d| d.as_table()) else {
                continue;
            };
            for (name, spec) in deps {
                let Some(path) = spec.get("path").and_then(|p| p.as_str()) else {
                    continue;
                };
                let target = normalise(&Path::new(&member).join(path));
                let to = folder(&target);
                let ok = to == from
                    || lookup(ALLOWED, &from).contains(&to.as_str())
                    || (dev
                        && (TEST_SUPPORT.contains(&to.as_str())
                            || lookup(DEV_ALLOWED, &from).contains(&to.as_str())));
                if !ok {
                    out.push(Violation {
                        file: rel.display().to_string(),
                        what: format!(
                            "{section} `{name}` is in {to}/, which {from}/ may not depend on"
                        ),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// `a/b/../c` → `a/c` (no file system access).
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every `.rs` file under `dir` (relative to `root`), sorted.
fn rust_files(root: &Path, dir: &Path) -> Result<Vec<PathBuf>, LayeringError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&d))
            .map_err(|e| LayeringError::Read(d.display().to_string(), e))?;
        for e in entries {
            let e = e.map_err(|e| LayeringError::Read(d.display().to_string(), e))?;
            let rel = d.join(e.file_name());
            if e.path().is_dir() {
                stack.push(rel);
            } else if rel.extension().is_some_and(|x| x == "rs") {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The code of `text` without its comment lines (`//`, `//!`, `///`).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// The top-level modules `code` names as `crate::m` or in `crate::{m, …}`.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The group's items at depth 0: `a::b`, `d::{e, f}` → a, d.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn rank(module: &str) -> Option<u8> {
    VMM_RANKS.iter().find(|(m, _)| *m == module).map(|r| r.1)
}

/// Calls `check` with every Rust file under `dir` (relative to `root`;
/// none when the folder is absent) and its text; collects what it finds.
fn scan(
    root: &Path,
    dir: &str,
    mut check: impl FnMut(&Path, &str, &mut Vec<Violation>),
) -> Result<Vec<Violation>, LayeringError> {
    let dir = Path::new(dir);
    let mut out = Vec::new();
    if root.join(dir).is_dir() {
        for rel in rust_files(root, dir)? {
            check(&rel, &read(root, &rel)?, &mut out);
        }
    }
    Ok(out)
}

/// Rule 2: the modules of `vmm/src/`.
fn vmm_modules(root: &Path) -> Result<Vec<Violation>, LayeringError> {
    scan(root, "vmm/src", |rel, text, out| {
        let inner = rel.strip_prefix("vmm/src").unwrap_or(rel);
        let first = folder(inner);
        let module = first.strip_suffix(".rs").unwrap_or(&first);
        let Some(own) = rank(module) else { return };
        let code: String = code_lines(text).collect::<Vec<_>>().join("\n");
        for used in crate_modules(&code) {
            if rank(&used).is_some_and(|r| r > own) {
                out.push(Violation {
                    file: rel.display().to_string(),
                    what: format!(
                        "`crate::{used}`: {module} may not import {used} (a higher layer)"
                    ),
                });
            }
        }
    })
}

/// Rule 3: host-sched's calls.
fn host_sched_calls(root: &Path) -> Result<Vec<Violation>, LayeringError> {
    scan(root, "host-sched/src", |rel, text, out| {
        for call in HOST_SCHED_FORBIDDEN {
            if code_lines(text).any(|l| l.contains(call)) {
                out.push(Violation {
                    file: rel.display().to_string(),
                    what: format!(
                        "`{call}`: host-sched decides and changes nothing (stage-device's os.rs acts)"
                    ),
                });
            }
        }
    })
}

#[cfg(test)]
mod tests;
