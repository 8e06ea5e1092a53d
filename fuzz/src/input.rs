//! Decoding arbitrary bytes into structured values.

/// A cursor over the fuzzer's bytes. Reads past the end return zeros, so
/// every input decodes to some value and decoding never fails.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// The next `N` bytes (zero-padded past the end).
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.u8();
        }
        out
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// A boolean (low bit of a byte).
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value in `0..n` (`n` > 0; 0 when `n` is 0).
    pub fn below(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        if n <= 256 {
            u32::from(self.u8()) % n
        } else {
            self.u32() % n
        }
    }

    /// True with probability about `1 / n`.
    pub fn one_in(&mut self, n: u32) -> bool {
        self.below(n) == 0
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(hi - lo + 1)
    }

    /// One of `choices` (the first when empty input).
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u32) as usize]
    }

    /// `n` bytes (zero-padded past the end).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }

    /// Fewer than `max` bytes, the count decoded first.
    pub fn bytes_below(&mut self, max: u32) -> Vec<u8> {
        let n = self.below(max) as usize;
        self.bytes(n)
    }

    /// The bytes not consumed yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        self.pos = self.data.len();
        rest
    }

    /// A `u64` biased towards interesting values: small, near `around`,
    /// near the ends of the range, or arbitrary.
    pub fn u64_near(&mut self, around: u64) -> u64 {
        match self.u8() % 6 {
            0 => u64::from(self.u8()),
            1 => around.wrapping_add(u64::from(self.u8())),
            2 => around.wrapping_sub(u64::from(self.u8())),
            3 => u64::MAX - u64::from(self.u8()),
            4 => 1u64 << (self.u8() % 64),
            _ => self.u64(),
        }
    }

    /// A `u32` biased like [`Self::u64_near`].
    pub fn u32_near(&mut self, around: u32) -> u32 {
        match self.u8() % 6 {
            0 => u32::from(self.u8()),
            1 => around.wrapping_add(u32::from(self.u8())),
            2 => around.wrapping_sub(u32::from(self.u8())),
            3 => u32::MAX - u32::from(self.u8()),
            4 => 1u32 << (self.u8() % 32),
            _ => self.u32(),
        }
    }
}
