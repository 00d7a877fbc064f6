/*
 * profile.c — the units of an analysis (flows, processes or hosts) and their
 * profiles: each thread's call tree swept in time, its time, call paths and
 * messages credited to the unit whose window holds them; roles; the dense
 * rows and the distance between two units.  The rules are anomaly.c's
 * points 1, 2 and 4 (roles).
 */
#include "an_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t an_name_id(an_anomalies *a, const char *name)
{
	map_slot *s = an_map_get(&a->name_ids, an_hash_str(name), 0);

	if (!s)
		return AN_NONE;
	if (!s->val) {
		char **n = realloc(a->names, (a->nnames + 1) * sizeof *n);

		if (!n || !(n[a->nnames] = strdup(name)))
			return AN_NONE;
		a->names = n;
		s->val = (uint32_t)++a->nnames;
	}
	return s->val - 1;
}

static uint32_t node_id(an_anomalies *a, uint32_t parent, uint32_t name)
{
	map_slot *s = an_map_get(&a->node_ids, (uint64_t)parent + 1, name);

	if (!s)
		return AN_NONE;
	if (!s->val) {
		node *n = realloc(a->nodes, (a->nnodes + 1) * sizeof *n);

		if (!n)
			return AN_NONE;
		a->nodes = n;
		n[a->nnodes] = (node){ parent, name };
		s->val = (uint32_t)++a->nnodes;
	}
	return s->val - 1;
}

/* ns more in call path nd (0: only entered, for the coverage). */
static int add_time(unit *u, uint32_t nd, double ns)
{
	map_slot *s = an_map_get(&u->idx, nd, 0);

	if (!s)
		return -1;
	if (!s->val) {
		if (u->ne == u->cap) {
			size_t cap = u->cap ? 2 * u->cap : 16;
			entry *e = realloc(u->e, cap * sizeof *e);

			if (!e)
				return -1;
			u->e = e;
			u->cap = cap;
		}
		u->e[u->ne] = (entry){ nd, 0 };
		s->val = (uint32_t)++u->ne;
	}
	u->e[s->val - 1].ns += ns;
	u->total += ns;
	return 0;
}

/* A message of `bytes` through call path nd, one way (point 2). */
static int add_comm(unit *u, uint32_t nd, int recv, uint64_t bytes)
{
	map_slot *s = an_map_get(&u->cidx, nd, (uint64_t)recv);

	if (!s)
		return -1;
	if (!s->val) {
		if (u->ncm == u->capcm) {
			size_t cap = u->capcm ? 2 * u->capcm : 8;
			comm *c = realloc(u->cm, cap * sizeof *c);

			if (!c)
				return -1;
			u->cm = c;
			u->capcm = cap;
		}
		u->cm[u->ncm] = (comm){ nd, (uint32_t)recv, 0, 0 };
		s->val = (uint32_t)++u->ncm;
	}
	u->cm[s->val - 1].n++;
	u->cm[s->val - 1].bytes += bytes;
	u->sends += !recv;
	u->bytes += bytes;
	return 0;
}

const comm *an_comm_of(const unit *u, uint32_t nd, int recv)
{
	const map_slot *s = an_map_find(&u->cidx, nd, (uint64_t)recv);

	return s ? &u->cm[s->val - 1] : NULL;
}

/* ns more of u's time in program prog (point 4, hosts). */
static int add_prog(unit *u, uint32_t prog, double ns)
{
	size_t k;

	for (k = 0; k < u->npt && u->pt[k].prog != prog; k++)
		;
	if (k == u->npt) {
		prog_time *p = realloc(u->pt, (u->npt + 1) * sizeof *p);

		if (!p)
			return -1;
		u->pt = p;
		u->pt[u->npt++] = (prog_time){ prog, 0 };
	}
	u->pt[k].ns += ns;
	return 0;
}

double an_time_of(const unit *u, uint32_t nd)
{
	const map_slot *s = an_map_find(&u->idx, nd, 0);

	return s ? u->e[s->val - 1].ns : 0;
}

bool an_covers(const unit *u, uint32_t nd)
{
	return an_map_find(&u->idx, nd, 0) != NULL;
}

/* A new unit; its index, AN_NONE when out of memory. */
static uint32_t new_unit(an_anomalies *a, const char *host, uint32_t pid, const char *flow,
			 int normal)
{
	unit *u = realloc(a->units, (a->nunits + 1) * sizeof *u);

	if (!u)
		return AN_NONE;
	a->units = u;
	u = &a->units[a->nunits];
	memset(u, 0, sizeof *u);
	u->host = strdup(host);
	u->flow = flow ? strdup(flow) : NULL;
	if (!u->host || (flow && !u->flow)) {
		free(u->host);
		free(u->flow);
		return AN_NONE;
	}
	u->pid = pid;
	u->normal = normal;
	u->first_ns = INT64_MAX;
	u->last_ns = INT64_MIN;
	u->last_node = AN_NONE;
	return (uint32_t)a->nunits++;
}

/* The unit of this host and pid (a process, or a host with pid 0). */
static uint32_t unit_of(an_anomalies *a, const char *host, uint32_t pid, int normal)
{
	for (size_t i = 0; i < a->nunits; i++)
		if (a->units[i].pid == pid && a->units[i].normal == normal &&
		    !a->units[i].flow && strcmp(a->units[i].host, host) == 0)
			return (uint32_t)i;
	return new_unit(a, host, pid, NULL, normal);
}

/* A thread's sweep (point 2): the windows of its time, by start, and where
 * the sweep stands in them. */
typedef struct sweep {
	an_anomalies *a;
	const window *w;
	size_t nw, at;
	collect *col;                    /* point 7's sweep: collects, profiles nothing */
} sweep;

static bool under(const an_anomalies *a, uint32_t nd, uint32_t top)
{
	for (; nd != AN_NONE; nd = a->nodes[nd].parent)
		if (nd == top)
			return true;
	return false;
}

/* Point 7: one more stretch of the culprit's. */
static int collect_add(collect *col, int64_t t0, int64_t t1)
{
	if (col->n == col->cap) {
		size_t cap = col->cap ? 2 * col->cap : 64;
		stretch *s = realloc(col->s, cap * sizeof *s);

		if (!s)
			return -1;
		col->s = s;
		col->cap = cap;
	}
	col->s[col->n++] = (stretch){ t0, t1 };
	return 0;
}

/* Time [from, to) of the thread was spent in call path nd. */
static int credit(sweep *sw, uint32_t nd, int64_t from, int64_t to)
{
	collect *col = sw->col;

	if (to <= from)
		return 0;
	if (col && (col->kind == K_COMM || (col->kind == K_TIME ? nd != col->node
					      : !under(sw->a, nd, col->node))))
		return 0;
	while (sw->at < sw->nw && sw->w[sw->at].t1 < from)
		sw->at++;
	for (size_t k = sw->at; k < sw->nw && sw->w[k].t0 < to; k++) {
		int64_t lo = from > sw->w[k].t0 ? from : sw->w[k].t0;
		int64_t hi = to < sw->w[k].t1 ? to : sw->w[k].t1;

		if (hi > lo && (col ? collect_add(col, lo, hi)
				: add_time(&sw->a->units[sw->w[k].unit], nd, (double)(hi - lo))) != 0)
			return -1;
	}
	return 0;
}

/* The window that holds time `at` (records before a window belong to the
 * one that follows), NULL past the last. */
static const window *window_at(const sweep *sw, int64_t at)
{
	for (size_t k = sw->at; k < sw->nw; k++)
		if (sw->w[k].t1 >= at)
			return &sw->w[k];
	return NULL;
}

/* window_at for a message, stamped at its call's start: the sweep may have
 * gone past the window that holds it. */
static const window *msg_window_at(const sweep *sw, int64_t at)
{
	sweep back = *sw;

	while (back.at > 0 && back.w[back.at - 1].t1 >= at)
		back.at--;
	return window_at(&back, at);
}

/* Point 2 with call sites: the callee, '@', and where it was called from
 * (the caller and the call's offset in it, link-time: the same in every
 * process of the binary). */
static const char *site_name(an_trace *t, uint32_t site, const char *name, char *buf,
			     size_t len)
{
	const an_site_info *si = an_site(t, site);
	const an_func *caller = si->caller != AN_NONE ? an_func_get(t, si->caller) : NULL;

	if (caller && caller->name && si->addr >= caller->addr)
		snprintf(buf, len, "%s@%s+%#" PRIx64, name ? name : "?", caller->name,
			 si->addr - caller->addr);
	else
		snprintf(buf, len, "%s@%#" PRIx64, name ? name : "?", si->addr);
	return buf;
}

static bool start_func(const an_anomalies *a, const char *name)
{
	for (size_t k = 0; name && k < a->flow_opts.nstart; k++)
		if (strcmp(name, a->flow_opts.start[k]) == 0)
			return true;
	return false;
}

/* Point 3's bookkeeping for a process unit: the innermost call open at the
 * end, else the last one. */
static void note_last(unit *u, const an_call *c, uint32_t nd)
{
	if (c->end == AN_END_TRACE ? c->t0 >= u->last_open_t0
	    : !u->last_open_t0 && c->t1 >= u->last_t1) {
		if (c->end == AN_END_TRACE)
			u->last_open_t0 = c->t0;
		u->last_t1 = c->t1;
		u->last_node = nd;
	}
}

/* Point 2 for one thread, its time split between the windows w (by start);
 * `whole`: the windows are one unit's, for point 3. */
int an_thread_profile(an_anomalies *a, an_trace *t, const an_thread *th, const window *w,
			  size_t nw, int whole, collect *col, sp_err *err)
{
	an_call *c = NULL;
	size_t n = 0, depth = 0;
	struct open {
		size_t item;
		uint32_t node;
	} *st = NULL;
	sweep sw = { a, w, nw, 0, col };
	int64_t cur = INT64_MIN;
	bool paused = false;             /* between AGENT_BEGIN and AGENT_END */
	int rc = -1;

	if (an_thread_calls(t, th, &c, &n, NULL, err) != 0)
		return -1;
	if (n && !(st = calloc(n, sizeof *st))) {
		sp_fail(err, "out of memory for the profile of thread %u", th->tid);
		goto out;
	}
	for (size_t j = 0; j <= n; j++) {
		/* close the open calls item j is not nested in */
		while (depth && (j == n || c[st[depth - 1].item].last <= j)) {
			const struct open *o = &st[--depth];
			int64_t end = an_realtime_ns(t, c[o->item].t1);

			if (!paused && credit(&sw, o->node, cur, end) != 0)
				goto oom;
			cur = end > cur ? end : cur;
		}
		if (j < n && c[j].kind == AN_EVENT && trace_event_is_agent(c[j].id)) {
			/* the agent's own time is nobody's (trace_format.h) */
			int64_t at = an_realtime_ns(t, c[j].t0);

			if (c[j].id == TRACE_EV_AGENT_BEGIN && depth && !paused &&
			    credit(&sw, st[depth - 1].node, cur, at) != 0)
				goto oom;
			paused = c[j].id == TRACE_EV_AGENT_BEGIN;
			cur = at > cur ? at : cur;
			continue;
		}
		if (j < n && c[j].kind == AN_EVENT && trace_event_is_msg(c[j].id)) {
			/* the communication profile: under the innermost open call */
			const an_msg *m = an_trace_msg(t, c[j].end);
			int64_t at = an_realtime_ns(t, c[j].t0);
			const window *win = msg_window_at(&sw, at);

			if (!m || !depth || !win)
				continue;
			uint32_t nd = st[depth - 1].node;

			if (!col) {
				if (add_comm(&a->units[win->unit], nd, m->recv, m->len) != 0)
					goto oom;
			} else if (col->kind == K_COMM && win->t0 <= at && nd == col->node &&
				   m->recv == col->recv && collect_add(col, at, at) != 0) {
				goto oom;
			}
			continue;
		}
		if (j == n || c[j].kind != AN_CALL)
			continue;
		paused = false;
		int64_t start = an_realtime_ns(t, c[j].t0), end = an_realtime_ns(t, c[j].t1);

		if (depth && credit(&sw, st[depth - 1].node, cur, start) != 0)
			goto oom;
		cur = start > cur ? start : cur;

		const char *name = an_func_get(t, an_site(t, c[j].id)->callee)->name;
		char at[512];
		uint32_t nm = an_name_id(a, a->sites ? site_name(t, c[j].id, name, at, sizeof at)
					 : name ? name : "?");
		/* a start function's call is the root of the paths under it */
		uint32_t nd = nm == AN_NONE ? AN_NONE
			      : node_id(a, depth && !start_func(a, name) ? st[depth - 1].node
					: AN_NONE, nm);
		const window *win = window_at(&sw, start);

		if (nd == AN_NONE)
			goto oom;
		st[depth++] = (struct open){ j, nd };
		if (!win || col)
			continue;
		unit *u = &a->units[win->unit];
		bool inside = win->t0 <= start;

		if (add_time(u, nd, 0) != 0)
			goto oom;
		/* a call entered before its window (a poll() waiting for the
		 * request) counts from the window on */
		if ((inside ? start : win->t0) < u->first_ns)
			u->first_ns = inside ? start : win->t0;
		if (end > u->last_ns)
			u->last_ns = end;
		/* point 3: a process's last call; a flow's calls entered inside its
		 * window and never ended (a call around the flows, a poll() loop's,
		 * is not the flow's) */
		if (whole || (inside && c[j].end == AN_END_TRACE))
			note_last(u, &c[j], nd);
	}
	rc = 0;
	goto out;
oom:
	sp_fail(err, "out of memory for the profile of thread %u", th->tid);
out:
	free(st);
	free(c);
	return rc;
}

/* Point 7 sweeps a unit's windows again. */
static int keep_part(an_anomalies *a, const part_ref *p)
{
	if (a->nparts == a->capparts) {
		size_t cap = a->capparts ? 2 * a->capparts : 256;
		part_ref *q = realloc(a->parts, cap * sizeof *q);

		if (!q)
			return -1;
		a->parts = q;
		a->capparts = cap;
	}
	a->parts[a->nparts++] = *p;
	return 0;
}

/* A role's program (point 4): the file's name, wherever it ran from. */
static const char *program_name(const char *path)
{
	const char *slash = path ? strrchr(path, '/') : NULL;

	return slash ? slash + 1 : path ? path : "?";
}

/* Point 1 for processes and hosts: every thread whole to its unit. */
static int whole_units(an_anomalies *a, an_session *s, int kind, int normal, sp_err *err)
{
	for (size_t i = 0; i < an_session_nimages(s); i++) {
		const an_image *im = an_session_image(s, i);
		an_trace *t = an_session_trace(s, i);

		for (size_t k = 0; t && k < an_trace_nthreads(t); k++) {
			const an_thread *th = an_trace_thread(t, k);
			uint32_t pid = kind == AN_UNITS_HOST ? 0 : th->pid ? th->pid : im->pid;
			window w = { INT64_MIN, INT64_MAX, unit_of(a, im->host ? im->host : "", pid,
								    normal) };

			if (w.unit == AN_NONE)
				return sp_fail(err, "out of memory for the processes");

			double before = a->units[w.unit].total;
			uint32_t prog = an_name_id(a, program_name(im->program));

			if (an_thread_profile(a, t, th, &w, 1, kind == AN_UNITS_PROCESS, NULL, err) != 0)
				return -1;
			if (!normal && keep_part(a, &(part_ref){ i, th->tid, w }) != 0)
				return sp_fail(err, "out of memory for the processes");
			if (prog == AN_NONE ||
			    add_prog(&a->units[w.unit], prog, a->units[w.unit].total - before) != 0)
				return sp_fail(err, "out of memory for the processes");
		}
	}
	return 0;
}

static int by_thread_then_start(const void *x, const void *y)
{
	const part_ref *a = x, *b = y;

	if (a->image != b->image)
		return a->image < b->image ? -1 : 1;
	if (a->tid != b->tid)
		return a->tid < b->tid ? -1 : 1;
	return a->w.t0 < b->w.t0 ? -1 : a->w.t0 > b->w.t0;
}

/* Point 1 for flows: each thread's time split between the flows' parts. */
static int flow_units(an_anomalies *a, an_session *s, const an_flows *f, int normal,
		      sp_err *err)
{
	part_ref *p = NULL;
	window *w = NULL;
	size_t np = 0, cap = 0;
	int rc = -1;

	for (size_t i = 0; i < an_flows_count(f); i++) {
		const an_flow *fl = an_flows_get(f, i);
		uint32_t ui = new_unit(a, fl->host ? fl->host : "", fl->pid, fl->id, normal);

		if (ui == AN_NONE)
			goto oom;
		/* its role's program: the one it started in */
		const char *prog = program_name(an_session_image(s, fl->image)->program);

		if ((a->units[ui].prog = an_name_id(a, prog)) == AN_NONE)
			goto oom;
		for (size_t k = 0; k < fl->nparts; k++) {
			if (np == cap) {
				size_t nc = cap ? 2 * cap : 256;
				part_ref *q = realloc(p, nc * sizeof *q);

				if (!q)
					goto oom;
				p = q;
				cap = nc;
			}
			p[np++] = (part_ref){ fl->parts[k].image, fl->parts[k].tid,
					      { fl->parts[k].work_start_ns, fl->parts[k].work_end_ns,
						ui } };
		}
	}
	qsort(p, np, sizeof *p, by_thread_then_start);
	if (np && !(w = calloc(np, sizeof *w)))
		goto oom;
	for (size_t i = 0, j; i < np; i = j) {
		an_trace *t = an_session_trace(s, p[i].image);
		const an_thread *th = t ? an_trace_thread_by_tid(t, p[i].tid) : NULL;

		for (j = i; j < np && p[j].image == p[i].image && p[j].tid == p[i].tid; j++)
			w[j - i] = p[j].w;
		if (th && an_thread_profile(a, t, th, w, j - i, 0, NULL, err) != 0)
			goto out;
	}
	for (size_t i = 0; !normal && i < np; i++)
		if (keep_part(a, &p[i]) != 0)
			goto oom;
	rc = 0;
	goto out;
oom:
	sp_fail(err, "out of memory for the flows' profiles");
out:
	free(w);
	free(p);
	return rc;
}

int an_units_profile(an_anomalies *a, an_session *s, int normal, sp_err *err)
{
	an_flows *f = NULL;
	int rc;

	if (a->kind != AN_UNITS_FLOW && a->kind != AN_UNITS_AUTO)
		return whole_units(a, s, a->kind, normal, err);
	if (an_flows_build_opts(s, &a->flow_opts, &f, err) != 0)
		return -1;
	if (a->kind == AN_UNITS_AUTO)
		a->kind = an_flows_count(f) >= 3 ? AN_UNITS_FLOW : AN_UNITS_PROCESS;
	rc = a->kind == AN_UNITS_FLOW ? flow_units(a, s, f, normal, err)
	     : whole_units(a, s, a->kind, normal, err);
	an_flows_free(f);
	return rc;
}

/* Point 4: the role's program, and the root whose subtree took most of
 * u's time. */
int an_unit_role(const an_anomalies *a, unit *u)
{
	map roots = { 0 };
	double best = -1;
	double *sum = calloc(u->ne ? u->ne : 1, sizeof *sum);

	for (size_t k = 0; k < u->npt; k++)
		if (!k || u->pt[k].ns > best) {
			best = u->pt[k].ns;
			u->prog = u->pt[k].prog;
		}
	best = -1;
	u->role = AN_NONE;
	if (!sum)
		return -1;
	for (size_t k = 0; k < u->ne; k++) {
		uint32_t root = u->e[k].node;
		map_slot *s;

		while (a->nodes[root].parent != AN_NONE)
			root = a->nodes[root].parent;
		if (!(s = an_map_get(&roots, root, 0))) {
			free(sum);
			an_map_free(&roots);
			return -1;
		}
		if (!s->val)
			s->val = (uint32_t)roots.n;         /* 1 + its index in sum */
		sum[s->val - 1] += u->e[k].ns;
		if (sum[s->val - 1] > best) {
			best = sum[s->val - 1];
			u->role = root;
		}
	}
	free(sum);
	an_map_free(&roots);
	return 0;
}

bool an_same_role(const unit *x, const unit *y)
{
	return x->role == y->role && x->prog == y->prog;
}

/* Point 2: the dense rows of every role (units without time get none). */
int an_make_dense(an_anomalies *a)
{
	for (size_t i = 0; i < a->nunits; i++) {
		unit *u = &a->units[i];
		size_t k;

		if (u->total <= 0)
			continue;
		for (k = 0; k < a->ndn && (a->dn[k].role != u->role || a->dn[k].prog != u->prog); k++)
			;
		if (k == a->ndn) {
			dense *d = realloc(a->dn, (a->ndn + 1) * sizeof *d);

			if (!d)
				return -1;
			a->dn = d;
			memset(&d[a->ndn], 0, sizeof *d);
			d[a->ndn].prog = u->prog;
			d[a->ndn++].role = u->role;
		}
		dense *d = &a->dn[k];

		u->dense = (uint32_t)k;
		u->row = (uint32_t)d->nrows++;
		for (size_t e = 0; e < u->ne; e++) {
			map_slot *sl = an_map_get(&d->col, u->e[e].node, 0);

			if (!sl)
				return -1;
			if (!sl->val)
				sl->val = (uint32_t)++d->ncols;
		}
		for (size_t e = 0; e < u->ncm; e++) {
			map_slot *sl = an_map_get(&d->ccol, u->cm[e].node, u->cm[e].recv);

			if (!sl)
				return -1;
			if (!sl->val)
				sl->val = (uint32_t)++d->nccols;
		}
	}
	for (size_t k = 0; k < a->ndn; k++) {
		dense *d = &a->dn[k];

		d->words = (d->ncols + 63) / 64;
		if (!(d->share = calloc(d->nrows * d->ncols + 1, sizeof *d->share)) ||
		    !(d->bits = calloc(d->nrows * d->words + 1, sizeof *d->bits)) ||
		    !(d->pop = calloc(d->nrows + 1, sizeof *d->pop)) ||
		    !(d->unit_of = calloc(d->nrows + 1, sizeof *d->unit_of)) ||
		    !(d->crecv = calloc(d->nccols + 1, sizeof *d->crecv)) ||
		    !(d->cn = calloc(d->nrows * d->nccols + 1, sizeof *d->cn)) ||
		    !(d->cb = calloc(d->nrows * d->nccols + 1, sizeof *d->cb)))
			return -1;
	}
	for (size_t i = 0; i < a->nunits; i++) {
		const unit *u = &a->units[i];

		if (u->total <= 0)
			continue;
		dense *d = &a->dn[u->dense];

		d->unit_of[u->row] = (uint32_t)i;
		uint32_t *sh = d->share + (size_t)u->row * d->ncols;
		uint64_t *b = d->bits + (size_t)u->row * d->words;

		for (size_t e = 0; e < u->ne; e++) {
			size_t c = an_map_find(&d->col, u->e[e].node, 0)->val - 1;

			sh[c] = (uint32_t)(u->e[e].ns / u->total * SHARE_ONE + 0.5);
			b[c / 64] |= 1ull << (c % 64);
		}
		d->pop[u->row] = (uint32_t)u->ne;
		for (size_t e = 0; e < u->ncm; e++) {
			size_t c = an_map_find(&d->ccol, u->cm[e].node, u->cm[e].recv)->val - 1;

			d->crecv[c] = (uint8_t)u->cm[e].recv;
			d->cn[(size_t)u->row * d->nccols + c] = (uint32_t)u->cm[e].n;
			d->cb[(size_t)u->row * d->nccols + c] = u->cm[e].bytes;
		}
	}
	return 0;
}

/* Point 2: the communication distance of two units of a role (0..1). */
static double comm_distance(const dense *d, const unit *x, const unit *y)
{
	const uint32_t *nx = d->cn + (size_t)x->row * d->nccols;
	const uint32_t *ny = d->cn + (size_t)y->row * d->nccols;
	const uint64_t *bx = d->cb + (size_t)x->row * d->nccols;
	const uint64_t *by = d->cb + (size_t)y->row * d->nccols;
	uint64_t tn = x->sends + y->sends, tb = x->bytes + y->bytes, dn = 0, db = 0;

	for (size_t c = 0; c < d->nccols; c++) {
		if (!d->crecv[c])
			dn += nx[c] > ny[c] ? nx[c] - ny[c] : ny[c] - nx[c];
		db += bx[c] > by[c] ? bx[c] - by[c] : by[c] - bx[c];
	}
	return ((tn ? (double)dn / (double)tn : 0) + (tb ? (double)db / (double)tb : 0)) / 2;
}

/* Point 2: the distance between two units of the same role (as a->profile
 * says). */
double an_distance(const an_anomalies *a, const unit *x, const unit *y)
{
	const dense *d = &a->dn[x->dense];
	const uint32_t *sx = d->share + (size_t)x->row * d->ncols;
	const uint32_t *sy = d->share + (size_t)y->row * d->ncols;
	const uint64_t *bx = d->bits + (size_t)x->row * d->words;
	const uint64_t *by = d->bits + (size_t)y->row * d->words;
	uint64_t sum = 0;
	size_t common = 0, either;

	if (a->profile != AN_PROFILE_COVERAGE)
		for (size_t c = 0; c < d->ncols; c++)
			sum += sx[c] > sy[c] ? sx[c] - sy[c] : sy[c] - sx[c];
	for (size_t w = 0; w < d->words; w++)
		common += (size_t)__builtin_popcountll(bx[w] & by[w]);
	either = d->pop[x->row] + d->pop[y->row] - common;

	double t = (double)sum / SHARE_ONE;
	double cov = either ? (double)(either - common) / (double)either : 0;

	switch (a->profile) {
	case AN_PROFILE_TIME:
		return t;
	case AN_PROFILE_COVERAGE:
		return cov;
	case AN_PROFILE_COMMUNICATION:
		return comm_distance(d, x, y);
	default:
		return t + cov + comm_distance(d, x, y);
	}
}

int an_path_of(const an_anomalies *a, uint32_t nd, const char ***out, size_t *n)
{
	size_t len = 0;

	for (uint32_t k = nd; k != AN_NONE; k = a->nodes[k].parent)
		len++;
	*out = calloc(len ? len : 1, sizeof **out);
	if (!*out)
		return -1;
	*n = len;
	for (uint32_t k = nd; k != AN_NONE; k = a->nodes[k].parent)
		(*out)[--len] = a->names[a->nodes[k].name];
	return 0;
}

const char *an_unit_name(const unit *u, char *buf, size_t len)
{
	if (u->flow)
		snprintf(buf, len, "flow %s", u->flow);
	else if (u->pid)
		snprintf(buf, len, "pid %" PRIu32, u->pid);
	else
		snprintf(buf, len, "host %s", u->host);
	return buf;
}

