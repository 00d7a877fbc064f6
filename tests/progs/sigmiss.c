/*
 * sigmiss.c — indirect calls that miss the agent's cache while a timer
 * signal's handler makes indirect calls that miss too (tests/e2e/
 * test_run.py, case sigmiss).
 *
 * The loop calls one of 64 functions through a pointer table, at random, so
 * most calls take the miss path (x86_64/emit.c: the target waits in
 * ag_tls_target while the agent looks it up); a SIGALRM every 50 us runs a
 * handler doing the same through another table.  Each function returns its
 * own number: a call that reached another function than the one its
 * pointer named is counted.  Prints "calls N wrong W bad_in_handler B" and
 * exits 1 if W or B is not 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define KEEP __attribute__((noinline, noipa))

#define F(i) KEEP static int f##i(void) { return i; } \
	     KEEP static int g##i(void) { return 1000 + i; }
#define F8(i) F(i##0) F(i##1) F(i##2) F(i##3) F(i##4) F(i##5) F(i##6) F(i##7)
F8(1) F8(2) F8(3) F8(4) F8(5) F8(6) F8(7) F8(8)
#define P8(p, i) p##i##0, p##i##1, p##i##2, p##i##3, p##i##4, p##i##5, p##i##6, p##i##7
static int (*const fs[64])(void) = { P8(f, 1), P8(f, 2), P8(f, 3), P8(f, 4),
				     P8(f, 5), P8(f, 6), P8(f, 7), P8(f, 8) };
static int (*const gs[64])(void) = { P8(g, 1), P8(g, 2), P8(g, 3), P8(g, 4),
				     P8(g, 5), P8(g, 6), P8(g, 7), P8(g, 8) };

/* What fs[i] and gs[i] return: their names' numbers. */
static int number(unsigned i)
{
	return (int)((i / 8 + 1) * 10 + i % 8);
}

static volatile unsigned hseed = 7;
static volatile long bad_in_handler;

KEEP static int call_g(unsigned i)
{
	return gs[i]();
}

static void on_alarm(int sig)
{
	unsigned i = (hseed = hseed * 1103515245u + 12345u) >> 16 & 63;

	(void)sig;
	if (call_g(i) != 1000 + number(i))
		bad_in_handler++;
}

KEEP static int call_f(unsigned i)
{
	return fs[i]();
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 2000000, wrong = 0;
	unsigned seed = 1;
	struct sigaction sa;
	struct itimerval it = { { 0, 50 }, { 0, 50 } };

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	for (long k = 0; k < n; k++) {
		unsigned i = (seed = seed * 1103515245u + 12345u) >> 16 & 63;

		if (call_f(i) != number(i))
			wrong++;
	}
	memset(&it, 0, sizeof it);
	setitimer(ITIMER_REAL, &it, NULL);
	printf("calls %ld wrong %ld bad_in_handler %ld\n", n, wrong, (long)bad_in_handler);
	return wrong || bad_in_handler;
}
