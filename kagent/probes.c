// SPDX-License-Identifier: GPL-2.0
/*
 * probes.c — recording the kernel functions a traced thread runs.
 *
 * A module for 6.1 cannot write kernel text itself (text_poke is not
 * exported) nor look symbols up (kallsyms_lookup_name is not), and what it
 * has that patches code -- ftrace_set_filter_ip on a registered ftrace_ops,
 * register_kprobe -- sleeps: it takes mutexes and waits for the text to be
 * synchronised on every CPU.  So nothing can be instrumented in the context
 * where the flow of control reaches it (a traced call runs with whatever
 * locks its caller holds).  The propagation is prepared ahead, with the
 * process's registration, and only *recorded* on the hot path:
 *
 *  1. User space (cli/kernel.c, root) builds the call graph of the live
 *     kernel from its entry points -- the __x64_sys_* functions of the
 *     system calls asked for: /proc/kallsyms gives each function's address
 *     and extent, /proc/kcore its code as it runs, capstone the direct
 *     calls and tail jumps in it -- to a bounded depth, leaving out the
 *     thunks and the locking and scheduling primitives.  This is the
 *     look-ahead of the user-space agent made in advance: every function
 *     the flow can reach from those entries within the depth.  (The
 *     agent's own look-ahead, cp_instrument in the propagation core the
 *     module shares, cannot run here: core_plat.c says why.)
 *  2. SPK_IOC_PROBE hands the entry addresses down; here, in process
 *     context, each is checked against a scratch ftrace_ops (ftrace refuses
 *     what has no __fentry__ site: assembly, notrace, inlined), then the
 *     accepted ones, as a batch, get an ftrace_ops of their own registered
 *     as a direct call (register_ftrace_direct_multi): each function's
 *     __fentry__ call is patched into a call of return.S's spk_direct --
 *     no ftrace trampoline, no saved registers, no int3, no kretprobe
 *     instance.  Registration happens before any thread is put in scope,
 *     so a traced thread's first system call is already recorded whole.
 *     More batches may join later, while threads run (SPK_IOC_PROBE again:
 *     the functions user space found since, e.g. an indirect call's
 *     target).
 *  3. On every call of a probed function by any thread, spk_direct tests
 *     the current thread's tgid in the scope's bitmap (scope.c) and an
 *     untraced thread returns at once: a call, five instructions and a
 *     return are all it pays.  A set bit goes on to spk_on_direct, which
 *     confirms the scope (the tgid array, and task context: an interrupt
 *     on a traced thread's CPU is not recorded).
 *  4. In scope, the function's index is found by its address (a hash
 *     table written before the address is published) and shadow.c records
 *     the entry and hooks the return on the thread's shadow stack; the
 *     exit record is written when the function returns.  Entry and exit
 *     thus nest exactly like the calls; a thread that migrates mid-call
 *     leaves its records in two rings, which user space merges per thread
 *     by timestamp.
 *  5. Closing /dev/sptrace (or unloading the module) empties the scope,
 *     removes indirect.c's kprobes, starts a new session for the shadow
 *     stacks (a return still pending records nothing), then
 *     unregister_ftrace_direct_multi removes every batch's calls and waits
 *     until no thread is inside spk_direct: after it the kernel's text is
 *     what it was, and the rings have no writer (the returns still pending
 *     write nothing).
 */
#include <linux/ftrace.h>
#include <linux/hash.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/trace_recursion.h>
#include <linux/vmalloc.h>

#include "kagent.h"

#define FHASH_BITS 14           /* 4 slots per function at most */
#define FHASH_SIZE (1u << FHASH_BITS)

struct fslot {
	unsigned long addr;     /* 0: empty; published last (step 4) */
	u32 index;
};

#define MAX_BATCHES 64          /* SPK_IOC_PROBE calls that add functions */

static struct fslot *fhash;
static unsigned long *faddr;    /* index -> address */
static u32 nfuncs;
static struct ftrace_ops *batches[MAX_BATCHES], scratch;
static u32 nbatches;

/* return.S */
void spk_direct(void);
void spk_on_direct(unsigned long body, unsigned long *retp);
const unsigned long spk_tgid_off = offsetof(struct task_struct, tgid);
static atomic64_t missed_nested = ATOMIC64_INIT(0);
static DEFINE_MUTEX(probes_lock);

static s32 notrace lookup(unsigned long addr)
{
	u32 h = hash_long(addr, FHASH_BITS);

	for (u32 i = 0; i < FHASH_SIZE; i++) {
		struct fslot *s = &fhash[(h + i) & (FHASH_SIZE - 1)];
		unsigned long a = smp_load_acquire(&s->addr);

		if (a == addr)
			return (s32)s->index;
		if (!a)
			break;
	}
	return -1;
}

static void insert(unsigned long addr, u32 index)
{
	u32 h = hash_long(addr, FHASH_BITS);

	for (u32 i = 0; i < FHASH_SIZE; i++) {
		struct fslot *s = &fhash[(h + i) & (FHASH_SIZE - 1)];

		if (!s->addr) {
			s->index = index;
			smp_store_release(&s->addr, addr);
			return;
		}
	}
}

/* Step 3: a call of a probed function by a thread whose tgid's bit is set. */
void notrace spk_on_direct(unsigned long body, unsigned long *retp)
{
	unsigned long ip = body - MCOUNT_INSN_SIZE;     /* the __fentry__ call */
	int bit;
	s32 f;

	if (!spk_scope_has_current())
		return;
	bit = ftrace_test_recursion_trylock(ip, *retp);
	if (bit < 0) {
		atomic64_inc(&missed_nested);
		return;
	}
	/* The entry, or 4 bytes in after an ENDBR. */
	f = lookup(ip);
	if (f < 0)
		f = lookup(ip - 4);
	if (f >= 0)
		spk_shadow_enter(retp, (u32)f);
	ftrace_test_recursion_unlock(bit);
}

/* Step 2: a direct call of spk_direct from each function of the batch. */
static int add_batch(unsigned long *ips, u32 n)
{
	struct ftrace_ops *o;
	int rc;

	if (nbatches >= MAX_BATCHES)
		return -ENOSPC;
	o = kzalloc(sizeof *o, GFP_KERNEL);
	if (!o)
		return -ENOMEM;
	rc = ftrace_set_filter_ips(o, ips, n, 0, 0);
	if (rc == 0)
		rc = register_ftrace_direct_multi(o, (unsigned long)spk_direct);
	if (rc) {
		ftrace_free_filter(o);
		kfree(o);
		return rc;
	}
	batches[nbatches++] = o;
	return 0;
}

/* Whether ftrace can hook addr: a fresh scratch filter with it alone. */
static int hookable(unsigned long addr)
{
	int rc = ftrace_set_filter_ip(&scratch, addr, 0, 1);

	return rc == -EINVAL ? -ENOENT : rc;
}

int spk_probes_add(const u64 *addrs, s32 *result, u32 n)
{
	unsigned long *batch;
	u32 nbatch = 0, first = nfuncs;
	int rc = 0;

	batch = kvmalloc_array(n, sizeof *batch, GFP_KERNEL);
	if (!batch)
		return -ENOMEM;
	mutex_lock(&probes_lock);
	if (!fhash) {
		fhash = vzalloc(FHASH_SIZE * sizeof *fhash);
		faddr = vzalloc(SPK_MAX_PROBES * sizeof *faddr);
		if (!fhash || !faddr) {
			vfree(fhash);
			vfree(faddr);
			fhash = NULL;
			faddr = NULL;
			rc = -ENOMEM;
			goto out;
		}
	}
	first = nfuncs;
	for (u32 i = 0; i < n; i++) {
		unsigned long a = (unsigned long)addrs[i];
		s32 f = lookup(a);

		if (f < 0) {
			for (u32 j = 0; j < nbatch; j++)
				if (batch[j] == a)
					f = (s32)(first + j);
		}
		if (f >= 0) {
			result[i] = f;
			continue;
		}
		if (first + nbatch >= SPK_MAX_PROBES) {
			result[i] = -ENOSPC;
			continue;
		}
		result[i] = hookable(a);
		if (result[i] == 0) {
			result[i] = (s32)(first + nbatch);
			batch[nbatch++] = a;
		}
		cond_resched();
	}
	ftrace_free_filter(&scratch);
	memset(&scratch, 0, sizeof scratch);
	if (!nbatch)
		goto out;
	/* The indices are published before ftrace calls for them (step 4). */
	for (u32 j = 0; j < nbatch; j++) {
		faddr[first + j] = batch[j];
		insert(batch[j], first + j);
	}
	rc = add_batch(batch, nbatch);
	/* A failure leaves the addresses in the table: harmless, ftrace never
	 * calls for them, and their indices are never handed out again. */
	if (rc)
		for (u32 i = 0; i < n; i++)
			if (result[i] >= (s32)first)
				result[i] = rc;
	WRITE_ONCE(nfuncs, first + nbatch);
	rc = 0;
out:
	mutex_unlock(&probes_lock);
	kvfree(batch);
	return rc;
}

void spk_probes_clear(void)
{
	mutex_lock(&probes_lock);
	spk_shadow_new_session();                   /* step 5 */
	for (u32 i = 0; i < nbatches; i++) {
		unregister_ftrace_direct_multi(batches[i], (unsigned long)spk_direct);
		ftrace_free_filter(batches[i]);
		kfree(batches[i]);
	}
	nbatches = 0;
	nfuncs = 0;
	vfree(fhash);
	vfree(faddr);
	fhash = NULL;
	faddr = NULL;
	mutex_unlock(&probes_lock);
}

s32 notrace spk_probes_index(unsigned long addr)
{
	return READ_ONCE(fhash) ? lookup(addr) : -1;
}

u32 spk_probes_count(void)
{
	return READ_ONCE(nfuncs);
}

void spk_probes_missed(u64 *depth, u64 *nested)
{
	*depth = spk_shadow_missed();
	*nested = (u64)atomic64_read(&missed_nested);
}
