/* SPDX-License-Identifier: Apache-2.0 */
/* What init.c shares with the other steps of /init (mariadb.c). */
#ifndef STAGEVM_LINUX_INIT_H
#define STAGEVM_LINUX_INIT_H

#include <stddef.h>

/* The group of /dev/stagevm in the test image: init sets it after loading
 * the agent, as the agent package's udev rule sets the `stagevm` group
 * (packaging/udev/60-stagevm.rules); the node is mode 0660.
 */
#define STAGEVM_DEVICE_GID 990

/* The exit status init ends the VM with: 0 while every step held. */
extern int status;
/* "stagevm-linux: MESSAGE (uptime S s)" on the console. */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* says "FAILED: what" and sets `status` to 1. */
void fail(const char *what);
/* Runs NAME (a multi-call entry in a fork when `entry`, else /bin/NAME) and
 * waits: its exit status, 128 + signal when killed.
 */
int run(const char *name, int (*entry)(int, char **), char *const argv[]);
/* The kernel command line's word equal to `word` or starting with it (a
 * `key=` prefix) in `out`; 0 when there is none.
 */
int cmdline_word(const char *word, char *out, size_t size);
/* Kernel log lines reporting an oops, BUG, WARNING or trace; -1 unreadable. */
int kernel_log_problems(void);
/* Ends the VM through stagevm's shutdown port with `status`. */
__attribute__((noreturn)) void shut_down(void);
/* eth0 up with `addr` (network order) / `prefix` (netecho.c); 0 or 1. */
int eth0_up(unsigned int addr, long prefix);

/* stagevm.test=mariadb: mariadbd from the root disk, then the harness's
 * commands (mariadb.c); ends the VM.
 */
__attribute__((noreturn)) void mariadb_step(void);

#endif
