/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage's private header (not installed; stage.h is the API): what its
 * two translation units share. stage.c opens the channel, registers, reads
 * the stage map, attaches and detaches threads and answers the getters;
 * hot.c is the hot path, stage_enter/stage_exit (its file comment describes
 * the protocol). Here: the transport and report modes, the thread's state
 * T and the process's state G (defined in stage.c), and the small inline
 * helpers both use. A file including this defines _GNU_SOURCE first.
 */
#ifndef LIBSTAGE_INTERNAL_H
#define LIBSTAGE_INTERNAL_H

#include "stage.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>

#if __has_include("sys/rseq.h")
#include <sys/rseq.h>
#define LIBSTAGE_GLIBC_RSEQ 1
#else
#include <linux/rseq.h>
#define LIBSTAGE_GLIBC_RSEQ 0
#endif

#include "stagevm_ioctl.h"
#include "stagevm_layout.h"
#include "stagevm_request.h"

#if !defined(__x86_64__)
#error "libstage's rseq critical section is written for x86-64"
#endif

/* Signature before the abort handler; glibc registers rseq with this value
 * on x86, and libstage's own registration uses it too (rseq_cs.h spells it
 * out in the abort handler's signature).
 */
#define LIBSTAGE_RSEQ_SIG 0x53053053

/* A thread's transport. */
#define MODE_RSEQ 1
#define MODE_LOCK 2

/* How the process reports (G.report): not decided yet (no map seen), every
 * switch an event in the rings, or per-vCPU counters (ABI minor 2).
 */
#define REPORT_UNDECIDED 0
#define REPORT_RINGS 1
#define REPORT_COUNTERS 2

struct stage_thread {
	int attached;
	int mode;
	int own_rseq;
	int stage;
	uint32_t tid;
	int last_cpu;
	int affinity_changed;
	struct rseq *rs;
	uint64_t epoch;
	uint64_t masks[STAGEVM_MAX_STAGES];
	cpu_set_t saved;
	/* The thread's request clock (ABI minor 4; Rust: RequestClock): a
	 * request is open from its begin (stage_request_begin*, or the first
	 * stage_enter after a stage_exit) to its stage_exit; req_start is the
	 * TSC a timed one started at, 0 for an untimed one.
	 */
	int req_open;
	uint64_t req_start;
	struct stage_stats st;
};

struct libstage_global {
	int ready;
	int fd;
	int device;
	int registered;
	int force_lock;
	uint8_t *base;
	size_t len;
	struct stagevm_layout l;
	int report;               /* REPORT_*, written once under G_lock */
	uint8_t *counters;        /* counters mode: vCPU 0's counter block */
	/* vCPU 0's latency block when requests are timed (counters mode, an
	 * area with latency blocks, a host of minor >= 4 that gave the TSC
	 * rate), else NULL; written before G.report.
	 */
	struct stagevm_vcpu_latency *latency;
	uint64_t ns_mult;         /* ns per TSC tick x 2^32 (timed requests) */
	uint64_t timed_every;     /* fixed stride of timed visits and requests, or 0: paced */
	uint64_t pace_ticks;      /* TSC ticks between paced timed visits (and requests) */
	uint64_t all_mask;
	char names[STAGEVM_MAX_STAGES][33];
	int named;
	struct stage_stats done;
	pthread_key_t key;
	int key_ok;
};

/*
 * The shared state and functions keep the short names the code uses but
 * link as hidden libstage_* symbols: libstage.a goes into programs that may
 * well have their own G or T. The thread's state is accessed %fs-relative
 * (local-exec) in both units, as when it was a static of one file: right
 * for an executable, PIE or not, which is what libstage.a is linked into
 * (a -fPIC build keeps the compiler's default model).
 */
#define LIBSTAGE_HIDDEN __attribute__((visibility("hidden")))
#if !defined(__PIC__) || defined(__PIE__)
#define LIBSTAGE_TLS __attribute__((tls_model("local-exec")))
#else
#define LIBSTAGE_TLS
#endif

extern __thread struct stage_thread T __asm__("libstage_T") LIBSTAGE_HIDDEN LIBSTAGE_TLS;
extern struct libstage_global G __asm__("libstage_G") LIBSTAGE_HIDDEN;
extern pthread_mutex_t G_lock __asm__("libstage_G_lock") LIBSTAGE_HIDDEN;

/* stage.c: copies the map into the thread's cache (stage_enter calls it when
 * the map's epoch changed).
 */
void read_map(struct stage_thread *t) __asm__("libstage_read_map") LIBSTAGE_HIDDEN;

static inline uint8_t *ring_at(uint32_t vcpu)
{
	return G.base + stagevm_ring_offset(&G.l, vcpu);
}

/* vCPU `vcpu`'s latency block (a layout with latency blocks). */
static inline struct stagevm_vcpu_latency *latency_at(uint32_t vcpu)
{
	return (struct stagevm_vcpu_latency *)(G.base + stagevm_latency_offset(&G.l, vcpu));
}

static inline const struct stagevm_stage_map *map_at(void)
{
	return (const struct stagevm_stage_map *)(G.base + STAGEVM_STAGE_MAP_OFFSET);
}

static inline int current_cpu(const struct stage_thread *t)
{
	if (t->mode == MODE_RSEQ)
		return (int)__atomic_load_n(&t->rs->cpu_id, __ATOMIC_RELAXED);
	return sched_getcpu();
}

#endif /* LIBSTAGE_INTERNAL_H */
