/* SPDX-License-Identifier: Apache-2.0 */
/* Stage-map file parser and writer (format: stagemap_file.h). Standalone:
 * no channel state, so stagectl builds it too.
 */
#include "stagemap_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES (16u << 20)
#define MAX_TOKENS (STAGEMAP_FILE_MAX_SYMBOLS + 2)

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

static int name_ok(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || n > STAGEMAP_FILE_NAME_MAX)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

struct token {
	const char *s;
	size_t n;
};

/* Splits [p, end) into tokens up to a '#'; returns the count, or -1 when
 * there are more than `max`.
 */
static int split(const char *p, const char *end, struct token *t, int max)
{
	int n = 0;

	while (p < end) {
		while (p < end && is_space(*p))
			p++;
		if (p == end || *p == '#')
			break;
		if (n == max)
			return -1;
		t[n].s = p;
		while (p < end && !is_space(*p) && *p != '#')
			p++;
		t[n].n = (size_t)(p - t[n].s);
		n++;
	}
	return n;
}

static int tok_is(const struct token *t, const char *word)
{
	return t->n == strlen(word) && !memcmp(t->s, word, t->n);
}

/* Every symbol of the file so far, to refuse duplicates. */
struct seen {
	char **v;
	unsigned int n;
};

static int seen_has(const struct seen *s, const struct token *t)
{
	unsigned int i;

	for (i = 0; i < s->n; i++)
		if (strlen(s->v[i]) == t->n && !memcmp(s->v[i], t->s, t->n))
			return 1;
	return 0;
}

/* Copies tokens t[0..n) into a new array of strings. */
static char **dup_symbols(const struct token *t, int n, struct seen *all, const char **why)
{
	char **v = calloc((size_t)n, sizeof(*v));
	int i;

	if (!v)
		return NULL;
	for (i = 0; i < n; i++) {
		if (t[i].n > STAGEMAP_FILE_SYMBOL_MAX || seen_has(all, &t[i])) {
			*why = t[i].n > STAGEMAP_FILE_SYMBOL_MAX ? "symbol longer than 1023 bytes"
								 : "symbol listed twice";
			goto bad;
		}
		v[i] = strndup(t[i].s, t[i].n);
		if (!v[i]) {
			*why = NULL;
			goto bad;
		}
		all->v[all->n++] = v[i];
	}
	return v;
bad:
	while (i-- > 0) {
		all->n--;
		free(v[i]);
	}
	free(v);
	return NULL;
}

int stagemap_file_parse(const char *text, size_t len, struct stagemap_file *out,
			unsigned int *bad_line, const char **why)
{
	struct token *t = calloc(MAX_TOKENS, sizeof(*t));
	struct seen all = { calloc(STAGEMAP_FILE_MAX_SYMBOLS, sizeof(char *)), 0 };
	const char *p = text, *end = text + len, *msg = NULL;
	unsigned int line = 0;
	int version = 0, ret = -EINVAL, n, i;

	memset(out, 0, sizeof(*out));
	out->request_stage = -1;
	if (!t || !all.v) {
		ret = -ENOMEM;
		goto done;
	}
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;

		line++;
		if ((size_t)(le - p) > STAGEMAP_FILE_LINE_MAX) {
			msg = "line longer than 64 KiB";
			goto done;
		}
		if (memchr(p, '\0', (size_t)(le - p))) {
			msg = "NUL byte in the file";
			goto done;
		}
		n = split(p, le, t, MAX_TOKENS);
		p = nl ? nl + 1 : end;
		if (n == 0)
			continue;
		if (n < 0) {
			msg = "too many tokens on one line";
			goto done;
		}
		if (!version) {
			if (!tok_is(&t[0], "stagemap") || n != 2 || !tok_is(&t[1], "1")) {
				msg = "the first directive must be 'stagemap 1'";
				goto done;
			}
			version = 1;
		} else if (tok_is(&t[0], "binary")) {
			if (n != 2 || out->binary) {
				msg = n != 2 ? "binary takes one path" : "binary given twice";
				goto done;
			}
			out->binary = strndup(t[1].s, t[1].n);
			if (!out->binary) {
				ret = -ENOMEM;
				goto done;
			}
		} else if (tok_is(&t[0], "stage") || tok_is(&t[0], "request")) {
			int is_req = tok_is(&t[0], "request");
			struct stagemap_file_stage *st = NULL;
			char **syms;

			if (n < 3) {
				msg = "expected a name and at least one symbol";
				goto done;
			}
			if (!name_ok(t[1].s, t[1].n)) {
				msg = "stage name: 1..31 bytes of [A-Za-z0-9_.-]";
				goto done;
			}
			for (i = 0; i < (int)out->nstages; i++)
				if (strlen(out->stages[i].name) == t[1].n &&
				    !memcmp(out->stages[i].name, t[1].s, t[1].n))
					st = &out->stages[i];
			if (is_req ? (!st || out->request_stage >= 0) : (st != NULL)) {
				msg = !is_req ? "stage defined twice"
				      : !st   ? "request names a stage not defined before it"
					      : "request given twice";
				goto done;
			}
			if (!is_req && out->nstages == STAGEMAP_FILE_MAX_STAGES) {
				msg = "more than 16 stages";
				goto done;
			}
			if (all.n + (unsigned int)(n - 2) > STAGEMAP_FILE_MAX_SYMBOLS) {
				msg = "more than 4096 symbols";
				goto done;
			}
			syms = dup_symbols(&t[2], n - 2, &all, &msg);
			if (!syms) {
				if (!msg)
					ret = -ENOMEM;
				goto done;
			}
			if (is_req) {
				out->request_stage = (int)(st - out->stages);
				out->request = syms;
				out->nrequest = (unsigned int)(n - 2);
			} else {
				st = &out->stages[out->nstages++];
				memcpy(st->name, t[1].s, t[1].n);
				st->name[t[1].n] = '\0';
				st->syms = syms;
				st->nsyms = (unsigned int)(n - 2);
			}
		} else {
			msg = "unknown directive (stagemap, binary, stage, request)";
			goto done;
		}
	}
	if (!version)
		msg = "empty: no 'stagemap 1' line";
	else if (out->nstages == 0)
		msg = "no stage";
	else
		ret = 0;
done:
	if (ret == -EINVAL) {
		if (bad_line)
			*bad_line = line;
		if (why)
			*why = msg;
	}
	free(t);
	free(all.v);
	return ret;
}

int stagemap_file_load(const char *path, struct stagemap_file *out, unsigned int *bad_line,
		       const char **why)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0, got;
	int ret;

	memset(out, 0, sizeof(*out));
	out->request_stage = -1;
	if (!f)
		return -errno;
	buf = malloc(MAX_FILE_BYTES + 1);
	if (!buf) {
		fclose(f);
		return -ENOMEM;
	}
	while ((got = fread(buf + len, 1, MAX_FILE_BYTES + 1 - len, f)) > 0)
		len += got;
	ret = ferror(f) ? -EIO : len > MAX_FILE_BYTES ? -EFBIG : 0;
	fclose(f);
	if (!ret)
		ret = stagemap_file_parse(buf, len, out, bad_line, why);
	free(buf);
	return ret;
}

static void put_list(FILE *f, const char *word, const char *name, char **v, unsigned int n)
{
	unsigned int i;

	fprintf(f, "%s %s", word, name);
	for (i = 0; i < n; i++)
		fprintf(f, " %s", v[i]);
	fputc('\n', f);
}

int stagemap_file_write(FILE *f, const struct stagemap_file *m)
{
	unsigned int s;

	fprintf(f, "stagemap %d\n", STAGEMAP_FILE_VERSION);
	if (m->binary)
		fprintf(f, "binary %s\n", m->binary);
	for (s = 0; s < m->nstages; s++)
		put_list(f, "stage", m->stages[s].name, m->stages[s].syms, m->stages[s].nsyms);
	if (m->request_stage >= 0)
		put_list(f, "request", m->stages[m->request_stage].name, m->request, m->nrequest);
	return ferror(f) ? -EIO : 0;
}

static void free_list(char **v, unsigned int n)
{
	unsigned int i;

	if (!v)
		return;
	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void stagemap_file_free(struct stagemap_file *m)
{
	unsigned int s;

	free(m->binary);
	for (s = 0; s < m->nstages; s++)
		free_list(m->stages[s].syms, m->stages[s].nsyms);
	free_list(m->request, m->nrequest);
	memset(m, 0, sizeof(*m));
	m->request_stage = -1;
}
