/*
 * injector.h — load a shared object into a running process (ptrace).
 *
 * Used by `sptrace attach` (and later by spdaemon).  One thread of the
 * target is stopped for a few remote calls -- memfd_create, mmap,
 * pthread_create -- at a point where it holds no lock of the C library (a
 * wait the C library or a Go runtime made), and the thread it starts does
 * the dlopen while the target runs on.  See inject.c for the protocol.
 */
#ifndef INJECTOR_H
#define INJECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "sp.h"

typedef struct inj_opts {
	const char *so_path;     /* the object to load (read here, sent as a memfd) */
	const char *entry;       /* exported function called after dlopen: int f(const char *) */
	const char *arg;         /* its argument (copied into the target) */
	double timeout;          /* seconds to wait for the target to finish loading */
	double safe_wait;        /* seconds to look for a thread at a safe point */
} inj_opts;

typedef struct inj_result {
	pid_t tid;               /* the thread that was stopped */
	double pause_ms;         /* how long it was stopped */
	double total_ms;         /* from the start to the entry function's return */
	int tries;               /* threads looked at before one was at a safe point */
	long entry_rc;           /* what the entry function returned */
	bool entry_running;      /* timed out while the entry function ran: it goes on */
} inj_result;

/* Can `pid` be injected?  0, or -1 with a message naming the pid and what
 * to do (no such process, permission, ptrace_scope, 32-bit, static or
 * non-glibc, a tracer already attached). */
int inj_check(pid_t pid, sp_err *err);

/* Does `pid` have a mapping whose path contains `name` (an object already
 * loaded)?  1 yes, 0 no, -1 error. */
int inj_has_mapping(pid_t pid, const char *name);

/* A thread of the target whose SIGTRAP was blocked before the attach:
 * its tid and its thread pointer (fs base = pthread_self() there). */
typedef struct inj_trap_thread {
	pid_t tid;
	uint64_t fs_base;
} inj_trap_thread;

/* Take SIGTRAP out of the signal mask of every thread of pid that blocks
 * it (the agent's breakpoints would kill such a thread), each stopped for
 * the change and let go with its system call as it was; the threads in
 * out[0..*n).  0, or -1 with a message (then no mask is changed). */
int inj_open_sigtrap(pid_t pid, inj_trap_thread *out, int cap, int *n, sp_err *err);

/* Put SIGTRAP back into those threads' masks (an attach that failed). */
void inj_close_sigtrap(pid_t pid, const inj_trap_thread *list, int n, sp_err *err);

/* Load o->so_path into pid and call o->entry(o->arg) there, on a thread of
 * its own.  0 when entry returned 0 (r->entry_rc), -1 with a message. */
int inj_load(pid_t pid, const inj_opts *o, inj_result *r, sp_err *err);

/*
 * agent.c — the sptrace agent into a running process, its trace directory
 * made: SIGTRAP opened where blocked, the agent's configuration, inj_load.
 * 0 when the agent runs; -1 with a message (r->entry_rc 1: loaded but not
 * tracing, its reason in the trace's meta; r->entry_running: timed out
 * while the agent was still starting, it goes on).
 */
typedef struct inj_agent {
	const char *so_path;     /* libsptrace-agent.so */
	const char *dir;         /* the trace directory (absolute, made) */
	const char *on;          /* the activation event, as the agent reads it */
	const char *ring;        /* ring bytes, or NULL */
	const char *budget;      /* the overhead budget in percent, or NULL */
	const char *repo;        /* SPTRACE_REPO to use, or NULL */
	const char *threads;     /* "event", "all", or NULL */
	const char *prepared;    /* a repository analysed for it, or NULL */
	const char *session;     /* spdaemon: the propagation session, or NULL */
	const char *wait;        /* ... milliseconds a traced send waits, or NULL */
	const char *mark;        /* ... "offset" or "oob": how its TCP sends are marked */
	const char *expect;      /* ... the receive to start at, or NULL
	                          * (agent/propagate.c) */
	const char *const *join; /* join directives (trace_format.h, "Values") */
	size_t njoin;
	double timeout;          /* seconds; 0: 120 */
} inj_agent;

int inj_attach_agent(pid_t pid, const inj_agent *a, inj_result *r, sp_err *err);

#endif
