/*
 * trace_dir.c — what `sptrace run` and `sptrace attach` share: finding the
 * agent, making (or clearing away) a trace directory, and checking the
 * options that go to the agent.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The agent sits next to the sptrace binary in a build tree, else in the
 * installed libdir; $SPTRACE_AGENT overrides both. */
int cli_find_agent(const char *cmd, char *out, size_t len)
{
	char self[PATH_MAX], *slash;
	const char *env = getenv("SPTRACE_AGENT");
	ssize_t n;
	static const char *const rel[] = { "/../agent/libsptrace-agent.so",
					   "/../lib/sptrace/libsptrace-agent.so",
					   "/../lib/x86_64-linux-gnu/sptrace/libsptrace-agent.so" };

	if (env && *env) {
		if (access(env, R_OK) == 0) {
			snprintf(out, len, "%s", env);
			return 0;
		}
		return cli_error("%s: SPTRACE_AGENT=%s: %s", cmd, env, strerror(errno));
	}
	n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return cli_error("%s: cannot find my own executable: %s", cmd, strerror(errno));
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
		char cand[PATH_MAX + 64], real[PATH_MAX];

		snprintf(cand, sizeof cand, "%s%s", self, rel[i]);
		if (realpath(cand, real) && access(real, R_OK) == 0) {
			snprintf(out, len, "%s", real);
			return 0;
		}
	}
	return cli_error("%s: cannot find libsptrace-agent.so next to %s; set SPTRACE_AGENT to "
			 "its path", cmd, self);
}

/* Remove a trace directory made by us: only the files a trace holds, so a
 * directory with anything else in it is left alone. */
int cli_remove_trace_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int rc = 0;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char path[PATH_MAX + 300];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
		if (strncmp(de->d_name, "exec.", 5) == 0 || strncmp(de->d_name, "spawn.", 6) == 0) {
			if (cli_remove_trace_dir(path) != 0)     /* an exec'd image's trace */
				rc = -1;
			continue;
		}
		if (strncmp(de->d_name, "ring.", 5) != 0 && strncmp(de->d_name, "seg.", 4) != 0 &&
		    strcmp(de->d_name, "sites") != 0 && strcmp(de->d_name, "meta") != 0 &&
		    strcmp(de->d_name, "agent.log") != 0 && strcmp(de->d_name, "control") != 0) {
			rc = -1;
			continue;
		}
		if (unlink(path) != 0)
			rc = -1;
	}
	closedir(d);
	return rc == 0 ? rmdir(dir) : rc;
}

/* A fresh, empty trace directory; an existing one becomes DIR.old. */
int cli_prepare_trace_dir(const char *cmd, const char *dir, char *abs)
{
	char old[PATH_MAX + 8];
	struct stat st;

	if (stat(dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			return cli_error("%s: %s exists and is not a directory; choose another with -o",
					 cmd, dir);
		snprintf(old, sizeof old, "%s.old", dir);
		if (stat(old, &st) == 0 && cli_remove_trace_dir(old) != 0)
			return cli_error("%s: %s holds files that are not a trace's; remove it or "
					 "choose another directory with -o", cmd, old);
		if (rename(dir, old) != 0)
			return cli_error("%s: cannot keep the previous trace as %s: %s", cmd, old,
					 strerror(errno));
	}
	if (mkdir(dir, 0755) != 0)
		return cli_error("%s: cannot create the trace directory %s: %s", cmd, dir,
				 strerror(errno));
	if (!realpath(dir, abs))
		return cli_error("%s: %s: %s", cmd, dir, strerror(errno));
	return 0;
}


int cli_ring_size(const char *cmd, const char *arg, char *ring, size_t len)
{
	char *end;
	unsigned long mb = strtoul(arg, &end, 10);

	if (*end || mb == 0 || mb > 65536)
		return cli_error("%s: --ring-size wants megabytes (1..65536), not '%s'", cmd, arg), 2;
	snprintf(ring, len, "%lu", mb << 20);
	return 0;
}

int cli_check_threads(const char *cmd, const char *arg)
{
	if (strcmp(arg, "event") != 0 && strcmp(arg, "all") != 0)
		return cli_error("%s: --threads '%s': use 'event' or 'all'", cmd, arg), 2;
	return 0;
}

int cli_check_event(const char *cmd, const char *on, const char *first)
{
	if (strncmp(on, "timer ", 6) == 0) {
		char *end;
		double s = strtod(on + 6, &end);

		if (end == on + 6 || *end || !(s >= 0) || s > 1e9)
			return cli_error("%s: --on '%s': give the delay in seconds, e.g. 'timer 2.5'",
					 cmd, on), 2;
	} else if (strcmp(on, first) != 0 && strncmp(on, "call ", 5) != 0 &&
		   strcmp(on, "signal") != 0 && strcmp(on, "accept") != 0 && strcmp(on, "recv") != 0) {
		return cli_error("%s: unknown event '%s'; this version knows '%s', 'call FUNC', "
				 "'timer SECONDS', 'signal', 'accept' and 'recv'", cmd, on, first), 2;
	}
	return 0;
}
