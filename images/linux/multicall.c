/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm-tools: the one static binary of the Linux test image's initramfs
 * (images/linux/build.sh links init.c, staged.c, hostile.c, stagevm-exit.c
 * and stagectl.c into it, each with its main renamed), chosen by the name it
 * is run as, like busybox. One binary instead of five (and no busybox) keeps
 * the initramfs small: the kernel unpacks it with emulated instructions,
 * ~8 s per MB here.
 */
#define _GNU_SOURCE
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int init_main(void);
int staged_main(int argc, char **argv);
int hostile_main(void);
int stagevm_exit_main(int argc, char **argv);
int stagectl_main(int argc, char **argv);

/* tlsprobe (init's `stagevm.test=exec` loop, images/linux/README.md): exits
 * 0 when the C library's static TLS block holds its initial values (its
 * locale pointer, copied from the binary's .tdata at startup, is not NULL)
 * and strtoul works; 3 when the pointer is NULL, 4 when strtoul fails.
 */
static int tlsprobe_main(void)
{
	if (uselocale((locale_t)0) == (locale_t)0)
		return 3;
	return strtoul("12", NULL, 10) == 12 ? 0 : 4;
}

int main(int argc, char **argv)
{
	const char *name = strrchr(argv[0], '/');

	name = name ? name + 1 : argv[0];
	if (!strcmp(name, "init"))
		return init_main();
	if (!strcmp(name, "staged"))
		return staged_main(argc, argv);
	if (!strcmp(name, "hostile"))
		return hostile_main();
	if (!strcmp(name, "stagevm-exit"))
		return stagevm_exit_main(argc, argv);
	if (!strcmp(name, "stagectl"))
		return stagectl_main(argc, argv);
	if (!strcmp(name, "tlsprobe"))
		return tlsprobe_main();
	fprintf(stderr, "stagevm-tools: run as init, staged, hostile, stagevm-exit, stagectl or tlsprobe, not '%s'\n",
		name);
	return 2;
}
