// SPDX-License-Identifier: GPL-2.0
/*
 * core_plat.c — the kernel's platform for the propagation core the agent
 * and the module share (agent/core/core.c, compiled into the module as
 * core.o; its API and the cp_plat_* interface in agent/core/core.h).
 *
 * What the module takes from the core: the indirect-call slow path,
 * cp_indirect_miss.  indirect.c's kprobe handler (on_site) keeps a core
 * cache (cp_indirect_cache) and site (cp_indirect_site) per watched call;
 * a target its cache lacks goes to the core, which decides -- exactly as
 * in user space -- whether the (site, callee) pair is new (eight per site,
 * then the core's shared pair table), whether its callee must be reached
 * (cp_plat_reached: here, kept for user space to hook), and points the
 * cache at it so that the site's next calls of the same target stop at the
 * cache test.
 *
 * What it does not take, and why: cp_instrument (which sites of a reached
 * function are patched and how, and the look-ahead batch).
 *   1. It runs where the flow reaches a function, and patches there: the
 *      module cannot -- text_poke is not exported, and what patches text
 *      (ftrace filters, register_kprobe) sleeps, while a traced call runs
 *      with its caller's locks held (probes.c's header).
 *   2. It reads the module's ca_func/ca_site records: for the kernel they
 *      are built in user space (cli/kernel.c, from /proc/kallsyms and
 *      /proc/kcore) and never handed down; the module hooks function
 *      entries (ftrace's __fentry__), not call sites, so a site plan
 *      (jump, springboard, trap) has nothing to act on here.
 *   The look-ahead the core makes at run time is made ahead by cli/kernel.c
 *   (the depth-bounded call graph).  So cp_plat_apply, _prepare, _reuse,
 *   _code_matches, _func_skipped and _signals_blocked, which only
 *   cp_instrument calls, refuse (and warn once if ever reached).
 *
 * Site ids: the kernel's records name functions (struct spk_rec.func), not
 * sites, so the ids cp_plat_site_new hands out only fill the cache's words
 * and are counted (SPK_IOC_INFO's core_ids).  The core's pair table lives
 * as long as the module (its arena is freed at unload only): a site of a
 * later session at the same address as an earlier one may meet the earlier
 * pair's id, which is harmless since no record carries it.
 *
 * A target is asked for once per (site, target) pair (the core's eight per
 * site, then its table): if the kept set (SPK_MAX_TARGETS) is full then,
 * the target is hooked only if another site asks for it later.
 *
 * Context: on_site runs in a kprobe handler (interrupts off, never
 * sleeping), so every cp_plat_* here is atomic: a spin lock with interrupts
 * saved, no allocation but the arena made in process context.
 */
#include "core.h"

#include <linux/bug.h>
#include <linux/irqflags.h>
#include <linux/percpu.h>
#include <linux/vmalloc.h>

#include "kagent.h"

/* The pair table's size in the core (PAIR_SLOTS pairs of 24 bytes). */
#define ARENA_BYTES (size_t)(1u << 16) * 24

static void *arena;
static bool arena_given;
static atomic64_t core_misses = ATOMIC64_INIT(0), core_reached = ATOMIC64_INIT(0),
		  core_ids = ATOMIC64_INIT(0);
static atomic_t next_id = ATOMIC_INIT(0);

/* The target cp_plat_lookup saw last on this CPU: cp_plat_reached, which
 * the core calls next under the same site lock (interrupts off, same CPU),
 * is given only a function number. */
static DEFINE_PER_CPU(unsigned long, looked_up);
/* Interrupt flags of the locks held on this CPU (a site's, then the pair
 * table's: two at most). */
static DEFINE_PER_CPU(unsigned long, lock_flags[2]);
static DEFINE_PER_CPU(int, lock_depth);

#define UNHOOKED (CA_NONE - 1)          /* a kernel target probes.c lacks */

int spk_core_prepare(void)
{
	void *a;

	if (READ_ONCE(arena))
		return 0;
	a = vzalloc(ARENA_BYTES);
	if (!a)
		return -ENOMEM;
	WRITE_ONCE(arena, a);
	return 0;
}

void spk_core_exit(void)
{
	/* The core's pair table may point into it: only at unload. */
	vfree(arena);
	arena = NULL;
}

void spk_core_stats(u64 *misses, u64 *reached, u64 *ids, u64 *pairs)
{
	*misses = (u64)atomic64_read(&core_misses);
	*reached = (u64)atomic64_read(&core_reached);
	*ids = (u64)atomic64_read(&core_ids);
	*pairs = cp_stats_get()->pairs;
}

void spk_core_miss(const cp_view *m, cp_indirect_site *is, u64 target)
{
	atomic64_inc(&core_misses);
	cp_indirect_miss(m, is, target);
}

void *cp_plat_alloc(size_t n)
{
	/* Only the pair table asks, once, under its lock. */
	if (n > ARENA_BYTES || arena_given || !READ_ONCE(arena))
		return NULL;
	arena_given = true;
	return arena;
}

void cp_plat_lock(volatile int *l)
{
	unsigned long flags;
	int d;

	local_irq_save(flags);
	while (xchg((int *)l, 1))
		cpu_relax();
	d = this_cpu_inc_return(lock_depth) - 1;
	if (!WARN_ON_ONCE(d >= 2))
		this_cpu_write(lock_flags[d], flags);
}

void cp_plat_unlock(volatile int *l)
{
	int d = this_cpu_dec_return(lock_depth);
	unsigned long flags = d >= 0 && d < 2 ? this_cpu_read(lock_flags[d]) : 0;

	smp_store_release((int *)l, 0);
	local_irq_restore(flags);
}

uint32_t cp_plat_site_new(const cp_site_desc *d)
{
	atomic64_inc(&core_ids);
	return (uint32_t)atomic_inc_return(&next_id) & 0x3fffffff ?: 1;
}

/* Every kernel address is in the one traced "module", the kernel; its
 * function is probes.c's index if hooked, else UNHOOKED. */
void cp_plat_lookup(uint64_t target, cp_target *t)
{
	s32 f = spk_probes_index((unsigned long)target);

	this_cpu_write(looked_up, (unsigned long)target);
	t->mod = (void *)&spk_core_view;
	t->index = 0;
	t->func = f >= 0 ? (uint32_t)f : UNHOOKED;
	t->named = target;
}

bool cp_plat_runtime_code(uint64_t target)
{
	return false;                   /* no language runtime in the kernel */
}

/* The core wants the callee instrumented: it cannot be here (the header),
 * so it is kept for user space, which hooks it (indirect.c, step 3). */
void cp_plat_reached(void *mod, uint32_t func)
{
	if (func != UNHOOKED)
		return;                 /* hooked already */
	atomic64_inc(&core_reached);
	spk_targets_keep(this_cpu_read(looked_up));
}

void cp_plat_indirect_id(uint32_t id, bool tail)
{
}

/* No profile of earlier runs in the kernel: the core's look-ahead, whole
 * (the module never calls cp_instrument anyway, the header). */
bool cp_plat_likely(void *mod, uint32_t func)
{
	return true;
}

/* Only cp_instrument calls these, and the module never does (the header). */
int cp_plat_apply(cp_patch *p, size_t n)
{
	WARN_ON_ONCE(1);
	return -1;
}

int cp_plat_prepare(void *mod, uint32_t si, enum cp_plan plan, enum cp_route route,
		    cp_patch *p, cp_patch *sb, enum cp_skip *why)
{
	WARN_ON_ONCE(1);
	*why = CP_SKIP_PLAN;
	return -1;
}

int cp_plat_reuse(void *mod, uint32_t si, void *saved, cp_patch *p, cp_patch *sb)
{
	WARN_ON_ONCE(1);
	return -1;
}

bool cp_plat_code_matches(void *mod, uint32_t si)
{
	WARN_ON_ONCE(1);
	return false;
}

bool cp_plat_func_skipped(void *mod, uint32_t func)
{
	WARN_ON_ONCE(1);
	return true;
}

bool cp_plat_signals_blocked(void *mod, uint32_t func)
{
	WARN_ON_ONCE(1);
	return true;
}
