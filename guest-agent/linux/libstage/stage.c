/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage: see stage.h for the API and guest-agent/linux/README.md for the
 * protocol. The ring protocol is the one of guest-agent/src/lib.rs (Agent::
 * push): write slot[head % entries] with seq = head, then publish head + 1
 * (a release store; x86 does not reorder stores), never overwriting a slot
 * the host has not consumed (head - tail == entries: count a back-off in the
 * ring header and wait for the host's tail).
 *
 * Concurrency. The host's drain (vmm/src/stage.rs, drain_ring) assumes one
 * producer per ring: it reads head, then every slot in [tail, head), checking
 * seq == index. In Linux many threads, of many processes, share CPU c and so
 * ring c, and any of them can be preempted in the middle of a write. libstage
 * keeps the single-producer property with restartable sequences (rseq, Linux
 * 4.18+): the whole push - check that the thread is still on CPU c, load
 * head and tail, fill the slot, store head + 1 - is one rseq critical section
 * whose last instruction (the head store) commits it. If the thread is
 * preempted, migrated or signalled before that store, the kernel restarts it
 * at the abort handler and libstage retries; the half-written slot lies
 * beyond head, so no reader sees it, and the next writer on CPU c overwrites
 * it. Code on one CPU is serialised, so per ring the writes behave as one
 * producer and the ABI and the VMM need no change.
 *
 * Without rseq (old kernel, or STAGE_TRANSPORT=lock) rings are written under
 * a spin lock in a guest-private word of the ring header (RingHeader.pad0[0],
 * which the host never reads); a waiter yields the CPU so a preempted holder
 * can finish, and gives up (drops and counts the event) after a second.
 * Writers of one ring must all use the same transport.
 */
#define _GNU_SOURCE
#include "stage.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if __has_include(<sys/rseq.h>)
#include <sys/rseq.h>
#define LIBSTAGE_GLIBC_RSEQ 1
#else
#include <linux/rseq.h>
#define LIBSTAGE_GLIBC_RSEQ 0
#endif

#include "stagevm_ioctl.h"
#include "stagevm_layout.h"

#if !defined(__x86_64__)
#error "libstage's rseq critical section is written for x86-64"
#endif

/* Signature before the abort handler; glibc registers rseq with this value
 * on x86, and libstage's own registration uses it too. */
#define LIBSTAGE_RSEQ_SIG 0x53053053
/* How long a writer waits for ring space or a ring lock before dropping. */
#define LIBSTAGE_WAIT_NS 1000000000ull

#define MODE_RSEQ 1
#define MODE_LOCK 2

struct stage_thread {
	int attached;
	int mode;
	int own_rseq;
	int stage;
	uint32_t tid;
	int last_cpu;
	int affinity_changed;
	struct rseq *rs;
	uint64_t epoch;
	uint64_t masks[STAGEVM_MAX_STAGES];
	cpu_set_t saved;
	struct stage_stats st;
};

static __thread struct stage_thread T = { .epoch = UINT64_MAX, .last_cpu = -1, .stage = -1 };
static __thread struct rseq own_rs __attribute__((aligned(32)));

static struct {
	int ready;
	int fd;
	int device;
	int registered;
	int force_lock;
	uint8_t *base;
	size_t len;
	struct stagevm_layout l;
	uint64_t all_mask;
	char names[STAGEVM_MAX_STAGES][33];
	int named;
	struct stage_stats done;
	pthread_key_t key;
	int key_ok;
} G = { .fd = -1 };

static pthread_mutex_t G_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint8_t *ring_at(uint32_t vcpu)
{
	return G.base + stagevm_ring_offset(&G.l, vcpu);
}

static inline volatile uint64_t *ring_word(uint8_t *ring, unsigned off)
{
	return (volatile uint64_t *)(ring + off);
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long x;

	if (!v || !*v)
		return dflt;
	errno = 0;
	x = strtoull(v, &end, 0);
	return (errno || *end) ? dflt : x;
}

/* Maps the area: the first page read-only, the rest read-write, at
 * consecutive addresses (the module refuses a writable mapping of page 0). */
static int map_area(int fd, size_t len)
{
	uint8_t *base;

	if (len < STAGEVM_RO_BYTES || len % STAGEVM_PAGE_SIZE)
		return -EINVAL;
	base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return -errno;
	if (mmap(base, STAGEVM_RO_BYTES, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED ||
	    (len > STAGEVM_RO_BYTES &&
	     mmap(base + STAGEVM_RO_BYTES, len - STAGEVM_RO_BYTES, PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_FIXED, fd, STAGEVM_RO_BYTES) == MAP_FAILED)) {
		int e = -errno;

		munmap(base, len);
		return e;
	}
	G.base = base;
	G.len = len;
	return 0;
}

static void thread_exit(void *arg)
{
	(void)arg;
	stage_detach();
}

static void common_init(void)
{
	G.force_lock = getenv("STAGE_TRANSPORT") && !strcmp(getenv("STAGE_TRANSPORT"), "lock");
	if (!G.key_ok)
		G.key_ok = pthread_key_create(&G.key, thread_exit) == 0;
}

/* Reads the geometry from a valid header (a joined registration). */
static int adopt_header(void)
{
	const struct stagevm_area_header *h = (const void *)G.base;
	struct stagevm_layout l;
	uint32_t i;

	if (h->magic != STAGEVM_AREA_MAGIC || h->version != STAGEVM_ABI_VERSION)
		return -ENOENT;
	if (stagevm_layout_init(&l, h->num_vcpus, h->num_stages, h->ring_entries) ||
	    stagevm_used_bytes(&l) > G.len)
		return -EPROTO;
	G.l = l;
	G.all_mask = l.num_vcpus >= 64 ? ~0ull : (1ull << l.num_vcpus) - 1;
	for (i = 0; i < l.num_stages; i++) {
		memcpy(G.names[i], G.base + STAGEVM_STAGE_DESCS_OFFSET + 32u * i, 32);
		G.names[i][32] = 0;
	}
	G.registered = 1;
	return 0;
}

static int init_fd_locked(int fd, size_t len)
{
	int r;

	if (G.ready)
		return 0;
	common_init();
	r = map_area(fd, len);
	if (r)
		return r;
	G.fd = fd;
	G.device = 0;
	G.l.num_vcpus = (uint32_t)env_u64("STAGEVM_VCPUS", (uint64_t)sysconf(_SC_NPROCESSORS_CONF));
	G.l.ring_entries = (uint32_t)env_u64("STAGEVM_RING_ENTRIES", 256);
	/* An area laid out already (by another process) is joined. */
	adopt_header();
	G.ready = 1;
	return 0;
}

int stage_init_fd(int fd, size_t len)
{
	int r;

	pthread_mutex_lock(&G_lock);
	r = init_fd_locked(fd, len);
	pthread_mutex_unlock(&G_lock);
	return r;
}

static int init_device_locked(const char *path)
{
	struct stagevm_ioc_info info;
	int fd, r;

	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ioctl(fd, STAGEVM_IOC_INFO, &info) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	common_init();
	r = map_area(fd, (size_t)info.area_size);
	if (r) {
		close(fd);
		return r;
	}
	G.fd = fd;
	G.device = 1;
	G.l.num_vcpus = info.num_vcpus;
	G.l.ring_entries = info.ring_entries;
	if (info.registered)
		adopt_header();
	G.ready = 1;
	return 0;
}

int stage_init(void)
{
	const char *fd = getenv("STAGEVM_FD");
	const char *dev = getenv("STAGEVM_DEVICE");
	int r;

	pthread_mutex_lock(&G_lock);
	if (G.ready)
		r = 0;
	else if (fd && *fd)
		r = init_fd_locked((int)env_u64("STAGEVM_FD", (uint64_t)-1),
				   (size_t)env_u64("STAGEVM_LEN", 0));
	else
		r = init_device_locked(dev && *dev ? dev : STAGEVM_DEVICE_PATH);
	pthread_mutex_unlock(&G_lock);
	return r;
}

int stage_name(unsigned id, const char *name)
{
	int r = 0;

	if (id >= STAGEVM_MAX_STAGES || !name)
		return -EINVAL;
	pthread_mutex_lock(&G_lock);
	if (G.registered) {
		r = strncmp(G.names[id], name, 32) ? -EBUSY : 0;
	} else {
		strncpy(G.names[id], name, 32);
		G.names[id][32] = 0;
		if ((int)id + 1 > G.named)
			G.named = (int)id + 1;
	}
	pthread_mutex_unlock(&G_lock);
	return r;
}

static int register_device_locked(void)
{
	struct stagevm_ioc_register reg;
	int i;

	memset(&reg, 0, sizeof(reg));
	reg.num_stages = (uint32_t)G.named;
	for (i = 0; i < G.named; i++)
		memcpy(reg.names[i], G.names[i], 32);
	if (ioctl(G.fd, STAGEVM_IOC_REGISTER, &reg) < 0) {
		int e = -errno;

		/* Registered by another process meanwhile: join it. */
		if (e == -EBUSY && adopt_header() == 0)
			return 0;
		return e;
	}
	return adopt_header();
}

static int register_fd_locked(void)
{
	const char *names[STAGEVM_MAX_STAGES];
	struct stagevm_layout l;
	void *tmp;
	int i, r;

	if (stagevm_layout_init(&l, G.l.num_vcpus, (uint32_t)G.named, G.l.ring_entries))
		return -EINVAL;
	if (stagevm_used_bytes(&l) > G.len)
		return -ENOSPC;
	for (i = 0; i < G.named; i++)
		names[i] = G.names[i];
	/* The module's part: a writable view of the header page for the layout. */
	tmp = mmap(NULL, G.len, PROT_READ | PROT_WRITE, MAP_SHARED, G.fd, 0);
	if (tmp == MAP_FAILED)
		return -errno;
	r = stagevm_area_init(tmp, G.len, &l, names) ? -EINVAL : 0;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	munmap(tmp, G.len);
	return r ? r : adopt_header();
}

int stage_register(void)
{
	int r;

	r = stage_init();
	if (r)
		return r;
	pthread_mutex_lock(&G_lock);
	if (G.registered)
		r = 0;
	else if (G.named == 0)
		r = -EINVAL;
	else
		r = G.device ? register_device_locked() : register_fd_locked();
	pthread_mutex_unlock(&G_lock);
	return r;
}

/* ---- per-thread state ---- */

static inline void *thread_pointer(void)
{
	void *tp;

	__asm__("mov %%fs:0, %0" : "=r"(tp));
	return tp;
}

static void setup_transport(struct stage_thread *t)
{
	t->mode = MODE_LOCK;
	t->rs = NULL;
	t->own_rseq = 0;
	if (G.force_lock)
		return;
#if LIBSTAGE_GLIBC_RSEQ
	if (__rseq_size > 0) {
		struct rseq *rs = (struct rseq *)((char *)thread_pointer() + __rseq_offset);

		if ((int32_t)__atomic_load_n(&rs->cpu_id, __ATOMIC_RELAXED) >= 0) {
			t->rs = rs;
			t->mode = MODE_RSEQ;
		}
		return;
	}
#endif
	/* glibc did not register rseq for this thread (old glibc, or
	 * GLIBC_TUNABLES=glibc.pthread.rseq=0): register our own. */
	memset(&own_rs, 0, sizeof(own_rs));
	own_rs.cpu_id = (uint32_t)RSEQ_CPU_ID_UNINITIALIZED;
	if (syscall(__NR_rseq, &own_rs, sizeof(own_rs), 0, LIBSTAGE_RSEQ_SIG) == 0) {
		t->rs = &own_rs;
		t->own_rseq = 1;
		t->mode = MODE_RSEQ;
	}
}

static int attach_locked(struct stage_thread *t)
{
	if (!G.registered) {
		int r;

		if (G.named == 0)
			return -EINVAL;
		r = G.device ? register_device_locked() : register_fd_locked();
		if (r)
			return r;
	}
	t->tid = (uint32_t)syscall(SYS_gettid);
	t->stage = -1;
	t->last_cpu = -1;
	t->epoch = UINT64_MAX;
	t->affinity_changed = 0;
	memset(&t->st, 0, sizeof(t->st));
	t->st.threads = 1;
	if (sched_getaffinity(0, sizeof(t->saved), &t->saved))
		CPU_ZERO(&t->saved);
	setup_transport(t);
	if (G.device)
		ioctl(G.fd, STAGEVM_IOC_ATTACH);
	if (G.key_ok)
		pthread_setspecific(G.key, t);
	t->attached = 1;
	return 0;
}

int stage_attach(void)
{
	struct stage_thread *t = &T;
	int r;

	if (t->attached)
		return 0;
	r = stage_init();
	if (r)
		return r;
	pthread_mutex_lock(&G_lock);
	r = attach_locked(t);
	pthread_mutex_unlock(&G_lock);
	return r;
}

static void add_stats(struct stage_stats *to, const struct stage_stats *from)
{
	const uint64_t *f = (const uint64_t *)from;
	uint64_t *o = (uint64_t *)to;
	size_t i;

	for (i = 0; i < sizeof(*to) / sizeof(uint64_t); i++)
		o[i] += f[i];
}

int stage_detach(void)
{
	struct stage_thread *t = &T;

	if (!t->attached)
		return 0;
	t->attached = 0;
	if (t->affinity_changed && CPU_COUNT(&t->saved))
		sched_setaffinity(0, sizeof(t->saved), &t->saved);
	if (t->own_rseq)
		syscall(__NR_rseq, &own_rs, sizeof(own_rs), RSEQ_FLAG_UNREGISTER, LIBSTAGE_RSEQ_SIG);
	t->own_rseq = 0;
	t->rs = NULL;
	pthread_mutex_lock(&G_lock);
	add_stats(&G.done, &t->st);
	if (G.device && G.fd >= 0)
		ioctl(G.fd, STAGEVM_IOC_DETACH);
	pthread_mutex_unlock(&G_lock);
	memset(&t->st, 0, sizeof(t->st));
	if (G.key_ok)
		pthread_setspecific(G.key, NULL);
	return 0;
}

/* ---- hot path ---- */

static inline int current_cpu(const struct stage_thread *t)
{
	if (t->mode == MODE_RSEQ)
		return (int)__atomic_load_n(&t->rs->cpu_id, __ATOMIC_RELAXED);
	return sched_getcpu();
}

static void read_map(struct stage_thread *t)
{
	const struct stagevm_stage_map *m =
		(const struct stagevm_stage_map *)(G.base + STAGEVM_STAGE_MAP_OFFSET);
	uint64_t v[STAGEVM_MAX_STAGES];
	uint64_t e;
	unsigned i;

	for (;;) {
		e = __atomic_load_n(&m->epoch, __ATOMIC_ACQUIRE);
		if (e & 1) {
			__builtin_ia32_pause();
			continue;
		}
		for (i = 0; i < STAGEVM_MAX_STAGES; i++)
			v[i] = __atomic_load_n(&m->vcpus[i], __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&m->epoch, __ATOMIC_RELAXED) == e)
			break;
	}
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		t->masks[i] = e == 0 ? G.all_mask : v[i] & G.all_mask;
	t->epoch = e;
	t->st.map_reads++;
}

/* Waits after finding `ring` full; false once the wait exceeded its bound. */
static int full_backoff(uint8_t *ring, uint64_t *since, unsigned *spins)
{
	uint64_t now;
	unsigned i;

	__atomic_fetch_add((uint64_t *)(ring + STAGEVM_RING_BACKOFFS_OFF), 1, __ATOMIC_RELAXED);
	T.st.full_waits++;
	if (*spins < 8) {
		for (i = 0; i < (64u << *spins); i++)
			__builtin_ia32_pause();
		(*spins)++;
	} else {
		struct timespec ts = { 0, 20000 };

		nanosleep(&ts, NULL);
	}
	now = now_ns();
	if (!*since)
		*since = now;
	return now - *since < LIBSTAGE_WAIT_NS;
}

/*
 * One rseq critical section (see the file comment): returns 0 when the event
 * was committed to ring `cpu`, 1 when the ring was full, -1 when the kernel
 * aborted the section (preemption, migration, signal) or the thread is not on
 * `cpu` any more. Modelled on librseq's rseq_cmpeqv_trymemcpy_storev.
 */
static inline int rseq_push(struct rseq *rs, uint32_t cpu, uint8_t *ring, uint64_t mask,
			    uint64_t tsc, uint64_t stage_thread, uint64_t seq_xor)
{
	__asm__ goto(
		".pushsection __rseq_cs, \"aw\"\n\t"
		".balign 32\n\t"
		"3:\n\t"
		".long 0x0, 0x0\n\t"
		".quad 1f, (2f - 1f), 4f\n\t"
		".popsection\n\t"
		".pushsection __rseq_cs_ptr_array, \"aw\"\n\t"
		".quad 3b\n\t"
		".popsection\n\t"
		"leaq 3b(%%rip), %%rax\n\t"
		"movq %%rax, 8(%[rs])\n\t"      /* rs->rseq_cs = &descriptor */
		"1:\n\t"
		"cmpl %[cpu], 4(%[rs])\n\t"     /* still on `cpu`? */
		"jnz %l[abort]\n\t"
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
		"2:\n\t"
		".pushsection __rseq_failure, \"ax\"\n\t"
		".byte 0x0f, 0xb9, 0x3d\n\t"    /* ud1 <sig>(%rip), %edi: the signature */
		".long 0x53053053\n\t"
		"4:\n\t"
		"jmp %l[abort]\n\t"
		".popsection\n\t"
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

/* Lock transport: 0 written, 1 full, -1 lock busy. */
static int lock_push(uint8_t *ring, uint64_t mask, uint64_t tsc, uint64_t stage_thread,
		     uint64_t seq_xor)
{
	uint64_t *lock = (uint64_t *)(ring + STAGEVM_RING_LOCK_OFF);
	uint64_t expected = 0, head, tail;
	volatile struct stagevm_stage_event *slot;
	unsigned i;

	for (i = 0; i < 64; i++) {
		expected = 0;
		if (__atomic_compare_exchange_n(lock, &expected, 1, 0, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			break;
		__builtin_ia32_pause();
	}
	if (i == 64)
		return -1;
	head = *ring_word(ring, STAGEVM_RING_HEAD_OFF);
	tail = __atomic_load_n((uint64_t *)(ring + STAGEVM_RING_TAIL_OFF), __ATOMIC_ACQUIRE);
	if (head - tail > mask) {
		__atomic_store_n(lock, 0, __ATOMIC_RELEASE);
		return 1;
	}
	slot = (volatile struct stagevm_stage_event *)(ring + sizeof(struct stagevm_ring_header) +
						       (head & mask) * sizeof(*slot));
	slot->seq = head ^ seq_xor;
	slot->tsc = tsc;
	slot->stage = (uint32_t)stage_thread;
	slot->thread = (uint32_t)(stage_thread >> 32);
	slot->reserved = 0;
	__atomic_store_n((uint64_t *)(ring + STAGEVM_RING_HEAD_OFF), head + 1, __ATOMIC_RELEASE);
	__atomic_store_n(lock, 0, __ATOMIC_RELEASE);
	return 0;
}

static void migrate(struct stage_thread *t, uint64_t mask);

/*
 * Writes one event into the ring of the CPU the thread runs on and returns
 * that CPU. With a non-zero `serve` mask the CPU must be in it: the thread is
 * migrated first if not, and since the critical section checks the CPU, the
 * event lands exactly in the ring of a serving vCPU.
 */
static int push(struct stage_thread *t, uint32_t stage, uint32_t thread, uint64_t seq_xor,
		uint64_t serve)
{
	uint64_t tsc = __builtin_ia32_rdtsc();
	uint64_t word = (uint64_t)stage | (uint64_t)thread << 32;
	uint64_t mask = G.l.ring_entries - 1, since = 0;
	unsigned spins = 0, migrated = 0;

	for (;;) {
		int cpu = current_cpu(t), r;
		uint8_t *ring;

		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus) {
			t->st.dropped++;
			return -ERANGE;
		}
		if (serve && !(serve >> cpu & 1)) {
			/* At most one affinity change per event: after a failed
			 * one (counted), write where the thread is. */
			if (!migrated++) {
				migrate(t, serve);
				continue;
			}
		}
		ring = ring_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			r = rseq_push(t->rs, (uint32_t)cpu, ring, mask, tsc, word, seq_xor);
			if (r < 0) {
				t->st.rseq_aborts++;
				continue;
			}
		} else {
			r = lock_push(ring, mask, tsc, word, seq_xor);
			if (r < 0) {
				uint64_t now = now_ns();

				t->st.lock_waits++;
				if (!since)
					since = now;
				if (now - since >= LIBSTAGE_WAIT_NS) {
					t->st.dropped++;
					return -EAGAIN;
				}
				sched_yield();
				continue;
			}
		}
		if (r > 0) {
			if (!full_backoff(ring, &since, &spins)) {
				t->st.dropped++;
				return -EAGAIN;
			}
			continue;
		}
		if (cpu != t->last_cpu && t->last_cpu >= 0)
			t->st.cpu_changes++;
		t->last_cpu = cpu;
		return cpu;
	}
}

static void migrate(struct stage_thread *t, uint64_t mask)
{
	cpu_set_t set;
	uint32_t v;

	CPU_ZERO(&set);
	for (v = 0; v < G.l.num_vcpus; v++)
		if ((mask >> v & 1) && CPU_ISSET(v, &t->saved))
			CPU_SET(v, &set);
	/* The thread's own restriction excludes every serving CPU: obey the map. */
	if (!CPU_COUNT(&set))
		for (v = 0; v < G.l.num_vcpus; v++)
			if (mask >> v & 1)
				CPU_SET(v, &set);
	t->st.affinity_calls++;
	if (sched_setaffinity(0, sizeof(set), &set)) {
		t->st.affinity_failures++;
		return;
	}
	t->affinity_changed = 1;
}

int stage_enter(unsigned id)
{
	struct stage_thread *t = &T;
	const struct stagevm_stage_map *m;
	uint64_t mask;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	if (id >= G.l.num_stages)
		return -EINVAL;
	m = (const struct stagevm_stage_map *)(G.base + STAGEVM_STAGE_MAP_OFFSET);
	if (__atomic_load_n(&m->epoch, __ATOMIC_ACQUIRE) != t->epoch)
		read_map(t);
	mask = t->masks[id];
	if (!mask)
		t->st.fallbacks++;
	r = push(t, id, t->tid, 0, mask);
	if (r < 0)
		return r;
	t->st.enters[id]++;
	t->stage = (int)id;
	return r;
}

int stage_exit(void)
{
	struct stage_thread *t = &T;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	r = push(t, STAGEVM_STAGE_NONE, t->tid, 0, 0);
	if (r < 0)
		return r;
	t->st.exits++;
	t->stage = -1;
	return r;
}

int stage_current(void)
{
	return T.attached ? T.stage : -1;
}

int stage_cpu(void)
{
	return T.attached ? current_cpu(&T) : sched_getcpu();
}

const char *stage_transport(void)
{
	if (!T.attached)
		return "none";
	return T.mode == MODE_RSEQ ? (T.own_rseq ? "rseq (own registration)" : "rseq") : "lock";
}

int stage_map(struct stage_map_view *out)
{
	struct stage_thread tmp;
	unsigned i;

	if (!G.ready || !G.registered)
		return -ENODEV;
	memset(&tmp, 0, sizeof(tmp));
	read_map(&tmp);
	out->epoch = tmp.epoch;
	out->num_stages = G.l.num_stages;
	out->num_vcpus = G.l.num_vcpus;
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		out->vcpus[i] = i < G.l.num_stages ? tmp.masks[i] : 0;
	return 0;
}

const char *stage_get_name(unsigned id)
{
	if (!G.registered || id >= G.l.num_stages)
		return NULL;
	return G.names[id];
}

void stage_get_stats(struct stage_stats *out)
{
	pthread_mutex_lock(&G_lock);
	*out = G.done;
	pthread_mutex_unlock(&G_lock);
	if (T.attached)
		add_stats(out, &T.st);
}

void stage_shutdown(void)
{
	stage_detach();
	pthread_mutex_lock(&G_lock);
	if (G.base)
		munmap(G.base, G.len);
	if (G.device && G.fd >= 0)
		close(G.fd);
	G.base = NULL;
	G.fd = -1;
	G.ready = 0;
	G.registered = 0;
	G.named = 0;
	pthread_mutex_unlock(&G_lock);
}

int stage__write_raw(uint64_t seq_xor, uint32_t stage, uint32_t thread)
{
	int r;

	if (!T.attached) {
		r = stage_attach();
		if (r)
			return r;
	}
	return push(&T, stage, thread, seq_xor, 0);
}

int64_t stage__ring_pending(unsigned vcpu)
{
	uint8_t *ring;

	if (!G.registered || vcpu >= G.l.num_vcpus)
		return -EINVAL;
	ring = ring_at(vcpu);
	return (int64_t)(__atomic_load_n((uint64_t *)(ring + STAGEVM_RING_HEAD_OFF),
					 __ATOMIC_ACQUIRE) -
			 __atomic_load_n((uint64_t *)(ring + STAGEVM_RING_TAIL_OFF),
					 __ATOMIC_ACQUIRE));
}

const void *stage__area(size_t *len)
{
	if (len)
		*len = G.len;
	return G.base;
}
