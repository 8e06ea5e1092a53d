//! Guest-virtual to guest-physical translation by walking the guest's page
//! tables, for failure reports (the instruction bytes at `RIP`).
//!
//! Handles every x86 paging mode a guest may be in when it fails: paging off
//! (real or protected mode), 32-bit paging (with 4 MiB pages when `CR4.PSE`),
//! PAE paging, and 4- or 5-level (`CR4.LA57`) long-mode paging with 1 GiB and
//! 2 MiB pages (Intel SDM Vol. 3A chapter 4).

use kvm_bindings::kvm_sregs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use stagevm_arch::regs::{
    CR0_PE, CR0_PG, CR4_LA57, CR4_PAE, CR4_PSE, EFER_LMA, PTE_ADDR_MASK as ADDR_MASK,
    PTE_HUGE as PAGE_SIZE_BIT, PTE_PRESENT as PRESENT,
};

/// The control registers that decide how a guest translates addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paging {
    /// `CR0`.
    pub cr0: u64,
    /// `CR3`.
    pub cr3: u64,
    /// `CR4`.
    pub cr4: u64,
    /// `IA32_EFER`.
    pub efer: u64,
}

impl Paging {
    /// The paging state of a vCPU.
    pub fn from_sregs(sregs: &kvm_sregs) -> Self {
        Self {
            cr0: sregs.cr0,
            cr3: sregs.cr3,
            cr4: sregs.cr4,
            efer: sregs.efer,
        }
    }

    /// A short name of the mode: "real mode", "protected mode, paging off",
    /// "32-bit paging", "PAE paging", "4-level paging", "5-level paging".
    pub fn describe(&self) -> &'static str {
        if self.cr0 & CR0_PE == 0 {
            "real mode"
        } else if self.cr0 & CR0_PG == 0 {
            "protected mode, paging off"
        } else if self.efer & EFER_LMA != 0 {
            if self.cr4 & CR4_LA57 != 0 {
                "5-level paging"
            } else {
                "4-level paging"
            }
        } else if self.cr4 & CR4_PAE != 0 {
            "PAE paging"
        } else {
            "32-bit paging"
        }
    }

    /// Translates linear address `la` to a GPA. `read(gpa, size)` reads a
    /// little-endian page-table entry of 4 or 8 bytes (`None` outside RAM).
    /// The error says at which level the walk stopped.
    pub fn translate(
        &self,
        la: u64,
        read: impl Fn(u64, usize) -> Option<u64>,
    ) -> Result<u64, GvaError> {
        let entry = |gpa: u64, size: usize, level: &'static str| {
            let e = read(gpa, size).ok_or(GvaError::EntryOutsideRam { level, gpa })?;
            if e & PRESENT == 0 {
                return Err(GvaError::NotPresent {
                    level,
                    entry: e,
                    gpa,
                    la,
                });
            }
            Ok(e)
        };
        if self.cr0 & CR0_PG == 0 {
            return Ok(la & 0xffff_ffff);
        }
        if self.efer & EFER_LMA != 0 {
            let levels = if self.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
            let mut table = self.cr3 & ADDR_MASK;
            for level in (1..=levels).rev() {
                let shift = 12 + 9 * (level - 1);
                let e = entry(
                    table + 8 * ((la >> shift) & 511),
                    8,
                    ["PTE", "PDE", "PDPTE", "PML4E", "PML5E"][level as usize - 1],
                )?;
                if level == 1 || (level <= 3 && e & PAGE_SIZE_BIT != 0) {
                    let mask = (1u64 << shift) - 1;
                    return Ok((e & ADDR_MASK & !mask) | (la & mask));
                }
                table = e & ADDR_MASK;
            }
            unreachable!("the level-1 entry returns");
        }
        let la = la & 0xffff_ffff;
        if self.cr4 & CR4_PAE != 0 {
            let pdpte = entry((self.cr3 & 0xffff_ffe0) + 8 * (la >> 30), 8, "PDPTE")?;
            let pde = entry((pdpte & ADDR_MASK) + 8 * ((la >> 21) & 511), 8, "PDE")?;
            if pde & PAGE_SIZE_BIT != 0 {
                return Ok((pde & ADDR_MASK & !0x1f_ffff) | (la & 0x1f_ffff));
            }
            let pte = entry((pde & ADDR_MASK) + 8 * ((la >> 12) & 511), 8, "PTE")?;
            return Ok((pte & ADDR_MASK) | (la & 0xfff));
        }
        let pde = entry((self.cr3 & 0xffff_f000) + 4 * (la >> 22), 4, "PDE")?;
        if pde & PAGE_SIZE_BIT != 0 && self.cr4 & CR4_PSE != 0 {
            return Ok((pde & 0xffc0_0000) | (la & 0x3f_ffff));
        }
        let pte = entry((pde & 0xffff_f000) + 4 * ((la >> 12) & 1023), 4, "PTE")?;
        Ok((pte & 0xffff_f000) | (la & 0xfff))
    }
}

/// Why a linear address has no GPA (in a failure report: where the walk
/// of the guest's own page tables stopped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GvaError {
    /// A paging-structure entry lies outside guest RAM.
    #[error("{level} entry at GPA {gpa:#x} is outside RAM")]
    EntryOutsideRam {
        /// The structure (`PML4E`, `PDE`, …).
        level: &'static str,
        /// Its entry's GPA.
        gpa: u64,
    },
    /// A paging-structure entry is not present.
    #[error("{level} entry {entry:#x} at GPA {gpa:#x} is not present for {la:#x}")]
    NotPresent {
        /// The structure (`PML4E`, `PDE`, …).
        level: &'static str,
        /// The entry's value.
        entry: u64,
        /// Its GPA.
        gpa: u64,
        /// The linear address translated.
        la: u64,
    },
    /// The code's first byte translates to a GPA outside RAM.
    #[error("code GPA {gpa:#x} is outside RAM")]
    CodeOutsideRam {
        /// The GPA.
        gpa: u64,
    },
}

/// Reads up to `buf.len()` bytes of code at `rip` of a vCPU in state
/// `sregs`: the linear address is `RIP` in 64-bit mode and `CS.base + RIP`
/// otherwise, translated page by page. Returns the GPA of the first byte and
/// the number of bytes read (fewer than asked when the code runs into an
/// unmapped page); the error says why not even the first byte was readable.
pub fn read_code(
    mem: &GuestMemoryMmap,
    sregs: &kvm_sregs,
    rip: u64,
    buf: &mut [u8],
) -> Result<(u64, usize), GvaError> {
    let paging = Paging::from_sregs(sregs);
    let long = paging.efer & EFER_LMA != 0 && sregs.cs.l == 1;
    let la = if long {
        rip
    } else {
        sregs.cs.base.wrapping_add(rip) & 0xffff_ffff
    };
    let read = |gpa: u64, size: usize| -> Option<u64> {
        let mut raw = [0u8; 8];
        mem.read_slice(&mut raw[..size], GuestAddress(gpa)).ok()?;
        Some(u64::from_le_bytes(raw))
    };
    let mut first = None;
    let mut done = 0;
    while done < buf.len() {
        let at = la.wrapping_add(done as u64);
        let gpa = match paging.translate(at, read) {
            Ok(gpa) => gpa,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        first.get_or_insert(gpa);
        let chunk = ((4096 - (at & 0xfff)) as usize).min(buf.len() - done);
        if mem
            .read_slice(&mut buf[done..done + chunk], GuestAddress(gpa))
            .is_err()
        {
            if done == 0 {
                return Err(GvaError::CodeOutsideRam { gpa });
            }
            break;
        }
        done += chunk;
    }
    Ok((first.unwrap_or(0), done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reader(map: &HashMap<u64, u64>) -> impl Fn(u64, usize) -> Option<u64> + '_ {
        move |gpa, _| Some(*map.get(&gpa).unwrap_or(&0))
    }

    #[test]
    fn paging_off_is_identity() {
        let p = Paging {
            cr0: CR0_PE,
            ..Default::default()
        };
        assert_eq!(p.translate(0x1234_5678, |_, _| None), Ok(0x1234_5678));
        assert_eq!(p.describe(), "protected mode, paging off");
    }

    #[test]
    fn four_level_with_4k_and_2m_pages() {
        let la = 0xffff_ffff_8100_1234u64;
        let mut m = HashMap::new();
        m.insert(0x1000 + 8 * ((la >> 39) & 511), 0x2000 | 1);
        m.insert(0x2000 + 8 * ((la >> 30) & 511), 0x3000 | 1);
        m.insert(0x3000 + 8 * ((la >> 21) & 511), 0x4000 | 1);
        m.insert(0x4000 + 8 * ((la >> 12) & 511), 0x0777_7000 | 1);
        let p = Paging {
            cr0: CR0_PE | CR0_PG,
            cr3: 0x1000,
            cr4: CR4_PAE,
            efer: EFER_LMA,
        };
        assert_eq!(p.translate(la, reader(&m)), Ok(0x0777_7234));
        // Turn the PDE into a 2 MiB page.
        m.insert(0x3000 + 8 * ((la >> 21) & 511), 0x0100_0000 | 0x81);
        assert_eq!(p.translate(la, reader(&m)), Ok(0x0100_1234));
        let e = p.translate(0x7000_0000_0000, reader(&m)).unwrap_err();
        assert!(
            matches!(e, GvaError::NotPresent { level: "PML4E", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("PML4E entry 0x0 at GPA"), "{e}");
    }

    #[test]
    fn pae_and_32_bit() {
        let la = 0xc010_2345u64;
        let mut m = HashMap::new();
        m.insert(0x1000 + 8 * 3, 0x2000 | 1);
        m.insert(0x2000 + 8 * ((la >> 21) & 511), 0x0060_0000 | 0x81);
        let pae = Paging {
            cr0: CR0_PE | CR0_PG,
            cr3: 0x1000,
            cr4: CR4_PAE,
            efer: 0,
        };
        assert_eq!(pae.translate(la, reader(&m)), Ok(0x0070_2345));
        let mut m = HashMap::new();
        m.insert(0x1000 + 4 * (la >> 22), 0x0080_0000 | 0x81);
        let pse = Paging {
            cr0: CR0_PE | CR0_PG,
            cr3: 0x1000,
            cr4: CR4_PSE,
            efer: 0,
        };
        assert_eq!(pse.translate(la, reader(&m)), Ok(0x0090_2345));
    }
}
