/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage's hot path: stage_enter and stage_exit (and the test hook
 * stage__write_raw, which writes through the same ring push); the request
 * clock they open and close is request.h (ABI minor 4). stage.c opens
 * the channel, registers, reads the map and attaches threads; see stage.h
 * for the API and guest-agent/linux/README.md for the protocol. The path is
 * one translation unit so that the compiler sees all of it: count() with
 * its rseq compare-and-store and push() with its rseq ring write (both in
 * rseq_cs.h, static inline), the lock transport and the migration.
 *
 * Two ways to report a stage switch, chosen once per process when libstage
 * first sees the host's stage map (stage.c, as guest-agent/src/lib.rs,
 * Mode):
 *
 * Counters (ABI minor 2: the area has STAGEVM_AREA_FLAG_COUNTERS and the
 * map says minor >= 2). A switch is a transition of the current CPU's
 * counter block (hypercall-abi/src/stage/counter_block.rs): the state word is
 * replaced, then counts[new] grows by one and, when a timed visit ended,
 * its length goes into cycles[old] and timed[old] grows by one. The TSC is
 * read only when the transition ends or starts a timed visit (needs_tsc).
 * Many threads share a CPU and so a block: the state word - and only it -
 * is replaced inside one rseq critical section that checks the CPU and that
 * the word still holds the value read before (a compare-and-store whose
 * store commits it; on an abort or a changed word the transition is
 * recomputed), so every committed transition replaced exactly the state it
 * ended. The counts are added after the commit with atomic adds, which
 * keeps them exact whoever is preempted where. The countdown and pacing
 * words are guest-private and written with plain stores: a race there only
 * moves which visit is timed. When the host asks for a trace
 * (StageMap.trace_every), the event also goes to the CPU's ring the way
 * Agent::try_push does it: never waiting, a full ring drops the event and
 * counts it in RingHeader.trace_dropped.
 *
 * Rings (an older host, or an area without counters). The ring protocol is
 * the one of guest-agent/src/ring.rs (Agent::push): write slot[head %
 * entries] with seq = head, then publish head + 1 (a release store; x86
 * does not reorder stores), never overwriting a slot the host has not
 * consumed (head - tail == entries: count a back-off in the ring header and
 * wait for the host's tail).
 *
 * Concurrency of the rings. The host's drain (vmm/src/stage/ring.rs)
 * assumes one producer per ring: it reads head, then every slot in [tail,
 * head), checking seq == index. In Linux many threads, of many processes,
 * share CPU c and so ring c, and any of them can be preempted in the middle
 * of a write. libstage keeps the single-producer property with restartable
 * sequences (rseq, Linux 4.18+): the whole push - check that the thread is
 * still on CPU c, load head and tail, fill the slot, store head + 1 - is one
 * rseq critical section whose last instruction (the head store) commits
 * it. If the thread is preempted, migrated or signalled before that store,
 * the kernel restarts it at the abort handler and libstage retries; the
 * half-written slot lies beyond head, so no reader sees it, and the next
 * writer on CPU c overwrites it. Code on one CPU is serialised, so per ring
 * the writes behave as one producer and the ABI and the VMM need no change.
 *
 * Requests (ABI minor 4). stage_enter opens the thread's request clock
 * when none is open, stage_exit closes it after counting the completion and
 * records a timed request's latency on the same CPU (request.h).
 *
 * Without rseq (old kernel, or STAGE_TRANSPORT=lock) rings and state words
 * are written under a spin lock in a guest-private word of the ring header
 * (RingHeader.pad0[0], which the host never reads); a waiter yields the CPU
 * so a preempted holder can finish, and gives up (drops and counts the
 * event) after a second. Writers of one ring must all use the same
 * transport.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <time.h>

#include "request.h"
#include "rseq_cs.h"

/* How long a writer waits for ring space or a ring lock before dropping. */
#define LIBSTAGE_WAIT_NS 1000000000ull

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline volatile uint64_t *ring_word(uint8_t *ring, unsigned int off)
{
	return (volatile uint64_t *)(ring + off);
}

static inline struct stagevm_vcpu_counters *block_at(uint32_t vcpu)
{
	return (struct stagevm_vcpu_counters *)G.counters + vcpu;
}

/* ---- rings ---- */

/* Waits after finding `ring` full; false once the wait exceeded its bound. */
static int full_backoff(uint8_t *ring, uint64_t *since, unsigned int *spins)
{
	uint64_t now;
	unsigned int i;

	__atomic_fetch_add((uint64_t *)(ring + STAGEVM_RING_BACKOFFS_OFF), 1, __ATOMIC_RELAXED);
	T.st.full_waits++;
	if (*spins < 8) {
		for (i = 0; i < (64u << *spins); i++)
			__builtin_ia32_pause();
		(*spins)++;
	} else {
		struct timespec ts = { 0, 20000 };

		nanosleep(&ts, NULL);
	}
	now = now_ns();
	if (!*since)
		*since = now;
	return now - *since < LIBSTAGE_WAIT_NS;
}

/* The lock transport's per-ring lock (RingHeader.pad0[0]): 0 when taken,
 * -1 when it stayed busy for 64 tries.
 */
static int ring_trylock(uint8_t *ring)
{
	uint64_t *lock = (uint64_t *)(ring + STAGEVM_RING_LOCK_OFF);
	unsigned int i;

	for (i = 0; i < 64; i++) {
		uint64_t expected = 0;

		if (__atomic_compare_exchange_n(lock, &expected, 1, 0, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return 0;
		__builtin_ia32_pause();
	}
	return -1;
}

static void ring_unlock(uint8_t *ring)
{
	__atomic_store_n((uint64_t *)(ring + STAGEVM_RING_LOCK_OFF), 0, __ATOMIC_RELEASE);
}

/* Lock transport: 0 written, 1 full, -1 lock busy. */
static int lock_push(uint8_t *ring, uint64_t mask, uint64_t tsc, uint64_t stage_thread,
		     uint64_t seq_xor)
{
	uint64_t head, tail;
	volatile struct stagevm_stage_event *slot;

	if (ring_trylock(ring))
		return -1;
	head = *ring_word(ring, STAGEVM_RING_HEAD_OFF);
	tail = __atomic_load_n((uint64_t *)(ring + STAGEVM_RING_TAIL_OFF), __ATOMIC_ACQUIRE);
	if (head - tail > mask) {
		ring_unlock(ring);
		return 1;
	}
	slot = (volatile struct stagevm_stage_event *)(ring + sizeof(struct stagevm_ring_header) +
						       (head & mask) * sizeof(*slot));
	slot->seq = head ^ seq_xor;
	slot->tsc = tsc;
	slot->stage = (uint32_t)stage_thread;
	slot->thread = (uint32_t)(stage_thread >> 32);
	slot->reserved = 0;
	__atomic_store_n((uint64_t *)(ring + STAGEVM_RING_HEAD_OFF), head + 1, __ATOMIC_RELEASE);
	ring_unlock(ring);
	return 0;
}

/* Waits out a busy ring lock: yields, true while the wait stays under its
 * bound (a second).
 */
static int lock_backoff(struct stage_thread *t, uint64_t *since)
{
	uint64_t now = now_ns();

	t->st.lock_waits++;
	if (!*since)
		*since = now;
	if (now - *since >= LIBSTAGE_WAIT_NS)
		return 0;
	sched_yield();
	return 1;
}

static int migrate(struct stage_thread *t, uint64_t mask);

/*
 * Writes one event into the ring of the CPU the thread runs on and returns
 * that CPU (rings mode, and the test hook stage__write_raw). With a
 * non-zero `serve` mask the CPU must be in it: the thread is migrated first
 * if not, and since the critical section checks the CPU, the event lands
 * exactly in the ring of a serving vCPU.
 */
static int push(struct stage_thread *t, uint32_t stage, uint32_t thread, uint64_t seq_xor,
		uint64_t serve)
{
	uint64_t tsc = __builtin_ia32_rdtsc();
	uint64_t word = (uint64_t)stage | (uint64_t)thread << 32;
	uint64_t mask = G.l.ring_entries - 1, since = 0;
	unsigned int spins = 0, migrated = 0;

	for (;;) {
		int cpu = current_cpu(t), r;
		uint8_t *ring;

		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus) {
			t->st.dropped++;
			return -ERANGE;
		}
		if (serve && !(serve >> cpu & 1)) {
			/* At most one affinity change per event: after a failed
			 * one (counted), write where the thread is.
			 */
			if (!migrated++) {
				migrate(t, serve);
				continue;
			}
		}
		ring = ring_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			r = rseq_push(t->rs, (uint32_t)cpu, ring, mask, tsc, word, seq_xor);
			if (r < 0) {
				t->st.rseq_aborts++;
				continue;
			}
		} else {
			r = lock_push(ring, mask, tsc, word, seq_xor);
			if (r < 0) {
				if (!lock_backoff(t, &since)) {
					t->st.dropped++;
					return -EAGAIN;
				}
				continue;
			}
		}
		if (r > 0) {
			if (!full_backoff(ring, &since, &spins)) {
				t->st.dropped++;
				return -EAGAIN;
			}
			continue;
		}
		if (cpu != t->last_cpu && t->last_cpu >= 0)
			t->st.cpu_changes++;
		t->last_cpu = cpu;
		return cpu;
	}
}

/* ---- counters mode (ABI minor 2) ---- */

/* The state a transition into `code` enters: timed (since `tsc`) when the
 * countdown ran out or the vCPU goes idle, else untimed (transition()).
 */
static inline uint64_t entered_state(uint64_t countdown, uint32_t code, uint64_t tsc)
{
	if (countdown == 0 || code == STAGEVM_CODE_IDLE)
		return stagevm_state_word(tsc, code, 1);
	return stagevm_state_word(0, code, 0);
}

/* One committed state-word replacement: the state it replaced, the
 * countdown read with it and the TSC (read only when needed, else 0).
 */
struct committed {
	uint64_t old, countdown, tsc;
};

/* Lock transport: replaces vCPU `cpu`'s state word under ring `cpu`'s
 * lock. 0 done, -1 lock busy.
 */
static int lock_transition(uint32_t cpu, uint32_t code, struct committed *c)
{
	struct stagevm_vcpu_counters *b = block_at(cpu);
	uint8_t *ring = ring_at(cpu);

	if (ring_trylock(ring))
		return -1;
	c->old = __atomic_load_n(&b->state, __ATOMIC_RELAXED);
	c->countdown = __atomic_load_n(&b->countdown, __ATOMIC_RELAXED);
	c->tsc = stagevm_needs_tsc(c->old, c->countdown, code) ? __builtin_ia32_rdtsc() : 0;
	__atomic_store_n(&b->state, entered_state(c->countdown, code, c->tsc), __ATOMIC_RELAXED);
	ring_unlock(ring);
	return 0;
}

/*
 * The next stride of paced timed visits at a paced start at TSC `now` (as
 * Agent::pace): the transitions this vCPU makes in TIMED_INTERVAL_NS at
 * the rate since the previous paced start, in 1..TIMED_STRIDE_MAX, plus
 * 0-3 from the TSC's low bits so that a stride never locks onto a
 * workload's period. Kept in the block's guest-private agent words (last
 * start, stride); plain stores: racing threads only perturb the sampling.
 */
static uint64_t pace(struct stagevm_vcpu_counters *b, uint64_t now)
{
	uint64_t since = __atomic_load_n(&b->agent[0], __ATOMIC_RELAXED);
	uint64_t n = __atomic_load_n(&b->agent[1], __ATOMIC_RELAXED);
	uint64_t next = STAGEVM_TIMED_EVERY;

	if (since && n && now > since) {
		uint64_t per = (now - since) / n;

		next = G.pace_ticks / (per ? per : 1);
		if (next < 1)
			next = 1;
		if (next > STAGEVM_TIMED_STRIDE_MAX)
			next = STAGEVM_TIMED_STRIDE_MAX;
	}
	next += (now >> 6) & 3;
	if (next > STAGEVM_TIMED_STRIDE_MAX)
		next = STAGEVM_TIMED_STRIDE_MAX;
	__atomic_store_n(&b->agent[0], now, __ATOMIC_RELAXED);
	__atomic_store_n(&b->agent[1], next, __ATOMIC_RELAXED);
	return next;
}

/*
 * The trace event of a counted switch (StageMap.trace_every != 0), as
 * Agent::try_push: into the ring of the CPU the thread runs on if it has
 * room, else dropped and counted in the ring's trace_dropped. Never waits
 * for ring space (nor, with the lock transport, for a busy ring lock).
 */
static void trace_push(struct stage_thread *t, uint64_t tsc, uint32_t stage)
{
	uint64_t word = (uint64_t)stage | (uint64_t)t->tid << 32;
	uint64_t mask = G.l.ring_entries - 1;

	if (!tsc)
		tsc = __builtin_ia32_rdtsc();
	for (;;) {
		int cpu = current_cpu(t), r;
		uint8_t *ring;

		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus)
			return;
		ring = ring_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			r = rseq_push(t->rs, (uint32_t)cpu, ring, mask, tsc, word, 0);
			if (r < 0) {
				t->st.rseq_aborts++;
				continue;
			}
		} else {
			r = lock_push(ring, mask, tsc, word, 0);
		}
		if (r == 0) {
			t->st.trace_written++;
		} else {
			/* Full (or its lock busy): drop, counted where the host
			 * reads it.
			 */
			__atomic_fetch_add((uint64_t *)(ring + STAGEVM_RING_TRACE_DROPPED_OFF), 1,
					   __ATOMIC_RELAXED);
			t->st.trace_dropped++;
		}
		return;
	}
}

/*
 * Counters mode: the transition of the current CPU's counter block into
 * `code` (stage `stage`, or STAGEVM_STAGE_NONE), and returns that CPU. With
 * a non-zero `serve` mask the CPU must be in it, as for push(). Only the
 * state word is replaced in the critical section (rseq) or under the lock;
 * counts, cycles, timed visits and migrations are then added with atomic
 * adds on the same block, so they stay exact with any number of threads
 * per CPU. -ERANGE on a CPU without a block; -EAGAIN when the ring lock
 * stayed busy for a second (lock transport).
 */
static int count(struct stage_thread *t, uint32_t code, uint32_t stage, uint64_t serve)
{
	struct stagevm_vcpu_counters *b;
	struct committed c;
	uint64_t n, since = 0, every;
	unsigned int migrated = 0;
	int from = -1, moved = 0, cpu;

	for (;;) {
		cpu = current_cpu(t);
		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus) {
			t->st.dropped++;
			return -ERANGE;
		}
		if (serve && !(serve >> cpu & 1) && !migrated++) {
			/* At most one affinity change per switch, as push(). */
			from = cpu;
			moved = migrate(t, serve) == 0;
			continue;
		}
		b = block_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			int r;

			c.old = __atomic_load_n(&b->state, __ATOMIC_RELAXED);
			c.countdown = __atomic_load_n(&b->countdown, __ATOMIC_RELAXED);
			c.tsc = stagevm_needs_tsc(c.old, c.countdown, code) ? __builtin_ia32_rdtsc() : 0;
			r = rseq_cas(t->rs, (uint32_t)cpu, &b->state, c.old,
				     entered_state(c.countdown, code, c.tsc));
			if (r < 0)
				t->st.rseq_aborts++;
			else if (r > 0)
				t->st.state_retries++;
			if (r)
				continue;
		} else if (lock_transition((uint32_t)cpu, code, &c)) {
			if (!lock_backoff(t, &since)) {
				t->st.dropped++;
				return -EAGAIN;
			}
			continue;
		}
		break;
	}
	/* Committed: this transition replaced exactly state c.old. */
	n = __atomic_add_fetch(&b->counts[code], 1, __ATOMIC_RELAXED);
	if (stagevm_state_timed(c.old) && stagevm_state_code(c.old) < STAGEVM_NUM_CODES) {
		uint64_t end = c.tsc & ~STAGEVM_STATE_LOW_MASK, start = stagevm_state_since(c.old);
		uint32_t old = stagevm_state_code(c.old);

		__atomic_fetch_add(&b->cycles[old], end > start ? end - start : 0, __ATOMIC_RELAXED);
		__atomic_fetch_add(&b->timed[old], 1, __ATOMIC_RELAXED);
	}
	if (c.tsc)
		t->st.tsc_reads++;
	/* A migration, counted where the thread arrived (the block's CPU). */
	if (moved && cpu != from && stage < STAGEVM_MAX_STAGES) {
		__atomic_fetch_add(&b->migrations_in[stage], 1, __ATOMIC_RELAXED);
		t->st.migrations_in[stage]++;
		if (t->stage >= 0) {
			__atomic_fetch_add(&b->migrations_out[t->stage], 1, __ATOMIC_RELAXED);
			t->st.migrations_out[t->stage]++;
		}
	}
	/* Guest-private countdown (plain store; see the file comment). */
	if (c.countdown == 0) {
		every = G.timed_every ? G.timed_every : pace(b, c.tsc);
		__atomic_store_n(&b->countdown, every - 1, __ATOMIC_RELAXED);
	} else {
		__atomic_store_n(&b->countdown, c.countdown - 1, __ATOMIC_RELAXED);
	}
	if (cpu != t->last_cpu && t->last_cpu >= 0)
		t->st.cpu_changes++;
	t->last_cpu = cpu;
	every = __atomic_load_n(&map_at()->trace_every, __ATOMIC_RELAXED);
	if (__builtin_expect(every != 0, 0) && (every == 1 || n % every == 0))
		trace_push(t, c.tsc, stage);
	return cpu;
}

/* Returns 0 when the thread's affinity was changed, -1 when it failed. */
static int migrate(struct stage_thread *t, uint64_t mask)
{
	cpu_set_t set;
	uint32_t v;

	CPU_ZERO(&set);
	for (v = 0; v < G.l.num_vcpus; v++)
		if ((mask >> v & 1) && CPU_ISSET(v, &t->saved))
			CPU_SET(v, &set);
	/* The thread's own restriction excludes every serving CPU: obey the map. */
	if (!CPU_COUNT(&set))
		for (v = 0; v < G.l.num_vcpus; v++)
			if (mask >> v & 1)
				CPU_SET(v, &set);
	t->st.affinity_calls++;
	if (sched_setaffinity(0, sizeof(set), &set)) {
		t->st.affinity_failures++;
		return -1;
	}
	t->affinity_changed = 1;
	return 0;
}

/* ---- the API's hot path ---- */

int stage_enter(unsigned int id)
{
	struct stage_thread *t = &T;
	uint64_t mask;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	if (id >= G.l.num_stages)
		return -EINVAL;
	/* A program that never begins its requests: each starts at its first
	 * stage entry (on the CPU it runs on before any migration).
	 */
	if (!t->req_open)
		request_begin(t, 0);
	if (__atomic_load_n(&map_at()->epoch, __ATOMIC_ACQUIRE) != t->epoch)
		read_map(t);
	mask = t->masks[id];
	if (!mask)
		t->st.fallbacks++;
	if (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_COUNTERS)
		r = count(t, STAGEVM_CODE_FIRST_STAGE + id, id, mask);
	else
		r = push(t, id, t->tid, 0, mask);
	if (r < 0)
		return r;
	t->st.enters[id]++;
	t->stage = (int)id;
	return r;
}

int stage_exit(void)
{
	struct stage_thread *t = &T;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	if (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_COUNTERS)
		r = count(t, STAGEVM_CODE_NONE, STAGEVM_STAGE_NONE, 0);
	else
		r = push(t, STAGEVM_STAGE_NONE, t->tid, 0, 0);
	if (r < 0) {
		/* No completion counted: the request ends unrecorded. */
		t->req_open = 0;
		return r;
	}
	/* After the completion was counted on vCPU r (count() above). */
	if (t->req_open)
		request_end(t, r);
	t->st.exits++;
	t->stage = -1;
	return r;
}

int stage__write_raw(uint64_t seq_xor, uint32_t stage, uint32_t thread)
{
	int r;

	if (!T.attached) {
		r = stage_attach();
		if (r)
			return r;
	}
	return push(&T, stage, thread, seq_xor, 0);
}
