//! x86-64: registers and page-table constants ([`regs`]), the guest memory
//! layout and ring-3 boot structures ([`layout`]), the Linux boot protocols
//! ([`linux`]) and their ACPI tables ([`acpi`]), kernel image loading
//! ([`kernel`]), guest page walks for failure reports ([`gva`]) and the
//! emulation assists of Linux guests ([`emulation`]).

pub mod acpi;
pub mod emulation;
pub mod gva;
pub mod kernel;
pub mod layout;
pub mod linux;
pub mod regs;
