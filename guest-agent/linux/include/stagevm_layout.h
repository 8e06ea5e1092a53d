/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layout helpers for the stage channel ABI v1, shared by the Linux kernel
 * module, libstage and stagectl. The C mirror of hypercall_abi::stage::Layout
 * (hypercall-abi/src/stage.rs): sizes and offsets come from stagevm_abi.h,
 * which tests/c_header.rs checks against the Rust crate; these formulas are
 * checked against Layout by tests/libstage.rs (the `layout` mode of the test
 * program), so nothing here is a hand-copied constant.
 *
 * Builds in kernel and user space (the module gets <stdint.h> from its
 * compat/ shim over <linux/types.h>).
 */
#ifndef STAGEVM_LAYOUT_H
#define STAGEVM_LAYOUT_H

#include "stagevm_abi.h"

#ifdef __KERNEL__
#include <linux/string.h>
#else
#include <stddef.h>
#include <string.h>
#endif

/* Bytes at the start of the area that user space maps read-only in a guest:
 * the header, stage descriptors, stage map and the first vCPU states. Rings
 * start after RINGS_OFFSET (4864), inside the second page, the counter
 * blocks (minor 2) after the rings and the latency blocks (minor 4) after
 * them: all can be mapped read-write.
 */
#define STAGEVM_RO_BYTES STAGEVM_PAGE_SIZE

/* Offset of `head`, `tail`, `full_backoffs` and `trace_dropped` in a ring
 * header.
 */
#define STAGEVM_RING_HEAD_OFF 0u
#define STAGEVM_RING_TAIL_OFF 64u
#define STAGEVM_RING_BACKOFFS_OFF 128u
#define STAGEVM_RING_TRACE_DROPPED_OFF 136u
/*
 * libstage's guest-private lock word for writers without rseq: word 0 of
 * RingHeader.pad0 (offset 8), on the guest-owned cache line of `head`. It
 * guards ring v and, in counters mode, the state word of vCPU v's counter
 * block. The host never reads pad0. All writers of one ring and block must
 * use the same protocol (rseq or this lock); see guest-agent/linux/README.md.
 */
#define STAGEVM_RING_LOCK_OFF 8u

struct stagevm_layout {
	uint32_t num_vcpus;
	uint32_t num_stages;
	uint32_t ring_entries;
	uint32_t counters; /* 1: a VcpuCounters block per vCPU follows the rings */
	uint32_t latency;  /* 1 (with counters): a VcpuLatency block per vCPU follows the
			    * counter blocks (minor 4)
			    */
};

/* Layout::new: 0 if the counts form a valid layout (rings only, no
 * counters), -1 otherwise.
 */
static inline int stagevm_layout_init(struct stagevm_layout *l, uint32_t num_vcpus,
				      uint32_t num_stages, uint32_t ring_entries)
{
	if (num_vcpus < 1 || num_vcpus > STAGEVM_MAX_VCPUS || num_stages < 1 ||
	    num_stages > STAGEVM_MAX_STAGES || ring_entries < 2 ||
	    ring_entries > STAGEVM_MAX_RING_ENTRIES || (ring_entries & (ring_entries - 1)))
		return -1;
	l->num_vcpus = num_vcpus;
	l->num_stages = num_stages;
	l->ring_entries = ring_entries;
	l->counters = 0;
	l->latency = 0;
	return 0;
}

/* Layout::with_counters: the same layout with the per-vCPU counter blocks
 * after the rings (ABI minor 2, STAGEVM_AREA_FLAG_COUNTERS).
 */
static inline void stagevm_layout_with_counters(struct stagevm_layout *l)
{
	l->counters = 1;
}

/* Layout::with_latency: the same layout with the counter blocks and, after
 * them, the per-vCPU latency histograms (ABI minor 4,
 * STAGEVM_AREA_FLAG_LATENCY, which means nothing without the counters).
 */
static inline void stagevm_layout_with_latency(struct stagevm_layout *l)
{
	l->counters = 1;
	l->latency = 1;
}

/* The layout a header's `flags` announce (as validate_header): counters
 * with AREA_FLAG_COUNTERS, latency blocks too with AREA_FLAG_LATENCY as
 * well; a latency flag alone is ignored.
 */
static inline void stagevm_layout_apply_flags(struct stagevm_layout *l, uint32_t flags)
{
	if (!(flags & STAGEVM_AREA_FLAG_COUNTERS))
		return;
	if (flags & STAGEVM_AREA_FLAG_LATENCY)
		stagevm_layout_with_latency(l);
	else
		stagevm_layout_with_counters(l);
}

static inline uint64_t stagevm_ring_bytes(const struct stagevm_layout *l)
{
	return sizeof(struct stagevm_ring_header) +
	       (uint64_t)l->ring_entries * sizeof(struct stagevm_stage_event);
}

static inline uint64_t stagevm_vcpu_state_offset(uint32_t vcpu)
{
	return STAGEVM_VCPU_STATES_OFFSET + 64u * (uint64_t)vcpu;
}

static inline uint64_t stagevm_ring_offset(const struct stagevm_layout *l, uint32_t vcpu)
{
	return STAGEVM_RINGS_OFFSET + (uint64_t)vcpu * stagevm_ring_bytes(l);
}

static inline uint64_t stagevm_slot_offset(const struct stagevm_layout *l, uint32_t vcpu,
					   uint64_t index)
{
	return stagevm_ring_offset(l, vcpu) + sizeof(struct stagevm_ring_header) +
	       (index & (uint64_t)(l->ring_entries - 1)) * sizeof(struct stagevm_stage_event);
}

/* Layout::counters_offset: vCPU `vcpu`'s counter block, after the last ring
 * rounded up to STAGEVM_COUNTERS_ALIGN (128 bytes), blocks back to back
 * (768 bytes each). Only meaningful for a layout with counters.
 */
static inline uint64_t stagevm_counters_offset(const struct stagevm_layout *l, uint32_t vcpu)
{
	uint64_t rings_end = stagevm_ring_offset(l, l->num_vcpus);

	return (rings_end + STAGEVM_COUNTERS_ALIGN - 1) / STAGEVM_COUNTERS_ALIGN *
		       STAGEVM_COUNTERS_ALIGN +
	       (uint64_t)vcpu * sizeof(struct stagevm_vcpu_counters);
}

/* Layout::latency_offset: vCPU `vcpu`'s latency histogram, right after the
 * last counter block (a multiple of STAGEVM_LATENCY_ALIGN, as every counter
 * block is), blocks back to back (2176 bytes each). Only meaningful for a
 * layout with latency blocks.
 */
static inline uint64_t stagevm_latency_offset(const struct stagevm_layout *l, uint32_t vcpu)
{
	return stagevm_counters_offset(l, l->num_vcpus) +
	       (uint64_t)vcpu * sizeof(struct stagevm_vcpu_latency);
}

/* Layout::used_bytes: the end of the last ring, or of the last counter block
 * in a layout with counters, or of the last latency block in a layout with
 * latency blocks.
 */
static inline uint64_t stagevm_used_bytes(const struct stagevm_layout *l)
{
	if (l->latency)
		return stagevm_latency_offset(l, l->num_vcpus);
	if (l->counters)
		return stagevm_counters_offset(l, l->num_vcpus);
	return stagevm_ring_offset(l, l->num_vcpus);
}

static inline uint64_t stagevm_area_size(const struct stagevm_layout *l)
{
	uint64_t used = stagevm_used_bytes(l);

	return (used + STAGEVM_PAGE_SIZE - 1) / STAGEVM_PAGE_SIZE * STAGEVM_PAGE_SIZE;
}

/*
 * Lays out an area of `area_size` bytes at `base` as Agent::register does:
 * zeroes it (so every counter and histogram starts at 0), writes the header
 * (with STAGEVM_AREA_FLAG_COUNTERS for a layout with counters, and
 * STAGEVM_AREA_FLAG_LATENCY too for one with latency blocks) and the NUL-padded
 * stage names (`names` may be NULL; names[i] may be NULL; a name longer than
 * 32 bytes is cut, one of 32 bytes has no NUL, as in Agent::register). With
 * counters the caller then starts them (stagevm_area_start_counters) and
 * sends REGISTER. Returns 0, or -1 if the layout does not fit.
 */
static inline int stagevm_area_init(void *base, uint64_t area_size, const struct stagevm_layout *l,
				    const char *const *names)
{
	struct stagevm_area_header *h = (struct stagevm_area_header *)base;
	uint32_t i;

	if (stagevm_used_bytes(l) > area_size || area_size % STAGEVM_PAGE_SIZE)
		return -1;
	memset(base, 0, (size_t)area_size);
	for (i = 0; names && i < l->num_stages; i++) {
		struct stagevm_stage_desc *d =
			(struct stagevm_stage_desc *)((char *)base + STAGEVM_STAGE_DESCS_OFFSET +
						      32u * i);
		size_t n;

		if (!names[i])
			continue;
		n = strlen(names[i]);
		if (n > sizeof(d->name))
			n = sizeof(d->name);
		memcpy(d->name, names[i], n);
	}
	h->magic = STAGEVM_AREA_MAGIC;
	h->version = STAGEVM_ABI_VERSION;
	h->header_size = sizeof(struct stagevm_area_header);
	h->area_size = area_size;
	h->num_vcpus = l->num_vcpus;
	h->num_stages = l->num_stages;
	h->ring_entries = l->ring_entries;
	h->flags = !l->counters ? 0 :
		   l->latency  ? STAGEVM_AREA_FLAG_COUNTERS | STAGEVM_AREA_FLAG_LATENCY :
				 STAGEVM_AREA_FLAG_COUNTERS;
	return 0;
}

/* ---- minor 2: state words (hypercall-abi/src/stage/counter_block.rs) ---- */

/* state_word: `code` since guest TSC `tsc`, timed or not. */
static inline uint64_t stagevm_state_word(uint64_t tsc, uint32_t code, int timed)
{
	return (tsc & ~STAGEVM_STATE_LOW_MASK) | (timed ? STAGEVM_STATE_TIMED : 0) |
	       ((uint64_t)code & STAGEVM_STATE_CODE_MASK);
}

static inline uint32_t stagevm_state_code(uint64_t state)
{
	return (uint32_t)(state & STAGEVM_STATE_CODE_MASK);
}

static inline int stagevm_state_timed(uint64_t state)
{
	return (state & STAGEVM_STATE_TIMED) != 0;
}

/* The TSC a timed state holds since (granule cleared). */
static inline uint64_t stagevm_state_since(uint64_t state)
{
	return state & ~STAGEVM_STATE_LOW_MASK;
}

/* needs_tsc: the transition from `state` into `code` with `countdown`
 * transitions left before a timed visit ends a timed visit or starts one.
 */
static inline int stagevm_needs_tsc(uint64_t state, uint64_t countdown, uint32_t code)
{
	return stagevm_state_timed(state) || countdown == 0 || code == STAGEVM_CODE_IDLE;
}

/*
 * What Agent::register does to the counters of a freshly laid-out area with
 * counters: the guest TSC `tsc`, read just before REGISTER, goes into the
 * header's register_tsc, and every vCPU starts in a timed "no stage" visit
 * from it (the host then charges each vCPU's time from REGISTER on). No-op
 * for a layout without counters.
 */
static inline void stagevm_area_start_counters(void *base, const struct stagevm_layout *l,
					       uint64_t tsc)
{
	struct stagevm_area_header *h = (struct stagevm_area_header *)base;
	uint32_t v;

	if (!l->counters)
		return;
	for (v = 0; v < l->num_vcpus; v++) {
		char *block = (char *)base + stagevm_counters_offset(l, v);
		struct stagevm_vcpu_counters *c = (struct stagevm_vcpu_counters *)block;

		c->state = stagevm_state_word(tsc, STAGEVM_CODE_NONE, 1);
	}
	h->register_tsc = tsc;
}

/* Name of a doorbell status (STAGEVM_OK ...), for messages. */
static inline const char *stagevm_status_name(uint32_t s)
{
	switch (s) {
	case STAGEVM_OK: return "ok";
	case STAGEVM_BAD_RANGE: return "bad range";
	case STAGEVM_BAD_ALIGNMENT: return "bad alignment";
	case STAGEVM_BAD_MAGIC: return "bad magic";
	case STAGEVM_BAD_VERSION: return "bad version";
	case STAGEVM_BAD_LAYOUT: return "bad layout";
	case STAGEVM_ALREADY_REGISTERED: return "already registered";
	case STAGEVM_NOT_REGISTERED: return "not registered";
	case STAGEVM_BAD_VCPU: return "bad vcpu";
	case STAGEVM_NO_DEVICE: return "no stage device";
	default: return "unknown status";
	}
}

#endif /* STAGEVM_LAYOUT_H */
