/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stageserver: a small multi-stage TCP server for stagevm-discover's
 * end-to-end test.  Thread per connection on 127.0.0.1; a request is one
 * line ("SEED\n"), served by handle_request() through three stages, each
 * calling 48 of its own 64 functions chosen by the data (~25 KiB of code per
 * stage, so the stages' code competes for a small L1i), and answered with
 * one line ("CHECKSUM\n").
 *
 *   stageserver serve PORT            serve until SIGTERM
 *   stageserver load PORT CONNS REQS  CONNS clients, REQS requests each;
 *                                     exit 0 when every answer checks
 *
 * The load computes every answer itself (the same stage code, linked in)
 * and exits 1 on a wrong one.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef uint64_t (*fn_t)(uint64_t);

#define MIX(k) x ^= x >> (((k) % 23) + 5); x *= 0x9E3779B97F4A7C15ull ^ (uint64_t)(k) * 0x100000001B3ull; x += (uint64_t)(k) << 17;
#define MIX4(k) MIX((k) * 4 + 1) MIX((k) * 4 + 2) MIX((k) * 4 + 3) MIX((k) * 4 + 4)
#define FN(s, i) \
    __attribute__((noinline)) uint64_t s##_##i(uint64_t x) \
    { MIX4(s##_base + i * 8) MIX4(s##_base + i * 8 + 1) MIX4(s##_base + i * 8 + 2) \
      MIX4(s##_base + i * 8 + 3) MIX4(s##_base + i * 8 + 4) MIX4(s##_base + i * 8 + 5) return x; }
#define SEQ(M, s) \
    M(s, 0) M(s, 1) M(s, 2) M(s, 3) M(s, 4) M(s, 5) M(s, 6) M(s, 7) M(s, 8) M(s, 9) M(s, 10) M(s, 11) \
    M(s, 12) M(s, 13) M(s, 14) M(s, 15) M(s, 16) M(s, 17) M(s, 18) M(s, 19) M(s, 20) M(s, 21) M(s, 22) \
    M(s, 23) M(s, 24) M(s, 25) M(s, 26) M(s, 27) M(s, 28) M(s, 29) M(s, 30) M(s, 31) M(s, 32) M(s, 33) \
    M(s, 34) M(s, 35) M(s, 36) M(s, 37) M(s, 38) M(s, 39) M(s, 40) M(s, 41) M(s, 42) M(s, 43) M(s, 44) \
    M(s, 45) M(s, 46) M(s, 47) M(s, 48) M(s, 49) M(s, 50) M(s, 51) M(s, 52) M(s, 53) M(s, 54) M(s, 55) \
    M(s, 56) M(s, 57) M(s, 58) M(s, 59) M(s, 60) M(s, 61) M(s, 62) M(s, 63)
#define REF(s, i) s##_##i,

enum { parse_base = 1000, plan_base = 2000, exec_base = 3000 };
SEQ(FN, parse)
SEQ(FN, plan)
SEQ(FN, exec)
static const fn_t parse_fns[64] = { SEQ(REF, parse) };
static const fn_t plan_fns[64] = { SEQ(REF, plan) };
static const fn_t exec_fns[64] = { SEQ(REF, exec) };

#define CALLS 48

static __attribute__((noinline)) uint64_t run_stage(const fn_t *fns, uint64_t x)
{
    for (int i = 0; i < CALLS; i++)
        x = fns[(x >> 7) % 64](x + (uint64_t)i);
    return x;
}

/* The three stage entries: each called once per request. */
__attribute__((noinline)) uint64_t parse_request(uint64_t x) { return run_stage(parse_fns, x ^ 0x5a5a); }
__attribute__((noinline)) uint64_t plan_request(uint64_t x) { return run_stage(plan_fns, x ^ 0xa5a5); }
__attribute__((noinline)) uint64_t execute_request(uint64_t x) { return run_stage(exec_fns, x ^ 0x3c3c); }

/* One request: the request marker stagevm-discover finds by default. */
__attribute__((noinline)) uint64_t handle_request(uint64_t seed)
{
    return execute_request(plan_request(parse_request(seed)));
}

static int read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = recv(fd, buf + n, 1, 0);
        if (r <= 0)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = 0;
    return (int)n;
}

static void *serve_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char line[64], out[64];
    while (read_line(fd, line, sizeof(line)) >= 0) {
        uint64_t r = handle_request(strtoull(line, NULL, 10));
        int n = snprintf(out, sizeof(out), "%llu\n", (unsigned long long)r);
        if (send(fd, out, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    close(fd);
    return NULL;
}

static int port_arg(const char *s)
{
    char *end;
    long p = strtol(s, &end, 10);
    if (*end || p <= 0 || p > 65535) {
        fprintf(stderr, "stageserver: bad port '%s'\n", s);
        exit(2);
    }
    return (int)p;
}

static int serve(int port)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) || listen(ls, 64)) {
        fprintf(stderr, "stageserver: 127.0.0.1:%d: %s\n", port, strerror(errno));
        return 1;
    }
    fprintf(stderr, "stageserver: listening on 127.0.0.1:%d\n", port);
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0)
            continue;
        pthread_t t;
        pthread_create(&t, NULL, serve_conn, (void *)(intptr_t)c);
        pthread_detach(t);
    }
}

static int load_port, load_reqs;
static volatile int load_bad;

static void *client(void *arg)
{
    uint64_t id = (uint64_t)(intptr_t)arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)load_port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        perror("stageserver load: connect");
        load_bad = 1;
        return NULL;
    }
    char line[64], in[64];
    for (int i = 0; i < load_reqs; i++) {
        uint64_t seed = id * 1000003u + (uint64_t)i * 7919u;
        int n = snprintf(line, sizeof(line), "%llu\n", (unsigned long long)seed);
        if (send(fd, line, (size_t)n, MSG_NOSIGNAL) != n || read_line(fd, in, sizeof(in)) < 0 ||
            strtoull(in, NULL, 10) != handle_request(seed)) {
            fprintf(stderr, "stageserver load: request %d of client %llu failed\n", i, (unsigned long long)id);
            load_bad = 1;
            break;
        }
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "serve"))
        return serve(port_arg(argv[2]));
    if (argc == 5 && !strcmp(argv[1], "load")) {
        load_port = port_arg(argv[2]);
        int conns = atoi(argv[3]);
        load_reqs = atoi(argv[4]);
        pthread_t t[64];
        if (conns < 1 || conns > 64 || load_reqs < 1) {
            fprintf(stderr, "stageserver load: 1..64 clients, ≥ 1 request\n");
            return 2;
        }
        for (int i = 0; i < conns; i++)
            pthread_create(&t[i], NULL, client, (void *)(intptr_t)(i + 1));
        for (int i = 0; i < conns; i++)
            pthread_join(t[i], NULL);
        return load_bad;
    }
    fprintf(stderr, "usage: stageserver serve PORT | stageserver load PORT CONNS REQS\n");
    return 2;
}
