/*
 * tp_closeall.c — a daemon that closes every descriptor, opens 40 files and
 * then runs code it never ran before (issue 11, case 1).
 *
 * The agent's descriptors (/proc/self/mem, agent.log, the sites file, the
 * control FIFO, ...) must survive the close loop, and the numbers the
 * program gets from open() must be the ones it gets natively: the agent
 * never writes code bytes or log lines into the program's files.
 *
 * Then, as a runtime with its own system calls would, it closes everything
 * past stderr with a raw close_range (the C library never sees it) and
 * opens one file 960 times -- over the numbers the agent had -- before
 * reaching new code again: the agent must notice its descriptors are gone
 * and write nowhere near that file.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>

#include "tp.h"

#define NFILES 40

static int fds[NFILES];

TP_NOINLINE static unsigned mix(unsigned x, unsigned k)
{
	return (x ^ k) * 2654435761u;
}

TP_NOINLINE static unsigned fresh_leaf(unsigned x)
{
	return mix(x, 7) + mix(x, 11);
}

TP_NOINLINE static unsigned fresh_mid(unsigned x)
{
	unsigned s = 0;

	for (unsigned i = 0; i < 50; i++)
		s += fresh_leaf(x + i);
	return s;
}

/* Code first reached after the files are open: instrumenting it writes
 * code (and the agent's log and sites file). */
TP_NOINLINE static unsigned fresh_top(unsigned x)
{
	return fresh_mid(x) ^ fresh_leaf(x);
}

TP_NOINLINE static unsigned later_leaf(unsigned x)
{
	return mix(x, 13) - x;
}

TP_NOINLINE static unsigned later_top(unsigned x)
{
	unsigned s = 0;

	for (unsigned i = 0; i < 20; i++)
		s ^= later_leaf(x + i) + fresh_leaf(i);
	return s;
}

/* dup2 of one file onto numbers near the top of the usual limit (where the
 * agent keeps its own): every one succeeds, as natively, and the agent's
 * writes that follow land in its own files. */
static int dup_high(const char *scratch)
{
	char path[4096];
	int ok = 0, fd;

	snprintf(path, sizeof path, "%s/dupped", scratch);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	for (int n = 880; n < 920; n++)
		if (dup2(fd, n) == n)
			ok++;
	printf("dup2 onto 880..919: %d of 40; result %u\n", ok, fresh_leaf(99) + later_leaf(3));
	for (int n = 880; n < 920; n++)
		close(n);
	close(fd);
	return ok;
}

/* Phase 2: the raw close, then one file at almost every number. */
static int raw_close_and_refill(const char *scratch)
{
	char path[4096];
	int n = 0;

	if (syscall(SYS_close_range, 3u, ~0u, 0) != 0)
		return -1;
	snprintf(path, sizeof path, "%s/many", scratch);
	for (int i = 0; i < 960; i++)
		if (open(path, O_RDWR | O_CREAT, 0600) >= 0)
			n++;
	return n;
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	return 0;
}

int tp_after_go(const char *scratch)
{
	int closed = 0, failed = 0;
	char path[4096];

	fflush(stdout);
	/* Daemon style: stdin and everything above stderr (stdout and stderr
	 * stay, for the comparison). */
	for (int fd = 0; fd < 1024; fd++) {
		if (fd == 1 || fd == 2)
			continue;
		if (close(fd) == 0)
			closed++;
	}
	printf("closed %d descriptors\n", closed);
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof path, "%s/file%02d", scratch, i);
		fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fds[i] < 0)
			failed++;
	}
	printf("opened %d files, first fd %d, last fd %d\n", NFILES - failed, fds[0],
	       fds[NFILES - 1]);
	printf("result %u\n", fresh_top(42));
	for (int i = 0; i < NFILES; i++) {
		char line[64];
		int n = snprintf(line, sizeof line, "file %d holds fd %d\n", i, fds[i]);

		if (write(fds[i], line, (size_t)n) != n)
			failed++;
		if (close(fds[i]) != 0)
			failed++;
	}
	printf("failures %d\n", failed);
	dup_high(scratch);
	printf("raw close_range, then %d descriptors of one file\n", raw_close_and_refill(scratch));
	printf("result %u\n", later_top(5));
	return failed ? 1 : 0;
}
