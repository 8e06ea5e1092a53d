/* SPDX-License-Identifier: Apache-2.0 */
/* Mechanism costs for bench_native_server.py, timed natively.
 *
 *   point_bench calls ITER            one thread calls probe_a, probe_b ITER
 *                                      times each, alternately; prints
 *                                      "ns_per_call X" (the two calls are
 *                                      two stage switches under a map that
 *                                      puts them in two stages)
 *   point_bench threads ITER THREADS   THREADS threads each do the same;
 *                                      prints "elapsed_ns X"
 *   point_bench futex ITER             two threads hand a futex back and
 *                                      forth ITER times each; prints
 *                                      "ns_per_handoff X" (the floor of a
 *                                      futex handoff, no gate)
 *
 * probe_a/probe_b start with a RIP-relative store, so a detour must
 * relocate their first instruction.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

volatile int sink_a, sink_b;

__attribute__((noinline)) int probe_a(int x)
{
	sink_a = x;
	return x + 1;
}

__attribute__((noinline)) int probe_b(int x)
{
	sink_b = x;
	return x + 2;
}

static long iters;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *loop(void *arg)
{
	int x = (int)(intptr_t)arg;

	for (long i = 0; i < iters; i++)
		x = probe_b(probe_a(x));
	return (void *)(intptr_t)x;
}

static _Atomic int turn;

static void *pingpong(void *arg)
{
	int me = (int)(intptr_t)arg;

	for (long i = 0; i < iters; i++) {
		while (atomic_load(&turn) != me)
			syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, 1 - me, NULL);
		atomic_store(&turn, 1 - me);
		syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s calls|threads|futex ITER [THREADS]\n", argv[0]);
		return 2;
	}
	iters = atol(argv[2]);
	uint64_t t0 = now_ns();

	if (!strcmp(argv[1], "calls")) {
		loop(NULL);
		printf("ns_per_call %.3f\n", (double)(now_ns() - t0) / (2.0 * (double)iters));
	} else if (!strcmp(argv[1], "threads") && argc > 3) {
		int n = atoi(argv[3]);
		pthread_t th[256];

		if (n < 1 || n > 256)
			return 2;
		for (int i = 0; i < n; i++)
			pthread_create(&th[i], NULL, loop, (void *)(intptr_t)i);
		for (int i = 0; i < n; i++)
			pthread_join(th[i], NULL);
		printf("elapsed_ns %llu\n", (unsigned long long)(now_ns() - t0));
	} else if (!strcmp(argv[1], "futex")) {
		pthread_t t;

		pthread_create(&t, NULL, pingpong, (void *)1);
		pingpong((void *)0);
		pthread_join(t, NULL);
		printf("ns_per_handoff %.1f\n", (double)(now_ns() - t0) / (2.0 * (double)iters));
	} else {
		fprintf(stderr, "point_bench: unknown mode %s\n", argv[1]);
		return 2;
	}
	return 0;
}
