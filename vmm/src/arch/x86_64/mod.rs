//! x86-64: registers and page-table constants ([`regs`]), the guest memory
//! layout and ring-3 boot structures ([`layout`]), the Linux boot protocols
//! ([`linux`]) and their ACPI tables ([`acpi`]), kernel image loading
//! ([`kernel`]) and guest page walks for failure reports ([`gva`]).

pub mod acpi;
pub mod gva;
pub mod kernel;
pub mod layout;
pub mod linux;
pub mod regs;
