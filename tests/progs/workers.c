/*
 * workers.c — N identical worker processes, one of which goes wrong
 * (tests/e2e/test_analyze.py: the ground truth of `sptrace analyze`).
 *
 *   workers N BAD MODE
 *
 * The parent forks N workers and prints "worker I pid P" for each; every
 * worker runs ROUNDS rounds of step() -> compute().  Worker BAD, in
 * MODE:
 *   loop   after a few rounds enters spin_forever(), a loop that calls
 *          nothing; the parent kills it once the others are done
 *   crash  after a few rounds calls crash_here(), which writes through a
 *          null pointer (SIGSEGV)
 *   slow   calls slow_path() in every round as well (a third of the
 *          worker's time)
 *   none   behaves like the others
 * The parent waits for all of them and exits 0.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa))
#define ROUNDS 400

static volatile long sink;

static KEEP long compute(long n)
{
	long s = 0;

	for (long i = 0; i < n; i++)
		s += i % 7;
	return s;
}

static KEEP void step(int round)
{
	sink += compute(200000 + round % 3);
}

static KEEP void slow_path(void)
{
	sink += compute(120000);
}

static KEEP void spin_forever(void)
{
	for (;;)
		sink++;
}

static KEEP void crash_here(void)
{
	volatile int *p = (volatile int *)(uintptr_t)(sink * 0);

	*p = 1;
}

static KEEP void work(int bad, const char *mode)
{
	for (int r = 0; r < ROUNDS; r++) {
		step(r);
		if (bad && strcmp(mode, "slow") == 0)
			slow_path();
		if (bad && r == 20 && strcmp(mode, "loop") == 0)
			spin_forever();
		if (bad && r == 20 && strcmp(mode, "crash") == 0)
			crash_here();
	}
}

int main(int argc, char **argv)
{
	int n, bad;
	pid_t *pids, badpid = 0;

	if (argc != 4 || (n = atoi(argv[1])) < 1 || (bad = atoi(argv[2])) < 0 || bad >= n) {
		fprintf(stderr, "usage: workers N BAD loop|crash|slow|none\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	pids = calloc((size_t)n, sizeof *pids);
	for (int i = 0; i < n; i++) {
		fflush(stdout);
		pids[i] = fork();
		if (pids[i] == 0) {
			work(i == bad, argv[3]);
			_exit(0);
		}
		printf("worker %d pid %d\n", i, (int)pids[i]);
		if (i == bad)
			badpid = pids[i];
	}
	for (int i = 0; i < n; i++)
		if (pids[i] != badpid)
			waitpid(pids[i], NULL, 0);
	if (strcmp(argv[3], "loop") == 0)
		kill(badpid, SIGKILL);
	waitpid(badpid, NULL, 0);
	return 0;
}
