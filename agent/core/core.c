// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * core.c — the propagation core: which sites of a reached function are
 * patched and how, the look-ahead batch, site ids across activations, and
 * the ids of indirect calls' (site, callee) pairs.  Freestanding: everything
 * it does to the world goes through core.h's cp_plat_* functions.
 *
 * Sites patched:
 *   direct calls and tail jumps to a function of the same module;
 *   calls and tail jumps through the PLT, and calls through a GOT slot
 *   (-fno-plt): the slot already holds the callee, which may live in another
 *   module -- that is how tracing crosses into shared libraries;
 *   indirect calls through registers or memory (a per-site cache);
 *   with a 5-byte patch, a springboard in dead padding or (indirect calls
 *   only) a relocated window or, last, an int3 on the call;
 *   indirect tail jumps where the analysis saw the frame torn down.
 * Not: other indirect jumps (a computed goto may keep r11, the flags or the
 * red zone live); conditional tail jumps that need more than a jump; short
 * direct calls (a trap per call would cost more than the call tells).
 * Nor anything of code a language runtime manages (CA_FUNC_RUNTIME): its
 * functions are never instrumented.
 */
#include "core.h"

static cp_stats stats;

const cp_stats *cp_stats_get(void)
{
	return &stats;
}

static bool runtime_func(const cp_view *m, uint32_t f)
{
	return m->funcs[f].flags & CA_FUNC_RUNTIME;
}

static bool is_indirect(const ca_site *s)
{
	return s->kind == CA_SITE_INDIRECT_REG || s->kind == CA_SITE_INDIRECT_MEM ||
	       (s->kind == CA_SITE_INDIRECT_RIP && s->import == CA_NONE) ||
	       s->kind == CA_SITE_TAIL_INDIRECT;
}

static bool patchable(const ca_site *s)
{
	switch (s->kind) {
	case CA_SITE_DIRECT:
	case CA_SITE_PLT:
	case CA_SITE_INDIRECT_RIP:
	case CA_SITE_INDIRECT_REG:
	case CA_SITE_INDIRECT_MEM:
		return true;
	case CA_SITE_TAIL_INDIRECT:
		/* Only where the frame is torn down (the analysis read the CFA):
		 * an unresolved computed goto inside a function with a frame looks
		 * the same, and there the red zone, r11 and the flags may be live. */
		return s->flags & CA_SITEF_TAILPOS;
	case CA_SITE_TAIL_DIRECT:
		return !(s->flags & CA_SITEF_COND) || s->method == CA_PATCH_DIRECT ||
		       s->method == CA_PATCH_SPRINGBOARD;
	default:
		return false;
	}
}

enum cp_plan cp_site_plan(const ca_site *s, bool signals_blocked)
{
	if (s->method == CA_PATCH_DIRECT && s->len >= 5)
		return CP_PLAN_JUMP;
	if (s->method == CA_PATCH_SPRINGBOARD && (s->kind == CA_SITE_TAIL_DIRECT || is_indirect(s)))
		return CP_PLAN_SPRINGBOARD;
	/* A trap met where every signal is blocked kills the process; a
	 * relocated window's int3 comes first too. */
	if ((s->method == CA_PATCH_RELOCATE || s->method == CA_PATCH_TRAP) && is_indirect(s) &&
	    !signals_blocked)
		return CP_PLAN_TRAP;
	return CP_PLAN_NONE;
}

enum cp_route cp_site_route(const cp_view *m, const ca_site *s)
{
	if (s->kind == CA_SITE_PLT || (s->kind == CA_SITE_TAIL_DIRECT && s->callee != CA_NONE &&
				       (m->funcs[s->callee].flags & CA_FUNC_PLT)))
		return CP_ROUTE_PLT;
	if (s->kind == CA_SITE_INDIRECT_RIP && s->import != CA_NONE)
		return CP_ROUTE_GOT;
	if (is_indirect(s))
		return CP_ROUTE_INDIRECT;
	if ((s->kind == CA_SITE_DIRECT || s->kind == CA_SITE_TAIL_DIRECT) && s->callee != CA_NONE)
		return CP_ROUTE_DIRECT;
	return CP_ROUTE_NONE;
}

/*
 * The look-ahead: F's direct callees in the same module, and when F was
 * reached from a call in C, C's other direct callees (the calls C makes
 * next), join the batch -- with the .cold/.part fragments of all of them,
 * which are their code too.  The cost of a batch is mostly fixed (three
 * writes of code and three core serialisations in user space), so reaching
 * those functions then costs nothing more; functions reached through them
 * start the next batch (depth 1 adds no callees of its own).
 *
 * A candidate joins only if cp_plat_likely says an earlier run reached it:
 * in a compiler most of a function's callees are never called in a given
 * run (cc1: 135,000 sites instrumented with the look-ahead, 68,000
 * without), while in python3 most are (the look-ahead saves a batch per
 * function there).  Without a profile every candidate is likely.  The
 * fragments of a function in the batch are its code: always in.  So is a
 * callee whose site in F (or in C) is left alone: reached through it, it
 * takes no slow path, and only the look-ahead instruments it -- the trace
 * must not depend on the profile.
 */
#define LOOKAHEAD_MAX 1024
#define SEEN_SLOTS 4096                 /* a power of two, > 2 * LOOKAHEAD_MAX */

typedef struct todo {
	uint32_t func[LOOKAHEAD_MAX];
	uint8_t depth[LOOKAHEAD_MAX];
	uint32_t n;
	uint64_t seen[SEEN_SLOTS];      /* (round << 32) | (func + 1): already listed */
	uint64_t round;
} todo;

/* Under the platform's instrument lock, so static. */
static todo work;
static cp_patch batch[1024], boards[1024];
static size_t nb, nsb;

static void todo_add(todo *t, const cp_view *m, uint32_t f, uint8_t depth)
{
	uint64_t key = t->round << 32 | (uint64_t)(f + 1);
	size_t h = (f * 2654435761u) & (SEEN_SLOTS - 1);

	if (t->n >= LOOKAHEAD_MAX || (m->func_state[f] & CP_FUNC_INSTRUMENTED) ||
	    runtime_func(m, f))
		return;
	while ((t->seen[h] >> 32) == t->round) {
		if (t->seen[h] == key)
			return;
		h = (h + 1) & (SEEN_SLOTS - 1);
	}
	t->seen[h] = key;
	t->func[t->n] = f;
	t->depth[t->n++] = depth;
}

/* A direct callee in the same module (not a PLT stub): look-ahead material. */
static bool local_callee(const cp_view *m, const ca_site *s)
{
	return (s->kind == CA_SITE_DIRECT || s->kind == CA_SITE_TAIL_DIRECT) &&
	       s->callee != CA_NONE && !(m->funcs[s->callee].flags & CA_FUNC_PLT);
}

/* Publish a batch: springboards first (a site may jump to one only once it
 * is whole), then the sites. */
static int flush(void)
{
	int rc = 0;

	if (nb)
		rc = cp_plat_apply(boards, nsb) || cp_plat_apply(batch, nb);
	nb = nsb = 0;
	return rc;
}

static int add_sites(const cp_view *m, uint32_t func, todo *t, uint8_t depth)
{
	const ca_func *fn = &m->funcs[func];
	int rc = 0;

	if (m->first_fragment)
		for (uint32_t c = m->first_fragment[func]; c != CA_NONE; c = m->next_fragment[c])
			todo_add(t, m, c, depth);
	if (cp_plat_func_skipped(m->mod, func)) {
		stats.skipped[CP_SKIP_PLAN] += fn->nsites;
		return 0;
	}
	for (uint32_t i = 0; i < fn->nsites; i++) {
		uint32_t si = fn->first_site + i;
		const ca_site *s = &m->sites[si];
		enum cp_skip why = CP_SKIP_NONE;
		enum cp_plan plan;
		void *saved;
		int r;

		if (!patchable(s)) {
			stats.skipped[CP_SKIP_KIND]++;
			continue;
		}
		plan = cp_site_plan(s, (s->method == CA_PATCH_RELOCATE ||
					s->method == CA_PATCH_TRAP) &&
				    cp_plat_signals_blocked(m->mod, func));
		if (plan == CP_PLAN_NONE) {
			stats.skipped[CP_SKIP_PLAN]++;
			continue;
		}
		saved = m->saved ? m->saved[si] : NULL;
		if (saved) {
			/* Patched in an earlier activation: the same area (and id). */
			r = cp_plat_reuse(m->mod, si, saved, &batch[nb], &boards[nsb]);
			if (r < 0)
				why = CP_SKIP_PLAN;     /* a window not used any more, a hot trap */
		} else if (!cp_plat_code_matches(m->mod, si)) {
			r = -1;
			why = CP_SKIP_CHANGED;
		} else {
			r = cp_plat_prepare(m->mod, si, plan, cp_site_route(m, s), &batch[nb],
					    &boards[nsb], &why);
		}
		if (r >= 0) {
			nb++;
			nsb += r == 1;
		} else if (why != CP_SKIP_NONE) {
			stats.skipped[why]++;
		}
		/* A callee this site will not reach through a slow path (the site
		 * is left alone) joins whatever the profile says. */
		if (depth == 0 && local_callee(m, s) && (r < 0 || cp_plat_likely(m->mod, s->callee)))
			todo_add(t, m, s->callee, 1);
		if (nb == sizeof batch / sizeof *batch)
			rc |= flush();
	}
	return rc;
}

int cp_instrument(const cp_view *m, uint32_t func, uint32_t caller)
{
	todo *t = &work;
	int rc = 0;

	if (func >= m->nfuncs || runtime_func(m, func))
		return -1;
	nb = nsb = 0;
	t->n = 0;
	t->round++;
	todo_add(t, m, func, 0);
	if (caller != CA_NONE && caller < m->nfuncs) {
		const ca_func *c = &m->funcs[caller];

		for (uint32_t i = 0; i < c->nsites; i++) {
			const ca_site *s = &m->sites[c->first_site + i];

			/* (One of C's sites left alone: no slow path there.) */
			if (local_callee(m, s) &&
			    (!m->saved || !m->saved[c->first_site + i] || cp_plat_likely(m->mod, s->callee)))
				todo_add(t, m, s->callee, 1);
		}
	}
	for (uint32_t k = 0; k < t->n; k++)
		rc |= add_sites(m, t->func[k], t, t->depth[k]);
	rc |= flush();
	/* Published last: areas that test these flags now go straight on. */
	for (uint32_t k = 0; k < t->n; k++)
		__atomic_store_n(&m->func_state[t->func[k]], CP_FUNC_INSTRUMENTED, __ATOMIC_RELEASE);
	return rc;
}

/*
 * Ids of (indirect site, callee) pairs beyond a site's first eight, in one
 * table for all sites: a megamorphic site (a dispatch over many types)
 * must not take a new id -- and a site description -- at every miss.  Under
 * its own lock (a miss holds only its site's lock).  Full at three
 * quarters: a pair then takes a fresh id each time.
 */
#define PAIR_SLOTS (1u << 16)                 /* a power of two */

typedef struct pair {
	const cp_indirect_site *is;
	uint64_t target;
	uint32_t id;
} pair;

static pair *pairs;
static uint32_t npairs;
static volatile int pair_lock;

void cp_after_fork(void)
{
	pair_lock = 0;
}

static size_t pair_hash(const cp_indirect_site *is, uint64_t target)
{
	return (size_t)((((uint64_t)(uintptr_t)is ^ target) * 0x9e3779b97f4a7c15ull) >> 48) &
	       (PAIR_SLOTS - 1);
}

/* The pair's id, else a new one; 0 if none can be had. */
static uint32_t pair_id(const cp_indirect_site *is, uint64_t target, const cp_site_desc *d)
{
	uint32_t id = 0;
	size_t h = pair_hash(is, target);

	cp_plat_lock(&pair_lock);
	if (!pairs)
		pairs = cp_plat_alloc(PAIR_SLOTS * sizeof *pairs);
	if (pairs) {
		while (pairs[h].is && !(pairs[h].is == is && pairs[h].target == target))
			h = (h + 1) & (PAIR_SLOTS - 1);
		if (pairs[h].is) {
			id = pairs[h].id;
		} else {
			id = cp_plat_site_new(d);
			if (id && npairs < PAIR_SLOTS / 4 * 3) {
				pairs[h] = (pair){ is, target, id };
				npairs++;
				stats.pairs++;
			}
		}
	}
	cp_plat_unlock(&pair_lock);
	return id;
}

/*
 * A callee reached through an indirect site for the first time (or after
 * another one): instrument it if it is a function of a traced module, give
 * the (site, callee) pair a site id, and point the site's cache at it.
 */
uint64_t cp_indirect_miss(const cp_view *m, cp_indirect_site *is, uint64_t target)
{
	const ca_site *s = &m->sites[is->site];
	const ca_func *caller = &m->funcs[s->func];
	uint32_t id = 0;
	size_t k;

	cp_plat_lock(&is->lock);
	if (s->kind == CA_SITE_TAIL_INDIRECT && target >= m->bias + caller->addr &&
	    target < m->bias + caller->addr + caller->size) {
		/* A jump within F (computed goto): not a call, no record. */
		__atomic_add_fetch(&stats.tail_internal, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->entry_word, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->target, target, __ATOMIC_RELEASE);
		cp_plat_unlock(&is->lock);
		return 1;
	}
	if (cp_plat_runtime_code(target)) {
		/* Into runtime-managed code: no record, and the area calls it
		 * with the caller's return address (answer 2). */
		__atomic_add_fetch(&stats.untraced, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->untraced, target, __ATOMIC_RELEASE);
		cp_plat_unlock(&is->lock);
		return 2;
	}
	for (k = 0; k < 8 && is->known_ids[k]; k++)
		if (is->known_targets[k] == target) {
			id = is->known_ids[k];
			break;
		}
	if (!id) {
		cp_target t = { .func = CA_NONE };
		cp_site_desc d = { .caller_module = m->index, .callee_module = UINT32_MAX,
				   .site_addr = s->addr, .caller_func = caller->addr,
				   .callee_func = target, .kind = s->kind };

		cp_plat_lookup(target, &t);
		if (t.mod && t.func != CA_NONE) {
			d.callee_module = t.index;
			d.callee_func = t.named;
			cp_plat_reached(t.mod, t.func);
		}
		id = k < 8 ? cp_plat_site_new(&d) : pair_id(is, target, &d);
		if (id && k < 8) {
			is->known_targets[k] = target;
			is->known_ids[k] = id;
		}
	}
	if (id) {
		cp_plat_indirect_id(id, s->kind == CA_SITE_TAIL_INDIRECT);
		/* Words first, target last: a reader that sees the new target
		 * mostly sees its words too (see emit.c for why a race is harmless). */
		__atomic_store_n(&is->cache->entry_word, ((uint64_t)id << 2) | CP_WORD_ENTRY,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->exit_word, ((uint64_t)id << 2) | CP_WORD_EXIT,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->target, target, __ATOMIC_RELEASE);
	}
	cp_plat_unlock(&is->lock);
	return 1;
}
