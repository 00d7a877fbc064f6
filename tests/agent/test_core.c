/*
 * test_core.c — the propagation core (agent/core/core.c) driven against a
 * fake platform: a synthetic module whose functions hold sites of every
 * kind, and platform functions that only record what the core asks.
 * Checks which sites get patched with which plan and route, what is skipped
 * and counted, the look-ahead's depth, site ids kept across a
 * re-activation, and the ids indirect-call misses hand out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static int failures;

#define CHECK(cond, ...)                                                         \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "test_core:%d: FAIL: ", __LINE__);       \
			fprintf(stderr, __VA_ARGS__);                            \
			fputc('\n', stderr);                                     \
			failures++;                                              \
		}                                                                \
	} while (0)

/* ---- the synthetic module ---- */

enum {
	F_MAIN, F_LEAF, F_TAILED, F_RUNTIME, F_DEEP, F_COLD, F_UNWIND, F_START, F_SIB, F_CALLER,
	F_SIB2, F_PLT, NFUNCS
};

#define BIAS 0x100000ull
#define S(k, m, l, c, fl) { .kind = (k), .method = (m), .len = (l), .callee = (c), \
			    .import = CA_NONE, .flags = (fl) }

/* Sites, grouped by function (first_site/nsites below). */
static ca_site sites[] = {
	/* F_MAIN: 0..9 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_LEAF, 0),          /* 0 jump, direct */
	S(CA_SITE_PLT, CA_PATCH_DIRECT, 5, F_PLT, 0),              /* 1 jump, plt */
	S(CA_SITE_INDIRECT_REG, CA_PATCH_SPRINGBOARD, 2, CA_NONE, 0), /* 2 springboard, indirect */
	S(CA_SITE_INDIRECT_MEM, CA_PATCH_TRAP, 3, CA_NONE, 0),     /* 3 trap, indirect */
	S(CA_SITE_TAIL_INDIRECT, CA_PATCH_DIRECT, 5, CA_NONE, 0),  /* 4 skipped: kind (no TAILPOS) */
	S(CA_SITE_DIRECT, CA_PATCH_RELOCATE, 2, F_DEEP, 0),        /* 5 skipped: plan (short direct) */
	S(CA_SITE_TAIL_DIRECT, CA_PATCH_SPRINGBOARD, 2, F_TAILED, CA_SITEF_COND), /* 6 springboard */
	S(CA_SITE_INDIRECT_RIP, CA_PATCH_DIRECT, 6, CA_NONE, 0),   /* 7 jump, got (import set) */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_RUNTIME, 0),       /* 8 jump, direct (runtime callee) */
	S(CA_SITE_TAIL_DIRECT, CA_PATCH_RELOCATE, 2, F_TAILED, CA_SITEF_COND), /* 9 skipped: kind */
	/* F_LEAF: 10 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_DEEP, 0),          /* 10 jump; F_DEEP not looked ahead */
	/* F_TAILED: 11 */
	S(CA_SITE_TAIL_INDIRECT, CA_PATCH_DIRECT, 5, CA_NONE, CA_SITEF_TAILPOS), /* 11 jump, indirect */
	/* F_RUNTIME: 12 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_DEEP, 0),          /* 12 never (runtime function) */
	/* F_DEEP: 13 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_LEAF, 0),          /* 13 */
	/* F_COLD: 14 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_LEAF, 0),          /* 14 jump (fragment of main) */
	/* F_UNWIND: 15..16, its platform skips it */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_LEAF, 0),
	S(CA_SITE_INDIRECT_REG, CA_PATCH_DIRECT, 5, CA_NONE, 0),
	/* F_START: 17..18, signals blocked */
	S(CA_SITE_INDIRECT_REG, CA_PATCH_TRAP, 2, CA_NONE, 0),     /* 17 skipped: plan (no trap) */
	S(CA_SITE_INDIRECT_REG, CA_PATCH_SPRINGBOARD, 2, CA_NONE, 0), /* 18 springboard */
	/* F_SIB: none; F_CALLER: 19..20 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_SIB, 0),
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_SIB2, 0),
	/* F_SIB2: 21 */
	S(CA_SITE_DIRECT, CA_PATCH_DIRECT, 5, F_DEEP, 0),
};
#define NSITES (sizeof sites / sizeof *sites)

static ca_func funcs[NFUNCS];
static uint8_t func_state[NFUNCS];
static uint32_t first_fragment[NFUNCS], next_fragment[NFUNCS];
static void *saved[NSITES];
static cp_view view;

static void module_init(void)
{
	static const struct { uint32_t first, n; } span[NFUNCS] = {
		[F_MAIN] = { 0, 10 }, [F_LEAF] = { 10, 1 }, [F_TAILED] = { 11, 1 },
		[F_RUNTIME] = { 12, 1 }, [F_DEEP] = { 13, 1 }, [F_COLD] = { 14, 1 },
		[F_UNWIND] = { 15, 2 }, [F_START] = { 17, 2 }, [F_SIB] = { 19, 0 },
		[F_CALLER] = { 19, 2 }, [F_SIB2] = { 21, 1 }, [F_PLT] = { 22, 0 },
	};

	for (uint32_t f = 0; f < NFUNCS; f++) {
		funcs[f] = (ca_func){ .addr = 0x1000 + 0x100 * f, .size = 0x100,
				      .first_site = span[f].first, .nsites = span[f].n,
				      .parent = CA_NONE };
		first_fragment[f] = next_fragment[f] = CA_NONE;
	}
	funcs[F_RUNTIME].flags = CA_FUNC_RUNTIME;
	funcs[F_PLT].flags = CA_FUNC_PLT;
	first_fragment[F_MAIN] = F_COLD;
	for (uint32_t f = 0; f < NFUNCS; f++)
		for (uint32_t i = 0; i < funcs[f].nsites; i++) {
			sites[funcs[f].first_site + i].func = f;
			sites[funcs[f].first_site + i].addr = funcs[f].addr + 0x10 * i;
		}
	sites[7].import = 1;                 /* a GOT slot (-fno-plt) */
	view = (cp_view){ .mod = &view, .index = 3, .bias = BIAS, .funcs = funcs, .nfuncs = NFUNCS,
			  .sites = sites, .func_state = func_state,
			  .first_fragment = first_fragment, .next_fragment = next_fragment,
			  .saved = saved };
}

/* ---- the fake platform: records what the core asks ---- */

typedef struct fake_saved {
	uint32_t site, id;
	enum cp_plan plan;
	enum cp_route route;
} fake_saved;

static uint32_t next_id = 1;
static cp_site_desc descs[256];
static enum cp_plan plan_of[NSITES];
static enum cp_route route_of[NSITES];
static int prepared[NSITES], reused[NSITES], applied[NSITES];
static int boards_applied, batches, reached[NFUNCS];
static bool code_changed[NSITES];

void *cp_plat_alloc(size_t n) { return calloc(1, n); }
void cp_plat_lock(volatile int *l) { CHECK(*l == 0, "lock taken twice"); *l = 1; }
void cp_plat_unlock(volatile int *l) { *l = 0; }
bool cp_plat_runtime_code(uint64_t target) { return target == 0xdead000; }
void cp_plat_reached(void *mod, uint32_t func) { (void)mod; reached[func]++; }
void cp_plat_indirect_id(uint32_t id, bool tail) { (void)id; (void)tail; }
/* An earlier run's profile: NULL (none: every candidate likely), else the
 * functions it reached. */
static const bool *profile;
bool cp_plat_likely(void *mod, uint32_t func) { (void)mod; return !profile || profile[func]; }
bool cp_plat_func_skipped(void *mod, uint32_t func) { (void)mod; return func == F_UNWIND; }
bool cp_plat_signals_blocked(void *mod, uint32_t func) { (void)mod; return func == F_START; }
bool cp_plat_code_matches(void *mod, uint32_t si) { (void)mod; return !code_changed[si]; }

uint32_t cp_plat_site_new(const cp_site_desc *d)
{
	if (next_id >= sizeof descs / sizeof *descs)
		return 0;
	descs[next_id] = *d;
	return next_id++;
}

/* Patches name their site by address: the site's, or its board's (+1). */
static uint32_t site_at(uint64_t addr)
{
	for (uint32_t i = 0; i < NSITES; i++)
		if (BIAS + sites[i].addr == (addr & ~1ull))
			return i;
	return UINT32_MAX;
}

int cp_plat_apply(cp_patch *p, size_t n)
{
	batches++;
	for (size_t i = 0; i < n; i++) {
		uint32_t si = site_at(p[i].addr);

		CHECK(si != UINT32_MAX, "patch at %#llx names no site", (unsigned long long)p[i].addr);
		if (si == UINT32_MAX)
			continue;
		if (p[i].addr & 1)
			boards_applied++;
		else
			applied[si]++;
	}
	return 0;
}

static void fill(uint32_t si, enum cp_plan plan, cp_patch *p, cp_patch *sb)
{
	memset(p, 0, sizeof *p);
	p->addr = BIAS + sites[si].addr;
	p->len = sites[si].len;
	if (plan == CP_PLAN_SPRINGBOARD) {
		memset(sb, 0, sizeof *sb);
		sb->addr = p->addr + 1;
		sb->len = 5;
	}
}

int cp_plat_prepare(void *mod, uint32_t si, enum cp_plan plan, enum cp_route route,
		    cp_patch *p, cp_patch *sb, enum cp_skip *why)
{
	fake_saved *sv;

	CHECK(mod == &view, "prepare: a foreign module handle");
	prepared[si]++;
	plan_of[si] = plan;
	route_of[si] = route;
	if (route == CP_ROUTE_DIRECT && (funcs[sites[si].callee].flags & CA_FUNC_RUNTIME)) {
		*why = CP_SKIP_RUNTIME;          /* as instrument.c's resolve() does */
		return -1;
	}
	sv = calloc(1, sizeof *sv);
	*sv = (fake_saved){ si, cp_plat_site_new(&(cp_site_desc){ .site_addr = sites[si].addr }),
			    plan, route };
	saved[si] = sv;
	fill(si, plan, p, sb);
	return plan == CP_PLAN_SPRINGBOARD;
}

int cp_plat_reuse(void *mod, uint32_t si, void *s, cp_patch *p, cp_patch *sb)
{
	fake_saved *sv = s;

	(void)mod;
	CHECK(sv->site == si, "reuse: site %u got site %u's saved state", si, sv->site);
	reused[si]++;
	fill(si, sv->plan, p, sb);
	return sv->plan == CP_PLAN_SPRINGBOARD;
}

/* Module lookup: 0x500000 + 0x100 * k is the entry of function k of another
 * traced module (index 7); anything else is in no traced module. */
void cp_plat_lookup(uint64_t target, cp_target *t)
{
	if (target >= 0x500000 && target < 0x500000 + 0x100 * 64) {
		t->mod = (void *)&descs;
		t->index = 7;
		t->func = (uint32_t)((target - 0x500000) / 0x100);
		t->named = target - 0x500000;
	}
}

/* ---- the checks ---- */

static void reset_counts(void)
{
	memset(prepared, 0, sizeof prepared);
	memset(reused, 0, sizeof reused);
	memset(applied, 0, sizeof applied);
	boards_applied = batches = 0;
}

static void test_first_activation(void)
{
	static const struct { uint32_t site; enum cp_plan plan; enum cp_route route; } want[] = {
		{ 0, CP_PLAN_JUMP, CP_ROUTE_DIRECT },
		{ 1, CP_PLAN_JUMP, CP_ROUTE_PLT },
		{ 2, CP_PLAN_SPRINGBOARD, CP_ROUTE_INDIRECT },
		{ 3, CP_PLAN_TRAP, CP_ROUTE_INDIRECT },
		{ 6, CP_PLAN_SPRINGBOARD, CP_ROUTE_DIRECT },
		{ 7, CP_PLAN_JUMP, CP_ROUTE_GOT },
		{ 10, CP_PLAN_JUMP, CP_ROUTE_DIRECT },
		{ 11, CP_PLAN_JUMP, CP_ROUTE_INDIRECT },
		{ 14, CP_PLAN_JUMP, CP_ROUTE_DIRECT },
	};
	const cp_stats *st = cp_stats_get();

	CHECK(cp_instrument(&view, F_MAIN, CA_NONE) == 0, "instrument(main) failed");
	for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
		uint32_t si = want[i].site;

		CHECK(prepared[si] == 1 && plan_of[si] == want[i].plan && route_of[si] == want[i].route,
		      "site %u: prepared %d times, plan %d route %d; want once, plan %d route %d",
		      si, prepared[si], plan_of[si], route_of[si], want[i].plan, want[i].route);
		CHECK(applied[si] == 1, "site %u: applied %d times, want 1", si, applied[si]);
	}
	CHECK(prepared[8] == 1 && applied[8] == 0, "site 8 (runtime callee): not patched");
	CHECK(!prepared[4] && !prepared[5] && !prepared[9], "sites 4, 5, 9 must be left alone");
	CHECK(boards_applied == 2, "springboards applied: %d, want 2 (sites 2, 6)", boards_applied);
	CHECK(batches == 2, "one batch (boards, then sites): %d apply calls", batches);
	CHECK(st->skipped[CP_SKIP_KIND] == 2, "skipped for kind: %llu, want 2 (sites 4, 9)",
	      (unsigned long long)st->skipped[CP_SKIP_KIND]);
	CHECK(st->skipped[CP_SKIP_PLAN] == 1, "skipped for plan: %llu, want 1 (site 5)",
	      (unsigned long long)st->skipped[CP_SKIP_PLAN]);
	CHECK(st->skipped[CP_SKIP_RUNTIME] == 1, "skipped for runtime: %llu, want 1 (site 8)",
	      (unsigned long long)st->skipped[CP_SKIP_RUNTIME]);
	/* The look-ahead: main's direct callees (depth 1) and its fragment,
	 * not their callees, nor a runtime function, nor a PLT stub. */
	CHECK(func_state[F_MAIN] && func_state[F_LEAF] && func_state[F_TAILED] && func_state[F_COLD],
	      "main, its callees and its fragment instrumented in one batch");
	CHECK(!func_state[F_DEEP] && !prepared[13], "look-ahead went deeper than 1 (F_DEEP)");
	CHECK(!func_state[F_RUNTIME] && !prepared[12], "a runtime function was instrumented");
	CHECK(!func_state[F_PLT], "a PLT stub was instrumented");
}

static void test_policy(void)
{
	const cp_stats *st = cp_stats_get();
	uint64_t plan0 = st->skipped[CP_SKIP_PLAN], changed0 = st->skipped[CP_SKIP_CHANGED];

	reset_counts();
	cp_instrument(&view, F_UNWIND, CA_NONE);
	CHECK(!prepared[15] && !prepared[16], "a function the platform skips: no site prepared");
	CHECK(st->skipped[CP_SKIP_PLAN] == plan0 + 2, "its 2 sites counted as skipped for plan");
	CHECK(func_state[F_UNWIND], "a skipped function is still marked instrumented");
	cp_instrument(&view, F_START, CA_NONE);
	CHECK(!prepared[17], "signals blocked: an indirect call's trap must not be planned");
	CHECK(prepared[18] && plan_of[18] == CP_PLAN_SPRINGBOARD,
	      "signals blocked: a springboard is still fine");
	CHECK(st->skipped[CP_SKIP_PLAN] == plan0 + 3, "site 17 counted as skipped for plan");
	code_changed[21] = true;
	cp_instrument(&view, F_SIB2, CA_NONE);
	CHECK(!prepared[21] && st->skipped[CP_SKIP_CHANGED] == changed0 + 1,
	      "a site whose bytes changed: left alone and counted");
	code_changed[21] = false;
	CHECK(func_state[F_DEEP], "F_SIB2's callee looked ahead (depth 0)");
	func_state[F_SIB2] = func_state[F_DEEP] = 0;      /* for test_siblings */
}

static void test_siblings(void)
{
	reset_counts();
	/* F_SIB reached from a call in F_CALLER: F_CALLER's other callee
	 * (F_SIB2) joins the batch, at depth 1 (F_DEEP stays out). */
	cp_instrument(&view, F_SIB, F_CALLER);
	CHECK(func_state[F_SIB] && func_state[F_SIB2], "the caller's other callee joins the batch");
	CHECK(prepared[21] == 1, "site 21 (F_SIB2's) prepared once");
	CHECK(!func_state[F_CALLER], "the caller itself is not instrumented");
	CHECK(!func_state[F_DEEP], "a sibling's callees are not looked ahead");
}

/* With a profile, a look-ahead candidate no earlier run reached stays out
 * (F_TAILED, F_SIB2); the function reached and its fragment are in whatever
 * the profile says; one left out is instrumented when it is reached. */
static void test_profile(void)
{
	static bool reached_before[NFUNCS] = { [F_LEAF] = true };
	static fake_saved caller_site;
	uint8_t keep[NFUNCS];

	memcpy(keep, func_state, sizeof keep);
	memset(func_state, 0, sizeof func_state);
	reset_counts();
	profile = reached_before;
	cp_instrument(&view, F_MAIN, CA_NONE);
	CHECK(func_state[F_MAIN] && func_state[F_COLD], "main and its fragment instrumented");
	CHECK(func_state[F_LEAF] && prepared[10] + reused[10] == 1,
	      "a callee the profile lists joins the batch");
	CHECK(!func_state[F_TAILED] && !prepared[11] && !reused[11],
	      "a callee the profile lacks joined the batch");
	/* The caller's site of F_SIB2 left alone: no slow path would catch
	 * F_SIB2, it joins whatever the profile says. */
	cp_instrument(&view, F_SIB, F_CALLER);
	CHECK(func_state[F_SIB] && func_state[F_SIB2],
	      "a sibling behind a site left alone stayed out of the batch");
	func_state[F_SIB] = func_state[F_SIB2] = 0;
	/* Patched (the caller instrumented): F_SIB2 only if the profile has it. */
	saved[20] = &caller_site;
	cp_instrument(&view, F_SIB, F_CALLER);
	saved[20] = NULL;
	CHECK(func_state[F_SIB] && !func_state[F_SIB2],
	      "a sibling the profile lacks joined the batch");
	cp_instrument(&view, F_TAILED, F_MAIN);
	CHECK(func_state[F_TAILED], "a function the profile lacks: instrumented when reached");
	profile = NULL;
	memcpy(func_state, keep, sizeof keep);
}

static void test_reactivation(void)
{
	uint32_t ids[NSITES], before = next_id;

	for (uint32_t i = 0; i < NSITES; i++)
		ids[i] = saved[i] ? ((fake_saved *)saved[i])->id : 0;
	for (uint32_t i = 0; i < NSITES; i++)
		for (uint32_t j = i + 1; j < NSITES; j++)
			CHECK(!ids[i] || ids[i] != ids[j], "sites %u and %u share id %u", i, j, ids[i]);
	/* A stop: the platform forgets the states, keeps what it made. */
	memset(func_state, 0, sizeof func_state);
	reset_counts();
	cp_instrument(&view, F_MAIN, CA_NONE);
	for (uint32_t i = 0; i < NSITES; i++) {
		CHECK(i == 8 || !prepared[i], "site %u prepared again on re-activation", i);
		CHECK(!saved[i] || !(i == 0 || i == 2 || i == 7) || reused[i] == 1,
		      "site %u: its saved patch not reused", i);
		CHECK(!saved[i] || ((fake_saved *)saved[i])->id == ids[i], "site %u changed id", i);
	}
	CHECK(prepared[8] == 1, "site 8 (left alone) not tried again");
	CHECK(applied[0] == 1 && applied[2] == 1 && boards_applied == 2,
	      "re-activation applies the same patches");
	CHECK(next_id == before, "re-activation took %u new ids", next_id - before);
}

static void test_indirect(void)
{
	cp_indirect_cache cache = { 0 };
	cp_indirect_site is = { .mod = &view, .site = 2, .cache = &cache };
	cp_indirect_site tail = { .mod = &view, .site = 11, .cache = &cache };
	const cp_stats *st = cp_stats_get();
	uint32_t ids[10], first = next_id;

	memset(reached, 0, sizeof reached);
	/* Ten callees in a traced module: eight ids kept on the site, then
	 * the pair table. */
	for (int k = 0; k < 10; k++) {
		uint64_t target = 0x500000 + 0x100 * (uint64_t)k;

		CHECK(cp_indirect_miss(&view, &is, target) == 1, "miss %d: answer", k);
		CHECK(cache.target == target, "miss %d: the cache names its target", k);
		ids[k] = (uint32_t)(cache.entry_word >> 2);
		CHECK((cache.entry_word & 3) == CP_WORD_ENTRY && cache.exit_word == ((uint64_t)ids[k] << 2 | CP_WORD_EXIT),
		      "miss %d: cache words", k);
		CHECK(reached[k] == 1, "miss %d: callee function %d not instrumented", k, k);
		CHECK(descs[ids[k]].callee_module == 7 && descs[ids[k]].callee_func == 0x100u * k &&
		      descs[ids[k]].caller_module == 3 && descs[ids[k]].site_addr == sites[2].addr,
		      "miss %d: the pair's description", k);
		for (int j = 0; j < k; j++)
			CHECK(ids[j] != ids[k], "misses %d and %d share id %u", j, k, ids[k]);
	}
	CHECK(next_id == first + 10, "ten pairs, ten ids (got %u)", next_id - first);
	CHECK(st->pairs == 2, "pairs beyond the site's eight: %llu, want 2",
	      (unsigned long long)st->pairs);
	/* The same callees again: the same ids, no new description. */
	for (int k = 9; k >= 0; k--) {
		cp_indirect_miss(&view, &is, 0x500000 + 0x100 * (uint64_t)k);
		CHECK((uint32_t)(cache.entry_word >> 2) == ids[k], "callee %d again: a new id", k);
	}
	CHECK(next_id == first + 10, "repeated misses took %u new ids", next_id - first - 10);
	/* An unknown callee: an id, callee module unknown, nothing instrumented. */
	CHECK(cp_indirect_miss(&view, &is, 0x900000) == 1 &&
	      descs[cache.entry_word >> 2].callee_module == UINT32_MAX &&
	      descs[cache.entry_word >> 2].callee_func == 0x900000, "an unknown callee's pair");
	/* Runtime-managed code: answer 2, untraced, no id. */
	cache.target = 0;
	CHECK(cp_indirect_miss(&view, &is, 0xdead000) == 2 && cache.untraced == 0xdead000 &&
	      cache.target == 0 && st->untraced == 1, "a runtime target goes untraced");
	/* A "tail jump" within its own function: no record. */
	CHECK(cp_indirect_miss(&view, &tail, BIAS + funcs[F_TAILED].addr + 8) == 1 &&
	      cache.entry_word == 0 && st->tail_internal == 1, "a jump within F records nothing");
	CHECK(is.lock == 0 && tail.lock == 0, "a site's lock left taken");
}

int main(void)
{
	module_init();
	test_first_activation();
	test_policy();
	test_siblings();
	test_profile();
	test_reactivation();
	test_indirect();
	if (failures) {
		fprintf(stderr, "test_core: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_core: all checks passed\n");
	return 0;
}
