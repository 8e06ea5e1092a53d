//! stagevm guest agent core (`no_std`): reports stage switches through the
//! stage channel and reads the stage map. Empty until the stage-channel work
//! lands; see `../shared/DESIGN.md`.
#![no_std]
