//! Guest kernel image checks and loading.
//!
//! `linux-loader` does the loading; before it runs, this module checks what the
//! loader does not (ELF class and machine) and computes the image's extent from
//! its program headers, so a bad image or a too-small `--memory` gets an error
//! naming the value instead of a generic load failure.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use hypercall_abi::boot::KERNEL_MIN_GPA;
use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// ELF constants (System V gABI, "ELF Header" and "Program Header").
const ELFMAG: [u8; 4] = *b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
/// More program headers than this is not a kernel we would load.
const MAX_PHDRS: u16 = 256;

/// Why a kernel image was refused. The VMM prefixes the path.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The file cannot be opened or read.
    #[error("cannot read kernel: {0}")]
    Io(#[from] std::io::Error),
    /// Not an ELF64 little-endian x86-64 image.
    #[error("not an ELF64 x86-64 kernel: {0}")]
    NotElf(&'static str),
    /// The image loads below [`KERNEL_MIN_GPA`] or has no loadable segment.
    #[error("unsupported kernel layout: {0}")]
    Layout(String),
    /// `linux-loader` refused the image.
    #[error("loading failed: {0}")]
    Load(#[from] linux_loader::loader::Error),
}

/// Extent of a checked ELF image in guest-physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageExtent {
    /// Lowest GPA of any `PT_LOAD` segment.
    pub start: u64,
    /// First GPA after the highest `PT_LOAD` segment (`p_paddr + p_memsz`).
    pub end: u64,
    /// Entry point GPA.
    pub entry: u64,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Opens `path` and checks that it is an ELF64 x86-64 image whose loadable
/// segments and entry point lie at or above [`KERNEL_MIN_GPA`]. Returns the
/// open file and the image's extent.
pub fn inspect(path: &Path) -> Result<(File, ImageExtent), KernelError> {
    let mut file = File::open(path)?;
    let mut ehdr = [0u8; EHDR_SIZE];
    if file.read_exact(&mut ehdr).is_err() {
        return Err(KernelError::NotElf("shorter than an ELF header"));
    }
    if ehdr[..4] != ELFMAG {
        return Err(KernelError::NotElf("no ELF magic"));
    }
    if ehdr[4] != ELFCLASS64 {
        return Err(KernelError::NotElf("not a 64-bit ELF"));
    }
    if ehdr[5] != ELFDATA2LSB {
        return Err(KernelError::NotElf("not little-endian"));
    }
    if u16_at(&ehdr, 18) != EM_X86_64 {
        return Err(KernelError::NotElf("machine is not x86-64"));
    }
    let entry = u64_at(&ehdr, 24);
    let phoff = u64_at(&ehdr, 32);
    let phentsize = u16_at(&ehdr, 54);
    let phnum = u16_at(&ehdr, 56);
    if phentsize as usize != PHDR_SIZE || phnum == 0 || phnum > MAX_PHDRS {
        return Err(KernelError::NotElf("bad program header table"));
    }
    file.seek(SeekFrom::Start(phoff))?;
    let mut phdrs = vec![0u8; PHDR_SIZE * phnum as usize];
    if file.read_exact(&mut phdrs).is_err() {
        return Err(KernelError::NotElf("program header table past end of file"));
    }
    let (mut start, mut end) = (u64::MAX, 0u64);
    for ph in phdrs.chunks_exact(PHDR_SIZE) {
        if u32_at(ph, 0) != PT_LOAD || u64_at(ph, 40) == 0 {
            continue;
        }
        let paddr = u64_at(ph, 24);
        let memsz = u64_at(ph, 40);
        let seg_end = paddr
            .checked_add(memsz)
            .ok_or_else(|| KernelError::Layout(format!("segment at {paddr:#x} overflows")))?;
        start = start.min(paddr);
        end = end.max(seg_end);
    }
    if end == 0 {
        return Err(KernelError::Layout("no loadable segment".into()));
    }
    if start < KERNEL_MIN_GPA {
        return Err(KernelError::Layout(format!(
            "segment at GPA {start:#x} is below the minimum load address {KERNEL_MIN_GPA:#x}"
        )));
    }
    if !(start..end).contains(&entry) {
        return Err(KernelError::Layout(format!(
            "entry point {entry:#x} is outside the loaded image [{start:#x}, {end:#x})"
        )));
    }
    Ok((file, ImageExtent { start, end, entry }))
}

/// Loads the checked image into guest memory with `linux-loader`; returns the
/// entry point GPA.
pub fn load(mem: &GuestMemoryMmap, file: &mut File) -> Result<u64, KernelError> {
    let result = Elf::load(mem, None, file, Some(GuestAddress(KERNEL_MIN_GPA)))?;
    Ok(result.kernel_load.0)
}
