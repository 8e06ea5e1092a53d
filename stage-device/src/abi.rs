//! `vm_memory::ByteValued` wrappers for the `hypercall-abi` structs, so they
//! can be read from and written to guest memory with `read_obj`/`write_obj`.
//! (`hypercall-abi` has no dependencies, so the impls live here.)

use hypercall_abi::boot::BootInfo;
use hypercall_abi::stage::{AreaHeader, StageDesc, StageEvent, VcpuCounters, VcpuLatency};

/// A `#[repr(C)]` ABI struct as a guest-memory object.
#[derive(Clone, Copy, Default, Debug)]
#[repr(transparent)]
pub struct Obj<T>(pub T);

macro_rules! byte_valued {
    ($($t:ty),*) => {$(
        // SAFETY: the ABI structs are #[repr(C)], made only of integers and
        // integer arrays, without padding (sizes asserted in hypercall-abi),
        // so every byte pattern is a valid value.
        unsafe impl vm_memory::ByteValued for Obj<$t> {}
    )*};
}

byte_valued!(
    BootInfo,
    AreaHeader,
    StageDesc,
    StageEvent,
    VcpuCounters,
    VcpuLatency
);
