//! x86-64 beyond the ring-3 boot (the `stagevm-arch` crate: the memory
//! layout, the boot structures, the registers): the Linux boot protocols
//! ([`linux`]) and their ACPI tables ([`acpi`]), kernel image loading
//! ([`kernel`]), guest page walks for failure reports ([`gva`]) and the
//! emulation assists of Linux guests ([`emulation`]).

pub mod acpi;
pub mod emulation;
pub mod gva;
pub mod kernel;
pub mod linux;
