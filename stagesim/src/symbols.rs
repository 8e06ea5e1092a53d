//! Function symbols of a traced binary at trace addresses, so a replay can
//! see function entries: a FETCH event that starts at a function's first
//! instruction is a call of it (the tracer cuts segments at every jump
//! target, so a call target always starts one; `bench/capture/README.md`).
//! Seed 004 finds its migration-point candidates the same way ("recognize
//! function calls in the resulting trace by matching the addresses with the
//! function symbols", §3.1).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use object::{Object as _, ObjectSymbol as _, SymbolKind};

/// Function entry addresses → symbol names.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    /// Entry address (as in the trace) → index into `names`.
    by_addr: HashMap<u64, u32>,
    /// Symbol names (mangled, as in the binary); several names of one
    /// address (aliases) keep the first one read.
    names: Vec<String>,
    /// Entry address of each name.
    addrs: Vec<u64>,
}

impl Symbols {
    /// Symbols from `(address, name)` pairs (addresses as in the trace).
    pub fn from_pairs<S: Into<String>>(pairs: impl IntoIterator<Item = (u64, S)>) -> Self {
        let mut s = Self::default();
        for (addr, name) in pairs {
            s.insert(addr, name.into());
        }
        s
    }

    fn insert(&mut self, addr: u64, name: String) {
        if addr == 0 || self.by_addr.contains_key(&addr) {
            return;
        }
        let idx = u32::try_from(self.names.len()).expect("fewer than 2^32 symbols");
        self.by_addr.insert(addr, idx);
        self.names.push(name);
        self.addrs.push(addr);
    }

    /// The defined function symbols of the ELF file at `path` (`.symtab`
    /// and `.dynsym`), at file address + `bias` (the load bias the tracer
    /// ran the binary at: the sidecar's `text_bias`).
    ///
    /// Errors: the file cannot be read or is not an ELF object, or it
    /// defines no function symbols (a stripped binary without `.dynsym`).
    pub fn from_elf(path: &Path, bias: u64) -> anyhow::Result<Self> {
        let data = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
        let file = object::File::parse(&*data)
            .with_context(|| format!("{}: not an ELF object", path.display()))?;
        let mut s = Self::default();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() != SymbolKind::Text || !sym.is_definition() {
                continue;
            }
            if let Ok(name) = sym.name() {
                if !name.is_empty() {
                    s.insert(sym.address().wrapping_add(bias), name.to_string());
                }
            }
        }
        anyhow::ensure!(
            !s.names.is_empty(),
            "{}: no function symbols (.symtab and .dynsym are empty)",
            path.display()
        );
        Ok(s)
    }

    /// The symbol index of the function starting at `addr`, if any.
    #[inline]
    pub fn at(&self, addr: u64) -> Option<u32> {
        self.by_addr.get(&addr).copied()
    }

    /// The name of symbol `idx`.
    pub fn name(&self, idx: u32) -> &str {
        &self.names[idx as usize]
    }

    /// The entry address of the symbol named `name` (a linear search).
    pub fn addr_of(&self, name: &str) -> Option<u64> {
        let idx = self.names.iter().position(|n| n == name)?;
        Some(self.addrs[idx])
    }

    /// The entry address of symbol `idx`.
    pub fn addr_of_index(&self, idx: u32) -> u64 {
        self.addrs[idx as usize]
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Parses a load bias as written in a sidecar: `0x108000` or decimal.
pub fn parse_bias(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let r = match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.with_context(|| format!("text bias '{s}': expected 0xHEX or a decimal number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tests_own_binary_has_its_functions_and_a_bias_moves_them() {
        let exe = std::env::current_exe().unwrap();
        let s = Symbols::from_elf(&exe, 0).unwrap();
        assert!(s.len() > 100, "{} symbols", s.len());
        let main = s.addr_of("main").expect("main in the test binary");
        let b = Symbols::from_elf(&exe, 0x1000).unwrap();
        assert_eq!(b.addr_of("main"), Some(main + 0x1000));
        assert_eq!(b.at(main + 0x1000).map(|i| b.name(i)), Some("main"));
        let e = Symbols::from_elf(Path::new("/nonexistent"), 0).unwrap_err();
        assert!(e.to_string().contains("/nonexistent"));
        assert_eq!(parse_bias("0x108000").unwrap(), 0x108000);
        assert_eq!(parse_bias("42").unwrap(), 42);
        assert!(parse_bias("0xzz").is_err());
    }
}
