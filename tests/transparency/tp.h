/*
 * tp.h — what every transparency program shares: the handshake with
 * test_transparency.py.
 *
 * A program does its setup, prints "ready" and waits for a line on stdin
 * (attached runs are attached right then, while main waits in read), then
 * calls tp_after_go(), which each program defines: the work whose behaviour
 * must not change under the agent.  Everything it prints to stdout, its
 * exit status and the files it leaves in argv[1] (a scratch directory) are
 * compared with a native run.  tp_after_go must be reached after the
 * attach: the test checks that the trace holds it (the agent was there).
 */
#ifndef TP_H
#define TP_H

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TP_NOINLINE __attribute__((noinline))

int tp_after_go(const char *scratch);

/* What a program does before "ready" (threads, masks, files): before the
 * attach.  0 when ready. */
int tp_setup(const char *scratch);

static inline void tp_handshake(void)
{
	char line[16];

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		exit(99);
}

/* Ask the test for `sptrace CMD` now (stop, activate) and wait until it is
 * done: traced, the command must succeed; natively nothing happens.  The
 * line is part of the output, the same either way. */
static inline void tp_control(const char *cmd)
{
	char line[16];

	printf("control %s\n", cmd);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		exit(98);
}

/* libtp_sigwait_dl.so, built beside the programs: a library no repository
 * holds, which the agent meets only when it is loaded. */
static inline void *tp_open_library(void)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
	char *slash;

	if (n <= 0)
		return NULL;
	path[n] = '\0';
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "libtp_sigwait_dl.so");
	return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
		return 2;
	}
	if (tp_setup(argv[1]) != 0)
		return 3;
	tp_handshake();
	return tp_after_go(argv[1]);
}

#endif
