/*
 * cmd_run.c — `sptrace run`: start a program under the agent.
 *
 * The program gets the agent through LD_PRELOAD and the trace directory
 * through the environment; `sptrace run` waits for it, completes the trace's
 * metadata if the program died without the agent finishing (kill -9, a
 * crash: the rings are files, so the records are kept), and then ends the
 * way the program ended: same exit status, or the same signal.
 *
 * Before the start it analyses the program and the libraries it will load
 * that the code-analysis repository lacks, and after the end the modules
 * the trace names that it still lacks (a library dlopen'd late, whose
 * analysis the program's end cut short): see preanalyze.c.
 */
#include "cli.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"
#include "registry.h"
#include "trace_format.h"

/* How often `sptrace run` packs the records written meanwhile (cmd_run's
 * loop says why), at the least. */
#define PACK_EVERY_NS 50000000ull

static const char help[] =
	"usage: sptrace run [OPTIONS] [--] PROGRAM [ARGS...]\n"
	"\n"
	"Run PROGRAM with the sptrace agent.  The agent changes nothing until the\n"
	"activation event; then it instruments the code just ahead of the flow of\n"
	"control and records every call and return into per-thread rings.\n"
	"\n"
	"options:\n"
	"  --on EVENT          when tracing starts:\n"
	"                        start         at main (the default)\n"
	"                        call FUNC     when FUNC (a name or 0xADDR) is first reached\n"
	"                        timer SECONDS after that long, every thread from where it\n"
	"                                      stands (its functions already running are\n"
	"                                      found by a stack walk)\n"
	"                        signal        at 'sptrace activate PID', likewise\n"
	"                        key CHORD     when the key chord is pressed (Ctrl-Alt-T;\n"
	"                                      X11 when $DISPLAY is set, else evdev: the\n"
	"                                      keyboards under /dev/input, else the kernel\n"
	"                                      module's keyboard notifier, /dev/sptrace),\n"
	"                                      likewise; again, tracing stops, and so on.\n"
	"                                      With --flight-recorder: traced from the\n"
	"                                      start, and the chord freezes the rings\n"
	"                                      (what the last seconds before it left in\n"
	"                                      them is kept); again, tracing resumes\n"
	"                        accept        when a thread's accept returns a connection\n"
	"                        recv          when a thread receives data on a socket\n"
	"                                      (recv, recvfrom, recvmsg, or read of a socket)\n"
	"  --threads WHICH     after an accept or recv: 'event' (the default) traces that\n"
	"                      thread and the threads it creates; 'all' every thread\n"
	"  --join DIRECTIVE    a join directive (repeat for more; up to 16), kept in the\n"
	"                      trace's meta for 'sptrace flows' and 'analyze':\n"
	"                        FUNC:entry:argN  record integer argument N (1..6) of\n"
	"                                         each direct call of FUNC\n"
	"                        FUNC:exit:ret    record its return value\n"
	"                        FUNC:scope       a call of FUNC is a scope (flows)\n"
	"                      calls whose values match join the same flow\n"
	"  -o, --output DIR    trace directory (default: sptrace.data; an existing one\n"
	"                      is kept as DIR.old)\n"
	"  --group GROUP       let GROUP (a name or a gid) read the trace: directories\n"
	"                      2750, files 0640; by default only you can (0700, 0600)\n"
	"  --ring-size MB      size of each thread's ring (default 16); with every\n"
	"                      record kept, of the window the agent writes through\n"
	"  --budget PERCENT    an overhead budget: the agent counts (rather than times)\n"
	"                      the calls of hot, short callees while tracing would\n"
	"                      cost more than PERCENT % of the program's own time;\n"
	"                      a call of 1 us or more is always timed, and every call\n"
	"                      is counted exactly (report's Calls; replay marks the\n"
	"                      sites).  Default 0: every call timed\n"
	"  --propagate-wait MS when a spdaemon serves this host, a traced send to a\n"
	"                      process not traced yet waits up to MS milliseconds\n"
	"                      (default 3000) while the daemon of the receiver's host\n"
	"                      puts the agent there; the receiver starts tracing at\n"
	"                      the receive of that send\n"
	"  --mark offset|oob   how a traced send and the receive it reaches are\n"
	"                      matched: 'offset' (the default) puts nothing on the\n"
	"                      wire: TCP by the stream offset the kernel counts at\n"
	"                      both ends, UDP by the datagram's content hash; 'oob'\n"
	"                      marks it: TCP by one urgent byte (MSG_OOB) sent before\n"
	"                      it, which the receiving agent takes out (where a\n"
	"                      receiver cannot -- SO_OOBINLINE, a SIGURG owner, a\n"
	"                      program that uses MSG_OOB -- by offset, said in its\n"
	"                      agent.log); UDP by an IP option with a sequence\n"
	"                      number, once a probe saw options arrive (else, and\n"
	"                      for IPv6, by content hash)\n"
	"  --no-propagate      trace this program only, even with a spdaemon\n"
	"  --flight-recorder   keep only the newest records: each thread's last\n"
	"                      --ring-size MB (a full ring overwrites its oldest\n"
	"                      records and counts them).  Without it every record is\n"
	"                      kept: each thread's file DIR/ring.<tid> grows as the\n"
	"                      thread writes (8 bytes per record; a full disk ends\n"
	"                      what is kept, and every reader says so first)\n"
	"  --no-compact        without --flight-recorder: leave the records as the\n"
	"                      agent wrote them.  By default sptrace run re-encodes\n"
	"                      each chunk of records a thread has finished into\n"
	"                      DIR/packed.<tid> (about 2-4 bytes a call instead of\n"
	"                      16) and frees it in ring.<tid>, while the program runs\n"
	"  --lookahead HOW     which functions the agent instruments ahead of the\n"
	"                      flow, with each function reached: 'profile' (the\n"
	"                      default) its direct callees and its caller's that an\n"
	"                      earlier run reached -- each run adds what it reached\n"
	"                      to its modules' profiles, beside their entries in the\n"
	"                      code-analysis repository, when that is yours and the\n"
	"                      records are packed; a module without one, all of\n"
	"                      them; 'all': all of them, profiles neither read nor\n"
	"                      written.  The trace is the same either way\n"
	"  --kernel            also record the kernel functions the program's system\n"
	"                      calls run, nested under the calls (needs root and\n"
	"                      sptrace's kernel module: /dev/sptrace, see kagent/)\n"
	CLI_HELP_KERNEL_CALLS
	"  -h, --help          this text\n"
	"\n"
	"Then: 'sptrace replay DIR' prints the call trees, 'sptrace report DIR' the\n"
	"time per function; after a run that propagated, 'sptrace collect -o OUT DIR'\n"
	"gathers the traces of every host the requests reached.\n";

/* What propagation did, from the trace's meta ("propagated" lines). */
static void print_propagation(const char *dir, const char *session)
{
	char hosts[512] = "";
	unsigned asked = 0, followed = 0, k;
	an_meta *m = NULL;
	sp_err e;

	if (an_meta_read(dir, &m, &e) < 0)
		m = NULL;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		char host[256];
		const char *p;

		if (strcmp(an_meta_key(m, l), TRACE_META_PROPAGATED) != 0 ||
		    !(p = strstr(an_meta_val(m, l), " host ")) ||
		    sscanf(p, " host %255s targets %u", host, &k) != 2)
			continue;
		asked++;
		followed += k;
		char word[260];

		snprintf(word, sizeof word, " %s,", host);
		if (k && strcmp(host, "-") != 0 && !strstr(hosts, word) &&
		    strlen(hosts) + strlen(word) < sizeof hosts)
			strcat(hosts, word);
	}
	an_meta_free(m);
	if (hosts[0])
		hosts[strlen(hosts) - 1] = '\0';
	if (!asked)
		fprintf(stderr, "sptrace: session %s: no traced send left this process\n", session);
	else
		fprintf(stderr, "sptrace: session %s: %u channel%s followed, %u process%s at their "
			"other ends traced (hosts:%s); gather them with 'sptrace collect -o OUT %s'\n",
			session, asked, asked == 1 ? "" : "s", followed, followed == 1 ? "" : "es",
			hosts[0] ? hosts : " none", dir);
}

static void meta_end(const char *dir, int status)
{
	struct timespec ts;
	uint32_t lo, hi;
	int fd = cli_trace_file(dir, "meta", O_WRONLY | O_APPEND);
	FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return;
	}
	/* The TSC is shared by all processes: read it here for the end clocks. */
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	clock_gettime(CLOCK_MONOTONIC, &ts);
	fprintf(f, TRACE_META_TSC1 " %llu\n" TRACE_META_MONO1 " %llu\n", (unsigned long long)hi << 32 | lo,
		(unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
	if (WIFSIGNALED(status))
		fprintf(f, "%s killed by signal %d (%s)%s\n", TRACE_META_END, WTERMSIG(status),
			strsignal(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
	else
		fprintf(f, "%s exit status %d before the agent finished\n", TRACE_META_END,
			WEXITSTATUS(status));
	fclose(f);
}

/* Complete every trace of the process: each image that exec'd ends with
 * that, the last one with how the process ended (unless its agent said). */
static void end_traces(const char *dir, int status)
{
	char cur[PATH_MAX], next[PATH_MAX], why[512];

	snprintf(cur, sizeof cur, "%s", dir);
	for (int depth = 0; depth < 64 && cli_exec_successor(cur, next, sizeof next); depth++) {
		if (!cli_meta_end(cur, why, sizeof why)) {
			int fd = cli_trace_file(cur, "meta", O_WRONLY | O_APPEND);

			if (fd >= 0) {
				dprintf(fd, "%s exec: the process went on in %s\n", TRACE_META_END,
					strrchr(next, '/') + 1);
				close(fd);
			}
		}
		snprintf(cur, sizeof cur, "%s", next);
	}
	if (!cli_meta_end(cur, why, sizeof why))
		meta_end(cur, status);
}

/*
 * The agent never started in the program (no meta): why, as far as the
 * file tells.  The loader ignores LD_PRELOAD in a static program, cannot
 * load a 64-bit agent into a 32-bit one, and ignores a preload with a
 * path in a set-user-ID or set-group-ID program run by someone else.
 */
static void why_not_traced(const char *prog, char *why, size_t n)
{
	char path[PATH_MAX], interp[PATH_MAX];
	unsigned char ident[EI_NIDENT];
	struct stat st;
	ssize_t got;
	int fd;

	snprintf(why, n, "the agent did not start in it (see the program's stderr)");
	if (cli_find_program(prog, path, sizeof path) != 0 || stat(path, &st) != 0)
		return;
	if (((st.st_mode & S_ISUID) && st.st_uid != getuid()) ||
	    ((st.st_mode & S_ISGID) && st.st_gid != getgid())) {
		snprintf(why, n, "%s is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD "
			 "in it", path);
		return;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	got = fd >= 0 ? read(fd, ident, sizeof ident) : -1;
	if (fd >= 0)
		close(fd);
	if (got != (ssize_t)sizeof ident || memcmp(ident, ELFMAG, SELFMAG) != 0)
		return;
	if (ident[EI_CLASS] == ELFCLASS32)
		snprintf(why, n, "%s is a 32-bit program; the agent is 64-bit", path);
	else if (!cli_elf_interpreter(path, interp, sizeof interp))
		snprintf(why, n, "%s is statically linked: there is no loader to preload the "
			 "agent", path);
}

/* The agent registers the program where `sptrace stop` finds it only in a
 * registry no other user could have written (registry.h), and says so in
 * agent.log alone: said here too, before the program starts.  A registry
 * not made yet is the agent's to make. */
static void warn_unregistered(void)
{
	char path[PATH_MAX], why[2 * PATH_MAX];
	int fd = sp_registry_open(getenv("XDG_RUNTIME_DIR"), (unsigned)getuid(), 0, path,
				  sizeof path, why, sizeof why);

	if (fd >= 0)
		close(fd);
	else if (errno != ENOENT)
		fprintf(stderr, "sptrace: run: warning: %s; 'sptrace stop' and 'sptrace activate' "
			"will not find the program\n", why);
}

/*
 * What execvp would refuse, said before the trace directory is touched (a
 * failed start must not cost the previous trace its place): a program that
 * does not exist (127), a directory, a file that is not executable (126).
 * 0 when it may start; what slips through is execvp's to say.
 */
static int cannot_start(const char *prog)
{
	char path[PATH_MAX];
	struct stat st;

	if (!strchr(prog, '/')) {
		if (cli_find_program(prog, path, sizeof path) == 0)
			return 0;
		/* Something by that name on PATH: execvp says what is wrong. */
		for (const char *p = getenv("PATH"); p && *p;) {
			size_t n = strcspn(p, ":");

			snprintf(path, sizeof path, "%.*s/%s", (int)n, p, prog);
			if (stat(path, &st) == 0)
				return 0;
			p += n + (p[n] == ':');
		}
		return cli_error("run: cannot execute %s: no such program in PATH", prog), 127;
	}
	if (stat(prog, &st) != 0)
		return cli_error("run: cannot execute %s: %s", prog, strerror(errno)),
		       errno == ENOENT ? 127 : 126;
	if (S_ISDIR(st.st_mode))
		return cli_error("run: cannot execute %s: it is a directory", prog), 126;
	if (access(prog, X_OK) != 0)
		return cli_error("run: cannot execute %s: %s", prog, strerror(errno)), 126;
	return 0;
}

/*
 * The files of every record (trace_format.h) end with the chunk the agent
 * mapped ahead: up to two chunks of zeros per thread, allocated.  Once the
 * program's process is gone, no thread of it can write any more: each of
 * its ring files (its pid in the header, in DIR and its exec'd images'
 * subdirectories) is cut to the records it holds.  Other processes' files
 * (a forked child that lives on) are left alone.
 */
static void trim_rings(const char *dir, pid_t pid, int depth)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = opendir(dir);

	if (!d)
		return;
	while ((de = readdir(d))) {
		trace_ring_header h;
		struct stat st;
		int fd;

		if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= sizeof path)
			continue;
		if (depth < 16 && strncmp(de->d_name, "exec.", 5) == 0) {
			trim_rings(path, pid, depth + 1);
			continue;
		}
		if (strncmp(de->d_name, "ring.", 5) != 0 ||
		    (fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
			continue;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
		    pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == TRACE_RING_MAGIC &&
		    h.version >= 2 && h.chunk && h.pid == (uint32_t)pid &&
		    h.header_size == TRACE_RING_HEADER_SIZE && h.count < ((uint64_t)1 << 56) &&
		    (uint64_t)st.st_size > h.header_size + h.count * 8 &&
		    ftruncate(fd, (off_t)(h.header_size + h.count * 8)) < 0)
			cli_error("run: %s: cannot cut the file to its records: %s", path,
				  strerror(errno));
		close(fd);
	}
	closedir(d);
}

/* End like the program did: same status, or the same signal (no core of
 * our own: the program already dumped one if it was going to). */
static int end_like(int status)
{
	if (WIFSIGNALED(status)) {
		struct rlimit no_core = { 0, 0 };

		setrlimit(RLIMIT_CORE, &no_core);
		signal(WTERMSIG(status), SIG_DFL);
		raise(WTERMSIG(status));
		return 128 + WTERMSIG(status);
	}
	return WEXITSTATUS(status);
}

/* ms, or until the program (pidfd) ends. */
static void wait_a_little(int pidfd, int ms)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };

	if (pidfd < 0 || poll(&p, 1, ms) < 0)
		nanosleep(&(struct timespec){ 0, ms * 1000000L }, NULL);
}

int cmd_run(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "on", required_argument, 0, 'e' },        { "output", required_argument, 0, 'o' },
		{ "ring-size", required_argument, 0, 'r' }, { "help", no_argument, 0, 'h' },
		{ "threads", required_argument, 0, 'T' },   { "flight-recorder", no_argument, 0, 'F' },
		{ "group", required_argument, 0, 'g' },     { "propagate-wait", required_argument, 0, 'W' },
		{ "no-propagate", no_argument, 0, 'N' },    { "kernel", no_argument, 0, 'K' },
		{ "kernel-calls", required_argument, 0, 'C' }, { "join", required_argument, 0, 'J' },
		{ "mark", required_argument, 0, 'M' },
		{ "budget", required_argument, 0, 'B' },
		{ "kernel-indirect", no_argument, 0, 'I' }, { "no-compact", no_argument, 0, 'P' },
		{ "lookahead", required_argument, 0, 'L' },
		{ 0, 0, 0, 0 },
	};
	const char *joins[CLI_JOIN_MAX];
	size_t njoins = 0;
	char join_env[CLI_JOIN_MAX * 257] = "";
	char session[128] = "", daemon[256] = "", wait[16] = "3000", mark[8] = "offset";
	int propagate = 1, kernel = 0, indirect = 0, go[2] = { -1, -1 };
	const char *kernel_calls = NULL;
	cli_kernel *kern = NULL;
	int flight = 0, compact = 1, profiles = 1;
	uint64_t last_pack, pack_every = PACK_EVERY_NS;
	int pidfd;
	const char *threads = NULL;
	const char *dir = "sptrace.data", *on = "start", *chord = NULL;
	cli_hotkey *hk = NULL;
	int presses = 0;
	char agent[PATH_MAX], absdir[PATH_MAX], preload[2 * PATH_MAX + 2], ring[32] = "", tsc_hz[24];
	char budget[16] = "0";
	char meta[PATH_MAX + 8];
	const char *old_preload = getenv("LD_PRELOAD");
	int c, status, errpipe[2], exec_errno = 0;
	cli_trace_owner owner = { geteuid(), getegid(), (gid_t)-1 };
	pid_t pid;
	cli_spares *spares = NULL;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:o:h", lo, NULL)) != -1) {
		switch (c) {
		case 'e':
			on = optarg;
			chord = cli_key_chord(on, argc, argv, &optind);
			break;
		case 'o': dir = optarg; break;
		case 'r':
			if (cli_ring_size("run", optarg, ring, sizeof ring))
				return 2;
			break;
		case 'T':
			if (cli_check_threads("run", optarg))
				return 2;
			threads = optarg;
			break;
		case 'J':
			if (cli_add_join("run", joins, &njoins, optarg))
				return 2;
			snprintf(join_env + strlen(join_env), sizeof join_env - strlen(join_env),
				 "%s%s", join_env[0] ? "\n" : "", optarg);
			break;
		case 'F': flight = 1; break;
		case 'P': compact = 0; break;
		case 'L':
			if (strcmp(optarg, "profile") != 0 && strcmp(optarg, "all") != 0)
				return cli_error("run: --lookahead '%s': expected 'profile' or 'all'; "
						 "see 'sptrace run --help'", optarg), 2;
			profiles = strcmp(optarg, "profile") == 0;
			break;
		case 'B':
			if (cli_budget("run", optarg, budget, sizeof budget))
				return 2;
			break;
		case 'N': propagate = 0; break;
		case 'K': kernel = 1; break;
		case 'C': kernel = 1; kernel_calls = optarg; break;
		case 'I': kernel = 1; indirect = 1; break;
		case 'W':
			if (cli_propagate_wait("run", optarg, wait, sizeof wait))
				return 2;
			break;
		case 'M':
			if (cli_propagate_mark("run", optarg, mark, sizeof mark))
				return 2;
			break;
		case 'g':
			if (cli_trace_group("run", optarg, &owner.group))
				return 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("run: option '%s' needs a value; see 'sptrace run --help'",
					 argv[optind - 1]), 2;
		default:
			return cli_error("run: unknown option '%s'; see 'sptrace run --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind >= argc)
		return cli_error("run: no program given; see 'sptrace run --help'"), 2;
	if (chord) {
		/* the agent waits dormant, as for 'sptrace activate'; the chord is
		 * ours.  A flight recorder records from the start instead, and the
		 * chord freezes it ('sptrace stop': its rings keep what the last
		 * seconds left in them). */
		if (cli_hotkey_check("run", chord))
			return 2;
		on = flight ? "start" : "signal";
	}
	if (cli_check_event("run", on, "start"))
		return 2;
	if ((c = cannot_start(argv[optind])))
		return c;
	/* The module first: without it the previous trace keeps its place. */
	if (kernel && !(kern = cli_kernel_start("run", kernel_calls, indirect)))
		return 1;
	if (cli_find_agent("run", agent, sizeof agent) ||
	    cli_prepare_trace_dir("run", dir, &owner, absdir)) {
		cli_kernel_abandon(kern);
		return 1;
	}
	warn_unregistered();
	if (propagate && cli_start_session(session, sizeof session, daemon, sizeof daemon) == 0)
		fprintf(stderr, "sptrace: spdaemon %s serves this host: the program's requests are "
			"followed into the processes they reach (session %s)\n", daemon, session);
	snprintf(preload, sizeof preload, "%s%s%s", agent, old_preload && *old_preload ? ":" : "",
		 old_preload ? old_preload : "");
	{
		char **mods;
		size_t n;

		/* The agent, in the same environment, uses the same repository. */
		if (cli_program_modules(argv[optind], &mods, &n) == 0) {
			cli_analyze_missing("run", NULL, mods, n, 0);
			cli_free_list(mods, n);
		}
		if (cli_agent_modules("", &mods, &n) == 0) {
			cli_analyze_missing("run", NULL, mods, n, 0);
			cli_free_list(mods, n);
		}
	}
	if (chord && !(hk = cli_hotkey_open("run", chord))) {
		cli_kernel_abandon(kern);
		cli_remove_trace_dir(absdir, owner.uid);
		return 2;
	}
	/* The kernel's functions are probed before the program starts, and
	 * the child waits on `go` until its pid is in the module's scope. */
	if (kernel) {
		if (pipe2(go, O_CLOEXEC) != 0) {
			cli_kernel_abandon(kern);
			return cli_error("run: cannot create a pipe: %s", strerror(errno));
		}
	}
	/* The child reports a failed exec through a close-on-exec pipe: an
	 * empty read means the program is running. */
	if (pipe2(errpipe, O_CLOEXEC) != 0)
		return cli_error("run: cannot create a pipe: %s", strerror(errno));
	snprintf(tsc_hz, sizeof tsc_hz, "%llu", (unsigned long long)sp_tsc_hz());
	spares = cli_spares_start(absdir);
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		cli_spares_end(spares);
		return cli_error("run: cannot fork: %s", strerror(errno));
	}
	if (pid == 0) {
		close(errpipe[0]);
		if (go[0] >= 0) {
			char b;

			close(go[1]);
			if (read(go[0], &b, 1) != 1)
				_exit(126);     /* sptrace could not put it in scope */
		}
		const char *bind = getenv("LD_BIND_NOW");

		setenv("SPTRACE_LD_BIND_NOW", bind ? bind : "-", 1);
		setenv("LD_BIND_NOW", "1", 1);     /* PLT slots hold their callees */
		setenv("SPTRACE_LD_PRELOAD", old_preload && *old_preload ? old_preload : "-", 1);
		setenv("LD_PRELOAD", preload, 1);
		setenv("SPTRACE_DIR", absdir, 1);
		setenv("SPTRACE_ON", on, 1);
		setenv("SPTRACE_TSC_HZ", tsc_hz, 1);
		if (*ring)
			setenv("SPTRACE_RING_BYTES", ring, 1);
		if (strcmp(budget, "0") != 0)
			setenv("SPTRACE_BUDGET", budget, 1);
		else
			unsetenv("SPTRACE_BUDGET");
		if (flight)
			unsetenv("SPTRACE_RECORDS");
		else
			setenv("SPTRACE_RECORDS", "all", 1);
		if (threads)
			setenv("SPTRACE_THREADS", threads, 1);
		if (profiles)
			unsetenv("SPTRACE_LOOKAHEAD");  /* not an outer run's */
		else
			setenv("SPTRACE_LOOKAHEAD", "all", 1);
		if (join_env[0])
			setenv("SPTRACE_JOIN", join_env, 1);
		else
			unsetenv("SPTRACE_JOIN");       /* not an outer run's */
		if (session[0]) {
			setenv("SPTRACE_SESSION", session, 1);
			setenv("SPTRACE_PROPAGATE_WAIT", wait, 1);
			setenv("SPTRACE_MARK", mark, 1);
		} else {
			unsetenv("SPTRACE_SESSION");    /* not an outer run's */
			unsetenv("SPTRACE_PROPAGATE_WAIT");
			unsetenv("SPTRACE_MARK");
		}
		unsetenv("SPTRACE_IMAGES");     /* the program's agents' own */
		unsetenv("SPTRACE_CPU");
		if (spares)
			setenv("SPTRACE_SPARE", cli_spares_path(spares), 1);
		else
			unsetenv("SPTRACE_SPARE");      /* not an outer run's */
		execvp(argv[optind], argv + optind);
		exec_errno = errno;
		if (write(errpipe[1], &exec_errno, sizeof exec_errno) < 0)
			_exit(126);
		_exit(exec_errno == ENOENT ? 127 : 126);
	}
	close(errpipe[1]);
	if (kern) {
		close(go[0]);
		if (cli_kernel_trace(kern, pid) != 0) {
			close(go[1]);           /* the child ends without starting */
			close(errpipe[0]);
			waitpid(pid, &status, 0);
			cli_spares_end(spares);
			cli_kernel_abandon(kern);
			cli_remove_trace_dir(absdir, owner.uid);
			return 1;
		}
		if (write(go[1], "g", 1) != 1) { /* the child is gone: waitpid says */ }
		close(go[1]);
	}
	if (read(errpipe[0], &exec_errno, sizeof exec_errno) == (ssize_t)sizeof exec_errno) {
		close(errpipe[0]);
		waitpid(pid, &status, 0);
		cli_spares_end(spares);
		cli_kernel_abandon(kern);
		cli_remove_trace_dir(absdir, owner.uid);
		cli_error("run: cannot execute %s: %s", argv[optind], strerror(exec_errno));
		return exec_errno == ENOENT ? 127 : 126;
	}
	close(errpipe[0]);
	/* Like a shell: the terminal's ^C goes to the program; we wait.  (The
	 * agent keeps the records itself: nothing to do meanwhile.) */
	signal(SIGINT, SIG_IGN);
	signal(SIGQUIT, SIG_IGN);
	if (hk && flight)
		fprintf(stderr, "sptrace: pid %d is traced into its flight recorder; %s (%s) "
			"freezes it, keeping the records before the press; pressed again, tracing "
			"resumes, and so on\n", (int)pid, chord, cli_hotkey_backend(hk));
	else if (hk)
		fprintf(stderr, "sptrace: pid %d waits for %s (%s): tracing starts when it is "
			"pressed; pressed again, it stops, and so on\n", (int)pid, chord,
			cli_hotkey_backend(hk));
	compact = compact && !flight;
	last_pack = sp_now_ns();
	/* Between looks the loop waits on the program's pidfd, which wakes it
	 * the moment the program ends (a sleep of 10 ms added 5 on average to
	 * every run); without one (a kernel before 5.3) it sleeps. */
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	for (;;) {
		pid_t w = waitpid(pid, &status, kern || hk || compact ? WNOHANG : 0);
		int busy = 0;

		if (w == pid)
			break;
		if (w < 0 && errno != EINTR) {
			cli_hotkey_close(hk);
			cli_spares_end(spares);
			return cli_error("run: waiting for pid %d: %s", (int)pid, strerror(errno));
		}
		if (kern && cli_kernel_poll(kern))
			busy = 1;
		/* the chord: activate, stop, activate... (as 'sptrace activate|stop') */
		for (int n = hk ? cli_hotkey_wait(hk, busy ? 0 : 1) : 0; n > 0; n--) {
			int activate = (presses++ % 2 == 0) != flight;

			fprintf(stderr, "sptrace: %s pressed%s\n", chord, !flight ? "" : activate ?
				": tracing resumes" : ": the flight recorder is frozen");
			cli_control_pid(activate, pid, 5);
		}
		/* Compaction: every 50 ms (a chunk of a thread is 8 MiB by
		 * default: filled in about 30 ms at full rate, so the page cache
		 * holds a few chunks per thread at most).  A pass that packed
		 * nothing but took longer than 12 ms to look (a program of
		 * thousands of processes) waits 4 times its time for the next:
		 * looking takes a fifth of a CPU at most. */
		if (compact && sp_now_ns() - last_pack >= pack_every) {
			uint64_t t = sp_now_ns(), wait;
			int64_t n = cli_pack_rings("run", absdir, false);

			if (n < 0)
				compact = 0;
			last_pack = sp_now_ns();
			wait = 4 * (last_pack - t);
			pack_every = n == 0 && wait > PACK_EVERY_NS ? wait : PACK_EVERY_NS;
		}
		if ((kern && !hk && !busy) || (compact && !kern && !hk))
			wait_a_little(pidfd, kern ? 1 : 10);
	}
	if (pidfd >= 0)
		close(pidfd);
	cli_hotkey_close(hk);
	/* The program is gone: a process it left running makes its files
	 * itself from now on. */
	cli_spares_end(spares);
	snprintf(meta, sizeof meta, "%s/meta", absdir);
	if (access(meta, F_OK) != 0) {
		char why[PATH_MAX + 128];

		why_not_traced(argv[optind], why, sizeof why);
		fprintf(stderr, "sptrace: nothing was traced in pid %d: %s\n", (int)pid, why);
		cli_kernel_abandon(kern);
		cli_remove_trace_dir(absdir, owner.uid);
		return end_like(status);
	}
	trim_rings(absdir, pid, 0);
	if (compact)      /* (the program's files, and those of children gone too) */
		cli_pack_rings("run", absdir, true);
	if (compact && profiles)
		cli_learn_lookahead("run", absdir);
	end_traces(absdir, status);
	if (kern)
		cli_kernel_finish(kern, absdir);
	cli_analyze_traced_modules("run", NULL, absdir);
	cli_print_left_alone(stderr, absdir);
	cli_print_untraced(stderr, absdir);
	if (session[0])
		print_propagation(absdir, session);
	cli_say_lost_dir("run", absdir, NULL);
	fprintf(stderr, "sptrace: trace of pid %d in %s\n", (int)pid, dir);
	return end_like(status);
}
