/*
 * threads.c — threads created after activation are traced from their start
 * routine on.
 *
 * The agent interposes pthread_create (it comes first in the lookup order,
 * through LD_PRELOAD) and starts the thread in ag_thread_start instead, which
 * records the start routine as the thread's root call, instruments it (so
 * tracing propagates from there) and calls it.  Before activation, and for
 * start routines outside the traced modules, the wrapper only passes the
 * call on: the thread runs exactly as it would have.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "agent.h"

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

typedef struct start_ctx {
	void *(*start)(void *);
	void *arg;
	ag_module *m;
	uint32_t func;
} start_ctx;

static create_fn real_create;

static void *ag_thread_start(void *p)
{
	start_ctx c = *(start_ctx *)p;
	trace_ring_header *ring;
	uint32_t site;
	void *ret;

	free(p);
	ring = ag_enter();
	if (!ring)
		ring = ag_ring_create();
	site = ag_site_root(c.m, c.func);
	ag_ring_put(ring, TRACE_EVENT, TRACE_EV_ACTIVATE);
	ag_ring_put(ring, TRACE_ENTRY, site);
	ag_instrument(c.m, c.func);
	ag_leave(ring);
	ret = c.start(c.arg);
	ring = ag_enter();
	if (ag_active())
		ag_ring_put(ring, TRACE_EXIT, site);
	ag_leave(ring);
	return ret;
}

int ag_real_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *),
			   void *arg)
{
	if (!real_create)
		real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
	return real_create ? real_create(th, attr, start, arg) : EAGAIN;
}

AG_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *),
			     void *arg)
{
	start_ctx *c;
	ag_module *m;
	uint32_t func;
	int rc;

	if (!ag_active())
		return ag_real_pthread_create(th, attr, start, arg);
	m = ag_module_of((uint64_t)(uintptr_t)start);
	func = m ? ca_func_at(m->ca, (uint64_t)(uintptr_t)start - m->bias) : CA_NONE;
	if (func == CA_NONE ||
	    ca_module_funcs(m->ca, NULL)[func].addr != (uint64_t)(uintptr_t)start - m->bias ||
	    !(c = malloc(sizeof *c)))
		return ag_real_pthread_create(th, attr, start, arg);
	*c = (start_ctx){ start, arg, m, func };
	rc = ag_real_pthread_create(th, attr, ag_thread_start, c);
	if (rc != 0)
		free(c);
	return rc;
}

/*
 * fork: the child is a copy with the same patched code, so it goes on
 * tracing -- into its own ring: the parent's ring file is shared memory and
 * the child must never write there, not even from the libc code that runs
 * in the child before the atfork handlers.  So the forking thread stops
 * recording in `prepare` (ag_enter: its TLS ring is NULL, nested slow paths
 * skip), the parent takes its ring back afterwards, and the child starts
 * without one: its first record creates ring.<child tid>.  Site ids come
 * from the counter shared through the sites file.  The child also needs its
 * own patch-area pools and its own /proc/self/mem (see pool.c, patch.c).
 */
static __thread trace_ring_header *ring_before_fork __attribute__((tls_model("initial-exec")));

static void prepare_fork(void)
{
	ring_before_fork = ag_enter();
}

static void parent_after_fork(void)
{
	ag_leave(ring_before_fork);
}

static void child_after_fork(void)
{
	ag_patch_after_fork();
	ag_pools_after_fork();
	ag_forked_child();
	ag_leave(NULL);
}

int ag_threads_init(void)
{
	return pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
}
