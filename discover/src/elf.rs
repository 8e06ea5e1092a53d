//! The server binary's function symbols: whether it has any (a stripped
//! binary cannot be staged by name), and the request marker — the function
//! a thread enters when it starts serving a request (MariaDB's
//! `do_command`), which the capture window and the discovery key on.

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSymbol as _, SymbolKind};

/// Request-marker functions tried, in order, when `--request` is not given:
/// the per-command entry of thread-per-connection servers (MariaDB and
/// MySQL `do_command`, Apache httpd `ap_process_request`) and two common
/// names in small servers.
pub const DEFAULT_REQUEST_SYMBOLS: [&str; 4] = [
    "do_command",
    "ap_process_request",
    "handle_request",
    "process_request",
];

/// Errors reading the binary or finding its request marker.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file cannot be read.
    #[error("--binary {}: {source}", path.display())]
    Read {
        /// The binary.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an ELF object.
    #[error("--binary {}: not an ELF executable", path.display())]
    NotElf {
        /// The binary.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: object::Error,
    },
    /// No function symbols: stripped, without `.dynsym` functions either.
    #[error(
        "--binary {}: no function symbols (.symtab {}, .dynsym {}): the binary is stripped; \
         stage points are named by function, so use an unstripped build (or its debug-symbol \
         package's .symtab)",
        path.display(),
        if *has_symtab { "present" } else { "absent" },
        if *has_dynsym { "present" } else { "absent" }
    )]
    NoSymbols {
        /// The binary.
        path: PathBuf,
        /// Whether a `.symtab` section exists.
        has_symtab: bool,
        /// Whether a `.dynsym` section exists.
        has_dynsym: bool,
    },
    /// `--request NAME` names no function of the binary.
    #[error(
        "--request {name}: no function of that name in {} ({functions} function symbols){}",
        path.display(),
        if similar.is_empty() { String::new() } else { format!("; similar: {}", similar.join(", ")) }
    )]
    UnknownRequest {
        /// The binary.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// Function symbols read.
        functions: usize,
        /// Up to 5 symbols that contain the name.
        similar: Vec<String>,
    },
    /// No `--request`, and none of [`DEFAULT_REQUEST_SYMBOLS`] is in the binary.
    #[error(
        "no request marker found in {}: none of {} is a function of it; name the function a \
         thread enters for each request with --request SYMBOL",
        path.display(),
        DEFAULT_REQUEST_SYMBOLS.join(", ")
    )]
    NoRequestMarker {
        /// The binary.
        path: PathBuf,
    },
}

/// A defined function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its name as in the binary (mangled).
    pub name: String,
    /// Its entry's file virtual address (the tracer adds the load bias).
    pub addr: u64,
}

/// The server binary's function symbols (`.symtab` and `.dynsym`).
#[derive(Clone, Debug)]
pub struct ServerBinary {
    /// The binary's path.
    pub path: PathBuf,
    /// Defined function symbols, `.symtab` first, without duplicate names.
    pub functions: Vec<Function>,
}

impl ServerBinary {
    /// Reads the function symbols of the ELF file at `path`.
    ///
    /// Errors: [`ElfError::Read`], [`ElfError::NotElf`], and
    /// [`ElfError::NoSymbols`] when it defines no function symbol.
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        let data = std::fs::read(path).map_err(|source| ElfError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file = object::File::parse(&*data).map_err(|source| ElfError::NotElf {
            path: path.to_path_buf(),
            source,
        })?;
        let mut functions: Vec<Function> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            if !name.is_empty() && seen.insert(name.to_string()) {
                functions.push(Function {
                    name: name.to_string(),
                    addr: sym.address(),
                });
            }
        }
        if functions.is_empty() {
            return Err(ElfError::NoSymbols {
                path: path.to_path_buf(),
                has_symtab: file.section_by_name(".symtab").is_some(),
                has_dynsym: file.section_by_name(".dynsym").is_some(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            functions,
        })
    }

    /// The functions named `name`: the symbol itself, or a C++ free
    /// function of that name under the Itanium ABI's mangling
    /// (`_Z<length><name>` then its parameter types, e.g. `do_command` →
    /// `_Z10do_commandP3THDb`; every overload).
    pub fn find(&self, name: &str) -> Vec<&Function> {
        let mangled = format!("_Z{}{}", name.len(), name);
        self.functions
            .iter()
            .filter(|f| {
                f.name == name
                    || f.name.strip_prefix(&mangled).is_some_and(|rest| {
                        // The length prefix fixes where the name ends; what
                        // follows is the parameter list, never empty.
                        !rest.is_empty()
                    })
            })
            .collect()
    }

    /// The request marker: the functions of `--request NAME`, else of the
    /// first of [`DEFAULT_REQUEST_SYMBOLS`] the binary defines; and the
    /// name used.
    ///
    /// Errors: [`ElfError::UnknownRequest`] (with up to 5 similar names),
    /// [`ElfError::NoRequestMarker`].
    pub fn request_marker(&self, name: Option<&str>) -> Result<(String, Vec<&Function>), ElfError> {
        if let Some(name) = name {
            let found = self.find(name);
            if found.is_empty() {
                let similar = self
                    .functions
                    .iter()
                    .filter(|f| f.name.contains(name))
                    .take(5)
                    .map(|f| f.name.clone())
                    .collect();
                return Err(ElfError::UnknownRequest {
                    path: self.path.clone(),
                    name: name.to_string(),
                    functions: self.functions.len(),
                    similar,
                });
            }
            return Ok((name.to_string(), found));
        }
        DEFAULT_REQUEST_SYMBOLS
            .iter()
            .map(|n| (n.to_string(), self.find(n)))
            .find(|(_, f)| !f.is_empty())
            .ok_or_else(|| ElfError::NoRequestMarker {
                path: self.path.clone(),
            })
    }
}

/// The stgtrace tool's stage table for a capture with one stage, `request`
/// (id 0), entered at `marker`'s functions, each flagged `T` (the window
/// opens and closes at a request's start): lines `HEXADDR STAGE FLAGS NAME`
/// (discover/stgtrace/st_main.c).
pub fn request_table(marker: &[&Function]) -> String {
    let mut s = String::from("# stagevm-discover: the request marker, stage 0, window trigger\n");
    for f in marker {
        s.push_str(&format!("{:x} 0 T {}\n", f.addr, f.name));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(names: &[&str]) -> ServerBinary {
        ServerBinary {
            path: "/srv/x".into(),
            functions: names
                .iter()
                .enumerate()
                .map(|(i, n)| Function {
                    name: n.to_string(),
                    addr: 0x1000 + i as u64 * 16,
                })
                .collect(),
        }
    }

    #[test]
    fn a_cpp_name_is_found_by_its_plain_name_and_overloads_are_all_found() {
        let b = bin(&[
            "_Z10do_commandP3THDb",
            "_Z10do_commandv",
            "_Z11do_commandsv",
            "main",
        ]);
        let f: Vec<&str> = b
            .find("do_command")
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(f, ["_Z10do_commandP3THDb", "_Z10do_commandv"]);
        assert_eq!(b.find("main").len(), 1);
        assert!(b.find("do_comman").is_empty());
    }

    #[test]
    fn the_marker_defaults_to_the_first_known_name_and_a_missing_one_is_named() {
        let b = bin(&["main", "handle_request", "_Z10do_commandP3THDb"]);
        let (name, f) = b.request_marker(None).unwrap();
        assert_eq!((name.as_str(), f.len()), ("do_command", 1));
        let e = b.request_marker(Some("serve")).unwrap_err();
        assert!(matches!(e, ElfError::UnknownRequest { .. }), "{e}");
        let e = b.request_marker(Some("request")).unwrap_err().to_string();
        assert!(e.contains("similar: handle_request"), "{e}");
        let e = bin(&["main"]).request_marker(None).unwrap_err().to_string();
        assert!(
            e.contains("--request SYMBOL") && e.contains("do_command"),
            "{e}"
        );
    }

    #[test]
    fn the_table_flags_every_marker_function_as_the_window_trigger() {
        let b = bin(&["a", "b"]);
        let t = request_table(&[&b.functions[1]]);
        assert!(t.ends_with("1010 0 T b\n"), "{t}");
    }
}
