/*
 * instrument.c — the user-space platform of the propagation core
 * (agent/core/core.h): the core decides which sites of a reached function
 * are patched and how; this file gives each such site its patch area (in
 * its module's pool, x86_64/emit.c), its patch (x86_64/sites.c) and its
 * trace site id, described in the sites file (trace_format.h) before any
 * record can name it.  It also holds the glibc policy the core asks about
 * (functions that read their own frame, run at a thread's end or with every
 * signal blocked, find their caller from the return address), the callee
 * lookup through GOT slots and the agent's interposers, the join
 * directives, and what is kept across activations.
 *
 * Calls through a GOT slot (PLT, -fno-plt): the slot already holds the
 * callee (the agent runs programs with LD_BIND_NOW), which may live in
 * another module -- that is how tracing crosses into shared libraries.
 * Indirect calls get a per-site cache (emit.c); short ones a springboard,
 * a relocated window (relocate.c) or, last, an int3 on the call (a signal
 * per call; put back once hot).
 *
 * Code a language runtime manages (CA_FUNC_RUNTIME: Go's text, V8's
 * builtins), whose stack walks read return addresses, is never
 * instrumented, and a call into it is not traced -- a direct or PLT site is
 * left alone, an indirect site's area calls such a target with the
 * caller's own return address on the stack (emit.c).  The C functions such
 * a runtime calls (CA_FUNC_RUNTIME_ENTRY) are reached by nothing traced:
 * they are instrumented at each activation instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

static volatile int sites_fd = -1;
static char sites_path[4200];
/* The next free site id.  It lives in shared memory (the first record of
 * the sites file, which no id uses) so that a forked child and its parent,
 * both writing into the same trace, never hand out the same id. */
static volatile uint32_t *next_site;
static volatile int instr_lock;
static uint64_t deferred;        /* instrumentations put off: threads being started */
static ag_indirect_site *indirect_sites;

/*
 * What a site got the first time, kept for the next activation: the agent
 * can be stopped and activated again any number of times, and each site
 * keeps its one area (and site id) -- re-patching puts back the same jump.
 * Deactivation zeroes what says "the callee is instrumented" (the function
 * states, the flag bytes of cross-module sites, the indirect sites' caches)
 * so that propagation starts afresh.
 */
typedef struct site_saved {
	ag_patch p;
	bool has_sb;
	uint8_t *flag;               /* the area's callee flag, if its own byte */
	ag_indirect_cache *cache;    /* an indirect site's cache */
	ag_reloc *reloc;             /* a relocated window: its jump, for later */
	struct site_saved *next;     /* every saved site, for the reset */
	/* Last, and allocated only when has_sb: most sites have no second
	 * patch, and one of these per instrumented site is arena memory that
	 * every fork copies page by page (bench/START.md). */
	ag_patch sb;
} site_saved;

static site_saved *all_saved;
/* What prepare() made besides the patch, for save_site (under the lock). */
static uint8_t *saved_flag;
static ag_indirect_cache *saved_cache;
static ag_reloc *saved_reloc;

/*
 * The sites file is mapped whole (address space for every possible id) and
 * grown in chunks of whole records with fallocate, which never shrinks it:
 * a forked child growing it from an older idea of its size cannot cut off
 * what the parent wrote.  A record is then a copy into the mapping, not a
 * system call.  Records of zeros at the end are holes the reader skips.
 */
#define SITES_CHUNK ((off_t)sizeof(trace_site) * 26214)   /* ~1 MiB */
/* The first chunk: most processes record a few hundred sites, and on a tmpfs
 * a chunk is memory zeroed at once (1 MiB: 0.25 ms). */
#define SITES_FIRST ((off_t)sizeof(trace_site) * 1638)     /* ~64 KiB */

/* Make the file at least `size` long, never shorter (fallocate; where the
 * file system has none, ftruncate after a look at the size). */
static int grow(off_t from, off_t len)
{
	struct stat st;
	int fd = ag_fd_checked(&sites_fd);

	if (fallocate(fd, 0, from, len) == 0)
		return 0;
	if (errno != EOPNOTSUPP || fstat(fd, &st) != 0)
		return -1;
	return st.st_size >= from + len ? 0 : ftruncate(fd, from + len);
}

static uint8_t *sites_map;
static volatile off_t sites_size;
static volatile int sites_lock;

int ag_sites_open(const char *dir)
{
	char *path = sites_path;
	size_t span = (size_t)(TRACE_ID_MAX + 1u) * sizeof(trace_site);

	snprintf(path, sizeof sites_path, "%s/sites", dir);
	sites_fd = ag_trace_open(path, O_RDWR | O_TRUNC);
	ag_fd_keep(&sites_fd, sites_path, O_RDWR);
	if (sites_fd < 0 || grow(0, SITES_FIRST) != 0) {
		ag_log("cannot create %s: %s", path, strerror(errno));
		return -1;
	}
	sites_size = SITES_FIRST;
	sites_map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, sites_fd, 0);
	if (sites_map == MAP_FAILED) {
		sites_map = NULL;
		ag_log("cannot map %s: %s", path, strerror(errno));
		return -1;
	}
	/* No read-ahead: the first fault would read (zero) the whole chunk
	 * into the page cache -- a process records a few sites, one page. */
	madvise(sites_map, span, MADV_RANDOM);
	next_site = (volatile uint32_t *)sites_map;
	*next_site = 1;                    /* id 0 is never used */
	return 0;
}

static uint32_t new_site(const trace_site *ts)
{
	uint32_t id = __atomic_fetch_add(next_site, 1, __ATOMIC_ACQ_REL);
	off_t end = ((off_t)id + 1) * (off_t)sizeof *ts;

	if (id > TRACE_ID_MAX)
		return 0;
	if (end > __atomic_load_n(&sites_size, __ATOMIC_ACQUIRE)) {
		while (__atomic_exchange_n(&sites_lock, 1, __ATOMIC_ACQUIRE))
			ag_arch_relax();
		while (end > sites_size) {
			if (grow(sites_size, SITES_CHUNK) != 0) {
				__atomic_store_n(&sites_lock, 0, __ATOMIC_RELEASE);
				ag_log("sites: cannot grow the file: %s", strerror(errno));
				return 0;
			}
			__atomic_store_n(&sites_size, sites_size + SITES_CHUNK, __ATOMIC_RELEASE);
		}
		__atomic_store_n(&sites_lock, 0, __ATOMIC_RELEASE);
	}
	memcpy(sites_map + (size_t)id * sizeof *ts, ts, sizeof *ts);
	return id;
}

uint32_t ag_site_root(ag_module *m, uint32_t func)
{
	const ca_func *f = ca_module_funcs(m->ca, NULL) + func;
	trace_site ts = { .caller_module = m->index, .callee_module = m->index,
			  .site_addr = f->addr, .caller_func = f->addr, .callee_func = f->addr,
			  .flags = TRACE_SITE_ROOT };

	return new_site(&ts);
}

static void lock(void)
{
	cp_plat_lock(&instr_lock);
}

static void unlock(void)
{
	cp_plat_unlock(&instr_lock);
}

/*
 * Functions that find their caller from their return address: called from a
 * patch area they would see the area, not the caller (dlsym(RTLD_NEXT, ...)
 * would search after the wrong object, dlopen would use the wrong search
 * path).  Their sites get an area that keeps the real return address.
 */
/* Is the function named one of names[0..n)? */
static bool named_one_of(const ag_module *m, uint32_t func, const char *const *names, size_t n)
{
	const char *name = ca_str(m->ca, ca_module_funcs(m->ca, NULL)[func].name);

	/* (the first letters first: called for every site's callee) */
	for (size_t i = 0; i < n; i++)
		if (name[0] == names[i][0] && strcmp(name, names[i]) == 0)
			return true;
	return false;
}

/* Join directives: the functions whose values the areas record. */
static struct join_dir {
	char text[256];          /* as given, for meta */
	char name[256];          /* FUNC */
	int kind;                /* enum trace_join_kind */
	unsigned arg;
} joins[AG_JOIN_MAX];
static size_t njoins;
static char join_env[AG_JOIN_MAX * 257];   /* the directives, one a line: an exec's SPTRACE_JOIN */

int ag_join_add(const char *directive, char *err, size_t errlen)
{
	unsigned long len;
	unsigned arg;
	int kind = trace_join_parse(directive, &len, &arg);

	if (kind < 0 || !len || len >= sizeof joins[0].name ||
	    strlen(directive) >= sizeof joins[0].text) {
		snprintf(err, errlen, "join directive '%.200s': give FUNC:entry:argN (N 1..6), "
			 "FUNC:exit:ret or FUNC:scope", directive);
		return -1;
	}
	if (njoins == AG_JOIN_MAX) {
		snprintf(err, errlen, "join directive '%.200s': at most %d directives", directive,
			 AG_JOIN_MAX);
		return -1;
	}
	snprintf(joins[njoins].text, sizeof joins[0].text, "%s", directive);
	snprintf(joins[njoins].name, sizeof joins[0].name, "%.*s", (int)len, directive);
	joins[njoins].kind = kind;
	joins[njoins].arg = arg;
	njoins++;
	snprintf(join_env + strlen(join_env), sizeof join_env - strlen(join_env), "%s%s",
		 join_env[0] ? "\n" : "", directive);
	return 0;
}

const char *ag_join_env(void) { return join_env; }

size_t ag_join_count(void) { return njoins; }

const char *ag_join_get(size_t i) { return i < njoins ? joins[i].text : NULL; }

/* Which values a direct call of F records (the first argument directive
 * naming F wins: one argument per call). */
static void join_values(const ag_module *m, uint32_t func, ag_area_spec *spec)
{
	const char *name;

	if (!njoins)
		return;
	name = ca_str(m->ca, ca_module_funcs(m->ca, NULL)[func].name);
	for (size_t i = 0; i < njoins; i++) {
		if (strcmp(name, joins[i].name) != 0)
			continue;
		if (joins[i].kind == TRACE_JOIN_ENTRY && !spec->value_arg)
			spec->value_arg = (uint8_t)joins[i].arg;
		else if (joins[i].kind == TRACE_JOIN_EXIT)
			spec->value_ret = true;
	}
}

static bool caller_sensitive(const ag_module *m, uint32_t func)
{
	static const char *const names[] = { "dlsym", "dlvsym", "dlopen", "dlmopen" };

	return named_one_of(m, func, names, sizeof names / sizeof *names);
}

/*
 * Code the C library runs with every signal blocked behind the agent's back
 * (raw system calls): a new thread's or posix_spawn's child's first steps
 * -- clone's child path, an outermost frame that starts with `xor %ebp,%ebp`
 * (often unnamed in a stripped libc) and calls the start function through a
 * register -- and posix_spawn's child, which also resets every handler.  An
 * int3 met there kills the process (a blocked trap is fatal).  Their short
 * sites get no trap and no relocated window (whose int3 comes first); jumps
 * are fine.
 */
static bool signals_blocked(const ag_module *m, uint32_t func)
{
	/* (start_thread's sites are all left alone: runs_in_thread_end) */
	static const char *const names[] = { "__spawni_child", "__spawnix" };
	const ca_func *f = ca_module_funcs(m->ca, NULL) + func;

	return ag_x86_outermost_frame((const uint8_t *)(uintptr_t)(m->bias + f->addr), f->size) ||
	       named_one_of(m, func, names, sizeof names / sizeof *names);
}

/*
 * The end of a thread: after its start routine, start_thread blocks every
 * signal (raw system call) and a detached thread frees its descriptor,
 * through these (and start_thread's own sites, should it ever be
 * instrumented).  Code is written while threads start only when none is
 * being started (patch.c), but a thread's end is not announced: their sites
 * are left alone, so that no batch's int3 is ever there.  (Not covered: a
 * detached thread's end that frees memory, through free, while free itself
 * is first patched.)
 */
static bool runs_in_thread_end(const ag_module *m, uint32_t func)
{
	static const char *const names[] = { "start_thread", "__nptl_free_tcb",
					     "__nptl_deallocate_stack", "__nptl_free_stacks" };

	return named_one_of(m, func, names, sizeof names / sizeof *names);
}

/*
 * libgcc's unwinder entry points read their own frame: each calls
 * uw_init_context, which takes its caller's CFA and return address to
 * describe the entry point's frame, and ends with __builtin_eh_return into
 * that frame's caller.  Called from an area, uw_init_context would describe
 * the area instead (no saved registers) and the landing pad would get
 * garbage registers.  Their own call sites are left alone; the calls into
 * them, and everything else in libgcc_s, are traced.
 */
static bool reads_own_frame(const ag_module *m, uint32_t func)
{
	static const char *const names[] = {
		"_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_Resume_or_Rethrow",
		"_Unwind_ForcedUnwind", "_Unwind_Backtrace",
	};

	return named_one_of(m, func, names, sizeof names / sizeof *names);
}

static bool runtime_func(const ag_module *m, uint32_t func)
{
	return ca_module_funcs(m->ca, NULL)[func].flags & CA_FUNC_RUNTIME;
}

/* Where a site leads.  0 ok; -1 when the callee is unknown (not yet bound,
 * or in a module the agent does not trace); -2 when it is runtime-managed
 * code (see the header comment). */
typedef struct callee {
	ag_module *m;
	uint32_t func;
	uint64_t entry;     /* run-time: what the site calls */
	uint64_t named;     /* link-time address in m the trace names it by */
	uint64_t slot;      /* run-time GOT slot, 0 for a direct site */
} callee;

static int resolve(ag_module *m, const ca_site *s, enum cp_route route, callee *c)
{
	uint64_t target;

	memset(c, 0, sizeof *c);
	if (route == CP_ROUTE_PLT)
		c->slot = ag_x86_plt_slot(m->bias + s->target);
	else if (route == CP_ROUTE_GOT)
		c->slot = m->bias + s->target;  /* a GOT slot (-fno-plt) */
	if (c->slot) {
		target = *(volatile uint64_t *)(uintptr_t)c->slot;
		/* An agent interposer (pthread_create, sigaction, swapcontext,
		 * ...) is called as it is, and named and instrumented as the C
		 * library's function it stands for. */
		c->entry = target;
		if (!ag_module_of(target)) {
			uint64_t real = ag_hook_real(target);

			target = real ? real : target;
		}
		c->m = ag_module_of(target);
		if (!c->m)
			return -1;
		c->func = ca_func_at(c->m->ca, target - c->m->bias);
		if (c->func == CA_NONE ||
		    ca_module_funcs(c->m->ca, NULL)[c->func].addr != target - c->m->bias ||
		    (ca_module_funcs(c->m->ca, NULL)[c->func].flags & CA_FUNC_PLT))
			return -1;  /* lazy binding not done, or not a function start */
		c->named = target - c->m->bias;
		return runtime_func(c->m, c->func) ? -2 : 0;
	}
	/* A tail jump to a stub of unknown form: to the stub itself, as named. */
	if (route != CP_ROUTE_DIRECT && !(route == CP_ROUTE_PLT && s->kind == CA_SITE_TAIL_DIRECT))
		return -1;
	c->m = m;
	c->func = s->callee;
	c->entry = m->bias + s->target;
	c->named = s->target;
	return runtime_func(m, c->func) ? -2 : 0;
}

_Static_assert(offsetof(ag_indirect_site, cache) == 16, "IS_CACHE in tramp.S");
_Static_assert(offsetof(ag_indirect_site, known_ids) == 24, "IS_KNOWN_IDS in tramp.S");
_Static_assert(offsetof(ag_indirect_site, known_targets) == 56, "IS_KNOWN_TARGETS in tramp.S");
_Static_assert(AG_SLOW_INDIRECT == 4 && TRACE_ENTRY == 0 && TRACE_EXIT == 1, "tramp.S");
_Static_assert((int)CP_WORD_ENTRY == (int)TRACE_ENTRY && (int)CP_WORD_EXIT == (int)TRACE_EXIT,
	       "core.c's cache words");

/* A direct site's area, emitted into `buf` for its code at rx (after the
 * slot's words, whose RET word a call without exit pushes). */
static size_t emit_direct(const ag_area_spec *spec, bool tail, bool noexit, uint8_t *buf,
			  const uint8_t *rx)
{
	uint64_t at = (uint64_t)(uintptr_t)rx;

	if (tail)
		return ag_emit_tail(spec, buf, at);
	if (noexit)
		return ag_emit_call_noexit(spec, buf, at, at - AG_SLOT_WORDS + AG_SLOT_RET);
	if (spec->budget_mode)
		return ag_emit_call_budget(spec, buf, at);
	return ag_emit_call(spec, buf, at);
}

static int site_patch(ag_module *m, const ca_site *s, enum cp_plan plan, uint8_t *rx,
		      ag_patch *p, ag_patch *sb);
static int trap_patch(ag_module *m, const ca_site *s, bool window, uint8_t *rx, ag_patch *p);
_Static_assert(offsetof(ag_indirect_cache, entry_word) == 8 &&
	       offsetof(ag_indirect_cache, exit_word) == 16, "tramp.S");
_Static_assert(offsetof(ag_indirect_cache, untraced) == 24, "emit.c: cache + 24");

/* An indirect call: the callee is known only at run time (see emit.c). */
static int prepare_indirect(ag_module *m, const ca_site *s, uint32_t si, enum cp_plan plan,
			    ag_patch *p, ag_patch *sb, enum cp_skip *why)
{
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + s->addr);
	ag_indirect_site *is = ag_alloc(sizeof *is);
	ag_indirect_cache *cache = (ag_indirect_cache *)ag_pool_data(m->pool, sizeof *cache);
	uint8_t scratch[AG_AREA_SCRATCH], *srx, *srw, *rx, *rw;
	ag_area_spec spec;
	size_t len;

	if (!is || !cache)
		return -1;
	memset(&spec, 0, sizeof spec);
	bool tail = s->kind == CA_SITE_TAIL_INDIRECT;

	if (!ag_x86_load_of_call(code, s->len, m->bias + s->addr, tail, &spec)) {
		*why = CP_SKIP_KIND;
		return -1;
	}
	*is = (ag_indirect_site){ .mod = m, .site = si, .cache = cache, .next = indirect_sites };
	indirect_sites = is;     /* under the instrument lock */
	saved_cache = cache;
	if (!ag_pool_code(m->pool, AG_SLOT_CODE(AG_SLOT_BIG), &srx, &srw))
		return -1;              /* a big slot: tramp.S's stubs find it so */
	rx = srx + AG_SLOT_WORDS;
	rw = srw + AG_SLOT_WORDS;
	spec.site = m->bias + s->addr;
	spec.site_len = s->len;
	spec.cache = (uint64_t)(uintptr_t)cache;
	spec.stubs = ag_pool_stubs(m->pool);
	spec.tail_jump = tail;
	spec.budget_indirect = ag_budget_percent() != 0;
	bool window = s->method == CA_PATCH_RELOCATE && s->reloc_rip != CA_RELOC_RIP_UNKNOWN &&
		      !ag_reloc_gave_up() &&
		      !ag_x86_one_byte_insn(*(const uint8_t *)(uintptr_t)(m->bias + s->patch_addr));

	if (window) {
		/* The instructions before the call run first in the area, right
		 * after its endbr64 (ag_emit_indirect), at rx + 4. */
		spec.prefix_len = (uint8_t)(s->addr - s->patch_addr);
		memcpy(spec.prefix, (const void *)(uintptr_t)(m->bias + s->patch_addr),
		       spec.prefix_len);
		if (s->reloc_rip && s->reloc_rip - 1u + 4 <= spec.prefix_len) {
			/* A RIP-relative operand, re-aimed: the copy sits
			 * (rx + 4) - window bytes further on. */
			window = ag_x86_reaim_rel32(spec.prefix, s->reloc_rip - 1u,
						    m->bias + s->patch_addr,
						    (uint64_t)(uintptr_t)rx + 4);
		} else if (s->reloc_rip) {
			window = false;
		}
		if (!window)
			spec.prefix_len = 0;
	}
	len = ag_emit_indirect(&spec, scratch, (uint64_t)(uintptr_t)rx);
	if (len > AG_SLOT_CODE(AG_SLOT_BIG)) {
		ag_log("instrument: indirect area of %zu bytes overflows its slot", len);
		return -1;
	}
	memcpy(rw, scratch, len);
	ag_x86_slot_words(srw, spec.site + s->len, 0, is);
	if (plan == CP_PLAN_TRAP)
		return trap_patch(m, s, window, rx, p);
	return site_patch(m, s, plan, rx, p, sb);
}

/*
 * A site without room for a jump: an int3 on the call itself (a TRAP plan,
 * or a window that cannot be used), the last resort -- a signal per call,
 * microseconds: the trap is put back once it has been hit TRAP_HOT times
 * (patch.c), a bounded cost -- or on a relocated window's first byte, which
 * becomes a jump once no thread can stand inside (relocate.c).
 */
static int trap_patch(ag_module *m, const ca_site *s, bool window, uint8_t *rx, ag_patch *p)
{
	uint64_t at = m->bias + (window ? s->patch_addr : s->addr);
	ag_reloc *r = NULL;

	if (window && !(r = ag_alloc(sizeof *r)))
		return -1;
	if (!ag_x86_trap_patch(at, (uint64_t)(uintptr_t)rx, p, r ? &r->jump : NULL) ||
	    ag_trap_site_add(at, (uint64_t)(uintptr_t)rx, !window))
		return -1;
	if (r) {
		r->start = at;
		r->end = m->bias + s->addr + s->len;
		r->copy = (uint64_t)(uintptr_t)rx + 4;
		saved_reloc = r;
	}
	return 0;
}

/* Module m as the core sees it (core.h). */
static void view_of(ag_module *m, cp_view *v)
{
	size_t nfuncs;

	v->mod = m;
	v->index = m->index;
	v->bias = m->bias;
	v->funcs = ca_module_funcs(m->ca, &nfuncs);
	v->nfuncs = (uint32_t)nfuncs;
	v->sites = ca_module_sites(m->ca, NULL);
	v->func_state = m->func_state;
	v->first_fragment = m->first_fragment;
	v->next_fragment = m->next_fragment;
	v->saved = m->site_saved;
}

/*
 * A callee reached through an indirect site for the first time (or after
 * another one): instrument it if it is a function of a traced module, give
 * the (site, callee) pair a site id, and point the site's cache at it
 * (core.c's cp_indirect_miss decides; cp_plat_* below act).
 */
uint64_t ag_indirect_miss(ag_indirect_site *is, uint64_t target)
{
	cp_view v;

	view_of(is->mod, &v);
	return cp_indirect_miss(&v, is, target);
}

/*
 * Build the area for one site and fill its patch.  A springboard site gets a
 * second patch, *sb: the 5-byte `jmp area` written into dead padding, which
 * must be in place before the site's 2-byte jump points to it.
 * Returns 0, 1 (with a springboard), -1 to leave the site alone (*why: how
 * the core counts it, if at all).
 */
static int prepare(ag_module *m, const ca_site *s, uint32_t si, enum cp_plan plan,
		   enum cp_route route, ag_patch *p, ag_patch *sb, enum cp_skip *why)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + s->addr);
	bool tail = s->kind == CA_SITE_TAIL_DIRECT;
	ag_area_spec spec;
	ag_callee *ref;
	trace_site ts;
	uint8_t *rx;
	size_t len;
	callee c;

	if (route == CP_ROUTE_INDIRECT)
		return prepare_indirect(m, s, si, plan, p, sb, why);
	switch (resolve(m, s, route, &c)) {
	case 0:
		break;
	case -2:
		*why = CP_SKIP_RUNTIME;
		return -1;
	default:
		*why = CP_SKIP_UNRESOLVED;
		return -1;
	}
	if (!ag_module_ready(c.m))
		return -1;
	ref = ag_alloc(sizeof *ref);
	if (!ref)
		return -1;
	memset(&spec, 0, sizeof spec);
	if (c.m == m && !c.slot) {
		*ref = (ag_callee){ c.m->index, c.func, NULL, m->index, s->func };
		spec.callee_flag = &m->func_state[c.func];      /* rip-reachable: same pool */
	} else {
		/* The callee's state lives near its own module: test a byte of
		 * this site instead, set once the callee is instrumented. */
		uint8_t *flag = ag_pool_data(m->pool, 1);

		if (!flag)
			return -1;
		saved_flag = flag;
		*flag = c.m->func_state[c.func];
		*ref = (ag_callee){ c.m->index, c.func, flag, m->index, s->func };
		spec.callee_flag = flag;
	}
	memset(&ts, 0, sizeof ts);
	ts.caller_module = m->index;
	ts.callee_module = c.m->index;
	ts.site_addr = s->addr;
	ts.caller_func = funcs[s->func].addr;
	ts.callee_func = c.named;
	ts.kind = s->kind;
	if (caller_sensitive(c.m, c.func)) {
		if (tail)
			spec.fix_return = true;
		else
			ts.flags |= TRACE_SITE_NO_EXIT;
	}
	spec.site_id = new_site(&ts);
	if (!spec.site_id)
		return -1;
	spec.site = m->bias + s->addr;
	spec.site_len = s->len;
	spec.callee = c.entry;
	spec.slot = c.slot;
	spec.stubs = ag_pool_stubs(m->pool);
	/* With a springboard, a jmp/jcc rel8 stays, retargeted to the
	 * springboard, so the area is reached only when taken; else a jmp/jcc
	 * rel32, whose condition the area tests. */
	if (tail && !ag_x86_tail_jump(code, plan == CP_PLAN_SPRINGBOARD, &spec.cond,
				      &spec.cond_code))
		return -1;
	/* A tail jump through the PLT goes to the stub: it jumps on via the slot. */
	if (tail)
		spec.callee = c.slot ? m->bias + s->target : c.entry;
	else if (!(ts.flags & TRACE_SITE_NO_EXIT))
		join_values(c.m, c.func, &spec);
	if ((tail && !spec.fix_return &&
	     (spec.budget_mode = ag_budget_site(m->pool, spec.site_id, true))) ||
	    (!tail && !(ts.flags & TRACE_SITE_NO_EXIT) &&
	     !spec.value_arg && !spec.value_ret &&     /* a join's calls stay timed */
	     (spec.budget_mode = ag_budget_site(m->pool, spec.site_id, false)))) {
		spec.tls_counts_offset = ag_tls_counts_offset();
		spec.tls_tick_offset = ag_tls_tick_offset();
	}
	/* Emitted into scratch first, for a small slot; an area that does not
	 * fit one is emitted again for a big slot (its length is the same
	 * wherever it is; the small slot stays unused): only an area that fits
	 * reaches the pool. */
	{
		uint8_t scratch[AG_AREA_SCRATCH], *srx, *srw;
		size_t room = AG_SLOT_CODE(AG_SLOT_SMALL);

		for (;;) {
			if (!ag_pool_code(m->pool, room, &srx, &srw))
				return -1;
			rx = srx + AG_SLOT_WORDS;
			len = emit_direct(&spec, tail, ts.flags & TRACE_SITE_NO_EXIT, scratch, rx);
			if (len <= room || room == AG_SLOT_CODE(AG_SLOT_BIG))
				break;
			room = AG_SLOT_CODE(AG_SLOT_BIG);
		}
		if (len > room && spec.value_arg && spec.value_ret) {
			/* both values do not fit: the argument only */
			ag_log("join: the area of a call of %s has no room for its return value "
			       "too: its argument only", ca_str(c.m->ca,
			       ca_module_funcs(c.m->ca, NULL)[c.func].name));
			spec.value_ret = false;
			len = emit_direct(&spec, tail, false, scratch, rx);
		}
		if (len > room) {
			ag_log("instrument: area of %zu bytes overflows its %zu-byte slot", len,
			       room + AG_SLOT_WORDS);
			return -1;
		}
		memcpy(srw + AG_SLOT_WORDS, scratch, len);
		ag_x86_slot_words(srw, spec.site + s->len, spec.site_id, ref);
	}
	return site_patch(m, s, plan, rx, p, sb);
}

/* The patch that sends site s to the area at rx (directly or through a
 * springboard).  Returns 0, 1 (with a springboard in *sb), -1. */
static int site_patch(ag_module *m, const ca_site *s, enum cp_plan plan, uint8_t *rx,
		      ag_patch *p, ag_patch *sb)
{
	return ag_x86_site_patch(m->bias + s->addr, s->len,
				 plan == CP_PLAN_SPRINGBOARD ? m->bias + s->patch_addr : 0,
				 (uint64_t)(uintptr_t)rx, p, sb);
}

/*
 * Guard 3 of codeanalysis/trust.c: are the bytes a patch of s would read or
 * overwrite (ca_site_spans) those the analysis saw?  Not if the entry is
 * stale, was made from another file with the same build-id, or the program
 * changed its code (self-modifying code, a JIT writing into a module).  A
 * hash of some 5 to 20 bytes of the module's own code, once per site, when
 * it is first patched; spans outside the module's code are no match.
 */
static bool code_as_analysed(const ag_module *m, const ca_site *s)
{
	uint64_t addr[2], h = CA_CODE_HASH_SEED;
	unsigned len[2];

	ca_site_spans(s, addr, len);
	for (int k = 0; k < 2; k++) {
		uint64_t at = m->bias + addr[k];

		if (!len[k])
			continue;
		if (at < m->text_lo || at >= m->text_hi || len[k] > m->text_hi - at)
			return false;
		h = ca_code_hash(h, (const void *)(uintptr_t)at, len[k]);
	}
	return h == s->code;
}

static void save_site(ag_module *m, uint32_t si, const ag_patch *p, const ag_patch *sb)
{
	site_saved *sv;

	if (!m->site_saved || !(sv = ag_alloc(sb ? sizeof *sv : offsetof(site_saved, sb))))
		return;
	sv->p = *p;
	if (sb) {
		sv->sb = *sb;
		sv->has_sb = true;
	}
	sv->flag = saved_flag;
	sv->cache = saved_cache;
	sv->reloc = saved_reloc;
	sv->next = all_saved;
	all_saved = sv;
	m->site_saved[si] = sv;
}

/* ---- the platform of agent/core (core.h) in user space ---- */

void *cp_plat_alloc(size_t n)
{
	return ag_alloc(n);
}

/*
 * The instrument lock and the indirect sites' locks: a spin, then a sleep.
 * The holder may write code for a long while (a batch's system calls, the
 * 2 ms wait of patch.c step 3; cc1 reaching 135,000 sites in one compile):
 * a waiter that only spun took a whole CPU meanwhile -- the control thread,
 * waiting to upgrade relocated windows, was 14 % of a traced `cc -c`'s CPU
 * time, on a 2-core machine where make -j2 had the other compile to run.
 *
 *   1. The word is 0 (free), 1 (held) or 2 (held, someone may sleep on it).
 *   2. Lock: SPINS tries to change 0 into 1 (never an exchange: it would
 *      wipe out a 2); then exchange with 2 and,
 *      while the old value was not 0, sleep on the word (futex, woken or
 *      not while it is 2).  Taking it with 2 may wake one needlessly later:
 *      never a lost wake-up.
 *   3. Unlock: exchange with 0; if it was 2, wake one sleeper.
 *   4. A quiet thread (tsc.c: perhaps in strict seccomp mode, where a futex
 *      call kills the process) takes none of these locks: its slow paths
 *      answer before (main.c, ag_slow).  Should one come here, it spins.
 * The futex calls are raw (ag_arch_syscall6): errno is the program's.
 */
#define SPINS 200

static void lock_sleep(volatile int *l)
{
	ag_arch_syscall6(SYS_futex, (long)l, FUTEX_WAIT_PRIVATE, 2, 0, 0, 0);
}

void cp_plat_lock(volatile int *l)
{
	for (int i = 0; i < SPINS || ag_tls_quiet; i++) {
		int free_ = 0;

		if (__atomic_compare_exchange_n(l, &free_, 1, false, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return;
		ag_arch_relax();
	}
	while (__atomic_exchange_n(l, 2, __ATOMIC_ACQUIRE))
		lock_sleep(l);
}

void cp_plat_unlock(volatile int *l)
{
	if (__atomic_exchange_n(l, 0, __ATOMIC_RELEASE) == 2)
		ag_arch_syscall6(SYS_futex, (long)l, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

/* (The areas' unwind information was registered with their pool.) */
int cp_plat_apply(cp_patch *p, size_t n)
{
	return ag_patch_apply(p, n);
}

uint32_t cp_plat_site_new(const cp_site_desc *d)
{
	trace_site ts = { .caller_module = d->caller_module, .callee_module = d->callee_module,
			  .site_addr = d->site_addr, .caller_func = d->caller_func,
			  .callee_func = d->callee_func, .kind = d->kind, .flags = d->flags };

	return new_site(&ts);
}

bool cp_plat_func_skipped(void *mod, uint32_t func)
{
	return reads_own_frame(mod, func) || runs_in_thread_end(mod, func);
}

bool cp_plat_signals_blocked(void *mod, uint32_t func)
{
	return signals_blocked(mod, func);
}

bool cp_plat_code_matches(void *mod, uint32_t si)
{
	ag_module *m = mod;
	const ca_site *s = ca_module_sites(m->ca, NULL) + si;

	if (code_as_analysed(m, s))
		return true;
	if (m->sites_changed++ == 0)
		ag_log("module %s: site %#lx left alone: its bytes are not those the "
		       "analysis saw (more such sites are counted at the end)",
		       m->path, (unsigned long)(m->bias + s->addr));
	return false;
}

int cp_plat_prepare(void *mod, uint32_t si, enum cp_plan plan, enum cp_route route,
		    cp_patch *p, cp_patch *sb, enum cp_skip *why)
{
	ag_module *m = mod;
	int r;

	saved_flag = NULL;
	saved_cache = NULL;
	saved_reloc = NULL;
	r = prepare(m, ca_module_sites(m->ca, NULL) + si, si, plan, route, p, sb, why);
	if (r >= 0) {
		save_site(m, si, p, r == 1 ? sb : NULL);
		if (saved_reloc)
			ag_reloc_queue(saved_reloc);
	}
	return r;
}

int cp_plat_reuse(void *mod, uint32_t si, void *saved, cp_patch *p, cp_patch *sb)
{
	site_saved *sv = saved;

	(void)mod;
	(void)si;
	if ((sv->reloc && ag_reloc_gave_up()) || ag_trap_site_retired(sv->p.addr))
		return -1;
	*p = sv->p;
	if (sv->has_sb)
		*sb = sv->sb;
	if (sv->reloc)
		ag_reloc_queue(sv->reloc);
	return sv->has_sb;
}

void cp_plat_lookup(uint64_t target, cp_target *t)
{
	ag_module *cm = ag_module_of(target);
	uint32_t f = cm ? ca_func_at(cm->ca, target - cm->bias) : CA_NONE;

	if (f != CA_NONE && (ca_module_funcs(cm->ca, NULL)[f].addr != target - cm->bias ||
			     runtime_func(cm, f)))
		f = CA_NONE;
	t->mod = cm;
	t->index = cm ? cm->index : UINT32_MAX;
	t->func = f;
	t->named = cm ? target - cm->bias : target;
}

bool cp_plat_runtime_code(uint64_t target)
{
	return ag_runtime_code(target);
}

void cp_plat_reached(void *mod, uint32_t func)
{
	ag_instrument(mod, func);
}

void cp_plat_indirect_id(uint32_t id, bool tail)
{
	ag_budget_indirect_id(id, tail);
}

/* Forget which functions are instrumented (see site_saved). */
static void reset_states(void)
{
	for (uint32_t i = 0; i < ag_module_count(); i++) {
		ag_module *m = ag_module_at(i);
		size_t nfuncs;

		if (!m->ca)
			continue;               /* never loaded (modules.c) */
		ca_module_funcs(m->ca, &nfuncs);
		if (m->func_state)
			for (size_t f = 0; f < nfuncs; f++)
				__atomic_store_n(&m->func_state[f], 0, __ATOMIC_RELAXED);
	}
	for (site_saved *sv = all_saved; sv; sv = sv->next) {
		if (sv->flag)
			__atomic_store_n(sv->flag, 0, __ATOMIC_RELAXED);
		if (sv->cache)
			__atomic_store_n(&sv->cache->target, 0, __ATOMIC_RELEASE);
	}
}

/*
 * Deactivation (the caller has cleared the active state): put every byte
 * back and forget the instrumented functions.  Under the instrument lock: an
 * instrument() that got there first finishes and is undone here; one that
 * waits finds the agent inactive and patches nothing.
 */
int ag_instrument_stop(void)
{
	int rc;

	lock();
	rc = ag_patch_restore_all();
	reset_states();
	ag_budget_reset();
	ag_reloc_forget();
	unlock();
	return rc;
}

/* A forked child: a thread that held one of these locks (a miss holds its
 * site's while it instruments the callee, and so may wait for the
 * instrument lock the forking thread held) stayed in the parent. */
void ag_instrument_after_fork(void)
{
	cp_after_fork();
	sites_lock = 0;
	/* Written only where held: a write would copy the site's page (the
	 * child's first write to each one) for nothing. */
	for (ag_indirect_site *is = indirect_sites; is; is = is->next)
		if (is->lock)
			is->lock = 0;
}

void ag_instrument_lock(void)
{
	lock();
}

void ag_instrument_unlock(void)
{
	unlock();
}

/* Before a new activation: states a late slow path may have set after the
 * stop are cleared again. */
void ag_instrument_restart(void)
{
	lock();
	reset_states();
	unlock();
}

static int instrument(ag_module *m, uint32_t func, ag_module *cm, uint32_t caller,
		      uint64_t wait_ns);
static void hint_add(const ag_module *m, uint32_t func);

int ag_instrument(ag_module *m, uint32_t func)
{
	return instrument(m, func, NULL, CA_NONE, 2000000);
}

/* A thread's start routine, from ag_thread_start: the thread holds no lock
 * of the program's yet, so it may wait for threads being started as long
 * as patch.c allows (a second) -- a root put off would lose the thread's
 * whole tree, its start routine being called once. */
int ag_instrument_root(ag_module *m, uint32_t func)
{
	return instrument(m, func, NULL, CA_NONE, 1000000000);
}

/* F reached from a call in `caller` (of module cm): the caller's other
 * direct callees join the batch when cm is m (core.c, the look-ahead). */
int ag_instrument_from(ag_module *m, uint32_t func, ag_module *cm, uint32_t caller)
{
	return instrument(m, func, cm, caller, 2000000);
}

/* wait_ns: how long to wait for threads being started (patch.c) before the
 * function is left for a later call. */
static int instrument(ag_module *m, uint32_t func, ag_module *cm, uint32_t caller,
		      uint64_t wait_ns)
{
	size_t nfuncs;
	cp_view v;
	int rc;

	ca_module_funcs(m->ca, &nfuncs);
	if (func >= nfuncs || runtime_func(m, func) || !ag_module_ready(m))
		return -1;
	/* Published with release by cp_instrument: done already, no lock to wait for. */
	if (__atomic_load_n(&m->func_state[func], __ATOMIC_ACQUIRE) & AG_FUNC_INSTRUMENTED)
		return 0;
	if (!ag_active())
		return -1;
	/* Threads being started (patch.c): not now if they stay for wait_ns
	 * (2 ms but for a thread's root: this thread may hold a lock a starter
	 * needs), or if this thread may be one of them.  Before the lock: a
	 * thread being started may want it. */
	if (ag_start_self() || !ag_patch_hold(wait_ns)) {
		__atomic_add_fetch(&deferred, 1, __ATOMIC_RELAXED);
		return -1;
	}
	lock();
	if ((m->func_state[func] & AG_FUNC_INSTRUMENTED) || !ag_active()) {
		unlock();
		ag_patch_release();
		return (m->func_state[func] & AG_FUNC_INSTRUMENTED) ? 0 : -1;
	}
	view_of(m, &v);
	rc = cp_instrument(&v, func, cm == m ? caller : CA_NONE);
	unlock();
	ag_patch_release();
	if (rc == 0)
		hint_add(m, func);
	return rc;
}

/*
 * Functions only a forked child reaches, instrumented in its parent for the
 * next children.  A shell's child runs code of its own between fork and
 * exec (signals restored, redirections, the exec): the parent never calls
 * it, so each child's first calls took the slow path and instrumented the
 * same functions again, with a memfd of the child's own over the rest of
 * each pool it wrote into -- 4-6 % of a traced bash forking /bin/true.
 *
 *   1. Each process that starts the agent maps one shared page (hints),
 *      which its forked children and theirs inherit; an exec'd image maps
 *      its own.  hint_owner is the process that mapped it.
 *   2. A process other than the owner that instruments a function from a
 *      slow path (a root of cp_instrument: the look-ahead comes again with
 *      it) appends (module index, bias, function) to the page: a slot taken
 *      by fetch-and-add, its function written last with release.
 *   3. Every process, in its fork's prepare handler (threads.c), before it
 *      takes the instrument lock, instruments each hint from its own cursor
 *      on whose module has the same index and bias here (a module dlopen'd
 *      after the fork may not), then moves its cursor past the hints it
 *      read; a slot not yet written stops it until the next fork.  A child
 *      forked then inherits the patched code.
 *   4. Nothing depends on a hint: a function not instrumented in the parent
 *      is instrumented by the child's slow path as before.  A full page
 *      takes no more hints.
 */
#define HINTS 255

typedef struct hint {
	uint64_t bias;
	uint32_t module;
	uint32_t func_plus1;     /* 0: not written yet */
} hint;

static struct hint_page {
	uint32_t n;
	uint32_t pad[3];
	hint h[HINTS];
} *hints;
static pid_t hint_owner;
static uint32_t hint_cursor;           /* private: this process's own */

void ag_instrument_hints_init(void)
{
	void *p = mmap(NULL, sizeof *hints, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		       -1, 0);

	_Static_assert(sizeof(struct hint_page) <= 4096, "one page");
	hints = p == MAP_FAILED ? NULL : p;
	hint_owner = getpid();
	hint_cursor = 0;
}

static void hint_add(const ag_module *m, uint32_t func)
{
	uint32_t i;

	if (!hints || ag_self_pid == hint_owner ||
	    __atomic_load_n(&hints->n, __ATOMIC_RELAXED) >= HINTS)
		return;
	i = __atomic_fetch_add(&hints->n, 1, __ATOMIC_ACQ_REL);
	if (i >= HINTS)
		return;
	hints->h[i].bias = m->bias;
	hints->h[i].module = m->index;
	__atomic_store_n(&hints->h[i].func_plus1, func + 1, __ATOMIC_RELEASE);
}

void ag_instrument_hints_apply(void)
{
	uint32_t n;

	if (!hints || !ag_active())
		return;
	n = __atomic_load_n(&hints->n, __ATOMIC_ACQUIRE);
	for (; hint_cursor < n && hint_cursor < HINTS; hint_cursor++) {
		const hint *h = &hints->h[hint_cursor];
		uint32_t f = __atomic_load_n(&h->func_plus1, __ATOMIC_ACQUIRE);
		ag_module *m;

		if (!f)
			break;
		m = h->module < ag_module_count() ? ag_module_at(h->module) : NULL;
		if (m && m->bias == h->bias)
			instrument(m, f - 1, NULL, CA_NONE, 2000000);
	}
}

/*
 * At an activation: the functions a language runtime calls into (cgo's C
 * side) -- the runtime is not patched, so no traced call reaches them, and
 * their calls would go unseen.  Their own entries are not recorded; what
 * they call is.  Returns how many.
 */
uint32_t ag_instrument_runtime_entries(void)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < ag_module_count(); i++) {
		ag_module *m = ag_module_at(i);
		const ca_func *funcs;
		size_t nfuncs;

		if (!__atomic_load_n(&m->ca, __ATOMIC_ACQUIRE))
			continue;
		funcs = ca_module_funcs(m->ca, &nfuncs);
		for (uint32_t f = 0; f < nfuncs; f++)
			if ((funcs[f].flags & CA_FUNC_RUNTIME_ENTRY) && ag_instrument(m, f) == 0)
				n++;
	}
	return n;
}

uint64_t ag_instrument_deferred(void)
{
	return deferred;
}

uint64_t ag_instrument_skipped_runtime(uint64_t *indirect)
{
	*indirect = cp_stats_get()->untraced;
	return cp_stats_get()->skipped[CP_SKIP_RUNTIME];
}

void ag_instrument_stats(uint64_t *sites, uint64_t *kind, uint64_t *plan, uint64_t *unresolved,
			 uint64_t *internal)
{
	const cp_stats *st = cp_stats_get();

	*internal = st->tail_internal;
	*sites = next_site ? *next_site - 1 : 0;
	*kind = st->skipped[CP_SKIP_KIND];
	*plan = st->skipped[CP_SKIP_PLAN];
	*unresolved = st->skipped[CP_SKIP_UNRESOLVED];
}
