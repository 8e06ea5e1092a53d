//! Shared pieces of the stagevm benchmarks: what to run ([`target`]),
//! booting the test guest ([`guest`]), the native references of the
//! headline's workload ([`native`]), small statistics ([`stats`]) and the
//! machine's background load during a run ([`load`]).

pub mod target;

pub mod guest;
pub mod native;
pub mod shape;

/// The CPU model and caches (from `lscpu`).
pub fn machine() -> String {
    let out = std::process::Command::new("lscpu")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let text = out.unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{}, {} CPUs, L1i {}, L2 {}, L3 {} (lscpu)",
        get("Model name:"),
        get("CPU(s):"),
        get("L1i cache:"),
        get("L2 cache:"),
        get("L3 cache:")
    )
}

/// A TrueType font for the plots' labels (plotters' `ab_glyph` backend
/// needs one registered; Debian's fonts-dejavu-core is on these machines).
pub const PLOT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers [`PLOT_FONT`] as plotters' `sans-serif`.
///
/// # Errors
/// When the font cannot be read or is not usable.
pub fn register_plot_font() -> anyhow::Result<()> {
    use anyhow::Context as _;
    let font =
        std::fs::read(PLOT_FONT).with_context(|| format!("reading the plot font {PLOT_FONT}"))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{PLOT_FONT} is not a usable font"))
}

/// Writes `section` into the results file `path` between the marker lines
/// `begin` and `end` (replacing what was between them; appended with its
/// markers when they are absent; the file is created if needed).
///
/// # Errors
/// When the file cannot be written.
pub fn write_section(
    path: &std::path::Path,
    begin: &str,
    end: &str,
    section: &str,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let old =
        std::fs::read_to_string(path).unwrap_or_else(|_| "# stagevm benchmark results\n".into());
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{begin}\n{section}{}", &old[..b], &old[e..])
        }
        _ => format!("{}\n{begin}\n{section}{end}\n", old.trim_end()),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

/// How busy the rest of the machine was while a benchmark ran: busy CPU
/// time of the whole machine (`/proc/stat`) minus this process's and its
/// waited-for children's (`getrusage`), over the wall-clock time.
pub mod load {
    use std::time::Instant;

    /// Background load (cores) above which a machine counts as busy: a
    /// target must not be called met on it.
    pub const BUSY_CORES: f64 = 0.2;

    /// Busy CPU time of the whole machine so far (s), from `/proc/stat`
    /// (user + nice + system + irq + softirq + steal, USER_HZ = 100 ticks/s).
    pub fn machine_busy_s() -> f64 {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: u64 = stat
            .lines()
            .next()
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .enumerate()
                    .filter(|(k, _)| matches!(k, 0 | 1 | 2 | 5 | 6 | 7))
                    .filter_map(|(_, v)| v.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0);
        ticks as f64 / 100.0
    }

    /// CPU time (s) this process and its waited-for children used.
    pub fn own_cpu_s() -> f64 {
        let mut total = 0.0;
        for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
            // SAFETY: getrusage fills the struct we pass.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `ru` is a valid, writable rusage.
            if unsafe { libc::getrusage(who, &mut ru) } == 0 {
                for tv in [ru.ru_utime, ru.ru_stime] {
                    total += tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
                }
            }
        }
        total
    }

    /// Measures the background load from its creation on.
    #[derive(Clone, Copy, Debug)]
    pub struct Meter {
        started: Instant,
        busy0: f64,
        own0: f64,
    }

    impl Meter {
        /// Starts measuring now.
        pub fn start() -> Self {
            Self {
                started: Instant::now(),
                busy0: machine_busy_s(),
                own0: own_cpu_s(),
            }
        }

        /// Cores other processes used on average since [`Meter::start`]
        /// (≥ 0; the run's own children count only once waited for).
        pub fn others_cores(&self) -> f64 {
            let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
            let others = (machine_busy_s() - self.busy0) - (own_cpu_s() - self.own0);
            others.max(0.0) / elapsed
        }
    }
}

/// Statistics over repeated runs.
pub mod stats {
    /// Median of the finite values in `v` (upper median for an even count;
    /// NaN when there is none).
    pub fn median(mut v: Vec<f64>) -> f64 {
        v.retain(|x| x.is_finite());
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            f64::NAN
        } else {
            v[v.len() / 2]
        }
    }

    /// Median and range of per-round values.
    #[derive(Clone, Copy, Debug)]
    pub struct Spread {
        /// Median (upper median for an even count).
        pub med: f64,
        /// Smallest value.
        pub min: f64,
        /// Largest value.
        pub max: f64,
        /// How many finite values there were.
        pub n: usize,
    }

    impl Spread {
        /// Over the finite values of `v` (all NaN when there is none).
        pub fn of(v: &[f64]) -> Self {
            let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
            if finite.is_empty() {
                return Self {
                    med: f64::NAN,
                    min: f64::NAN,
                    max: f64::NAN,
                    n: 0,
                };
            }
            Self {
                med: median(finite.clone()),
                min: finite.iter().copied().fold(f64::INFINITY, f64::min),
                max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                n: finite.len(),
            }
        }

        /// `median (min–max)` with `digits` decimals, the median alone for a
        /// single value, or `-`.
        pub fn plain(&self, digits: usize) -> String {
            match self.n {
                0 => "-".into(),
                1 => format!("{:.digits$}", self.med),
                _ => format!(
                    "{:.digits$} ({:.digits$}–{:.digits$})",
                    self.med, self.min, self.max
                ),
            }
        }

        /// As a ratio: `1.040× (0.980–1.100)`, or `-`.
        pub fn ratio(&self) -> String {
            if self.med.is_finite() {
                format!("{:.3}× ({:.3}–{:.3})", self.med, self.min, self.max)
            } else {
                "-".into()
            }
        }

        /// As a rate: `123456 (120000–125000)`, or `-`.
        pub fn rate(&self) -> String {
            if self.med.is_finite() {
                format!("{:.0} ({:.0}–{:.0})", self.med, self.min, self.max)
            } else {
                "-".into()
            }
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn median_skips_non_finite_values() {
            assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
            assert_eq!(super::median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
            assert_eq!(super::median(vec![f64::NAN, 5.0]), 5.0);
            assert!(super::median(vec![]).is_nan());
        }
    }
}
