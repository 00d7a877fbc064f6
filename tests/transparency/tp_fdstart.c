/*
 * tp_fdstart.c — a program that opens files from its first instruction on
 * (agent/control.c, points 2 and 3).
 *
 * The agent's start opens descriptors on two threads (the control thread's
 * opens overlap the main thread's analysis); each holds the lowest free
 * number for a moment before fds.c moves it high.  All of that must be over
 * before the program runs: its open() gets the number it gets natively,
 * every time.  The program opens and closes a file for 20 ms first thing in
 * main, then opens 16 at once, and says which numbers it got.  A descriptor
 * the agent's start left at a low number shows every time; the control
 * thread's opens running into the program's (were the wait before the
 * activation trap gone) only when the two threads run on two CPUs at once.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <time.h>

#include "tp.h"

#define LOOP_NS 20000000          /* 20 ms of opens */

static char seen[4096];

/* The numbers open() gave, as "3 4 ..." (each once, in order). */
static void numbers(void)
{
	bool got[256] = { false };
	int other = 0, fds[16];
	size_t n = 0;
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		int fd = open("/dev/null", O_RDONLY);

		if (fd >= 0 && fd < 256)
			got[fd] = true;
		else
			other++;
		if (fd >= 0)
			close(fd);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < LOOP_NS);
	for (int fd = 0; fd < 256; fd++)
		if (got[fd])
			n += (size_t)snprintf(seen + n, sizeof seen - n, " %d", fd);
	n += (size_t)snprintf(seen + n, sizeof seen - n, "; others %d; 16 at once:", other);
	for (int i = 0; i < 16; i++) {
		fds[i] = open("/dev/null", O_RDONLY);
		n += (size_t)snprintf(seen + n, sizeof seen - n, " %d", fds[i]);
	}
	for (int i = 0; i < 16; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	numbers();              /* before anything else: nothing is printed before "ready" */
	return 0;
}

TP_NOINLINE static unsigned mix(unsigned x)
{
	return x * 2654435761u;
}

int tp_after_go(const char *scratch)
{
	(void)scratch;
	printf("opened at start:%s\n", seen);
	printf("mix %u\n", mix(7));
	return 0;
}
