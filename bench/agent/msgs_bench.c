/*
 * msgs_bench.c — what a message event adds to a traced send or receive
 * (bench/msgs_bench.sh runs it natively and under `sptrace run`).
 *
 *   msgs_bench N ROUNDS
 *
 * One thread, a UNIX stream socketpair, 64-byte messages.  Each round times
 * N pairs of send + recv through the C library (the agent's interposers:
 * under sptrace run two message events per pair, the channel known after
 * the first), then N pairs through syscall(2) (no interposer, no event: the
 * same kernel work and one traced call each, as send and recv are).  Rounds
 * interleave the two loops, so that a noisy machine hits both alike.  Each
 * round prints "libc NS raw NS": nanoseconds of thread CPU time per pair.
 *
 * Added cost of the message events per call = ((traced libc - traced raw)
 * - (native libc - native raw)) / 2.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void libc_pairs(int a, int b, long n)
{
	char buf[64] = { 0 };

	for (long i = 0; i < n; i++)
		if (send(a, buf, sizeof buf, 0) != sizeof buf || recv(b, buf, sizeof buf, 0) != sizeof buf)
			exit(2);
}

__attribute__((noinline)) static void raw_pairs(int a, int b, long n)
{
	char buf[64] = { 0 };

	for (long i = 0; i < n; i++)
		if (syscall(SYS_sendto, a, buf, sizeof buf, 0, NULL, 0) != sizeof buf ||
		    syscall(SYS_recvfrom, b, buf, sizeof buf, 0, NULL, NULL) != sizeof buf)
			exit(2);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	int rounds = argc > 2 ? atoi(argv[2]) : 5, sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return 1;
	libc_pairs(sv[0], sv[1], 1000);         /* warm up: channel known, sites patched */
	raw_pairs(sv[0], sv[1], 1000);
	for (int r = 0; r < rounds; r++) {
		uint64_t t0 = cpu_ns(), t1, t2;

		libc_pairs(sv[0], sv[1], n);
		t1 = cpu_ns();
		raw_pairs(sv[0], sv[1], n);
		t2 = cpu_ns();
		printf("libc %.1f raw %.1f\n", (double)(t1 - t0) / n, (double)(t2 - t1) / n);
	}
	return 0;
}
