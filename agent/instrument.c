/*
 * instrument.c — instrument(F): give every call site of F a patch area and
 * patch the sites, so the next call F makes is seen and propagates tracing
 * to the callee before the callee runs.
 *
 * Each site that gets an area also gets a trace site id, described in the
 * sites file (trace_format.h) before any record can name it.
 *
 * Sites patched so far:
 *   direct calls and tail jumps to a function of the same module;
 *   calls and tail jumps through the PLT, and calls through a GOT slot
 *   (-fno-plt): the slot already holds the callee (the agent runs programs
 *   with LD_BIND_NOW), which may live in another module -- that is how
 *   tracing crosses into shared libraries;
 *   indirect calls through registers or memory (a per-site cache, emit.c);
 *   with a 5-byte patch, a springboard in dead padding or a relocated
 *   window (relocate.c),
 *   or, last, an int3 on the call (a signal per call; put back once hot);
 *   indirect tail jumps where the analysis saw the frame torn down (ENTRY
 *   only).
 * Not: other indirect jumps (a computed goto may keep r11, the flags or the
 * red zone live); they are left untouched and counted in the log.
 *
 * Nor anything of code a language runtime manages (CA_FUNC_RUNTIME: Go's
 * text, V8's builtins), whose stack walks read return addresses: its
 * functions are never instrumented, and a call into it is not traced -- a
 * direct or PLT site is left alone, an indirect site's area calls such a
 * target with the caller's own return address on the stack (emit.c).  The
 * C functions such a runtime calls (CA_FUNC_RUNTIME_ENTRY) are reached by
 * nothing traced: they are instrumented at each activation instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static volatile int sites_fd = -1;
static char sites_path[4200];
/* The next free site id.  It lives in shared memory (the first record of
 * the sites file, which no id uses) so that a forked child and its parent,
 * both writing into the same trace, never hand out the same id. */
static volatile uint32_t *next_site;
static volatile int instr_lock;
static uint64_t skipped_kind, skipped_plan, skipped_unresolved;
static uint64_t tail_internal;   /* "tail jumps" that went within their function */
static uint64_t skipped_runtime; /* sites calling into runtime-managed code */
static uint64_t deferred;        /* instrumentations put off: threads being started */
static uint64_t untraced_misses; /* indirect calls that found such a target */
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
	ag_patch p, sb;
	bool has_sb;
	uint8_t *flag;               /* the area's callee flag, if its own byte */
	ag_indirect_cache *cache;    /* an indirect site's cache */
	ag_reloc *reloc;             /* a relocated window: its jump, for later */
	struct site_saved *next;     /* every saved site, for the reset */
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
	if (sites_fd < 0 || grow(0, SITES_CHUNK) != 0) {
		ag_log("cannot create %s: %s", path, strerror(errno));
		return -1;
	}
	sites_size = SITES_CHUNK;
	sites_map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, sites_fd, 0);
	if (sites_map == MAP_FAILED) {
		sites_map = NULL;
		ag_log("cannot map %s: %s", path, strerror(errno));
		return -1;
	}
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
			__builtin_ia32_pause();
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
	while (__atomic_exchange_n(&instr_lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
}

static void unlock(void)
{
	__atomic_store_n(&instr_lock, 0, __ATOMIC_RELEASE);
}

/* The GOT slot a PLT stub jumps through: [endbr64] [bnd] jmp *disp32(%rip). */
static uint64_t plt_slot(uint64_t stub)
{
	const uint8_t *p = (const uint8_t *)(uintptr_t)stub;
	int32_t disp;

	if (p[0] == 0xf3 && p[1] == 0x0f && p[2] == 0x1e && p[3] == 0xfa)
		p += 4;
	if (p[0] == 0xf2)
		p++;
	if (p[0] != 0xff || p[1] != 0x25)
		return 0;
	memcpy(&disp, p + 2, 4);
	return (uint64_t)(uintptr_t)(p + 6) + (uint64_t)(int64_t)disp;
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

	for (size_t i = 0; i < n; i++)
		if (strcmp(name, names[i]) == 0)
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
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + f->addr);

	if (f->size >= 6 && memcmp(code, "\xf3\x0f\x1e\xfa", 4) == 0)
		code += 4;                      /* endbr64 */
	if (code[0] == 0x31 && code[1] == 0xed)
		return true;                    /* xor %ebp,%ebp: a thread's or process's start */
	return named_one_of(m, func, names, sizeof names / sizeof *names);
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

static int resolve(ag_module *m, const ca_site *s, callee *c)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	uint64_t target;

	memset(c, 0, sizeof *c);
	if (s->kind == CA_SITE_PLT || (s->kind == CA_SITE_TAIL_DIRECT && s->callee != CA_NONE &&
				       (funcs[s->callee].flags & CA_FUNC_PLT)))
		c->slot = plt_slot(m->bias + s->target);
	else if (s->kind == CA_SITE_INDIRECT_RIP && s->import != CA_NONE)
		c->slot = m->bias + s->target;  /* a GOT slot (-fno-plt); else a variable */
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
	if ((s->kind != CA_SITE_DIRECT && s->kind != CA_SITE_TAIL_DIRECT) || s->callee == CA_NONE)
		return -1;
	c->m = m;
	c->func = s->callee;
	c->entry = m->bias + s->target;
	c->named = s->target;
	return runtime_func(m, c->func) ? -2 : 0;
}

static int site_patch(ag_module *m, const ca_site *s, uint8_t *rx, ag_patch *p, ag_patch *sb);
static int trap_patch(ag_module *m, const ca_site *s, bool window, uint8_t *rx, ag_patch *p);
static bool one_byte_insn(uint8_t b);

/* The words at the end of an area slot (agent.h): the site id of its exit
 * record (0 for an indirect site, whose id depends on the callee), the
 * caller's return address S+len, the magic that marks a call area, and
 * S+len-1 for the unwinder. */
static void slot_words(uint8_t *rw, uint64_t ret, uint32_t site)
{
	uint64_t magic = AG_SLOT_MAGIC_VALUE, ra = ret - 1, id = site;

	memcpy(rw + AG_SLOT_SITE, &id, 8);
	memcpy(rw + AG_SLOT_RET, &ret, 8);
	memcpy(rw + AG_SLOT_MAGIC, &magic, 8);
	memcpy(rw + AG_SLOT_RA, &ra, 8);
}

static bool is_indirect(const ca_site *s)
{
	return s->kind == CA_SITE_INDIRECT_REG || s->kind == CA_SITE_INDIRECT_MEM ||
	       (s->kind == CA_SITE_INDIRECT_RIP && s->import == CA_NONE) ||
	       s->kind == CA_SITE_TAIL_INDIRECT;
}

/*
 * `call *OP` (ff /2) or `jmp *OP` (ff /4) re-encoded as `mov OP,%r11`:
 * [3e] [REX] ff /op modrm [sib] [disp]
 * becomes REX.W|R|X|B 8b modrm' [sib] [disp] with the reg field set to r11.
 * Returns the length, 0 if the instruction is not of that form.
 */
static size_t load_of_call(const uint8_t *c, size_t len, unsigned op, uint8_t *out, uint8_t *rip_at)
{
	size_t i = 0, n;
	uint8_t rex = 0, modrm;

	if (i < len && c[i] == 0x3e)
		i++;                            /* notrack */
	if (i < len && (c[i] & 0xf0) == 0x40)
		rex = c[i++];
	if (i + 1 >= len || c[i] != 0xff || ((c[i + 1] >> 3) & 7) != op)
		return 0;
	modrm = c[i + 1];
	out[0] = (uint8_t)(0x4c | (rex & 0x03));           /* REX.W + R, keep X and B */
	out[1] = 0x8b;
	out[2] = (uint8_t)((modrm & 0xc7) | (3 << 3));      /* reg = r11 (with REX.R) */
	n = len - (i + 2);
	memcpy(out + 3, c + i + 2, n);
	*rip_at = (modrm & 0xc7) == 0x05 ? 3 : 0;           /* mod 00, rm 101: rip+disp32 */
	return 3 + n;
}

/* tramp.S reads these fields (its fast path for a known callee). */
_Static_assert(offsetof(ag_indirect_site, cache) == 16, "IS_CACHE in tramp.S");
_Static_assert(offsetof(ag_indirect_site, known_ids) == 24, "IS_KNOWN_IDS in tramp.S");
_Static_assert(offsetof(ag_indirect_site, known_targets) == 56, "IS_KNOWN_TARGETS in tramp.S");
_Static_assert(AG_SLOW_INDIRECT == 4 && TRACE_ENTRY == 0 && TRACE_EXIT == 1, "tramp.S");
_Static_assert(offsetof(ag_indirect_cache, entry_word) == 8 &&
	       offsetof(ag_indirect_cache, exit_word) == 16, "tramp.S");
_Static_assert(offsetof(ag_indirect_cache, untraced) == 24, "emit.c: cache + 24");

/* An indirect call: the callee is known only at run time (see emit.c). */
static int prepare_indirect(ag_module *m, const ca_site *s, uint32_t si, ag_patch *p, ag_patch *sb)
{
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + s->addr);
	ag_indirect_site *is = ag_alloc(sizeof *is);
	ag_indirect_cache *cache = (ag_indirect_cache *)ag_pool_data(m->pool, sizeof *cache);
	uint8_t scratch[2 * AG_AREA_MAX], *rx, *rw;
	ag_area_spec spec;
	uint64_t ra;
	size_t len;

	if (!is || !cache)
		return -1;
	memset(&spec, 0, sizeof spec);
	bool tail = s->kind == CA_SITE_TAIL_INDIRECT;

	spec.load_len = (uint8_t)load_of_call(code, s->len, tail ? 4 : 2, spec.load,
					      &spec.load_rip_at);
	if (!spec.load_len) {
		skipped_kind++;
		return -1;
	}
	if (spec.load_rip_at) {
		int32_t disp;

		memcpy(&disp, code + s->len - 4, 4);
		spec.load_rip_target = m->bias + s->addr + s->len + (uint64_t)(int64_t)disp;
	}
	*is = (ag_indirect_site){ .m = m, .site = si, .cache = cache, .next = indirect_sites };
	indirect_sites = is;     /* under the instrument lock */
	saved_cache = cache;
	if (!ag_pool_code(m->pool, AG_AREA_MAX, &rx, &rw))
		return -1;
	spec.site = m->bias + s->addr;
	spec.site_len = s->len;
	spec.slow_instr = ag_pool_tramp(m->pool);
	spec.indirect_ref = is;
	spec.cache = (uint64_t)(uintptr_t)cache;
	spec.tls_offset = ag_tls_offset();
	spec.tls_target_offset = ag_tls_target_offset();
	spec.tail_jump = tail;
	if (!tail && (spec.budget_modes = ag_budget_modes())) {
		spec.tls_counts_offset = ag_tls_counts_offset();
		spec.tls_tick_offset = ag_tls_tick_offset();
	}
	bool window = s->method == CA_PATCH_RELOCATE && s->reloc_rip != CA_RELOC_RIP_UNKNOWN &&
		      !ag_reloc_gave_up() &&
		      !one_byte_insn(*(const uint8_t *)(uintptr_t)(m->bias + s->patch_addr));

	if (window) {
		/* The instructions before the call run first in the area, right
		 * after its endbr64 (ag_emit_indirect), at rx + 4. */
		spec.prefix_len = (uint8_t)(s->addr - s->patch_addr);
		memcpy(spec.prefix, (const void *)(uintptr_t)(m->bias + s->patch_addr),
		       spec.prefix_len);
		if (s->reloc_rip && s->reloc_rip - 1u + 4 <= spec.prefix_len) {
			/* A RIP-relative operand, re-aimed: the copy sits
			 * (rx + 4) - window bytes further on. */
			int32_t d;
			int64_t nd;

			memcpy(&d, spec.prefix + s->reloc_rip - 1, 4);
			nd = (int64_t)d - (int64_t)((uint64_t)(uintptr_t)rx + 4 - (m->bias + s->patch_addr));
			if (nd == (int32_t)nd)
				memcpy(spec.prefix + s->reloc_rip - 1, &(int32_t){ (int32_t)nd }, 4);
			else
				window = false;
		} else if (s->reloc_rip) {
			window = false;
		}
		if (!window)
			spec.prefix_len = 0;
	}
	len = ag_emit_indirect(&spec, scratch, (uint64_t)(uintptr_t)rx);
	if (len > AG_SLOT_CODE) {
		ag_log("instrument: indirect area of %zu bytes overflows its slot", len);
		return -1;
	}
	ra = spec.site + s->len - 1;
	memcpy(rw, scratch, len);
	slot_words(rw, ra + 1, 0);
	if (s->method == CA_PATCH_RELOCATE || s->method == CA_PATCH_TRAP)
		return trap_patch(m, s, window, rx, p);
	return site_patch(m, s, rx, p, sb);
}

/*
 * Opcodes of one-byte instructions (push/pop, nop/xchg, cdq, lahf/sahf,
 * string instructions without prefix, leave, flag instructions...).  A
 * window that starts with one is not used: a thread standing right after
 * the window's int3 must be one that executed it (see the SIGTRAP handler
 * in patch.c), never one that ran the old instruction.
 */
static bool one_byte_insn(uint8_t b)
{
	return (b >= 0x50 && b <= 0x5f) || (b >= 0x90 && b <= 0x99) || (b >= 0x9b && b <= 0x9f) ||
	       (b >= 0xa4 && b <= 0xa7) || (b >= 0xaa && b <= 0xaf) || (b >= 0x6c && b <= 0x6f) ||
	       (b >= 0xec && b <= 0xef) || b == 0xc9 || b == 0xcc || b == 0xd7 || b == 0xf4 ||
	       b == 0xf5 || (b >= 0xf8 && b <= 0xfd);
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
	int64_t rel = (int64_t)((uint64_t)(uintptr_t)rx - (at + 5));

	if (window) {
		r = ag_alloc(sizeof *r);
		if (!r || rel != (int32_t)rel)
			return -1;
	}
	if (ag_trap_site_add(at, (uint64_t)(uintptr_t)rx, !window))
		return -1;
	memset(p, 0, sizeof *p);
	p->addr = at;
	p->len = 1;
	memcpy(p->old, (const void *)(uintptr_t)at, window ? 5 : 1);
	p->new[0] = 0xcc;
	p->redirect = (uint64_t)(uintptr_t)rx;
	if (window) {
		*r = (ag_reloc){ .start = at, .end = m->bias + s->addr + s->len,
				 .copy = (uint64_t)(uintptr_t)rx + 4, .jump = *p };
		r->jump.len = 5;
		r->jump.new[0] = 0xe9;
		memcpy(r->jump.new + 1, &(int32_t){ (int32_t)rel }, 4);
		saved_reloc = r;
	}
	return 0;
}

/*
 * Ids of (indirect site, callee) pairs beyond a site's first eight, in one
 * table for all sites: a megamorphic site (a dispatch over many types)
 * must not take a new id -- and a record in the sites file -- at every
 * miss.  Under its own lock (a miss holds only its site's lock).
 */
#define PAIR_SLOTS (1u << 16)                 /* a power of two */

typedef struct pair {
	const ag_indirect_site *is;
	uint64_t target;
	uint32_t id;
} pair;

static pair *pairs;
static uint32_t npairs;
static volatile int pair_lock;

static size_t pair_hash(const ag_indirect_site *is, uint64_t target)
{
	return (size_t)((((uint64_t)(uintptr_t)is ^ target) * 0x9e3779b97f4a7c15ull) >> 48) &
	       (PAIR_SLOTS - 1);
}

/* The pair's id, else a new one from make(); 0 if none can be had. */
static uint32_t pair_id(const ag_indirect_site *is, uint64_t target, const trace_site *ts)
{
	uint32_t id = 0;
	size_t h = pair_hash(is, target);

	while (__atomic_exchange_n(&pair_lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	if (!pairs)
		pairs = ag_alloc(PAIR_SLOTS * sizeof *pairs);
	if (pairs) {
		while (pairs[h].is && !(pairs[h].is == is && pairs[h].target == target))
			h = (h + 1) & (PAIR_SLOTS - 1);
		if (pairs[h].is) {
			id = pairs[h].id;
		} else {
			id = new_site(ts);
			if (id && npairs < PAIR_SLOTS / 4 * 3) {
				pairs[h] = (pair){ is, target, id };
				npairs++;
			}
		}
	}
	__atomic_store_n(&pair_lock, 0, __ATOMIC_RELEASE);
	return id;
}

/*
 * A callee reached through an indirect site for the first time (or after
 * another one): instrument it if it is a function of a traced module, give
 * the (site, callee) pair a site id, and point the site's cache at it.
 */
uint64_t ag_indirect_miss(ag_indirect_site *is, uint64_t target)
{
	const ca_site *s = ca_module_sites(is->m->ca, NULL) + is->site;
	const ca_func *funcs = ca_module_funcs(is->m->ca, NULL);
	uint32_t id = 0;
	size_t k;

	while (__atomic_exchange_n(&is->lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	if (s->kind == CA_SITE_TAIL_INDIRECT) {
		uint64_t lo = is->m->bias + funcs[s->func].addr, hi = lo + funcs[s->func].size;

		if (target >= lo && target < hi) {
			/* A jump within F (computed goto): not a call, no record. */
			__atomic_add_fetch(&tail_internal, 1, __ATOMIC_RELAXED);
			__atomic_store_n(&is->cache->entry_word, 0, __ATOMIC_RELAXED);
			__atomic_store_n(&is->cache->target, target, __ATOMIC_RELEASE);
			__atomic_store_n(&is->lock, 0, __ATOMIC_RELEASE);
			return 1;
		}
	}
	if (ag_runtime_code(target)) {
		/* Into runtime-managed code: no record, and the area calls it
		 * with the caller's return address (answer 2, see emit.c). */
		__atomic_add_fetch(&untraced_misses, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->untraced, target, __ATOMIC_RELEASE);
		__atomic_store_n(&is->lock, 0, __ATOMIC_RELEASE);
		return 2;
	}
	for (k = 0; k < 8 && is->known_ids[k]; k++)
		if (is->known_targets[k] == target) {
			id = is->known_ids[k];
			break;
		}
	if (!id) {
		ag_module *cm = ag_module_of(target);
		uint32_t f = cm ? ca_func_at(cm->ca, target - cm->bias) : CA_NONE;
		trace_site ts;

		if (f != CA_NONE && (ca_module_funcs(cm->ca, NULL)[f].addr != target - cm->bias ||
				     runtime_func(cm, f)))
			f = CA_NONE;
		memset(&ts, 0, sizeof ts);
		ts.caller_module = is->m->index;
		ts.callee_module = f != CA_NONE ? cm->index : UINT32_MAX;
		ts.site_addr = s->addr;
		ts.caller_func = funcs[s->func].addr;
		ts.callee_func = f != CA_NONE ? target - cm->bias : target;
		ts.kind = s->kind;
		if (f != CA_NONE)
			ag_instrument(cm, f);
		id = k < 8 ? new_site(&ts) : pair_id(is, target, &ts);
		if (id && k < 8) {
			is->known_targets[k] = target;
			is->known_ids[k] = id;
		}
	}
	if (id) {
		ag_budget_indirect_id(id);
		/* Words first, target last: a reader that sees the new target
		 * mostly sees its words too (see emit.c for why a race is harmless). */
		__atomic_store_n(&is->cache->entry_word, ((uint64_t)id << 2) | TRACE_ENTRY,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->exit_word, ((uint64_t)id << 2) | TRACE_EXIT,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&is->cache->target, target, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&is->lock, 0, __ATOMIC_RELEASE);
	return 1;
}

/*
 * Build the area for one site and fill its patch.  A springboard site gets a
 * second patch, *sb: the 5-byte `jmp area` written into dead padding, which
 * must be in place before the site's 2-byte jump points to it.
 * Returns 0, 1 (with a springboard), -1 to leave the site alone.
 */
static int prepare(ag_module *m, const ca_site *s, uint32_t si, ag_patch *p, ag_patch *sb)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + s->addr);
	bool tail = s->kind == CA_SITE_TAIL_DIRECT;
	ag_area_spec spec;
	ag_callee *ref;
	trace_site ts;
	uint8_t *rx, *rw;
	size_t len;
	callee c;

	if (is_indirect(s))
		return prepare_indirect(m, s, si, p, sb);
	switch (resolve(m, s, &c)) {
	case 0:
		break;
	case -2:
		skipped_runtime++;
		return -1;
	default:
		skipped_unresolved++;
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
	if (!spec.site_id || !ag_pool_code(m->pool, AG_AREA_MAX, &rx, &rw))
		return -1;
	spec.site = m->bias + s->addr;
	spec.site_len = s->len;
	spec.callee = c.entry;
	spec.slot = c.slot;
	spec.slow_instr = ag_pool_tramp(m->pool);
	spec.callee_ref = ref;
	spec.tls_offset = ag_tls_offset();
	if (tail && s->method == CA_PATCH_SPRINGBOARD) {
		/* jmp rel8 (eb) or jcc rel8 (7x): the jump itself stays, retargeted
		 * to the springboard, so the area is reached only when taken. */
		if (code[0] != 0xeb && (code[0] & 0xf0) != 0x70)
			return -1;
	} else if (tail) {
		/* jmp rel32 (e9) or jcc rel32 (0f 8x) */
		if (code[0] == 0x0f && (code[1] & 0xf0) == 0x80) {
			spec.cond = true;
			spec.cond_code = code[1] & 0x0f;
		} else if (code[0] != 0xe9) {
			return -1;
		}
	}
	/* A tail jump through the PLT goes to the stub: it jumps on via the slot. */
	if (tail)
		spec.callee = c.slot ? m->bias + s->target : c.entry;
	else if (!(ts.flags & TRACE_SITE_NO_EXIT))
		join_values(c.m, c.func, &spec);
	/* Emitted into scratch first: only an area that fits reaches the pool. */
	{
		uint8_t scratch[2 * AG_AREA_MAX];
		uint64_t ret_word = (uint64_t)(uintptr_t)rx + AG_SLOT_RET;

		if (tail)
			len = ag_emit_tail(&spec, scratch, (uint64_t)(uintptr_t)rx);
		else if (ts.flags & TRACE_SITE_NO_EXIT)
			len = ag_emit_call_noexit(&spec, scratch, (uint64_t)(uintptr_t)rx, ret_word);
		else if (!spec.value_arg && !spec.value_ret &&     /* a join's calls stay timed */
			 (spec.budget_mode = ag_budget_site(m->pool, spec.site_id))) {
			spec.tls_counts_offset = ag_tls_counts_offset();
			spec.tls_tick_offset = ag_tls_tick_offset();
			len = ag_emit_call_budget(&spec, scratch, (uint64_t)(uintptr_t)rx);
		} else
			len = ag_emit_call(&spec, scratch, (uint64_t)(uintptr_t)rx);
		if (len > AG_SLOT_CODE && spec.value_arg && spec.value_ret) {
			/* both values do not fit: the argument only */
			ag_log("join: the area of a call of %s has no room for its return value "
			       "too: its argument only", ca_str(c.m->ca,
			       ca_module_funcs(c.m->ca, NULL)[c.func].name));
			spec.value_ret = false;
			len = ag_emit_call(&spec, scratch, (uint64_t)(uintptr_t)rx);
		}
		if (len > AG_SLOT_CODE) {
			ag_log("instrument: area of %zu bytes overflows its %d-byte slot", len,
			       AG_AREA_MAX);
			return -1;
		}
		memcpy(rw, scratch, len);
		slot_words(rw, spec.site + s->len, spec.site_id);
	}
	return site_patch(m, s, rx, p, sb);
}

/* The patch that sends site s to the area at rx (directly or through a
 * springboard).  Returns 0, 1 (with a springboard in *sb), -1. */
static int site_patch(ag_module *m, const ca_site *s, uint8_t *rx, ag_patch *p, ag_patch *sb)
{
	const uint8_t *code = (const uint8_t *)(uintptr_t)(m->bias + s->addr);
	int64_t rel;

	memset(p, 0, sizeof *p);
	p->addr = m->bias + s->addr;
	p->len = s->len;
	memcpy(p->old, code, s->len);
	if (s->method == CA_PATCH_SPRINGBOARD) {
		uint64_t at = m->bias + s->patch_addr;
		int64_t d8 = (int64_t)(at - (p->addr + 2));

		memset(sb, 0, sizeof *sb);
		sb->addr = at;
		sb->len = 5;
		memcpy(sb->old, (const void *)(uintptr_t)at, 5);
		rel = (int64_t)((uint64_t)(uintptr_t)rx - (at + 5));
		if (rel != (int32_t)rel || d8 != (int8_t)d8)
			return -1;
		sb->new[0] = 0xe9;
		memcpy(sb->new + 1, &(int32_t){ (int32_t)rel }, 4);
		sb->redirect = (uint64_t)(uintptr_t)rx;
		/* A jmp/jcc rel8 stays the same jump, retargeted to the springboard;
		 * a short indirect call becomes jmp rel8. */
		p->new[0] = (p->old[0] == 0xeb || (p->old[0] & 0xf0) == 0x70) ? p->old[0] : 0xeb;
		p->new[1] = (uint8_t)(int8_t)d8;
		p->redirect = at;
		return 1;
	}
	rel = (int64_t)((uint64_t)(uintptr_t)rx - (p->addr + 5));
	if (rel != (int32_t)rel)
		return -1;
	p->new[0] = 0xe9;                                  /* jmp rel32 area */
	memcpy(p->new + 1, &(int32_t){ (int32_t)rel }, 4);
	memset(p->new + 5, 0xcc, s->len - 5u);             /* never executed */
	p->redirect = (uint64_t)(uintptr_t)rx;
	return 0;
}

/* Publish a batch: springboards first (a site may jump to one only once it
 * is whole), then the sites.  (The areas' unwind information was registered
 * with their pool.) */
static int flush(ag_patch *batch, size_t nb, ag_patch *boards, size_t nsb)
{
	if (nb == 0)
		return 0;
	return ag_patch_apply(boards, nsb) || ag_patch_apply(batch, nb);
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

static void save_site(ag_module *m, uint32_t si, const ag_patch *p, const ag_patch *sb)
{
	site_saved *sv;

	if (!m->site_saved || !(sv = ag_alloc(sizeof *sv)))
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
	pair_lock = 0;
	sites_lock = 0;
	for (ag_indirect_site *is = indirect_sites; is; is = is->next)
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

/*
 * instrument(F), with look-ahead: F's direct callees in the same module,
 * and when F was reached from a call in C, C's other direct callees (the
 * calls C makes next), join the batch -- with the .cold/.part fragments of
 * all of them, which are their code too.  The cost of a batch is mostly
 * fixed -- three writes to /proc/self/mem and three core serialisations --
 * so reaching those functions then costs nothing more; functions reached
 * through them start the next batch.
 */
#define LOOKAHEAD_MAX 1024
#define SEEN_SLOTS 4096                 /* a power of two, > 2 * LOOKAHEAD_MAX */

/* The batch's functions (under the instrument lock, so static). */
typedef struct todo {
	uint32_t func[LOOKAHEAD_MAX];
	uint8_t depth[LOOKAHEAD_MAX];
	uint32_t n;
	uint64_t seen[SEEN_SLOTS];      /* (round << 32) | (func + 1): already listed */
	uint64_t round;
} todo;

static todo work;

static void todo_add(todo *t, ag_module *m, uint32_t f, uint8_t depth)
{
	uint64_t key = t->round << 32 | (uint64_t)(f + 1);
	size_t h = (f * 2654435761u) & (SEEN_SLOTS - 1);

	if (t->n >= LOOKAHEAD_MAX || (m->func_state[f] & AG_FUNC_INSTRUMENTED) ||
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

/* Under the instrument lock. */
static ag_patch batch[1024], boards[1024];
static size_t nb, nsb;

static int add_sites(ag_module *m, uint32_t func, todo *t, uint8_t depth)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	const ca_site *sites = ca_module_sites(m->ca, NULL);
	int rc = 0;

	if (m->first_fragment)
		for (uint32_t c = m->first_fragment[func]; c != CA_NONE; c = m->next_fragment[c])
			todo_add(t, m, c, depth);
	if (reads_own_frame(m, func) || runs_in_thread_end(m, func)) {
		skipped_plan += funcs[func].nsites;
		return 0;
	}
	for (uint32_t i = 0; i < funcs[func].nsites; i++) {
		uint32_t si = funcs[func].first_site + i;
		const ca_site *s = &sites[si];

		if (!patchable(s)) {
			skipped_kind++;
			continue;
		}
		if (!(s->method == CA_PATCH_DIRECT && s->len >= 5) &&
		    !(s->method == CA_PATCH_SPRINGBOARD &&
		      (s->kind == CA_SITE_TAIL_DIRECT || is_indirect(s))) &&
		    !((s->method == CA_PATCH_RELOCATE || s->method == CA_PATCH_TRAP) &&
		      is_indirect(s) && !signals_blocked(m, func))) {
			skipped_plan++;
			continue;
		}
		if (depth == 0 && (s->kind == CA_SITE_DIRECT || s->kind == CA_SITE_TAIL_DIRECT) &&
		    s->callee != CA_NONE && !(funcs[s->callee].flags & CA_FUNC_PLT))
			todo_add(t, m, s->callee, 1);
		site_saved *sv = m->site_saved ? m->site_saved[si] : NULL;

		if (sv && ((sv->reloc && ag_reloc_gave_up()) || ag_trap_site_retired(sv->p.addr))) {
			skipped_plan++;         /* a window not used any more, a hot trap */
		} else if (sv) {
			/* Patched in an earlier activation: the same area again. */
			batch[nb++] = sv->p;
			if (sv->has_sb)
				boards[nsb++] = sv->sb;
			if (sv->reloc)
				ag_reloc_queue(sv->reloc);
		} else if (!code_as_analysed(m, s)) {
			if (m->sites_changed++ == 0)
				ag_log("module %s: site %#lx left alone: its bytes are not those the "
				       "analysis saw (more such sites are counted at the end)",
				       m->path, (unsigned long)(m->bias + s->addr));
		} else {
			saved_flag = NULL;
			saved_cache = NULL;
			saved_reloc = NULL;
			int r = prepare(m, s, si, &batch[nb], &boards[nsb]);

			if (r >= 0) {
				save_site(m, si, &batch[nb], r == 1 ? &boards[nsb] : NULL);
				if (saved_reloc)
					ag_reloc_queue(saved_reloc);
				nb++;
				nsb += r == 1;
			}
		}
		if (nb == sizeof batch / sizeof *batch) {
			rc |= flush(batch, nb, boards, nsb);
			nb = nsb = 0;
		}
	}
	return rc;
}

static int instrument(ag_module *m, uint32_t func, ag_module *cm, uint32_t caller,
		      uint64_t wait_ns);

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

/* The caller's direct callees in m that are not instrumented yet. */
static void add_siblings(todo *t, ag_module *m, uint32_t caller)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	const ca_site *sites = ca_module_sites(m->ca, NULL);

	for (uint32_t i = 0; i < funcs[caller].nsites; i++) {
		const ca_site *s = &sites[funcs[caller].first_site + i];

		if ((s->kind == CA_SITE_DIRECT || s->kind == CA_SITE_TAIL_DIRECT) &&
		    s->callee != CA_NONE && !(funcs[s->callee].flags & CA_FUNC_PLT))
			todo_add(t, m, s->callee, 1);
	}
}

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
	todo *t = &work;
	int rc = 0;

	ca_module_funcs(m->ca, &nfuncs);
	if (func >= nfuncs || runtime_func(m, func) || !ag_module_ready(m))
		return -1;
	/* Published with release below: done already, no lock to wait for. */
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
	nb = nsb = 0;
	t->n = 0;
	t->round++;
	todo_add(t, m, func, 0);
	if (cm == m && caller != CA_NONE && caller < nfuncs)
		add_siblings(t, m, caller);
	for (uint32_t k = 0; k < t->n; k++)
		rc |= add_sites(m, t->func[k], t, t->depth[k]);
	rc |= flush(batch, nb, boards, nsb);
	nb = nsb = 0;
	/* Published last: areas that test these flags now go straight on. */
	for (uint32_t k = 0; k < t->n; k++)
		__atomic_store_n(&m->func_state[t->func[k]], AG_FUNC_INSTRUMENTED, __ATOMIC_RELEASE);
	unlock();
	ag_patch_release();
	return rc;
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
	*indirect = untraced_misses;
	return skipped_runtime;
}

void ag_instrument_stats(uint64_t *sites, uint64_t *kind, uint64_t *plan, uint64_t *unresolved,
			 uint64_t *internal)
{
	*internal = tail_internal;
	*sites = next_site ? *next_site - 1 : 0;
	*kind = skipped_kind;
	*plan = skipped_plan;
	*unresolved = skipped_unresolved;
}
