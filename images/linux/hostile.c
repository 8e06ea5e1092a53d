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
 * serves them with default budgets).
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

static int failed;

/* Records one case: `got` is the ioctl's result (-1 with errno, or >= 0),
 * `want` the errno expected (0: success). */
static void expect(const char *name, int got, int err, int want)
{
	int ok = want ? (got < 0 && err == want) : got >= 0;

	printf("hostile: %s: %s (%s)\n", name, ok ? "ok" : "FAILED",
	       got < 0 ? strerror(err) : "succeeded");
	failed += !ok;
}

static int reg(int fd, unsigned n, const char *const *names)
{
	struct stagevm_ioc_register r;

	memset(&r, 0, sizeof(r));
	r.num_stages = n;
	for (unsigned i = 0; i < n && i < 16; i++)
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
	 * its size. */
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
	/* A process that exits in the middle of a stage (libstage, attached,
	 * its area mapped, no stage_exit or detach). */
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
	close(fd);
	printf("hostile: %d case(s) failed\n", failed);
	return failed;
}
