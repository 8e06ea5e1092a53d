//! Architecture-specific code. stagevm runs x86-64 guests only.

pub mod x86_64;
