/*
 * activate.c — starting to trace in the middle of a run (`--on timer S`,
 * `--on signal` with `sptrace activate PID`): every thread is already deep
 * in its calls, and tracing must pick them up where they are.
 *
 * One thread cannot read another's registers in-process, so each thread
 * walks its own stack, in the agent's SIGTRAP handler, and the control
 * thread only makes every other thread take that trap:
 *
 *   - a thread blocked in a system call (/proc/self/task/T/syscall names
 *     one) gets a hardware breakpoint bound to it at the instruction after
 *     the syscall: the call completes exactly as it would have (no EINTR, no
 *     restart) and the trap fires on its way back to the program;
 *   - a running thread gets a SIGTRAP queued with rt_tgsigqueueinfo, code
 *     SI_QUEUE and a value only the agent uses.  (A thread that enters a
 *     system call between the check and the signal sees that call end as a
 *     handled signal would end it: read/write/accept/futex restart, while
 *     poll/epoll_wait/nanosleep return EINTR.  The window is microseconds.)
 *
 * The handler walks from the interrupted context with the agent's private
 * copy of libgcc's unwinder (CFI: -O2 code without frame pointers is fine;
 * it knows the areas and stubs, x86_64/unwind.c; it finds the modules'
 * unwind information with _dl_find_object, which takes no lock), from its
 * own frames through the signal frame; and, for each frame in a traced
 * module from the outermost traced one (main, or the function a thread
 * started in) inwards:
 *
 *   1. records an ENTRY of the function's root site, with the activation
 *      time: the call began before the trace, the tree opens there;
 *   2. instruments the function, so its further calls are traced;
 *   3. replaces the frame's return address (CFA - 8) with a return stub,
 *      which records the matching EXIT and jumps to the real return address.
 *
 * Return stubs are slots of a pool like patch areas (pool.c), so each has an
 * FDE: "CFA = rsp, rip = the word at slot + AG_SLOT_RA", that word holding
 * the real return address - 1 (the slot is a signal frame, see unwind.c).
 * C++ exceptions, pthread_exit and backtrace() thus unwind through a stub as
 * through the original return address.  The return address written is
 * slot + AG_STUB_RETURN (past a nop at the start of the slot's code), so the
 * unwinder, which looks up "return address - 1", lands in the stub's own
 * FDE.  The slot (small, agent.h) and the stub's code (x86_64/emit.c,
 * ag_emit_return_stub):
 *
 *   slot + AG_SLOT_RA     real return address - 1
 *   slot + AG_SLOT_SITE   the root site id (u32)
 *   slot + AG_SLOT_WORDS  nop
 *               + 1       movabs $slot, %r11 ; jmp *ag_tramp_retpoint
 *
 * A stub is the thread's until it runs (ag_retpoint) or until a stub outer
 * to it runs after a longjmp or an exception skipped it: each thread keeps
 * its stubs in stack order, and a stub that runs retires the inner ones
 * left behind (no exit is recorded for them: their calls were unwound).
 * Retired slots are reused.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#include <unwind.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"

#define MAX_FRAMES 256
#define STUB_SLOTS 2048
#define STUB_SITE AG_SLOT_SITE      /* the root site id (u32) */
#define STUB_CODE AG_SLOT_CODE(AG_SLOT_SMALL)   /* a stub takes a small slot */
#define SHADOW_MAX 512
#define MAX_BPS 1024

/* What the queued SIGTRAP carries; nothing else sends this value. */
static const char activate_magic[] = "sptrace-activate";

/* ---- return stubs ---- */

static ag_pool *stub_pool;
static uint64_t *stub_free;       /* rx addresses of free slots */
static uint32_t stub_nfree;
static volatile int stub_lock;
static uint8_t *stub_rw0, *stub_rx0;   /* the pool's first stub slot, both views */

typedef struct frame {
	uint64_t ip, sp;
	bool exact;       /* ip is where the thread stands, not a return address */
	bool signal;      /* a signal frame (the kernel's sigreturn trampoline; to
			   * libgcc an area or a stub too, see on_frame) */
} frame;

/* Per thread, made at its first walk (signal handlers may run on small
 * stacks: the walk keeps its frames here). */
typedef struct shadow {
	uint32_t n;
	uint64_t slot[SHADOW_MAX];        /* the thread's stubs, outermost first */
	uint64_t loc[SHADOW_MAX];         /* where each one stands in for a return address */
	frame f[MAX_FRAMES];
	ag_module *fm[MAX_FRAMES];
	uint32_t ff[MAX_FRAMES];
	ucontext_t self_uc;               /* ag_walk_self's own context */
} shadow;

static __thread shadow *thread_stubs __attribute__((tls_model("initial-exec")));

static void slock(void)
{
	while (__atomic_exchange_n(&stub_lock, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
}

static void sunlock(void)
{
	__atomic_store_n(&stub_lock, 0, __ATOMIC_RELEASE);
}

/* Made at start (pool creation registers unwind information, which must
 * not happen from a signal handler). */
int ag_activate_init(void)
{
	uint8_t *rx, *rw;

	stub_pool = ag_pool_near((uint64_t)(uintptr_t)ag_tramp_retpoint,
				 (uint64_t)(uintptr_t)ag_tramp_retpoint + 1, STUB_SLOTS + 1, 0, 0, true);
	stub_free = ag_alloc(STUB_SLOTS * sizeof *stub_free);
	if (!stub_pool || !stub_free || !ag_pool_code(stub_pool, STUB_CODE, &rx, &rw))
		return -1;
	stub_rw0 = rw;
	stub_rx0 = rx;
	stub_free[stub_nfree++] = (uint64_t)(uintptr_t)rx;
	return 0;
}

static uint8_t *stub_rw(uint64_t rx)
{
	return stub_rw0 + (rx - (uint64_t)(uintptr_t)stub_rx0);
}

/* A free slot, its code written (the same bytes at every use; written
 * here rather than at start so that only slots in use take memory).  Slots
 * are taken from the pool as they are first needed: a fork copies the
 * pool's used part (pool.c), which would otherwise be all 2 MB of it. */
static void stub_put(uint64_t s);

static uint64_t stub_get(void)
{
	uint64_t s = 0, tramp = (uint64_t)(uintptr_t)ag_tramp_retpoint;
	uint8_t *p, *rw;

	slock();
	if (stub_nfree)
		s = stub_free[--stub_nfree];
	else if (ag_pool_code(stub_pool, STUB_CODE, &p, &rw))
		s = (uint64_t)(uintptr_t)p;
	sunlock();
	if (!s)
		return 0;
	if (!ag_pool_writing(stub_pool)) {
		stub_put(s);
		return 0;
	}
	ag_emit_return_stub(stub_rw(s), s, tramp);
	return s;
}

static void stub_put(uint64_t s)
{
	slock();
	if (stub_nfree < STUB_SLOTS)
		stub_free[stub_nfree++] = s;
	sunlock();
}

static uint32_t stub_site(uint64_t s)
{
	uint32_t id;

	memcpy(&id, (const void *)(uintptr_t)(s + STUB_SITE), 4);
	return id;
}

/*
 * A stub ran: the frame it stood for has returned.  Called from
 * ag_tramp_retpoint with the slot; returns where the frame really returns.
 */
uint64_t ag_retpoint(uint64_t slot)
{
	trace_ring_header *ring = ag_enter();
	shadow *sh = thread_stubs;
	uint64_t ra;
	uint32_t k;

	memcpy(&ra, (const void *)(uintptr_t)(slot + AG_SLOT_RA), 8);
	ra += 1;
	if (sh) {
		for (k = sh->n; k > 0 && sh->slot[k - 1] != slot; k--)
			;
		if (k > 0) {
			/* Inner stubs left behind by a longjmp or an exception:
			 * their frames are gone, without an exit (the replay marks
			 * them unwound when this exit closes the outer call). */
			for (uint32_t j = sh->n; j > k; j--)
				stub_put(sh->slot[j - 1]);
			sh->n = k - 1;
		}
	}
	if (ag_active() && ring)
		ag_ring_put(ring, TRACE_EXIT, stub_site(slot));
	stub_put(slot);
	ag_leave(ring);
	return ra;
}

/* ---- the walk, in the thread's SIGTRAP handler ---- */

/* Stubs of an earlier activation still on the stack go back to the real
 * return addresses before the walk; the walk puts new ones.  Live frames
 * lie above the interrupted stack pointer; the others were unwound. */
static void unstub(shadow *sh, uint64_t sp)
{
	for (uint32_t i = sh->n; i > 0; i--) {
		uint64_t stub = sh->slot[i - 1], loc = sh->loc[i - 1];

		if (loc >= sp && *(volatile uint64_t *)(uintptr_t)loc == stub + AG_STUB_RETURN) {
			uint64_t ra;

			memcpy(&ra, (const void *)(uintptr_t)(stub + AG_SLOT_RA), 8);
			*(volatile uint64_t *)(uintptr_t)loc = ra + 1;
		}
		stub_put(stub);
	}
	sh->n = 0;
}

/* Is ip inside a call area?  Then *site gets the id its exit records and
 * *ret the caller's return address. */
static bool in_area(uint64_t ip, uint32_t *site, uint64_t *ret)
{
	uint64_t slot = ag_pool_slot_of(ip), magic, id;

	if (!slot)
		return false;
	memcpy(&magic, (const void *)(uintptr_t)(slot + AG_SLOT_MAGIC), 8);
	if (magic != AG_SLOT_MAGIC_VALUE)
		return false;
	memcpy(&id, (const void *)(uintptr_t)(slot + AG_SLOT_SITE), 8);
	memcpy(ret, (const void *)(uintptr_t)(slot + AG_SLOT_RET), 8);
	*site = (uint32_t)id;
	return true;
}

/* Functions that start a process or a thread never return: the walk stops
 * below them. */
static bool is_start(const char *name)
{
	static const char *const starts[] = {
		"_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main",
		"start_thread", "clone3", "__clone3", "clone", "__clone", "__clone_internal",
	};

	for (size_t i = 0; i < sizeof starts / sizeof *starts; i++)
		if (strcmp(name, starts[i]) == 0)
			return true;
	return false;
}

/* Activations so far; the one a thread last walked for.  A thread walks
 * once per activation, whichever of its signal or breakpoint comes first
 * (a standard signal does not queue: one sent while an older one is still
 * pending is lost, so a late one may stand for the newer activation). */
static volatile uint32_t generation;
static __thread uint32_t walked_gen __attribute__((tls_model("initial-exec")));
/* Walks in progress: a stop waits for them, so that no walk records after
 * the stop's DEACTIVATE event. */
static volatile int walkers;

static void walk_stack(ucontext_t *uc, bool in_signal);

/* Walk once per activation, counted among the walks in progress. */
static void walk_once(ucontext_t *uc, bool in_signal)
{
	__atomic_add_fetch(&walkers, 1, __ATOMIC_SEQ_CST);
	if (ag_active() && walked_gen != __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) {
		walked_gen = generation;
		walk_stack(uc, in_signal);
	}
	__atomic_sub_fetch(&walkers, 1, __ATOMIC_SEQ_CST);
}

/*
 * A thread stopped in the agent's own code or in a patch area cannot be
 * walked; it is treated as inside the agent.  An area's unwind information
 * (unwind.c) is right only where the area has the call site's stack
 * pointer, and on a slow path it is 128 bytes lower (below the red zone) --
 * unwinding from there read frames out of the red zone, and return stubs
 * went over stack words that were no return addresses (run-cycles died of
 * SIGSEGV under load, 1 run in 3).  The agent's code: a slow path's or a
 * hook's C code, the trampolines, or the first instruction of the agent's
 * SIGTRAP handler -- the kernel, with two SIGTRAPs to deliver (an int3's or
 * a round's, and the activation's), builds the second frame over the first
 * before the handler runs one instruction (seen: a walk from on_trap's
 * entry through __restore_rt and the signal frame, 7 frames, libc's
 * __restore_rt "entered").
 */
static bool in_agent_code(const ucontext_t *uc)
{
	uint64_t pc = ag_uc_pc(uc);

	return ag_pool_holds(pc) || ag_agent_code_holds(pc);
}

/* A return address into ag_tramp_slow: the walk reached a slow path's
 * frame, past which lie registers it saved, not frames -- its CFI holds
 * only at its first instruction.  (The two return trampolines end a walk:
 * their CFI says so.) */
static bool in_slow_trampoline(uint64_t ip)
{
	return ip >= (uint64_t)(uintptr_t)ag_tramp_slow && ip < (uint64_t)(uintptr_t)ag_tramp_return;
}

static void walk(ucontext_t *uc)
{
	if (ag_busy() || ag_trap_nested() || in_agent_code(uc)) {
		ag_log("activation: thread %ld was inside the agent; it joins at its next traced call",
		       (long)syscall(SYS_gettid));
		return;
	}
	walk_once(uc, true);
}

/* The frames of a walk that went wrong somewhere, for the log. */
static void log_frames(const frame *f, ag_module *const *fm, int n)
{
	for (int k = 0; k < n; k++)
		ag_log("  frame %d: ip %#lx (%s+%#lx%s%s%s) sp %#lx", k, (unsigned long)f[k].ip,
		       fm[k] ? fm[k]->path : "?",
		       (unsigned long)(fm[k] ? f[k].ip - fm[k]->bias : 0),
		       ag_pool_holds(f[k].ip) ? ", agent pool" : "", f[k].exact ? ", exact" : "",
		       f[k].signal ? ", signal frame" : "", (unsigned long)f[k].sp);
}

/*
 * One walk's frames, innermost first, as the unwinder reports them from
 * its caller (walk_stack) outwards.  In a signal handler the frames before
 * the interrupted one (the agent's, the handler's, the kernel's sigreturn
 * trampoline) are passed over: the interrupted frame is the one at the
 * context's ip and stack pointer.  A frame's stack pointer is its callee's
 * CFA; its ip is exact below a signal frame (the unwinder says so: libgcc
 * takes the areas and stubs, whose CIEs say "S", as signal frames too, and
 * the ip below one is then the call's last byte, see x86_64/unwind.c).
 */
typedef struct walk_frames {
	frame *f;
	int n;
	bool skipping;              /* before the interrupted frame */
	uint64_t ip, sp;            /* the interrupted frame's */
	bool in_agent;              /* a slow path's frame was reached */
} walk_frames;

static _Unwind_Reason_Code on_frame(struct _Unwind_Context *ctx, void *arg)
{
	walk_frames *w = arg;
	int before = 0;
	uint64_t ip = (uint64_t)_Unwind_GetIPInfo(ctx, &before);
	/* libgcc's context at a frame holds its callee's CFA: the frame's sp. */
	uint64_t sp = (uint64_t)_Unwind_GetCFA(ctx);

	if (w->skipping) {
		if (ip != w->ip || sp != w->sp)
			return _URC_NO_REASON;
		w->skipping = false;
		before = 1;
	}
	if (ip == 0)
		return _URC_END_OF_STACK;
	/* A system call a slow path makes before ag_enter marks the thread
	 * busy (the SIGTRAP mask check): the thread is inside the agent. */
	if (in_slow_trampoline(ip)) {
		w->in_agent = true;
		return _URC_END_OF_STACK;
	}
	if (before && w->n > 0)
		w->f[w->n - 1].signal = true;
	w->f[w->n++] = (frame){ ip, sp, before != 0, false };
	return w->n < MAX_FRAMES ? _URC_NO_REASON : _URC_END_OF_STACK;
}

static void walk_stack(ucontext_t *uc, bool in_signal)
{
	trace_ring_header *ring;
	int n = 0, top, stubs = 0, entered = 0;
	bool in_agent = false, runtime_stop = false;

	ring = ag_enter();
	/* A thread without records yet (the rule at a first activation) gets
	 * its ring now, and the calls it was in open at the activation time:
	 * a thread that slept through it was in them then. */
	uint64_t t = ag_rdtsc();

	if (!ring) {
		ring = ag_ring_create();
		if (ring && ag_activation_tsc && ag_activation_tsc < t) {
			t = ag_activation_tsc;
			ring->start_tsc = t;
		}
	}
	if (!ring) {
		ag_leave(ring);
		return;
	}
	if (!thread_stubs)
		thread_stubs = ag_alloc(sizeof *thread_stubs);
	if (!thread_stubs) {
		ag_leave(ring);
		return;
	}
	frame *f = thread_stubs->f;
	ag_module **fm = thread_stubs->fm;
	uint32_t *ff = thread_stubs->ff;

	ag_ring_put_at(ring, TRACE_EVENT, TRACE_EV_ACTIVATE, t);
	unstub(thread_stubs, ag_uc_sp(uc));
	walk_frames wf = { f, 0, in_signal, ag_uc_pc(uc), ag_uc_sp(uc), false };

	if (!ag_unwind_walk_begin()) {
		ag_log("activation: thread %ld was not walked: the agent was registering unwind "
		       "information; it joins at its next traced call", (long)syscall(SYS_gettid));
		ag_leave(ring);
		return;
	}
	_Unwind_Backtrace(on_frame, &wf);
	ag_unwind_walk_end();
	n = wf.n;
	in_agent = wf.in_agent;
	if (in_agent) {
		ag_log("activation: thread %ld was inside the agent (a slow path); it joins at its "
		       "next traced call", (long)syscall(SYS_gettid));
		ag_leave(ring);
		return;
	}
	/* Which frames are traced functions, up to the first start function --
	 * or up to the first in code a language runtime manages (Go, V8) or
	 * in code no object holds (a JIT's): such a runtime reads the return
	 * addresses of its frames, which must stay as they are, and the
	 * frames past it were found without unwind information. */
	for (top = 0; top < n; top++) {
		uint64_t at = f[top].exact ? f[top].ip : f[top].ip - 1;
		ag_module *m = ag_module_of(at);
		uint32_t func = m && !f[top].signal ? ca_func_at(m->ca, at - m->bias) : CA_NONE;

		if (ag_runtime_code(at) || !ag_code_known(at)) {
			runtime_stop = true;
			ag_log("activation: thread %ld: frame %d is in %s code (%#lx): it and the "
			       "frames outside it are left alone", (long)syscall(SYS_gettid), top,
			       ag_runtime_code(at) ? "runtime-managed" : "unknown (JIT?)",
			       (unsigned long)at);
			break;
		}

		fm[top] = m;
		ff[top] = func;
		if (func != CA_NONE &&
		    is_start(ca_str(m->ca, ca_module_funcs(m->ca, NULL)[func].name)))
			break;
	}
	/* Outermost first: the tree opens in call order. */
	for (int i = top - 1; i >= 0; i--) {
		uint64_t slot_addr, stub, ret;
		uint32_t site;

		if (ff[i] == CA_NONE)
			continue;
		if (i + 1 < n && in_area(f[i + 1].ip, &site, &ret)) {
			/* Called through an area (an earlier activation's call
			 * still in flight): the area records the exit, under its
			 * site id. */
			if (site)
				ag_ring_put_at(ring, TRACE_ENTRY, site, t);
			entered++;
			ag_instrument(fm[i], ff[i]);
			continue;
		}
		site = ag_site_root(fm[i], ff[i]);
		ag_ring_put_at(ring, TRACE_ENTRY, site, t);
		entered++;
		ag_instrument(fm[i], ff[i]);
		/* The return address of frame i lies just below the CFA, which
		 * is the stack pointer of frame i+1; it must hold frame i+1's ip. */
		if (i + 1 >= n || f[i + 1].exact || f[i].signal || (runtime_stop && i + 1 == top))
			continue;
		slot_addr = f[i + 1].sp - 8;
		if (*(uint64_t *)(uintptr_t)slot_addr != f[i + 1].ip ||
		    thread_stubs->n >= SHADOW_MAX || !(stub = stub_get())) {
			ag_log("activation: frame %d of thread %ld keeps its return address; its "
			       "exit will not be recorded", i, (long)syscall(SYS_gettid));
			log_frames(f, fm, n);
			continue;
		}
		{
			uint8_t *rw = stub_rw(stub);
			uint64_t ra = f[i + 1].ip - 1;

			memcpy(rw + STUB_SITE, &site, 4);
			memcpy(rw + AG_SLOT_RA, &ra, 8);
		}
		__atomic_thread_fence(__ATOMIC_RELEASE);
		thread_stubs->slot[thread_stubs->n] = stub;
		thread_stubs->loc[thread_stubs->n++] = slot_addr;
		*(uint64_t *)(uintptr_t)slot_addr = stub + AG_STUB_RETURN;
		stubs++;
	}
	/* The walk's entries and the instrumenting above are at time t; what
	 * happened since is the agent's own time (trace_format.h). */
	ag_ring_put_at(ring, TRACE_EVENT, TRACE_EV_AGENT_BEGIN, t);
	ag_log("activation: thread %ld walked %d frames, %d traced functions entered, %d return "
	       "stubs", (long)syscall(SYS_gettid), n, entered, stubs);
	ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_END);
	ag_leave(ring);
}

/*
 * Attached with --on accept or recv: a thread already blocked in that
 * system call made it through the C library's entry, not the agent's
 * interposer, so its return would go unseen.  It gets a breakpoint after
 * the syscall instruction instead (as a sleeping thread does at an
 * activation): when the call returns a connection or data, the event
 * happens there.
 */
static bool arm_thread_bp(int tid, uint64_t addr, const char *event, long nr);

/* Thread `tid` is in a system call: its number and the address it returns to. */
static bool thread_syscall(int tid, long *nr, uint64_t *pc)
{
	return ag_thread_where(tid, nr, pc) == 1 && *nr >= 0;
}

typedef struct watch {
	const char *event;
	const long *nrs;         /* the event's system calls */
	int armed;
	int n;                   /* in nrs */
	int skip;                /* the thread the injector stopped, going back into
				  * its call: armed apart */
} watch;

static bool event_call(const watch *w, long nr)
{
	for (int i = 0; i < w->n; i++)
		if (nr == w->nrs[i])
			return true;
	return false;
}

static int watch_one(int tid, void *arg)
{
	watch *w = arg;
	uint64_t pc;
	long nr;

	if (tid != w->skip && thread_syscall(tid, &nr, &pc) && event_call(w, nr) &&
	    arm_thread_bp(tid, pc, w->event, nr))
		w->armed++;
	return 0;
}

/*
 * The thread the injector stopped goes back into its system call only when
 * the injector lets it go and it gets a CPU -- on a busy machine long after
 * the agent is here -- and meanwhile /proc shows it in none, or in the
 * injector's own remote calls (its munmap).  Looked at there, it went
 * unwatched: a receive the daemon waited for passed untraced, a pipe's
 * helper answered the first traced request untraced and its counts named
 * the next one's bytes (a receive matched to a send two seconds after it).
 * So it is not looked at: the injector says which call it goes back into
 * and where that call returns (stopped_nr, stopped_pc), and the breakpoint
 * goes there at once -- the thread runs nothing at that address before the
 * call returns.  A thread whose call had ended when it was stopped
 * (stopped_nr -1) is looked at as the others are.
 */
void ag_watch_blocked_calls(const char *event, int stopped, long stopped_nr,
			    uint64_t stopped_pc)
{
	static const long accept_nrs[] = { SYS_accept, SYS_accept4 };
	/* a read: a receive if on a socket (or an awaited pipe), ag_event_fires */
	static const long recv_nrs[] = { SYS_recvfrom, SYS_recvmsg, SYS_read, SYS_readv };
	bool acc = strcmp(event, "accept") == 0;
	watch w = { event, acc ? accept_nrs : recv_nrs, 0, acc ? 2 : 4,
		    stopped_nr >= 0 ? stopped : 0 };

	if (stopped > 0 && stopped_nr >= 0 && event_call(&w, stopped_nr) &&
	    arm_thread_bp(stopped, stopped_pc, event, stopped_nr))
		w.armed++;
	ag_for_other_threads(watch_one, &w);
	if (w.armed)
		ag_log("%s: %d thread(s) already waiting in it are watched by a breakpoint", event,
		       w.armed);
}

/*
 * The calling thread walks its own stack now (an event -- accept, recv --
 * happened on it, in the agent's interposer; not in a signal handler).
 * The agent's own frames on top are not traced functions and are skipped.
 */
void ag_walk_self(ucontext_t *signal_uc)
{
	ucontext_t *uc;

	if (signal_uc) {
		walk(signal_uc);          /* in the SIGTRAP handler: from the trap */
		return;
	}
	if (!thread_stubs)
		thread_stubs = ag_alloc(sizeof *thread_stubs);
	if (!thread_stubs)
		return;
	uc = &thread_stubs->self_uc;
	if (getcontext(uc) == 0)
		walk_once(uc, false);
}

/* A new activation round (an event activation that does not ask the other
 * threads to walk still counts as one). */
void ag_activation_round(void)
{
	__atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
}

/* ---- making every thread walk (control thread) ---- */

/*
 * Breakpoints armed for sleeping threads.  One that fired, or that a stop
 * disarmed, stays in the table as retired (fd -1): its SIGTRAP may already
 * be queued on its thread, and must still be recognised (and swallowed)
 * when it arrives.  Entries are handed out round robin, so a retired one is
 * reused only after MAX_BPS newer ones.
 */
typedef struct bp {
	volatile int tid;          /* 0: never used */
	uint64_t addr;
	volatile int fd;           /* -1: retired */
	const char *event;         /* NULL: walk for an activation; else the event
				      ("accept", "recv") whose system call returns here */
	long nr;                   /* that system call */
} bp;

static bp bps[MAX_BPS];
static uint32_t bp_next;       /* control thread only */

/* A breakpoint at `addr` for thread `tid` only. */
static bool arm_thread_bp(int tid, uint64_t addr, const char *event, long nr)
{
	int fd = ag_perf_breakpoint(addr, tid, false, true);

	if (fd < 0)
		return false;
	for (int k = 0; k < MAX_BPS; k++) {
		bp *b = &bps[bp_next++ % MAX_BPS];

		if (b->tid && b->fd >= 0)
			continue;               /* still armed */
		__atomic_store_n(&b->tid, 0, __ATOMIC_RELEASE);
		b->addr = addr;
		b->fd = fd;
		ag_fd_keep(&b->fd, NULL, 0);
		b->event = event;
		b->nr = nr;
		__atomic_store_n(&b->tid, tid, __ATOMIC_RELEASE);
		ioctl(b->fd, PERF_EVENT_IOC_ENABLE, 0);
		return true;
	}
	close(fd);
	return false;
}

/* Take a breakpoint out (it fired, or tracing stopped); the entry stays. */
static void retire(bp *b)
{
	int fd = __atomic_exchange_n(&b->fd, -1, __ATOMIC_ACQ_REL);

	if (fd >= 0) {
		ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
		ag_fd_drop(fd);
	}
}

/* sptrace stop (control thread; tracing is already off): wait for walks in
 * progress, and take out the breakpoints of threads still asleep. */
void ag_activate_quiesce(void)
{
	while (__atomic_load_n(&walkers, __ATOMIC_SEQ_CST))
		sched_yield();
	for (int i = 0; i < MAX_BPS; i++)
		if (bps[i].tid)
			retire(&bps[i]);
}

static bool queue_trap(int tid)
{
	return ag_queue_sigtrap(tid, activate_magic);
}

/* Thread `tid`: blocked in a system call (breakpoint after it) or running
 * (a queued SIGTRAP). */
static const char *reach(int tid)
{
	uint64_t pc;
	long nr;

	if (thread_syscall(tid, &nr, &pc) && arm_thread_bp(tid, pc, NULL, nr))
		return "breakpoint after its system call";
	return queue_trap(tid) ? "signal" : NULL;
}
/*
 * Activate now (the control thread, on the timer or `sptrace activate`):
 * every thread but this one walks its stack.  Threads created later are
 * traced from their start routine (threads.c).
 */
static int reach_one(int tid, void *arg)
{
	const char *how;

	(void)arg;
	if (ag_quiet_tid(tid)) {
		ag_log("activation: thread %d cannot read the TSC: not traced", tid);
		return 0;
	}
	how = reach(tid);
	if (how)
		ag_log("activation: thread %d reached by %s", tid, how);
	else
		ag_log("activation: thread %d cannot be reached (%s); it joins at its first "
		       "traced call", tid, strerror(errno));
	return 0;
}

void ag_activate_running(bool new_round)
{
	if (new_round)
		__atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
	int n;

	/* Under the instrument lock, so that an exec on another thread never
	 * carries one of these SIGTRAPs into its new image (exec.c). */
	ag_instrument_lock();
	n = ag_for_other_threads(reach_one, NULL);
	ag_instrument_unlock();
	ag_log("activation: %d threads asked to walk their stacks", n);
}
/*
 * From the SIGTRAP handler: is this trap one of the activation's?  Then the
 * thread walks (and the interrupted code resumes where it was).
 */
bool ag_activation_trap(siginfo_t *si, ucontext_t *uc)
{
	/* A thread that cannot read the TSC (tsc.c) neither walks nor makes a
	 * system call (strict seccomp): its requests are answered by nothing,
	 * a breakpoint of ours stays (the activation skips known quiet threads
	 * and sets none on them). */
	if (ag_tls_quiet) {
		if (si->si_code == SI_QUEUE && si->si_value.sival_ptr == (void *)activate_magic)
			return true;
		for (int i = 0; si->si_code == TRAP_PERF && i < MAX_BPS; i++)
			if (bps[i].addr == ag_uc_pc(uc))
				return true;
		return false;
	}
	if (si->si_code == SI_QUEUE && si->si_pid == getpid() &&
	    si->si_value.sival_ptr == (void *)activate_magic) {
		walk(uc);
		return true;
	}
	if (si->si_code == TRAP_PERF) {
		int tid = (int)syscall(SYS_gettid);
		uint64_t pc = ag_uc_pc(uc);

		for (int i = 0; i < MAX_BPS; i++)
			if (__atomic_load_n(&bps[i].tid, __ATOMIC_ACQUIRE) == tid && bps[i].addr == pc) {
				const char *event = bps[i].event;
				long rc = ag_uc_syscall_ret(uc), nr = bps[i].nr;
				int fd = (int)ag_uc_syscall_arg0(uc);

				retire(&bps[i]);
				if (!event)
					walk(uc);
				else if ((rc > 0 || (rc == 0 && strcmp(event, "accept") == 0)) &&
					 /* a read is a receive on a socket only (msgs.c) */
					 (ag_expect_mode() || (nr != SYS_read && nr != SYS_readv) ||
					  ag_fd_is_socket(fd)) &&
					 ag_event_fires(event, fd, rc, NULL)) {
					ag_activate_on_event(event, strcmp(event, "accept") == 0
							     ? (int)rc : fd, uc);
					/* the receive itself, which no interposer saw */
					if (rc > 0 && strcmp(event, "recv") == 0)
						ag_msgs_received(fd, nr, rc);
				}
				return true;
			}
	}
	return false;
}
