/*
 * relocate.c — short call sites traced through a relocated window.
 *
 * A 2- or 3-byte indirect call (`call *%rax`, `call *0x18(%rbx)`) has no
 * room for a 5-byte jump and, often, no dead padding within a rel8 jump.
 * The analyser then plans a *window*: the instructions before the call in
 * the same basic block, none a branch target, call or system call, which
 * together with the call are at least 5 bytes.  The area begins with a copy
 * of them, byte for byte (a rip-relative operand's disp32, which the
 * analysis located, re-aimed for the copy's address), then does the call as
 * every indirect area does.  (A window whose rip-relative operand could not
 * be located or re-aimed, or one starting with a one-byte instruction (see
 * patch.c's SIGTRAP handler), is not used: the call gets a trap, put back
 * once hot, like a TRAP plan -- an int3 that stays costs a signal per call.)
 *
 * Writing the jump over the window is only safe when no thread stands
 * inside it: a thread preempted, or interrupted by a signal, between two of
 * its instructions would resume in the middle of the new jump.  So:
 *
 *   1. The window's first byte becomes int3, through the usual batch
 *      (patch.c), and stays: a thread reaching the window traps and goes to
 *      the area (the trap table).  A thread already past the first byte is
 *      unaffected; it runs the original instructions and the call goes
 *      untraced, once.
 *   2. Now and then the control thread looks at every other thread
 *      (/proc/self/task/T/syscall): one blocked in the kernel has its user
 *      address there -- inside a window, that window waits for a later
 *      round; one running gets a queued SIGTRAP whose handler moves it, if
 *      it stands inside a window, to the same offset in the copy (the
 *      copy has the same layout).  The round waits for every handler
 *      (asking again a thread whose signal was merged with a pending
 *      SIGTRAP of its own: standard signals are not queued twice).
 *   3. No thread is inside a window and none can enter one (the int3): the
 *      5-byte jumps are written, int3 first as always.
 *
 * Step 2 holds the instrument lock, so no instrumentation and no stop run
 * meanwhile.  A thread that enters a system call between the look and the
 * signal sees the call end as a handled signal ends it (read, accept, futex
 * restart; poll, epoll_wait, nanosleep return EINTR), as at an activation
 * (activate.c); rounds happen only while windows wait, a handful per run.
 * Not covered: a thread inside a program's signal handler that interrupted
 * it inside a window (its outer frame returns there); the handler would
 * have to be running at the moment of the round.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"

#define QUEUE_MAX 16384
#define ROUND_TIMEOUT_NS 200000000L

/*
 * What the queued SIGTRAP carries: QUIESCE_MAGIC in the high half (never the
 * high half of a user-space address, which the agent's other requests
 * carry), the round's number and the index of the asked thread.  The
 * handler needs no system call to know who it is: a signal handler making
 * system calls while the thread was inside one tripped valgrind ("Assertion
 * 'sci->status.what == SsIdle' failed").  A late answer to an earlier round
 * is told by its number.
 */
#define QUIESCE_MAGIC 0x53505152ull
static unsigned round_no;

static void *quiesce_value(int i)
{
	return (void *)(uintptr_t)(QUIESCE_MAGIC << 32 | (uint64_t)(round_no & 0xffff) << 16 |
				   (uint64_t)i);
}

/* Under the instrument lock. */
static ag_reloc *queue[QUEUE_MAX];
static size_t nqueue;
static uint64_t nqueued, nupgraded;
static bool given_up;              /* a round timed out: windows stay traps */

/* The round in progress: its windows are queue[0..round_n), read by the
 * signal handlers (the queue does not change while the round holds the
 * instrument lock). */
static volatile size_t round_n;

/* The threads asked this round, and which have answered.  A SIGTRAP is
 * not queued while another is pending (not a real-time signal): a thread
 * running into int3s may drop ours, so unanswered threads are asked again. */
#define ASKED_MAX 4096
static int asked_tid[ASKED_MAX];
static volatile int answered[ASKED_MAX];
static volatile int nasked;

bool ag_reloc_gave_up(void)
{
	return given_up;
}

void ag_reloc_queue(ag_reloc *r)
{
	nqueued++;
	if (nqueue < QUEUE_MAX && !given_up) {
		queue[nqueue++] = r;
		if (nqueue == 1)
			ag_control_wake();
	}
}

void ag_reloc_forget(void)
{
	nqueue = 0;
}

void ag_reloc_stats(uint64_t *queued, uint64_t *upgraded)
{
	*queued = nqueued;
	*upgraded = nupgraded;
}

/* The round's window pc stands inside (past its first byte), -1 if none
 * (windows never overlap: each holds one call). */
static ssize_t window_at(uint64_t pc)
{
	size_t n = __atomic_load_n(&round_n, __ATOMIC_ACQUIRE);

	for (size_t i = 0; i < n; i++)
		if (pc > queue[i]->start && pc < queue[i]->end)
			return (ssize_t)i;
	return -1;
}

bool ag_reloc_trap(siginfo_t *si, ucontext_t *uc)
{
	uint64_t v = (uint64_t)(uintptr_t)si->si_value.sival_ptr, pc;
	int i = (int)(v & 0xffff);
	ssize_t w;

	if (si->si_code != SI_QUEUE || si->si_pid != ag_self_pid || v >> 32 != QUIESCE_MAGIC)
		return false;
	/* Inside the agent's own SIGTRAP handler: the program's pc is in the
	 * outer frame, out of reach; no answer, the round asks again. */
	if (ag_trap_nested())
		return true;
	pc = ag_uc_pc(uc);
	w = window_at(pc);
	if (w >= 0)
		ag_uc_set_pc(uc, queue[w]->copy + (pc - queue[w]->start));
	if (((v >> 16) & 0xffff) == (__atomic_load_n(&round_no, __ATOMIC_ACQUIRE) & 0xffff) &&
	    i < __atomic_load_n(&nasked, __ATOMIC_ACQUIRE))
		__atomic_store_n(&answered[i], 1, __ATOMIC_RELEASE);
	return true;
}

typedef struct look {
	bool busy[QUEUE_MAX];          /* a blocked thread stands inside */
} look;

static int look_at(int tid, void *arg)
{
	look *l = arg;
	uint64_t pc;
	long nr;
	int where = ag_thread_where(tid, &nr, &pc);

	/* -1: gone, or the kernel could not say (it answers EAGAIN for a
	 * thread that woke up while it looked): ask it like a running one (if
	 * it is gone, the signal cannot be queued and nobody waits for it). */
	if (where == 1) {
		ssize_t w = window_at(pc);

		if (w >= 0)
			l->busy[w] = true;
		return 0;
	}
	if (nasked < ASKED_MAX) {
		int i = nasked;

		asked_tid[i] = tid;
		answered[i] = 0;
		__atomic_store_n(&nasked, i + 1, __ATOMIC_RELEASE);
		if (!ag_queue_sigtrap(tid, quiesce_value(i)) && errno == ESRCH)
			answered[i] = 1;        /* gone: nobody waits for it */
	} else {
		for (size_t i = 0; i < round_n; i++)
			l->busy[i] = true;    /* cannot ask them all: no jumps this round */
	}
	return 0;
}

/* How many asked threads have not answered; every 5 ms they are asked
 * again (a thread that is gone cannot be: it counts as answered). */
static int unanswered(bool ask_again)
{
	int left = 0;

	for (int i = 0; i < nasked; i++) {
		if (__atomic_load_n(&answered[i], __ATOMIC_ACQUIRE))
			continue;
		if (ask_again && !ag_queue_sigtrap(asked_tid[i], quiesce_value(i)) && errno == ESRCH) {
			answered[i] = 1;
			continue;
		}
		left++;
	}
	return left;
}

static bool wait_acks(void)
{
	struct timespec t0, now, nap = { 0, 50000 };
	long last_ask = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		long ns;

		clock_gettime(CLOCK_MONOTONIC, &now);
		ns = (now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec);
		bool again = ns - last_ask > 5000000;

		if (again)
			last_ask = ns;
		if (unanswered(again && ns > 0) == 0)
			return true;
		if (ns > ROUND_TIMEOUT_NS)
			return false;
		nanosleep(&nap, NULL);
	}
}

void ag_reloc_upgrade(void)
{
	static look l;
	static ag_patch jumps[QUEUE_MAX];
	static ag_reloc *later[QUEUE_MAX];
	size_t nj = 0, nlater = 0;

	if (!__atomic_load_n(&nqueue, __ATOMIC_RELAXED))
		return;
	ag_instrument_lock();
	if (!nqueue || !ag_active() || given_up) {
		ag_instrument_unlock();
		return;
	}
	memset(&l, 0, sizeof l);
	__atomic_store_n(&nasked, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&round_no, round_no + 1, __ATOMIC_RELEASE);
	__atomic_store_n(&round_n, nqueue, __ATOMIC_RELEASE);
	ag_for_other_threads(look_at, &l);
	if (!wait_acks()) {
		/* A thread that cannot take the signal now (stopped, say) may
		 * still be inside: never write the jumps; a late handler finds
		 * no round and changes nothing.  The windows' int3s go (a signal
		 * per call is too slow to keep) and no window is used again. */
		static uint64_t starts[QUEUE_MAX];
		size_t n = nqueue;

		__atomic_store_n(&round_n, 0, __ATOMIC_RELEASE);
		given_up = true;
		for (size_t i = 0; i < n; i++)
			starts[i] = queue[i]->start;
		nqueue = 0;
		ag_patch_revert(starts, n);
		ag_instrument_unlock();
		ag_log("relocate: %d of %d threads did not answer within %ld ms; %zu relocated "
		       "windows put back, and no more are used", unanswered(false), (int)nasked,
		       ROUND_TIMEOUT_NS / 1000000, n);
		return;
	}
	for (size_t i = 0; i < nqueue; i++) {
		if (l.busy[i])
			later[nlater++] = queue[i];
		else
			jumps[nj++] = queue[i]->jump;
	}
	__atomic_store_n(&round_n, 0, __ATOMIC_RELEASE);
	if (ag_patch_apply(jumps, nj) == 0)
		nupgraded += nj;
	memcpy(queue, later, nlater * sizeof *later);
	nqueue = nlater;
	ag_instrument_unlock();
}
