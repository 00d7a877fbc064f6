/*
 * tp_forkmeta.c — children that exit while their parent is traced (issue
 * 11, item 8: postgres's postmaster forks backends that come and go).
 *
 * Every forked child carries a copy of the agent.  Children that exit
 * (through exit(), so atexit handlers run) must not end their parent's
 * trace: afterwards `sptrace stop` must restore the parent's code and
 * `sptrace activate` start again.  Children are forked while tracing and
 * again while the agent is dormant after the stop (before the next
 * activation); a grandchild too.
 */
#include <string.h>
#include <sys/wait.h>

#include "tp.h"

TP_NOINLINE static unsigned mix(unsigned x)
{
	return x * 2654435761u ^ (x >> 7);
}

TP_NOINLINE static unsigned work(unsigned seed)
{
	unsigned h = seed;

	for (unsigned i = 0; i < 1000; i++)
		h = mix(h + i);
	return h;
}

/* n children, each working and leaving by exit() with its own status; a
 * grandchild from the first.  Their statuses, in order, on stdout. */
TP_NOINLINE static int children(unsigned n, unsigned base)
{
	pid_t pids[8];

	fflush(stdout);         /* a child's exit() flushes its copy of the buffer */
	for (unsigned i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			return 1;
		if (pids[i] == 0) {
			if (i == 0) {
				pid_t g = fork();
				int st;

				if (g == 0)
					exit((int)(work(base) & 7));
				if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st))
					exit(100);
			}
			exit((int)((base + i + work(base + i)) & 63));
		}
	}
	for (unsigned i = 0; i < n; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) != pids[i])
			return 1;
		printf("child %u: %s %d\n", base + i, WIFEXITED(st) ? "exit" : "signal",
		       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
	return 0;
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	return 0;
}

int tp_after_go(const char *scratch)
{
	(void)scratch;
	if (children(4, 0))
		return 1;
	tp_control("stop");
	if (children(3, 10))        /* forked while dormant, before the next activation */
		return 1;
	tp_control("activate");
	printf("work %u\n", work(42));
	if (children(2, 20))
		return 1;
	tp_control("stop");
	printf("done\n");
	return 0;
}
