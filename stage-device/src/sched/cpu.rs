//! The CPU the guest's work costs, from the host's side: each vCPU
//! thread's CPU time (its thread CPU clock, `clock_gettime` on the clock
//! id glibc's `pthread_getcpuclockid` gives, which counts the running
//! slice to the ns) and the time it waited runnable for a CPU
//! (`/proc/self/task/TID/schedstat`'s second field; its first, the CPU
//! time, lags a running thread by up to a scheduler tick, 4 ms at
//! `HZ=250`: 20 % of a policy period), minus the guest's idle spinning.
//!
//! A vCPU thread is on a CPU while the guest works, while it spins idle
//! (the test guest polls its run queue before it parks; an owned core
//! polls for milliseconds), and while the VMM handles its exits; it sleeps
//! while parked in WAIT. The guest reports its idle time exactly (ABI
//! minor 2: idle visits are always timed), spinning and parked alike, on
//! its own clock, which runs on while the thread waits for a CPU. So, per
//! vCPU and window *W* (ns):
//!
//! * sleep = *W* − on-CPU − runnable-waiting (parked, mostly);
//! * spinning idle (wall) = guest idle − sleep;
//! * the share of its runnable time the thread got a CPU, f = on-CPU ÷
//!   (on-CPU + waiting), applies to its spinning as to its work (the host
//!   scheduler does not know which it is doing);
//! * **work CPU** = on-CPU − f × spinning idle.
//!
//! Work CPU divided by the requests completed is the **CPU per request**
//! `auto` compares below saturation. The VM's **utilisation** is the
//! larger of two shares: work CPU over *W* × the cores the vCPUs may use
//! (at most one each), and the guest's busy share, 1 − its idle time over
//! *W* × the vCPUs. The first misses saturation when the VMM's own threads
//! or other host load take part of the cores (a debug build's `stage-sched`
//! took ~20 % of a 2-core machine: a closed loop measured 0.8); the second
//! overstates it when vCPUs outnumber cores (a vCPU waiting for a core is
//! busy to the guest) but never misses it: a saturated guest never idles.
//! Exit
//! handling inside a request (a doorbell WAKE, a disk notification) is the
//! request's cost; an idle vCPU's WAIT exit is idle.

use std::io::Read;

/// A vCPU thread's scheduler statistics (cumulative, ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time on a CPU.
    pub on_cpu_ns: u64,
    /// Time runnable, waiting on a run queue.
    pub runq_wait_ns: u64,
}

/// Largest thread id Linux gives (`PID_MAX_LIMIT`, `include/linux/threads.h`).
const PID_MAX_LIMIT: i32 = 1 << 22;

/// Parses `/proc/…/schedstat` (`on-cpu-ns wait-ns timeslices`).
pub fn parse_schedstat(text: &str) -> Option<SchedStat> {
    let mut words = text.split_ascii_whitespace();
    let on_cpu_ns = words.next()?.parse().ok()?;
    let runq_wait_ns = words.next()?.parse().ok()?;
    Some(SchedStat {
        on_cpu_ns,
        runq_wait_ns,
    })
}

/// CPU time (ns) of thread `tid` of this process: its thread CPU clock,
/// `(~tid << 3) | 6` (`CPUCLOCK_SCHED` | `CPUCLOCK_PERTHREAD_MASK`, as
/// glibc's `pthread_getcpuclockid` makes it; Linux,
/// `include/linux/posix-timers_types.h`). `None` when the thread is gone
/// or `tid` is not a thread id (above Linux's `PID_MAX_LIMIT`, 2²², the
/// shift would reach another clock).
pub fn thread_cpu_time_ns(tid: i32) -> Option<u64> {
    if !(1..=PID_MAX_LIMIT).contains(&tid) {
        return None;
    }
    let clock = ((!tid) << 3) | 6;
    let t = nix::time::clock_gettime(nix::time::ClockId::from_raw(clock)).ok()?;
    Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Thread `tid`'s CPU time ([`thread_cpu_time_ns`]) and its time waiting
/// for a CPU (schedstat; 0 when the kernel has no `CONFIG_SCHED_INFO`).
/// `None` when the thread is gone.
pub fn read_schedstat(tid: i32) -> Option<SchedStat> {
    let on_cpu_ns = thread_cpu_time_ns(tid)?;
    let runq_wait_ns = std::fs::File::open(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|mut f| {
            let mut buf = [0u8; 128];
            let n = f.read(&mut buf).ok()?;
            parse_schedstat(std::str::from_utf8(&buf[..n]).ok()?)
        })
        .map_or(0, |s| s.runq_wait_ns);
    Some(SchedStat {
        on_cpu_ns,
        runq_wait_ns,
    })
}

/// Work CPU (ns) of one vCPU in a window of `window_ns`: `stat` is the
/// window's growth of its schedstat, `idle_ns` the guest's idle time in
/// it (see the module docs).
pub fn work_cpu_ns(stat: SchedStat, idle_ns: u64, window_ns: u64) -> u64 {
    let on = stat.on_cpu_ns;
    let runnable = on.saturating_add(stat.runq_wait_ns);
    if runnable == 0 {
        return 0;
    }
    let sleep = window_ns.saturating_sub(runnable);
    let spinning = idle_ns.saturating_sub(sleep);
    let spent = (u128::from(on) * u128::from(spinning) / u128::from(runnable)) as u64;
    on.saturating_sub(spent)
}

/// One window's CPU figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuWindow {
    /// Work CPU of all vCPUs (ns).
    pub work_ns: u64,
    /// Per vCPU, work CPU ÷ the window (0..=1).
    pub vcpu_utilisation: Vec<f64>,
    /// The larger of work CPU ÷ (window × the cores the vCPUs may use)
    /// and 1 − the guest's idle ÷ (window × vCPUs) (0..=1; module docs).
    pub utilisation: f64,
}

/// Successive schedstat reads of the vCPU threads, turned into windows.
#[derive(Debug, Default)]
pub struct CpuMeter {
    last: Vec<Option<SchedStat>>,
}

impl CpuMeter {
    /// The window since the previous read: `now` per vCPU (its schedstat,
    /// `None` when unreadable), `idle_ns` per vCPU (the guest's), the
    /// window's length and the cores the vCPUs may use (`cores` ≥ 1).
    /// `None` for the first read, when a vCPU's statistics are missing or
    /// went backwards (a thread that restarted), or for an empty window.
    pub fn window(
        &mut self,
        now: &[Option<SchedStat>],
        idle_ns: &[u64],
        window_ns: u64,
        cores: usize,
    ) -> Option<CpuWindow> {
        let last = std::mem::replace(&mut self.last, now.to_vec());
        if last.len() != now.len() || window_ns == 0 {
            return None;
        }
        let mut w = CpuWindow::default();
        for (v, (n, l)) in now.iter().zip(&last).enumerate() {
            let (n, l) = ((*n)?, (*l)?);
            let stat = SchedStat {
                on_cpu_ns: n.on_cpu_ns.checked_sub(l.on_cpu_ns)?,
                runq_wait_ns: n.runq_wait_ns.checked_sub(l.runq_wait_ns)?,
            };
            let idle = idle_ns.get(v).copied().unwrap_or(0);
            let work = work_cpu_ns(stat, idle, window_ns);
            w.work_ns = w.work_ns.saturating_add(work);
            w.vcpu_utilisation
                .push((work as f64 / window_ns as f64).min(1.0));
        }
        let capacity = window_ns as f64 * cores.clamp(1, now.len().max(1)) as f64;
        let host = (w.work_ns as f64 / capacity).min(1.0);
        let idle: u64 = idle_ns
            .iter()
            .take(now.len())
            .map(|i| (*i).min(window_ns))
            .sum();
        let guest = 1.0 - idle as f64 / (window_ns as f64 * now.len().max(1) as f64);
        w.utilisation = host.max(guest).clamp(0.0, 1.0);
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_parses_and_this_thread_has_one() {
        assert_eq!(
            parse_schedstat("249286 1200 3\n"),
            Some(SchedStat {
                on_cpu_ns: 249286,
                runq_wait_ns: 1200
            })
        );
        assert_eq!(parse_schedstat("12"), None);
        assert_eq!(parse_schedstat("a b c"), None);
        // This thread's CPU clock counts its running slice to the ns.
        let tid = nix::unistd::gettid().as_raw();
        let a = read_schedstat(tid)
            .expect("this thread's CPU clock")
            .on_cpu_ns;
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        let b = read_schedstat(tid).unwrap().on_cpu_ns;
        assert!(b > a, "{a} then {b}");
        assert_eq!(read_schedstat(0), None);
        assert_eq!(read_schedstat(i32::MAX), None);
        // A thread id no thread has (ids are below pid_max, 2^22 at most).
        assert_eq!(read_schedstat(PID_MAX_LIMIT), None);
    }

    #[test]
    fn work_is_on_cpu_time_minus_spinning() {
        let ms = 1_000_000;
        // Busy the whole 20 ms on its own core: all work.
        let s = |on, wait| SchedStat {
            on_cpu_ns: on * ms,
            runq_wait_ns: wait * ms,
        };
        assert_eq!(work_cpu_ns(s(20, 0), 0, 20 * ms), 20 * ms);
        // On an owned core, 8 ms of the 20 spent polling idle: 12 ms work.
        assert_eq!(work_cpu_ns(s(20, 0), 8 * ms, 20 * ms), 12 * ms);
        // Parked 8 ms (asleep), spun 2 ms: 10 ms work.
        assert_eq!(work_cpu_ns(s(12, 0), 10 * ms, 20 * ms), 10 * ms);
        // Sharing a core: on a CPU half of its runnable time; 4 ms of the
        // guest's idle wall time was spinning, half of it on the CPU.
        assert_eq!(work_cpu_ns(s(8, 8), 8 * ms, 20 * ms), 6 * ms);
        assert_eq!(work_cpu_ns(s(0, 0), 20 * ms, 20 * ms), 0);
        // Nothing a guest reports makes it negative.
        assert_eq!(work_cpu_ns(s(5, 0), u64::MAX, 20 * ms), 0);
    }

    #[test]
    fn the_meter_takes_deltas_and_refuses_gaps() {
        let ms = 1_000_000;
        let mut m = CpuMeter::default();
        let st = |on| {
            Some(SchedStat {
                on_cpu_ns: on * ms,
                runq_wait_ns: 0,
            })
        };
        assert_eq!(m.window(&[st(100), st(100)], &[0, 0], 20 * ms, 2), None);
        let w = m
            .window(&[st(120), st(110)], &[0, 10 * ms], 20 * ms, 2)
            .unwrap();
        // vCPU 1: 10 ms on the CPU, 10 ms asleep: all of it work.
        assert_eq!(w.work_ns, 30 * ms);
        assert_eq!(w.vcpu_utilisation, vec![1.0, 0.5]);
        assert!((w.utilisation - 0.75).abs() < 1e-9);
        // Saturated guest (no idle) whose threads got 16 of 20 ms each
        // (the VMM's own threads took the rest): host share 0.8, guest
        // share 1 — saturated.
        let w = m.window(&[st(136), st(126)], &[0, 0], 20 * ms, 2).unwrap();
        assert!((w.work_ns as f64 / (40 * ms) as f64 - 0.8).abs() < 1e-9);
        assert_eq!(w.utilisation, 1.0);
        // 4 vCPUs on 2 cores, each on a CPU 5 of 20 ms and idle 10:
        // host share 20/40 = 0.5, guest share 1 − 40/80 = 0.5.
        let mut m4 = CpuMeter::default();
        let four = |on| [st(on), st(on), st(on), st(on)];
        m4.window(&four(0), &[0; 4], 20 * ms, 2);
        let w = m4.window(&four(5), &[10 * ms; 4], 20 * ms, 2).unwrap();
        assert!((w.utilisation - 0.5).abs() < 1e-9, "{w:?}");
        assert_eq!(m.window(&[st(130), None], &[0, 0], 20 * ms, 2), None);
        assert_eq!(m.window(&[st(100), st(100)], &[0, 0], 20 * ms, 2), None);
    }
}
