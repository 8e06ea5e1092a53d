//! Sets of host CPUs (cores) in the kernel's cpulist format (`0-3,6`).

use std::collections::BTreeSet;
use std::fmt;

/// A set of host CPU numbers, ordered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

/// A cpulist that could not be parsed; names the text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid CPU list '{0}' (expected e.g. 0-3,6)")]
pub struct ParseError(pub String);

/// Largest CPU number accepted (matches glibc's `CPU_SETSIZE`).
pub const MAX_CPU: usize = 1023;

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the kernel's cpulist format (`Documentation/admin-guide/cputopology.rst`):
    /// comma-separated CPUs or ranges, possibly empty (or only whitespace).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let err = || ParseError(text.trim().to_string());
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.parse().map_err(|_| err())?, b.parse().map_err(|_| err())?),
                None => {
                    let n: usize = part.parse().map_err(|_| err())?;
                    (n, n)
                }
            };
            if lo > hi || hi > MAX_CPU {
                return Err(err());
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// Adds a CPU.
    pub fn insert(&mut self, cpu: usize) {
        self.0.insert(cpu);
    }

    /// Elements of `self` not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// Elements in both.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    /// Whether every element is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// Formats as a cpulist with ranges (`0-3,6`), the format of
    /// `/proc/<pid>/status` `Cpus_allowed_list`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<usize> = self.iter().collect();
        let mut i = 0;
        let mut first = true;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if i == j {
                write!(f, "{}", v[i])?;
            } else {
                write!(f, "{}-{}", v[i], v[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format_round_trip() {
        for text in ["0", "0-3", "0-3,6", "1,3,5-7", ""] {
            assert_eq!(CpuSet::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(CpuSet::parse("0-1\n").unwrap().len(), 2);
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
        assert!(CpuSet::parse("5000").is_err());
    }
}
