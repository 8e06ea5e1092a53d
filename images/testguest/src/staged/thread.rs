//! A guest thread: [`Thread`], which lives at the top of its own stack, the
//! context switch between stacks (`testguest_ctx_switch`) and the
//! trampoline a new thread starts through, and [`new_thread`].
//!
//! Depends on [`super::platform`] (stack pages) and [`super::config`] (the
//! thread's [`Job`]) only; the run queues ([`super::runq`]) and the
//! scheduler ([`super::runtime`]) build on it.

use core::arch::global_asm;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use hypercall_abi::stage::STAGE_NONE;

use super::config::{Job, StagedConfig};
use super::platform::alloc_pages;
use crate::print_line;

/// Bytes of stack per guest thread.
const THREAD_STACK: u64 = 64 << 10;

global_asm!(
    r#"
    .global testguest_ctx_switch
testguest_ctx_switch:
    push rbp
    push rbx
    push r12
    push r13
    push r14
    push r15
    mov [rdi], rsp
    mov rsp, rsi
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    pop rbp
    ret
    .global testguest_thread_trampoline
testguest_thread_trampoline:
    mov rdi, r12
    call r13
    ud2
"#
);

extern "C" {
    /// Saves callee-saved registers and RSP into `*save`, switches to `to`.
    pub(super) fn testguest_ctx_switch(save: *mut u64, to: u64);
    fn testguest_thread_trampoline();
}

/// Thread id and vCPU value meaning "none".
pub(super) const NONE: u32 = u32::MAX;
/// Bytes at the top of each thread's stack allocation that hold its
/// [`Thread`] (the stack grows down from below them).
const THREAD_HEADER: u64 = 256;
const _: () = assert!(core::mem::size_of::<Thread>() as u64 <= THREAD_HEADER);
/// A cooperative guest thread. It lives at the top of its own stack
/// allocation and moves between vCPUs' run queues: whoever popped it from a
/// queue owns it until it is pushed again (the queue locks order the
/// accesses), so every mutable field is an atomic used as a plain cell.
#[repr(C, align(64))]
pub(super) struct Thread {
    /// Saved stack pointer while the thread is not running (written by
    /// `testguest_ctx_switch`).
    pub(super) rsp: AtomicU64,
    /// Next thread in the run queue it is on (under the queue's lock).
    pub(super) next: AtomicPtr<Thread>,
    /// vCPU that runs it now or last ran it (set by the scheduler that resumes it).
    pub(super) vcpu: AtomicU32,
    /// vCPU it asked to move to at its last stage switch, or [`NONE`]; taken by
    /// the scheduler once the thread's context is saved.
    pub(super) migrate_to: AtomicU32,
    /// Stage it is in, or `STAGE_NONE` between requests.
    pub(super) stage: AtomicU32,
    /// Set by an idle vCPU that took it although the map does not give its
    /// stage to that vCPU (a spill, `spill_us=`): the thread runs its
    /// current stage visit there and follows the map again at its next
    /// switch. Taken (cleared) by the stage switch when it resumes.
    pub(super) spilled: AtomicBool,
    /// Whether the map's visit policy was temporal at its last stage switch
    /// (then it does not yield at the end of its request: it yields at its
    /// next switch, into that stage's queue). Its own line: no map read at
    /// every request's end.
    pub(super) temporal: AtomicBool,
    /// Set when all its requests are done.
    pub(super) done: AtomicBool,
    /// Checksum of its requests (final once `done`).
    pub(super) checksum: AtomicU64,
    /// Its request's clock (`guest_agent::RequestClock::to_raw`): the
    /// agent times one request in N from its start to its `stage_exit`.
    pub(super) clock: AtomicU64,
    /// Open loop (`arrival=`): the TSC its current request arrived at, and
    /// the requests it served.
    pub(super) arrival: AtomicU64,
    pub(super) served: AtomicU64,
    /// Open loop: set before it yields because no request waits; the
    /// scheduler then parks it among the waiting threads
    /// (`runtime::take_arrival`).
    pub(super) blocked: AtomicBool,
    /// Open loop: woken for a queued request, not yet come to take it.
    pub(super) woken: AtomicBool,
    /// Unique id (`vcpu + num_vcpus × i` of the vCPU that created it).
    pub(super) id: u32,
    /// What it runs (requests and their parameters).
    pub(super) job: Job,
}

/// Body of every guest thread, given by the workload layer and entered
/// through the trampoline with the thread's [`Thread`]; it ends with
/// [`super::runtime::finish`].
pub(super) type Entry = extern "C" fn(*const Thread);

/// Makes a new thread's [`Job`] under the config (the workload layer's,
/// which may allocate the thread's data).
pub(super) type NewJob = fn(&StagedConfig) -> Job;

/// Creates a thread on a fresh stack, to start on `vcpu` in `entry`,
/// running its share of `cfg` (the [`Job`] `new_job` makes).
pub(super) fn new_thread(
    id: u32,
    vcpu: u32,
    cfg: &StagedConfig,
    entry: Entry,
    new_job: NewJob,
) -> &'static Thread {
    let Some(stack) = alloc_pages(THREAD_STACK) else {
        println!("testguest: out of memory for thread stacks");
        crate::shutdown(5);
    };
    let job = new_job(cfg);
    let slot = (stack + THREAD_STACK - THREAD_HEADER) as *mut Thread;
    // SAFETY: the top THREAD_HEADER bytes of our freshly allocated, 4 KiB
    // aligned stack; nothing else uses them.
    unsafe {
        slot.write(Thread {
            rsp: AtomicU64::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            vcpu: AtomicU32::new(vcpu),
            migrate_to: AtomicU32::new(NONE),
            stage: AtomicU32::new(STAGE_NONE),
            spilled: AtomicBool::new(false),
            temporal: AtomicBool::new(false),
            done: AtomicBool::new(false),
            checksum: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            arrival: AtomicU64::new(0),
            served: AtomicU64::new(0),
            blocked: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            id,
            job,
        })
    };
    // SAFETY: initialised just above, never freed.
    let t: &'static Thread = unsafe { &*slot };
    // Initial frame popped by testguest_ctx_switch: r15, r14, r13 (entry),
    // r12 (argument), rbx, rbp, then the return address (the trampoline),
    // placed so RSP is 16-byte aligned at the trampoline's `call`.
    let top = slot as u64;
    let frame = (top - 56) as *mut u64;
    let words = [
        0,
        0,
        entry as *const () as u64,
        slot as u64,
        0,
        0,
        testguest_thread_trampoline as *const () as u64,
    ];
    for (k, word) in words.iter().enumerate() {
        // SAFETY: inside the freshly allocated stack, below the Thread.
        unsafe { frame.add(k).write(*word) };
    }
    t.rsp.store(frame as u64, Ordering::Relaxed);
    t
}
