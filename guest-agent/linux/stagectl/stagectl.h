/* SPDX-License-Identifier: Apache-2.0 */
/* stagectl's subcommands on stage maps (attach.c); each returns the exit
 * status: 0 done, 1 refused or failed (with a message), 2 bad usage.
 */
#ifndef STAGECTL_H
#define STAGECTL_H

int stagectl_attach(int argc, char **argv);
int stagectl_detach(int argc, char **argv);
int stagectl_probes(int argc, char **argv);

/* A test's hook (images/linux/hostile_agent.c): when set, `stagectl attach`
 * calls it with the binary's path after resolving the symbols and before
 * attaching the probes, where a swap of the path must change nothing. NULL
 * (not called) in stagectl itself.
 */
extern void (*stagectl_attach_hook)(const char *binary);

#endif
