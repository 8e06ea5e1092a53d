//! stagevm's preload library: in-process stage points and a temporal gate
//! for an unmodified server binary (`LD_PRELOAD=libstagevm_preload.so`, or a
//! systemd drop-in with `Environment=LD_PRELOAD=…`).
//!
//! At load, before the program's `main` and so before it starts threads,
//! the library reads the stage-map file in `STAGEVM_STAGEMAP` (the format
//! `stagectl --map-file` checks and `stagevm-discover` writes:
//! `stagemap-file`), resolves each symbol against the running executable
//! (`resolve`), and installs an entry detour on each function (`hooks`):
//! entering a `stage` function is a switch into that stage, entering a
//! `request` function means the thread is about to wait for its client.
//! The program always starts: a map that cannot be read, parsed or
//! resolved installs nothing (one line names the file, the line and the
//! symbol), and a function that cannot be patched safely is left alone
//! (one line names it).
//!
//! Each stage point ([`gate::point_fast`]) counts a visit; with the gate on
//! it also runs the temporal gate (`lane`, `gate`): threads bound to CPUs,
//! a queue per stage on each CPU, the visit order of the guest runtime's
//! rules (`guest_agent::visit`, seed 002 ch. 3).
//!
//! Environment (read once, at load):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `STAGEVM_STAGEMAP` | the stage-map file | none: the library stays inactive |
//! | `STAGEVM_CONTROL` | the control page's file (`control`), shared with `stagevm-gatectl` | an anonymous page |
//! | `STAGEVM_GATE` | `off` or `temporal`, when the page is new | `off` |
//! | `STAGEVM_VISIT` | `srpt`, `cohort`, `dbr`, `mg1` or `color`, when the page is new | `srpt` |
//! | `STAGEVM_MAX_WAIT_US` | the wait bound, µs, when the page is new | 500 |
//! | `STAGEVM_LANES` | the lanes' CPUs (`1`, `0-3`, `0,2`) | the process's CPU mask at load |
//! | `STAGEVM_PRELOAD_QUIET` | `1`: only warnings and errors | unset |
//! | `STAGEVM_PRELOAD_SAVE` | `fxsave`: the slow path saves with FXSAVE even where XSAVE is enabled (tests only: AVX upper halves are then not kept) | XSAVE where enabled, else FXSAVE |
//! | `STAGEVM_CHANNEL` | `auto`, `on` or `off`: report through the stage channel (a stagevm guest, `channel`) | `auto`: when the device (or `STAGEVM_FD`) is there |
//!
//! In a stagevm guest (`channel`) the stage points also report through
//! the stage channel (libstage), and the VMM's stage map sets the gate's
//! mode and visit policy; `STAGEVM_GATE` and `STAGEVM_VISIT` then only
//! hold until the host's first map.

pub mod channel;
pub mod control;
pub mod costs;
pub mod gate;
pub mod hooks;
pub mod lane;
pub mod resolve;

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use hypercall_abi::stage::VisitPolicy;
use stagemap_file::{symbol_line, StageMapFile};

use host_sched::cpuset::CpuSet;
use host_sched::topology::thread_affinity;

use control::{Control, Mapping, MAX_WAIT_US_RANGE};
use hooks::PointKind;

/// The lanes' CPUs: `STAGEVM_LANES` (the kernel's cpulist format, parsed
/// by host-sched's `CpuSet`), else this thread's mask at load. A bad or
/// empty list is named in a warning and the mask used.
fn lane_cpus() -> Vec<usize> {
    let own = || thread_affinity(0).map_or_else(|_| vec![0], |set| set.iter().collect());
    let Ok(v) = std::env::var("STAGEVM_LANES") else {
        return own();
    };
    match CpuSet::parse(&v) {
        Ok(set) if !set.is_empty() => set.iter().collect(),
        Ok(_) => {
            warn(&format!(
                "STAGEVM_LANES='{v}' names no CPU; using this process's CPUs"
            ));
            own()
        }
        Err(e) => {
            warn(&format!("STAGEVM_LANES: {e}; using this process's CPUs"));
            own()
        }
    }
}

fn say(quiet: bool, msg: &str) {
    if !quiet {
        eprintln!("stagevm-preload: {msg}");
    }
}

fn warn(msg: &str) {
    eprintln!("stagevm-preload: warning: {msg}");
}

/// The gate settings of a new control page, from the environment; a bad
/// value is named in a warning and the default used.
fn init_page(c: &Control) {
    let h = &c.header;
    if let Ok(v) = std::env::var("STAGEVM_GATE") {
        match v.as_str() {
            "off" => h.mode.store(control::mode::OFF, Relaxed),
            "temporal" => h.mode.store(control::mode::TEMPORAL, Relaxed),
            _ => warn(&format!(
                "STAGEVM_GATE='{v}' is not 'off' or 'temporal'; the gate starts off"
            )),
        }
    }
    if let Ok(v) = std::env::var("STAGEVM_VISIT") {
        match VisitPolicy::parse(&v).filter(|p| p.is_temporal()) {
            Some(p) => h.policy.store(p.code() as u32, Relaxed),
            None => warn(&format!(
                "STAGEVM_VISIT='{v}' is not srpt, cohort, dbr, mg1 or color; using srpt"
            )),
        }
    }
    if let Ok(v) = std::env::var("STAGEVM_MAX_WAIT_US") {
        match v
            .parse::<u32>()
            .ok()
            .filter(|n| MAX_WAIT_US_RANGE.contains(n))
        {
            Some(n) => h.max_wait_us.store(n, Relaxed),
            None => warn(&format!(
                "STAGEVM_MAX_WAIT_US='{v}' is not a number of µs in {}..={}; using {}",
                MAX_WAIT_US_RANGE.start(),
                MAX_WAIT_US_RANGE.end(),
                control::DEFAULT_MAX_WAIT_US
            )),
        }
    }
}

/// What went wrong with a map as a whole (nothing is installed then).
fn refuse(path: &str, why: &str) {
    eprintln!("stagevm-preload: error: {path}: {why}; no stage points installed");
}

/// Loads the map and installs the stage points (see the crate docs).
/// Returns `None` when nothing was installed.
pub fn start() -> Option<()> {
    let quiet = std::env::var("STAGEVM_PRELOAD_QUIET").is_ok_and(|v| v == "1");
    let path = std::env::var("STAGEVM_STAGEMAP").ok()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            refuse(&path, &format!("cannot read it: {e}"));
            return None;
        }
    };
    let map = match StageMapFile::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            refuse(&path, &e.to_string());
            return None;
        }
    };
    let program = match resolve::Program::current() {
        Ok(p) => p,
        Err(e) => {
            refuse(&path, &e.to_string());
            return None;
        }
    };
    if let Some(b) = &map.binary {
        let named = std::fs::canonicalize(b).unwrap_or_else(|_| Path::new(b).to_path_buf());
        if named != program.path {
            say(
                quiet,
                &format!(
                    "{path} is for {b}, this process runs {}: inactive",
                    program.path.display()
                ),
            );
            return None;
        }
    }
    let force_fxsave = std::env::var("STAGEVM_PRELOAD_SAVE").is_ok_and(|v| v == "fxsave");
    let Some(save) = hooks::init_xsave(force_fxsave) else {
        refuse(&path, "this CPU has neither XSAVE nor FXSAVE, which stage points need to keep the caller's vector registers");
        return None;
    };
    // Every symbol resolves, or the map is refused (line and symbol named).
    let mut points = Vec::new();
    let request = map.request.iter().flat_map(|(s, syms)| {
        syms.iter()
            .map(move |sym| (sym, PointKind::Request(*s as u8)))
    });
    let stages = map.stages.iter().enumerate().flat_map(|(i, st)| {
        st.symbols
            .iter()
            .map(move |sym| (sym, PointKind::Stage(i as u8)))
    });
    for (sym, kind) in stages.chain(request) {
        match program.find(sym) {
            Some(f) => points.push((sym, kind, f)),
            None => {
                let line = symbol_line(&text, sym).unwrap_or(0);
                refuse(
                    &path,
                    &format!(
                        "line {line}: symbol {sym} is not a function of {}",
                        program.path.display()
                    ),
                );
                return None;
            }
        }
    }
    let control = match std::env::var("STAGEVM_CONTROL") {
        Ok(p) => Mapping::open(Path::new(&p), init_page),
        Err(_) => Mapping::anonymous(init_page),
    };
    let control = match control {
        Ok(c) => c,
        Err(e) => {
            refuse(&path, &format!("the control page: {e}"));
            return None;
        }
    };
    let cpus = lane_cpus();
    let h = &control.get().header;
    // SAFETY: getpid has no preconditions.
    h.pid.store(unsafe { libc::getpid() } as u32, Relaxed);
    h.stages.store(map.stages.len() as u32, Relaxed);
    let names: Vec<String> = map.stages.iter().map(|st| st.name.clone()).collect();
    let channel = match channel::wanted() {
        Ok(false) => None,
        Ok(true) => match channel::open(&names) {
            Ok(how) => Some(how),
            Err(e) => {
                warn(&format!(
                    "the stage channel: {e}; stage points stay in this process"
                ));
                None
            }
        },
        Err(e) => {
            warn(&format!("{e}; the stage channel is not used"));
            None
        }
    };
    h.channel.store(u32::from(channel.is_some()), Relaxed);
    gate::install_runtime(control, &cpus, map.stages.len());
    let (mut installed, mut skipped) = (0u32, 0u32);
    for (sym, kind, f) in points {
        // SAFETY: `f` is a function of the running executable (its symbol
        // table), and the program has not started threads (we run from its
        // constructors).
        match unsafe { hooks::install(f.addr, f.size, kind) } {
            Ok(()) => installed += 1,
            Err(e) => {
                skipped += 1;
                warn(&format!("left {sym} alone: {e}"));
            }
        }
    }
    let c = gate::control()?;
    c.header.hooks_installed.store(installed, Relaxed);
    c.header.hooks_skipped.store(skipped, Relaxed);
    say(
        quiet,
        &format!(
            "{}: {installed} stage points for {} stages ({skipped} functions left alone); gate {}, {}, lanes on CPUs {cpus:?}; slow path {}; {}",
            program.path.display(),
            map.stages.len(),
            if c.mode() == control::mode::TEMPORAL { "temporal" } else { "off" },
            c.policy().name(),
            match save {
                hooks::StateSave::Xsave(n) => format!("XSAVE ({n} bytes)"),
                hooks::StateSave::Fxsave => "FXSAVE (512 bytes)".to_string(),
            },
            match &channel {
                Some(how) => format!("stage channel open (reporting: {how}), the VMM's map sets the gate"),
                None => "no stage channel".into(),
            },
        ),
    );
    Some(())
}

#[cfg(not(test))]
extern "C" fn preload_init() {
    // A panic must not cross into the program's start-up code.
    let _ = std::panic::catch_unwind(start);
}

/// Runs [`start`] when the library is loaded (`LD_PRELOAD`): an
/// `.init_array` entry, which the loader calls before the program's own
/// constructors and `main`. Only in the shared library: the rlib (tests,
/// `stagevm-gatectl`) never starts by itself.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = preload_init;
