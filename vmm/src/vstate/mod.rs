//! vCPU state: the per-vCPU run loop ([`vcpu`]), the parking of a vCPU
//! thread that rings the WAIT doorbell ([`park`]) and guest memory
//! ([`memory`]).

pub mod memory;
pub mod park;
pub mod vcpu;
