/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Requests with a start and an end (ABI minor 4): the per-vCPU part of the
 * request clock, shared by libstage (hot.c: stage_request_begin,
 * stage_enter, stage_exit) and the module's uprobes (probes.c: a stage
 * map's `request` symbols). The C mirror of guest-agent/src/request_clock.rs
 * (Agent::request_begin, request_pace, ticks_to_ns, record_latency); the
 * block is struct stagevm_vcpu_latency (stagevm_abi.h), its place
 * stagevm_latency_offset (stagevm_layout.h).
 *
 * The Rust agent has one writer per vCPU and uses plain stores. Here many
 * threads share a vCPU (and a uprobe hit may write the block of the CPU it
 * runs on while a libstage thread does too), so:
 *  - the countdown is replaced with a compare-and-swap (each request takes
 *    exactly one step of it; one writer wins each timed start);
 *  - a recorded latency is added with atomic adds: its bucket, sum_ns, then
 *    samples (release), the Rust agent's order, so the host never sees a
 *    sample without its bucket;
 *  - the pacing words (agent[0..2]) are guest-private and only a heuristic:
 *    racing writers may lose each other's updates, but every stride is
 *    computed afresh and clamped, so it stays in 1..TIMED_STRIDE_MAX + 3.
 *
 * Builds in kernel and user space, as stagevm_layout.h.
 */
#ifndef STAGEVM_REQUEST_H
#define STAGEVM_REQUEST_H

#include "stagevm_abi.h"

/* The longest countdown a writer of this header leaves (a stride of
 * TIMED_STRIDE_MAX plus up to 3, minus 1). A longer one is not ours (a
 * forged block): the next request is timed and re-arms it.
 */
#define STAGEVM_REQUEST_COUNTDOWN_MAX (STAGEVM_TIMED_STRIDE_MAX + 2u)

static inline uint64_t stagevm_request_tsc(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

/* ns per TSC tick x 2^32 for a TSC of `khz` kHz (> 0): (10^6 << 32) / khz,
 * below 2^52 (as Agent::register's ns_mult).
 */
static inline uint64_t stagevm_ns_mult(uint64_t khz)
{
	return (1000000ull << 32) / khz;
}

/* TSC ticks as ns (Agent::ticks_to_ns): (ticks x ns_mult) >> 32 in 128
 * bits, saturated.
 */
static inline uint64_t stagevm_ticks_to_ns(uint64_t ticks, uint64_t ns_mult)
{
	unsigned __int128 ns = ((unsigned __int128)ticks * ns_mult) >> 32;

	return ns >> 64 ? ~0ull : (uint64_t)ns;
}

/* TSC ticks in TIMED_INTERVAL_NS at `khz` kHz: the pace of timed requests. */
static inline uint64_t stagevm_pace_ticks(uint64_t khz)
{
	return khz * STAGEVM_TIMED_INTERVAL_NS / 1000000u;
}

/*
 * The next stride of timed requests on block `b`, at a timed start at TSC
 * `now` (Agent::request_pace): TIMED_INTERVAL_NS (`pace_ticks`) over the
 * mean TSC ticks per request - a moving average of weight 1/4 of the gap
 * since the last timed start over the stride begun since - in
 * 1..TIMED_STRIDE_MAX, plus ((now >> 6) & 3) % (stride / 4 + 1) so the
 * stride never locks onto a period of the workload. Kept in the block's
 * agent words: (last timed start, stride since, mean ticks per request).
 */
static inline uint64_t stagevm_request_pace(struct stagevm_vcpu_latency *b, uint64_t now,
					    uint64_t pace_ticks)
{
	uint64_t since = __atomic_load_n(&b->agent[0], __ATOMIC_RELAXED);
	uint64_t n = __atomic_load_n(&b->agent[1], __ATOMIC_RELAXED);
	uint64_t avg = __atomic_load_n(&b->agent[2], __ATOMIC_RELAXED), next;

	if (since && n && now >= since) {
		uint64_t per = (now - since) / n;

		if (!avg) {
			avg = per;
		} else {
			/* avg + (per - avg) / 4 in integers, saturated. */
			uint64_t a = avg / 4 * 3, p = per / 4;

			avg = a + p < a ? ~0ull : a + p;
		}
	}
	next = avg ? pace_ticks / avg : 1;
	if (next < 1)
		next = 1;
	if (next > STAGEVM_TIMED_STRIDE_MAX)
		next = STAGEVM_TIMED_STRIDE_MAX;
	next += ((now >> 6) & 3) % (next / 4 + 1);
	__atomic_store_n(&b->agent[0], now, __ATOMIC_RELAXED);
	__atomic_store_n(&b->agent[1], next, __ATOMIC_RELAXED);
	__atomic_store_n(&b->agent[2], avg, __ATOMIC_RELAXED);
	return next;
}

/*
 * A request starts on the vCPU of block `b` (Agent::request_begin): one
 * step of the block's countdown. Returns 0 for an untimed request, or for a
 * timed one the TSC read now (never 0) after re-arming the countdown to the
 * next stride less one: `every` when the agent was given a fixed stride
 * (1..TIMED_STRIDE_MAX), else stagevm_request_pace. Only a timed start
 * reads the TSC. Lock-free: a compare-and-swap per step.
 */
static inline uint64_t stagevm_request_begin(struct stagevm_vcpu_latency *b, uint64_t every,
					     uint64_t pace_ticks)
{
	uint64_t left = __atomic_load_n(&b->countdown, __ATOMIC_RELAXED);

	for (;;) {
		uint64_t now, stride;

		if (left != 0 && left <= STAGEVM_REQUEST_COUNTDOWN_MAX) {
			if (__atomic_compare_exchange_n(&b->countdown, &left, left - 1, 0,
							__ATOMIC_RELAXED, __ATOMIC_RELAXED))
				return 0;
			continue; /* `left` holds the new value */
		}
		now = stagevm_request_tsc();
		stride = every ? every : stagevm_request_pace(b, now, pace_ticks);
		if (__atomic_compare_exchange_n(&b->countdown, &left, stride - 1, 0,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED))
			return now ? now : 1;
		/* Another writer re-armed it first: this request is one of its
		 * stride.
		 */
	}
}

/*
 * Records one request of `ns` nanoseconds in block `b` (Agent::
 * record_latency, VcpuLatency::record): its bucket, the sum, then samples
 * with release ordering, each an atomic add. The caller has already
 * counted the request's completion (counts[CODE_NONE]) on the same vCPU,
 * so the host never sees more timed requests than completed ones. Returns
 * the bucket.
 */
static inline uint32_t stagevm_latency_record(struct stagevm_vcpu_latency *b, uint64_t ns)
{
	uint32_t bucket = stagevm_latency_bucket(ns);

	__atomic_fetch_add(&b->buckets[bucket], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->sum_ns, ns, __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->samples, 1, __ATOMIC_RELEASE);
	return bucket;
}

/* The latency of a timed request that started at TSC `start`, ending now
 * (0 when the TSC is not past it, e.g. a start the caller gave in the
 * future).
 */
static inline uint64_t stagevm_request_ns(uint64_t start, uint64_t ns_mult)
{
	uint64_t now = stagevm_request_tsc();

	return stagevm_ticks_to_ns(now > start ? now - start : 0, ns_mult);
}

#endif /* STAGEVM_REQUEST_H */
