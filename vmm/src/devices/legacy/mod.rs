//! Legacy PC devices: the platform's port-I/O devices (serial console,
//! shutdown and vCPU-stop ports) live on the bus in [`super::Bus`]; the CMOS
//! clock and i8042 reset of a Linux guest are in [`pc`]; the serial
//! console's host side (output, input, `--serial`) in [`console`], with
//! stdout's non-blocking buffer in [`serial_out`].

pub mod console;
pub mod pc;
pub mod serial_out;

pub use pc::Legacy;
