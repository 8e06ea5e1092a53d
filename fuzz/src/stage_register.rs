//! Target 1: the stage area header and stage descriptors at REGISTER.
//!
//! Arbitrary (often near-valid) header and descriptor bytes are written at
//! an arbitrary (often valid) page of guest RAM, and REGISTER is rung. The
//! status must be exactly the one docs/stage-protocol.md §8 prescribes (an
//! independent model of the rules), an accepted area must validate and fit
//! RAM, and the names returned must be the descriptors' names (lossy UTF-8,
//! cut at the first NUL), one per declared stage.

use hypercall_abi::boot::KERNEL_MIN_GPA;
use hypercall_abi::stage::{
    Layout, Status, ABI_VERSION, AREA_FLAG_COUNTERS, AREA_FLAG_LATENCY, AREA_MAGIC,
    DOORBELL_REGISTER, DOORBELL_STATUS, DOORBELL_UNREGISTER, MAX_RING_ENTRIES, MAX_STAGES,
    MAX_VCPUS, PAGE_SIZE, RINGS_OFFSET, STAGE_DESCS_OFFSET,
};
use stage_device::stage::StageDevice;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, write_clipped, ZeroOnDrop};
use crate::input::Input;

/// Guest RAM of the target's VMs (bytes).
pub const MEM: u64 = 4 << 20;
/// The page most inputs register.
pub const AREA: u64 = 1 << 20;

thread_local! {
    static MEMORY: GuestMemoryMmap = guest_memory(MEM);
}

/// The status §8 of docs/stage-protocol.md prescribes for REGISTER of the
/// header `h` (raw bytes) at `gpa` in a VM of `vm_vcpus` vCPUs and
/// `mem_size` bytes of RAM, with no area registered yet.
pub fn expected_status(h: &[u8; 64], gpa: u64, vm_vcpus: u32, mem_size: u64) -> Status {
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    if gpa < KERNEL_MIN_GPA || gpa.checked_add(64).is_none_or(|e| e > mem_size) {
        return Status::BadRange;
    }
    let (magic, version, header_size, area_size) = (u64_at(0), u32_at(8), u32_at(12), u64_at(16));
    let (vcpus, stages, entries) = (u32_at(24), u32_at(28), u32_at(32));
    if magic != AREA_MAGIC {
        return Status::BadMagic;
    }
    if version != ABI_VERSION {
        return Status::BadVersion;
    }
    if area_size == 0 || !area_size.is_multiple_of(PAGE_SIZE) {
        return Status::BadAlignment;
    }
    if header_size != 64 || vcpus != vm_vcpus {
        return Status::BadLayout;
    }
    let counts_ok = (1..=MAX_VCPUS as u32).contains(&vcpus)
        && (1..=MAX_STAGES as u32).contains(&stages)
        && (2..=MAX_RING_ENTRIES).contains(&entries)
        && entries.is_power_of_two();
    if !counts_ok {
        return Status::BadLayout;
    }
    // u128: the model must not overflow where the VMM must not either.
    let mut used = u128::from(RINGS_OFFSET) + u128::from(vcpus) * (192 + 32 * u128::from(entries));
    if u32_at(36) & AREA_FLAG_COUNTERS != 0 {
        // Minor 2 (§5a): 768-byte counter blocks after the rings, from the
        // next 128-byte boundary.
        used = used.next_multiple_of(128) + u128::from(vcpus) * 768;
        if u32_at(36) & AREA_FLAG_LATENCY != 0 {
            // Minor 4 (§5b): 2,176-byte latency blocks after them.
            used += u128::from(vcpus) * 2176;
        }
    }
    if used > u128::from(area_size) {
        return Status::BadLayout;
    }
    if u128::from(gpa) + u128::from(area_size) > u128::from(mem_size) {
        return Status::BadRange;
    }
    Status::Ok
}

/// A 64-byte header decoded from `inp`: arbitrary bytes with each field
/// made valid for a VM of `vm_vcpus` vCPUs with some probability.
pub fn near_valid_header(inp: &mut Input, vm_vcpus: u32) -> [u8; 64] {
    let mut h: [u8; 64] = inp.array();
    // Flags stay arbitrary: a size made valid follows them (counters and
    // latency blocks or not).
    let flags = u32::from_le_bytes(h[36..40].try_into().unwrap());
    let counters = flags & AREA_FLAG_COUNTERS != 0;
    let latency = counters && flags & AREA_FLAG_LATENCY != 0;
    let fix = inp.u8();
    let mut put = |off: usize, bytes: &[u8]| h[off..off + bytes.len()].copy_from_slice(bytes);
    if fix & 1 == 0 {
        put(0, &AREA_MAGIC.to_le_bytes());
    }
    if fix & 2 == 0 {
        put(8, &ABI_VERSION.to_le_bytes());
    }
    if fix & 4 == 0 {
        put(12, &64u32.to_le_bytes());
    }
    let vcpus = if fix & 8 == 0 {
        vm_vcpus
    } else {
        inp.u32_near(vm_vcpus)
    };
    put(24, &vcpus.to_le_bytes());
    let stages = if fix & 16 == 0 {
        inp.range(1, 16)
    } else {
        inp.u32_near(16)
    };
    put(28, &stages.to_le_bytes());
    let entries = if fix & 32 == 0 {
        2u32 << inp.below(16)
    } else {
        inp.u32_near(1 << 16)
    };
    put(32, &entries.to_le_bytes());
    if fix & 64 == 0 {
        // The layout's size, a few pages more or less, or a near-page value.
        let base = Layout::new(vcpus, stages, entries)
            .map(|l| match (counters, latency) {
                (true, true) => l.with_latency(),
                (true, false) => l.with_counters(),
                _ => l,
            })
            .map_or(PAGE_SIZE, |l| l.area_size());
        let size = match inp.u8() % 4 {
            0 => base,
            1 => base.wrapping_add(PAGE_SIZE * u64::from(inp.u8() % 4)),
            2 => base.wrapping_sub(PAGE_SIZE * u64::from(inp.u8() % 4)),
            _ => base.wrapping_add(u64::from(inp.u16())),
        };
        put(16, &size.to_le_bytes());
    }
    h
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    MEMORY.with(|mem| run(mem, data));
}

fn run(mem: &GuestMemoryMmap, data: &[u8]) {
    let mut inp = Input::new(data);
    let vm_vcpus = inp.range(1, MAX_VCPUS as u32);
    let pfn: u32 = match inp.u8() % 8 {
        0 => inp.u32(),
        1 => ((MEM >> 12) as u32).wrapping_sub(u32::from(inp.u8() % 8)),
        2 => (AREA >> 12) as u32 + inp.below(MEM as u32 >> 12),
        3 => inp.below(300),
        _ => (AREA >> 12) as u32,
    };
    let gpa = u64::from(pfn) << 12;
    let header = near_valid_header(&mut inp, vm_vcpus);
    let descs = inp.bytes(32 * MAX_STAGES);
    // Header, descriptors and the stage map the device writes.
    let _clean = ZeroOnDrop::new(mem, MEM, gpa, RINGS_OFFSET);
    write_clipped(mem, MEM, gpa, &header);
    write_clipped(mem, MEM, gpa.saturating_add(STAGE_DESCS_OFFSET), &descs);

    let tsc_khz = inp.u64();
    let dev = StageDevice::new(
        std::sync::Arc::new(mem.clone()),
        MEM,
        vm_vcpus,
        tsc_khz,
        1000,
    );
    let vcpu = inp.below(vm_vcpus);
    let want = expected_status(&header, gpa, vm_vcpus, MEM);
    let registered = dev.doorbell(vcpu, DOORBELL_REGISTER, &pfn.to_le_bytes());
    let mut st = [0u8; 4];
    dev.read_status(vcpu, DOORBELL_STATUS, &mut st);
    let status = Status::from_u32(u32::from_le_bytes(st));
    assert_eq!(
        status,
        Some(want),
        "REGISTER pfn {pfn:#x} of header {header:02x?}"
    );
    assert_eq!(registered.is_some(), want == Status::Ok);
    let report = dev.report();
    assert_eq!(report.registered, want == Status::Ok);
    assert_eq!(
        report.registrations_rejected.values().sum::<u64>(),
        u64::from(want != Status::Ok)
    );
    if let Some(r) = registered {
        // Accepted: the header validates and the area fits in RAM.
        let stages = u32::from_le_bytes(header[28..32].try_into().unwrap());
        let area_size = u64::from_le_bytes(header[16..24].try_into().unwrap());
        assert!(gpa >= KERNEL_MIN_GPA && gpa + area_size <= MEM);
        assert_eq!(r.names.len(), stages as usize);
        for (id, name) in r.names.iter().enumerate() {
            let raw = &descs[32 * id..32 * id + 32];
            let end = raw.iter().position(|b| *b == 0).unwrap_or(32);
            assert_eq!(*name, String::from_utf8_lossy(&raw[..end]));
        }
        assert_eq!(report.stages.len(), stages as usize);
        let khz: u64 = mem.read_obj(GuestAddress(gpa + 40)).unwrap();
        assert_eq!(khz, tsc_khz, "REGISTER writes tsc_khz");
        // A second REGISTER is refused; the empty rings drain to nothing.
        assert!(dev
            .doorbell(vcpu, DOORBELL_REGISTER, &pfn.to_le_bytes())
            .is_none());
        assert!(dev.drain().events.is_empty());
        dev.publish(
            &[u64::MAX; MAX_STAGES],
            inp.u64(),
            hypercall_abi::stage::VisitPolicy::Cohort,
        );
        dev.doorbell(vcpu, DOORBELL_UNREGISTER, &[]);
        assert!(!dev.report().registered);
    }
}
