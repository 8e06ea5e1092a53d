//! vCPU set-up (registers for the direct ring-3 boot) and the per-vCPU run
//! loop that runs on its own host thread, named `vcpu<N>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use hypercall_abi::boot::{BOOT_INFO_GPA, GDT_GPA, PML4_GPA};
use kvm_bindings::{kvm_fpu, kvm_regs, CpuId};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::devices::{Devices, PioAction};
use crate::layout::{segment_from_gdt, GDT};

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
    fd.set_cpuid2(&cpuid)?;

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
}

impl Vcpu {
    /// Runs the guest until it stops this vCPU, the VM ends or it fails.
    /// Never panics on guest behaviour: every outcome becomes a [`VmEvent`].
    pub fn run(mut self) {
        self.sched.start_vcpu_thread(self.index);
        let event = self.run_loop();
        if let Some(event) = event {
            // The control loop may already be gone when the VM is ending.
            let _ = self.events.send(event);
        }
    }

    fn run_loop(&mut self) -> Option<VmEvent> {
        let index = self.index;
        while !self.stop.load(Ordering::Acquire) {
            let action = match self.fd.run() {
                Ok(VcpuExit::IoOut(port, data)) => self.devices.pio_write(index, port, data),
                Ok(VcpuExit::IoIn(port, data)) => {
                    self.devices.pio_read(index, port, data);
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
                    return Some(self.failure("KVM internal error (emulation failure)"));
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

    /// Builds a failure event with the vCPU's RIP, CPL and the instruction
    /// bytes at RIP (read through the identity map: GVA = GPA).
    fn failure(&self, what: &str) -> VmEvent {
        let mut reason = what.to_string();
        if let (Ok(regs), Ok(sregs)) = (self.fd.get_regs(), self.fd.get_sregs()) {
            reason += &format!(
                " at RIP {:#x} (CPL {}, RSP {:#x})",
                regs.rip,
                sregs.cs.selector & 3,
                regs.rsp
            );
            let mut bytes = [0u8; 15];
            if self
                .memory
                .read_slice(&mut bytes, GuestAddress(regs.rip))
                .is_ok()
            {
                let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
                reason += &format!(", code: {}", hex.join(" "));
            }
        }
        VmEvent::GuestFailure {
            vcpu: self.index,
            reason,
        }
    }
}
