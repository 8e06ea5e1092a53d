/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Self-test program for stgtrace's stage markers: known call structure.
 * main -> stage_a (100x) -> stage_b (3x each) -> helper (no stage);
 * stage_c recurses 5 deep once per stage_a call (same stage: no new entry);
 * stage_throw unwinds through stage_b via longjmp (pops by SP rule).
 */
#include <setjmp.h>
#include <stdio.h>

volatile unsigned long sink;
static jmp_buf jb;

__attribute__((noinline)) void helper(int n) { for (int i = 0; i < n; i++) sink += i; }
__attribute__((noinline)) void stage_b(int n) { helper(n); sink++; }
__attribute__((noinline)) void stage_c(int depth) { sink += depth; if (depth) stage_c(depth - 1); sink++; }
__attribute__((noinline)) void stage_jump(void) { helper(10); longjmp(jb, 1); }
__attribute__((noinline)) void stage_a(int n)
{
    for (int i = 0; i < 3; i++) stage_b(n);
    stage_c(5);
    sink++;
}
int main(void)
{
    for (int i = 0; i < 100; i++) stage_a(20);
    if (!setjmp(jb)) stage_jump();
    helper(5);                 /* back to no stage after the longjmp */
    printf("%lu\n", sink);
    return 0;
}
