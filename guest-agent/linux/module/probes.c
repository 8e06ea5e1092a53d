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
 * Cost per hit (the int3 trap, the handler, the out-of-line single step and
 * its trap; Documentation/trace/uprobetracer.rst): on hardware, published
 * figures range from a few hundred ns to a few µs (guest-agent/linux/
 * README.md); here, where guest kernel mode is emulated, 0.2-2.5 ms
 * (images/linux/mariadb/README.md).
 *
 * Without CONFIG_UPROBES (the test-linux kernel) every call answers
 * -EOPNOTSUPP.
 */
#include <linux/atomic.h>
#include <linux/cpumask.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/uprobes.h>
#include <asm/msr.h>

#include "agent.h"

#ifdef CONFIG_UPROBES

struct stage_probe {
	struct uprobe_consumer uc;
	loff_t offset;
	u32 stage;
};

/* Threads whose affinity a hit changed: given every CPU back at detach. */
#define PROBED_THREADS 1024

static struct {
	/* Attached map (written under the agent's lock, read by hits while
	 * attached: uprobe_unregister waits for running handlers). */
	struct inode *inode;
	struct stage_probe *probes;
	u32 num_probes;
	struct stagevm_agent_area area;
	atomic64_t hits[STAGEVM_MAX_STAGES];
	atomic64_t counted, not_counted, migrations, affinity_failures;
	u64 map_attaches, map_detaches, threads_reset;
	spinlock_t threads_lock;
	struct pid *threads[PROBED_THREADS];
	u32 num_threads;
	atomic64_t threads_lost;
} pm = { .threads_lock = __SPIN_LOCK_UNLOCKED(pm.threads_lock) };

static void remember_thread(void)
{
	struct pid *pid = task_pid(current);
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&pm.threads_lock, flags);
	for (i = 0; i < pm.num_threads; i++)
		if (pm.threads[i] == pid)
			goto out;
	if (pm.num_threads < PROBED_THREADS)
		pm.threads[pm.num_threads++] = get_pid(pid);
	else if (atomic64_inc_return(&pm.threads_lost) == 1)
		pr_warn_ratelimited("stagevm: more than %d threads moved by stage-map hits: the rest keep their vCPUs at detach (counted)\n",
				    PROBED_THREADS);
out:
	spin_unlock_irqrestore(&pm.threads_lock, flags);
}

/* The vCPUs serving `stage` in the host's map as a cpumask; false when the
 * map gives it none (the thread then stays where it is, a fallback). */
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

/* The state-word transition of libstage's count() (hot.c) into `code` on
 * this CPU's block, with preemption off. Returns the CPU, or -1 when there
 * is no block to count in. */
static int count_on_this_cpu(u32 code, u32 stage, bool moved)
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

		__atomic_add_fetch(&b->cycles[stagevm_state_code(old)], end > start ? end - start : 0,
				   __ATOMIC_RELAXED);
		__atomic_add_fetch(&b->timed[stagevm_state_code(old)], 1, __ATOMIC_RELAXED);
	}
	if (moved)
		__atomic_add_fetch(&b->migrations_in[stage], 1, __ATOMIC_RELAXED);
	WRITE_ONCE(b->countdown, countdown ? countdown - 1 : STAGEVM_TIMED_EVERY - 1);
	put_cpu();
	return cpu;
}

static int probe_hit(struct uprobe_consumer *uc, struct pt_regs *regs)
{
	struct stage_probe *p = container_of(uc, struct stage_probe, uc);
	int from = raw_smp_processor_id(), cpu;
	bool moved = false;
	cpumask_var_t mask;

	atomic64_inc(&pm.hits[p->stage]);
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
	cpu = count_on_this_cpu(STAGEVM_CODE_FIRST_STAGE + p->stage, p->stage, moved);
	atomic64_inc(cpu < 0 ? &pm.not_counted : &pm.counted);
	if (moved)
		atomic64_inc(&pm.migrations);
	return 0;
}

/* Gives every thread a hit moved all CPUs back. */
static void reset_threads(void)
{
	u32 i, n;

	spin_lock_irq(&pm.threads_lock);
	n = pm.num_threads;
	pm.num_threads = 0;
	spin_unlock_irq(&pm.threads_lock);
	/* No hit runs now (every uprobe is unregistered): the table is ours. */
	for (i = 0; i < n; i++) {
		struct task_struct *t = get_pid_task(pm.threads[i], PIDTYPE_PID);

		if (t) {
			if (set_cpus_allowed_ptr(t, cpu_possible_mask) == 0)
				pm.threads_reset++;
			put_task_struct(t);
		}
		put_pid(pm.threads[i]);
	}
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
		if (in[i].stage >= area->num_stages || in[i].reserved ||
		    in[i].offset >= (u64)i_size_read(file_inode(f)))
			ret = -EINVAL;
	if (ret)
		goto out;
	pm.inode = igrab(file_inode(f));
	pm.area = *area;
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		atomic64_set(&pm.hits[i], 0);
	for (i = 0; i < req.num_probes; i++) {
		pm.probes[i].offset = in[i].offset;
		pm.probes[i].stage = in[i].stage;
		pm.probes[i].uc.handler = probe_hit;
		ret = uprobe_register(pm.inode, in[i].offset, &pm.probes[i].uc);
		if (ret) {
			pr_warn_ratelimited("stagevm: uprobe at offset %#llx refused (%ld); nothing attached\n",
					    in[i].offset, ret);
			unregister_probes(i);
			iput(pm.inode);
			pm.inode = NULL;
			goto out;
		}
	}
	pm.num_probes = req.num_probes;
	pm.map_attaches++;
	pr_info("stagevm: stage map attached: %u uprobes on inode %lu, %u stages\n",
		pm.num_probes, pm.inode->i_ino, area->num_stages);
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
	if (!pm.inode)
		return -ENOENT;
	unregister_probes(pm.num_probes);
	reset_threads();
	iput(pm.inode);
	pm.inode = NULL;
	kfree(pm.probes);
	pm.probes = NULL;
	pr_info("stagevm: stage map detached after %u uprobes, %llu threads given every CPU back\n",
		pm.num_probes, pm.threads_reset);
	pm.num_probes = 0;
	pm.map_detaches++;
	return 0;
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

#endif
