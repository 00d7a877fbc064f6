/*
 * tp_notsc.c — threads that forbid themselves the time-stamp counter (issue
 * 11, item 4): prctl(PR_SET_TSC, PR_TSC_SIGSEGV), inherited by the threads
 * created afterwards, and seccomp's strict mode, which forbids every system
 * call but read, write, exit and sigreturn as well.  Under either an rdtsc
 * raises SIGSEGV -- and every record of the agent's holds one.
 *
 * Four threads, each through the C library's prctl() and through a raw
 * system call: they work (calls the agent traces), a PR_SET_TSC thread
 * creates a thread that works too, the strict ones report through a pipe
 * and leave with a raw exit.  The results must come out as natively, the
 * process alive.
 */
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "tp.h"

TP_NOINLINE static unsigned mix(unsigned x)
{
	return x * 2654435761u ^ (x >> 11);
}

TP_NOINLINE static unsigned work(unsigned seed)
{
	unsigned h = seed;

	for (unsigned i = 0; i < 20000; i++)
		h = mix(h + i);
	return h;
}

static void *inherited(void *arg)
{
	return (void *)(uintptr_t)work((unsigned)(uintptr_t)arg);
}

/* PR_SET_TSC, through prctl() or the raw system call; then a new thread. */
static void *notsc(void *arg)
{
	unsigned how = (unsigned)(uintptr_t)arg, r;
	pthread_t t;
	void *sub;
	long rc = how == 0 ? prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0)
		  : syscall(SYS_prctl, PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0);

	if (rc != 0)
		return (void *)1;
	r = work(100 + how);
	if (pthread_create(&t, NULL, inherited, (void *)(uintptr_t)(200 + how)) != 0 ||
	    pthread_join(t, &sub) != 0)
		return (void *)2;
	return (void *)(uintptr_t)(r ^ (unsigned)(uintptr_t)sub);
}

static int strict_pipe[2][2];

/* Strict seccomp, through prctl() or the raw system call; the result goes
 * out through the pipe (write is allowed), the thread through a raw exit. */
static void *strict(void *arg)
{
	unsigned how = (unsigned)(uintptr_t)arg, r;
	long rc = how == 0 ? prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0)
		  : syscall(SYS_seccomp, SECCOMP_SET_MODE_STRICT, 0, NULL);

	r = rc == 0 ? work(300 + how) : 0;
	if (write(strict_pipe[how][1], &r, sizeof r) != (ssize_t)sizeof r)
		r = 0;
	syscall(SYS_exit, 0);
	return NULL;
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	return pipe(strict_pipe[0]) || pipe(strict_pipe[1]);
}

int tp_after_go(const char *scratch)
{
	static const char *const how[] = { "prctl()", "raw system call" };
	pthread_t t;
	void *ret;
	unsigned r;

	(void)scratch;
	for (unsigned i = 0; i < 2; i++) {
		if (pthread_create(&t, NULL, notsc, (void *)(uintptr_t)i) != 0 ||
		    pthread_join(t, &ret) != 0)
			return 1;
		printf("PR_SET_TSC through %s: %#x\n", how[i], (unsigned)(uintptr_t)ret);
	}
	for (unsigned i = 0; i < 2; i++) {
		if (pthread_create(&t, NULL, strict, (void *)(uintptr_t)i) != 0)
			return 1;
		if (read(strict_pipe[i][0], &r, sizeof r) != (ssize_t)sizeof r)
			return 1;
		pthread_join(t, NULL);
		printf("strict seccomp through %s: %#x\n", how[i], r);
	}
	printf("main: %#x\n", work(7));
	return 0;
}
