/*
 * main.c — the `sptrace` front end: finds the subcommand and hands it argv.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"
#include "sp.h"
#include "trace_format.h"

static const cli_cmd commands[] = {
	{ "run", cmd_run, "run a program under the agent and trace it" },
	{ "attach", cmd_attach, "load the agent into a running process and trace it" },
	{ "stop", cmd_stop, "stop tracing a running process; its code is restored" },
	{ "activate", cmd_activate, "start tracing now in a process whose agent waits" },
	{ "analyze-binary", cmd_analyze_binary,
	  "analyse ELF modules and fill the code-analysis repository" },
	{ "replay", cmd_replay, "print each thread's calls as a tree (uftrace-like)" },
	{ "report", cmd_report, "time per function: total, self, calls" },
	{ "flows", cmd_flows, "separate a trace's records into flows (per request or job)" },
	{ "analyze", cmd_analyze, "the process that behaved differently, and the likely cause" },
	{ "pack", cmd_pack, "store a trace's records compactly (what sptrace run does itself)" },
	{ "export", cmd_export, "write a trace for Perfetto or chrome://tracing" },
	{ "keys", cmd_keys, "make the cluster CA and hosts' certificates for spdaemon" },
	{ "status", cmd_status, "ask this host's or other hosts' spdaemon who it is" },
	{ "collect", cmd_collect, "gather a session's traces from every host it reached" },
};

#define NCOMMANDS (sizeof commands / sizeof *commands)

static int usage(FILE *out)
{
	fprintf(out,
		"usage: sptrace COMMAND [ARGS]\n"
		"\n"
		"sptrace traces unmodified, running Linux programs.\n"
		"\n"
		"commands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n'sptrace COMMAND --help' describes a command.\n");
	return out == stderr ? 2 : 0;
}

int cli_error(const char *fmt, ...)
{
	va_list ap;

	cli_progress_end();
	fputs("sptrace: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

FILE *cli_create_beside(const char *cmd, const char *path, char **tmp)
{
	size_t len = strlen(path);
	mode_t mask;
	FILE *f;
	int fd;

	if (!(*tmp = malloc(len + 8))) {
		cli_error("%s: %s: out of memory", cmd, path);
		return NULL;
	}
	memcpy(*tmp, path, len);
	memcpy(*tmp + len, ".XXXXXX", 8);
	if ((fd = mkstemp(*tmp)) < 0) {
		cli_error("%s: %s: cannot create %s beside it: %s", cmd, path, *tmp,
			  strerror(errno));
		free(*tmp);
		*tmp = NULL;
		return NULL;
	}
	/* the file is the user's, readable as a file they made would be */
	mask = umask(0);
	umask(mask);
	if (fchmod(fd, 0644 & ~mask) != 0 || !(f = fdopen(fd, "w"))) {
		cli_error("%s: %s: %s", cmd, *tmp, strerror(errno));
		close(fd);
		unlink(*tmp);
		free(*tmp);
		*tmp = NULL;
		return NULL;
	}
	return f;
}

int cli_finish_beside(const char *cmd, FILE *f, char *tmp, const char *path, int ok)
{
	int e = 0;

	if (ok && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0))
		e = errno ? errno : EIO;
	if (fclose(f) != 0 && ok && !e)
		e = errno;
	if (ok && !e && rename(tmp, path) != 0)
		e = errno;
	if (!ok || e)
		unlink(tmp);
	free(tmp);
	if (e)
		return cli_error("%s: cannot write %s: %s", cmd, path, strerror(e));
	return ok ? 0 : 1;
}

static int progress_shown;

void cli_progress(const char *what, size_t done, size_t total)
{
	int width = 30, fill;

	if (!isatty(STDERR_FILENO) || total < 2)
		return;
	fill = (int)(total ? done * (size_t)width / total : 0);
	fprintf(stderr, "\r[%.*s%*s] %zu/%zu %-.60s\033[K", fill,
		"##############################", width - fill, "", done, total, what);
	progress_shown = 1;
}

void cli_progress_end(void)
{
	if (progress_shown) {
		fputs("\r\033[K", stderr);
		progress_shown = 0;
	}
}

int cli_meta_get(const char *dir, const char *key, char *val, size_t len)
{
	an_meta *m;
	sp_err e;
	const char *v;
	int found;

	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	found = (int)an_meta_count(m, key);
	if ((v = an_meta_last(m, key)))
		snprintf(val, len, "%.500s", v);
	an_meta_free(m);
	return found;
}

/* The path of module `index` in meta's "module" lines, "?" if none. */
static void module_path(const an_meta *m, unsigned index, char *path, size_t len)
{
	unsigned i;
	int n;

	snprintf(path, len, "?");
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		const char *v = an_meta_val(m, l);

		if (strcmp(an_meta_key(m, l), TRACE_META_MODULE) == 0 &&
		    sscanf(v, "%u %n", &i, &n) == 1 && i == index) {
			snprintf(path, len, "%.*s", (int)strcspn(v + n, " "), v + n);
			return;
		}
	}
}

int cli_print_left_alone(FILE *out, const char *dir)
{
	char mod[4096], kind[16];
	unsigned long long lo, hi;
	unsigned index;
	int count = 0;
	an_meta *m;
	sp_err e;

	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		const char *key = an_meta_key(m, l), *v = an_meta_val(m, l);
		unsigned long long nchanged;
		int at = 0;

		if (strcmp(key, TRACE_META_CHANGED) == 0 &&
		    sscanf(v, "%u %llu", &index, &nchanged) == 2) {
			module_path(m, index, mod, sizeof mod);
			fprintf(out, "sptrace: not traced: %llu call sites in %s: their code differs "
				"from the analysis (changed since it was analysed, or by the program "
				"itself; see %s/agent.log)\n", nchanged, mod, dir);
			count++;
			continue;
		}
		if (strcmp(key, TRACE_META_UNTRACED) == 0 &&
		    sscanf(v, "%4095s %n", mod, &at) == 1 && at > 0) {
			fprintf(out, "sptrace: not traced: %s: %s\n", mod, v + at);
			count++;
			continue;
		}
		if (strcmp(key, TRACE_META_RUNTIME) != 0 ||
		    sscanf(v, "%u %15s %llx %llx", &index, kind, &lo, &hi) != 4)
			continue;
		module_path(m, index, mod, sizeof mod);
		fprintf(out, "sptrace: not traced: %s code in %s (%#llx-%#llx, %.1f MB): its runtime "
			"reads return addresses; its calls out are traced (see %s/agent.log)\n",
			strcmp(kind, "go") == 0 ? "Go runtime" : strcmp(kind, "v8") == 0 ? "V8 builtins"
			: kind, mod, lo, hi, (double)(hi - lo) / 1e6, dir);
		count++;
	}
	an_meta_free(m);
	return count;
}

int cli_print_untraced(FILE *out, const char *dir)
{
	char why[512], pid[64] = "?", prog[512] = "?";
	int count = 0;
	DIR *d;
	struct dirent *de;

	if (cli_meta_end(dir, why, sizeof why) && strncmp(why, "not tracing: ", 13) == 0) {
		cli_meta_get(dir, TRACE_META_PID, pid, sizeof pid);
		cli_meta_get(dir, TRACE_META_PROGRAM, prog, sizeof prog);
		fprintf(out, "sptrace: pid %s (%s) was not traced: %s (see %s/agent.log)\n", pid, prog,
			why + 13, dir);
		count++;
	}
	/* The images exec'd or spawned from this one have traces of their own. */
	if (!(d = opendir(dir)))
		return count;
	while ((de = readdir(d))) {
		char sub[PATH_MAX];

		if ((strncmp(de->d_name, "exec.", 5) == 0 || strncmp(de->d_name, "spawn.", 6) == 0) &&
		    snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) < (int)sizeof sub)
			count += cli_print_untraced(out, sub);
	}
	closedir(d);
	return count;
}

int cli_meta_end(const char *dir, char *why, size_t len)
{
	return cli_meta_get(dir, TRACE_META_END, why, len);
}

int cli_meta_wait(const char *dir, const char *key, int before, double timeout, double *ms,
		  char *why, size_t len)
{
	struct timespec t0, now, nap = { 0, 5000000 };
	char val[512];
	/* An end line already there is not news (sptrace stop still reaches
	 * an agent whose trace ended). */
	int ends = cli_meta_get(dir, TRACE_META_END, val, sizeof val);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		*ms = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
		if (cli_meta_get(dir, key, val, sizeof val) > before)
			return 1;
		if (cli_meta_get(dir, TRACE_META_END, why, len) > ends)
			return -1;
		if (*ms > timeout * 1e3)
			return 0;
		nanosleep(&nap, NULL);
	}
}

/* The image traced in `dir` exec'd another: the subdirectory its trace is
 * in (the last exec that did not fail), or 0. */
int cli_exec_successor(const char *dir, char *sub, size_t len)
{
	char name[256], failed[256];
	int epid, pid = 0;
	an_meta *m;
	sp_err e;

	sub[0] = '\0';
	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		const char *key = an_meta_key(m, l), *v = an_meta_val(m, l);

		if (strcmp(key, TRACE_META_PID) == 0)
			pid = atoi(v);
		else if (strcmp(key, TRACE_META_EXEC) == 0 &&
			 sscanf(v, "%255s %d", name, &epid) == 2 && epid == pid &&
			 strlen(dir) + strlen(name) + 2 <= len) {
			size_t kd = strlen(dir);

			/* The agent names a new subdirectory (agent/exec.c); "." or
			 * ".." or a path would send a reader back up the chain of
			 * images, round and round. */
			if (strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
				fprintf(stderr, "sptrace: warning: %s/meta: exec line names '%s', not "
					"a subdirectory of the trace: ignored (a damaged meta file)\n",
					dir, name);
				continue;
			}

			memcpy(sub, dir, kd);
			sub[kd] = '/';
			memcpy(sub + kd + 1, name, strlen(name) + 1);
		} else if (strcmp(key, TRACE_META_EXEC_FAILED) == 0 && sub[0] &&
			   sscanf(v, "%255s", failed) == 1 &&
			   strcmp(strrchr(sub, '/') + 1, failed) == 0) {
			sub[0] = '\0';
		}
	}
	an_meta_free(m);
	return sub[0] != '\0' && access(sub, F_OK) == 0;
}

int main(int argc, char **argv)
{
	sp_tsc_hz_start();      /* for the agents run and attach start (sp.h) */
	if (argc < 2)
		return usage(stderr);
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		if (argc > 2 && strcmp(argv[1], "help") == 0)
			for (size_t i = 0; i < NCOMMANDS; i++)
				if (strcmp(argv[2], commands[i].name) == 0) {
					char *av[] = { argv[2], "--help", NULL };
					return commands[i].run(2, av);
				}
		return usage(stdout);
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("sptrace %s\n", SPTRACE_VERSION);
		return 0;
	}
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(argv[1], commands[i].name) == 0)
			return commands[i].run(argc - 1, argv + 1);
	cli_error("'%s' is not a command; 'sptrace --help' lists them", argv[1]);
	return 2;
}

void cli_json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}
