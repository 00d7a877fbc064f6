/*
 * cmd_control.c — commands to the agent in running processes:
 *
 *   sptrace stop PID | --all   deactivate: every patched byte is put back
 *                              (the code is again identical to the files)
 *                              and the trace is completed; the program goes
 *                              on untraced.  Sent to any agent that listens,
 *                              even when meta says the trace ended.
 *   sptrace activate PID...    start tracing now (`--on signal`, or any
 *                              agent still waiting for its event).
 *
 * The agent registers each traced process as a link
 * $XDG_RUNTIME_DIR/sptrace/<pid>-<start time> (or /tmp/sptrace-<uid>/...) to
 * its trace directory, where a FIFO named `control` takes the command
 * (agent/control.c).
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "registry.h"
#include "trace_format.h"

static const char stop_help[] =
	"usage: sptrace stop PID...\n"
	"       sptrace stop --all\n"
	"\n"
	"Stop tracing in running processes started with 'sptrace run': the agent puts\n"
	"back every byte of code it patched and goes dormant; the program runs on\n"
	"untraced, and 'sptrace activate PID' starts tracing again (into the same\n"
	"trace).  Waits until the agent confirms.\n"
	"\n"
	"options:\n"
	"  --all               every traced process of this user\n"
	"  --timeout SECONDS   how long to wait for each agent (default 10)\n"
	"  -h, --help          this text\n";

static const char activate_help[] =
	"usage: sptrace activate PID...\n"
	"\n"
	"Start tracing now in processes whose agent waits for its event (started\n"
	"with 'sptrace run --on signal', or any other event not yet reached).\n"
	"Every thread is traced from where it stands: the functions already running\n"
	"are found by a walk of its stack, and their returns are recorded too.\n"
	"Waits until the agent confirms.\n"
	"\n"
	"options:\n"
	"  --timeout SECONDS   how long to wait for each agent (default 10)\n"
	"  -h, --help          this text\n";

/* What a command asks of the agent and how the agent confirms it. */
typedef struct command {
	const char *name;        /* "stop", "activate" */
	const char *word;        /* written into the FIFO */
	const char *confirm;     /* the meta key the agent appends when done */
} command;

static const command stop_cmd = { "stop", "stop\n", TRACE_META_STOPPED };
static const command activate_cmd = { "activate", "activate\n", TRACE_META_ACTIVATED };

/* Is the agent tracing, by meta: its last "activated" or "stopped" line. */
static int tracing_now(const char *dir)
{
	char line[1024];
	size_t ka = strlen(TRACE_META_ACTIVATED), ks = strlen(TRACE_META_STOPPED);
	int state = 0;
	FILE *f;

	if (!(f = cli_meta_open(dir)))
		return 0;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, TRACE_META_ACTIVATED, ka) == 0 && line[ka] == ' ')
			state = 1;
		else if (strncmp(line, TRACE_META_STOPPED, ks) == 0 && line[ks] == ' ')
			state = 0;
	fclose(f);
	return state;
}

static int control_one(const command *cmd, const char *reg, const char *pid, double timeout)
{
	char link[PATH_MAX], dir[PATH_MAX], fifo[PATH_MAX + 16], why[512];
	double ms;
	ssize_t n;
	int fd;

	for (const char *p = pid; *p; p++)
		if (*p < '0' || *p > '9')
			return cli_error("%s: '%s' is not a process id", cmd->name, pid);
	snprintf(link, sizeof link, "%s/%s-%llu", reg, pid, sp_proc_start_time(pid));
	n = readlink(link, dir, sizeof dir - 1);
	if (n <= 0) {
		/* A process of another user registered in its own user's dir. */
		char other[PATH_MAX];

		if (sp_registry_dir_of(pid, other, sizeof other) == 0 && strcmp(other, reg) != 0) {
			snprintf(link, sizeof link, "%.3000s/%s-%llu", other, pid, sp_proc_start_time(pid));
			n = readlink(link, dir, sizeof dir - 1);
		}
	}
	if (n <= 0) {
		if (kill(atoi(pid), 0) != 0 && errno == ESRCH)
			return cli_error("%s: pid %s: no such process", cmd->name, pid);
		return cli_error("%s: pid %s is not traced by sptrace (nothing registered in %s); "
				 "start programs with 'sptrace run'", cmd->name, pid, reg);
	}
	dir[n] = '\0';
	if (kill(atoi(pid), 0) != 0 && errno == ESRCH) {
		unlink(link);
		return cli_error("%s: pid %s has exited; its trace is in %s", cmd->name, pid, dir);
	}
	/* An ended trace takes no activation; a stop still goes to an agent
	 * that listens: the code of a process that has the agent is restored
	 * whatever meta says. */
	int ended = cli_meta_end(dir, why, sizeof why);

	if (ended && cmd == &activate_cmd)
		return cli_error("%s: pid %s: tracing already ended (%s); trace in %s", cmd->name, pid,
				 why, dir);
	/* Each activation and each stop appends a line to meta: the agent's
	 * answer is one more line of the command's kind. */
	int before = cli_meta_get(dir, cmd->confirm, why, sizeof why);

	if (cmd == &activate_cmd && tracing_now(dir)) {
		printf("sptrace: pid %s: already tracing; trace in %s\n", pid, dir);
		return 0;
	}
	snprintf(fifo, sizeof fifo, "%s/control", dir);
	fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && ended)
		return cli_error("%s: pid %s: tracing already ended (%s) and no agent listens on %s; "
				 "trace in %s", cmd->name, pid, why, fifo, dir);
	if (fd < 0)
		return cli_error("%s: pid %s: the agent does not answer on %s: %s", cmd->name, pid,
				 fifo, errno == ENXIO ? "no control thread is listening" : strerror(errno));
	if (write(fd, cmd->word, strlen(cmd->word)) != (ssize_t)strlen(cmd->word)) {
		close(fd);
		return cli_error("%s: pid %s: cannot write to %s: %s", cmd->name, pid, fifo,
				 strerror(errno));
	}
	close(fd);
	switch (cli_meta_wait(dir, cmd->confirm, before, timeout, &ms, why, sizeof why)) {
	case 1:
		if (cmd == &activate_cmd)
			printf("sptrace: pid %s: tracing; trace in %s\n", pid, dir);
		else
			printf("sptrace: pid %s: tracing stopped, code restored; the agent "
			       "is dormant ('sptrace activate %s' starts again); trace in %s\n",
			       pid, pid, dir);
		return 0;
	case -1:
		return cli_error("%s: pid %s: the trace ended (%s) before the agent "
				 "answered; see %s/agent.log", cmd->name, pid, why, dir);
	default:
		return cli_error("%s: pid %s: no confirmation from the agent within %.0f s; "
				 "see %s/agent.log", cmd->name, pid, timeout, dir);
	}
}

int cmd_stop(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "all", no_argument, 0, 'a' }, { "timeout", required_argument, 0, 't' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	char reg[PATH_MAX];
	double timeout = 10;
	int c, all = 0, failed = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'a': all = 1; break;
		case 't': timeout = atof(optarg); break;
		case 'h': fputs(stop_help, stdout); return 0;
		case ':':
			return cli_error("stop: option '%s' needs a value; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		default:
			return cli_error("stop: unknown option '%s'; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		}
	}
	sp_registry_dir(reg, sizeof reg);
	if (all) {
		DIR *d = opendir(reg);
		struct dirent *de;
		int any = 0;

		while (d && (de = readdir(d))) {
			char pid[32], stale[PATH_MAX + 300];
			const char *dash = strchr(de->d_name, '-');

			if (de->d_name[0] < '0' || de->d_name[0] > '9' || !dash ||
			    (size_t)(dash - de->d_name) >= sizeof pid)
				continue;
			snprintf(pid, sizeof pid, "%.*s", (int)(dash - de->d_name), de->d_name);
			if (strtoull(dash + 1, NULL, 10) != sp_proc_start_time(pid)) {
				/* left by a process that is gone: not ours to stop */
				snprintf(stale, sizeof stale, "%s/%s", reg, de->d_name);
				unlink(stale);
				continue;
			}
			any = 1;
			failed |= control_one(&stop_cmd, reg, pid, timeout);
		}
		if (d)
			closedir(d);
		if (!any)
			printf("sptrace: no traced process is registered in %s\n", reg);
		return failed;
	}
	if (optind >= argc)
		return cli_error("stop: no process id given; see 'sptrace stop --help'"), 2;
	for (int i = optind; i < argc; i++)
		failed |= control_one(&stop_cmd, reg, argv[i], timeout);
	return failed;
}

int cmd_activate(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "timeout", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	char reg[PATH_MAX];
	double timeout = 10;
	int c, failed = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 't': timeout = atof(optarg); break;
		case 'h': fputs(activate_help, stdout); return 0;
		case ':':
			return cli_error("activate: option '%s' needs a value; see 'sptrace activate "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("activate: unknown option '%s'; see 'sptrace activate --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind >= argc)
		return cli_error("activate: no process id given; see 'sptrace activate --help'"), 2;
	sp_registry_dir(reg, sizeof reg);
	for (int i = optind; i < argc; i++)
		failed |= control_one(&activate_cmd, reg, argv[i], timeout);
	return failed;
}
