/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stagectl attach / detach / probes: stage maps on unmodified binaries
 * (the module's uprobes, guest-agent/linux/module/probes.c).
 *
 *   stagectl attach --binary PATH --map FILE [--device PATH]
 *       Reads the stage-map file (libstage/stagemap_file.h), resolves every
 *       symbol of its `stage` and `request` lines in PATH's ELF symbol
 *       tables (.symtab, then .dynsym; defined functions only) to a file
 *       offset, registers the map's stages with the VMM when nothing is
 *       registered yet (their names, in the file's order) or checks them
 *       against the registered ones, and attaches one uprobe per symbol.
 *       Anything wrong - a symbol PATH does not define, a stage the guest did
 *       not register, more probes than STAGEVM_MAX_PROBES - is refused with
 *       a message naming it before anything is attached. The binary is
 *       opened once: its symbols are resolved from that descriptor and the
 *       same descriptor goes to the module. The resolution is bounded (at
 *       most one .symtab and one .dynsym, 2^22 entries, 64 PT_LOADs; see
 *       STAGECTL_MAX_SYMBOLS) and a file beyond a bound is refused, naming it.
 *   stagectl detach [--device PATH]
 *       Removes the map's uprobes; the probed threads get every CPU back.
 *   stagectl probes [--device PATH]
 *       One line: probes attached, hits per stage, counted, migrations,
 *       requests begun, ended (completions counted), timed and dropped.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
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

struct wanted {
	const char *sym;
	unsigned int stage;
	int request;     /* a `request` symbol (STAGEVM_PROBE_REQUEST) */
	uint64_t offset; /* 0 until found (a function never starts at offset 0) */
};

/* Work bounds of the ELF resolution: a crafted binary (say 65,535 section
 * headers, all SHT_SYMTAB over one large table) must not keep attach busy.
 * At most one SHT_SYMTAB and one SHT_DYNSYM section are read (the ELF gABI
 * allows one of each; a file with more is refused), holding at most
 * STAGECTL_MAX_SYMBOLS entries between them, through at most
 * STAGECTL_MAX_LOADS PT_LOAD segments. Each entry then costs one name
 * length bounded by the longest wanted name, a binary search over the
 * wanted names (at most 9 comparisons for 256) and, on a match, one look
 * through the segments: attach's whole resolution is O(sections +
 * segments + entries x 9 x 1,024 bytes), seconds at worst, milliseconds
 * for real binaries.
 */
#define STAGECTL_MAX_SYMBOLS (1u << 22)
#define STAGECTL_MAX_LOADS 64

/* The binary's mapped bytes and what resolving needs of them. */
struct elf_view {
	const uint8_t *base;
	size_t size;
	const Elf64_Ehdr *eh;
	const Elf64_Phdr *loads[STAGECTL_MAX_LOADS]; /* its PT_LOAD headers */
	unsigned int nloads;
	struct wanted *w;
	unsigned int n;
	unsigned int *order;  /* indices of w sorted by symbol name */
	size_t longest;   /* bytes of the longest wanted name */
};

/* A checked view of bytes [off, off + len) of the file; NULL when outside. */
static const void *at(const uint8_t *base, size_t size, uint64_t off, uint64_t len)
{
	if (off > size || len > size - off)
		return NULL;
	return base + off;
}

/* File offset of virtual address `va` through the PT_LOAD segments; 0 when
 * no segment holds it in its file bytes.
 */
static uint64_t va_to_offset(const struct elf_view *v, uint64_t va)
{
	for (unsigned int i = 0; i < v->nloads; i++) {
		const Elf64_Phdr *ph = v->loads[i];

		if (va >= ph->p_vaddr && va - ph->p_vaddr < ph->p_filesz)
			return va - ph->p_vaddr + ph->p_offset;
	}
	return 0;
}

static const struct wanted *sort_base;

static int by_name(const void *a, const void *b)
{
	return strcmp(sort_base[*(const unsigned int *)a].sym, sort_base[*(const unsigned int *)b].sym);
}

/* The index in v->w of the wanted symbol `name`, or -1: a binary search
 * (the map file names each symbol once).
 */
static int find_wanted(const struct elf_view *v, const char *name)
{
	unsigned int lo = 0, hi = v->n;

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;
		int c = strcmp(name, v->w[v->order[mid]].sym);

		if (!c)
			return (int)v->order[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

/* Resolves the wanted symbols in one symbol table section (its entries
 * were counted against STAGECTL_MAX_SYMBOLS by the caller).
 */
static void resolve_section(const struct elf_view *v, const Elf64_Shdr *sh)
{
	const Elf64_Shdr *strh;
	const char *strtab;

	if (sh->sh_entsize != sizeof(Elf64_Sym) || sh->sh_link >= v->eh->e_shnum ||
	    !at(v->base, v->size, sh->sh_offset, sh->sh_size))
		return;
	strh = at(v->base, v->size, v->eh->e_shoff + (uint64_t)sh->sh_link * sizeof(*strh), sizeof(*strh));
	if (!strh)
		return;
	strtab = at(v->base, v->size, strh->sh_offset, strh->sh_size);
	if (!strtab)
		return;
	for (uint64_t k = 0; k < sh->sh_size / sizeof(Elf64_Sym); k++) {
		const Elf64_Sym *s = (const Elf64_Sym *)(v->base + sh->sh_offset) + k;
		const char *name;
		size_t room, lim;
		int i;

		if (ELF64_ST_TYPE(s->st_info) != STT_FUNC || s->st_shndx == SHN_UNDEF || s->st_name >= strh->sh_size)
			continue;
		name = strtab + s->st_name;
		room = strh->sh_size - s->st_name;
		lim = room < v->longest + 1 ? room : v->longest + 1;
		/* No NUL in the first `lim` bytes: longer than every wanted
		 * name, or running out of the table; it matches none.
		 */
		if (strnlen(name, lim) == lim)
			continue;
		i = find_wanted(v, name);
		if (i >= 0 && !v->w[i].offset)
			v->w[i].offset = va_to_offset(v, s->st_value);
	}
}

/* Finds every wanted symbol in the ELF file open as `fd` (named `path` in
 * messages), the descriptor that is then handed to the module; `*st` gets
 * its fstat. 0, or 1 after saying what is wrong: the first missing symbol
 * and its stage, or the work bound (above) the file exceeds.
 */
static int resolve(int fd, const char *path, struct stat *st, struct wanted *w, unsigned int n,
		   const struct stagemap_file *m)
{
	struct elf_view v = { .w = w, .n = n };
	const Elf64_Shdr *tabs[2] = { NULL, NULL }; /* .symtab, .dynsym */
	unsigned int order[STAGEVM_MAX_PROBES];
	uint64_t entries = 0;
	uint8_t *base;
	int rc = 1;

	if (fstat(fd, st) < 0) {
		fprintf(stderr, "stagectl: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (!S_ISREG(st->st_mode)) {
		fprintf(stderr, "stagectl: %s: not a regular file\n", path);
		return 1;
	}
	base = mmap(NULL, st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (base == MAP_FAILED) {
		fprintf(stderr, "stagectl: %s: mmap: %s\n", path, strerror(errno));
		return 1;
	}
	v.base = base;
	v.size = st->st_size;
	v.eh = at(base, v.size, 0, sizeof(*v.eh));
	if (!v.eh || memcmp(v.eh->e_ident, ELFMAG, SELFMAG) || v.eh->e_ident[EI_CLASS] != ELFCLASS64 ||
	    v.eh->e_shentsize != sizeof(Elf64_Shdr) || v.eh->e_phentsize != sizeof(Elf64_Phdr)) {
		fprintf(stderr, "stagectl: %s: not a 64-bit ELF file\n", path);
		goto out;
	}
	for (unsigned int i = 0; i < v.eh->e_phnum; i++) {
		const Elf64_Phdr *ph = at(base, v.size, v.eh->e_phoff + (uint64_t)i * sizeof(*ph), sizeof(*ph));

		if (!ph || ph->p_type != PT_LOAD)
			continue;
		if (v.nloads == STAGECTL_MAX_LOADS) {
			fprintf(stderr, "stagectl: %s: more than %u PT_LOAD segments (the limit); nothing attached\n",
				path, STAGECTL_MAX_LOADS);
			goto out;
		}
		v.loads[v.nloads++] = ph;
	}
	/* One pass over the section headers (at most 65,535): the symbol
	 * tables, at most one of each kind.
	 */
	for (unsigned int i = 0; i < v.eh->e_shnum; i++) {
		const Elf64_Shdr *sh = at(base, v.size, v.eh->e_shoff + (uint64_t)i * sizeof(*sh), sizeof(*sh));
		unsigned int kind;

		if (!sh || (sh->sh_type != SHT_SYMTAB && sh->sh_type != SHT_DYNSYM))
			continue;
		kind = sh->sh_type == SHT_DYNSYM;
		if (tabs[kind]) {
			fprintf(stderr, "stagectl: %s: more than one %s section (section %u): stagectl reads at most one "
				"SHT_SYMTAB and one SHT_DYNSYM, as ELF allows; nothing attached\n",
				path, kind ? "SHT_DYNSYM" : "SHT_SYMTAB", i);
			goto out;
		}
		tabs[kind] = sh;
		entries += sh->sh_size / sizeof(Elf64_Sym);
	}
	if (entries > STAGECTL_MAX_SYMBOLS) {
		fprintf(stderr, "stagectl: %s: %llu symbol table entries, more than the limit of %u; nothing attached\n",
			path, (unsigned long long)entries, STAGECTL_MAX_SYMBOLS);
		goto out;
	}
	for (unsigned int i = 0; i < n; i++) {
		size_t len = strlen(w[i].sym);

		order[i] = i;
		v.longest = len > v.longest ? len : v.longest;
	}
	sort_base = w;
	qsort(order, n, sizeof(order[0]), by_name);
	v.order = order;
	/* .symtab first (every function of an unstripped binary), then .dynsym
	 * (what a stripped distribution binary keeps).
	 */
	for (unsigned int kind = 0; kind < 2; kind++)
		if (tabs[kind])
			resolve_section(&v, tabs[kind]);
	for (unsigned int i = 0; i < n; i++)
		if (!w[i].offset) {
			fprintf(stderr, "stagectl: symbol %s (stage %s) is not a function defined in %s; nothing attached\n",
				w[i].sym, m->stages[w[i].stage].name, path);
			goto out;
		}
	rc = 0;
out:
	munmap(base, v.size);
	return rc;
}

/* The registered stages agree with the map's, or are registered now from
 * it. 0, or 1 after saying which stage disagrees.
 */
static int check_registration(int dev, const struct stagemap_file *m, const char *map)
{
	struct stagevm_ioc_info info;
	struct stagevm_ioc_register reg = { .num_stages = m->nstages };
	char names[STAGEVM_MAX_STAGES][33];
	const struct stagevm_area_header *h;

	if (ioctl(dev, STAGEVM_IOC_INFO, &info) < 0) {
		fprintf(stderr, "stagectl: STAGEVM_IOC_INFO: %s\n", strerror(errno));
		return 1;
	}
	if (!info.registered) {
		for (unsigned int s = 0; s < m->nstages; s++)
			strncpy(reg.names[s], m->stages[s].name, sizeof(reg.names[s]));
		if (ioctl(dev, STAGEVM_IOC_REGISTER, &reg) < 0) {
			fprintf(stderr, "stagectl: registering the map's %u stages: %s (host status %s)\n",
				m->nstages, strerror(errno), stagevm_status_name(reg.status));
			return 1;
		}
		printf("stagectl: registered %u stages from %s\n", m->nstages, map);
		return 0;
	}
	if (m->nstages > info.num_stages) {
		fprintf(stderr, "stagectl: %s has %u stages, the guest registered %u; nothing attached\n", map,
			m->nstages, info.num_stages);
		return 1;
	}
	h = mmap(NULL, info.ro_bytes, PROT_READ, MAP_SHARED, dev, 0);
	if (h == MAP_FAILED) {
		fprintf(stderr, "stagectl: mmap of /dev/stagevm: %s\n", strerror(errno));
		return 1;
	}
	for (unsigned int s = 0; s < m->nstages; s++) {
		const struct stagevm_stage_desc *d =
			(const void *)((const char *)h + STAGEVM_STAGE_DESCS_OFFSET) + s * sizeof(*d);

		memcpy(names[s], d->name, 32);
		names[s][32] = 0;
		if (strcmp(names[s], m->stages[s].name)) {
			fprintf(stderr, "stagectl: stage %u is '%s' in %s but '%s' in the guest's registration; nothing attached\n",
				s, m->stages[s].name, map, names[s]);
			munmap((void *)h, info.ro_bytes);
			return 1;
		}
	}
	munmap((void *)h, info.ro_bytes);
	return 0;
}

void (*stagectl_attach_hook)(const char *binary);

int stagectl_attach(int argc, char **argv)
{
	const char *binary = NULL, *map = NULL, *device = STAGEVM_DEVICE_PATH, *why = NULL;
	struct stagevm_ioc_probe probes[STAGEVM_MAX_PROBES];
	struct wanted w[STAGEVM_MAX_PROBES];
	struct stagevm_ioc_attach_map req = { 0 };
	struct stagemap_file m;
	struct stat st;
	unsigned int n = 0, line = 0;
	int r, dev, bin, rc = 1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--binary") && i + 1 < argc)
			binary = argv[++i];
		else if (!strcmp(argv[i], "--map") && i + 1 < argc)
			map = argv[++i];
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else
			map = NULL, i = argc;
	}
	if (!map) {
		fprintf(stderr, "usage: stagectl attach --map FILE [--binary PATH] [--device PATH]\n"
				"       (PATH: the binary the map's symbols are from; default its `binary` line)\n");
		return 2;
	}
	r = stagemap_file_load(map, &m, &line, &why);
	if (r < 0) {
		if (r == -EINVAL)
			fprintf(stderr, "stagectl: %s: line %u: %s\n", map, line, why);
		else
			fprintf(stderr, "stagectl: %s: %s\n", map, strerror(-r));
		stagemap_file_free(&m);
		return 1;
	}
	if (!binary)
		binary = m.binary;
	if (!binary) {
		fprintf(stderr, "stagectl: %s names no binary: give --binary PATH\n", map);
		goto out;
	}
	for (unsigned int s = 0; s < m.nstages; s++)
		for (unsigned int k = 0; k < m.stages[s].nsyms + (m.request_stage == (int)s ? m.nrequest : 0); k++) {
			if (n == STAGEVM_MAX_PROBES) {
				fprintf(stderr, "stagectl: %s has more than %u symbols; nothing attached\n", map,
					STAGEVM_MAX_PROBES);
				goto out;
			}
			w[n++] = (struct wanted){ k < m.stages[s].nsyms ? m.stages[s].syms[k]
									: m.request[k - m.stages[s].nsyms],
						  s, k >= m.stages[s].nsyms, 0 };
		}
	/* One open: the file whose symbols give the offsets is the file the
	 * module probes. Opening the path again for the module would let a
	 * rename or symlink swap in between put the probes (int3s at offsets
	 * computed for this file) into another one, libc say.
	 */
	bin = open(binary, O_RDONLY | O_CLOEXEC);
	if (bin < 0) {
		fprintf(stderr, "stagectl: %s: %s\n", binary, strerror(errno));
		goto out;
	}
	if (resolve(bin, binary, &st, w, n, &m)) {
		close(bin);
		goto out;
	}
	if (stagectl_attach_hook)
		stagectl_attach_hook(binary);
	dev = open(device, O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		fprintf(stderr, "stagectl: %s: %s\n", device, strerror(errno));
		close(bin);
		goto out;
	}
	if (!check_registration(dev, &m, map)) {
		for (unsigned int i = 0; i < n; i++)
			probes[i] = (struct stagevm_ioc_probe){
				.offset = w[i].offset, .stage = w[i].stage,
				.flags = w[i].request ? STAGEVM_PROBE_REQUEST : 0 };
		req = (struct stagevm_ioc_attach_map){ .fd = bin, .num_probes = n,
						       .probes = (uint64_t)(uintptr_t)probes };
		if (ioctl(dev, STAGEVM_IOC_ATTACH_MAP, &req) < 0) {
			fprintf(stderr, "stagectl: attaching %u uprobes to %s: %s%s\n", n, binary, strerror(errno),
				errno == EOPNOTSUPP ? " (the guest kernel has no CONFIG_UPROBES)" :
				errno == EBUSY ? " (a map is attached: stagectl detach)" : "");
		} else {
			printf("stagectl: attached %s to %s (inode %llu): %u uprobes, %u stages\n", map, binary,
			       (unsigned long long)st.st_ino, n, m.nstages);
			for (unsigned int i = 0; i < n; i++)
				printf("stagectl:   stage %s: %s at file offset %#llx%s\n", m.stages[w[i].stage].name,
				       w[i].sym, (unsigned long long)w[i].offset,
				       w[i].request ? " (request: entry ends one, return begins one)" : "");
			rc = 0;
		}
	}
	close(bin);
	close(dev);
out:
	stagemap_file_free(&m);
	return rc;
}

static int open_device(int argc, char **argv)
{
	const char *device = STAGEVM_DEVICE_PATH;
	int fd;

	if (argc == 3 && !strcmp(argv[1], "--device"))
		device = argv[2];
	else if (argc != 1) {
		fprintf(stderr, "usage: stagectl %s [--device PATH]\n", argv[0]);
		return -2;
	}
	fd = open(device, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "stagectl: %s: %s\n", device, strerror(errno));
	return fd;
}

int stagectl_detach(int argc, char **argv)
{
	int fd = open_device(argc, argv), r;

	if (fd < 0)
		return fd == -2 ? 2 : 1;
	r = ioctl(fd, STAGEVM_IOC_DETACH_MAP);
	if (r < 0)
		fprintf(stderr, "stagectl: detach: %s\n", errno == ENOENT ? "no stage map is attached" : strerror(errno));
	else
		printf("stagectl: stage map detached\n");
	close(fd);
	return r < 0 ? 1 : 0;
}

int stagectl_probes(int argc, char **argv)
{
	struct stagevm_ioc_probe_stats st;
	int fd = open_device(argc, argv), r;

	if (fd < 0)
		return fd == -2 ? 2 : 1;
	r = ioctl(fd, STAGEVM_IOC_PROBE_STATS, &st);
	close(fd);
	if (r < 0) {
		fprintf(stderr, "stagectl: probes: %s\n", strerror(errno));
		return 1;
	}
	printf("stagectl: probes attached %u, hits", st.attached);
	for (unsigned int s = 0; s < st.num_stages && s < STAGEVM_MAX_STAGES; s++)
		printf(" %llu", (unsigned long long)st.hits[s]);
	printf(", counted %llu, not counted %llu, migrations %llu, affinity failures %llu, threads reset %llu, threads lost %llu, "
	       "threads held %llu, requests begun %llu ended %llu timed %llu dropped %llu\n",
	       (unsigned long long)st.counted, (unsigned long long)st.not_counted,
	       (unsigned long long)st.migrations, (unsigned long long)st.affinity_failures,
	       (unsigned long long)st.threads_reset, (unsigned long long)st.threads_lost,
	       (unsigned long long)st.threads_held,
	       (unsigned long long)st.requests_begun, (unsigned long long)st.requests_ended,
	       (unsigned long long)st.requests_timed, (unsigned long long)st.requests_dropped);
	return 0;
}
