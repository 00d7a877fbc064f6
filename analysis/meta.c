/*
 * meta.c — the meta file: an_meta, the one reader every command uses, and
 * the trace's parse of it (clocks, modules). See analysis.h for what each
 * promises.
 */
#include "an_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* meta                                                                      */
/* ------------------------------------------------------------------------ */

/* A whole string as an unsigned number in `base` (16 allows "0x"). */
int an_parse_u64(const char *s, int base, uint64_t *out)
{
	char *end;

	if (!isxdigit((unsigned char)*s))
		return -1;
	errno = 0;
	*out = strtoull(s, &end, base);
	return errno || *end ? -1 : 0;
}

static int module_cmp(const void *a, const void *b)
{
	const module *x = a, *y = b;

	if (x->pub.index != y->pub.index)
		return x->pub.index < y->pub.index ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

/* "module <index> <path> <key> <bias-hex>": the path may hold spaces, so
 * the key and bias are taken from the right. */
int an_module_line(char *v, an_module *out)
{
	char *sp1 = strchr(v, ' '), *sp3 = strrchr(v, ' '), *sp2;
	uint64_t index, bias;

	if (!sp1 || sp3 == sp1)
		return -1;
	*sp3 = '\0';
	sp2 = strrchr(v, ' ');
	if (sp2 == sp1 || sp2 == sp1 + 1)
		return -1;
	*sp1 = *sp2 = '\0';
	if (an_parse_u64(v, 10, &index) || index >= AN_NONE || an_parse_u64(sp3 + 1, 16, &bias))
		return -1;
	if (!sp2[1])
		return -1;
	memset(out, 0, sizeof *out);
	out->index = (uint32_t)index;
	out->bias = bias;
	out->path = sp1 + 1;
	out->key = sp2 + 1;
	for (const char *k = out->key; *k; k++)
		if (!isalnum((unsigned char)*k) && *k != '-')
			return -2;
	return 0;
}

static int parse_module(an_trace *t, const char *where, size_t line, char *v, sp_err *err)
{
	an_module pub;
	module *m;
	int rc = an_module_line(v, &pub);

	if (rc == -2)
		return sp_fail(err, "%s: module key '%s' is not a build-id or content hash",
			       where, pub.key);
	if (rc < 0)
		return sp_fail(err, "%s: malformed module line (expected 'module <index> <path> "
			       "<key> <bias-hex>')", where);
	if (sp_grow((void **)&t->mods, &t->capmods, t->nmods + 1, sizeof *t->mods))
		return sp_fail(err, "out of memory");
	m = &t->mods[t->nmods++];
	memset(m, 0, sizeof *m);
	m->pub = pub;            /* path and key point into the meta value, which stays */
	m->line = line;
	return 0;
}

/* A required numeric meta value. */
static int meta_number(an_trace *t, const char *meta_path, const char *key, const char *what,
		       uint64_t *out, sp_err *err)
{
	const char *v = an_trace_meta(t, key);

	if (!v)
		return sp_fail(err, "%s: no '%s' line (%s); the agent writes it when the trace "
			       "starts, so the file is incomplete", meta_path, key, what);
	if (an_parse_u64(v, 10, out))
		return sp_fail(err, "%s: '%s' is '%s', not an unsigned decimal number", meta_path,
			       key, v);
	return 0;
}

/* ---- an_meta: the one reader of meta every command uses ---- */

struct an_meta {
	char *text;              /* the file; keys and values point into it */
	meta_kv *kv;
	size_t n, cap;
};

int an_meta_read(const char *dir, an_meta **out, sp_err *err)
{
	char path[PATH_MAX + 8], *buf, *p;
	size_t len, lineno = 0;
	an_meta *m;

	*out = NULL;
	snprintf(path, sizeof path, "%s/meta", dir);
	if (an_slurp(path, TRACE_META_MAX_BYTES, &buf, &len) < 0) {
		int e = errno;

		sp_fail(err, "%s: cannot read: %s%s", path, an_errno_text(e),
			e == ENOENT ? " (is this a trace directory?)" : "");
		errno = e;
		return -1;
	}
	if (strlen(buf) != len) {
		free(buf);
		errno = EINVAL;
		return sp_fail(err, "%s: holds a NUL byte: not a meta file, or a corrupt one", path);
	}
	if (!(m = calloc(1, sizeof *m))) {
		free(buf);
		errno = ENOMEM;
		return sp_fail(err, "out of memory");
	}
	m->text = buf;
	for (p = buf; *p; ) {
		char *line = p, *nl = strchr(p, '\n'), *sp;

		lineno++;
		if (nl) {
			*nl = '\0';
			p = nl + 1;
		} else {
			p += strlen(p);
		}
		if (*line == '\0' || *line == '#')
			continue;
		if (sp_grow((void **)&m->kv, &m->cap, m->n + 1, sizeof *m->kv)) {
			an_meta_free(m);
			errno = ENOMEM;
			return sp_fail(err, "out of memory");
		}
		sp = strchr(line, ' ');
		if (sp)
			*sp = '\0';
		m->kv[m->n].key = line;
		m->kv[m->n].val = sp ? sp + 1 : line + strlen(line);
		m->kv[m->n].line = lineno;
		m->n++;
	}
	*out = m;
	return 0;
}

void an_meta_free(an_meta *m)
{
	if (!m)
		return;
	free(m->text);
	free(m->kv);
	free(m);
}

size_t an_meta_nlines(const an_meta *m)
{
	return m ? m->n : 0;
}

const char *an_meta_key(const an_meta *m, size_t i)
{
	return m && i < m->n ? m->kv[i].key : NULL;
}

const char *an_meta_val(const an_meta *m, size_t i)
{
	return m && i < m->n ? m->kv[i].val : NULL;
}

size_t an_meta_lineno(const an_meta *m, size_t i)
{
	return m && i < m->n ? m->kv[i].line : 0;
}

const char *an_meta_get(const an_meta *m, const char *key)
{
	for (size_t i = 0; m && i < m->n; i++)
		if (strcmp(m->kv[i].key, key) == 0)
			return m->kv[i].val;
	return NULL;
}

const char *an_meta_last(const an_meta *m, const char *key)
{
	for (size_t i = m ? m->n : 0; i-- > 0; )
		if (strcmp(m->kv[i].key, key) == 0)
			return m->kv[i].val;
	return NULL;
}

size_t an_meta_count(const an_meta *m, const char *key)
{
	size_t c = 0;

	for (size_t i = 0; m && i < m->n; i++)
		c += strcmp(m->kv[i].key, key) == 0;
	return c;
}

/* ---- the trace's parse of it ---- */

/*
 * The TSC rate over the trace's whole life.  The agent measures tsc_hz over
 * 2 ms when it starts (agent/main.c: calibrate): a few hundred nanoseconds
 * of error in either reading is 1e-4 of the rate, and two traces of one
 * host then disagree by up to a few hundred microseconds a second later --
 * more than a pipe or a veth takes, so a receive showed before the send it
 * matched (flows.c, rule 8).  The end line (tsc1, mono1_ns: the agent's,
 * or the daemon's or run's for a process that died first) is a second
 * reading of the same two clocks: over at least 20 ms it gives the rate ten
 * times closer, and it is taken when it agrees with the calibration within
 * 1% (else the end line is not to be trusted: kept as it was).
 */
static void refine_tsc_hz(an_trace *t)
{
	const char *a = an_meta_last(t->meta, TRACE_META_TSC1);
	const char *b = an_meta_last(t->meta, TRACE_META_MONO1);
	uint64_t tsc1, mono1;
	double hz;

	if (!a || !b || an_parse_u64(a, 10, &tsc1) || an_parse_u64(b, 10, &mono1) ||
	    tsc1 <= t->tsc0 || mono1 > INT64_MAX || (int64_t)mono1 - t->mono0 < 20000000)
		return;
	hz = (double)(tsc1 - t->tsc0) * 1e9 / (double)((int64_t)mono1 - t->mono0);
	if (hz > (double)t->tsc_hz * 0.99 && hz < (double)t->tsc_hz * 1.01)
		t->tsc_hz = (uint64_t)(hz + 0.5);
}

int an_read_meta(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], where[PATH_MAX + 32];
	uint64_t v;
	an_meta *m;

	snprintf(path, sizeof path, "%s/meta", t->dir);
	if (an_meta_read(t->dir, &t->meta, err) < 0)
		return -1;
	m = t->meta;
	for (size_t i = 0; i < m->n; i++)
		if (strcmp(m->kv[i].key, TRACE_META_MODULE) == 0) {
			/* parse_module cuts the value into its fields, in place */
			snprintf(where, sizeof where, "%s:%zu", path, m->kv[i].line);
			if (parse_module(t, where, m->kv[i].line, m->kv[i].val, err))
				return -1;
		}
	if (!m->n)
		return sp_fail(err, "%s: empty; the agent writes it when the trace starts", path);
	if (!an_trace_meta(t, TRACE_META_VERSION))
		return sp_fail(err, "%s: no 'version' line: not an sptrace trace, or an "
			       "incomplete one", path);
	if (an_parse_u64(an_trace_meta(t, TRACE_META_VERSION), 10, &v) ||
	    v < TRACE_FORMAT_VERSION_MIN || v > TRACE_FORMAT_VERSION)
		return sp_fail(err, "%s: trace format version '%s'; this sptrace reads versions "
			       "%d to %d%s", path, an_trace_meta(t, TRACE_META_VERSION),
			       TRACE_FORMAT_VERSION_MIN, TRACE_FORMAT_VERSION,
			       v > TRACE_FORMAT_VERSION ? ": read it with the sptrace that wrote it, "
			       "or a newer one" : "");
	if (meta_number(t, path, TRACE_META_TSC_HZ, "the TSC frequency", &t->tsc_hz, err) ||
	    meta_number(t, path, TRACE_META_TSC0, "the TSC at the clock reading", &t->tsc0, err) ||
	    meta_number(t, path, TRACE_META_MONO0, "CLOCK_MONOTONIC at tsc0", &v, err))
		return -1;
	if (v > INT64_MAX)
		return sp_fail(err, "%s: '%s' %" PRIu64 " is out of range", path, TRACE_META_MONO0, v);
	t->mono0 = (int64_t)v;
	if (meta_number(t, path, TRACE_META_REAL0, "CLOCK_REALTIME at tsc0", &v, err))
		return -1;
	if (v > INT64_MAX)
		return sp_fail(err, "%s: '%s' %" PRIu64 " is out of range", path, TRACE_META_REAL0, v);
	t->real0 = (int64_t)v;
	if (t->tsc_hz == 0)
		return sp_fail(err, "%s: 'tsc_hz' is 0; the TSC frequency must be positive", path);
	refine_tsc_hz(t);
	if (t->nmods)
		qsort(t->mods, t->nmods, sizeof *t->mods, module_cmp);
	for (size_t i = 1; i < t->nmods; i++)
		if (t->mods[i].pub.index == t->mods[i - 1].pub.index)
			return sp_fail(err, "%s:%zu: module index %u appears twice (also line %zu)",
				       path, t->mods[i].line > t->mods[i - 1].line ? t->mods[i].line
				       : t->mods[i - 1].line, t->mods[i].pub.index,
				       t->mods[i].line > t->mods[i - 1].line ? t->mods[i - 1].line
				       : t->mods[i].line);
	return 0;
}

module *an_module_by_index(an_trace *t, uint32_t index)
{
	size_t lo = 0, hi = t->nmods;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t->mods[mid].pub.index == index)
			return &t->mods[mid];
		if (t->mods[mid].pub.index < index)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

