//! The per-vCPU run loop, on its own host thread named `vcpu<N>`.
//!
//! Every I/O exit goes to the device [`Bus`]; a REGISTER of the stage
//! channel goes on to the scheduler ([`StageSched::on_register`]) before the
//! guest resumes; every way the vCPU ends becomes an [`ExitEvent`] request.
//!
//! Kick: to stop a vCPU the main thread sets the stop flag and sends the
//! thread one [`kick_signal`]. Its handler sets `immediate_exit` in the
//! thread's `kvm_run` (as Firecracker does), so a `KVM_RUN` entered after
//! the stop flag was checked returns at once with `EINTR`: one kick is
//! enough, there are no retries.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::GuestMemoryMmap;

use crate::devices::{Bus, PioAction};
use crate::exit::{ExitEvent, VmExit};
use crate::sched::StageSched;

thread_local! {
    /// This vCPU thread's `kvm_run.immediate_exit` byte (null elsewhere).
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread out of `KVM_RUN` (the first
/// real-time signal, as Firecracker and Cloud Hypervisor use).
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    IMMEDIATE_EXIT.with(|p| {
        let p = p.get();
        if !p.is_null() {
            // SAFETY: `p` points into this thread's live `kvm_run` mapping:
            // it is set by `Vcpu::run` before the first `KVM_RUN` and reset
            // to null before the `VcpuFd` (and its mapping) is dropped.
            unsafe { p.write_volatile(1) };
        }
    });
}

/// Installs the kick handler for the process (once, before vCPU threads
/// start). Errors: `sigaction` failed.
pub fn install_kick_handler() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(kick_signal(), kick_handler)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

/// Bytes of code reported at `RIP` after a failure (the longest x86
/// instruction).
const CODE_BYTES: usize = 15;
/// The `int3` opcode and the `#BP` vector.
const INT3: u8 = 0xcc;
const BP_VECTOR: u8 = 3;
/// The `fwait` opcode and the x87 status word's exception-summary bit.
const FWAIT: u8 = 0x9b;
const FSW_ES: u16 = 1 << 7;
/// RFLAGS.IF: maskable interrupts enabled (Intel SDM vol. 1, §3.4.3).
const RFLAGS_IF: u64 = 1 << 9;

/// How a vCPU's run loop ended.
#[derive(Debug)]
enum VmEvent {
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
    VcpuStopped,
    /// The guest failed on a vCPU (triple fault, KVM internal error…).
    GuestFailure {
        /// Index of the vCPU.
        vcpu: u32,
        /// What happened, with RIP.
        reason: String,
    },
}

/// One vCPU and what its thread needs.
pub struct Vcpu {
    /// Index of this vCPU (`0..num_vcpus`).
    pub index: u32,
    /// The KVM vCPU.
    pub fd: VcpuFd,
    /// The devices.
    pub bus: Arc<Bus>,
    /// Guest memory, for failure reports (instruction bytes at RIP).
    pub memory: GuestMemoryMmap,
    /// Set by the main thread when the VM ends; checked before every entry.
    pub stop: Arc<AtomicBool>,
    /// Where the vCPU's end goes.
    pub exit: Arc<ExitEvent>,
    /// Pins the thread at start; plans the first stage map at REGISTER.
    pub sched: Arc<StageSched>,
    /// `--seccomp`: the vCPU filter is installed before the first KVM_RUN.
    pub seccomp: crate::seccomp::SeccompMode,
    /// Complete a kernel-mode `int3` or `fwait` that KVM fails to emulate
    /// (see `Vcpu::assist_emulation`); on for Linux guests.
    pub assist_emulation: bool,
    /// How many instructions `assist_emulation` completed, by opcode.
    pub assists: std::collections::BTreeMap<u8, u64>,
}

impl Vcpu {
    /// Runs the guest until it stops this vCPU, the VM ends or it fails.
    /// Never panics on guest behaviour: every outcome becomes an
    /// [`ExitEvent`] request.
    pub fn run(mut self) {
        self.sched.pinner().start_vcpu_thread(self.index);
        let sched = self.sched.clone();
        let _cpu = crate::sched::ThreadCpu::start(sched.pinner());
        crate::exit::test_panic_hook("vcpu");
        let kvm_run: *mut u8 = &mut self.fd.get_kvm_run().immediate_exit;
        IMMEDIATE_EXIT.with(|p| p.set(kvm_run));
        let event = match crate::seccomp::install(crate::seccomp::ThreadKind::Vcpu, self.seccomp) {
            Ok(()) => self.run_loop(),
            Err(e) => Some(VmEvent::ConfigError(e)),
        };
        IMMEDIATE_EXIT.with(|p| p.set(std::ptr::null_mut()));
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
        match event {
            None => self.log_stopped_state(),
            Some(VmEvent::Shutdown { vcpu, code }) => {
                let clamped = u8::try_from(code).unwrap_or_else(|_| {
                    tracing::warn!(vcpu, code, "guest exit code above 255, using 255");
                    255
                });
                tracing::info!(vcpu, code = clamped, "guest requested shutdown");
                self.exit.request(VmExit::Guest(clamped));
            }
            Some(VmEvent::VcpuStopped) => self.exit.vcpu_stopped(),
            Some(VmEvent::GuestFailure { vcpu, reason }) => self
                .exit
                .request(VmExit::GuestFailure(format!("vCPU {vcpu}: {reason}"))),
            Some(VmEvent::ConfigError(msg)) => self.exit.request(VmExit::ConfigError(msg)),
        }
    }

    fn run_loop(&mut self) -> Option<VmEvent> {
        let index = self.index;
        while !self.stop.load(Ordering::Acquire) {
            let mut internal_error = false;
            let action = match self.fd.run() {
                Ok(VcpuExit::IoOut(port, data)) => self.bus.pio_write(index, port, data),
                Ok(VcpuExit::IoIn(port, data)) => {
                    self.bus.pio_read(index, port, data);
                    PioAction::Continue
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    self.bus.mmio_read(addr, data);
                    PioAction::Continue
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    self.bus.mmio_write(addr, data);
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
                    // A kick: only a stopping VM kicks, so the flag is set;
                    // clear immediate_exit in case it is not.
                    self.fd.set_kvm_immediate_exit(0);
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
                    return Some(VmEvent::VcpuStopped);
                }
                PioAction::StageRegistered(registered) => self.sched.on_register(&registered),
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
        let Ok((mut regs, sregs)) = self.registers() else {
            return false;
        };
        let mut byte = [0u8; 1];
        if !matches!(
            crate::arch::x86_64::gva::read_code(&self.memory, &sregs, regs.rip, &mut byte),
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

    /// Logs where a vCPU the VMM stopped was (RIP, CPL, whether it was halted
    /// waiting for an interrupt and whether interrupts were enabled): at
    /// `info` when a signal ended the VM, the case of a harness's time limit,
    /// where it tells a guest waiting for a lost interrupt (halted, IF set,
    /// on every vCPU) from one spinning; at `debug` otherwise.
    fn log_stopped_state(&self) {
        let signal = matches!(self.exit.reason(), Some(VmExit::Signal(_)));
        if !signal && !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let mp_state = match self.fd.get_mp_state().map(|m| m.mp_state) {
            Ok(kvm_bindings::KVM_MP_STATE_RUNNABLE) => "runnable".to_string(),
            Ok(kvm_bindings::KVM_MP_STATE_HALTED) => "halted".to_string(),
            Ok(other) => format!("mp_state {other}"),
            Err(e) => format!("mp_state unreadable: {e}"),
        };
        let (place, interrupts) = match self.registers() {
            Ok((regs, sregs)) => (
                describe_registers(&regs, &sregs),
                if regs.rflags & RFLAGS_IF != 0 {
                    "interrupts enabled"
                } else {
                    "interrupts disabled"
                },
            ),
            Err(e) => (format!("registers unreadable: {e}"), "RFLAGS unreadable"),
        };
        let state = format!("{place}, {mp_state}, {interrupts}");
        if signal {
            tracing::info!(vcpu = self.index, "vCPU stopped by the VMM at {state}");
        } else {
            tracing::debug!(vcpu = self.index, "vCPU stopped by the VMM at {state}");
        }
    }

    /// The vCPU's general and segment registers (one `KVM_GET_REGS` and one
    /// `KVM_GET_SREGS`). Errors: either ioctl failed.
    fn registers(&self) -> Result<(kvm_regs, kvm_sregs), kvm_ioctls::Error> {
        Ok((self.fd.get_regs()?, self.fd.get_sregs()?))
    }

    /// Builds a failure event with the vCPU's RIP, CPL, paging mode and the
    /// instruction bytes at RIP, read from guest memory through the guest's
    /// own page tables (see [`crate::arch::x86_64::gva`]).
    fn failure(&self, what: &str) -> VmEvent {
        let reason = match self.registers() {
            Ok((regs, sregs)) => {
                let mut reason = format!("{what} at {}", describe_registers(&regs, &sregs));
                let mut bytes = [0u8; CODE_BYTES];
                match crate::arch::x86_64::gva::read_code(
                    &self.memory,
                    &sregs,
                    regs.rip,
                    &mut bytes,
                ) {
                    Ok((gpa, n)) => {
                        let hex: Vec<String> =
                            bytes[..n].iter().map(|b| format!("{b:02x}")).collect();
                        reason += &format!(", code: {} (GPA {gpa:#x})", hex.join(" "));
                    }
                    Err(e) => reason += &format!(", code bytes unreadable: {e}"),
                }
                reason
            }
            Err(e) => format!("{what} at registers unreadable: {e}"),
        };
        VmEvent::GuestFailure {
            vcpu: self.index,
            reason,
        }
    }
}

/// "RIP … (CPL, RSP, paging mode)" of a vCPU's registers.
fn describe_registers(regs: &kvm_regs, sregs: &kvm_sregs) -> String {
    format!(
        "RIP {:#x} (CPL {}, RSP {:#x}, {})",
        regs.rip,
        sregs.cs.selector & 3,
        regs.rsp,
        crate::arch::x86_64::gva::Paging::from_sregs(sregs).describe()
    )
}
