//! Entry detours: each stage-map function's first bytes become a jump to
//! a stub of ours, which calls the stage point and then continues in the
//! function through a trampoline. The detour and the trampoline (the
//! displaced first instructions, with RIP-relative operands and relative
//! branches relocated) are the `retour` crate's (`RawDetour`); the decoder
//! that checks a function's body is `iced-x86`, the one `retour` itself
//! uses. Nothing here decodes x86 by hand.
//!
//! The stubs ([`MAX_HOOKS`] of them, 16 bytes each) push their index and
//! jump to one common stub (the index's stack slot later holds the
//! trampoline's address). A hooked function may be called by
//! code that assumes more than the ABI: with interprocedural register
//! allocation (GCC's `-fipa-ra`, on at `-O2`) a caller in the same unit
//! keeps values in call-clobbered registers across the call when it knows
//! the callee leaves them alone, and calls without aligning the stack when
//! the callee needs no alignment (both seen here: `point_bench.c`'s loop
//! keeps its counter in `rcx`/`rdx` and calls with `rsp` ≡ 0 (mod 16)).
//! So the common stub preserves every register and aligns the stack
//! itself:
//! * it changes no register before saving it: it saves `rbx`, `rax`,
//!   `rcx`, `rdx`, `rsi`, `rdi`, `r8`–`r11` and
//!   `xmm0`–`xmm15` on a 64-byte-aligned frame, and calls `hit_fast`
//!   (Rust built for baseline x86-64: SSE only, so the upper halves of the
//!   vector registers are untouched), which counts the visit;
//! * only when the gate must act (`gate::point_fast` says so) it saves the
//!   whole extended state with `XSAVE` (AVX, AVX-512: what a libc call
//!   with `vzeroupper` would destroy) and calls `hit_slow`, then `XRSTOR`;
//!   where the OS did not enable XSAVE (CPUID's OSXSAVE clear: a kernel
//!   booted `noxsave` on hardware KVM) no AVX state can exist, and
//!   `FXSAVE`/`FXRSTOR` keep all there is (x87, MMX, SSE). (This machine's
//!   software KVM runs guest user code natively, so its `noxsave` guests
//!   still see OSXSAVE and get `XSAVE`: images/linux/README.md.)
//! * it restores everything and jumps to the trampoline (the address in a
//!   stack slot above the frame, read from the red zone after `rsp` is
//!   back: the kernel never writes the red zone when it delivers a
//!   signal).
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

use iced_x86::{Decoder, DecoderOptions};
use retour::RawDetour;

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

extern "C" {
    /// The first of the [`MAX_HOOKS`] 16-byte stubs.
    fn stagevm_preload_stubs();
}

/// Bytes of the `XSAVE` area the slow path reserves on the stack; set at
/// start from CPUID leaf 0xD (rounded up to 64), 0 until then (the slow
/// path then never runs: [`init_xsave`]).
static XSAVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// 1: the slow path saves with `FXSAVE` (512 bytes) instead of `XSAVE`
/// ([`init_xsave`]).
static FXSAVE_ONLY: AtomicUsize = AtomicUsize::new(0);

std::arch::global_asm!(
    ".pushsection .text.stagevm_preload_stubs,\"ax\",@progbits",
    ".balign 16",
    ".globl stagevm_preload_stubs",
    ".hidden stagevm_preload_stubs",
    "stagevm_preload_stubs:",
    ".set stagevm_i, 0",
    ".rept {n}",
    "    push stagevm_i",
    "    jmp 2f",
    "    .balign 16, 0xcc",
    "    .set stagevm_i, stagevm_i + 1",
    ".endr",
    "2:",
    // [rbp + 8]: the hook's index, then the trampoline's address;
    // [rbp + 16]: the return address.
    "    push rbp",
    "    mov rbp, rsp",
    "    push rbx",
    "    push rax",
    "    push rcx",
    "    push rdx",
    "    push rsi",
    "    push rdi",
    "    push r8",
    "    push r9",
    "    push r10",
    "    push r11",
    "    and rsp, -64",
    "    sub rsp, 320",
    "    mov rbx, rsp",
    "    movaps [rbx], xmm0",
    "    movaps [rbx + 16], xmm1",
    "    movaps [rbx + 32], xmm2",
    "    movaps [rbx + 48], xmm3",
    "    movaps [rbx + 64], xmm4",
    "    movaps [rbx + 80], xmm5",
    "    movaps [rbx + 96], xmm6",
    "    movaps [rbx + 112], xmm7",
    "    movaps [rbx + 128], xmm8",
    "    movaps [rbx + 144], xmm9",
    "    movaps [rbx + 160], xmm10",
    "    movaps [rbx + 176], xmm11",
    "    movaps [rbx + 192], xmm12",
    "    movaps [rbx + 208], xmm13",
    "    movaps [rbx + 224], xmm14",
    "    movaps [rbx + 240], xmm15",
    "    mov edi, [rbp + 8]",
    "    call {fast}",
    "    mov [rbx + 256], rax",
    "    test rdx, rdx",
    "    jz 3f",
    "    mov rcx, [rip + {xs}]",
    "    test rcx, rcx",
    "    jz 3f",
    "    sub rsp, rcx",
    "    cmp qword ptr [rip + {fx}], 0",
    "    jne 4f",
    // The XSAVE header (bytes 512..576) must hold zeros in its reserved part.
    "    xor eax, eax",
    "    mov [rsp + 512], rax",
    "    mov [rsp + 520], rax",
    "    mov [rsp + 528], rax",
    "    mov [rsp + 536], rax",
    "    mov [rsp + 544], rax",
    "    mov [rsp + 552], rax",
    "    mov [rsp + 560], rax",
    "    mov [rsp + 568], rax",
    "    mov eax, -1",
    "    mov edx, -1",
    "    xsave64 [rsp]",
    "    mov edi, [rbp + 8]",
    "    call {slow}",
    "    mov eax, -1",
    "    mov edx, -1",
    "    xrstor64 [rsp]",
    "    jmp 3f",
    "4:",
    "    fxsave64 [rsp]",
    "    mov edi, [rbp + 8]",
    "    call {slow}",
    "    fxrstor64 [rsp]",
    "3:",
    "    mov rax, [rbx + 256]",
    "    mov [rbp + 8], rax",
    "    movaps xmm0, [rbx]",
    "    movaps xmm1, [rbx + 16]",
    "    movaps xmm2, [rbx + 32]",
    "    movaps xmm3, [rbx + 48]",
    "    movaps xmm4, [rbx + 64]",
    "    movaps xmm5, [rbx + 80]",
    "    movaps xmm6, [rbx + 96]",
    "    movaps xmm7, [rbx + 112]",
    "    movaps xmm8, [rbx + 128]",
    "    movaps xmm9, [rbx + 144]",
    "    movaps xmm10, [rbx + 160]",
    "    movaps xmm11, [rbx + 176]",
    "    movaps xmm12, [rbx + 192]",
    "    movaps xmm13, [rbx + 208]",
    "    movaps xmm14, [rbx + 224]",
    "    movaps xmm15, [rbx + 240]",
    "    lea rsp, [rbp - 80]",
    "    pop r11",
    "    pop r10",
    "    pop r9",
    "    pop r8",
    "    pop rdi",
    "    pop rsi",
    "    pop rdx",
    "    pop rcx",
    "    pop rax",
    "    pop rbx",
    "    pop rbp",
    "    lea rsp, [rsp + 8]",
    "    jmp qword ptr [rsp - 8]",
    ".popsection",
    n = const MAX_HOOKS,
    fast = sym hit_fast,
    slow = sym hit_slow,
    xs = sym XSAVE_BYTES,
    fx = sym FXSAVE_ONLY,
);

/// What `hit_fast` returns (in `rax`:`rdx`, the SysV ABI's pair return).
#[repr(C)]
struct FastReturn {
    trampoline: usize,
    slow: usize,
}

fn point_of(index: u32) -> (&'static Hook, PointKind) {
    let h = &HOOKS[index as usize % MAX_HOOKS];
    let packed = h.point.load(Relaxed);
    let point = if packed & 0x100 != 0 {
        PointKind::Request(packed as u8)
    } else {
        PointKind::Stage(packed as u8)
    };
    (h, point)
}

extern "C" fn hit_fast(index: u32) -> FastReturn {
    let (h, point) = point_of(index);
    let slow = crate::gate::point_fast(point);
    FastReturn {
        trampoline: h.trampoline.load(Relaxed),
        slow: usize::from(slow),
    }
}

extern "C" fn hit_slow(index: u32) {
    let (_, point) = point_of(index);
    crate::gate::point_slow(point);
}

/// How the slow path saves the caller's extended state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSave {
    /// `XSAVE` of every feature the OS enabled, this many bytes.
    Xsave(usize),
    /// `FXSAVE` (512 bytes): the OS did not enable XSAVE, so x87, MMX and
    /// SSE are all the extended state there is.
    Fxsave,
}

/// Chooses and sizes the slow path's save area from CPUID (leaf 1: XSAVE,
/// OSXSAVE and FXSR; leaf 0xD: the bytes the enabled features need):
/// XSAVE when the OS enabled it, else FXSAVE. `force_fxsave` takes FXSAVE
/// even where the OS enabled XSAVE: for tests of that path only
/// (`STAGEVM_PRELOAD_SAVE=fxsave`), as the upper halves of a caller's AVX
/// registers are then not kept across the slow path. Returns `None` when
/// neither is there (no hook is then installed: the slow path could not
/// keep the caller's vector state).
pub fn init_xsave(force_fxsave: bool) -> Option<StateSave> {
    let leaf1 = std::arch::x86_64::__cpuid(1);
    let (xsave, osxsave) = (leaf1.ecx & (1 << 26) != 0, leaf1.ecx & (1 << 27) != 0);
    let fxsr = leaf1.edx & (1 << 24) != 0;
    if !(xsave && osxsave) || force_fxsave {
        if !fxsr {
            return None;
        }
        FXSAVE_ONLY.store(1, Relaxed);
        XSAVE_BYTES.store(512, Relaxed);
        return Some(StateSave::Fxsave);
    }
    // Leaf 0xD exists when XSAVE does.
    let size = std::arch::x86_64::__cpuid_count(0xd, 0).ebx as usize;
    let size = size.checked_add(63)? & !63;
    (576..=1 << 16).contains(&size).then(|| {
        XSAVE_BYTES.store(size, Relaxed);
        StateSave::Xsave(size)
    })
}

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
/// lands inside its first instructions (those covering the 5 bytes of the
/// detour's `jmp rel32`),
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
