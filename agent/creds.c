/*
 * creds.c — the control thread holds what the program's thread holds: its
 * capabilities, keepcaps, securebits, bounding and ambient sets.
 *
 *  1. Linux keeps credentials per thread: setresuid(2) changes its caller's
 *     only.  glibc makes the POSIX call process-wide (__nptl_setxid): it
 *     signals every thread it started (SIGSETXID), each makes the same
 *     system call in the handler, and when a thread's result differs from
 *     another's glibc calls abort().
 *  2. The control thread (control.c) is such a thread.  What decides those
 *     results is per thread too, and glibc leaves it to the program: the
 *     capability sets (capset), keepcaps, the securebits, the bounding and
 *     the ambient sets (prctl).  A program alone in its process sets them on
 *     its one thread: `setpriv --reuid U --regid G` keeps its capabilities
 *     (prctl PR_SET_KEEPCAPS), calls setresuid, raises CAP_SETGID again
 *     (capset), calls setresgid.  The control thread had lost CAP_SETGID at
 *     the setresuid, failed the setresgid its caller made, and glibc aborted
 *     a program that runs fine alone.
 *  3. So each call of the program that changes that state for its own
 *     thread and succeeds -- capset of itself; prctl PR_SET_KEEPCAPS,
 *     PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_CAP_AMBIENT but its query --
 *     is made again by the control thread on itself before the call returns
 *     to the program.  Whichever way it came: the C library's capset and
 *     prctl (interposed here and in tsc.c), or its syscall() (interposed in
 *     x86_64/context.S: libcap makes its system calls that way).
 *  4. The caller takes the one request slot (a lock; a signal handler
 *     that finds it taken on its own thread does not wait), fills it, wakes
 *     the control thread (ag_control_wake) and waits on a futex for its
 *     result, at most 2 s; the control thread serves the slot first thing
 *     each time it wakes (ag_creds_serve).  errno is the program's call's.
 *  5. A process without its control thread (a forked child; one whose
 *     control thread could not start) mirrors nothing: glibc has no other
 *     thread to ask.  A mirror that fails or does not come in time is
 *     logged: the program's next setxid may then abort as before.  Program
 *     threads whose capabilities differ from one another are their own
 *     affair (glibc's setxid would abort natively too); the control thread
 *     follows the last change.
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/capability.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#define MIRROR_WAIT_NS 2000000000ull

/* Point 4: the slot.  state: 0 free, 1 posted, 2 done (rc set). */
static struct {
	volatile int lock;
	volatile uint32_t state;
	long nr, arg[5];
	long rc;
	struct __user_cap_header_struct head;
	struct __user_cap_data_struct data[2];
} slot;

/* The C library's syscall(), behind the agent's (context.S); 0 until
 * found: context.S then makes the system call itself (ag_syscall_raw). */
uint64_t ag_real_syscall;

/* In every process the agent is loaded into, sptrace's or not: syscall()
 * is interposed there too. */
__attribute__((constructor)) static void find_syscall(void)
{
	void *real = dlsym(RTLD_NEXT, "syscall");

	if (real && real != (void *)syscall)
		ag_real_syscall = (uint64_t)(uintptr_t)real;
}

long ag_syscall_raw(long nr, long a, long b, long c, long d, long e, long f)
{
	long rc = ag_arch_syscall6(nr, a, b, c, d, e, f);

	if ((unsigned long)rc >= -4095ul) {
		errno = (int)-rc;
		return -1;
	}
	return rc;
}

static void futex_wake(volatile uint32_t *w)
{
	ag_arch_syscall6(SYS_futex, (long)w, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

/* Point 3: does this successful call change what point 2 lists, for the
 * calling thread? */
static bool changes_creds(long nr, long a, long b)
{
	if (nr == SYS_capset) {
		const struct __user_cap_header_struct *h = (const void *)a;

		return h && (h->pid == 0 || h->pid == ag_arch_syscall6(SYS_gettid, 0, 0, 0, 0, 0, 0));
	}
	return nr == SYS_prctl && (a == PR_SET_KEEPCAPS || a == PR_SET_SECUREBITS ||
				   a == PR_CAPBSET_DROP ||
				   (a == PR_CAP_AMBIENT && b != PR_CAP_AMBIENT_IS_SET));
}

static const char *call_name(long nr, long a)
{
	if (nr == SYS_capset)
		return "capset";
	switch (a) {
	case PR_SET_KEEPCAPS: return "prctl(PR_SET_KEEPCAPS)";
	case PR_SET_SECUREBITS: return "prctl(PR_SET_SECUREBITS)";
	case PR_CAPBSET_DROP: return "prctl(PR_CAPBSET_DROP)";
	default: return "prctl(PR_CAP_AMBIENT)";
	}
}

/* Point 4, the caller's side. */
static void mirror(long nr, const long a[5])
{
	uint64_t deadline = ag_mono_ns() + MIRROR_WAIT_NS;
	int self = (int)ag_arch_syscall6(SYS_gettid, 0, 0, 0, 0, 0, 0);
	static __thread uint8_t in_mirror __attribute__((tls_model("initial-exec")));

	if (!ag_control_serving() || self == ag_control_tid())
		return;
	if (in_mirror) {         /* a signal handler's call inside ours */
		ag_log("thread %d: %s in a signal handler while another was being mirrored: not "
		       "mirrored to the agent's thread", self, call_name(nr, a[0]));
		return;
	}
	in_mirror = 1;
	while (__atomic_exchange_n(&slot.lock, 1, __ATOMIC_ACQUIRE))
		sched_yield();
	/* a request a caller stopped waiting for (point 5) is served first */
	while (__atomic_load_n(&slot.state, __ATOMIC_ACQUIRE) == 1 && ag_mono_ns() < deadline)
		sched_yield();
	if (__atomic_load_n(&slot.state, __ATOMIC_ACQUIRE) == 1) {
		ag_log("thread %d: %s not mirrored to the agent's thread: it did not answer",
		       self, call_name(nr, a[0]));
		goto out;
	}
	slot.nr = nr;
	for (int i = 0; i < 5; i++)
		slot.arg[i] = a[i];
	if (nr == SYS_capset) {
		const struct __user_cap_header_struct *h = (const void *)a[0];
		const struct __user_cap_data_struct *d = (const void *)a[1];

		slot.head = (struct __user_cap_header_struct){ .version = h->version, .pid = 0 };
		slot.data[0] = d[0];
		if (h->version != _LINUX_CAPABILITY_VERSION_1)
			slot.data[1] = d[1];
		slot.arg[0] = (long)&slot.head;
		slot.arg[1] = (long)slot.data;
	}
	__atomic_store_n(&slot.state, 1, __ATOMIC_RELEASE);
	ag_control_wake();
	for (uint64_t now; __atomic_load_n(&slot.state, __ATOMIC_ACQUIRE) == 1 &&
	     (now = ag_mono_ns()) < deadline;) {
		struct timespec ts = { 0, (long)(deadline - now < 10000000 ? deadline - now
						   : 10000000) };

		ag_arch_syscall6(SYS_futex, (long)&slot.state, FUTEX_WAIT_PRIVATE, 1, (long)&ts, 0, 0);
	}
	if (__atomic_load_n(&slot.state, __ATOMIC_ACQUIRE) != 2) {
		ag_log("thread %d: %s not mirrored to the agent's thread within %llu ms: a setuid "
		       "or setgid of the program's may now fail there (glibc aborts then)", self,
		       call_name(nr, a[0]), MIRROR_WAIT_NS / 1000000);
		goto out;
	}
	if (slot.rc < 0)
		ag_log("thread %d: %s made again on the agent's thread failed (%ld): a setuid or "
		       "setgid of the program's may now fail there (glibc aborts then)", self,
		       call_name(nr, a[0]), -slot.rc);
	__atomic_store_n(&slot.state, 0, __ATOMIC_RELEASE);
out:
	__atomic_store_n(&slot.lock, 0, __ATOMIC_RELEASE);
	in_mirror = 0;
}

/* Point 4, the control thread's side: the posted call, on itself. */
void ag_creds_serve(void)
{
	if (__atomic_load_n(&slot.state, __ATOMIC_ACQUIRE) != 1)
		return;
	slot.rc = ag_arch_syscall6(slot.nr, slot.arg[0], slot.arg[1], slot.arg[2], slot.arg[3],
				   slot.arg[4], 0);
	__atomic_store_n(&slot.state, 2, __ATOMIC_RELEASE);
	futex_wake(&slot.state);
	/* nobody waits any more (point 5): free it for the next */
	if (!__atomic_load_n(&slot.lock, __ATOMIC_ACQUIRE))
		__atomic_store_n(&slot.state, 0, __ATOMIC_RELEASE);
}

/* syscall(SYS_capset or SYS_prctl, ...): context.S comes here for those
 * two, the rest go to the C library's syscall(). */
long ag_syscall_creds(long nr, long a, long b, long c, long d, long e, long f)
{
	long rc = ag_syscall_raw(nr, a, b, c, d, e, f);   /* -1: failed, errno set */

	if (rc != -1 && changes_creds(nr, a, b)) {
		int saved = errno;

		mirror(nr, (const long[5]){ a, b, c, d, e });
		errno = saved;
	}
	return rc;
}

int capset(struct __user_cap_header_struct *head, struct __user_cap_data_struct *data)
{
	return (int)ag_syscall_creds(SYS_capset, (long)head, (long)data, 0, 0, 0, 0);
}
