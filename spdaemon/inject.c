/*
 * inject.c — the inject request: put the agent into every process of this
 * host that holds the receiving end of a channel, so that tracing follows a
 * message to where it is received.
 *
 *   1. The request is checked: a session name of [A-Za-z0-9._-], 1 to 64
 *      characters (it names a directory), and a channel with addresses of
 *      the right length or an inode.
 *   2. The holders of the channel's receiving end (holders.c), less the
 *      requester itself and this daemon.
 *   3. The policy, process by process.  A local requester (SO_PEERCRED) may
 *      have the agent put only into a process its own user could trace: all
 *      of the process's user ids are the requester's -- root into any.  A
 *      daemon of another host (a certificate of the cluster) only into a
 *      process none of whose user ids is root's, unless the configuration
 *      says otherwise (`remote-inject all`, or `none`).  pid 1 never
 *      (inj_check).  Each refusal is answered and logged with its reason.
 *   4. A process that has the agent already is left as it is, and said.
 *   5. Its trace directory is STATE/sessions/SESSION/PID, made through
 *      descriptors, given to the process's user (the agent writes as it),
 *      0700; the directories above it are root's and only traversable by
 *      others (0711), so no user can see or touch another's trace.
 *   6. The agent goes in (inj_attach_agent) dormant until its event: the
 *      request's `on`, else "accept" when the receiving end is a listener
 *      (the connection waits to be accepted), "recv" for an established
 *      one; the thread of the event is traced (threads=event).  It reads
 *      the analyses of the daemon's own repository (prepared=).
 *   7. The holders are asked again, until a round finds no new process (a
 *      pre-forked worker may have inherited the socket meanwhile), at most
 *      SPD_INJECT_ROUNDS rounds.
 *
 * A channel whose receiving end is on another host (its destination is no
 * address of this network namespace) is not this daemon's to serve: a
 * local requester's request goes on, as it is, to the daemon of that
 * address over mutual TLS, and its answer comes back (the other host
 * applies its own policy to "a daemon of another host").  When that daemon
 * answers, its address joins the session's peers (session.c), the hosts
 * `sptrace collect` and stop reach through this daemon.  A request from
 * another host for an address that is not here is refused: no relays.
 */
#include "spd_daemon.h"

#include <fcntl.h>
#include <pthread.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codeanalysis.h"
#include "injector.h"

#define SPD_INJECT_ROUNDS 8
#define SPD_MAX_TARGETS 256

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
	if (ch->kind == SPD_CH_PIPE || ch->kind == SPD_CH_UNIX)
		return ch->inode ? 0 : sp_fail(err, "a pipe or UNIX channel without its inode");
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

/* Steps 3 to 6 for one process: fills t (its strings are the caller's). */
static void inject_one(spd_daemon *d, spd_conn *c, const Sptrace__Spd__InjectRequest *q,
		       const char *on, pid_t pid, Sptrace__Spd__InjectReply__Target *t, char *dir,
		       size_t dirlen, char *why, size_t whylen)
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
	if (inj_has_mapping(pid, "sptrace-agent") == 1) {
		snprintf(why, whylen, "pid %d has the agent already", (int)pid);
		return;
	}
	if (target_dir(d, q->session, pid, st.st_uid, st.st_gid, dir, dirlen, &err) != 0) {
		snprintf(why, whylen, "%s", err.msg);
		return;
	}
	inj_agent a = { .so_path = d->agent, .dir = dir, .on = on,
			.threads = "event", .prepared = ca_repo_default_dir(), .timeout = 60 };

	if (inj_attach_agent(pid, &a, &r, &err) != 0) {
		snprintf(why, whylen, "%s", err.msg);
		return;
	}
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

/* The request, as it is, to the daemon of the channel's destination; its
 * answer back to the requester under the requester's id. */
static void forward(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, const spd_channel *ch,
		    sp_err *err)
{
	char host[INET6_ADDRSTRLEN];
	Sptrace__Spd__Frame *rep = NULL;
	uint64_t id = req->id;
	spd_conn far;
	int r;

	inet_ntop(ch->dst.family, ch->dst.addr, host, sizeof host);
	if (!spd_tls_client(d, err) || spd_tls_connect(d->tls_client, host, d->port, 10, &far,
							 err) != 0) {
		spd_send_error(c, id, err->msg);
		spd_log("%s: inject session %s for %s: %s", c->peer, req->inject->session, host,
			err->msg);
		return;
	}
	r = spd_frame_write(&far, req, err) == 0 ? spd_frame_read(&far, &rep, err) : -1;
	spd_conn_close(&far);
	if (r != 1) {
		if (r == 0)
			sp_fail(err, "the spdaemon of %s closed the connection without an answer", host);
		spd_send_error(c, id, err->msg);
		spd_log("%s: inject session %s for %s: %s", c->peer, req->inject->session, host,
			err->msg);
		return;
	}
	spd_log("%s: inject session %s: forwarded to the spdaemon of %s, which answered with %s",
		c->peer, req->inject->session, host,
		rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY ? "the processes it found"
		: "an error");
	/* That host takes part in the session now: `sptrace collect` asks it. */
	if (rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY &&
	    spd_session_add_peer(d, req->inject->session, host, err) != 0)
		spd_log("%s: inject session %s: %s", c->peer, req->inject->session, err->msg);
	rep->id = id;
	spd_frame_write(c, rep, err);
	spd_frame_free(rep);
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

		if (spd_channel_inodes(&ch, inodes, 64, &ni, &listener, err) != 0 ||
		    (ni && spd_holders(inodes, ni, pids, SPD_MAX_TARGETS, &np, err) != 0)) {
			spd_send_error(c, req->id, err->msg);
			spd_log("%s: inject: %s", c->peer, err->msg);
			goto out;
		}
		for (size_t i = 0; ni && i < np && ndone < SPD_MAX_TARGETS; i++) {
			if (seen(done, ndone, pids[i]) || pids[i] == getpid() ||
			    (!c->remote && pids[i] == c->pid))
				continue;
			char *dir = strings + ndone * (dirlen + whylen), *why = dir + dirlen;
			Sptrace__Spd__InjectReply__Target *t = &targets[ndone];

			sptrace__spd__inject_reply__target__init(t);
			inject_one(d, c, q, q->on && *q->on ? q->on : listener ? "accept" : "recv",
				   pids[i], t, dir, dirlen, why, whylen);
			spd_log("%s: inject session %s pid %d: %s%s%s%s", c->peer, q->session,
				(int)pids[i], t->injected ? "" : "refused: ", why,
				t->injected ? "; trace in " : "", t->injected ? dir : "");
			tp[ndone] = t;
			done[ndone++] = pids[i];
		}
		if (ndone == before)
			break;
	}
	if (ndone == 0)
		spd_log("%s: inject session %s: no process of this host holds the channel", c->peer,
			q->session);
	rep.n_targets = ndone;
	rep.targets = tp;
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_INJECT_REPLY;
	f.inject_reply = &rep;
	spd_frame_write(c, &f, err);
out:
	free(strings);
	free(tp);
	free(targets);
}
