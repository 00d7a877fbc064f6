/*
 * collected.c — reading a tree made by `sptrace collect` (cmd_collect.c):
 *
 *   OUT/HOST/PID/meta ...   one process's trace (its exec'd images below)
 *
 * and no OUT/meta, which tells it from a trace directory.  replay and
 * report show each process after one header line naming its host.
 */
#include "cli.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trace_format.h"

static int has_meta(const char *dir)
{
	char path[PATH_MAX + 300];
	struct stat st;

	snprintf(path, sizeof path, "%s/meta", dir);
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int not_hidden(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Process directories by pid, then by name. */
static int by_pid(const struct dirent **a, const struct dirent **b)
{
	long x = strtol((*a)->d_name, NULL, 10), y = strtol((*b)->d_name, NULL, 10);

	return x != y ? (x < y ? -1 : 1) : strcmp((*a)->d_name, (*b)->d_name);
}

/* fn for each HOST/PID of dir that holds a trace (links are not followed):
 * how many there are, or with fn whether one failed. */
static int each(const char *dir, cli_collected_fn fn, void *arg)
{
	struct dirent **hosts = NULL;
	int nh = scandir(dir, &hosts, not_hidden, alphasort), found = 0, rc = 0;

	for (int i = 0; i < nh; i++) {
		char hdir[PATH_MAX];
		struct dirent **procs = NULL;
		struct stat st;
		int np;

		snprintf(hdir, sizeof hdir, "%s/%s", dir, hosts[i]->d_name);
		np = lstat(hdir, &st) == 0 && S_ISDIR(st.st_mode) ?
		     scandir(hdir, &procs, not_hidden, by_pid) : 0;
		for (int j = 0; j < np; j++) {
			char pdir[PATH_MAX + 256], pid[64], prog[PATH_MAX];

			snprintf(pdir, sizeof pdir, "%s/%s", hdir, procs[j]->d_name);
			if (lstat(pdir, &st) == 0 && S_ISDIR(st.st_mode) && has_meta(pdir)) {
				found++;
				if (fn) {
					if (!cli_meta_get(pdir, TRACE_META_PID, pid, sizeof pid))
						snprintf(pid, sizeof pid, "%.63s", procs[j]->d_name);
					if (!cli_meta_get(pdir, TRACE_META_PROGRAM, prog, sizeof prog))
						snprintf(prog, sizeof prog, "?");
					printf("== host %s: pid %s (%s)\n", hosts[i]->d_name, pid, prog);
					fflush(stdout);
					/* one damaged trace does not hide the others */
					rc |= fn(pdir, arg);
				}
			}
			free(procs[j]);
		}
		free(procs);
		free(hosts[i]);
	}
	free(hosts);
	return fn ? rc : found;
}

int cli_collected_tree(const char *dir)
{
	struct stat st;

	return !has_meta(dir) && stat(dir, &st) == 0 && S_ISDIR(st.st_mode) &&
	       each(dir, NULL, NULL) > 0;
}

int cli_collected_each(const char *dir, cli_collected_fn fn, void *arg)
{
	return each(dir, fn, arg);
}
