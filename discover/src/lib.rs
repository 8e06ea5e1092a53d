//! `stagevm-discover`: from a server binary to a stage map.
//!
//! It runs the server under the stgtrace Valgrind tool while a load command
//! drives it ([`capture`]), then seed 004's request-level discovery and a
//! replay of the chosen map against the unstaged models in the cache
//! simulator ([`model`], the `stagesim` binary), and writes `NAME.stagemap`
//! (the file `stagectl attach --map` takes in the guest) and a short report
//! ([`report`]).
//!
//! * [`elf`] — the binary's function symbols and its request marker,
//! * [`tools`] — finding Valgrind's stgtrace tool and `stagesim`,
//! * [`capture`] — the server under the tool, the load, the window, the stop,
//! * [`server_proc`] — its readiness and mapped binary, from `/proc`,
//! * [`model`] — this host's L2 and cores, the mechanism and its cost (for
//!   temporal staging, the default, the preload library's gate handoff
//!   measured on this host: `stagevm_preload::costs`), the `stagesim` runs,
//! * [`report`] — the report an operator reads.

pub mod capture;
pub mod elf;
pub mod model;
pub mod report;
pub mod server_proc;
pub mod tools;
