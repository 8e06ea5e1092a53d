//! The doorbell ports as one rust-vmm `vm-device` port-I/O device that
//! takes no lock of its own ([`StagePorts`], feature `vm-device`).
//!
//! A bus that keeps each device behind a `Mutex` (`vm-device`'s
//! `MutDevicePio`, Firecracker's `pio_bus`) holds it for a whole `write`,
//! and a WAIT parks the calling vCPU inside the write for up to
//! [`WAIT_MAX_US`](hypercall_abi::stage::WAIT_MAX_US): every other vCPU's WAKE —
//! the call that would end the WAIT — would queue behind it. [`StagePorts`]
//! implements `DevicePio` (`&self`) instead, so `vm-device`'s `IoManager`
//! calls it without a lock: WAIT and WAKE meet only in the device's own
//! parker (docs/embedding.md, "Watch the bus's lock").

use std::sync::Arc;

use hypercall_abi::stage::DOORBELL_REGISTER;
use vm_device::bus::{PioAddress, PioAddressOffset, PioRange};
use vm_device::DevicePio;

use crate::sched::StageSched;
use crate::stage::StageMemory;

/// First doorbell port (REGISTER, also the status port).
pub const BASE: u16 = DOORBELL_REGISTER;
/// Ports the device spans from [`BASE`]: REGISTER, UNREGISTER, WAIT and
/// WAKE, four bytes each.
pub const LEN: u16 = 16;

/// The stage channel's doorbell ports for `vm-device`'s I/O manager: an
/// `out` rings the doorbell of the calling vCPU thread (recorded by
/// [`Pinner::start_vcpu_thread`](crate::sched::Pinner::start_vcpu_thread)),
/// a REGISTER is planned for ([`StageSched::on_register`]) before the vCPU
/// resumes, an `in` reads the thread's last status. Ports outside the
/// channel's and a scheduler without a device are ignored.
pub struct StagePorts<M: StageMemory = Arc<vm_memory::GuestMemoryMmap>> {
    sched: Arc<StageSched<M>>,
}

impl<M: StageMemory> StagePorts<M> {
    /// The ports of `sched`'s device.
    pub fn new(sched: Arc<StageSched<M>>) -> Self {
        Self { sched }
    }

    /// The range to register the ports at (`IoManager::register_pio`).
    /// Errors: never for these constants (`vm-device` refuses an empty or
    /// wrapping range).
    pub fn range() -> Result<PioRange, vm_device::bus::Error> {
        PioRange::new(PioAddress(BASE), LEN)
    }
}

impl<M: StageMemory> DevicePio for StagePorts<M> {
    fn pio_read(&self, base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        if let Some(device) = self.sched.device() {
            device.read_status_from_current(base.0.wrapping_add(offset), data);
        }
    }

    fn pio_write(&self, base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        let Some(device) = self.sched.device() else {
            return;
        };
        if let Some(registered) = device.doorbell_from_current(base.0.wrapping_add(offset), data) {
            self.sched.on_register(&registered);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hypercall_abi::stage::{DOORBELL_WAIT, DOORBELL_WAKE, WAIT_MAX_US};
    use vm_device::device_manager::{IoManager, PioManager};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::stage::StageDevice;

    #[test]
    fn a_wake_through_the_io_manager_ends_a_wait_parked_in_it() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let device = Arc::new(StageDevice::new(std::sync::Arc::new(mem), 1 << 20, 2, 0, 0));
        let setup = crate::sched::test_setup("0", "[policy]\nname = \"static\"\n");
        let sched = StageSched::new(&setup, 2, Some(device.clone())).unwrap();
        let mut io = IoManager::new();
        io.register_pio(
            StagePorts::<Arc<GuestMemoryMmap>>::range().unwrap(),
            Arc::new(StagePorts::new(sched)),
        )
        .unwrap();
        let io = Arc::new(io);
        // vCPU 1 parks in WAIT (the longest timeout) inside the manager's
        // write; vCPU 0's WAKE through the same manager must end it.
        let waiter = {
            let io = io.clone();
            std::thread::spawn(move || {
                crate::stage::set_current_vcpu(1);
                let t = Instant::now();
                io.pio_write(PioAddress(DOORBELL_WAIT), &0u32.to_le_bytes())
                    .unwrap();
                t.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(5));
        crate::stage::set_current_vcpu(0);
        io.pio_write(PioAddress(DOORBELL_WAKE), &1u32.to_le_bytes())
            .unwrap();
        let waited = waiter.join().unwrap();
        assert!(
            waited < Duration::from_micros(u64::from(WAIT_MAX_US) / 2),
            "{waited:?}"
        );
        assert_eq!(device.report().wakes, 1);
        // The status read goes through the same device: WAKE's `Ok`.
        let mut status = [0xffu8; 4];
        io.pio_read(PioAddress(BASE), &mut status).unwrap();
        assert_eq!(u32::from_le_bytes(status), 0);
    }
}
