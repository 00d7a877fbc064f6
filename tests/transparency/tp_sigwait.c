/*
 * tp_sigwait.c — a server that takes every signal in sigwaitinfo and loads
 * a library later (issue 11, item 6).
 *
 * Every signal is blocked before the agent arrives; a thread waits in
 * sigwaitinfo() for all of them, as servers do, and stops at the first one
 * it does not expect.  After the handshake, main dlopen's a library that is
 * in no repository (libtp_sigwait_dl.so, beside the program) and calls into
 * it, gives the agent time to meet it (the control thread looks for new
 * modules every 200 ms), then sends itself SIGUSR1 and SIGUSR2.  A
 * pthread_atfork handler says so if it ever runs.
 *
 * An agent that analysed the library inside the program by forking a DWARF
 * reader gave it a SIGCHLD (the waiter printed it and stopped) and ran its
 * atfork handlers; natively neither happens.
 */
#define _GNU_SOURCE     /* sigabbrev_np */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "tp.h"

static pthread_t waiter;

/* Async-signal-safe: it may run in a forked child. */
static void say(const char *s)
{
	if (write(STDOUT_FILENO, s, strlen(s)) < 0)
		_exit(98);
}

static void at_prepare(void)
{
	say("atfork prepare handler ran\n");
}

static void at_parent(void)
{
	say("atfork parent handler ran\n");
}

static void at_child(void)
{
	say("atfork child handler ran\n");
}

static void *wait_signals(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	for (;;) {
		siginfo_t si;
		int s = sigwaitinfo(&all, &si);

		if (s < 0) {
			if (errno == EINTR)
				continue;
			printf("sigwaitinfo: %s\n", strerror(errno));
			break;
		}
		printf("got %s from %s\n", sigabbrev_np(s) ? sigabbrev_np(s) : "?",
		       si.si_pid == getpid() ? "the program itself" : "elsewhere");
		fflush(stdout);
		if (s == SIGUSR2)
			break;
		if (s != SIGUSR1) {
			printf("an unexpected signal: the server stops\n");
			break;
		}
	}
	return NULL;
}

int tp_setup(const char *scratch)
{
	sigset_t all;

	(void)scratch;
	if (pthread_atfork(at_prepare, at_parent, at_child) != 0)
		return 1;
	sigfillset(&all);
	if (pthread_sigmask(SIG_BLOCK, &all, NULL) != 0)
		return 1;
	return pthread_create(&waiter, NULL, wait_signals, NULL);   /* inherits the mask */
}


int tp_after_go(const char *scratch)
{
	struct timespec pause = { 1, 500000000 };
	unsigned (*work)(unsigned);
	void *lib;

	(void)scratch;
	lib = tp_open_library();
	if (!lib) {
		printf("dlopen: %s\n", dlerror());
		return 1;
	}
	work = (unsigned (*)(unsigned))dlsym(lib, "tpdl_work");
	if (!work) {
		printf("dlsym: %s\n", dlerror());
		return 1;
	}
	printf("library result %u\n", work(1000));
	fflush(stdout);
	/* Time for the agent to find the library and read its analysis. */
	nanosleep(&pause, NULL);
	printf("library result again %u\n", work(2000));
	fflush(stdout);
	kill(getpid(), SIGUSR1);
	kill(getpid(), SIGUSR2);
	pthread_join(waiter, NULL);
	printf("server done\n");
	return 0;
}
