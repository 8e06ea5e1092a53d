//! Emulation assists for Linux guests on a KVM whose kernel-mode emulator
//! fails on two instructions Linux cannot avoid (`kvm_pvm` on the project's
//! machines; dead code on hardware KVM, where the CPU runs them), and the
//! register description every failure report starts with.
//!
//! * `int3` (`0xcc`; Linux runs one in `int3_selftest()` at boot and more
//!   when it patches code): `RIP` moves past it and `#BP` is injected
//!   through `KVM_SET_VCPU_EVENTS`, which is what the CPU does for this
//!   trap (Intel SDM Vol. 3A §6.15, interrupt 3);
//! * `fwait` (`0x9b`; in `fpu__drop()` on every exec and thread exit): a
//!   no-op unless an x87 exception is pending (FSW.ES, Intel SDM Vol. 1
//!   §8.1.3), so `RIP` moves past it; with one pending it is left to fail.

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::GuestMemoryMmap;

/// The `int3` opcode and the `#BP` vector.
pub const INT3: u8 = 0xcc;
const BP_VECTOR: u8 = 3;
/// The `fwait` opcode and the x87 status word's exception-summary bit.
pub const FWAIT: u8 = 0x9b;
const FSW_ES: u16 = 1 << 7;

/// Completes the instruction at `RIP` after a `KVM_EXIT_INTERNAL_ERROR`
/// when it is one of the module's two; returns its opcode and `RIP`, or `None`,
/// changing nothing, for any other failure or instruction (then the guest
/// failed). `memory` is read through the guest's page tables.
pub fn assist(fd: &mut VcpuFd, memory: &GuestMemoryMmap) -> Option<(u8, u64)> {
    // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member is the
    // one KVM filled in.
    let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    if internal.suberror != kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
        return None;
    }
    let (mut regs, sregs) = (fd.get_regs().ok()?, fd.get_sregs().ok()?);
    let mut byte = [0u8; 1];
    if !matches!(
        super::gva::read_code(memory, &sregs, regs.rip, &mut byte),
        Ok((_, 1))
    ) {
        return None;
    }
    let rip = regs.rip;
    regs.rip += 1;
    let done = match byte[0] {
        INT3 => {
            let mut events = fd.get_vcpu_events().ok()?;
            if events.exception.injected != 0 || events.exception.pending != 0 {
                return None;
            }
            events.exception.injected = 1;
            events.exception.nr = BP_VECTOR;
            events.exception.has_error_code = 0;
            events.exception.error_code = 0;
            // Leave NMI, SIPI, shadow and SMM state as they are.
            events.flags = 0;
            fd.set_regs(&regs).is_ok() && fd.set_vcpu_events(&events).is_ok()
        }
        FWAIT => {
            if fd.get_fpu().ok()?.fsw & FSW_ES != 0 {
                return None;
            }
            fd.set_regs(&regs).is_ok()
        }
        _ => return None,
    };
    if !done {
        regs.rip = rip;
        let _ = fd.set_regs(&regs);
        return None;
    }
    Some((byte[0], rip))
}

/// What an assisted instruction was, for the logs.
pub fn describe_assist(opcode: u8) -> &'static str {
    if opcode == INT3 {
        "int3 (#BP delivered)"
    } else {
        "fwait (skipped)"
    }
}

/// Describes a `KVM_EXIT_INTERNAL_ERROR` from the `kvm_run` area
/// (kvm-ioctls' exit carries no payload): the sub-error and its data words.
pub fn describe_internal_error(fd: &mut VcpuFd) -> String {
    // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member is the
    // one KVM filled in.
    let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let what = match internal.suberror {
        kvm_bindings::KVM_INTERNAL_ERROR_EMULATION => "emulation failure",
        kvm_bindings::KVM_INTERNAL_ERROR_SIMUL_EX => "exception while delivering an exception",
        kvm_bindings::KVM_INTERNAL_ERROR_DELIVERY_EV => "event delivery failed",
        kvm_bindings::KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON => "unexpected exit reason",
        _ => "unknown sub-error",
    };
    let n = (internal.ndata as usize).min(internal.data.len());
    let data: Vec<String> = internal.data[..n]
        .iter()
        .map(|d| format!("{d:#x}"))
        .collect();
    format!(
        "KVM internal error {} ({what}), data [{}]",
        internal.suberror,
        data.join(", ")
    )
}

/// "RIP … (CPL, RSP, paging mode)" of a vCPU's registers.
pub fn describe_registers(regs: &kvm_regs, sregs: &kvm_sregs) -> String {
    format!(
        "RIP {:#x} (CPL {}, RSP {:#x}, {})",
        regs.rip,
        sregs.cs.selector & 3,
        regs.rsp,
        super::gva::Paging::from_sregs(sregs).describe()
    )
}
