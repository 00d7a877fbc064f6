/*
 * modules.c — the modules the agent traces and their code analysis.
 *
 * Every module loaded at start (the executable and its shared libraries) is
 * looked up in the repository.  The sptrace command analyses the modules
 * the repository lacks before it starts the program or injects the agent
 * (cli/preanalyze.c), so the agent normally only reads entries.  One still
 * missing (dlopen'd later, or a program exec'd from the traced one) is
 * analysed here, while the agent is dormant or on the control thread, and
 * WITHOUT source lines: the agent does not need them to patch, and reading
 * them forks a DWARF reader (codeanalysis/lines.c) -- a child process of
 * the program's own, whose SIGCHLD a server waiting in sigwaitinfo() takes,
 * whose fork runs the program's pthread_atfork handlers and waits for its
 * stdio locks (an attach hung while main sat in fgets(stdin)).  Such an
 * entry is stored at once, marked lines-pending; whoever reads lines later
 * (replay --srcline, analyze-binary) completes it outside the program.
 * A module's patch-area pool and its per-function state are created when
 * its first function is instrumented.
 *
 * Attached (sptrace attach), the repository entries are read by the control
 * thread after the agent has reported itself dormant: the program is not
 * waiting for them, and a command that attaches should not either.  An
 * activation before they are all in waits for them (ag_modules_wait); a
 * module is invisible (ag_module_of) until its entry is in.
 *
 * Not traced: the agent itself and the vDSO.  The agent shares no library
 * with the program but the C library and the loader (agent/meson.build
 * links the rest in, private), so every library the program loads is the
 * program's and traced; one that cannot be (no analysis, no patch-area pool
 * within reach) is named in agent.log and meta ("untraced" lines, which
 * the command's summary prints).
 * Modules loaded later with dlopen are found by the control thread, which
 * registers them in meta first (so that, should the program end before
 * their analysis does, `sptrace run` analyses them afterwards and the next
 * run finds them) and then reads or makes their analyses off the program's
 * threads (ag_modules_refresh).
 *
 * Nor is code a language runtime manages (the analysis names it: Go's text,
 * V8's embedded builtins, see codeanalysis/runtimes.c): the runtime walks
 * its stacks by return address and aborts on one in a patch area.  Such a
 * module is traced outside those regions; each region is named in agent.log
 * and meta ("runtime" lines, which sptrace run sums up).
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#define MAX_MODULES 1024

char ag_repo_dir[4096];               /* "" : the default repository */
/* Attached by another user (root): the repository sptrace attach analysed
 * the process's modules into, its own.  The agent reads entries there when
 * its own repository lacks them, and writes only into its own. */
char ag_prepared_dir[4096];
static ag_module *modules[MAX_MODULES];
static uint32_t nmodules;
static volatile int ready_lock;

/* Modules that cannot be traced, with why: in agent.log at once, and in
 * meta by ag_modules_untraced_meta (the first ones are found before meta is
 * written). */
#define MAX_UNTRACED 64
static struct {
	char name[512], why[512];
	bool written;            /* its meta line */
} untraced[MAX_UNTRACED];
static uint32_t nuntraced;

static void note_untraced(const char *path, const char *why)
{
	size_t len = strlen(path);

	ag_log("module %s not traced: %s", path, why);
	if (strncmp(why, path, len) == 0 && strncmp(why + len, ": ", 2) == 0)
		why += len + 2;          /* the error names the file: it is named already */
	if (nuntraced >= MAX_UNTRACED)
		return;
	snprintf(untraced[nuntraced].name, sizeof untraced[nuntraced].name, "%s", path);
	snprintf(untraced[nuntraced].why, sizeof untraced[nuntraced].why, "%s", why);
	nuntraced++;
}

/* Their meta lines, those not written yet. */
void ag_modules_untraced_meta(void)
{
	for (uint32_t k = 0; k < nuntraced; k++)
		if (!untraced[k].written) {
			untraced[k].written = true;
			ag_meta_untraced(untraced[k].name, untraced[k].why);
		}
}

/* The agent itself (also found by address: attached, its name is
 * /proc/self/fd/N) and the vDSO. */
static bool skip_object(const char *path)
{
	const char *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	return strncmp(base, "linux-vdso", 10) == 0 || strncmp(base, "linux-gate", 10) == 0 ||
	       strncmp(base, "libsptrace-agent.so", 19) == 0;
}

typedef struct load_ctx {
	char *err;
	size_t errlen;
	int failed;
	bool defer;          /* register only; ag_modules_load reads the entries */
} load_ctx;

static volatile int all_loaded = 1;      /* 0 while entries are deferred */
static volatile int load_lock;

/* The run-time range of an object's executable segments; false if none. */
/* The agent's own code, found with the modules (it is never one). */
static uint64_t self_lo, self_hi;

bool ag_agent_code_holds(uint64_t addr)
{
	return addr >= self_lo && addr < self_hi;
}

static bool code_range(const struct dl_phdr_info *info, uint64_t *lo, uint64_t *hi)
{
	*lo = UINT64_MAX;
	*hi = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		if (info->dlpi_addr + ph->p_vaddr < *lo)
			*lo = info->dlpi_addr + ph->p_vaddr;
		if (info->dlpi_addr + ph->p_vaddr + ph->p_memsz > *hi)
			*hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
	}
	return *lo < *hi;
}

/* The agent reads functions and call sites only (ca_options.calls_only),
 * and never reads source lines (see the header comment). */
static const ca_options calls_view = { .calls_only = 1, .no_lines = 1 };

/*
 * May the prepared repository be read?  Its entries are trusted like our
 * own, so it must belong to root or to this process's user: sptrace attach
 * only names it then, and this makes sure nobody else's takes its place.
 */
static bool prepared_ok(void)
{
	struct stat st;

	if (!ag_prepared_dir[0] ||
	    strcmp(ag_prepared_dir, ag_repo_dir[0] ? ag_repo_dir : ca_repo_default_dir()) == 0)
		return false;
	if (stat(ag_prepared_dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
	    (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & S_IWOTH)) {
		ag_log("repository %s (from sptrace attach) not read: not a directory of root's "
		       "or this user's that only they can write", ag_prepared_dir);
		ag_prepared_dir[0] = '\0';
		return false;
	}
	return true;
}

/*
 * The calls images whose every record was checked (codeanalysis/image.c,
 * step 2): by this process, or by the images before it in the run -- each
 * exec passes its list on in SPTRACE_IMAGES (exec.c), so a traced shell's
 * children skip the pass over the C library's image (0.1 ms of their
 * start).  A forked child has its parent's.  Appended under the load (start,
 * the control thread), read by any thread: each entry is written before the
 * count that shows it.
 */
#define MAX_CHECKED 32
static ca_image_id checked_ids[MAX_CHECKED];
static volatile uint32_t nchecked;

static bool image_seen(const ca_image_id *id)
{
	uint32_t n = __atomic_load_n(&nchecked, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < n; i++)
		if (memcmp(&checked_ids[i], id, sizeof *id) == 0)
			return true;
	return false;
}

static void image_checked(const ca_image_id *id)
{
	uint32_t n = __atomic_load_n(&nchecked, __ATOMIC_ACQUIRE);

	if (n >= MAX_CHECKED || image_seen(id))
		return;
	checked_ids[n] = *id;
	__atomic_store_n(&nchecked, n + 1, __ATOMIC_RELEASE);
}

static const ca_image_memo image_memo = { image_seen, image_checked };

/* SPTRACE_IMAGES: "DEV.INO.SIZE.CTIME.NONCE" in hex, comma-separated. */
void ag_modules_images_init(const char *env)
{
	ca_image_set_memo(&image_memo);
	while (env && *env) {
		uint64_t v[5];
		const char *p = env;
		char *end = NULL;

		for (int k = 0; k < 5; k++, p = end + 1) {
			v[k] = strtoull(p, &end, 16);
			if (end == p || !(k < 4 ? *end == '.' : *end == ',' || *end == '\0'))
				return;         /* not ours: the images are checked */
		}
		image_checked(&(ca_image_id){ v[0], v[1], v[2], v[3], v[4] });
		env = *end ? end + 1 : end;
	}
}

/* The same, for an exec'd image (on the stack: a vfork child may call it).
 * False: it does not fit, or there is none. */
bool ag_modules_images_env(char *out, size_t len)
{
	uint32_t n = __atomic_load_n(&nchecked, __ATOMIC_ACQUIRE);
	size_t used = 0;

	for (uint32_t i = 0; i < n; i++) {
		int k = snprintf(out + used, len - used, "%s%llx.%llx.%llx.%llx.%llx", i ? "," : "",
				 (unsigned long long)checked_ids[i].dev,
				 (unsigned long long)checked_ids[i].ino,
				 (unsigned long long)checked_ids[i].size,
				 (unsigned long long)checked_ids[i].ctime_ns,
				 (unsigned long long)checked_ids[i].nonce);

		if (k < 0 || (size_t)k >= len - used)
			return false;
		used += (size_t)k;
	}
	return n > 0;
}

/* The module's code analysis: its repository entry (ours, else the one
 * sptrace attach prepared), else analysed now and stored in ours. */
static int analysis_of(const ag_module *m, ca_module **ca, int *from_repo, sp_err *e)
{
	const char *own = ag_repo_dir[0] ? ag_repo_dir : NULL;
	sp_err ignored;

	if (prepared_ok() && (ca_repo_load_calls(own, m->key, ca, &ignored) == 0 ||
			      ca_repo_load_calls(ag_prepared_dir, m->key, ca, &ignored) == 0)) {
		*from_repo = 1;
		return 0;
	}
	ca_options opt = calls_view;

	opt.key = m->key;               /* add_object read it: not again */
	return ca_repo_get(own, m->path, &opt, ca, from_repo, e);
}

static void log_module(const ag_module *m, int from_repo)
{
	size_t nr;
	const ca_runtime *r = ca_module_runtimes(m->ca, &nr);

	ag_log("module %u: %s bias %#lx, %u functions, %u sites (%s%s)", m->index, m->path,
	       (unsigned long)m->bias, ca_module_stats(m->ca)->nfuncs, ca_module_stats(m->ca)->nsites,
	       from_repo ? "from the repository"
	       : ca_module_untrusted(m->ca)[0] ? "analysed now, without source lines, not stored: "
	       "the file is " : "analysed now, without source lines, and stored",
	       from_repo ? "" : ca_module_untrusted(m->ca));
	for (size_t i = 0; i < nr; i++)
		ag_log("module %s: %s at %#lx-%#lx (%s): its code is not patched, calls into it "
		       "are not traced, stack walks stop there (the runtime reads return "
		       "addresses)", m->path, ca_runtime_kind_name(r[i].kind),
		       (unsigned long)(m->bias + r[i].lo), (unsigned long)(m->bias + r[i].hi),
		       ca_str(m->ca, r[i].how));
}

/* The code of objects that are not traced modules (the vDSO, the agent's own
 * libraries): a stack walk may go through them, unlike through code no object
 * holds (a JIT's). */
#define MAX_OTHER 64
static struct { uint64_t lo, hi; } other_code[MAX_OTHER];
static uint32_t nother;

static void note_other_code(uint64_t lo, uint64_t hi)
{
	if (nother < MAX_OTHER) {
		other_code[nother].lo = lo;
		other_code[nother].hi = hi;
		__atomic_store_n(&nother, nother + 1, __ATOMIC_RELEASE);
	}
}

/* Its pool and function states now (see ag_module_ready), or say why not. */
static void make_ready(ag_module *m)
{
	ag_module_ready(m);       /* says why if not */
}

/* Add m to the list; readers see it whole. */
static void publish(ag_module *m)
{
	m->index = nmodules;
	modules[nmodules] = m;
	__atomic_store_n(&nmodules, nmodules + 1, __ATOMIC_RELEASE);
}

/* The module's key (its build-id) from its notes as loaded: no open and
 * read of its file at every start -- and the key of the code that runs,
 * even if the file was replaced since. */
static bool key_in_memory(const struct dl_phdr_info *info, char *key, size_t keylen)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type == PT_NOTE &&
		    ca_module_key_of_notes((const void *)(uintptr_t)(info->dlpi_addr + ph->p_vaddr),
					   ph->p_memsz, ph->p_align, key, keylen) == 0)
			return true;
	}
	return false;
}

static int add_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	load_ctx *lc = arg;
	ag_module *m;
	sp_err e = { "" };
	int from_repo = 0;
	uint64_t lo, hi;

	if (nmodules >= MAX_MODULES)
		return 1;
	if (nmodules > 0 && (!info->dlpi_name || !info->dlpi_name[0]))
		return 0;                          /* only the executable has no name */
	if (!code_range(info, &lo, &hi))
		return 0;
	/* The agent itself (attached, it is /proc/self/fd/N, not by name). */
	if ((uint64_t)(uintptr_t)add_object >= lo && (uint64_t)(uintptr_t)add_object < hi) {
		self_lo = lo;
		self_hi = hi;
		note_other_code(lo, hi);
		return 0;
	}
	m = ag_alloc(sizeof *m);
	if (!m)
		return 1;
	if (nmodules == 0) {
		ssize_t n = readlink("/proc/self/exe", m->path, sizeof m->path - 1);

		if (n <= 0) {
			snprintf(lc->err, lc->errlen, "cannot read /proc/self/exe: %s", strerror(errno));
			lc->failed = 1;
			return 1;
		}
		m->path[n] = '\0';
	} else {
		snprintf(m->path, sizeof m->path, "%s", info->dlpi_name);
		if (skip_object(m->path)) {
			note_other_code(lo, hi);
			return 0;
		}
	}
	m->bias = info->dlpi_addr;
	m->text_lo = lo;
	m->text_hi = hi;
	if (!key_in_memory(info, m->key, sizeof m->key) &&
	    ca_module_key_of(m->path, m->key, sizeof m->key, &e) < 0) {
		if (nmodules == 0) {
			snprintf(lc->err, lc->errlen, "%.1000s", e.msg);
			lc->failed = 1;
			return 1;
		}
		note_untraced(m->path, e.msg);
		return 0;
	}
	if (lc->defer) {
		publish(m);
		return 0;
	}
	if (analysis_of(m, &m->ca, &from_repo, &e)) {
		if (nmodules == 0) {
			snprintf(lc->err, lc->errlen, "analysing %.1000s: %.1000s", m->path, e.msg);
			lc->failed = 1;
			return 1;
		}
		note_untraced(m->path, e.msg);
		return 0;
	}
	publish(m);
	log_module(m, from_repo);
	ag_lookahead_profile(m);
	return 0;
}

/*
 * Modules loaded since the last look (dlopen): the C library counts loads
 * and unloads (dlpi_adds, dlpi_subs), so a look costs one dl_iterate_phdr
 * when nothing changed.  Called by the control thread only.
 */
static int count_loads(struct dl_phdr_info *info, size_t size, void *arg)
{
	*(unsigned long long *)arg = info->dlpi_adds;
	return 1;
}

static bool known(uint64_t lo)
{
	for (uint32_t i = 0; i < nmodules; i++)
		if (modules[i]->text_lo == lo)
			return true;
	return false;
}

static int add_new_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	uint64_t lo, hi;

	if (!code_range(info, &lo, &hi) || known(lo) || !info->dlpi_name || !info->dlpi_name[0])
		return 0;
	return add_object(info, size, arg);
}

static bool load_entry(ag_module *m);
/* Held while the loader's module list is walked (dl_iterate_phdr takes
 * the loader's _dl_load_write_lock), and by a fork's prepare handler:
 * glibc 2.36's fork does not take that lock, so a fork while the control
 * thread walked gave a child whose lock was held for ever, and its next
 * dl_iterate_phdr -- an exception unwound, the agent's own look -- hung
 * (a postgres backend forked by a traced postmaster, seen). */
static volatile int register_lock;

/*
 * Register the modules loaded since the last look (key only) and name them
 * in meta, before any analysis: an analysis can take seconds (libjvm's, 24
 * MB), and a program that ends meanwhile leaves meta saying which module is
 * still wanted (`sptrace run` analyses it after the end).  The control
 * thread and the exiting thread may both look: one at a time.  Returns the
 * index of the first new module.
 */
static uint32_t register_new(void)
{
	static unsigned long long seen;
	unsigned long long adds = 0;
	char err[1024];
	load_ctx lc = { err, sizeof err, 0, true };
	uint32_t before;
	struct timespec nap = { 0, 100000 };

	while (__atomic_exchange_n(&register_lock, 1, __ATOMIC_ACQUIRE))
		nanosleep(&nap, NULL);
	before = nmodules;
	dl_iterate_phdr(count_loads, &adds);
	if (adds != seen) {
		seen = adds;
		dl_iterate_phdr(add_new_object, &lc);
		for (uint32_t i = before; i < nmodules; i++)
			ag_meta_module(modules[i]);
	}
	ag_modules_untraced_meta();
	__atomic_store_n(&register_lock, 0, __ATOMIC_RELEASE);
	return before;
}

void ag_modules_refresh(void)
{
	uint32_t first = register_new();

	/* One of them may be libgcc_s, loaded by the C library itself: its
	 * unwinder gets the areas' information before new areas exist
	 * (x86_64/unwind.c, step 3). */
	if (first < nmodules)
		ag_unwind_need(false, "a module loaded");
	for (uint32_t i = first; i < nmodules; i++)
		load_entry(modules[i]);
}

/* At exit: no analysis now (the program is ending), only the names of the
 * modules loaded since the control thread last looked. */
void ag_modules_register_late(void)
{
	register_new();
}

int ag_modules_init(char *err, size_t errlen, bool defer)
{
	load_ctx lc = { err, errlen, 0, defer };

	if (defer)
		all_loaded = 0;
	dl_iterate_phdr(add_object, &lc);
	if (lc.failed)
		return -1;
	if (nmodules == 0) {
		snprintf(err, errlen, "cannot find the executable's code segments");
		return -1;
	}
	if (defer)
		return 0;
	/* Pools now, while it is safe to register unwind information. */
	for (uint32_t i = 0; i < nmodules; i++)
		make_ready(modules[i]);
	return 0;
}

/*
 * A registered module's analysis: its entry, else made now (no lines) and
 * stored -- ca_repo_get stores before it returns, atomically (repo.c), so a
 * finished analysis is kept even if the program ends the next moment.  The
 * module becomes visible with its entry and pool.  False: not traced.
 */
static bool load_entry(ag_module *m)
{
	ca_module *ca = NULL;
	sp_err e = { "" };
	int from_repo = 0;

	if (analysis_of(m, &ca, &from_repo, &e)) {
		note_untraced(m->path, e.msg);
		ag_modules_untraced_meta();
		return false;
	}
	/* Published under the instrument lock: a fork happens under it
	 * (threads.c), so a child never inherits a pool half made. */
	ag_instrument_lock();
	__atomic_store_n(&m->ca, ca, __ATOMIC_RELEASE);
	make_ready(m);
	ag_instrument_unlock();
	log_module(m, from_repo);
	ag_lookahead_profile(m);
	ag_meta_runtimes(m);
	return true;
}

/*
 * Read the deferred repository entries (the control thread at its start, or
 * an activation that cannot wait): each module becomes visible with its
 * entry and pool.  A module whose entry cannot be had stays invisible.
 */
void ag_modules_load(void)
{
	uint64_t t0;
	struct timespec ts, nap = { 0, 100000 };
	uint32_t n, ok = 0;

	if (__atomic_load_n(&all_loaded, __ATOMIC_ACQUIRE))
		return;
	if (__atomic_exchange_n(&load_lock, 1, __ATOMIC_ACQUIRE)) {
		/* Another thread reads them: wait for it. */
		while (!__atomic_load_n(&all_loaded, __ATOMIC_ACQUIRE))
			nanosleep(&nap, NULL);
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	n = nmodules;
	for (uint32_t i = 0; i < n; i++)
		if (!modules[i]->ca && load_entry(modules[i]))
			ok++;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ag_log("code analyses of %u of %u modules in %.1f ms (after the agent was dormant)", ok,
	       n, (double)((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec - t0) / 1e6);
	__atomic_store_n(&all_loaded, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&load_lock, 0, __ATOMIC_RELEASE);
}

/* A forked child: the reader, if any, stayed in the parent. */
/* Fork handlers (threads.c): no walk of the loader's list is under way
 * while the process forks. */
void ag_modules_fork_lock(void)
{
	struct timespec nap = { 0, 100000 };

	while (__atomic_exchange_n(&register_lock, 1, __ATOMIC_ACQUIRE))
		nanosleep(&nap, NULL);
}

void ag_modules_fork_unlock(void)
{
	__atomic_store_n(&register_lock, 0, __ATOMIC_RELEASE);
}

void ag_modules_after_fork(void)
{
	load_lock = 0;
	register_lock = 0;
}

bool ag_modules_loaded(void)
{
	return __atomic_load_n(&all_loaded, __ATOMIC_ACQUIRE);
}

/* Create the module's pool and function states on first use.  In practice
 * a module is made ready as it becomes visible -- at the agent's start,
 * before any thread of the program can fork, or in load_entry under the
 * instrument lock, which a fork takes (threads.c) -- so no fork finds
 * ready_lock taken: a child could not take it again.  A caller that finds
 * the module not ready yet (instrument(), outside that lock) only meets a
 * module made ready since. */
bool ag_module_ready(ag_module *m)
{
	bool ok;

	if (__atomic_load_n(&m->func_state, __ATOMIC_ACQUIRE))
		return true;
	if (__atomic_load_n(&m->no_pool, __ATOMIC_ACQUIRE))
		return false;
	while (__atomic_exchange_n(&ready_lock, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
	if (!m->func_state && !m->no_pool) {
		size_t nfuncs;

		const ca_stats *st = ca_module_stats(m->ca);

		ca_module_funcs(m->ca, &nfuncs);
		/* A slot per site that may get an area; data: function states and
		 * a flag byte per site. */
		m->pool = ag_pool_near(m->text_lo, m->text_hi, st->nsites, st->nsites,
				       nfuncs + st->nsites * 16u, false);
		if (m->pool) {
			uint8_t *fs = ag_pool_data(m->pool, nfuncs ? nfuncs : 1);
			const ca_func *f = ca_module_funcs(m->ca, NULL);

			/* Each function's .cold/.part fragments, chained. */
			m->first_fragment = ag_alloc((nfuncs ? nfuncs : 1) * sizeof(uint32_t));
			m->next_fragment = ag_alloc((nfuncs ? nfuncs : 1) * sizeof(uint32_t));
			if (m->first_fragment && m->next_fragment) {
				memset(m->first_fragment, 0xff, nfuncs * sizeof(uint32_t));
				for (uint32_t i = 0; i < nfuncs; i++)
					if ((f[i].flags & CA_FUNC_FRAGMENT) && f[i].parent < nfuncs &&
					    f[i].parent != i) {
						m->next_fragment[i] = m->first_fragment[f[i].parent];
						m->first_fragment[f[i].parent] = i;
					}
			} else {
				m->first_fragment = NULL;
			}
			m->site_saved = ag_alloc((st->nsites ? st->nsites : 1) * sizeof *m->site_saved);
			__atomic_store_n(&m->func_state, fs, __ATOMIC_RELEASE);
		} else {
			/* Said once, and not tried again at every call into it. */
			__atomic_store_n(&m->no_pool, true, __ATOMIC_RELEASE);
			ag_log("module %s: no patch-area pool within reach of its code; it is not "
			       "traced", m->path);
			ag_meta_untraced(m->path, "no room for patch areas within 2 GiB of its code");
		}
	}
	ok = m->func_state != NULL;
	__atomic_store_n(&ready_lock, 0, __ATOMIC_RELEASE);
	return ok;
}

/* A region of runtime-managed code holds addr (see the header comment). */
bool ag_runtime_code(uint64_t addr)
{
	ag_module *m = ag_module_of(addr);

	return m && ca_runtime_at(m->ca, addr - m->bias);
}

bool ag_code_known(uint64_t addr)
{
	uint32_t n = __atomic_load_n(&nother, __ATOMIC_ACQUIRE);

	if (ag_module_of(addr) || ag_pool_holds(addr))
		return true;
	for (uint32_t i = 0; i < n; i++)
		if (addr >= other_code[i].lo && addr < other_code[i].hi)
			return true;
	return false;
}

ag_module *ag_module_of(uint64_t addr)
{
	for (uint32_t i = 0; i < nmodules; i++)
		if (addr >= modules[i]->text_lo && addr < modules[i]->text_hi)
			return __atomic_load_n(&modules[i]->ca, __ATOMIC_ACQUIRE) ? modules[i] : NULL;
	return NULL;
}

uint32_t ag_module_count(void)
{
	return nmodules;
}

ag_module *ag_module_at(uint32_t index)
{
	return index < nmodules ? modules[index] : NULL;
}
