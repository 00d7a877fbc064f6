/*
 * kcalls.c — a program whose system calls tests/kagent/ checks in the
 * kernel part of its trace: a write to a pipe, a read from it, getppid.
 * `kcalls loop N` calls getppid N times instead and prints the ns per call
 * (bench/kagent_bench.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static __attribute__((noinline)) void ask_parent(void)
{
	printf("ppid %d\n", (int)getppid());
}

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	int p[2];
	char buf[16] = "";

	if (argc == 3 && strcmp(argv[1], "loop") == 0) {
		long n = atol(argv[2]);
		long long t0 = now_ns();

		for (long i = 0; i < n; i++)
			getppid();
		printf("%.1f ns per getppid\n", (double)(now_ns() - t0) / (double)n);
		return 0;
	}
	if (pipe(p) != 0)
		return 1;
	if (write(p[1], "ping", 4) != 4 || read(p[0], buf, sizeof buf) != 4)
		return 1;
	ask_parent();
	printf("read %s\n", buf);
	return 0;
}
