/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace_stats: quick statistics of a "stagetrace v1" stream (fast C twin of
 * trace_stats.py; same output).  Reads the *decompressed* stream on stdin:
 *
 *     zstd -dc trace.strace.zst | trace_stats [--json out.json] [--name NAME]
 *
 * Per thread and per stage: instructions, FETCH records (blocks), loads,
 * stores, stage entries, distinct 64-byte instruction lines (code footprint).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_STAGE 0xFFFFu

typedef struct {
    uint64_t instrs, fetches, loads, stores, entries, bytes;
    uint64_t *set; size_t cap, n;        /* distinct i-lines */
} Acc;

static void set_add(Acc *a, uint64_t line)
{
    if (a->n * 2 >= a->cap) {
        size_t ncap = a->cap ? a->cap * 2 : 4096;
        uint64_t *ns = calloc(ncap, sizeof(*ns));
        for (size_t i = 0; i < a->cap; i++) {
            uint64_t v = a->set[i];
            if (!v) continue;
            size_t h = (v * 0x9E3779B97F4A7C15ull) >> 20 & (ncap - 1);
            while (ns[h]) h = (h + 1) & (ncap - 1);
            ns[h] = v;
        }
        free(a->set); a->set = ns; a->cap = ncap;
    }
    uint64_t v = line + 1;
    size_t h = (v * 0x9E3779B97F4A7C15ull) >> 20 & (a->cap - 1);
    while (a->set[h]) { if (a->set[h] == v) return; h = (h + 1) & (a->cap - 1); }
    a->set[h] = v; a->n++;
}

#define MAXT 4096
#define MAXS 65536
static Acc *thr[MAXT];
static Acc *stg[MAXS + 1];       /* index MAXS... NO_STAGE maps to 0xFFFF */
static uint32_t thr_ids[MAXT]; static int nthr;

static Acc *get(Acc **tab, size_t i) { if (!tab[i]) tab[i] = calloc(1, sizeof(Acc)); return tab[i]; }

static unsigned char buf[1 << 20];
static size_t blen, bpos;
static uint64_t consumed;

static int need(size_t n)
{
    if (blen - bpos >= n) return 1;
    memmove(buf, buf + bpos, blen - bpos);
    blen -= bpos; consumed += bpos; bpos = 0;
    while (blen < n) {
        size_t r = fread(buf + blen, 1, sizeof(buf) - blen, stdin);
        if (r == 0) return 0;
        blen += r;
    }
    return 1;
}
static inline uint16_t rd16(const unsigned char *p) { return p[0] | p[1] << 8; }
static inline uint32_t rd32(const unsigned char *p) { return rd16(p) | (uint32_t)rd16(p + 2) << 16; }
static inline uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

int main(int argc, char **argv)
{
    const char *json = NULL, *name = "trace";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
        else { fprintf(stderr, "usage: zstd -dc T | trace_stats [--json F] [--name N]\n"); return 2; }
    }
    if (!need(8) || memcmp(buf, "STGTRC01", 8)) { fprintf(stderr, "trace_stats: bad magic\n"); return 1; }
    bpos = 8;
    int tix = -1;                 /* current thread index */
    uint32_t cur_stage_of[MAXT];  /* per thread index */
    uint64_t n_fetch = 0, n_instr = 0, n_load = 0, n_store = 0, n_stage = 0, n_thread = 0;
    int ended = 0;
    Acc *tall = NULL;             /* no thread yet */
    for (;;) {
        if (!need(1)) break;
        unsigned int tag = buf[bpos];
        const unsigned char *p;
        switch (tag) {
        case 1: {
            if (!need(5)) goto trunc;
            uint32_t tid = rd32(buf + bpos + 1); bpos += 5; n_thread++;
            tix = -1;
            for (int i = 0; i < nthr; i++) if (thr_ids[i] == tid) { tix = i; break; }
            if (tix < 0) {
                if (nthr == MAXT) { fprintf(stderr, "too many threads\n"); return 1; }
                tix = nthr++; thr_ids[tix] = tid; cur_stage_of[tix] = NO_STAGE;
            }
            tall = get(thr, tix);
            break;
        }
        case 2: {
            if (!need(13)) goto trunc;
            p = buf + bpos + 1; bpos += 13;
            if (tix < 0) { fprintf(stderr, "FETCH before THREAD\n"); return 1; }
            uint64_t a = rd64(p); unsigned int by = rd16(p + 8), in = rd16(p + 10);
            Acc *s = get(stg, cur_stage_of[tix]);
            n_fetch++; n_instr += in;
            tall->fetches++; tall->instrs += in; tall->bytes += by;
            s->fetches++; s->instrs += in; s->bytes += by;
            if (by) for (uint64_t l = a >> 6; l <= (a + by - 1) >> 6; l++) set_add(s, l);
            break;
        }
        case 3: case 4: {
            if (!need(10)) goto trunc;
            bpos += 10;
            if (tix < 0) { fprintf(stderr, "LOAD/STORE before THREAD\n"); return 1; }
            Acc *s = get(stg, cur_stage_of[tix]);
            if (tag == 3) { n_load++; tall->loads++; s->loads++; }
            else { n_store++; tall->stores++; s->stores++; }
            break;
        }
        case 5: {
            if (!need(3)) goto trunc;
            uint16_t st = rd16(buf + bpos + 1); bpos += 3; n_stage++;
            if (tix < 0) { fprintf(stderr, "STAGE before THREAD\n"); return 1; }
            if (st != cur_stage_of[tix]) { get(stg, st)->entries++; tall->entries++; }
            cur_stage_of[tix] = st;
            break;
        }
        case 6: bpos += 1; ended = 1; goto done;
        default:
            fprintf(stderr, "trace_stats: bad tag 0x%02x at byte %llu\n", tag,
                    (unsigned long long)(consumed + bpos));
            return 1;
        }
    }
trunc:
    fprintf(stderr, "trace_stats: warning: stream truncated (no END record)\n");
done:
    consumed += bpos;
    printf("%s: %llu bytes, %llu instructions, %llu FETCH (%.2f instrs/block), %llu LOAD, %llu STORE, "
           "%llu STAGE, %llu THREAD records, %d threads, END %s\n",
           name, (unsigned long long)consumed, (unsigned long long)n_instr,
           (unsigned long long)n_fetch, n_fetch ? (double)n_instr / n_fetch : 0.0,
           (unsigned long long)n_load, (unsigned long long)n_store,
           (unsigned long long)n_stage, (unsigned long long)n_thread, nthr, ended ? "yes" : "NO");
    printf("%-8s %14s %7s %12s %12s %12s %10s %12s\n", "stage", "instructions", "share",
           "blocks", "loads", "stores", "entries", "code KiB");
    for (size_t i = 0; i <= 0xFFFF; i++) {
        Acc *s = stg[i];
        if (!s) continue;
        char nm[16];
        if (i == NO_STAGE) snprintf(nm, sizeof(nm), "none"); else snprintf(nm, sizeof(nm), "%zu", i);
        printf("%-8s %14llu %6.2f%% %12llu %12llu %12llu %10llu %12.1f\n", nm,
               (unsigned long long)s->instrs, n_instr ? 100.0 * s->instrs / n_instr : 0.0,
               (unsigned long long)s->fetches, (unsigned long long)s->loads,
               (unsigned long long)s->stores, (unsigned long long)s->entries, s->n * 64 / 1024.0);
    }
    printf("%-8s %14s %7s %12s %12s %12s %10s\n", "thread", "instructions", "share",
           "blocks", "loads", "stores", "stage sw.");
    for (int i = 0; i < nthr; i++) {
        Acc *t = thr[i];
        printf("%-8u %14llu %6.2f%% %12llu %12llu %12llu %10llu\n", thr_ids[i],
               (unsigned long long)t->instrs, n_instr ? 100.0 * t->instrs / n_instr : 0.0,
               (unsigned long long)t->fetches, (unsigned long long)t->loads,
               (unsigned long long)t->stores, (unsigned long long)t->entries);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { perror(json); return 1; }
        fprintf(f, "{\"bytes\": %llu, \"instructions\": %llu, \"fetch_records\": %llu, "
                   "\"load_records\": %llu, \"store_records\": %llu, \"stage_records\": %llu, "
                   "\"thread_records\": %llu, \"thread_count\": %d, \"end\": %s,\n \"stages\": {",
                (unsigned long long)consumed, (unsigned long long)n_instr,
                (unsigned long long)n_fetch, (unsigned long long)n_load,
                (unsigned long long)n_store, (unsigned long long)n_stage,
                (unsigned long long)n_thread, nthr, ended ? "true" : "false");
        int first = 1;
        for (size_t i = 0; i <= 0xFFFF; i++) {
            Acc *s = stg[i];
            if (!s) continue;
            fprintf(f, "%s\n  \"%zu\": {\"instructions\": %llu, \"blocks\": %llu, \"loads\": %llu, "
                       "\"stores\": %llu, \"entries\": %llu, \"code_lines\": %zu}",
                    first ? "" : ",", i, (unsigned long long)s->instrs,
                    (unsigned long long)s->fetches, (unsigned long long)s->loads,
                    (unsigned long long)s->stores, (unsigned long long)s->entries, s->n);
            first = 0;
        }
        fprintf(f, "},\n \"threads\": {");
        for (int i = 0; i < nthr; i++) {
            Acc *t = thr[i];
            fprintf(f, "%s\n  \"%u\": {\"instructions\": %llu, \"blocks\": %llu, \"loads\": %llu, "
                       "\"stores\": %llu, \"stage_switches\": %llu}",
                    i ? "," : "", thr_ids[i], (unsigned long long)t->instrs,
                    (unsigned long long)t->fetches, (unsigned long long)t->loads,
                    (unsigned long long)t->stores, (unsigned long long)t->entries);
        }
        fprintf(f, "}}\n");
        fclose(f);
    }
    return ended ? 0 : 3;
}
