//! The per-vCPU run loop, on its own host thread named `vcpu<N>`.
//!
//! In Firecracker's shape: [`handle_exit`] turns one `KVM_RUN` result into
//! a [`Step`] (every I/O exit goes to the device [`Bus`]), and the loop
//! acts on it: a REGISTER of the stage channel goes on to the scheduler
//! ([`StageSched::on_register`]) before the guest resumes, an emulation
//! failure gets the x86 assists ([`crate::arch::x86_64::emulation`]), and
//! every way the vCPU ends becomes an [`ExitEvent`] request.
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

use crate::arch::x86_64::emulation;
use crate::devices::{Bus, PioAction};
use crate::exit::{ExitEvent, VmExit};
use stage_device::sched::StageSched;
use stage_device::stage::Registered;

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
/// RFLAGS.IF: maskable interrupts enabled (Intel SDM vol. 1, §3.4.3).
const RFLAGS_IF: u64 = 1 << 9;

/// How a vCPU's run loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum VmEvent {
    /// A vCPU wrote the shutdown port.
    Shutdown {
        /// Index of the vCPU.
        vcpu: u32,
        /// The raw 32-bit exit code it wrote.
        code: u32,
    },
    /// The vCPU thread could not run (its seccomp filter was refused).
    ThreadFailure(String),
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

/// What the run loop does after one exit ([`handle_exit`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Enter the guest again.
    Continue,
    /// `KVM_RUN` returned `EINTR`/`EAGAIN`: a kick. Clear `immediate_exit`,
    /// then the stop flag decides.
    Kicked,
    /// The guest registered its stage channel: the scheduler plans the
    /// first stage map before the guest resumes.
    Registered(Registered),
    /// `KVM_EXIT_INTERNAL_ERROR`: an emulation assist may complete the
    /// instruction; else the guest failed.
    InternalError,
    /// The guest failed; the text says how (the loop adds the registers).
    Failed(String),
    /// The vCPU's run ends.
    End(VmEvent),
}

/// One `KVM_RUN` result of vCPU `index` to a [`Step`]; port and MMIO
/// accesses are served by `bus` on the way. Never panics on what the guest
/// does.
pub fn handle_exit(bus: &Bus, index: u32, exit: Result<VcpuExit<'_>, kvm_ioctls::Error>) -> Step {
    match exit {
        Ok(VcpuExit::IoOut(port, data)) => match bus.pio_write(index, port, data) {
            PioAction::Continue => Step::Continue,
            PioAction::Shutdown(code) => Step::End(VmEvent::Shutdown { vcpu: index, code }),
            PioAction::StopVcpu => Step::End(VmEvent::VcpuStopped),
            PioAction::StageRegistered(registered) => Step::Registered(registered),
        },
        Ok(VcpuExit::IoIn(port, data)) => {
            bus.pio_read(index, port, data);
            Step::Continue
        }
        Ok(VcpuExit::MmioRead(addr, data)) => {
            bus.mmio_read(addr, data);
            Step::Continue
        }
        Ok(VcpuExit::MmioWrite(addr, data)) => {
            bus.mmio_write(addr, data);
            Step::Continue
        }
        Ok(VcpuExit::Hlt) => Step::End(VmEvent::VcpuStopped),
        Ok(VcpuExit::Intr) => Step::Continue,
        Ok(VcpuExit::Shutdown) => Step::Failed("triple fault (KVM shutdown exit)".into()),
        Ok(VcpuExit::InternalError) => Step::InternalError,
        Ok(VcpuExit::FailEntry(reason, cpu)) => Step::Failed(format!(
            "VM entry failed: hardware reason {reason:#x} on host CPU {cpu}"
        )),
        Ok(other) => Step::Failed(format!("unexpected exit {other:?}")),
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Kicked,
        Err(e) => Step::Failed(format!("KVM_RUN failed: {e}")),
    }
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
    /// (see [`emulation::assist`]); on for Linux guests.
    pub assist_emulation: bool,
    /// How many instructions the assists completed, by opcode.
    pub assists: std::collections::BTreeMap<u8, u64>,
}

impl Vcpu {
    /// Runs the guest until it stops this vCPU, the VM ends or it fails.
    /// Never panics on guest behaviour: every outcome becomes an
    /// [`ExitEvent`] request.
    pub fn run(mut self) {
        self.sched.pinner().start_vcpu_thread(self.index);
        let sched = self.sched.clone();
        let _cpu = stage_device::sched::ThreadCpu::start(sched.pinner());
        crate::exit::test_panic_hook("vcpu");
        let kvm_run: *mut u8 = &mut self.fd.get_kvm_run().immediate_exit;
        IMMEDIATE_EXIT.with(|p| p.set(kvm_run));
        let event = match crate::seccomp::install(crate::seccomp::ThreadKind::Vcpu, self.seccomp) {
            Ok(()) => self.run_loop(),
            Err(e) => Some(VmEvent::ThreadFailure(e.to_string())),
        };
        IMMEDIATE_EXIT.with(|p| p.set(std::ptr::null_mut()));
        if !self.assists.is_empty() {
            let counts: Vec<String> = self
                .assists
                .iter()
                .map(|(op, n)| {
                    let name = if *op == emulation::INT3 {
                        "int3"
                    } else {
                        "fwait"
                    };
                    format!("{n} x {name}")
                })
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
            Some(VmEvent::ThreadFailure(why)) => self.exit.request(VmExit::ThreadFailure {
                thread: format!("vcpu{}", self.index),
                reason: why,
            }),
        }
    }

    fn run_loop(&mut self) -> Option<VmEvent> {
        while !self.stop.load(Ordering::Acquire) {
            let exit = self.fd.run();
            match handle_exit(&self.bus, self.index, exit) {
                Step::Continue => {}
                Step::Kicked => {
                    // Only a stopping VM kicks, so the flag is set; clear
                    // immediate_exit in case it is not.
                    self.fd.set_kvm_immediate_exit(0);
                }
                Step::Registered(registered) => self.sched.on_register(&registered),
                Step::InternalError => {
                    if self.assist_emulation && self.assist() {
                        continue;
                    }
                    let what = emulation::describe_internal_error(&mut self.fd);
                    return Some(self.failure(&what));
                }
                Step::Failed(what) => return Some(self.failure(&what)),
                Step::End(event) => {
                    if event == VmEvent::VcpuStopped {
                        tracing::debug!(vcpu = self.index, "vCPU stopped by the guest");
                    }
                    return Some(event);
                }
            }
        }
        None
    }

    /// An emulation assist ([`emulation::assist`]) for the instruction at
    /// `RIP`, counted and logged (the first of each kind at `info`).
    fn assist(&mut self) -> bool {
        let Some((opcode, rip)) = emulation::assist(&mut self.fd, &self.memory) else {
            return false;
        };
        let count = self.assists.entry(opcode).or_insert(0);
        *count += 1;
        let what = emulation::describe_assist(opcode);
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
                emulation::describe_registers(&regs, &sregs),
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
                let mut reason =
                    format!("{what} at {}", emulation::describe_registers(&regs, &sregs));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SerialConfig;
    use hypercall_abi::platform::{SHUTDOWN_PORT, VCPU_STOP_PORT};

    fn bus() -> Bus {
        Bus::new(&SerialConfig::Null, None, false).unwrap()
    }

    /// Exits built by hand, as Firecracker tests `handle_kvm_exit`.
    #[test]
    fn each_exit_becomes_its_step() {
        let bus = bus();
        let code = 7u32.to_le_bytes();
        assert_eq!(
            handle_exit(&bus, 1, Ok(VcpuExit::IoOut(SHUTDOWN_PORT, &code))),
            Step::End(VmEvent::Shutdown { vcpu: 1, code: 7 })
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::IoOut(VCPU_STOP_PORT, &[0]))),
            Step::End(VmEvent::VcpuStopped)
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::Hlt)),
            Step::End(VmEvent::VcpuStopped)
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::IoOut(0x80, &[1]))),
            Step::Continue
        );
        let mut data = [0u8; 2];
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::IoIn(0x80, &mut data))),
            Step::Continue
        );
        assert_eq!(data, [0xff, 0xff], "an unhandled port reads as open bus");
        let mut word = [0u8; 4];
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::MmioRead(0xfee0_0000, &mut word))),
            Step::Continue
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::MmioWrite(0xfee0_0000, &word))),
            Step::Continue
        );
        assert_eq!(handle_exit(&bus, 0, Ok(VcpuExit::Intr)), Step::Continue);
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::InternalError)),
            Step::InternalError
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::Shutdown)),
            Step::Failed("triple fault (KVM shutdown exit)".into())
        );
        assert_eq!(
            handle_exit(&bus, 0, Ok(VcpuExit::FailEntry(0x21, 3))),
            Step::Failed("VM entry failed: hardware reason 0x21 on host CPU 3".into())
        );
        match handle_exit(&bus, 0, Ok(VcpuExit::Debug(Default::default()))) {
            Step::Failed(what) => assert!(what.starts_with("unexpected exit Debug"), "{what}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_kick_is_not_a_failure_but_other_errors_are() {
        let bus = bus();
        for errno in [libc::EINTR, libc::EAGAIN] {
            assert_eq!(
                handle_exit(&bus, 0, Err(kvm_ioctls::Error::new(errno))),
                Step::Kicked
            );
        }
        match handle_exit(&bus, 0, Err(kvm_ioctls::Error::new(libc::EFAULT))) {
            Step::Failed(what) => assert!(what.starts_with("KVM_RUN failed"), "{what}"),
            other => panic!("{other:?}"),
        }
    }
}
