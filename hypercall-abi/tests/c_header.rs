//! The C header `include/stagevm_abi.h` must describe the same ABI as the
//! Rust crate: compile a probe against it with the system C compiler and
//! compare every constant, size and offset.

use std::mem::{offset_of, size_of};
use std::process::Command;

use hypercall_abi::stage::*;

/// The digest the probe computes with the C header's bucket function.
fn bucket_digest() -> u64 {
    let mut sum = 0u64;
    for k in 0..64 {
        let v = 1u64 << k;
        for x in [v - 1, v, v + 1, v + v / 3] {
            sum = sum.wrapping_mul(31).wrapping_add(latency_bucket(x) as u64);
        }
    }
    sum
}

#[test]
fn c_header_matches_rust_layout() {
    let dir = std::env::temp_dir().join(format!("stagevm-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let probe = dir.join("probe.c");
    std::fs::write(
        &probe,
        r#"#include <stdio.h>
#include <stddef.h>
#include "stagevm_abi.h"
#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))
int main(void) {
    P("magic", STAGEVM_AREA_MAGIC); P("version", STAGEVM_ABI_VERSION);
    P("max_stages", STAGEVM_MAX_STAGES); P("max_vcpus", STAGEVM_MAX_VCPUS);
    P("max_ring", STAGEVM_MAX_RING_ENTRIES); P("stage_none", STAGEVM_STAGE_NONE); P("idle_thread", STAGEVM_IDLE_THREAD);
    P("db_register", STAGEVM_DOORBELL_REGISTER); P("db_unregister", STAGEVM_DOORBELL_UNREGISTER);
    P("db_wait", STAGEVM_DOORBELL_WAIT); P("db_wake", STAGEVM_DOORBELL_WAKE);
    P("db_status", STAGEVM_DOORBELL_STATUS); P("wait_max", STAGEVM_WAIT_MAX_US);
    P("st_bad_layout", STAGEVM_BAD_LAYOUT); P("st_bad_vcpu", STAGEVM_BAD_VCPU);
    P("st_no_device", STAGEVM_NO_DEVICE);
    P("hdr", sizeof(struct stagevm_area_header));
    P("hdr.area_size", offsetof(struct stagevm_area_header, area_size));
    P("hdr.num_vcpus", offsetof(struct stagevm_area_header, num_vcpus));
    P("hdr.num_stages", offsetof(struct stagevm_area_header, num_stages));
    P("hdr.ring_entries", offsetof(struct stagevm_area_header, ring_entries));
    P("hdr.tsc_khz", offsetof(struct stagevm_area_header, tsc_khz));
    P("desc", sizeof(struct stagevm_stage_desc));
    P("map", sizeof(struct stagevm_stage_map));
    P("map.vcpus", offsetof(struct stagevm_stage_map, vcpus));
    P("map.owned", offsetof(struct stagevm_stage_map, owned));
    P("map.minor", offsetof(struct stagevm_stage_map, minor));
    P("abi_minor", STAGEVM_ABI_MINOR);
    P("ring", sizeof(struct stagevm_ring_header));
    P("ring.tail", offsetof(struct stagevm_ring_header, tail));
    P("ring.full_backoffs", offsetof(struct stagevm_ring_header, full_backoffs));
    P("event", sizeof(struct stagevm_stage_event));
    P("event.tsc", offsetof(struct stagevm_stage_event, tsc));
    P("event.stage", offsetof(struct stagevm_stage_event, stage));
    P("event.thread", offsetof(struct stagevm_stage_event, thread));
    P("descs_off", STAGEVM_STAGE_DESCS_OFFSET); P("map_off", STAGEVM_STAGE_MAP_OFFSET);
    P("rings_off", STAGEVM_RINGS_OFFSET); P("vcpu_states_off", STAGEVM_VCPU_STATES_OFFSET);
    P("vcpu_state", sizeof(struct stagevm_vcpu_state));
    P("vcpu_state.parked", offsetof(struct stagevm_vcpu_state, parked));
    P("vcpu_state.runnable", offsetof(struct stagevm_vcpu_state, runnable));
    P("vcpu_state.fallbacks", offsetof(struct stagevm_vcpu_state, fallbacks));
    P("flag_counters", STAGEVM_AREA_FLAG_COUNTERS);
    P("hdr.register_tsc", offsetof(struct stagevm_area_header, register_tsc));
    P("map.trace_every", offsetof(struct stagevm_stage_map, trace_every));
    P("map.visit", offsetof(struct stagevm_stage_map, visit));
    P("visit_fifo", STAGEVM_VISIT_FIFO); P("visit_cohort", STAGEVM_VISIT_COHORT);
    P("visit_srpt", STAGEVM_VISIT_SRPT); P("visit_dbr", STAGEVM_VISIT_DBR);
    P("visit_mg1", STAGEVM_VISIT_MG1); P("visit_color", STAGEVM_VISIT_COLOR);
    P("ring.trace_dropped", offsetof(struct stagevm_ring_header, trace_dropped));
    P("code_bits", STAGEVM_STATE_CODE_BITS); P("code_mask", STAGEVM_STATE_CODE_MASK);
    P("state_timed", STAGEVM_STATE_TIMED); P("state_low_mask", STAGEVM_STATE_LOW_MASK);
    P("state_private_shift", STAGEVM_STATE_PRIVATE_SHIFT);
    P("timed_every", STAGEVM_TIMED_EVERY); P("counters_align", STAGEVM_COUNTERS_ALIGN);
    P("counters.countdown", offsetof(struct stagevm_vcpu_counters, countdown));
    P("counters.timed", offsetof(struct stagevm_vcpu_counters, timed));
    P("counters.agent", offsetof(struct stagevm_vcpu_counters, agent));
    P("timed_interval", STAGEVM_TIMED_INTERVAL_NS); P("stride_max", STAGEVM_TIMED_STRIDE_MAX);
    P("code_none", STAGEVM_CODE_NONE); P("code_idle", STAGEVM_CODE_IDLE);
    P("code_first_stage", STAGEVM_CODE_FIRST_STAGE); P("num_codes", STAGEVM_NUM_CODES);
    P("counters", sizeof(struct stagevm_vcpu_counters));
    P("counters.cycles", offsetof(struct stagevm_vcpu_counters, cycles));
    P("counters.counts", offsetof(struct stagevm_vcpu_counters, counts));
    P("counters.migrations_in", offsetof(struct stagevm_vcpu_counters, migrations_in));
    P("counters.migrations_out", offsetof(struct stagevm_vcpu_counters, migrations_out));
    P("flag_latency", STAGEVM_AREA_FLAG_LATENCY); P("latency_buckets", STAGEVM_LATENCY_BUCKETS);
    P("latency_sub_bits", STAGEVM_LATENCY_SUB_BITS); P("latency_unit_shift", STAGEVM_LATENCY_UNIT_SHIFT);
    P("latency_align", STAGEVM_LATENCY_ALIGN);
    P("latency", sizeof(struct stagevm_vcpu_latency));
    P("latency.sum_ns", offsetof(struct stagevm_vcpu_latency, sum_ns));
    P("latency.countdown", offsetof(struct stagevm_vcpu_latency, countdown));
    P("latency.agent", offsetof(struct stagevm_vcpu_latency, agent));
    P("latency.buckets", offsetof(struct stagevm_vcpu_latency, buckets));
    {
        /* The bucket function on every power of two and its neighbours. */
        unsigned long long sum = 0;
        for (int k = 0; k < 64; k++) {
            unsigned long long v = 1ull << k;
            sum = sum * 31 + stagevm_latency_bucket(v - 1);
            sum = sum * 31 + stagevm_latency_bucket(v);
            sum = sum * 31 + stagevm_latency_bucket(v + 1);
            sum = sum * 31 + stagevm_latency_bucket(v + v / 3);
        }
        P("latency_bucket_digest", sum);
    }
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("probe");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I", include, "-o"])
        .arg(&exe)
        .arg(&probe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}': {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(out.stdout).unwrap();
    let c: std::collections::HashMap<&str, u64> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    let expect: &[(&str, u64)] = &[
        ("magic", AREA_MAGIC),
        ("version", ABI_VERSION.into()),
        ("max_stages", MAX_STAGES as u64),
        ("max_vcpus", MAX_VCPUS as u64),
        ("max_ring", MAX_RING_ENTRIES.into()),
        ("stage_none", STAGE_NONE.into()),
        ("idle_thread", IDLE_THREAD.into()),
        ("db_register", DOORBELL_REGISTER.into()),
        ("db_unregister", DOORBELL_UNREGISTER.into()),
        ("db_wait", DOORBELL_WAIT.into()),
        ("db_wake", DOORBELL_WAKE.into()),
        ("db_status", DOORBELL_STATUS.into()),
        ("wait_max", WAIT_MAX_US.into()),
        ("st_bad_layout", Status::BadLayout as u64),
        ("st_bad_vcpu", Status::BadVcpu as u64),
        ("st_no_device", Status::NoDevice as u64),
        ("hdr", size_of::<AreaHeader>() as u64),
        ("hdr.area_size", offset_of!(AreaHeader, area_size) as u64),
        ("hdr.num_vcpus", offset_of!(AreaHeader, num_vcpus) as u64),
        ("hdr.num_stages", offset_of!(AreaHeader, num_stages) as u64),
        (
            "hdr.ring_entries",
            offset_of!(AreaHeader, ring_entries) as u64,
        ),
        ("hdr.tsc_khz", offset_of!(AreaHeader, tsc_khz) as u64),
        ("desc", size_of::<StageDesc>() as u64),
        ("map", size_of::<StageMap>() as u64),
        ("map.vcpus", offset_of!(StageMap, vcpus) as u64),
        ("map.owned", offset_of!(StageMap, owned) as u64),
        ("map.minor", offset_of!(StageMap, minor) as u64),
        ("abi_minor", ABI_MINOR),
        ("ring", size_of::<RingHeader>() as u64),
        ("ring.tail", offset_of!(RingHeader, tail) as u64),
        (
            "ring.full_backoffs",
            offset_of!(RingHeader, full_backoffs) as u64,
        ),
        ("event", size_of::<StageEvent>() as u64),
        ("event.tsc", offset_of!(StageEvent, tsc) as u64),
        ("event.stage", offset_of!(StageEvent, stage) as u64),
        ("event.thread", offset_of!(StageEvent, thread) as u64),
        ("descs_off", STAGE_DESCS_OFFSET),
        ("map_off", STAGE_MAP_OFFSET),
        ("rings_off", RINGS_OFFSET),
        ("vcpu_states_off", VCPU_STATES_OFFSET),
        ("vcpu_state", size_of::<VcpuState>() as u64),
        ("vcpu_state.parked", offset_of!(VcpuState, parked) as u64),
        (
            "vcpu_state.runnable",
            offset_of!(VcpuState, runnable) as u64,
        ),
        (
            "vcpu_state.fallbacks",
            offset_of!(VcpuState, fallbacks) as u64,
        ),
        ("flag_counters", AREA_FLAG_COUNTERS.into()),
        (
            "hdr.register_tsc",
            offset_of!(AreaHeader, register_tsc) as u64,
        ),
        ("map.trace_every", offset_of!(StageMap, trace_every) as u64),
        ("map.visit", offset_of!(StageMap, visit) as u64),
        ("visit_fifo", VisitPolicy::Fifo.code()),
        ("visit_cohort", VisitPolicy::Cohort.code()),
        ("visit_srpt", VisitPolicy::Srpt.code()),
        ("visit_dbr", VisitPolicy::Dbr.code()),
        ("visit_mg1", VisitPolicy::Mg1.code()),
        ("visit_color", VisitPolicy::Color.code()),
        (
            "ring.trace_dropped",
            offset_of!(RingHeader, trace_dropped) as u64,
        ),
        ("code_bits", STATE_CODE_BITS.into()),
        ("code_mask", STATE_CODE_MASK),
        ("state_timed", STATE_TIMED),
        ("state_low_mask", STATE_LOW_MASK),
        ("state_private_shift", STATE_PRIVATE_SHIFT.into()),
        ("timed_every", TIMED_EVERY),
        ("counters_align", COUNTERS_ALIGN),
        ("counters.countdown", COUNTERS_COUNTDOWN_OFFSET),
        ("counters.timed", COUNTERS_TIMED_OFFSET),
        ("counters.agent", COUNTERS_AGENT_OFFSET),
        ("timed_interval", TIMED_INTERVAL_NS),
        ("stride_max", TIMED_STRIDE_MAX),
        ("code_none", CODE_NONE.into()),
        ("code_idle", CODE_IDLE.into()),
        ("code_first_stage", CODE_FIRST_STAGE.into()),
        ("num_codes", NUM_CODES as u64),
        ("counters", size_of::<VcpuCounters>() as u64),
        ("counters.cycles", COUNTERS_CYCLES_OFFSET),
        ("counters.counts", COUNTERS_COUNTS_OFFSET),
        ("counters.migrations_in", COUNTERS_MIGRATIONS_IN_OFFSET),
        ("counters.migrations_out", COUNTERS_MIGRATIONS_OUT_OFFSET),
        ("flag_latency", AREA_FLAG_LATENCY.into()),
        ("latency_buckets", LATENCY_BUCKETS as u64),
        ("latency_sub_bits", LATENCY_SUB_BITS.into()),
        ("latency_unit_shift", LATENCY_UNIT_SHIFT.into()),
        ("latency_align", LATENCY_ALIGN),
        ("latency", size_of::<VcpuLatency>() as u64),
        ("latency.sum_ns", LATENCY_SUM_OFFSET),
        ("latency.countdown", LATENCY_COUNTDOWN_OFFSET),
        ("latency.agent", LATENCY_AGENT_OFFSET),
        ("latency.buckets", LATENCY_BUCKETS_OFFSET),
        ("latency_bucket_digest", bucket_digest()),
    ];
    for (name, rust) in expect {
        assert_eq!(c.get(name), Some(rust), "C header vs Rust: {name}");
    }
    assert_eq!(c.len(), expect.len());
}
