/*
 * cause.c — why a unit is suspect: the evidence of each kind (time,
 * coverage, communication), the culprit among it, and when the culprit
 * showed (anomaly.c's points 6 and 7).
 */
#include "an_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TIME_MIN 0.005               /* point 6: a time cause moves a share by this at least */
#define COVER_RARE 0.10              /* point 6: taken by at most this share */
#define COVER_USUAL 0.90             /* point 6: not taken, by at least this share */
#define MAX_EACH 4                   /* candidates of each kind kept for the causes */
#define COMM_MIN 0.05                /* point 6: a communication cause moves its distance by this */
#define COMM_CLEAR 0.25              /* point 6: and is the culprit from this on */

/* A candidate cause of point 6. */
typedef struct cand {
	uint32_t node;
	double key;                      /* time: the difference; coverage: exclusiveness */
	double ns;                       /* coverage: the unit's time under the path */
	int taken;                       /* coverage: 1 taken unlike the others, 0 not taken;
					    communication: 1 received, 0 sent */
	size_t count;                    /* coverage: how many of the others took it */
	size_t merged;                   /* coverage: further paths ending in its function */
} cand;

/* Keep the MAX_EACH best of a list ordered by `better`. */
static void keep_best(cand *list, size_t *n, cand c, int (*better)(const cand *, const cand *))
{
	size_t k;

	for (k = *n; k > 0 && better(&c, &list[k - 1]); k--)
		if (k < MAX_EACH)
			list[k] = list[k - 1];
	if (k < MAX_EACH) {
		list[k] = c;
		if (*n < MAX_EACH)
			(*n)++;
	}
}

static int time_better(const cand *x, const cand *y)
{
	return x->key > y->key;
}

static int cover_better(const cand *x, const cand *y)
{
	if (x->key != y->key)
		return x->key > y->key;
	if (x->taken != y->taken)
		return x->taken > y->taken;
	return x->ns > y->ns;
}

/* Point 6, time: the largest components of (u - v). */
static void time_cands(const unit *u, const unit *v, cand *out, size_t *n)
{
	double tu = u->total > 0 ? u->total : 1, tv = v && v->total > 0 ? v->total : 1;

	*n = 0;
	for (size_t i = 0; i < u->ne; i++) {
		double d = u->e[i].ns / tu - (v ? an_time_of(v, u->e[i].node) / tv : 0);

		if (d > 0)
			keep_best(out, n, (cand){ .node = u->e[i].node, .key = d }, time_better);
	}
	/* after the largest (the culprit's fallback), only those that tell */
	while (*n > 1 && out[*n - 1].key < TIME_MIN)
		(*n)--;
}

/* The time u spent under call path nd (nd and the paths below it). */
static double time_under(const an_anomalies *a, const unit *u, uint32_t nd)
{
	double ns = 0;

	for (size_t i = 0; i < u->ne; i++)
		for (uint32_t k = u->e[i].node; k != AN_NONE; k = a->nodes[k].parent)
			if (k == nd) {
				ns += u->e[i].ns;
				break;
			}
	return ns;
}

/*
 * Point 6, coverage: u against the units `others` (npeers of them); count
 * says, per node, how many of them entered it (a map node -> count, u's own
 * included when self_counted).
 */
static int cover_cands(const an_anomalies *a, const unit *u, const map *count, int self_counted,
		       size_t npeers, cand *out, size_t *n)
{
	cand all[64];
	size_t nall = 0;

	*n = 0;
	if (!npeers)
		return 0;
	for (size_t pass = 0; pass < 2; pass++) {
		/* pass 0: u's paths taken unlike the others; pass 1: the others'
		 * usual paths u did not take */
		for (size_t i = 0; i < count->cap; i++) {
			const map_slot *s = &count->slot[i];

			if (!s->used)
				continue;
			uint32_t nd = (uint32_t)s->a;
			bool mine = an_covers(u, nd);
			size_t c = s->val - (self_counted && mine);
			double share = (double)c / (double)npeers;
			uint32_t up = a->nodes[nd].parent;

			if (pass == 0 && (!mine || share > COVER_RARE))
				continue;
			if (pass == 1 && (mine || share < COVER_USUAL))
				continue;
			/* reduction 1: the parent path differs the same way */
			if (up != AN_NONE) {
				const map_slot *ps = an_map_find(count, up, 0);
				size_t pc = ps ? ps->val - (self_counted && an_covers(u, up)) : 0;
				double psh = (double)pc / (double)npeers;

				if (pass == 0 ? psh <= COVER_RARE : !an_covers(u, up))
					continue;
			}
			cand cd = { .node = nd, .key = pass == 0 ? 1 - share : share,
				    .ns = pass == 0 ? time_under(a, u, nd) : 0, .taken = pass == 0,
				    .count = c };

			/* reduction 2: one per function */
			size_t k;

			for (k = 0; k < nall; k++)
				if (all[k].taken == cd.taken &&
				    a->nodes[all[k].node].name == a->nodes[nd].name)
					break;
			if (k < nall) {
				all[k].merged++;
				if (cover_better(&cd, &all[k])) {
					cd.merged = all[k].merged;
					all[k] = cd;
				}
			} else if (nall < sizeof all / sizeof *all) {
				all[nall++] = cd;
			}
		}
	}
	for (size_t k = 0; k < nall; k++)
		keep_best(out, n, all[k], cover_better);
	return 0;
}

/* A cause's text (cut at the end when it does not fit). */
void an_say(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void an_say(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

static int add_cause(const an_anomalies *a, an_suspect *s, const cand *c, const char *kind,
		     const char why[sizeof s->causes[0].why])
{
	an_cause *k = &s->causes[s->ncauses];

	if (s->ncauses == AN_MAX_CAUSES)
		return 0;		/* cannot happen: callers keep count */
	if (an_path_of(a, c->node, &k->path, &k->npath) != 0)
		return -1;
	k->kind = kind;
	memcpy(k->why, why, sizeof k->why);
	s->ncauses++;
	return 0;
}

/* Point 6, communication: the call paths whose messages differ most between
 * u and v, each by its part of their communication distance. */
static void comm_cands(const unit *u, const unit *v, cand *out, size_t *n)
{
	double tn = (double)(u->sends + v->sends), tb = (double)(u->bytes + v->bytes);

	*n = 0;
	for (size_t side = 0; side < 2; side++) {
		/* side 0: u's paths; side 1: v's that u has not */
		const unit *x = side ? v : u, *y = side ? u : v;

		for (size_t i = 0; i < x->ncm; i++) {
			const comm *c = &x->cm[i], *o = an_comm_of(y, c->node, (int)c->recv);

			if (side && o)
				continue;
			uint64_t on = o ? o->n : 0, ob = o ? o->bytes : 0;
			double dn = c->recv ? 0 : (double)(c->n > on ? c->n - on : on - c->n);
			double db = (double)(c->bytes > ob ? c->bytes - ob : ob - c->bytes);
			double key = ((tn > 0 ? dn / tn : 0) + (tb > 0 ? db / tb : 0)) / 2;

			if (key >= COMM_MIN)
				keep_best(out, n, (cand){ .node = c->node, .key = key,
							  .taken = (int)c->recv }, time_better);
		}
	}
}

static const char *const kind_names[NKINDS] = { "time", "coverage", "communication" };

/* A cause's words, for the cand c of kind k. */
static void cause_why(int k, const cand *c, const unit *u, const unit *v, size_t npeers,
		      const char *others, char *why, size_t len)
{
	double tu = u->total > 0 ? u->total : 1, tv = v && v->total > 0 ? v->total : 1;
	char un[96], vn[96], more[64] = "";

	an_unit_name(u, un, sizeof un);
	if (v)
		an_unit_name(v, vn, sizeof vn);
	if (k == K_TIME && v)
		an_say(why, len, "%.1f%% of %s's traced time against %.1f%% of %s's, its nearest %s",
		    100 * an_time_of(u, c->node) / tu, un, 100 * an_time_of(v, c->node) / tv, vn,
		    v->normal ? "normal unit" : "neighbour");
	else if (k == K_TIME)
		an_say(why, len, "%.1f%% of %s's traced time", 100 * an_time_of(u, c->node) / tu, un);
	else if (k == K_COMM) {
		const comm *x = an_comm_of(u, c->node, c->taken), *y = an_comm_of(v, c->node, c->taken);

		an_say(why, len, "%s %s %" PRIu64 " message%s (%" PRIu64 " bytes) here, its nearest %s "
			 "%s %" PRIu64 " (%" PRIu64 " bytes)", un, c->taken ? "received" : "sent",
		    x ? x->n : 0, x && x->n == 1 ? "" : "s", x ? x->bytes : 0,
		    v->normal ? "normal unit" : "neighbour", vn, y ? y->n : 0, y ? y->bytes : 0);
	} else {
		if (c->merged)
			an_say(more, sizeof more, " (and %zu more path%s ending in it)", c->merged,
			    c->merged == 1 ? "" : "s");
		if (c->taken)
			an_say(why, len, "taken by %s and by %zu of the %zu other %s%s", un, c->count,
			    npeers, others, more);
		else
			an_say(why, len, "not taken by %s, taken by %zu of the %zu other %s%s", un,
			    c->count, npeers, others, more);
	}
}

/* Point 6: the culprit and the causes of u, against v (time,
 * communication) and the others (coverage); the culprit in *cul. */
int an_causes(const an_anomalies *a, const unit *u, const unit *v, const map *count,
		  int self_counted, size_t npeers, const char *others, an_suspect *s,
		  culprit *cul)
{
	cand list[NKINDS][MAX_EACH];
	size_t cnt[NKINDS], at[NKINDS] = { 0 };
	char why[sizeof s->causes[0].why];
	int first;

	time_cands(u, v, list[K_TIME], &cnt[K_TIME]);
	if (cover_cands(a, u, count, self_counted, npeers, list[K_COVER], &cnt[K_COVER]) != 0)
		return -1;
	cnt[K_COMM] = 0;
	if (v)                   /* messages: against the compared unit */
		comm_cands(u, v, list[K_COMM], &cnt[K_COMM]);
	if ((cnt[K_COVER] || cnt[K_COMM]) && cnt[K_TIME] == 1 && list[K_TIME][0].key < TIME_MIN)
		cnt[K_TIME] = 0;     /* a time difference that tells nothing */
	if (cnt[K_TIME] && list[K_TIME][0].key >= TIME_CLEAR)
		first = K_TIME;
	else if (cnt[K_COVER] && list[K_COVER][0].taken)
		first = K_COVER;
	else if (cnt[K_COMM] && list[K_COMM][0].key >= COMM_CLEAR)
		first = K_COMM;
	else
		first = cnt[K_TIME] ? K_TIME : cnt[K_COVER] ? K_COVER : K_COMM;
	cul->kind = -1;
	/* the culprit's kind first, then the best of the others, then by turns */
	for (size_t round = 0, r = 0;; round++) {
		size_t before = s->ncauses;

		for (int step = round ? 0 : -1; step < NKINDS; step++) {
			int k = step < 0 ? first : step;

			if ((round == 0 && step == first) || at[k] == cnt[k] ||
			    s->ncauses == AN_MAX_CAUSES - 1)
				continue;
			const cand *c = &list[k][at[k]++];

			cause_why(k, c, u, v, npeers, others, why, sizeof why);
			if (add_cause(a, s, c, kind_names[k], why) != 0)
				return -1;
			if (r++)
				continue;
			if (an_path_of(a, c->node, &s->path, &s->npath) != 0)
				return -1;
			*cul = (culprit){ k, c->node, c->taken, 0 };
			if (k == K_TIME && v)
				cul->share = an_time_of(v, c->node) / (v->total > 0 ? v->total : 1);
		}
		if (round && s->ncauses == before)
			break;
	}
	return 0;
}

static int by_start(const void *x, const void *y)
{
	const stretch *a = x, *b = y;

	return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

/*
 * Point 7: when the culprit of unit ui (a suspect of the session, not of
 * REF) showed, from a second sweep of its windows: the interval [*from,
 * *to] and the time in the path inside it (*in).  0 when found, 1 when the
 * path left no time in the unit, -1 with err.
 */
static int interval_of(an_anomalies *a, an_session *s, uint32_t ui, const culprit *cul,
		       int64_t *from, int64_t *to, double *in, sp_err *err)
{
	const unit *u = &a->units[ui];
	collect col = { cul->kind, cul->node, cul->recv, NULL, 0, 0 };
	window *w = calloc(a->nparts ? a->nparts : 1, sizeof *w);
	int rc = -1;

	if (!w)
		return sp_fail(err, "out of memory for the interval of a suspect");
	for (size_t i = 0, j; i < a->nparts; i = j) {
		const part_ref *p = &a->parts[i];
		size_t nw = 0;

		for (j = i; j < a->nparts && a->parts[j].image == p->image &&
			    a->parts[j].tid == p->tid; j++)
			if (a->parts[j].w.unit == ui)
				w[nw++] = a->parts[j].w;
		if (!nw)
			continue;
		an_trace *t = an_session_trace(s, p->image);
		const an_thread *th = t ? an_trace_thread_by_tid(t, p->tid) : NULL;

		if (th && an_thread_profile(a, t, th, w, nw, 0, &col, err) != 0)
			goto out;
	}
	rc = 1;
	if (!col.n)
		goto out;
	qsort(col.s, col.n, sizeof *col.s, by_start);
	size_t m = 0;                    /* merged: threads overlap */

	for (size_t i = 1; i < col.n; i++)
		if (col.s[i].t0 <= col.s[m].t1)
			col.s[m].t1 = col.s[i].t1 > col.s[m].t1 ? col.s[i].t1 : col.s[m].t1;
		else
			col.s[++m] = col.s[i];
	col.n = m + 1;
	/* the stretch holding the path's time beyond what the compared unit's
	 * share of it would put there: each stretch weighs its length times
	 * (1 - r), each gap between two costs its length times r */
	double r = 0, cur = 0, best = -1;
	int64_t span = u->last_ns - u->first_ns, start = col.s[0].t0;

	if (col.kind == K_TIME && span > 0)
		r = cul->share * u->total / (double)span;
	r = r < 0.95 ? r : 0.95;
	*from = col.s[0].t0;
	*to = col.s[col.kind == K_COMM ? col.n - 1 : 0].t1;   /* messages: first to last */
	for (size_t i = 0; col.kind != K_COMM && i < col.n; i++) {
		double gap = i ? r * (double)(col.s[i].t0 - col.s[i - 1].t1) : 0;
		double len = (double)(col.s[i].t1 - col.s[i].t0) * (1 - r);

		if (i && cur - gap > 0) {
			cur += len - gap;
		} else {
			cur = len;
			start = col.s[i].t0;
		}
		if (cur > best) {
			best = cur;
			*from = start;
			*to = col.s[i].t1;
		}
	}
	*in = 0;
	for (size_t i = 0; i < col.n; i++)
		if (col.s[i].t0 >= *from && col.s[i].t1 <= *to)
			*in += (double)(col.s[i].t1 - col.s[i].t0);
	rc = 0;
out:
	free(col.s);
	free(w);
	return rc;
}

/* Point 7 for suspect sp of unit ui: the interval as its last cause. */
int an_add_interval(an_anomalies *a, an_session *s, uint32_t ui, const culprit *cul,
			an_suspect *sp, sp_err *err)
{
	const unit *u = &a->units[ui];
	int64_t from = 0, to = 0;
	double in = 0, ms = 1e-6 * (double)(u->last_ns - u->first_ns);
	an_cause *c = &sp->causes[sp->ncauses];
	char un[96];
	int rc;

	if (cul->kind < 0 || sp->ncauses == AN_MAX_CAUSES)
		return 0;
	if ((rc = interval_of(a, s, ui, cul, &from, &to, &in, err)) != 0)
		return rc < 0 ? -1 : 0;
	an_unit_name(u, un, sizeof un);
	if (an_path_of(a, cul->node, &c->path, &c->npath) != 0)
		return sp_fail(err, "out of memory");
	c->kind = "interval";
	sp->interval_from_ns = from;
	sp->interval_to_ns = to;
	double f = 1e-6 * (double)(from - u->first_ns), t = 1e-6 * (double)(to - u->first_ns);

	if (cul->kind == K_TIME)
		an_say(c->why, sizeof c->why, "from +%.1f ms to +%.1f ms of %s's %.1f ms: %.1f ms in "
			 "this path, %.0f%% of that time (its compared unit spends %.1f%% of its time "
			 "here)", f, t, un, ms, 1e-6 * in, to > from ? 100 * in / (double)(to - from)
			 : 100.0, 100 * cul->share);
	else if (cul->kind == K_COVER)
		an_say(c->why, sizeof c->why, "taken from +%.1f ms to +%.1f ms of %s's %.1f ms",
			 f, t, un, ms);
	else
		an_say(c->why, sizeof c->why, "its messages here went from +%.1f ms to +%.1f ms of "
			 "%s's %.1f ms", f, t, un, ms);
	sp->ncauses++;
	return 0;
}

