/*
 * agent.c — putting the sptrace agent into a running process: what
 * `sptrace attach` and spdaemon's inject request both do once the trace
 * directory is made (inj_attach_agent, injector.h).
 *
 *   1. Threads that block SIGTRAP would be killed by the agent's first
 *      breakpoint: SIGTRAP is taken out of their masks before the agent
 *      exists, and the agent is told which (trapblocked=), to keep their
 *      belief that it is blocked (agent/signals.c).
 *   2. The agent's configuration -- one "key=value" line each: dir, on,
 *      ring, repo, threads, prepared, session, wait, expect, tsc_hz (this
 *      process's measure of the counter's rate, sp.h: the agent need not
 *      spend 2 ms measuring it), a join line per join directive,
 *      trapblocked -- is the argument of its
 *      entry function sptrace_agent_attach (agent/main.c).
 *   3. inj_load loads it (inject.c).  If that fails and the agent is not
 *      still starting, no agent will place a breakpoint: the masks are put
 *      back as they were.
 */
#include "injector.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Threads that blocked SIGTRAP before the attach the agent keeps track of
 * (agent/signals.c holds as many). */
#define MAX_TRAP_THREADS 1024

static size_t put(char *buf, size_t len, size_t at, const char *key, const char *val)
{
	if (!val || !*val || at >= len)
		return at;
	return at + (size_t)snprintf(buf + at, len - at, "%s=%s\n", key, val);
}

int inj_attach_agent(pid_t pid, const inj_agent *a, inj_result *r, sp_err *err)
{
	static __thread inj_trap_thread traps[MAX_TRAP_THREADS];
	size_t len = 4096 + MAX_TRAP_THREADS * 32, at = 0;
	char *config, hz[24];
	inj_opts o = { .so_path = a->so_path, .entry = "sptrace_agent_attach",
		       .timeout = a->timeout > 0 ? a->timeout : 120, .safe_wait = 3 };
	int ntraps = 0, rc;

	memset(r, 0, sizeof *r);
	if (strlen(a->dir) + (a->repo ? strlen(a->repo) : 0) +
	    (a->prepared ? strlen(a->prepared) : 0) + (a->expect ? strlen(a->expect) : 0) +
	    (a->session ? strlen(a->session) : 0) > 3000 || a->njoin > 16)
		return sp_fail(err, "pid %d: the agent's paths are too long", (int)pid);
	if (!(config = malloc(len)))
		return sp_fail(err, "out of memory");
	if (inj_open_sigtrap(pid, traps, MAX_TRAP_THREADS, &ntraps, err)) {
		free(config);
		return -1;
	}
	at = put(config, len, at, "dir", a->dir);
	at = put(config, len, at, "on", a->on);
	at = put(config, len, at, "ring", a->ring);
	at = put(config, len, at, "budget", a->budget);
	at = put(config, len, at, "repo", a->repo);
	at = put(config, len, at, "threads", a->threads);
	at = put(config, len, at, "prepared", a->prepared);
	at = put(config, len, at, "session", a->session);
	at = put(config, len, at, "wait", a->wait);
	at = put(config, len, at, "mark", a->mark);
	at = put(config, len, at, "expect", a->expect);
	snprintf(hz, sizeof hz, "%llu", (unsigned long long)sp_tsc_hz());
	at = put(config, len, at, "tsc_hz", hz);
	for (size_t i = 0; i < a->njoin; i++)
		at = put(config, len, at, "join", a->join[i]);
	if (ntraps)
		at += (size_t)snprintf(config + at, len - at, "trapblocked=");
	for (int i = 0; i < ntraps && at < len; i++)
		at += (size_t)snprintf(config + at, len - at, "%d:%llx%s", (int)traps[i].tid,
				       (unsigned long long)traps[i].fs_base,
				       i + 1 < ntraps ? "," : "\n");
	o.arg = config;
	rc = inj_load(pid, &o, r, err);
	if (rc && !r->entry_running) {
		sp_err ignored;

		inj_close_sigtrap(pid, traps, ntraps, &ignored);
	}
	free(config);
	return rc;
}
