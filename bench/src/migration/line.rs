//! The machine's floor under a migration: what moving one cache line from
//! one stage core to the other costs.
//!
//! Two host threads, pinned to the two cores, pass a counter back and forth
//! through two cache lines (128-byte aligned, one written by each side):
//! each round trip moves each line once between the cores, so half a
//! round trip is one line transfer (a read miss on a line the other core
//! just wrote). A guest thread's migration cannot cost less than the
//! transfers it needs — at least the line that hands it over and the line
//! with its saved registers — so this figure tells whether a target in ns
//! is within the machine's reach (on bare metal a transfer is tens of ns;
//! inside a cloud VM it can be far more).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Result};

#[repr(align(128))]
struct Line(AtomicU64);

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // within it (cpu < CPU_SETSIZE is checked below).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        bail!("CPU {cpu} is out of range");
    }
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if r != 0 {
        bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// One run: `round_trips` round trips between `cores`; one-way ns.
fn run(cores: [usize; 2], round_trips: u64) -> Result<f64> {
    let ping = Line(AtomicU64::new(0));
    let pong = Line(AtomicU64::new(0));
    // The other side's pinning: 0 pending, 1 done, 2 failed.
    let ready = AtomicU64::new(0);
    pin(cores[0])?;
    std::thread::scope(|s| -> Result<f64> {
        let other = s.spawn(|| -> Result<()> {
            if let Err(e) = pin(cores[1]) {
                ready.store(2, Ordering::Release);
                return Err(e);
            }
            ready.store(1, Ordering::Release);
            for i in 1..=round_trips {
                while ping.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.0.store(i, Ordering::Release);
            }
            Ok(())
        });
        while ready.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        if ready.load(Ordering::Acquire) == 2 {
            return Err(other
                .join()
                .expect("the probe thread does not panic")
                .unwrap_err());
        }
        let start = Instant::now();
        for i in 1..=round_trips {
            ping.0.store(i, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
        }
        let elapsed = start.elapsed();
        other.join().expect("the probe thread does not panic")?;
        Ok(elapsed.as_nanos() as f64 / round_trips as f64 / 2.0)
    })
}

/// One-way cache-line transfer between `cores` (ns), one value per run of
/// `round_trips` round trips (`runs` runs). Runs on threads of its own, so
/// the caller's affinity (which the VMs it starts inherit) is untouched.
///
/// # Errors
/// When a thread cannot be pinned to its core.
pub fn transfer_ns(cores: [usize; 2], runs: usize, round_trips: u64) -> Result<Vec<f64>> {
    std::thread::spawn(move || (0..runs).map(|_| run(cores, round_trips)).collect())
        .join()
        .expect("the probe thread does not panic")
}
