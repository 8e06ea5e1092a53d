/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagevm-exit CODE: ends the VM with exit status CODE (0-255) by writing it
 * to stagevm's shutdown port (0x600, hypercall-abi/src/platform.rs). Needs
 * root (iopl). Built static by images/linux/build.sh for the initramfs: the
 * Debian cloud kernel has no /dev/port (CONFIG_DEVPORT is off).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/io.h>

#define SHUTDOWN_PORT 0x600

int main(int argc, char **argv)
{
	long code = argc > 1 ? strtol(argv[1], NULL, 0) : 0;

	if (code < 0 || code > 255) {
		fprintf(stderr, "stagevm-exit: code %ld is not in 0-255\n", code);
		return 2;
	}
	if (iopl(3) != 0) {
		perror("stagevm-exit: iopl");
		return 1;
	}
	outl((unsigned int)code, SHUTDOWN_PORT);
	/* Not reached under stagevm. */
	fprintf(stderr, "stagevm-exit: port 0x600 did not end the VM\n");
	return 1;
}
