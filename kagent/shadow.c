// SPDX-License-Identifier: GPL-2.0
/*
 * shadow.c — the returns of a traced thread's kernel calls, through a
 * shadow stack per thread (what the kernel's function_graph tracer does,
 * whose entry points are not exported to modules).
 *
 * probes.c's ftrace callback runs at the entry of every probed function,
 * for every thread; only a traced thread's calls (the scope said yes) get
 * here, so untraced threads never pay for the return hook.
 *
 *  1. Enter (spk_shadow_enter, from the ftrace callback, preemption off):
 *     the thread's slot is found by its task pointer in an open-addressed
 *     table (claimed on its first traced call); the frame keeps the real
 *     return address, where it lies on the stack (retp), the function's
 *     index and the session's generation.  The entry record is written,
 *     then the return address on the stack is replaced by
 *     spk_return_trampoline (return.S).  A full shadow stack (or table)
 *     records nothing and hooks nothing: entry and exit records always
 *     come in pairs.
 *  2. A thread's first pending frame takes a reference on the module and
 *     its last one drops it: the trampoline's address stays valid while
 *     any stack holds it, so rmmod fails (EBUSY) rather than free code a
 *     sleeping thread will return into.  Module exit also waits for
 *     synchronize_rcu_tasks(), so no thread is left preempted between the
 *     last module_put and the trampoline's final return.
 *  3. Return: the function returns into the trampoline, which calls
 *     spk_shadow_return with the stack pointer of the return.  The top
 *     frame is the function's (a tail call shares its caller's retp: then
 *     two frames pop one after the other, the callee's first).  Its exit
 *     record is written if its session is still the current one (a frame
 *     pending across close and a new open records nothing into the new
 *     session's rings), and the real return address is returned.
 *  4. Only the thread itself pushes or pops its frames (task context; the
 *     scope refuses interrupts), so a slot needs no lock.  A frame that
 *     never returns is one of do_exit's (exit never returns): the thread's
 *     exit (sched_process_exit, current == the thread) releases the slot,
 *     before its task_struct can be reused by another thread.  Released
 *     slots become tombstones, never empty again, so a lookup stops at the
 *     first empty slot.
 */
#include <linux/atomic.h>
#include <linux/hash.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/trace_recursion.h>
#include <linux/vmalloc.h>

#include "kagent.h"

#define SHADOW_BITS 10
#define SHADOW_TASKS (1u << SHADOW_BITS)  /* threads with traced calls pending */
#define SHADOW_DEPTH 64                    /* pending traced calls per thread */
#define TOMB ((struct task_struct *)1)

struct frame {
	unsigned long ret;      /* the real return address */
	unsigned long *retp;    /* where it was on the stack */
	u32 func;
	u32 gen;
};

struct shadow {
	struct task_struct *task;       /* NULL: never used; TOMB: released */
	u32 depth;
	struct frame f[SHADOW_DEPTH];
};

static struct shadow *shadows;
static atomic_t claimed = ATOMIC_INIT(0);   /* slots that hold a thread */
static u32 gen = 1;                         /* the session's, see step 3 */
static atomic64_t missed_depth = ATOMIC64_INIT(0);

void spk_return_trampoline(void);
unsigned long spk_shadow_return(unsigned long *sp);

static struct shadow *find(struct task_struct *t, bool claim)
{
	u32 h = hash_ptr(t, SHADOW_BITS);
	struct task_struct *o;

	for (u32 i = 0; i < SHADOW_TASKS; i++) {
		struct shadow *s = &shadows[(h + i) & (SHADOW_TASKS - 1)];

		o = READ_ONCE(s->task);
		if (o == t)
			return s;
		if (!o)
			break;
	}
	if (!claim)
		return NULL;
	for (u32 i = 0; i < SHADOW_TASKS; i++) {
		struct shadow *s = &shadows[(h + i) & (SHADOW_TASKS - 1)];

		o = READ_ONCE(s->task);
		if ((o == NULL || o == TOMB) && cmpxchg(&s->task, o, t) == o) {
			s->depth = 0;
			atomic_inc(&claimed);
			return s;
		}
	}
	return NULL;
}

void notrace spk_shadow_enter(unsigned long *retp, u32 func)
{
	struct shadow *s = find(current, true);
	struct frame *f;

	if (!s || s->depth >= SHADOW_DEPTH) {
		atomic64_inc(&missed_depth);
		return;
	}
	f = &s->f[s->depth];
	f->ret = *retp;
	f->retp = retp;
	f->func = func;
	f->gen = READ_ONCE(gen);
	if (s->depth++ == 0)
		__module_get(THIS_MODULE);      /* step 2 */
	spk_ring_put(func);
	WRITE_ONCE(*retp, (unsigned long)spk_return_trampoline);
}

unsigned long notrace spk_shadow_return(unsigned long *sp)
{
	struct shadow *s = find(current, false);
	unsigned long ret;
	int bit, i;

	/* Our own callees are not recorded (the callback sees the lock). */
	bit = ftrace_test_recursion_trylock(_THIS_IP_, 0);
	for (i = s ? (int)s->depth - 1 : -1; i >= 0; i--)
		if (s->f[i].retp == sp - 1)
			break;
	/* No frame of ours for this return: the stack no longer says where
	 * to go.  Nothing pushes the trampoline without a frame (step 1). */
	BUG_ON(i < 0);
	ret = s->f[i].ret;
	if (s->f[i].gen == READ_ONCE(gen))
		spk_ring_put(s->f[i].func | SPK_EXIT);
	s->depth = (u32)i;
	if (i == 0)
		module_put(THIS_MODULE);
	if (bit >= 0)
		ftrace_test_recursion_unlock(bit);
	return ret;
}

void spk_shadow_task_exit(struct task_struct *t)
{
	struct shadow *s;

	if (likely(!atomic_read(&claimed)) || !(s = find(t, false)))
		return;
	if (s->depth)
		module_put(THIS_MODULE);
	s->depth = 0;
	WRITE_ONCE(s->task, TOMB);
	atomic_dec(&claimed);
}

void spk_shadow_new_session(void)
{
	WRITE_ONCE(gen, gen + 1);
}

u64 spk_shadow_missed(void)
{
	return (u64)atomic64_read(&missed_depth);
}

int spk_shadow_init(void)
{
	shadows = vzalloc(SHADOW_TASKS * sizeof *shadows);
	return shadows ? 0 : -ENOMEM;
}

void spk_shadow_exit(void)
{
	/* No frame is pending (step 2: the module could not be unloaded);
	 * wait until no thread is still inside the trampoline's last steps. */
	synchronize_rcu_tasks();
	vfree(shadows);
	shadows = NULL;
}
