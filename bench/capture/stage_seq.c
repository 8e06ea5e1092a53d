/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stage_seq: the per-thread stage sequence of a "stagetrace v1" stream, the
 * fast path of tpcc_mix.py (which has the same decoder in Python, --pure).
 * Reads the *decompressed* stream on stdin and writes, for every STAGE
 * record that changes its thread's stage, 16 bytes to stdout:
 *
 *     u32 thread, u16 new stage, u16 0, u64 instructions the thread executed
 *                                          before this point (little-endian)
 *
 * and at END one such record per thread with stage 0xFFFE (its total).
 *
 *     zstd -dc trace.strace.zst | stage_seq > seq.bin
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXT 65536
static uint64_t instrs[MAXT];
static uint32_t stage[MAXT];
static unsigned char seen[MAXT];
static uint32_t order[MAXT];
static int nthr;

static unsigned char buf[1 << 20];
static size_t blen, bpos;

static int need(size_t n)
{
    if (blen - bpos >= n) return 1;
    memmove(buf, buf + bpos, blen - bpos);
    blen -= bpos; bpos = 0;
    while (blen < n) {
        size_t r = fread(buf + blen, 1, sizeof(buf) - blen, stdin);
        if (r == 0) return 0;
        blen += r;
    }
    return 1;
}
static inline uint16_t rd16(const unsigned char *p) { return p[0] | p[1] << 8; }
static inline uint32_t rd32(const unsigned char *p) { return rd16(p) | (uint32_t)rd16(p + 2) << 16; }

static void out(uint32_t t, uint16_t s, uint64_t n)
{
    unsigned char r[16];
    memcpy(r, &t, 4); memcpy(r + 4, &s, 2); memset(r + 6, 0, 2); memcpy(r + 8, &n, 8);
    fwrite(r, 1, 16, stdout);      /* x86-64: little-endian */
}

int main(void)
{
    static const int len[7] = {0, 5, 13, 10, 10, 3, 1};
    if (!need(8) || memcmp(buf, "STGTRC01", 8)) { fprintf(stderr, "stage_seq: bad magic\n"); return 1; }
    bpos = 8;
    uint32_t tid = 0;
    int ended = 0;
    while (need(1)) {
        unsigned int tag = buf[bpos];
        if (tag < 1 || tag > 6) { fprintf(stderr, "stage_seq: bad tag %#x\n", tag); return 1; }
        if (!need(len[tag])) break;                 /* truncated */
        const unsigned char *p = buf + bpos + 1;
        switch (tag) {
        case 1:
            tid = rd32(p);
            if (tid >= MAXT) { fprintf(stderr, "stage_seq: thread id %u too large\n", tid); return 1; }
            if (!seen[tid]) { seen[tid] = 1; stage[tid] = 0xFFFF; order[nthr++] = tid; }
            break;
        case 2: instrs[tid] += rd16(p + 10); break;
        case 5: {
            uint16_t s = rd16(p);
            if (s != stage[tid]) { stage[tid] = s; out(tid, s, instrs[tid]); }
            break;
        }
        case 6: ended = 1; break;
        default: break;
        }
        bpos += len[tag];
        if (ended) break;
    }
    for (int i = 0; i < nthr; i++) out(order[i], 0xFFFE, instrs[order[i]]);
    if (!ended) { fprintf(stderr, "stage_seq: no END record (truncated trace)\n"); return 3; }
    return 0;
}
