/* SPDX-License-Identifier: Apache-2.0 */
/*
 * staged: the staged C test program of the Linux test image
 * (images/linux/README.md). Linked with libstage, run by /init after
 * `insmod stagevm_agent.ko`.
 *
 *   staged THREADS ITERS WORK_US
 *
 * Registers three stages (parse, plan, execute) through /dev/stagevm, then
 * runs two phases of THREADS threads x ITERS requests; a request enters each
 * stage in turn and spins WORK_US microseconds of user-mode work in it.
 *   1. "static": the VM starts under --policy static;
 *   2. "off": after phase 1 the program prints "staged: waiting for policy
 *      off" and waits (up to 60 s) for a stage map in which every vCPU serves
 *      every stage: the test harness switches the policy through the VMM's
 *      API socket when it reads that line.
 * Each stage_enter's vCPU is checked against the stage map (re-read when the
 * epoch moved): a stage run on a vCPU the map did not give it is a violation.
 * libstage reports through the per-vCPU stage counters on a host of ABI
 * minor 2 ("mode counters" in the registered line), else through the rings.
 * Per phase it prints one "staged: phase ..." line with the counters' deltas;
 * at the end "staged: total ..." (per-stage enters, exits, drops), "staged:
 * vcpus ..." (switches and exits per vCPU) and "staged: migrations ..."
 * (counted per stage, counters mode), to be compared with the VMM's report,
 * and the costs measured in the guest: a getppid() round trip (a system
 * call: emulated guest kernel mode) and stage_enter() without migration
 * (user-mode stores only).
 *
 * Requests (ABI minor 4): under "static" each request begins at its first
 * stage_enter (libstage's implicit begin), under "off" at an explicit
 * stage_request_begin(); stage_exit ends it. libstage times one in N per
 * vCPU into the latency histograms the VMM reads ("staged: requests ..."
 * gives the requests begun and timed, to be compared with the report's
 * stage_channel.latency).
 *
 * Exit status: 0 when both phases ran with no violation and no drop, 1
 * otherwise, 2 when the channel could not be set up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "stage.h"

#define NSTAGES 3
#define MAX_THREADS 64
static const char *const names[NSTAGES] = { "parse", "plan", "execute" };

static unsigned int iters;
static uint64_t work_ns;
/* Begin each request with stage_request_begin() (phase "off") rather than
 * at its first stage_enter (phase "static").
 */
static int explicit_begin;

#define MAX_VCPUS 64

struct worker {
	pthread_t tid;
	uint64_t violations;
	uint64_t enter_errors;
	uint64_t switches[MAX_VCPUS]; /* enters and exits reported per vCPU */
	uint64_t exits[MAX_VCPUS];
};

/* Per vCPU, every switch and exit of the finished phases (and of the cost
 * loop), as reported by stage_enter/stage_exit's return value.
 */
static uint64_t switches_on[MAX_VCPUS], exits_on[MAX_VCPUS];

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void spin(uint64_t ns)
{
	uint64_t end = now_ns() + ns;

	while (now_ns() < end)
		;
}

/* True when `vcpu` serves `stage` in `map` (a map with no vCPU for the
 * stage lets it run anywhere, as libstage does).
 */
static int serves(const struct stage_map_view *map, unsigned int stage, int vcpu)
{
	uint64_t mask = map->vcpus[stage];

	return mask == 0 || (vcpu >= 0 && vcpu < 64 && (mask >> vcpu) & 1);
}

static void *run(void *arg)
{
	struct worker *w = arg;
	struct stage_map_view map;

	stage_map(&map);
	for (unsigned int i = 0; i < iters; i++) {
		if (explicit_begin && stage_request_begin() < 0)
			w->enter_errors++;
		for (unsigned int s = 0; s < NSTAGES; s++) {
			int vcpu = stage_enter(s);

			if (vcpu < 0) {
				w->enter_errors++;
				continue;
			}
			if (vcpu < MAX_VCPUS)
				w->switches[vcpu]++;
			if (!serves(&map, s, vcpu)) {
				stage_map(&map); /* the map may have moved */
				if (!serves(&map, s, vcpu))
					w->violations++;
			}
			spin(work_ns);
		}
		int vcpu = stage_exit();

		if (vcpu < 0) {
			w->enter_errors++;
		} else if (vcpu < MAX_VCPUS) {
			w->switches[vcpu]++;
			w->exits[vcpu]++;
		}
	}
	stage_detach();
	return NULL;
}

/* Runs one phase; prints its line; returns its violations + errors. */
static uint64_t phase(const char *name, unsigned int threads)
{
	struct worker w[MAX_THREADS] = { 0 };
	struct stage_stats before, after;
	struct stage_map_view map;
	uint64_t t0, bad = 0, errors = 0;

	stage_get_stats(&before);
	stage_map(&map);
	t0 = now_ns();
	for (unsigned int t = 0; t < threads; t++)
		if (pthread_create(&w[t].tid, NULL, run, &w[t]) != 0) {
			fprintf(stderr, "staged: pthread_create failed\n");
			exit(2);
		}
	for (unsigned int t = 0; t < threads; t++) {
		pthread_join(w[t].tid, NULL);
		bad += w[t].violations;
		errors += w[t].enter_errors;
		for (unsigned int v = 0; v < MAX_VCPUS; v++) {
			switches_on[v] += w[t].switches[v];
			exits_on[v] += w[t].exits[v];
		}
	}
	stage_get_stats(&after);
	printf("staged: phase %s: epoch %llu map", name, (unsigned long long)map.epoch);
	for (unsigned int s = 0; s < NSTAGES; s++)
		printf(" %s=%#llx", names[s], (unsigned long long)map.vcpus[s]);
	printf("; %.1f ms; enters", (double)(now_ns() - t0) / 1e6);
	for (unsigned int s = 0; s < NSTAGES; s++)
		printf(" %s=%llu", names[s],
		       (unsigned long long)(after.enters[s] - before.enters[s]));
	printf("; affinity_calls %llu cpu_changes %llu dropped %llu violations %llu errors %llu\n",
	       (unsigned long long)(after.affinity_calls - before.affinity_calls),
	       (unsigned long long)(after.cpu_changes - before.cpu_changes),
	       (unsigned long long)(after.dropped - before.dropped),
	       (unsigned long long)bad, (unsigned long long)errors);
	fflush(stdout);
	return bad + errors + (after.dropped - before.dropped);
}

/* Waits until every vCPU serves every stage (the policy is off). */
static int wait_for_off(unsigned int vcpus, unsigned int timeout_s)
{
	uint64_t all = vcpus >= 64 ? ~0ull : (1ull << vcpus) - 1;
	uint64_t end = now_ns() + (uint64_t)timeout_s * 1000000000ull;
	struct stage_map_view map;

	while (now_ns() < end) {
		int every = 1;

		stage_map(&map);
		for (unsigned int s = 0; s < NSTAGES; s++)
			every &= (map.vcpus[s] & all) == all;
		if (every)
			return 0;
		usleep(20000);
	}
	return -1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Median of `n` timed calls of getppid() (a real system call every time:
 * syscall(2), so no libc caching), in ns.
 */
static uint64_t syscall_ns(unsigned int n)
{
	uint64_t t[256];

	if (n > 256)
		n = 256;
	for (unsigned int i = 0; i < n; i++) {
		uint64_t a = now_ns();

		syscall(SYS_getppid);
		t[i] = now_ns() - a;
	}
	qsort(t, n, sizeof(t[0]), cmp_u64);
	return t[n / 2];
}

/* stage_enter() of a stage this vCPU serves (no migration), ns per call:
 * the median of 9 batches of `n` (fewer than a ring's entries, with a pause
 * between batches for the VMM to drain, should libstage report through the
 * rings: a full ring would make it wait; counters never wait).
 */
static double stage_enter_ns(unsigned int n)
{
	uint64_t t[9];
	int vcpu = stage_cpu(), exit_vcpu;
	struct stage_map_view map;
	unsigned int s = 0;

	if (n > 128)
		n = 128;
	stage_map(&map);
	while (s < NSTAGES && !serves(&map, s, vcpu))
		s++;
	if (s == NSTAGES)
		return -1;
	for (unsigned int b = 0; b < 9; b++) {
		int v[128];
		uint64_t a = now_ns();

		for (unsigned int i = 0; i < n; i++)
			v[i] = stage_enter(s);
		t[b] = now_ns() - a;
		/* Under "off" the kernel may move the thread between calls. */
		for (unsigned int i = 0; i < n; i++)
			if (v[i] >= 0 && v[i] < MAX_VCPUS)
				switches_on[v[i]]++;
		usleep(50000);
	}
	exit_vcpu = stage_exit();
	if (exit_vcpu >= 0 && exit_vcpu < MAX_VCPUS) {
		switches_on[exit_vcpu]++;
		exits_on[exit_vcpu]++;
	}
	qsort(t, 9, sizeof(t[0]), cmp_u64);
	return (double)t[4] / n;
}

int main(int argc, char **argv)
{
	unsigned int threads, vcpus;
	struct stage_stats total;
	struct stage_map_view map;
	uint64_t bad = 0;
	int err;

	if (argc != 4) {
		fprintf(stderr, "usage: staged THREADS ITERS WORK_US\n");
		return 2;
	}
	threads = (unsigned int)strtoul(argv[1], NULL, 0);
	iters = (unsigned int)strtoul(argv[2], NULL, 0);
	work_ns = strtoull(argv[3], NULL, 0) * 1000ull;
	if (threads == 0 || threads > MAX_THREADS) {
		fprintf(stderr, "staged: THREADS = %u is not in 1-%d\n", threads, MAX_THREADS);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	err = stage_init();
	if (err < 0) {
		fprintf(stderr, "staged: stage_init: %s\n", strerror(-err));
		return 2;
	}
	for (unsigned int s = 0; s < NSTAGES; s++)
		stage_name(s, names[s]);
	err = stage_register();
	if (err < 0) {
		fprintf(stderr, "staged: stage_register: %s\n", strerror(-err));
		return 2;
	}
	stage_map(&map);
	vcpus = map.num_vcpus;
	printf("staged: registered %d stages on %u vCPUs (stage map epoch %llu, host ABI minor "
	       "%llu, trace %llu), mode %s\n",
	       NSTAGES, vcpus, (unsigned long long)map.epoch, (unsigned long long)map.minor,
	       (unsigned long long)map.trace_every, stage_mode());

	bad += phase("static", threads);
	printf("staged: waiting for policy off\n");
	if (wait_for_off(vcpus, 60) != 0) {
		printf("staged: the stage map did not become 'off' in 60 s\n");
		return 1;
	}
	explicit_begin = 1;
	bad += phase("off", threads);

	printf("staged: getppid round trip %.1f us (median of 64)\n", (double)syscall_ns(64) / 1e3);
	printf("staged: stage_enter without migration %.1f ns (median of 9 x 128)\n",
	       stage_enter_ns(128));
	/* No wait needed before rmmod: the VMM keeps the counters as UNREGISTER
	 * leaves them and reads them once more (guest-agent/linux/README.md,
	 * "The host's view").
	 */
	stage_get_stats(&total);
	printf("staged: total enters");
	for (unsigned int s = 0; s < NSTAGES; s++)
		printf(" %s=%llu", names[s], (unsigned long long)total.enters[s]);
	printf(" exits=%llu dropped=%llu\n", (unsigned long long)total.exits,
	       (unsigned long long)total.dropped);
	printf("staged: vcpus");
	for (unsigned int v = 0; v < vcpus && v < MAX_VCPUS; v++)
		printf(" %u:switches=%llu,exits=%llu", v, (unsigned long long)switches_on[v],
		       (unsigned long long)exits_on[v]);
	printf("\n");
	printf("staged: migrations in");
	for (unsigned int s = 0; s < NSTAGES; s++)
		printf(" %s=%llu", names[s], (unsigned long long)total.migrations_in[s]);
	printf(" out");
	for (unsigned int s = 0; s < NSTAGES; s++)
		printf(" %s=%llu", names[s], (unsigned long long)total.migrations_out[s]);
	printf("; mode %s, tsc reads %llu, state retries %llu, rseq aborts %llu\n", stage_mode(),
	       (unsigned long long)total.tsc_reads, (unsigned long long)total.state_retries,
	       (unsigned long long)total.rseq_aborts);
	printf("staged: requests begun %llu timed %llu (latency %s)\n",
	       (unsigned long long)total.requests, (unsigned long long)total.requests_timed,
	       total.latency ? "on" : "off");
	stage_shutdown();
	return bad ? 1 : 0;
}
