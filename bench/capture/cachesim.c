/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cachesim: an independent check of stagesim's cache model (issue 16).
 *
 * Replays a "stagetrace v1" trace on ONE core in the order it was captured
 * (records in file order: the traced run's own thread switches) through
 * L1i, L1d and a unified L2, and prints instruction and data misses per
 * 1000 instructions after a warm-up.  Written separately from stagesim (C,
 * timestamp LRU instead of stagesim's MRU-ordered sets) so that agreement
 * checks stagesim's replay and cache code, not just itself.
 *
 * Model (as documented in stagesim/src/cache.rs): set-associative,
 * exact LRU, set index = line number mod sets; non-inclusive non-exclusive,
 * fill on miss at every level that missed; L1 hits do not touch L2; stores
 * as loads.  A FETCH touches every line of [addr, addr + bytes) (at least
 * one), a LOAD/STORE every line of [addr, addr + size) (at least one).
 * The first --warmup-pct % of the trace's instructions (file order) warm
 * the caches and are not counted.
 *
 *   cachesim [--l1i KIB:WAYS] [--l1d KIB:WAYS] [--l2 KIB:WAYS] [--line B]
 *            [--warmup-pct P] [--json] TRACE.strace.zst
 *
 * Reads the trace twice through `zstd -dc` (the instruction total first).
 * Defaults: 32:8, 32:8, 512:8, 64-byte lines, 10 %.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t sets, ways;
    uint64_t *tag;   /* sets × ways line numbers + 1 (0 = empty) */
    uint64_t *used;  /* last-use stamps */
    uint64_t clock;
} Cache;

static int cache_init(Cache *c, const char *spec, uint64_t line)
{
    unsigned long kib, ways;
    if (sscanf(spec, "%lu:%lu", &kib, &ways) != 2 || !kib || !ways) return -1;
    uint64_t lines = kib * 1024 / line;
    if (lines % ways) return -1;
    c->sets = lines / ways;
    if (c->sets & (c->sets - 1)) return -1;
    c->ways = ways;
    c->tag = calloc(lines, sizeof(*c->tag));
    c->used = calloc(lines, sizeof(*c->used));
    c->clock = 0;
    return c->tag && c->used ? 0 : -1;
}

/* 1 on a hit; on a miss the least recently used way takes the line. */
static int cache_access(Cache *c, uint64_t line)
{
    uint64_t *t = c->tag + (line & (c->sets - 1)) * c->ways;
    uint64_t *u = c->used + (line & (c->sets - 1)) * c->ways;
    uint64_t victim = 0;
    c->clock++;
    for (uint64_t w = 0; w < c->ways; w++) {
        if (t[w] == line + 1) { u[w] = c->clock; return 1; }
        if (u[w] < u[victim]) victim = w;
    }
    t[victim] = line + 1;
    u[victim] = c->clock;
    return 0;
}

static Cache l1i, l1d, l2;
static uint64_t shift;
static int counting;
static uint64_t instrs, l1i_miss, l2i_miss, l1d_miss, l2d_miss, i_lines, d_lines;

static void touch(Cache *l1, uint64_t addr, uint64_t bytes, uint64_t *lines,
                  uint64_t *m1, uint64_t *m2)
{
    /* Low 48 bits, sign-extended, as stagesim keeps them. */
    addr = (uint64_t)((int64_t)(addr << 16) >> 16);
    uint64_t first = addr >> shift, last = (addr + (bytes ? bytes : 1) - 1) >> shift;
    for (uint64_t l = first;; l++) {
        int h1 = cache_access(l1, l);
        int h2 = h1 ? 1 : cache_access(&l2, l);
        if (counting) { (*lines)++; *m1 += !h1; *m2 += !h2; }
        if (l >= last) break;
    }
}

static unsigned char buf[1 << 20];
static size_t blen, bpos;
static FILE *in;

static int need(size_t n)
{
    if (blen - bpos >= n) return 1;
    memmove(buf, buf + bpos, blen - bpos);
    blen -= bpos; bpos = 0;
    while (blen < n) {
        size_t r = fread(buf + blen, 1, sizeof(buf) - blen, in);
        if (r == 0) return 0;
        blen += r;
    }
    return 1;
}
static inline uint64_t rd(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* One pass: with simulate = 0 only counts instructions. */
static int pass(const char *path, int simulate, uint64_t warm, uint64_t *total)
{
    char cmd[4200];
    if (strlen(path) > 4000 || strchr(path, '\'')) { fprintf(stderr, "cachesim: bad path\n"); return -1; }
    snprintf(cmd, sizeof(cmd), "zstd -dcq '%s'", path);
    in = popen(cmd, "r");
    if (!in) { perror("cachesim: zstd"); return -1; }
    blen = bpos = 0;
    if (!need(8) || memcmp(buf, "STGTRC01", 8)) { fprintf(stderr, "cachesim: %s: bad magic\n", path); pclose(in); return -1; }
    bpos = 8;
    uint64_t seen = 0;
    static const int len[7] = {0, 5, 13, 10, 10, 3, 1};
    while (need(1)) {
        unsigned int tag = buf[bpos];
        if (tag < 1 || tag > 6) { fprintf(stderr, "cachesim: unknown tag %u\n", tag); pclose(in); return -1; }
        if (!need(len[tag])) { fprintf(stderr, "cachesim: truncated record\n"); pclose(in); return -1; }
        const unsigned char *p = buf + bpos + 1;
        bpos += len[tag];
        if (tag == 2) {
            uint64_t n = rd(p + 10, 2);
            if (simulate) {
                counting = seen >= warm;
                touch(&l1i, rd(p, 8), rd(p + 8, 2), &i_lines, &l1i_miss, &l2i_miss);
                if (counting) instrs += n;
            }
            seen += n;
        } else if (simulate && (tag == 3 || tag == 4)) {
            touch(&l1d, rd(p, 8), rd(p + 8, 1), &d_lines, &l1d_miss, &l2d_miss);
        } else if (tag == 6) {
            break;
        }
    }
    *total = seen;
    return pclose(in) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *s1i = "32:8", *s1d = "32:8", *s2 = "512:8", *path = NULL;
    uint64_t line = 64; double warm_pct = 10.0; int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--l1i") && i + 1 < argc) s1i = argv[++i];
        else if (!strcmp(argv[i], "--l1d") && i + 1 < argc) s1d = argv[++i];
        else if (!strcmp(argv[i], "--l2") && i + 1 < argc) s2 = argv[++i];
        else if (!strcmp(argv[i], "--line") && i + 1 < argc) line = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--warmup-pct") && i + 1 < argc) warm_pct = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else { fprintf(stderr, "usage: cachesim [--l1i K:W] [--l1d K:W] [--l2 K:W] [--line B] [--warmup-pct P] [--json] TRACE\n"); return 2; }
    }
    if (!path || !line || (line & (line - 1)) || warm_pct < 0 || warm_pct >= 100) {
        fprintf(stderr, "cachesim: need a trace, a power-of-two line and a warm-up in [0, 100)\n");
        return 2;
    }
    shift = (uint64_t)__builtin_ctzll(line);
    if (cache_init(&l1i, s1i, line) || cache_init(&l1d, s1d, line) || cache_init(&l2, s2, line)) {
        fprintf(stderr, "cachesim: bad geometry (KIB:WAYS, sets a power of two)\n");
        return 2;
    }
    uint64_t total = 0, again = 0;
    if (pass(path, 0, 0, &total)) return 1;
    uint64_t warm = (uint64_t)(total * warm_pct / 100.0);
    if (pass(path, 1, warm, &again)) return 1;
    double k = instrs ? 1000.0 / instrs : 0;
    if (json)
        printf("{\"trace\":\"%s\",\"instrs\":%llu,\"warmup_instrs\":%llu,\"l1i_mpki\":%.4f,\"l2i_mpki\":%.4f,"
               "\"l1d_mpki\":%.4f,\"l2d_mpki\":%.4f,\"l2\":\"%s\"}\n",
               path, (unsigned long long)instrs, (unsigned long long)warm, l1i_miss * k, l2i_miss * k,
               l1d_miss * k, l2d_miss * k, s2);
    else
        printf("%s: %llu instructions counted after %llu warm-up; L1i MPKI %.3f, L2i MPKI %.3f, "
               "L1d MPKI %.3f, L2d MPKI %.3f (L2 %s)\n",
               path, (unsigned long long)instrs, (unsigned long long)warm, l1i_miss * k, l2i_miss * k,
               l1d_miss * k, l2d_miss * k, s2);
    return 0;
}
