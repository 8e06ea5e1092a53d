/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hostile: a hostile sequence against the guest agent module from guest
 * user space (images/linux/README.md), run by /init before the staged
 * program. Each case prints "hostile: <case>: ok (<what happened>)" or
 * "hostile: <case>: FAILED (...)"; the test also checks that the kernel
 * logged no oops or BUG meanwhile. The module must answer every case with an
 * error code (or survive it) and stay usable: the staged program registers
 * afterwards.
 *
 * It also registers stage names the VMM's configuration does not list
 * ("hostile-a", "hostile-b"): the VM must keep running (the VMM warns and
 * serves them with default budgets). While that registration stands it
 * forges the per-vCPU stage counters (ABI minor 2), which user space can
 * map read-write: a state word with an unknown code and counts no vCPU can
 * reach. The VMM reads them once per policy period, must clamp them (it
 * logs "stage counters: impossible values clamped") and keep running.
 *
 * Then the cases on stage maps of hostile_agent.c (uprobes, `stagectl
 * attach`): a resolution bomb, a path swapped during attach, an
 * unprivileged user against root's attached map, a failed attach's unwind.
 *
 * Exit status: the number of failed cases (0: all held).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stage.h"
#include "stagevm_ioctl.h"
#include "stagevm_layout.h"

static int failed;

/* The cases on stage maps (hostile_agent.c); the number that failed. */
int hostile_agent(int fd);

/* Records one case: `got` is the ioctl's result (-1 with errno, or >= 0),
 * `want` the errno expected (0: success).
 */
static void expect(const char *name, int got, int err, int want)
{
	int ok = want ? (got < 0 && err == want) : got >= 0;

	printf("hostile: %s: %s (%s)\n", name, ok ? "ok" : "FAILED",
	       got < 0 ? strerror(err) : "succeeded");
	failed += !ok;
}

/* Maps the area's counter blocks read-write and writes impossible values
 * into every vCPU's block: an out-of-range state code and counts of 2^62.
 * Returns 0 when the blocks were mapped and written, -1 (errno set) when
 * not. The values then stand for `hold_us` (several of the VMM's policy
 * periods of 20 ms) before the caller unregisters.
 */
static int forge_counters(int fd, const struct stagevm_ioc_info *info, unsigned int hold_us)
{
	const struct stagevm_area_header *h;
	struct stagevm_layout l;
	uint8_t *ro, *rw;
	uint32_t v;

	ro = mmap(NULL, STAGEVM_PAGE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	if (ro == MAP_FAILED)
		return -1;
	h = (const void *)ro;
	if (!(h->flags & STAGEVM_AREA_FLAG_COUNTERS) ||
	    stagevm_layout_init(&l, h->num_vcpus, h->num_stages, h->ring_entries)) {
		munmap(ro, STAGEVM_PAGE_SIZE);
		errno = ENOENT;
		return -1;
	}
	stagevm_layout_with_counters(&l);
	munmap(ro, STAGEVM_PAGE_SIZE);
	/* Everything after the read-only page maps read-write. */
	rw = mmap(NULL, info->area_size - STAGEVM_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
		  fd, STAGEVM_PAGE_SIZE);
	if (rw == MAP_FAILED)
		return -1;
	for (v = 0; v < l.num_vcpus; v++) {
		struct stagevm_vcpu_counters *c =
			(void *)(rw + stagevm_counters_offset(&l, v) - STAGEVM_PAGE_SIZE);

		c->state = STAGEVM_STATE_CODE_MASK; /* code 31: no such code */
		for (unsigned int k = 0; k < STAGEVM_NUM_CODES; k++)
			c->counts[k] = 1ull << 62;
	}
	usleep(hold_us);
	munmap(rw, info->area_size - STAGEVM_PAGE_SIZE);
	return 0;
}

static int reg(int fd, unsigned int n, const char *const *names)
{
	struct stagevm_ioc_register r;

	memset(&r, 0, sizeof(r));
	r.num_stages = n;
	for (unsigned int i = 0; i < n && i < 16; i++)
		strncpy(r.names[i], names[i], sizeof(r.names[i]));
	return ioctl(fd, STAGEVM_IOC_REGISTER, &r);
}

int main(void)
{
	static const char *const unknown[] = { "hostile-a", "hostile-b" };
	static const char *const many[17] = { "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8",
					      "s9", "s10", "s11", "s12", "s13", "s14", "s15", "s16" };
	struct stagevm_ioc_info info;
	char small[4];
	void *p;
	int fd, r, status;
	pid_t child;

	setvbuf(stdout, NULL, _IOLBF, 0);
	fd = open(STAGEVM_DEVICE_PATH, O_RDWR);
	if (fd < 0) {
		printf("hostile: open %s: FAILED (%s)\n", STAGEVM_DEVICE_PATH, strerror(errno));
		return 1;
	}
	/* Bad sizes and numbers: the size is part of the command. */
	r = ioctl(fd, _IOR(STAGEVM_IOC_MAGIC, 1, char[4]), small);
	expect("INFO with a 4-byte size", r, errno, ENOTTY);
	r = ioctl(fd, _IOWR(STAGEVM_IOC_MAGIC, 2, char[4]), small);
	expect("REGISTER with a 4-byte size", r, errno, ENOTTY);
	r = ioctl(fd, _IO(STAGEVM_IOC_MAGIC, 99), 0);
	expect("unknown command 99", r, errno, ENOTTY);
	r = ioctl(fd, STAGEVM_IOC_INFO, (void *)8);
	expect("INFO to an unmapped address", r, errno, EFAULT);
	r = ioctl(fd, STAGEVM_IOC_REGISTER, (void *)8);
	expect("REGISTER from an unmapped address", r, errno, EFAULT);
	r = reg(fd, 0, unknown);
	expect("REGISTER of 0 stages", r, errno, EINVAL);
	r = reg(fd, 17, many);
	expect("REGISTER of 17 stages", r, errno, EINVAL);
	/* Registration state. */
	r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
	expect("UNREGISTER without REGISTER", r, errno, ENOENT);
	r = reg(fd, 2, unknown);
	expect("REGISTER of stages the VMM's config does not list", r, errno, 0);
	r = reg(fd, 2, unknown);
	expect("REGISTER twice", r, errno, EBUSY);
	/* The read-only page may not be mapped writable; the area not beyond
	 * its size.
	 */
	r = ioctl(fd, STAGEVM_IOC_INFO, &info);
	expect("INFO", r, errno, 0);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	expect("mmap of the read-only page writable", p == MAP_FAILED ? -1 : 0, errno, EPERM);
	if (p != MAP_FAILED)
		munmap(p, 4096);
	p = mmap(NULL, info.area_size + 4096, PROT_READ, MAP_SHARED, fd, 0);
	expect("mmap beyond the area", p == MAP_FAILED ? -1 : 0, errno, EINVAL);
	if (p != MAP_FAILED)
		munmap(p, info.area_size + 4096);
	/* The counter blocks (after the rings) map read-write; the VMM must
	 * clamp what is forged there, for 5 of its policy periods.
	 */
	r = forge_counters(fd, &info, 100000);
	expect("forged stage counters (mapped read-write, held 100 ms)", r, errno, 0);
	/* A process that exits in the middle of a stage (libstage, attached,
	 * its area mapped, no stage_exit or detach).
	 */
	child = fork();
	if (child == 0) {
		if (stage_init() < 0 || stage_enter(1) < 0)
			_exit(3);
		_exit(0);
	}
	r = waitpid(child, &status, 0) == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	printf("hostile: a process exiting mid-stage: %s (exit %d)\n", r == 0 ? "ok" : "FAILED", r);
	failed += r != 0;
	r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
	expect("UNREGISTER", r, errno, 0);
	r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
	expect("UNREGISTER twice", r, errno, ENOENT);
	/* Stage maps (uprobes): bounded resolution, one-open attach, root's
	 * privilege over an attached map, the unwinding of a failed attach.
	 */
	failed += hostile_agent(fd);
	close(fd);
	printf("hostile: %d case(s) failed\n", failed);
	return failed;
}
