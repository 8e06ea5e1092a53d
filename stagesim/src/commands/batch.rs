//! `stagesim replay-batch FILE`: many `stagesim replay` command lines on
//! the traces they name, each trace (and each stage-map re-marking of one)
//! loaded once. Loading and decoding a MariaDB trace takes 9–20 s, as long
//! as the replays of a whole line: `just bench-sim`'s verdict runs 28 lines
//! per trace.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;

use stagesim::stream::Trace;

use crate::cli::args::ReplayArgs;

/// A trace re-marked by a stage-map file, and the grouping it needs.
type Remarked = (Arc<Trace>, String);

/// The traces a batch has loaded, by (trace, sidecar), and their
/// re-markings by stage-map files, by (trace, sidecar, map).
#[derive(Default)]
pub struct TraceCache {
    traces: HashMap<(PathBuf, Option<PathBuf>), Arc<Trace>>,
    remarked: HashMap<(PathBuf, Option<PathBuf>, PathBuf), Remarked>,
}

impl TraceCache {
    /// The trace of `(path, sidecar)`, loaded on first use.
    pub fn get(&mut self, path: &Path, sidecar: Option<&Path>) -> anyhow::Result<Arc<Trace>> {
        let key = (path.to_path_buf(), sidecar.map(Path::to_path_buf));
        if let Some(t) = self.traces.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(super::load(path, sidecar)?);
        self.traces.insert(key, t.clone());
        Ok(t)
    }

    /// The re-marking of `(path, sidecar)` by the stage-map file `map` and
    /// its grouping, made by `make` on first use.
    pub fn remarked(
        &mut self,
        path: &Path,
        sidecar: Option<&Path>,
        map: &Path,
        make: impl FnOnce() -> anyhow::Result<(Trace, String)>,
    ) -> anyhow::Result<Remarked> {
        let key = (
            path.to_path_buf(),
            sidecar.map(Path::to_path_buf),
            map.to_path_buf(),
        );
        if let Some(t) = self.remarked.get(&key) {
            return Ok(t.clone());
        }
        let (t, spec) = make()?;
        let entry = (Arc::new(t), spec);
        self.remarked.insert(key, entry.clone());
        Ok(entry)
    }
}

/// One line of a batch: `stagesim replay`'s options.
#[derive(Parser)]
#[command(name = "stagesim replay")]
struct Line {
    #[command(flatten)]
    args: ReplayArgs,
}

/// The replay options of each line of `text` (words split on white space;
/// empty lines and `#` comments skipped), with their line numbers. Errors
/// name the file and the line.
pub fn parse(text: &str, file: &Path) -> anyhow::Result<Vec<(usize, ReplayArgs)>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let words = std::iter::once("stagesim-replay").chain(l.split_whitespace());
            Line::try_parse_from(words)
                .map(|line| (i + 1, line.args))
                .map_err(|e| anyhow::anyhow!("{}:{}: {e}", file.display(), i + 1))
        })
        .collect()
}

/// `stagesim replay-batch FILE`: every line is checked before the first
/// replay runs, then run in order on the shared traces.
pub fn replay_batch(file: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let lines = parse(&text, file)?;
    let mut cache = TraceCache::default();
    let n = lines.len();
    for (k, (line, args)) in lines.into_iter().enumerate() {
        eprintln!(
            "stagesim replay-batch: {}:{line} ({} of {n})",
            file.display(),
            k + 1
        );
        super::replay::replay_with(args, &mut cache)
            .with_context(|| format!("{}:{line}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_as_replay_options_and_errors_name_the_line() {
        let text = "# the verdict\n--trace a.stz --cores 4,6 --policy static\n\n--trace b.stz --repeat 2 --json b.json\n";
        let lines = parse(text, Path::new("v.batch")).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].0, 2);
        assert_eq!(lines[0].1.cores, [4, 6]);
        assert_eq!(lines[1].1.repeat, 2);
        let bad = parse(
            "--trace a.stz\n--trace b.stz --cores x\n",
            Path::new("v.batch"),
        );
        let e = bad.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("v.batch:2: "), "{e}");
    }
}
