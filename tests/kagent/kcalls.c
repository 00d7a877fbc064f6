/*
 * kcalls.c — a program whose system calls tests/kagent/ checks in the
 * kernel part of its trace: a write to a pipe, a read from it, getppid.
 * Other modes (tests/kagent/test_kagent.py, bench/kagent_bench.sh):
 *   kcalls loop N         getppid N times; prints the ns per call
 *   kcalls spin FILE      getppid until FILE exists; prints how many
 *   kcalls cat FILE       FILE to stdout (read and write)
 *   kcalls fork           a child asks getppid (ask_parent) and ends
 *   kcalls idle FILE      makes FILE.ready, then sleeps until FILE exists
 *                         (a traced process that costs the CPU nothing)
 *   kcalls wait FILE      likewise, then the write, read and getppid
 *                         (sptrace attach --kernel)
 *   kcalls pipes N        N writes and reads through a pipe, 20 ms apart
 *                         (calls through f_op pointers, found as they run)
 *   kcalls ploop N        N writes and reads through a pipe; prints the ns
 *                         per pair
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
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
	if (argc == 3 && strcmp(argv[1], "ploop") == 0) {
		long n = atol(argv[2]);
		long long t0;

		if (pipe(p) != 0)
			return 1;
		t0 = now_ns();
		for (long i = 0; i < n; i++)
			if (write(p[1], "ping", 4) != 4 || read(p[0], buf, sizeof buf) != 4)
				return 1;
		printf("%.1f ns per write and read\n", (double)(now_ns() - t0) / (double)n);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "pipes") == 0) {
		long n = atol(argv[2]);

		if (pipe(p) != 0)
			return 1;
		for (long i = 0; i < n; i++) {
			if (write(p[1], "ping", 4) != 4 || read(p[0], buf, sizeof buf) != 4)
				return 1;
			usleep(20000);
		}
		printf("%ld reads from a pipe\n", n);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "spin") == 0) {
		long n = 0;

		do {
			for (int i = 0; i < 1000; i++, n++)
				getppid();
		} while (access(argv[2], F_OK) != 0);
		printf("%ld getppid calls\n", n);
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "fork") == 0) {
		int status;
		pid_t child = fork();

		if (child == 0) {
			ask_parent();
			fflush(stdout);
			_exit(0);
		}
		return child > 0 && waitpid(child, &status, 0) == child && status == 0 ? 0 : 1;
	}
	if (argc == 3 && (strcmp(argv[1], "idle") == 0 || strcmp(argv[1], "wait") == 0)) {
		char ready[4096];

		snprintf(ready, sizeof ready, "%s.ready", argv[2]);
		close(open(ready, O_WRONLY | O_CREAT, 0600));
		while (access(argv[2], F_OK) != 0)
			usleep(10000);
		if (strcmp(argv[1], "idle") == 0)
			return 0;
	}
	if (argc == 3 && strcmp(argv[1], "cat") == 0) {
		int fd = open(argv[2], O_RDONLY);
		char b[4096];
		ssize_t got;

		if (fd < 0)
			return 1;
		while ((got = read(fd, b, sizeof b)) > 0)
			if (write(1, b, (size_t)got) != got)
				return 1;
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
