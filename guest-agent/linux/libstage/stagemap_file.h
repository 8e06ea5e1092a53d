/* SPDX-License-Identifier: Apache-2.0 */
/* Stage-map files: which functions of an unmodified binary start which
 * stage (`stagesim discover` writes them, issue 25; the agent attaches them
 * with uprobes, issue 27; libstage users can read them).
 *
 * Format, version 1: UTF-8 text, one directive per line, tokens separated
 * by spaces or tabs, `#` starts a comment that runs to the end of the line,
 * blank lines are ignored:
 *
 *   stagemap 1                   first directive, required
 *   binary PATH                  optional, at most once: the binary the
 *                                symbols are from
 *   stage NAME SYMBOL...         1..STAGEVM_MAX_STAGES (16) stages, in id
 *                                order: entering any SYMBOL starts stage NAME
 *   request NAME SYMBOL...       optional, at most once, after stage NAME:
 *                                the functions where a request starts (the
 *                                thread waits for its client); a thread
 *                                entering them is in stage NAME (the
 *                                agent's uprobes: the outermost entry ends
 *                                the thread's request, the return from it
 *                                begins the next; guest-agent/linux/README.md)
 *
 * NAME: 1..31 bytes of [A-Za-z0-9_.-]. SYMBOL: 1..1023 bytes without
 * whitespace or '#' (mangled names as in the binary's symbol tables); a
 * symbol appears once in the whole file. At most 4096 symbols per file and
 * lines of at most 64 KiB.
 */
#ifndef LIBSTAGE_STAGEMAP_FILE_H
#define LIBSTAGE_STAGEMAP_FILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STAGEMAP_FILE_VERSION 1
#define STAGEMAP_FILE_MAX_STAGES 16
#define STAGEMAP_FILE_NAME_MAX 31
#define STAGEMAP_FILE_SYMBOL_MAX 1023
#define STAGEMAP_FILE_MAX_SYMBOLS 4096
#define STAGEMAP_FILE_LINE_MAX 65536

struct stagemap_file_stage {
	char name[STAGEMAP_FILE_NAME_MAX + 1];
	unsigned int nsyms;
	char **syms; /* nsyms strings */
};

struct stagemap_file {
	char *binary; /* NULL when the file names none */
	unsigned int nstages;
	struct stagemap_file_stage stages[STAGEMAP_FILE_MAX_STAGES];
	int request_stage; /* index into stages, or -1: no request line */
	unsigned int nrequest;
	char **request; /* nrequest strings */
};

/* Parses `len` bytes of `text` into `*out` (which the caller frees with
 * stagemap_file_free, also after an error). Returns 0, -EINVAL for a
 * malformed file (with `*bad_line`, if not NULL, the 1-based line and
 * `why` a static message) or -ENOMEM.
 */
int stagemap_file_parse(const char *text, size_t len, struct stagemap_file *out,
			unsigned int *bad_line, const char **why);

/* Reads and parses the file at `path` (at most 16 MiB). Returns as
 * stagemap_file_parse, or -errno of opening or reading it, -EFBIG.
 */
int stagemap_file_load(const char *path, struct stagemap_file *out, unsigned int *bad_line,
		       const char **why);

/* Writes `m` in canonical form (no comments, one space between tokens).
 * Returns 0 or -EIO.
 */
int stagemap_file_write(FILE *f, const struct stagemap_file *m);

/* Frees what a parse allocated and empties `*m`. */
void stagemap_file_free(struct stagemap_file *m);

#ifdef __cplusplus
}
#endif

#endif /* LIBSTAGE_STAGEMAP_FILE_H */
