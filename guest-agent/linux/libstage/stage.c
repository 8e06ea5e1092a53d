/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage: see stage.h for the API and guest-agent/linux/README.md for the
 * protocol. Two ways to report a stage switch, chosen once per process when
 * libstage first sees the host's stage map (as guest-agent/src/lib.rs,
 * Mode):
 *
 * Counters (ABI minor 2: the area has STAGEVM_AREA_FLAG_COUNTERS and the
 * map says minor >= 2). A switch is a transition of the current CPU's
 * counter block (hypercall-abi/src/stage/counters.rs): the state word is
 * replaced, then counts[new] grows by one and, when a timed visit ended,
 * its length goes into cycles[old] and timed[old] grows by one. The TSC is
 * read only when the transition ends or starts a timed visit (needs_tsc).
 * Many threads share a CPU and so a block: the state word - and only it -
 * is replaced inside one rseq critical section that checks the CPU and that
 * the word still holds the value read before (a compare-and-store whose
 * store commits it; on an abort or a changed word the transition is
 * recomputed), so every committed transition replaced exactly the state it
 * ended. The counts are added after the commit with atomic adds, which
 * keeps them exact whoever is preempted where. The countdown and pacing
 * words are guest-private and written with plain stores: a race there only
 * moves which visit is timed. When the host asks for a trace
 * (StageMap.trace_every), the event also goes to the CPU's ring the way
 * Agent::try_push does it: never waiting, a full ring drops the event and
 * counts it in RingHeader.trace_dropped.
 *
 * Rings (an older host, or an area without counters). The ring protocol is
 * the one of guest-agent/src/ring.rs (Agent::push): write slot[head %
 * entries] with seq = head, then publish head + 1 (a release store; x86
 * does not reorder stores), never overwriting a slot the host has not
 * consumed (head - tail == entries: count a back-off in the ring header and
 * wait for the host's tail).
 *
 * Concurrency of the rings. The host's drain (vmm/src/stage/ring.rs)
 * assumes one producer per ring: it reads head, then every slot in [tail,
 * head), checking seq == index. In Linux many threads, of many processes,
 * share CPU c and so ring c, and any of them can be preempted in the middle
 * of a write. libstage keeps the single-producer property with restartable
 * sequences (rseq, Linux 4.18+): the whole push - check that the thread is
 * still on CPU c, load head and tail, fill the slot, store head + 1 - is one
 * rseq critical section whose last instruction (the head store) commits
 * it. If the thread is preempted, migrated or signalled before that store,
 * the kernel restarts it at the abort handler and libstage retries; the
 * half-written slot lies beyond head, so no reader sees it, and the next
 * writer on CPU c overwrites it. Code on one CPU is serialised, so per ring
 * the writes behave as one producer and the ABI and the VMM need no change.
 *
 * Without rseq (old kernel, or STAGE_TRANSPORT=lock) rings and state words
 * are written under a spin lock in a guest-private word of the ring header
 * (RingHeader.pad0[0], which the host never reads); a waiter yields the CPU
 * so a preempted holder can finish, and gives up (drops and counts the
 * event) after a second. Writers of one ring must all use the same
 * transport.
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

/* A thread's transport. */
#define MODE_RSEQ 1
#define MODE_LOCK 2

/* How the process reports (G.report): not decided yet (no map seen), every
 * switch an event in the rings, or per-vCPU counters (ABI minor 2). */
#define REPORT_UNDECIDED 0
#define REPORT_RINGS 1
#define REPORT_COUNTERS 2

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
	int report;               /* REPORT_*, written once under G_lock */
	uint8_t *counters;        /* counters mode: vCPU 0's counter block */
	uint64_t timed_every;     /* fixed stride of timed visits, or 0: paced */
	uint64_t pace_ticks;      /* TSC ticks between paced timed visits */
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

static inline struct stagevm_vcpu_counters *block_at(uint32_t vcpu)
{
	return (struct stagevm_vcpu_counters *)G.counters + vcpu;
}

static inline const struct stagevm_stage_map *map_at(void)
{
	return (const struct stagevm_stage_map *)(G.base + STAGEVM_STAGE_MAP_OFFSET);
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

/* A consistent copy of the stage map's epoch, masks and minor (seqlock:
 * retries while the host writes). */
static uint64_t read_map_raw(uint64_t v[STAGEVM_MAX_STAGES], uint64_t *owned, uint64_t *minor)
{
	const struct stagevm_stage_map *m = map_at();
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
		*owned = __atomic_load_n(&m->owned, __ATOMIC_RELAXED);
		*minor = __atomic_load_n(&m->minor, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&m->epoch, __ATOMIC_RELAXED) == e)
			return e;
	}
}

/*
 * Decides how this process reports, once, from the first published map
 * (epoch != 0): counters when the area has them and the host's minor is
 * >= 2, else rings. In device mode the host publishes its first map before
 * REGISTER returns; in fd mode the host registers the area after libstage
 * laid it out, so the decision waits for the map. Called with G_lock held.
 */
static void decide_report_locked(uint64_t epoch, uint64_t minor)
{
	const struct stagevm_area_header *h = (const void *)G.base;
	uint64_t khz;

	if (G.report != REPORT_UNDECIDED || !G.registered || epoch == 0)
		return;
	if (!G.l.counters || minor < 2) {
		__atomic_store_n(&G.report, REPORT_RINGS, __ATOMIC_RELEASE);
		return;
	}
	G.counters = G.base + stagevm_counters_offset(&G.l, 0);
	/* The host wrote the TSC rate at REGISTER: timed visits are paced by
	 * time when it is known, else one transition in TIMED_EVERY starts one
	 * (as Agent::register; STAGE_TIMED_EVERY=N forces a stride). */
	khz = __atomic_load_n(&h->tsc_khz, __ATOMIC_RELAXED);
	G.pace_ticks = khz * STAGEVM_TIMED_INTERVAL_NS / 1000000u;
	G.timed_every = env_u64("STAGE_TIMED_EVERY", 0);
	if (G.timed_every == 0 && G.pace_ticks == 0)
		G.timed_every = STAGEVM_TIMED_EVERY;
	__atomic_store_n(&G.report, REPORT_COUNTERS, __ATOMIC_RELEASE);
}

/* Reads the geometry from a valid header (a joined registration). */
static int adopt_header(void)
{
	const struct stagevm_area_header *h = (const void *)G.base;
	struct stagevm_layout l;
	uint64_t v[STAGEVM_MAX_STAGES], owned, minor, epoch;
	uint32_t i;

	if (h->magic != STAGEVM_AREA_MAGIC || h->version != STAGEVM_ABI_VERSION)
		return -ENOENT;
	if (stagevm_layout_init(&l, h->num_vcpus, h->num_stages, h->ring_entries))
		return -EPROTO;
	if (h->flags & STAGEVM_AREA_FLAG_COUNTERS)
		stagevm_layout_with_counters(&l);
	if (stagevm_used_bytes(&l) > G.len)
		return -EPROTO;
	G.l = l;
	G.all_mask = l.num_vcpus >= 64 ? ~0ull : (1ull << l.num_vcpus) - 1;
	for (i = 0; i < l.num_stages; i++) {
		memcpy(G.names[i], G.base + STAGEVM_STAGE_DESCS_OFFSET + 32u * i, 32);
		G.names[i][32] = 0;
	}
	G.registered = 1;
	epoch = read_map_raw(v, &owned, &minor);
	decide_report_locked(epoch, minor);
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
	G.l.counters = env_u64("STAGEVM_COUNTERS", 1) != 0;
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
	if (G.l.counters)
		stagevm_layout_with_counters(&l);
	if (stagevm_used_bytes(&l) > G.len)
		return -ENOSPC;
	for (i = 0; i < G.named; i++)
		names[i] = G.names[i];
	/* The module's part: a writable view of the header page for the layout. */
	tmp = mmap(NULL, G.len, PROT_READ | PROT_WRITE, MAP_SHARED, G.fd, 0);
	if (tmp == MAP_FAILED)
		return -errno;
	r = stagevm_area_init(tmp, G.len, &l, names) ? -EINVAL : 0;
	/* As the module at REGISTER (the host rings it in fd mode). */
	if (!r)
		stagevm_area_start_counters(tmp, &l, __builtin_ia32_rdtsc());
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

/* Copies the map into the thread's cache; the first published map decides
 * how the process reports. */
static void read_map(struct stage_thread *t)
{
	uint64_t v[STAGEVM_MAX_STAGES], owned, minor, e;
	unsigned i;

	e = read_map_raw(v, &owned, &minor);
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		t->masks[i] = e == 0 ? G.all_mask : v[i] & G.all_mask;
	t->epoch = e;
	t->st.map_reads++;
	if (e != 0 && __atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_UNDECIDED) {
		pthread_mutex_lock(&G_lock);
		decide_report_locked(e, minor);
		pthread_mutex_unlock(&G_lock);
	}
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
 * One rseq critical section (see the file comment): returns 0 when the event
 * was committed to ring `cpu`, 1 when the ring was full, -1 when the kernel
 * aborted the section (preemption, migration, signal) or the thread is not on
 * `cpu` any more. Modelled on librseq's rseq_cmpeqv_trymemcpy_storev.
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

/* The lock transport's per-ring lock (RingHeader.pad0[0]): 0 when taken,
 * -1 when it stayed busy for 64 tries. */
static int ring_trylock(uint8_t *ring)
{
	uint64_t *lock = (uint64_t *)(ring + STAGEVM_RING_LOCK_OFF);
	unsigned i;

	for (i = 0; i < 64; i++) {
		uint64_t expected = 0;

		if (__atomic_compare_exchange_n(lock, &expected, 1, 0, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return 0;
		__builtin_ia32_pause();
	}
	return -1;
}

static void ring_unlock(uint8_t *ring)
{
	__atomic_store_n((uint64_t *)(ring + STAGEVM_RING_LOCK_OFF), 0, __ATOMIC_RELEASE);
}

/* Lock transport: 0 written, 1 full, -1 lock busy. */
static int lock_push(uint8_t *ring, uint64_t mask, uint64_t tsc, uint64_t stage_thread,
		     uint64_t seq_xor)
{
	uint64_t head, tail;
	volatile struct stagevm_stage_event *slot;

	if (ring_trylock(ring))
		return -1;
	head = *ring_word(ring, STAGEVM_RING_HEAD_OFF);
	tail = __atomic_load_n((uint64_t *)(ring + STAGEVM_RING_TAIL_OFF), __ATOMIC_ACQUIRE);
	if (head - tail > mask) {
		ring_unlock(ring);
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
	ring_unlock(ring);
	return 0;
}

/* Waits out a busy ring lock: yields, true while the wait stays under its
 * bound (a second). */
static int lock_backoff(struct stage_thread *t, uint64_t *since)
{
	uint64_t now = now_ns();

	t->st.lock_waits++;
	if (!*since)
		*since = now;
	if (now - *since >= LIBSTAGE_WAIT_NS)
		return 0;
	sched_yield();
	return 1;
}

static int migrate(struct stage_thread *t, uint64_t mask);

/*
 * Writes one event into the ring of the CPU the thread runs on and returns
 * that CPU (rings mode, and the test hook stage__write_raw). With a
 * non-zero `serve` mask the CPU must be in it: the thread is migrated first
 * if not, and since the critical section checks the CPU, the event lands
 * exactly in the ring of a serving vCPU.
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
				if (!lock_backoff(t, &since)) {
					t->st.dropped++;
					return -EAGAIN;
				}
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

/* ---- counters mode (ABI minor 2) ---- */

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

/* The state a transition into `code` enters: timed (since `tsc`) when the
 * countdown ran out or the vCPU goes idle, else untimed (transition()). */
static inline uint64_t entered_state(uint64_t countdown, uint32_t code, uint64_t tsc)
{
	if (countdown == 0 || code == STAGEVM_CODE_IDLE)
		return stagevm_state_word(tsc, code, 1);
	return stagevm_state_word(0, code, 0);
}

/* One committed state-word replacement: the state it replaced, the
 * countdown read with it and the TSC (read only when needed, else 0). */
struct committed {
	uint64_t old, countdown, tsc;
};

/* Lock transport: replaces vCPU `cpu`'s state word under ring `cpu`'s
 * lock. 0 done, -1 lock busy. */
static int lock_transition(uint32_t cpu, uint32_t code, struct committed *c)
{
	struct stagevm_vcpu_counters *b = block_at(cpu);
	uint8_t *ring = ring_at(cpu);

	if (ring_trylock(ring))
		return -1;
	c->old = __atomic_load_n(&b->state, __ATOMIC_RELAXED);
	c->countdown = __atomic_load_n(&b->countdown, __ATOMIC_RELAXED);
	c->tsc = stagevm_needs_tsc(c->old, c->countdown, code) ? __builtin_ia32_rdtsc() : 0;
	__atomic_store_n(&b->state, entered_state(c->countdown, code, c->tsc), __ATOMIC_RELAXED);
	ring_unlock(ring);
	return 0;
}

/*
 * The next stride of paced timed visits at a paced start at TSC `now` (as
 * Agent::pace): the transitions this vCPU makes in TIMED_INTERVAL_NS at
 * the rate since the previous paced start, in 1..TIMED_STRIDE_MAX, plus
 * 0-3 from the TSC's low bits so that a stride never locks onto a
 * workload's period. Kept in the block's guest-private agent words (last
 * start, stride); plain stores: racing threads only perturb the sampling.
 */
static uint64_t pace(struct stagevm_vcpu_counters *b, uint64_t now)
{
	uint64_t since = __atomic_load_n(&b->agent[0], __ATOMIC_RELAXED);
	uint64_t n = __atomic_load_n(&b->agent[1], __ATOMIC_RELAXED);
	uint64_t next = STAGEVM_TIMED_EVERY;

	if (since && n && now > since) {
		uint64_t per = (now - since) / n;

		next = G.pace_ticks / (per ? per : 1);
		if (next < 1)
			next = 1;
		if (next > STAGEVM_TIMED_STRIDE_MAX)
			next = STAGEVM_TIMED_STRIDE_MAX;
	}
	next += (now >> 6) & 3;
	if (next > STAGEVM_TIMED_STRIDE_MAX)
		next = STAGEVM_TIMED_STRIDE_MAX;
	__atomic_store_n(&b->agent[0], now, __ATOMIC_RELAXED);
	__atomic_store_n(&b->agent[1], next, __ATOMIC_RELAXED);
	return next;
}

/*
 * The trace event of a counted switch (StageMap.trace_every != 0), as
 * Agent::try_push: into the ring of the CPU the thread runs on if it has
 * room, else dropped and counted in the ring's trace_dropped. Never waits
 * for ring space (nor, with the lock transport, for a busy ring lock).
 */
static void trace_push(struct stage_thread *t, uint64_t tsc, uint32_t stage)
{
	uint64_t word = (uint64_t)stage | (uint64_t)t->tid << 32;
	uint64_t mask = G.l.ring_entries - 1;

	if (!tsc)
		tsc = __builtin_ia32_rdtsc();
	for (;;) {
		int cpu = current_cpu(t), r;
		uint8_t *ring;

		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus)
			return;
		ring = ring_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			r = rseq_push(t->rs, (uint32_t)cpu, ring, mask, tsc, word, 0);
			if (r < 0) {
				t->st.rseq_aborts++;
				continue;
			}
		} else {
			r = lock_push(ring, mask, tsc, word, 0);
		}
		if (r == 0) {
			t->st.trace_written++;
		} else {
			/* Full (or its lock busy): drop, counted where the host
			 * reads it. */
			__atomic_fetch_add((uint64_t *)(ring + STAGEVM_RING_TRACE_DROPPED_OFF), 1,
					   __ATOMIC_RELAXED);
			t->st.trace_dropped++;
		}
		return;
	}
}

/*
 * Counters mode: the transition of the current CPU's counter block into
 * `code` (stage `stage`, or STAGEVM_STAGE_NONE), and returns that CPU. With
 * a non-zero `serve` mask the CPU must be in it, as for push(). Only the
 * state word is replaced in the critical section (rseq) or under the lock;
 * counts, cycles, timed visits and migrations are then added with atomic
 * adds on the same block, so they stay exact with any number of threads
 * per CPU. -ERANGE on a CPU without a block; -EAGAIN when the ring lock
 * stayed busy for a second (lock transport).
 */
static int count(struct stage_thread *t, uint32_t code, uint32_t stage, uint64_t serve)
{
	struct stagevm_vcpu_counters *b;
	struct committed c;
	uint64_t n, since = 0, every;
	unsigned migrated = 0;
	int from = -1, moved = 0, cpu;

	for (;;) {
		cpu = current_cpu(t);
		if (cpu < 0 || (uint32_t)cpu >= G.l.num_vcpus) {
			t->st.dropped++;
			return -ERANGE;
		}
		if (serve && !(serve >> cpu & 1) && !migrated++) {
			/* At most one affinity change per switch, as push(). */
			from = cpu;
			moved = migrate(t, serve) == 0;
			continue;
		}
		b = block_at((uint32_t)cpu);
		if (t->mode == MODE_RSEQ) {
			int r;

			c.old = __atomic_load_n(&b->state, __ATOMIC_RELAXED);
			c.countdown = __atomic_load_n(&b->countdown, __ATOMIC_RELAXED);
			c.tsc = stagevm_needs_tsc(c.old, c.countdown, code) ? __builtin_ia32_rdtsc() : 0;
			r = rseq_cas(t->rs, (uint32_t)cpu, &b->state, c.old,
				     entered_state(c.countdown, code, c.tsc));
			if (r < 0)
				t->st.rseq_aborts++;
			else if (r > 0)
				t->st.state_retries++;
			if (r)
				continue;
		} else if (lock_transition((uint32_t)cpu, code, &c)) {
			if (!lock_backoff(t, &since)) {
				t->st.dropped++;
				return -EAGAIN;
			}
			continue;
		}
		break;
	}
	/* Committed: this transition replaced exactly state c.old. */
	n = __atomic_add_fetch(&b->counts[code], 1, __ATOMIC_RELAXED);
	if (stagevm_state_timed(c.old) && stagevm_state_code(c.old) < STAGEVM_NUM_CODES) {
		uint64_t end = c.tsc & ~STAGEVM_STATE_LOW_MASK, start = stagevm_state_since(c.old);
		uint32_t old = stagevm_state_code(c.old);

		__atomic_fetch_add(&b->cycles[old], end > start ? end - start : 0, __ATOMIC_RELAXED);
		__atomic_fetch_add(&b->timed[old], 1, __ATOMIC_RELAXED);
	}
	if (c.tsc)
		t->st.tsc_reads++;
	/* A migration, counted where the thread arrived (the block's CPU). */
	if (moved && cpu != from && stage < STAGEVM_MAX_STAGES) {
		__atomic_fetch_add(&b->migrations_in[stage], 1, __ATOMIC_RELAXED);
		t->st.migrations_in[stage]++;
		if (t->stage >= 0) {
			__atomic_fetch_add(&b->migrations_out[t->stage], 1, __ATOMIC_RELAXED);
			t->st.migrations_out[t->stage]++;
		}
	}
	/* Guest-private countdown (plain store; see the file comment). */
	if (c.countdown == 0) {
		every = G.timed_every ? G.timed_every : pace(b, c.tsc);
		__atomic_store_n(&b->countdown, every - 1, __ATOMIC_RELAXED);
	} else {
		__atomic_store_n(&b->countdown, c.countdown - 1, __ATOMIC_RELAXED);
	}
	if (cpu != t->last_cpu && t->last_cpu >= 0)
		t->st.cpu_changes++;
	t->last_cpu = cpu;
	every = __atomic_load_n(&map_at()->trace_every, __ATOMIC_RELAXED);
	if (__builtin_expect(every != 0, 0) && (every == 1 || n % every == 0))
		trace_push(t, c.tsc, stage);
	return cpu;
}

/* Returns 0 when the thread's affinity was changed, -1 when it failed. */
static int migrate(struct stage_thread *t, uint64_t mask)
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
		return -1;
	}
	t->affinity_changed = 1;
	return 0;
}

int stage_enter(unsigned id)
{
	struct stage_thread *t = &T;
	uint64_t mask;
	int r;

	if (__builtin_expect(!t->attached, 0)) {
		r = stage_attach();
		if (r)
			return r;
	}
	if (id >= G.l.num_stages)
		return -EINVAL;
	if (__atomic_load_n(&map_at()->epoch, __ATOMIC_ACQUIRE) != t->epoch)
		read_map(t);
	mask = t->masks[id];
	if (!mask)
		t->st.fallbacks++;
	if (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_COUNTERS)
		r = count(t, STAGEVM_CODE_FIRST_STAGE + id, id, mask);
	else
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
	if (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_COUNTERS)
		r = count(t, STAGEVM_CODE_NONE, STAGEVM_STAGE_NONE, 0);
	else
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

const char *stage_mode(void)
{
	switch (__atomic_load_n(&G.report, __ATOMIC_ACQUIRE)) {
	case REPORT_COUNTERS: return "counters";
	case REPORT_RINGS: return "rings";
	default: return "none";
	}
}

int stage_map(struct stage_map_view *out)
{
	struct stage_thread tmp;
	uint64_t v[STAGEVM_MAX_STAGES], owned, minor;
	unsigned i;

	if (!G.ready || !G.registered)
		return -ENODEV;
	memset(&tmp, 0, sizeof(tmp));
	read_map(&tmp);
	out->epoch = read_map_raw(v, &owned, &minor);
	out->num_stages = G.l.num_stages;
	out->num_vcpus = G.l.num_vcpus;
	for (i = 0; i < STAGEVM_MAX_STAGES; i++)
		out->vcpus[i] = i >= G.l.num_stages ? 0 : out->epoch ? v[i] & G.all_mask : G.all_mask;
	out->owned = owned & G.all_mask;
	out->minor = minor;
	out->trace_every = __atomic_load_n(&map_at()->trace_every, __ATOMIC_RELAXED);
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
	out->counters = __atomic_load_n(&G.report, __ATOMIC_ACQUIRE) == REPORT_COUNTERS;
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
	G.report = REPORT_UNDECIDED;
	G.counters = NULL;
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
