/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * core.h — the agent's propagation core and the platform interface it runs on.
 *
 * The core (core.c) decides; a platform acts.  Like Redis's ae.c, which never
 * calls epoll but a handful of aeApi* functions that ae_epoll.c provides, the
 * core never touches memory it did not get from its platform, never encodes
 * an instruction, and never asks the C library anything: it is built
 * freestanding (stddef, stdint, stdbool only; meson target sptrace-core-
 * freestanding, test core-symbols), so that the user-space agent
 * (agent/instrument.c) and the kernel module can share it.
 *
 * What the core decides, for a function F reached for the first time:
 *   - which of F's sites are patched and with which plan (cp_site_plan):
 *     a 5-byte jump on the site, a 2-byte jump to a springboard, or an int3
 *     (or a relocated window) for an indirect call with no room, and which
 *     are skipped and why (cp_stats);
 *   - how a site finds its callee (cp_site_route): the callee named by the
 *     analysis, the GOT slot behind a PLT stub, the site's own GOT slot
 *     (-fno-plt), or a per-site cache filled at run time (indirect calls);
 *   - the look-ahead: F's direct callees and, when F was reached from a call
 *     in C, C's other direct callees join F's batch (cp_instrument) -- those
 *     an earlier run reached, when the platform has a profile of the module
 *     (cp_plat_likely);
 *   - site ids: a site keeps its patch, and so its id, across activations
 *     (the platform keeps what it made, cp_view.saved; the core reuses it);
 *     an indirect site's (site, callee) pairs get ids as calls miss its
 *     cache: eight per site, then one shared table (cp_indirect_miss).
 *
 * Its names are prefixed cp_ (the agent's are ag_): the kernel module, which
 * shares it, has its own (spk_).
 *
 * The core holds no lock of its own but the pair table's: cp_instrument
 * runs under the platform's instrument lock, cp_indirect_miss under the
 * indirect site's (taken through cp_plat_lock).
 */
#ifndef SPTRACE_CORE_H
#define SPTRACE_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ca_records.h"

/* ---- what the core and its platform exchange ---- */

/* One code patch: `len` bytes at `addr`, from `old` to `new`.  A thread that
 * meets the patch while it is being written goes to `redirect` (the
 * int3-first protocol is the platform's, agent/patch.c). */
typedef struct cp_patch {
	uint64_t addr;
	uint8_t len;
	uint8_t old[16], new[16];
	uint64_t redirect;
	/* A springboard: its old bytes are dead padding, no code a thread may
	 * run, so one that traps there while it is undone goes on to redirect
	 * (the area), never back to addr (the platform's undo). */
	uint8_t board;
} cp_patch;

/* A module as the core sees it: the analysis' records and the platform's
 * per-function and per-site state.  Built by the platform for each call. */
typedef struct cp_view {
	void *mod;                     /* the platform's handle, passed back */
	uint32_t index;                /* the module's number in the trace */
	uint64_t bias;                 /* run-time address = link-time + bias */
	const ca_func *funcs;
	uint32_t nfuncs;
	const ca_site *sites;
	uint8_t *func_state;           /* per function: CP_FUNC_* */
	/* a function's .cold/.part fragments: first, then next; CA_NONE ends
	 * (NULL: unknown) */
	const uint32_t *first_fragment, *next_fragment;
	void **saved;                  /* per site: what the platform made, or NULL */
} cp_view;

enum { CP_FUNC_INSTRUMENTED = 1 };

/* How a site is patched. */
enum cp_plan {
	CP_PLAN_NONE = 0,        /* left alone (counted: skipped_plan) */
	CP_PLAN_JUMP,            /* jmp rel32 over the site (>= 5 bytes) */
	CP_PLAN_SPRINGBOARD,     /* 2-byte jump to a 5-byte jump in dead padding */
	CP_PLAN_TRAP,            /* indirect call with no room: int3, or a
	                          * relocated window when the platform can */
};

/* How a site's area finds the callee. */
enum cp_route {
	CP_ROUTE_NONE = 0,       /* not known before the call (unresolved) */
	CP_ROUTE_DIRECT,         /* the function the analysis names */
	CP_ROUTE_PLT,            /* the GOT slot its PLT stub jumps through */
	CP_ROUTE_GOT,            /* the site's own GOT slot (-fno-plt) */
	CP_ROUTE_INDIRECT,       /* known at run time: the site's cache */
};

/* Why a site was left alone. */
enum cp_skip {
	CP_SKIP_NONE = 0,
	CP_SKIP_KIND,            /* a kind never patched (computed goto...) */
	CP_SKIP_PLAN,            /* no plan for it here (or a retired trap) */
	CP_SKIP_UNRESOLVED,      /* callee unknown (not bound, not traced) */
	CP_SKIP_RUNTIME,         /* calls into runtime-managed code */
	CP_SKIP_CHANGED,         /* its bytes are not those the analysis saw */
	CP_SKIP_MAX
};

typedef struct cp_stats {
	uint64_t skipped[CP_SKIP_MAX];
	uint64_t tail_internal;  /* indirect "tail jumps" within their function */
	uint64_t untraced;       /* indirect calls that met runtime-managed code */
	uint64_t pairs;          /* (indirect site, callee) ids beyond a site's eight */
} cp_stats;

/* A trace site's description (the platform writes it: trace_format.h's
 * trace_site, or the kernel's equivalent). */
typedef struct cp_site_desc {
	uint32_t caller_module, callee_module;  /* callee UINT32_MAX: unknown */
	uint64_t site_addr, caller_func, callee_func;   /* link-time */
	uint32_t kind;           /* enum ca_site_kind */
	uint32_t flags;          /* TRACE_SITE_* */
} cp_site_desc;

/* The record kinds of a cache's words (trace_format.h's TRACE_ENTRY/EXIT). */
enum { CP_WORD_ENTRY = 0, CP_WORD_EXIT = 1 };

/* An indirect site's cache: the area reads it (x86_64/tramp.S, emit.c). */
typedef struct cp_indirect_cache {
	uint64_t target;         /* last callee seen */
	uint64_t entry_word;     /* (id << 2) | ENTRY for it (0: no record) */
	uint64_t exit_word;      /* (id << 2) | EXIT */
	uint64_t untraced;       /* last callee seen in runtime-managed code: called
	                          * untraced, with the caller's return address */
} cp_indirect_cache;

/* What the indirect slow path needs about the site. */
typedef struct cp_indirect_site {
	void *mod;               /* caller's module (the platform's handle) */
	uint32_t site;           /* index in its ca sites */
	cp_indirect_cache *cache;
	uint32_t known_ids[8];   /* ids already handed out for this site ... */
	uint64_t known_targets[8]; /* ... and their targets */
	volatile int lock;
	struct cp_indirect_site *next; /* all of them (a forked child frees their locks) */
} cp_indirect_site;

/* A call target, as the platform's module lookup found it. */
typedef struct cp_target {
	void *mod;               /* NULL: in no traced module */
	uint32_t index;          /* its module's number */
	uint32_t func;           /* CA_NONE: not a function's entry */
	uint64_t named;          /* link-time address it is named by */
} cp_target;

/* ---- the core (core.c) ---- */

/* The plan for site s of function `func` (signals_blocked: the platform's
 * policy says its code runs with every signal blocked, so no trap). */
enum cp_plan cp_site_plan(const ca_site *s, bool signals_blocked);
enum cp_route cp_site_route(const cp_view *m, const ca_site *s);
/* Instrument func (and its look-ahead) of m: caller, of the same module, is
 * the function whose call reached it (CA_NONE: none).  Under the platform's
 * instrument lock; publishes CP_FUNC_INSTRUMENTED last.  0, or -1 if some
 * batch could not be applied. */
int cp_instrument(const cp_view *m, uint32_t func, uint32_t caller);
/* A call through indirect site `is` of m to a target its cache lacks: 1 (the
 * cache now names target; entry_word 0: no record), 2 (runtime-managed
 * code: cache->untraced, the area calls it untraced). */
uint64_t cp_indirect_miss(const cp_view *m, cp_indirect_site *is, uint64_t target);
const cp_stats *cp_stats_get(void);
void cp_after_fork(void);        /* a forked child: the pair table's lock */

/* ---- the platform interface: each platform defines every one ---- */

void *cp_plat_alloc(size_t n);                 /* zeroed, never freed; NULL: none */
void cp_plat_lock(volatile int *l);            /* a spin lock, also from a slow path */
void cp_plat_unlock(volatile int *l);
/* Apply a batch of patches (live, other threads running). 0 or -1. */
int cp_plat_apply(cp_patch *p, size_t n);
/* A new site id, its description written before any record names it; 0: none. */
uint32_t cp_plat_site_new(const cp_site_desc *d);
/* Policy: a function none of whose sites is patched (one that reads its own
 * frame, one that runs at a thread's end); one whose code runs with every
 * signal blocked (no trap there). */
bool cp_plat_func_skipped(void *mod, uint32_t func);
bool cp_plat_signals_blocked(void *mod, uint32_t func);
/* Site si still holds the bytes the analysis saw (else it is left alone). */
bool cp_plat_code_matches(void *mod, uint32_t si);
/* Build site si's area in the code pool and fill its patch (*p) and, for a
 * springboard, the springboard's (*sb); keep what it made in saved[si].
 * Returns 0, 1 (with *sb), or -1 with *why. */
int cp_plat_prepare(void *mod, uint32_t si, enum cp_plan plan, enum cp_route route,
		    cp_patch *p, cp_patch *sb, enum cp_skip *why);
/* Site si patched in an earlier activation (saved[si]): its same patches
 * again.  0, 1 (with *sb), -1 (not any more: a retired trap...). */
int cp_plat_reuse(void *mod, uint32_t si, void *saved, cp_patch *p, cp_patch *sb);
/* Module lookup: the function whose entry is `target` (run-time). */
void cp_plat_lookup(uint64_t target, cp_target *t);
bool cp_plat_runtime_code(uint64_t target);    /* code a language runtime manages */
/* A function reached through an indirect call: instrument it (the platform
 * takes its lock, waits for what it must, calls cp_instrument). */
void cp_plat_reached(void *mod, uint32_t func);
/* May function func of mod join a look-ahead batch?  True unless the
 * platform knows the module's functions earlier runs reached and func is
 * not one of them (a heuristic only: a function left out is instrumented
 * when it is reached, like any other). */
bool cp_plat_likely(void *mod, uint32_t func);
/* An id indirect calls (tail: indirect tail jumps) record now. */
void cp_plat_indirect_id(uint32_t id, bool tail);
/* GCC and clang may emit calls to these even freestanding (struct copies).
 * The kernel module has its own (<linux/string.h>, macros under
 * FORTIFY_SOURCE: declaring them again would expand them). */
#ifndef __KERNEL__
void *memcpy(void *d, const void *s, size_t n);
void *memset(void *d, int c, size_t n);
#endif

#endif
