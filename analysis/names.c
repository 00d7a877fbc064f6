/*
 * names.c — the sites file; functions and sites by name (an_site,
 * an_func_get). See analysis.h for what each promises.
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
/* Functions and sites                                                       */
/* ------------------------------------------------------------------------ */

static void source_line(const ca_module *ca, uint64_t addr, char *buf, size_t len)
{
	const ca_line *l = ca ? ca_line_at(ca, addr) : NULL;

	if (l)
		snprintf(buf, len, "%s:%u", ca_str(ca, l->file), l->line);
	else
		buf[0] = '\0';
}

/* Append a function; its index, or AN_NONE when out of memory. */
static uint32_t func_add(an_trace *t, const char *name, const char *src, uint32_t module,
			 uint64_t addr)
{
	an_func *f;

	if (t->nfuncs >= AN_NONE ||
	    sp_grow((void **)&t->funcs, &t->capfuncs, t->nfuncs + 1, sizeof *t->funcs))
		return AN_NONE;
	f = malloc(sizeof *f);
	if (!f)
		return AN_NONE;
	f->name = strdup(name);
	f->src = strdup(src);
	f->module = module;
	f->addr = addr;
	f->signature = 0;
	if (!f->name || !f->src) {
		free((char *)f->name);
		free((char *)f->src);
		free(f);
		return AN_NONE;
	}
	t->funcs[t->nfuncs] = f;
	return (uint32_t)t->nfuncs++;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

/* The function at link-time `addr` of module `index`, named as analysis.h
 * says.  AN_NONE when out of memory. */
static uint32_t func_at(an_trace *t, uint32_t index, uint64_t addr)
{
	map_slot *slot = an_map_get(&t->func_ids, index, addr);
	module *m = an_module_by_index(t, index);
	char *name = NULL, src[4200] = "";
	const char *sym;
	int n = 0, signature = 0;

	if (!slot)
		return AN_NONE;
	if (slot->val)
		return slot->val - 1;
	if (!m) {
		n = asprintf(&name, "?module%u+0x%" PRIx64, index, addr);
	} else if ((sym = an_kernel_name(m, addr))) {
		n = (name = strdup(sym)) ? 0 : -1;
	} else if (!m->ca) {
		n = asprintf(&name, "%s+0x%" PRIx64, base_name(m->pub.path), addr);
	} else {
		size_t nf;
		const ca_func *f = ca_module_funcs(m->ca, &nf);
		uint32_t fi = ca_func_at(m->ca, addr);

		if (fi == CA_NONE)
			n = asprintf(&name, "sub_%" PRIx64, addr);
		else if (!(sym = an_symbol_name(t, m, fi)))
			return AN_NONE;
		else if (f[fi].addr == addr) {
			n = (name = strdup(sym)) ? 0 : -1;
			/* The runtime's demangling of a function always ends
			 * with its parameters (and qualifiers). */
			signature = t->demangle == AN_DEMANGLE_FULL &&
				    strcmp(sym, ca_str(m->ca, f[fi].name)) != 0;
		} else
			n = asprintf(&name, "%s+0x%" PRIx64, sym, addr - f[fi].addr);
		source_line(m->ca, addr, src, sizeof src);
	}
	if (n < 0)
		return AN_NONE;
	uint32_t i = func_add(t, name, src, index, addr);
	free(name);
	if (i != AN_NONE) {
		t->funcs[i]->signature = signature;
		slot->val = i + 1;
	}
	return i;
}

static int name_site(an_trace *t, uint32_t id, sp_err *err)
{
	const trace_site *s = &t->raw_sites[id];
	an_site_info *info = &t->sites[id];
	module *cm = an_module_by_index(t, s->caller_module);
	char src[4200] = "";
	int root = (s->flags & TRACE_SITE_ROOT) != 0;

	info->addr = s->site_addr;
	info->kind = s->kind;
	info->flags = s->flags;
	info->valid = 1;
	info->caller = root ? AN_NONE : func_at(t, s->caller_module, s->caller_func);
	if (s->callee_module != UINT32_MAX) {
		info->callee = func_at(t, s->callee_module, s->callee_func);
	} else if (root) {
		info->callee = func_at(t, s->caller_module, s->caller_func);
	} else {
		uint32_t caller = func_at(t, s->caller_module, s->caller_func);
		char *name;

		if (asprintf(&name, "<indirect@%s+0x%" PRIx64 ">",
			     caller == AN_NONE ? "?" : t->funcs[caller]->name,
			     s->site_addr - s->caller_func) < 0)
			return sp_fail(err, "out of memory naming %zu sites", t->nsites);
		info->callee = func_add(t, name, "", AN_NONE, 0);
		free(name);
	}
	if (!root && cm && cm->ca)
		source_line(cm->ca, s->site_addr, src, sizeof src);
	info->src = strdup(src);
	if (info->callee == AN_NONE || (!root && info->caller == AN_NONE) || !info->src)
		return sp_fail(err, "out of memory naming %zu sites", t->nsites);
	return 0;
}

int an_read_sites(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], *buf;
	size_t len;

	snprintf(path, sizeof path, "%s/sites", t->dir);
	if (an_slurp(path, (size_t)(TRACE_ID_MAX + 1) * sizeof(trace_site), &buf, &len) < 0)
		return sp_fail(err, "%s: cannot read: %s%s", path, an_errno_text(errno),
			       errno == ENOENT ? " (the agent writes it with the first "
			       "instrumented site; without it no call can be named)" : "");
	if (len % sizeof(trace_site))
		an_warn(t, "%s: %zu bytes after the last whole site record ignored (a record the "
		     "agent was writing)", path, len % sizeof(trace_site));
	t->raw_sites = (trace_site *)buf;
	t->nsites = len / sizeof(trace_site);
	t->sites = calloc(t->nsites ? t->nsites : 1, sizeof *t->sites);
	if (!t->sites)
		return sp_fail(err, "out of memory");
	return 0;
}

/* The channels file (message events).  An older agent wrote none: no
 * channel is known then, and messages name channel ids only. */
int an_name_sites(an_trace *t, sp_err *err)
{
	static const trace_site zero;
	size_t nbadmod = 0;
	uint32_t first_badmod = 0;
	map same = { 0 };

	for (size_t id = 1; id < t->nsites; id++) {
		const trace_site *s = &t->raw_sites[id];
		map_slot *slot;

		if (memcmp(s, &zero, sizeof zero) == 0)
			continue;
		/* Ids of one call instruction share a canonical id (roots never do). */
		slot = (s->flags & TRACE_SITE_ROOT) ? NULL :
		       an_map_get(&same, s->caller_module + 1, s->site_addr);
		if (!(s->flags & TRACE_SITE_ROOT) && !slot) {
			an_map_free(&same);
			return sp_fail(err, "out of memory");
		}
		if (slot && !slot->val)
			slot->val = (uint32_t)id;
		t->sites[id].canon = slot ? slot->val : (uint32_t)id;
		if (!an_module_by_index(t, s->caller_module) ||
		    (s->callee_module != UINT32_MAX && !an_module_by_index(t, s->callee_module))) {
			if (!nbadmod++)
				first_badmod = (uint32_t)id;
		}
		if (name_site(t, (uint32_t)id, err)) {
			an_map_free(&same);
			return -1;
		}
	}
	an_map_free(&same);
	if (nbadmod)
		an_warn(t, "%s/sites: %zu sites (the first: id %u) name a module meta has no "
		     "'module' line for; their functions are shown as ?module<N>+0x<addr>",
		     t->dir, nbadmod, first_badmod);
	return 0;
}

static an_site_info *bad_site_new(an_trace *t, const char *name)
{
	an_site_info *info = calloc(1, sizeof *info);

	if (!info)
		return NULL;
	info->callee = func_add(t, name, "", AN_NONE, 0);
	info->caller = AN_NONE;
	info->src = "";
	if (info->callee == AN_NONE) {
		free(info);
		return NULL;
	}
	return info;
}

const an_site_info *an_site(an_trace *t, uint32_t id)
{
	static an_site_info oom = { AN_NONE, AN_NONE, "", 0, 0, 0, 0, 0 };
	char name[32];
	an_site_info *info;
	map_slot *slot;

	if (id > 0 && id < t->nsites && t->sites[id].valid)
		return &t->sites[id];
	slot = an_map_find(&t->bad_ids, id, 0);
	if (slot)
		return t->bad[slot->val - 1];
	if (t->nbad >= MAX_BAD_SITES) {
		if (!t->bad_many)
			t->bad_many = bad_site_new(t, "?site");
		return t->bad_many ? t->bad_many : &oom;
	}
	if (sp_grow((void **)&t->bad, &t->capbad, t->nbad + 1, sizeof *t->bad) ||
	    !(slot = an_map_get(&t->bad_ids, id, 0)))
		return &oom;
	snprintf(name, sizeof name, "?site %u", id);
	if (!(info = bad_site_new(t, name)))
		return &oom;
	t->bad[t->nbad++] = info;
	slot->val = (uint32_t)t->nbad;
	return info;
}

int an_site_is_tail(const an_site_info *s)
{
	return s->kind == CA_SITE_TAIL_DIRECT || s->kind == CA_SITE_TAIL_INDIRECT;
}

const char *an_event_name(uint32_t id, char *buf, size_t len)
{
	switch (id) {
	case TRACE_EV_ACTIVATE: return "activate";
	case TRACE_EV_DEACTIVATE: return "deactivate";
	case TRACE_EV_THREAD_EXIT: return "thread exit";
	case TRACE_EV_SIGNAL: return "signal";
	case TRACE_EV_ACCEPT: return "accept";
	case TRACE_EV_RECV: return "recv";
	case TRACE_EV_CTX_SAVE: return "context saved";
	case TRACE_EV_CTX_LOAD: return "context switch";
	case TRACE_EV_CTX_NEW: return "context made";
	case TRACE_EV_MSG_SEND: return "message sent";
	case TRACE_EV_MSG_RECV: return "message received";
	case TRACE_EV_MSG_DATA: return "message data";
	case TRACE_EV_AGENT_BEGIN: return "agent begin";
	case TRACE_EV_AGENT_END: return "agent end";
	case TRACE_EV_VALUE: return "value";
	case TRACE_EV_BUDGET: return "budget";
	case TRACE_EV_COUNT: return "counted calls";
	case TRACE_EV_COUNT_DATA: return "counted calls data";
	}
	snprintf(buf, len, "event %u", id);
	return buf;
}

