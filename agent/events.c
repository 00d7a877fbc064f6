/*
 * events.c — activation by what a thread does: `--on accept` (accept or
 * accept4 returned a connection) and `--on recv` (recv, recvfrom or recvmsg
 * returned data, or read/readv did on a socket).  The functions are
 * interposed in msgs.c (LD_PRELOAD under sptrace run, GOT slots when
 * attached: hooks.c), which calls ag_event_after when they return; until
 * the event nothing else happens.  The thread the event happened on starts tracing where it
 * stands (main.c: ag_activate_on_event), and the event is recorded as the
 * start of its flow.
 *
 * With --threads event (the default for these events) only that thread
 * records, and the threads it creates afterwards: a thread may create its
 * ring only if ag_may_trace() says so.
 */
#include <errno.h>
#include <string.h>

#include "agent.h"

static __thread uint8_t may_trace __attribute__((tls_model("initial-exec")));
static bool event_only;

bool ag_may_trace(void)
{
	return !event_only || may_trace;
}

bool ag_may_trace_get(void)
{
	return may_trace;
}

void ag_may_trace_set(bool yes)
{
	may_trace = yes;
}

void ag_event_only(bool yes)
{
	event_only = yes;
}

/* While spdaemon's agent awaits the receive of a traced send (propagate.c,
 * points 5 and 6) only that receive is the event; otherwise any. */
bool ag_event_fires(const char *what, int fd, long rc, const void *data)
{
	if (ag_expect_mode())
		return strcmp(what, "recv") == 0 && ag_expect_match(fd, rc, data);
	return true;
}

/* An accept (rc: the new descriptor) or a receive (rc: bytes) returned on
 * fd: the activation, if the agent waits for this event.  Called by the
 * interposers (msgs.c); errno is kept. */
void ag_event_after(const char *what, long rc, int fd, const void *data)
{
	int e = errno;

	if (rc >= 0 && ag_event_wanted(what) && ag_event_fires(what, fd, rc, data))
		ag_activate_on_event(what, (int)(strcmp(what, "accept") == 0 ? rc : fd), NULL);
	errno = e;
}
