/*
 * module.c — ca_analyze(), which runs the passes in order, and the read side
 * of a ca_module: accessors, lookups and printable names.
 *
 *   1. elf.c      sections, symbols, GOT names, build-id
 *   2. ehframe.c  FDE ranges, landing pads
 *   3. funcs.c    function starts from every source
 *   4. disasm.c   decode until no new function appears (call targets, endbr64)
 *   5. funcs.c    noreturn inference, fragments
 *   6. disasm.c   blocks and edges
 *   7. sites.c    call sites and patch plans
 *   8. trust.c    the bytes each site's patch reads or overwrites, hashed
 *   9. lines.c    source lines
 */
#include "ca_internal.h"

#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

ca_module *ca_module_new(void)
{
	ca_module *m = calloc(1, sizeof *m);

	if (!m)
		return NULL;
	m->strs = malloc(256);
	if (!m->strs) {
		free(m);
		return NULL;
	}
	m->strs[0] = '\0';
	m->nstrs = 1;
	m->capstrs = 256;
	return m;
}

uint32_t ca_str_add(ca_module *m, const char *s)
{
	size_t len = strlen(s) + 1;
	uint32_t off;

	if (len == 1)
		return 0;
	if (m->nstrs + len > UINT32_MAX - 1 ||
	    sp_grow((void **)&m->strs, &m->capstrs, m->nstrs + len, 1))
		return CA_NONE;
	off = (uint32_t)m->nstrs;
	memcpy(m->strs + m->nstrs, s, len);
	m->nstrs += len;
	return off;
}

void ca_module_free(ca_module *m)
{
	if (!m)
		return;
	free(m->path);
	if (m->mapped) {
		munmap(m->mapped, m->mapped_len);       /* funcs, sites, runtimes, strs */
	} else {
		free(m->funcs);
		free(m->sites);
		free(m->runtimes);
		free(m->strs);
	}
	free(m->blocks);
	free(m->edges);
	free(m->lines);
	free(m->undec);
	free(m->owned_blob);
	free(m);
}

static void fill_key(ca_module *m, const ca_elf *e)
{
	snprintf(m->buildid, sizeof m->buildid, "%s", e->buildid_hex);
	snprintf(m->key, sizeof m->key, "%s", m->buildid);
}

/* Undecodable regions: from each point capstone refused up to the next byte
 * that some instruction covers (or the end of the function's range). */
static int collect_undecodable(ca_work *w)
{
	ca_module *m = w->m;

	for (size_t i = 0; i < w->nundec; i++) {
		uint64_t a = w->undec[i], end = a;
		const ca_textmap *tm = ca_textmap_at(w, a);
		uint32_t f = ca_func_at(m, a);
		uint64_t limit = tm->sec->addr + tm->sec->size;
		ca_undecodable *u;

		if (f != CA_NONE && m->funcs[f].addr + m->funcs[f].size > a &&
		    m->funcs[f].addr + m->funcs[f].size < limit)
			limit = m->funcs[f].addr + m->funcs[f].size;  /* never past the section */
		while (end < limit && !tm->covered[end - tm->sec->addr])
			end++;
		if (end == a)
			continue;
		if (sp_grow((void **)&m->undec, &m->capundec, m->nundec + 1, sizeof *m->undec))
			return -1;
		u = &m->undec[m->nundec++];
		*u = (ca_undecodable){ a, (uint32_t)(end - a), f };
		m->stats.undecodable_bytes += end - a;
	}
	m->stats.nundecodable = (uint32_t)m->nundec;
	return 0;
}

static void compute_stats(ca_work *w)
{
	ca_module *m = w->m;
	ca_stats *st = &m->stats;

	st->ninsns = (uint32_t)w->nins;
	st->nfuncs = (uint32_t)m->nfuncs;
	st->nblocks = (uint32_t)m->nblocks;
	st->nedges = (uint32_t)m->nedges;
	st->nsites = (uint32_t)m->nsites;
	st->nlines = (uint32_t)m->nlines;
	for (size_t i = 0; i < w->nins; i++)
		st->decoded_bytes += w->ins[i].len;
	for (size_t i = 0; i < m->nfuncs; i++) {
		const ca_func *f = &m->funcs[i];

		for (int b = 0; b < 8; b++)
			if (f->sources & (1u << b))
				st->nfuncs_by_source[b]++;
		if (f->flags & CA_FUNC_FRAGMENT)
			st->nfragments++;
		if (f->flags & CA_FUNC_NORETURN)
			st->nnoreturn++;
	}
	for (size_t i = 0; i < m->nsites; i++) {
		st->nsites_by_kind[m->sites[i].kind]++;
		st->nsites_by_method[m->sites[i].method]++;
	}
}

static void work_free(ca_work *w)
{
	ca_disasm_fini(w);
	free(w->fn);
	free(w->fkeys);
	free(w->fvals);
	free(w->ins);
	free(w->order);
	free(w->jt);
	free(w->work);
	free(w->undec);
	free(w->fmap);
	free(w->jout);
	free(w->deferred);
}

static int run_passes(ca_work *w, sp_err *err)
{
	int added;

	if (ca_ehframe_parse(w->e, err) || ca_disasm_init(w, err) ||
	    ca_funcs_discover(w, err) || ca_disasm_pending(w, err))
		return -1;
	while ((added = ca_funcs_scan_endbr(w)) > 0)
		if (ca_disasm_pending(w, err))
			return -1;
	if (added < 0)
		return sp_fail(err, "%s: out of memory", w->e->path);
	if (ca_disasm_order(w))
		return sp_fail(err, "%s: out of memory", w->e->path);
	if (ca_funcs_finish(w, err) || ca_blocks_build(w, err) || ca_sites_plan(w, err))
		return -1;
	if (collect_undecodable(w))
		return sp_fail(err, "%s: out of memory", w->e->path);
	if (ca_runtimes_find(w->m, w->e, err))
		return -1;
	compute_stats(w);
	return 0;
}

int ca_analyze(const char *path, const ca_options *opt, ca_module **out, sp_err *err)
{
	static const ca_options defaults;
	ca_elf e;
	ca_work w;
	ca_module *m;
	uint64_t t0 = sp_now_ns(), t1;
	int rc;

	*out = NULL;
	if (!opt)
		opt = &defaults;
	m = ca_module_new();
	if (!m)
		return sp_fail(err, "%s: out of memory", path);
	m->path = strdup(path);
	if (!m->path) {
		ca_module_free(m);
		return sp_fail(err, "%s: out of memory", path);
	}
	if (ca_elf_open(&e, path, opt->debug_dir, err)) {
		ca_elf_close(&e);
		ca_module_free(m);
		return -1;
	}
	m->file_size = e.map_size;
	m->is_dyn = e.e_type == ET_DYN;
	snprintf(m->untrusted, sizeof m->untrusted, "%s", e.untrusted);
	memcpy(m->file_id, e.file_id, sizeof m->file_id);
	fill_key(m, &e);
	if (ca_code_sha256_fd(e.fd, path, m->code_sha256, err)) {
		ca_elf_close(&e);
		ca_module_free(m);
		return -1;
	}
	if (!m->key[0] && ca_module_key_of(path, m->key, sizeof m->key, err)) {
		ca_elf_close(&e);
		ca_module_free(m);
		return -1;
	}
	memset(&w, 0, sizeof w);
	w.m = m;
	w.e = &e;
	w.opt = opt;
	rc = run_passes(&w, err);
	if (rc == 0)
		ca_sites_hash(m, &e);
	work_free(&w);
	t1 = sp_now_ns();
	/* Corrupt DWARF costs the source lines, not the analysis. */
	if (rc == 0 && ca_lines_read(m, &e, opt, err)) {
		snprintf(m->lines_error, sizeof m->lines_error, "%s", err->msg);
		free(m->lines);
		m->lines = NULL;
		m->nlines = m->caplines = 0;
		m->lines_source[0] = '\0';
	}
	ca_elf_close(&e);
	if (rc) {
		ca_module_free(m);
		return -1;
	}
	m->stats.nlines = (uint32_t)m->nlines;
	m->stats.lines_ns = sp_now_ns() - t1;
	m->lines_pending = opt && opt->no_lines;
	m->stats.analyze_ns = sp_now_ns() - t0;
	*out = m;
	return 0;
}

/* ---- accessors ---- */

const char *ca_module_path(const ca_module *m) { return m->path ? m->path : ""; }
const char *ca_module_key(const ca_module *m) { return m->key; }
const char *ca_module_buildid(const ca_module *m) { return m->buildid; }
uint64_t ca_module_file_size(const ca_module *m) { return m->file_size; }
int ca_module_is_pie_or_dso(const ca_module *m) { return m->is_dyn; }
const char *ca_module_lines_source(const ca_module *m) { return m->lines_source; }
const char *ca_module_lines_error(const ca_module *m) { return m->lines_error; }
int ca_module_lines_pending(const ca_module *m) { return m->lines_pending; }
const uint8_t *ca_module_code_sha256(const ca_module *m) { return m->code_sha256; }
const char *ca_module_untrusted(const ca_module *m) { return m->untrusted; }
const ca_stats *ca_module_stats(const ca_module *m) { return &m->stats; }

#define ACCESSOR(fn, type, arr, count)                                    \
	const type *fn(const ca_module *m, size_t *n)                      \
	{                                                                  \
		if (n)                                                     \
			*n = m->count;                                     \
		return m->arr;                                             \
	}
ACCESSOR(ca_module_funcs, ca_func, funcs, nfuncs)
ACCESSOR(ca_module_blocks, ca_block, blocks, nblocks)
ACCESSOR(ca_module_edges, ca_edge, edges, nedges)
ACCESSOR(ca_module_sites, ca_site, sites, nsites)
ACCESSOR(ca_module_lines, ca_line, lines, nlines)
ACCESSOR(ca_module_undecodable, ca_undecodable, undec, nundec)
ACCESSOR(ca_module_runtimes, ca_runtime, runtimes, nruntimes)

const char *ca_str(const ca_module *m, uint32_t off)
{
	if (off == CA_NONE || off >= m->nstrs)
		return "";
	return m->strs + off;
}

/* ---- lookups ---- */

uint32_t ca_func_at(const ca_module *m, uint64_t addr)
{
	size_t lo = 0, hi = m->nfuncs;

	/* The last function starting at or before addr, if addr is inside it. */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (m->funcs[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return CA_NONE;
	lo--;
	if (addr - m->funcs[lo].addr < (m->funcs[lo].size ? m->funcs[lo].size : 1))
		return (uint32_t)lo;
	return CA_NONE;
}

uint32_t ca_func_by_name(const ca_module *m, const char *name)
{
	for (size_t i = 0; i < m->nfuncs; i++)
		if (strcmp(ca_str(m, m->funcs[i].name), name) == 0)
			return (uint32_t)i;
	return CA_NONE;
}

const ca_line *ca_line_at(const ca_module *m, uint64_t addr)
{
	size_t lo = 0, hi = m->nlines;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (m->lines[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* Line 0 is an end-of-sequence marker: the address is past any code
	 * the line table describes. */
	return lo && m->lines[lo - 1].line ? &m->lines[lo - 1] : NULL;
}

/* ---- names ---- */

const char *ca_site_kind_name(unsigned kind)
{
	static const char *const n[] = { "?", "direct", "plt", "indirect-reg", "indirect-mem",
					  "indirect-rip", "tail-direct", "tail-indirect" };
	return kind < sizeof n / sizeof *n ? n[kind] : "?";
}

const char *ca_patch_method_name(unsigned method)
{
	static const char *const n[] = { "?", "direct", "springboard", "relocate", "trap", "none" };
	return method < sizeof n / sizeof *n ? n[method] : "?";
}

const char *ca_patch_reason_text(unsigned reason)
{
	static const char *const n[] = {
		"?",
		"site is at least 5 bytes",
		"short site; dead padding within rel8 reach",
		"short site; same-block instructions before it can move",
		"short site; no dead padding in reach and too few movable bytes before it",
		"short site; an instruction before it cannot be moved",
		"next to undecodable bytes",
		"overlaps another decoded instruction: the decoding there is in doubt",
	};
	return reason < sizeof n / sizeof *n ? n[reason] : "?";
}

const char *ca_edge_kind_name(unsigned kind)
{
	static const char *const n[] = { "?", "fallthrough", "jump", "taken", "not-taken", "table" };
	return kind < sizeof n / sizeof *n ? n[kind] : "?";
}
