/*
 * jobs.c — one process, one thread, N jobs in a loop and no messages: the
 * ground truth of `--start FUNC` (tests/e2e/test_analyze.py).
 *
 *   jobs N BAD
 *
 * main() sets up (a table), then calls process_job(i) for i in 0..N-1 and
 * tears down.  Each job runs load_input() and transform(); job BAD also
 * runs retry_slow() (twice the job's work).  Prints "done".
 */
#include <stdio.h>
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa))
#define WORK 8000000L

static volatile long sink;

static KEEP long spin(long n)
{
	long s = 0;

	for (long i = 0; i < n; i++)
		s += i % 7;
	return s;
}

static KEEP void load_input(int job)
{
	sink += spin(WORK / 4 + job % 3);
}

static KEEP void transform(int job)
{
	sink += spin(WORK - job % 5);
}

static KEEP void retry_slow(void)
{
	sink += spin(WORK + WORK / 4);
}

static KEEP void process_job(int job, int bad)
{
	load_input(job);
	transform(job);
	if (job == bad)
		retry_slow();
}

static KEEP long *setup(int n)
{
	long *t = calloc((size_t)n, sizeof *t);

	for (int i = 0; t && i < n; i++)
		t[i] = spin(1000 + i);
	return t;
}

int main(int argc, char **argv)
{
	int n, bad;
	long *table;

	if (argc != 3 || (n = atoi(argv[1])) < 1 || (bad = atoi(argv[2])) < 0 || bad >= n) {
		fprintf(stderr, "usage: jobs N BAD\n");
		return 2;
	}
	table = setup(n);
	for (int i = 0; i < n; i++)
		process_job(i, bad);
	free(table);
	printf("done\n");
	return 0;
}
