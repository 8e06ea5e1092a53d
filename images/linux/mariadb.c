/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm.test=mariadb: /init's sequence in the MariaDB guest image
 * (images/linux/mariadb/README.md, `just mariadb-image`).
 *
 * Mounts the root disk (/dev/vda, ext4: Debian's mariadb-server-core and
 * its libraries, a data directory initialised on the host) at /mnt, gives
 * eth0 the address of stagevm.net=ADDR/PREFIX, starts /usr/sbin/mariadbd
 * chrooted there and waits until it accepts connections on its socket,
 * printing where the time went ("mariadb: ready after S s"). Then it loads
 * the agent module and serves the harness's commands on the console, one a
 * line, each answered by a "stagevm-linux: mariadb: ..." line ending in
 * "-> N" (the command's exit status):
 *
 *   stagectl ARGS...   runs stagectl (e.g. `stagectl attach --binary
 *                      /mnt/usr/sbin/mariadbd --map /mnt/etc/mysql/stages.map`)
 *   rmmod              unloads the agent module
 *   alive              whether mariadbd still runs (0) or not (1), with its
 *                      page faults and CPU time so far
 *   exit               stops mariadbd (SIGTERM, then waits), counts the
 *                      kernel log's oops/BUG/WARNING lines, ends the VM
 *   gatectl ARGS...    (preload path) runs stagevm-gatectl on mariadbd's
 *                      control page (e.g. `gatectl show --json`)
 *
 * With stagevm.mariadb=preload on the kernel command line mariadbd is staged
 * through the preload library instead of uprobes: the module is loaded
 * first, the library and stagevm-gatectl (in the initramfs under
 * PRELOAD_SRC, mariadb/build.sh) are copied to the chroot's /run, and
 * mariadbd starts with LD_PRELOAD and STAGEVM_STAGEMAP set: its own stage
 * points report through the stage channel and the VMM's map sets its gate
 * (guest-agent/preload/README.md).
 *
 * No shell, no busybox: each fork and exec is emulated kernel work here.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "init.h"

#define ROOT "/mnt"
#define MODULE_PATH "/lib/stagevm/stagevm_agent.ko"
#define MARIADBD "/usr/sbin/mariadbd"
/* The bound: a server that is not up 10 minutes after boot is a
 * finding (where the time goes), not something to wait for longer.
 */
#define READY_WAIT_S 600
/* The preload path: where the initramfs holds the files, where the chroot
 * sees them (/run is a tmpfs), and the gate's wait bound in the guest (a
 * futex hand-off is emulated kernel work here, ~1 ms).
 */
#define PRELOAD_SRC "/lib/stagevm/preload"
#define PRELOAD_DIR "/run/stagevm"
#define PRELOAD_MAX_WAIT_US "50000"
/* glibc's string functions without AVX (see start_server). */
#define GLIBC_NO_AVX                                                                               \
	"glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-FMA,-FMA4," \
	"-AVX_Fast_Unaligned_Load"

int stagectl_main(int argc, char **argv);

static pid_t server;
/* stagevm.mariadb=preload: the preload path. */
static int preload;

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The root disk and the file systems mariadbd expects under it. */
static int mount_root(void)
{
	if (mount("/dev/vda", ROOT, "ext4", MS_NOATIME, NULL) < 0) {
		say("mariadb: mount /dev/vda on " ROOT ": %s", strerror(errno));
		return -1;
	}
	if (mount("proc", ROOT "/proc", "proc", 0, NULL) < 0 ||
	    mount("devtmpfs", ROOT "/dev", "devtmpfs", 0, NULL) < 0 ||
	    mount("tmpfs", ROOT "/run", "tmpfs", 0, "mode=755") < 0 ||
	    mount("tmpfs", ROOT "/tmp", "tmpfs", 0, "mode=1777") < 0) {
		say("mariadb: mounting proc, dev, run, tmp under " ROOT ": %s", strerror(errno));
		return -1;
	}
	mkdir(ROOT "/run/mysqld", 0755);
	return 0;
}

/* Brings the loopback interface up (the kernel leaves it down). */
static int loopback_up(void)
{
	struct ifreq ifr = { .ifr_name = "lo" };
	int fd = socket(AF_INET, SOCK_DGRAM, 0), ok;

	ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 &&
	     (ifr.ifr_flags |= IFF_UP | IFF_RUNNING, ioctl(fd, SIOCSIFFLAGS, &ifr) == 0);
	if (fd >= 0)
		close(fd);
	if (!ok)
		say("mariadb: bringing lo up: %s", strerror(errno));
	return ok ? 0 : -1;
}

/* Whether mariadbd accepts a connection on its local socket now. */
static int accepts(void)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX, .sun_path = ROOT "/run/mysqld/mysqld.sock" };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0), ok;

	ok = fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Where a process's time went, from /proc/PID/stat: page faults (minor,
 * major) and user and system CPU seconds (system: emulated kernel mode here).
 */
static void say_costs(pid_t pid, const char *when)
{
	char path[64], buf[1024], *p;
	unsigned long minflt = 0, majflt = 0, utime = 0, stime = 0;
	int fd, n;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY);
	n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return;
	buf[n] = 0;
	p = strrchr(buf, ')'); /* after the command name, which may hold spaces */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %lu %*u %lu %*u %lu %lu", &minflt, &majflt,
			 &utime, &stime) != 4)
		return;
	say("mariadb: mariadbd %s: %lu minor and %lu major page faults, %.2f s user, %.2f s system CPU", when,
	    minflt, majflt, utime / (double)sysconf(_SC_CLK_TCK), stime / (double)sysconf(_SC_CLK_TCK));
}

/* stagevm.net=ADDR/PREFIX on eth0; 0 when absent (local clients only). */
static int network(void)
{
	char word[64], *addr, *prefix;
	struct in_addr a;

	if (loopback_up() < 0)
		return -1;
	if (!cmdline_word("stagevm.net=", word, sizeof(word)))
		return 0;
	addr = word + strlen("stagevm.net=");
	prefix = strchr(addr, '/');
	if (prefix)
		*prefix++ = 0;
	if (!prefix || inet_pton(AF_INET, addr, &a) != 1) {
		say("mariadb: stagevm.net= needs ADDR/PREFIX, got '%s'", word);
		return -1;
	}
	if (eth0_up(a.s_addr, strtol(prefix, NULL, 10)) != 0)
		return -1;
	say("mariadb: eth0 %s/%s up", addr, prefix);
	return 0;
}

/* Copies `from` to `to` with `mode`; 0, or -1 (said). */
static int copy_file(const char *from, const char *to, mode_t mode)
{
	static char buf[65536];
	int in = open(from, O_RDONLY | O_CLOEXEC);
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	ssize_t n = 0;

	while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, n) != n) {
			n = -1;
			break;
		}
	if (in < 0 || out < 0 || n < 0)
		say("mariadb: copying %s to %s: %s", from, to, strerror(errno));
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return in < 0 || out < 0 || n < 0 ? -1 : 0;
}

/* The preload library and stagevm-gatectl, where the chroot sees them. */
static int install_preload(void)
{
	mkdir(ROOT PRELOAD_DIR, 0755);
	if (copy_file(PRELOAD_SRC "/libstagevm_preload.so", ROOT PRELOAD_DIR "/libstagevm_preload.so", 0644) < 0 ||
	    copy_file(PRELOAD_SRC "/stagevm-gatectl", ROOT PRELOAD_DIR "/stagevm-gatectl", 0755) < 0)
		return -1;
	say("mariadb: preload library installed in " PRELOAD_DIR);
	return 0;
}

/* Starts mariadbd chrooted at ROOT and waits until it accepts connections;
 * 0, or -1 when it exited or was not ready within READY_WAIT_S.
 */
static int start_server(void)
{
	double t0 = now_s();
	int st;

	server = fork();
	if (server == 0) {
		if (chroot(ROOT) < 0 || chdir("/") < 0)
			_exit(126);
		/* The guest kernel runs `noxsave` (xsave stops this machine's
		 * emulator: ../README.md), so a context switch keeps only the
		 * x87/SSE state, while user code runs natively and CPUID offers
		 * it AVX and AVX-512: a thread preempted inside an AVX string
		 * function can resume with another thread's upper register
		 * halves. glibc is told not to use them (mariadbd's own
		 * AVX-512 CRC-32 is not configurable).
		 */
		if (setenv("GLIBC_TUNABLES", GLIBC_NO_AVX, 1) < 0)
			_exit(126);
		if (preload && (setenv("LD_PRELOAD", PRELOAD_DIR "/libstagevm_preload.so", 1) < 0 ||
				setenv("STAGEVM_STAGEMAP", "/etc/mysql/stages.map", 1) < 0 ||
				setenv("STAGEVM_CONTROL", PRELOAD_DIR "/gate", 1) < 0 ||
				setenv("STAGEVM_MAX_WAIT_US", PRELOAD_MAX_WAIT_US, 1) < 0))
			_exit(126);
		execl(MARIADBD, "mariadbd", "--defaults-file=/etc/mysql/my.cnf", (char *)NULL);
		_exit(127);
	}
	if (server < 0) {
		say("mariadb: fork: %s", strerror(errno));
		return -1;
	}
	say("mariadb: mariadbd started (pid %d)", server);
	while (now_s() - t0 < READY_WAIT_S) {
		if (waitpid(server, &st, WNOHANG) == server) {
			say("mariadb: mariadbd ended before it was ready (%s %d)",
			    WIFSIGNALED(st) ? "signal" : "exit status",
			    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
			server = 0;
			return -1;
		}
		if (accepts()) {
			say("mariadb: ready after %.1f s", now_s() - t0);
			say_costs(server, "at ready");
			return 0;
		}
		sleep(1);
	}
	say("mariadb: not ready after %d s", READY_WAIT_S);
	return -1;
}

static int alive(void)
{
	return server > 0 && waitpid(server, NULL, WNOHANG) == 0;
}

static void stop_server(void)
{
	double t0 = now_s();
	int st;

	if (!alive())
		return;
	kill(server, SIGTERM);
	while (now_s() - t0 < 300) {
		if (waitpid(server, &st, WNOHANG) == server) {
			say("mariadb: mariadbd stopped in %.1f s (exit status %d)", now_s() - t0,
			    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			return;
		}
		usleep(200000);
	}
	kill(server, SIGKILL);
	fail("mariadbd did not stop within 300 s of SIGTERM");
}

static int load_module(void)
{
	int fd = open(MODULE_PATH, O_RDONLY | O_CLOEXEC), ok;

	ok = fd >= 0 && syscall(SYS_finit_module, fd, "", 0) == 0;
	if (fd >= 0)
		close(fd);
	return ok ? 0 : -1;
}

/* `gatectl ARGS...`: stagevm-gatectl on mariadbd's control page, chrooted
 * at ROOT; its exit status.
 */
static int gatectl(char **argv)
{
	char *args[20] = { "stagevm-gatectl", "--control", PRELOAD_DIR "/gate" };
	int n = 3, st;
	pid_t pid;

	for (int i = 1; argv[i] && n < 19; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	pid = fork();
	if (pid == 0) {
		if (chroot(ROOT) < 0 || chdir("/") < 0)
			_exit(126);
		execv(PRELOAD_DIR "/stagevm-gatectl", args);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 127;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One console command; its exit status. */
static int command(char *line)
{
	char *argv[16];
	int argc = 0;

	for (char *tok = strtok(line, " "); tok && argc < 15; tok = strtok(NULL, " "))
		argv[argc++] = tok;
	argv[argc] = NULL;
	if (argc == 0)
		return 0;
	if (!strcmp(argv[0], "stagectl"))
		return run("stagectl", stagectl_main, argv);
	if (!strcmp(argv[0], "rmmod"))
		return syscall(SYS_delete_module, "stagevm_agent", O_NONBLOCK) == 0 ? 0 : errno;
	if (!strcmp(argv[0], "gatectl"))
		return gatectl(argv);
	if (!strcmp(argv[0], "alive")) {
		if (alive())
			say_costs(server, "now");
		return alive() ? 0 : 1;
	}
	say("mariadb: unknown command '%s' (stagectl ARGS, gatectl ARGS, rmmod, alive, exit)", argv[0]);
	return 2;
}

void mariadb_step(void)
{
	char line[512];

	signal(SIGPIPE, SIG_IGN);
	preload = cmdline_word("stagevm.mariadb=preload", line, sizeof(line));
	if (mount_root() < 0 || network() < 0) {
		fail("mariadb start-up");
		shut_down();
	}
	/* The preload path: the library opens /dev/stagevm at mariadbd's start. */
	if (preload && (install_preload() < 0 || load_module() < 0)) {
		fail("the preload path (library, insmod stagevm_agent.ko)");
		shut_down();
	}
	if (preload)
		say("mariadb: module loaded; mariadbd starts with the preload library");
	if (start_server() < 0) {
		fail("mariadb start-up");
		stop_server();
		shut_down();
	}
	if (!preload) {
		if (load_module() == 0)
			say("mariadb: module loaded");
		else
			fail("insmod stagevm_agent.ko");
	}
	say("mariadb: commands");
	while (fgets(line, sizeof(line), stdin)) {
		char echo[512];
		int rc;

		line[strcspn(line, "\r\n")] = 0;
		if (!strcmp(line, "exit"))
			break;
		snprintf(echo, sizeof(echo), "%s", line);
		rc = command(line);
		say("mariadb: %s -> %d", echo, rc);
	}
	stop_server();
	say("kernel log: %d oops/BUG/WARNING lines", kernel_log_problems());
	shut_down();
}
