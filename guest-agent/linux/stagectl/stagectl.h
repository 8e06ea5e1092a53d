/* SPDX-License-Identifier: Apache-2.0 */
/* stagectl's subcommands on stage maps (attach.c); each returns the exit
 * status: 0 done, 1 refused or failed (with a message), 2 bad usage. */
#ifndef STAGECTL_H
#define STAGECTL_H

int stagectl_attach(int argc, char **argv);
int stagectl_detach(int argc, char **argv);
int stagectl_probes(int argc, char **argv);

#endif
