/*
 * cmd_control.c — commands to the agent in running processes:
 *
 *   sptrace stop PID | --all   deactivate: every patched byte is put back
 *                              (the code is again identical to the files)
 *                              and the trace is completed; the program goes
 *                              on untraced.  Sent to any agent that listens,
 *                              even when meta says the trace ended.
 *   sptrace stop --session NAME  every agent of a session, on every host it
 *                              reached (through this host's spdaemon)
 *   sptrace activate PID...    start tracing now (`--on signal`, or any
 *                              agent still waiting for its event).
 *
 * The agent registers each traced process as a link
 * $XDG_RUNTIME_DIR/sptrace/<pid>-<start time> (or /tmp/sptrace-<uid>/...) to
 * its trace directory, where a FIFO named `control` takes the command
 * (agent/control.c).  Root reads other users' registries: what it trusts
 * there, and what it checks before it writes, are registry.h's rules.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"
#include "registry.h"
#include "spd.h"
#include "trace_format.h"

static const char stop_help[] =
	"usage: sptrace stop PID...\n"
	"       sptrace stop --all\n"
	"       sptrace stop --session NAME\n"
	"\n"
	"Stop tracing in running processes started with 'sptrace run': the agent puts\n"
	"back every byte of code it patched and goes dormant; the program runs on\n"
	"untraced, and 'sptrace activate PID' starts tracing again (into the same\n"
	"trace).  Waits until the agent confirms.\n"
	"\n"
	"With --session, every agent of the session NAME (meta's 'session' line) on\n"
	"every host it reached: this host's spdaemon tells its own, then the daemons\n"
	"of the hosts it followed the session to, and theirs, each host once.  Only\n"
	"your own processes' agents are told (root: all).  One line per host; the\n"
	"agents are told, not waited for.\n"
	"\n"
	"options:\n"
	"  --all               every traced process of this user\n"
	"  --session NAME      every agent of the session, on every host\n"
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

/* The process a command goes to, as control_one learns it. */
typedef struct target {
	char pid[32];            /* its pid, leading zeros dropped */
	char name[64];           /* its registry entry: <pid>-<start time> */
	unsigned uids[4];        /* real, effective, saved, fs (/proc/PID/status) */
	unsigned reg_owner;      /* the owner of the registry holding its entry */
	char dir[PATH_MAX];      /* its trace directory, where the entry leads */
} target;

/* Is the agent tracing, by meta: its last "activated" or "stopped" line. */
static int tracing_now(const char *dir)
{
	int state = 0;
	an_meta *m;
	sp_err e;

	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	for (size_t l = 0; l < an_meta_nlines(m); l++)
		if (strcmp(an_meta_key(m, l), TRACE_META_ACTIVATED) == 0)
			state = 1;
		else if (strcmp(an_meta_key(m, l), TRACE_META_STOPPED) == 0)
			state = 0;
	an_meta_free(m);
	return state;
}

/* A process id as given, leading zeros dropped ("007" is pid 7), into pid:
 * 0, or 1 after a message. */
static int parse_pid(const command *cmd, const char *arg, char *pid, size_t len)
{
	unsigned long v = 0;

	for (const char *p = arg; *p; p++) {
		if (*p < '0' || *p > '9' || (v = v * 10 + (unsigned long)(*p - '0')) > INT_MAX)
			return cli_error("%s: '%s' is not a process id", cmd->name, arg);
	}
	if (v == 0)
		return cli_error("%s: '%s' is not a process id", cmd->name, arg);
	snprintf(pid, len, "%lu", v);
	return 0;
}

/* --timeout SECONDS: 0 and the seconds in *out, or 2 after a message. */
static int parse_timeout(const char *name, const char *arg, double *out)
{
	char *end;
	double v = strtod(arg, &end);

	if (end == arg || *end || !(v > 0) || !isfinite(v))
		return cli_error("%s: --timeout must be a positive number of seconds, not '%s'", name,
				 arg), 2;
	*out = v;
	return 0;
}

/* The uids of the process (sp_proc_uids): 0, or 1 after a message. */
static int process_uids(const command *cmd, target *t)
{
	if (sp_proc_uids(t->pid, t->uids) == 0)
		return 0;
	if (kill(atoi(t->pid), 0) != 0 && errno == ESRCH)
		return cli_error("%s: pid %s: no such process", cmd->name, t->pid);
	return cli_error("%s: pid %s: cannot read /proc/%s/status: %s", cmd->name, t->pid, t->pid,
			 strerror(errno));
}

/* A user other than root cannot reach the agent of another user's process
 * (its registry and FIFO are that user's): 1 after saying so, else 0. */
static int owned_by_another(const command *cmd, const target *t)
{
	unsigned me = (unsigned)geteuid();
	struct passwd *pw;

	if (me == 0 || t->uids[0] == me || t->uids[1] == me)
		return 0;
	pw = getpwuid((uid_t)t->uids[0]);
	return cli_error("%s: pid %s is owned by another user (%s, uid %u): only that user or root "
			 "can reach its agent; run 'sptrace %s %s' as that user or as root", cmd->name,
			 t->pid, pw ? pw->pw_name : "no name", t->uids[0], cmd->name, t->pid);
}

/* Where the agent of the process registered (registry.h: the caller's
 * registry, then the process's own user's): t->dir and t->reg_owner, and
 * the registry, open, in *reg; 0.  Else 1 after a message: a registry
 * refused by rule 1, or nothing registered. */
static int find_trace_dir(const command *cmd, target *t, int *reg)
{
	char own_xdg[4096], paths[2][PATH_MAX], why[2 * PATH_MAX] = "";
	const char *xdg[2] = { getenv("XDG_RUNTIME_DIR"), own_xdg };
	unsigned uid[2] = { (unsigned)getuid(), t->uids[0] };
	struct stat st;
	ssize_t n;

	sp_proc_xdg(t->pid, own_xdg, sizeof own_xdg);
	for (int i = 0; i < 2; i++) {
		char refused[2 * PATH_MAX];

		*reg = sp_registry_open(xdg[i], uid[i], 0, paths[i], sizeof paths[i], refused,
					sizeof refused);
		if (i == 1 && strcmp(paths[0], paths[1]) == 0) {
			if (*reg >= 0)
				close(*reg);
			break;
		}
		if (*reg < 0) {
			if (errno != ENOENT && !why[0])
				snprintf(why, sizeof why, "%s", refused);
			continue;
		}
		n = readlinkat(*reg, t->name, t->dir, sizeof t->dir - 1);
		if (n > 0 && fstat(*reg, &st) == 0) {
			t->dir[n] = '\0';
			t->reg_owner = (unsigned)st.st_uid;
			return 0;
		}
		close(*reg);
	}
	*reg = -1;
	if (why[0])
		return cli_error("%s: pid %s: %s", cmd->name, t->pid, why);
	return cli_error("%s: pid %s is not traced by sptrace (nothing registered in %s); "
			 "start programs with 'sptrace run'", cmd->name, t->pid, paths[0]);
}

/* Whether the FIFO's owner may have made it for the agent: the process's
 * user, or whoever could write the entry leading there (root, for a daemon
 * started by root that dropped its privileges since). */
static int fifo_owner_fits(const target *t, unsigned owner)
{
	return owner == t->uids[0] || owner == t->uids[1] || owner == t->uids[3] ||
	       owner == t->reg_owner;
}

/* DIR/control when it is what the agent makes (registry.h's rule 4): a
 * FIFO, not a link, of the right owner.  Opened O_PATH: nothing is opened
 * for writing before the checks.  Its descriptor; -1 if there is none
 * (errno); -2 after a message naming it. */
static int control_fifo(const command *cmd, const target *t, const char *fifo)
{
	struct stat st;
	char bad[128] = "";
	int fd = open(fifo, O_PATH | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0)
		snprintf(bad, sizeof bad, "%s", strerror(errno));
	else if (S_ISLNK(st.st_mode))
		snprintf(bad, sizeof bad, "a symbolic link");
	else if (!S_ISFIFO(st.st_mode))
		snprintf(bad, sizeof bad, "not a FIFO");
	else if (!fifo_owner_fits(t, (unsigned)st.st_uid))
		snprintf(bad, sizeof bad, "a FIFO owned by uid %u, not by the process's user (uid %u)",
			 (unsigned)st.st_uid, t->uids[0]);
	if (!bad[0])
		return fd;
	close(fd);
	cli_error("%s: pid %s: refused to write to %s: %s, so not the agent's (someone may have "
		  "planted it); nothing written", cmd->name, t->pid, fifo, bad);
	return -2;
}

/* Write the command into the FIFO checked by control_fifo (`path_fd`),
 * reopened through /proc/self/fd: the very file checked.  0, or 1 after a
 * message. */
static int send_command(const command *cmd, const char *pid, int path_fd, const char *fifo)
{
	char proc[64];
	size_t len = strlen(cmd->word);
	int fd;

	snprintf(proc, sizeof proc, "/proc/self/fd/%d", path_fd);
	fd = open(proc, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return cli_error("%s: pid %s: the agent does not answer on %s: %s", cmd->name, pid,
				 fifo, errno == ENXIO ? "no control thread is listening" : strerror(errno));
	if (write(fd, cmd->word, len) != (ssize_t)len) {
		close(fd);
		return cli_error("%s: pid %s: cannot write to %s: %s", cmd->name, pid, fifo,
				 strerror(errno));
	}
	close(fd);
	return 0;
}

/* Whether to send the command, by meta and the FIFO (`fd`, from
 * control_fifo; -1: none, errno e): 0 to send it, 2 after saying the agent
 * traces already, 1 after a message.  An ended trace takes no activation;
 * a stop still goes to an agent that listens: the code of a process that
 * has the agent is restored whatever meta says. */
static int not_to_send(const command *cmd, const char *pid, const char *dir, const char *fifo,
		       int fd, int e)
{
	char why[512];
	int ended = cli_meta_end(dir, why, sizeof why);

	if (ended && cmd == &activate_cmd)
		return cli_error("%s: pid %s: tracing already ended (%s); trace in %s", cmd->name, pid,
				 why, dir);
	if (fd < 0 && ended)
		return cli_error("%s: pid %s: tracing already ended (%s) and no agent listens on %s; "
				 "trace in %s", cmd->name, pid, why, fifo, dir);
	if (fd < 0)
		return cli_error("%s: pid %s: the agent does not answer on %s: %s", cmd->name, pid,
				 fifo, strerror(e));
	if (cmd == &activate_cmd && tracing_now(dir)) {
		printf("sptrace: pid %s: already tracing; trace in %s\n", pid, dir);
		return 2;
	}
	return 0;
}

/* Where the answer is said: stdout for `sptrace activate|stop`, stderr when
 * run or attach toggles tracing at a key chord (cli_control_pid). */
static FILE *said;

/* The agent's answer: one more meta line of the command's kind than
 * `before`. */
static int await_answer(const command *cmd, const char *pid, const char *dir, int before,
			double timeout)
{
	char why[512];
	double ms;

	switch (cli_meta_wait(dir, cmd->confirm, before, timeout, &ms, why, sizeof why)) {
	case 1:
		if (cmd == &activate_cmd)
			fprintf(said ? said : stdout, "sptrace: pid %s: tracing; trace in %s\n", pid,
				dir);
		else
			fprintf(said ? said : stdout, "sptrace: pid %s: tracing stopped, code "
				"restored; the agent is dormant ('sptrace activate %s' starts again); "
				"trace in %s\n", pid, pid, dir);
		return 0;
	case -1:
		return cli_error("%s: pid %s: the trace ended (%s) before the agent "
				 "answered; see %s/agent.log", cmd->name, pid, why, dir);
	default:
		return cli_error("%s: pid %s: no confirmation from the agent within %.0f s; "
				 "see %s/agent.log", cmd->name, pid, timeout, dir);
	}
}

/* Deliver the command to the agent whose trace is in t->dir and wait for
 * its answer.  The FIFO is checked before meta is read: a planted link
 * leads to no file of another user's. */
static int deliver(const command *cmd, const target *t, double timeout)
{
	char fifo[PATH_MAX + 16], why[512];
	int fd, e, rc, before = 0;

	snprintf(fifo, sizeof fifo, "%s/control", t->dir);
	fd = control_fifo(cmd, t, fifo);
	e = errno;
	if (fd == -2)
		return 1;
	rc = not_to_send(cmd, t->pid, t->dir, fifo, fd, e);
	if (rc == 0) {
		before = cli_meta_get(t->dir, cmd->confirm, why, sizeof why);
		rc = send_command(cmd, t->pid, fd, fifo);
	}
	if (fd >= 0)
		close(fd);
	if (rc)
		return rc == 2 ? 0 : rc;
	return await_answer(cmd, t->pid, t->dir, before, timeout);
}

static int control_one(const command *cmd, const char *arg, double timeout)
{
	target t = { .reg_owner = 0 };
	int reg;

	if (parse_pid(cmd, arg, t.pid, sizeof t.pid) || process_uids(cmd, &t) ||
	    owned_by_another(cmd, &t))
		return 1;
	snprintf(t.name, sizeof t.name, "%s-%llu", t.pid, sp_proc_start_time(t.pid));
	if (find_trace_dir(cmd, &t, &reg))
		return 1;
	if (kill(atoi(t.pid), 0) != 0 && errno == ESRCH) {
		unlinkat(reg, t.name, 0);
		close(reg);
		return cli_error("%s: pid %s has exited; its trace is in %s", cmd->name, t.pid, t.dir);
	}
	close(reg);
	return deliver(cmd, &t, timeout);
}

/* A name in the registry: 1 if it is the entry of a process that still
 * runs (its pid in pid), 0 if the entry of one that is gone, -1 if not an
 * entry. */
static int live_entry(const char *name, char *pid, size_t len)
{
	const char *dash = strchr(name, '-');

	if (name[0] < '0' || name[0] > '9' || !dash || (size_t)(dash - name) >= len)
		return -1;
	snprintf(pid, len, "%.*s", (int)(dash - name), name);
	return strtoull(dash + 1, NULL, 10) == sp_proc_start_time(pid);
}

/* stop --all: every process registered in the caller's registry. */
static int stop_all(double timeout)
{
	char path[PATH_MAX], why[2 * PATH_MAX], pid[32];
	int reg = sp_registry_open(getenv("XDG_RUNTIME_DIR"), (unsigned)getuid(), 0, path,
				   sizeof path, why, sizeof why);
	int copy, any = 0, failed = 0;
	struct dirent *de;
	DIR *d = NULL;

	if (reg < 0 && errno != ENOENT)
		return cli_error("stop: %s", why);
	if (reg >= 0 && (copy = dup(reg)) >= 0 && !(d = fdopendir(copy)))
		close(copy);
	while (d && (de = readdir(d))) {
		int live = live_entry(de->d_name, pid, sizeof pid);

		if (live == 0)
			unlinkat(reg, de->d_name, 0);   /* left by a process that is gone */
		if (live != 1)
			continue;
		any = 1;
		failed |= control_one(&stop_cmd, pid, timeout);
	}
	if (d)
		closedir(d);
	if (reg >= 0)
		close(reg);
	if (!any)
		printf("sptrace: no traced process is registered in %s\n", path);
	return failed;
}

/* --session: the StopRequest to this host's daemon (spdaemon/collect.c),
 * which reaches the other hosts of the session. */
static int stop_session(const char *session)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__StopRequest q = SPTRACE__SPD__STOP_REQUEST__INIT;
	spd_conn c;
	sp_err err;
	int r, failed = 0;

	q.session = (char *)session;
	req.id = 1;
	req.body_case = SPTRACE__SPD__FRAME__BODY_STOP;
	req.stop = &q;
	if (spd_local_connect(&c, &err) != 0)
		return cli_error("stop: %s", err.msg);
	r = spd_frame_write(&c, &req, &err) == 0 ? spd_frame_read(&c, &rep, &err) : -1;
	spd_conn_close(&c);
	if (r != 1)
		return cli_error("stop: session %s: %s", session, r == 0 ? "the daemon closed the "
				 "connection without an answer" : err.msg);
	if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		failed = cli_error("stop: session %s: the daemon refused: %s", session,
				   rep->error->message);
	} else if (rep->body_case != SPTRACE__SPD__FRAME__BODY_STOP_REPLY) {
		failed = cli_error("stop: session %s: the daemon answered something else (body %d)",
				   session, (int)rep->body_case);
	} else {
		for (size_t i = 0; i < rep->stop_reply->n_hosts; i++) {
			const Sptrace__Spd__StopReply__Host *h = rep->stop_reply->hosts[i];

			if (h->error && *h->error)
				failed |= cli_error("stop: session %s: host %s did not answer: %s",
						    session, h->host, h->error);
			else
				printf("stop: session %s: host %s: %u agents told to stop, %u "
				       "trace directories skipped (no agent listening, or another "
				       "user's)\n", session, h->host, h->stopped, h->skipped);
		}
	}
	spd_frame_free(rep);
	return failed;
}

int cmd_stop(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "all", no_argument, 0, 'a' }, { "timeout", required_argument, 0, 't' },
		{ "session", required_argument, 0, 's' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *session = NULL;
	double timeout = 10;
	int c, all = 0, failed = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'a': all = 1; break;
		case 's': session = optarg; break;
		case 't':
			if (parse_timeout("stop", optarg, &timeout))
				return 2;
			break;
		case 'h': fputs(stop_help, stdout); return 0;
		case ':':
			return cli_error("stop: option '%s' needs a value; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		default:
			return cli_error("stop: unknown option '%s'; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (session && (all || optind < argc))
		return cli_error("stop: --session stops the agents of a session: give no PID "
				 "and no --all with it"), 2;
	if (session)
		return stop_session(session);
	if (all)
		return stop_all(timeout);
	if (optind >= argc)
		return cli_error("stop: no process id given; see 'sptrace stop --help'"), 2;
	for (int i = optind; i < argc; i++)
		failed |= control_one(&stop_cmd, argv[i], timeout);
	return failed;
}

int cmd_activate(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "timeout", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	double timeout = 10;
	int c, failed = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 't':
			if (parse_timeout("activate", optarg, &timeout))
				return 2;
			break;
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
	for (int i = optind; i < argc; i++)
		failed |= control_one(&activate_cmd, argv[i], timeout);
	return failed;
}

int cli_control_pid(int activate, pid_t pid, double timeout)
{
	char arg[24];
	int rc;

	snprintf(arg, sizeof arg, "%d", (int)pid);
	said = stderr;
	rc = control_one(activate ? &activate_cmd : &stop_cmd, arg, timeout);
	said = NULL;
	return rc;
}
