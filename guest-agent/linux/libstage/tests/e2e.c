/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The C side of the host-side end-to-end test (tests/libstage.rs): threads
 * using libstage on a memfd-backed area ($STAGEVM_FD) that the VMM's real
 * StageDevice registers, reads (counters) and drains (rings, trace). The
 * Rust test drives it over stdin/stdout, one line at a time.
 *
 *   e2e layout VCPUS STAGES ENTRIES
 *       prints the C layout helpers' offsets, rings only and with counters
 *       (checked against Rust's Layout)
 *   e2e run THREADS ITERS WORK_NS PHASES CORRUPT
 *       "ready" -> waits "go"; prints the map (and the mode libstage chose
 *       from it); per phase, THREADS threads run ITERS requests (enter 0,
 *       work, enter 1, work, exit), then "phase P done" -> waits "go"; then
 *       CORRUPT bad-seq and CORRUPT bad-stage ring entries plus CORRUPT
 *       valid enters; prints the counts ("count ...") and "end" -> waits
 *       "exit".
 *   e2e bench BATCHES
 *       "ready" -> "go": stage_enter / stage_exit cost without migration vs
 *       an empty loop; "migrate ready" -> "go": stage_enter with migration.
 *   e2e latency NS...
 *       lays the area out (fd mode, nothing registered by a host) and
 *       records each NS on vCPU 0 through stage__test_record_latency;
 *       prints the buckets it returned ("buckets ...") and "end"
 *   e2e requests THREADS ITERS WORK_NS AGE_US
 *       "ready" -> waits "go"; prints the map; THREADS threads run ITERS
 *       requests each (enter 0, work, enter 1, work, exit), begun in turn
 *       by the first stage_enter, by stage_request_begin() and by
 *       stage_request_begin_at(a TSC AGE_US before now); prints "requests
 *       ...", the exits per vCPU and the stats, "end" -> waits "exit".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "stage.h"
#include "stagevm_layout.h"

#define MAX_THREADS 64
#define NSTAGES 2

static void die(const char *what, int err)
{
	fprintf(stderr, "e2e: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(2);
}

static void expect_line(const char *want)
{
	char line[128];

	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "e2e: stdin closed while waiting for '%s'\n", want);
		exit(2);
	}
	line[strcspn(line, "\n")] = 0;
	if (strcmp(line, want)) {
		fprintf(stderr, "e2e: expected '%s', got '%s'\n", want, line);
		exit(2);
	}
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void spin_ns(uint64_t ns)
{
	uint64_t end;

	if (!ns)
		return;
	end = now_ns() + ns;
	while (now_ns() < end)
		;
}

static void setup(void)
{
	int r = stage_init();

	if (r)
		die("stage_init", r);
	r = stage_name(0, "parse");
	if (!r)
		r = stage_name(1, "execute");
	if (r)
		die("stage_name", r);
	r = stage_register();
	if (r)
		die("stage_register", r);
	r = stage_attach();
	if (r)
		die("stage_attach", r);
}

/* ---- run ---- */

struct worker {
	pthread_t th;
	int index;
	uint64_t enters[NSTAGES];
	uint64_t exits;
	uint64_t errors;
	uint64_t violations;      /* event written on a vCPU not serving the stage */
	uint64_t on_vcpu[NSTAGES][64]; /* enter events per stage and vCPU */
	uint64_t exits_on[64];         /* exit events per vCPU */
};

static struct {
	int threads, phases;
	long iters;
	uint64_t work_ns;
	pthread_barrier_t start, end;
	struct worker w[MAX_THREADS];
	int tids[MAX_THREADS];
} R;

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	int p;
	long i;

	R.tids[w->index] = (int)syscall(SYS_gettid);
	for (p = 0; p < R.phases; p++) {
		pthread_barrier_wait(&R.start);
		for (i = 0; i < R.iters; i++) {
			int s;

			for (s = 0; s < NSTAGES; s++) {
				struct stage_map_view map;
				int v = stage_enter((unsigned int)s);

				if (v < 0) {
					w->errors++;
					continue;
				}
				w->enters[s]++;
				w->on_vcpu[s][v]++;
				/* The map cannot change within phases 0 and 1 (the
				 * host flips it between them), so this is exact.
				 */
				if (p < 2 && stage_map(&map) == 0 && !(map.vcpus[s] >> v & 1))
					w->violations++;
				spin_ns(R.work_ns);
			}
			s = stage_exit();
			if (s < 0) {
				w->errors++;
			} else {
				w->exits++;
				w->exits_on[s]++;
			}
		}
		pthread_barrier_wait(&R.end);
	}
	/* Stay (with the affinity of the last stage) until the host has looked
	 * at /proc: thread exit detaches, which restores the affinity.
	 */
	pthread_barrier_wait(&R.start);
	return NULL;
}

static void print_map(void)
{
	struct stage_map_view map;

	if (stage_map(&map) == 0)
		say("map epoch %llu stage0 %#llx stage1 %#llx minor %llu trace %llu mode %s",
		    (unsigned long long)map.epoch, (unsigned long long)map.vcpus[0],
		    (unsigned long long)map.vcpus[1], (unsigned long long)map.minor,
		    (unsigned long long)map.trace_every, stage_mode());
}

static int run(int argc, char **argv)
{
	uint64_t enters[NSTAGES] = { 0 }, exits = 0, errors = 0, violations = 0;
	uint64_t on_vcpu[NSTAGES][64] = { { 0 } }, exits_on[64] = { 0 };
	struct stage_map_view map;
	struct stage_stats st;
	long corrupt, k;
	int t, p, s, v;
	char line[2048];
	size_t n;

	if (argc < 7)
		return 2;
	R.threads = atoi(argv[2]);
	R.iters = atol(argv[3]);
	R.work_ns = strtoull(argv[4], NULL, 0);
	R.phases = atoi(argv[5]);
	corrupt = atol(argv[6]);
	if (R.threads < 1 || R.threads > MAX_THREADS)
		return 2;
	setup();
	say("ready transport %s", stage_transport());
	expect_line("go");
	print_map();
	pthread_barrier_init(&R.start, NULL, (unsigned int)R.threads + 1);
	pthread_barrier_init(&R.end, NULL, (unsigned int)R.threads + 1);
	for (t = 0; t < R.threads; t++) {
		R.w[t].index = t;
		if (pthread_create(&R.w[t].th, NULL, worker_main, &R.w[t]))
			die("pthread_create", errno);
	}
	for (p = 0; p < R.phases; p++) {
		pthread_barrier_wait(&R.start);
		pthread_barrier_wait(&R.end);
		n = (size_t)snprintf(line, sizeof(line), "phase %d done tids", p);
		for (t = 0; t < R.threads && n < sizeof(line) - 12; t++)
			n += (size_t)snprintf(line + n, sizeof(line) - n, " %d", R.tids[t]);
		say("%s", line);
		expect_line("go");
		print_map();
	}
	pthread_barrier_wait(&R.start);
	for (t = 0; t < R.threads; t++) {
		pthread_join(R.w[t].th, NULL);
		for (s = 0; s < NSTAGES; s++) {
			enters[s] += R.w[t].enters[s];
			for (v = 0; v < 64; v++)
				on_vcpu[s][v] += R.w[t].on_vcpu[s][v];
		}
		for (v = 0; v < 64; v++)
			exits_on[v] += R.w[t].exits_on[v];
		exits += R.w[t].exits;
		errors += R.w[t].errors;
		violations += R.w[t].violations;
	}
	/* Corrupt entries on purpose, then valid ones after them. */
	for (k = 0; k < corrupt; k++) {
		if (stage__write_raw(0xdead0000ull, 0, 7) < 0 ||
		    stage__write_raw(0, 99, 7) < 0)
			errors++;
	}
	for (k = 0; k < corrupt; k++) {
		v = stage_enter(0);
		if (v < 0) {
			errors++;
			continue;
		}
		enters[0]++;
		on_vcpu[0][v]++;
	}
	stage_get_stats(&st);
	say("count enter0 %llu enter1 %llu exits %llu errors %llu violations %llu",
	    (unsigned long long)enters[0], (unsigned long long)enters[1],
	    (unsigned long long)exits, (unsigned long long)errors,
	    (unsigned long long)violations);
	say("corrupt bad_seq %ld bad_stage %ld", corrupt, corrupt);
	if (stage_map(&map))
		die("stage_map", -ENODEV);
	for (s = 0; s <= NSTAGES; s++) {
		if (s < NSTAGES)
			n = (size_t)snprintf(line, sizeof(line), "vcpus stage%d", s);
		else
			n = (size_t)snprintf(line, sizeof(line), "vcpus exits");
		for (v = 0; v < (int)map.num_vcpus && n < sizeof(line) - 24; v++)
			n += (size_t)snprintf(line + n, sizeof(line) - n, " %llu",
					      (unsigned long long)(s < NSTAGES ? on_vcpu[s][v] : exits_on[v]));
		say("%s", line);
	}
	say("stats enters %llu %llu exits %llu affinity_calls %llu affinity_failures %llu "
	    "cpu_changes %llu fallbacks %llu full_waits %llu dropped %llu rseq_aborts %llu "
	    "lock_waits %llu map_reads %llu threads %llu counters %llu state_retries %llu "
	    "tsc_reads %llu migrations_in %llu %llu migrations_out %llu %llu trace_written %llu "
	    "trace_dropped %llu",
	    (unsigned long long)st.enters[0], (unsigned long long)st.enters[1],
	    (unsigned long long)st.exits, (unsigned long long)st.affinity_calls,
	    (unsigned long long)st.affinity_failures, (unsigned long long)st.cpu_changes,
	    (unsigned long long)st.fallbacks, (unsigned long long)st.full_waits,
	    (unsigned long long)st.dropped, (unsigned long long)st.rseq_aborts,
	    (unsigned long long)st.lock_waits, (unsigned long long)st.map_reads,
	    (unsigned long long)st.threads, (unsigned long long)st.counters,
	    (unsigned long long)st.state_retries, (unsigned long long)st.tsc_reads,
	    (unsigned long long)st.migrations_in[0], (unsigned long long)st.migrations_in[1],
	    (unsigned long long)st.migrations_out[0], (unsigned long long)st.migrations_out[1],
	    (unsigned long long)st.trace_written, (unsigned long long)st.trace_dropped);
	say("end");
	expect_line("exit");
	stage_shutdown();
	return 0;
}

/* ---- bench ---- */

static __attribute__((noinline)) int empty(unsigned int id)
{
	__asm__ volatile("" : : "r"(id) : "memory");
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void wait_drained(void)
{
	unsigned int v;
	int busy = 1;

	while (busy) {
		busy = 0;
		for (v = 0; v < 64; v++) {
			int64_t p = stage__ring_pending(v);

			if (p < 0)
				break;
			if (p > 0)
				busy = 1;
		}
		if (busy)
			usleep(50);
	}
}

/* Median over batches of the per-call time of `what` (0 empty, 1 enter, 2 exit). */
static double batch_median(int what, int batches, long per_batch)
{
	uint64_t *ns = calloc((size_t)batches, sizeof(uint64_t));
	double out;
	int b;
	long i;

	for (b = 0; b < batches; b++) {
		uint64_t t0;

		wait_drained();
		t0 = now_ns();
		for (i = 0; i < per_batch; i++) {
			if (what == 0)
				empty(0);
			else if (what == 1)
				stage_enter(0);
			else
				stage_exit();
		}
		ns[b] = now_ns() - t0;
	}
	qsort(ns, (size_t)batches, sizeof(uint64_t), cmp_u64);
	out = (double)ns[batches / 2] / (double)per_batch;
	free(ns);
	return out;
}

static int bench(int argc, char **argv)
{
	int batches = argc > 2 ? atoi(argv[2]) : 200;
	struct stage_stats st;
	const struct stagevm_area_header *h;
	double e, en, ex, mig;
	uint64_t t0;
	long per_batch;
	int i, n = 200;

	setup();
	h = stage__area(NULL);
	/* Half a ring per batch: the host drains between batches, so no
	 * batch waits for ring space.
	 */
	per_batch = (long)h->ring_entries / 2;
	say("ready transport %s", stage_transport());
	expect_line("go");
	stage_enter(0); /* the first enter migrates if needed */
	e = batch_median(0, batches, per_batch);
	en = batch_median(1, batches, per_batch);
	ex = batch_median(2, batches, per_batch);
	say("migrate ready");
	expect_line("go");
	wait_drained();
	stage_enter(0);
	t0 = now_ns();
	for (i = 0; i < n; i++) {
		stage_enter(1);
		stage_enter(0);
	}
	mig = (double)(now_ns() - t0) / (2.0 * n);
	stage_get_stats(&st);
	say("bench empty_ns %.2f enter_ns %.2f exit_ns %.2f migrate_ns %.0f batch %ld "
	    "affinity_calls %llu full_waits %llu rseq_aborts %llu counters %llu tsc_reads %llu "
	    "enters0 %llu enters1 %llu exits %llu",
	    e, en, ex, mig, per_batch, (unsigned long long)st.affinity_calls,
	    (unsigned long long)st.full_waits, (unsigned long long)st.rseq_aborts,
	    (unsigned long long)st.counters, (unsigned long long)st.tsc_reads,
	    (unsigned long long)st.enters[0], (unsigned long long)st.enters[1],
	    (unsigned long long)st.exits);
	say("end");
	expect_line("exit");
	return 0;
}

/* ---- latency, requests (ABI minor 4) ---- */

static int latency(int argc, char **argv)
{
	char line[8192];
	size_t n;
	int i, b;

	setup();
	n = (size_t)snprintf(line, sizeof(line), "buckets");
	for (i = 2; i < argc; i++) {
		b = stage__test_record_latency(0, strtoull(argv[i], NULL, 0));
		if (b < 0)
			die("stage__test_record_latency", b);
		if (n < sizeof(line) - 8)
			n += (size_t)snprintf(line + n, sizeof(line) - n, " %d", b);
	}
	say("%s", line);
	say("end");
	return 0;
}

static struct {
	long iters;
	uint64_t work_ns, age_ticks;
	uint64_t requests[MAX_THREADS], aged[MAX_THREADS], timed_begins[MAX_THREADS];
	uint64_t errors[MAX_THREADS];
	uint64_t exits_on[MAX_THREADS][64];
} Q;

static void *request_worker(void *arg)
{
	long t = (long)arg, i;

	for (i = 0; i < Q.iters; i++) {
		int v, r = 0;

		/* Request i begins at its first stage_enter, at
		 * stage_request_begin() or AGE_US before now.
		 */
		if (i % 3 == 1)
			r = stage_request_begin();
		else if (i % 3 == 2)
			r = stage_request_begin_at(__builtin_ia32_rdtsc() - Q.age_ticks);
		if (r < 0) {
			Q.errors[t]++;
			continue;
		}
		Q.timed_begins[t] += r == 1;
		Q.aged[t] += i % 3 == 2;
		if (stage_enter(0) < 0) {
			Q.errors[t]++;
			continue;
		}
		spin_ns(Q.work_ns);
		if (stage_enter(1) < 0) {
			Q.errors[t]++;
			continue;
		}
		spin_ns(Q.work_ns);
		v = stage_exit();
		if (v < 0 || v >= 64) {
			Q.errors[t]++;
			continue;
		}
		Q.requests[t]++;
		Q.exits_on[t][v]++;
	}
	return NULL;
}

static int requests(int argc, char **argv)
{
	uint64_t total = 0, aged = 0, timed = 0, errors = 0, exits_on[64] = { 0 };
	const struct stagevm_area_header *h;
	pthread_t th[MAX_THREADS];
	struct stage_map_view map;
	struct stage_stats st;
	char line[2048];
	long t, threads;
	size_t n;
	int v;

	if (argc < 6)
		return 2;
	threads = atol(argv[2]);
	Q.iters = atol(argv[3]);
	Q.work_ns = strtoull(argv[4], NULL, 0);
	if (threads < 1 || threads > MAX_THREADS)
		return 2;
	setup();
	say("ready transport %s", stage_transport());
	expect_line("go");
	print_map();
	/* The host wrote the TSC rate at REGISTER. */
	h = stage__area(NULL);
	Q.age_ticks = h->tsc_khz * strtoull(argv[5], NULL, 0) / 1000u;
	for (t = 0; t < threads; t++)
		if (pthread_create(&th[t], NULL, request_worker, (void *)t))
			die("pthread_create", errno);
	for (t = 0; t < threads; t++) {
		pthread_join(th[t], NULL);
		total += Q.requests[t];
		aged += Q.aged[t];
		timed += Q.timed_begins[t];
		errors += Q.errors[t];
		for (v = 0; v < 64; v++)
			exits_on[v] += Q.exits_on[t][v];
	}
	stage_get_stats(&st);
	say("requests total %llu aged %llu timed_begins %llu errors %llu work_ns %llu",
	    (unsigned long long)total, (unsigned long long)aged, (unsigned long long)timed,
	    (unsigned long long)errors, (unsigned long long)Q.work_ns);
	if (stage_map(&map))
		die("stage_map", -ENODEV);
	n = (size_t)snprintf(line, sizeof(line), "vcpus exits");
	for (v = 0; v < (int)map.num_vcpus && n < sizeof(line) - 24; v++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, " %llu",
				      (unsigned long long)exits_on[v]);
	say("%s", line);
	say("stats counters %llu latency %llu requests %llu requests_timed %llu exits %llu "
	    "enters %llu %llu dropped %llu",
	    (unsigned long long)st.counters, (unsigned long long)st.latency,
	    (unsigned long long)st.requests, (unsigned long long)st.requests_timed,
	    (unsigned long long)st.exits, (unsigned long long)st.enters[0],
	    (unsigned long long)st.enters[1], (unsigned long long)st.dropped);
	say("end");
	expect_line("exit");
	stage_shutdown();
	return 0;
}

/* ---- layout ---- */

static int layout(int argc, char **argv)
{
	struct stagevm_layout l;
	uint32_t v;

	if (argc < 5 || stagevm_layout_init(&l, (uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]),
					    (uint32_t)atoi(argv[4]))) {
		say("invalid");
		return 0;
	}
	say("ring_bytes %llu", (unsigned long long)stagevm_ring_bytes(&l));
	say("used_bytes %llu", (unsigned long long)stagevm_used_bytes(&l));
	say("area_size %llu", (unsigned long long)stagevm_area_size(&l));
	for (v = 0; v <= l.num_vcpus; v++)
		say("ring_offset %u %llu", v, (unsigned long long)stagevm_ring_offset(&l, v));
	for (v = 0; v < l.num_vcpus; v++) {
		say("vcpu_state_offset %u %llu", v, (unsigned long long)stagevm_vcpu_state_offset(v));
		say("slot_offset %u 0 %llu", v, (unsigned long long)stagevm_slot_offset(&l, v, 0));
		say("slot_offset %u %u %llu", v, l.ring_entries + 3,
		    (unsigned long long)stagevm_slot_offset(&l, v, l.ring_entries + 3));
	}
	/* The same layout with counters (minor 2). */
	stagevm_layout_with_counters(&l);
	say("counters used_bytes %llu", (unsigned long long)stagevm_used_bytes(&l));
	say("counters area_size %llu", (unsigned long long)stagevm_area_size(&l));
	for (v = 0; v <= l.num_vcpus; v++)
		say("counters_offset %u %llu", v, (unsigned long long)stagevm_counters_offset(&l, v));
	/* And with the latency blocks after the counters (minor 4). */
	stagevm_layout_with_latency(&l);
	say("latency used_bytes %llu", (unsigned long long)stagevm_used_bytes(&l));
	say("latency area_size %llu", (unsigned long long)stagevm_area_size(&l));
	for (v = 0; v <= l.num_vcpus; v++)
		say("latency_offset %u %llu", v, (unsigned long long)stagevm_latency_offset(&l, v));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "run"))
		return run(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "bench"))
		return bench(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "layout"))
		return layout(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "latency"))
		return latency(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "requests"))
		return requests(argc, argv);
	fprintf(stderr, "usage: e2e run|bench|layout|latency|requests ...\n");
	return 2;
}
