/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hostile_agent: the hostile sequence's cases on the agent's stage maps
 * (issue 36, items 7-10), run by hostile.c after its own cases, as root and
 * with nothing registered. They need a guest kernel with uprobes and uid
 * switching (images/linux/kernel/stagevm.config). Each case prints
 * "hostile: <case>: ok (...)" or "hostile: <case>: FAILED (...)";
 * images/linux/test.py checks them by name.
 *
 *  1. A binary whose ELF resolution used to take seconds to hours (16,384
 *     section headers here, every one SHT_SYMTAB over one 384 KiB table)
 *     is refused by `stagectl attach` within 1 s (timed around stagectl's
 *     work in the child; killed after 10 s).
 *  2. `stagectl attach` through a symlink that is swapped to another file
 *     between resolving the symbols and attaching (stagectl's test hook)
 *     probes the file it resolved: the module's "attached ... on inode"
 *     line names that file's inode.
 *  3. Nobody outside /dev/stagevm's group cannot open it (mode 0660,
 *     issue 50 S8). In the group: with root's map attached, nobody's
 *     UNREGISTER gets -EBUSY and its DETACH_MAP -EPERM, and the map stays
 *     attached; once root detached it, nobody's UNREGISTER of root's
 *     registration gets -EPERM (only its owner or root undoes it), and
 *     root's succeeds.
 *  4. A map whose last symbol cannot be probed (an int3 at its entry: the
 *     kernel will not probe a breakpoint) fails to attach while a thread
 *     runs through its first probe: the thread the probe moved gets its
 *     affinity back and the module holds no thread reference.
 *
 * Files are written to /tmp on the initramfs's root file system.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "init.h"
#include "stagectl.h"
#include "stagevm_ioctl.h"
#include "stagevm_layout.h"

#define ELF_A "/tmp/hostile-a.elf"     /* the binary the maps are for */
#define ELF_B "/tmp/hostile-b.elf"     /* what the swap puts in its place */
#define LINK "/tmp/hostile-bin"        /* the path given to stagectl */
#define LINK_NEW "/tmp/hostile-bin.new"
#define BOMB "/tmp/hostile-bomb.elf"
#define BOMB_ERR "/tmp/hostile-bomb.err" /* stagectl's message about it */
#define MAP3 "/tmp/hostile.map"        /* parse hf0, plan hf1, execute hf2 */
#define MAP_TRAP "/tmp/hostile-trap.map" /* parse hf0..hf14 hftrap */

#define VADDR 0x400000u   /* the PT_LOAD's address of file offset 0 */
#define TEXT_OFF 0x1000u  /* file offset of the functions */
#define FN_BYTES 16u      /* bytes per function */
#define NFN 16u           /* functions in ELF_A and ELF_B: hf0..hf14, hftrap */
#define MAP3_PROBES 3u
/* The bomb's size: the unbounded resolution walked BOMB_SYMS entries per
 * header, 2.7 x 10^8 in all, 2.8 s natively (the 65,535 headers
 * over a larger table took hours); every MiB written costs seconds of
 * emulated kernel mode here (page allocation and clearing).
 */
#define BOMB_SHDRS 16384u /* 1 MiB of Elf64_Shdr */
#define BOMB_SYMS 16384u  /* 384 KiB of Elf64_Sym */
#define NOBODY 65534

static int failed;

static void result(const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(const char *name, int ok, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	printf("hostile: %s: %s (%s)\n", name, ok ? "ok" : "FAILED", why);
	failed += !ok;
}

/* An ioctl's result against the errno wanted (0: success); prints it. */
static int expect_errno(const char *name, int got, int err, int want)
{
	int ok = want ? (got < 0 && err == want) : got >= 0;

	result(name, ok, "%s", got < 0 ? strerror(err) : "succeeded");
	return ok;
}

static int write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	const char *p = buf;

	if (fd < 0)
		return -1;
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n <= 0) {
			close(fd);
			return -1;
		}
		p += n, len -= (size_t)n;
	}
	return close(fd);
}

static void elf_header(Elf64_Ehdr *eh, uint64_t shoff, unsigned int shnum, uint64_t file_size)
{
	Elf64_Phdr *ph = (Elf64_Phdr *)(eh + 1);

	memcpy(eh->e_ident, ELFMAG, SELFMAG);
	eh->e_ident[EI_CLASS] = ELFCLASS64;
	eh->e_ident[EI_DATA] = ELFDATA2LSB;
	eh->e_ident[EI_VERSION] = EV_CURRENT;
	eh->e_type = ET_EXEC;
	eh->e_machine = EM_X86_64;
	eh->e_version = EV_CURRENT;
	eh->e_entry = VADDR + TEXT_OFF;
	eh->e_phoff = sizeof(*eh);
	eh->e_shoff = shoff;
	eh->e_ehsize = sizeof(*eh);
	eh->e_phentsize = sizeof(*ph);
	eh->e_phnum = 1;
	eh->e_shentsize = sizeof(Elf64_Shdr);
	eh->e_shnum = shnum;
	*ph = (Elf64_Phdr){ .p_type = PT_LOAD, .p_flags = PF_R | PF_X, .p_offset = 0, .p_vaddr = VADDR,
			    .p_paddr = VADDR, .p_filesz = file_size, .p_memsz = file_size, .p_align = 0x1000 };
}

/* Writes a small ELF64 file with NFN functions of FN_BYTES at TEXT_OFF
 * (nops and a ret) named in its .symtab hf0, hf1, ... and, last, hftrap,
 * whose first byte is int3. `mark` (in e_ident's padding) makes two such
 * files differ. 0, or -1 with errno.
 */
static int write_elf(const char *path, uint8_t mark)
{
	static uint8_t buf[TEXT_OFF + NFN * FN_BYTES + (NFN + 1) * sizeof(Elf64_Sym) + NFN * 8 + 4 * sizeof(Elf64_Shdr) + 64];
	uint64_t symoff = TEXT_OFF + NFN * FN_BYTES, stroff = symoff + (NFN + 1) * sizeof(Elf64_Sym), shoff;
	Elf64_Sym *sym = (Elf64_Sym *)(buf + symoff);
	char *str = (char *)buf + stroff;
	size_t strsz = 1;
	Elf64_Shdr *sh;

	memset(buf, 0, sizeof(buf));
	for (unsigned int i = 0; i < NFN; i++) {
		uint8_t *fn = buf + TEXT_OFF + i * FN_BYTES;

		memset(fn, 0x90, FN_BYTES - 1); /* nop */
		fn[FN_BYTES - 1] = 0xc3;        /* ret */
		if (i == NFN - 1)
			fn[0] = 0xcc;           /* int3 */
		sym[i + 1] = (Elf64_Sym){ .st_name = (uint32_t)strsz, .st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC),
					  .st_shndx = 1, .st_value = VADDR + TEXT_OFF + i * FN_BYTES,
					  .st_size = FN_BYTES };
		if (i == NFN - 1)
			strsz += (size_t)sprintf(str + strsz, "hftrap") + 1;
		else
			strsz += (size_t)sprintf(str + strsz, "hf%u", i) + 1;
	}
	shoff = (stroff + strsz + 7) & ~7ull;
	sh = (Elf64_Shdr *)(buf + shoff);
	sh[1] = (Elf64_Shdr){ .sh_type = SHT_PROGBITS, .sh_flags = SHF_ALLOC | SHF_EXECINSTR,
			      .sh_addr = VADDR + TEXT_OFF, .sh_offset = TEXT_OFF, .sh_size = NFN * FN_BYTES };
	sh[2] = (Elf64_Shdr){ .sh_type = SHT_SYMTAB, .sh_offset = symoff, .sh_size = (NFN + 1) * sizeof(Elf64_Sym),
			      .sh_link = 3, .sh_info = 1, .sh_entsize = sizeof(Elf64_Sym), .sh_addralign = 8 };
	sh[3] = (Elf64_Shdr){ .sh_type = SHT_STRTAB, .sh_offset = stroff, .sh_size = strsz };
	elf_header((Elf64_Ehdr *)buf, shoff, 4, shoff + 4 * sizeof(*sh));
	buf[EI_PAD] = mark;
	return write_file(path, buf, shoff + 4 * sizeof(*sh));
}

/* Writes the resolution bomb: BOMB_SHDRS section headers, every one
 * SHT_SYMTAB over the same table of BOMB_SYMS defined functions (each named
 * by the table's first bytes: ""), the table its own string table. The
 * unbounded resolution walked the whole table once per header. Written
 * through a shared mapping (no second copy in emulated kernel mode). 0, or
 * -1 with errno.
 */
static int write_bomb(void)
{
	uint64_t symoff = 4096, shoff = symoff + (uint64_t)BOMB_SYMS * sizeof(Elf64_Sym);
	size_t size = shoff + (size_t)BOMB_SHDRS * sizeof(Elf64_Shdr);
	int fd = open(BOMB, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	uint8_t *buf;
	Elf64_Sym *sym;
	Elf64_Shdr *sh;

	if (fd < 0)
		return -1;
	buf = ftruncate(fd, (off_t)size) < 0 ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (buf == MAP_FAILED)
		return -1;
	sym = (Elf64_Sym *)(buf + symoff);
	for (unsigned int i = 0; i < BOMB_SYMS; i++)
		sym[i] = (Elf64_Sym){ .st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC), .st_shndx = 1,
				      .st_value = VADDR + symoff };
	sh = (Elf64_Shdr *)(buf + shoff);
	for (unsigned int i = 0; i < BOMB_SHDRS; i++)
		sh[i] = (Elf64_Shdr){ .sh_type = SHT_SYMTAB, .sh_offset = symoff,
				      .sh_size = (uint64_t)BOMB_SYMS * sizeof(Elf64_Sym), .sh_link = 0,
				      .sh_entsize = sizeof(Elf64_Sym) };
	elf_header((Elf64_Ehdr *)buf, shoff, BOMB_SHDRS, size);
	return munmap(buf, size);
}

/* Prints the first 1 KiB of the file at `path` and removes it. */
static void print_file(const char *path)
{
	char buf[1024];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = 0;
	printf("%s", buf);
	unlink(path);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs `stagectl attach --binary BINARY --map MAP` here; its exit status. */
static int attach(const char *binary, const char *map)
{
	char *argv[] = { "attach", "--binary", (char *)binary, "--map", (char *)map, NULL };

	return stagectl_attach(5, argv);
}

/* Case 1 (item 10): stagectl refuses the bomb within 1 s, timed in the
 * child around stagectl's own work (a fork and an exit cost up to seconds
 * of emulated kernel mode here); the child is killed after 10 s.
 */
static void bomb_case(void)
{
	const char *name = "a binary with 16384 SHT_SYMTAB headers over one table is refused within 1 s";
	double t0 = now_s(), dt = -1;
	int st = 0, done = 0, fds[2];
	pid_t child;

	if (write_bomb() < 0 || pipe(fds) < 0) {
		result(name, 0, "writing %s: %s", BOMB, strerror(errno));
		return;
	}
	printf("hostile: note: wrote %s (%u section headers) in %.1f s\n", BOMB, BOMB_SHDRS, now_s() - t0);
	t0 = now_s();
	child = fork();
	if (child == 0) {
		/* The message to a file, printed by the parent: the console's
		 * emulated output is no part of stagectl's time.
		 */
		int efd = open(BOMB_ERR, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		double t;
		int rc;

		if (efd >= 0)
			dup2(efd, 2);
		t = now_s();
		rc = attach(BOMB, MAP3);

		t = now_s() - t;
		fflush(stdout);
		_exit(write(fds[1], &t, sizeof(t)) == sizeof(t) ? rc : 99);
	}
	close(fds[1]);
	while (child > 0 && !(done = waitpid(child, &st, WNOHANG) == child) && now_s() - t0 < 10)
		usleep(10000);
	unlink(BOMB);
	if (child > 0 && !done) {
		kill(child, SIGKILL);
		waitpid(child, &st, 0);
		close(fds[0]);
		result(name, 0, "still resolving after %.1f s, killed", now_s() - t0);
		return;
	}
	if (read(fds[0], &dt, sizeof(dt)) != sizeof(dt))
		dt = -1;
	close(fds[0]);
	print_file(BOMB_ERR);
	result(name, done && WIFEXITED(st) && WEXITSTATUS(st) == 1 && dt >= 0 && dt < 1.0,
	       "exit %d after %.3f s of stagectl attach (%.1f s with its fork and exit)",
	       done && WIFEXITED(st) ? WEXITSTATUS(st) : -1, dt, now_s() - t0);
}

/* The inode in the kernel log's last "stage map attached" line, or 0. */
static unsigned long attached_inode(void)
{
	static char log[1 << 17];
	const char *key = "stage map attached: ", *p, *last = NULL;
	int n = klogctl(3 /* SYSLOG_ACTION_READ_ALL */, log, sizeof(log) - 1);
	unsigned long ino = 0;

	if (n < 0)
		return 0;
	log[n] = 0;
	for (p = strstr(log, key); p; p = strstr(p + 1, key))
		last = p;
	if (last) {
		p = strstr(last, " on inode ");
		if (p)
			ino = strtoul(p + strlen(" on inode "), NULL, 10);
	}
	return ino;
}

static void swap_link(const char *binary)
{
	/* The attacker's move: the path now names another file. */
	unlink(LINK_NEW);
	if (symlink(ELF_B, LINK_NEW) == 0)
		rename(LINK_NEW, binary);
}

/* Case 2 (item 8): root attaches MAP3 through LINK, swapped from ELF_A to
 * ELF_B between resolving and attaching. Leaves root's map attached.
 */
static void swap_case(void)
{
	const char *name = "attach probes the file it resolved though the path is swapped in between";
	struct stat a, b;
	char target[64] = "";
	unsigned long ino;
	pid_t child;
	int st = -1;

	unlink(LINK);
	if (symlink(ELF_A, LINK) < 0 || stat(ELF_A, &a) < 0 || stat(ELF_B, &b) < 0) {
		result(name, 0, "setting up %s: %s", LINK, strerror(errno));
		return;
	}
	child = fork();
	if (child == 0) {
		int rc;

		stagectl_attach_hook = swap_link;
		rc = attach(LINK, MAP3);
		fflush(stdout);
		_exit(rc);
	}
	if (child < 0 || waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st)) {
		result(name, 0, "stagectl attach did not attach (status %#x)", st);
		return;
	}
	if (readlink(LINK, target, sizeof(target) - 1) < 0 || strcmp(target, ELF_B)) {
		result(name, 0, "the swap did not happen (%s -> '%s')", LINK, target);
		return;
	}
	ino = attached_inode();
	result(name, ino == a.st_ino, "resolved %s, inode %lu; the module attached on inode %lu%s", ELF_A,
	       (unsigned long)a.st_ino, ino, ino == b.st_ino ? ", the swapped-in file's" : "");
}

/* In a child as nobody, in /dev/stagevm's group when `unreg_case` is
 * given: UNREGISTER and DETACH_MAP against `want_unreg` and `want_detach`
 * (errnos; -1: not tried); else outside it, where opening the device must
 * fail with EACCES. The cases that failed.
 */
static int as_nobody(const char *unreg_case, int want_unreg, const char *detach_case, int want_detach)
{
	pid_t child = fork();
	int st;

	if (child == 0) {
		gid_t group = STAGEVM_DEVICE_GID;
		int fd, r, bad = 0;

		if (setgroups(unreg_case ? 1 : 0, &group) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0) {
			printf("hostile: becoming nobody (uid %d): FAILED (%s)\n", NOBODY, strerror(errno));
			_exit(1);
		}
		fd = open(STAGEVM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
		if (!unreg_case) {
			bad += !expect_errno("nobody outside the device's group cannot open " STAGEVM_DEVICE_PATH, fd,
					     errno, EACCES);
			fflush(stdout);
			_exit(bad);
		}
		if (fd < 0) {
			printf("hostile: nobody opening %s: FAILED (%s)\n", STAGEVM_DEVICE_PATH, strerror(errno));
			_exit(1);
		}
		r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
		bad += !expect_errno(unreg_case, r, errno, want_unreg);
		if (detach_case) {
			r = ioctl(fd, STAGEVM_IOC_DETACH_MAP, 0);
			bad += !expect_errno(detach_case, r, errno, want_detach);
		}
		fflush(stdout);
		_exit(bad);
	}
	if (child < 0 || waitpid(child, &st, 0) != child || !WIFEXITED(st)) {
		printf("hostile: running a process as nobody: FAILED\n");
		return 1;
	}
	return WEXITSTATUS(st);
}

/* Case 3 (item 7, issue 50 S8): nobody outside the device's group, then
 * nobody in it against root's attached map; root detaches, nobody cannot
 * unregister root's stages, root does (nothing is registered afterwards).
 */
static void privilege_case(int fd)
{
	struct stagevm_ioc_probe_stats ps;
	char *probes[] = { "probes", NULL }, *detach[] = { "detach", NULL };
	int r;

	failed += as_nobody(NULL, 0, NULL, 0);
	failed += as_nobody("nobody's UNREGISTER while root's map is attached", EBUSY,
			    "nobody's DETACH_MAP of root's map", EPERM);
	r = ioctl(fd, STAGEVM_IOC_PROBE_STATS, &ps);
	result("root's map stays attached after nobody's attempts", r == 0 && ps.attached == MAP3_PROBES,
	       "%u probes attached", r == 0 ? ps.attached : 0);
	stagectl_probes(1, probes);
	r = stagectl_detach(1, detach);
	result("root detaches its map (stagectl detach)", r == 0, "exit %d", r);
	failed += as_nobody("nobody's UNREGISTER of root's registration", EPERM, NULL, 0);
	r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
	expect_errno("root unregisters its own registration", r, errno, 0);
}

static volatile int spin_stop, spin_started;
static volatile pid_t spin_tid;

static void *spin(void *fn)
{
	spin_tid = gettid();
	spin_started = 1;
	while (!spin_stop)
		((void (*)(void))fn)();
	return NULL;
}

/* Waits (at most 3 s) until the host's stage map gives stage 0 some of the
 * CPUs in `all` but not all of them: a probe hit then moves a thread.
 */
static int stage0_restricted(int fd, uint64_t all, uint64_t *got)
{
	const uint8_t *ro = mmap(NULL, STAGEVM_PAGE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	const struct stagevm_stage_map *m;
	int ok = 0;

	*got = 0;
	if (ro == MAP_FAILED)
		return 0;
	m = (const void *)(ro + STAGEVM_STAGE_MAP_OFFSET);
	for (int i = 0; i < 150 && !ok; i++) {
		*got = __atomic_load_n(&m->vcpus[0], __ATOMIC_ACQUIRE) & all;
		ok = *got && *got != all;
		if (!ok)
			usleep(20000);
	}
	munmap((void *)ro, STAGEVM_PAGE_SIZE);
	return ok;
}

static uint64_t mask_bits(const cpu_set_t *s)
{
	uint64_t b = 0;

	for (int c = 0; c < 64; c++)
		if (CPU_ISSET(c, s))
			b |= 1ull << c;
	return b;
}

/* Case 4 (item 9): MAP_TRAP fails at its last probe while a thread runs
 * through its first. Registers parse, plan, execute and unregisters.
 */
static void unwind_case(int fd)
{
	static const char *const names[] = { "parse", "plan", "execute" };
	const char *aff_case = "a failed attach gives the thread its probes moved its affinity back";
	const char *ref_case = "a failed attach leaves no thread reference in the module";
	struct stagevm_ioc_register reg = { .num_stages = 3 };
	struct stagevm_ioc_probe_stats ps = { 0 };
	cpu_set_t orig, after;
	uint64_t all, map0;
	pthread_t t;
	void *text;
	int afd, rc = 0, tries = 0, r;

	for (unsigned int i = 0; i < 3; i++)
		strncpy(reg.names[i], names[i], sizeof(reg.names[i]));
	r = ioctl(fd, STAGEVM_IOC_REGISTER, &reg);
	if (!expect_errno("REGISTER of parse, plan, execute for the unwind case", r, errno, 0))
		return;
	sched_getaffinity(0, sizeof(orig), &orig);
	all = mask_bits(&orig);
	if (!stage0_restricted(fd, all, &map0)) {
		result(aff_case, 0, "the host's map never gave parse part of the CPUs %#llx (got %#llx)",
		       (unsigned long long)all, (unsigned long long)map0);
		goto out;
	}
	/* The binary mapped for execution: uprobe_register installs each
	 * probe into this mapping at once, and refuses the int3.
	 */
	afd = open(ELF_A, O_RDONLY | O_CLOEXEC);
	text = afd < 0 ? MAP_FAILED : mmap(NULL, TEXT_OFF + NFN * FN_BYTES, PROT_READ | PROT_EXEC, MAP_PRIVATE, afd, 0);
	if (afd >= 0)
		close(afd);
	if (text == MAP_FAILED || pthread_create(&t, NULL, spin, (char *)text + TEXT_OFF)) {
		result(aff_case, 0, "mapping %s and starting a thread in it: %s", ELF_A, strerror(errno));
		goto out;
	}
	while (!spin_started)
		usleep(1000);
	/* A try is conclusive when a probe was hit in the window between the
	 * first probe's registration and the last one's refusal.
	 */
	do {
		rc = attach(ELF_A, MAP_TRAP);
		r = ioctl(fd, STAGEVM_IOC_PROBE_STATS, &ps);
	} while (rc != 0 && r == 0 && ps.hits[0] == 0 && ++tries < 3);
	CPU_ZERO(&after);
	sched_getaffinity(spin_tid, sizeof(after), &after);
	result(aff_case, rc == 1 && r == 0 && ps.hits[0] > 0 && CPU_EQUAL(&orig, &after),
	       "attach exit %d after %u hits of its first probes (tries %d); affinity %#llx, was %#llx; the map gave %#llx",
	       rc, r == 0 ? (unsigned int)ps.hits[0] : 0, tries + 1, (unsigned long long)mask_bits(&after),
	       (unsigned long long)all, (unsigned long long)map0);
	result(ref_case, r == 0 && ps.attached == 0 && ps.threads_held == 0,
	       "%llu thread references held, %u probes attached", r == 0 ? (unsigned long long)ps.threads_held : 0,
	       r == 0 ? ps.attached : 0);
	spin_stop = 1;
	pthread_join(t, NULL);
	munmap(text, TEXT_OFF + NFN * FN_BYTES);
out:
	r = ioctl(fd, STAGEVM_IOC_UNREGISTER, 0);
	expect_errno("UNREGISTER after the unwind case", r, errno, 0);
}

/* The map files: MAP3 (one symbol per stage) and MAP_TRAP (every
 * function in stage parse, the int3 last). 0 or -1.
 */
static int write_maps(void)
{
	char trap[512] = "stagemap 1\nstage parse";
	static const char map3[] = "stagemap 1\nstage parse hf0\nstage plan hf1\nstage execute hf2\n";
	size_t len = strlen(trap);

	for (unsigned int i = 0; i + 1 < NFN; i++)
		len += (size_t)snprintf(trap + len, sizeof(trap) - len, " hf%u", i);
	snprintf(trap + len, sizeof(trap) - len, " hftrap\n");
	return write_file(MAP3, map3, strlen(map3)) || write_file(MAP_TRAP, trap, strlen(trap)) ? -1 : 0;
}

/* Runs the cases on `fd` (/dev/stagevm, nothing registered); the number
 * that failed.
 */
int hostile_agent(int fd)
{
	failed = 0;
	mkdir("/tmp", 01777);
	if (write_elf(ELF_A, 'a') < 0 || write_elf(ELF_B, 'b') < 0 || write_maps() < 0) {
		result("writing the test binaries and maps to /tmp", 0, "%s", strerror(errno));
		return failed;
	}
	bomb_case();
	swap_case();
	privilege_case(fd);
	unwind_case(fd);
	return failed;
}
