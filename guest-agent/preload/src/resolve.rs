//! Resolving a stage map's symbols against the running binary: the main
//! executable's file (`/proc/self/exe`), its function symbols (`.symtab`,
//! then `.dynsym`, read with the `object` crate) and its load bias (the PIE
//! base, from `dl_iterate_phdr`'s first entry, the main program).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSymbol as _, SymbolKind};
use thiserror::Error;

/// A function found in the running binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its run-time address (load bias + symbol value).
    pub addr: usize,
    /// Its size from the symbol table, bytes (0: unknown).
    pub size: usize,
}

/// Why the binary's symbols could not be read.
#[derive(Debug, Error)]
pub enum ResolveError {
    /// `/proc/self/exe` or the file behind it could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not an ELF file `object` can read.
    #[error("{path} is not a readable ELF file: {source}")]
    NotElf {
        /// The path.
        path: PathBuf,
        /// The error.
        source: object::Error,
    },
}

/// The running program's function symbols.
#[derive(Debug)]
pub struct Program {
    /// The executable's path (`/proc/self/exe` resolved).
    pub path: PathBuf,
    /// Defined function symbols by name: run-time address and size; the
    /// first definition of a name wins (`.symtab` before `.dynsym`).
    functions: HashMap<String, Found>,
}

impl Program {
    /// Reads the running program's symbols.
    ///
    /// Errors: [`ResolveError`].
    pub fn current() -> Result<Self, ResolveError> {
        let link = Path::new("/proc/self/exe");
        let path = std::fs::read_link(link).map_err(|source| ResolveError::Read {
            path: link.to_path_buf(),
            source,
        })?;
        Self::open(&path, main_load_bias())
    }

    /// Reads the function symbols of the ELF file at `path`, loaded with
    /// `bias` added to its addresses.
    ///
    /// Errors: [`ResolveError`].
    pub fn open(path: &Path, bias: usize) -> Result<Self, ResolveError> {
        let data = std::fs::read(path).map_err(|source| ResolveError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file = object::File::parse(&*data).map_err(|source| ResolveError::NotElf {
            path: path.to_path_buf(),
            source,
        })?;
        let mut functions = HashMap::new();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let Some(addr) = usize::try_from(sym.address())
                .ok()
                .and_then(|a| a.checked_add(bias))
            else {
                continue;
            };
            functions.entry(name.to_string()).or_insert(Found {
                addr,
                size: usize::try_from(sym.size()).unwrap_or(0),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            functions,
        })
    }

    /// The function named `symbol` (a mangled name as in the map).
    pub fn find(&self, symbol: &str) -> Option<Found> {
        self.functions.get(symbol).copied()
    }
}

/// The main program's load bias (0 for a non-PIE executable): the first
/// object `dl_iterate_phdr` reports is the main program.
pub fn main_load_bias() -> usize {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` for the duration of the
        // call, and `data` is the `&mut usize` passed below.
        unsafe { *data.cast::<usize>() = (*info).dlpi_addr as usize };
        1 // stop after the first object
    }
    let mut bias = 0usize;
    // SAFETY: `first` only writes through `data`, which points at `bias`
    // and outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut bias as *mut usize).cast()) };
    bias
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    #[no_mangle]
    extern "C" fn stagevm_preload_resolve_probe() -> u32 {
        std::hint::black_box(7)
    }

    #[test]
    fn the_test_binary_finds_its_own_function_at_its_run_time_address() {
        let p = Program::current().unwrap();
        let f = p.find("stagevm_preload_resolve_probe").unwrap();
        assert_eq!(f.addr, stagevm_preload_resolve_probe as *const () as usize);
        assert!(f.size > 0);
        assert_eq!(p.find("no_such_function_anywhere"), None);
    }
}
