//! The default disk image generator: `bytes` bytes of the xorshift64 stream
//! (Marsaglia 2003, shifts 13, 7, 17) seeded with 0x2545_f491_4f6c_dd1d,
//! each word stored little-endian. Reproducible, incompressible, and easy to
//! recompute anywhere. `mkdisk` writes it for `just run`; `disk-bench` and
//! the end-to-end disk tests (tests/disk.rs) use it too.

/// Generates the image.
pub fn generate(bytes: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::with_capacity(bytes + 8);
    while data.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(bytes);
    data
}
