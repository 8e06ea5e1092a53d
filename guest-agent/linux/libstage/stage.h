/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage: the seeds' user-space stage API for Linux guests of stagevm.
 *
 *   stage_init();                  // open /dev/stagevm (or $STAGEVM_FD)
 *   stage_name(0, "parse");        // name every stage ...
 *   stage_name(1, "execute");
 *   stage_register();              // ... then register (else: at the first stage_enter)
 *   // in any thread:
 *   stage_enter(0); parse(); stage_enter(1); execute(); stage_exit();
 *
 * stage_enter(id) reports the switch on the CPU the thread runs on (in a
 * guest, CPU i is vCPU i) with a few user-space stores and no system call:
 * on a host of ABI minor 2 as a transition of that CPU's stage counters
 * (stage_mode() "counters"), on an older host as an event in that CPU's
 * ring ("rings"). It calls sched_setaffinity() only when that CPU does not
 * serve the stage in the host's current stage map (the map epoch and masks
 * are cached per thread), restricting the thread to the CPUs that serve it.
 * On a host of minor 4 the requests these calls delimit are timed too: a
 * request runs from its first stage_enter (or stage_request_begin*) to its
 * stage_exit, and one in N per vCPU goes to that vCPU's latency histogram.
 *
 * Every function returns 0 (or a non-negative value) on success and -errno
 * on failure; none of them is async-signal-safe. Layout types come from
 * stagevm_abi.h (hypercall-abi/include), the ABI checked against the Rust
 * crate; see guest-agent/linux/README.md.
 */
#ifndef LIBSTAGE_STAGE_H
#define LIBSTAGE_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "stagevm_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STAGE_MAX ((int)STAGEVM_MAX_STAGES)

/*
 * Opens the channel. Environment (read here):
 *   STAGEVM_FD, STAGEVM_LEN  use the area in this file descriptor (a memfd)
 *                            of this many bytes, as stage_init_fd() does;
 *   STAGEVM_DEVICE           device path (default /dev/stagevm);
 *   STAGEVM_VCPUS, STAGEVM_RING_ENTRIES  area geometry in fd mode
 *                            (default: configured CPUs, 256 entries);
 *   STAGEVM_COUNTERS=0       fd mode: lay the area out without counters (a
 *                            v1.1 guest: rings only); counters are also left
 *                            out when they do not fit STAGEVM_LEN;
 *   STAGE_TRANSPORT=lock     write rings and state words under a per-ring
 *                            lock instead of rseq (tests; every writer of a
 *                            ring must agree);
 *   STAGEVM_LATENCY=0        fd mode: lay the area out without the latency
 *                            blocks (a minor-3 guest: no request is timed);
 *                            they are also left out when they do not fit
 *                            STAGEVM_LEN;
 *   STAGE_TIMED_EVERY=N      counters mode: time one visit in N, and one
 *                            request in N (1: every visit and request,
 *                            at most 1021; default: about one per 16 us
 *                            per vCPU when the host gave the TSC rate,
 *                            else one visit in 61).
 * Idempotent; -EALREADY is never returned.
 */
int stage_init(void);

/*
 * Uses the `len`-byte area in `fd` (e.g. a memfd shared with a host-side
 * test) instead of /dev/stagevm. libstage then plays the kernel module's part
 * at stage_register(): it lays the area out itself; the host registers it.
 * An area that already holds a valid header is joined as it is.
 */
int stage_init_fd(int fd, size_t len);

/* Names stage `id` (before registration; up to 32 bytes are kept). The
 * stages are 0..n-1 where n-1 is the highest id named.
 */
int stage_name(unsigned int id, const char *name);

/* Lays out and registers the area with the named stages (device: through
 * the module's REGISTER ioctl and the doorbell), or joins a registration that
 * exists already. Called by the first stage_enter() if not before.
 */
int stage_register(void);

/* The calling thread starts / stops using the channel. Attach is implicit in
 * stage_enter(); detach runs at thread exit, restores the affinity the
 * thread had at attach, and folds its counters into stage_get_stats().
 */
int stage_attach(void);
int stage_detach(void);

/* Enters stage `id`: migrates the thread when its CPU does not serve the
 * stage, then reports the switch. Returns the vCPU whose counters (or ring)
 * got the switch (it serves the stage in the map the thread last read,
 * unless no vCPU serves it: then the thread stays, counted as a fallback),
 * -EINVAL for an unknown stage, -EAGAIN when the switch could not be
 * reported (rings: a ring full for a second; either mode: a ring lock busy
 * for a second; counted as dropped), -ERANGE on a CPU without a ring. In
 * counters mode it never waits for the host.
 */
int stage_enter(unsigned int id);

/* Leaves the current stage: a request is done (reports STAGE_NONE, the
 * counters' "no stage" code); returns the vCPU written. It ends the
 * thread's request (see stage_request_begin): a timed one's latency, from
 * its start to now, goes to the latency histogram of the vCPU written.
 */
int stage_exit(void);

/*
 * Requests with a start and an end (ABI minor 4). Each thread has a request
 * clock. A request starts at stage_request_begin() (now), at
 * stage_request_begin_at(tsc) (the caller's TSC: an open-loop client passes
 * the request's arrival time; 0 means now), or - for a program that never
 * calls either - at the first stage_enter() while none is open; a request
 * already open is started again. It ends at stage_exit(). One request in N
 * per vCPU is timed (N paced to about one timed request per vCPU every
 * 16 us from the vCPU's mean time per request, or STAGE_TIMED_EVERY), and
 * only a timed one reads the TSC. Its latency goes to the histogram of the
 * vCPU its stage_exit ran on, which the host reads once per policy period.
 * Requests are timed only when the area has latency blocks, the host's
 * minor is >= 4 and it gave the TSC rate (stage_get_stats' `latency`);
 * otherwise the clock only opens and closes.
 *
 * Both return 1 when this request is timed, 0 when not, -errno when the
 * thread could not attach (as stage_attach).
 */
int stage_request_begin(void);
int stage_request_begin_at(uint64_t tsc);

/* The calling thread's stage, or -1. */
int stage_current(void);

/* The CPU the calling thread runs on now (rseq's cpu_id, else getcpu). */
int stage_cpu(void);

/* "rseq" or "lock": how this thread writes rings and state words (after
 * attach).
 */
const char *stage_transport(void);

/* How this process reports stage switches, decided once from the first
 * stage map libstage sees after registration: "counters" (the host's ABI
 * minor is >= 2 and the area has counter blocks), "rings" (an older host,
 * or an area without counters), "none" (no map seen yet).
 */
const char *stage_mode(void);

/* A consistent copy of the host's stage map (epoch 0: none published yet,
 * and then every vCPU serves every stage).
 */
struct stage_map_view {
	uint64_t epoch;
	uint32_t num_stages;
	uint32_t num_vcpus;
	uint64_t vcpus[STAGEVM_MAX_STAGES];
	uint64_t owned;       /* minor 1: vCPUs alone on their host core */
	uint64_t minor;       /* the host's ABI minor (0: v1.0 host) */
	uint64_t trace_every; /* minor 2: 0 no trace, N every Nth event traced */
	/* minor 3: the stage-visit policy, STAGEVM_VISIT_* (FIFO from an older host) */
	uint64_t visit;
};
int stage_map(struct stage_map_view *out);

/* The stage map's epoch now (one load; 0 before registration or before the
 * host published a map): a caller that acts on the map (a temporal gate
 * following its visit policy) calls stage_map() only when this changed.
 */
uint64_t stage_map_epoch(void);

/* Name of stage `id` as registered, or NULL. */
const char *stage_get_name(unsigned int id);

/* Counters of this process: detached threads plus the calling thread. */
struct stage_stats {
	uint64_t enters[STAGEVM_MAX_STAGES]; /* enters reported, per stage */
	uint64_t exits;                      /* exits reported */
	uint64_t affinity_calls;    /* sched_setaffinity() calls by stage_enter */
	uint64_t affinity_failures; /* of which failed (thread stayed) */
	uint64_t cpu_changes;  /* switches on another vCPU than the thread's last */
	uint64_t fallbacks;    /* enters of a stage no vCPU serves (stayed) */
	uint64_t full_waits;   /* rings: times a ring was found full (then waited) */
	uint64_t dropped;      /* switches not reported (-EAGAIN, no ring) */
	uint64_t rseq_aborts;  /* restarted critical sections */
	uint64_t lock_waits;   /* lock transport: times the ring lock was busy */
	uint64_t map_reads;    /* stage-map copies (new epochs seen) */
	uint64_t threads;      /* threads attached */
	/* Counters mode (ABI minor 2). */
	uint64_t counters;      /* 1 when the process reports through counters */
	uint64_t state_retries; /* state word changed by another thread first */
	uint64_t tsc_reads;     /* transitions that read the TSC (timed visits) */
	uint64_t migrations_in[STAGEVM_MAX_STAGES];  /* counted, per stage entered */
	uint64_t migrations_out[STAGEVM_MAX_STAGES]; /* counted, per stage left */
	uint64_t trace_written; /* trace events written (StageMap.trace_every) */
	uint64_t trace_dropped; /* trace events dropped on a full ring */
	/* Requests (ABI minor 4). */
	uint64_t latency;        /* 1 when the process times requests */
	uint64_t requests;       /* requests begun (explicitly or at a stage_enter) */
	uint64_t requests_timed; /* timed requests whose latency stage_exit recorded */
};
void stage_get_stats(struct stage_stats *out);

/* Unmaps the area and closes the channel (threads must be done with it). */
void stage_shutdown(void);

/* Test hooks. stage__write_raw writes one event into the ring of the CPU
 * the thread runs on, through the normal transport (waiting while the ring
 * is full, in either mode), with `seq` XOR-ed with `seq_xor` (0: the valid
 * form) and the given stage and thread; it returns the vCPU written.
 * stage__ring_pending returns head - tail of ring `vcpu`.
 */
int stage__write_raw(uint64_t seq_xor, uint32_t stage, uint32_t thread);
int64_t stage__ring_pending(unsigned int vcpu);
/* The area's base address and length (read-only view), or NULL. */
const void *stage__area(size_t *len);
/* Test only (tests/libstage.rs compares it with the Rust agent): records a
 * request of `ns` nanoseconds in vCPU `cpu`'s latency block through the
 * path stage_exit uses for a timed request, whether or not requests are
 * timed (the area needs latency blocks). Returns the bucket, -ENODEV
 * without latency blocks, -ERANGE for a vCPU past the area's.
 */
int stage__test_record_latency(unsigned int cpu, uint64_t ns);

#ifdef __cplusplus
}
#endif

#endif /* LIBSTAGE_STAGE_H */
