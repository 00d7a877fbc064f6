/*
 * tsc.c — threads that cannot read the time-stamp counter.
 *
 * Every record holds an rdtsc reading.  A thread may forbid itself the
 * instruction: prctl(PR_SET_TSC, PR_TSC_SIGSEGV), which the threads it
 * creates afterwards inherit, or seccomp's strict mode, which also leaves it
 * only read, write, exit and sigreturn -- any other system call kills the
 * process.  Under either, an rdtsc raises SIGSEGV.  Such a thread goes
 * quiet for good: it records nothing more, the program runs on.
 *
 *   - Its TLS ring is NULL (ag_leave keeps it so), so the generated code
 *     never reaches its rdtsc and takes the slow path, which answers "skip"
 *     (or "go on untraced") before any system call (main.c: ag_slow).
 *   - The agent's C code reads no TSC on it: ag_rdtsc gives a time from
 *     another clock (the clock_gettime system call; under strict mode, where
 *     that is forbidden too, the last TSC value any thread read).
 *   - It makes no ring, serves no activation walk, answers no activation
 *     breakpoint, instruments nothing from a signal handler, and the
 *     activation does not ask it to walk (activate.c).
 *
 * How a thread is found to be one:
 *   1. the program's prctl() reaches the interposer below (run: exported;
 *      attach: a GOT hook, hooks.c), which makes the thread quiet before
 *      the call -- after a strict-mode call it could not say so;
 *   2. a ring is about to be made for a thread whose TSC faults (PR_GET_TSC:
 *      a thread created by a quiet one, or one that asked by a raw system
 *      call before its first record);
 *   3. a raw system call did it after the thread's first record: its next
 *      record faults.  A SIGSEGV at an rdtsc in a record stub or elsewhere
 *      in the agent's own code is the agent's (ag_tsc_fault, called first by the
 *      fatal-signal handlers in signals.c): the thread goes quiet (as if in
 *      strict mode: which of the two it was cannot be asked), the record in
 *      flight is skipped, and the thread goes on.
 * Each says so in agent.log.
 * Not covered: a raw seccomp call on a thread without a ring yet (its first
 * record's slow path makes system calls), and, under attach, a SIGSEGV
 * handler the program installed before the agent came (the safety net is
 * the agent's own fatal-signal handler).
 */
#include <errno.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"

__thread uint8_t ag_tls_quiet __attribute__((tls_model("initial-exec")));

#define MAX_QUIET 1024

static int quiet_tids[MAX_QUIET];
static volatile uint32_t nquiet;
static volatile uint64_t tsc_last;     /* the last TSC any thread read (ag_rdtsc) */

/* Calibration (main.c): TSC = tsc0 + (monotonic ns - mono0) * hz / 1e9. */
static uint64_t cal_hz, cal_tsc0, cal_mono0;

void ag_tsc_calibrated(uint64_t hz, uint64_t tsc0, uint64_t mono0)
{
	cal_hz = hz;
	cal_tsc0 = tsc0;
	cal_mono0 = mono0;
}

uint64_t ag_tsc_hz(void)
{
	return cal_hz;
}

uint64_t ag_rdtsc(void)
{
	uint64_t t;

	if (ag_tls_quiet)
		return ag_tsc_fallback();
	t = ag_arch_cycles();
	__atomic_store_n(&tsc_last, t, __ATOMIC_RELAXED);
	return t;
}

/* A time in TSC units for a quiet thread. */
uint64_t ag_tsc_fallback(void)
{
	struct timespec ts;
	uint64_t last = __atomic_load_n(&tsc_last, __ATOMIC_RELAXED), t;

	/* The system call, not the C library's clock_gettime: the vDSO reads
	 * the TSC itself. */
	if (ag_tls_quiet == AG_QUIET_STRICT || !cal_hz ||
	    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) != 0)
		return last;
	t = cal_tsc0 + (uint64_t)((double)((uint64_t)ts.tv_sec * 1000000000u +
					   (uint64_t)ts.tv_nsec - cal_mono0) * (double)cal_hz / 1e9);
	return t > last ? t : last;
}

bool ag_quiet_tid(int tid)
{
	uint32_t n = __atomic_load_n(&nquiet, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < n && i < MAX_QUIET; i++)
		if (quiet_tids[i] == tid)
			return true;
	return false;
}

/* The calling thread (tid, 0 if unknown) records no more: why, for the log.
 * No system call but the log's write. */
static void go_quiet(uint8_t level, int tid, const char *why)
{
	uint32_t slot;

	if (ag_tls_quiet < level)
		ag_tls_quiet = level;
	ag_tls_ring = NULL;
	ag_tls_counts = NULL;       /* nor counts (budget.c) */
	if (tid > 0 && !ag_quiet_tid(tid) &&
	    (slot = __atomic_fetch_add(&nquiet, 1, __ATOMIC_ACQ_REL)) < MAX_QUIET)
		quiet_tids[slot] = tid;
	ag_log("thread %d: %s: it cannot read the TSC from now on (rdtsc faults), so it records "
	       "nothing more%s; the program goes on", tid, why,
	       level == AG_QUIET_STRICT ? " and the agent makes no system call on it" : "");
}

bool ag_tsc_usable(int tid)
{
	int v = 0;

	if (ag_tls_quiet)
		return false;
	if (syscall(SYS_prctl, PR_GET_TSC, &v, 0, 0, 0) == 0 && v == PR_TSC_SIGSEGV) {
		go_quiet(AG_QUIET_TSC, tid, "PR_TSC_SIGSEGV (inherited, or set by a raw system call)");
		return false;
	}
	return true;
}

/*
 * A SIGSEGV: is it an rdtsc of the agent's that faulted?  Then the thread
 * goes quiet and resumes past the rdtsc with made-up values: in a record
 * stub (tramp.S), a TSC whose high bits differ from the ring's epoch, so
 * the record takes its SYNC slow path, which skips it for a quiet thread;
 * in the agent's C code, the fallback time.  No system call but the log's write.
 */
bool ag_tsc_fault(int sig, const siginfo_t *si, ucontext_t *uc)
{
	uint64_t pc = ag_uc_pc(uc), fake;
	const trace_ring_header *ring = ag_tls_ring;
	bool stub;

	if (sig != SIGSEGV || si->si_code != SI_KERNEL)
		return false;
	stub = pc >= (uint64_t)(uintptr_t)ag_record_entry && pc < (uint64_t)(uintptr_t)ag_records_end;
	if ((!stub && !ag_agent_code_holds(pc)) || !ag_arch_cycles_insn_at(pc))
		return false;
	go_quiet(AG_QUIET_STRICT, ring ? (int)ring->tid : 0,
		 "an rdtsc of the agent's faulted (PR_SET_TSC or strict seccomp by a raw system call)");
	if (stub) {
		/* The stub loaded the ring before its rdtsc. */
		const trace_ring_header *r = (const trace_ring_header *)(uintptr_t)
					     ag_arch_stub_ring(uc);

		fake = (r->epoch ^ 1) << TRACE_TSC_LOW_BITS;
	} else {
		fake = ag_tsc_fallback();
	}
	ag_arch_cycles_resume(uc, fake);
	return true;
}

/*
 * prctl: PR_SET_TSC with PR_TSC_SIGSEGV and PR_SET_SECCOMP with
 * SECCOMP_MODE_STRICT make the thread quiet first; the call is the system
 * call the C library's prctl makes.  A call that fails gives the thread
 * its ring back.
 */
AG_EXPORT int prctl(int option, ...)
{
	unsigned long a[4];
	va_list ap;
	uint8_t level = 0, was = ag_tls_quiet;
	trace_ring_header *ring = ag_tls_ring;
	long rc;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_TSC && a[0] == PR_TSC_SIGSEGV)
		level = AG_QUIET_TSC;
	else if (option == PR_SET_SECCOMP && a[0] == SECCOMP_MODE_STRICT)
		level = AG_QUIET_STRICT;
	if (level && ag_tls_quiet < level)
		go_quiet(level, (int)syscall(SYS_gettid), level == AG_QUIET_TSC
			 ? "prctl(PR_SET_TSC, PR_TSC_SIGSEGV)"
			 : "prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)");
	else
		level = 0;
	rc = syscall(SYS_prctl, option, a[0], a[1], a[2], a[3]);
	if (rc != 0 && level) {
		int e = errno;

		ag_tls_quiet = was;
		ag_tls_ring = ring;
		ag_tls_counts = ring ? ag_budget_counts() : NULL;
		ag_log("thread %ld: that prctl failed (%d): it records again", (long)syscall(SYS_gettid),
		       e);
		errno = e;
	}
	return (int)rc;
}
