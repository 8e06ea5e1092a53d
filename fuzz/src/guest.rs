//! Guest RAM for the targets: one mapping per thread, reused across cases
//! and zeroed again after each case (also when a case panics, so the cases
//! bolero runs after a failure start from the same clean RAM).

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Zeroed guest RAM of `size` bytes at GPA 0.
pub fn memory(size: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)])
        .expect("cannot map fuzz guest memory")
}

/// Writes `bytes` at `gpa`, cut at the end of RAM (`mem_size`).
pub fn write_clipped(mem: &GuestMemoryMmap, mem_size: u64, gpa: u64, bytes: &[u8]) {
    if gpa >= mem_size {
        return;
    }
    let n = (mem_size - gpa).min(bytes.len() as u64) as usize;
    mem.write_slice(&bytes[..n], GuestAddress(gpa))
        .expect("write inside RAM");
}

/// Zeroes `[gpa, gpa + len)` of RAM (cut at its end) when dropped.
pub struct ZeroOnDrop<'a> {
    mem: &'a GuestMemoryMmap,
    mem_size: u64,
    gpa: u64,
    len: u64,
}

impl<'a> ZeroOnDrop<'a> {
    /// A guard for `[gpa, gpa + len)` of `mem` (`mem_size` bytes).
    pub fn new(mem: &'a GuestMemoryMmap, mem_size: u64, gpa: u64, len: u64) -> Self {
        Self {
            mem,
            mem_size,
            gpa,
            len,
        }
    }
}

impl Drop for ZeroOnDrop<'_> {
    fn drop(&mut self) {
        let len = self.len.min(self.mem_size.saturating_sub(self.gpa));
        if len == 0 {
            return;
        }
        // One memset instead of vm-memory's volatile copy, which is slow in
        // debug builds for the up to 1 MiB the ring target clears.
        let host = self
            .mem
            .get_host_address(GuestAddress(self.gpa))
            .expect("gpa inside RAM");
        // SAFETY: RAM is one mapping of `mem_size` bytes from GPA 0 (see
        // `memory`), `[gpa, gpa + len)` lies inside it, and writing bytes
        // into guest RAM cannot break any Rust invariant.
        unsafe { std::ptr::write_bytes(host, 0, len as usize) };
    }
}

/// One split-ring descriptor table entry (VIRTIO 1.2 §2.7.5: `addr` le64,
/// `len` le32, `flags` le16, `next` le16) at `addr` of `len` bytes, with
/// flags drawn from `inp` (one in 8 arbitrary, else the low three bits:
/// NEXT, WRITE, INDIRECT) and a next index (one in 8 arbitrary, else within
/// a queue of `qsize` entries or just past it).
pub fn descriptor(inp: &mut crate::input::Input, addr: u64, len: u32, qsize: u16) -> [u8; 16] {
    let flags = if inp.one_in(8) {
        inp.u16()
    } else {
        u16::from(inp.u8() % 8)
    };
    let next = if inp.one_in(8) {
        inp.u16()
    } else {
        inp.below(u32::from(qsize) + 2) as u16
    };
    let mut entry = [0u8; 16];
    entry[0..8].copy_from_slice(&addr.to_le_bytes());
    entry[8..12].copy_from_slice(&len.to_le_bytes());
    entry[12..14].copy_from_slice(&flags.to_le_bytes());
    entry[14..16].copy_from_slice(&next.to_le_bytes());
    entry
}
