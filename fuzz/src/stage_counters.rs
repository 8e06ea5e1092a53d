//! Target 7: the per-vCPU stage counters (ABI minor 2) as the VMM reads
//! them, over arbitrary blocks and clocks.
//!
//! A valid area with counters is registered on a real stage device, with an
//! arbitrary `register_tsc`. For a few rounds each vCPU's block gets either
//! plausible transitions (the ABI's own single-writer model,
//! `VcpuCounters::apply`) or arbitrary words (counters that go backwards,
//! huge cycles and counts, forged state words), the host's TSC advances by
//! an arbitrary step, and the device's `read_counters` feeds the
//! scheduler's `Accounting` as the `stage-sched` thread does. Checked
//! against docs/stage-protocol.md §8–9: no panic; every vCPU's ticks sum to
//! the window the read reports, and no code gets more; counts stay within
//! the window and its slack; the load the policy would see
//! (`take_window`'s busy time over its window) never exceeds the vCPU
//! count.
//!
//! Minor 4: the area has latency histograms too, each vCPU's written with
//! plausible requests (as many as its block completed, `VcpuLatency::record`)
//! or arbitrary words; the device's `read_blocks` copies both. Checked: no
//! panic, and the windows never hold more timed requests than the
//! requests the counters completed so far (+1 per vCPU, the one in
//! flight).

use hypercall_abi::stage::{
    stage_code, state_word, transition, Layout, Status, VcpuCounters, VcpuLatency, CODE_NONE,
    DOORBELL_REGISTER, DOORBELL_STATUS, NUM_CODES,
};
use stage_device::abi::Obj;
use stage_device::sched::counter_reader::{CounterReader, SLACK_DIV};
use stage_device::sched::latency_reader::LatencyReader;
use stage_device::sched::Accounting;
use stage_device::stage::{Blocks, StageDevice};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, ZeroOnDrop};
use crate::input::Input;
use crate::stage_register::AREA;

/// Guest RAM of the target's VMs (bytes).
pub const MEM: u64 = 2 << 20;

thread_local! {
    static MEMORY: GuestMemoryMmap = guest_memory(MEM);
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    MEMORY.with(|mem| run(mem, data));
}

fn run(mem: &GuestMemoryMmap, data: &[u8]) {
    let mut inp = Input::new(data);
    let vcpus = inp.range(1, 4);
    let stages = inp.range(1, 16);
    let layout = Layout::new(vcpus, stages, 2)
        .expect("valid counts")
        .with_latency();
    let _clean = ZeroOnDrop::new(mem, MEM, AREA, layout.area_size());
    let register_tsc = inp.u64_near(1 << 40);
    let header = hypercall_abi::stage::AreaHeader {
        register_tsc,
        ..layout.header()
    };
    mem.write_obj(Obj(header), GuestAddress(AREA)).unwrap();
    let dev = StageDevice::new(
        std::sync::Arc::new(mem.clone()),
        MEM,
        vcpus,
        2_000_000,
        1000,
    );
    let registered = dev
        .doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes())
        .expect("a valid area registers");
    let mut st = [0u8; 4];
    dev.read_status(0, DOORBELL_STATUS, &mut st);
    assert_eq!(u32::from_le_bytes(st), Status::Ok as u32);
    assert!(registered.counters && registered.latency);
    let names: Vec<String> = (0..stages).map(|s| format!("s{s}")).collect();
    let mut host = inp.u64_near(1 << 40);
    let mut accounting = Accounting::new(&names, vcpus, 2_000_000)
        .with_counters(CounterReader::new(
            registered.generation,
            vcpus,
            register_tsc,
            host,
            2_000_000,
        ))
        .with_latency(LatencyReader::new(vcpus));
    // An independent reader on the same reads, to check each window.
    let mut reader =
        CounterReader::new(registered.generation, vcpus, register_tsc, host, 2_000_000);
    let mut blocks: Vec<VcpuCounters> = vec![VcpuCounters::default(); vcpus as usize];
    let mut latency: Vec<VcpuLatency> = vec![VcpuLatency::default(); vcpus as usize];
    let mut buf = Blocks::default();
    let (mut timed_total, mut completed_total) = (0u64, 0u64);
    for _ in 0..inp.range(1, 6) {
        for (v, block) in blocks.iter_mut().enumerate() {
            write_block(mem, &layout, v as u32, block, stages, host, &mut inp);
            write_latency(mem, &layout, v as u32, block, &mut latency[v], &mut inp);
        }
        let step = match inp.u8() % 5 {
            0 => 0,
            1 => u64::from(inp.u16()),
            2 => u64::from(inp.u32()),
            // Long windows (a policy period of seconds): products of the
            // busy time and a guest's estimates grow past 2^64.
            3 => (1 << 33) + u64::from(inp.u32()),
            _ => inp.u64_near(40_000_000),
        };
        host = host.wrapping_add(step);
        let generation = dev
            .read_blocks(&mut buf)
            .expect("an area with counters")
            .generation;
        assert_eq!(buf.counters.len(), vcpus as usize);
        assert_eq!(buf.latency.len(), vcpus as usize);
        let (deltas, window) = reader.update(&buf.counters, host);
        let completed: u64 = deltas.iter().map(|d| d.counts[CODE_NONE as usize]).sum();
        for d in &deltas {
            let sum: u64 = d.ticks.iter().sum();
            assert!(
                sum == window || (sum == 0 && window == 0),
                "{sum} ticks in {window}"
            );
            assert!(d.ticks.iter().all(|t| *t <= window));
            assert!(d.counts.iter().all(|c| *c <= window + window / SLACK_DIV));
        }
        accounting.ingest_counters(generation, &buf, host);
        let window = accounting.take_window();
        // Timed requests are bounded by the completions so far, plus one in
        // flight per vCPU (a window may time requests an earlier one
        // completed: `LatencyReader`'s credit).
        timed_total += window.latency.as_ref().map_or(0, |h| h.count());
        completed_total += completed;
        assert!(
            timed_total <= completed_total + u64::from(vcpus),
            "{timed_total} timed requests, {completed_total} completed so far"
        );
        if let Some(ns) = window.length_ns {
            let load: u128 = window.busy.iter().map(|b| u128::from(*b)).sum();
            assert!(
                load <= u128::from(ns) * u128::from(vcpus),
                "load {load} ns in {ns} ns on {vcpus} vCPUs"
            );
        }
        // A forged count cannot make the rate auto compares non-finite.
        if let Some(per) = accounting.entries_per_request() {
            assert!(per.is_finite() && per > 0.0, "{per} entries per request");
        }
        if inp.is_empty() {
            break;
        }
    }
    let mut report = dev.report();
    accounting.fill_report(&mut report);
    assert_eq!(report.stages.len(), stages as usize);
}

/// Writes vCPU `v`'s block: a few plausible transitions up to host TSC
/// `host`, or arbitrary words.
fn write_block(
    mem: &GuestMemoryMmap,
    layout: &Layout,
    v: u32,
    block: &mut VcpuCounters,
    stages: u32,
    host: u64,
    inp: &mut Input,
) {
    match inp.u8() % 4 {
        0 => {
            // Arbitrary words anywhere in the block.
            for _ in 0..inp.range(1, 8) {
                let word = inp.below(96) as usize;
                let value = inp.u64_near(host);
                as_words(block)[word] = value;
            }
        }
        1 => block.state = state_word(inp.u64_near(host), inp.below(32), inp.bool()),
        _ => {
            let every = u64::from(inp.range(1, 64));
            for i in 0..inp.range(1, 16) {
                let code = inp.below(NUM_CODES as u32).min(stage_code(stages - 1));
                let tsc = host.wrapping_sub(u64::from(inp.u16()) * u64::from(16 - i));
                let t = transition(block.state, block.countdown, code, tsc, every);
                block.apply(&t);
            }
        }
    }
    let at = AREA + layout.counters_offset(v);
    mem.write_obj(Obj(*block), GuestAddress(at)).unwrap();
}

/// Writes vCPU `v`'s latency histogram: a plausible request per request
/// its counters completed since, or arbitrary words.
fn write_latency(
    mem: &GuestMemoryMmap,
    layout: &Layout,
    v: u32,
    counters: &VcpuCounters,
    block: &mut VcpuLatency,
    inp: &mut Input,
) {
    if inp.u8().is_multiple_of(4) {
        for _ in 0..inp.range(1, 8) {
            let word = inp.below(272) as usize;
            let value = inp.u64_near(1 << 20);
            latency_words(block)[word] = value;
        }
    } else {
        let done = counters.counts[CODE_NONE as usize];
        while block.samples < done && block.samples < 1 << 16 {
            block.record(inp.u64_near(1 << 30));
        }
    }
    let at = AREA + layout.latency_offset(v);
    mem.write_obj(Obj(*block), GuestAddress(at)).unwrap();
}

/// The latency block as 272 words.
fn latency_words(block: &mut VcpuLatency) -> &mut [u64; 272] {
    const _: () = assert!(std::mem::size_of::<VcpuLatency>() == 272 * 8);
    // SAFETY: VcpuLatency is #[repr(C)] of 272 u64 words without padding
    // (size asserted above and in hypercall-abi); any u64 is a valid field.
    unsafe { &mut *(block as *mut VcpuLatency).cast::<[u64; 272]>() }
}

/// The block as 96 words.
fn as_words(block: &mut VcpuCounters) -> &mut [u64; 96] {
    const _: () = assert!(std::mem::size_of::<VcpuCounters>() == 96 * 8);
    // SAFETY: VcpuCounters is #[repr(C)] of 96 u64 words without padding
    // (size asserted above and in hypercall-abi); any u64 is a valid field.
    unsafe { &mut *(block as *mut VcpuCounters).cast::<[u64; 96]>() }
}
