/*
 * flows.c — a session's records separated into flows: what one request or
 * job did, across threads, processes and hosts.  See analysis.h.
 */
#include "an_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A segment is a run of one thread's records that belongs to one flow.
 * Segments are cut by the rules below; the segments joined by matched
 * messages form a flow (union-find).
 *
 *   1. Start events begin a new flow on their thread: an activation of
 *      tracing (TRACE_EV_ACTIVATE, named by meta's "activated" line at that
 *      time: start, call, timer, signal...; "thread" for a thread that began
 *      tracing on its own), or the accept or receive tracing began at
 *      (TRACE_EV_ACCEPT, TRACE_EV_RECV).  An ACTIVATE followed by an ACCEPT
 *      or RECV with no message between is one start (the agent walks the
 *      thread's stack, then records the event that woke it), named by the
 *      event.  Records before a thread's first
 *      start event (the stack walk of an activation is written before the
 *      event) belong to the segment that follows.
 *      With start functions (`--start FUNC`), each outermost call of one
 *      begins a new flow too (event "func"), as an activation would; the
 *      segment's work ends at that call's return (what the thread does
 *      until the next call is between jobs).
 *   2. A segment goes on with its thread's records until the thread's next
 *      cut.
 *   3. Message switch: a receive whose bytes a traced send of this session
 *      sent (matched below) joins the sender's flow: the thread goes on in
 *      the sender's flow from that receive.  When the thread's segment has
 *      no message yet and began at an activation, that activation was this
 *      very receive (propagation starts a process at it): the whole
 *      segment joins.
 *   4. Artificial send: a receive no traced send matches began outside the
 *      session (an untraced client): it starts a new flow, a new request --
 *      unless the segment has had no message yet (the activation's flow is
 *      that request), or it goes on an exchange still open on its channel
 *      (per thread and channel):
 *        - a channel whose first message here was a receive is served by
 *          this end: its request is open until this end sends on it (the
 *          reply), so more bytes of it -- read in several calls, or after
 *          the thread served other connections meanwhile (a poll() loop) --
 *          go on in the flow that read its first bytes;
 *        - a channel whose first message here was a send is one this end
 *          asked on: what comes back is the answer, and goes on in the flow
 *          of the last send.
 *   5. Matching (trace_format.h, "Message events"): streams by their
 *      direction and overlapping byte ranges -- TCP by the 4-tuple, pipes by
 *      inode and UNIX stream sockets by their pair of inodes on the same
 *      host.  Offsets are taken as they are: absolute ones name the same
 *      bytes on both ends; relative ones (each end counts from the first
 *      byte it saw) agree when both ends were traced from the channel's
 *      first byte, as propagation arranges (the receiver starts at the
 *      first traced send's bytes), and may pair wrong bytes otherwise.
 *      Datagrams by order: the i-th datagram received for a destination
 *      is the i-th sent to it, both counted in time order -- UDP's
 *      destination is its port (a receiver bound to every address knows
 *      no other, a sender may not know its own address yet), a UNIX
 *      datagram socket's its pair of inodes.  Messages of 0 bytes (end of
 *      stream, shutdown) match nothing and cut nothing.
 *   6. Children: a process goes on in the image it exec'd, and a forked
 *      child goes on with its parent's work.  The first segment of an
 *      image exec'd by the same process joins the flow of the old image's
 *      last record; the first segment of a forked child (a thread of
 *      another pid in its parent's image, or an image a child exec'd) joins
 *      the flow its parent's process was in when the child's first record
 *      came -- the segment of the parent's pid started last before it: a
 *      guess when several of the parent's threads are in different flows.
 *      Only a segment that began as a continuation (event "start" or
 *      "thread") joins: one that began at an accept or a receive is a
 *      request of its own (a pre-forked worker's).
 *   7. Clocks: hosts' clocks are only as close as they are synchronised, and
 *      a receive never precedes its send.  Each matched message between two
 *      hosts bounds the difference of their clocks: from A to B, B's clock
 *      is at least (send - receive) ahead of A's; from B to A, at most
 *      (receive - send).  A pair with bounds both ways is set to the middle
 *      of them (as NTP assumes the two ways take as long); a pair with one
 *      bound is moved only as far as that bound needs (a clock that already
 *      agrees stays).  Hosts are aligned along a spanning tree of the pairs
 *      that exchanged messages, from the host of the session's first image;
 *      a host with no message to the others keeps its clock.  The offsets
 *      are applied to the session's traces (an_realtime_ns) before the
 *      flows' times are taken, so exports and comparisons see them.
 *   8. Properties the result should have, counted where it does not: a
 *      flow holds one request (at most one start that is not a
 *      continuation: an accept, a receive from outside, a start function's
 *      call, an activation), and a receive never precedes the send it
 *      matched (after rule 7); with join directives (rule 9), every value
 *      given is taken.  `sptrace flows` says which flows and how many
 *      messages or values break them.
 *   9. Join directives (trace_format.h, "Values"): a work item handed
 *      between threads with no message -- a queue, a thread pool -- is
 *      followed by the values the agent recorded for FUNC:entry:argN and
 *      FUNC:exit:ret directives (`sptrace run --join`).  In each process,
 *      in time order, the occurrences of one value pair up as a give and a
 *      take: an occurrence is a take when an earlier one of the same value
 *      on another thread is still untaken (the earliest such: a queue is
 *      first in, first out), else a give -- so `enqueue(req)` gives req and
 *      the `dequeue()` that returns it takes it, and a request that comes
 *      back at the same address later is given anew.  An occurrence on the
 *      thread holding an untaken give of the value is neither (the giver
 *      naming its item again).  The value 0 (NULL, none) joins nothing.
 *      A take cuts its thread: from it the thread goes on in the giver's
 *      flow (a segment joined to the give's), until its next cut -- but a
 *      thread that began on its own (event "thread") and has had no
 *      message or value yet was waiting for this item: that segment joins
 *      whole, as in rule 3.  For the time a flow owns, a give ends its
 *      part's work as a send does, and a take begins it as a receive.
 *  10. Scopes (FUNC:scope directives, from meta's "join" lines and
 *      `--join`): each outermost call of FUNC is a segment of its own; a
 *      take inside it joins the whole call, from its entry, to the giver's
 *      flow (the item's work began when the call did), and at its return
 *      the thread goes back to the flow it was in before the call (a
 *      thread that was in none -- a worker whose whole life is scopes --
 *      goes on in the scope's until its next cut: its loop between two
 *      items, not a flow of its own).  A scope in which nothing was taken
 *      stays in the flow before it.
 */

typedef struct chan_key {
	uint32_t proto;
	uint32_t host;           /* pipes and UNIX sockets: an index of the host name */
	uint8_t src[16], dst[16];
	uint16_t sport, dport;
	uint64_t ino_a, ino_b;
} chan_key;

typedef struct send_ent {
	chan_key k;
	uint64_t off, len;       /* a datagram: off is its number (rule 5) */
	int dgram;
	int64_t ns;
	long seg;                /* the segment it was sent in */
	size_t image;            /* where it was sent, for an_flows_match */
	uint32_t tid;
	uint64_t tsc;
} send_ent;

/* A datagram received, for its number (rule 5). */
typedef struct dgram_recv {
	chan_key k;
	int64_t ns;
	size_t seq;              /* in the order pass 2 meets it */
} dgram_recv;

typedef struct segment {
	size_t parent;           /* union-find */
	size_t image;
	uint32_t pid, tid;
	const char *event;       /* root segments: the start event; NULL: joined */
	int64_t t0, t1;
	uint64_t events;
	int has_t;
	int first;               /* its thread's first segment */
	int64_t first_msg;       /* its first message's time, */
	int first_is_recv;       /* whether it was a receive, */
	int64_t last_msg;        /* its last message's time, */
	int last_is_send;        /* and whether it was a send, */
	int64_t last_send_ret;   /* and then when that send returned */
	int has_msg;
	int64_t func_end;        /* a start function's call: its return */
	int has_func_end;
} segment;

typedef struct join {
	size_t seg;
	size_t send;
} join;

/* A join directive's value (rule 9), in pass 1's order. */
typedef struct val_ent {
	size_t image;
	uint32_t pid, tid;
	int64_t ns;
	int64_t value;
	long give;               /* a take: the give it took; -1 */
	int role;                /* VAL_GIVE, VAL_TAKE or VAL_NONE */
	int taken;               /* a give: a take took it */
	long seg;                /* the segment it was met in (pass 2) */
} val_ent;

enum { VAL_NONE, VAL_GIVE, VAL_TAKE };

struct an_flows {
	an_flow *f;
	size_t n;
	an_msg_match *m;         /* matched messages, by receive in pass 2's order */
	size_t nm, capm;
	char **hosts;            /* host names, interned */
	size_t nhosts, caphosts;
	an_clock *clocks;        /* rule 7: the hosts whose clocks were aligned */
	size_t nclocks;
	size_t nbackwards;       /* rule 8: receives before their sends */
	size_t ntakes, nuntaken; /* rule 9: values taken, values given and never taken */
};

typedef struct build {
	an_session *s;
	an_flows *out;
	send_ent *sends;
	size_t nsends, capsends;
	size_t *sorted;          /* sends by key, then offset */
	segment *segs;
	size_t nsegs, capsegs;
	join *joins;
	size_t njoins, capjoins;
	dgram_recv *drecv;
	size_t ndrecv, capdrecv;
	uint64_t *drecv_no;      /* by seq: the number of that datagram */
	an_meta *meta;           /* activation_name's: of image meta_image */
	size_t meta_image;
	const an_flows_opts *opts;
	unsigned char *is_start; /* rules 1 and 10: per site id of the image being read,
				    SITE_START | SITE_SCOPE */
	size_t nis_start;
	val_ent *vals;           /* rule 9 */
	size_t nvals, capvals;
	join *vjoins;            /* segments joined to a give: send is its vals index */
	size_t nvjoins, capvjoins;
} build;

enum { SITE_START = 1, SITE_SCOPE = 2 };

static int host_index(an_flows *f, const char *host, uint32_t *out)
{
	for (size_t i = 0; i < f->nhosts; i++)
		if (strcmp(f->hosts[i], host) == 0) {
			*out = (uint32_t)i;
			return 0;
		}
	if (sp_grow((void **)&f->hosts, &f->caphosts, f->nhosts + 1, sizeof *f->hosts) ||
	    !(f->hosts[f->nhosts] = strdup(host)))
		return -1;
	*out = (uint32_t)f->nhosts++;
	return 0;
}

/* The key of a message's direction, as the sender names it (recv: the
 * receiver's channel turned round).  0, or -1 if the channel is unknown. */
static int msg_key(an_trace *t, uint32_t host, const an_msg *m, chan_key *k)
{
	const trace_channel *c = an_channel(t, m->chan);

	memset(k, 0, sizeof *k);
	if (!c || !c->proto)
		return -1;
	k->proto = c->proto;
	switch (c->proto) {
	case TRACE_PROTO_UDP:
		if (!m->recv && !(c->flags & TRACE_CHAN_PEER))
			return -1;
		k->dport = m->recv ? c->local_port : c->peer_port;
		return 0;
	case TRACE_PROTO_TCP:
		if (!(c->flags & TRACE_CHAN_PEER))
			return -1;
		memcpy(m->recv ? k->src : k->dst, c->peer_addr, 16);
		memcpy(m->recv ? k->dst : k->src, c->local_addr, 16);
		k->sport = m->recv ? c->peer_port : c->local_port;
		k->dport = m->recv ? c->local_port : c->peer_port;
		return 0;
	case TRACE_PROTO_PIPE:
		k->host = host;
		k->ino_a = c->inode;
		return 0;
	default:                 /* UNIX sockets: the sender's inode, the receiver's */
		if (!(c->flags & TRACE_CHAN_PEER_INODE))
			return -1;
		k->host = host;
		k->ino_a = m->recv ? c->peer_inode : c->inode;
		k->ino_b = m->recv ? c->inode : c->peer_inode;
		return 0;
	}
}

/* Messages that can be matched (rule 5). */
static int matchable(const an_trace *t, const an_msg *m)
{
	const trace_channel *c = an_channel(t, m->chan);

	return m->len && c;
}

static int key_cmp(const chan_key *a, const chan_key *b)
{
	return memcmp(a, b, sizeof *a);
}

static build *sort_ctx;

static int send_cmp(const void *x, const void *y)
{
	const send_ent *a = &sort_ctx->sends[*(const size_t *)x];
	const send_ent *b = &sort_ctx->sends[*(const size_t *)y];
	int c = key_cmp(&a->k, &b->k);

	if (c)
		return c;
	if (a->dgram != b->dgram)
		return a->dgram - b->dgram;
	if (a->dgram && a->ns != b->ns)
		return a->ns < b->ns ? -1 : 1;
	if (a->off != b->off)
		return a->off < b->off ? -1 : 1;
	return *(const size_t *)x < *(const size_t *)y ? -1 : 1;
}

static int drecv_cmp(const void *x, const void *y)
{
	const dgram_recv *a = x, *b = y;
	int c = key_cmp(&a->k, &b->k);

	if (c)
		return c;
	if (a->ns != b->ns)
		return a->ns < b->ns ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* The send whose bytes overlap this receive's, or the datagram of this
 * number (rule 5), or -1. */
static long find_send(build *b, const chan_key *k, const an_msg *m)
{
	size_t lo = 0, hi = b->nsends;
	int dg = !!(m->flags & TRACE_MSG_DGRAM);

	/* the first send of this key with off + len > m->off, sends of one key
	 * being sorted by offset (and, on one stream, not overlapping) */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const send_ent *s = &b->sends[b->sorted[mid]];
		int c = key_cmp(&s->k, k);

		if (c < 0 || (c == 0 && (s->dgram < dg || (s->dgram == dg &&
					 (dg ? s->off < m->off : s->off + s->len <= m->off)))))
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < b->nsends) {
		const send_ent *s = &b->sends[b->sorted[lo]];

		if (key_cmp(&s->k, k) == 0 && s->dgram == dg &&
		    (dg ? s->off == m->off : s->off < m->off + m->len))
			return (long)b->sorted[lo];
	}
	return -1;
}

static long seg_new(build *b, size_t image, const an_thread *th, const char *event)
{
	segment *sg;

	if (sp_grow((void **)&b->segs, &b->capsegs, b->nsegs + 1, sizeof *b->segs))
		return -1;
	sg = &b->segs[b->nsegs];
	memset(sg, 0, sizeof *sg);
	sg->parent = b->nsegs;
	sg->image = image;
	sg->pid = th->pid ? th->pid : an_session_image(b->s, image)->pid;
	sg->tid = th->tid;
	sg->event = event;
	return (long)b->nsegs++;
}

static void seg_count(segment *sg, int64_t t0, int64_t t1, uint64_t n)
{
	if (!n)
		return;
	if (!sg->has_t || t0 < sg->t0)
		sg->t0 = t0;
	if (!sg->has_t || t1 > sg->t1)
		sg->t1 = t1;
	sg->has_t = 1;
	sg->events += n;
}

static int add_join(build *b, size_t seg, size_t send)
{
	if (sp_grow((void **)&b->joins, &b->capjoins, b->njoins + 1, sizeof *b->joins))
		return -1;
	b->joins[b->njoins++] = (join){ seg, send };
	return 0;
}

/* A receive matched to a send, for an_flows_match. */
static int add_match(build *b, size_t send, size_t image, uint32_t tid, uint64_t tsc)
{
	an_flows *f = b->out;
	const send_ent *s = &b->sends[send];

	if (sp_grow((void **)&f->m, &f->capm, f->nm + 1, sizeof *f->m))
		return -1;
	f->m[f->nm++] = (an_msg_match){ s->image, s->tid, s->tsc, image, tid, tsc,
					 INT64_MIN, INT64_MIN };
	return 0;
}

/* The cause of the activation at `tsc`: the first word after the TSC of the
 * "activated" line of image's meta nearest at or after it (the agent writes
 * the line after the event), within 10 ms; else "thread" (rule 1). */
static const char *activation_name(build *b, size_t image, an_trace *t, uint64_t tsc)
{
	static const char *const known[] = { "start", "call", "timer", "signal", "accept",
					     "recv", "activate", "attach" };
	const char *best = NULL, *hz = an_trace_meta(t, TRACE_META_TSC_HZ);
	uint64_t best_d = UINT64_MAX, limit = hz ? strtoull(hz, NULL, 10) / 100 : 0;
	an_meta *m;
	sp_err e;

	if (b->meta_image != image) {
		an_meta_free(b->meta);
		b->meta = NULL;
		b->meta_image = image;
		if (an_meta_read(an_trace_dir(t), &b->meta, &e) < 0)
			b->meta = NULL;
	}
	m = b->meta;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		unsigned long long at;
		char word[32];

		if (strcmp(an_meta_key(m, l), TRACE_META_ACTIVATED) != 0 ||
		    sscanf(an_meta_val(m, l), "%llu %31s", &at, word) != 2 || at < tsc ||
		    at - tsc > limit || at - tsc >= best_d)
			continue;
		for (size_t k = 0; k < sizeof known / sizeof *known; k++)
			if (strcmp(word, known[k]) == 0) {
				best = known[k];
				best_d = at - tsc;
			}
	}
	return best ? best : "thread";
}

/* Rule 9: a value met in pass 1. */
static int add_value(build *b, size_t image, an_trace *t, const an_thread *th,
		     const an_record *r)
{
	if (sp_grow((void **)&b->vals, &b->capvals, b->nvals + 1, sizeof *b->vals))
		return -1;
	b->vals[b->nvals++] = (val_ent){ image, th->pid ? th->pid : an_session_image(b->s, image)->pid,
					 th->tid, an_realtime_ns(t, r->tsc), r->value, -1, VAL_NONE,
					 0, -1 };
	return 0;
}

static const val_ent *val_sort_base;

static int val_cmp(const void *x, const void *y)
{
	const val_ent *a = &val_sort_base[*(const size_t *)x], *c = &val_sort_base[*(const size_t *)y];

	if (a->image != c->image)
		return a->image < c->image ? -1 : 1;
	if (a->pid != c->pid)
		return a->pid < c->pid ? -1 : 1;
	if (a->value != c->value)
		return a->value < c->value ? -1 : 1;
	if (a->ns != c->ns)
		return a->ns < c->ns ? -1 : 1;
	return *(const size_t *)x < *(const size_t *)y ? -1 : 1;
}

/* Rule 9: gives and takes.  The occurrences of one value in one process,
 * in time order: each takes the earliest untaken give of another thread.
 * The untaken gives of the value at each point are few (a queue holds an
 * item once): kept in a list of their own, in time order. */
static int pair_values(build *b)
{
	size_t *o = malloc((b->nvals + 1) * sizeof *o), *open = malloc((b->nvals + 1) * sizeof *open);

	if (!o || !open) {
		free(o);
		free(open);
		return -1;
	}
	for (size_t i = 0; i < b->nvals; i++)
		o[i] = i;
	val_sort_base = b->vals;
	qsort(o, b->nvals, sizeof *o, val_cmp);
	val_sort_base = NULL;
	for (size_t from = 0, to; from < b->nvals; from = to) {
		const val_ent *f = &b->vals[o[from]];

		for (to = from + 1; to < b->nvals; to++) {
			const val_ent *v = &b->vals[o[to]];

			if (v->image != f->image || v->pid != f->pid || v->value != f->value)
				break;
		}
		if (f->value == 0)
			continue;
		size_t nopen = 0;

		for (size_t k = from; k < to; k++) {
			val_ent *v = &b->vals[o[k]];
			size_t j, give = nopen;

			for (j = 0; j < nopen && b->vals[open[j]].tid != v->tid; j++)
				if (give == nopen)
					give = j;
			if (j < nopen)
				continue;            /* its own thread's give is untaken */
			if (give < nopen) {
				v->role = VAL_TAKE;
				v->give = (long)open[give];
				b->vals[open[give]].taken = 1;
				b->out->ntakes++;
				memmove(open + give, open + give + 1, (nopen - give - 1) * sizeof *open);
				nopen--;
			} else {
				v->role = VAL_GIVE;
				open[nopen++] = o[k];
			}
		}
		b->out->nuntaken += nopen;
	}
	free(o);
	free(open);
	return 0;
}

static int add_vjoin(build *b, size_t seg, size_t give)
{
	if (sp_grow((void **)&b->vjoins, &b->capvjoins, b->nvjoins + 1, sizeof *b->vjoins))
		return -1;
	b->vjoins[b->nvjoins++] = (join){ seg, give };
	return 0;
}

/* Pass 1: every send of the session, for matching. */
static int collect_sends(build *b, sp_err *err)
{
	for (size_t i = 0; i < an_session_nimages(b->s); i++) {
		an_trace *t = an_session_trace(b->s, i);
		uint32_t host;

		if (!t)
			continue;
		if (host_index(b->out, an_session_image(b->s, i)->host, &host))
			return sp_fail(err, "out of memory");
		for (size_t k = 0; k < an_trace_nthreads(t); k++) {
			an_iter *it;
			an_record r;

			if (an_iter_open(t, an_trace_thread(t, k), &it, err) < 0)
				return -1;
			while (an_iter_next(it, &r)) {
				send_ent *s;
				dgram_recv *d;

				if (r.kind == TRACE_EVENT && r.id == TRACE_EV_VALUE) {
					if (add_value(b, i, t, an_trace_thread(t, k), &r)) {
						an_iter_close(it);
						return sp_fail(err, "out of memory");
					}
					continue;
				}
				if (r.kind != TRACE_EVENT || !trace_event_is_msg(r.id) ||
				    !matchable(t, &r.msg))
					continue;
				if (r.msg.recv) {
					if (!(r.msg.flags & TRACE_MSG_DGRAM))
						continue;
					if (sp_grow((void **)&b->drecv, &b->capdrecv, b->ndrecv + 1,
						    sizeof *b->drecv)) {
						an_iter_close(it);
						return sp_fail(err, "out of memory");
					}
					d = &b->drecv[b->ndrecv];
					if (msg_key(t, host, &r.msg, &d->k) < 0)
						continue;
					d->ns = an_realtime_ns(t, r.tsc);
					d->seq = b->ndrecv++;
					continue;
				}
				if (sp_grow((void **)&b->sends, &b->capsends, b->nsends + 1,
					    sizeof *b->sends)) {
					an_iter_close(it);
					return sp_fail(err, "out of memory");
				}
				s = &b->sends[b->nsends];
				if (msg_key(t, host, &r.msg, &s->k) < 0)
					continue;
				s->off = r.msg.off;
				s->len = r.msg.len;
				s->dgram = !!(r.msg.flags & TRACE_MSG_DGRAM);
				s->ns = an_realtime_ns(t, r.tsc);
				s->seg = -1;
				s->image = i;
				s->tid = an_trace_thread(t, k)->tid;
				s->tsc = r.tsc;
				b->nsends++;
			}
			an_iter_close(it);
		}
	}
	if (pair_values(b) ||
	    !(b->sorted = malloc((b->nsends + 1) * sizeof *b->sorted)))
		return sp_fail(err, "out of memory");
	for (size_t i = 0; i < b->nsends; i++)
		b->sorted[i] = i;
	sort_ctx = b;
	qsort(b->sorted, b->nsends, sizeof *b->sorted, send_cmp);
	sort_ctx = NULL;
	/* datagrams numbered in time order per destination (rule 5) */
	for (size_t i = 0, no = 0; i < b->nsends; i++) {
		send_ent *s = &b->sends[b->sorted[i]];

		if (!s->dgram)
			continue;
		no = i && b->sends[b->sorted[i - 1]].dgram &&
		     key_cmp(&b->sends[b->sorted[i - 1]].k, &s->k) == 0 ? no + 1 : 0;
		s->off = no;
	}
	if (!(b->drecv_no = malloc((b->ndrecv + 1) * sizeof *b->drecv_no)))
		return sp_fail(err, "out of memory");
	if (b->ndrecv)
		qsort(b->drecv, b->ndrecv, sizeof *b->drecv, drecv_cmp);
	for (size_t i = 0, no = 0; i < b->ndrecv; i++) {
		no = i && key_cmp(&b->drecv[i - 1].k, &b->drecv[i].k) == 0 ? no + 1 : 0;
		b->drecv_no[b->drecv[i].seq] = no;
	}
	return 0;
}

static size_t find(segment *s, size_t i);
static void unite(segment *s, size_t a, size_t b);

/* Rule 4: where each channel's exchange stands on the thread being read. */
enum { CH_NONE, CH_REQUEST, CH_REPLIED, CH_ASKED };

typedef struct chan_state {
	long seg;                /* the segment of the open exchange */
	uint8_t state;
} chan_state;

/* Rule 10: does `d` (a join directive) make `name` a scope? */
static int scope_of(const char *d, const char *name)
{
	unsigned long len;
	unsigned arg;

	return trace_join_parse(d, &len, &arg) == TRACE_JOIN_SCOPE && strlen(name) == len &&
	       strncmp(name, d, len) == 0;
}

/* Rules 1 and 10: which site ids of trace t enter a start function, which
 * a scope (the directives of its meta's "join" lines and of the options). */
static int start_sites(build *b, an_trace *t)
{
	an_meta *m = NULL;
	sp_err e;
	size_t nscope = 0;

	free(b->is_start);
	b->is_start = NULL;
	b->nis_start = 0;
	if (an_meta_read(an_trace_dir(t), &m, &e) < 0)
		m = NULL;
	for (size_t l = 0; m && l < an_meta_nlines(m); l++)
		nscope += strcmp(an_meta_key(m, l), TRACE_META_JOIN) == 0;
	if ((!b->opts || (!b->opts->nstart && !b->opts->njoin)) && !nscope) {
		an_meta_free(m);
		return 0;
	}
	if (!(b->is_start = calloc(an_nsites(t) + 1, 1))) {
		an_meta_free(m);
		return -1;
	}
	b->nis_start = an_nsites(t);
	for (size_t id = 1; id < b->nis_start; id++) {
		const an_func *f = an_func_get(t, an_site(t, (uint32_t)id)->callee);

		if (!f || !f->name)
			continue;
		for (size_t k = 0; b->opts && k < b->opts->nstart; k++)
			if (strcmp(f->name, b->opts->start[k]) == 0)
				b->is_start[id] |= SITE_START;
		for (size_t k = 0; b->opts && k < b->opts->njoin; k++)
			if (scope_of(b->opts->join[k], f->name))
				b->is_start[id] |= SITE_SCOPE;
		for (size_t l = 0; m && l < an_meta_nlines(m); l++)
			if (strcmp(an_meta_key(m, l), TRACE_META_JOIN) == 0 &&
			    scope_of(an_meta_val(m, l), f->name))
				b->is_start[id] |= SITE_SCOPE;
	}
	an_meta_free(m);
	return 0;
}

static int site_is(const build *b, const an_record *r, int what)
{
	return (r->kind == TRACE_ENTRY || r->kind == TRACE_EXIT) && r->id < b->nis_start &&
	       (b->is_start[r->id] & what);
}

static int is_start(const build *b, const an_record *r)
{
	return site_is(b, r, SITE_START);
}

/* Pass 2: one thread's records cut into segments (rules 1 to 4).  Its sends
 * come in the order pass 1 met them: *next_send walks them. */
static int thread_segments(build *b, size_t image, an_trace *t, uint32_t host,
			   const an_thread *th, size_t *next_send, size_t *next_drecv, size_t *next_val,
			   sp_err *err)
{
	an_iter *it;
	an_record r;
	long cur = -1;
	int has_msg = 0, cur_activation = 0, cur_activate = 0, in_start = 0;
	int in_scope = 0, scope_joined = 0;    /* rule 10 */
	long before_scope = -1;
	long ret_seg = -1;                     /* a send's segment, until the send returns */
	int ret_open = 0;                      /* calls opened since that send */
	uint64_t pending = 0;
	int64_t pend_t0 = 0, pend_t1 = 0;
	size_t first_seg = b->nsegs;

	size_t nch = an_nchannels(t), nopen = 0;
	chan_state *ch = calloc(nch + 1, sizeof *ch);
	uint32_t *open_req = calloc(nch + 1, sizeof *open_req);   /* channels in CH_REQUEST */

	if (!ch || !open_req) {
		free(ch);
		free(open_req);
		return sp_fail(err, "out of memory");
	}
	if (an_iter_open(t, th, &it, err) < 0) {
		free(ch);
		free(open_req);
		return -1;
	}
	while (an_iter_next(it, &r)) {
		int64_t ns = an_realtime_ns(t, r.tsc);
		long send = -1;
		chan_key k;

		if (ret_seg >= 0 && r.kind == TRACE_ENTRY)
			ret_open++;
		else if (ret_seg >= 0 && r.kind == TRACE_EXIT && !ret_open--) {
			/* the return of the call the last send was made in */
			b->segs[ret_seg].last_send_ret = ns;
			ret_seg = -1;
		}

		if (r.kind == TRACE_ENTRY && site_is(b, &r, SITE_SCOPE) && !in_scope++) {
			/* rule 10: a scope begins */
			before_scope = cur;
			if ((cur = seg_new(b, image, th, cur < 0 ? "thread" : NULL)) < 0)
				goto nomem;
			scope_joined = 0;
		}
		if (r.kind == TRACE_EVENT && r.id == TRACE_EV_VALUE && *next_val < b->nvals) {
			/* rule 9 */
			val_ent *v = &b->vals[(*next_val)++];

			if (v->role == VAL_GIVE) {
				segment *sg;

				if (cur < 0 && (cur = seg_new(b, image, th, "thread")) < 0)
					goto nomem;
				v->seg = cur;
				/* a hand-off, as a send: the part's work ends there */
				sg = &b->segs[cur];
				if (!sg->has_msg) {
					sg->first_msg = ns;
					sg->first_is_recv = 0;
					sg->has_msg = 1;
				}
				sg->last_msg = sg->last_send_ret = ns;
				sg->last_is_send = 1;
			} else if (v->role == VAL_TAKE) {
				int cut = !in_scope || scope_joined;

				if (cut && cur >= 0 && !b->segs[cur].has_msg && b->segs[cur].event &&
				    strcmp(b->segs[cur].event, "thread") == 0) {
					/* a thread's start, waiting for its first item: it
					 * joins whole, its work from the take (as rule 3) */
					b->segs[cur].event = NULL;
					b->segs[cur].first_msg = ns;
					b->segs[cur].first_is_recv = 1;
					b->segs[cur].has_msg = 1;
					b->segs[cur].last_msg = ns;
				} else if (cut) {
					if ((cur = seg_new(b, image, th, NULL)) < 0)
						goto nomem;
					cur_activation = 0;
					cur_activate = 0;
					/* as a receive: the part's work begins there */
					b->segs[cur].first_msg = ns;
					b->segs[cur].first_is_recv = 1;
					b->segs[cur].has_msg = 1;
					b->segs[cur].last_msg = ns;
				}
				if (in_scope && !scope_joined)
					b->segs[cur].event = NULL;   /* the scope goes on a flow */
				scope_joined = in_scope;
				v->seg = cur;
				if (add_vjoin(b, (size_t)cur, (size_t)v->give))
					goto nomem;
			}
		} else if (r.kind == TRACE_ENTRY && is_start(b, &r) && !in_start++) {
			/* rule 1: a start function's call */
			if ((cur = seg_new(b, image, th, "func")) < 0)
				goto nomem;
			has_msg = 0;
			cur_activation = 1;
			cur_activate = 0;
		} else if (r.kind == TRACE_EVENT && (r.id == TRACE_EV_ACCEPT || r.id == TRACE_EV_RECV) &&
		    cur >= 0 && cur_activate && !has_msg) {
			/* rule 1: the event of the activation just walked */
			b->segs[cur].event = r.id == TRACE_EV_ACCEPT ? "accept" : "recv";
			cur_activate = 0;
		} else if (r.kind == TRACE_EVENT && (r.id == TRACE_EV_ACTIVATE ||
						     r.id == TRACE_EV_ACCEPT || r.id == TRACE_EV_RECV)) {
			/* rule 1 */
			cur = seg_new(b, image, th, r.id == TRACE_EV_ACCEPT ? "accept"
				      : r.id == TRACE_EV_RECV ? "recv" : activation_name(b, image, t, r.tsc));
			if (cur < 0)
				goto nomem;
			has_msg = 0;
			cur_activation = 1;
			cur_activate = r.id == TRACE_EV_ACTIVATE;
		} else if (r.kind == TRACE_EVENT && r.id == TRACE_EV_MSG_SEND && matchable(t, &r.msg)) {
			if (cur < 0 && (cur = seg_new(b, image, th, "thread")) < 0)
				goto nomem;
			if (msg_key(t, host, &r.msg, &k) == 0 && *next_send < b->nsends)
				b->sends[(*next_send)++].seg = cur;
			has_msg = 1;
			if (r.msg.len) {
				/* rule 4: the requests of this flow are answered (a
				 * reply may go out on another channel: stdin, stdout) */
				size_t root = find(b->segs, (size_t)cur), keep = 0;

				for (size_t i = 0; i < nopen; i++) {
					chan_state *c = &ch[open_req[i]];

					if (c->state == CH_REQUEST &&
					    find(b->segs, (size_t)c->seg) == root)
						c->state = CH_REPLIED;
					if (c->state == CH_REQUEST)
						open_req[keep++] = open_req[i];
				}
				nopen = keep;
				if (r.msg.chan < nch && ch[r.msg.chan].state != CH_REPLIED) {
					ch[r.msg.chan].state = CH_ASKED;
					ch[r.msg.chan].seg = cur;
				}
			}
		} else if (r.kind == TRACE_EVENT && r.id == TRACE_EV_MSG_RECV && r.msg.len) {
			if (matchable(t, &r.msg) && msg_key(t, host, &r.msg, &k) == 0) {
				an_msg m = r.msg;

				if ((m.flags & TRACE_MSG_DGRAM) && *next_drecv < b->ndrecv)
					m.off = b->drecv_no[(*next_drecv)++];
				send = find_send(b, &k, &m);
			}
			if (send >= 0) {
				/* rule 3 */
				if (cur < 0 || !(cur_activation && !has_msg)) {
					if ((cur = seg_new(b, image, th, NULL)) < 0)
						goto nomem;
				} else {
					b->segs[cur].event = NULL;
				}
				if (add_join(b, (size_t)cur, (size_t)send) ||
				    add_match(b, (size_t)send, image, th->tid, r.tsc))
					goto nomem;
				cur_activation = 0;
			} else {
				/* rule 4 */
				chan_state *c = r.msg.chan < nch ? &ch[r.msg.chan] : NULL;
				int open = c && (c->state == CH_REQUEST || c->state == CH_ASKED);

				if (open && cur >= 0 && find(b->segs, (size_t)cur) ==
							find(b->segs, (size_t)c->seg)) {
					/* the exchange goes on where it is */
				} else if (open) {
					if ((cur = seg_new(b, image, th, NULL)) < 0)
						goto nomem;
					unite(b->segs, (size_t)cur, (size_t)c->seg);
					cur_activation = 0;
				} else if (cur < 0 || has_msg) {
					if ((cur = seg_new(b, image, th, "recv")) < 0)
						goto nomem;
					cur_activation = 0;
				}
				if (c && !open) {
					c->state = CH_REQUEST;
					c->seg = cur;
					open_req[nopen++] = r.msg.chan;
				}
			}
			has_msg = 1;
		}
		if (cur < 0) {
			if (!pending)
				pend_t0 = ns;
			pend_t1 = ns;
			pending++;
			continue;
		}
		if (pending) {
			seg_count(&b->segs[cur], pend_t0, pend_t1, pending);
			pending = 0;
		}
		seg_count(&b->segs[cur], ns, ns, 1);
		if (r.kind == TRACE_EXIT && in_start && is_start(b, &r) && !--in_start) {
			b->segs[cur].func_end = ns;
			b->segs[cur].has_func_end = 1;
		}
		if (r.kind == TRACE_EXIT && in_scope && site_is(b, &r, SITE_SCOPE) && !--in_scope) {
			/* rule 10: back to the flow before the scope */
			if (before_scope >= 0 && !scope_joined)
				unite(b->segs, (size_t)cur, (size_t)before_scope);
			if (before_scope >= 0) {
				if ((cur = seg_new(b, image, th, NULL)) < 0)
					goto nomem;
				unite(b->segs, (size_t)cur, (size_t)before_scope);
			}
		}
		if (r.kind == TRACE_EVENT && trace_event_is_msg(r.id) && r.msg.len) {
			segment *sg = &b->segs[cur];

			if (!sg->has_msg) {
				sg->first_msg = ns;
				sg->first_is_recv = r.id == TRACE_EV_MSG_RECV;
				sg->has_msg = 1;
			}
			sg->last_msg = sg->last_send_ret = ns;
			sg->last_is_send = r.id == TRACE_EV_MSG_SEND;
			ret_seg = sg->last_is_send ? cur : -1;
			ret_open = 0;
		}
	}
	an_iter_close(it);
	free(ch);
	free(open_req);
	if (pending) {
		/* a thread with records and no start event of its own */
		if ((cur = seg_new(b, image, th, "thread")) < 0)
			return sp_fail(err, "out of memory");
		seg_count(&b->segs[cur], pend_t0, pend_t1, pending);
	}
	if (b->nsegs > first_seg)
		b->segs[first_seg].first = 1;
	return 0;
nomem:
	an_iter_close(it);
	free(ch);
	free(open_req);
	return sp_fail(err, "out of memory");
}

static size_t find(segment *s, size_t i)
{
	while (s[i].parent != i) {
		s[i].parent = s[s[i].parent].parent;
		i = s[i].parent;
	}
	return i;
}

typedef struct group {
	size_t root;             /* union-find root */
	size_t before;           /* its index before they were sorted */
	size_t start;            /* the segment the flow starts at */
	int64_t t0, t1;
	uint64_t events;
	uint32_t starts;         /* its segments that began at a request's start */
} group;

static int group_cmp(const void *x, const void *y)
{
	const group *a = x, *b = y;

	if (a->t0 != b->t0)
		return a->t0 < b->t0 ? -1 : 1;
	return a->start < b->start ? -1 : a->start > b->start;
}

/* Segments by flow, then by time: seg_sort_grp[i] is segment i's flow. */
static build *seg_sort_ctx;
static size_t *seg_sort_grp;

static int seg_time_cmp(const void *x, const void *y)
{
	size_t i = *(const size_t *)x, j = *(const size_t *)y;
	const segment *a = &seg_sort_ctx->segs[i], *b = &seg_sort_ctx->segs[j];

	if (seg_sort_grp[i] != seg_sort_grp[j])
		return seg_sort_grp[i] < seg_sort_grp[j] ? -1 : 1;
	if (a->t0 != b->t0)
		return a->t0 < b->t0 ? -1 : 1;
	return i < j ? -1 : i > j;
}

static void unite(segment *s, size_t a, size_t b)
{
	size_t x = find(s, a), y = find(s, b);

	if (x != y)
		s[x > y ? x : y].parent = x < y ? x : y;
}

/* The segment of image `image` and process `pid` started last at or before
 * `ns` (any, if `ns` is INT64_MAX: the one with the last record), or -1. */
static long segment_at(const build *b, size_t image, uint32_t pid, int64_t ns)
{
	long best = -1;

	for (size_t i = 0; i < b->nsegs; i++) {
		const segment *sg = &b->segs[i];

		if (sg->image != image || sg->pid != pid || !sg->has_t)
			continue;
		if (ns == INT64_MAX ? best < 0 || sg->t1 > b->segs[best].t1
		    : sg->t0 <= ns && (best < 0 || sg->t0 > b->segs[best].t0))
			best = (long)i;
	}
	return best;
}

/* Rule 6. */
static void link_children(build *b)
{
	for (size_t i = 0; i < b->nsegs; i++) {
		const segment *sg = &b->segs[i];
		const an_image *im = an_session_image(b->s, sg->image);
		long parent = -1;

		if (!sg->first || !sg->has_t || !sg->event ||
		    (strcmp(sg->event, "start") != 0 && strcmp(sg->event, "thread") != 0))
			continue;
		if (sg->pid != im->pid && im->pid) {
			/* a forked child's thread in its parent's image */
			parent = segment_at(b, sg->image, im->pid, sg->t0);
		} else if (im->exec_of != AN_NONE) {
			const an_image *old = an_session_image(b->s, im->exec_of);

			if (old->pid == im->pid)
				parent = segment_at(b, im->exec_of, old->pid, INT64_MAX);
			else if ((parent = segment_at(b, im->exec_of, im->pid, INT64_MAX)) < 0)
				parent = segment_at(b, im->exec_of, old->pid, sg->t0);
		}
		if (parent >= 0)
			unite(b->segs, i, (size_t)parent);
	}
}

/* The flows: groups of joined segments, ordered by their start. */
static int make_flows(build *b, sp_err *err)
{
	group *g = NULL;
	size_t ng = 0, *gi = NULL, *order = NULL, *pos = NULL;
	an_flows *f = b->out;

	for (size_t j = 0; j < b->njoins; j++) {
		long other = b->sends[b->joins[j].send].seg;

		if (other >= 0)
			unite(b->segs, b->joins[j].seg, (size_t)other);
	}
	for (size_t j = 0; j < b->nvjoins; j++) {
		long other = b->vals[b->vjoins[j].send].seg;     /* rule 9 */

		if (other >= 0)
			unite(b->segs, b->vjoins[j].seg, (size_t)other);
	}
	link_children(b);
	gi = malloc((b->nsegs + 1) * sizeof *gi);
	g = calloc(b->nsegs + 1, sizeof *g);
	order = malloc((b->nsegs + 1) * sizeof *order);
	if (!gi || !g || !order)
		goto nomem;
	for (size_t i = 0; i < b->nsegs; i++) {
		size_t r = find(b->segs, i);
		segment *sg = &b->segs[i];
		group *gr;

		if (!sg->has_t && !sg->events)
			sg->t0 = sg->t1 = INT64_MAX;
		if (r == i)
			gi[i] = ng++, g[gi[i]] = (group){ .root = i, .start = i, .t0 = INT64_MAX,
							  .t1 = INT64_MIN };
		gr = &g[gi[r]];
		if (sg->has_t) {
			if (sg->t0 < gr->t0)
				gr->t0 = sg->t0;
			if (sg->t1 > gr->t1)
				gr->t1 = sg->t1;
		}
		gr->events += sg->events;
		/* rule 8: a start that is not a continuation (a child's, a thread's) */
		if (sg->event && strcmp(sg->event, "thread") != 0 && strcmp(sg->event, "start") != 0)
			gr->starts++;
		/* the start: its earliest segment that began at a start event */
		if (sg->event && (!b->segs[gr->start].event || sg->t0 < b->segs[gr->start].t0))
			gr->start = i;
	}
	for (size_t k = 0; k < ng; k++)
		g[k].before = k;
	qsort(g, ng, sizeof *g, group_cmp);
	/* gi[] becomes each segment's flow, in the sorted order */
	if (!(pos = malloc((ng + 1) * sizeof *pos)))
		goto nomem;
	for (size_t k = 0; k < ng; k++)
		pos[g[k].before] = k;
	/* two steps: a root's gi[] is read after the segments before it changed
	 * theirs (a flow's root is its first segment, not its earliest) */
	for (size_t i = 0; i < b->nsegs; i++)
		order[i] = pos[gi[find(b->segs, i)]];
	for (size_t i = 0; i < b->nsegs; i++)
		gi[i] = order[i];
	for (size_t i = 0; i < b->nsegs; i++)
		order[i] = i;
	seg_sort_ctx = b;
	seg_sort_grp = gi;
	qsort(order, b->nsegs, sizeof *order, seg_time_cmp);
	seg_sort_ctx = NULL;
	seg_sort_grp = NULL;
	if (!(f->f = calloc(ng + 1, sizeof *f->f)))
		goto nomem;
	for (size_t k = 0, at = 0; k < ng; k++) {
		an_flow *fl = &f->f[f->n];
		const segment *st = &b->segs[g[k].start];
		size_t from = at, no;

		while (at < b->nsegs && gi[order[at]] == k)
			at++;
		no = at - from;
		if (!g[k].events)
			continue;
		f->n++;
		snprintf(fl->id, sizeof fl->id, "f%zu", f->n);
		fl->image = st->image;
		fl->host = an_session_image(b->s, st->image)->host;
		fl->pid = st->pid;
		fl->tid = st->tid;
		fl->event = st->event ? st->event : "recv";
		fl->start_ns = g[k].t0;
		fl->end_ns = g[k].t1;
		fl->events = g[k].events;
		fl->starts = g[k].starts;
		/* the start's process first, then by first appearance */
		if (!(fl->procs = calloc(no + 1, sizeof *fl->procs)) ||
		    !(fl->parts = calloc(no + 1, sizeof *fl->parts)))
			goto nomem;
		fl->procs[fl->nprocs++] = (an_flow_proc){ fl->host, fl->pid };
		for (size_t i = from; i < at; i++) {
			const segment *sg = &b->segs[order[i]];
			const char *h = an_session_image(b->s, sg->image)->host;
			size_t p;

			if (sg->events)
				fl->parts[fl->nparts++] = (an_flow_part){
					sg->image, sg->pid, sg->tid, sg->t0, sg->t1, sg->events,
					sg->first_is_recv ? sg->first_msg : sg->t0,
					sg->has_func_end ? sg->func_end
					: !sg->last_is_send ? sg->t1
					: sg->last_send_ret > sg->last_msg ? sg->last_send_ret
					: sg->last_msg };
			for (p = 0; p < fl->nprocs; p++)
				if (fl->procs[p].pid == sg->pid && strcmp(fl->procs[p].host, h) == 0)
					break;
			if (p == fl->nprocs)
				fl->procs[fl->nprocs++] = (an_flow_proc){ h, sg->pid };
		}
	}
	free(pos);
	free(gi);
	free(g);
	free(order);
	return 0;
nomem:
	free(pos);
	free(gi);
	free(g);
	free(order);
	return sp_fail(err, "out of memory");
}

/* Rule 7: the bounds on host j's clock minus host i's (i < j). */
typedef struct bound {
	int64_t lo, hi;
	size_t n;                /* messages that gave them */
	int ways;                /* bit 0: from i to j, bit 1: from j to i */
} bound;

static int64_t pick(const bound *p)
{
	if ((p->ways & 3) == 3)
		return p->lo / 2 + p->hi / 2;
	if (p->ways & 1)
		return p->lo > 0 ? p->lo : 0;
	return p->hi < 0 ? p->hi : 0;
}

static int align_clocks(build *b, sp_err *err)
{
	an_flows *f = b->out;
	size_t nh = f->nhosts, *queue = NULL, nq = 0;
	uint32_t *himg = NULL, first = 0;
	bound *p = NULL;
	int64_t *off = NULL;
	char *done = NULL;
	int rc = -1;

	if (nh < 2 || !f->nm)
		return 0;
	if (!(p = calloc(nh * nh, sizeof *p)) || !(off = calloc(nh, sizeof *off)) ||
	    !(done = calloc(nh, 1)) || !(queue = calloc(nh, sizeof *queue)) ||
	    !(himg = calloc(an_session_nimages(b->s), sizeof *himg)) ||
	    !(f->clocks = calloc(nh, sizeof *f->clocks)))
		goto nomem;
	for (size_t i = 0; i < an_session_nimages(b->s); i++)
		if (host_index(f, an_session_image(b->s, i)->host, &himg[i]))
			goto nomem;
	for (size_t i = 0; i < f->nm; i++) {
		const an_msg_match *m = &f->m[i];
		uint32_t hs = himg[m->send_image], hr = himg[m->recv_image];
		an_trace *ts = an_session_trace(b->s, m->send_image);
		an_trace *tr = an_session_trace(b->s, m->recv_image);

		if (hs == hr || !ts || !tr)
			continue;
		int64_t d = an_realtime_ns(ts, m->send_tsc) - an_realtime_ns(tr, m->recv_tsc);
		bound *q = &p[(hs < hr ? hs : hr) * nh + (hs < hr ? hr : hs)];

		if (hs < hr) {       /* off[hr] - off[hs] >= d */
			q->lo = (q->ways & 1) && q->lo > d ? q->lo : d;
			q->ways |= 1;
		} else {             /* off[hs] - off[hr] <= -d */
			q->hi = (q->ways & 2) && q->hi < -d ? q->hi : -d;
			q->ways |= 2;
		}
		q->n++;
	}
	if (an_session_nimages(b->s))
		first = himg[0];
	done[first] = 1;
	queue[nq++] = first;
	for (size_t at = 0; at < nq; at++) {
		size_t i = queue[at];

		for (size_t j = 0; j < nh; j++) {
			const bound *q = &p[(i < j ? i : j) * nh + (i < j ? j : i)];

			if (done[j] || !q->ways)
				continue;
			off[j] = off[i] + (i < j ? pick(q) : -pick(q));
			done[j] = 1;
			queue[nq++] = j;
			f->clocks[f->nclocks++] = (an_clock){ f->hosts[j], off[j], f->hosts[i], q->n,
							      (q->ways & 3) == 3 };
		}
	}
	for (size_t i = 0; i < an_session_nimages(b->s); i++) {
		an_trace *t = an_session_trace(b->s, i);

		if (t)
			t->align_ns += off[himg[i]];
	}
	for (size_t i = 0; i < b->nsegs; i++) {
		segment *sg = &b->segs[i];
		int64_t o = off[himg[sg->image]];

		sg->t0 += o;
		sg->t1 += o;
		sg->first_msg += o;
		sg->last_msg += o;
		sg->last_send_ret += o;
		sg->func_end += o;
	}
	for (size_t i = 0; i < b->nsends; i++)
		b->sends[i].ns += off[himg[b->sends[i].image]];
	rc = 0;
	goto out;
nomem:
	rc = sp_fail(err, "out of memory");
out:
	free(p);
	free(off);
	free(done);
	free(queue);
	free(himg);
	return rc;
}

int an_flows_build(an_session *s, an_flows **out, sp_err *err)
{
	return an_flows_build_opts(s, NULL, out, err);
}

int an_flows_build_opts(an_session *s, const an_flows_opts *o, an_flows **out, sp_err *err)
{
	build b = { .s = s, .meta_image = AN_NONE, .opts = o };
	int rc = -1;

	*out = NULL;
	if (!(b.out = calloc(1, sizeof *b.out)))
		return sp_fail(err, "out of memory");
	if (collect_sends(&b, err) < 0)
		goto done;
	{
		size_t next_send = 0, next_drecv = 0, next_val = 0;

		for (size_t i = 0; i < an_session_nimages(s); i++) {
			an_trace *t = an_session_trace(s, i);
			uint32_t host;

			if (!t)
				continue;
			if (host_index(b.out, an_session_image(s, i)->host, &host) ||
			    start_sites(&b, t) != 0) {
				sp_fail(err, "out of memory");
				goto done;
			}
			for (size_t k = 0; k < an_trace_nthreads(t); k++)
				if (thread_segments(&b, i, t, host, an_trace_thread(t, k), &next_send,
						    &next_drecv, &next_val, err) < 0)
					goto done;
		}
	}
	if (align_clocks(&b, err) < 0 || make_flows(&b, err) < 0)
		goto done;
	for (size_t i = 0; i < b.out->nm; i++) {
		/* the matches' times, aligned; rule 8: receives before their sends */
		an_msg_match *m = &b.out->m[i];
		an_trace *ts = an_session_trace(s, m->send_image), *tr = an_session_trace(s, m->recv_image);

		m->send_ns = ts && tr ? an_realtime_ns(ts, m->send_tsc) : INT64_MIN;
		m->recv_ns = ts && tr ? an_realtime_ns(tr, m->recv_tsc) : INT64_MIN;
		if (ts && tr && m->recv_ns < m->send_ns)
			b.out->nbackwards++;
	}
	*out = b.out;
	b.out = NULL;
	rc = 0;
done:
	an_flows_free(b.out);
	free(b.sends);
	free(b.sorted);
	free(b.segs);
	free(b.joins);
	free(b.drecv);
	free(b.drecv_no);
	free(b.is_start);
	free(b.vals);
	free(b.vjoins);
	an_meta_free(b.meta);
	return rc;
}

size_t an_flows_count(const an_flows *f) { return f->n; }

const an_flow *an_flows_get(const an_flows *f, size_t i)
{
	return i < f->n ? &f->f[i] : NULL;
}

const an_flow *an_flows_find(const an_flows *f, const char *id, size_t *index)
{
	char *end;
	unsigned long long n = id[0] == 'f' ? strtoull(id + 1, &end, 10) : 0;

	/* the ids are "f1", "f2", ... in the order of the flows */
	if (!n || *end || n > f->n || strcmp(f->f[n - 1].id, id) != 0)
		return NULL;
	if (index)
		*index = (size_t)n - 1;
	return &f->f[n - 1];
}

size_t an_flows_nmatches(const an_flows *f) { return f->nm; }

size_t an_flows_nclocks(const an_flows *f) { return f->nclocks; }

size_t an_flows_nbackwards(const an_flows *f) { return f->nbackwards; }

size_t an_flows_ntakes(const an_flows *f) { return f->ntakes; }

size_t an_flows_nuntaken(const an_flows *f) { return f->nuntaken; }

const an_clock *an_flows_clock(const an_flows *f, size_t i)
{
	return i < f->nclocks ? &f->clocks[i] : NULL;
}

const an_msg_match *an_flows_match(const an_flows *f, size_t i)
{
	return i < f->nm ? &f->m[i] : NULL;
}

void an_flows_free(an_flows *f)
{
	if (!f)
		return;
	free(f->clocks);
	free(f->m);
	for (size_t i = 0; i < f->n; i++) {
		free(f->f[i].procs);
		free(f->f[i].parts);
	}
	free(f->f);
	for (size_t i = 0; i < f->nhosts; i++)
		free(f->hosts[i]);
	free(f->hosts);
	free(f);
}

/*
 * Critical path: from the flow's last record back to its start.
 *
 *  1. Start where the flow began -- the thread of its start event, which
 *     answers or ends the request -- at that thread's last record in the
 *     flow (other threads may go on after: a monitor, a helper).
 *  2. On that thread, the latest receive of a matched message at or before
 *     the time, inside one of the flow's parts on it: the thread waited for
 *     that message, so the time before went to its sender.  The run from
 *     the receive to the time is a step; go on at the sender's thread, at
 *     the send.
 *  3. No such receive: the run from the start of the flow's part that holds
 *     the time (its earliest on that thread) to the time is the last step.
 *  Times only go back (a receive whose send is not before the time, rule
 *  8's breach, is passed over), and at most one step per matched message,
 *  so the walk ends.
 */
static const an_flow_part *part_at(const an_flow *fl, size_t image, uint32_t tid, int64_t ns)
{
	for (size_t k = 0; k < fl->nparts; k++)
		if (fl->parts[k].image == image && fl->parts[k].tid == tid &&
		    fl->parts[k].start_ns <= ns && ns <= fl->parts[k].end_ns)
			return &fl->parts[k];
	return NULL;
}

int an_flows_critical_path(const an_flows *f, size_t i, an_crit_step **out, size_t *n,
			   sp_err *err)
{
	const an_flow *fl = an_flows_get(f, i);
	const an_flow_part *last = NULL;
	an_crit_step *st;
	size_t ns = 0;

	*out = NULL;
	*n = 0;
	if (!fl)
		return sp_fail(err, "no flow %zu", i);
	for (size_t k = 0; k < fl->nparts; k++)
		if (fl->parts[k].image == fl->image && fl->parts[k].tid == fl->tid &&
		    (!last || fl->parts[k].end_ns > last->end_ns))
			last = &fl->parts[k];
	if (!last)
		return 0;
	if (!(st = calloc(f->nm + 2, sizeof *st)))
		return sp_fail(err, "out of memory");
	size_t image = last->image;
	uint32_t tid = last->tid, pid = last->pid;
	int64_t t = last->end_ns;

	for (;;) {
		/* point 2 */
		const an_msg_match *best = NULL;
		int64_t best_recv = 0, best_send = 0;

		for (size_t k = 0; k < f->nm; k++) {
			const an_msg_match *m = &f->m[k];
			int64_t r = m->recv_ns, snd = m->send_ns;

			if (m->recv_image != image || m->recv_tid != tid || r == INT64_MIN)
				continue;

			/* a send not before the time (rule 8's breach: matched
			 * wrong) cannot have been waited on; one a little after its
			 * receive can (clocks aligned only so far) */
			if (r > t || snd >= t || (best && r <= best_recv) ||
			    !part_at(fl, image, tid, r))
				continue;
			best = m;
			best_recv = r;
			best_send = snd;
		}
		if (!best || ns == f->nm) {
			/* point 3 */
			const an_flow_part *p = part_at(fl, image, tid, t);
			int64_t from = p ? p->start_ns : t;

			for (size_t k = 0; k < fl->nparts; k++)
				if (fl->parts[k].image == image && fl->parts[k].tid == tid &&
				    fl->parts[k].start_ns < from && fl->parts[k].end_ns >= from)
					from = fl->parts[k].start_ns;
			st[ns++] = (an_crit_step){ image, pid, tid, from, t, 0 };
			break;
		}
		st[ns++] = (an_crit_step){ image, pid, tid, best_recv, t, 0 };
		const an_flow_part *sp = part_at(fl, best->send_image, best->send_tid, best_send);

		image = best->send_image;
		tid = best->send_tid;
		pid = sp ? sp->pid : tid;
		t = best_send;
	}
	/* earliest first; each step but the last ends where a message left */
	for (size_t a = 0, b = ns - 1; a < b; a++, b--) {
		an_crit_step x = st[a];

		st[a] = st[b];
		st[b] = x;
	}
	for (size_t k = 0; k + 1 < ns; k++)
		st[k].via = 1;
	*out = st;
	*n = ns;
	return 0;
}
