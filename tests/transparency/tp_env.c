/*
 * tp_env.c — the environment main gets must be the one it was given,
 * whatever the program does with getenv and its kin.
 *
 * Like bash (lib/sh/getenv.c), this program defines its own getenv, setenv,
 * unsetenv and putenv (exported: -rdynamic), which keep a table of their own
 * and leave environ alone.  An agent that took its variables (SPTRACE_DIR,
 * its LD_PRELOAD...) out of the environment through unsetenv got the
 * program's, changed nothing, and bash scripts saw $SPTRACE_DIR.  The
 * program prints every variable of environ, sorted, and how often its own
 * setenv family was called: natively 0.
 */
#include <stdlib.h>
#include <string.h>

#include "tp.h"

extern char **environ;
static int changes;

char *getenv(const char *name)
{
	size_t len = strlen(name);

	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
			return *e + len + 1;
	return NULL;
}

int setenv(const char *name, const char *value, int overwrite)
{
	changes++;
	return 0;
}

int unsetenv(const char *name)
{
	changes++;
	return 0;
}

int putenv(char *string)
{
	changes++;
	return 0;
}

static int by_text(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int tp_setup(const char *scratch)
{
	return 0;
}

TP_NOINLINE int tp_after_go(const char *scratch)
{
	size_t n = 0;
	char **copy;

	while (environ[n])
		n++;
	copy = calloc(n + 1, sizeof *copy);
	if (!copy)
		return 4;
	memcpy(copy, environ, n * sizeof *copy);
	qsort(copy, n, sizeof *copy, by_text);
	/* SPTRACE_REPO is the caller's (test_transparency.py gives the traced
	 * run a repository of its own): passed on, not the agent's. */
	for (size_t i = 0; i < n; i++)
		if (strncmp(copy[i], "SPTRACE_REPO=", 13) != 0)
			printf("env %s\n", copy[i]);
	printf("setenv family called %d times\n", changes);
	free(copy);
	return 0;
}
