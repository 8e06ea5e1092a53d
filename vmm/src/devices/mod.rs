//! The devices of a VM on one port-I/O and MMIO [`Bus`], which the vCPU
//! run loop calls on every I/O exit:
//!
//! * the platform's ports: the 16550A serial console (`vm-superio`) and the
//!   shutdown / vCPU-stop ports of [`hypercall_abi::platform`],
//! * the stage device's doorbell ([`stage_device::stage`]),
//! * the legacy PC ports of a Linux guest ([`legacy`]: CMOS clock, i8042),
//! * virtio-mmio block and network devices ([`virtio`]).

pub mod legacy;
pub mod virtio;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use hypercall_abi::platform::{SERIAL_PORT_BASE, SERIAL_PORT_COUNT, SHUTDOWN_PORT, VCPU_STOP_PORT};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::config::SerialConfig;
use legacy::Legacy;
use stage_device::stage::{Registered, StageDevice};

/// Interrupt line of the UART as an `EventFd`.
///
/// `vm-superio`'s `Serial` signals interrupts through a [`Trigger`]. The
/// ring-3 unikernel runs with interrupts off and no interrupt controller, so
/// nothing listens on this `EventFd` there; a Linux boot registers it as an
/// irqfd on IRQ 4 ([`Bus::serial_irq_fd`]).
pub struct EventFdTrigger(EventFd);

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Where serial bytes go.
pub type SerialOut = Box<dyn Write + Send>;

/// What a vCPU must do after a port-I/O write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PioAction {
    /// Resume the guest.
    Continue,
    /// The guest asked to end the VM with this exit code (raw 32-bit value).
    Shutdown(u32),
    /// The guest asked to stop the vCPU that wrote.
    StopVcpu,
    /// The guest registered its stage channel: the scheduler plans the first
    /// stage map before the guest resumes.
    StageRegistered(Registered),
}

/// Written when the guest has emptied the UART's receive FIFO (the
/// console's input thread then reads more).
pub struct RoomEvent(EventFd);

impl vm_superio::serial::SerialEvents for RoomEvent {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {}
    fn in_buffer_empty(&self) {
        let _ = self.0.write(1);
    }
}

type Uart = Serial<EventFdTrigger, RoomEvent, SerialOut>;

/// All devices of a VM, shared by every vCPU thread.
pub struct Bus {
    serial: Mutex<Uart>,
    /// The console's input, taken by the `serial-in` thread.
    console_input: Mutex<Option<legacy::console::Input>>,
    /// stdout's buffered output, taken by the `serial-out` thread.
    console_output: Mutex<Option<legacy::serial_out::Drain>>,
    /// Waits for that output at the end of the run (without the UART's
    /// lock).
    console_flusher: Option<legacy::serial_out::Flusher>,
    /// Restores the user's terminal when the bus goes (`--serial tty`).
    _terminal: Option<legacy::console::TermiosGuard>,
    stage: Option<Arc<StageDevice>>,
    legacy: Option<Legacy>,
    /// The virtio-mmio register windows, by GPA of their first byte
    /// (each [`stagevm_arch::layout::MMIO_SIZE`] long), each knowing whether KVM
    /// delivers its queue notifications (ioeventfd).
    mmio: BTreeMap<u64, virtio::mmio::MmioTransport>,
    /// The block devices among them (reports, I/O threads).
    blocks: Vec<virtio::SharedBlock>,
    /// The network devices among them.
    nets: Vec<Arc<virtio::net::MmioNet>>,
}

impl Bus {
    /// Creates the devices; opens the serial console (`--serial`: its
    /// output file, pty or socket; error: it cannot be opened, naming it)
    /// and prints where a pty or socket console is. Without a
    /// `stage` device its doorbell ports read as open bus, which the guest
    /// agent takes as "no channel"; `legacy_pc` adds the CMOS clock and the
    /// i8042 reset a Linux guest uses.
    pub fn new(
        serial: &SerialConfig,
        stage: Option<Arc<StageDevice>>,
        legacy_pc: bool,
    ) -> io::Result<Self> {
        let console = legacy::console::open(serial)?;
        if let Some(line) = &console.announce {
            eprintln!("stagevm: {line}");
        }
        let trigger = EventFdTrigger(EventFd::new(libc::EFD_NONBLOCK)?);
        let room = RoomEvent(EventFd::new(libc::EFD_NONBLOCK)?);
        let (drain, flusher) = console.drain.unzip();
        Ok(Self {
            serial: Mutex::new(Serial::with_events(trigger, room, console.out)),
            console_input: Mutex::new(Some(console.input)),
            console_output: Mutex::new(drain),
            console_flusher: flusher,
            _terminal: console.restore,
            stage,
            legacy: legacy_pc.then(Legacy::new),
            mmio: BTreeMap::new(),
            blocks: Vec::new(),
            nets: Vec::new(),
        })
    }

    /// The console's input and a handle on the UART's "FIFO emptied" event,
    /// for the `serial-in` thread; `None` when the console has no input
    /// (or it was taken). Error: the event cannot be duplicated.
    pub fn take_console_input(&self) -> io::Result<Option<(legacy::console::Input, EventFd)>> {
        let mut slot = self.console_input.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*slot, None | Some(legacy::console::Input::None)) {
            return Ok(None);
        }
        let room = self.lock_serial().events().0.try_clone()?;
        Ok(slot.take().map(|input| (input, room)))
    }

    /// stdout's buffered output, for the `serial-out` thread; `None` for
    /// the other consoles (or once taken).
    pub fn take_console_output(&self) -> Option<legacy::serial_out::Drain> {
        self.console_output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn serial_offset(port: u16) -> Option<u8> {
        port.checked_sub(SERIAL_PORT_BASE)
            .filter(|off| *off < SERIAL_PORT_COUNT)
            .map(|off| off as u8)
    }

    /// Handles an `in` by vCPU `vcpu` from `port`: fills `data` (1, 2 or 4
    /// bytes). Unknown ports read as all ones, like an open ISA bus.
    pub fn pio_read(&self, vcpu: u32, port: u16, data: &mut [u8]) {
        data.fill(0xff);
        if let Some(legacy) = self.legacy.as_ref().filter(|_| Legacy::handles(port)) {
            legacy.pio_read(port, data);
        } else if let Some(stage) = self
            .stage
            .as_ref()
            .filter(|_| stage_device::stage::handles(port))
        {
            stage.read_status(vcpu, port, data);
        } else if let Some(offset) = Self::serial_offset(port) {
            if let Some(first) = data.first_mut() {
                *first = self.lock_serial().read(offset);
            }
        } else {
            tracing::trace!(port = format_args!("{port:#x}"), "read from unhandled port");
        }
    }

    /// Handles an `out` by vCPU `vcpu` of `data` (1, 2 or 4 bytes, little
    /// endian) to `port`. A stage-channel WAIT blocks the caller.
    pub fn pio_write(&self, vcpu: u32, port: u16, data: &[u8]) -> PioAction {
        if let Some(legacy) = self.legacy.as_ref().filter(|_| Legacy::handles(port)) {
            return legacy.pio_write(port, data);
        }
        if let Some(stage) = self
            .stage
            .as_ref()
            .filter(|_| stage_device::stage::handles(port))
        {
            return match stage.doorbell(vcpu, port, data) {
                Some(registered) => PioAction::StageRegistered(registered),
                None => PioAction::Continue,
            };
        }
        if let Some(offset) = Self::serial_offset(port) {
            if let Some(&byte) = data.first() {
                if let Err(e) = self.lock_serial().write(offset, byte) {
                    // Once per byte the guest writes: rate-limited (issue 14 D13).
                    stage_device::guest_warn!("serial output failed: {e}");
                }
            }
            return PioAction::Continue;
        }
        match port {
            SHUTDOWN_PORT => {
                let mut raw = [0u8; 4];
                let n = data.len().min(4);
                raw[..n].copy_from_slice(&data[..n]);
                PioAction::Shutdown(u32::from_le_bytes(raw))
            }
            VCPU_STOP_PORT => PioAction::StopVcpu,
            _ => {
                tracing::trace!(port = format_args!("{port:#x}"), "write to unhandled port");
                PioAction::Continue
            }
        }
    }

    /// A second handle on the UART's interrupt `EventFd`, for an irqfd (the
    /// Linux boot routes it to IRQ 4 of the in-kernel irqchip). Error: the
    /// descriptor cannot be duplicated.
    pub fn serial_irq_fd(&self) -> io::Result<EventFd> {
        self.lock_serial().interrupt_evt().0.try_clone()
    }

    /// Adds a virtio-mmio block device; `ioeventfd` tells whether KVM
    /// signals its notifications itself.
    pub fn add_block(&mut self, block: virtio::SharedBlock, ioeventfd: bool) {
        self.add_mmio(block.clone(), ioeventfd);
        self.blocks.push(block);
    }

    /// Maps `device`'s register window at its base GPA.
    fn add_mmio(&mut self, device: Arc<dyn virtio::mmio::VirtioDevice>, ioeventfd: bool) {
        let base = device.base();
        self.mmio
            .insert(base, virtio::mmio::MmioTransport::new(device, ioeventfd));
    }

    /// The block devices.
    pub fn blocks(&self) -> impl Iterator<Item = &virtio::SharedBlock> {
        self.blocks.iter()
    }

    /// The block devices' reports.
    pub fn block_reports(&self) -> Vec<virtio::block::BlockReport> {
        self.blocks
            .iter()
            .map(|b| b.report(self.ioeventfd(b.base)))
            .collect()
    }

    /// Adds a virtio-mmio network device; `ioeventfd` tells whether KVM
    /// signals its notifications itself.
    pub fn add_net(&mut self, net: Arc<virtio::net::MmioNet>, ioeventfd: bool) {
        self.add_mmio(net.clone(), ioeventfd);
        self.nets.push(net);
    }

    /// The network devices.
    pub fn nets(&self) -> impl Iterator<Item = &Arc<virtio::net::MmioNet>> {
        self.nets.iter()
    }

    /// The network devices' reports.
    pub fn net_reports(&self) -> Vec<virtio::net::NetReport> {
        self.nets
            .iter()
            .map(|n| n.report(self.ioeventfd(n.base)))
            .collect()
    }

    /// Whether KVM delivers the notifications of the window at `base`.
    fn ioeventfd(&self, base: u64) -> bool {
        self.mmio.get(&base).is_some_and(|t| t.ioeventfd())
    }

    /// The register window holding `addr`, and `addr`'s offset in it.
    fn mmio_at(&self, addr: u64) -> Option<(&virtio::mmio::MmioTransport, u64)> {
        let (base, t) = self.mmio.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < stagevm_arch::layout::MMIO_SIZE).then_some((t, offset))
    }

    /// An MMIO read at guest-physical `addr`; unbacked addresses read as ones.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        match self.mmio_at(addr) {
            Some((t, offset)) => t.read(offset, data),
            None => {
                tracing::trace!("MMIO read from unmapped {addr:#x}");
                data.fill(0xff);
            }
        }
    }

    /// An MMIO write at guest-physical `addr`; unbacked addresses ignore it.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) {
        match self.mmio_at(addr) {
            Some((t, offset)) => {
                t.write(offset, data);
            }
            None => tracing::trace!("MMIO write to unmapped {addr:#x}"),
        }
    }

    /// Flushes the serial output (called once at VM exit).
    pub fn flush(&self) {
        if let Some(f) = &self.console_flusher {
            let lost = f.flush(legacy::serial_out::FLUSH_TIMEOUT);
            if lost > 0 {
                tracing::warn!(
                    "console: {lost} bytes of output not written within {:?} (stdout not read?)",
                    legacy::serial_out::FLUSH_TIMEOUT
                );
            }
        } else if let Err(e) = self.lock_serial().writer_mut().flush() {
            tracing::warn!("serial flush failed: {e}");
        }
    }

    fn lock_serial(&self) -> std::sync::MutexGuard<'_, Uart> {
        // A vCPU thread that panicked while holding the lock leaves the UART
        // state intact (every update is a single field store), so keep going.
        self.serial.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The console's input goes into the UART's receive FIFO.
impl legacy::console::Sink for Bus {
    fn room(&self) -> usize {
        self.lock_serial().fifo_capacity()
    }

    fn push(&self, bytes: &[u8]) -> usize {
        match self.lock_serial().enqueue_raw_bytes(bytes) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("serial input not taken: {e:?}");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_carries_the_code_and_unknown_ports_read_ones() {
        let d = Bus::new(&SerialConfig::Null, None, false).unwrap();
        assert_eq!(d.pio_write(0, SHUTDOWN_PORT, &[7]), PioAction::Shutdown(7));
        assert_eq!(
            d.pio_write(0, SHUTDOWN_PORT, &300u32.to_le_bytes()),
            PioAction::Shutdown(300)
        );
        assert_eq!(d.pio_write(0, VCPU_STOP_PORT, &[0]), PioAction::StopVcpu);
        assert_eq!(d.pio_write(0, 0x80, &[0]), PioAction::Continue);
        let mut buf = [0u8; 2];
        d.pio_read(0, 0x80, &mut buf);
        assert_eq!(buf, [0xff, 0xff]);
        // LSR reports the transmitter empty, as a guest driver expects.
        let mut lsr = [0u8];
        d.pio_read(0, SERIAL_PORT_BASE + 5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }
}
