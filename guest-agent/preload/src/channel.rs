//! The guest path: in a stagevm guest the library's stage points report
//! through the stage channel, and the VMM's stage map decides the gate.
//!
//! The reporting is libstage's (guest-agent/linux/libstage, C, compiled in
//! by `build.rs`), the same code a program linked with libstage runs: each
//! stage switch is `stage_enter(stage)` (a transition of the vCPU's
//! counter block with no system call, ABI minor 2; or an event in its
//! ring on an older host), each request marker `stage_exit()` (the request
//! is done; a timed one's latency goes to the vCPU's histogram, minor 4).
//! The VMM's report, API and metrics then show the stages, visits and
//! request latency as they do for any guest.
//!
//! The mode follows the map the VMM publishes in the shared page, read at
//! stage points (one load of its epoch; a copy only when it changed):
//! - a temporal visit policy (minor 3: `srpt`, `cohort`, `dbr`, `mg1`,
//!   `color`) on a map where every vCPU serves every stage turns the gate
//!   on with that policy (temporal staging);
//! - a map that gives stages their own vCPUs (spatial staging) leaves the
//!   gate off: libstage's `stage_enter` moves the thread to a vCPU of its
//!   stage (the agent's route), and the gate's lanes would fight it;
//! - FIFO on a shared map (`off`, `pinned`) turns the gate off, releasing
//!   every waiter.
//!
//! So `auto`'s trials of unstaged against temporal reach the library
//! without anything of its own: each trial epoch is a map.
//!
//! Enabled by `STAGEVM_CHANNEL`: `auto` (default: when `STAGEVM_FD` is set
//! or the device — `STAGEVM_DEVICE`, else `/dev/stagevm` — exists), `on`
//! (the same, but a missing device is warned about), `off`.

use std::ffi::{c_char, c_int, c_uint, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use hypercall_abi::stage::{VisitPolicy, MAX_STAGES};

use crate::control::{mode, Control};

/// libstage's `struct stage_map_view` (stage.h).
#[repr(C)]
struct MapView {
    epoch: u64,
    num_stages: u32,
    num_vcpus: u32,
    vcpus: [u64; MAX_STAGES],
    owned: u64,
    minor: u64,
    trace_every: u64,
    visit: u64,
}

extern "C" {
    fn stage_init() -> c_int;
    fn stage_name(id: c_uint, name: *const c_char) -> c_int;
    fn stage_register() -> c_int;
    fn stage_enter(id: c_uint) -> c_int;
    fn stage_exit() -> c_int;
    fn stage_map(out: *mut MapView) -> c_int;
    fn stage_map_epoch() -> u64;
    fn stage_mode() -> *const c_char;
}

/// The channel is open and registered: stage points report through it.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The map epoch the gate's mode last followed (0: none yet).
static FOLLOWED: AtomicU64 = AtomicU64::new(0);

/// True when stage points report through the channel.
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Relaxed)
}

/// True when the VMM published a map the gate has not followed yet.
#[inline]
pub fn map_changed() -> bool {
    // SAFETY: libstage is initialised (ACTIVE) before any caller sees it.
    active() && unsafe { stage_map_epoch() } != FOLLOWED.load(Relaxed)
}

/// Why the channel is not used.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// `STAGEVM_CHANNEL` holds something else than `auto`, `on`, `off`.
    #[error("STAGEVM_CHANNEL='{0}' is not auto, on or off")]
    BadSetting(String),
    /// A libstage call failed.
    #[error("{call}: {err}")]
    Libstage {
        /// The call (`stage_init`, `stage_name`, `stage_register`).
        call: &'static str,
        /// Its `-errno`, as an error.
        err: std::io::Error,
    },
}

fn check(call: &'static str, rc: c_int) -> Result<c_int, ChannelError> {
    if rc < 0 {
        Err(ChannelError::Libstage {
            call,
            err: std::io::Error::from_raw_os_error(-rc),
        })
    } else {
        Ok(rc)
    }
}

/// Whether to open the channel, from `STAGEVM_CHANNEL` and the device's
/// presence: `Ok(false)` when it is off or, under `auto`, absent.
pub fn wanted() -> Result<bool, ChannelError> {
    let setting = std::env::var("STAGEVM_CHANNEL").unwrap_or_else(|_| "auto".into());
    let present = || {
        std::env::var_os("STAGEVM_FD").is_some()
            || std::path::Path::new(
                &std::env::var_os("STAGEVM_DEVICE").unwrap_or_else(|| "/dev/stagevm".into()),
            )
            .exists()
    };
    match setting.as_str() {
        "off" => Ok(false),
        "auto" => Ok(present()),
        "on" => Ok(true),
        _ => Err(ChannelError::BadSetting(setting)),
    }
}

/// Opens the channel and registers `stages` (names, in stage-id order)
/// through libstage; from then on stage points report through it. Returns
/// libstage's reporting mode (`counters`, `rings`, or `none` until the
/// host's first map). Errors: a libstage call failed (its errno).
pub fn open(stages: &[String]) -> Result<String, ChannelError> {
    // SAFETY: libstage's documented start-up sequence, from the library's
    // constructor before the program runs threads; names are C strings we
    // own for the call.
    unsafe {
        check("stage_init", stage_init())?;
        for (i, name) in stages.iter().enumerate() {
            let c = CString::new(name.replace('\0', "")).unwrap_or_default();
            check("stage_name", stage_name(i as c_uint, c.as_ptr()))?;
        }
        check("stage_register", stage_register())?;
    }
    ACTIVE.store(true, Release);
    // SAFETY: stage_mode returns a static string.
    let m = unsafe { CStr::from_ptr(stage_mode()) };
    Ok(m.to_string_lossy().into_owned())
}

/// Reports a switch into stage `stage` (libstage `stage_enter`). Returns
/// false when libstage did not report it (counted by the caller).
pub fn enter(stage: u8) -> bool {
    // SAFETY: the channel is open (callers check `active`).
    unsafe { stage_enter(c_uint::from(stage)) >= 0 }
}

/// Reports the end of the thread's request (libstage `stage_exit`).
pub fn exit() -> bool {
    // SAFETY: as in `enter`.
    unsafe { stage_exit() >= 0 }
}

/// The gate's mode for a map: `(mode, policy)` (see the module docs).
/// `vcpus` is the map's vCPU mask per stage in use, `all` the mask of
/// every vCPU of the map.
pub fn mode_for(visit: u64, vcpus: &[u64], all: u64) -> (u32, Option<VisitPolicy>) {
    let shared = vcpus.iter().all(|v| *v & all == all);
    match VisitPolicy::from_code(visit).filter(|p| p.is_temporal()) {
        Some(p) if shared => (mode::TEMPORAL, Some(p)),
        _ => (mode::OFF, None),
    }
}

/// Follows the VMM's current map (see the module docs): sets the control
/// page's mode and policy from it. Followers take turns (a lock: two maps
/// published close together must not leave the older one's mode written
/// last); one that finds the epoch followed already returns at once.
pub fn follow(c: &Control) {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = FOLLOWED.load(Relaxed);
    let mut view = std::mem::MaybeUninit::<MapView>::zeroed();
    // SAFETY: libstage fills the view it is given (a zeroed, sized struct).
    if unsafe { stage_map(view.as_mut_ptr()) } < 0 {
        return;
    }
    // SAFETY: zero-initialised and filled by libstage.
    let view = unsafe { view.assume_init() };
    if view.epoch == seen {
        return;
    }
    FOLLOWED.store(view.epoch, Relaxed);
    let n = (view.num_stages as usize).min(MAX_STAGES);
    let all = match view.num_vcpus {
        0 => 0,
        v if v >= 64 => u64::MAX,
        v => (1u64 << v) - 1,
    };
    let (m, policy) = if view.epoch == 0 {
        (mode::OFF, None)
    } else {
        mode_for(view.visit, &view.vcpus[..n], all)
    };
    if let Some(p) = policy {
        c.header.policy.store(p.code() as u32, Relaxed);
    }
    c.header.mode.store(m, Release);
    c.header.map_epoch.store(view.epoch, Relaxed);
    c.header.map_changes.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporal_visit_on_a_shared_map_turns_the_gate_on_and_anything_else_off() {
        let srpt = VisitPolicy::Srpt.code();
        let fifo = VisitPolicy::Fifo.code();
        assert_eq!(
            mode_for(srpt, &[3, 3], 3),
            (mode::TEMPORAL, Some(VisitPolicy::Srpt))
        );
        let cohort = VisitPolicy::Cohort.code();
        assert_eq!(mode_for(cohort, &[3, 3], 3).1, Some(VisitPolicy::Cohort));
        // Spatial: stages on their own vCPUs — libstage moves threads.
        assert_eq!(mode_for(srpt, &[1, 2], 3), (mode::OFF, None));
        assert_eq!(mode_for(fifo, &[3, 3], 3), (mode::OFF, None));
        // A code this library does not know reads as FIFO.
        assert_eq!(mode_for(99, &[3, 3], 3), (mode::OFF, None));
    }
}
