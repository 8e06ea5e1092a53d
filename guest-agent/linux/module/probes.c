// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Stage maps on unmodified binaries: the module's uprobes
 * (STAGEVM_IOC_ATTACH_MAP, `stagectl attach`; guest-agent/linux/README.md).
 *
 * A stage-map file names, per stage, function entries of one ELF binary;
 * stagectl resolves them to file offsets and hands them here with an open
 * fd of the binary. Each becomes a uprobe (uprobe_register(), the facility
 * behind `perf probe`, Documentation/trace/uprobetracer.rst): an int3 at the
 * entry, whose hit runs probe_hit() in the hitting thread's context before
 * the original instruction is single-stepped out of line. A hit does what
 * libstage's stage_enter does for a linked program:
 *
 *  - moves the thread to the vCPUs the host's stage map gives the stage
 *    (set_cpus_allowed_ptr: the scheduler's own migration, as
 *    sched_setaffinity; under a map where the stage is served everywhere
 *    the thread keeps or gets back every CPU), and
 *  - counts the transition on the vCPU it then runs on, in that vCPU's
 *    counter block (ABI minor 2; the same state-word transition as
 *    libstage's count(), hot.c), with preemption off so that no other writer
 *    of the block runs on this CPU in between.
 *
 * It never waits on anything but the migration itself: no lock is taken but
 * the thread table's spinlock, nothing is allocated.
 *
 * Requests (ABI minor 4). The map's `request` symbols are the functions
 * where a thread waits for its client's next request (MariaDB's network
 * reads; libstage/stagemap_file.h). Their probes (STAGEVM_PROBE_REQUEST)
 * also carry a uretprobe (uprobe_consumer.ret_handler), and per thread the
 * module tracks how deep it is in them and its request clock:
 *
 *  - the outermost entry ends the thread's open request, as libstage's
 *    stage_exit: the transition into "no stage" on the CPU it runs on
 *    (counts[CODE_NONE], a completion) and, for a timed request, then its
 *    latency in that CPU's latency block (bucket, sum, samples); then the
 *    hit enters the request's stage as any other;
 *  - the outermost return (the request has arrived) begins the next one on
 *    the CPU it runs on: one step of that CPU's countdown decides whether
 *    it is timed (stagevm_request.h, shared with libstage).
 *
 * So a request runs from the return of the read that brought it to the
 * entry of the next read, the server's time for it; the client's think
 * time between requests is outside. Nested request functions (a read
 * calling the lower-level reads, also listed) move only the depth. The
 * clock lives in the table of probed threads (below), a bounded hash table
 * keyed by the thread's struct pid; a thread it cannot hold (1024 live
 * threads) loses its request events, counted (requests_dropped), and
 * threads that have exited are swept out when it is full.
 *
 * Cost per hit (the int3 trap, the handler, the out-of-line single step and
 * its trap; Documentation/trace/uprobetracer.rst): on hardware, published
 * figures range from a few hundred ns to a few µs (guest-agent/linux/
 * README.md); here, where guest kernel mode is emulated, 0.2-2.5 ms
 * (images/linux/mariadb/README.md).
 *
 * Without CONFIG_UPROBES every call answers -EOPNOTSUPP (the test-linux
 * and MariaDB kernels have it: images/linux/kernel/).
 */
/* Every message begins "stagevm: ", what operators and the tests look for. */
#define pr_fmt(fmt) "stagevm: " fmt

#include <linux/atomic.h>
#include <linux/cpumask.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/hash.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/uprobes.h>
#include <asm/msr.h>

#include "agent.h"
#include "stagevm_request.h"

#ifdef CONFIG_UPROBES

struct stage_probe {
	struct uprobe_consumer uc;
	loff_t offset;
	u32 stage;
	bool request; /* STAGEVM_PROBE_REQUEST */
};

/* A thread the probes know: one whose affinity a hit changed (given every
 * CPU back at detach), or one in or between requests (request symbols).
 */
struct probed_thread {
	struct pid *pid; /* a reference; NULL: a free slot */
	u64 start;       /* the TSC an open timed request started at, else 0 */
	u32 depth;       /* request functions entered and not returned from */
	bool open;       /* a request is open */
	bool moved;      /* a hit changed its affinity */
};

/* The table of probed threads: open addressing, linear probing. */
#define PROBED_BITS 10
#define PROBED_THREADS (1u << PROBED_BITS)

static struct {
	/* Attached map (written under the agent's lock, read by hits while
	 * attached: uprobe_unregister waits for running handlers).
	 */
	struct inode *inode;
	struct stage_probe *probes;
	u32 num_probes;
	struct stagevm_agent_area area;
	atomic64_t hits[STAGEVM_MAX_STAGES];
	atomic64_t counted, not_counted, migrations, affinity_failures;
	u64 map_attaches, map_detaches, threads_reset;
	spinlock_t threads_lock; /* threads[] and threads_held, between concurrent hits */
	struct probed_thread threads[PROBED_THREADS];
	u64 threads_held; /* struct pid references in `threads` (slots in use) */
	atomic64_t threads_lost;
	/* Requests are timed (set at attach): an area with latency blocks, a
	 * host of minor >= 4 that gave the TSC rate; its ns per tick (x 2^32)
	 * and the TSC ticks of TIMED_INTERVAL_NS.
	 */
	bool latency_on;
	u64 ns_mult, pace_ticks;
	atomic64_t requests_begun, requests_ended, requests_timed, requests_dropped;
} pm = { .threads_lock = __SPIN_LOCK_UNLOCKED(pm.threads_lock) };

/* ---- the table of probed threads (callers hold threads_lock) ---- */

static u32 home_slot(const struct pid *pid)
{
	return hash_ptr(pid, PROBED_BITS);
}

/* Frees slot `i`, moving back the entries after it that may no longer be
 * found past the hole (backward-shift deletion: no tombstones).
 */
static void slot_free(u32 i)
{
	u32 j = i;

	put_pid(pm.threads[i].pid);
	pm.threads[i].pid = NULL;
	pm.threads_held--;
	for (;;) {
		u32 home;

		j = (j + 1) & (PROBED_THREADS - 1);
		if (!pm.threads[j].pid)
			return;
		home = home_slot(pm.threads[j].pid);
		/* Entry j stays when its home lies cyclically in (i, j]. */
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		pm.threads[i] = pm.threads[j];
		pm.threads[j].pid = NULL;
		i = j;
	}
}

/* Frees the slots of threads that have exited; true when one was freed. */
static bool sweep_exited(void)
{
	bool freed = false;
	u32 i = 0;

	while (i < PROBED_THREADS) {
		struct pid *pid = pm.threads[i].pid;

		if (pid && !pid_has_task(pid, PIDTYPE_PID)) {
			slot_free(i); /* an entry after it may move into i */
			freed = true;
			continue;
		}
		i++;
	}
	return freed;
}

/* The calling thread's slot, or -1. With `add`, a thread without one gets
 * a free slot (and the table a reference to its pid); -1 when the table is
 * full of live threads.
 */
static int thread_slot(bool add)
{
	struct pid *pid = task_pid(current);
	bool swept = false;
	u32 i, n;

	for (;;) {
		i = home_slot(pid);
		for (n = 0; n < PROBED_THREADS; n++, i = (i + 1) & (PROBED_THREADS - 1)) {
			if (pm.threads[i].pid == pid)
				return i;
			if (!pm.threads[i].pid)
				break;
		}
		if (!add)
			return -1;
		if (n < PROBED_THREADS)
			break;
		if (swept || !sweep_exited())
			return -1;
		swept = true;
	}
	pm.threads[i] = (struct probed_thread){ .pid = get_pid(pid) };
	pm.threads_held++;
	return i;
}

static void remember_thread(void)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pm.threads_lock, flags);
	i = thread_slot(true);
	if (i >= 0)
		pm.threads[i].moved = true;
	else if (atomic64_inc_return(&pm.threads_lost) == 1)
		pr_warn_ratelimited("more than %u threads moved by stage-map hits: the rest keep their vCPUs at detach (counted)\n",
				    PROBED_THREADS);
	spin_unlock_irqrestore(&pm.threads_lock, flags);
}

/* The vCPUs serving `stage` in the host's map as a cpumask; false when the
 * map gives it none (the thread then stays where it is, a fallback).
 */
static bool serving(u32 stage, struct cpumask *mask)
{
	const struct stagevm_stage_map *m = pm.area.base + STAGEVM_STAGE_MAP_OFFSET;
	u64 vcpus = READ_ONCE(m->vcpus[stage]);
	u32 v;

	cpumask_clear(mask);
	for (v = 0; v < pm.area.layout.num_vcpus && v < nr_cpu_ids; v++)
		if (vcpus >> v & 1)
			cpumask_set_cpu(v, mask);
	return !cpumask_empty(mask);
}

/* vCPU `cpu`'s latency block in the attached area (minor 4). */
static struct stagevm_vcpu_latency *latency_block(u32 cpu)
{
	return pm.area.base + stagevm_latency_offset(&pm.area.layout, cpu);
}

/* The state-word transition of libstage's count() (hot.c) into `code` on
 * this CPU's block, with preemption off. A transition into "no stage" ends
 * a request: with `timed_start` (its start TSC, if timed), its latency then
 * goes to the same CPU's latency block, as libstage's stage_exit. Returns
 * the CPU, or -1 when there is no block to count in.
 */
static int count_on_this_cpu(u32 code, u32 stage, bool moved, u64 timed_start)
{
	const struct stagevm_stage_map *m = pm.area.base + STAGEVM_STAGE_MAP_OFFSET;
	struct stagevm_vcpu_counters *b;
	u64 old, countdown, tsc;
	int cpu = get_cpu();

	if (!pm.area.layout.counters || READ_ONCE(m->minor) < 2 ||
	    (u32)cpu >= pm.area.layout.num_vcpus) {
		put_cpu();
		return -1;
	}
	b = pm.area.base + stagevm_counters_offset(&pm.area.layout, cpu);
	old = READ_ONCE(b->state);
	countdown = READ_ONCE(b->countdown);
	tsc = stagevm_needs_tsc(old, countdown, code) ? rdtsc() : 0;
	WRITE_ONCE(b->state, countdown == 0 ? stagevm_state_word(tsc, code, 1) :
					      stagevm_state_word(0, code, 0));
	__atomic_add_fetch(&b->counts[code], 1, __ATOMIC_RELAXED);
	if (stagevm_state_timed(old) && stagevm_state_code(old) < STAGEVM_NUM_CODES) {
		u64 end = tsc & ~STAGEVM_STATE_LOW_MASK, start = stagevm_state_since(old);

		__atomic_add_fetch(&b->cycles[stagevm_state_code(old)],
				   end > start ? end - start : 0, __ATOMIC_RELAXED);
		__atomic_add_fetch(&b->timed[stagevm_state_code(old)], 1, __ATOMIC_RELAXED);
	}
	if (moved)
		__atomic_add_fetch(&b->migrations_in[stage], 1, __ATOMIC_RELAXED);
	WRITE_ONCE(b->countdown, countdown ? countdown - 1 : STAGEVM_TIMED_EVERY - 1);
	if (code == STAGEVM_CODE_NONE) {
		/* After counts[CODE_NONE]: never more timed than completed. */
		atomic64_inc(&pm.requests_ended);
		if (timed_start && pm.latency_on) {
			stagevm_latency_record(latency_block(cpu),
					       stagevm_request_ns(timed_start, pm.ns_mult));
			atomic64_inc(&pm.requests_timed);
		}
	}
	put_cpu();
	return cpu;
}

/* A request symbol's entry: the thread's outermost one ends its open
 * request. Returns true then, with the request's timed start (0: untimed)
 * in `*start`.
 */
static bool request_entry(u64 *start)
{
	unsigned long flags;
	bool end = false;
	int i;

	spin_lock_irqsave(&pm.threads_lock, flags);
	i = thread_slot(true);
	if (i < 0) {
		atomic64_inc(&pm.requests_dropped);
	} else if (pm.threads[i].depth++ == 0 && pm.threads[i].open) {
		end = true;
		*start = pm.threads[i].start;
		pm.threads[i].open = false;
		pm.threads[i].start = 0;
	}
	spin_unlock_irqrestore(&pm.threads_lock, flags);
	return end;
}

/* A request symbol's return (uretprobe): the thread's outermost one begins
 * a request on the CPU it runs on (one already open starts again).
 */
static int probe_ret(struct uprobe_consumer *uc, unsigned long func, struct pt_regs *regs)
{
	struct probed_thread *t;
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pm.threads_lock, flags);
	/* No slot: its entry found the table full (counted there). */
	i = thread_slot(false);
	if (i >= 0) {
		t = &pm.threads[i];
		if (t->depth)
			t->depth--;
		if (!t->depth) {
			u32 cpu = raw_smp_processor_id(); /* interrupts are off */

			t->open = true;
			t->start = 0;
			if (pm.latency_on && cpu < pm.area.layout.num_vcpus)
				t->start = stagevm_request_begin(latency_block(cpu), 0,
								 pm.pace_ticks);
			atomic64_inc(&pm.requests_begun);
		}
	}
	spin_unlock_irqrestore(&pm.threads_lock, flags);
	return 0;
}

static int probe_hit(struct uprobe_consumer *uc, struct pt_regs *regs)
{
	struct stage_probe *p = container_of(uc, struct stage_probe, uc);
	int from = raw_smp_processor_id(), cpu;
	bool moved = false;
	cpumask_var_t mask;

	atomic64_inc(&pm.hits[p->stage]);
	if (p->request) {
		u64 start = 0;

		/* The request ends where the thread was, before it moves. */
		if (request_entry(&start))
			count_on_this_cpu(STAGEVM_CODE_NONE, STAGEVM_STAGE_NONE, false, start);
		from = raw_smp_processor_id();
	}
	if (alloc_cpumask_var(&mask, GFP_ATOMIC)) {
		if (!serving(p->stage, mask))
			cpumask_copy(mask, cpu_possible_mask);
		if (!cpumask_equal(current->cpus_ptr, mask)) {
			if (set_cpus_allowed_ptr(current, mask) == 0) {
				remember_thread();
				moved = raw_smp_processor_id() != from;
			} else {
				atomic64_inc(&pm.affinity_failures);
			}
		}
		free_cpumask_var(mask);
	}
	cpu = count_on_this_cpu(STAGEVM_CODE_FIRST_STAGE + p->stage, p->stage, moved, 0);
	atomic64_inc(cpu < 0 ? &pm.not_counted : &pm.counted);
	if (moved)
		atomic64_inc(&pm.migrations);
	return 0;
}

/* Gives every thread a hit moved all CPUs back and empties the table
 * (open requests are forgotten), dropping its struct pid references.
 * Returns the threads given their CPUs back.
 */
static u64 reset_threads(void)
{
	u64 reset = 0;
	u32 i;

	/* No hit runs now (every uprobe is unregistered): the table is ours. */
	for (i = 0; i < PROBED_THREADS; i++) {
		struct probed_thread *pt = &pm.threads[i];
		struct task_struct *t;

		if (!pt->pid)
			continue;
		t = pt->moved ? get_pid_task(pt->pid, PIDTYPE_PID) : NULL;
		if (t) {
			if (set_cpus_allowed_ptr(t, cpu_possible_mask) == 0)
				reset++;
			put_task_struct(t);
		}
		put_pid(pt->pid);
		*pt = (struct probed_thread){ 0 };
		pm.threads_held--;
	}
	pm.threads_reset += reset;
	return reset;
}

static void unregister_probes(u32 n)
{
	while (n--)
		uprobe_unregister(pm.inode, pm.probes[n].offset, &pm.probes[n].uc);
}

long stagevm_probes_attach(const struct stagevm_agent_area *area,
			   struct stagevm_ioc_attach_map __user *uarg)
{
	struct stagevm_ioc_attach_map req;
	struct stagevm_ioc_probe *in;
	struct file *f;
	u32 i;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (pm.inode)
		return -EBUSY;
	if (!area->registered)
		return -ENOENT;
	if (req.num_probes < 1 || req.num_probes > STAGEVM_MAX_PROBES || req.reserved)
		return -EINVAL;
	f = fget(req.fd);
	if (!f)
		return -EBADF;
	if (!S_ISREG(file_inode(f)->i_mode)) {
		fput(f);
		return -EBADF;
	}
	in = memdup_user(u64_to_user_ptr(req.probes), req.num_probes * sizeof(*in));
	if (IS_ERR(in)) {
		fput(f);
		return PTR_ERR(in);
	}
	pm.probes = kcalloc(req.num_probes, sizeof(*pm.probes), GFP_KERNEL);
	ret = pm.probes ? 0 : -ENOMEM;
	for (i = 0; !ret && i < req.num_probes; i++)
		if (in[i].stage >= area->num_stages || (in[i].flags & ~STAGEVM_PROBE_REQUEST) ||
		    in[i].offset >= (u64)i_size_read(file_inode(f)))
			ret = -EINVAL;
	if (ret)
		goto out;
	pm.inode = igrab(file_inode(f));
	pm.area = *area;
	/* Requests are timed as libstage times them (its decide_report). */
	{
		const struct stagevm_area_header *h = area->base;
		const struct stagevm_stage_map *m = area->base + STAGEVM_STAGE_MAP_OFFSET;
		u64 khz = READ_ONCE(h->tsc_khz);

		pm.latency_on = area->layout.latency && khz && READ_ONCE(m->minor) >= 4;
		pm.ns_mult = khz ? stagevm_ns_mult(khz) : 0;
		pm.pace_ticks = stagevm_pace_ticks(khz);
	}
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		atomic64_set(&pm.hits[i], 0);
	for (i = 0; i < req.num_probes; i++) {
		pm.probes[i].offset = in[i].offset;
		pm.probes[i].stage = in[i].stage;
		pm.probes[i].request = in[i].flags & STAGEVM_PROBE_REQUEST;
		pm.probes[i].uc.handler = probe_hit;
		if (pm.probes[i].request)
			pm.probes[i].uc.ret_handler = probe_ret;
		ret = uprobe_register(pm.inode, in[i].offset, &pm.probes[i].uc);
		if (ret) {
			u64 reset;

			/* All or nothing, threads included: the probes before
			 * this one were live, and a thread that hit one in the
			 * meantime was moved and is held in the table. Once they
			 * are unregistered no hit runs (uprobe_unregister waits
			 * for running handlers), so the table is ours to empty.
			 */
			unregister_probes(i);
			reset = reset_threads();
			pr_warn_ratelimited("uprobe %u of %u at offset %#llx refused (%ld); nothing attached, %llu threads given every CPU back\n",
					    i + 1, req.num_probes, in[i].offset, ret, reset);
			iput(pm.inode);
			pm.inode = NULL;
			goto out;
		}
	}
	pm.num_probes = req.num_probes;
	pm.map_attaches++;
	pr_info("stage map attached: %u uprobes on inode %lu, %u stages, requests %s\n",
		pm.num_probes, pm.inode->i_ino, area->num_stages,
		pm.latency_on ? "timed" : "not timed");
out:
	if (!pm.inode) {
		kfree(pm.probes);
		pm.probes = NULL;
	}
	kfree(in);
	fput(f);
	return ret;
}

long stagevm_probes_detach(void)
{
	u64 reset;

	if (!pm.inode)
		return -ENOENT;
	unregister_probes(pm.num_probes);
	reset = reset_threads();
	iput(pm.inode);
	pm.inode = NULL;
	kfree(pm.probes);
	pm.probes = NULL;
	pr_info("stage map detached after %u uprobes, %llu threads given every CPU back\n",
		pm.num_probes, reset);
	pm.num_probes = 0;
	pm.map_detaches++;
	return 0;
}

bool stagevm_probes_attached(void)
{
	return pm.inode;
}

long stagevm_probes_stats(struct stagevm_ioc_probe_stats __user *uarg)
{
	struct stagevm_ioc_probe_stats st = {
		.attached = pm.num_probes,
		.num_stages = pm.area.num_stages,
		.counted = atomic64_read(&pm.counted),
		.not_counted = atomic64_read(&pm.not_counted),
		.migrations = atomic64_read(&pm.migrations),
		.affinity_failures = atomic64_read(&pm.affinity_failures),
		.map_attaches = pm.map_attaches,
		.map_detaches = pm.map_detaches,
		.threads_reset = pm.threads_reset,
		.threads_lost = atomic64_read(&pm.threads_lost),
		.threads_held = pm.threads_held,
		.requests_begun = atomic64_read(&pm.requests_begun),
		.requests_ended = atomic64_read(&pm.requests_ended),
		.requests_timed = atomic64_read(&pm.requests_timed),
		.requests_dropped = atomic64_read(&pm.requests_dropped),
	};
	u32 i;

	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		st.hits[i] = atomic64_read(&pm.hits[i]);
	return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
}

#else /* !CONFIG_UPROBES */

long stagevm_probes_attach(const struct stagevm_agent_area *area,
			   struct stagevm_ioc_attach_map __user *uarg)
{
	return -EOPNOTSUPP;
}

long stagevm_probes_detach(void)
{
	return -ENOENT;
}

long stagevm_probes_stats(struct stagevm_ioc_probe_stats __user *uarg)
{
	return -EOPNOTSUPP;
}

bool stagevm_probes_attached(void)
{
	return false;
}

#endif
