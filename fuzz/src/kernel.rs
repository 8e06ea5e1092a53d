//! Target 5: the kernel image checks and loaders.
//!
//! Arbitrary bytes, near-valid ELF64 images (header, program headers, note
//! segments with PVH notes) and near-valid bzImages (setup header fields)
//! are written to a file and given to `kernel::open`, `kernel::inspect` and
//! `kernel::inspect_bzimage`. Checked: no panic; `open` agrees with the
//! checker of the format it picked; an accepted ELF's segments and entry
//! points lie at or above `KERNEL_MIN_GPA` inside its extent; an accepted
//! bzImage's setup plus payload is the file. Accepted images that fit a
//! small guest RAM are then loaded with `linux-loader`, which must not
//! panic either.

use std::path::PathBuf;

use hypercall_abi::boot::KERNEL_MIN_GPA;
use stagevm::arch::x86_64::kernel::{self, KernelImage};
use vm_memory::GuestMemoryMmap;

use crate::guest::memory as guest_memory;
use crate::input::Input;

/// Guest RAM the accepted images are loaded into (bytes).
pub const MEM: u64 = 4 << 20;
/// Bytes of the bzImage setup header `open` reads.
const BZ_HEADER_END: usize = 0x268;

struct Local {
    mem: GuestMemoryMmap,
    path: PathBuf,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

thread_local! {
    static LOCAL: Local = Local {
        mem: guest_memory(MEM),
        path: scratch_dir().join(format!(
            "stagevm-fuzz-kernel-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )),
    };
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    LOCAL.with(|l| run(l, data));
}

/// `/dev/shm` (tmpfs: the image is written for every case) if there is
/// one, else the temporary directory.
fn scratch_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

fn put(b: &mut [u8], off: usize, bytes: &[u8]) {
    if let Some(dst) = b.get_mut(off..off + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

/// A PT_NOTE segment's bytes: notes of arbitrary, GNU, Xen and PVH kinds.
fn notes(inp: &mut Input) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..inp.below(4) {
        let (name, kind): (&[u8], u32) = match inp.u8() % 4 {
            0 => (b"Xen\0", 18),
            1 => (b"GNU\0", 3),
            2 => (b"Xen\0", inp.u32_near(18)),
            _ => (b"Xe", 18),
        };
        let desc = inp.bytes_below(9);
        let namesz = if inp.one_in(8) {
            inp.u32_near(4)
        } else {
            name.len() as u32
        };
        let descsz = if inp.one_in(8) {
            inp.u32_near(4)
        } else {
            desc.len() as u32
        };
        v.extend_from_slice(&namesz.to_le_bytes());
        v.extend_from_slice(&descsz.to_le_bytes());
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(name);
        v.resize(v.len().next_multiple_of(4), 0);
        v.extend_from_slice(&desc);
        v.resize(v.len().next_multiple_of(4), 0);
    }
    v
}

/// A near-valid ELF64 x86-64 image.
fn elf(inp: &mut Input) -> Vec<u8> {
    let phnum = if inp.one_in(8) {
        inp.u16()
    } else {
        inp.range(1, 6) as u16
    };
    let mut f = vec![0u8; 64 + 56 * usize::from(phnum.min(8))];
    put(&mut f, 0, b"\x7fELF");
    f[4] = if inp.one_in(16) { inp.u8() } else { 2 };
    f[5] = if inp.one_in(16) { inp.u8() } else { 1 };
    let machine = if inp.one_in(16) { inp.u16() } else { 62 };
    put(&mut f, 18, &machine.to_le_bytes());
    put(
        &mut f,
        24,
        &inp.u64_near(KERNEL_MIN_GPA + 0x1000).to_le_bytes(),
    );
    let phoff = if inp.one_in(8) { inp.u64_near(64) } else { 64 };
    put(&mut f, 32, &phoff.to_le_bytes());
    let phentsize = if inp.one_in(16) { inp.u16() } else { 56 };
    put(&mut f, 54, &phentsize.to_le_bytes());
    put(&mut f, 56, &phnum.to_le_bytes());
    let mut note_segments = Vec::new();
    for i in 0..usize::from(phnum.min(8)) {
        let ph = 64 + 56 * i;
        let kind: u32 = match inp.u8() % 4 {
            0 => 4,
            1 => inp.u32_near(1),
            _ => 1,
        };
        put(&mut f, ph, &kind.to_le_bytes());
        let file_len = f.len() as u64;
        let offset = if inp.one_in(4) {
            inp.u64_near(file_len)
        } else {
            file_len
        };
        let filesz = match inp.u8() % 4 {
            0 => inp.u64_near(0x1000),
            _ => u64::from(inp.u16() % 0x2000),
        };
        let paddr = inp.u64_near(KERNEL_MIN_GPA);
        let memsz = match inp.u8() % 4 {
            0 => inp.u64_near(filesz),
            _ => filesz.wrapping_add(u64::from(inp.u16())),
        };
        put(&mut f, ph + 8, &offset.to_le_bytes());
        put(&mut f, ph + 16, &paddr.to_le_bytes());
        put(&mut f, ph + 24, &paddr.to_le_bytes());
        put(&mut f, ph + 32, &filesz.to_le_bytes());
        put(&mut f, ph + 40, &memsz.to_le_bytes());
        if kind == 4 {
            note_segments.push((ph, notes(inp)));
        }
    }
    // Note segments at the end of the file, their headers pointing at them.
    for (ph, n) in note_segments {
        if !inp.one_in(4) {
            let (off, len) = (f.len() as u64, n.len() as u64);
            put(&mut f, ph + 8, &off.to_le_bytes());
            put(&mut f, ph + 32, &len.to_le_bytes());
        }
        f.extend_from_slice(&n);
    }
    // Some payload for PT_LOAD segments.
    let payload = inp.below(0x2000) as usize;
    f.resize(f.len() + payload, 0x90);
    f
}

/// A near-valid bzImage: setup header fields, setup sectors and payload.
fn bzimage(inp: &mut Input) -> Vec<u8> {
    let mut f = inp.bytes(BZ_HEADER_END);
    let sects = if inp.bool() {
        inp.u8()
    } else {
        inp.below(8) as u8
    };
    f[0x1f1] = sects;
    put(&mut f, 0x202, b"HdrS");
    let version = if inp.one_in(4) {
        inp.u16()
    } else {
        0x020c + inp.below(4) as u16
    };
    put(&mut f, 0x206, &version.to_le_bytes());
    if !inp.one_in(4) {
        f[0x211] |= 1;
    }
    if !inp.one_in(4) {
        f[0x236] |= 1;
    }
    let code32 = if inp.one_in(4) {
        inp.u32()
    } else {
        KERNEL_MIN_GPA as u32
    };
    put(&mut f, 0x214, &code32.to_le_bytes());
    let pref = inp.u64_near(0x100_0000);
    put(&mut f, 0x258, &pref.to_le_bytes());
    let init_size = inp.u32_near(0x20_0000);
    put(&mut f, 0x260, &init_size.to_le_bytes());
    let setup = (usize::from(if sects == 0 { 4 } else { sects }) + 1) * 512;
    let len = match inp.u8() % 4 {
        0 => inp.below(setup as u32 + 2) as usize,
        _ => setup + inp.below(0x2000) as usize,
    };
    f.resize(len, 0);
    f
}

fn run(local: &Local, data: &[u8]) {
    let mut inp = Input::new(data);
    let image = match inp.u8() % 4 {
        0 => inp.rest().to_vec(),
        1 | 2 => elf(&mut inp),
        _ => bzimage(&mut inp),
    };
    std::fs::write(&local.path, &image).expect("cannot write the image file");
    let len = image.len() as u64;
    let head = &image[..image.len().min(BZ_HEADER_END)];

    let direct_bz = kernel::inspect_bzimage(head, len);
    let direct_elf = kernel::inspect(&local.path);
    if let Ok(info) = &direct_bz {
        assert!(info.load_addr >= KERNEL_MIN_GPA);
        assert_eq!(info.setup_size + info.payload_size, len);
        assert!(info.payload_size > 0);
        assert!(info.pref_address.checked_add(info.init_size).is_some());
        assert!(info.end() >= info.load_addr);
    }
    if let Ok((_, e)) = &direct_elf {
        assert!(e.start >= KERNEL_MIN_GPA && e.start < e.end);
        assert!((e.start..e.end).contains(&e.entry));
        assert!(e.pvh_entry.is_none_or(|p| (e.start..e.end).contains(&p)));
    }
    match kernel::open(&local.path) {
        Ok(KernelImage::Elf(mut file, extent)) => {
            assert_eq!(image[..4], *b"\x7fELF");
            assert_eq!(direct_elf.as_ref().ok().map(|(_, e)| *e), Some(extent));
            if extent.end <= MEM {
                let _ = kernel::load(&local.mem, &mut file);
            }
        }
        Ok(KernelImage::BzImage(mut file, info)) => {
            assert_eq!(direct_bz.as_ref().ok(), Some(&info));
            if info.load_addr.saturating_add(info.payload_size) <= MEM {
                let _ = kernel::load_bzimage(&local.mem, &mut file);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            if image.len() >= 4 && image[..4] == *b"\x7fELF" {
                assert!(
                    direct_elf.is_err(),
                    "open refused an ELF inspect accepts: {msg}"
                );
            } else if image.get(0x202..0x206) == Some(b"HdrS") {
                assert!(direct_bz.is_err(), "open refused a bzImage: {msg}");
            }
        }
    }
}
