/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage's request clock (ABI minor 4; private, as internal.h): what
 * stage_enter and stage_exit (hot.c) and stage_request_begin* (request.c)
 * do to the thread's clock (T.req_open, T.req_start) and to the current
 * CPU's latency block. Static inline so that the hot path keeps it inline.
 *
 * A request opens at stage_request_begin*() or at the first stage_enter
 * while none is open, and closes at stage_exit. At a begin, one step of the
 * current CPU's latency countdown (a compare-and-swap,
 * stagevm_request_begin in stagevm_request.h) decides whether the request
 * is timed; at the stage_exit of a timed one, after count() has counted the
 * completion (counts[CODE_NONE]) on CPU c, its latency goes to CPU c's
 * latency block with atomic adds: bucket, sum_ns, then samples. So the host,
 * which copies the latency blocks before the counters, never sees more
 * timed requests than completed ones on a vCPU. A file including this
 * includes internal.h first.
 */
#ifndef LIBSTAGE_REQUEST_H
#define LIBSTAGE_REQUEST_H

/* Opens the thread's request clock: a request starts now, or at TSC `at`
 * when non-zero (as Agent::request_begin; one already open starts again).
 * Returns 1 when it is timed.
 */
static inline int request_begin(struct stage_thread *t, uint64_t at)
{
	int cpu;
	uint64_t now;

	t->req_open = 1;
	t->req_start = 0;
	t->st.requests++;
	if (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE) != REPORT_COUNTERS || !G.latency)
		return 0;
	cpu = current_cpu(t);
	if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus)
		return 0;
	now = stagevm_request_begin(G.latency + cpu, G.timed_every, G.pace_ticks);
	if (!now)
		return 0;
	t->req_start = at ? at : now;
	return 1;
}

/* Closes the thread's request clock at a stage_exit that counted the
 * completion on vCPU `cpu`: a timed request's latency goes to `cpu`'s
 * histogram (as Agent::stage_exit_request).
 */
static inline void request_end(struct stage_thread *t, int cpu)
{
	uint64_t start = t->req_start;

	t->req_open = 0;
	t->req_start = 0;
	if (!start || !G.latency || cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus)
		return;
	stagevm_latency_record(G.latency + cpu, stagevm_request_ns(start, G.ns_mult));
	t->st.requests_timed++;
}

#endif /* LIBSTAGE_REQUEST_H */
