/* SPDX-License-Identifier: Apache-2.0 */
/*
 * netecho ADDR PREFIX: the Linux test image's network check (issue 26),
 * run by /init when the kernel command line has stagevm.net=ADDR/PREFIX.
 *
 * Configures eth0 (the virtio-net card stagevm's DSDT describes) with
 * ADDR/PREFIX and brings it up with the classic interface ioctls (no
 * netlink, no `ip` in the image), listens on TCP port 7 (echo, RFC 862),
 * prints "netecho: eth0 ADDR/PREFIX up, listening on TCP port 7", echoes
 * one connection until the peer closes it, and prints "netecho: echoed N
 * bytes to PEER:PORT". Exit status 0 when all of it held; 1 otherwise
 * (with the failing step and errno on the console). A peer that has not
 * connected within NETECHO_WAIT_S seconds ends it with status 1.
 *
 * The harness (images/linux/test.py) runs the peer in a network namespace
 * of its own, on the tap's side with a link-local address (169.254.0.0/16).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "init.h"

#define NETECHO_PORT 7
#define NETECHO_WAIT_S 300

static int step_failed(const char *what)
{
	printf("netecho: FAILED: %s: %s\n", what, strerror(errno));
	fflush(stdout);
	return 1;
}

/* Sets one address-type member of eth0 (SIOCSIFADDR, SIOCSIFNETMASK). */
static int set_addr(int sock, unsigned long req, in_addr_t addr)
{
	struct ifreq ifr;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;

	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = addr;
	return ioctl(sock, req, &ifr);
}

/* Gives eth0 the address `addr` (network order) with a /`prefix` netmask and
 * brings it up, with the classic interface ioctls. Returns 0, or 1 after
 * printing the failing step and errno. Also used by mariadb.c.
 */
int eth0_up(in_addr_t addr, long prefix)
{
	struct ifreq ifr;
	int sock = socket(AF_INET, SOCK_DGRAM, 0);

	if (sock < 0)
		return step_failed("socket");
	if (set_addr(sock, SIOCSIFADDR, addr) < 0)
		return step_failed("SIOCSIFADDR eth0");
	if (set_addr(sock, SIOCSIFNETMASK, htonl(~0u << (32 - prefix))) < 0)
		return step_failed("SIOCSIFNETMASK eth0");
	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
	if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0)
		return step_failed("SIOCGIFFLAGS eth0");
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0)
		return step_failed("SIOCSIFFLAGS eth0");
	close(sock);
	return 0;
}

int netecho_main(int argc, char **argv)
{
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(NETECHO_PORT) };
	struct sockaddr_in peer;
	socklen_t peer_len = sizeof(peer);
	struct in_addr addr;
	struct pollfd pfd;
	char buf[4096];
	long prefix, echoed = 0;
	int lsn, conn, one = 1;

	prefix = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
	if (argc != 3 || inet_pton(AF_INET, argv[1], &addr) != 1 || prefix < 1 || prefix > 30) {
		printf("netecho: FAILED: usage: netecho IPV4-ADDRESS PREFIX (1-30)\n");
		return 1;
	}
	if (eth0_up(addr.s_addr, prefix) != 0)
		return 1;

	lsn = socket(AF_INET, SOCK_STREAM, 0);
	if (lsn < 0)
		return step_failed("socket (TCP)");
	setsockopt(lsn, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	me.sin_addr = addr;
	if (bind(lsn, (struct sockaddr *)&me, sizeof(me)) < 0)
		return step_failed("bind TCP port 7");
	if (listen(lsn, 1) < 0)
		return step_failed("listen");
	printf("netecho: eth0 %s/%ld up, listening on TCP port %d\n", argv[1], prefix, NETECHO_PORT);
	fflush(stdout);
	pfd = (struct pollfd){ .fd = lsn, .events = POLLIN };
	if (poll(&pfd, 1, NETECHO_WAIT_S * 1000) != 1) {
		errno = ETIMEDOUT;
		return step_failed("no connection");
	}
	conn = accept(lsn, (struct sockaddr *)&peer, &peer_len);
	if (conn < 0)
		return step_failed("accept");
	for (;;) {
		ssize_t n = read(conn, buf, sizeof(buf)), off = 0;

		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return step_failed("read");
		}
		while (off < n) {
			ssize_t w = write(conn, buf + off, n - off);

			if (w < 0 && errno != EINTR)
				return step_failed("write");
			off += w > 0 ? w : 0;
		}
		echoed += n;
	}
	close(conn);
	close(lsn);
	printf("netecho: echoed %ld bytes to %s:%u\n", echoed, inet_ntoa(peer.sin_addr),
	       ntohs(peer.sin_port));
	fflush(stdout);
	return 0;
}
