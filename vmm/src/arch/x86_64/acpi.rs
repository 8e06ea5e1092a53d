//! Minimal ACPI tables for Linux guests, so a kernel without MP-table support
//! (Debian's cloud kernel has no `CONFIG_X86_MPPARSE`) finds its CPUs and the
//! I/O APIC: RSDP → XSDT → FADT (hardware-reduced, with a reset register)
//! → empty DSDT, and a MADT with one local APIC per vCPU (APIC ID = vCPU
//! index, as [`crate::arch::x86_64::regs::vcpu_cpuid`] reports) and KVM's in-kernel I/O
//! APIC. Layout and field offsets follow the ACPI 6.x specification
//! (§5.2.5 RSDP, §5.2.8 XSDT, §5.2.9 FADT, §5.2.12 MADT), as Cloud Hypervisor
//! writes them.
//!
//! The tables live in the reserved BIOS area (`0xe0000`, inside the e820
//! reserved range of [`crate::arch::x86_64::linux::e820_map`]), where Linux also scans for
//! the RSDP; the boot protocols pass its address too. A kernel started with
//! `acpi=off` ignores them.

use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// GPA of the RSDP.
pub const RSDP_GPA: u64 = 0xe_0000;
/// GPA of the XSDT; the other tables follow it.
const XSDT_GPA: u64 = RSDP_GPA + 0x40;
/// End of the area the tables may use (the BIOS area ends at 1 MiB).
const TABLES_END: u64 = 0x10_0000;
/// Local APIC and I/O APIC MMIO bases (KVM's in-kernel defaults).
const LAPIC_BASE: u32 = 0xfee0_0000;
const IOAPIC_BASE: u32 = 0xfec0_0000;
/// I/O APIC ID (after the vCPUs' APIC IDs in xAPIC mode is not required;
/// Cloud Hypervisor and QEMU use 0 for a single I/O APIC too).
const IOAPIC_ID: u8 = 0;
/// FADT flags (§5.2.9, table 5.10).
const FADT_PWR_BUTTON: u32 = 1 << 4;
const FADT_SLP_BUTTON: u32 = 1 << 5;
const FADT_RESET_REG_SUP: u32 = 1 << 10;
const FADT_HW_REDUCED_ACPI: u32 = 1 << 20;
/// IA-PC boot architecture flag: VGA not present (no 8042 bit: Linux skips
/// the keyboard controller probe).
const IAPC_NO_VGA: u16 = 1 << 2;
/// MADT flag: the PC has dual 8259 PICs (KVM's in-kernel irqchip does).
const MADT_PCAT_COMPAT: u32 = 1;

/// Writes a standard 36-byte table header; the checksum is fixed later.
fn header(sig: &[u8; 4], len: u32, revision: u8) -> Vec<u8> {
    let mut t = Vec::with_capacity(len as usize);
    t.extend_from_slice(sig);
    t.extend_from_slice(&len.to_le_bytes());
    t.push(revision);
    t.push(0); // checksum
    t.extend_from_slice(b"STAGVM"); // OEM ID
    t.extend_from_slice(b"STAGEVM "); // OEM table ID
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(b"SVMM"); // creator ID
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t
}

/// Sets byte `at` so that `bytes` sums to zero (mod 256).
fn fix_checksum(bytes: &mut [u8], at: usize) {
    bytes[at] = 0;
    let sum = bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    bytes[at] = 0u8.wrapping_sub(sum);
}

/// A finished table: length field and checksum set.
fn finish(mut t: Vec<u8>) -> Vec<u8> {
    let len = t.len() as u32;
    t[4..8].copy_from_slice(&len.to_le_bytes());
    fix_checksum(&mut t, 9);
    t
}

fn dsdt() -> Vec<u8> {
    // No AML: no devices beyond what the FADT and MADT describe.
    finish(header(b"DSDT", 36, 2))
}

fn fadt(dsdt_gpa: u64) -> Vec<u8> {
    let mut t = header(b"FACP", 276, 6);
    t.resize(276, 0);
    t[40..44].copy_from_slice(&(dsdt_gpa as u32).to_le_bytes()); // DSDT
    t[109..111].copy_from_slice(&IAPC_NO_VGA.to_le_bytes()); // IAPC_BOOT_ARCH
    let flags = FADT_PWR_BUTTON | FADT_SLP_BUTTON | FADT_RESET_REG_SUP | FADT_HW_REDUCED_ACPI;
    t[112..116].copy_from_slice(&flags.to_le_bytes());
    // RESET_REG: system I/O port 0x64, 8 bits, value 0xfe (an i8042 reset,
    // which stagevm turns into the end of the VM).
    t[116] = 1; // address space: system I/O
    t[117] = 8; // bit width
    t[118] = 0; // bit offset
    t[119] = 1; // access size: byte
    t[120..128].copy_from_slice(&0x64u64.to_le_bytes());
    t[128] = 0xfe; // RESET_VALUE
    t[131] = 3; // FADT minor version (6.3)
    t[140..148].copy_from_slice(&dsdt_gpa.to_le_bytes()); // X_DSDT
    t[268..276].copy_from_slice(b"STAGEVM\0"); // hypervisor vendor identity
    finish(t)
}

fn madt(num_vcpus: u32) -> Vec<u8> {
    let mut t = header(b"APIC", 0, 5);
    t.extend_from_slice(&LAPIC_BASE.to_le_bytes());
    t.extend_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    for cpu in 0..num_vcpus {
        // Processor local APIC: type 0, length 8, ACPI processor UID, APIC
        // ID, flags (enabled).
        t.extend_from_slice(&[0, 8, cpu as u8, cpu as u8]);
        t.extend_from_slice(&1u32.to_le_bytes());
    }
    // I/O APIC: type 1, length 12, ID, reserved, address, GSI base 0.
    t.extend_from_slice(&[1, 12, IOAPIC_ID, 0]);
    t.extend_from_slice(&IOAPIC_BASE.to_le_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    // Local APIC NMI: type 4, length 6, all processors (0xff), flags 0,
    // LINT1 — as vcpu set-up programs LINT1.
    t.extend_from_slice(&[4, 6, 0xff, 0, 0, 1]);
    finish(t)
}

fn xsdt(entries: &[u64]) -> Vec<u8> {
    let mut t = header(b"XSDT", 0, 1);
    for e in entries {
        t.extend_from_slice(&e.to_le_bytes());
    }
    finish(t)
}

fn rsdp(xsdt_gpa: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(36);
    r.extend_from_slice(b"RSD PTR ");
    r.push(0); // checksum of the first 20 bytes
    r.extend_from_slice(b"STAGVM");
    r.push(2); // revision: ACPI 2.0+
    r.extend_from_slice(&0u32.to_le_bytes()); // no RSDT
    r.extend_from_slice(&36u32.to_le_bytes());
    r.extend_from_slice(&xsdt_gpa.to_le_bytes());
    r.push(0); // extended checksum
    r.extend_from_slice(&[0; 3]);
    fix_checksum(&mut r[..20], 8);
    fix_checksum(&mut r, 32);
    r
}

/// Writes the tables for `num_vcpus` vCPUs; returns the RSDP's GPA. Errors:
/// guest RAM does not reach the BIOS area (it always does: Linux boots need
/// far more than 1 MiB), or the MADT of this many vCPUs does not fit.
pub fn write_tables(mem: &GuestMemoryMmap, num_vcpus: u32) -> Result<u64, GuestMemoryError> {
    let mut at = XSDT_GPA + 0x40; // room for an XSDT of a few entries
    let mut place = |table: Vec<u8>| -> Result<u64, GuestMemoryError> {
        let gpa = at;
        if gpa + table.len() as u64 > TABLES_END {
            return Err(GuestMemoryError::InvalidGuestAddress(GuestAddress(gpa)));
        }
        mem.write_slice(&table, GuestAddress(gpa))?;
        at = (gpa + table.len() as u64).next_multiple_of(16);
        Ok(gpa)
    };
    let dsdt_gpa = place(dsdt())?;
    let fadt_gpa = place(fadt(dsdt_gpa))?;
    let madt_gpa = place(madt(num_vcpus))?;
    mem.write_slice(&xsdt(&[fadt_gpa, madt_gpa]), GuestAddress(XSDT_GPA))?;
    mem.write_slice(&rsdp(XSDT_GPA), GuestAddress(RSDP_GPA))?;
    Ok(RSDP_GPA)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    fn read(mem: &GuestMemoryMmap, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
        v
    }

    #[test]
    fn tables_link_up_and_check_out() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let rsdp_gpa = write_tables(&mem, 3).unwrap();
        let rsdp = read(&mem, rsdp_gpa, 36);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[..20]), 0);
        assert_eq!(sum(&rsdp), 0);
        let xsdt_gpa = u64::from_le_bytes(rsdp[24..32].try_into().unwrap());
        let table = |gpa: u64| {
            let len = u32::from_le_bytes(read(&mem, gpa + 4, 4).try_into().unwrap());
            let t = read(&mem, gpa, len as usize);
            assert_eq!(
                sum(&t),
                0,
                "checksum of {}",
                String::from_utf8_lossy(&t[..4])
            );
            t
        };
        let xsdt = table(xsdt_gpa);
        assert_eq!(&xsdt[..4], b"XSDT");
        let entries: Vec<u64> = xsdt[36..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let fadt = table(entries[0]);
        assert_eq!((&fadt[..4], fadt.len()), (&b"FACP"[..], 276));
        let dsdt = table(u64::from_le_bytes(fadt[140..148].try_into().unwrap()));
        assert_eq!(&dsdt[..4], b"DSDT");
        let madt = table(entries[1]);
        assert_eq!(&madt[..4], b"APIC");
        // Three local APICs with IDs 0, 1, 2, then the I/O APIC.
        let lapics: Vec<u8> = madt[44..]
            .chunks(8)
            .take(3)
            .map(|e| {
                assert_eq!(&e[..2], &[0, 8]);
                e[3]
            })
            .collect();
        assert_eq!(lapics, [0, 1, 2]);
        assert_eq!(&madt[44 + 24..44 + 26], &[1, 12]);
        assert!(entries.iter().all(|e| *e < TABLES_END));
    }
}
