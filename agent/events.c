/*
 * events.c — activation by what a thread does: `--on accept` (accept or
 * accept4 returned a connection) and `--on recv` (recv, recvfrom or recvmsg
 * returned data).  The functions are interposed (LD_PRELOAD under sptrace
 * run, GOT slots when attached: hooks.c); until the event they only pass
 * the call on.  The thread the event happened on starts tracing where it
 * stands (main.c: ag_activate_on_event), and the event is recorded as the
 * start of its flow.
 *
 * With --threads event (the default for these events) only that thread
 * records, and the threads it creates afterwards: a thread may create its
 * ring only if ag_may_trace() says so.
 */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "agent.h"

typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);

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

static void *next(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

static void after(const char *what, long rc, int fd)
{
	int e = errno;

	if (rc >= 0 && ag_event_wanted(what))
		ag_activate_on_event(what, (int)(strcmp(what, "accept") == 0 ? rc : fd), NULL);
	errno = e;
}

AG_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	static accept_fn real;
	int rc;

	if (!real && !(real = (accept_fn)next("accept"))) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(fd, addr, len);
	after("accept", rc, fd);
	return rc;
}

AG_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	static accept4_fn real;
	int rc;

	if (!real && !(real = (accept4_fn)next("accept4"))) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(fd, addr, len, flags);
	after("accept", rc, fd);
	return rc;
}

AG_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	static recv_fn real;
	ssize_t rc;

	if (!real && !(real = (recv_fn)next("recv"))) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(fd, buf, n, flags);
	if (rc > 0)
		after("recv", rc, fd);
	return rc;
}

AG_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr,
			   socklen_t *len)
{
	static recvfrom_fn real;
	ssize_t rc;

	if (!real && !(real = (recvfrom_fn)next("recvfrom"))) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(fd, buf, n, flags, addr, len);
	if (rc > 0)
		after("recv", rc, fd);
	return rc;
}

AG_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	static recvmsg_fn real;
	ssize_t rc;

	if (!real && !(real = (recvmsg_fn)next("recvmsg"))) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(fd, msg, flags);
	if (rc > 0)
		after("recv", rc, fd);
	return rc;
}
