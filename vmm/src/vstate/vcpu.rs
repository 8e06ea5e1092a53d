//! vCPU set-up (registers for the direct ring-3 boot) and the per-vCPU run
//! loop that runs on its own host thread, named `vcpu<N>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use hypercall_abi::boot::{BOOT_INFO_GPA, GDT_GPA, PML4_GPA};
use kvm_bindings::{kvm_fpu, kvm_regs, CpuId};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::GuestMemoryMmap;

use crate::devices::{Devices, PioAction};
use crate::layout::{segment_from_gdt, GDT};
use crate::legacy::Legacy;

/// Bytes of code reported at `RIP` after a failure (the longest x86
/// instruction).
const CODE_BYTES: usize = 15;
/// The `int3` opcode and the `#BP` vector.
const INT3: u8 = 0xcc;
const BP_VECTOR: u8 = 3;
/// The `fwait` opcode and the x87 status word's exception-summary bit.
const FWAIT: u8 = 0x9b;
const FSW_ES: u16 = 1 << 7;

/// Control register and EFER bits (Intel SDM Vol. 3A §2.5, §2.2.1).
const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS: reserved bit 1 set, IOPL = 3 (bits 12-13), IF clear.
const RFLAGS_BOOT: u64 = 0x3002;

/// Something a vCPU thread reports to the VM's control loop.
#[derive(Debug)]
pub enum VmEvent {
    /// A vCPU wrote the shutdown port.
    Shutdown {
        /// Index of the vCPU.
        vcpu: u32,
        /// The raw 32-bit exit code it wrote.
        code: u32,
    },
    /// The stage configuration does not fit the guest (e.g. names a stage the
    /// guest did not declare).
    ConfigError(String),
    /// A vCPU stopped on request (vCPU stop port or `hlt`).
    VcpuStopped(u32),
    /// The guest failed on a vCPU (triple fault, KVM internal error…).
    GuestFailure {
        /// Index of the vCPU.
        vcpu: u32,
        /// What happened, with RIP.
        reason: String,
    },
    /// The VMM received SIGINT or SIGTERM.
    Signal(i32),
}

/// KVM's supported CPUID `cpuid` with the APIC ID fields of vCPU `index`
/// (leaf 1 `EBX[31:24]`, leaves 0xB / 0x1F `EDX`).
pub fn vcpu_cpuid(cpuid: &CpuId, index: u32) -> CpuId {
    let mut cpuid = cpuid.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            // Leaf 1 EBX[31:24]: initial APIC ID.
            1 => e.ebx = (e.ebx & 0x00ff_ffff) | (index << 24),
            // Leaves 0xB / 0x1F EDX: x2APIC ID.
            0xb | 0x1f => e.edx = index,
            _ => {}
        }
    }
    cpuid
}

/// Sets up CPUID, FPU, segment/control registers and general registers of
/// vCPU `index` for the ring-3 boot protocol of [`hypercall_abi::boot`].
///
/// `cpuid` is KVM's supported CPUID; the APIC ID fields are patched to
/// `index`. `rsp` is the top of this vCPU's stack. Errors are KVM ioctl errors.
pub fn configure(
    fd: &VcpuFd,
    index: u32,
    cpuid: &CpuId,
    entry: u64,
    rsp: u64,
) -> Result<(), kvm_ioctls::Error> {
    fd.set_cpuid2(&vcpu_cpuid(cpuid, index))?;

    // x87 control word and MXCSR at their reset values (Intel SDM Vol. 1 §8.1.5, §10.2.3).
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu)?;

    let mut sregs = fd.get_sregs()?;
    let code = segment_from_gdt(3);
    let data = segment_from_gdt(4);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = (std::mem::size_of_val(&GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    fd.set_sregs(&sregs)?;

    let regs = kvm_regs {
        rip: entry,
        rsp,
        rdi: u64::from(index),
        rsi: BOOT_INFO_GPA,
        rflags: RFLAGS_BOOT,
        ..Default::default()
    };
    fd.set_regs(&regs)
}

/// One vCPU and what its thread needs.
pub struct Vcpu {
    /// Index of this vCPU (`0..num_vcpus`).
    pub index: u32,
    /// The KVM vCPU.
    pub fd: VcpuFd,
    /// Port-I/O devices.
    pub devices: Arc<Devices>,
    /// Guest memory, for failure reports (instruction bytes at RIP).
    pub memory: GuestMemoryMmap,
    /// Set by the control loop when the VM ends; checked before every entry.
    pub stop: Arc<AtomicBool>,
    /// Where events go.
    pub events: Sender<VmEvent>,
    /// Pins the thread at start.
    pub sched: Arc<crate::sched::Scheduler>,
    /// The PC legacy ports of a Linux guest (CMOS clock, i8042 reset); `None`
    /// for the ring-3 unikernel.
    pub legacy: Option<Arc<Legacy>>,
    /// Complete a kernel-mode `int3` or `fwait` that KVM fails to emulate
    /// (see `Vcpu::assist_emulation`); on for Linux guests.
    pub assist_emulation: bool,
    /// How many instructions `assist_emulation` completed, by opcode.
    pub assists: std::collections::BTreeMap<u8, u64>,
}

impl Vcpu {
    /// Runs the guest until it stops this vCPU, the VM ends or it fails.
    /// Never panics on guest behaviour: every outcome becomes a [`VmEvent`].
    pub fn run(mut self) {
        self.sched.start_vcpu_thread(self.index);
        let event = self.run_loop();
        if !self.assists.is_empty() {
            let counts: Vec<String> = self
                .assists
                .iter()
                .map(|(op, n)| format!("{n} x {}", if *op == INT3 { "int3" } else { "fwait" }))
                .collect();
            tracing::info!(
                vcpu = self.index,
                "completed instructions KVM could not emulate: {}",
                counts.join(", ")
            );
        }
        if let Some(event) = event {
            // The control loop may already be gone when the VM is ending.
            let _ = self.events.send(event);
        }
    }

    fn run_loop(&mut self) -> Option<VmEvent> {
        let index = self.index;
        while !self.stop.load(Ordering::Acquire) {
            let legacy = self.legacy.as_deref();
            let mut internal_error = false;
            let action = match self.fd.run() {
                Ok(VcpuExit::IoOut(port, data)) => match legacy {
                    Some(legacy) if Legacy::handles(port) => legacy.pio_write(port, data),
                    _ => self.devices.pio_write(index, port, data),
                },
                Ok(VcpuExit::IoIn(port, data)) => {
                    match legacy {
                        Some(legacy) if Legacy::handles(port) => legacy.pio_read(port, data),
                        _ => self.devices.pio_read(index, port, data),
                    }
                    PioAction::Continue
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    self.devices.mmio_read(addr, data);
                    PioAction::Continue
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    self.devices.mmio_write(addr, data);
                    PioAction::Continue
                }
                Ok(VcpuExit::Hlt) => PioAction::StopVcpu,
                Ok(VcpuExit::Intr) => PioAction::Continue,
                Ok(VcpuExit::Shutdown) => {
                    return Some(self.failure("triple fault (KVM shutdown exit)"));
                }
                Ok(VcpuExit::InternalError) => {
                    internal_error = true;
                    PioAction::Continue
                }
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return Some(self.failure(&format!(
                        "VM entry failed: hardware reason {reason:#x} on host CPU {cpu}"
                    )));
                }
                Ok(other) => {
                    let what = format!("unexpected exit {other:?}");
                    return Some(self.failure(&what));
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    PioAction::Continue
                }
                Err(e) => return Some(self.failure(&format!("KVM_RUN failed: {e}"))),
            };
            if internal_error {
                if self.assist_emulation && self.assist_emulation() {
                    continue;
                }
                let what = self.internal_error();
                return Some(self.failure(&what));
            }
            match action {
                PioAction::Continue => {}
                PioAction::Shutdown(code) => return Some(VmEvent::Shutdown { vcpu: index, code }),
                PioAction::StopVcpu => {
                    tracing::debug!(vcpu = index, "vCPU stopped by the guest");
                    return Some(VmEvent::VcpuStopped(index));
                }
            }
        }
        None
    }

    /// Completes, in the VMM, the two instructions `kvm_pvm`'s kernel-mode
    /// emulator fails on although Linux cannot avoid them (its emulator
    /// otherwise delivers exceptions and interrupts and runs `iretq`):
    ///
    /// * `int3` (`0xcc`; Linux runs one in `int3_selftest()` at boot and more
    ///   when it patches code): advances `RIP` past it and injects `#BP`
    ///   through `KVM_SET_VCPU_EVENTS`, which is what the CPU does for this
    ///   trap;
    /// * `fwait` (`0x9b`; in `fpu__drop()` on every exec and thread exit):
    ///   a no-op unless an x87 exception is pending (FSW.ES), so `RIP` moves
    ///   past it; with one pending it is left to fail.
    ///
    /// Called after an emulation failure; returns false, changing nothing,
    /// for anything else.
    fn assist_emulation(&mut self) -> bool {
        // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member is the
        // one KVM filled in.
        let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
        if internal.suberror != kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
            return false;
        }
        let (Ok(mut regs), Ok(sregs)) = (self.fd.get_regs(), self.fd.get_sregs()) else {
            return false;
        };
        let mut byte = [0u8; 1];
        if !matches!(
            crate::gva::read_code(&self.memory, &sregs, regs.rip, &mut byte),
            Ok((_, 1))
        ) {
            return false;
        }
        let rip = regs.rip;
        regs.rip += 1;
        let done = match byte[0] {
            INT3 => {
                let Ok(mut events) = self.fd.get_vcpu_events() else {
                    return false;
                };
                if events.exception.injected != 0 || events.exception.pending != 0 {
                    return false;
                }
                events.exception.injected = 1;
                events.exception.nr = BP_VECTOR;
                events.exception.has_error_code = 0;
                events.exception.error_code = 0;
                // Leave NMI, SIPI, shadow and SMM state as they are.
                events.flags = 0;
                self.fd.set_regs(&regs).is_ok() && self.fd.set_vcpu_events(&events).is_ok()
            }
            FWAIT => {
                let Ok(fpu) = self.fd.get_fpu() else {
                    return false;
                };
                if fpu.fsw & FSW_ES != 0 {
                    return false;
                }
                self.fd.set_regs(&regs).is_ok()
            }
            _ => return false,
        };
        if !done {
            regs.rip = rip;
            let _ = self.fd.set_regs(&regs);
            return false;
        }
        let count = self.assists.entry(byte[0]).or_insert(0);
        *count += 1;
        let what = if byte[0] == INT3 {
            "int3 (#BP delivered)"
        } else {
            "fwait (skipped)"
        };
        if *count == 1 {
            tracing::info!(vcpu = self.index, rip = format_args!("{rip:#x}"), "completed {what} that KVM could not emulate; further ones are logged at debug level");
        } else {
            tracing::debug!(
                vcpu = self.index,
                rip = format_args!("{rip:#x}"),
                "completed {what}"
            );
        }
        true
    }

    /// Describes a `KVM_EXIT_INTERNAL_ERROR` from the `kvm_run` area
    /// (kvm-ioctls' exit carries no payload): the sub-error and its data words.
    fn internal_error(&mut self) -> String {
        // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member is the
        // one KVM filled in.
        let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
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

    /// Builds a failure event with the vCPU's RIP, CPL, paging mode and the
    /// instruction bytes at RIP, read from guest memory through the guest's
    /// own page tables (see [`crate::gva`]).
    fn failure(&self, what: &str) -> VmEvent {
        let mut reason = what.to_string();
        if let (Ok(regs), Ok(sregs)) = (self.fd.get_regs(), self.fd.get_sregs()) {
            let paging = crate::gva::Paging::from_sregs(&sregs);
            reason += &format!(
                " at RIP {:#x} (CPL {}, RSP {:#x}, {})",
                regs.rip,
                sregs.cs.selector & 3,
                regs.rsp,
                paging.describe()
            );
            let mut bytes = [0u8; CODE_BYTES];
            match crate::gva::read_code(&self.memory, &sregs, regs.rip, &mut bytes) {
                Ok((gpa, n)) => {
                    let hex: Vec<String> = bytes[..n].iter().map(|b| format!("{b:02x}")).collect();
                    reason += &format!(", code: {} (GPA {gpa:#x})", hex.join(" "));
                }
                Err(e) => reason += &format!(", code bytes unreadable: {e}"),
            }
        }
        VmEvent::GuestFailure {
            vcpu: self.index,
            reason,
        }
    }
}
