//! Fixed port-I/O devices of the stagevm platform.
//!
//! Guests start in ring 3 with IOPL 3 (see [`crate::boot`]), so they may use
//! `in`/`out` on these ports directly. Every access is a VM exit: on the
//! project's machines one port-I/O round trip from ring 3 costs ~82 µs
//! (`docs/design.md`, "Machine facts"), so these ports are for console
//! output and life-cycle events, never for a hot path.

/// Base port of the 16550A UART (COM1). Registers are `SERIAL_PORT_BASE + 0..8`.
pub const SERIAL_PORT_BASE: u16 = 0x3f8;
/// Number of consecutive ports the UART decodes.
pub const SERIAL_PORT_COUNT: u16 = 8;
/// Offset of the transmit holding register (write a byte to send it).
pub const SERIAL_THR: u16 = 0;
/// Offset of the line status register.
pub const SERIAL_LSR: u16 = 5;
/// LSR bit: transmit holding register empty (ready for the next byte).
pub const SERIAL_LSR_THR_EMPTY: u8 = 0x20;

/// Shutdown port: a 1-, 2- or 4-byte `out` of an exit code ends the whole VM.
///
/// `stagevm` stops every vCPU and exits with that code. Codes above 255 are
/// truncated to their low 8 bits by the operating system, so the VMM clamps
/// them to 255 and logs a warning.
pub const SHUTDOWN_PORT: u16 = 0x600;

/// vCPU stop port: any `out` stops the vCPU that executes it for good.
///
/// Its host thread ends; the VM keeps running until a vCPU writes
/// [`SHUTDOWN_PORT`]. If every vCPU stops without a shutdown the VMM treats it
/// as a guest failure ([`EXIT_GUEST_FAILURE`]).
pub const VCPU_STOP_PORT: u16 = 0x604;

/// `stagevm` exit code for a configuration or start-up error (bad kernel path,
/// bad `--cpus`/`--memory` value, `/dev/kvm` unusable).
pub const EXIT_VMM_ERROR: u8 = 1;
/// `stagevm` exit code when the guest fails: triple fault (KVM shutdown exit),
/// KVM internal/emulation error, failed VM entry, or every vCPU stopped without
/// a shutdown request.
pub const EXIT_GUEST_FAILURE: u8 = 2;
/// `stagevm` exit code after SIGINT (128 + 2, the shell convention).
pub const EXIT_SIGINT: u8 = 130;
/// `stagevm` exit code after SIGTERM (128 + 15, the shell convention).
pub const EXIT_SIGTERM: u8 = 143;
