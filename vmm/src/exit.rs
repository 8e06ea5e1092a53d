//! How a VM ends, and the one exit `EventFd` every loop of the VM waits on.
//!
//! Whoever ends the VM — a vCPU (shutdown port, failure, every vCPU
//! stopped, a configuration that does not fit the guest's stages) or the
//! main thread (SIGINT, SIGTERM) — calls [`ExitEvent::request`]: the first
//! reason is kept and the `EventFd` becomes readable for good (it is never
//! read), so the main loop, `stage-sched` and the I/O threads all wake up
//! from their `epoll` and return.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use hypercall_abi::platform::{EXIT_GUEST_FAILURE, EXIT_SIGINT, EXIT_SIGTERM, EXIT_VMM_ERROR};
use vmm_sys_util::eventfd::EventFd;

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest wrote this code to the shutdown port (clamped to 0..=255).
    Guest(u8),
    /// The guest failed; the text says how and on which vCPU.
    GuestFailure(String),
    /// The VMM received this signal (SIGINT or SIGTERM).
    Signal(i32),
    /// The stage configuration did not fit the guest's stages.
    ConfigError(String),
    /// A thread of the VMM could not go on (its seccomp filter refused,
    /// its epoll set or timer failed, the API server failed).
    ThreadFailure {
        /// The thread's name (`vcpu0`, `stage-sched`, `io-net0`, `api`, …).
        thread: String,
        /// What failed.
        reason: String,
    },
    /// The operator shut the VM down (`PUT /api/v1/vm.shutdown`); status 0.
    ApiShutdown,
}

impl VmExit {
    /// The process exit code `stagevm` returns for this end (see
    /// [`hypercall_abi::platform`] for the fixed codes).
    pub fn exit_code(&self) -> u8 {
        match self {
            VmExit::Guest(code) => *code,
            VmExit::GuestFailure(_) => EXIT_GUEST_FAILURE,
            VmExit::ConfigError(_) | VmExit::ThreadFailure { .. } => EXIT_VMM_ERROR,
            VmExit::Signal(libc::SIGINT) => EXIT_SIGINT,
            VmExit::Signal(_) => EXIT_SIGTERM,
            VmExit::ApiShutdown => 0,
        }
    }

    /// How the VM ended, as one line for the report.
    pub fn describe(&self) -> String {
        match self {
            VmExit::Guest(code) => format!("guest shutdown with code {code}"),
            VmExit::GuestFailure(why) => format!("guest failure: {why}"),
            VmExit::Signal(sig) => format!("signal {sig}"),
            VmExit::ConfigError(msg) => format!("configuration error: {msg}"),
            VmExit::ThreadFailure { thread, reason } => {
                format!("VMM thread {thread} failed: {reason}")
            }
            VmExit::ApiShutdown => "shut down through the operator API".into(),
        }
    }
}

/// The VM's exit: the first reason given and the `EventFd` that announces it.
pub struct ExitEvent {
    evt: EventFd,
    reason: Mutex<Option<VmExit>>,
    stopped_vcpus: AtomicUsize,
    num_vcpus: usize,
}

impl ExitEvent {
    /// The exit of a VM of `num_vcpus` vCPUs. Errors: the `EventFd` cannot
    /// be created.
    pub fn new(num_vcpus: u32) -> std::io::Result<Self> {
        Ok(Self {
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
            reason: Mutex::new(None),
            stopped_vcpus: AtomicUsize::new(0),
            num_vcpus: num_vcpus as usize,
        })
    }

    /// Ends the VM for `exit` unless it is already ending (the first reason
    /// wins).
    pub fn request(&self, exit: VmExit) {
        let mut reason = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if reason.is_none() {
            *reason = Some(exit);
            // A full counter (never after one write) still leaves it readable.
            let _ = self.evt.write(1);
        }
    }

    /// A vCPU stopped on the guest's request; the last one ends the VM.
    pub fn vcpu_stopped(&self) {
        if self.stopped_vcpus.fetch_add(1, Ordering::AcqRel) + 1 == self.num_vcpus {
            self.request(VmExit::GuestFailure(
                "every vCPU stopped without a shutdown request".into(),
            ));
        }
    }

    /// The `EventFd`, readable once the VM is ending.
    pub fn fd(&self) -> &EventFd {
        &self.evt
    }

    /// The reason, once one was given.
    pub fn reason(&self) -> Option<VmExit> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Debug builds only: panics the calling thread of kind `kind` when
/// `STAGEVM_TEST_PANIC` names it, so tests can check the fail-stop (a
/// release build has no such hook).
pub fn test_panic_hook(kind: &str) {
    if cfg!(debug_assertions) && std::env::var("STAGEVM_TEST_PANIC").is_ok_and(|v| v == kind) {
        panic!("STAGEVM_TEST_PANIC={kind}");
    }
}
