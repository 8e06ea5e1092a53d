//! The checksum the test guest prints over what it read or echoed (a disk's
//! bytes, frames' payloads) and the tests recompute: FNV-1a, 64 bits
//! (Fowler–Noll–Vo; the `fnv` crate's `FnvHasher`).

use core::hash::Hasher;

/// FNV-1a's 64-bit offset basis: the checksum of nothing.
pub const FNV1A_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (64-bit) over `bytes`, continuing from `h` ([`FNV1A_START`] to
/// begin).
pub fn fnv1a_continue(h: u64, bytes: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::with_key(h);
    hasher.write(bytes);
    hasher.finish()
}

/// FNV-1a (64-bit) over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_continue(FNV1A_START, bytes)
}

#[cfg(test)]
mod tests {
    /// The published test vectors of FNV-1a 64 (the FNV page, isthe.com).
    #[test]
    fn known_values() {
        assert_eq!(super::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let (a, b) = b"foobar".split_at(2);
        assert_eq!(
            super::fnv1a_continue(super::fnv1a(a), b),
            super::fnv1a(b"foobar")
        );
    }
}
