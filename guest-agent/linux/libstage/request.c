/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage's request API (ABI minor 4; stage.h): stage_request_begin,
 * stage_request_begin_at and the test hook stage__test_record_latency. The
 * clock itself is request.h, which stage_enter and stage_exit (hot.c) use
 * inline.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>

#include "request.h"

static int begin_at(uint64_t at)
{
	struct stage_thread *t = &T;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	return request_begin(t, at);
}

int stage_request_begin(void)
{
	return begin_at(0);
}

int stage_request_begin_at(uint64_t tsc)
{
	return begin_at(tsc);
}

int stage__test_record_latency(unsigned int cpu, uint64_t ns)
{
	if (!G.registered || !G.l.latency)
		return -ENODEV;
	if (cpu >= G.l.num_vcpus)
		return -ERANGE;
	/* The record of request_end (request.h), on any block. */
	return (int)stagevm_latency_record(latency_at(cpu), ns);
}
