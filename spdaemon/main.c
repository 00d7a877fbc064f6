/*
 * main.c — spdaemon, one per host (one per network namespace): its options
 * and configuration, its state directory and log, and the listening loop.
 * What each request does is in serve.c.
 *
 *   spdaemon --keys KEYDIR --name NAME --state-dir DIR [--port 7470]
 *            [--config FILE] [--foreground]
 *
 * It listens on two sockets:
 *   - the abstract UNIX socket "sptrace-spdaemon", which exists once per
 *     network namespace: the agents and `sptrace` commands of this host
 *     reach it without configuration, and SO_PEERCRED tells who they are;
 *   - TCP PORT on every address, mutual TLS 1.3, for the daemons of other
 *     hosts: a peer is the host its certificate (signed by KEYDIR/ca.crt)
 *     names.
 * Each connection gets a thread of its own, at most SPD_MAX_CONNS at once.
 */
#include "spd_daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#define SPD_MAX_CONNS 64

static const char help[] =
	"usage: spdaemon --keys KEYDIR --name NAME --state-dir DIR [options]\n"
	"\n"
	"The sptrace daemon of this host (of this network namespace): it lets the\n"
	"agents and sptrace commands here, and the daemons of other hosts, ask for\n"
	"tracing to follow a request into this host's processes.\n"
	"\n"
	"  --keys KEYDIR      ca.crt, NAME.crt and NAME.key ('sptrace keys issue')\n"
	"  --name NAME        this host, as its certificate names it\n"
	"  --state-dir DIR    the daemon's log (spdaemon.log), pid file and saved\n"
	"                     traces; made 0700 if missing\n"
	"  --port PORT        TCP port for other hosts' daemons (default 7470)\n"
	"  --agent FILE       the agent it injects (default: libsptrace-agent.so\n"
	"                     beside spdaemon's own installation or build)\n"
	"  --config FILE      'key value' lines: keys, name, state-dir, port, agent,\n"
	"                     remote-inject (users: other hosts may have the agent\n"
	"                     put into non-root processes, the default; all; none)\n"
	"                     (options on the command line win)\n"
	"  --foreground       stay in the foreground and log to stderr too\n"
	"  -h, --help         this text\n"
	"  --version          the version\n";

static spd_daemon D = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- the log ------------------------------------------------------------ */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void spd_log(const char *fmt, ...)
{
	char line[2048];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
	n += snprintf(line + n, sizeof line - (size_t)n, ".%03ldZ ", ts.tv_nsec / 1000000);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	n = (int)strlen(line);
	line[n++] = '\n';
	pthread_mutex_lock(&log_lock);
	if (D.log_fd >= 0)
		(void)sp_write_all(D.log_fd, line, (size_t)n);
	if (D.foreground)
		(void)sp_write_all(STDERR_FILENO, line, (size_t)n);
	pthread_mutex_unlock(&log_lock);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("spdaemon: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* ---- options and configuration ------------------------------------------ */

static int set_port(const char *arg, const char *where)
{
	char *end;
	long p = strtol(arg, &end, 10);

	if (*end || end == arg || p < 1 || p > 65535)
		return fail("%s: port '%s': give a TCP port, 1 to 65535", where, arg);
	D.port = (int)p;
	return 0;
}

/* A "key value" line of the config file; an option given on the command
 * line (already set) wins. */
static int config_line(char *line, const char *file, int lineno)
{
	char where[4200], *key = line, *val;

	snprintf(where, sizeof where, "%s:%d", file, lineno);
	line[strcspn(line, "#\n")] = '\0';
	while (*key == ' ' || *key == '\t')
		key++;
	if (!*key)
		return 0;
	val = key + strcspn(key, " \t");
	if (*val)
		*val++ = '\0';
	while (*val == ' ' || *val == '\t')
		val++;
	for (char *e = val + strlen(val); e > val && (e[-1] == ' ' || e[-1] == '\t');)
		*--e = '\0';
	if (!*val)
		return fail("%s: '%s' needs a value", where, key);
	if (strcmp(key, "port") == 0)
		return D.port ? 0 : set_port(val, where);
	if (strcmp(key, "remote-inject") == 0) {
		if (strcmp(val, "users") && strcmp(val, "all") && strcmp(val, "none"))
			return fail("%s: remote-inject '%s': use users, all or none", where, val);
		D.remote_inject = strcmp(val, "users") == 0 ? SPD_REMOTE_USERS
				  : strcmp(val, "all") == 0 ? SPD_REMOTE_ALL : SPD_REMOTE_NONE;
		return 0;
	}
	char **slot = strcmp(key, "keys") == 0 ? &D.keys : strcmp(key, "name") == 0 ? &D.name
		      : strcmp(key, "state-dir") == 0 ? &D.state_dir
		      : strcmp(key, "agent") == 0 ? &D.agent : NULL;

	if (!slot)
		return fail("%s: unknown setting '%s' (this version knows keys, name, state-dir, "
			    "port, agent, remote-inject)", where, key);
	if (!*slot && !(*slot = strdup(val)))
		return fail("out of memory");
	return 0;
}

static int read_config(const char *file)
{
	char line[4096];
	int fd = sp_open_regular(file, 0), lineno = 0, rc = 0;
	FILE *f;

	if (fd < 0 || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		return fail("--config %s: %s", file, sp_open_why(errno));
	}
	while (rc == 0 && fgets(line, sizeof line, f))
		rc = config_line(line, file, ++lineno);
	fclose(f);
	return rc;
}

static int parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "keys", required_argument, 0, 'k' }, { "name", required_argument, 0, 'n' },
		{ "state-dir", required_argument, 0, 's' }, { "port", required_argument, 0, 'p' },
		{ "config", required_argument, 0, 'c' }, { "foreground", no_argument, 0, 'f' },
		{ "agent", required_argument, 0, 'a' },
		{ "help", no_argument, 0, 'h' }, { "version", no_argument, 0, 'V' },
		{ 0, 0, 0, 0 },
	};
	const char *config = NULL;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'k': D.keys = optarg; break;
		case 'n': D.name = optarg; break;
		case 's': D.state_dir = optarg; break;
		case 'p': if (set_port(optarg, "--port")) return 2; break;
		case 'c': config = optarg; break;
		case 'a': D.agent = optarg; break;
		case 'f': D.foreground = 1; break;
		case 'h': fputs(help, stdout); exit(0);
		case 'V': printf("spdaemon %s\n", SPTRACE_VERSION); exit(0);
		case ':': return fail("option '%s' needs a value; see 'spdaemon --help'",
				      argv[optind - 1]), 2;
		default: return fail("unknown option '%s'; see 'spdaemon --help'",
				     argv[optind - 1]), 2;
		}
	}
	if (optind < argc)
		return fail("unexpected argument '%s'; see 'spdaemon --help'", argv[optind]), 2;
	if (config && read_config(config))
		return 2;
	if (!D.keys || !D.name || !D.state_dir)
		return fail("give %s; see 'spdaemon --help'", !D.keys ? "--keys KEYDIR (made with "
			    "'sptrace keys init' and 'sptrace keys issue')" : !D.name ? "--name NAME "
			    "(this host, as its certificate names it)" : "--state-dir DIR"), 2;
	if (!D.port)
		D.port = SPD_PORT;
	return 0;
}

/* ---- the agent ----------------------------------------------------------- */

/* The agent the daemon puts into processes: --agent, else beside the
 * daemon's build or installation.  Root loads it into other users'
 * processes, so it must be a regular file of root's (or the daemon's
 * user's) that no one else may write. */
static int find_agent(void)
{
	static const char *const rel[] = { "/../agent/libsptrace-agent.so",
					   "/../lib/sptrace/libsptrace-agent.so",
					   "/../lib/x86_64-linux-gnu/sptrace/libsptrace-agent.so" };
	static char found[4096];
	char self[4096], *slash;
	struct stat st;
	ssize_t n;
	int fd;

	if (!D.agent) {
		n = readlink("/proc/self/exe", self, sizeof self - 1);
		self[n > 0 ? n : 0] = '\0';
		if ((slash = strrchr(self, '/')))
			*slash = '\0';
		for (size_t i = 0; i < sizeof rel / sizeof *rel && !D.agent; i++) {
			char cand[4200];

			snprintf(cand, sizeof cand, "%s%s", self, rel[i]);
			if (realpath(cand, found))
				D.agent = found;
		}
		if (!D.agent)
			return fail("cannot find libsptrace-agent.so beside %s; give --agent FILE",
				    self);
	}
	fd = sp_open_regular(D.agent, 0);
	if (fd < 0)
		return fail("--agent %s: %s", D.agent, sp_open_why(errno));
	if (fstat(fd, &st) != 0 || (st.st_uid != 0 && st.st_uid != geteuid()) ||
	    (st.st_mode & 022)) {
		close(fd);
		return fail("--agent %s belongs to uid %u with mode %03o: the daemon puts it into "
			    "other users' processes, so it must be root's and writable by no one "
			    "else", D.agent, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
	}
	close(fd);
	return 0;
}

/* ---- the state directory ------------------------------------------------ */

/* DIR made if missing; the daemon's own, writable by no one else (nobody
 * may plant a link where it writes logs and traces), and 0711: the agents
 * it injects write their traces below it as their processes' users
 * (inject.c), into directories of their own. */
static int open_state_dir(void)
{
	struct stat st;

	if (mkdir(D.state_dir, 0711) != 0 && errno != EEXIST)
		return fail("cannot create the state directory %s: %s", D.state_dir,
			    strerror(errno));
	D.state_fd = open(D.state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (D.state_fd < 0)
		return fail("state directory %s: %s", D.state_dir,
			    errno == ELOOP || errno == ENOTDIR ? "not a directory (a link is not "
			    "followed)" : strerror(errno));
	if (!sp_fd_private(D.state_fd, &st))
		return fail("state directory %s belongs to uid %u with mode %03o: it must be "
			    "this daemon's user's and writable by no one else", D.state_dir,
			    (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
	fchmod(D.state_fd, (st.st_mode & 0755) | 0711);
	if (!realpath(D.state_dir, D.state_abs))
		return fail("state directory %s: %s", D.state_dir, strerror(errno));
	D.log_fd = openat(D.state_fd, "spdaemon.log",
			  O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (D.log_fd < 0)
		return fail("cannot open %s/spdaemon.log: %s", D.state_dir, strerror(errno));
	return 0;
}

static int write_pid_file(void)
{
	char buf[32];
	int fd, n = snprintf(buf, sizeof buf, "%d\n", (int)getpid());

	fd = openat(D.state_fd, "spdaemon.pid",
		    O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0 || sp_write_all(fd, buf, (size_t)n) != 0) {
		if (fd >= 0)
			close(fd);
		return fail("cannot write %s/spdaemon.pid: %s", D.state_dir, strerror(errno));
	}
	close(fd);
	return 0;
}

/* ---- listening ---------------------------------------------------------- */

static int listen_local(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				    strlen(SPD_SOCKET));

	memcpy(sa.sun_path + 1, SPD_SOCKET, strlen(SPD_SOCKET));
	D.local_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (D.local_fd < 0 || bind(D.local_fd, (struct sockaddr *)&sa, len) != 0 ||
	    listen(D.local_fd, 64) != 0)
		return fail("cannot listen on the abstract socket @%s: %s", SPD_SOCKET,
			    errno == EADDRINUSE ? "another spdaemon serves this network namespace "
			    "already" : strerror(errno));
	return 0;
}

/* UDP PORT, IPv4: the other hosts' probes of whether IP options arrive
 * (inject.c, the probe).  Without it datagrams from other hosts are matched
 * by their content hash, said once here. */
static void listen_probes(void)
{
	struct sockaddr_in sa4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)D.port) };
	int one = 1;

	D.probe_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (D.probe_fd >= 0 &&
	    (setsockopt(D.probe_fd, IPPROTO_IP, IP_RECVOPTS, &one, sizeof one) != 0 ||
	     bind(D.probe_fd, (struct sockaddr *)&sa4, sizeof sa4) != 0)) {
		spd_log("no UDP port %d for the probes of IP options (%s): datagrams from other "
			"hosts are matched by content hash", D.port, strerror(errno));
		close(D.probe_fd);
		D.probe_fd = -1;
	}
}

/* TCP PORT on every address: IPv6 with IPv4 mapped, else IPv4 only. */
static int listen_remote(void)
{
	struct sockaddr_in6 sa6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)D.port),
				    .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in sa4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)D.port) };
	int one = 1, zero = 0;

	D.remote_fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (D.remote_fd >= 0) {
		setsockopt(D.remote_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
		setsockopt(D.remote_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(D.remote_fd, (struct sockaddr *)&sa6, sizeof sa6) == 0)
			goto bound;
		close(D.remote_fd);
	}
	D.remote_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (D.remote_fd < 0)
		return fail("cannot make a TCP socket: %s", strerror(errno));
	setsockopt(D.remote_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(D.remote_fd, (struct sockaddr *)&sa4, sizeof sa4) != 0)
		return fail("cannot listen on TCP port %d: %s", D.port,
			    errno == EADDRINUSE ? "in use (another spdaemon? choose --port)"
			    : strerror(errno));
bound:
	if (listen(D.remote_fd, 64) != 0)
		return fail("cannot listen on TCP port %d: %s", D.port, strerror(errno));
	listen_probes();
	return 0;
}

/* ---- connections -------------------------------------------------------- */

static int nconns;
/* The connections being served, so that a stop can end them (another
 * host's daemon keeps its connection open between requests: inject.c). */
static spd_conn *open_conns[SPD_MAX_CONNS];
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;

static void conn_track(spd_conn *c, bool on)
{
	pthread_mutex_lock(&conns_lock);
	for (int i = 0; i < SPD_MAX_CONNS; i++)
		if (on ? !open_conns[i] : open_conns[i] == c) {
			open_conns[i] = on ? c : NULL;
			break;
		}
	pthread_mutex_unlock(&conns_lock);
}

static void *conn_main(void *arg)
{
	spd_conn *c = arg;

	spd_serve(&D, c);
	conn_track(c, false);
	spd_conn_close(c);
	free(c);
	__atomic_sub_fetch(&nconns, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* At the stop: every connection ends (its thread sees the end and frees
 * it), the kept ones to other hosts are closed; waits for them, a while. */
static void end_connections(void)
{
	spd_inject_close_kept();
	pthread_mutex_lock(&conns_lock);
	for (int i = 0; i < SPD_MAX_CONNS; i++)
		if (open_conns[i])
			shutdown(open_conns[i]->fd, SHUT_RDWR);
	pthread_mutex_unlock(&conns_lock);
	for (int i = 0; i < 300 && __atomic_load_n(&nconns, __ATOMIC_RELAXED) > 0; i++)
		usleep(10000);
}

static void describe_peer(spd_conn *c, int remote, struct sockaddr_storage *sa)
{
	if (!remote) {
		struct ucred cred;
		socklen_t len = sizeof cred;

		if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
			c->uid = cred.uid;
			c->pid = cred.pid;
		}
		snprintf(c->peer, sizeof c->peer, "local pid %d uid %u", (int)c->pid,
			 (unsigned)c->uid);
		return;
	}
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	if (sa->ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
		port = ntohs(s6->sin6_port);
		if (strncmp(host, "::ffff:", 7) == 0)
			memmove(host, host + 7, strlen(host + 7) + 1);
	} else if (sa->ss_family == AF_INET) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host);
		port = ntohs(s4->sin_port);
	}
	snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
}

static void accept_one(int lfd, int remote)
{
	struct sockaddr_storage sa;
	socklen_t len = sizeof sa;
	pthread_attr_t attr;
	pthread_t th;
	spd_conn *c;
	int fd = accept4(lfd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (__atomic_add_fetch(&nconns, 1, __ATOMIC_RELAXED) > SPD_MAX_CONNS ||
	    !(c = calloc(1, sizeof *c))) {
		__atomic_sub_fetch(&nconns, 1, __ATOMIC_RELAXED);
		spd_log("refused a connection: %d are open already", SPD_MAX_CONNS);
		close(fd);
		return;
	}
	*c = (spd_conn){ .fd = fd, .uid = (uid_t)-1, .pid = -1 };
	describe_peer(c, remote, &sa);
	c->remote = remote;
	conn_track(c, true);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &attr, conn_main, c) != 0) {
		spd_log("%s: no thread to serve it: %s", c->peer, strerror(errno));
		conn_track(c, false);
		close(fd);
		free(c);
		__atomic_sub_fetch(&nconns, 1, __ATOMIC_RELAXED);
	}
	pthread_attr_destroy(&attr);
}

/* Serve until SIGTERM, SIGINT or SIGHUP. */
static void loop(int sigfd)
{
	for (;;) {
		struct pollfd p[3] = {
			{ .fd = D.local_fd, .events = POLLIN },
			{ .fd = D.remote_fd, .events = POLLIN },
			{ .fd = sigfd, .events = POLLIN },
		};

		if (poll(p, 3, -1) < 0 && errno != EINTR)
			return;
		if (p[2].revents) {
			struct signalfd_siginfo si;

			if (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
				spd_log("signal %u: stopping", si.ssi_signo);
			return;
		}
		if (p[0].revents)
			accept_one(D.local_fd, 0);
		if (p[1].revents)
			accept_one(D.remote_fd, 1);
	}
}

static int daemonize(void)
{
	pid_t pid = fork();
	int null;

	if (pid < 0)
		return fail("cannot fork: %s", strerror(errno));
	if (pid > 0)
		_exit(0);
	setsid();
	if ((null = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		close(null);
	}
	return 0;
}

int main(int argc, char **argv)
{
	sigset_t sigs;
	sp_err err;
	int sigfd, rc;

	D.log_fd = D.state_fd = D.local_fd = D.remote_fd = D.probe_fd = -1;
	if ((rc = parse_args(argc, argv)))
		return rc;
	if (spd_host_name_kind(D.name, &err) < 0)
		return fail("--name: %s", err.msg);
	if (!(D.tls = spd_tls_context(D.keys, D.name, 1, &err)))
		return fail("%s", err.msg);
	sp_tsc_hz();    /* measured once, before any inject waits for it (sp.h) */
	if (find_agent() || open_state_dir() || listen_local() || listen_remote())
		return 1;
	if (!D.foreground && daemonize())
		return 1;
	if (write_pid_file())
		return 1;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigfd = signalfd(-1, &sigs, SFD_CLOEXEC);
	clock_gettime(CLOCK_MONOTONIC, &D.started);
	spd_log("spdaemon %s started: host %s, pid %d, uid %u, TCP port %d, local socket @%s, "
		"state in %s, agent %s, remote-inject %s", SPTRACE_VERSION, D.name, (int)getpid(),
		(unsigned)geteuid(), D.port, SPD_SOCKET, D.state_dir, D.agent,
		D.remote_inject == SPD_REMOTE_USERS ? "users"
		: D.remote_inject == SPD_REMOTE_ALL ? "all" : "none");
	if (geteuid() != 0)
		spd_log("not root: only processes of uid %u can be traced from here",
			(unsigned)geteuid());
	loop(sigfd);
	end_connections();
	unlinkat(D.state_fd, "spdaemon.pid", 0);
	spd_log("stopped after %llu requests", (unsigned long long)D.requests);
	return 0;
}
