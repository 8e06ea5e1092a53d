//! Minimal ACPI tables for Linux guests, so a kernel without MP-table support
//! (Debian's cloud kernel has no `CONFIG_X86_MPPARSE`) finds its CPUs and the
//! I/O APIC: RSDP → XSDT → FADT (hardware-reduced, with a reset register)
//! → DSDT, and a MADT with one local APIC per vCPU (APIC ID = vCPU
//! index, as [`stagevm_arch::regs::vcpu_cpuid`] reports) and KVM's in-kernel I/O
//! APIC.
//!
//! The DSDT describes the devices with interrupts ([`Devices`]): COM1
//! (`PNP0501`) and each virtio-mmio device (`LNRO0005`, the ID Linux's
//! `virtio_mmio` driver matches), each with its I/O or MMIO range and an
//! edge-triggered, active-high GSI, as Cloud Hypervisor and Firecracker
//! describe theirs. A hardware-reduced FADT means no legacy PIC in Linux
//! (`acpi_generic_reduced_hw_init`), so no ISA IRQ is routed by default: a
//! device the DSDT does not list gets no interrupt (seen here: user-space
//! output to ttyS0 was lost and virtio-blk failed to probe with -22). rust-vmm's `acpi_tables` crate encodes the tables (headers, lengths,
//! checksums, the RSDP, XSDT and FADT layouts, the MADT's local APIC and
//! I/O APIC structures), as in Cloud Hypervisor; the few fields and
//! structures it has no API for are written into its table bytes here, each
//! with the reason. Layout and field offsets follow the ACPI 6.x
//! specification (§5.2.5 RSDP, §5.2.8 XSDT, §5.2.9 FADT, §5.2.12 MADT).
//!
//! The tables live in the reserved BIOS area (`0xe0000`, inside the e820
//! reserved range of [`crate::arch::x86_64::linux::e820_map`]), where Linux also scans for
//! the RSDP; the boot protocols pass its address too. A kernel started with
//! `acpi=off` ignores them.

use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{aml, Aml};
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
/// OEM ID, OEM table ID and OEM revision of every table (the crate sets the
/// creator ID and revision itself: `RVAT`, the rust-vmm ACPI tables crate).
const OEM_ID: [u8; 6] = *b"STAGVM";
const OEM_TABLE_ID: [u8; 8] = *b"STAGEVM ";
const OEM_REVISION: u32 = 1;
/// IA-PC boot architecture flag: VGA not present (no 8042 bit: Linux skips
/// the keyboard controller probe).
const IAPC_NO_VGA: u16 = 1 << 2;
/// MADT flag: the PC has dual 8259 PICs (KVM's in-kernel irqchip does).
const MADT_PCAT_COMPAT: u32 = 1;
/// Offsets of the MADT's two fields after the standard header (§5.2.12).
const MADT_LAPIC_ADDRESS: usize = 36;
const MADT_FLAGS: usize = 40;
/// MADT Local APIC NMI structure (§5.2.12.7): type 4, length 6, all
/// processors (0xff), flags 0 (bus-conforming polarity and trigger), LINT1 —
/// as vcpu set-up programs LINT1.
const MADT_LAPIC_NMI_LINT1: [u8; 6] = [4, 6, 0xff, 0, 0, 1];

/// The bytes of a table the crate encodes.
fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    table.to_aml_bytes(&mut v);
    v
}

/// The devices the DSDT describes (all interrupts: edge, active high, GSIs
/// of KVM's in-kernel I/O APIC, which the VMM raises through irqfds).
#[derive(Debug, Clone, Default)]
pub struct Devices {
    /// A 16550 UART: I/O port base (8 ports) and GSI.
    pub serial: Option<(u16, u32)>,
    /// virtio-mmio devices: GPA of the 4 KiB register window, its size in
    /// bytes, and the GSI.
    pub virtio_mmio: Vec<(u64, u32, u32)>,
}

/// `Device(name) { _HID, _UID, _CRS }` in AML.
fn device(name: &str, hid: &dyn Aml, uid: u32, resources: &[&dyn Aml]) -> Vec<u8> {
    let crs = aml::ResourceTemplate::new(resources.to_vec());
    bytes(&aml::Device::new(
        name.into(),
        vec![
            &aml::Name::new("_HID".into(), hid),
            &aml::Name::new("_UID".into(), &uid),
            &aml::Name::new("_CRS".into(), &crs),
        ],
    ))
}

fn dsdt(devices: &Devices) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some((port, gsi)) = devices.serial {
        let hid = aml::EISAName::new("PNP0501");
        // Interrupt(consumer, edge, active high, exclusive); IO(port, 8 ports).
        let irq = aml::Interrupt::new(true, true, false, false, gsi);
        let io = aml::IO::new(port, port, 1, 8);
        body.extend(device("COM1", &hid, 0, &[&io, &irq]));
    }
    for (i, &(base, size, gsi)) in devices.virtio_mmio.iter().enumerate() {
        // MMIO windows lie below 4 GiB (virtio::MMIO_BASE): 32-bit fixed.
        let Ok(base) = u32::try_from(base) else {
            continue;
        };
        let mem = aml::Memory32Fixed::new(true, base, size);
        let irq = aml::Interrupt::new(true, true, false, false, gsi);
        let name = format!("VR{i:02X}");
        body.extend(device(&name, &"LNRO0005", i as u32, &[&mem, &irq]));
    }
    let mut dsdt = Sdt::new(*b"DSDT", 36, 2, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    if !body.is_empty() {
        let devices = RawAml(&body);
        dsdt.append_slice(&bytes(&aml::Scope::new("\\_SB_".into(), vec![&devices])));
    }
    dsdt.as_slice().to_vec()
}

/// Bytes that are AML already (the devices, encoded one by one).
struct RawAml<'a>(&'a [u8]);

impl Aml for RawAml<'_> {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(self.0);
    }
}

fn fadt(dsdt_gpa: u64) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .flag(Flags::ResetRegSup)
        .flag(Flags::HwReducedAcpi)
        .dsdt_64(dsdt_gpa);
    // `dsdt_64` clears the 32-bit DSDT field; fill it in too, as before (the
    // DSDT lies below 1 MiB, so the address fits in 32 bits).
    fadt.dsdt = (dsdt_gpa as u32).into();
    // The builder has no setters for these, but its fields are public.
    fadt.iapc_boot_arch = IAPC_NO_VGA.into();
    // RESET_REG: system I/O port 0x64, 8 bits, value 0xfe (an i8042 reset,
    // which stagevm turns into the end of the VM).
    fadt.reset_reg = GAS::new(AddressSpace::SystemIo, 8, 0, AccessSize::ByteAccess, 0x64);
    fadt.reset_value = 0xfe;
    // FADT 6.3 (the crate defaults to minor version 5).
    fadt.fadt_minor_version = 3;
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"STAGEVM\0").into();
    bytes(&fadt.finalize())
}

fn madt(num_vcpus: u32) -> Vec<u8> {
    // The crate's `madt::MADT` fixes revision 1 and flags 0 and has no
    // Local APIC NMI structure, so, as Cloud Hypervisor does, the MADT is a
    // generic crate `Sdt` (revision 5) whose two header fields are written
    // at their offsets; the crate's `Sdt` keeps length and checksum.
    let mut madt = Sdt::new(*b"APIC", 44, 5, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    madt.write_u32(MADT_LAPIC_ADDRESS, LAPIC_BASE);
    madt.write_u32(MADT_FLAGS, MADT_PCAT_COMPAT);
    let mut entries = Vec::new();
    for cpu in 0..num_vcpus {
        // ACPI processor UID = APIC ID = vCPU index.
        let lapic = ProcessorLocalApic::new(cpu as u8, cpu as u8, EnabledStatus::Enabled);
        lapic.to_aml_bytes(&mut entries);
    }
    IoApic::new(IOAPIC_ID, IOAPIC_BASE, 0).to_aml_bytes(&mut entries);
    // The crate has no x86 Local APIC NMI structure: its bytes by hand.
    entries.extend_from_slice(&MADT_LAPIC_NMI_LINT1);
    madt.append_slice(&entries);
    madt.as_slice().to_vec()
}

fn xsdt(entries: &[u64]) -> Vec<u8> {
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for e in entries {
        xsdt.add_entry(*e);
    }
    bytes(&xsdt)
}

fn rsdp(xsdt_gpa: u64) -> Vec<u8> {
    // Revision 2 (ACPI 2.0+), no RSDT, both checksums.
    bytes(&Rsdp::new(OEM_ID, xsdt_gpa))
}

/// Writes the tables for `num_vcpus` vCPUs and `devices`; returns the RSDP's
/// GPA. Errors: guest RAM does not reach the BIOS area (it always does:
/// Linux boots need far more than 1 MiB), or the MADT of this many vCPUs
/// does not fit.
pub fn write_tables(
    mem: &GuestMemoryMmap,
    num_vcpus: u32,
    devices: &Devices,
) -> Result<u64, GuestMemoryError> {
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
    let dsdt_gpa = place(dsdt(devices))?;
    let fadt_gpa = place(fadt(dsdt_gpa))?;
    let madt_gpa = place(madt(num_vcpus))?;
    mem.write_slice(&xsdt(&[fadt_gpa, madt_gpa]), GuestAddress(XSDT_GPA))?;
    mem.write_slice(&rsdp(XSDT_GPA), GuestAddress(RSDP_GPA))?;
    Ok(RSDP_GPA)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand encoding this module used before the crate, kept to check
    /// that the crate's tables carry the same fields.
    mod hand {
        fn header(sig: &[u8; 4], len: u32, revision: u8) -> Vec<u8> {
            let mut t = Vec::new();
            t.extend_from_slice(sig);
            t.extend_from_slice(&len.to_le_bytes());
            t.extend_from_slice(&[revision, 0]);
            t.extend_from_slice(b"STAGVMSTAGEVM ");
            t.extend_from_slice(&1u32.to_le_bytes());
            t.extend_from_slice(b"SVMM");
            t.extend_from_slice(&1u32.to_le_bytes());
            t
        }

        fn fix_checksum(bytes: &mut [u8], at: usize) {
            bytes[at] = 0;
            let sum = bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b));
            bytes[at] = 0u8.wrapping_sub(sum);
        }

        fn finish(mut t: Vec<u8>) -> Vec<u8> {
            let len = t.len() as u32;
            t[4..8].copy_from_slice(&len.to_le_bytes());
            fix_checksum(&mut t, 9);
            t
        }

        pub fn dsdt() -> Vec<u8> {
            finish(header(b"DSDT", 36, 2))
        }

        pub fn fadt(dsdt_gpa: u64) -> Vec<u8> {
            let mut t = header(b"FACP", 276, 6);
            t.resize(276, 0);
            t[40..44].copy_from_slice(&(dsdt_gpa as u32).to_le_bytes());
            t[109..111].copy_from_slice(&(1u16 << 2).to_le_bytes());
            let flags: u32 = (1 << 4) | (1 << 5) | (1 << 10) | (1 << 20);
            t[112..116].copy_from_slice(&flags.to_le_bytes());
            t[116..120].copy_from_slice(&[1, 8, 0, 1]);
            t[120..128].copy_from_slice(&0x64u64.to_le_bytes());
            t[128] = 0xfe;
            t[131] = 3;
            t[140..148].copy_from_slice(&dsdt_gpa.to_le_bytes());
            t[268..276].copy_from_slice(b"STAGEVM\0");
            finish(t)
        }

        pub fn madt(num_vcpus: u32) -> Vec<u8> {
            let mut t = header(b"APIC", 0, 5);
            t.extend_from_slice(&0xfee0_0000u32.to_le_bytes());
            t.extend_from_slice(&1u32.to_le_bytes());
            for cpu in 0..num_vcpus {
                t.extend_from_slice(&[0, 8, cpu as u8, cpu as u8]);
                t.extend_from_slice(&1u32.to_le_bytes());
            }
            t.extend_from_slice(&[1, 12, 0, 0]);
            t.extend_from_slice(&0xfec0_0000u32.to_le_bytes());
            t.extend_from_slice(&0u32.to_le_bytes());
            t.extend_from_slice(&[4, 6, 0xff, 0, 0, 1]);
            finish(t)
        }

        pub fn xsdt(entries: &[u64]) -> Vec<u8> {
            let mut t = header(b"XSDT", 0, 1);
            for e in entries {
                t.extend_from_slice(&e.to_le_bytes());
            }
            finish(t)
        }

        pub fn rsdp(xsdt_gpa: u64) -> Vec<u8> {
            let mut r = b"RSD PTR \0STAGVM\x02".to_vec();
            r.extend_from_slice(&0u32.to_le_bytes());
            r.extend_from_slice(&36u32.to_le_bytes());
            r.extend_from_slice(&xsdt_gpa.to_le_bytes());
            r.extend_from_slice(&[0; 4]);
            fix_checksum(&mut r[..20], 8);
            fix_checksum(&mut r, 32);
            r
        }
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    fn read(mem: &GuestMemoryMmap, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
        v
    }

    fn u32_at(t: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(t[at..at + 4].try_into().unwrap())
    }

    fn u64_at(t: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(t[at..at + 8].try_into().unwrap())
    }

    fn guest_mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap()
    }

    #[test]
    fn tables_link_up_and_check_out() {
        let mem = guest_mem();
        let rsdp_gpa = write_tables(&mem, 3, &Devices::default()).unwrap();
        assert_eq!(rsdp_gpa, RSDP_GPA);
        let rsdp = read(&mem, rsdp_gpa, 36);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(rsdp[15], 2, "RSDP revision");
        assert_eq!(sum(&rsdp[..20]), 0);
        assert_eq!(sum(&rsdp), 0);
        let xsdt_gpa = u64_at(&rsdp, 24);
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
        assert_eq!(entries.len(), 2);
        assert!(entries.iter().all(|e| *e < TABLES_END));

        let fadt = table(entries[0]);
        assert_eq!((&fadt[..4], fadt.len()), (&b"FACP"[..], 276));
        assert_eq!((fadt[8], fadt[131]), (6, 3), "FADT version 6.3");
        let dsdt_gpa = u64_at(&fadt, 140);
        assert_eq!(u32_at(&fadt, 40) as u64, dsdt_gpa, "DSDT and X_DSDT");
        let dsdt = table(dsdt_gpa);
        assert_eq!((&dsdt[..4], dsdt.len()), (&b"DSDT"[..], 36));
        // Flags: PWR_BUTTON, SLP_BUTTON, RESET_REG_SUP, HW_REDUCED_ACPI.
        let flags = (1 << 4) | (1 << 5) | (1 << 10) | (1 << 20);
        assert_eq!(u32_at(&fadt, 112), flags);
        assert_eq!(&fadt[109..111], &[1 << 2, 0], "IAPC_BOOT_ARCH: no VGA");
        // RESET_REG: system I/O, 8 bits at bit 0, byte access, port 0x64.
        assert_eq!(&fadt[116..120], &[1, 8, 0, 1]);
        assert_eq!(u64_at(&fadt, 120), 0x64);
        assert_eq!(fadt[128], 0xfe, "RESET_VALUE");
        assert_eq!(&fadt[268..276], b"STAGEVM\0");

        let madt = table(entries[1]);
        assert_eq!((&madt[..4], madt[8]), (&b"APIC"[..], 5));
        assert_eq!(u32_at(&madt, 36), LAPIC_BASE);
        assert_eq!(u32_at(&madt, 40), MADT_PCAT_COMPAT);
        // Three enabled local APICs with UIDs and IDs 0, 1, 2...
        for (cpu, e) in madt[44..44 + 24].chunks(8).enumerate() {
            assert_eq!(&e[..4], &[0, 8, cpu as u8, cpu as u8]);
            assert_eq!(u32_at(e, 4), 1, "local APIC {cpu} enabled");
        }
        // ... then the I/O APIC (ID 0, KVM's base, GSI base 0) ...
        let ioapic = &madt[44 + 24..44 + 36];
        assert_eq!(&ioapic[..4], &[1, 12, IOAPIC_ID, 0]);
        assert_eq!((u32_at(ioapic, 4), u32_at(ioapic, 8)), (IOAPIC_BASE, 0));
        // ... and the NMI on every CPU's LINT1, ending the table.
        assert_eq!(&madt[44 + 36..], &[4, 6, 0xff, 0, 0, 1]);
    }

    #[test]
    fn one_local_apic_per_vcpu() {
        for n in [1, 2, 8, 64] {
            let m = madt(n);
            assert_eq!(m.len(), 44 + 8 * n as usize + 12 + 6);
            assert_eq!(sum(&m), 0);
            let ids: Vec<u8> = m[44..44 + 8 * n as usize].chunks(8).map(|e| e[3]).collect();
            assert_eq!(ids, (0..n as u8).collect::<Vec<_>>());
        }
    }

    /// Every byte matches the former hand encoding, but for the creator ID
    /// and revision (the crate's own, `RVAT`) and so the checksum.
    #[test]
    fn same_fields_as_hand_encoding() {
        let same_but_creator = |new: Vec<u8>, old: Vec<u8>| {
            let sig = String::from_utf8_lossy(&old[..4]).into_owned();
            assert_eq!(new.len(), old.len(), "{sig} length");
            assert_eq!(&new[28..32], b"RVAT", "{sig} creator ID");
            for (at, (n, o)) in new.iter().zip(&old).enumerate() {
                if at != 9 && !(28..36).contains(&at) {
                    assert_eq!(n, o, "{sig} byte {at}");
                }
            }
        };
        same_but_creator(dsdt(&Devices::default()), hand::dsdt());
        same_but_creator(fadt(0xe_0120), hand::fadt(0xe_0120));
        for n in [1, 3, 255] {
            same_but_creator(madt(n), hand::madt(n));
        }
        same_but_creator(
            xsdt(&[0xe_0150, 0xe_0240]),
            hand::xsdt(&[0xe_0150, 0xe_0240]),
        );
        // The RSDP has no creator field: byte for byte the same.
        assert_eq!(rsdp(XSDT_GPA), hand::rsdp(XSDT_GPA));
    }

    #[test]
    fn tables_stay_in_the_bios_area() {
        // A MADT this large would run past 1 MiB.
        assert!(write_tables(&guest_mem(), 100_000, &Devices::default()).is_err());
        // Guest RAM that does not reach the BIOS area.
        let small = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 512 << 10)]).unwrap();
        assert!(write_tables(&small, 1, &Devices::default()).is_err());
    }

    /// COM1 and a virtio-mmio device in the DSDT, as Linux's ACPI namespace
    /// reads them: `\_SB_.COM1` with `_HID` EISA ID PNP0501 (compressed:
    /// `41 d0 05 01`), an I/O descriptor for 8 ports at 0x3f8 and an
    /// extended interrupt descriptor for GSI 4 (edge, active high, consumer:
    /// flags 0x03); `\_SB_.VR00` with `_HID` "LNRO0005", a 32-bit fixed
    /// memory descriptor (read-write) for its window and GSI 5.
    #[test]
    fn dsdt_describes_serial_and_virtio_mmio() {
        let devices = Devices {
            serial: Some((0x3f8, 4)),
            virtio_mmio: vec![(0xd000_0000, 0x1000, 5)],
        };
        let t = dsdt(&devices);
        assert_eq!(sum(&t), 0);
        assert_eq!(u32_at(&t, 4) as usize, t.len());
        let find = |needle: &[u8]| t.windows(needle.len()).position(|w| w == needle);
        let scope = find(b"_SB_").expect("\\_SB_ scope");
        let com1 = find(b"COM1").expect("COM1");
        let vr00 = find(b"VR00").expect("VR00");
        assert!(scope < com1 && com1 < vr00);
        // _HID: DWordPrefix (0x0c) and PNP0501 compressed.
        assert!(find(&[b'_', b'H', b'I', b'D', 0x0c, 0x41, 0xd0, 0x05, 0x01]).is_some());
        // IO descriptor (0x47): 16-bit decode, 0x3f8..0x3f8, align 1, 8 ports.
        assert!(find(&[0x47, 0x01, 0xf8, 0x03, 0xf8, 0x03, 0x01, 0x08]).is_some());
        // Extended interrupt descriptors (0x89, length 6, flags 3, 1 GSI).
        assert!(find(&[0x89, 6, 0, 0x03, 1, 4, 0, 0, 0]).is_some());
        assert!(find(&[0x89, 6, 0, 0x03, 1, 5, 0, 0, 0]).is_some());
        assert!(find(b"LNRO0005\0").is_some());
        // Memory32Fixed (0x86, length 9, read-write): base and length.
        let mut mem = vec![0x86, 9, 0, 1];
        mem.extend_from_slice(&0xd000_0000u32.to_le_bytes());
        mem.extend_from_slice(&0x1000u32.to_le_bytes());
        assert!(find(&mem).is_some());
        // Only the devices asked for.
        assert!(dsdt(&Devices::default()).len() == 36);
        let only_serial = dsdt(&Devices {
            serial: Some((0x3f8, 4)),
            virtio_mmio: vec![],
        });
        assert!(!only_serial.windows(4).any(|w| w == b"VR00"));
    }
}
