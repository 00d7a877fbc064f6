/*
 * tp_setuid.c — a server that starts as root and drops to nobody before it
 * starts its workers (issue 11, messages): the agent can no longer create
 * rings in root's trace directory.  The program must not notice; the agent
 * says so once, not once per call (test_transparency.py counts the lines).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "tp.h"

#define NTHREADS 16

TP_NOINLINE static unsigned work_leaf(unsigned x)
{
	return x * 2654435761u;
}

static void *worker(void *arg)
{
	unsigned s = 0;

	for (unsigned i = 0; i < 1000; i++)
		s += work_leaf(i + (unsigned)(uintptr_t)arg);
	return (void *)(uintptr_t)s;
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	return 0;
}

int tp_after_go(const char *scratch)
{
	pthread_t th[NTHREADS];
	unsigned long total = 0;

	(void)scratch;
	if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
		printf("cannot become nobody\n");
		return 1;
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	for (int i = 0; i < NTHREADS; i++) {
		void *r;

		pthread_join(th[i], &r);
		total += (uintptr_t)r;
	}
	printf("uid %d, %d workers, total %lu\n", (int)getuid(), NTHREADS, total);
	return 0;
}
