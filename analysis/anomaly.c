/*
 * anomaly.c — which request, process or host behaved differently, and which
 * call path is the likely cause (chapter 5 of the self-propelled
 * instrumentation thesis, summarised in ../shared/DESIGN.md), over the units
 * of a session.
 *
 *  1. Units: the session's flows (flows.c: one per request or job), its
 *     processes (host and pid; a forked child that did not exec is a unit of
 *     its own, by its threads' pid) or its hosts.  AN_UNITS_AUTO takes flows
 *     when there are 3 or more, else processes.  With start functions
 *     (an_anomaly_opts.flows), each call of one is a flow, and the root of
 *     the call paths under it: the jobs compare with each other, not with
 *     what called them.
 *  2. A unit's profiles, from each thread's call tree swept in time: at
 *     every moment the innermost open call spends the time, under its call
 *     path (the functions from the thread's outermost traced call down, by
 *     name, so that units of different processes and hosts compare; with
 *     an_anomaly_opts.sites each by name and call site, "callee@caller+0xOFF",
 *     link-time offsets, the same in every process of a binary).
 *       - time: the time spent in each call path, exclusive of the calls
 *         nested in it, as a fraction of the unit's traced time.  A flow
 *         owns a thread's time between its part's first and last records
 *         (an_flow_part), so a call that spans several flows -- a poll()
 *         loop serving one request after another -- is split between them
 *         at the switches.  A part whose first message is a receive (a
 *         request arrived) begins there, and one whose last message is a
 *         send (a request answered) ends there: what its thread does before
 *         and after is waiting for a request.  A call still open at the end counts up to the
 *         thread's last record.  The agent's own time (instrumenting a
 *         function reached for the first time: AGENT_BEGIN to AGENT_END,
 *         trace_format.h) is nobody's: the first requests would otherwise
 *         all look slow.
 *       - coverage: the set of call paths entered (in a flow: entered
 *         inside one of its parts).
 *       - communication: the messages sent and received (trace_format.h's
 *         message events, at their stamp: a call's start) by the call path
 *         of the innermost call open at each, one way or the other: their
 *         number and their bytes.  The number received is left out of the
 *         distance: how a stream's bytes come in pieces is the kernel's
 *         doing, not the program's.
 *     The composite distance between two units is the Manhattan distance of
 *     their time profiles (0..2) plus the Jaccard distance of their
 *     coverage (0..1: the paths only one has, over the paths either has)
 *     plus their communication distance (0..1: the mean of the Manhattan
 *     distance of the messages sent by path and that of the bytes by path
 *     and way, each over the two units' sums -- so twice the messages or a
 *     reply ten times larger tells, not only a different spread);
 *     AN_PROFILE_TIME, AN_PROFILE_COVERAGE and AN_PROFILE_COMMUNICATION
 *     take one of the three alone.
 *  3. Fail-stop first (processes and flows; a host does not stop while its
 *     peers go on, but one of its processes may: by host, the host of the
 *     process the processes' point 3 names ranks first, with that
 *     process's gap and culprit): a unit that stopped in the middle of something -- a
 *     call still open at its last record that is not the process's exit
 *     (_exit, exit: it ended as it should); for a flow, a call it entered
 *     that never returned (a request stuck on its thread) -- while the
 *     other units of its role (point 4) went on: its last record is earlier than their median
 *     last record by more than FAILSTOP_MIN_NS and a tenth of the session's
 *     span (well above clock precision).  It crashed, hung in a loop that
 *     calls nothing, or blocked for good.  The one with the largest gap
 *     ranks first (method "earliest-last-timestamp", score: the gap in
 *     seconds), and its culprit is the innermost call open at its last
 *     record.
 *  4. The others (all, without a fail-stop): the suspect score is the
 *     composite distance to the unit's k-th nearest neighbour, k = |U|/4 (at
 *     least 1): a unit unlike most others scores high even when a few others
 *     are like it.  Units are compared with those of their role only -- the
 *     program (its file's name: a process's, the one a host spends most time
 *     in, the one a flow starts in) and the outermost function they spend
 *     most time in (a server's master and its workers, a parent and the
 *     children it forked, a client's host and its servers', are not alike by
 *     design); a role of fewer than 3 units is not scored (0, said in its
 *     cause).  The scores cost a distance per pair of a role's units: a
 *     role of more than SAMPLE_ABOVE units compares each with about SAMPLE
 *     of them (every n/SAMPLE-th, from a start that depends on the unit: the
 *     k-th nearest of the sample estimates the same quantile of its
 *     distances), then scores the TOP_EXACT most suspect again against all
 *     (their score, nearest neighbour and causes exact).
 *  5. With known-normal traces (`--normal REF`: the one-class variant), the
 *     score is the distance to the nearest unit of REF of the same role, and
 *     REF sets the bar: the threshold is the largest distance from a unit of
 *     REF to its nearest other unit of REF (how far normal units can be from
 *     each other), leaving out REF's own far outliers (beyond the third
 *     quartile of those distances by three interquartile ranges: a
 *     reference run has its noise too), and never below that fence nor
 *     FLAG_FLOOR: 0.2, time shares moved by 10% (TIME_CLEAR, the culprit's
 *     bar) -- two runs of the same requests differ more than one run's
 *     requests among themselves, and a busy machine's preemptions move a
 *     request's shares by several percent.  A unit farther than that is flagged; a normal but rare
 *     behaviour that REF also shows is near a unit of REF, and is not.  A
 *     unit whose role REF lacks is flagged with the largest distance, 3.
 *  6. The causes (against the nearest neighbour or nearest normal unit for
 *     time and communication, against every other unit of the role -- or of
 *     REF -- for coverage):
 *       - time: the components of the difference between the time
 *         profiles, largest first (after the largest, only those of half a
 *         percent or more);
 *       - coverage: the paths the unit entered that at most a tenth of the
 *         others did (taken unlike the others), and those at least nine
 *         tenths of the others entered and it did not (not taken).  Two
 *         reductions: a path whose parent path is itself such a difference
 *         is dropped (the parent explains it: keep the shortest prefix), and
 *         paths ending in the same function are merged into the first.  They
 *         rank by how exclusive they are (for a taken path, the share of
 *         others without it; for a path not taken, the share with it), then
 *         taken before not taken, then by the time the unit spent under
 *         them;
 *       - communication: the paths and ways whose messages differ most,
 *         each by its part of the communication distance (COMM_MIN at
 *         least).
 *     The culprit: the largest time difference when it is at least
 *     TIME_CLEAR of the unit's time, else the first path taken unlike the
 *     others if there is one, else the largest communication difference
 *     when it is COMM_CLEAR at least, else the largest time difference (or,
 *     without one, the first of the others).  The causes list the culprit's
 *     first, then the best of each other kind, then the rest by turns, so
 *     each kind of evidence is in the first three.
 *  7. When (the anomalous time interval), for the INTERVAL_TOP most suspect
 *     units that stand out (flagged, or a score of FLAG_FLOOR at least;
 *     not a fail-stop, whose cause says when already): a second sweep of
 *     the unit's windows collects where its culprit showed -- for a time
 *     culprit, the stretches of time in the path itself; for a path taken
 *     unlike the others, the time under it; for messages, their stamps.
 *     The interval is the stretch of the unit's time where its time in the
 *     path ran furthest beyond what the compared unit's share would put
 *     there: each stretch in the path weighs its length times (1 - r) and
 *     each gap between two costs its length times r, r the compared unit's
 *     share of the path scaled to the unit's span (at most 0.95), and the
 *     heaviest run wins (a maximum-sum run, one pass).  With r = 0 it runs
 *     from the first stretch to the last; messages, from the first to the
 *     last.  It is the unit's last cause (kind "interval"), with its bounds
 *     in the suspect.
 */
#include "an_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAILSTOP_MIN_NS 10000000ll   /* point 3 */
#define MAX_DIST 4.0                 /* point 5: the composite distance's bound */
#define SAMPLE_ABOVE 4096            /* point 4: roles larger are sampled ... */
#define SAMPLE 1024                  /* ... about this many of their units */
#define TOP_EXACT 32                 /* ... and the most suspect scored again exactly */
#define FLAG_FLOOR (2 * TIME_CLEAR)  /* point 5: the least threshold */
#define INTERVAL_TOP 8               /* point 7: the most suspect units said when */

/* The k-th smallest of v[0..n) (k from 0), v reordered. */
static double kth(double *v, size_t n, size_t k)
{
	size_t lo = 0, hi = n - 1;

	while (lo < hi) {
		double p = v[lo + (hi - lo) / 2];
		size_t i = lo, j = hi;

		while (i <= j) {
			while (v[i] < p)
				i++;
			while (v[j] > p)
				j--;
			if (i <= j) {
				double t = v[i];

				v[i] = v[j];
				v[j] = t;
				i++;
				if (j == 0)
					break;
				j--;
			}
		}
		if (k <= j)
			hi = j;
		else if (k >= i)
			lo = i;
		else
			return v[k];
	}
	return v[k];
}

static int by_score(const void *x, const void *y)
{
	const an_suspect *a = x, *b = y;
	int c;

	if (a->failstop != b->failstop)
		return b->failstop - a->failstop;
	if (a->score != b->score)
		return a->score < b->score ? 1 : -1;
	if ((c = strcmp(a->host, b->host)) != 0)
		return c;
	if (a->pid != b->pid)
		return a->pid < b->pid ? -1 : 1;
	return a->flow && b->flow ? strlen(a->flow) != strlen(b->flow)
				    ? (strlen(a->flow) < strlen(b->flow) ? -1 : 1)
				    : strcmp(a->flow, b->flow) : 0;
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
		    an_same_role(&a->units[j], u))
			tmp[n++] = (double)a->units[j].last_ns;
	if (!n)
		return u->last_ns;
	qsort(tmp, n, sizeof *tmp, cmp_double);
	return (int64_t)tmp[n / 2];
}

/* Point 3: the unit that stopped first, AN_NONE if none; its gap in *gap. */
static size_t failstop_unit(const an_anomalies *a, size_t nsus, double *tmp, int64_t *gap)
{
	int64_t first = INT64_MAX, last = INT64_MIN;
	size_t which = AN_NONE;

	*gap = 0;
	if (a->kind == AN_UNITS_HOST || nsus < 3)
		return AN_NONE;
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
		g = median_last(a, u, tmp) - u->last_ns;
		if (g > FAILSTOP_MIN_NS && g > (last - first) / 10 && g > *gap) {
			*gap = g;
			which = i;
		}
	}
	return which;
}

/* Per role, how many units (of the session, or of REF) entered each path:
 * counts[r] for the r-th role of roles[]. */
typedef struct role_count {
	uint32_t role, prog;
	int normal;
	size_t units;
	map count;
} role_count;

static role_count *count_of(role_count *rc, size_t n, const unit *u, int normal)
{
	for (size_t i = 0; i < n; i++)
		if (rc[i].role == u->role && rc[i].prog == u->prog && rc[i].normal == normal)
			return &rc[i];
	return NULL;
}

static int count_roles(const an_anomalies *a, role_count **out, size_t *n)
{
	role_count *rc = calloc(a->nunits ? a->nunits : 1, sizeof *rc);

	*out = rc;
	*n = 0;
	if (!rc)
		return -1;
	for (size_t i = 0; i < a->nunits; i++) {
		const unit *u = &a->units[i];
		role_count *r;

		if (u->total <= 0)
			continue;
		if (!(r = count_of(rc, *n, u, u->normal))) {
			r = &rc[(*n)++];
			r->role = u->role;
			r->prog = u->prog;
			r->normal = u->normal;
		}
		r->units++;
		for (size_t k = 0; k < u->ne; k++) {
			map_slot *s = an_map_get(&r->count, u->e[k].node, 0);

			if (!s)
				return -1;
			s->val++;
		}
	}
	return 0;
}

static void free_roles(role_count *rc, size_t n)
{
	for (size_t i = 0; i < n; i++)
		an_map_free(&rc[i].count);
	free(rc);
}

/* Point 5: the threshold of a role, from the reference; -1 if the
 * reference has fewer than 2 units of it.  tmp has room for every unit. */
static double ref_threshold(an_anomalies *a, const unit *u, double *tmp)
{
	dense *dn = &a->dn[u->dense];
	size_t n = 0;
	double q1, q3, fence, worst = -1;

	if (dn->has_threshold)
		return dn->threshold;
	dn->has_threshold = 1;
	dn->threshold = -1;

	for (size_t i = 0; i < a->nunits; i++) {
		const unit *x = &a->units[i];
		double best = -1;

		if (!x->normal || x->total <= 0 || !an_same_role(x, u))
			continue;
		for (size_t j = 0; j < a->nunits; j++) {
			const unit *y = &a->units[j];

			if (j == i || !y->normal || y->total <= 0 || !an_same_role(y, u))
				continue;
			double d = an_distance(a, x, y);

			if (best < 0 || d < best)
				best = d;
		}
		if (best >= 0)
			tmp[n++] = best;
	}
	if (!n)
		return -1;
	qsort(tmp, n, sizeof *tmp, cmp_double);
	q1 = tmp[n / 4];
	q3 = tmp[3 * n / 4];
	fence = q3 + 3 * (q3 - q1);
	for (size_t i = 0; i < n; i++)
		if (tmp[i] <= fence)
			worst = tmp[i];
	worst = worst > fence ? worst : fence;
	dn->threshold = worst > FLAG_FLOOR ? worst : FLAG_FLOOR;
	return dn->threshold;
}

static const char *kind_plural(int kind)
{
	return kind == AN_UNITS_FLOW ? "flows" : kind == AN_UNITS_HOST ? "hosts" : "processes";
}

/*
 * Point 4's comparisons of unit i: its distances to the units of its role
 * (of REF with `normal`) in d, their count returned, the nearest in *near.
 * A role of more than SAMPLE_ABOVE units is sampled unless `exact`.
 */
static size_t compare(const an_anomalies *a, size_t i, int normal, bool exact, double *d,
		      const unit **near, double *best)
{
	const unit *u = &a->units[i];
	const dense *dn = &a->dn[u->dense];
	size_t nd = 0, step = 1, first = 0;

	*near = NULL;
	*best = 0;
	if (!exact && !normal && dn->nrows > SAMPLE_ABOVE) {
		step = dn->nrows / SAMPLE;
		first = (size_t)(((uint64_t)i * 2654435761u) % step);
	}
	for (size_t r = first; r < dn->nrows; r += step) {
		size_t j = dn->unit_of[r];
		const unit *v = &a->units[j];

		if (j == i || v->normal != normal)
			continue;
		double x = an_distance(a, u, v);

		if (!*near || x < *best) {
			*near = v;
			*best = x;
		}
		d[nd++] = x;
	}
	return nd;
}

/* Point 4: the k-th nearest of the nd distances d (reordered), and the
 * causes against the nearest. */
static int knn(const an_anomalies *a, const unit *u, an_suspect *sp, double *d, size_t nd,
	       const unit *near, const role_count *rc, culprit *cul)
{
	size_t k = (nd + 1) / 4 ? (nd + 1) / 4 : 1;
	char others[64];

	snprintf(others, sizeof others, "%s of its role", kind_plural(a->kind));
	sp->method = "knn-manhattan";
	sp->score = kth(d, nd, (k <= nd ? k : nd) - 1);
	sp->nearest = near ? near->flow : NULL;
	return an_causes(a, u, near, &rc->count, 1, rc->units - 1, others, sp, cul);
}


static void clear_causes(an_suspect *sp)
{
	free((void *)sp->path);
	sp->path = NULL;
	sp->npath = 0;
	for (size_t k = 0; k < sp->ncauses; k++)
		free((void *)sp->causes[k].path);
	memset(sp->causes, 0, sizeof sp->causes);
	sp->ncauses = 0;
}

/* Suspects' indexes by score, highest first (qsort_r, for TOP_EXACT). */
static int by_index_score(const void *x, const void *y, void *sus)
{
	const an_suspect *s = sus;
	double sx = s[*(const uint32_t *)x].score, sy = s[*(const uint32_t *)y].score;

	return sx < sy ? 1 : sx > sy ? -1 : 0;
}

/* Suspects' indexes in the order of their ranks (qsort_r, point 7). */
static int by_index_rank(const void *x, const void *y, void *sus)
{
	const an_suspect *s = sus;

	return by_score(&s[*(const uint32_t *)x], &s[*(const uint32_t *)y]);
}

/* Point 3 by host: the processes' fail-stop, if there is one (*pa, to be
 * freed, holds it). */
static const an_suspect *process_failstop(an_session *s, const an_anomaly_opts *o,
					  an_anomalies **pa, sp_err *err)
{
	an_anomaly_opts po = o ? *o : (an_anomaly_opts){ 0 };

	po.units = AN_UNITS_PROCESS;
	if (an_anomalies_find(s, NULL, &po, pa, err) != 0)
		return NULL;
	return (*pa)->nsus && (*pa)->sus[0].failstop ? &(*pa)->sus[0] : NULL;
}

/* A copy of another analysis's call path, its names a's own. */
static int path_copy(an_anomalies *a, const char *const *from, size_t n, const char ***out,
		     size_t *nout)
{
	*out = calloc(n ? n : 1, sizeof **out);
	if (!*out)
		return -1;
	*nout = n;
	for (size_t i = 0; i < n; i++) {
		uint32_t id = an_name_id(a, from[i]);

		if (id == AN_NONE)
			return -1;
		(*out)[i] = a->names[id];
	}
	return 0;
}

int an_anomalies_find(an_session *s, an_session *normal, const an_anomaly_opts *o,
		      an_anomalies **out, sp_err *err)
{
	an_anomalies *a = calloc(1, sizeof *a), *pa = NULL;
	const an_suspect *pf = NULL;
	size_t nsus = 0, failstop, nroles = 0;
	role_count *roles = NULL;
	uint32_t *sus_unit = NULL, *order = NULL;   /* a suspect's unit; suspects by score */
	culprit *cul = NULL;                        /* a suspect's culprit */
	bool sampled = false;
	double *d = NULL;
	int64_t gap = 0;

	*out = NULL;
	if (!a)
		return sp_fail(err, "out of memory");
	a->kind = o ? o->units : AN_UNITS_AUTO;
	a->profile = o ? o->profile : AN_PROFILE_COMPOSITE;
	a->sites = o ? o->sites : 0;
	if (o)
		a->flow_opts = o->flows;
	if (an_units_profile(a, s, 0, err) != 0 || (normal && an_units_profile(a, normal, 1, err) != 0))
		goto fail;
	for (size_t i = 0; i < a->nunits; i++) {
		nsus += !a->units[i].normal && a->units[i].total > 0;
		if (an_unit_role(a, &a->units[i]) != 0)
			goto oom;
	}
	if (!(a->sus = calloc(nsus ? nsus : 1, sizeof *a->sus)) ||
	    !(sus_unit = calloc(nsus ? nsus : 1, sizeof *sus_unit)) ||
	    !(order = calloc(nsus ? nsus : 1, sizeof *order)) ||
	    !(cul = calloc(nsus ? nsus : 1, sizeof *cul)) ||
	    !(d = calloc(a->nunits ? 2 * a->nunits : 1, sizeof *d)) ||
	    count_roles(a, &roles, &nroles) != 0 || an_make_dense(a) != 0)
		goto oom;
	failstop = normal ? AN_NONE : failstop_unit(a, nsus, d, &gap);
	if (a->kind == AN_UNITS_HOST && !normal) {
		pf = process_failstop(s, o, &pa, err);
		if (!pa)
			goto fail;
	}
	for (size_t i = 0; i < a->nunits; i++) {
		unit *u = &a->units[i];
		an_suspect *sp = &a->sus[a->nsus];
		const unit *near = NULL;
		const role_count *rc = count_of(roles, nroles, u, normal != NULL);
		size_t nd;
		double best = 0;

		if (u->normal || u->total <= 0)
			continue;
		sp->kind = a->kind;
		sp->flow = u->flow;
		sp->host = u->host;
		sp->pid = u->pid;
		sp->flagged = -1;
		sp->first_ns = u->first_ns;
		sus_unit[a->nsus] = (uint32_t)i;
		cul[a->nsus].kind = -1;
		nd = compare(a, i, normal != NULL, false, d, &near, &best);
		if (pf && strcmp(u->host, pf->host) == 0) {
			sp->failstop = sp->flagged = 1;
			sp->method = pf->method;
			sp->score = pf->score;
			an_cause *c = &sp->causes[sp->ncauses++];

			c->kind = "time";
			if (path_copy(a, pf->path, pf->npath, &sp->path, &sp->npath) != 0 ||
			    path_copy(a, pf->path, pf->npath, &c->path, &c->npath) != 0)
				goto oom;
			an_say(c->why, sizeof c->why, "its process %u stopped here, %.1f ms before "
				 "the other processes of its role went on to (their median): it "
				 "crashed, hung or blocked, and the host's other processes went on",
				 pf->pid, pf->score * 1e3);
		} else if (i == failstop) {
			sp->failstop = sp->flagged = 1;
			sp->method = "earliest-last-timestamp";
			sp->score = (double)gap / 1e9;
			if (u->last_node != AN_NONE &&
			    an_path_of(a, u->last_node, &sp->path, &sp->npath) != 0)
				goto oom;
			an_cause *c = &sp->causes[sp->ncauses++];

			c->kind = "time";
			if (an_path_of(a, u->last_node, &c->path, &c->npath) != 0)
				goto oom;
			an_say(c->why, sizeof c->why, "its last record, %.1f ms before the other "
				 "%s of its role went on to (their median): it stopped here "
				 "(crashed, hung or blocked)", (double)gap / 1e6, kind_plural(a->kind));
		} else if (!normal && nd < 2) {
			sp->method = "knn-manhattan";
			sp->score = 0;
			an_cause *c = &sp->causes[sp->ncauses++];

			c->kind = "time";
			if (an_path_of(a, u->role, &c->path, &c->npath) != 0)
				goto oom;
			an_say(c->why, sizeof c->why, "%s: %zu other %s of this role (the "
				 "outermost function it spends most time in): not compared",
				 nd ? "only" : "no", nd, nd == 1 ? (a->kind == AN_UNITS_FLOW ? "flow" :
				 a->kind == AN_UNITS_HOST ? "host" : "process") : kind_plural(a->kind));
		} else if (normal) {
			sp->method = "nearest-normal";
			sp->threshold = ref_threshold(a, u, d + a->nunits);
			sp->score = nd ? best : MAX_DIST;
			sp->flagged = !nd || sp->score > sp->threshold;
			sp->nearest = near ? near->flow : NULL;
			if (an_causes(a, u, near, rc ? &rc->count : &(map){ 0 }, 0, rc ? rc->units : 0,
				   "units of the reference", sp, &cul[a->nsus]) != 0)
				goto oom;
		} else {
			sampled |= a->dn[u->dense].nrows > SAMPLE_ABOVE;
			if (knn(a, u, sp, d, nd, near, rc, &cul[a->nsus]) != 0)
				goto oom;
		}
		a->nsus++;
	}
	if (sampled) {
		/* Point 4: the most suspect of sampled roles, again against all. */
		for (size_t q = 0; q < a->nsus; q++)
			order[q] = (uint32_t)q;
		qsort_r(order, a->nsus, sizeof *order, by_index_score, a->sus);
		for (size_t r = 0, done = 0; r < a->nsus && done < TOP_EXACT; r++) {
			an_suspect *sp = &a->sus[order[r]];
			size_t i = sus_unit[order[r]];
			const unit *u = &a->units[i], *near;
			double best;

			if (sp->failstop || a->dn[u->dense].nrows <= SAMPLE_ABOVE)
				continue;
			size_t nd = compare(a, i, 0, true, d, &near, &best);

			clear_causes(sp);
			if (knn(a, u, sp, d, nd, near, count_of(roles, nroles, u, 0),
				&cul[order[r]]) != 0)
				goto oom;
			done++;
		}
	}
	/* Point 7: when, for the most suspect */
	for (size_t q = 0; q < a->nsus; q++)
		order[q] = (uint32_t)q;
	qsort_r(order, a->nsus, sizeof *order, by_index_rank, a->sus);
	for (size_t r = 0; r < a->nsus && r < INTERVAL_TOP; r++) {
		an_suspect *sp = &a->sus[order[r]];

		if (!sp->failstop && (sp->flagged == 1 || (sp->flagged < 0 && sp->score >= FLAG_FLOOR)) &&
		    an_add_interval(a, s, sus_unit[order[r]], &cul[order[r]], sp, err) != 0)
			goto fail;
	}
	qsort(a->sus, a->nsus, sizeof *a->sus, by_score);
	free_roles(roles, nroles);
	free(d);
	free(sus_unit);
	free(order);
	free(cul);
	an_anomalies_free(pa);
	*out = a;
	return 0;
oom:
	sp_fail(err, "out of memory");
fail:
	free_roles(roles, nroles);
	free(d);
	free(sus_unit);
	free(order);
	free(cul);
	an_anomalies_free(pa);
	an_anomalies_free(a);
	return -1;
}

int an_anomalies_kind(const an_anomalies *a)
{
	return a->kind;
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
		free(a->units[i].flow);
		free(a->units[i].e);
		an_map_free(&a->units[i].idx);
		free(a->units[i].cm);
		an_map_free(&a->units[i].cidx);
		free(a->units[i].pt);
	}
	free(a->units);
	free(a->parts);
	for (size_t k = 0; k < a->ndn; k++) {
		an_map_free(&a->dn[k].col);
		free(a->dn[k].share);
		free(a->dn[k].bits);
		free(a->dn[k].pop);
		free(a->dn[k].unit_of);
		an_map_free(&a->dn[k].ccol);
		free(a->dn[k].crecv);
		free(a->dn[k].cn);
		free(a->dn[k].cb);
	}
	free(a->dn);
	for (size_t i = 0; i < a->nnames; i++)
		free(a->names[i]);
	free(a->names);
	free(a->nodes);
	an_map_free(&a->name_ids);
	an_map_free(&a->node_ids);
	free(a);
}
