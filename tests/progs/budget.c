/*
 * budget.c — hot tiny functions and a slow one, for the overhead budget
 * (tests/e2e/test_budget.py, `sptrace run --budget`).
 *
 *   budget THREADS CALLS [tail]
 *
 * Each thread calls tiny() CALLS times directly and tiny_ptr() CALLS times
 * through a function pointer (an indirect call site), and slow(), which
 * spins 20 us, SLOW_CALLS times in between; main joins them and prints
 * "budget THREADS CALLS sum S".  So the trace must say tiny and tiny_ptr
 * THREADS * CALLS times each (most of them counted, not timed) and slow
 * THREADS * SLOW_CALLS times, every one with its entry and exit.
 *
 * With "tail", each thread also calls hop() and hop_ptr() CALLS times,
 * which end in a tail jump (`jmp`, sibling call) to tiny_tail() directly
 * and to tiny_tail_ptr() through a function pointer (an indirect tail
 * jump): those two are reached THREADS * CALLS times each.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOW_CALLS 50
#define MAX_THREADS 16

static long calls;

/* The empty asm keeps the calls: gcc may not prove they do nothing. */
__attribute__((noinline)) long tiny(long i)
{
	__asm__ volatile("" : : "r"(i));
	return i & 1;
}

__attribute__((noinline)) long tiny_ptr(long i)
{
	__asm__ volatile("" : : "r"(i));
	return (i >> 1) & 1;
}

static long (*volatile ptr)(long) = tiny_ptr;

__attribute__((noinline)) long tiny_tail(long i)
{
	__asm__ volatile("" : : "r"(i));
	return (i >> 2) & 1;
}

__attribute__((noinline)) long tiny_tail_ptr(long i)
{
	__asm__ volatile("" : : "r"(i));
	return (i >> 3) & 1;
}

static long (*volatile tail_ptr)(long) = tiny_tail_ptr;

/* -O2: both end in a jmp (a sibling call), not a call. */
__attribute__((noinline)) long hop(long i)
{
	__asm__ volatile("" : : "r"(i));
	return tiny_tail(i + 1);
}

__attribute__((noinline)) long hop_ptr(long i)
{
	__asm__ volatile("" : : "r"(i));
	return tail_ptr(i + 1);
}

static int tails;

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) void slow(void)
{
	long t0 = now_ns();

	while (now_ns() - t0 < 20000)
		;
}

static void *worker(void *arg)
{
	long s = 0, every = calls / SLOW_CALLS;

	for (long i = 0; i < calls; i++) {
		s += tiny(i);
		s += ptr(i);
		if (tails)
			s += hop(i) + hop_ptr(i);
		if (i % every == every - 1)
			slow();
	}
	*(long *)arg = s;
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[MAX_THREADS];
	long sums[MAX_THREADS], sum = 0;
	int n = argc > 2 ? atoi(argv[1]) : 0;

	calls = argc > 2 ? atol(argv[2]) : 0;
	tails = argc > 3 && !strcmp(argv[3], "tail");
	if (n < 1 || n > MAX_THREADS || calls < SLOW_CALLS) {
		fprintf(stderr, "usage: budget THREADS(1-%d) CALLS(>= %d)\n", MAX_THREADS, SLOW_CALLS);
		return 2;
	}
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, worker, &sums[i]) != 0)
			return 1;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		sum += sums[i];
	}
	printf("budget %d %ld sum %ld\n", n, calls, sum);
	return 0;
}
