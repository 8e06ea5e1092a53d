//! The programs stagevm-discover drives: Valgrind with the stgtrace tool
//! (`discover/stgtrace/st_main.c`, built by
//! `discover/stgtrace/build_tool.sh` or installed by the `stagevm` package) and
//! the `stagesim` simulator (the discovery and the replays).

use std::path::{Path, PathBuf};

/// The stgtrace tool's file name (Valgrind loads `<tool>-<arch>-<os>`).
pub const TOOL_FILE: &str = "stgtrace-amd64-linux";

/// Where Debian's `valgrind` package keeps its tools and support files.
pub const VALGRIND_LIBEXEC: &str = "/usr/libexec/valgrind";

/// A program that could not be found.
#[derive(Debug, thiserror::Error)]
#[error("{what} not found (looked at {}); {hint}", looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
pub struct NotFound {
    /// What was looked for.
    pub what: &'static str,
    /// The places looked at, in order.
    pub looked: Vec<PathBuf>,
    /// How to get it.
    pub hint: &'static str,
}

/// Errors preparing Valgrind's tool folder.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A program is missing.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// Valgrind's support files are missing.
    #[error("{VALGRIND_LIBEXEC}: {source} (install Debian's valgrind package)")]
    NoValgrind {
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The temporary tool folder could not be made.
    #[error("the Valgrind tool folder {}: {source}", path.display())]
    Folder {
        /// The folder.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The folder of this executable (`/usr/bin`, `target/release`).
fn exe_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// The first existing file of: `$env`, then `rel` below this executable's
/// folder, each in order.
fn find(
    what: &'static str,
    env: &str,
    rel: &[&str],
    hint: &'static str,
) -> Result<PathBuf, NotFound> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p);
    }
    if let Some(dir) = exe_dir() {
        for r in rel {
            let p = dir.join(r);
            if p.is_file() {
                return Ok(p);
            }
            looked.push(p);
        }
    }
    Err(NotFound { what, looked, hint })
}

/// The stgtrace tool: `$STAGEVM_STGTRACE`, the package's
/// `/usr/lib/stagevm/valgrind/`, or a source tree's `target/capture-build/`.
pub fn stgtrace() -> Result<PathBuf, NotFound> {
    find(
        "the stgtrace Valgrind tool",
        "STAGEVM_STGTRACE",
        &[
            "../lib/stagevm/valgrind/stgtrace-amd64-linux",
            "../capture-build/stgtrace-amd64-linux",
        ],
        "install the stagevm package, or build it with discover/stgtrace/build_tool.sh",
    )
}

/// The simulator: `$STAGEVM_STAGESIM`, the package's `/usr/lib/stagevm/`,
/// or `stagesim` beside this executable (a source tree's `target/<profile>/`).
pub fn stagesim() -> Result<PathBuf, NotFound> {
    find(
        "the stagesim simulator",
        "STAGEVM_STAGESIM",
        &["../lib/stagevm/stagesim", "stagesim"],
        "install the stagevm package, or build it with cargo build --release -p stagesim",
    )
}

/// A `VALGRIND_LIB` folder: Valgrind's own support files (symbolic links
/// into [`VALGRIND_LIBEXEC`]) beside the stgtrace tool; removed on drop.
#[derive(Debug)]
pub struct ValgrindLib {
    dir: tempfile::TempDir,
}

impl ValgrindLib {
    /// Makes the folder for `tool`.
    ///
    /// Errors: [`ToolError::NoValgrind`] when Valgrind is not installed,
    /// [`ToolError::Folder`] when a link cannot be made.
    pub fn new(tool: &Path) -> Result<Self, ToolError> {
        let dir = tempfile::Builder::new()
            .prefix("stagevm-discover-vglib.")
            .tempdir()
            .map_err(|source| ToolError::Folder {
                path: std::env::temp_dir(),
                source,
            })?;
        let folder = |source| ToolError::Folder {
            path: dir.path().to_path_buf(),
            source,
        };
        let entries = std::fs::read_dir(VALGRIND_LIBEXEC)
            .map_err(|source| ToolError::NoValgrind { source })?;
        for e in entries {
            let e = e.map_err(|source| ToolError::NoValgrind { source })?;
            if e.file_name() != TOOL_FILE {
                std::os::unix::fs::symlink(e.path(), dir.path().join(e.file_name()))
                    .map_err(folder)?;
            }
        }
        std::os::unix::fs::symlink(tool, dir.path().join(TOOL_FILE)).map_err(folder)?;
        Ok(Self { dir })
    }

    /// The folder, for `VALGRIND_LIB`.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}
