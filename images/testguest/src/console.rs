//! `console=1`: vCPU 0 reads lines typed on the serial console (COM1's
//! receive FIFO, polled through the line status register: interrupts are
//! off in ring 3) and answers each with `testguest: console got 'LINE'`
//! until the line `quit`. Every poll is a port-I/O exit, so this is for
//! tests, not for speed. Longer lines than [`LINE`] bytes are cut.
//!
//! `console_after=MS` keeps the receiver off for MS ms first (nothing
//! reads the FIFO: a guest that ignores its console), then answers as
//! above.

use crate::{inb, print_line, SERIAL_LSR, SERIAL_PORT_BASE};

/// LSR bit 0: data ready (16550 datasheet).
const LSR_DATA_READY: u8 = 1;
/// Receive buffer register offset.
const RBR: u16 = 0;
/// Bytes kept of one line.
const LINE: usize = 128;

/// Answers lines until `quit`, after `after_ms` ms of not reading on a
/// TSC of `tsc_khz` kHz; prints how many it answered.
pub fn echo_lines(after_ms: u64, tsc_khz: u64) {
    // SAFETY: rdtsc is allowed in ring 3 (CR4.TSD clear).
    let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
    let until = tsc().saturating_add(after_ms.saturating_mul(tsc_khz));
    while tsc() < until {
        core::hint::spin_loop();
    }
    println!("testguest: console ready");
    let mut line = [0u8; LINE];
    let mut len = 0;
    let mut answered = 0u32;
    loop {
        while inb(SERIAL_PORT_BASE + SERIAL_LSR) & LSR_DATA_READY == 0 {
            core::hint::spin_loop();
        }
        let b = inb(SERIAL_PORT_BASE + RBR);
        if b != b'\r' && b != b'\n' {
            if len < LINE {
                line[len] = b;
                len += 1;
            }
            continue;
        }
        if len == 0 {
            continue;
        }
        let text = core::str::from_utf8(&line[..len]).unwrap_or("(not UTF-8)");
        if text == "quit" {
            break;
        }
        println!("testguest: console got '{}'", text.escape_debug());
        answered += 1;
        len = 0;
    }
    println!("testguest: console answered {} lines", answered);
}
