/*
 * tp_sigblock.c — every signal blocked before the agent arrives, signals
 * taken from a signalfd (issue 11, cases 2 and 5; haproxy's workers and
 * the sigwait/signalfd pattern).
 *
 * A worker thread blocks every signal and calls functions without pause;
 * main blocks every signal too and reads a signalfd for all of them.  Then
 * (after the attach) a timer sends SIGALRM 40 times.  The worker must never
 * meet an int3 of the agent's while SIGTRAP is blocked (the kernel kills
 * the process), and the signalfd must return SIGALRM every time, never a
 * signal of the agent's.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/time.h>

#include "tp.h"

#define NREADS 40

static volatile int stopping;
static int sfd = -1;
static pthread_t worker;
static unsigned long mismatches, rounds;

TP_NOINLINE static unsigned step_a(unsigned x)
{
	return x * 3 + 1;
}

TP_NOINLINE static unsigned step_b(unsigned x)
{
	return step_a(x) ^ (x >> 3);
}

TP_NOINLINE static unsigned step_c(unsigned x)
{
	return step_b(x) + step_a(x + 1);
}

static void *work(void *arg)
{
	(void)arg;
	while (!stopping) {
		for (unsigned i = 0; i < 100; i++)
			if (step_c(i) != ((i * 3 + 1) ^ (i >> 3)) + i * 3 + 4)
				mismatches++;
		rounds++;
	}
	return NULL;
}

int tp_setup(const char *scratch)
{
	sigset_t all;

	(void)scratch;
	sigfillset(&all);
	if (pthread_sigmask(SIG_BLOCK, &all, NULL) != 0)
		return 1;
	sfd = signalfd(-1, &all, SFD_CLOEXEC);
	if (sfd < 0)
		return 1;
	return pthread_create(&worker, NULL, work, NULL);   /* inherits the mask */
}

int tp_after_go(const char *scratch)
{
	struct itimerval it = { { 0, 3000 }, { 0, 3000 } }, off;
	unsigned counts[65] = { 0 };
	sigset_t now;

	(void)scratch;
	setitimer(ITIMER_REAL, &it, NULL);
	for (int i = 0; i < NREADS; i++) {
		struct signalfd_siginfo si;

		if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si) {
			printf("read from the signalfd failed\n");
			return 1;
		}
		counts[si.ssi_signo < 65 ? si.ssi_signo : 0]++;
	}
	memset(&off, 0, sizeof off);
	setitimer(ITIMER_REAL, &off, NULL);
	stopping = 1;
	pthread_join(worker, NULL);
	for (int s = 0; s < 65; s++)
		if (counts[s])
			printf("signal %d (%s): %u\n", s, strsignal(s), counts[s]);
	pthread_sigmask(SIG_BLOCK, NULL, &now);
	printf("SIGTRAP blocked as the program believes: %s\n",
	       sigismember(&now, SIGTRAP) ? "yes" : "no");
	printf("worker ran: %s, mismatches %lu\n", rounds ? "yes" : "no", mismatches);
	return 0;
}
