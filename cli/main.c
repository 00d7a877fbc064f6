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

FILE *cli_meta_open(const char *dir)
{
	char path[PATH_MAX + 8];
	int fd;
	FILE *f;

	struct stat st;

	snprintf(path, sizeof path, "%s/meta", dir);
	if ((fd = sp_open_regular(path, 1)) < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || st.st_size > TRACE_META_MAX_BYTES) {
		close(fd);
		errno = EFBIG;
		return NULL;
	}
	if (!(f = fdopen(fd, "r")))
		close(fd);
	return f;
}

int cli_meta_get(const char *dir, const char *key, char *val, size_t len)
{
	char line[4096];
	size_t klen = strlen(key);
	FILE *f;
	int found = 0;

	f = cli_meta_open(dir);
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
			snprintf(val, len, "%.500s", line + klen + 1);
			val[strcspn(val, "\n")] = '\0';
			found++;
		}
	fclose(f);
	return found;
}

/* The path of module `index` in meta's "module" lines, "?" if none. */
static void module_path(FILE *f, unsigned index, char *path, size_t len)
{
	char line[4200];
	size_t km = strlen(TRACE_META_MODULE);
	unsigned i;
	int n;

	snprintf(path, len, "?");
	rewind(f);
	while (fgets(line, sizeof line, f))
		if (strncmp(line, TRACE_META_MODULE, km) == 0 && line[km] == ' ' &&
		    sscanf(line + km + 1, "%u %n", &i, &n) == 1 && i == index) {
			snprintf(path, len, "%.*s", (int)strcspn(line + km + 1 + n, " \n"),
				 line + km + 1 + n);
			return;
		}
}

int cli_print_left_alone(FILE *out, const char *dir)
{
	char line[4200], mod[4096], kind[16];
	size_t kr = strlen(TRACE_META_RUNTIME);
	unsigned long long lo, hi;
	unsigned index;
	long pos;
	int count = 0;
	FILE *f;

	f = cli_meta_open(dir);
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		size_t ku = strlen(TRACE_META_UNTRACED), kc = strlen(TRACE_META_CHANGED);
		unsigned long long nchanged;
		int at = 0;

		if (strncmp(line, TRACE_META_CHANGED, kc) == 0 && line[kc] == ' ' &&
		    sscanf(line + kc + 1, "%u %llu", &index, &nchanged) == 2) {
			pos = ftell(f);
			module_path(f, index, mod, sizeof mod);
			fseek(f, pos, SEEK_SET);
			fprintf(out, "sptrace: not traced: %llu call sites in %s: their code differs "
				"from the analysis (changed since it was analysed, or by the program "
				"itself; see %s/agent.log)\n", nchanged, mod, dir);
			count++;
			continue;
		}
		if (strncmp(line, TRACE_META_UNTRACED, ku) == 0 && line[ku] == ' ' &&
		    sscanf(line + ku + 1, "%4095s %n", mod, &at) == 1 && at > 0) {
			fprintf(out, "sptrace: not traced: %s: %s", mod, line + ku + 1 + at);
			count++;
			continue;
		}
		if (strncmp(line, TRACE_META_RUNTIME, kr) != 0 || line[kr] != ' ' ||
		    sscanf(line + kr + 1, "%u %15s %llx %llx", &index, kind, &lo, &hi) != 4)
			continue;
		pos = ftell(f);
		module_path(f, index, mod, sizeof mod);
		fseek(f, pos, SEEK_SET);
		fprintf(out, "sptrace: not traced: %s code in %s (%#llx-%#llx, %.1f MB): its runtime "
			"reads return addresses; its calls out are traced (see %s/agent.log)\n",
			strcmp(kind, "go") == 0 ? "Go runtime" : strcmp(kind, "v8") == 0 ? "V8 builtins"
			: kind, mod, lo, hi, (double)(hi - lo) / 1e6, dir);
		count++;
	}
	fclose(f);
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
	char line[PATH_MAX + 64], name[256], pid[32] = "";
	size_t ke = strlen(TRACE_META_EXEC), kf = strlen(TRACE_META_EXEC_FAILED);
	size_t kp = strlen(TRACE_META_PID);
	int epid;
	FILE *f;

	sub[0] = '\0';
	if (!(f = cli_meta_open(dir)))
		return 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, TRACE_META_PID " ", kp + 1) == 0)
			snprintf(pid, sizeof pid, "%d", atoi(line + kp + 1));
		else if (strncmp(line, TRACE_META_EXEC " ", ke + 1) == 0 &&
			 sscanf(line + ke + 1, "%255s %d", name, &epid) == 2 && epid == atoi(pid) &&
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
		} else if (strncmp(line, TRACE_META_EXEC_FAILED " ", kf + 1) == 0 && sub[0]) {
			const char *failed = strtok(line + kf + 1, " \n");

			if (failed && strcmp(strrchr(sub, '/') + 1, failed) == 0)
				sub[0] = '\0';
		}
	}
	fclose(f);
	return sub[0] != '\0' && access(sub, F_OK) == 0;
}

int main(int argc, char **argv)
{
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
