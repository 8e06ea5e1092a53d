//! Set-associative LRU caches and the per-core hierarchy.
//!
//! **Inclusion policy: non-inclusive, non-exclusive ("NINE"), fill on miss at
//! every level.** An access that misses in L1 looks up L2 (and the optional
//! shared L3); every level that missed allocates the line (becoming MRU in its
//! set). Evictions never propagate: an L2 eviction does not back-invalidate
//! L1, and an L1 eviction does not write the line into L2 (it is normally
//! still there). Hits in L1 do not touch L2's LRU state. Stores are treated
//! like loads (write-allocate, no write-back traffic is modelled). All levels
//! share one line size.
//!
//! Every cache is one flat `Vec<u64>` of `sets × ways` line numbers, each set
//! ordered MRU first; an access scans the set and rotates the hit (or the new
//! line) to the front — exact LRU, no hashing, no allocation.

use thiserror::Error;

/// A line slot that holds nothing (no real line number reaches `u64::MAX`:
/// line numbers are addresses shifted right by at least 1).
const INVALID: u64 = u64::MAX;

/// The shape of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Capacity in bytes (e.g. 32768 for 32 KiB).
    pub size_bytes: u64,
    /// Associativity (lines per set), 1..=64.
    pub ways: u32,
    /// Line size in bytes, a power of two ≥ 2 (e.g. 64).
    pub line_bytes: u32,
}

/// A cache geometry that cannot be built.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("cache {what}: {size_bytes} bytes, {ways}-way, {line_bytes} B lines: {why}")]
pub struct GeometryError {
    /// Which cache (e.g. "L2").
    pub what: String,
    /// Requested capacity in bytes.
    pub size_bytes: u64,
    /// Requested associativity.
    pub ways: u32,
    /// Requested line size in bytes.
    pub line_bytes: u32,
    /// What is wrong.
    pub why: &'static str,
}

impl Geometry {
    /// A geometry from KiB, ways and line bytes.
    pub const fn kib(kib: u64, ways: u32, line_bytes: u32) -> Self {
        Self {
            size_bytes: kib * 1024,
            ways,
            line_bytes,
        }
    }

    /// Number of sets (`size / (ways × line)`).
    pub fn sets(&self) -> u64 {
        self.size_bytes / (self.ways as u64 * self.line_bytes as u64)
    }

    /// Checks the geometry: line size a power of two ≥ 2, 1..=64 ways, and
    /// the number of sets a power of two ≥ 1 that divides the size exactly.
    pub fn validate(&self, what: &str) -> Result<(), GeometryError> {
        let bad = |why| {
            Err(GeometryError {
                what: what.to_string(),
                size_bytes: self.size_bytes,
                ways: self.ways,
                line_bytes: self.line_bytes,
                why,
            })
        };
        if self.line_bytes < 2 || !self.line_bytes.is_power_of_two() {
            return bad("line size must be a power of two ≥ 2");
        }
        if self.ways == 0 || self.ways > 64 {
            return bad("ways must be 1..=64");
        }
        let set_bytes = self.ways as u64 * self.line_bytes as u64;
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(set_bytes) {
            return bad("size must be a non-zero multiple of ways × line size");
        }
        if !self.sets().is_power_of_two() {
            return bad("number of sets (size / (ways × line)) must be a power of two");
        }
        Ok(())
    }
}

/// One set-associative LRU cache addressed by line number.
#[derive(Clone, Debug)]
pub struct Cache {
    ways: usize,
    set_mask: u64,
    line_shift: u32,
    /// `sets × ways` line numbers, each set MRU first.
    tags: Vec<u64>,
}

impl Cache {
    /// An empty cache of `geometry` (`what` names it in errors).
    pub fn new(geometry: Geometry, what: &str) -> Result<Self, GeometryError> {
        geometry.validate(what)?;
        let sets = geometry.sets();
        Ok(Self {
            ways: geometry.ways as usize,
            set_mask: sets - 1,
            line_shift: geometry.line_bytes.trailing_zeros(),
            tags: vec![INVALID; (sets * geometry.ways as u64) as usize],
        })
    }

    /// log2 of the line size in bytes.
    pub fn line_shift(&self) -> u32 {
        self.line_shift
    }

    /// Accesses line number `line` (address >> line shift): returns `true` on
    /// a hit. Either way the line becomes the set's MRU entry; on a miss the
    /// LRU entry is evicted.
    #[inline]
    pub fn access_line(&mut self, line: u64) -> bool {
        let base = (line & self.set_mask) as usize * self.ways;
        let set = &mut self.tags[base..base + self.ways];
        if set[0] == line {
            return true;
        }
        let pos = set.iter().position(|&t| t == line);
        let (hit, end) = match pos {
            Some(i) => (true, i),
            None => (false, set.len() - 1),
        };
        set.copy_within(0..end, 1);
        set[0] = line;
        hit
    }

    /// Accesses the line holding byte address `addr`; `true` on a hit.
    #[inline]
    pub fn access(&mut self, addr: u64) -> bool {
        self.access_line(addr >> self.line_shift)
    }

    /// Whether the line holding `addr` is present (no LRU update).
    pub fn contains(&self, addr: u64) -> bool {
        let line = addr >> self.line_shift;
        let base = (line & self.set_mask) as usize * self.ways;
        self.tags[base..base + self.ways].contains(&line)
    }

    /// The byte addresses (line-aligned) held in the set of `addr`, MRU first.
    pub fn set_contents(&self, addr: u64) -> Vec<u64> {
        let line = addr >> self.line_shift;
        let base = (line & self.set_mask) as usize * self.ways;
        self.tags[base..base + self.ways]
            .iter()
            .filter(|t| **t != INVALID)
            .map(|t| t << self.line_shift)
            .collect()
    }

    /// Removes line number `line` if present (the entries behind it move up
    /// one place and the set's last entry becomes empty); `true` if it was
    /// there. Used when another core writes the line
    /// ([`crate::sim::SimConfig`]'s transfer model).
    pub fn invalidate_line(&mut self, line: u64) -> bool {
        let base = (line & self.set_mask) as usize * self.ways;
        let set = &mut self.tags[base..base + self.ways];
        let Some(i) = set.iter().position(|&t| t == line) else {
            return false;
        };
        set.copy_within(i + 1.., i);
        set[set.len() - 1] = INVALID;
        true
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.tags.fill(INVALID);
    }
}

/// Where an access was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// L1 (instruction or data) hit.
    L1,
    /// L1 miss, L2 hit.
    L2,
    /// L1 and L2 miss, shared L3 hit.
    L3,
    /// Missed every level: served by memory.
    Memory,
}

/// Cache geometry of the whole simulated machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hierarchy {
    /// Per-core L1 instruction cache (default 32 KiB, 8-way, 64 B: AMD Zen 3).
    pub l1i: Geometry,
    /// Per-core L1 data cache (default 32 KiB, 8-way, 64 B: AMD Zen 3).
    pub l1d: Geometry,
    /// Per-core private unified L2 (default 512 KiB, 8-way, 64 B: AMD Zen 3 /
    /// EPYC 7003, this machine's L2 per core).
    pub l2: Geometry,
    /// Optional L3 shared by all simulated cores (off by default).
    pub l3: Option<Geometry>,
}

impl Default for Hierarchy {
    fn default() -> Self {
        Self {
            l1i: Geometry::kib(32, 8, 64),
            l1d: Geometry::kib(32, 8, 64),
            l2: Geometry::kib(512, 8, 64),
            l3: None,
        }
    }
}

impl Hierarchy {
    /// Checks every level and that all levels share one line size.
    pub fn validate(&self) -> Result<(), GeometryError> {
        self.l1i.validate("L1i")?;
        self.l1d.validate("L1d")?;
        self.l2.validate("L2")?;
        if let Some(l3) = &self.l3 {
            l3.validate("L3")?;
        }
        let line = self.l1i.line_bytes;
        for (what, g) in [
            ("L1d", Some(self.l1d)),
            ("L2", Some(self.l2)),
            ("L3", self.l3),
        ] {
            if let Some(g) = g {
                if g.line_bytes != line {
                    return Err(GeometryError {
                        what: what.into(),
                        size_bytes: g.size_bytes,
                        ways: g.ways,
                        line_bytes: g.line_bytes,
                        why: "all levels must use the L1i line size",
                    });
                }
            }
        }
        Ok(())
    }
}

/// One simulated core's private caches.
#[derive(Clone, Debug)]
pub struct CoreCaches {
    /// L1 instruction cache.
    pub l1i: Cache,
    /// L1 data cache.
    pub l1d: Cache,
    /// Unified private L2.
    pub l2: Cache,
    /// Line number of the last instruction fetch (always MRU in L1i).
    last_iline: u64,
    /// Line number of the last data access (always MRU in L1d).
    last_dline: u64,
}

impl CoreCaches {
    /// Empty caches of the given geometry.
    pub fn new(h: &Hierarchy) -> Result<Self, GeometryError> {
        h.validate()?;
        Ok(Self {
            l1i: Cache::new(h.l1i, "L1i")?,
            l1d: Cache::new(h.l1d, "L1d")?,
            l2: Cache::new(h.l2, "L2")?,
            last_iline: INVALID,
            last_dline: INVALID,
        })
    }

    /// Instruction fetch of line number `line` through L1i → L2 → `l3`.
    #[inline]
    pub fn fetch_line(&mut self, line: u64, l3: Option<&mut Cache>) -> Level {
        // The last fetched line is the MRU entry of its L1i set (only fetches
        // touch L1i), so a repeat is a hit that changes no state.
        access(&mut self.last_iline, &mut self.l1i, &mut self.l2, l3, line)
    }

    /// Drops data line `line` from this core's L1d and L2 (another core wrote
    /// it). Instruction lines are never written, so L1i keeps its lines.
    pub fn invalidate_data(&mut self, line: u64) {
        if self.last_dline == line {
            self.last_dline = INVALID;
        }
        self.l1d.invalidate_line(line);
        self.l2.invalidate_line(line);
    }

    /// Data access (load or store) of line number `line` through L1d → L2 → `l3`.
    #[inline]
    pub fn data_line(&mut self, line: u64, l3: Option<&mut Cache>) -> Level {
        access(&mut self.last_dline, &mut self.l1d, &mut self.l2, l3, line)
    }
}

/// An access of `line` through `l1` (whose last accessed line is `last`:
/// a repeat is a hit that changes no state) → `l2` → `l3`.
#[inline(always)]
fn access(
    last: &mut u64,
    l1: &mut Cache,
    l2: &mut Cache,
    l3: Option<&mut Cache>,
    line: u64,
) -> Level {
    if line == *last {
        return Level::L1;
    }
    *last = line;
    if l1.access_line(line) {
        Level::L1
    } else {
        lower(l2, l3, line)
    }
}

#[inline]
fn lower(l2: &mut Cache, l3: Option<&mut Cache>, line: u64) -> Level {
    if l2.access_line(line) {
        Level::L2
    } else {
        match l3 {
            Some(l3) => {
                if l3.access_line(line) {
                    Level::L3
                } else {
                    Level::Memory
                }
            }
            None => Level::Memory,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 sets × 2 ways × 64 B = 512 B.
    fn tiny() -> Cache {
        Cache::new(Geometry::kib(0, 2, 64).with_size(512), "t").unwrap()
    }

    impl Geometry {
        fn with_size(mut self, bytes: u64) -> Self {
            self.size_bytes = bytes;
            self
        }
    }

    #[test]
    fn geometry_math_and_validation() {
        assert_eq!(Geometry::kib(32, 8, 64).sets(), 64);
        assert_eq!(Geometry::kib(512, 8, 64).sets(), 1024);
        assert!(Geometry::kib(48, 12, 64).validate("x").is_ok()); // 64 sets
        assert!(Geometry::kib(32, 8, 48).validate("x").is_err()); // line not 2^n
        assert!(Geometry::kib(24, 8, 64).validate("x").is_err()); // 48 sets
        assert!(Geometry::kib(32, 0, 64).validate("x").is_err());
        let e = Geometry::kib(0, 8, 64).validate("L2").unwrap_err();
        assert!(e.to_string().starts_with("cache L2: 0 bytes"), "{e}");
        let mut h = Hierarchy::default();
        h.l2.line_bytes = 128;
        assert!(h.validate().is_err());
    }

    #[test]
    fn hit_after_miss_and_offsets_within_a_line() {
        let mut c = tiny();
        assert!(!c.access(0x1000));
        assert!(c.access(0x1000));
        assert!(c.access(0x103f)); // same 64 B line
        assert!(!c.access(0x1040)); // next line, other set
    }

    #[test]
    fn an_invalidated_line_misses_and_its_set_keeps_the_others_in_order() {
        // Set 0 holds 512 (MRU) and 256; dropping 512 leaves 256 alone, so
        // 0 then fills the free way without evicting 256.
        let mut c = tiny();
        for a in [0u64, 256, 512] {
            c.access(a);
        }
        assert!(c.invalidate_line(512 >> 6));
        assert!(!c.invalidate_line(512 >> 6));
        assert_eq!(c.set_contents(0), vec![256]);
        assert!(!c.access(512));
        assert!(c.access(256));
        assert!(!c.access(0));
        assert_eq!(c.set_contents(0), vec![0, 256]);
    }

    #[test]
    fn conflict_misses_in_one_set() {
        // Set stride = 4 sets × 64 B = 256 B: 0, 256, 512 all map to set 0.
        let mut c = tiny();
        for a in [0u64, 256, 512] {
            assert!(!c.access(a));
        }
        // 2-way: 512 evicted 0 (LRU); 256 and 512 remain.
        assert!(!c.contains(0));
        assert!(c.contains(256) && c.contains(512));
        // Cycling three lines through a 2-way set misses every time (LRU).
        let mut misses = 0;
        for _ in 0..4 {
            for a in [0u64, 256, 512] {
                misses += !c.access(a) as u32;
            }
        }
        assert_eq!(misses, 12);
        // Other sets are untouched.
        assert!(c.set_contents(64).is_empty());
    }

    #[test]
    fn lru_order_follows_use() {
        // 1 set × 4 ways.
        let mut c = Cache::new(Geometry::kib(0, 4, 64).with_size(256), "t").unwrap();
        for a in [0u64, 64, 128, 192] {
            c.access(a);
        }
        assert_eq!(c.set_contents(0), [192, 128, 64, 0]);
        assert!(c.access(64)); // 64 becomes MRU
        assert_eq!(c.set_contents(0), [64, 192, 128, 0]);
        assert!(!c.access(256)); // evicts LRU = 0
        assert_eq!(c.set_contents(0), [256, 64, 192, 128]);
        assert!(c.access(128));
        assert!(!c.access(320)); // evicts LRU = 192
        assert_eq!(c.set_contents(0), [320, 128, 256, 64]);
        c.clear();
        assert!(c.set_contents(0).is_empty());
    }

    fn small_hierarchy() -> Hierarchy {
        // L1: 1 set × 2 ways (128 B); L2: 1 set × 4 ways (256 B); L3: 1 set × 8 ways.
        Hierarchy {
            l1i: Geometry::kib(0, 2, 64).with_size(128),
            l1d: Geometry::kib(0, 2, 64).with_size(128),
            l2: Geometry::kib(0, 4, 64).with_size(256),
            l3: Some(Geometry::kib(0, 8, 64).with_size(512)),
        }
    }

    #[test]
    fn l2_hit_after_l1_eviction() {
        let h = small_hierarchy();
        let mut core = CoreCaches::new(&h).unwrap();
        let l = |a: u64| a >> 6;
        assert_eq!(core.fetch_line(l(0), None), Level::Memory);
        assert_eq!(core.fetch_line(l(64), None), Level::Memory);
        assert_eq!(core.fetch_line(l(128), None), Level::Memory); // evicts 0 from L1i
        assert!(!core.l1i.contains(0));
        assert!(core.l2.contains(0)); // non-inclusive: L2 keeps it
        assert_eq!(core.fetch_line(l(0), None), Level::L2);
        assert_eq!(core.fetch_line(l(0), None), Level::L1); // repeat fast path
        assert_eq!(core.fetch_line(l(128), None), Level::L1);
    }

    #[test]
    fn l1_hits_do_not_refresh_l2_and_l2_eviction_keeps_l1() {
        let h = small_hierarchy();
        let mut core = CoreCaches::new(&h).unwrap();
        let l = |a: u64| a >> 6;
        // Line A = 0 stays hot in L1i while data lines stream through L2.
        core.fetch_line(l(0), None);
        for a in [1u64, 2, 3, 4] {
            core.data_line(a, None);
            core.fetch_line(l(0), None); // L1 hit (fast path), L2 LRU untouched
        }
        // L2 (4 ways) saw 0 then 1,2,3,4: 0 was LRU and is gone from L2 ...
        assert!(!core.l2.contains(0));
        // ... but L1i still has it (no back-invalidation).
        assert!(core.l1i.contains(0));
        assert_eq!(core.fetch_line(l(0), None), Level::L1);
    }

    #[test]
    fn shared_l3_serves_other_cores() {
        let h = small_hierarchy();
        let mut l3 = Cache::new(h.l3.unwrap(), "L3").unwrap();
        let mut a = CoreCaches::new(&h).unwrap();
        let mut b = CoreCaches::new(&h).unwrap();
        assert_eq!(a.fetch_line(7, Some(&mut l3)), Level::Memory);
        assert_eq!(b.fetch_line(7, Some(&mut l3)), Level::L3);
        assert_eq!(b.data_line(7, Some(&mut l3)), Level::L2); // unified L2
        assert_eq!(a.data_line(7, Some(&mut l3)), Level::L2);
    }
}
