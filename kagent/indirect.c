// SPDX-License-Identifier: GPL-2.0
/*
 * indirect.c — following a traced thread's calls through function
 * pointers (vfs_read's f_op->read_iter, ...), which no call graph made
 * ahead can name.
 *
 *  1. User space (cli/kernel.c), decoding the functions it hooks, also
 *     finds their indirect calls and jumps -- `call *%reg`, or a call of
 *     the retpoline thunk __x86_indirect_thunk_REG -- and hands them down
 *     with SPK_IOC_SITES: each gets a kprobe on the instruction (process
 *     context, may sleep).
 *  2. The kprobe's handler runs before the instruction, so the register
 *     holds the target.  Out of scope (any other thread group) it returns
 *     at once.  For a traced thread, a target the site's cache holds (the
 *     last one it called) needs nothing more; another goes to the
 *     propagation core the user-space agent runs too (cp_indirect_miss,
 *     agent/core/core.c; the kernel's platform is core_plat.c): the core
 *     knows the site's targets (eight, then its shared pair table), and a
 *     new one it asks to have reached -- here, a target not hooked yet
 *     (probes.c's table) is kept in a small set under a raw spinlock (the
 *     handler may run with interrupts off); nothing is patched here --
 *     patching sleeps.  The core then points the cache at the target.
 *  3. User space takes the kept targets (SPK_IOC_TARGETS) while the program
 *     runs, looks each up in its symbols and hooks it, with what it calls,
 *     through SPK_IOC_PROBE (a new batch: probes.c, step 2).  The call
 *     that revealed a target is not recorded; the following ones are.
 *  4. Close (or unload): every kprobe unregistered in one batch, which
 *     waits until no handler runs; the kept targets are forgotten.
 *
 * Every thread that passes a watched site pays a kprobe hit (an int3, or a
 * jump when kprobes can optimise it) and the scope test: unlike the
 * functions' ftrace calls, a site costs untraced processes something.
 */
#include <linux/kprobes.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/stddef.h>
#include <linux/vmalloc.h>

#include "core.h"

#include "kagent.h"

struct site {
	struct kprobe kp;
	u32 off;                /* the register's offset in pt_regs */
	cp_indirect_site is;    /* the core's state of the site ... */
	cp_indirect_cache cache; /* ... and its cache (target: last one seen) */
};

/* The sites as the core sees them: one "module" (the kernel), whose site i
 * is sites[i]; their calling function is not known here (user space found
 * it), so one function without an extent stands for all of them. */
static ca_site *ca_sites;
static ca_func ca_caller;
cp_view spk_core_view = { .funcs = &ca_caller, .nfuncs = 1 };

static struct site *sites;
static struct kprobe **kps;     /* the same, for the batch unregister */
static u32 nsites;
static DEFINE_MUTEX(sites_lock);

static unsigned long kept[SPK_MAX_TARGETS];
static u32 nkept;
static DEFINE_RAW_SPINLOCK(kept_lock);

static const u32 reg_off[SPK_NREGS] = {
	offsetof(struct pt_regs, ax), offsetof(struct pt_regs, cx),
	offsetof(struct pt_regs, dx), offsetof(struct pt_regs, bx),
	offsetof(struct pt_regs, sp), offsetof(struct pt_regs, bp),
	offsetof(struct pt_regs, si), offsetof(struct pt_regs, di),
	offsetof(struct pt_regs, r8), offsetof(struct pt_regs, r9),
	offsetof(struct pt_regs, r10), offsetof(struct pt_regs, r11),
	offsetof(struct pt_regs, r12), offsetof(struct pt_regs, r13),
	offsetof(struct pt_regs, r14), offsetof(struct pt_regs, r15),
};

/* Step 2. */
static int on_site(struct kprobe *kp, struct pt_regs *regs)
{
	struct site *s;
	unsigned long t;

	/* Not spk_scope_has_current(): an int3's handler runs as an NMI does,
	 * never in_task().  An interrupt on a traced thread's CPU may pass
	 * here too: its target is then hooked for nothing, never recorded. */
	if (!spk_scope_holds_current())
		return 0;
	s = container_of(kp, struct site, kp);
	t = *(unsigned long *)((char *)regs + s->off);
	if (smp_load_acquire(&s->cache.target) != t)
		spk_core_miss(&spk_core_view, &s->is, t);
	return 0;
}

/* Step 2, for the core (core_plat.c's cp_plat_reached). */
void spk_targets_keep(unsigned long t)
{
	unsigned long flags;
	u32 i;

	raw_spin_lock_irqsave(&kept_lock, flags);
	for (i = 0; i < nkept && kept[i] != t; i++)
		;
	if (i == nkept && nkept < SPK_MAX_TARGETS)
		kept[nkept++] = t;
	raw_spin_unlock_irqrestore(&kept_lock, flags);
}

int spk_sites_add(struct spk_site *req, u32 n)
{
	mutex_lock(&sites_lock);
	if (!sites) {
		sites = vzalloc(SPK_MAX_SITES * sizeof *sites);
		kps = vzalloc(SPK_MAX_SITES * sizeof *kps);
		ca_sites = vzalloc(SPK_MAX_SITES * sizeof *ca_sites);
		if (!sites || !kps || !ca_sites || spk_core_prepare()) {
			vfree(sites);
			vfree(kps);
			vfree(ca_sites);
			sites = NULL;
			kps = NULL;
			ca_sites = NULL;
			mutex_unlock(&sites_lock);
			return -ENOMEM;
		}
		spk_core_view.sites = ca_sites;
	}
	for (u32 i = 0; i < n; i++) {
		struct site *s;

		if (req[i].reg >= SPK_NREGS || req[i].reg == SPK_REG_RSP) {
			req[i].result = -EINVAL;
			continue;
		}
		if (nsites >= SPK_MAX_SITES) {
			req[i].result = -ENOSPC;
			continue;
		}
		s = &sites[nsites];
		memset(s, 0, sizeof *s);
		ca_sites[nsites] = (ca_site){ .addr = req[i].addr, .callee = CA_NONE, .import = CA_NONE,
					      .kind = CA_SITE_INDIRECT_REG, .func = 0 };
		s->is.site = nsites;
		s->is.cache = &s->cache;
		s->kp.addr = (kprobe_opcode_t *)(uintptr_t)req[i].addr;
		s->kp.pre_handler = on_site;
		s->off = reg_off[req[i].reg];
		req[i].result = register_kprobe(&s->kp);
		if (req[i].result == 0)
			kps[nsites++] = &s->kp;
		cond_resched();
	}
	mutex_unlock(&sites_lock);
	return 0;
}

u32 spk_targets_take(u64 *out, u32 cap)
{
	unsigned long flags;
	u32 n;

	raw_spin_lock_irqsave(&kept_lock, flags);
	n = min(cap, nkept);
	for (u32 i = 0; i < n; i++)
		out[i] = kept[i];
	memmove(kept, kept + n, (nkept - n) * sizeof *kept);
	nkept -= n;
	raw_spin_unlock_irqrestore(&kept_lock, flags);
	return n;
}

void spk_sites_clear(void)
{
	unsigned long flags;

	mutex_lock(&sites_lock);
	if (nsites)
		unregister_kprobes(kps, (int)nsites);   /* step 4 */
	nsites = 0;
	vfree(sites);
	vfree(kps);
	vfree(ca_sites);
	sites = NULL;
	kps = NULL;
	ca_sites = NULL;
	spk_core_view.sites = NULL;
	mutex_unlock(&sites_lock);
	raw_spin_lock_irqsave(&kept_lock, flags);
	nkept = 0;
	raw_spin_unlock_irqrestore(&kept_lock, flags);
}
