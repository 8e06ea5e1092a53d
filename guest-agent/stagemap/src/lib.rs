//! Stage-map files (version 1): which functions of an unmodified binary
//! start which stage. `stagesim discover --binary` writes them; the Linux
//! agent's C parser (`guest-agent/linux/libstage/stagemap_file.[ch]`,
//! `stagectl --map-file`) reads them, the preload library
//! (`guest-agent/preload`) installs a stage point at each symbol's entry, and
//! `stagesim replay --stage-map` replays a trace re-marked by them. The format is specified in
//! `stagemap_file.h`; this parser applies the same rules (a test runs both on
//! the same files).

use thiserror::Error;

/// Most stages (the ABI's `MAX_STAGES`).
pub const MAX_STAGES: usize = 16;
/// Longest stage name, bytes.
pub const NAME_MAX: usize = 31;
/// Longest symbol, bytes.
pub const SYMBOL_MAX: usize = 1023;
/// Most symbols per file.
pub const MAX_SYMBOLS: usize = 4096;

/// One stage: its name and the functions whose entry starts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapStage {
    /// 1..=31 bytes of `[A-Za-z0-9_.-]`.
    pub name: String,
    /// Mangled symbol names.
    pub symbols: Vec<String>,
}

/// A parsed stage-map file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StageMapFile {
    /// The binary the symbols are from, if named.
    pub binary: Option<String>,
    /// Stages in id order (1..=16).
    pub stages: Vec<MapStage>,
    /// Where a request starts: (stage index, symbols).
    pub request: Option<(usize, Vec<String>)>,
}

/// A malformed stage-map file: the 1-based line and why.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("line {line}: {why}")]
pub struct MapFileError {
    /// 1-based line number.
    pub line: usize,
    /// The reason, as the C parser words it.
    pub why: &'static str,
}

fn name_ok(s: &str) -> bool {
    (1..=NAME_MAX).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The 1-based line of `text` (a stage-map file) that lists `symbol` in a
/// `stage` or `request` directive, for errors that name a symbol after
/// parsing (for example one the binary does not define). `None` when no
/// directive lists it.
pub fn symbol_line(text: &str, symbol: &str) -> Option<usize> {
    text.lines().enumerate().find_map(|(i, raw)| {
        let code = raw.split('#').next().unwrap_or("");
        let mut t = code.split_whitespace();
        let directive = t.next()?;
        let listed = matches!(directive, "stage" | "request") && t.skip(1).any(|s| s == symbol);
        listed.then_some(i + 1)
    })
}

impl StageMapFile {
    /// Parses `text`. Errors: [`MapFileError`] with the first bad line.
    pub fn parse(text: &str) -> Result<Self, MapFileError> {
        let mut m = StageMapFile::default();
        let mut version = false;
        let mut all: Vec<&str> = Vec::new();
        let mut line = 0;
        for raw in text.split_terminator('\n') {
            line += 1;
            let bad = |why| Err(MapFileError { line, why });
            if raw.len() > 65536 {
                return bad("line longer than 64 KiB");
            }
            if raw.contains('\0') {
                return bad("NUL byte in the file");
            }
            let code = raw.split('#').next().unwrap_or("");
            let t: Vec<&str> = code
                .split([' ', '\t', '\r'])
                .filter(|s| !s.is_empty())
                .collect();
            if t.is_empty() {
                continue;
            }
            if !version {
                if t != ["stagemap", "1"] {
                    return bad("the first directive must be 'stagemap 1'");
                }
                version = true;
                continue;
            }
            match t[0] {
                "binary" => {
                    if t.len() != 2 {
                        return bad("binary takes one path");
                    }
                    if m.binary.is_some() {
                        return bad("binary given twice");
                    }
                    m.binary = Some(t[1].to_string());
                }
                "stage" | "request" => {
                    let is_req = t[0] == "request";
                    if t.len() < 3 {
                        return bad("expected a name and at least one symbol");
                    }
                    if !name_ok(t[1]) {
                        return bad("stage name: 1..31 bytes of [A-Za-z0-9_.-]");
                    }
                    let st = m.stages.iter().position(|s| s.name == t[1]);
                    match (is_req, st) {
                        (false, Some(_)) => return bad("stage defined twice"),
                        (true, None) => return bad("request names a stage not defined before it"),
                        (true, Some(_)) if m.request.is_some() => {
                            return bad("request given twice")
                        }
                        _ => {}
                    }
                    if !is_req && m.stages.len() == MAX_STAGES {
                        return bad("more than 16 stages");
                    }
                    if all.len() + t.len() - 2 > MAX_SYMBOLS {
                        return bad("more than 4096 symbols");
                    }
                    for s in &t[2..] {
                        if s.len() > SYMBOL_MAX {
                            return bad("symbol longer than 1023 bytes");
                        }
                        if all.contains(s) {
                            return bad("symbol listed twice");
                        }
                        all.push(s);
                    }
                    let syms: Vec<String> = t[2..].iter().map(|s| s.to_string()).collect();
                    match st {
                        Some(i) if is_req => m.request = Some((i, syms)),
                        _ => m.stages.push(MapStage {
                            name: t[1].to_string(),
                            symbols: syms,
                        }),
                    }
                }
                _ => return bad("unknown directive (stagemap, binary, stage, request)"),
            }
        }
        if !version {
            return Err(MapFileError {
                line,
                why: "empty: no 'stagemap 1' line",
            });
        }
        if m.stages.is_empty() {
            return Err(MapFileError {
                line,
                why: "no stage",
            });
        }
        Ok(m)
    }

    /// The canonical text (as `stagectl --map-file` prints it), after
    /// `comment` lines (each prefixed with `# `).
    pub fn to_text(&self, comment: &[String]) -> String {
        let mut s: String = comment.iter().map(|c| format!("# {c}\n")).collect();
        s.push_str("stagemap 1\n");
        if let Some(b) = &self.binary {
            s.push_str(&format!("binary {b}\n"));
        }
        for st in &self.stages {
            s.push_str(&format!("stage {} {}\n", st.name, st.symbols.join(" ")));
        }
        if let Some((i, syms)) = &self.request {
            s.push_str(&format!(
                "request {} {}\n",
                self.stages[*i].name,
                syms.join(" ")
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_round_trips_and_bad_lines_are_named() {
        let text = "# made by hand\nstagemap 1 # v1\nbinary /usr/sbin/mariadbd\n\nstage front do_command _Zfoo\nstage exec\t_ZN4JOIN4execEv\nrequest exec my_net_read\n";
        let m = StageMapFile::parse(text).unwrap();
        assert_eq!(m.stages.len(), 2);
        assert_eq!(m.request, Some((1, vec!["my_net_read".to_string()])));
        let canon = m.to_text(&[]);
        assert_eq!(
            canon,
            "stagemap 1\nbinary /usr/sbin/mariadbd\nstage front do_command _Zfoo\nstage exec _ZN4JOIN4execEv\nrequest exec my_net_read\n"
        );
        assert_eq!(StageMapFile::parse(&m.to_text(&["x".into()])).unwrap(), m);
        for (text, line, why) in [
            ("", 0, "empty: no 'stagemap 1' line"),
            ("stage a b\n", 1, "the first directive must be 'stagemap 1'"),
            ("stagemap 1\n", 1, "no stage"),
            (
                "stagemap 1\nstage a x\nstage b x\n",
                3,
                "symbol listed twice",
            ),
            (
                "stagemap 1\nstage a x\nstage a y\n",
                3,
                "stage defined twice",
            ),
            (
                "stagemap 1\nrequest a x\n",
                2,
                "request names a stage not defined before it",
            ),
            (
                "stagemap 1\nstage a\n",
                2,
                "expected a name and at least one symbol",
            ),
            (
                "stagemap 1\nstage a/b x\n",
                2,
                "stage name: 1..31 bytes of [A-Za-z0-9_.-]",
            ),
            (
                "stagemap 1\nstages a x\n",
                2,
                "unknown directive (stagemap, binary, stage, request)",
            ),
        ] {
            assert_eq!(
                StageMapFile::parse(text),
                Err(MapFileError { line, why }),
                "{text:?}"
            );
        }
        let many: String = (0..17).map(|i| format!("stage s{i} f{i}\n")).collect();
        assert_eq!(
            StageMapFile::parse(&format!("stagemap 1\n{many}"))
                .unwrap_err()
                .why,
            "more than 16 stages"
        );
    }
}

#[cfg(test)]
mod symbol_line_tests {
    use super::symbol_line;

    #[test]
    fn symbol_line_finds_the_directive_not_a_comment() {
        let text = "stagemap 1\n# stage x f\nstage a f g # h\nrequest a h\n";
        assert_eq!(symbol_line(text, "g"), Some(3));
        assert_eq!(symbol_line(text, "h"), Some(4));
        // The stage's name is not one of its symbols.
        assert_eq!(symbol_line(text, "a"), None);
        assert_eq!(symbol_line(text, "x"), None);
    }
}
