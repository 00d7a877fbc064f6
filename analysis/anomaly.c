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
 *     name, so that units of different processes and hosts compare).
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
#define TIME_CLEAR 0.10              /* point 6 */
#define TIME_MIN 0.005               /* point 6: a time cause moves a share by this at least */
#define COVER_RARE 0.10              /* point 6: taken by at most this share */
#define COVER_USUAL 0.90             /* point 6: not taken, by at least this share */
#define MAX_DIST 4.0                 /* point 5: the composite distance's bound */
#define SAMPLE_ABOVE 4096            /* point 4: roles larger are sampled ... */
#define SAMPLE 1024                  /* ... about this many of their units */
#define TOP_EXACT 32                 /* ... and the most suspect scored again exactly */
#define FLAG_FLOOR (2 * TIME_CLEAR)  /* point 5: the least threshold */
#define MAX_EACH 4                   /* candidates of each kind kept for the causes */
#define COMM_MIN 0.05                /* point 6: a communication cause moves its distance by this */
#define COMM_CLEAR 0.25              /* point 6: and is the culprit from this on */
#define INTERVAL_TOP 8               /* point 7: the most suspect units said when */

typedef struct node {
	uint32_t parent;                 /* AN_NONE: a root */
	uint32_t name;                   /* index in names */
} node;

typedef struct entry {
	uint32_t node;
	double ns;
} entry;

/* A unit's messages through one call path, one way (point 2). */
typedef struct comm {
	uint32_t node;                   /* the innermost call open at the message */
	uint32_t recv;                   /* 1 received, 0 sent */
	uint64_t n, bytes;
} comm;

/* A unit's time in a program (point 4, hosts). */
typedef struct prog_time {
	uint32_t prog;                   /* a name */
	double ns;
} prog_time;

typedef struct unit {
	char *host;
	uint32_t pid;
	char *flow;                      /* a flow's id, NULL otherwise */
	int normal;                      /* from --normal REF */
	map idx;                         /* node -> 1 + index in e: its coverage */
	entry *e;
	size_t ne, cap;
	double total;
	map cidx;                        /* (node, recv) -> 1 + index in cm */
	comm *cm;                        /* by (node, recv) once profiled */
	size_t ncm, capcm;
	uint64_t sends, bytes;           /* all its messages sent, bytes either way */
	prog_time *pt;                   /* the programs it ran, their time */
	size_t npt;
	uint32_t prog;                   /* point 4: the program it spent most time in */
	int64_t first_ns, last_ns;
	uint32_t last_node;              /* point 3's culprit */
	uint32_t role;                   /* point 4: a root node, AN_NONE if none */
	uint64_t last_open_t0;           /* the innermost open call's entry, or 0 */
	uint64_t last_t1;
	uint32_t dense, row;             /* its row in the dense profiles of its role */
} unit;

/*
 * The profiles of a role's units as dense rows, for the distances (point
 * 2): a column per call path any unit of the role entered, the time shares
 * in fixed point (SHARE_ONE = all of a unit's time) and the coverage as a
 * bit set.  A role's distances then cost a pass over two rows each, not a
 * hash lookup per path.
 */
#define SHARE_ONE (1u << 24)

typedef struct dense {
	uint32_t role, prog;
	map col;                         /* node -> 1 + column */
	size_t ncols, words, nrows;
	uint32_t *share;                 /* nrows x ncols */
	uint64_t *bits;                  /* nrows x words */
	uint32_t *pop;                   /* nrows: paths entered */
	uint32_t *unit_of;               /* nrows: each row's unit */
	map ccol;                        /* (node, recv) -> 1 + communication column */
	size_t nccols;
	uint8_t *crecv;                  /* nccols: the column's messages were received */
	uint32_t *cn;                    /* nrows x nccols: messages */
	uint64_t *cb;                    /* nrows x nccols: bytes */
	double threshold;                /* point 5, computed once */
	int has_threshold;
} dense;

/* The part of a thread's time that belongs to a unit (point 2). */
typedef struct window {
	int64_t t0, t1;
	uint32_t unit;
} window;

/* A thread's window, kept for point 7. */
typedef struct part_ref {
	size_t image;
	uint32_t tid;
	window w;
} part_ref;

/* The kinds of evidence (point 6). */
enum cause_kind { K_TIME, K_COVER, K_COMM, NKINDS };

/* Point 7: a second sweep of one unit collects where its culprit's time
 * went. */
typedef struct segment {
	int64_t t0, t1;
} segment;

typedef struct collect {
	int kind;                        /* K_TIME: the time in the path itself; K_COVER:
					    under it; K_COMM: its messages one way */
	uint32_t node;
	int recv;
	segment *s;
	size_t n, cap;
} collect;

struct an_anomalies {
	int kind;
	int profile;                     /* enum an_profile */
	an_flows_opts flow_opts;         /* start functions */
	char **names;
	size_t nnames;
	map name_ids;                    /* (hash, 0) -> 1 + name index */
	node *nodes;
	size_t nnodes;
	map node_ids;                    /* (parent + 1, name) -> 1 + node index */
	unit *units;
	size_t nunits;
	dense *dn;
	size_t ndn;
	an_suspect *sus;
	size_t nsus;
	part_ref *parts;                 /* the session's units' windows (not REF's), by
					    thread and start, for point 7 */
	size_t nparts, capparts;
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

static const comm *comm_of(const unit *u, uint32_t nd, int recv)
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

static double time_of(const unit *u, uint32_t nd)
{
	const map_slot *s = an_map_find(&u->idx, nd, 0);

	return s ? u->e[s->val - 1].ns : 0;
}

static bool covers(const unit *u, uint32_t nd)
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

/* Point 7: one more segment of the culprit's. */
static int collect_add(collect *col, int64_t t0, int64_t t1)
{
	if (col->n == col->cap) {
		size_t cap = col->cap ? 2 * col->cap : 64;
		segment *s = realloc(col->s, cap * sizeof *s);

		if (!s)
			return -1;
		col->s = s;
		col->cap = cap;
	}
	col->s[col->n++] = (segment){ t0, t1 };
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

/* The unit whose window holds time `at` (records before a window belong to
 * the one that follows), AN_NONE past the last. */
static uint32_t unit_at(const sweep *sw, int64_t at, bool *inside)
{
	for (size_t k = sw->at; k < sw->nw; k++)
		if (sw->w[k].t1 >= at) {
			*inside = sw->w[k].t0 <= at;
			return sw->w[k].unit;
		}
	return AN_NONE;
}

/* unit_at for a message, stamped at its call's start: the sweep may have
 * gone past the window that holds it. */
static uint32_t msg_unit_at(const sweep *sw, int64_t at, bool *inside)
{
	sweep back = *sw;

	while (back.at > 0 && back.w[back.at - 1].t1 >= at)
		back.at--;
	return unit_at(&back, at, inside);
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
static int thread_profile(an_anomalies *a, an_trace *t, const an_thread *th, const window *w,
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
			bool inside;
			uint32_t ui = msg_unit_at(&sw, an_realtime_ns(t, c[j].t0), &inside);

			if (!m || !depth || ui == AN_NONE)
				continue;
			if (!col ? add_comm(&a->units[ui], st[depth - 1].node, m->recv, m->len) != 0
			    : col->kind == K_COMM && inside && st[depth - 1].node == col->node &&
			      m->recv == col->recv &&
			      collect_add(col, an_realtime_ns(t, c[j].t0), an_realtime_ns(t, c[j].t0)) != 0)
				goto oom;
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
		uint32_t nm = name_id(a, name ? name : "?");
		/* a start function's call is the root of the paths under it */
		uint32_t nd = nm == AN_NONE ? AN_NONE
			      : node_id(a, depth && !start_func(a, name) ? st[depth - 1].node
					: AN_NONE, nm);
		bool inside = false;
		uint32_t ui = unit_at(&sw, start, &inside);

		if (nd == AN_NONE)
			goto oom;
		st[depth++] = (struct open){ j, nd };
		if (ui == AN_NONE || col)
			continue;
		unit *u = &a->units[ui];

		if (add_time(u, nd, 0) != 0)
			goto oom;
		if (start < u->first_ns)
			u->first_ns = start;
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
			uint32_t prog = name_id(a, program_name(im->program));

			if (thread_profile(a, t, th, &w, 1, kind == AN_UNITS_PROCESS, NULL, err) != 0)
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
		if ((a->units[ui].prog = name_id(a, program_name(an_session_image(s, fl->image)->program))) == AN_NONE)
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
		if (th && thread_profile(a, t, th, w, j - i, 0, NULL, err) != 0)
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

static int session_units(an_anomalies *a, an_session *s, int normal, sp_err *err)
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
static int role_of(const an_anomalies *a, unit *u)
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

static bool same_role(const unit *x, const unit *y)
{
	return x->role == y->role && x->prog == y->prog;
}

/* Point 2: the dense rows of every role (units without time get none). */
static int make_dense(an_anomalies *a)
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
static double distance(const an_anomalies *a, const unit *x, const unit *y)
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

static const char *unit_name(const unit *u, char *buf, size_t len)
{
	if (u->flow)
		snprintf(buf, len, "flow %s", u->flow);
	else if (u->pid)
		snprintf(buf, len, "pid %" PRIu32, u->pid);
	else
		snprintf(buf, len, "host %s", u->host);
	return buf;
}

/* A candidate cause of point 6. */
typedef struct cand {
	uint32_t node;
	double key;                      /* time: the difference; coverage: exclusiveness */
	double ns;                       /* coverage: the unit's time under the path */
	int taken;                       /* coverage: 1 taken unlike the others, 0 not taken */
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
		double d = u->e[i].ns / tu - (v ? time_of(v, u->e[i].node) / tv : 0);

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
			bool mine = covers(u, nd);
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
				size_t pc = ps ? ps->val - (self_counted && covers(u, up)) : 0;
				double psh = (double)pc / (double)npeers;

				if (pass == 0 ? psh <= COVER_RARE : !covers(u, up))
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
static void say(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *buf, size_t len, const char *fmt, ...)
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
	if (path_of(a, c->node, &k->path, &k->npath) != 0)
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
	double tn = (double)(u->sends + (v ? v->sends : 0));
	double tb = (double)(u->bytes + (v ? v->bytes : 0));

	*n = 0;
	for (size_t side = 0; side < 2; side++) {
		/* side 0: u's paths; side 1: v's that u has not */
		const unit *x = side ? v : u, *y = side ? u : v;

		for (size_t i = 0; x && i < x->ncm; i++) {
			const comm *c = &x->cm[i], *o = y ? comm_of(y, c->node, (int)c->recv) : NULL;
			uint64_t on = o ? o->n : 0, ob = o ? o->bytes : 0;
			double dn = c->recv ? 0 : (double)(c->n > on ? c->n - on : on - c->n);
			double db = (double)(c->bytes > ob ? c->bytes - ob : ob - c->bytes);
			double key = ((tn > 0 ? dn / tn : 0) + (tb > 0 ? db / tb : 0)) / 2;

			if (side && o)
				continue;
			if (key >= COMM_MIN)
				keep_best(out, n, (cand){ .node = c->node, .key = key,
							  .taken = (int)c->recv }, time_better);
		}
	}
}

/* The culprit of point 6, for point 7. */
typedef struct culprit {
	int kind;                        /* enum cause_kind, -1: none */
	uint32_t node;
	int recv;                        /* communication: the messages' way */
	double share;                    /* time: the compared unit's share of the path */
} culprit;

static const char *const kind_names[NKINDS] = { "time", "coverage", "communication" };

/* A cause's words, for the cand c of kind k. */
static void cause_why(const an_anomalies *a, int k, const cand *c, const unit *u, const unit *v,
		      size_t npeers, const char *others, char *why, size_t len)
{
	double tu = u->total > 0 ? u->total : 1, tv = v && v->total > 0 ? v->total : 1;
	char un[96], vn[96], more[64] = "";

	(void)a;
	unit_name(u, un, sizeof un);
	if (v)
		unit_name(v, vn, sizeof vn);
	if (k == K_TIME && v)
		say(why, len, "%.1f%% of %s's traced time against %.1f%% of %s's, its nearest %s",
		    100 * time_of(u, c->node) / tu, un, 100 * time_of(v, c->node) / tv, vn,
		    v->normal ? "normal unit" : "neighbour");
	else if (k == K_TIME)
		say(why, len, "%.1f%% of %s's traced time", 100 * time_of(u, c->node) / tu, un);
	else if (k == K_COMM) {
		const comm *x = comm_of(u, c->node, c->taken), *y = comm_of(v, c->node, c->taken);

		say(why, len, "%s %s %" PRIu64 " message%s (%" PRIu64 " bytes) here, its nearest %s "
			 "%s %" PRIu64 " (%" PRIu64 " bytes)", un, c->taken ? "received" : "sent",
		    x ? x->n : 0, x && x->n == 1 ? "" : "s", x ? x->bytes : 0,
		    v->normal ? "normal unit" : "neighbour", vn, y ? y->n : 0, y ? y->bytes : 0);
	} else {
		if (c->merged)
			say(more, sizeof more, " (and %zu more path%s ending in it)", c->merged,
			    c->merged == 1 ? "" : "s");
		if (c->taken)
			say(why, len, "taken by %s and by %zu of the %zu other %s%s", un, c->count,
			    npeers, others, more);
		else
			say(why, len, "not taken by %s, taken by %zu of the %zu other %s%s", un,
			    c->count, npeers, others, more);
	}
}

/* Point 6: the culprit and the causes of u, against v (time,
 * communication) and the others (coverage); the culprit in *cul. */
static int causes(const an_anomalies *a, const unit *u, const unit *v, const map *count,
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
	comm_cands(u, v, list[K_COMM], &cnt[K_COMM]);
	if (!v)
		cnt[K_COMM] = 0;
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

			cause_why(a, k, c, u, v, npeers, others, why, sizeof why);
			if (add_cause(a, s, c, kind_names[k], why) != 0)
				return -1;
			if (r++)
				continue;
			if (path_of(a, c->node, &s->path, &s->npath) != 0)
				return -1;
			*cul = (culprit){ k, c->node, c->taken, 0 };
			if (k == K_TIME && v)
				cul->share = time_of(v, c->node) / (v->total > 0 ? v->total : 1);
		}
		if (round && s->ncauses == before)
			break;
	}
	return 0;
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
		    same_role(&a->units[j], u))
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

		if (!x->normal || x->total <= 0 || !same_role(x, u))
			continue;
		for (size_t j = 0; j < a->nunits; j++) {
			const unit *y = &a->units[j];

			if (j == i || !y->normal || y->total <= 0 || !same_role(y, u))
				continue;
			double d = distance(a, x, y);

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
		double x = distance(a, u, v);

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
	return causes(a, u, near, &rc->count, 1, rc->units - 1, others, sp, cul);
}

static int by_start(const void *x, const void *y)
{
	const segment *a = x, *b = y;

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

		if (th && thread_profile(a, t, th, w, nw, 0, &col, err) != 0)
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
	 * share of it would put there: each segment weighs its length times
	 * (1 - r), each gap between two costs its length times r */
	double r = 0, cur = 0, best = -1;
	int64_t span = u->last_ns - u->first_ns, start = col.s[0].t0;

	if (col.kind == K_TIME && span > 0)
		r = cul->share * u->total / (double)span;
	r = r < 0.95 ? r : 0.95;
	*from = col.s[0].t0;
	*to = col.kind == K_COMM ? col.s[col.n - 1].t1 : col.s[0].t1;
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
static int add_interval(an_anomalies *a, an_session *s, uint32_t ui, const culprit *cul,
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
	unit_name(u, un, sizeof un);
	if (path_of(a, cul->node, &c->path, &c->npath) != 0)
		return sp_fail(err, "out of memory");
	c->kind = "interval";
	sp->interval_from_ns = from;
	sp->interval_to_ns = to;
	double f = 1e-6 * (double)(from - u->first_ns), t = 1e-6 * (double)(to - u->first_ns);

	if (cul->kind == K_TIME)
		say(c->why, sizeof c->why, "from +%.1f ms to +%.1f ms of %s's %.1f ms: %.1f ms in "
			 "this path, %.0f%% of that time (its compared unit spends %.1f%% of its time "
			 "here)", f, t, un, ms, 1e-6 * in, to > from ? 100 * in / (double)(to - from)
			 : 100.0, 100 * cul->share);
	else if (cul->kind == K_COVER)
		say(c->why, sizeof c->why, "taken from +%.1f ms to +%.1f ms of %s's %.1f ms",
			 f, t, un, ms);
	else
		say(c->why, sizeof c->why, "its messages here went from +%.1f ms to +%.1f ms of "
			 "%s's %.1f ms", f, t, un, ms);
	sp->ncauses++;
	return 0;
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
		uint32_t id = name_id(a, from[i]);

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
	if (o)
		a->flow_opts = o->flows;
	if (session_units(a, s, 0, err) != 0 || (normal && session_units(a, normal, 1, err) != 0))
		goto fail;
	for (size_t i = 0; i < a->nunits; i++) {
		nsus += !a->units[i].normal && a->units[i].total > 0;
		if (role_of(a, &a->units[i]) != 0)
			goto oom;
	}
	if (!(a->sus = calloc(nsus ? nsus : 1, sizeof *a->sus)) ||
	    !(sus_unit = calloc(nsus ? nsus : 1, sizeof *sus_unit)) ||
	    !(order = calloc(nsus ? nsus : 1, sizeof *order)) ||
	    !(cul = calloc(nsus ? nsus : 1, sizeof *cul)) ||
	    !(d = calloc(a->nunits ? 2 * a->nunits : 1, sizeof *d)) ||
	    count_roles(a, &roles, &nroles) != 0 || make_dense(a) != 0)
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
		sp->last_ns = u->last_ns;
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
			say(c->why, sizeof c->why, "its process %u stopped here, %.1f ms before "
				 "the other processes of its role went on to (their median): it "
				 "crashed, hung or blocked, and the host's other processes went on",
				 pf->pid, pf->score * 1e3);
		} else if (i == failstop) {
			sp->failstop = sp->flagged = 1;
			sp->method = "earliest-last-timestamp";
			sp->score = (double)gap / 1e9;
			if (u->last_node != AN_NONE &&
			    path_of(a, u->last_node, &sp->path, &sp->npath) != 0)
				goto oom;
			an_cause *c = &sp->causes[sp->ncauses++];

			c->kind = "time";
			if (path_of(a, u->last_node, &c->path, &c->npath) != 0)
				goto oom;
			say(c->why, sizeof c->why, "its last record, %.1f ms before the other "
				 "%s of its role went on to (their median): it stopped here "
				 "(crashed, hung or blocked)", (double)gap / 1e6, kind_plural(a->kind));
		} else if (!normal && nd < 2) {
			sp->method = "knn-manhattan";
			sp->score = 0;
			an_cause *c = &sp->causes[sp->ncauses++];

			c->kind = "time";
			if (path_of(a, u->role, &c->path, &c->npath) != 0)
				goto oom;
			say(c->why, sizeof c->why, "%s: %zu other %s of this role (the "
				 "outermost function it spends most time in): not compared",
				 nd ? "only" : "no", nd, nd == 1 ? (a->kind == AN_UNITS_FLOW ? "flow" :
				 a->kind == AN_UNITS_HOST ? "host" : "process") : kind_plural(a->kind));
		} else if (normal) {
			sp->method = "nearest-normal";
			sp->threshold = ref_threshold(a, u, d + a->nunits);
			sp->score = nd ? best : MAX_DIST;
			sp->flagged = !nd || sp->score > sp->threshold;
			sp->nearest = near ? near->flow : NULL;
			if (causes(a, u, near, rc ? &rc->count : &(map){ 0 }, 0, rc ? rc->units : 0,
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
		    add_interval(a, s, sus_unit[order[r]], &cul[order[r]], sp, err) != 0)
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
