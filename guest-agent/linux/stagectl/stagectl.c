/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagectl: prints the stage channel's state from the mapped area - the
 * header, the host's stage map (epoch, vCPU mask and name per stage, the
 * host's ABI minor and the trace it asks for), each vCPU's ring counters
 * and scheduling hints, each vCPU's stage counters (ABI minor 2: state,
 * entries per stage, requests, idles, timed visits and their cycles,
 * migrations) and request-latency histogram (ABI minor 4: timed requests,
 * their mean, the fullest buckets) - and, on /dev/stagevm, the module's
 * counters. Read-only.
 *
 *   stagectl [--device PATH | --fd N | --file PATH]
 *
 * and attaches stage maps to unmodified binaries (attach.c):
 *
 *   stagectl attach --map FILE [--binary PATH] | detach | probes
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stagevm_ioctl.h"
#include "stagevm_layout.h"
#include "stagemap_file.h"
#include "stagectl.h"

static void print_vcpus(uint64_t mask, char *out, size_t len)
{
	size_t n = 0;
	int v, first = 1;

	out[0] = 0;
	for (v = 0; v < 64 && n < len; v++) {
		int end = v;

		if (!(mask >> v & 1))
			continue;
		while (end + 1 < 64 && (mask >> (end + 1) & 1))
			end++;
		n += (size_t)snprintf(out + n, len - n, end > v ? "%s%d-%d" : "%s%d", first ? "" : ",",
				      v, end);
		first = 0;
		v = end;
	}
	if (first)
		snprintf(out, len, "none");
}

static uint64_t load(const void *p)
{
	return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}

/* Name of state code `code`: "none", "idle", a stage's name, or "code N"
 * for a code past the registered stages (a forged state word).
 */
static const char *code_name(const uint8_t *base, const struct stagevm_layout *l, uint32_t code,
			     char *buf, size_t len)
{
	if (code == STAGEVM_CODE_NONE)
		return "none";
	if (code == STAGEVM_CODE_IDLE)
		return "idle";
	if (code - STAGEVM_CODE_FIRST_STAGE < l->num_stages) {
		memcpy(buf, base + STAGEVM_STAGE_DESCS_OFFSET + 32u * (code - STAGEVM_CODE_FIRST_STAGE),
		       32);
		buf[32] = 0;
		if (buf[0])
			return buf;
	}
	snprintf(buf, len, "code %u", code);
	return buf;
}

/* vCPU `v`'s counter block: its state, then one line per code with
 * anything counted. Counters are totals since REGISTER, read without the
 * writers' cooperation (a line may be one transition behind another).
 */
static void print_counters(const uint8_t *base, const struct stagevm_layout *l, uint32_t v)
{
	const struct stagevm_vcpu_counters *c =
		(const void *)(base + stagevm_counters_offset(l, v));
	uint64_t state = load(&c->state), timed = 0, cycles = 0;
	char name[40];
	uint32_t code, s;

	for (code = 0; code < STAGEVM_NUM_CODES; code++) {
		timed += load(&c->timed[code]);
		cycles += load(&c->cycles[code]);
	}
	printf("  vcpu %2u counters: state %s", v,
	       code_name(base, l, stagevm_state_code(state), name, sizeof(name)));
	if (stagevm_state_timed(state))
		printf(" (timed, since TSC %llu)", (unsigned long long)stagevm_state_since(state));
	else
		printf(" (untimed)");
	printf(", requests %llu, idle %llu, timed visits %llu (%llu cycles)\n",
	       (unsigned long long)load(&c->counts[STAGEVM_CODE_NONE]),
	       (unsigned long long)load(&c->counts[STAGEVM_CODE_IDLE]), (unsigned long long)timed,
	       (unsigned long long)cycles);
	for (code = 0; code < STAGEVM_CODE_FIRST_STAGE; code++)
		if (load(&c->timed[code]))
			printf("    %-32s timed %llu cycles %llu\n",
			       code_name(base, l, code, name, sizeof(name)),
			       (unsigned long long)load(&c->timed[code]),
			       (unsigned long long)load(&c->cycles[code]));
	for (s = 0; s < l->num_stages; s++) {
		code = STAGEVM_CODE_FIRST_STAGE + s;
		printf("    %-32s entries %llu timed %llu cycles %llu migrations in %llu out %llu\n",
		       code_name(base, l, code, name, sizeof(name)),
		       (unsigned long long)load(&c->counts[code]),
		       (unsigned long long)load(&c->timed[code]),
		       (unsigned long long)load(&c->cycles[code]),
		       (unsigned long long)load(&c->migrations_in[s]),
		       (unsigned long long)load(&c->migrations_out[s]));
	}
}

/* vCPU `v`'s latency histogram (minor 4): timed requests, their mean and
 * the range of buckets holding them, read without the writers'
 * cooperation.
 */
static void print_latency(const uint8_t *base, const struct stagevm_layout *l, uint32_t v)
{
	const struct stagevm_vcpu_latency *b =
		(const void *)(base + stagevm_latency_offset(l, v));
	uint64_t samples = load(&b->samples), sum = load(&b->sum_ns);
	uint32_t i, lo = STAGEVM_LATENCY_BUCKETS, hi = 0;

	for (i = 0; i < STAGEVM_LATENCY_BUCKETS; i++)
		if (load(&b->buckets[i])) {
			lo = lo < i ? lo : i;
			hi = i;
		}
	printf("  vcpu %2u latency: timed requests %llu", v, (unsigned long long)samples);
	if (samples)
		printf(", mean %.1f us, buckets %u-%u", (double)sum / (double)samples / 1e3, lo, hi);
	printf("\n");
}

/* `stagectl --map-file PATH`: parses a stage-map file and prints it in
 * canonical form (stagemap_file.h); exit status 1 with the line and reason
 * when it is malformed.
 */
static int print_map_file(const char *path)
{
	struct stagemap_file m;
	const char *why = NULL;
	unsigned int line = 0;
	int r = stagemap_file_load(path, &m, &line, &why);

	if (r == -EINVAL)
		fprintf(stderr, "stagectl: %s: line %u: %s\n", path, line, why);
	else if (r < 0)
		fprintf(stderr, "stagectl: %s: %s\n", path, strerror(-r));
	else
		r = stagemap_file_write(stdout, &m);
	stagemap_file_free(&m);
	return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *device = STAGEVM_DEVICE_PATH, *file = NULL;
	const struct stagevm_area_header *h;
	const struct stagevm_stage_map *m;
	struct stagevm_ioc_info info;
	struct stagevm_ioc_stats stats;
	struct stagevm_layout l;
	uint64_t epoch, masks[STAGEVM_MAX_STAGES], minor, trace;
	int fd = -1, is_device = 0, i;
	size_t len;
	uint8_t *base;
	uint32_t v, s;

	if (argc > 1 && !strcmp(argv[1], "attach"))
		return stagectl_attach(argc - 1, argv + 1);
	if (argc > 1 && !strcmp(argv[1], "detach"))
		return stagectl_detach(argc - 1, argv + 1);
	if (argc > 1 && !strcmp(argv[1], "probes"))
		return stagectl_probes(argc - 1, argv + 1);
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--map-file") && i + 1 < argc)
			return print_map_file(argv[i + 1]);
		if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else if (!strcmp(argv[i], "--fd") && i + 1 < argc)
			fd = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--file") && i + 1 < argc)
			file = argv[++i];
		else {
			fprintf(stderr, "usage: stagectl [--device PATH | --fd N | --file PATH]\n"
					"       stagectl --map-file PATH   (check and print a stage-map file)\n"
					"       stagectl attach --map FILE [--binary PATH] | detach | probes\n"
					"                                  (a stage map on an unmodified binary, uprobes)\n");
			return 2;
		}
	}
	if (fd < 0) {
		fd = open(file ? file : device, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			fprintf(stderr, "stagectl: %s: %s\n", file ? file : device, strerror(errno));
			return 1;
		}
		is_device = !file;
	}
	if (is_device) {
		if (ioctl(fd, STAGEVM_IOC_INFO, &info) < 0) {
			fprintf(stderr, "stagectl: %s: STAGEVM_IOC_INFO: %s\n", device, strerror(errno));
			return 1;
		}
		len = (size_t)info.area_size;
		printf("device %s: area %llu bytes at %#llx, %u vCPUs, %u ring entries, %s, last "
		       "status %s\n",
		       device, (unsigned long long)info.area_size, (unsigned long long)info.area_phys,
		       info.num_vcpus, info.ring_entries,
		       info.registered ? "registered" : "not registered",
		       stagevm_status_name(info.last_status));
		if (ioctl(fd, STAGEVM_IOC_STATS, &stats) == 0)
			printf("module: registrations %llu failures %llu unregistrations %llu "
			       "attached threads %lld (attaches %llu detaches %llu) mmaps %llu\n",
			       (unsigned long long)stats.registrations,
			       (unsigned long long)stats.register_failures,
			       (unsigned long long)stats.unregistrations, (long long)stats.attached,
			       (unsigned long long)stats.attaches, (unsigned long long)stats.detaches,
			       (unsigned long long)stats.mmaps);
		if (!info.registered)
			return 0;
	} else {
		struct stat st;

		if (fstat(fd, &st) < 0) {
			perror("stagectl: fstat");
			return 1;
		}
		len = (size_t)st.st_size;
	}
	if (len < STAGEVM_PAGE_SIZE) {
		fprintf(stderr, "stagectl: area of %zu bytes is too small\n", len);
		return 1;
	}
	base = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		perror("stagectl: mmap");
		return 1;
	}
	h = (const void *)base;
	if (h->magic != STAGEVM_AREA_MAGIC || h->version != STAGEVM_ABI_VERSION ||
	    stagevm_layout_init(&l, h->num_vcpus, h->num_stages, h->ring_entries)) {
		fprintf(stderr, "stagectl: no valid stage area (magic %#llx version %u)\n",
			(unsigned long long)h->magic, h->version);
		return 1;
	}
	stagevm_layout_apply_flags(&l, h->flags);
	if (stagevm_used_bytes(&l) > len) {
		fprintf(stderr, "stagectl: the layout needs %llu bytes, the area has %zu\n",
			(unsigned long long)stagevm_used_bytes(&l), len);
		return 1;
	}
	printf("area: ABI v%u, %u vCPUs, %u stages, %u ring entries, %llu bytes, guest TSC %llu "
	       "kHz, %s\n",
	       h->version, l.num_vcpus, l.num_stages, l.ring_entries,
	       (unsigned long long)h->area_size, (unsigned long long)h->tsc_khz,
	       l.latency ? "counters (minor 2), latency (minor 4)" :
	       l.counters ? "counters (minor 2)" : "rings only");
	if (l.counters)
		printf("registered at guest TSC %llu\n", (unsigned long long)h->register_tsc);
	m = (const void *)(base + STAGEVM_STAGE_MAP_OFFSET);
	for (;;) {
		epoch = load(&m->epoch);
		if (epoch & 1)
			continue;
		for (s = 0; s < STAGEVM_MAX_STAGES; s++)
			masks[s] = __atomic_load_n(&m->vcpus[s], __ATOMIC_RELAXED);
		minor = __atomic_load_n(&m->minor, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (load(&m->epoch) == epoch)
			break;
	}
	trace = load(&m->trace_every);
	printf("stage map epoch %llu%s\n", (unsigned long long)epoch,
	       epoch ? "" : " (none published: every vCPU serves every stage)");
	if (epoch) {
		char what[64];

		if (minor < 2)
			snprintf(what, sizeof(what), "n/a (minor < 2)");
		else if (trace == 0)
			snprintf(what, sizeof(what), "off");
		else
			snprintf(what, sizeof(what), "every %llu event(s) per vCPU",
				 (unsigned long long)trace);
		printf("host ABI minor %llu: the guest reports through %s; trace %s\n",
		       (unsigned long long)minor, l.counters && minor >= 2 ? "counters" : "rings",
		       what);
	}
	for (s = 0; s < l.num_stages; s++) {
		char name[33], vcpus[200];

		memcpy(name, base + STAGEVM_STAGE_DESCS_OFFSET + 32u * s, 32);
		name[32] = 0;
		print_vcpus(epoch ? masks[s] : ~0ull >> (64 - l.num_vcpus), vcpus, sizeof(vcpus));
		printf("  stage %2u %-32s vCPUs %-12s mask %#llx\n", s, name, vcpus,
		       (unsigned long long)masks[s]);
	}
	for (v = 0; v < l.num_vcpus; v++) {
		const uint8_t *ring = base + stagevm_ring_offset(&l, v);
		const struct stagevm_vcpu_state *vs =
			(const void *)(base + stagevm_vcpu_state_offset(v));
		uint64_t head = load(ring + STAGEVM_RING_HEAD_OFF);
		uint64_t tail = load(ring + STAGEVM_RING_TAIL_OFF);

		printf("  vcpu %2u ring head %llu tail %llu pending %llu full_backoffs %llu "
		       "trace_dropped %llu  runq %u parked %u fallbacks %u\n",
		       v, (unsigned long long)head, (unsigned long long)tail,
		       (unsigned long long)(head - tail),
		       (unsigned long long)load(ring + STAGEVM_RING_BACKOFFS_OFF),
		       (unsigned long long)load(ring + STAGEVM_RING_TRACE_DROPPED_OFF), vs->runq_depth,
		       vs->parked, vs->fallbacks);
	}
	for (v = 0; l.counters && v < l.num_vcpus; v++)
		print_counters(base, &l, v);
	for (v = 0; l.latency && v < l.num_vcpus; v++)
		print_latency(base, &l, v);
	munmap(base, len);
	return 0;
}
