//! Entry detours: each stage-map function's first bytes become a jump to
//! a stub of ours, which calls the stage point and then continues in the
//! function through a trampoline. The detour and the trampoline (the
//! displaced first instructions, with RIP-relative operands and relative
//! branches relocated) are the `retour` crate's (`RawDetour`); the decoder
//! that checks a function's body is `iced-x86`, the one `retour` itself
//! uses. Nothing here decodes x86 by hand.
//!
//! The stubs ([`MAX_HOOKS`] of them, 16 bytes each) load their index into
//! `r11` (a scratch register no argument uses in the SysV ABI) and jump to
//! one common stub that saves every argument register (`rdi`, `rsi`,
//! `rdx`, `rcx`, `r8`, `r9`, `rax` for variadic calls, `xmm0`–`xmm7`),
//! calls `hit(index)`, which runs the stage point and returns the
//! trampoline's address, restores them and jumps there. The stack is
//! 16-byte aligned at the call: at a function's entry `rsp` ≡ 8 (mod 16),
//! seven pushes and 128 bytes of vector registers make it ≡ 0.
//!
//! A function is left alone, with one warning naming it, when:
//! * its symbol has no size (its body cannot be checked);
//! * a relative branch in its body lands inside the bytes the detour
//!   displaces (a loop back into its first instructions would run the
//!   jump's bytes as code);
//! * `retour` refuses it (too short, an instruction it cannot relocate,
//!   no memory for a trampoline within ±2 GiB), or panics on it.
//!
//! Indirect branches into a function's first 5 bytes (a jump table that
//! targets them) cannot be seen by any static check; compilers do not
//! emit them for a function's entry sequence.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use retour::RawDetour;
use iced_x86::{Decoder, DecoderOptions};

/// Most stage points (one per map symbol; the map format's limit).
pub const MAX_HOOKS: usize = 4096;

/// Bytes the detour writes over a function's entry (`jmp rel32`).
const PATCH_BYTES: usize = 5;

/// What a hook's stage point is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointKind {
    /// Entering this stage (map index).
    Stage(u8),
    /// A request marker of this stage: the thread is about to wait for
    /// its client; it leaves the gate.
    Request(u8),
}

/// One installed hook: its trampoline and its point.
struct Hook {
    trampoline: AtomicUsize,
    /// `PointKind` packed: bit 8 = request, bits 0..8 = stage.
    point: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Hook = Hook {
    trampoline: AtomicUsize::new(0),
    point: AtomicUsize::new(0),
};
static HOOKS: [Hook; MAX_HOOKS] = [EMPTY; MAX_HOOKS];

/// The function the common stub calls: runs hook `index`'s stage point and
/// returns the address to continue at.
type HitFn = extern "C" fn(u32) -> usize;

extern "C" {
    /// The first of the [`MAX_HOOKS`] 16-byte stubs.
    fn stagevm_preload_stubs();
}

std::arch::global_asm!(
    ".pushsection .text.stagevm_preload_stubs,\"ax\",@progbits",
    ".balign 16",
    ".globl stagevm_preload_stubs",
    ".hidden stagevm_preload_stubs",
    "stagevm_preload_stubs:",
    ".set stagevm_i, 0",
    ".rept {n}",
    "    mov r11d, stagevm_i",
    "    jmp 2f",
    "    .balign 16, 0xcc",
    "    .set stagevm_i, stagevm_i + 1",
    ".endr",
    "2:",
    "    push rdi",
    "    push rsi",
    "    push rdx",
    "    push rcx",
    "    push r8",
    "    push r9",
    "    push rax",
    "    sub rsp, 128",
    "    movdqu [rsp], xmm0",
    "    movdqu [rsp + 16], xmm1",
    "    movdqu [rsp + 32], xmm2",
    "    movdqu [rsp + 48], xmm3",
    "    movdqu [rsp + 64], xmm4",
    "    movdqu [rsp + 80], xmm5",
    "    movdqu [rsp + 96], xmm6",
    "    movdqu [rsp + 112], xmm7",
    "    mov edi, r11d",
    "    call {hit}",
    "    mov r11, rax",
    "    movdqu xmm0, [rsp]",
    "    movdqu xmm1, [rsp + 16]",
    "    movdqu xmm2, [rsp + 32]",
    "    movdqu xmm3, [rsp + 48]",
    "    movdqu xmm4, [rsp + 64]",
    "    movdqu xmm5, [rsp + 80]",
    "    movdqu xmm6, [rsp + 96]",
    "    movdqu xmm7, [rsp + 112]",
    "    add rsp, 128",
    "    pop rax",
    "    pop r9",
    "    pop r8",
    "    pop rcx",
    "    pop rdx",
    "    pop rsi",
    "    pop rdi",
    "    jmp r11",
    ".popsection",
    n = const MAX_HOOKS,
    hit = sym hit,
);

extern "C" fn hit(index: u32) -> usize {
    let h = &HOOKS[index as usize % MAX_HOOKS];
    let packed = h.point.load(Relaxed);
    let point = if packed & 0x100 != 0 {
        PointKind::Request(packed as u8)
    } else {
        PointKind::Stage(packed as u8)
    };
    crate::gate::on_point(point);
    h.trampoline.load(Relaxed)
}

// Keeps the type of `hit` checked against what the stub expects.
const _: HitFn = hit;

/// Why a function was left alone.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    /// Every stub is in use.
    #[error("more than {MAX_HOOKS} stage points")]
    Full,
    /// The symbol has no size.
    #[error("its symbol has no size, so its body cannot be checked for branches into its entry")]
    NoSize,
    /// A branch lands inside the displaced bytes.
    #[error("the instruction at +{from:#x} branches to +{to:#x}, inside the {len} bytes the detour displaces")]
    BranchIntoEntry {
        /// Offset of the branch.
        from: usize,
        /// Offset of its target.
        to: usize,
        /// Bytes displaced.
        len: usize,
    },
    /// `retour` refused or panicked.
    #[error("the detour library refused it: {0}")]
    Detour(String),
}

/// Checks that no relative branch in the `size`-byte function at `addr`
/// lands inside its first instructions (those covering [`PATCH_BYTES`]),
/// decoding it with `iced-x86`.
///
/// # Safety
/// `addr..addr + size` must be mapped, readable code.
pub unsafe fn check_body(addr: usize, size: usize) -> Result<(), HookError> {
    if size == 0 {
        return Err(HookError::NoSize);
    }
    // SAFETY: the caller's contract.
    let code = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
    let mut displaced = 0usize;
    for ins in Decoder::with_ip(64, code, 0, DecoderOptions::NONE) {
        let (off, end) = (ins.ip() as usize, ins.next_ip() as usize);
        if displaced < PATCH_BYTES {
            displaced = end;
        }
        if ins.is_invalid() {
            continue;
        }
        let to = ins.near_branch_target() as usize;
        let len = displaced.max(PATCH_BYTES);
        if to > 0 && to < len {
            return Err(HookError::BranchIntoEntry { from: off, to, len });
        }
    }
    Ok(())
}

/// Hooks installed so far (the next stub's index).
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

/// Installs a stage point of kind `point` at the entry of the `size`-byte
/// function at `addr`. The detour stays for the life of the process.
///
/// Errors: [`HookError`] (the function is then unchanged).
///
/// # Safety
/// `addr` must be the entry of a function of `size` bytes in mapped code,
/// and no other thread may run it while it is patched (call before the
/// program starts its threads).
pub unsafe fn install(addr: usize, size: usize, point: PointKind) -> Result<(), HookError> {
    // SAFETY: the caller's contract.
    unsafe { check_body(addr, size)? };
    let index = INSTALLED.load(Relaxed);
    if index >= MAX_HOOKS {
        return Err(HookError::Full);
    }
    let stub = stagevm_preload_stubs as *const () as usize + 16 * index;
    let detour = std::panic::catch_unwind(|| {
        // SAFETY: the caller's contract; the stub is our code.
        let d = unsafe { RawDetour::new(addr as *const (), stub as *const ()) }?;
        HOOKS[index]
            .trampoline
            .store(d.trampoline() as *const () as usize, Relaxed);
        HOOKS[index].point.store(
            match point {
                PointKind::Stage(s) => usize::from(s),
                PointKind::Request(s) => 0x100 | usize::from(s),
            },
            Relaxed,
        );
        // SAFETY: as above.
        unsafe { d.enable() }?;
        Ok::<_, retour::Error>(d)
    });
    match detour {
        Ok(Ok(d)) => {
            // The detour (and its trampoline) lives as long as the process.
            std::mem::forget(d);
            INSTALLED.store(index + 1, Relaxed);
            Ok(())
        }
        Ok(Err(e)) => Err(HookError::Detour(e.to_string())),
        Err(_) => Err(HookError::Detour("it panicked".into())),
    }
}
