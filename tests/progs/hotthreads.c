/*
 * hotthreads.c — many threads calling a small function as fast as they can
 * (tests/e2e/test_records.py, bench/records_bench.py): the load under which
 * the copying drain of `sptrace run` fell behind (issue 16).
 *
 *   hotthreads THREADS CALLS [fsize BYTES] [spin]
 *
 * Each thread calls leaf() CALLS times; main prints one line, "hotthreads
 * THREADS CALLS loop_ns NS", and exits 0.  "fsize BYTES" first sets
 * RLIMIT_FSIZE (a trace file that cannot grow: the agent must neither send
 * the program SIGXFSZ nor lose records silently).  "spin" calls for ever
 * (for kill -9).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static long calls;
static int spin;
static volatile long sink;

/* The empty asm keeps the call: gcc may not prove leaf() does nothing. */
__attribute__((noinline)) void leaf(long i)
{
	__asm__ volatile("" : : "r"(i));
}

static void *worker(void *arg)
{
	for (long i = 0; spin || i < calls; i++)
		leaf(i);
	sink = calls;
	return arg;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 8;
	pthread_t th[256];
	struct timespec a, b;

	calls = argc > 2 ? atol(argv[2]) : 1000000;
	for (int i = 3; i < argc; i++) {
		if (strcmp(argv[i], "spin") == 0) {
			spin = 1;
		} else if (strcmp(argv[i], "fsize") == 0 && i + 1 < argc) {
			struct rlimit r = { (rlim_t)atol(argv[i + 1]), RLIM_INFINITY };

			if (setrlimit(RLIMIT_FSIZE, &r) != 0) {
				perror("setrlimit");
				return 2;
			}
			i++;
		}
	}
	if (n < 1 || n > 256 || calls < 0) {
		fprintf(stderr, "usage: hotthreads THREADS(1-256) CALLS [fsize BYTES] [spin]\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, worker, NULL) != 0) {
			fprintf(stderr, "hotthreads: pthread_create failed\n");
			return 2;
		}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("hotthreads %d %ld loop_ns %lld\n", n, calls,
	       (long long)(b.tv_sec - a.tv_sec) * 1000000000ll + (b.tv_nsec - a.tv_nsec));
	return 0;
}
