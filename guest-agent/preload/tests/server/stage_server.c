/* SPDX-License-Identifier: Apache-2.0 */
/* A small multi-threaded "server" for the preload library's tests: each
 * worker thread serves requests through three stages (parse -> plan ->
 * exec), each a function the stage map names, after waiting for its
 * "client" in req_wait (the request marker). Built by the tests with cc.
 *
 * usage: stage_server THREADS REQUESTS WORK [options]
 *   --mutex       hold one global mutex from parse to exec (across a stage point)
 *   --sleep-ms N  thread 0 sleeps N ms inside plan on its first request
 *                 (the other threads start their requests once it sleeps)
 *   --idle-us N   each request first waits N us for its client (in req_wait)
 *   --start-delay-ms N  main waits N ms before starting the workers (a test
 *                 host registers the stage channel's area meanwhile)
 *   --check-regs  each worker first calls reg_probe (a stage point) from
 *                 assembly that keeps values in call-clobbered registers
 *                 (as GCC's interprocedural register allocation may) and
 *                 calls it with the stack misaligned; exits 3 when a
 *                 register changed
 * Prints "thread ID FINISH_MS MAX_REQUEST_US" per thread, then
 * "done THREADS REQUESTS CHECKSUM MAX_REQUEST_US ELAPSED_MS", and exits 0.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int nthreads, nrequests, work, use_mutex, sleep_ms, idle_us, check_regs, start_delay_ms;
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

/* Set by thread 0 as it starts its sleep (--sleep-ms): the others start
 * their requests only then, so they meet the sleeper at the gate however
 * late the machine's load starts thread 0.
 */
static int sleeper_in;

__attribute__((noinline)) uint64_t stage_plan(int id, int r, uint64_t x)
{
	if (sleep_ms && id == 0 && r == 0) {
		__atomic_store_n(&sleeper_in, 1, __ATOMIC_RELEASE);
		usleep((useconds_t)sleep_ms * 1000);
	}
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

/* A stage point that is fine to patch: 6 bytes (mov, add, ret). */
__asm__(".text\n.globl reg_probe\n.type reg_probe,@function\nreg_probe:\n"
	"  mov %edi, %eax\n  add $1, %eax\n  ret\n.size reg_probe, .-reg_probe\n");

/* Calls reg_probe with values in rcx, rdx, rsi, r8-r11, xmm8, xmm15 and
 * (with AVX) the upper half of ymm9, and with rsp misaligned by 8; returns
 * 1 when all of them survived.
 */
__asm__(".text\n.globl regs_survive\n.type regs_survive,@function\nregs_survive:\n"
	"  push %rbx\n"
	"  mov %edi, %ebx\n"
	"  mov $0x1111, %rcx\n  mov $0x2222, %rdx\n  mov $0x3333, %rsi\n"
	"  mov $0x4444, %r8\n  mov $0x5555, %r9\n  mov $0x6666, %r10\n  mov $0x7777, %r11\n"
	"  mov $0x8888, %rax\n  movq %rax, %xmm8\n  mov $0x9999, %rax\n  movq %rax, %xmm15\n"
	"  test %ebx, %ebx\n  jz 1f\n  vcmptrueps %ymm9, %ymm9, %ymm9\n1:\n"
	"  mov $5, %edi\n  sub $8, %rsp\n  push %rbx\n" /* rsp = 0 mod 16 at the call: misaligned */
	"  call reg_probe\n"
	"  pop %rbx\n  add $8, %rsp\n"
	"  cmp $6, %eax\n  jne 9f\n"
	"  cmp $0x1111, %rcx\n  jne 9f\n  cmp $0x2222, %rdx\n  jne 9f\n  cmp $0x3333, %rsi\n  jne 9f\n"
	"  cmp $0x4444, %r8\n  jne 9f\n  cmp $0x5555, %r9\n  jne 9f\n  cmp $0x6666, %r10\n  jne 9f\n"
	"  cmp $0x7777, %r11\n  jne 9f\n"
	"  movq %xmm8, %rax\n  cmp $0x8888, %rax\n  jne 9f\n  movq %xmm15, %rax\n  cmp $0x9999, %rax\n  jne 9f\n"
	"  test %ebx, %ebx\n  jz 2f\n  vextractf128 $1, %ymm9, %xmm0\n  movq %xmm0, %rax\n  vzeroupper\n"
	"  cmp $-1, %rax\n  jne 9f\n"
	"2:\n  mov $1, %eax\n  pop %rbx\n  ret\n"
	"9:\n  xor %eax, %eax\n  pop %rbx\n  ret\n"
	".size regs_survive, .-regs_survive\n");
int regs_survive(int with_avx);

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	uint64_t x = (uint64_t)id;

	if (check_regs) {
		int avx = __builtin_cpu_supports("avx");

		for (int k = 0; k < 3; k++)
			if (!regs_survive(avx)) {
				printf("regs clobbered (thread %d, call %d)\n", id, k);
				fflush(stdout);
				_exit(3);
			}
	}
	while (sleep_ms && id != 0 && !__atomic_load_n(&sleeper_in, __ATOMIC_ACQUIRE))
		usleep(100);
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
		fprintf(stderr, "usage: %s THREADS REQUESTS WORK [--mutex] [--sleep-ms N] [--idle-us N] [--start-delay-ms N]\n", argv[0]);
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
		else if (!strcmp(argv[i], "--check-regs"))
			check_regs = 1;
		else if (!strcmp(argv[i], "--idle-us") && i + 1 < argc)
			idle_us = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--start-delay-ms") && i + 1 < argc)
			start_delay_ms = atoi(argv[++i]);
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

	if (start_delay_ms > 0)
		usleep((useconds_t)start_delay_ms * 1000);
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
