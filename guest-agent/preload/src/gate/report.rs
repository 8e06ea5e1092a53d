//! The stage point's part for the stage channel (`crate::channel`): which
//! points the channel must hear of, and reporting them through libstage.

use std::sync::atomic::Ordering::Relaxed;

use super::{Runtime, ThreadState, NO_STAGE, REPORT_EXIT, REPORT_NONE};
use crate::channel;
use crate::hooks::PointKind;

impl Runtime {
    /// Whether the channel must hear of this point; sets what to report.
    /// A stage point reports a switch into its stage when the channel's
    /// stage differs (after a request marker it is none, so the first
    /// stage of the next request is reported even when the gate's stage
    /// did not change); a request marker reports the request's end once.
    #[inline]
    pub(super) fn channel_due(t: &ThreadState, point: PointKind) -> bool {
        let (stage, report) = match point {
            PointKind::Stage(s) => (s, u16::from(s)),
            PointKind::Request(_) => (NO_STAGE, REPORT_EXIT),
        };
        if t.ch_stage.replace(stage) == stage {
            return false;
        }
        t.report.set(report);
        true
    }

    /// The channel's part of a stage point: reports the switch or the
    /// request's end through libstage.
    #[cold]
    pub(super) fn report(&self, t: &ThreadState) {
        let ok = match t.report.replace(REPORT_NONE) {
            REPORT_NONE => true,
            REPORT_EXIT => channel::exit(),
            s => channel::enter(s as u8),
        };
        if !ok {
            self.control
                .get()
                .header
                .channel_drops
                .fetch_add(1, Relaxed);
        }
    }
}
