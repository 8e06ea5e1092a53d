/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libstage: see stage.h for the API and guest-agent/linux/README.md for the
 * protocol. This file opens the channel (/dev/stagevm, or an area in a
 * descriptor: stage_init, stage_init_fd), registers the stages (the
 * device's REGISTER, or in fd mode the module's part: laying the area out),
 * reads the stage map and decides once, from the first published map, how
 * the process reports (counters or rings), attaches and detaches threads
 * (each picks its transport: glibc's rseq, its own rseq registration, or
 * the ring lock), answers the getters, shuts down, and defines the state
 * both files share (internal.h). The hot path, stage_enter/stage_exit, is
 * hot.c, whose file comment describes how a switch is reported.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread struct stage_thread T = { .epoch = UINT64_MAX, .last_cpu = -1, .stage = -1 };
static __thread struct rseq own_rs __attribute__((aligned(32)));

struct libstage_global G = { .fd = -1 };

pthread_mutex_t G_lock = PTHREAD_MUTEX_INITIALIZER;

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

/* ---- opening, the stage map, registration ---- */

/* Maps the area: the first page read-only, the rest read-write, at
 * consecutive addresses (the module refuses a writable mapping of page 0).
 */
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
 * retries while the host writes).
 */
static uint64_t read_map_raw(uint64_t v[STAGEVM_MAX_STAGES], uint64_t *owned, uint64_t *minor)
{
	const struct stagevm_stage_map *m = map_at();
	uint64_t e;
	unsigned int i;

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
 * >= 2, else rings; with counters, requests are timed when the area has
 * latency blocks, the host's minor is >= 4 and it gave the TSC rate (as
 * Agent::register). In device mode the host publishes its first map before
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
	 * (as Agent::register; STAGE_TIMED_EVERY=N forces a stride).
	 */
	khz = __atomic_load_n(&h->tsc_khz, __ATOMIC_RELAXED);
	G.pace_ticks = khz * STAGEVM_TIMED_INTERVAL_NS / 1000000u;
	G.timed_every = env_u64("STAGE_TIMED_EVERY", 0);
	if (G.timed_every > STAGEVM_TIMED_STRIDE_MAX)
		G.timed_every = STAGEVM_TIMED_STRIDE_MAX;
	if (G.timed_every == 0 && G.pace_ticks == 0)
		G.timed_every = STAGEVM_TIMED_EVERY;
	/* Minor 4: requests are timed in ns, so only with the TSC rate. The
	 * hot path reads G.latency after G.report (acquire).
	 */
	if (G.l.latency && khz > 0 && minor >= 4) {
		G.ns_mult = stagevm_ns_mult(khz);
		G.latency = latency_at(0);
	}
	__atomic_store_n(&G.report, REPORT_COUNTERS, __ATOMIC_RELEASE);
}

/* Copies the map into the thread's cache; the first published map decides
 * how the process reports.
 */
void read_map(struct stage_thread *t)
{
	uint64_t v[STAGEVM_MAX_STAGES], owned, minor, e;
	unsigned int i;

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
	stagevm_layout_apply_flags(&l, h->flags);
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
	G.l.latency = G.l.counters && env_u64("STAGEVM_LATENCY", 1) != 0;
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

int stage_name(unsigned int id, const char *name)
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
	if (G.l.counters) {
		struct stagevm_layout c = l, lat = l;

		/* Counters (and the latency blocks after them) only where they
		 * fit the area; else the rings, as an older layout (the host
		 * serves both).
		 */
		stagevm_layout_with_counters(&c);
		stagevm_layout_with_latency(&lat);
		if (G.l.latency && stagevm_used_bytes(&lat) <= G.len)
			l = lat;
		else if (stagevm_used_bytes(&c) <= G.len)
			l = c;
	}
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
	 * GLIBC_TUNABLES=glibc.pthread.rseq=0): register our own.
	 */
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
	t->req_open = 0;
	t->req_start = 0;
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

/* ---- getters, shutdown, test hooks ---- */

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
	unsigned int i;

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
	out->visit = minor >= 3 ? __atomic_load_n(&map_at()->visit, __ATOMIC_RELAXED) : STAGEVM_VISIT_FIFO;
	return 0;
}

uint64_t stage_map_epoch(void)
{
	if (!G.ready || !G.registered)
		return 0;
	return __atomic_load_n(&map_at()->epoch, __ATOMIC_ACQUIRE) & ~1ull;
}

const char *stage_get_name(unsigned int id)
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
	out->latency = out->counters && G.latency;
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
	G.latency = NULL;
	G.ns_mult = 0;
	pthread_mutex_unlock(&G_lock);
}

int64_t stage__ring_pending(unsigned int vcpu)
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
