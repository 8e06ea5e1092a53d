/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm-tools: one static binary for the guest programs of the Linux test
 * image (images/linux/build.sh links staged.c, hostile.c, stagevm-exit.c and
 * stagectl.c into it, each with its main renamed), chosen by the name it is
 * run as, like busybox. One binary instead of four keeps the initramfs small:
 * the kernel unpacks it with emulated instructions, ~12 s per MB here.
 */
#include <stdio.h>
#include <string.h>

int staged_main(int argc, char **argv);
int hostile_main(void);
int stagevm_exit_main(int argc, char **argv);
int stagectl_main(int argc, char **argv);

int main(int argc, char **argv)
{
	const char *name = strrchr(argv[0], '/');

	name = name ? name + 1 : argv[0];
	if (!strcmp(name, "staged"))
		return staged_main(argc, argv);
	if (!strcmp(name, "hostile"))
		return hostile_main();
	if (!strcmp(name, "stagevm-exit"))
		return stagevm_exit_main(argc, argv);
	if (!strcmp(name, "stagectl"))
		return stagectl_main(argc, argv);
	fprintf(stderr, "stagevm-tools: run as staged, hostile, stagevm-exit or stagectl, not '%s'\n",
		name);
	return 2;
}
