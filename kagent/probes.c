// SPDX-License-Identifier: GPL-2.0
/*
 * probes.c — recording the kernel functions a traced thread runs.
 *
 * A module for 6.1 cannot write kernel text itself (text_poke is not
 * exported) nor look symbols up (kallsyms_lookup_name is not), and the
 * one primitive it has that patches code, register_kretprobe, sleeps: it
 * takes mutexes, allocates and waits for the text to be synchronised on
 * every CPU.  So nothing can be instrumented in the context where the
 * flow of control reaches it (a probe handler runs with preemption off).
 * The propagation is therefore prepared ahead, with the process's
 * registration, and only *recorded* on the hot path:
 *
 *  1. User space (cli/kernel.c, root) builds the call graph of the live
 *     kernel from its entry points -- the __x64_sys_* functions of the
 *     system calls asked for: /proc/kallsyms gives each function's address
 *     and extent, /proc/kcore its code as it runs, capstone the direct
 *     calls and tail jumps in it -- to a bounded depth, leaving out what
 *     kprobes may not touch and the thunks (__fentry__, retpolines,
 *     __x86_return_thunk).  This is the look-ahead of the user-space
 *     agent made in advance: every function the flow can reach from those
 *     entries within the depth.
 *  2. SPK_IOC_PROBE hands the entry addresses down; here, in process
 *     context, each gets a kretprobe (register_kretprobe: through ftrace
 *     on the function's __fentry__ site, else an int3).  The kernel checks
 *     that the address is a function entry it may probe; a refusal is
 *     that address's result, not the whole call's.  Registration happens
 *     before any thread is put in scope, so a traced thread's first
 *     system call is already recorded whole.
 *  3. On every call of a probed function by any thread, the entry handler
 *     asks the scope (scope.c: one load when nothing is traced).  Out of
 *     scope -- another process, or interrupt context on a traced thread's
 *     CPU -- it returns 1: kretprobes then skip the return hook, so an
 *     untraced call costs the probe hit and that test only.
 *  4. In scope, the entry record goes into the CPU's ring (ring.c) and the
 *     kretprobe hooks the return; its handler writes the exit record.
 *     Entry and exit thus nest exactly like the calls; a thread that
 *     migrates mid-call leaves its records in two rings, which user space
 *     merges per thread by timestamp.
 *  5. Closing /dev/sptrace (or unloading the module) empties the scope,
 *     then unregister_kretprobes removes every probe in one batch and
 *     waits (synchronize_rcu) until no handler runs: after it the kernel's
 *     text is what it was, and the rings have no writer.
 */
#include <linux/kprobes.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "kagent.h"

struct spk_probe {
	struct kretprobe rp;
	u32 index;              /* the records' function index */
};

static struct spk_probe *probes;     /* SPK_MAX_PROBES, registered first */
static struct kretprobe **rps;       /* the same, for the batch unregister */
static u32 nprobes;
static DEFINE_MUTEX(probes_lock);

static int on_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct spk_probe *p;

	if (!spk_scope_has_current())
		return 1;       /* step 3: no return hook */
	p = container_of(get_kretprobe(ri), struct spk_probe, rp);
	spk_ring_put(p->index);
	return 0;
}

static int on_return(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct spk_probe *p = container_of(get_kretprobe(ri), struct spk_probe, rp);

	spk_ring_put(p->index | SPK_EXIT);
	return 0;
}

static s32 add_one(u64 addr)
{
	struct spk_probe *p;
	int rc;

	for (u32 i = 0; i < nprobes; i++)
		if ((u64)(uintptr_t)probes[i].rp.kp.addr == addr)
			return (s32)i;
	if (nprobes >= SPK_MAX_PROBES)
		return -ENOSPC;
	p = &probes[nprobes];
	memset(p, 0, sizeof *p);
	p->rp.kp.addr = (kprobe_opcode_t *)(uintptr_t)addr;
	p->rp.entry_handler = on_entry;
	p->rp.handler = on_return;
	/* Instances are per pending return, shared by all threads: enough
	 * for deep recursion on a few CPUs. */
	p->rp.maxactive = 64;
	p->index = nprobes;
	rc = register_kretprobe(&p->rp);
	if (rc < 0)
		return rc;
	rps[nprobes] = &p->rp;
	return (s32)nprobes++;
}

int spk_probes_add(const u64 *addrs, s32 *result, u32 n)
{
	mutex_lock(&probes_lock);
	if (!probes) {
		probes = vzalloc(SPK_MAX_PROBES * sizeof *probes);
		rps = vzalloc(SPK_MAX_PROBES * sizeof *rps);
		if (!probes || !rps) {
			vfree(probes);
			vfree(rps);
			probes = NULL;
			rps = NULL;
			mutex_unlock(&probes_lock);
			return -ENOMEM;
		}
	}
	for (u32 i = 0; i < n; i++) {
		result[i] = add_one(addrs[i]);
		cond_resched();
	}
	mutex_unlock(&probes_lock);
	return 0;
}

void spk_probes_clear(void)
{
	mutex_lock(&probes_lock);
	if (nprobes)
		unregister_kretprobes(rps, (int)nprobes);   /* step 5 */
	nprobes = 0;
	vfree(probes);
	vfree(rps);
	probes = NULL;
	rps = NULL;
	mutex_unlock(&probes_lock);
}

u32 spk_probes_count(void)
{
	return READ_ONCE(nprobes);
}

void spk_probes_missed(u64 *instance, u64 *nested)
{
	*instance = *nested = 0;
	mutex_lock(&probes_lock);
	for (u32 i = 0; i < nprobes; i++) {
		*instance += probes[i].rp.nmissed;
		*nested += probes[i].rp.kp.nmissed;
	}
	mutex_unlock(&probes_lock);
}
