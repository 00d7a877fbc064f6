/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kagent.h — what the files of sptrace's kernel module share.
 *
 *   main.c    /dev/sptrace: open, ioctls, mmap of the rings; load, unload
 *   scope.c   the traced thread groups, kept current on fork and exit
 *   probes.c  the ftrace hook on the kernel functions user space prepared
 *   shadow.c  the traced threads' shadow stacks: their calls' returns
 *   return.S  spk_direct (every hooked function's entry) and the
 *             trampoline a traced call returns into
 *   indirect.c the kprobes on indirect calls that find their targets
 *   ring.c    the per-CPU rings records go into
 *   keys.c    the keyboard notifier counting a chord's presses (--on key)
 *   core.c    agent/core/core.c, the propagation core the user-space agent
 *             runs too (copied in by build.sh; kagent/core_shim/ maps its
 *             stdint.h, stdbool.h, stddef.h to <linux/types.h>)
 *   core_plat.c the kernel's cp_plat_* for it: what the module takes from
 *             the core (the indirect calls' misses) and what not, and why
 */
#ifndef KAGENT_H
#define KAGENT_H

#include <linux/fs.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/types.h>

#include "sptrace_kagent.h"

/* ---- scope.c ---- */
int spk_scope_init(void);              /* fork and exit tracepoints */
void spk_scope_exit(void);
bool spk_scope_has_current(void);      /* the hot path: see scope.c */
bool spk_scope_holds_current(void);    /* the same in any context */
int spk_scope_add(pid_t tgid);         /* a thread group, by its global tgid */
void spk_scope_del(pid_t tgid);
void spk_scope_clear(void);
u32 spk_scope_count(void);

/* ---- probes.c ---- */
/* Hook n entry addresses (process context, may sleep); result[i] as
 * SPK_IOC_PROBE says. */
int spk_probes_add(const u64 *addrs, s32 *result, u32 n);
void spk_probes_clear(void);           /* unhook every one (may sleep) */
u32 spk_probes_count(void);
s32 spk_probes_index(unsigned long addr);   /* its index if hooked, else -1 (any context) */
void spk_probes_missed(u64 *depth, u64 *nested);

/* ---- shadow.c (and return.S) ---- */
int spk_shadow_init(void);
void spk_shadow_exit(void);            /* no frame may be pending */
void spk_shadow_enter(unsigned long *retp, u32 func);  /* entry record, return hooked */
void spk_shadow_task_exit(struct task_struct *t);      /* t == current, exiting */
void spk_shadow_new_session(void);     /* pending returns record nothing */
u64 spk_shadow_missed(void);

/* ---- indirect.c ---- */
int spk_sites_add(struct spk_site *sites, u32 n);  /* SPK_IOC_SITES (may sleep) */
u32 spk_targets_take(u64 *out, u32 cap);           /* SPK_IOC_TARGETS */
void spk_sites_clear(void);            /* unregister every one (may sleep) */
void spk_targets_keep(unsigned long t);   /* for SPK_IOC_TARGETS (any context) */

/* ---- core_plat.c (the files that include core.h first) ---- */
int spk_core_prepare(void);            /* the core's arena (process context) */
void spk_core_exit(void);              /* at unload */
void spk_core_stats(u64 *misses, u64 *reached, u64 *ids, u64 *pairs);
#ifdef SPTRACE_CORE_H
extern cp_view spk_core_view;          /* indirect.c's sites as the core sees them */
/* A watched site's target its core cache lacks: cp_indirect_miss, counted. */
void spk_core_miss(const cp_view *m, cp_indirect_site *is, u64 target);
#endif

/* ---- ring.c ---- */
int spk_rings_init(void);
void spk_rings_exit(void);
void spk_rings_reset(void);            /* no writer may run (no probes) */
void spk_ring_put(u32 func);           /* on the current CPU, task context */
void *spk_ring_of(unsigned int cpu);
u64 spk_rings_hits(void);

/* ---- keys.c ---- */
int spk_keys_set(u32 code, u32 mods);  /* SPK_IOC_KEY_CHORD (may sleep) */
void spk_keys_clear(void);             /* unregister (may sleep) */
__poll_t spk_keys_poll(struct file *f, poll_table *wait);
ssize_t spk_keys_read(struct file *f, char __user *buf, size_t len);

#endif
