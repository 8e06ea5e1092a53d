//! PC legacy ports a Linux guest touches at boot and that the in-kernel
//! irqchip does not emulate: the CMOS real-time clock (ports `0x70`/`0x71`)
//! and the i8042 controller's reset line (a write of `0xfe` to port `0x64`,
//! Linux's `reboot=k`, the default after ACPI).
//!
//! Only Linux boots get these (the ring-3 unikernel sees every unknown port as
//! open bus, as before). Without a CMOS, port reads return `0xff`, which tells
//! Linux an update is always in progress and the clock is invalid.

use std::sync::Mutex;

use crate::devices::PioAction;

/// CMOS index and data ports.
pub const CMOS_INDEX: u16 = 0x70;
/// CMOS data port.
pub const CMOS_DATA: u16 = 0x71;
/// i8042 command/status port.
pub const I8042_COMMAND: u16 = 0x64;
/// i8042 command that pulses the CPU reset line.
pub const I8042_RESET: u8 = 0xfe;

/// MC146818 register numbers.
const RTC_SECONDS: u8 = 0x00;
const RTC_MINUTES: u8 = 0x02;
const RTC_HOURS: u8 = 0x04;
const RTC_WEEKDAY: u8 = 0x06;
const RTC_DAY: u8 = 0x07;
const RTC_MONTH: u8 = 0x08;
const RTC_YEAR: u8 = 0x09;
const RTC_REG_A: u8 = 0x0a;
const RTC_REG_B: u8 = 0x0b;
const RTC_REG_D: u8 = 0x0d;
const RTC_CENTURY: u8 = 0x32;
/// Register A: 32.768 kHz time base, 1024 Hz rate, no update in progress.
const REG_A_VALUE: u8 = 0x26;
/// Register B: 24-hour mode, BCD.
const REG_B_VALUE: u8 = 0x02;
/// Register D: valid RAM and time (VRT).
const REG_D_VALUE: u8 = 0x80;

/// The legacy ports of a Linux VM.
#[derive(Debug, Default)]
pub struct Legacy {
    cmos_index: Mutex<u8>,
}

fn bcd(v: u32) -> u8 {
    (((v / 10) << 4) | (v % 10)) as u8
}

/// Year, month (1–12) and day (1–31) of `days` since 1970-01-01 in the
/// proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (u32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as u32;
    (year, month, day)
}

/// The host's UTC time as (seconds, minutes, hours, weekday 1–7, day,
/// month, year in the century, century) for the CMOS clock.
fn now_utc() -> [u32; 8] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday; CMOS weekdays run 1 (Sunday) to 7.
    let weekday = ((days + 4).rem_euclid(7) + 1) as u32;
    [
        secs % 60,
        secs / 60 % 60,
        secs / 3600,
        weekday,
        day,
        month,
        year % 100,
        year / 100,
    ]
}

impl Legacy {
    /// Creates the ports.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `port` is one of these devices'.
    pub fn handles(port: u16) -> bool {
        matches!(port, CMOS_INDEX | CMOS_DATA | I8042_COMMAND)
    }

    /// The value of CMOS register `reg` now.
    pub fn cmos_register(reg: u8) -> u8 {
        let [sec, min, hour, wday, day, month, year, century] = now_utc();
        match reg {
            RTC_SECONDS => bcd(sec),
            RTC_MINUTES => bcd(min),
            RTC_HOURS => bcd(hour),
            RTC_WEEKDAY => bcd(wday),
            RTC_DAY => bcd(day),
            RTC_MONTH => bcd(month),
            RTC_YEAR => bcd(year),
            RTC_CENTURY => bcd(century),
            RTC_REG_A => REG_A_VALUE,
            RTC_REG_B => REG_B_VALUE,
            RTC_REG_D => REG_D_VALUE,
            _ => 0,
        }
    }

    /// An `in` from `port`: fills `data`. The i8042 status reads as open bus
    /// (`0xff`), so Linux finds no keyboard controller.
    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        data.fill(0xff);
        if port == CMOS_DATA {
            let reg = *self.cmos_index.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(first) = data.first_mut() {
                *first = Self::cmos_register(reg);
            }
        }
    }

    /// An `out` of `data` to `port`. The i8042 reset command ends the VM with
    /// exit code 0 (a guest reboot); CMOS writes other than the index are
    /// ignored (the clock is read-only).
    pub fn pio_write(&self, port: u16, data: &[u8]) -> PioAction {
        let Some(&byte) = data.first() else {
            return PioAction::Continue;
        };
        match port {
            // Bit 7 of the index masks NMIs on a PC; only the index matters here.
            CMOS_INDEX => *self.cmos_index.lock().unwrap_or_else(|p| p.into_inner()) = byte & 0x7f,
            I8042_COMMAND if byte == I8042_RESET => {
                tracing::info!("guest reset through the i8042 controller");
                return PioAction::Shutdown(0);
            }
            _ => {}
        }
        PioAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_bcd_and_is_never_updating() {
        let legacy = Legacy::new();
        let read = |reg: u8| {
            legacy.pio_write(CMOS_INDEX, &[reg | 0x80]);
            let mut b = [0u8];
            legacy.pio_read(CMOS_DATA, &mut b);
            b[0]
        };
        assert_eq!(read(RTC_REG_A) & 0x80, 0, "UIP clear");
        assert_eq!(read(RTC_REG_D), 0x80, "valid");
        let month = read(RTC_MONTH);
        assert!(
            (0x01..=0x12).contains(&month) && month & 0xf <= 9,
            "{month:#x}"
        );
        assert_eq!(read(RTC_CENTURY), 0x20);
        assert_eq!(bcd(59), 0x59);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
    }

    #[test]
    fn reset_ends_the_vm() {
        let legacy = Legacy::new();
        assert_eq!(
            legacy.pio_write(I8042_COMMAND, &[0xaa]),
            PioAction::Continue
        );
        assert_eq!(
            legacy.pio_write(I8042_COMMAND, &[I8042_RESET]),
            PioAction::Shutdown(0)
        );
    }
}
