//! What every attack needs: the machine ([`Env`]), the TSC ([`tsc`]) and
//! the way out when an attack cannot run as designed ([`fail`]).
//!
//! Depends on [`crate::staged::platform`] only.

use guest_agent::Platform;

use crate::staged::platform::PortIo;
use crate::{print_line, shutdown};

/// What the attacks need to know about the machine.
pub struct Env {
    /// Guest RAM (bytes).
    pub mem_size: u64,
    /// vCPUs of the VM.
    pub num_vcpus: u32,
    /// TSC frequency (kHz; a 3 GHz guess when the VMM gave none).
    pub tsc_khz: u64,
    /// GPA of the first virtio-mmio block device, if any.
    pub virtio: Option<u64>,
    /// GPA of the first virtio-mmio network card, if any.
    pub net: Option<u64>,
}

impl Env {
    /// TSC ticks in `ms` milliseconds.
    pub fn ticks(&self, ms: u64) -> u64 {
        ms * self.tsc_khz
    }

    /// TSC ticks to nanoseconds.
    pub fn ns(&self, ticks: u64) -> u64 {
        (u128::from(ticks) * 1_000_000 / u128::from(self.tsc_khz)) as u64
    }
}

/// The guest TSC (ticks).
pub fn tsc() -> u64 {
    PortIo.tsc()
}

/// Prints `hostile: FAILED …` and ends the VM with exit code 6, so a test
/// sees that an attack could not run as designed (e.g. the VMM stopped
/// draining).
pub fn fail(what: core::fmt::Arguments) -> ! {
    println!("hostile: FAILED {}", what);
    shutdown(6)
}
