/*
 * inject.c — the inject request: put the agent into every process of this
 * host that holds the receiving end of a channel, so that tracing follows a
 * message to where it is received.
 *
 *   1. The request is checked: a session name of [A-Za-z0-9._-], 1 to 64
 *      characters (it names a directory), and a channel with addresses of
 *      the right length or an inode.
 *   2. The holders of the channel's receiving end (holders.c), less the
 *      requester itself and this daemon.  A UNIX stream socket named by
 *      its sending socket alone (a forked writer cannot learn its peer:
 *      agent/propagate.c, point 18) is looked up first: its peer
 *      (spd_unix_peer, this namespace's sock_diag, for a local requester
 *      that holds the sending socket) is the receiving end, named in the
 *      answer (InjectReply.inode); not accepted yet, the listener's path.
 *   3. The policy, process by process.  A local requester (SO_PEERCRED) may
 *      have the agent put only into a process its own user could trace: all
 *      of the process's user ids are the requester's -- root into any.  A
 *      daemon of another host (a certificate of the cluster) only into a
 *      process none of whose user ids is root's, unless the configuration
 *      says otherwise (`remote-inject all`, or `none`).  pid 1 never
 *      (inj_check).  Each refusal is answered and logged with its reason.
 *   4. A process that has the agent already is left as it is, and said --
 *      unless this daemon put it there for the same session and the
 *      request follows a traced send: then the agent is told to follow
 *      that receive too (tell_to_follow: `expect ...` into its control
 *      FIFO, which must be a FIFO of the process's user, reached without
 *      following a link), and the answer waits until the agent says in its
 *      meta that it expects it (at most a second): the sender's bytes go
 *      only after that.
 *   5. Its trace directory is STATE/sessions/SESSION/PID, made through
 *      descriptors, given to the process's user (the agent writes as it),
 *      0700; the directories above it are root's and only traversable by
 *      others (0711), so no user can see or touch another's trace.  For a
 *      pipe, the count of its bytes that its readers' agents share, of
 *      any users (readers_count: a sealed memfd of the daemon's, which each
 *      reader's agent asks for as it arms, spd_count); and, before any of
 *      that, the count its traced writers' agents share, whose value names
 *      the requester's send: another such memfd, whose descriptor goes with
 *      the answer (writers_count); for a UNIX stream socket, the same two
 *      counts, INODE the receiving socket's (agent/propagate.c, point 18).
 *   6. The agent goes in (inj_attach_agent) dormant until its event.  A
 *      request that follows a traced send (`follow`, from an agent): the
 *      receive of that send (expect=, agent/propagate.c), and the agent
 *      propagates on in the same session.  Otherwise the request's `on`,
 *      else "accept" when the receiving end is a listener (the connection
 *      waits to be accepted), "recv" for an established one.  The thread of
 *      the event is traced (threads=event).  It reads the analyses of the
 *      daemon's own repository (prepared=).
 *   7. For a listener, the holders are asked again, until a round finds no
 *      new process (a pre-forked worker may have inherited the socket
 *      meanwhile), at most SPD_INJECT_ROUNDS rounds.
 *
 * The traces stay the daemon's: when a process it put the agent into ends
 * without its agent finishing -- kill -9 in the middle of a request, a crash
 * before the handler ran -- the reaper (a thread, every 200 ms) completes
 * its meta the way `sptrace run` does for its child: the clocks at the end
 * and an "end" line, appended through the trace directory's descriptor, to
 * a regular file of the process's user only.  The rings are files: every
 * record written before the end is there.
 *
 * A channel whose receiving end is on another host (its destination is no
 * address of this network namespace) is not this daemon's to serve: a
 * local requester's request goes on, as it is, to the daemon of that
 * address over mutual TLS, and its answer comes back (the other host
 * applies its own policy to "a daemon of another host").  When that daemon
 * answers that one of its processes follows, its address joins the
 * session's peers (session.c), the hosts `sptrace collect` and stop reach
 * through this daemon.  The other host gets 3/4 of the time the requester
 * waits; one whose daemon did not answer is remembered for
 * SPD_UNREACHABLE_S and answered for at once meanwhile.  A request from
 * another host for an address that is not here is refused: no relays.
 */
#include "spd_daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codeanalysis.h"
#include "injector.h"
#include "registry.h"
#include "trace_format.h"

#define SPD_INJECT_ROUNDS 8
#define SPD_MAX_TARGETS 256

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Step 1. */
static int check_request(const Sptrace__Spd__InjectRequest *q, spd_channel *ch, sp_err *err)
{
	if (spd_session_check(q->session, err) != 0)
		return -1;
	if (!q->channel)
		return sp_fail(err, "an inject request without a channel");
	memset(ch, 0, sizeof *ch);
	ch->kind = (spd_channel_kind)q->channel->kind;
	ch->inode = q->channel->inode;
	if (ch->kind == SPD_CH_UNIX)
		ch->src_inode = q->channel->src_inode;
	if (ch->kind == SPD_CH_UNIX && !ch->inode && ch->src_inode &&
	    (!q->channel->path || strlen(q->channel->path) < sizeof ch->path)) {
		/* its peer found from src_inode (spd_inject), else the path */
		snprintf(ch->path, sizeof ch->path, "%s", q->channel->path ? q->channel->path : "");
		return 0;
	}
	if (ch->kind == SPD_CH_UNIX_DGRAM && !ch->inode && q->channel->path &&
	    q->channel->path[0] && strlen(q->channel->path) < sizeof ch->path) {
		snprintf(ch->path, sizeof ch->path, "%s", q->channel->path);
		return 0;
	}
	if (ch->kind == SPD_CH_PIPE || ch->kind == SPD_CH_UNIX || ch->kind == SPD_CH_UNIX_DGRAM)
		return ch->inode ? 0 : sp_fail(err, "a pipe or UNIX channel without its inode (or, "
					       "not accepted yet, its listener's path; a datagram's "
					       "path)");
	if (ch->kind != SPD_CH_TCP && ch->kind != SPD_CH_UDP)
		return sp_fail(err, "a channel of unknown kind %d", (int)q->channel->kind);
	const Sptrace__Spd__Endpoint *e[2] = { q->channel->src, q->channel->dst };
	spd_endpoint *out[2] = { &ch->src, &ch->dst };

	for (int i = 0; i < 2; i++) {
		if (!e[i] || (e[i]->addr.len != 4 && e[i]->addr.len != 16) || e[i]->port > 65535 ||
		    (i == 1 && e[i]->port == 0))
			return sp_fail(err, "the channel's %s is not an IPv4 or IPv6 address and port",
				       i ? "destination" : "source");
		out[i]->family = e[i]->addr.len == 4 ? AF_INET : AF_INET6;
		memcpy(out[i]->addr, e[i]->addr.data, e[i]->addr.len);
		out[i]->port = (uint16_t)e[i]->port;
	}
	if (ch->src.family != ch->dst.family)
		return sp_fail(err, "the channel's ends are of different address families");
	return 0;
}

/* The real, effective, saved and file-system uids of pid; 0, or -1. */
static int uids_of(pid_t pid, unsigned u[4])
{
	char path[64], buf[4096];
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strstr(buf, "\nUid:");
	return p && sscanf(p + 5, "%u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4 ? 0 : -1;
}

/* Step 3: may the requester on `c` have the agent put into pid?  0, or -1
 * and *why. */
static int allowed(const spd_daemon *d, const spd_conn *c, pid_t pid, const unsigned u[4],
		   char *why, size_t len)
{
	if (!c->remote) {
		if (c->uid == 0)
			return 0;
		for (int i = 0; i < 4; i++)
			if (u[i] != c->uid) {
				snprintf(why, len, "pid %d runs as uid %u and the requester is uid %u: "
					 "a user may have only its own processes traced", (int)pid,
					 u[i], (unsigned)c->uid);
				return -1;
			}
		return 0;
	}
	if (d->remote_inject == SPD_REMOTE_NONE) {
		snprintf(why, len, "this host takes no inject request from other hosts "
			 "(remote-inject none)");
		return -1;
	}
	for (int i = 0; i < 4 && d->remote_inject == SPD_REMOTE_USERS; i++)
		if (u[i] == 0) {
			snprintf(why, len, "pid %d runs as root, and other hosts may have only other "
				 "users' processes traced here (remote-inject users)", (int)pid);
			return -1;
		}
	return 0;
}

/* Step 5: SESSION/PID, new, the process's user's; its absolute path. */
static int target_dir(const spd_daemon *d, const char *session, pid_t pid, uid_t uid, gid_t gid,
		      char *abs, size_t len, sp_err *err)
{
	char name[32];
	struct stat st;
	int sfd = spd_session_open(d, session, 1, err), fd;

	if (sfd < 0)
		return -1;
	snprintf(name, sizeof name, "%d", (int)pid);
	if (mkdirat(sfd, name, 0700) != 0) {
		close(sfd);
		return sp_fail(err, "%s/sessions/%s/%s: %s", d->state_dir, session, name,
			       errno == EEXIST ? "exists already (this pid was traced in this "
			       "session before)" : strerror(errno));
	}
	fd = openat(sfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(sfd);
	if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != geteuid() ||
	    fchown(fd, uid, gid) != 0 || fchmod(fd, 0700) != 0) {
		if (fd >= 0)
			close(fd);
		return sp_fail(err, "%s/sessions/%s/%s: cannot give it to uid %u: %s", d->state_dir,
			       session, name, (unsigned)uid, strerror(errno));
	}
	close(fd);
	snprintf(abs, len, "%s/sessions/%s/%s", d->state_abs, session, name);
	return 0;
}

/* The receive a follow request's agents start at, in the agent's words
 * (agent/propagate.c, point 5): "tcp SRC SPORT DST DPORT OFFSET|-", "udp
 * SRC SPORT DST DPORT HASH|-" (the datagram's content hash, hexadecimal),
 * "pipe INODE [OFFSET]", "unix INODE [OFFSET]" (the receiving socket's; OFFSET
 * the writer's count of its first traced byte), "unixfrom INODE" (a
 * connection not accepted yet: the socket whose peer is INODE), "unixdgram
 * INODE HASH|-" (a UNIX datagram to socket INODE, by its content hash).  A TCP
 * line ends in " oob" when the sender would mark the send by an urgent
 * byte (point 9); a UDP line in " ipopt SEQ" when the datagram would carry
 * the IP option SEQ (point 13: `ipopt`, the probe said options arrive). */
static void expect_line(const Sptrace__Spd__InjectRequest *q, const spd_channel *ch,
			uint64_t offset, bool ipopt, char *out, size_t len)
{
	char s[INET6_ADDRSTRLEN], t[INET6_ADDRSTRLEN], off[24] = "-";

	out[0] = '\0';
	if (ch->kind == SPD_CH_UNIX && !ch->inode) {
		snprintf(out, len, "unixfrom %llu", (unsigned long long)ch->src_inode);
		return;
	}
	if (ch->kind == SPD_CH_PIPE || ch->kind == SPD_CH_UNIX) {
		if (q->at_offset)       /* the writers' count, for the reader's (agent) */
			snprintf(off, sizeof off, " %llu", (unsigned long long)offset);
		snprintf(out, len, "%s %llu%s", ch->kind == SPD_CH_PIPE ? "pipe" : "unix",
			 (unsigned long long)ch->inode, q->at_offset ? off : "");
		return;
	}
	if (ch->kind == SPD_CH_UNIX_DGRAM) {
		if (q->at_offset)
			snprintf(off, sizeof off, "%llx", (unsigned long long)offset);
		if (ch->inode)
			snprintf(out, len, "unixdgram %llu %s", (unsigned long long)ch->inode, off);
		return;
	}
	if (ch->kind != SPD_CH_TCP && ch->kind != SPD_CH_UDP)
		return;
	inet_ntop(ch->src.family, ch->src.addr, s, sizeof s);
	inet_ntop(ch->dst.family, ch->dst.addr, t, sizeof t);
	if (q->at_offset)
		snprintf(off, sizeof off, ch->kind == SPD_CH_TCP ? "%llu" : "%llx",
			 (unsigned long long)offset);
	snprintf(out, len, "%s %s %u %s %u %s%s", ch->kind == SPD_CH_TCP ? "tcp" : "udp", s,
		 ch->src.port, t, ch->dst.port, off,
		 ch->kind == SPD_CH_TCP && q->mark && strcmp(q->mark, "oob") == 0 ? " oob" : "");
	if (ipopt)
		snprintf(out + strlen(out), len - strlen(out), " ipopt %u", q->mark_seq);
}

static unsigned long long start_time(pid_t pid)
{
	char p[16];

	snprintf(p, sizeof p, "%d", (int)pid);
	return sp_proc_start_time(p);
}

/* Step 4: the trace directory this daemon gave pid in `session`, if any. */
static bool traced_here(spd_daemon *d, pid_t pid, const char *session, char *dir, size_t len)
{
	unsigned long long start = start_time(pid);
	bool found = false;

	pthread_mutex_lock(&d->lock);
	for (size_t i = 0; i < d->ntraced && !found; i++)
		if (d->traced[i].pid == pid && d->traced[i].start == start &&
		    strcmp(d->traced[i].session, session) == 0) {
			snprintf(dir, len, "%s", d->traced[i].dir);
			found = true;
		}
	pthread_mutex_unlock(&d->lock);
	return found;
}

/* The reaper: a process gone without its agent's "end" line gets one. */
static void complete_meta(const spd_traced *t)
{
	char buf[65536];
	struct stat st;
	struct timespec ts;
	uint32_t lo, hi;
	ssize_t n;
	int dfd = open(t->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd;

	if (dfd < 0)
		return;
	fd = openat(dfd, "meta", O_RDWR | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	close(dfd);
	if (fd < 0)
		return;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != t->uid ||
	    st.st_size > (off_t)TRACE_META_MAX_BYTES) {
		close(fd);
		return;
	}
	/* the agent's own end line, if it wrote one, is in the last lines */
	off_t from = st.st_size > (off_t)sizeof buf - 1 ? st.st_size - (off_t)sizeof buf + 1 : 0;

	n = pread(fd, buf, sizeof buf - 1, from);
	buf[n > 0 ? n : 0] = '\0';
	if (!strstr(buf, "\n" TRACE_META_END " ")) {
		__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
		clock_gettime(CLOCK_MONOTONIC, &ts);
		dprintf(fd, "%s %llu\n%s %llu\n%s the process ended before its agent finished "
			"(killed, or it crashed); spdaemon completed the trace\n", TRACE_META_TSC1,
			(unsigned long long)hi << 32 | lo, TRACE_META_MONO1,
			(unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec,
			TRACE_META_END);
		spd_log("pid %d (session %s) is gone without its agent finishing: its trace in %s "
			"is completed", (int)t->pid, t->session, t->dir);
	}
	close(fd);
}

static void *reaper(void *arg)
{
	spd_daemon *d = arg;

	for (;;) {
		usleep(200000);
		pthread_mutex_lock(&d->lock);
		for (size_t i = 0; i < d->ntraced; i++) {
			spd_traced *t = &d->traced[i];

			if (t->gone || start_time(t->pid) == t->start)
				continue;
			t->gone = 1;
			complete_meta(t);
		}
		pthread_mutex_unlock(&d->lock);
	}
	return NULL;
}

static void remember(spd_daemon *d, pid_t pid, uid_t uid, const char *session, const char *dir)
{
	unsigned long long start = start_time(pid);

	pthread_mutex_lock(&d->lock);
	if (!d->reaper) {
		pthread_t th;

		d->reaper = pthread_create(&th, NULL, reaper, d) == 0;
		if (d->reaper)
			pthread_detach(th);
	}
	if (!d->traced)
		d->traced = calloc(SPD_MAX_TRACED, sizeof *d->traced);
	if (d->traced) {
		size_t i = d->ntraced < SPD_MAX_TRACED ? d->ntraced++ : (size_t)pid % SPD_MAX_TRACED;
		spd_traced *e = &d->traced[i];

		e->pid = pid;
		e->uid = uid;
		e->gone = 0;
		e->start = start;
		snprintf(e->session, sizeof e->session, "%s", session);
		snprintf(e->dir, sizeof e->dir, "%s", dir);
	}
	pthread_mutex_unlock(&d->lock);
}

/* Does the end of the meta in directory dfd say `want` (waiting up to
 * `tries` ms for it)?  With `also`: and that too, once it does. */
static bool meta_says(int dfd, const char *want, const char *also, int tries)
{
	char buf[65536];
	struct stat st;
	ssize_t n;

	for (int i = 0; i < tries; i++) {
		int mfd = openat(dfd, "meta", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

		if (mfd >= 0 && fstat(mfd, &st) == 0 && S_ISREG(st.st_mode)) {
			off_t from = st.st_size > (off_t)sizeof buf - 1 ? st.st_size - (off_t)sizeof buf + 1
				     : 0;

			n = pread(mfd, buf, sizeof buf - 1, from);
			buf[n > 0 ? n : 0] = '\0';
			close(mfd);
			if (strstr(buf, want))
				return !also || strstr(buf, also);
		} else if (mfd >= 0) {
			close(mfd);
		}
		usleep(1000);
	}
	return false;
}

/* Points 9 and 13 of agent/propagate.c: did the agent in `dir`, told to
 * expect LINE, take the mark ("mark WORD LINE" in its meta: oob, ipopt)? */
static bool takes_mark(const char *dir, const char *line, const char *word)
{
	char want[300], also[320];
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	bool yes;

	if (dfd < 0)
		return false;
	snprintf(want, sizeof want, "expect %s\n", line);
	snprintf(also, sizeof also, "mark %s %s\n", word, line);
	yes = meta_says(dfd, want, also, 1000);
	close(dfd);
	return yes;
}

/* Step 4: `expect LINE` into the agent's FIFO, then wait for its meta to
 * say "expect LINE".  0, or -1 and *why.  (Not inlined: gcc cannot see that
 * the caller's dir and why, parts of one allocation, do not overlap.) */
static __attribute__((noinline)) int tell_to_follow(const char *dir, uid_t uid, const char *line, char *why, size_t len)
{
	char want[256];
	int dfd;

	if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		snprintf(why, len, "%s: %s", dir, strerror(errno));
		return -1;
	}
	snprintf(want, sizeof want, "expect %s\n", line);
	if (spd_agent_tell(dfd, uid, want) != 0) {
		snprintf(why, len, errno == EPERM ? "%s/control is not the agent's FIFO (uid %u): not "
			 "told to follow" : "%s/control: cannot write (uid %u): is the agent still "
			 "there?", dir, (unsigned)uid);
		close(dfd);
		return -1;
	}
	if (meta_says(dfd, want, NULL, 1000)) {
		close(dfd);
		return 0;
	}
	snprintf(why, len, "the agent did not take the receive to follow within a second");
	close(dfd);
	return -1;
}

/*
 * Step 5, the counts a pipe's or a UNIX stream socket's traced ends share
 * (agent/propagate.c, points 6 and 15 to 18): each a memfd of the daemon's,
 * 64 bytes, sealed so that nobody can shrink or grow it (an agent's mapping
 * never faults), kept for the daemon's life (one per session, channel and
 * side, at most SPD_MAX_COUNTS), its descriptor passed (SCM_RIGHTS) only to
 * a local asker that holds the channel's end of that side: the writers'
 * count (writers_count) with the answer to a traced send's request, the
 * readers' (readers_count) with the answer to a reader's agent's
 * CountRequest (spd_count).  Read here with pread only, never mapped.
 */
#define SPD_MAX_COUNTS 256
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	char session[65];
	int kind;                        /* SPD_CH_PIPE, SPD_CH_UNIX */
	int readers;                     /* its readers' (1) or its writers' (0) */
	uint64_t inode;                  /* the pipe's, the receiving socket's */
	int fd;
} counts[SPD_MAX_COUNTS];
static size_t ncounts;

/* Under counts_lock: the count's index, or -1. */
static int count_find(const char *session, int kind, uint64_t inode, int readers)
{
	for (size_t i = 0; i < ncounts; i++)
		if (counts[i].kind == kind && counts[i].inode == inode &&
		    counts[i].readers == readers && strcmp(counts[i].session, session) == 0)
			return (int)i;
	return -1;
}

/* Under counts_lock: a new count holding v; its index, or -1 and why. */
static int count_make(const char *session, int kind, uint64_t inode, int readers,
		      const uint64_t v[8], char *why, size_t len)
{
	int m = ncounts < SPD_MAX_COUNTS ? memfd_create("sptrace-count", MFD_CLOEXEC |
							 MFD_ALLOW_SEALING) : -1;

	if (m < 0 || pwrite(m, v, 64, 0) != 64 ||
	    fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
		snprintf(why, len, "%s", m < 0 && ncounts == SPD_MAX_COUNTS ? "the daemon holds as "
			 "many counts as it keeps" : strerror(errno));
		if (m >= 0)
			close(m);
		return -1;
	}
	snprintf(counts[ncounts].session, sizeof counts[ncounts].session, "%s", session);
	counts[ncounts].kind = kind;
	counts[ncounts].inode = inode;
	counts[ncounts].readers = readers;
	counts[ncounts].fd = m;
	return (int)ncounts++;
}

/* Step 5, a channel's readers: the count of its bytes that its readers'
 * agents share (agent/propagate.c, point 6: pre-forked readers of one pipe
 * or of one UNIX stream socket, INODE the receiving socket's, point 18), of
 * any users -- 64 bytes of zeros but the inode (word 1), which the first
 * reader's agent to arm sets to the writer's offset.  Made once per session
 * and channel, when a follow request names the writer's offset (`expect`:
 * "pipe|unix INODE OFFSET"); each reader's agent asks for it (spd_count). */
static void readers_count(const char *session, const char *expect)
{
	unsigned long long ino, off;
	uint64_t v[8] = { 0 };
	char why[200];
	int kind;

	if (!expect || (sscanf(expect, "pipe %llu %llu", &ino, &off) != 2 &&
			sscanf(expect, "unix %llu %llu", &ino, &off) != 2))
		return;
	kind = expect[0] == 'p' ? SPD_CH_PIPE : SPD_CH_UNIX;
	v[1] = ino;
	pthread_mutex_lock(&counts_lock);
	if (count_find(session, kind, ino, 1) < 0 &&
	    count_make(session, kind, ino, 1, v, why, sizeof why) < 0)
		spd_log("inject session %s: %.4s %llu: no count of its readers: %s; they count its "
			"bytes alone", session, expect, ino, why);
	pthread_mutex_unlock(&counts_lock);
}

/* Steps 3 to 6 for one process: fills t (its strings are the caller's). */
static void inject_one(spd_daemon *d, spd_conn *c, const Sptrace__Spd__InjectRequest *q,
		       const char *on, const char *expect, pid_t pid,
		       Sptrace__Spd__InjectReply__Target *t, char *dir, size_t dirlen, char *why,
		       size_t whylen)
{
	unsigned u[4];
	struct stat st;
	char proc[32];
	inj_result r;
	sp_err err;

	t->pid = pid;
	t->dir = dir;
	t->why = why;
	dir[0] = why[0] = '\0';
	snprintf(proc, sizeof proc, "/proc/%d", (int)pid);
	if (uids_of(pid, u) != 0 || stat(proc, &st) != 0) {
		snprintf(why, whylen, "pid %d is gone", (int)pid);
		return;
	}
	if (allowed(d, c, pid, u, why, whylen) != 0)
		return;
	if (inj_check(pid, &err) != 0) {
		snprintf(why, whylen, "%s", err.msg);
		return;
	}
	readers_count(q->session, expect);
	if (inj_has_mapping(pid, "sptrace-agent") == 1) {
		if (expect && traced_here(d, pid, q->session, dir, dirlen)) {
			if (tell_to_follow(dir, st.st_uid, expect, why, whylen) == 0) {
				t->following = 1;
				snprintf(why, whylen, "had the agent of session %s: follows this "
					 "receive too", q->session);
			}
			return;
		}
		snprintf(why, whylen, "pid %d has the agent already", (int)pid);
		return;
	}
	if (target_dir(d, q->session, pid, st.st_uid, st.st_gid, dir, dirlen, &err) != 0) {
		snprintf(why, whylen, "%s", err.msg);
		return;
	}
	char wait[16];

	snprintf(wait, sizeof wait, "%u", q->wait_ms);
	inj_agent a = { .so_path = d->agent, .dir = dir, .on = expect ? "recv" : on,
			.threads = "event", .prepared = ca_repo_default_dir(), .timeout = 60,
			.session = expect ? q->session : NULL, .wait = expect && q->wait_ms ? wait : NULL,
			.mark = expect && q->mark && *q->mark ? q->mark : NULL, .expect = expect };

	if (inj_attach_agent(pid, &a, &r, &err) != 0) {
		snprintf(why, whylen, "%s", err.msg);
		return;
	}
	remember(d, pid, st.st_uid, q->session, dir);
	t->injected = 1;
	snprintf(why, whylen, "agent in after %.1f ms (thread %d stopped %.2f ms)", r.total_ms,
		 (int)r.tid, r.pause_ms);
}

/* Is `ep` an address of this network namespace (loopback included)? */
static bool local_address(const spd_endpoint *ep)
{
	static const uint8_t v6_loopback[16] = { [15] = 1 };
	struct ifaddrs *ifs, *i;
	bool found = false;

	if ((ep->family == AF_INET && ep->addr[0] == 127) ||
	    (ep->family == AF_INET6 && memcmp(ep->addr, v6_loopback, 16) == 0))
		return true;
	if (getifaddrs(&ifs) != 0)
		return true;         /* cannot tell: serve it here rather than loop */
	for (i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != ep->family)
			continue;
		if (ep->family == AF_INET)
			found = memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, ep->addr,
				       4) == 0;
		else
			found = memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, ep->addr,
				       16) == 0;
	}
	freeifaddrs(ifs);
	return found;
}

static bool following(const Sptrace__Spd__Frame *rep)
{
	for (size_t i = 0; i < rep->inject_reply->n_targets; i++)
		if (rep->inject_reply->targets[i]->injected || rep->inject_reply->targets[i]->following)
			return true;
	return false;
}

/*
 * Hosts whose daemon did not answer, remembered for SPD_UNREACHABLE_S: a
 * traced program that opens connections to a host without a spdaemon (a
 * database, a web API elsewhere) asks at the first send of each, and each
 * would wait for the connection to the daemon there to time out.
 */
#define SPD_UNREACHABLE_S 30
#define SPD_UNREACHABLE_MAX 64

static struct {
	char host[INET6_ADDRSTRLEN];
	char why[sizeof ((sp_err *)0)->msg];
	double until;
} unreachable[SPD_UNREACHABLE_MAX];
static unsigned unreachable_next;
static pthread_mutex_t unreachable_lock = PTHREAD_MUTEX_INITIALIZER;

/* Is host remembered?  Then true and why, in err. */
static bool host_unreachable(const char *host, sp_err *err)
{
	bool found = false;

	pthread_mutex_lock(&unreachable_lock);
	for (unsigned i = 0; i < SPD_UNREACHABLE_MAX && !found; i++)
		if (strcmp(unreachable[i].host, host) == 0 && unreachable[i].until > now_ms()) {
			snprintf(err->msg, sizeof err->msg, "%.800s (said %.0f s ago; asked again "
				 "after %d s)", unreachable[i].why, SPD_UNREACHABLE_S -
				 (unreachable[i].until - now_ms()) / 1000, SPD_UNREACHABLE_S);
			found = true;
		}
	pthread_mutex_unlock(&unreachable_lock);
	return found;
}

static void host_failed(const char *host, const char *why)
{
	pthread_mutex_lock(&unreachable_lock);
	for (unsigned i = 0; i < SPD_UNREACHABLE_MAX; i++)
		if (strcmp(unreachable[i].host, host) == 0 && unreachable[i].until > now_ms()) {
			pthread_mutex_unlock(&unreachable_lock);
			return;          /* remembered already: `why` says so */
		}
	unsigned i = unreachable_next++ % SPD_UNREACHABLE_MAX;

	snprintf(unreachable[i].host, sizeof unreachable[i].host, "%s", host);
	snprintf(unreachable[i].why, sizeof unreachable[i].why, "%s", why);
	unreachable[i].until = now_ms() + SPD_UNREACHABLE_S * 1000.0;
	pthread_mutex_unlock(&unreachable_lock);
}

/*
 * Connections to other hosts' daemons are kept, one per host, for
 * SPD_KEPT_S after their last answer: a traced program's every new
 * connection to a host asks its daemon again, and a TLS handshake each time
 * costs both daemons (about 3 ms here).  A kept connection is used by one
 * request at a time (taken out while in use); one the other end closed
 * meanwhile is replaced by a new one, once.  The other daemon ends an idle
 * connection after 60 s of silence: SPD_KEPT_S stays well below.
 */
#define SPD_KEPT_S 20
#define SPD_KEPT_MAX 16

static struct {
	char host[INET6_ADDRSTRLEN];     /* "": free */
	spd_conn c;
	double since;
} kept[SPD_KEPT_MAX];
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static bool kept_take(const char *host, spd_conn *out)
{
	bool found = false;

	pthread_mutex_lock(&kept_lock);
	for (unsigned i = 0; i < SPD_KEPT_MAX; i++) {
		if (!kept[i].host[0])
			continue;
		if (now_ms() - kept[i].since > SPD_KEPT_S * 1000.0) {
			spd_conn_close(&kept[i].c);      /* stale, any host's */
			kept[i].host[0] = '\0';
		} else if (!found && strcmp(kept[i].host, host) == 0) {
			*out = kept[i].c;
			kept[i].host[0] = '\0';
			found = true;
		}
	}
	pthread_mutex_unlock(&kept_lock);
	return found;
}

void spd_inject_close_kept(void)
{
	pthread_mutex_lock(&kept_lock);
	for (unsigned i = 0; i < SPD_KEPT_MAX; i++)
		if (kept[i].host[0]) {
			spd_conn_close(&kept[i].c);
			kept[i].host[0] = '\0';
		}
	pthread_mutex_unlock(&kept_lock);
}

static void kept_put(const char *host, spd_conn *c)
{
	unsigned i;

	pthread_mutex_lock(&kept_lock);
	for (i = 0; i < SPD_KEPT_MAX && kept[i].host[0]; i++)
		if (strcmp(kept[i].host, host) == 0)
			break;                           /* one per host */
	if (i < SPD_KEPT_MAX && !kept[i].host[0]) {
		snprintf(kept[i].host, sizeof kept[i].host, "%s", host);
		kept[i].c = *c;
		kept[i].since = now_ms();
		c = NULL;
	}
	pthread_mutex_unlock(&kept_lock);
	if (c)
		spd_conn_close(c);
}

/* The request, as it is, to the daemon of the channel's destination; its
 * answer back to the requester under the requester's id. */
/*
 * The probe (agent/propagate.c, point 12): whether IP options cross the
 * network from the requester's host to this one, before a program's
 * datagram carries one.
 *
 *  1. The daemon that forwards a follow request for a UDP datagram marked
 *     by an IP option (mark "oob", mark_seq, IPv4) first sends the other
 *     host's daemon, at its UDP port (the same number as its TLS port), a
 *     datagram "sptrace probe SEQ" carrying the option with SEQ, from its
 *     own socket: the way the program's datagram will go.
 *  2. The other daemon reads its UDP port (IP_RECVOPTS) when the request
 *     comes, keeping the last SPD_PROBES probes seen, and waits for SEQ at
 *     most PROBE_WAIT_MS: the option is used only if SEQ came and came with
 *     it.  Else the expectation names no option, its agents match by content
 *     hash, and the log says why.
 *  3. A request from this host for a datagram to this host needs no probe.
 *
 * A forged probe can only make a datagram carry the option where it does
 * not arrive; its receivers then match it by content hash.
 */
#define SPD_PROBES 64
#define PROBE_WAIT_MS 300
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint32_t seq;
	int opts;
} probes[SPD_PROBES];
static unsigned nprobes;

static bool wants_ipopt(const Sptrace__Spd__InjectRequest *q, const spd_channel *ch)
{
	return q->follow && ch->kind == SPD_CH_UDP && q->mark && strcmp(q->mark, "oob") == 0 &&
	       q->mark_seq && ch->dst.family == AF_INET;
}

/* Step 1. */
static void probe_send(spd_daemon *d, const char *host, uint32_t seq)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)d->port) };
	uint8_t o[SP_IPMARK_LEN];
	char text[40];
	int n = snprintf(text, sizeof text, "sptrace probe %u", seq);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	sp_ipmark_build(o, seq);
	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
	    setsockopt(fd, IPPROTO_IP, IP_OPTIONS, o, sizeof o) != 0 ||
	    sendto(fd, text, (size_t)n, 0, (struct sockaddr *)&sa, sizeof sa) != n)
		spd_log("the probe of IP options to %s:%d/udp was not sent: %s", host, d->port,
			strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Step 2: 1 when probe seq came with its option, 0 without, -1 not yet. */
static int probe_came(spd_daemon *d, uint32_t seq)
{
	double until = now_ms() + PROBE_WAIT_MS;
	int found = -1;

	if (d->probe_fd < 0)
		return -1;
	pthread_mutex_lock(&probe_lock);
	for (;;) {
		for (;;) {
			char buf[64];
			union {
				struct cmsghdr h;
				char b[CMSG_SPACE(40)];
			} ctl;
			struct iovec v = { buf, sizeof buf - 1 };
			struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b,
					     .msg_controllen = sizeof ctl.b };
			ssize_t n = recvmsg(d->probe_fd, &mh, MSG_DONTWAIT);
			unsigned s;
			uint32_t os;
			int opts = 0;

			if (n < 0)
				break;
			buf[n] = '\0';
			if (sscanf(buf, "sptrace probe %u", &s) != 1 || !s)
				continue;
			for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
				if (cm->cmsg_level == IPPROTO_IP && (cm->cmsg_type == IP_RECVOPTS ||
								     cm->cmsg_type == IP_OPTIONS) &&
				    sp_ipmark_find(CMSG_DATA(cm), cm->cmsg_len - CMSG_LEN(0), &os) &&
				    os == s)
					opts = 1;
			probes[nprobes % SPD_PROBES].seq = s;
			probes[nprobes++ % SPD_PROBES].opts = opts;
		}
		for (int i = 0; i < SPD_PROBES && found < 0; i++)
			if (probes[i].seq == seq)
				found = probes[i].opts;
		if (found >= 0 || now_ms() >= until)
			break;
		struct pollfd p = { .fd = d->probe_fd, .events = POLLIN };

		poll(&p, 1, 20);
	}
	pthread_mutex_unlock(&probe_lock);
	return found;
}

/* May this request's datagram carry the option (steps 2 and 3)? */
static bool ipopt_ok(spd_daemon *d, spd_conn *c, const Sptrace__Spd__InjectRequest *q,
		     const spd_channel *ch)
{
	int came;

	if (!wants_ipopt(q, ch))
		return false;
	if (!c->remote)
		return true;
	came = probe_came(d, q->mark_seq);
	if (came != 1)
		spd_log("%s: inject session %s: %s: the datagram is matched by its content hash",
			c->peer, q->session, came == 0 ? "the probe of IP options came without them"
			: d->probe_fd < 0 ? "no UDP port for probes of IP options"
			: "no probe of IP options came within 300 ms");
	return came == 1;
}

static void forward(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, const spd_channel *ch,
		    sp_err *err)
{
	char host[INET6_ADDRSTRLEN];
	Sptrace__Spd__Frame *rep = NULL;
	uint64_t id = req->id;
	spd_conn far;
	int r;
	double t0 = now_ms(), tc;
	/* the requester waits wait_ms: the other host gets 3/4 of it, so that
	 * one that does not answer is remembered before the requester's next
	 * send asks again */
	double timeout = req->inject->wait_ms ? req->inject->wait_ms * 0.75 / 1000 : 10;

	if (timeout > 10)
		timeout = 10;
	inet_ntop(ch->dst.family, ch->dst.addr, host, sizeof host);
	bool reused = kept_take(host, &far);

	if (reused)
		spd_conn_timeout(&far, timeout);
again:
	if (!reused && (host_unreachable(host, err) || !spd_tls_client(d, err) ||
		      spd_tls_connect(d->tls_client, host, d->port, timeout, &far, err) != 0)) {
		host_failed(host, err->msg);
		spd_send_error(c, id, err->msg);
		spd_log("%s: inject session %s for %s: %s", c->peer, req->inject->session, host,
			err->msg);
		return;
	}
	tc = now_ms() - t0;
	if (wants_ipopt(req->inject, ch))
		probe_send(d, host, req->inject->mark_seq);
	if (spd_frame_write(&far, req, err) != 0) {
		r = -2;                  /* nothing reached the other host */
	} else {
		r = spd_frame_read(&far, &rep, err);
	}
	if (reused && (r == -2 || r == 0)) {
		/* a kept connection the other end closed meanwhile: a new one */
		spd_conn_close(&far);
		reused = false;
		goto again;
	}
	if (r == 1)
		kept_put(host, &far);
	else
		spd_conn_close(&far);
	if (r != 1) {
		if (r == 0)
			sp_fail(err, "the spdaemon of %s closed the connection without an answer", host);
		spd_send_error(c, id, err->msg);
		spd_log("%s: inject session %s for %s: %s", c->peer, req->inject->session, host,
			err->msg);
		return;
	}
	spd_log("%s: inject session %s: forwarded to the spdaemon of %s, which answered with %s "
		"in %.1f ms (%.1f ms of it the TLS connection%s)", c->peer, req->inject->session,
		host, rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY ?
		"the processes it found" : "an error", now_ms() - t0, tc,
		reused ? ", kept from before" : "");
	/* That host takes part in the session now, if one of its processes
	 * follows: `sptrace collect` asks it. */
	if (rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY && following(rep) &&
	    spd_session_add_peer(d, req->inject->session, host, err) != 0)
		spd_log("%s: inject session %s: %s", c->peer, req->inject->session, err->msg);
	rep->id = id;
	spd_frame_write(c, rep, err);
	spd_frame_free(rep);
}

/* Step 5, a pipe's writers: the count of the pipe's bytes that its traced
 * writers' agents share (agent/msgs.c, point 6; agent/propagate.c, points
 * 15 to 18): writers that are not one process and its forked children --
 * programs exec'd apart, processes that opened a named pipe each, of any
 * users -- name each byte alike, as its reader sees it.  64 bytes: the
 * count, then the pipe's inode, in a memfd of the daemon's, sealed so that
 * nobody can shrink or grow it (an agent's mapping never faults), kept for
 * the daemon's life in `counts` (one per session and channel, at most
 * SPD_MAX_COUNTS).  The first request for the pipe in the session makes
 * it, holding the requester's own count (the request's offset: the bytes
 * queued ahead of its send); each later one takes the count as it stands
 * now as its send's first byte, which the readers await instead of the
 * request's offset.  A UNIX stream socket's writers the same way (point
 * 18), keyed by the receiving socket's inode (the bytes into it).  Read
 * under one lock with pread only (never mapped here).  Only a local
 * requester that holds the pipe's write end (or the sending socket it
 * names) itself gets it: its descriptor goes with the answer (*fd,
 * spd_frame_write_fd), logged with who got it; another (remote, or not a
 * writer) gets none and counts alone.  Answers *fd (the table's: not to be
 * closed) or -1, the count's name (for the logs) and *offset. */
static void writers_count(const spd_conn *c, const Sptrace__Spd__InjectRequest *q,
			  const spd_channel *ch, char *label, size_t len, uint64_t *offset,
			  int *fd)
{
	uint64_t v[8] = { q->offset, ch->inode };
	const char *kind = ch->kind == SPD_CH_PIPE ? "pipe" : "unix";
	char why[200];
	int i;

	label[0] = '\0';
	*fd = -1;
	*offset = q->offset;
	if ((ch->kind != SPD_CH_PIPE && (ch->kind != SPD_CH_UNIX || !ch->inode || !ch->src_inode)) ||
	    !q->follow || !q->at_offset || c->remote)
		return;
	if (ch->kind == SPD_CH_PIPE ? !spd_pid_holds(c->pid, ch->inode, true, SPD_END_WRITE)
	    : !spd_pid_holds(c->pid, ch->src_inode, false, SPD_END_ANY)) {
		spd_log("%s: inject session %s: pid %d holds no write end of %s %llu: no count "
			"of its writers", c->peer, q->session, (int)c->pid, kind,
			(unsigned long long)ch->inode);
		return;
	}
	snprintf(label, len, "session %s's %s-%llu-sent", q->session, kind,
		 (unsigned long long)ch->inode);
	pthread_mutex_lock(&counts_lock);
	if ((i = count_find(q->session, (int)ch->kind, ch->inode, 0)) < 0) {
		if ((i = count_make(q->session, (int)ch->kind, ch->inode, 0, v, why,
				    sizeof why)) < 0) {
			spd_log("%s: inject session %s: %s %llu: %s; pid %d counts its bytes alone",
				c->peer, q->session, kind, (unsigned long long)ch->inode, why,
				(int)c->pid);
			label[0] = '\0';
			goto out;
		}
	} else {
		/* the agents add to it atomically: two equal reads are not torn */
		uint64_t a = 0, b = 1;

		for (int k = 0; k < 100 && a != b; k++)
			if (pread(counts[i].fd, &a, 8, 0) != 8 || pread(counts[i].fd, &b, 8, 0) != 8)
				break;
		if (a != b) {
			label[0] = '\0';
			goto out;
		}
		*offset = a;
	}
	*fd = counts[i].fd;
	spd_log("%s: inject session %s: %s %llu: pid %d (uid %u) gets the count its writers "
		"share (%s): its send is byte %llu", c->peer, q->session, kind,
		(unsigned long long)ch->inode, (int)c->pid, (unsigned)c->uid, label,
		(unsigned long long)*offset);
out:
	pthread_mutex_unlock(&counts_lock);
}

/* A reader's agent asks for its channel's readers' count (readers_count):
 * only a local requester holding the channel's receiving end -- a pipe's
 * read end, the receiving UNIX socket -- gets its descriptor (answered
 * with the CountReply), which the daemon made when it had that channel's
 * readers follow a traced send in the session; anyone else an Error, and
 * the agent counts alone.  Logged.  Served on the connection's own thread
 * while another thread of the daemon may be injecting the asker. */
void spd_count(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	const Sptrace__Spd__CountRequest *q = req->count;
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__CountReply rep = SPTRACE__SPD__COUNT_REPLY__INIT;
	const Sptrace__Spd__Channel *ch = q->channel;
	bool is_pipe = ch && ch->kind == SPTRACE__SPD__CHANNEL__KIND__PIPE;
	unsigned long long ino = ch ? (unsigned long long)ch->inode : 0;
	char label[160];
	int i, fd = -1;

	(void)d;
	err->msg[0] = '\0';
	if (c->remote)
		sp_fail(err, "a count goes to a local agent only");
	else if (spd_session_check(q->session, err) != 0)
		;
	else if (!ch || !ch->inode || (!is_pipe && ch->kind != SPTRACE__SPD__CHANNEL__KIND__UNIX))
		sp_fail(err, "a count request names a pipe or a UNIX stream socket by its inode");
	else if (is_pipe ? !spd_pid_holds(c->pid, ch->inode, true, SPD_END_READ)
		 : !spd_pid_holds(c->pid, ch->inode, false, SPD_END_ANY))
		sp_fail(err, "pid %d holds no %s %llu: no count of its readers", (int)c->pid,
			is_pipe ? "read end of pipe" : "UNIX socket", ino);
	if (!err->msg[0]) {
		pthread_mutex_lock(&counts_lock);
		i = count_find(q->session, is_pipe ? SPD_CH_PIPE : SPD_CH_UNIX, ch->inode, 1);
		fd = i >= 0 ? counts[i].fd : -1;
		pthread_mutex_unlock(&counts_lock);
		if (fd < 0)
			sp_fail(err, "session %s has no count of the readers of %s %llu (the daemon "
				"makes one when it has them follow a traced send)", q->session,
				is_pipe ? "pipe" : "unix socket", ino);
	}
	if (fd < 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: count refused: %s", c->peer, err->msg);
		return;
	}
	snprintf(label, sizeof label, "session %s's %s-%llu-read", q->session, is_pipe ? "pipe" :
		 "unix", ino);
	rep.count = label;
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_COUNT_REPLY;
	f.count_reply = &rep;
	if (spd_frame_write_fd(c, &f, fd, err) == 0)
		spd_log("%s: pid %d (uid %u) gets the count the readers of %s %llu share (%s)",
			c->peer, (int)c->pid, (unsigned)c->uid, is_pipe ? "pipe" : "unix socket", ino,
			label);
}

static bool seen(const pid_t *v, size_t n, pid_t pid)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == pid)
			return true;
	return false;
}

void spd_inject(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	static const size_t dirlen = 4200, whylen = 1100;
	Sptrace__Spd__InjectRequest *q = req->inject;
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__InjectReply rep = SPTRACE__SPD__INJECT_REPLY__INIT;
	Sptrace__Spd__InjectReply__Target *targets = NULL, **tp = NULL;
	pid_t done[SPD_MAX_TARGETS];
	char *strings = NULL;
	size_t ndone = 0;
	spd_channel ch;
	char expect[300], sent[160];
	uint64_t offset;
	int count_fd;
	double t0 = now_ms(), holders_ms = 0, inject_ms = 0;
	int rounds = 0;

	if (check_request(q, &ch, err) != 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: inject refused: %s", c->peer, err->msg);
		return;
	}
	if ((ch.kind == SPD_CH_TCP || ch.kind == SPD_CH_UDP) && !local_address(&ch.dst)) {
		if (!c->remote) {
			forward(d, c, req, &ch, err);
			return;
		}
		char host[INET6_ADDRSTRLEN];

		inet_ntop(ch.dst.family, ch.dst.addr, host, sizeof host);
		snprintf(err->msg, sizeof err->msg, "%s is not an address of host %s: a daemon "
			 "serves only its own host's processes", host, d->name);
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: inject refused: %s", c->peer, err->msg);
		return;
	}
	if (ch.kind == SPD_CH_UNIX && !ch.inode) {
		/* a UNIX stream named by its sending socket alone (a forked
		 * writer knows no peer: agent/propagate.c, point 18): its peer,
		 * if accepted, found here for a local requester that holds it */
		if (!c->remote && spd_pid_holds(c->pid, ch.src_inode, false, SPD_END_ANY))
			ch.inode = spd_unix_peer(ch.src_inode);
		if (!ch.inode && !ch.path[0]) {
			sp_fail(err, "UNIX socket %llu: %s", (unsigned long long)ch.src_inode,
				c->remote || !spd_pid_holds(c->pid, ch.src_inode, false, SPD_END_ANY) ?
				"the requester does not hold it: its peer is not looked up" :
				"no peer with an inode (sock_diag), and no listener's path");
			spd_send_error(c, req->id, err->msg);
			spd_log("%s: inject refused: %s", c->peer, err->msg);
			return;
		}
	}
	expect[0] = '\0';
	if (ch.kind == SPD_CH_UNIX_DGRAM && !ch.inode) {
		/* the socket bound to the path the datagram went to */
		uint64_t ino[2];
		size_t ni = 0;

		if (spd_channel_inodes(&ch, ino, 2, &ni, NULL, err) == 0 && ni == 1)
			ch.inode = ino[0];
	}
	writers_count(c, q, &ch, sent, sizeof sent, &offset, &count_fd);
	if (q->follow)
		expect_line(q, &ch, offset, ipopt_ok(d, c, q, &ch), expect, sizeof expect);
	targets = calloc(SPD_MAX_TARGETS, sizeof *targets);
	tp = calloc(SPD_MAX_TARGETS, sizeof *tp);
	strings = malloc(SPD_MAX_TARGETS * (dirlen + whylen));
	if (!targets || !tp || !strings) {
		spd_send_error(c, req->id, "the daemon is out of memory");
		goto out;
	}
	/* Step 7: rounds until no new holder. */
	for (int round = 0; round < SPD_INJECT_ROUNDS; round++) {
		uint64_t inodes[64];
		pid_t pids[SPD_MAX_TARGETS];
		size_t ni, np, before = ndone;
		bool listener;

		double th = now_ms();

		rounds++;
		if (spd_channel_inodes(&ch, inodes, 64, &ni, &listener, err) != 0 ||
		    (ni && spd_holders(inodes, ni, ch.kind == SPD_CH_PIPE, pids, SPD_MAX_TARGETS, &np,
				       err) != 0)) {
			spd_send_error(c, req->id, err->msg);
			spd_log("%s: inject: %s", c->peer, err->msg);
			goto out;
		}
		holders_ms += now_ms() - th;
		for (size_t i = 0; ni && i < np && ndone < SPD_MAX_TARGETS; i++) {
			if (seen(done, ndone, pids[i]) || pids[i] == getpid() ||
			    (!c->remote && pids[i] == c->pid) ||
			    (ch.kind == SPD_CH_PIPE &&
			     !spd_pid_holds(pids[i], ch.inode, true, SPD_END_READ)))
				continue;
			char *dir = strings + ndone * (dirlen + whylen), *why = dir + dirlen;
			Sptrace__Spd__InjectReply__Target *t = &targets[ndone];

			sptrace__spd__inject_reply__target__init(t);
			th = now_ms();
			inject_one(d, c, q, q->on && *q->on ? q->on : listener ? "accept" : "recv",
				   expect[0] ? expect : NULL, pids[i], t, dir, dirlen, why, whylen);
			if ((t->injected || t->following) && strstr(expect, " oob"))
				t->mark = (char *)(takes_mark(dir, expect, "oob") ? "oob" : "offset");
			else if ((t->injected || t->following) && strstr(expect, " ipopt "))
				t->mark = (char *)(takes_mark(dir, expect, "ipopt") ? "ipopt" : "hash");
			spd_log("%s: inject session %s pid %d: %s%s%s%s%s%s", c->peer, q->session,
				(int)pids[i], t->injected || t->following ? "" : "refused: ", why,
				t->injected ? "; trace in " : "", t->injected ? dir : "",
				*t->mark ? "; mark " : "", t->mark);
			inject_ms += now_ms() - th;
			tp[ndone] = t;
			done[ndone++] = pids[i];
		}
		/* a connection's or a pipe's holders are all there; a
		 * listener's pre-forked workers may come meanwhile */
		if (ndone == before || !listener)
			break;
	}
	if (ndone == 0)
		spd_log("%s: inject session %s: no process of this host holds the channel", c->peer,
			q->session);
	rep.n_targets = ndone;
	rep.targets = tp;
	rep.host = d->name;
	rep.sent_count = sent;
	rep.sent_offset = offset;
	rep.inode = ch.kind == SPD_CH_UNIX ? ch.inode : 0;
	spd_log("%s: inject session %s: answered in %.1f ms (%d round%s of looking for holders: "
		"%.1f ms; the agents: %.1f ms)", c->peer, q->session, now_ms() - t0, rounds,
		rounds == 1 ? "" : "s", holders_ms, inject_ms);
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_INJECT_REPLY;
	f.inject_reply = &rep;
	spd_frame_write_fd(c, &f, count_fd, err);
out:
	free(strings);
	free(tp);
	free(targets);
}
