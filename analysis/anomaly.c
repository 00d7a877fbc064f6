/*
 * anomaly.c — which process behaved differently, and which call path is the
 * likely cause (chapter 5 of the self-propelled instrumentation thesis,
 * summarised in ../shared/DESIGN.md), over the processes of a session.
 *
 *  1. Units: every process of the session (host and pid; a forked child
 *     that did not exec is a unit of its own, by its threads' pid).
 *  2. A unit's profile: the time spent in each call path (the functions
 *     from the thread's outermost traced call down, by name, so that units
 *     of different processes and hosts compare), exclusive of the calls
 *     nested in it, summed over the unit's threads, as a fraction of the
 *     unit's traced time.  A call still open at the end counts up to the
 *     thread's last record.
 *  3. Fail-stop first: a unit that stopped in the middle of something -- a
 *     call still open at its last record that is not the process's exit
 *     (_exit, exit: it ended as it should) -- while the other units of its
 *     role (point 4) went on: its last record is earlier than their median
 *     last record by more than FAILSTOP_MIN_NS and a tenth of the session's
 *     span (well above clock precision).  It crashed, hung in a loop that
 *     calls nothing, or blocked for good.  The one with the largest gap
 *     ranks first (method "earliest-last-timestamp", score: the gap in
 *     seconds), and its culprit is the innermost call open at its last
 *     record.
 *  4. The others (all, without a fail-stop): the suspect score is the
 *     Manhattan distance between profiles to the unit's k-th nearest
 *     neighbour, k = |U|/4 (at least 1): a unit unlike most others scores
 *     high even when a few others are like it.  Units are compared with
 *     those of their role only -- the outermost function they spend most
 *     time in (a server's master and its workers, a parent and the children
 *     it forked, are not alike by design); a role of fewer than 3 units is
 *     not scored (0, said in its cause).  With known-normal traces
 *     (`--normal REF`: the one-class variant), the distance to the nearest
 *     unit of REF instead.
 *  5. The cause: the components of the difference between the unit's
 *     profile and its nearest neighbour's (or nearest normal unit's),
 *     largest first; the culprit is the largest, and the next ones are the
 *     further causes.
 */
#include "an_internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAILSTOP_MIN_NS 10000000ll   /* point 3 */
#define MAX_CAUSES 3

typedef struct node {
	uint32_t parent;                 /* AN_NONE: a root */
	uint32_t name;                   /* index in names */
} node;

typedef struct entry {
	uint32_t node;
	double ns;
} entry;

typedef struct unit {
	char *host;
	uint32_t pid;
	int normal;                      /* from --normal REF */
	map idx;                         /* node -> 1 + index in e */
	entry *e;
	size_t ne, cap;
	double total;
	int64_t first_ns, last_ns;
	uint32_t last_node;              /* point 3's culprit */
	uint32_t role;                   /* point 4: a root node, AN_NONE if none */
	uint64_t last_open_t0;           /* the innermost open call's entry, or 0 */
	uint64_t last_t1;
} unit;

struct an_anomalies {
	char **names;
	size_t nnames;
	map name_ids;                    /* (hash, 0) -> 1 + name index */
	node *nodes;
	size_t nnodes;
	map node_ids;                    /* (parent + 1, name) -> 1 + node index */
	unit *units;
	size_t nunits;
	an_suspect *sus;
	size_t nsus;
};

static uint32_t name_id(an_anomalies *a, const char *name)
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

static int add_time(unit *u, uint32_t nd, double ns)
{
	map_slot *s = an_map_get(&u->idx, nd, 0);

	if (!s)
		return -1;
	if (!s->val) {
		if (u->ne == u->cap) {
			size_t cap = u->cap ? 2 * u->cap : 64;
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

static double time_of(const unit *u, uint32_t nd)
{
	const map_slot *s = an_map_find(&u->idx, nd, 0);

	return s ? u->e[s->val - 1].ns : 0;
}

static unit *unit_of(an_anomalies *a, const char *host, uint32_t pid, int normal)
{
	for (size_t i = 0; i < a->nunits; i++)
		if (a->units[i].pid == pid && a->units[i].normal == normal &&
		    strcmp(a->units[i].host, host) == 0)
			return &a->units[i];
	unit *u = realloc(a->units, (a->nunits + 1) * sizeof *u);

	if (!u)
		return NULL;
	a->units = u;
	u = &a->units[a->nunits];
	memset(u, 0, sizeof *u);
	if (!(u->host = strdup(host)))
		return NULL;
	u->pid = pid;
	u->normal = normal;
	u->first_ns = INT64_MAX;
	u->last_ns = INT64_MIN;
	u->last_node = AN_NONE;
	a->nunits++;
	return u;
}

/* Point 2 for one thread: its calls' exclusive times by call path. */
static int thread_profile(an_anomalies *a, an_trace *t, const an_thread *th, unit *u,
			  sp_err *err)
{
	an_call *c = NULL;
	size_t n = 0, depth = 0;
	struct open {
		size_t item;
		uint32_t node;
		double incl, inner;
	} *st = NULL;
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
			struct open *o = &st[--depth];

			if (add_time(u, o->node, o->incl > o->inner ? o->incl - o->inner : 0) != 0)
				goto oom;
			if (depth)
				st[depth - 1].inner += o->incl;
		}
		if (j == n || c[j].kind != AN_CALL)
			continue;
		const char *name = an_func_get(t, an_site(t, c[j].id)->callee)->name;
		uint32_t nm = name_id(a, name ? name : "?");
		uint32_t nd = nm == AN_NONE ? AN_NONE
			      : node_id(a, depth ? st[depth - 1].node : AN_NONE, nm);

		if (nd == AN_NONE)
			goto oom;
		st[depth++] = (struct open){ j, nd, (double)an_tsc_ns(t, c[j].t0, c[j].t1), 0 };
		int64_t t0 = an_realtime_ns(t, c[j].t0), t1 = an_realtime_ns(t, c[j].t1);

		if (t0 < u->first_ns)
			u->first_ns = t0;
		if (t1 > u->last_ns)
			u->last_ns = t1;
		/* point 3: the innermost call open at the end, else the last one */
		if (c[j].end == AN_END_TRACE ? c[j].t0 >= u->last_open_t0
		    : !u->last_open_t0 && c[j].t1 >= u->last_t1) {
			if (c[j].end == AN_END_TRACE)
				u->last_open_t0 = c[j].t0;
			u->last_t1 = c[j].t1;
			u->last_node = nd;
		}
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

static int session_units(an_anomalies *a, an_session *s, int normal, sp_err *err)
{
	for (size_t i = 0; i < an_session_nimages(s); i++) {
		const an_image *im = an_session_image(s, i);
		an_trace *t = an_session_trace(s, i);

		for (size_t k = 0; t && k < an_trace_nthreads(t); k++) {
			const an_thread *th = an_trace_thread(t, k);
			unit *u = unit_of(a, im->host ? im->host : "", th->pid ? th->pid : im->pid,
					  normal);

			if (!u)
				return sp_fail(err, "out of memory for the processes");
			if (thread_profile(a, t, th, u, err) != 0)
				return -1;
		}
	}
	return 0;
}

/* Point 4: the root whose subtree took most of u's time. */
static int role_of(const an_anomalies *a, unit *u)
{
	map roots = { 0 };
	double best = -1;
	double *sum = calloc(u->ne ? u->ne : 1, sizeof *sum);

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

/* Manhattan distance between two units' profiles (fractions of their time). */
static double distance(const unit *x, const unit *y)
{
	double d = 0, tx = x->total > 0 ? x->total : 1, ty = y->total > 0 ? y->total : 1;

	for (size_t i = 0; i < x->ne; i++) {
		double v = x->e[i].ns / tx - time_of(y, x->e[i].node) / ty;

		d += v < 0 ? -v : v;
	}
	for (size_t i = 0; i < y->ne; i++)
		if (!an_map_find(&x->idx, y->e[i].node, 0))
			d += y->e[i].ns / ty;
	return d;
}

static int path_of(const an_anomalies *a, uint32_t nd, const char ***out, size_t *n)
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

/* Point 5: the largest components of (u - v), into s. */
static int causes(const an_anomalies *a, const unit *u, const unit *v, an_suspect *s)
{
	double tu = u->total > 0 ? u->total : 1, tv = v && v->total > 0 ? v->total : 1;
	size_t best[MAX_CAUSES];
	double val[MAX_CAUSES];
	size_t nb = 0;

	for (size_t i = 0; i < u->ne; i++) {
		double d = u->e[i].ns / tu - (v ? time_of(v, u->e[i].node) / tv : 0);
		size_t k;

		if (d <= 0)
			continue;
		for (k = nb; k > 0 && val[k - 1] < d; k--)
			if (k < MAX_CAUSES) {
				best[k] = best[k - 1];
				val[k] = val[k - 1];
			}
		if (k < MAX_CAUSES) {
			best[k] = i;
			val[k] = d;
			if (nb < MAX_CAUSES)
				nb++;
		}
	}
	for (size_t k = 0; k < nb; k++) {
		an_cause *c = &s->causes[s->ncauses];
		const entry *e = &u->e[best[k]];

		if (path_of(a, e->node, &c->path, &c->npath) != 0)
			return -1;
		if (v)
			snprintf(c->why, sizeof c->why, "%.1f%% of pid %u's traced time against %.1f%% "
				 "of pid %u's, its nearest %s", 100 * e->ns / tu, u->pid,
				 100 * time_of(v, e->node) / tv, v->pid,
				 v->normal ? "normal process" : "neighbour");
		else
			snprintf(c->why, sizeof c->why, "%.1f%% of pid %u's traced time",
				 100 * e->ns / tu, u->pid);
		s->ncauses++;
	}
	if (nb && path_of(a, u->e[best[0]].node, &s->path, &s->npath) != 0)
		return -1;
	return 0;
}

static int by_score(const void *x, const void *y)
{
	const an_suspect *a = x, *b = y;

	if (a->failstop != b->failstop)
		return b->failstop - a->failstop;
	return a->score < b->score ? 1 : a->score > b->score ? -1 :
	       a->pid < b->pid ? -1 : a->pid > b->pid;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

/* Point 3: the process's own end, not a stop. */
static bool is_exit(const char *f)
{
	static const char *const exits[] = { "_exit", "_Exit", "exit", "__GI__exit", "__GI_exit",
					     "__run_exit_handlers", "exit_group", "quick_exit" };

	for (size_t i = 0; i < sizeof exits / sizeof *exits; i++)
		if (strcmp(f, exits[i]) == 0)
			return true;
	return false;
}

/* Point 3: the median last record of the other units of u's role (its own
 * if it is alone); tmp has room for every unit. */
static int64_t median_last(const an_anomalies *a, const unit *u, double *tmp)
{
	size_t n = 0;

	for (size_t j = 0; j < a->nunits; j++)
		if (&a->units[j] != u && !a->units[j].normal && a->units[j].total > 0 &&
		    a->units[j].role == u->role)
			tmp[n++] = (double)a->units[j].last_ns;
	if (!n)
		return u->last_ns;
	qsort(tmp, n, sizeof *tmp, cmp_double);
	return (int64_t)tmp[n / 2];
}

int an_anomalies_find(an_session *s, an_session *normal, an_anomalies **out, sp_err *err)
{
	an_anomalies *a = calloc(1, sizeof *a);
	size_t nsus = 0, failstop = AN_NONE;
	double *d = NULL;

	*out = NULL;
	if (!a)
		return sp_fail(err, "out of memory");
	if (session_units(a, s, 0, err) != 0 || (normal && session_units(a, normal, 1, err) != 0))
		goto fail;
	for (size_t i = 0; i < a->nunits; i++) {
		nsus += !a->units[i].normal && a->units[i].total > 0;
		if (role_of(a, &a->units[i]) != 0)
			goto oom;
	}
	if (!(a->sus = calloc(nsus ? nsus : 1, sizeof *a->sus)) ||
	    !(d = calloc(a->nunits ? a->nunits : 1, sizeof *d))) {
		sp_fail(err, "out of memory");
		goto fail;
	}
	/* Point 3, without known-normal traces. */
	int64_t gap = 0;

	if (!normal && nsus >= 3) {
		int64_t first = INT64_MAX, last = INT64_MIN;

		for (size_t i = 0; i < a->nunits; i++) {
			const unit *u = &a->units[i];

			if (u->total <= 0)
				continue;
			first = u->first_ns < first ? u->first_ns : first;
			last = u->last_ns > last ? u->last_ns : last;
		}
		for (size_t i = 0; i < a->nunits; i++) {
			const unit *u = &a->units[i];
			int64_t g;

			if (u->total <= 0 || u->normal || !u->last_open_t0 || u->last_node == AN_NONE ||
			    is_exit(a->names[a->nodes[u->last_node].name]))
				continue;
			g = median_last(a, u, d) - u->last_ns;
			if (g > FAILSTOP_MIN_NS && g > (last - first) / 10 && g > gap) {
				gap = g;
				failstop = i;
			}
		}
	}
	for (size_t i = 0; i < a->nunits; i++) {
		unit *u = &a->units[i];
		an_suspect *sp = &a->sus[a->nsus];
		const unit *near = NULL;
		size_t nd = 0;
		double best = 0;

		if (u->normal || u->total <= 0)
			continue;
		sp->host = u->host;
		sp->pid = u->pid;
		for (size_t j = 0; j < a->nunits; j++) {
			const unit *v = &a->units[j];

			if (j == i || v->total <= 0 || v->normal != (normal != NULL) ||
			    v->role != u->role)
				continue;
			double x = distance(u, v);

			if (!near || x < best) {
				near = v;
				best = x;
			}
			d[nd++] = x;
		}
		qsort(d, nd, sizeof *d, cmp_double);
		if (i == failstop) {
			sp->failstop = 1;
			sp->method = "earliest-last-timestamp";
			sp->score = (double)gap / 1e9;
			if (u->last_node != AN_NONE &&
			    path_of(a, u->last_node, &sp->path, &sp->npath) != 0)
				goto oom;
			an_cause *c = &sp->causes[sp->ncauses++];

			if (path_of(a, u->last_node, &c->path, &c->npath) != 0)
				goto oom;
			snprintf(c->why, sizeof c->why, "its last record, %.1f ms before the other "
				 "processes of its role went on to (their median): it stopped here "
				 "(crashed, hung or blocked)", (double)gap / 1e6);
		} else if (!normal && nd < 2) {
			sp->method = "knn-manhattan";
			sp->score = 0;
			an_cause *c = &sp->causes[sp->ncauses++];

			if (path_of(a, u->role, &c->path, &c->npath) != 0)
				goto oom;
			snprintf(c->why, sizeof c->why, "%s: %zu other process%s of this role (the "
				 "outermost function it spends most time in): not compared",
				 nd ? "only" : "no", nd, nd == 1 ? "" : "es");
		} else {
			size_t k = normal ? 1 : ((nd + 1) / 4 ? (nd + 1) / 4 : 1);

			sp->method = normal ? "nearest-normal" : "knn-manhattan";
			sp->score = nd ? d[(k <= nd ? k : nd) - 1] : 0;
			if (causes(a, u, near, sp) != 0)
				goto oom;
		}
		a->nsus++;
	}
	qsort(a->sus, a->nsus, sizeof *a->sus, by_score);
	free(d);
	*out = a;
	return 0;
oom:
	sp_fail(err, "out of memory");
fail:
	free(d);
	an_anomalies_free(a);
	return -1;
}

size_t an_anomalies_count(const an_anomalies *a)
{
	return a->nsus;
}

const an_suspect *an_anomalies_get(const an_anomalies *a, size_t i)
{
	return i < a->nsus ? &a->sus[i] : NULL;
}

void an_anomalies_free(an_anomalies *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->nsus; i++) {
		free((void *)a->sus[i].path);
		for (size_t k = 0; k < a->sus[i].ncauses; k++)
			free((void *)a->sus[i].causes[k].path);
	}
	free(a->sus);
	for (size_t i = 0; i < a->nunits; i++) {
		free(a->units[i].host);
		free(a->units[i].e);
		an_map_free(&a->units[i].idx);
	}
	free(a->units);
	for (size_t i = 0; i < a->nnames; i++)
		free(a->names[i]);
	free(a->names);
	free(a->nodes);
	an_map_free(&a->name_ids);
	an_map_free(&a->node_ids);
	free(a);
}
