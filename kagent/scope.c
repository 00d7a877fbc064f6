// SPDX-License-Identifier: GPL-2.0
/*
 * scope.c — the per-application scope: the thread groups being traced.
 *
 * Every probed kernel function asks, on every call by anyone, "is the
 * current thread traced?"; untraced processes must pay next to nothing for
 * it.  So the first answer is one bit: spk_scope_bits, indexed by tgid
 * (PID_MAX_LIMIT bits, 512 KiB), tested by return.S's spk_direct with a
 * single bt.  A set bit is confirmed (spk_scope_has_current) against the
 * array of tgids -- a few cache lines, no lock, no pointer to chase -- and
 * task context.  Writers (ioctls, fork and exit) hold a spinlock and
 * update the array, then the bit; a reader racing a removal may miss a
 * thread group being removed, never see one that was not added.
 *
 * The scope follows the process tree: a traced process's fork (a new
 * thread group; its threads share the tgid anyway) joins it, from the
 * sched_process_fork tracepoint, and a thread group leaves it when its last
 * thread exits (sched_process_exit, once signal->live reached 0), so a
 * recycled pid is never traced by mistake.  exec keeps the tgid: nothing
 * to do.  The tracepoints are found by name (for_each_kernel_tracepoint):
 * their symbols are not exported to modules.
 */
#include <linux/sched/signal.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/threads.h>
#include <linux/tracepoint.h>

#include "kagent.h"

unsigned long spk_scope_bits[BITS_TO_LONGS(PID_MAX_LIMIT)];  /* return.S reads it */
static pid_t tgids[SPK_SCOPE_MAX];
static u32 ntgids;
static DEFINE_SPINLOCK(scope_lock);

static struct tracepoint *tp_fork, *tp_exit;

static bool holds(pid_t tgid)
{
	u32 n = READ_ONCE(ntgids);

	for (u32 i = 0; i < n && i < SPK_SCOPE_MAX; i++)
		if (READ_ONCE(tgids[i]) == tgid)
			return true;
	return false;
}

bool spk_scope_has_current(void)
{
	if (likely(!READ_ONCE(ntgids)) || !in_task())
		return false;
	return holds(current->tgid);
}

bool spk_scope_holds_current(void)
{
	return READ_ONCE(ntgids) && holds(current->tgid);
}

int spk_scope_add(pid_t tgid)
{
	int rc = 0;

	spin_lock(&scope_lock);
	if (holds(tgid))
		rc = 0;
	else if (ntgids >= SPK_SCOPE_MAX)
		rc = -ENOSPC;
	else {
		WRITE_ONCE(tgids[ntgids], tgid);
		smp_store_release(&ntgids, ntgids + 1);
		if (tgid >= 0 && tgid < PID_MAX_LIMIT)
			set_bit(tgid, spk_scope_bits);
	}
	spin_unlock(&scope_lock);
	return rc;
}

void spk_scope_del(pid_t tgid)
{
	spin_lock(&scope_lock);
	for (u32 i = 0; i < ntgids; i++)
		if (tgids[i] == tgid) {
			WRITE_ONCE(tgids[i], tgids[ntgids - 1]);
			WRITE_ONCE(ntgids, ntgids - 1);
			if (tgid >= 0 && tgid < PID_MAX_LIMIT)
				clear_bit(tgid, spk_scope_bits);
			break;
		}
	spin_unlock(&scope_lock);
}

void spk_scope_clear(void)
{
	spin_lock(&scope_lock);
	for (u32 i = 0; i < ntgids; i++)
		if (tgids[i] >= 0 && tgids[i] < PID_MAX_LIMIT)
			clear_bit(tgids[i], spk_scope_bits);
	WRITE_ONCE(ntgids, 0);
	spin_unlock(&scope_lock);
}

u32 spk_scope_count(void)
{
	return READ_ONCE(ntgids);
}

static void on_fork(void *data, struct task_struct *parent, struct task_struct *child)
{
	if (likely(!READ_ONCE(ntgids)) || child->tgid == parent->tgid || !holds(parent->tgid))
		return;
	if (spk_scope_add(child->tgid))
		pr_warn_ratelimited("sptrace: scope full (%d thread groups): pid %d not traced\n",
				    SPK_SCOPE_MAX, child->tgid);
}

static void on_exit(void *data, struct task_struct *p)
{
	spk_shadow_task_exit(p);        /* any thread that has a shadow stack */
	if (likely(!READ_ONCE(ntgids)) || !holds(p->tgid))
		return;
	if (atomic_read(&p->signal->live) == 0)
		spk_scope_del(p->tgid);
}

static void find_tp(struct tracepoint *tp, void *unused)
{
	if (!strcmp(tp->name, "sched_process_fork"))
		tp_fork = tp;
	else if (!strcmp(tp->name, "sched_process_exit"))
		tp_exit = tp;
}

int spk_scope_init(void)
{
	int rc;

	for_each_kernel_tracepoint(find_tp, NULL);
	if (!tp_fork || !tp_exit) {
		pr_err("sptrace: the kernel has no sched_process_fork/exit tracepoints\n");
		return -ENOENT;
	}
	rc = tracepoint_probe_register(tp_fork, on_fork, NULL);
	if (rc)
		return rc;
	rc = tracepoint_probe_register(tp_exit, on_exit, NULL);
	if (rc) {
		tracepoint_probe_unregister(tp_fork, on_fork, NULL);
		return rc;
	}
	return 0;
}

void spk_scope_exit(void)
{
	tracepoint_probe_unregister(tp_fork, on_fork, NULL);
	tracepoint_probe_unregister(tp_exit, on_exit, NULL);
	tracepoint_synchronize_unregister();
}
