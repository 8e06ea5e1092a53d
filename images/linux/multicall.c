/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm-tools: the one static binary of the Linux test image's initramfs
 * (images/linux/build.sh links init.c, staged.c, hostile.c, stagevm-exit.c
 * and stagectl.c into it, each with its main renamed), chosen by the name it
 * is run as, like busybox. One binary instead of five (and no busybox) keeps
 * the initramfs small: the kernel unpacks it with emulated instructions,
 * ~8 s per MB here.
 */
#include <stdio.h>
#include <string.h>

int init_main(void);
int staged_main(int argc, char **argv);
int hostile_main(void);
int stagevm_exit_main(int argc, char **argv);
int stagectl_main(int argc, char **argv);

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
	fprintf(stderr, "stagevm-tools: run as init, staged, hostile, stagevm-exit or stagectl, not '%s'\n",
		name);
	return 2;
}
