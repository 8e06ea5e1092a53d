//! Rate-limited logging for everything a guest can trigger.
//!
//! A guest can make the VMM log at will (a bad REGISTER, a corrupt ring
//! entry, a bad virtio register write), so every such call site logs through
//! [`guest_warn!`](crate::guest_warn): at most [`BURST`] lines per
//! [`WINDOW_NS`] per call site, as Firecracker's `error_rate_limited!`; the
//! lines over that are counted ([`suppressed`], in the report as
//! `log_lines_suppressed`), not printed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Lines one call site may log per window.
pub const BURST: u32 = 10;
/// The window (ns): 5 s.
pub const WINDOW_NS: u64 = 5_000_000_000;

static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Log lines suppressed so far, over every call site.
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// The budget of one call site.
pub struct RateLimit {
    window_start: AtomicU64,
    lines: AtomicU32,
}

impl RateLimit {
    /// A fresh budget (a `static` per call site).
    pub const fn new() -> Self {
        Self {
            window_start: AtomicU64::new(0),
            lines: AtomicU32::new(0),
        }
    }

    /// Whether a line may be logged now; counts it as suppressed if not.
    pub fn allow(&self) -> bool {
        let now = now_ns();
        let start = self.window_start.load(Ordering::Relaxed);
        if now.saturating_sub(start) >= WINDOW_NS
            && self
                .window_start
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.lines.store(0, Ordering::Relaxed);
        }
        if self.lines.fetch_add(1, Ordering::Relaxed) < BURST {
            true
        } else {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// `tracing::warn!` limited to [`BURST`] lines per [`WINDOW_NS`] at this
/// call site (see the module docs). Use it for anything a guest can
/// trigger.
#[macro_export]
macro_rules! guest_warn {
    ($($arg:tt)*) => {{
        static LIMIT: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        if LIMIT.allow() {
            $crate::__tracing::warn!($($arg)*);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_site_logs_its_burst_then_counts() {
        let limit = RateLimit::new();
        let before = suppressed();
        let allowed = (0..100_000).filter(|_| limit.allow()).count();
        assert_eq!(allowed, BURST as usize);
        assert!(suppressed() - before >= 100_000 - u64::from(BURST));
    }
}
