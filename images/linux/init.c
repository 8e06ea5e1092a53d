/* SPDX-License-Identifier: Apache-2.0 */
/*
 * /init of the stagevm Linux test image (images/linux/build.sh links it into
 * stagevm-tools, multicall.c). A C program rather than a busybox script: the
 * initramfs then holds no busybox (2 MB the kernel would unpack with emulated
 * instructions, ~8 s per MB here) and no shell forks.
 *
 * Reports each step on the serial console as "stagevm-linux: ... (uptime
 * S s)" lines, read by images/linux/test.py, and ends the VM through
 * stagevm's shutdown port with a status: 0 when every step held.
 *
 * Kernel command line: stagevm.test=boot stops after user space is reached
 * (the boot-time measurement); stagevm.test=exec runs the exec probe
 * (exec_probe); stagevm.test=console a tiny console shell (console_shell);
 * stagevm.test=net only the network step (net_step: the README's walk-through);
 * stagevm.test=mariadb the MariaDB guest's sequence (mariadb.c);
 * otherwise the whole sequence runs: a CRC-32 of /dev/vda, with
 * stagevm.net=ADDR/PREFIX a TCP echo on eth0 (netecho.c), insmod, the
 * hostile sequence, the staged program (static, then off: the harness
 * switches the policy through the API socket), rmmod, the kernel log's
 * oops count.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/klog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "init.h"

#define MODULE_PATH "/lib/stagevm/stagevm_agent.ko"
#define STAGED_ARGS "/lib/stagevm/staged-args"

int stagevm_exit_main(int argc, char **argv);
int staged_main(int argc, char **argv);
int hostile_main(void);
int netecho_main(int argc, char **argv);

static int hostile_entry(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return hostile_main();
}

int status;

void say(const char *fmt, ...)
{
	char up[32] = "?";
	int fd = open("/proc/uptime", O_RDONLY);
	va_list ap;

	if (fd >= 0) {
		ssize_t n = read(fd, up, sizeof(up) - 1);

		up[n > 0 ? n : 0] = 0;
		up[strcspn(up, "\n ")] = 0;
		close(fd);
	}
	printf("stagevm-linux: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (uptime %s s)\n", up);
	fflush(stdout);
}

void fail(const char *what)
{
	say("FAILED: %s", what);
	status = 1;
}

/* The whole kernel log, NUL-terminated, in a static buffer; NULL when it
 * cannot be read. Each call reads it anew (and the caller may cut it up).
 */
static char *read_kernel_log(void)
{
	static char log[1 << 17];
	int n = klogctl(3 /* SYSLOG_ACTION_READ_ALL */, log, sizeof(log) - 1);

	if (n < 0)
		return NULL;
	log[n] = 0;
	return log;
}

/* The kernel log's last line containing `word` (the kernel prints a
 * process's segfault at a level `quiet` keeps off the console), copied into
 * `buf`; "-" when there is none.
 */
static const char *last_kernel_line(const char *word, char *buf, size_t size)
{
	char *log = read_kernel_log();
	const char *found = NULL;

	snprintf(buf, size, "-");
	if (!log)
		return buf;
	for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
		if (strstr(line, word))
			found = line;
	if (found)
		snprintf(buf, size, "%s", found);
	return buf;
}

/* Lines of the kernel log that report an oops, BUG, WARNING or trace. */
int kernel_log_problems(void)
{
	static const char *const pat[] = {
		"Oops", "BUG:", "WARNING:", "general protection", "Call Trace"
	};
	char *log = read_kernel_log();
	int count = 0;

	if (!log)
		return -1;
	for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
		for (size_t i = 0; i < sizeof(pat) / sizeof(pat[0]); i++)
			if (strstr(line, pat[i])) {
				count++;
				break;
			}
	return count;
}

/* Runs NAME with `argv` in a child and waits for it: `entry` called in a
 * forked copy of init when given (the programs are all in this multi-call
 * binary), /bin/NAME executed otherwise. Returns its exit status, 128 +
 * signal when killed, and says which when it is not 0. The test's programs
 * run without an exec: each process start is a chance of the zeroed TLS
 * block this machine's KVM causes (images/linux/README.md).
 */
int run(const char *name, int (*entry)(int, char **), char *const argv[])
{
	char path[64];
	pid_t pid;
	int st, argc = 0;

	while (argv[argc])
		argc++;
	snprintf(path, sizeof(path), "/bin/%s", name);
	pid = fork();
	if (pid == 0) {
		if (entry)
			exit(entry(argc, (char **)argv));
		execv(path, argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		say("%s: could not run it", name);
		return 127;
	}
	if (WIFSIGNALED(st)) {
		char why[256];

		say("%s: killed by signal %d; kernel: %s", name, WTERMSIG(st),
		    last_kernel_line("segfault", why, sizeof(why)));
		return 128 + WTERMSIG(st);
	}
	if (WEXITSTATUS(st))
		say("%s: exit status %d", name, WEXITSTATUS(st));
	return WEXITSTATUS(st);
}

/* CRC-32 (IEEE 802.3, as zlib's crc32) of the whole file, or -1. */
static int64_t crc32_file(const char *path)
{
	static unsigned char buf[65536];
	uint32_t crc = 0xffffffff;
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++) {
			crc ^= buf[i];
			for (int b = 0; b < 8; b++)
				crc = (crc >> 1) ^ (0xedb88320u & -(crc & 1));
		}
	close(fd);
	return n < 0 ? -1 : (int64_t)(crc ^ 0xffffffff);
}

/* The kernel command line's word that is `word` or starts with it (a
 * `key=` prefix), copied into `out` (`size` bytes); 0 when there is none.
 */
int cmdline_word(const char *word, char *out, size_t size)
{
	char line[4096], *tok;
	int fd = open("/proc/cmdline", O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, line, sizeof(line) - 1) : -1;
	size_t len = strlen(word);

	if (fd >= 0)
		close(fd);
	line[n > 0 ? n : 0] = 0;
	for (tok = strtok(line, "\n "); tok; tok = strtok(NULL, "\n "))
		if (!strncmp(tok, word, len) && (word[len - 1] == '=' || tok[len] == 0)) {
			snprintf(out, size, "%s", tok);
			return 1;
		}
	return 0;
}

static int cmdline_has(const char *word)
{
	char tok[256];

	return cmdline_word(word, tok, sizeof(tok));
}

static int netecho_entry(int argc, char **argv)
{
	return netecho_main(argc, argv);
}

/* stagevm.net=ADDR/PREFIX: eth0 gets the address and echoes one TCP
 * connection (netecho.c).
 */
static void net_step(void)
{
	char word[64], *addr, *prefix;

	if (!cmdline_word("stagevm.net=", word, sizeof(word)))
		return;
	addr = word + strlen("stagevm.net=");
	prefix = strchr(addr, '/');
	if (!prefix) {
		fail("stagevm.net= needs ADDR/PREFIX");
		return;
	}
	*prefix++ = 0;
	if (run("netecho", netecho_entry, (char *const[]){ "netecho", addr, prefix, NULL }) != 0)
		fail("netecho");
	else
		say("net done");
}

/* stagevm.test=exec: EXEC_PROBE_WORKERS children of init each run
 * /bin/tlsprobe (multicall.c) again and again for EXEC_PROBE_S seconds;
 * reports how many process starts found their TLS wrong, with a status of
 * 1 when any did. Each start is an exec's burst of page faults and system
 * calls in emulated kernel mode (images/linux/README.md).
 */
#define EXEC_PROBE_S 180
#define EXEC_PROBE_WORKERS 2
static void exec_probe(void)
{
	char *const argv[] = { "tlsprobe", NULL };
	int runs = 0, failed = 0, fds[2];

	if (pipe(fds) < 0) {
		fail("exec probe: pipe");
		return;
	}
	for (int w = 0; w < EXEC_PROBE_WORKERS; w++) {
		if (fork() == 0) {
			struct timespec start, now;
			int counts[2] = { 0, 0 };

			clock_gettime(CLOCK_MONOTONIC, &start);
			do {
				if (run("tlsprobe", NULL, argv) != 0)
					counts[1]++;
				counts[0]++;
				clock_gettime(CLOCK_MONOTONIC, &now);
			} while (now.tv_sec - start.tv_sec < EXEC_PROBE_S);
			_exit(write(fds[1], counts, sizeof(counts)) == sizeof(counts) ? 0 : 1);
		}
	}
	close(fds[1]);
	for (int w = 0; w < EXEC_PROBE_WORKERS; w++) {
		int counts[2];

		if (read(fds[0], counts, sizeof(counts)) == sizeof(counts)) {
			runs += counts[0];
			failed += counts[1];
		} else {
			fail("exec probe: a worker died");
		}
	}
	while (wait(NULL) > 0)
		;
	say("exec probe: %d process starts, %d with a wrong TLS", runs, failed);
	if (failed)
		status = 1;
}

/* stagevm.test=console: a tiny shell on the console (stdin is
 * /dev/console, the 16550 stagevm feeds from --serial pty|socket|tty) for
 * the harness's interactive check: each line typed is answered on its own
 * line; "meminfo" answers with /proc/meminfo's MemTotal, "exit" ends it. The
 * tty is left in its canonical mode: the kernel echoes what is typed and
 * delivers whole lines.
 */
static void console_shell(void)
{
	char line[256];

	say("console ready");
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		if (!strcmp(line, "exit"))
			break;
		if (!strcmp(line, "meminfo")) {
			char buf[4096];
			int fd = open("/proc/meminfo", O_RDONLY);
			ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

			if (fd >= 0)
				close(fd);
			buf[n > 0 ? n : 0] = 0;
			buf[strcspn(buf, "\n")] = 0;
			say("console: %s", buf);
			continue;
		}
		say("console got '%s'", line);
	}
	say("console closed");
}

void shut_down(void)
{
	char code[8];
	char *argv[] = { "stagevm-exit", code, NULL };

	snprintf(code, sizeof(code), "%d", status);
	say("done, exit %d", status);
	/* The console may still hold the last lines: send them before the VM
	 * ends (a write returns once the tty has the bytes, not the UART).
	 */
	tcdrain(1);
	stagevm_exit_main(2, argv);
	/* Not reached under stagevm; PID 1 must not exit. */
	for (;;)
		pause();
}

int init_main(void)
{
	char args[128] = "2 100 100", *staged_argv[8] = { "staged" };
	int fd, argc = 1;
	int64_t crc;

	mount("proc", "/proc", "proc", 0, NULL);
	mount("sysfs", "/sys", "sysfs", 0, NULL);
	mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
	if (fcntl(1, F_GETFD) < 0) {
		fd = open("/dev/console", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
	}
	say("user space reached");
	say("%ld CPUs", sysconf(_SC_NPROCESSORS_ONLN));
	if (cmdline_has("stagevm.test=boot"))
		shut_down();
	if (cmdline_has("stagevm.test=exec")) {
		exec_probe();
		shut_down();
	}
	if (cmdline_has("stagevm.test=console")) {
		console_shell();
		shut_down();
	}
	if (cmdline_has("stagevm.test=mariadb"))
		mariadb_step();
	if (cmdline_has("stagevm.test=net")) {
		net_step();
		shut_down();
	}

	crc = crc32_file("/dev/vda");
	if (crc < 0)
		fail("cannot read /dev/vda");
	else
		say("disk /dev/vda crc32 %08llx", (unsigned long long)crc);
	net_step();

	fd = open(MODULE_PATH, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && syscall(SYS_finit_module, fd, "", 0) == 0)
		say("module loaded");
	else
		fail("insmod stagevm_agent.ko");
	if (fd >= 0)
		close(fd);
	if (access("/dev/stagevm", F_OK) != 0)
		fail("no /dev/stagevm");
	else if (chown("/dev/stagevm", 0, STAGEVM_DEVICE_GID) < 0)
		fail("chgrp /dev/stagevm");
	else {
		struct stat st;

		if (stat("/dev/stagevm", &st) == 0 && (st.st_mode & 07777) == 0660)
			say("/dev/stagevm present (mode 0660, group %u)", (unsigned int)st.st_gid);
		else
			fail("/dev/stagevm is not mode 0660");
	}

	if (run("hostile", hostile_entry, (char *const[]){ "hostile", NULL }) != 0)
		fail("hostile sequence");
	say("hostile done");

	fd = open(STAGED_ARGS, O_RDONLY);
	if (fd >= 0) {
		ssize_t n = read(fd, args, sizeof(args) - 1);

		args[n > 0 ? n : 0] = 0;
		close(fd);
	}
	for (char *tok = strtok(args, "\n "); tok && argc < 7; tok = strtok(NULL, "\n "))
		staged_argv[argc++] = tok;
	staged_argv[argc] = NULL;
	say("staged start");
	if (run("staged", staged_main, staged_argv) != 0)
		fail("staged");
	say("staged done");

	if (syscall(SYS_delete_module, "stagevm_agent", O_NONBLOCK) == 0)
		say("module unloaded");
	else
		fail("rmmod stagevm_agent");
	say("kernel log: %d oops/BUG/WARNING lines", kernel_log_problems());
	shut_down();
	return 0;
}
