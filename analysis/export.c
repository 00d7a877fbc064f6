/*
 * export.c — a session as a file a trace viewer opens (an_export): the walk
 * over the session's threads, the numbering of processes, threads and
 * message arrows; one writer per format (export_perfetto.c,
 * export_chrome.c; their interface, ex_format, in an_internal.h).
 */
#include "an_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace_format.h"

/*
 * Viewers know a process by its pid and a thread by its tid, across the
 * whole file; a collected session may hold the same pid (or tid) on two
 * hosts, and an exec'd image is the same process as the image before it.
 * So each (host, number) gets one number in the file: its own when no other
 * host took it first, else a fresh one above the kernel's largest pid
 * (PID_MAX_LIMIT, 2^22), which no real process has.  Pids and tids share
 * one numbering, as they do in the kernel (a main thread's tid is its pid).
 */
#define FIRST_FREE_ID (1u << 22)

typedef struct ex_id {
	const char *host;
	uint32_t real, out;
} ex_id;

typedef struct ex_track {
	const char *host;
	uint32_t pid, tid;       /* real */
	uint64_t uuid;
	int64_t cursor;          /* the last time written on it (threads) */
} ex_track;

typedef struct ex_walk {
	const ex_format *fmt;
	ex_writer *w;
	an_session *s;
	ex_id *ids;
	size_t nids, capids;
	uint32_t next_free;
	ex_track *procs, *threads;
	size_t nprocs, capprocs, nthreads, capthreads;
	uint64_t next_uuid;
	an_flows *flows;
	const an_flow *flow;     /* --flow: only its records, else NULL */
	struct ep *eps;          /* message ends, sorted (ep_cmp) */
	size_t neps;
	uint64_t *fl;            /* flows_at's */
	size_t capfl;
	struct tpart *tp;        /* the thread's parts of flows, by start (corr_at) */
	size_t ntp, captp;
	const an_export_opts *o;
	/* progress */
	uint64_t total, done;
	struct timespec t0, last;
} ex_walk;

static int out_id(ex_walk *x, const char *host, uint32_t real, uint32_t *out)
{
	int taken = 0;

	for (size_t i = 0; i < x->nids; i++) {
		if (x->ids[i].real == real && strcmp(x->ids[i].host, host) == 0)
			return *out = x->ids[i].out, 0;
		if (x->ids[i].out == real)
			taken = 1;
	}
	if (sp_grow((void **)&x->ids, &x->capids, x->nids + 1, sizeof *x->ids))
		return -1;
	*out = taken || real >= FIRST_FREE_ID ? x->next_free++ : real;
	x->ids[x->nids++] = (ex_id){ host, real, *out };
	return 0;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s && s[1] ? s + 1 : path;
}

/* The track of process (host, pid), described to the writer on first use. */
static ex_track *process_track(ex_walk *x, const char *host, uint32_t pid, const char *program)
{
	char name[512];
	uint32_t out;
	ex_track *p;

	for (size_t i = 0; i < x->nprocs; i++)
		if (x->procs[i].pid == pid && strcmp(x->procs[i].host, host) == 0)
			return &x->procs[i];
	if (out_id(x, host, pid, &out) < 0 ||
	    sp_grow((void **)&x->procs, &x->capprocs, x->nprocs + 1, sizeof *x->procs))
		return NULL;
	p = &x->procs[x->nprocs++];
	*p = (ex_track){ host, pid, pid, ++x->next_uuid, 0 };
	snprintf(name, sizeof name, "%s (host %s, pid %" PRIu32 ")", base_name(program),
		 *host ? host : "?", pid);
	return x->fmt->process(x->w, p->uuid, (int32_t)out, name) < 0 ? NULL : p;
}

static ex_track *thread_track(ex_walk *x, size_t image, const an_thread *th)
{
	const an_image *im = an_session_image(x->s, image);
	uint32_t pid = th->pid ? th->pid : im->pid, opid, otid;
	char name[64];
	ex_track *p, *t;

	for (size_t i = 0; i < x->nthreads; i++)
		if (x->threads[i].tid == th->tid && strcmp(x->threads[i].host, im->host) == 0)
			return &x->threads[i];
	if (!(p = process_track(x, im->host, pid, im->program)) ||
	    out_id(x, im->host, pid, &opid) < 0 || out_id(x, im->host, th->tid, &otid) < 0 ||
	    sp_grow((void **)&x->threads, &x->capthreads, x->nthreads + 1, sizeof *x->threads))
		return NULL;
	t = &x->threads[x->nthreads++];
	*t = (ex_track){ im->host, pid, th->tid, ++x->next_uuid, INT64_MIN };
	snprintf(name, sizeof name, "%s %" PRIu32, th->name[0] ? th->name
		 : base_name(im->program), th->tid);
	return x->fmt->thread(x->w, t->uuid, p->uuid, (int32_t)opid, (int32_t)otid, name) < 0
	       ? NULL : t;
}

/* ---- message arrows ---- */

/* One end of a matched message (an_flows_match): flow id `flow` starts at
 * a send and ends at its receive. */
struct ep {
	size_t image;
	uint32_t tid;
	uint64_t tsc;
	int recv;
	uint64_t flow;
};

static int ep_cmp(const void *a, const void *b)
{
	const struct ep *x = a, *y = b;

	if (x->image != y->image)
		return x->image < y->image ? -1 : 1;
	if (x->tid != y->tid)
		return x->tid < y->tid ? -1 : 1;
	if (x->tsc != y->tsc)
		return x->tsc < y->tsc ? -1 : 1;
	if (x->recv != y->recv)
		return x->recv - y->recv;
	return x->flow < y->flow ? -1 : x->flow > y->flow;
}

/* Whether --flow's flow has the record of image/tid at ns (always without
 * --flow). */
static int in_flow(const ex_walk *x, size_t image, uint32_t tid, int64_t ns)
{
	if (!x->flow)
		return 1;
	for (size_t i = 0; i < x->flow->nparts; i++) {
		const an_flow_part *p = &x->flow->parts[i];

		if (p->image == image && p->tid == tid && p->start_ns <= ns && ns <= p->end_ns)
			return 1;
	}
	return 0;
}

static int end_in_flow(ex_walk *x, size_t image, uint32_t tid, uint64_t tsc)
{
	an_trace *t = an_session_trace(x->s, image);

	return t && in_flow(x, image, tid, an_realtime_ns(t, tsc));
}

/* The flows of the session and its message arrows: an arrow only when both
 * its ends are exported (--flow), so that each starts and ends once. */
static int message_ends(ex_walk *x, const char *flow, sp_err *err)
{
	size_t n;

	if (an_flows_build(x->s, &x->flows, err) < 0)
		return -1;
	if (flow && !(x->flow = an_flows_find(x->flows, flow, NULL)))
		return sp_fail(err, "flow %s: no such flow (this trace has %zu: f1..f%zu; see "
			       "'sptrace flows DIR')", flow, an_flows_count(x->flows),
			       an_flows_count(x->flows));
	n = an_flows_nmatches(x->flows);
	if (!(x->eps = malloc((2 * n + 1) * sizeof *x->eps)))
		return sp_fail(err, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const an_msg_match *m = an_flows_match(x->flows, i);

		if (!end_in_flow(x, m->send_image, m->send_tid, m->send_tsc) ||
		    !end_in_flow(x, m->recv_image, m->recv_tid, m->recv_tsc))
			continue;
		x->eps[x->neps++] = (struct ep){ m->send_image, m->send_tid, m->send_tsc, 0,
						 i + 1 };
		x->eps[x->neps++] = (struct ep){ m->recv_image, m->recv_tid, m->recv_tsc, 1,
						 i + 1 };
	}
	qsort(x->eps, x->neps, sizeof *x->eps, ep_cmp);
	return 0;
}

/* The flows a message starts (recv 0) or ends (recv 1), into x->fl. */
static int flows_at(ex_walk *x, size_t image, uint32_t tid, uint64_t tsc, int recv,
		    size_t *n)
{
	size_t lo = 0, hi = x->neps;
	struct ep key = { image, tid, tsc, recv, 0 };

	*n = 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ep_cmp(&x->eps[mid], &key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < x->neps; lo++) {
		const struct ep *e = &x->eps[lo];

		if (e->image != image || e->tid != tid || e->tsc != tsc || e->recv != recv)
			break;
		if (sp_grow((void **)&x->fl, &x->capfl, *n + 1, sizeof *x->fl))
			return -1;
		x->fl[(*n)++] = e->flow;
	}
	return 0;
}

/* ---- correlation: the flow each item belongs to ---- */

struct tpart {
	int64_t t0, t1;
	uint64_t flow;           /* its number: f3 is 3 */
};

static int tpart_cmp(const void *a, const void *b)
{
	const struct tpart *x = a, *y = b;

	return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* The parts of flows on thread (image, tid), into x->tp by start. */
static int thread_parts(ex_walk *x, size_t image, uint32_t tid)
{
	x->ntp = 0;
	for (size_t i = 0; i < an_flows_count(x->flows); i++) {
		const an_flow *fl = an_flows_get(x->flows, i);
		uint64_t num = i + 1;            /* its id's number: f1, f2, ... in order */

		for (size_t k = 0; k < fl->nparts; k++) {
			const an_flow_part *p = &fl->parts[k];

			if (p->image != image || p->tid != tid)
				continue;
			if (sp_grow((void **)&x->tp, &x->captp, x->ntp + 1, sizeof *x->tp))
				return -1;
			x->tp[x->ntp++] = (struct tpart){ p->start_ns, p->end_ns, num };
		}
	}
	qsort(x->tp, x->ntp, sizeof *x->tp, tpart_cmp);
	return 0;
}

/* The number of the flow whose part of the thread holds time ns, 0 if none. */
static uint64_t corr_at(const ex_walk *x, int64_t ns)
{
	size_t lo = 0, hi = x->ntp;

	while (lo < hi) {               /* the first part starting after ns */
		size_t mid = lo + (hi - lo) / 2;

		if (x->tp[mid].t0 <= ns)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo && ns <= x->tp[lo - 1].t1 ? x->tp[lo - 1].flow : 0;
}

/* ---- the walk ---- */

static void progress(ex_walk *x, int last)
{
	struct timespec now;
	double el;

	if (!x->o->progress)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	el = (double)(now.tv_sec - x->last.tv_sec) + (double)(now.tv_nsec - x->last.tv_nsec) / 1e9;
	if ((el < 1 && !last) || (!x->done && !last))
		return;
	if (last && now.tv_sec - x->t0.tv_sec < 1)
		return;          /* small traces: silent */
	x->last = now;
	x->o->progress(x->o->arg, x->done, x->total, x->fmt->bytes(x->w));
}

/* What a call, event or message is called. */
static const char *item_name(an_trace *t, const an_call *c, char *buf, size_t len)
{
	if (c->kind == AN_CALL)
		return an_func_get(t, an_site(t, c->id)->callee)->name;
	if (trace_event_is_msg(c->id) && an_trace_msg(t, c->end))
		return an_msg_text(t, an_trace_msg(t, c->end), buf, len);
	if (c->id == TRACE_EV_VALUE) {
		int64_t v;

		if (an_trace_value(t, c->end, &v) == 0 && AN_VALUE_ARG(c))
			snprintf(buf, len, "arg%u=%#" PRIx64, AN_VALUE_ARG(c), (uint64_t)v);
		else if (an_trace_value(t, c->end, &v) == 0)
			snprintf(buf, len, "ret=%#" PRIx64, (uint64_t)v);
		else
			snprintf(buf, len, "value");
		return buf;
	}
	return an_event_name(c->id, buf, len);
}

/*
 * A send is stamped when its call began (trace_format.h, "Message events")
 * but recorded when the call returned, after what the call did meanwhile
 * (the C library's calls around the system call, the agent's own work): in
 * the thread's order it comes after items of later times.  Written there it
 * was pushed to the last of them (times never go back on a track) -- to the
 * call's return, after the receive of its own bytes when the writer waited
 * for a CPU in its system call: an arrow pointing back (75 ms seen on a
 * busy machine).  So it is written earlier, before the first item of its
 * caller's body that began after it: at its own time.  `sibs` holds, for
 * each call open at the item, the items of its body so far (one stack of
 * (depth, index), a body's run on top of its caller's).
 */
typedef struct hoist {
	size_t at;               /* written before item `at` */
	size_t k;                /* the send's item */
} hoist;

static int hoist_cmp(const void *a, const void *b)
{
	const hoist *x = a, *y = b;

	if (x->at != y->at)
		return x->at < y->at ? -1 : 1;
	return x->k < y->k ? -1 : x->k > y->k;
}

/* The sends of calls[0..n) written earlier, sorted by where: *out, *nout. */
static int send_hoists(const an_call *calls, size_t n, hoist **out, size_t *nout)
{
	size_t *sibs = malloc((n + 1) * sizeof *sibs), ns = 0;
	hoist *h = NULL;
	size_t nh = 0, cap = 0;

	*out = NULL;
	*nout = 0;
	if (!sibs)
		return -1;
	for (size_t k = 0; k < n; k++) {
		const an_call *c = &calls[k];
		size_t at = k, top;

		if (c->kind == AN_EXIT_ONLY)
			continue;
		while (ns && calls[sibs[ns - 1]].depth > c->depth)
			ns--;                /* the bodies of calls closed before k */
		if (c->kind == AN_EVENT && c->id == TRACE_EV_MSG_SEND) {
			for (top = ns; top && calls[sibs[top - 1]].depth == c->depth &&
			     calls[sibs[top - 1]].t0 > c->t0; top--)
				at = sibs[top - 1];
			if (at < k) {
				if (sp_grow((void **)&h, &cap, nh + 1, sizeof *h)) {
					free(h);
					free(sibs);
					return -1;
				}
				h[nh++] = (hoist){ at, k };
			}
		}
		sibs[ns++] = k;
	}
	free(sibs);
	if (nh)
		qsort(h, nh, sizeof *h, hoist_cmp);
	*out = h;
	*nout = nh;
	return 0;
}

/* Where an item that began at t0 goes on track tr, its caller ending at
 * ends[depth - 1]: times never go back on a track, and an item lies within
 * its caller -- clamped, against clocks read on different CPUs.  The
 * track's cursor moves there. */
static int64_t place(ex_track *tr, const int64_t *ends, size_t depth, int64_t t0)
{
	if (t0 < tr->cursor)
		t0 = tr->cursor;
	if (depth && t0 > ends[depth - 1])
		t0 = ends[depth - 1];
	tr->cursor = t0;
	return t0;
}

/* Event or message item c of the thread, at t0 (in its caller: ends[depth -
 * 1]); 0, -1 with errno (cannot write), -2 out of memory. */
static int put_instant(ex_walk *x, size_t image, an_trace *t, const an_thread *th,
		       ex_track *tr, const an_call *c, size_t depth, const int64_t *ends)
{
	int64_t t0 = an_realtime_ns(t, c->t0);
	const an_msg *m = trace_event_is_msg(c->id) ? an_trace_msg(t, c->end) : NULL;
	size_t nf = 0;
	char buf[600];

	if (!in_flow(x, image, th->tid, t0))
		return 0;
	t0 = place(tr, ends, depth, t0);
	if (m && flows_at(x, image, th->tid, c->t0, m->recv, &nf) < 0)
		return -2;
	x->done++;
	return x->fmt->instant(x->w, tr->uuid, item_name(t, c, buf, sizeof buf), t0,
			       corr_at(x, an_realtime_ns(t, c->t0)),
			       m && !m->recv ? x->fl : NULL, m && !m->recv ? nf : 0,
			       m && m->recv ? x->fl : NULL, m && m->recv ? nf : 0);
}

/* One thread's call tree as begins, ends and instants (export.h's order). */
static int walk_thread(ex_walk *x, size_t image, an_trace *t, const an_thread *th, sp_err *err)
{
	an_call *calls;
	size_t n, *stack = NULL, depth = 0, nh = 0, hi = 0;
	int64_t *ends = NULL;
	hoist *hs = NULL;
	unsigned char *moved = NULL;
	ex_track *tr;
	int rc = -1, r;

	if (x->flow) {
		size_t p;

		for (p = 0; p < x->flow->nparts; p++)
			if (x->flow->parts[p].image == image && x->flow->parts[p].tid == th->tid)
				break;
		if (p == x->flow->nparts)
			return 0;
	}
	if (an_thread_calls(t, th, &calls, &n, NULL, err) < 0)
		return -1;
	if (!n) {
		free(calls);
		return 0;
	}
	if (!(tr = thread_track(x, image, th)))
		goto io;
	if (thread_parts(x, image, th->tid) < 0) {
		sp_fail(err, "out of memory");
		goto done;
	}
	if (!(stack = malloc(n * sizeof *stack)) || !(ends = malloc(n * sizeof *ends)) ||
	    !(moved = calloc(n, 1)) || send_hoists(calls, n, &hs, &nh) < 0) {
		sp_fail(err, "out of memory");
		goto done;
	}
	for (size_t k = 0; k < nh; k++)
		moved[hs[k].k] = 1;
	for (size_t i = 0; i <= n; i++) {
		const an_call *c = i < n ? &calls[i] : NULL;
		int64_t t0, t1;
		char buf[600];

		/* close the calls this item is not nested in */
		while (depth && (!c || calls[stack[depth - 1]].last <= i)) {
			depth--;
			if (x->fmt->end(x->w, tr->uuid, ends[depth]) < 0)
				goto io;
			tr->cursor = ends[depth];
		}
		if (!c)
			break;
		/* the sends stamped before this item (send_hoists) */
		for (; hi < nh && hs[hi].at == i; hi++)
			if ((r = put_instant(x, image, t, th, tr, &calls[hs[hi].k], depth, ends)) < 0)
				goto fail;
		if (c->kind == AN_EXIT_ONLY || moved[i])
			continue;
		if (c->kind != AN_CALL) {
			if ((r = put_instant(x, image, t, th, tr, c, depth, ends)) < 0)
				goto fail;
			if ((i & 0xffff) == 0)
				progress(x, 0);
			continue;
		}
		t0 = an_realtime_ns(t, c->t0);
		if (!in_flow(x, image, th->tid, t0))
			continue;
		t0 = place(tr, ends, depth, t0);
		t1 = an_realtime_ns(t, c->t1);
		if (t1 < t0)
			t1 = t0;
		if (depth && t1 > ends[depth - 1])
			t1 = ends[depth - 1];
		if (x->fmt->begin(x->w, tr->uuid, item_name(t, c, buf, sizeof buf), t0, t1,
				  corr_at(x, an_realtime_ns(t, c->t0))) < 0)
			goto io;
		stack[depth] = i;
		ends[depth++] = t1;
		x->done += 2;
		if ((i & 0xffff) == 0)
			progress(x, 0);
	}
	rc = 0;
	goto done;
fail:
	if (r == -2) {
		sp_fail(err, "out of memory");
		goto done;
	}
io:
	if (errno == EFBIG)
		rc = -2;
	else
		sp_fail(err, "cannot write the %s file: %s", x->fmt->name,
			errno ? strerror(errno) : "an error of the writer");
done:
	free(stack);
	free(ends);
	free(moved);
	free(hs);
	free(calls);
	return rc;
}

/* The earliest record of the session (CLOCK_REALTIME), 0 if none. */
static int64_t earliest(an_session *s)
{
	an_merge *m;
	an_event ev;
	sp_err err;
	int64_t ns = 0;

	if (an_merge_open(s, &m, &err) < 0)
		return 0;
	if (an_merge_next(m, &ev))
		ns = ev.ns;
	an_merge_close(m);
	return ns;
}

/* Records the walk will meet: every thread's (or --flow's). */
static uint64_t count_records(ex_walk *x)
{
	uint64_t n = 0;

	if (x->flow)
		return x->flow->events;
	for (size_t i = 0; i < an_session_nimages(x->s); i++) {
		an_trace *t = an_session_trace(x->s, i);

		for (size_t k = 0; t && k < an_trace_nthreads(t); k++) {
			const an_thread *th = an_trace_thread(t, k);

			n += (th->count < th->capacity ? th->count : th->capacity) + th->drained;
		}
	}
	return n;
}

/* -1 with err; -2: over the size limit. */
static int walk(ex_walk *x, uint64_t max_bytes, sp_err *err)
{
	x->total = count_records(x);
	if (max_bytes && x->total > max_bytes / x->fmt->min_bytes)
		return -2;
	for (size_t i = 0; i < an_session_nimages(x->s); i++) {
		an_trace *t = an_session_trace(x->s, i);
		int rc;

		for (size_t k = 0; t && k < an_trace_nthreads(t); k++)
			if ((rc = walk_thread(x, i, t, an_trace_thread(t, k), err)) < 0)
				return rc;
	}
	progress(x, 1);
	return 0;
}

static void walk_free(ex_walk *x)
{
	free(x->eps);
	free(x->fl);
	free(x->tp);
	an_flows_free(x->flows);
	free(x->ids);
	free(x->procs);
	free(x->threads);
}

int an_export(an_session *s, FILE *out, const an_export_opts *o, sp_err *err)
{
	ex_walk x = { .next_free = FIRST_FREE_ID, .s = s, .o = o };
	int rc;

	if (strcmp(o->format, "perfetto") == 0)
		x.fmt = &ex_perfetto;
	else if (strcmp(o->format, "chrome") == 0)
		x.fmt = &ex_chrome;
	else
		return sp_fail(err, "--format %s: no such format; give perfetto or chrome",
			       o->format);
	if (message_ends(&x, o->flow, err) < 0) {
		walk_free(&x);
		return -1;
	}
	clock_gettime(CLOCK_MONOTONIC, &x.t0);
	x.last = x.t0;
	errno = 0;
	if (!(x.w = x.fmt->open(out, x.flow ? x.flow->start_ns : earliest(s), o->max_bytes))) {
		rc = sp_fail(err, "cannot begin the %s file: %s", x.fmt->name,
			     strerror(errno ? errno : ENOMEM));
	} else if ((rc = walk(&x, o->max_bytes, err)) < 0) {
		x.fmt->close(x.w);
		rc = rc == -2 ? AN_EXPORT_TOO_BIG : -1;
	} else if (x.fmt->close(x.w) < 0) {
		rc = errno == EFBIG ? AN_EXPORT_TOO_BIG
		     : sp_fail(err, "cannot write the %s file: %s", x.fmt->name,
			       strerror(errno ? errno : EIO));
	}
	walk_free(&x);
	return rc;
}
