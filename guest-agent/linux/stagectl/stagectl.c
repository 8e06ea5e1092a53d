/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagectl: prints the stage channel's state from the mapped area - the
 * header, the host's stage map (epoch, vCPU mask and name per stage), each
 * vCPU's ring counters and scheduling hints - and, on /dev/stagevm, the
 * module's counters. Read-only.
 *
 *   stagectl [--device PATH | --fd N | --file PATH]
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

int main(int argc, char **argv)
{
	const char *device = STAGEVM_DEVICE_PATH, *file = NULL;
	const struct stagevm_area_header *h;
	const struct stagevm_stage_map *m;
	struct stagevm_ioc_info info;
	struct stagevm_ioc_stats stats;
	struct stagevm_layout l;
	uint64_t epoch, masks[STAGEVM_MAX_STAGES];
	int fd = -1, is_device = 0, i;
	size_t len;
	uint8_t *base;
	uint32_t v, s;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else if (!strcmp(argv[i], "--fd") && i + 1 < argc)
			fd = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--file") && i + 1 < argc)
			file = argv[++i];
		else {
			fprintf(stderr, "usage: stagectl [--device PATH | --fd N | --file PATH]\n");
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
	    stagevm_layout_init(&l, h->num_vcpus, h->num_stages, h->ring_entries) ||
	    stagevm_used_bytes(&l) > len) {
		fprintf(stderr, "stagectl: no valid stage area (magic %#llx version %u)\n",
			(unsigned long long)h->magic, h->version);
		return 1;
	}
	printf("area: ABI v%u, %u vCPUs, %u stages, %u ring entries, %llu bytes, guest TSC %llu "
	       "kHz\n",
	       h->version, l.num_vcpus, l.num_stages, l.ring_entries,
	       (unsigned long long)h->area_size, (unsigned long long)h->tsc_khz);
	m = (const void *)(base + STAGEVM_STAGE_MAP_OFFSET);
	for (;;) {
		epoch = load(&m->epoch);
		if (epoch & 1)
			continue;
		for (s = 0; s < STAGEVM_MAX_STAGES; s++)
			masks[s] = __atomic_load_n(&m->vcpus[s], __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (load(&m->epoch) == epoch)
			break;
	}
	printf("stage map epoch %llu%s\n", (unsigned long long)epoch,
	       epoch ? "" : " (none published: every vCPU serves every stage)");
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

		printf("  vcpu %2u ring head %llu tail %llu pending %llu full_backoffs %llu  runq %u "
		       "parked %u fallbacks %u\n",
		       v, (unsigned long long)head, (unsigned long long)tail,
		       (unsigned long long)(head - tail),
		       (unsigned long long)load(ring + STAGEVM_RING_BACKOFFS_OFF), vs->runq_depth,
		       vs->parked, vs->fallbacks);
	}
	munmap(base, len);
	return 0;
}
