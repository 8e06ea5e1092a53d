// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * stagevm_agent: the Linux guest side of the stagevm stage channel, kept
 * thin. It allocates the shared area (physically contiguous pages), lays it
 * out and registers it with the VMM through the port-I/O doorbell when user
 * space asks (STAGEVM_IOC_REGISTER, with the stage names), and exposes it as
 * /dev/stagevm for mmap: the first page (header, stage descriptors, stage
 * map) read-only, the per-vCPU rings, (ABI minor 2) the per-vCPU counter
 * blocks after them and (minor 4) the per-vCPU request-latency histograms
 * after those read-write. Stage switches and request latencies are written
 * by libstage in user space; no system call is on that path. Stage maps on unmodified
 * binaries (uprobes, STAGEVM_IOC_ATTACH_MAP) are in probes.c. See
 * guest-agent/linux/README.md; the ABI is hypercall-abi/include/stagevm_abi.h.
 */
/* Every message begins "stagevm: ", what operators and the tests look for. */
#define pr_fmt(fmt) "stagevm: " fmt

#include <linux/atomic.h>
#include <linux/capability.h>
#include <linux/cpumask.h>
#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/io.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/smp.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <asm/cpufeature.h>
#include <asm/msr.h>

#include "agent.h"

static unsigned int ring_entries = 256;
module_param(ring_entries, uint, 0444);
MODULE_PARM_DESC(ring_entries, "Events per vCPU ring, a power of two (default 256)");

static unsigned int vcpus;
module_param(vcpus, uint, 0444);
MODULE_PARM_DESC(vcpus, "Number of vCPUs (rings); 0: the present CPUs");

static bool counters = true;
module_param(counters, bool, 0444);
MODULE_PARM_DESC(counters, "Lay out per-vCPU stage counters (ABI minor 2; 0: rings only, as a v1.1 guest)");

static bool latency = true;
module_param(latency, bool, 0444);
MODULE_PARM_DESC(latency, "With counters, lay out per-vCPU request-latency histograms (ABI minor 4; 0: as a minor-3 guest)");

static bool force_doorbell;
module_param(force_doorbell, bool, 0444);
MODULE_PARM_DESC(force_doorbell, "Use the doorbell ports without a hypervisor CPUID bit");

static struct {
	struct mutex lock; /* registration state, doorbell */
	struct page *pages;
	unsigned int order;
	void *area;
	u64 size;
	u32 num_vcpus;
	u32 num_stages;
	struct stagevm_layout layout; /* as registered */
	bool registered;
	kuid_t owner; /* the euid that registered (UNREGISTER is its own) */
	u32 last_status;
	u64 registrations;
	u64 register_failures;
	u64 unregistrations;
	atomic64_t attaches;
	atomic64_t detaches;
	atomic64_t mmaps;
} sv;

static int status_errno(u32 s)
{
	switch (s) {
	case STAGEVM_OK: return 0;
	case STAGEVM_NO_DEVICE: return -ENODEV;
	case STAGEVM_ALREADY_REGISTERED: return -EBUSY;
	case STAGEVM_NOT_REGISTERED: return -ENOENT;
	default: return -EIO;
	}
}

/* One doorbell command. The VMM keeps the status per vCPU: the `out` and
 * the `in` must run on the same CPU. Called with sv.lock held.
 */
static u32 doorbell(u16 port, u32 value)
{
	u32 status;

	if (!force_doorbell && !boot_cpu_has(X86_FEATURE_HYPERVISOR))
		return STAGEVM_NO_DEVICE;
	get_cpu();
	outl(value, port);
	status = inl(STAGEVM_DOORBELL_STATUS);
	put_cpu();
	return status;
}

/* The area's layout for `num_stages` stages: -1 for a bad count. */
static int area_layout(struct stagevm_layout *l, u32 num_stages)
{
	if (stagevm_layout_init(l, sv.num_vcpus, num_stages, ring_entries))
		return -1;
	if (counters && latency)
		stagevm_layout_with_latency(l);
	else if (counters)
		stagevm_layout_with_counters(l);
	return 0;
}

static long do_register(struct stagevm_ioc_register __user *uarg)
{
	struct stagevm_ioc_register req;
	struct stagevm_layout l;
	/* Static (under sv.lock), not on the stack: with `req` they would
	 * pass the kernel's 1024-byte frame limit.
	 */
	static char names[STAGEVM_MAX_STAGES][33];
	static const char *ptrs[STAGEVM_MAX_STAGES];
	unsigned long pfn;
	u32 i, status;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (area_layout(&l, req.num_stages))
		return -EINVAL;
	mutex_lock(&sv.lock);
	for (i = 0; i < req.num_stages; i++) {
		memcpy(names[i], req.names[i], 32);
		names[i][32] = 0;
		ptrs[i] = names[i];
	}
	if (sv.registered) {
		ret = -EBUSY;
		goto out;
	}
	/* A fresh layout on every registration: the area is zeroed, so every
	 * counter of a new registration starts at 0 (the host's baseline).
	 */
	if (stagevm_area_init(sv.area, sv.size, &l, ptrs)) {
		ret = -EINVAL;
		goto out;
	}
	/* As Agent::register: every vCPU in a timed "no stage" visit from the
	 * TSC read just before REGISTER, which the header also carries.
	 */
	stagevm_area_start_counters(sv.area, &l, rdtsc());
	/* Header, names and counters before the host reads them at REGISTER. */
	wmb();
	pfn = page_to_pfn(sv.pages);
	status = doorbell(STAGEVM_DOORBELL_REGISTER, (u32)pfn);
	sv.last_status = status;
	ret = status_errno(status);
	if (ret) {
		sv.register_failures++;
		pr_warn_ratelimited("REGISTER of %llu bytes at %#llx refused: %s (%u)\n",
				    sv.size, (u64)PFN_PHYS(pfn), stagevm_status_name(status),
				    status);
	} else {
		sv.registered = true;
		sv.owner = current_euid();
		sv.num_stages = req.num_stages;
		sv.layout = l;
		sv.registrations++;
		pr_info("registered %u stages, %u vCPUs, %u ring entries%s%s\n",
			req.num_stages, sv.num_vcpus, ring_entries, l.counters ? ", counters" : "",
			l.latency ? ", latency" : "");
	}
	req.status = status;
	if (copy_to_user(uarg, &req, sizeof(req)))
		ret = ret ? ret : -EFAULT;
out:
	mutex_unlock(&sv.lock);
	return ret;
}

/* Called with sv.lock held. */
static int do_unregister(void)
{
	u32 status;

	if (!sv.registered)
		return -ENOENT;
	/* A stage map's uprobes count into this registration's area. */
	stagevm_probes_detach();
	status = doorbell(STAGEVM_DOORBELL_UNREGISTER, 0);
	sv.last_status = status;
	sv.registered = false;
	sv.num_stages = 0;
	sv.unregistrations++;
	if (status != STAGEVM_OK) {
		pr_warn_ratelimited("UNREGISTER: %s (%u)\n", stagevm_status_name(status), status);
		return status_errno(status);
	}
	return 0;
}

static long stagevm_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	long ret;

	switch (cmd) {
	case STAGEVM_IOC_INFO: {
		struct stagevm_ioc_info info = {
			.area_size = sv.size,
			.area_phys = (u64)page_to_phys(sv.pages),
			.num_vcpus = sv.num_vcpus,
			.ring_entries = ring_entries,
			.ro_bytes = STAGEVM_RO_BYTES,
		};

		mutex_lock(&sv.lock);
		info.num_stages = sv.num_stages;
		info.registered = sv.registered;
		info.last_status = sv.last_status;
		mutex_unlock(&sv.lock);
		return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
	}
	case STAGEVM_IOC_REGISTER:
		return do_register(uarg);
	case STAGEVM_IOC_UNREGISTER:
		mutex_lock(&sv.lock);
		/* UNREGISTER detaches an attached stage map first, which
		 * DETACH_MAP allows only with CAP_SYS_ADMIN: without it the
		 * caller gets -EBUSY while a map is attached (the map is what is
		 * in the way, and the same call succeeds once root detaches it;
		 * libstage programs of any user unregister their own stages).
		 * Otherwise anyone could detach root's map and register names
		 * that make root's next attach be refused.
		 */
		if (stagevm_probes_attached() && !capable(CAP_SYS_ADMIN)) {
			pr_warn_ratelimited("UNREGISTER by pid %d refused: a stage map is attached (detaching it needs CAP_SYS_ADMIN)\n",
					    task_pid_nr(current));
			ret = -EBUSY;
		} else if (sv.registered && !uid_eq(current_euid(), sv.owner) &&
			   !capable(CAP_SYS_ADMIN)) {
			/* A registration is undone by the user who made it (or
			 * root): another member of the device's group cannot
			 * take a server's stages away (issue 50 S8).
			 */
			pr_warn_ratelimited("UNREGISTER by pid %d (uid %u) refused: uid %u registered\n",
					    task_pid_nr(current),
					    from_kuid(&init_user_ns, current_euid()),
					    from_kuid(&init_user_ns, sv.owner));
			ret = -EPERM;
		} else {
			ret = do_unregister();
		}
		mutex_unlock(&sv.lock);
		return ret;
	case STAGEVM_IOC_ATTACH:
		atomic64_inc(&sv.attaches);
		return raw_smp_processor_id();
	case STAGEVM_IOC_DETACH:
		atomic64_inc(&sv.detaches);
		return 0;
	case STAGEVM_IOC_STATS: {
		struct stagevm_ioc_stats st = {
			.attaches = atomic64_read(&sv.attaches),
			.detaches = atomic64_read(&sv.detaches),
			.mmaps = atomic64_read(&sv.mmaps),
		};

		st.attached = (s64)(st.attaches - st.detaches);
		mutex_lock(&sv.lock);
		st.registrations = sv.registrations;
		st.register_failures = sv.register_failures;
		st.unregistrations = sv.unregistrations;
		st.last_status = sv.last_status;
		mutex_unlock(&sv.lock);
		return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
	}
	case STAGEVM_IOC_ATTACH_MAP: {
		struct stagevm_agent_area area;

		/* /dev/stagevm is open to its group (libstage programs), but a stage map
		 * probes every process running the binary and moves its threads:
		 * root's, like `perf probe`.
		 */
		if (!capable(CAP_SYS_ADMIN))
			return -EPERM;
		mutex_lock(&sv.lock);
		area = (struct stagevm_agent_area){ .base = sv.area, .layout = sv.layout,
						    .num_stages = sv.num_stages,
						    .registered = sv.registered };
		ret = stagevm_probes_attach(&area, uarg);
		mutex_unlock(&sv.lock);
		return ret;
	}
	case STAGEVM_IOC_DETACH_MAP:
		if (!capable(CAP_SYS_ADMIN))
			return -EPERM;
		mutex_lock(&sv.lock);
		ret = stagevm_probes_detach();
		mutex_unlock(&sv.lock);
		return ret;
	case STAGEVM_IOC_PROBE_STATS:
		mutex_lock(&sv.lock);
		ret = stagevm_probes_stats(uarg);
		mutex_unlock(&sv.lock);
		return ret;
	default:
		return -ENOTTY;
	}
}

static int stagevm_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	unsigned long pages = sv.size >> PAGE_SHIFT;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_pgoff >= pages || len > ((pages - vma->vm_pgoff) << PAGE_SHIFT))
		return -EINVAL;
	/* The header, names and stage map are the kernel's and the host's. */
	if ((vma->vm_pgoff << PAGE_SHIFT) < STAGEVM_RO_BYTES) {
		if (vma->vm_flags & VM_WRITE) {
			pr_warn_ratelimited("writable mapping of the header page refused (pid %d)\n",
					    task_pid_nr(current));
			return -EPERM;
		}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
		vm_flags_clear(vma, VM_MAYWRITE);
#else
		vma->vm_flags &= ~VM_MAYWRITE;
#endif
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
#endif
	atomic64_inc(&sv.mmaps);
	return remap_pfn_range(vma, vma->vm_start, page_to_pfn(sv.pages) + vma->vm_pgoff, len,
			       vma->vm_page_prot);
}

static const struct file_operations stagevm_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = stagevm_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = stagevm_mmap,
	.llseek = noop_llseek,
};

static struct miscdevice stagevm_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "stagevm",
	.fops = &stagevm_fops,
	/* Read-write for root and the device's group only: a member can
	 * register stages and write its vCPUs' counters (what the host
	 * schedules by), so the group is the guest's trusted servers. The
	 * kernel creates the node root:root; the agent's package sets the
	 * group `stagevm` with a udev rule (60-stagevm.rules), as /dev/kvm's
	 * `kvm` group is set (issue 50 S8).
	 */
	.mode = 0660,
};

static int __init stagevm_init(void)
{
	struct stagevm_layout l;
	unsigned long pfn;
	int ret;

	mutex_init(&sv.lock);
	sv.num_vcpus = vcpus ? vcpus : num_present_cpus();
	if (area_layout(&l, 1)) {
		pr_warn("bad parameters: vcpus %u ring_entries %u\n", sv.num_vcpus,
			ring_entries);
		return -EINVAL;
	}
	/* The area's size does not depend on the number of stages; with
	 * counters it includes the counter blocks after the rings, and with
	 * latency the latency blocks after those.
	 */
	sv.size = stagevm_area_size(&l);
	sv.order = get_order(sv.size);
	sv.pages = alloc_pages(GFP_KERNEL | __GFP_ZERO, sv.order);
	if (!sv.pages)
		return -ENOMEM;
	pfn = page_to_pfn(sv.pages);
	/* The doorbell carries a 32-bit page frame number. */
	if (pfn + (1UL << sv.order) > 0xffffffffUL) {
		pr_warn("area at %#llx is above the doorbell's reach\n",
			(u64)PFN_PHYS(pfn));
		ret = -ERANGE;
		goto free;
	}
	sv.area = page_address(sv.pages);
	sv.last_status = STAGEVM_NOT_REGISTERED;
	ret = misc_register(&stagevm_misc);
	if (ret)
		goto free;
	pr_info("/dev/stagevm: %llu-byte area at %#llx, %u vCPUs, %u ring entries%s%s\n",
		sv.size, (u64)PFN_PHYS(pfn), sv.num_vcpus, ring_entries,
		l.counters ? ", counters" : "", l.latency ? ", latency" : "");
	return 0;
free:
	__free_pages(sv.pages, sv.order);
	return ret;
}

static void __exit stagevm_exit(void)
{
	misc_deregister(&stagevm_misc);
	mutex_lock(&sv.lock);
	stagevm_probes_detach();
	do_unregister();
	mutex_unlock(&sv.lock);
	__free_pages(sv.pages, sv.order);
}

module_init(stagevm_init);
module_exit(stagevm_exit);
MODULE_DESCRIPTION("stagevm guest agent: stage channel shared area and doorbell");
MODULE_LICENSE("GPL and additional rights");
