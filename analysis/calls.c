/*
 * calls.c — entries paired with exits: a thread's call tree
 * (an_thread_calls). See analysis.h for what each promises.
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
/* Calls                                                                     */
/* ------------------------------------------------------------------------ */

/* One stack the thread runs on, once context events say it has several. */
typedef struct shadow {
	uint32_t *saved;         /* site ids of its calls while suspended, outermost first */
	size_t nsaved, capsaved;
	size_t base;             /* in the chain: the depth its calls start at */
	int in_chain;
	int entered;             /* the thread has run on it */
} shadow;

typedef struct calls_build {
	an_trace *t;
	an_call *c;
	size_t n, cap;
	size_t *stack;           /* indices of open AN_CALL items */
	size_t depth, capstack;
	map open;                /* site id -> number of open calls of it */
	int stopped;             /* between a DEACTIVATE and the next ACTIVATE */
	shadow *sh;              /* stacks; [0] the thread's own (none: one stack) */
	size_t nsh, capsh;
	size_t *chain;           /* indices into sh, outermost first */
	size_t nchain, capchain;
	map keys;                /* context key -> index into sh + 1 */
} calls_build;

static an_call *call_add(calls_build *b, uint32_t kind, uint32_t id, uint64_t tsc)
{
	an_call *c;

	if (sp_grow((void **)&b->c, &b->cap, b->n + 1, sizeof *b->c))
		return NULL;
	c = &b->c[b->n++];
	*c = (an_call){ (uint16_t)kind, 0, 0, id,
			(uint32_t)(b->depth > UINT32_MAX ? UINT32_MAX : b->depth), 0, tsc, tsc };
	return c;
}

/* Close the innermost open call. */
static uint32_t canon_id(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && t->sites[id].canon ? t->sites[id].canon : id;
}

static void call_close(calls_build *b, uint32_t end, uint64_t tsc)
{
	an_call *c = &b->c[b->stack[--b->depth]];
	map_slot *s = an_map_find(&b->open, canon_id(b->t, c->id), 0);

	c->end = end;
	c->t1 = tsc;
	c->last = b->n;
	if (s)
		s->val--;
}

static int site_is_tail(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && an_site_is_tail(&t->sites[id]);
}

/* A call whose callee returns to the caller directly (TRACE_SITE_NO_EXIT). */
static int site_no_exit(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && (t->sites[id].flags & TRACE_SITE_NO_EXIT);
}

/* Close, as unwound, the open calls above the innermost one that entered
 * the function making call `id` (nothing if none is open). */
static void resync_to_caller(calls_build *b, uint32_t id, uint64_t tsc)
{
	const an_trace *t = b->t;
	size_t k = b->depth;

	if (id >= t->nsites || !t->sites[id].valid || t->sites[id].caller == AN_NONE)
		return;
	while (k > 0) {
		uint32_t open = b->c[b->stack[k - 1]].id;

		if (open < t->nsites && t->sites[open].valid &&
		    t->sites[open].callee == t->sites[id].caller)
			break;
		k--;
	}
	if (k == 0)
		return;
	while (b->depth > k)
		call_close(b, AN_END_UNWOUND, tsc);
}

/* ---- stacks (context events) ---- */

static void stacks_free(calls_build *b)
{
	for (size_t i = 0; i < b->nsh; i++)
		free(b->sh[i].saved);
	free(b->sh);
	free(b->chain);
	an_map_free(&b->keys);
	b->sh = NULL;
	b->chain = NULL;
	b->nsh = b->capsh = b->nchain = b->capchain = 0;
}

/* A new stack, not run on yet. */
static long stack_new(calls_build *b)
{
	if (sp_grow((void **)&b->sh, &b->capsh, b->nsh + 1, sizeof *b->sh))
		return -1;
	b->sh[b->nsh] = (shadow){ 0 };
	return (long)b->nsh++;
}

/* At the first context event: stack 0, the thread's own, with its calls. */
static int stacks_start(calls_build *b)
{
	if (sp_grow((void **)&b->chain, &b->capchain, 1, sizeof *b->chain) || stack_new(b) < 0)
		return -1;
	b->sh[0].in_chain = b->sh[0].entered = 1;
	b->chain[b->nchain++] = 0;
	return 0;
}

/* Suspend the top stack of the chain: its open calls end AN_END_SWITCHED
 * and are kept to go on when the thread comes back. */
static int stack_suspend(calls_build *b, uint64_t tsc)
{
	shadow *s = &b->sh[b->chain[--b->nchain]];
	size_t n = b->depth - s->base;

	if (sp_grow((void **)&s->saved, &s->capsaved, n, sizeof *s->saved))
		return -1;
	for (size_t i = 0; i < n; i++)
		s->saved[i] = b->c[b->stack[s->base + i]].id;
	s->nsaved = n;
	s->in_chain = 0;
	while (b->depth > s->base)
		call_close(b, AN_END_SWITCHED, tsc);
	return 0;
}

/* Put stack i on top of the chain: its suspended calls go on. */
static int stack_resume(calls_build *b, size_t i, uint64_t tsc)
{
	shadow *s;

	if (sp_grow((void **)&b->chain, &b->capchain, b->nchain + 1, sizeof *b->chain))
		return -1;
	b->chain[b->nchain++] = i;
	s = &b->sh[i];
	s->in_chain = 1;
	s->base = b->depth;
	for (size_t k = 0; k < s->nsaved; k++) {
		map_slot *o;
		an_call *c = call_add(b, AN_CALL, s->saved[k], tsc);

		if (!c || sp_grow((void **)&b->stack, &b->capstack, b->depth + 1, sizeof *b->stack) ||
		    !(o = an_map_get(&b->open, canon_id(b->t, s->saved[k]), 0)))
			return -1;
		c->flags = AN_CONTINUED;
		o->val++;
		b->stack[b->depth++] = b->n - 1;
	}
	s->nsaved = 0;
	return 0;
}

/* The stack a context key names; a new one if none did. */
static long stack_of(calls_build *b, uint64_t key)
{
	map_slot *k = an_map_get(&b->keys, key, 0);
	long i;

	if (!k)
		return -1;
	if (k->val)
		return (long)k->val - 1;
	if ((i = stack_new(b)) >= 0)
		k->val = (uint32_t)i + 1;
	return i;
}

static int context_event(calls_build *b, const an_record *r)
{
	map_slot *k;
	an_call *c;
	long i;

	if (!b->nsh && stacks_start(b) < 0)
		return -1;
	switch (r->id) {
	case TRACE_EV_CTX_SAVE:
		if (!(k = an_map_get(&b->keys, r->key, 0)))
			return -1;
		k->val = (uint32_t)b->chain[b->nchain - 1] + 1;
		return 0;
	case TRACE_EV_CTX_NEW:
		if ((i = stack_new(b)) < 0 || !(k = an_map_get(&b->keys, r->key, 0)))
			return -1;
		k->val = (uint32_t)i + 1;
		return 0;
	default:
		if ((i = stack_of(b, r->key)) < 0)
			return -1;
		if ((size_t)i == b->chain[b->nchain - 1])
			return 0;                       /* setcontext on the same stack */
		if (b->sh[i].in_chain) {
			while (b->chain[b->nchain - 1] != (size_t)i)
				if (stack_suspend(b, r->tsc))
					return -1;
		}
		if (!(c = call_add(b, AN_EVENT, r->id, r->tsc)))
			return -1;
		c->end = (uint32_t)i;
		c->flags = b->sh[i].entered ? 0 : AN_NEW_STACK;
		b->sh[i].entered = 1;
		if (!b->sh[i].in_chain)
			return stack_resume(b, (size_t)i, r->tsc);
		return 0;
	}
}

static int calls_record(calls_build *b, const an_record *r)
{
	map_slot *s;
	uint32_t key = canon_id(b->t, r->id);

	if (b->stopped && r->kind != TRACE_EVENT)
		return 0;
	switch (r->kind) {
	case TRACE_ENTRY:
		if (!call_add(b, AN_CALL, r->id, r->tsc) ||
		    sp_grow((void **)&b->stack, &b->capstack, b->depth + 1, sizeof *b->stack) ||
		    !(s = an_map_get(&b->open, key, 0)))
			return -1;
		s->val++;
		b->stack[b->depth++] = b->n - 1;
		/* A tail jump with nothing open below it comes from a function
		 * the trace never entered (called from untraced code, e.g. a new
		 * thread's start in libc): nothing will close it, so it counts as
		 * a call of unknown length. */
		if ((b->depth == 1 && site_is_tail(b->t, r->id)) || site_no_exit(b->t, r->id))
			call_close(b, AN_END_TAIL, r->tsc);
		return 0;
	case TRACE_EXIT:
		s = an_map_find(&b->open, key, 0);
		if (!s || !s->val) {
			/* A call returning whose entry is closed: a second return
			 * of setjmp after a longjmp, say.  The function that made the
			 * call is the innermost running one: close what lies above it. */
			resync_to_caller(b, r->id, r->tsc);
			return call_add(b, AN_EXIT_ONLY, r->id, r->tsc) ? 0 : -1;
		}
		/* The innermost open call of this site, at k.  Above it: first the
		 * callees of tail jumps, which return with it; then calls left
		 * without their exit (longjmp, exception). */
		size_t k = b->depth - 1, j;

		while (canon_id(b->t, b->c[b->stack[k]].id) != key)
			k--;
		for (j = k + 1; j < b->depth && site_is_tail(b->t, b->c[b->stack[j]].id); j++)
			;
		while (b->depth > j)
			call_close(b, AN_END_UNWOUND, r->tsc);
		while (b->depth > k + 1)
			call_close(b, AN_END_TAIL, r->tsc);
		call_close(b, AN_END_EXIT, r->tsc);
		return 0;
	default:
		if (trace_event_has_key(r->id))
			return context_event(b, r);
		if (r->id == TRACE_EV_DEACTIVATE) {
			while (b->depth)
				call_close(b, AN_END_STOPPED, r->tsc);
			stacks_free(b);             /* begin again with one stack */
			b->stopped = 1;
		} else if (r->id == TRACE_EV_ACTIVATE) {
			b->stopped = 0;
		} else if (r->id == TRACE_EV_BUDGET || r->id == TRACE_EV_COUNT) {
			an_trace *t = b->t;
			an_call *c;

			if (t->nbudget >= UINT32_MAX ||
			    sp_grow((void **)&t->budget, &t->capbudget, t->nbudget + 1,
				    sizeof *t->budget) ||
			    !(c = call_add(b, AN_EVENT, r->id, r->tsc)))
				return -1;
			t->budget[t->nbudget] = r->budget;
			c->end = (uint32_t)t->nbudget++;
			return 0;
		} else if (trace_event_is_msg(r->id)) {
			an_trace *t = b->t;
			an_call *c;

			if (t->nmsgs >= UINT32_MAX ||
			    sp_grow((void **)&t->msgs, &t->capmsgs, t->nmsgs + 1, sizeof *t->msgs) ||
			    !(c = call_add(b, AN_EVENT, r->id, r->tsc)))
				return -1;
			t->msgs[t->nmsgs] = r->msg;
			c->end = (uint32_t)t->nmsgs++;
			return 0;
		} else if (r->id == TRACE_EV_VALUE && !b->stopped) {
			an_trace *t = b->t;
			an_call *c;

			if (t->nvalues >= UINT32_MAX ||
			    sp_grow((void **)&t->values, &t->capvalues, t->nvalues + 1,
				    sizeof *t->values) ||
			    !(c = call_add(b, AN_EVENT, r->id, r->tsc)))
				return -1;
			t->values[t->nvalues] = r->value;
			c->end = (uint32_t)t->nvalues++;
			c->flags = (uint16_t)(r->value_arg << 8);
			return 0;
		}
		return call_add(b, AN_EVENT, r->id, r->tsc) ? 0 : -1;
	}
}

int an_thread_calls(an_trace *t, const an_thread *th, an_call **out, size_t *n,
		    an_iter_stats *stats, sp_err *err)
{
	calls_build b = { .t = t };
	an_iter *it;
	an_record r;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (an_iter_open(t, th, &it, err) < 0)
		return -1;
	while (rc == 0 && an_iter_next(it, &r))
		rc = calls_record(&b, &r);
	if (rc == 0)
		while (b.depth)
			call_close(&b, AN_END_TRACE, an_iter_stats_get(it)->last_tsc);
	if (stats)
		*stats = *an_iter_stats_get(it);
	an_iter_close(it);
	free(b.stack);
	an_map_free(&b.open);
	stacks_free(&b);
	if (rc) {
		free(b.c);
		return sp_fail(err, "%s: out of memory building the call tree", th->path);
	}
	*out = b.c;
	*n = b.n;
	return 0;
}

