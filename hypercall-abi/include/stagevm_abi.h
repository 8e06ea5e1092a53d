/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm stage channel ABI v1 (minor 4), for C guest agents (the Linux module and
 * libstage). Mirrors hypercall-abi/src/stage.rs; tests/c_header.rs compiles
 * this header and checks every size and offset against the Rust side.
 */
#ifndef STAGEVM_ABI_H
#define STAGEVM_ABI_H

#include <stdint.h>

#define STAGEVM_AREA_MAGIC 0x314e414843475453ULL /* "STGCHAN1" little endian */
#define STAGEVM_ABI_VERSION 1u
/* 1: map owned, minor; 2: counters, lossy trace rings; 3: map visit; 4: latency */
#define STAGEVM_ABI_MINOR 4ull
/* Header flags: counter blocks follow the rings. */
#define STAGEVM_AREA_FLAG_COUNTERS 1u
/* Minor 4, with COUNTERS: latency blocks follow the counter blocks. */
#define STAGEVM_AREA_FLAG_LATENCY 2u
/* Minor 3: stage-visit policies (stagevm_stage_map.visit, seed 002 ch. 3). */
#define STAGEVM_VISIT_FIFO 0ull
#define STAGEVM_VISIT_COHORT 1ull
#define STAGEVM_VISIT_SRPT 2ull
#define STAGEVM_VISIT_DBR 3ull
#define STAGEVM_VISIT_MG1 4ull
#define STAGEVM_VISIT_COLOR 5ull
#define STAGEVM_MAX_STAGES 16u
#define STAGEVM_MAX_VCPUS 64u
#define STAGEVM_MAX_RING_ENTRIES 65536u
#define STAGEVM_STAGE_NONE 0xffffffffu
#define STAGEVM_IDLE_THREAD 0xffffffffu
#define STAGEVM_PAGE_SIZE 4096u

#define STAGEVM_DOORBELL_REGISTER 0x610
#define STAGEVM_DOORBELL_UNREGISTER 0x614
#define STAGEVM_DOORBELL_WAIT 0x618
#define STAGEVM_DOORBELL_WAKE 0x61c
#define STAGEVM_DOORBELL_STATUS 0x610
#define STAGEVM_WAIT_MAX_US 100000u

enum stagevm_status {
	STAGEVM_OK = 0,
	STAGEVM_BAD_RANGE = 1,
	STAGEVM_BAD_ALIGNMENT = 2,
	STAGEVM_BAD_MAGIC = 3,
	STAGEVM_BAD_VERSION = 4,
	STAGEVM_BAD_LAYOUT = 5,
	STAGEVM_ALREADY_REGISTERED = 6,
	STAGEVM_NOT_REGISTERED = 7,
	STAGEVM_BAD_VCPU = 8,
	STAGEVM_NO_DEVICE = 0xffffffffu,
};

struct stagevm_area_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;
	uint64_t area_size;
	uint32_t num_vcpus;
	uint32_t num_stages;
	uint32_t ring_entries;
	uint32_t flags;
	uint64_t tsc_khz;
	uint64_t register_tsc; /* minor 2: guest TSC just before REGISTER (0: unknown) */
	uint64_t reserved;
};

struct stagevm_stage_desc {
	uint8_t name[32];
};

struct stagevm_stage_map {
	uint64_t epoch;
	uint64_t vcpus[STAGEVM_MAX_STAGES];
	uint64_t owned; /* minor 1: vCPUs alone on their host core */
	uint64_t minor; /* the host's STAGEVM_ABI_MINOR; 0 from a v1.0 host */
	uint64_t trace_every; /* minor 2, host-written: 0 no trace, N every Nth event */
	uint64_t visit; /* minor 3: stage-visit policy, STAGEVM_VISIT_* (unknown = FIFO) */
	uint64_t reserved[3];
};

struct stagevm_vcpu_state {
	uint32_t runq_depth;
	uint32_t parked;
	uint16_t runnable[STAGEVM_MAX_STAGES];
	uint32_t fallbacks;
	uint32_t reserved[5];
};

struct stagevm_ring_header {
	uint64_t head;
	uint64_t pad0[7];
	uint64_t tail;
	uint64_t pad1[7];
	uint64_t full_backoffs;
	uint64_t trace_dropped; /* minor 2: trace events dropped on a full ring */
	uint64_t pad2[6];
};

struct stagevm_stage_event {
	uint64_t seq;
	uint64_t tsc;
	uint32_t stage;
	uint32_t thread;
	uint64_t reserved;
};

/* Minor 2: per-vCPU counters (hypercall-abi/src/stage/counter_block.rs). The
 * state word is (TSC & ~STATE_LOW_MASK) | timed flag | code, or for an
 * untimed visit (guest-private value << 6) | code; codes index
 * cycles[], timed[] and counts[]: 0 none (requests completed), 1 idle,
 * 2 + s stage s. About one visit per STAGEVM_TIMED_INTERVAL_NS per vCPU
 * is timed (one transition in STAGEVM_TIMED_EVERY when the TSC rate is
 * unknown); idle visits are always timed.
 */
#define STAGEVM_STATE_CODE_BITS 5u
#define STAGEVM_STATE_CODE_MASK 31ull
#define STAGEVM_STATE_TIMED 32ull
#define STAGEVM_STATE_PRIVATE_SHIFT 6u /* bit 6, and bits 6-63 of an untimed state: guest-private */
#define STAGEVM_STATE_LOW_MASK 127ull
#define STAGEVM_CODE_NONE 0u
#define STAGEVM_CODE_IDLE 1u
#define STAGEVM_CODE_FIRST_STAGE 2u
#define STAGEVM_NUM_CODES (STAGEVM_CODE_FIRST_STAGE + STAGEVM_MAX_STAGES)
#define STAGEVM_TIMED_EVERY 61u
#define STAGEVM_TIMED_INTERVAL_NS 16000u
#define STAGEVM_TIMED_STRIDE_MAX 1021u
#define STAGEVM_COUNTERS_ALIGN 128u /* the first block: after the rings, rounded up */

struct stagevm_vcpu_counters {
	uint64_t state;
	uint64_t countdown; /* guest-private */
	uint64_t cycles[STAGEVM_NUM_CODES];
	uint64_t timed[STAGEVM_NUM_CODES];
	uint64_t counts[STAGEVM_NUM_CODES];
	uint64_t migrations_in[STAGEVM_MAX_STAGES];
	uint64_t migrations_out[STAGEVM_MAX_STAGES];
	uint64_t agent[2]; /* guest-private */
	uint64_t reserved[6];
};

/* Minor 4: per-vCPU request-latency histograms
 * (hypercall-abi/src/stage/latency.rs), right after the last counter block.
 * Buckets are log-linear over 16-ns units u = ns >> 4: u < 8 is bucket u;
 * else, with e = floor(log2 u), bucket 8 * (e - 2) + ((u >> (e - 3)) & 7),
 * at most 255 (>= 2^38 ns). The agent records a timed request's latency in
 * the vCPU it ends on: the bucket, sum_ns, then samples (release).
 */
#define STAGEVM_LATENCY_BUCKETS 256u
#define STAGEVM_LATENCY_SUB_BITS 3u
#define STAGEVM_LATENCY_UNIT_SHIFT 4u
#define STAGEVM_LATENCY_ALIGN 128u

struct stagevm_vcpu_latency {
	uint64_t samples; /* requests recorded: the sum of buckets, stored last */
	uint64_t sum_ns;
	uint64_t countdown; /* guest-private: requests to the next timed one */
	uint64_t agent[3]; /* guest-private: the agent's pacing of timed requests */
	uint64_t reserved[10];
	uint64_t buckets[STAGEVM_LATENCY_BUCKETS];
};

/* The bucket of a latency of ns nanoseconds (as latency_bucket in Rust). */
static inline uint32_t stagevm_latency_bucket(uint64_t ns)
{
	uint64_t u = ns >> STAGEVM_LATENCY_UNIT_SHIFT;
	uint32_t e;
	uint64_t index;

	if (u < (1u << STAGEVM_LATENCY_SUB_BITS))
		return (uint32_t)u;
	e = 63u - (uint32_t)__builtin_clzll(u);
	index = (uint64_t)(e - (STAGEVM_LATENCY_SUB_BITS - 1u)) << STAGEVM_LATENCY_SUB_BITS;
	index += (u >> (e - STAGEVM_LATENCY_SUB_BITS)) & ((1u << STAGEVM_LATENCY_SUB_BITS) - 1u);
	return index >= STAGEVM_LATENCY_BUCKETS ? STAGEVM_LATENCY_BUCKETS - 1u : (uint32_t)index;
}

#define STAGEVM_STAGE_DESCS_OFFSET 64u
#define STAGEVM_STAGE_MAP_OFFSET (STAGEVM_STAGE_DESCS_OFFSET + STAGEVM_MAX_STAGES * 32u)
#define STAGEVM_VCPU_STATES_OFFSET (STAGEVM_STAGE_MAP_OFFSET + 192u)
#define STAGEVM_RINGS_OFFSET (STAGEVM_VCPU_STATES_OFFSET + STAGEVM_MAX_VCPUS * 64u)

#endif /* STAGEVM_ABI_H */
