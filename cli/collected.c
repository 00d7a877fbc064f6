/*
 * collected.c — reading a tree made by `sptrace collect` (cmd_collect.c):
 *
 *   OUT/HOST/PID/meta ...   one process's trace (its exec'd images below)
 *
 * and no OUT/meta, which tells it from a trace directory.  The tree is
 * the analysis library's session (analysis.h, an_session_open): hosts by
 * name, processes by pid.  replay and report show each process after one
 * header line naming its host.
 */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "analysis.h"
#include "trace_format.h"

/* The tree's session; names only: no module is analysed. */
static an_session *open_tree(const char *dir)
{
	an_open_opts opt = { .no_modules = 1 };
	an_session *s;
	sp_err err;

	if (an_session_open(dir, &opt, &s, &err) < 0)
		return NULL;
	if (!an_session_collected(s)) {
		an_session_close(s);
		return NULL;
	}
	return s;
}

int cli_collected_tree(const char *dir)
{
	an_session *s = open_tree(dir);

	an_session_close(s);
	return s != NULL;
}

int cli_collected_each(const char *dir, cli_collected_fn fn, void *arg)
{
	an_session *s = open_tree(dir);
	int rc = 0;

	for (size_t i = 0; s && i < an_session_nimages(s); i++) {
		const an_image *im = an_session_image(s, i);
		char pid[64], prog[PATH_MAX];
		const char *base = strrchr(im->dir, '/');

		if (im->exec_of != AN_NONE)
			continue;        /* fn shows a process's exec'd images itself */
		if (!cli_meta_get(im->dir, TRACE_META_PID, pid, sizeof pid))
			snprintf(pid, sizeof pid, "%.63s", base ? base + 1 : im->dir);
		if (!cli_meta_get(im->dir, TRACE_META_PROGRAM, prog, sizeof prog))
			snprintf(prog, sizeof prog, "?");
		printf("== host %s: pid %s (%s)\n", im->host, pid, prog);
		fflush(stdout);
		/* one damaged trace does not hide the others */
		rc |= fn(im->dir, arg);
	}
	an_session_close(s);
	return rc;
}
