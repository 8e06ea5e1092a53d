/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage's rseq critical sections (x86-64 asm), included by hot.c only:
 * static inline, so that each is inlined into the hot path that uses it
 * (rseq_push into push() and trace_push(), rseq_cas into count()). hot.c's
 * file comment says what they guarantee.
 */
#ifndef LIBSTAGE_RSEQ_CS_H
#define LIBSTAGE_RSEQ_CS_H

#include "internal.h"

/*
 * The frame of an rseq critical section (as librseq's RSEQ_ASM_DEFINE_TABLE,
 * RSEQ_ASM_STORE_RSEQ_CS and RSEQ_ASM_DEFINE_ABORT): RSEQ_ENTER emits the
 * descriptor {start 1f, length 2f - 1f, abort 4f}, points rs->rseq_cs at it
 * and enters at 1: on `cpu` or jumps to `abort`; RSEQ_LEAVE ends the section
 * at 2: and puts the abort handler, behind the signature, out of line. Both
 * need the asm operands [rs] and [cpu], the goto label `abort`, and clobber
 * rax.
 */
#define RSEQ_ENTER                                                      \
	".pushsection __rseq_cs, \"aw\"\n\t"                            \
	".balign 32\n\t"                                                  \
	"3:\n\t"                                                          \
	".long 0x0, 0x0\n\t"                                              \
	".quad 1f, (2f - 1f), 4f\n\t"                                     \
	".popsection\n\t"                                                 \
	".pushsection __rseq_cs_ptr_array, \"aw\"\n\t"                  \
	".quad 3b\n\t"                                                    \
	".popsection\n\t"                                                 \
	"leaq 3b(%%rip), %%rax\n\t"                                       \
	"movq %%rax, 8(%[rs])\n\t"      /* rs->rseq_cs = &descriptor */   \
	"1:\n\t"                                                          \
	"cmpl %[cpu], 4(%[rs])\n\t"     /* still on `cpu`? */             \
	"jnz %l[abort]\n\t"

#define RSEQ_LEAVE                                                      \
	"2:\n\t"                                                          \
	".pushsection __rseq_failure, \"ax\"\n\t"                       \
	".byte 0x0f, 0xb9, 0x3d\n\t" /* ud1 <sig>(%rip), %edi */          \
	".long 0x53053053\n\t"       /* LIBSTAGE_RSEQ_SIG */              \
	"4:\n\t"                                                          \
	"jmp %l[abort]\n\t"                                               \
	".popsection\n\t"

/*
 * One rseq critical section (see hot.c's file comment): returns 0 when the
 * event was committed to ring `cpu`, 1 when the ring was full, -1 when the
 * kernel aborted the section (preemption, migration, signal) or the thread
 * is not on `cpu` any more. Modelled on librseq's
 * rseq_cmpeqv_trymemcpy_storev.
 */
static inline int rseq_push(struct rseq *rs, uint32_t cpu, uint8_t *ring, uint64_t mask,
			    uint64_t tsc, uint64_t stage_thread, uint64_t seq_xor)
{
	__asm__ goto(
		RSEQ_ENTER
		"movq 0(%[ring]), %%rcx\n\t"    /* head */
		"movq %%rcx, %%rdx\n\t"
		"subq 64(%[ring]), %%rdx\n\t"   /* head - tail */
		"cmpq %[mask], %%rdx\n\t"
		"ja %l[full]\n\t"               /* >= entries: full */
		"movq %%rcx, %%rdx\n\t"
		"andq %[mask], %%rdx\n\t"
		"shlq $5, %%rdx\n\t"
		"leaq 192(%[ring], %%rdx), %%rdx\n\t" /* slot */
		"movq %%rcx, %%rax\n\t"
		"xorq %[xor], %%rax\n\t"
		"movq %%rax, 0(%%rdx)\n\t"      /* seq */
		"movq %[tsc], 8(%%rdx)\n\t"
		"movq %[st], 16(%%rdx)\n\t"     /* stage, thread */
		"movq $0, 24(%%rdx)\n\t"
		"addq $1, %%rcx\n\t"
		"movq %%rcx, 0(%[ring])\n\t"    /* commit: head + 1 */
		RSEQ_LEAVE
		:
		: [rs] "r"(rs), [cpu] "r"(cpu), [ring] "r"(ring), [mask] "r"(mask), [tsc] "r"(tsc),
		  [st] "r"(stage_thread), [xor] "r"(seq_xor)
		: "memory", "cc", "rax", "rcx", "rdx"
		: abort, full);
	return 0;
abort:
	return -1;
full:
	return 1;
}

/*
 * The state word's compare-and-store as one rseq critical section: on CPU
 * `cpu` with `*word` still equal to `expect`, stores `desired` (the store
 * commits the section). Returns 0 when stored, 1 when the word held
 * another value (another thread on this CPU made a transition first), -1
 * when the kernel aborted the section or the thread is not on `cpu`. As
 * librseq's rseq_cmpeqv_storev.
 */
static inline int rseq_cas(struct rseq *rs, uint32_t cpu, uint64_t *word, uint64_t expect,
			   uint64_t desired)
{
	__asm__ goto(
		RSEQ_ENTER
		"cmpq %[expect], (%[word])\n\t" /* still the state we read? */
		"jnz %l[changed]\n\t"
		"movq %[desired], (%[word])\n\t" /* commit: the new state */
		RSEQ_LEAVE
		:
		: [rs] "r"(rs), [cpu] "r"(cpu), [word] "r"(word), [expect] "r"(expect),
		  [desired] "r"(desired)
		: "memory", "cc", "rax"
		: abort, changed);
	return 0;
abort:
	return -1;
changed:
	return 1;
}

#endif /* LIBSTAGE_RSEQ_CS_H */
