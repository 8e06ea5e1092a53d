/* A small multi-threaded "server" for the preload library's tests: each
 * worker thread serves requests through three stages (parse -> plan ->
 * exec), each a function the stage map names, after waiting for its
 * "client" in req_wait (the request marker). Built by the tests with cc.
 *
 * usage: stage_server THREADS REQUESTS WORK [options]
 *   --mutex       hold one global mutex from parse to exec (across a stage point)
 *   --sleep-ms N  thread 0 sleeps N ms inside plan on its first request
 *   --idle-us N   each request first waits N us for its client (in req_wait)
 * Prints "thread ID FINISH_MS MAX_REQUEST_US" per thread, then
 * "done THREADS REQUESTS CHECKSUM MAX_REQUEST_US ELAPSED_MS", and exits 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int nthreads, nrequests, work, use_mutex, sleep_ms, idle_us;
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;
static uint64_t checksum[1024];
static uint64_t max_req_ns[1024];
static uint64_t finish_ns[1024];
static uint64_t start_ns;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static __attribute__((noinline)) uint64_t spin(uint64_t x, int n)
{
	for (int i = 0; i < n; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x;
}

__attribute__((noinline)) void req_wait(int id)
{
	if (idle_us)
		usleep((useconds_t)idle_us);
	__asm__ volatile("" ::"r"(id));
}

__attribute__((noinline)) uint64_t stage_parse(int id, uint64_t x)
{
	if (use_mutex)
		pthread_mutex_lock(&big);
	return spin(x + (uint64_t)id, work);
}

__attribute__((noinline)) uint64_t stage_plan(int id, int r, uint64_t x)
{
	if (sleep_ms && id == 0 && r == 0)
		usleep((useconds_t)sleep_ms * 1000);
	return spin(x ^ 0x9e3779b97f4a7c15ull, work);
}

__attribute__((noinline)) uint64_t stage_exec(int id, uint64_t x)
{
	uint64_t y = spin(x, work);
	if (use_mutex)
		pthread_mutex_unlock(&big);
	return y + (uint64_t)id;
}

/* Unpatchable on purpose: its loop branches back into its first 5 bytes. */
__asm__(".text\n.globl tight_loop\n.type tight_loop,@function\ntight_loop:\n"
	"  nop\n1:\n  dec %edi\n  jnz 1b\n  mov %edi, %eax\n  ret\n"
	".size tight_loop, .-tight_loop\n");
int tight_loop(int n);

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	uint64_t x = (uint64_t)id;
	for (int r = 0; r < nrequests; r++) {
		req_wait(id);
		uint64_t t0 = now_ns();
		x = stage_parse(id, x);
		x = stage_plan(id, r, x);
		x = stage_exec(id, x);
		x += (uint64_t)tight_loop(3);
		uint64_t d = now_ns() - t0;
		if (d > max_req_ns[id])
			max_req_ns[id] = d;
	}
	checksum[id] = x;
	finish_ns[id] = now_ns() - start_ns;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s THREADS REQUESTS WORK [--mutex] [--sleep-ms N] [--idle-us N]\n", argv[0]);
		return 2;
	}
	nthreads = atoi(argv[1]);
	nrequests = atoi(argv[2]);
	work = atoi(argv[3]);
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--mutex"))
			use_mutex = 1;
		else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc)
			sleep_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--idle-us") && i + 1 < argc)
			idle_us = atoi(argv[++i]);
		else {
			fprintf(stderr, "stage_server: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 1024) {
		fprintf(stderr, "stage_server: THREADS %d not in 1..1024\n", nthreads);
		return 2;
	}
	pthread_t th[1024];
	uint64_t t0 = now_ns();
	start_ns = t0;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
	uint64_t sum = 0, maxd = 0;
	for (int i = 0; i < nthreads; i++) {
		pthread_join(th[i], NULL);
		sum ^= checksum[i];
		if (max_req_ns[i] > maxd)
			maxd = max_req_ns[i];
	}
	for (int i = 0; i < nthreads; i++)
		printf("thread %d %llu %llu\n", i, (unsigned long long)(finish_ns[i] / 1000000),
		       (unsigned long long)(max_req_ns[i] / 1000));
	printf("done %d %d %llu %llu %llu\n", nthreads, nrequests, (unsigned long long)sum,
	       (unsigned long long)(maxd / 1000), (unsigned long long)((now_ns() - t0) / 1000000));
	return 0;
}
