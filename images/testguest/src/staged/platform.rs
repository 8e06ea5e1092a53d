//! The platform layer of the staged phase, the bottom of its modules: port
//! I/O and the TSC for the agent ([`PortIo`]), the guest's one [`Agent`]
//! (registered by vCPU 0 in [`register`], read-only afterwards, reached
//! through [`agent`]; the registered area's address through [`area`]), the
//! page allocator over the boot info's free range ([`alloc_pages`]), and
//! the machine's vCPU count and TSC rate ([`num_vcpus`], [`TSC_KHZ`]).
//!
//! Depends on nothing else in `staged/` (only on the crate root's port I/O
//! and console); every other module of `staged/`, and `crate::hostile`,
//! may use it.

use core::arch::asm;
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use guest_agent::{Agent, AreaSpec, Mode, Platform};
use hypercall_abi::stage::{Layout, DOORBELL_STATUS};

use crate::{inl, outl, print_line};

/// Port I/O and TSC for the agent.
pub struct PortIo;

impl Platform for PortIo {
    fn doorbell(&self, port: u16, value: u32) {
        outl(port, value);
    }
    fn doorbell_status(&self) -> u32 {
        inl(DOORBELL_STATUS)
    }
    fn tsc(&self) -> u64 {
        let (lo, hi): (u32, u32);
        // SAFETY: rdtsc is allowed in ring 3 (CR4.TSD clear, see hypercall_abi::boot).
        unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
        (u64::from(hi) << 32) | u64::from(lo)
    }
}

/// Called by [`register`] between laying out the area and registering it:
/// the guest's RAM size (bytes), the area's GPA and its layout.
pub type RegisterHook = fn(mem_size: u64, area: u64, layout: &Layout);

/// The global agent, set by vCPU 0 before it releases the other vCPUs.
struct AgentCell(UnsafeCell<MaybeUninit<Agent<PortIo>>>);
// SAFETY: written once by vCPU 0 before READY is released; read-only after.
unsafe impl Sync for AgentCell {}
static AGENT: AgentCell = AgentCell(UnsafeCell::new(MaybeUninit::uninit()));
static READY: AtomicBool = AtomicBool::new(false);
/// GPA (identity-mapped) of the registered area; 0 when inactive. Read by
/// [`crate::hostile`], which writes rings directly, as a hostile guest would.
static AREA: AtomicU64 = AtomicU64::new(0);

/// GPA of the registered stage-channel area (0 when the agent is inactive).
pub(crate) fn area() -> u64 {
    AREA.load(Ordering::Acquire)
}

/// The guest's agent (inactive when the channel is not there). Panics if
/// called before vCPU 0 published it in [`register`]. Inlined: every stage
/// switch calls it, and the agent's address folds into its callers.
#[inline]
pub(crate) fn agent() -> &'static Agent<PortIo> {
    assert!(READY.load(Ordering::Acquire));
    // SAFETY: initialised before READY was set (see `register`).
    unsafe { (*AGENT.0.get()).assume_init_ref() }
}

/// vCPU 0, once: lays out an area for `info.num_vcpus` rings of
/// `ring_entries` entries (and per-vCPU counters with `counters`, timing one
/// visit in `timed_every`, 0 = the agent's default) and the
/// stages `names`, registers it (an inactive agent when the layout is
/// invalid, memory runs out or the VMM refuses), prints the `testguest:
/// stage channel` line and publishes the agent for [`agent`]. With
/// `before_register` (`abuse=1`: `crate::hostile::abuse::bad_registers`),
/// first calls it on the same area.
pub(super) fn register(
    info: &hypercall_abi::boot::BootInfo,
    names: &[&str],
    ring_entries: u32,
    (counters, latency): (bool, bool),
    timed_every: u64,
    before_register: Option<RegisterHook>,
) {
    let mut spec = AreaSpec {
        gpa: 0,
        size: 0,
        num_vcpus: info.num_vcpus,
        stage_names: names,
        ring_entries,
        counters,
        timed_every,
        latency,
    };
    let mut area = None;
    let agent = match spec.layout() {
        Some(layout) => {
            let size = layout.area_size();
            match alloc_pages(size) {
                Some(addr) => {
                    area = Some(addr);
                    if let Some(hook) = before_register {
                        hook(info.mem_size, addr, &layout);
                    }
                    (spec.gpa, spec.size) = (addr, size);
                    // SAFETY: `addr` is `size` bytes of our own memory, page aligned.
                    unsafe { Agent::register(PortIo, addr as *mut u8, &spec) }
                        .unwrap_or_else(|_| Agent::inactive(PortIo))
                }
                None => Agent::inactive(PortIo),
            }
        }
        None => Agent::inactive(PortIo),
    };
    println!(
        "testguest: stage channel {:?} ({} stages, {} ring entries, {})",
        agent.status(),
        names.len(),
        ring_entries,
        match (agent.is_active(), agent.mode()) {
            (false, _) => "inactive",
            (true, Mode::Counters) => "counters",
            (true, Mode::Rings) => "rings",
        }
    );
    if let Some(addr) = area.filter(|_| agent.is_active()) {
        AREA.store(addr, Ordering::Release);
    }
    // SAFETY: only vCPU 0 writes, before READY is released.
    unsafe { (*AGENT.0.get()).write(agent) };
    READY.store(true, Ordering::Release);
}

/// vCPU count (≤ `MAX_VCPUS`) and TSC frequency (kHz), set by vCPU 0 in
/// [`super::setup`].
pub(super) static NUM_VCPUS: AtomicU32 = AtomicU32::new(1);
pub(crate) static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// vCPUs taking part in the staged phase (those with a ring and a queue).
pub(super) fn num_vcpus() -> u32 {
    NUM_VCPUS.load(Ordering::Relaxed)
}

/// Memory from the boot info's free range, handed out by a bump pointer.
static FREE_NEXT: AtomicU64 = AtomicU64::new(0);
static FREE_END: AtomicU64 = AtomicU64::new(0);

/// Sets the free range `[start, end)` (GPAs; vCPU 0, before other vCPUs
/// allocate).
pub(super) fn init_free(start: u64, end: u64) {
    FREE_NEXT.store(start, Ordering::Relaxed);
    FREE_END.store(end, Ordering::Release);
}

/// Allocates `size` bytes aligned to 4 KiB; `None` when memory is exhausted.
pub fn alloc_pages(size: u64) -> Option<u64> {
    let size = size.next_multiple_of(4096);
    let start = FREE_NEXT.fetch_add(size, Ordering::Relaxed);
    (start + size <= FREE_END.load(Ordering::Acquire)).then_some(start)
}
