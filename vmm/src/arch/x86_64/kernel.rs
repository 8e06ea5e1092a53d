//! Guest kernel image checks and loading.
//!
//! `linux-loader` does the loading; before it runs, this module checks what the
//! loader does not (ELF class and machine, the PVH note, the bzImage boot
//! protocol version) and computes the image's extent, so a bad image or a
//! too-small `--memory` gets an error naming the value instead of a generic
//! load failure.
//!
//! Three kinds of image are told apart ([`open`]): an ELF64 without a PVH
//! entry note (stagevm's ring-3 unikernel), an ELF64 with one (a Linux
//! `vmlinux`), and a bzImage (`HdrS` at offset 0x202).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use hypercall_abi::boot::KERNEL_MIN_GPA;
use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{bzimage::BzImage, elf::Elf, elf::PvhBootCapability, KernelLoader};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// ELF constants (System V gABI, "ELF Header" and "Program Header").
const ELFMAG: [u8; 4] = *b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
/// PVH entry note: owner "Xen", type `XEN_ELFNOTE_PHYS32_ENTRY`
/// (xen/include/public/elfnote.h), descriptor = 32-bit physical entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// Largest note segment read while looking for the PVH note (bytes).
const MAX_NOTE_SEGMENT: u64 = 1 << 20;
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
    /// Neither an ELF nor a bzImage.
    #[error("not an ELF64 x86-64 kernel nor a bzImage: {0}")]
    UnknownFormat(&'static str),
    /// A bzImage this VMM cannot boot (protocol too old, no 64-bit entry).
    #[error("unsupported bzImage: {0}")]
    BzImage(String),
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
    /// 32-bit PVH entry point GPA from the `XEN_ELFNOTE_PHYS32_ENTRY` note,
    /// if the image has one (a Linux `vmlinux` with `CONFIG_PVH`).
    pub pvh_entry: Option<u64>,
}

/// What the bzImage setup header says (Linux `Documentation/arch/x86/boot.rst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BzImageInfo {
    /// Boot protocol version (`0x020f` = 2.15).
    pub version: u16,
    /// Size of the real-mode setup in bytes (`(setup_sects + 1) * 512`).
    pub setup_size: u64,
    /// GPA where the protected-mode kernel is loaded (`code32_start`).
    pub load_addr: u64,
    /// Bytes of the protected-mode kernel (file size minus the setup).
    pub payload_size: u64,
    /// GPA where the kernel prefers to run after decompression.
    pub pref_address: u64,
    /// Memory the kernel needs from its run address during boot (bytes).
    pub init_size: u64,
    /// Highest GPA the initramfs may end at, inclusive (`initrd_addr_max`).
    pub initrd_addr_max: u64,
    /// Longest command line the kernel reads, without the NUL (bytes).
    pub cmdline_size: u64,
}

impl BzImageInfo {
    /// First GPA after everything the kernel uses while it boots: the loaded
    /// payload and the decompressed kernel's `init_size` at `pref_address`.
    pub fn end(&self) -> u64 {
        // Both sums are checked by `inspect_bzimage`; saturate anyway.
        (self.load_addr.saturating_add(self.payload_size))
            .max(self.pref_address.saturating_add(self.init_size))
    }
}

/// A checked kernel image, open and ready for [`load`] / [`load_bzimage`].
#[derive(Debug)]
pub enum KernelImage {
    /// An ELF64 x86-64 image ([`ImageExtent::pvh_entry`] tells whether it is
    /// a PVH-capable Linux `vmlinux`).
    Elf(File, ImageExtent),
    /// A Linux bzImage.
    BzImage(File, BzImageInfo),
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

/// bzImage setup header offsets and values (boot.rst, "The Real-Mode Kernel
/// Header").
const BZ_SETUP_SECTS: usize = 0x1f1;
const BZ_HEADER: usize = 0x202;
const BZ_HEADER_MAGIC: u32 = 0x5372_6448; // "HdrS"
const BZ_VERSION: usize = 0x206;
const BZ_LOADFLAGS: usize = 0x211;
const BZ_CODE32_START: usize = 0x214;
const BZ_INITRD_ADDR_MAX: usize = 0x22c;
const BZ_XLOADFLAGS: usize = 0x236;
const BZ_CMDLINE_SIZE: usize = 0x238;
const BZ_PREF_ADDRESS: usize = 0x258;
const BZ_INIT_SIZE: usize = 0x260;
/// Bytes of the file read to look at the setup header.
const BZ_HEADER_END: usize = 0x268;
/// `loadflags` bit: the protected-mode kernel is loaded at 1 MiB.
const LOADED_HIGH: u8 = 1;
/// `xloadflags` bit: the kernel has the 64-bit entry at load address + 0x200.
const XLF_KERNEL_64: u16 = 1;
/// Oldest protocol with `xloadflags`, `pref_address` and `init_size`: 2.12.
const BZ_MIN_VERSION: u16 = 0x020c;

/// Opens `path` and tells which kind of image it is: an ELF64 x86-64 image
/// (checked by [`inspect`]) or a bzImage (checked by [`inspect_bzimage`]).
/// Anything else is [`KernelError::UnknownFormat`].
pub fn open(path: &Path) -> Result<KernelImage, KernelError> {
    // A FIFO or a device would block or never end: refuse it before opening.
    let meta = std::fs::metadata(path).map_err(|e| {
        std::io::Error::new(e.kind(), stagevm_api::paths::describe_path_error(path, &e))
    })?;
    if !meta.is_file() {
        return Err(KernelError::UnknownFormat("not a regular file"));
    }
    let mut file = File::open(path)?;
    let mut head = Vec::with_capacity(BZ_HEADER_END);
    (&mut file)
        .take(BZ_HEADER_END as u64)
        .read_to_end(&mut head)?;
    if head.len() >= 4 && head[..4] == ELFMAG {
        let (file, extent) = inspect(path)?;
        return Ok(KernelImage::Elf(file, extent));
    }
    if head.len() >= BZ_HEADER + 4 && u32_at(&head, BZ_HEADER) == BZ_HEADER_MAGIC {
        let info = inspect_bzimage(&head, file.metadata()?.len())?;
        return Ok(KernelImage::BzImage(file, info));
    }
    Err(KernelError::UnknownFormat(if head.len() < 4 {
        "shorter than an ELF header"
    } else {
        "no ELF magic and no bzImage 'HdrS' header"
    }))
}

/// Checks a bzImage's setup header (`head`: the file's first 0x268 bytes or
/// fewer; `file_len`: its size in bytes): protocol 2.12 or later, loaded high,
/// with a 64-bit entry point.
pub fn inspect_bzimage(head: &[u8], file_len: u64) -> Result<BzImageInfo, KernelError> {
    if head.len() < BZ_HEADER_END {
        return Err(KernelError::BzImage(format!(
            "{} bytes is shorter than the setup header",
            head.len()
        )));
    }
    let version = u16_at(head, BZ_VERSION);
    if version < BZ_MIN_VERSION {
        return Err(KernelError::BzImage(format!(
            "boot protocol {}.{:02} is older than 2.12",
            version >> 8,
            version & 0xff
        )));
    }
    if head[BZ_LOADFLAGS] & LOADED_HIGH == 0 {
        return Err(KernelError::BzImage(
            "loadflags has no LOADED_HIGH: a zImage, not a bzImage".into(),
        ));
    }
    let xloadflags = u16_at(head, BZ_XLOADFLAGS);
    if xloadflags & XLF_KERNEL_64 == 0 {
        return Err(KernelError::BzImage(format!(
            "xloadflags {xloadflags:#x} has no XLF_KERNEL_64: no 64-bit entry point"
        )));
    }
    let sects = match head[BZ_SETUP_SECTS] {
        0 => 4,
        n => u64::from(n),
    };
    let setup_size = (sects + 1) * 512;
    let payload_size = file_len
        .checked_sub(setup_size)
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            KernelError::BzImage(format!(
                "file of {file_len} bytes has no payload after {setup_size} bytes of setup"
            ))
        })?;
    let load_addr = u64::from(u32_at(head, BZ_CODE32_START));
    if load_addr < KERNEL_MIN_GPA {
        return Err(KernelError::BzImage(format!(
            "code32_start {load_addr:#x} is below {KERNEL_MIN_GPA:#x}"
        )));
    }
    let pref_address = u64_at(head, BZ_PREF_ADDRESS);
    let init_size = u64::from(u32_at(head, BZ_INIT_SIZE));
    if pref_address.checked_add(init_size).is_none() {
        return Err(KernelError::BzImage(format!(
            "pref_address {pref_address:#x} + init_size {init_size:#x} overflows"
        )));
    }
    Ok(BzImageInfo {
        version,
        setup_size,
        load_addr,
        payload_size,
        pref_address,
        init_size,
        initrd_addr_max: u64::from(u32_at(head, BZ_INITRD_ADDR_MAX)),
        cmdline_size: u64::from(u32_at(head, BZ_CMDLINE_SIZE)),
    })
}

/// Looks for the PVH entry note in a `PT_NOTE` segment's bytes; returns its
/// 32-bit entry point.
fn pvh_note(notes: &[u8]) -> Option<u64> {
    let mut off = 0usize;
    while off + 12 <= notes.len() {
        let namesz = u32_at(notes, off) as usize;
        let descsz = u32_at(notes, off + 4) as usize;
        let kind = u32_at(notes, off + 8);
        let name_at = off + 12;
        let desc_at = name_at.checked_add(namesz.next_multiple_of(4))?;
        let next = desc_at.checked_add(descsz.next_multiple_of(4))?;
        if next > notes.len() {
            return None;
        }
        if kind == XEN_ELFNOTE_PHYS32_ENTRY
            && namesz == 4
            && &notes[name_at..name_at + 4] == b"Xen\0"
            && descsz >= 4
        {
            return Some(u64::from(u32_at(notes, desc_at)));
        }
        off = next;
    }
    None
}

/// Opens `path` and checks that it is an ELF64 x86-64 image whose loadable
/// segments and entry point lie at or above [`KERNEL_MIN_GPA`]. Returns the
/// open file and the image's extent (with its PVH entry, if any).
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
    let mut pvh_entry = None;
    for ph in phdrs.chunks_exact(PHDR_SIZE) {
        if u32_at(ph, 0) == PT_NOTE && pvh_entry.is_none() {
            let (offset, filesz) = (u64_at(ph, 8), u64_at(ph, 32));
            if filesz <= MAX_NOTE_SEGMENT {
                let mut notes = vec![0u8; filesz as usize];
                file.seek(SeekFrom::Start(offset))?;
                if file.read_exact(&mut notes).is_ok() {
                    pvh_entry = pvh_note(&notes);
                }
            }
            continue;
        }
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
    if let Some(pvh) = pvh_entry.filter(|pvh| !(start..end).contains(pvh)) {
        return Err(KernelError::Layout(format!(
            "PVH entry point {pvh:#x} is outside the loaded image [{start:#x}, {end:#x})"
        )));
    }
    Ok((
        file,
        ImageExtent {
            start,
            end,
            entry,
            pvh_entry,
        },
    ))
}

/// Loads the checked ELF image into guest memory with `linux-loader`; returns
/// the ELF entry point GPA and the PVH entry `linux-loader` found, if any.
pub fn load(mem: &GuestMemoryMmap, file: &mut File) -> Result<(u64, Option<u64>), KernelError> {
    let result = Elf::load(mem, None, file, Some(GuestAddress(KERNEL_MIN_GPA)))?;
    let pvh = match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) => Some(addr.0),
        _ => None,
    };
    Ok((result.kernel_load.0, pvh))
}

/// Loads a checked bzImage's protected-mode kernel at its `code32_start`
/// with `linux-loader`; returns its setup header (for `boot_params.hdr`).
pub fn load_bzimage(mem: &GuestMemoryMmap, file: &mut File) -> Result<setup_header, KernelError> {
    let result = BzImage::load(mem, None, file, Some(GuestAddress(KERNEL_MIN_GPA)))?;
    result
        .setup_header
        .ok_or_else(|| KernelError::BzImage("linux-loader returned no setup header".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(name.len() as u32).to_le_bytes());
        v.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(name);
        v.resize(v.len().next_multiple_of(4), 0);
        v.extend_from_slice(desc);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    #[test]
    fn pvh_note_is_found_among_others() {
        let mut notes = note(b"GNU\0", 3, &[1; 20]);
        notes.extend(note(b"Xen\0", 5, b"xen-3.0\0"));
        assert_eq!(pvh_note(&notes), None);
        notes.extend(note(b"Xen\0", 18, &0x0100_0abcu32.to_le_bytes()));
        assert_eq!(pvh_note(&notes), Some(0x0100_0abc));
        // A truncated segment is not read past its end.
        assert_eq!(pvh_note(&notes[..notes.len() - 2]), None);
        assert_eq!(pvh_note(&note(b"Xe\0", 18, &[0; 4])), None);
    }

    fn header(version: u16, xloadflags: u16) -> Vec<u8> {
        let mut h = vec![0u8; BZ_HEADER_END];
        h[BZ_SETUP_SECTS] = 1;
        h[BZ_HEADER..BZ_HEADER + 4].copy_from_slice(&BZ_HEADER_MAGIC.to_le_bytes());
        h[BZ_VERSION..BZ_VERSION + 2].copy_from_slice(&version.to_le_bytes());
        h[BZ_LOADFLAGS] = LOADED_HIGH;
        h[BZ_CODE32_START..BZ_CODE32_START + 4].copy_from_slice(&0x10_0000u32.to_le_bytes());
        h[BZ_XLOADFLAGS..BZ_XLOADFLAGS + 2].copy_from_slice(&xloadflags.to_le_bytes());
        h[BZ_PREF_ADDRESS..BZ_PREF_ADDRESS + 8].copy_from_slice(&0x100_0000u64.to_le_bytes());
        h[BZ_INIT_SIZE..BZ_INIT_SIZE + 4].copy_from_slice(&0x200_0000u32.to_le_bytes());
        h
    }

    #[test]
    fn bzimage_headers() {
        let info = inspect_bzimage(&header(0x020f, 1), 1024 + 4096).unwrap();
        assert_eq!(info.setup_size, 1024);
        assert_eq!(info.payload_size, 4096);
        assert_eq!(info.load_addr, 0x10_0000);
        assert_eq!(info.end(), 0x300_0000);
        let e = inspect_bzimage(&header(0x020a, 1), 8192).unwrap_err();
        assert!(e.to_string().contains("2.10"), "{e}");
        let e = inspect_bzimage(&header(0x020f, 0), 8192).unwrap_err();
        assert!(e.to_string().contains("XLF_KERNEL_64"), "{e}");
        let e = inspect_bzimage(&header(0x020f, 1), 1024).unwrap_err();
        assert!(e.to_string().contains("no payload"), "{e}");
    }

    /// A header whose end would overflow is refused with a named error
    /// (issue 14 D8: `pref_address + init_size` overflowed in `end()`).
    #[test]
    fn bzimage_end_that_overflows_is_refused() {
        let mut h = header(0x020f, 1);
        h[BZ_PREF_ADDRESS..BZ_PREF_ADDRESS + 8].copy_from_slice(&(u64::MAX - 16).to_le_bytes());
        let e = inspect_bzimage(&h, 8192).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }
}
