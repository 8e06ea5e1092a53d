//! vCPU state: the per-vCPU run loop ([`vcpu`]) and guest memory
//! ([`memory`]). A vCPU thread that rings the WAIT doorbell parks in the
//! stage device ([`stage_device::park`]).

pub mod memory;
pub mod vcpu;
