/*
 * cmd_attach.c — `sptrace attach PID`: load the agent into a running process
 * (injector/) and trace it from the activation event on, without restarting
 * it.  The agent then behaves as under `sptrace run`: `sptrace stop PID`
 * puts every byte back, `sptrace activate PID` starts again.
 *
 * The code analyses of the process's modules are made here, before the
 * agent is injected, for every module the repository lacks (preanalyze.c):
 * the agent then only reads entries.  Not when root attaches to another
 * user's process: root would store, in the repository its own processes
 * trust, analyses of files that user may have made (a build-id is only a
 * claim); that user's agent analyses them, in the user's repository, as
 * before -- without forking and without source lines (agent/modules.c).
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "codeanalysis.h"
#include "injector.h"
#include "trace_format.h"

static const char help[] =
	"usage: sptrace attach [OPTIONS] PID\n"
	"\n"
	"Load the sptrace agent into the running process PID and trace it: no\n"
	"restart, no rebuild.  One thread of the process is stopped for a few\n"
	"milliseconds, at a point where it waits in a system call; the agent is\n"
	"loaded on a thread of its own.\n"
	"\n"
	"options:\n"
	"  --on EVENT          when tracing starts:\n"
	"                        now           at once (the default): every thread from\n"
	"                                      where it stands\n"
	"                        call FUNC     when FUNC (a name or 0xADDR) is next reached\n"
	"                        timer SECONDS after that long\n"
	"                        signal        at 'sptrace activate PID'\n"
	"                        key CHORD     when the key chord is pressed (Ctrl-Alt-T;\n"
	"                                      X11 when $DISPLAY is set, else evdev: the\n"
	"                                      keyboards under /dev/input, else the kernel\n"
	"                                      module's keyboard notifier, /dev/sptrace);\n"
	"                                      again, tracing stops, and so on: attach\n"
	"                                      waits for the chord until the process ends\n"
	"                        accept        when a thread's accept returns a connection\n"
	"                        recv          when a thread receives data on a socket\n"
	"                                      (recv, recvfrom, recvmsg, or read of a socket)\n"
	"  --threads WHICH     after an accept or recv: 'event' (the default) traces that\n"
	"                      thread and the threads it creates; 'all' every thread\n"
	"  --join DIRECTIVE    a join directive, as 'sptrace run --join' (repeat for more)\n"
	"  -o, --output DIR    trace directory (default: sptrace.PID; an existing one is\n"
	"                      kept as DIR.old).  Root attaching to another user's\n"
	"                      process gives it to that user, whom the agent writes as\n"
	"  --group GROUP       let GROUP (a name or a gid) read the trace: directories\n"
	"                      2750, files 0640; by default only its owner can (0700,\n"
	"                      0600)\n"
	"  --ring-size MB      size of each thread's ring (default 16); an attached\n"
	"                      process is traced in flight-recorder mode: a full ring\n"
	"                      overwrites its oldest records and counts them\n"
	"  --budget PERCENT    an overhead budget (default 10): the agent counts, rather\n"
	"                      than times, the calls of hot, short callees while\n"
	"                      tracing would cost more than PERCENT % of the\n"
	"                      process's own time; a call of 1 us or more is always\n"
	"                      timed, every call counted exactly.  0: every call timed\n"
	"  --propagate-wait MS when a spdaemon serves this host, a traced send to a\n"
	"                      process not traced yet waits up to MS milliseconds\n"
	"                      (default 3000) while the daemon of the receiver's host\n"
	"                      puts the agent there; the receiver starts tracing at\n"
	"                      the receive of that send\n"
	"  --mark offset|oob   how a traced send and the receive it reaches are\n"
	"                      matched: 'offset' (the default: stream offsets,\n"
	"                      content hashes) or 'oob' (an urgent byte, an IP\n"
	"                      option; see sptrace run --help)\n"
	"  --no-propagate      trace this process only, even with a spdaemon\n"
	"  --kernel            also record the kernel functions the process's system\n"
	"                      calls run, nested under them (root; needs sptrace's\n"
	"                      kernel module: /dev/sptrace, see kagent/); attach then\n"
	"                      stays until the process ends, copying the module's\n"
	"                      records, and writes them into the trace (^C: at once,\n"
	"                      the agent tracing on)\n"
	CLI_HELP_KERNEL_CALLS
	"  --timeout SECONDS   how long to wait for the agent to be ready (default 120)\n"
	"  -h, --help          this text\n"
	"\n"
	"Then: 'sptrace stop PID' stops tracing and restores every byte of code;\n"
	"'sptrace activate PID' starts again; 'sptrace replay DIR' prints the trees.\n";

/* Analyse what the repository lacks of the modules `pid` maps (see the
 * header comment): the agent reads them from prepared=. */
static void prepare_analyses(const char *pid)
{
	char **mods, root[64];
	size_t n;

	if (cli_loaded_modules("attach", pid, &mods, &n) != 0)
		return;
	cli_analyze_missing("attach", NULL, mods, n, strlen("/proc//root") + strlen(pid));
	cli_free_list(mods, n);
	snprintf(root, sizeof root, "/proc/%s/root", pid);
	if (cli_agent_modules(root, &mods, &n) == 0) {
		cli_analyze_missing("attach", NULL, mods, n, strlen(root));
		cli_free_list(mods, n);
	}
}

/* What the agent said about its start (meta "end not tracing: ..."). */
static void agent_reason(const char *dir, char *why, size_t len)
{
	if (!cli_meta_end(dir, why, len))
		snprintf(why, len, "see %.500s/agent.log", dir);
}

static volatile sig_atomic_t stop_following;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_following = 1;
}

/* After the agent is in, attach stays while pid lives if it has work:
 * --kernel copies the module's rings (^C or SIGTERM end it sooner, the
 * agent tracing on), then writes the kernel's records into the trace;
 * --on key toggles tracing at each press of the chord.  Both can run in
 * one loop: the chord's wait is the loop's pause when nothing was copied. */
static int follow(pid_t pid, cli_kernel *k, cli_hotkey *hk, const char *chord,
		  const char *absdir, const char *dir)
{
	struct sigaction sa = { .sa_handler = on_stop_signal };
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0), busy = 0, presses = 0, rc = 0;

	if (k) {
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		printf("sptrace: recording pid %d's kernel calls until it ends (^C: now)\n",
		       (int)pid);
		fflush(stdout);
	}
	while (!stop_following) {
		int pause_ms = busy ? 0 : k ? 1 : 200;

		if (hk) {
			for (int n = cli_hotkey_wait(hk, pause_ms); n > 0; n--) {
				fprintf(stderr, "sptrace: %s pressed\n", chord);
				rc |= cli_control_pid(presses++ % 2 == 0, pid, 5);
			}
			pause_ms = 0;
		}
		if (pfd >= 0) {
			struct pollfd p = { pfd, POLLIN, 0 };

			if (poll(&p, 1, pause_ms) > 0)
				break;          /* it has ended */
		} else if (kill(pid, 0) != 0 && errno == ESRCH) {
			break;
		} else if (pause_ms) {
			nanosleep(&(struct timespec){ 0, pause_ms * 1000000L }, NULL);
		}
		busy = k && cli_kernel_poll(k);
	}
	if (pfd >= 0)
		close(pfd);
	cli_hotkey_close(hk);
	if (!k) {
		printf("sptrace: pid %d has ended\n", (int)pid);
		return rc;
	}
	rc |= cli_kernel_finish(k, absdir);
	printf("sptrace: %s; trace in %s\n", stop_following ? "stopped recording the kernel's "
	       "part (the agent traces on)" : "the process has ended", dir);
	return rc;
}

int cmd_attach(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "on", required_argument, 0, 'e' },        { "output", required_argument, 0, 'o' },
		{ "ring-size", required_argument, 0, 'r' }, { "timeout", required_argument, 0, 't' },
		{ "threads", required_argument, 0, 'T' },   { "help", no_argument, 0, 'h' },
		{ "group", required_argument, 0, 'g' },     { "propagate-wait", required_argument, 0, 'W' },
		{ "no-propagate", no_argument, 0, 'N' },    { "join", required_argument, 0, 'J' },
		{ "mark", required_argument, 0, 'M' },
		{ "budget", required_argument, 0, 'B' },
		{ "kernel", no_argument, 0, 'K' },
		{ "kernel-calls", required_argument, 0, 'C' }, { "kernel-indirect", no_argument, 0, 'I' },
		{ 0, 0, 0, 0 },
	};
	const char *joins[CLI_JOIN_MAX];
	size_t njoins = 0;
	const char *dir = NULL, *on = "now", *threads = "", *chord = NULL;
	cli_hotkey *hk = NULL;
	char agent[PATH_MAX], absdir[PATH_MAX], defdir[64], why[600];
	char ring[32] = "", *end;
	/* A process in production: its calls cost at most a tenth more. */
	char budget[16] = "10";
	double timeout = 120;
	inj_result r;
	sp_err err;
	struct stat st;
	cli_trace_owner owner = { geteuid(), getegid(), (gid_t)-1 };
	char proc[64];
	bool same_user;
	char session[128] = "", daemon[256] = "", wait[16] = "3000", mark[8] = "offset";
	int propagate = 1, kernel = 0, indirect = 0;
	const char *kernel_calls = NULL;
	cli_kernel *kern = NULL;
	long pidl;
	pid_t pid;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:h", lo, NULL)) != -1) {
		switch (c) {
		case 'e':
			on = optarg;
			chord = cli_key_chord(on, argc, argv, &optind);
			break;
		case 'o': dir = optarg; break;
		case 'r':
			if (cli_ring_size("attach", optarg, ring, sizeof ring))
				return 2;
			break;
		case 'B':
			if (cli_budget("attach", optarg, budget, sizeof budget))
				return 2;
			break;
		case 't':
			timeout = strtod(optarg, &end);
			if (*end || !(timeout > 0))
				return cli_error("attach: --timeout wants seconds, not '%s'", optarg), 2;
			break;
		case 'T':
			if (cli_check_threads("attach", optarg))
				return 2;
			threads = optarg;
			break;
		case 'g':
			if (cli_trace_group("attach", optarg, &owner.group))
				return 2;
			break;
		case 'J':
			if (cli_add_join("attach", joins, &njoins, optarg))
				return 2;
			break;
		case 'N': propagate = 0; break;
		case 'K': kernel = 1; break;
		case 'C': kernel = 1; kernel_calls = optarg; break;
		case 'I': kernel = 1; indirect = 1; break;
		case 'W':
			if (cli_propagate_wait("attach", optarg, wait, sizeof wait))
				return 2;
			break;
		case 'M':
			if (cli_propagate_mark("attach", optarg, mark, sizeof mark))
				return 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("attach: option '%s' needs a value; see 'sptrace attach "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("attach: unknown option '%s'; see 'sptrace attach --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("attach: %s; see 'sptrace attach --help'",
				 optind >= argc ? "no process id given" : "give one process id"), 2;
	pidl = strtol(argv[optind], &end, 10);
	if (*end || pidl <= 0 || pidl > INT32_MAX)
		return cli_error("attach: '%s' is not a process id", argv[optind]), 2;
	pid = (pid_t)pidl;
	if (chord) {
		if (cli_hotkey_check("attach", chord))
			return 2;
		on = "signal";           /* dormant; the chord is ours */
	}
	if (cli_check_event("attach", on, "now"))
		return 2;
	if (strcmp(on, "now") == 0)
		on = "timer 0";
	if (inj_check(pid, &err))
		return cli_error("attach: %s", err.msg);
	if (inj_has_mapping(pid, "sptrace-agent") == 1)
		return cli_error("attach: pid %d already has the sptrace agent; use 'sptrace "
				 "activate %d' to trace and 'sptrace stop %d' to stop", (int)pid, (int)pid,
				 (int)pid);
	if (!dir) {
		snprintf(defdir, sizeof defdir, "sptrace.%d", (int)pid);
		dir = defdir;
	}
	/* The agent writes as the target's user: root gives the trace to it. */
	snprintf(proc, sizeof proc, "/proc/%d", (int)pid);
	if (stat(proc, &st) != 0)
		return cli_error("attach: pid %d: %s", (int)pid, strerror(errno));
	same_user = st.st_uid == geteuid();
	if (kernel && !same_user)
		return cli_error("attach: --kernel: pid %d is another user's (uid %u): its trace is "
				 "that user's, and root does not write the kernel's part into a "
				 "directory another user controls; use 'sptrace run --kernel' as root, "
				 "or attach without --kernel", (int)pid, (unsigned)st.st_uid);
	if (geteuid() == 0 && st.st_uid != 0) {
		owner.uid = st.st_uid;
		owner.gid = st.st_gid;
	}
	/* The module first: without it the previous trace keeps its place. */
	if (kernel && !(kern = cli_kernel_start("attach", kernel_calls, indirect)))
		return 1;
	/* After the module: its keyboard backend is then known to be taken
	 * by --kernel (hotkey.c says so), and another backend serves. */
	if (chord && !(hk = cli_hotkey_open("attach", chord))) {
		cli_kernel_abandon(kern);
		return 2;
	}
	if (cli_find_agent("attach", agent, sizeof agent) ||
	    cli_prepare_trace_dir("attach", dir, &owner, absdir)) {
		cli_kernel_abandon(kern);
		return 1;
	}
	/* In scope before the agent is in: the kernel's part has the
	 * activation's first call whole (what comes before is left out). */
	if (kern && cli_kernel_trace(kern, pid) != 0) {
		cli_kernel_abandon(kern);
		cli_remove_trace_dir(absdir, owner.uid);
		return 1;
	}
	if (same_user)
		prepare_analyses(argv[optind]);
	if (propagate && cli_start_session(session, sizeof session, daemon, sizeof daemon) == 0)
		printf("sptrace: spdaemon %s serves this host: the process's requests are followed "
		       "into the processes they reach (session %s)\n", daemon, session);
	inj_agent a = { .so_path = agent, .dir = absdir, .on = on, .ring = ring, .budget = budget,
			.repo = getenv("SPTRACE_REPO"), .threads = threads,
			.prepared = same_user ? ca_repo_default_dir() : NULL, .timeout = timeout,
			.session = session[0] ? session : NULL, .wait = session[0] ? wait : NULL,
			.join = joins, .njoin = njoins, .mark = session[0] ? mark : NULL };

	if (inj_attach_agent(pid, &a, &r, &err)) {
		if (r.entry_running) {
			cli_error("attach: %s; trace in %s", err.msg, absdir);
		} else if (r.entry_rc == 1) {
			agent_reason(absdir, why, sizeof why);
			cli_error("attach: pid %d: the agent is loaded but does not trace: %s", (int)pid,
				  why);
		} else {
			cli_error("attach: %s", err.msg);
			cli_remove_trace_dir(absdir, owner.uid);
		}
		cli_kernel_abandon(kern);
		return 1;
	}
	if (strcmp(on, "timer 0") == 0) {
		/* Tracing starts once the agent has read the modules' code
		 * analyses, which it does after it is in (modules.c). */
		double ms;
		int got = cli_meta_wait(absdir, TRACE_META_ACTIVATED, 0, timeout, &ms, why, sizeof why);

		if (got < 0) {
			printf("sptrace: attached to pid %d in %.1f ms (thread %d stopped for %.2f ms); "
			       "the trace ended before tracing began (%s; see %s/agent.log); trace in "
			       "%s\n", (int)pid, r.total_ms, (int)r.tid, r.pause_ms, why, absdir, absdir);
			cli_kernel_abandon(kern);
			return 1;
		}
		if (got == 0) {
			printf("sptrace: attached to pid %d in %.1f ms (thread %d stopped for %.2f ms); "
			       "not tracing yet after %.0f s (see %s/agent.log); trace in %s\n",
			       (int)pid, r.total_ms, (int)r.tid, r.pause_ms, timeout, absdir, absdir);
			cli_kernel_abandon(kern);
			return 1;
		}
		cli_print_left_alone(stdout, absdir);
		printf("sptrace: attached to pid %d in %.1f ms (thread %d stopped for %.2f ms); "
		       "tracing %.1f ms later; trace in %s\n", (int)pid, r.total_ms, (int)r.tid,
		       r.pause_ms, ms, absdir);
		return kern ? follow(pid, kern, NULL, NULL, absdir, dir) : 0;
	}
	if (hk) {
		printf("sptrace: attached to pid %d in %.1f ms (thread %d stopped for %.2f ms); "
		       "tracing starts when %s is pressed (%s), and stops when it is pressed "
		       "again; waiting for it until pid %d ends (^C leaves the agent dormant); "
		       "trace in %s\n", (int)pid, r.total_ms, (int)r.tid, r.pause_ms, chord,
		       cli_hotkey_backend(hk), (int)pid, absdir);
		fflush(stdout);
		return follow(pid, kern, hk, chord, absdir, dir);
	}
	printf("sptrace: attached to pid %d in %.1f ms (thread %d stopped for %.2f ms); %s; trace "
	       "in %s\n", (int)pid, r.total_ms, (int)r.tid, r.pause_ms,
	       strcmp(on, "signal") == 0 ? "dormant until 'sptrace activate'"
	       : "dormant until the event", absdir);
	return kern ? follow(pid, kern, NULL, NULL, absdir, dir) : 0;
}
