//! Which vCPU the calling thread runs, for VMMs whose port-I/O path does
//! not say: Cloud Hypervisor's `VmOps::pio_write(port, data)` and the
//! `BusDevice::write(base, offset, data)` of its and Firecracker's I/O
//! buses carry no vCPU index, but each vCPU has its own thread there too
//! (docs/embedding.md). [`crate::sched::Pinner::start_vcpu_thread`] records
//! the index when the thread starts; the `*_from_current` doorbells read
//! it back.

use std::cell::Cell;

use super::{Registered, StageDevice};

thread_local! {
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Records that the calling thread runs vCPU `index` (done by
/// [`crate::sched::Pinner::start_vcpu_thread`]; call it yourself only
/// without the pinner).
pub fn set_current_vcpu(index: u32) {
    CURRENT.with(|c| c.set(Some(index)));
}

/// The vCPU the calling thread runs, if it recorded one.
pub fn current_vcpu() -> Option<u32> {
    CURRENT.with(Cell::get)
}

impl<M: super::StageMemory> StageDevice<M> {
    /// [`StageDevice::doorbell`] for the calling thread's vCPU
    /// ([`current_vcpu`]). A thread that is not a vCPU's gets nothing done
    /// and a rate-limited warning.
    pub fn doorbell_from_current(&self, port: u16, data: &[u8]) -> Option<Registered> {
        match current_vcpu() {
            Some(vcpu) => self.doorbell(vcpu, port, data),
            None => {
                crate::guest_warn!("stage doorbell {port:#x} rung from a thread that is no vCPU's");
                None
            }
        }
    }

    /// [`StageDevice::read_status`] for the calling thread's vCPU; a
    /// thread that is not a vCPU's reads
    /// [`Status::BadVcpu`](hypercall_abi::stage::Status::BadVcpu).
    pub fn read_status_from_current(&self, port: u16, data: &mut [u8]) {
        self.read_status(current_vcpu().unwrap_or(u32::MAX), port, data);
    }
}

#[cfg(test)]
mod tests {
    use hypercall_abi::stage::{Status, DOORBELL_STATUS, DOORBELL_WAKE};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    fn status(dev: &StageDevice) -> Status {
        let mut raw = [0u8; 4];
        dev.read_status_from_current(DOORBELL_STATUS, &mut raw);
        Status::from_u32(u32::from_le_bytes(raw)).unwrap()
    }

    #[test]
    fn a_doorbell_is_the_calling_vcpu_threads() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let dev = StageDevice::new(std::sync::Arc::new(mem), 4 << 20, 2, 0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Not a vCPU's thread: nothing rung, no status of its own.
                assert_eq!(current_vcpu(), None);
                dev.doorbell_from_current(DOORBELL_WAKE, &0u32.to_le_bytes());
                assert_eq!(status(&dev), Status::BadVcpu);
                assert_eq!(dev.report().wakes, 0);
            })
            .join()
            .unwrap();
            s.spawn(|| {
                set_current_vcpu(1);
                // WAKE of vCPU 5 (there are 2): vCPU 1's status says so,
                // vCPU 0's is untouched.
                dev.doorbell_from_current(DOORBELL_WAKE, &5u32.to_le_bytes());
                assert_eq!(status(&dev), Status::BadVcpu);
                let mut raw = [0u8; 4];
                dev.read_status(0, DOORBELL_STATUS, &mut raw);
                assert_eq!(u32::from_le_bytes(raw), Status::Ok as u32);
                dev.doorbell_from_current(DOORBELL_WAKE, &0u32.to_le_bytes());
                assert_eq!(status(&dev), Status::Ok);
            });
        });
        assert_eq!(dev.report().wakes, 1);
    }
}
