/*
 * holders.c — which processes of this host hold the other end of a
 * channel: the ones the agent must be injected into so that tracing follows
 * a message to where it is received.
 *
 * A channel names its receiving end by address (TCP, UDP) or by inode
 * (pipes, UNIX sockets).  An address becomes socket inodes through the
 * kernel's sock_diag (NETLINK_SOCK_DIAG) of this network namespace -- which
 * is this daemon's host: one exact lookup by the 4-tuple, the way the kernel
 * finds the socket for an incoming segment, and for a listener a dump of the
 * listening sockets only.  (Reading /proc/net/{tcp,udp}[6] walks every
 * bucket of the kernel's global connection table, about 10 ms here; it is
 * the fallback when sock_diag cannot answer.)  An inode becomes processes
 * through /proc/PID/fd:
 *
 *   1. TCP: the established socket whose local end is the channel's
 *      destination and whose remote end is its source.  A connection the
 *      kernel has completed but no process has accepted yet shows with
 *      inode 0: then it is the listening socket on the destination (its
 *      address, or the wildcard), held by every process that may accept
 *      from it -- all the workers of a pre-forked server;
 *   2. UDP: the socket bound to the destination, connected to the source
 *      if one is, else unconnected (an address or the wildcard);
 *   3. pipes and UNIX sockets: the inode itself -- a named pipe (FIFO) too,
 *      whose descriptors name its path, not "pipe:[INODE]": for a pipe
 *      every descriptor naming a path is looked at (a stat through its
 *      /proc link, which names the open file itself: no path is followed).
 *
 * Every holder is listed, threads folded into their process; the caller
 * (the inject request) injects into each and asks again until no new one
 * appears, as a process may inherit a descriptor meanwhile (fork).
 */
#include "spd.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/rtnetlink.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TCP_LISTEN 0x0A

/* One line of /proc/net/{tcp,udp}[6]. */
typedef struct net_line {
	spd_endpoint local, remote;
	unsigned state;
	uint64_t inode;
} net_line;

/* An address as /proc/net prints it: 8 or 32 hex digits, each 32-bit word
 * in the host's byte order, then ':' and the port in 4 hex digits. */
static int parse_endpoint(const char *s, int family, spd_endpoint *ep)
{
	int words = family == AF_INET ? 1 : 4;

	memset(ep, 0, sizeof *ep);
	ep->family = family;
	for (int w = 0; w < words; w++) {
		char hex[9];
		uint32_t v;

		memcpy(hex, s + 8 * w, 8);
		hex[8] = '\0';
		for (int i = 0; i < 8; i++)
			if (!isxdigit((unsigned char)hex[i]))
				return -1;
		v = (uint32_t)strtoul(hex, NULL, 16);
		memcpy(ep->addr + 4 * w, &v, 4);
	}
	if (s[8 * words] != ':')
		return -1;
	ep->port = (uint16_t)strtoul(s + 8 * words + 1, NULL, 16);
	return 0;
}

static int parse_net_line(const char *line, int family, net_line *out)
{
	char local[64], remote[64];
	unsigned long long inode;
	unsigned state;

	if (sscanf(line, " %*u: %63s %63s %x %*s %*s %*s %*u %*u %llu", local, remote, &state,
		   &inode) != 4)
		return -1;
	if (parse_endpoint(local, family, &out->local) || parse_endpoint(remote, family,
									 &out->remote))
		return -1;
	out->state = state;
	out->inode = inode;
	return 0;
}

static bool same_addr(const spd_endpoint *a, const spd_endpoint *b)
{
	size_t len = a->family == AF_INET ? 4 : 16;

	return a->family == b->family && memcmp(a->addr, b->addr, len) == 0;
}

static bool is_any(const spd_endpoint *a)
{
	static const uint8_t zero[16];

	return memcmp(a->addr, zero, a->family == AF_INET ? 4 : 16) == 0;
}

/* An IPv4 endpoint as an IPv6 socket sees it: ::ffff:a.b.c.d. */
static spd_endpoint mapped(const spd_endpoint *v4)
{
	spd_endpoint m = { .family = AF_INET6, .port = v4->port };

	m.addr[10] = m.addr[11] = 0xff;
	memcpy(m.addr + 12, v4->addr, 4);
	return m;
}

static int add_inode(uint64_t inode, uint64_t *inodes, size_t max, size_t *n)
{
	for (size_t i = 0; i < *n; i++)
		if (inodes[i] == inode)
			return 0;
	if (*n >= max)
		return -1;
	inodes[(*n)++] = inode;
	return 0;
}

/* Rules 1 and 2 over one /proc/net file: exact matches into *exact, the
 * fallbacks (listener, unconnected UDP) into *fallback. */
static int scan_net(const char *file, int family, const spd_channel *ch, const spd_endpoint *dst,
		    const spd_endpoint *src, uint64_t *exact, size_t *nexact, uint64_t *fallback,
		    size_t *nfallback, size_t max, sp_err *err)
{
	bool tcp = ch->kind == SPD_CH_TCP;
	char line[512];
	net_line l;
	int fd = sp_open_regular(file, 0);
	FILE *f;

	if (fd < 0 && errno == ENOENT)
		return 0;        /* no IPv6 in this kernel */
	if (fd < 0 || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		return sp_fail(err, "%s: %s", file, sp_open_why(errno));
	}
	if (!fgets(line, sizeof line, f))
		line[0] = '\0';          /* the header */
	while (fgets(line, sizeof line, f)) {
		if (parse_net_line(line, family, &l) || l.local.port != dst->port)
			continue;
		bool local_ok = same_addr(&l.local, dst);
		bool remote_ok = same_addr(&l.remote, src) && l.remote.port == src->port;

		if (local_ok && remote_ok && l.inode && (!tcp || l.state != TCP_LISTEN)) {
			if (add_inode(l.inode, exact, max, nexact))
				goto full;
		} else if ((local_ok || is_any(&l.local)) && l.inode &&
			   (tcp ? l.state == TCP_LISTEN : is_any(&l.remote))) {
			if (add_inode(l.inode, fallback, max, nfallback))
				goto full;
		}
	}
	fclose(f);
	return 0;
full:
	fclose(f);
	return sp_fail(err, "%s: more than %zu sockets match the channel", file, max);
}

/* ---- sock_diag ---- */

/* Does a listener bound to l take connections to dst? */
static bool listens_for(const spd_endpoint *l, const spd_endpoint *dst)
{
	spd_endpoint m6 = mapped(dst);

	return l->port == dst->port &&
	       (is_any(l) || same_addr(l, dst) || (dst->family == AF_INET && same_addr(l, &m6)));
}

typedef struct diag_hit {
	int found;                   /* messages seen */
	uint8_t state;
	uint64_t inode;
	const spd_channel *ch;       /* dump: keep the listeners of ch's destination */
	const spd_endpoint *dst;
	uint64_t *inodes;
	size_t max, *n;
	int full;
} diag_hit;

static void put_addr(__be32 out[4], const spd_endpoint *e)
{
	memcpy(out, e->addr, e->family == AF_INET ? 4 : 16);
}

/* One request (dump: every listening socket of `family`; else the socket of
 * the 4-tuple `local`/`remote`, as inet_diag names it for `proto`); each
 * answer into h.  0, or -1 when sock_diag cannot answer (the caller reads
 * /proc/net). */
static int diag(int family, int proto, bool dump, const spd_endpoint *local,
		const spd_endpoint *remote, diag_hit *h)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} q = { 0 };
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	union {
		char buf[16384];
		struct nlmsghdr align;
	} u;
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG), rc = -1;
	struct timeval tv = { 2, 0 };

	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	q.nlh.nlmsg_len = sizeof q;
	q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	q.nlh.nlmsg_flags = NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0);
	q.nlh.nlmsg_seq = 1;
	q.r.sdiag_family = (uint8_t)family;
	q.r.sdiag_protocol = (uint8_t)proto;
	q.r.idiag_states = dump ? 1u << TCP_LISTEN : ~0u;
	q.r.id.idiag_cookie[0] = q.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	if (!dump) {
		/* TCP's lookup takes src as the socket's own end; UDP's, for
		 * historical reasons, as the datagram's sender (the peer) */
		const spd_endpoint *s = proto == IPPROTO_TCP ? local : remote;
		const spd_endpoint *d = proto == IPPROTO_TCP ? remote : local;

		put_addr(q.r.id.idiag_src, s);
		put_addr(q.r.id.idiag_dst, d);
		q.r.id.idiag_sport = htons(s->port);
		q.r.id.idiag_dport = htons(d->port);
	}
	if (sendto(fd, &q, sizeof q, 0, (struct sockaddr *)&nl, sizeof nl) != (ssize_t)sizeof q)
		goto out;
	for (;;) {
		ssize_t len = recv(fd, u.buf, sizeof u.buf, 0);

		if (len <= 0)
			goto out;
		for (struct nlmsghdr *m = &u.align; NLMSG_OK(m, (size_t)len); m = NLMSG_NEXT(m, len)) {
			if (m->nlmsg_type == NLMSG_DONE) {
				rc = 0;
				goto out;
			}
			if (m->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(m);

				/* ENOENT: no such socket, an answer */
				rc = e->error == -ENOENT ? 0 : -1;
				goto out;
			}
			if (m->nlmsg_type != SOCK_DIAG_BY_FAMILY)
				continue;
			const struct inet_diag_msg *d = NLMSG_DATA(m);

			if (!dump) {
				h->found++;
				h->state = d->idiag_state;
				h->inode = d->idiag_inode;
				rc = 0;
				goto out;
			}
			spd_endpoint l = { .family = d->idiag_family,
					   .port = ntohs(d->id.idiag_sport) };

			memcpy(l.addr, d->id.idiag_src, d->idiag_family == AF_INET ? 4 : 16);
			if (d->idiag_inode && listens_for(&l, h->dst)) {
				h->found++;
				if (add_inode(d->idiag_inode, h->inodes, h->max, h->n))
					h->full = 1;
			}
		}
	}
out:
	close(fd);
	return rc;
}

/* Rules 1 and 2 through sock_diag: 0 (answered; *n may be 0), -1 (it
 * cannot answer: nothing added), -2 (too many; a message). */
static int diag_channel(const spd_channel *ch, uint64_t *inodes, size_t max, size_t *n,
			bool *listener, sp_err *err)
{
	int proto = ch->kind == SPD_CH_TCP ? IPPROTO_TCP : IPPROTO_UDP;
	spd_endpoint d6 = mapped(&ch->dst), s6 = mapped(&ch->src);
	const spd_endpoint *dst[2] = { &ch->dst, &d6 }, *src[2] = { &ch->src, &s6 };
	int fams[2] = { ch->dst.family, AF_INET6 }, nfam = ch->dst.family == AF_INET ? 2 : 1;
	bool want_listener = false;

	for (int i = 0; i < nfam; i++) {
		diag_hit h = { 0 };

		if (diag(fams[i], proto, false, dst[i], src[i], &h) != 0) {
			*n = 0;
			return -1;
		}
		if (!h.found)
			continue;
		if (proto == IPPROTO_UDP || (h.state != TCP_LISTEN && h.inode)) {
			if (!h.inode)
				continue;
			add_inode(h.inode, inodes, max, n);
			return 0;
		}
		want_listener = true;    /* not accepted yet, or only a listener */
		break;
	}
	if (!want_listener)
		return 0;
	for (int i = 0; i < 2; i++) {
		diag_hit h = { .ch = ch, .dst = &ch->dst, .inodes = inodes, .max = max, .n = n };

		if (diag(i ? AF_INET6 : AF_INET, IPPROTO_TCP, true, NULL, NULL, &h) != 0) {
			*n = 0;
			return -1;
		}
		if (h.full) {
			sp_fail(err, "more than %zu sockets match the channel", max);
			return -2;
		}
	}
	if (listener)
		*listener = *n > 0;
	return 0;
}

/* Rule 3, a UNIX connection not accepted yet: the listening socket bound
 * to `path` ('@': abstract), from /proc/net/unix of this namespace; with
 * `dgram`, the datagram socket bound there. */
static int unix_listener(const char *path, bool dgram, uint64_t *inodes, size_t max, size_t *n,
			 sp_err *err)
{
	char line[512], name[300];
	unsigned long long inode;
	unsigned flags, type, state;
	int fd = sp_open_regular("/proc/net/unix", 0);
	FILE *f;

	if (fd < 0 || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		return sp_fail(err, "/proc/net/unix: %s", sp_open_why(errno));
	}
	while (fgets(line, sizeof line, f)) {
		name[0] = '\0';
		/* Num RefCount Protocol Flags Type St Inode Path */
		if (sscanf(line, "%*s %*s %*s %x %x %x %llu %299s", &flags, &type, &state, &inode,
			   name) < 4 || (dgram ? type != SOCK_DGRAM : !(flags & 0x10000)) ||
		    strcmp(name, path) != 0)
			continue;            /* 0x10000: __SO_ACCEPTCON, a listener */
		if (add_inode(inode, inodes, max, n)) {
			fclose(f);
			return sp_fail(err, "more than %zu sockets listen at %s", max, path);
		}
	}
	fclose(f);
	return 0;
}

int spd_channel_inodes(const spd_channel *ch, uint64_t *inodes, size_t max, size_t *n,
		       bool *listener, sp_err *err)
{
	uint64_t fallback[256];
	size_t nfallback = 0;
	const char *v4, *v6;

	*n = 0;
	if (listener)
		*listener = false;
	if (ch->kind == SPD_CH_UNIX && !ch->inode && ch->path[0]) {
		if (listener)
			*listener = true;
		return unix_listener(ch->path, false, inodes, max, n, err);
	}
	if (ch->kind == SPD_CH_UNIX_DGRAM && !ch->inode && ch->path[0])
		return unix_listener(ch->path, true, inodes, max, n, err);
	if (ch->kind == SPD_CH_PIPE || ch->kind == SPD_CH_UNIX || ch->kind == SPD_CH_UNIX_DGRAM) {
		if (!ch->inode)
			return sp_fail(err, "a pipe or UNIX socket channel without an inode");
		return add_inode(ch->inode, inodes, max, n);
	}
	if (ch->dst.family != AF_INET && ch->dst.family != AF_INET6)
		return sp_fail(err, "a channel whose destination is not an IP address");
	switch (diag_channel(ch, inodes, max, n, listener, err)) {
	case 0:
		return 0;
	case -2:
		return -1;
	default:
		if (listener)
			*listener = false;
		break;                   /* read /proc/net */
	}
	v4 = ch->kind == SPD_CH_TCP ? "/proc/net/tcp" : "/proc/net/udp";
	v6 = ch->kind == SPD_CH_TCP ? "/proc/net/tcp6" : "/proc/net/udp6";
	if (ch->dst.family == AF_INET) {
		/* An IPv4 peer reaches IPv4 sockets, and dual-stack IPv6 ones
		 * under its mapped address. */
		spd_endpoint d6 = mapped(&ch->dst), s6 = mapped(&ch->src);

		if (scan_net(v4, AF_INET, ch, &ch->dst, &ch->src, inodes, n, fallback, &nfallback,
			     max < 256 ? max : 256, err) ||
		    scan_net(v6, AF_INET6, ch, &d6, &s6, inodes, n, fallback, &nfallback,
			     max < 256 ? max : 256, err))
			return -1;
	} else if (scan_net(v6, AF_INET6, ch, &ch->dst, &ch->src, inodes, n, fallback, &nfallback,
			    max < 256 ? max : 256, err)) {
		return -1;
	}
	if (*n == 0 && listener)
		*listener = ch->kind == SPD_CH_TCP && nfallback > 0;
	if (*n == 0)
		for (size_t i = 0; i < nfallback; i++)
			if (add_inode(fallback[i], inodes, max, n))
				return sp_fail(err, "more than %zu sockets match the channel", max);
	return 0;
}

/* A UNIX stream socket's peer, for a requester that knows only its own
 * socket (a forked child: agent/msgs.c, unix_peer, point 1): one exact
 * request for the inode, as the agent makes, in this daemon's network
 * namespace -- the requester's (it reached this daemon's abstract socket).
 * A connection not accepted yet has a peer without an inode: 0. */
uint64_t spd_unix_peer(uint64_t inode)
{
	uint8_t q[SP_UNIX_PEER_REQ_BYTES];
	size_t len = sp_unix_peer_request(q, inode);
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	struct timeval tv = { 2, 0 };
	union {
		char buf[1024];
		struct nlmsghdr nh;              /* aligned as the answer is read */
	} a;
	uint64_t peer = 0;
	ssize_t n;
	int fd;

	if (inode == 0 || inode > UINT32_MAX ||
	    (fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) < 0)
		return 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (sendto(fd, q, len, 0, (struct sockaddr *)&nl, sizeof nl) == (ssize_t)len &&
	    (n = recv(fd, a.buf, sizeof a.buf, 0)) > 0)
		peer = sp_unix_peer_answer(a.buf, (size_t)n, inode);
	close(fd);
	return peer;
}

/* Is pid's descriptor `name` open for reading only (end SPD_END_READ) or
 * for writing (SPD_END_WRITE), by its /proc/PID/fdinfo flags? */
static bool open_as(int procfd, const char *pid, const char *name, enum spd_end end)
{
	char path[300], info[512];
	unsigned flags;
	const char *f;
	ssize_t n;
	int fd;

	if (end == SPD_END_ANY)
		return true;
	snprintf(path, sizeof path, "%s/fdinfo/%s", pid, name);
	fd = openat(procfd, path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, info, sizeof info - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return false;
	info[n] = '\0';
	f = strstr(info, "flags:");
	return f && sscanf(f + 6, " %o", &flags) == 1 &&
	       ((flags & O_ACCMODE) == O_RDONLY) == (end == SPD_END_READ);
}

/* Does one of `fd`'s /proc/PID/fd entries name one of the inodes (fifos:
 * a named pipe's too), open as `end` says? */
static bool holds(int procfd, const char *pid, const uint64_t *inodes, size_t n, bool fifos,
		  enum spd_end end)
{
	char path[300], target[64];
	struct dirent *de;
	bool found = false;
	DIR *d;
	int fdd;

	snprintf(path, sizeof path, "%s/fd", pid);
	fdd = openat(procfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fdd < 0 || !(d = fdopendir(fdd))) {
		if (fdd >= 0)
			close(fdd);
		return false;    /* gone, or a kernel thread */
	}
	while (!found && (de = readdir(d))) {
		ssize_t len = readlinkat(dirfd(d), de->d_name, target, sizeof target - 1);
		unsigned long long ino;
		char kind[8];

		if (len <= 0)
			continue;
		target[len] = '\0';
		if (fifos && target[0] == '/') {
			struct stat st;

			if (fstatat(dirfd(d), de->d_name, &st, 0) != 0 || !S_ISFIFO(st.st_mode))
				continue;
			ino = (unsigned long long)st.st_ino;
		} else if (sscanf(target, "%7[a-z]:[%llu]", kind, &ino) != 2 ||
			   (strcmp(kind, "socket") != 0 && strcmp(kind, "pipe") != 0)) {
			continue;
		}
		for (size_t i = 0; i < n && !found; i++)
			found = inodes[i] == ino && open_as(procfd, pid, de->d_name, end);
	}
	closedir(d);
	return found;
}

bool spd_pid_holds(pid_t pid, uint64_t inode, bool fifos, enum spd_end end)
{
	char name[16];
	int procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	bool yes;

	if (procfd < 0)
		return false;
	snprintf(name, sizeof name, "%d", (int)pid);
	yes = holds(procfd, name, &inode, 1, fifos, end);
	close(procfd);
	return yes;
}

int spd_holders(const uint64_t *inodes, size_t n, bool fifos, pid_t *pids, size_t max,
		size_t *npids, sp_err *err)
{
	struct dirent *de;
	DIR *proc;
	int procfd;

	*npids = 0;
	procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (procfd < 0 || !(proc = fdopendir(procfd))) {
		if (procfd >= 0)
			close(procfd);
		return sp_fail(err, "/proc: %s", strerror(errno));
	}
	while ((de = readdir(proc))) {
		if (!isdigit((unsigned char)de->d_name[0]) ||
		    !holds(dirfd(proc), de->d_name, inodes, n, fifos, SPD_END_ANY))
			continue;
		if (*npids >= max) {
			closedir(proc);
			return sp_fail(err, "more than %zu processes hold the channel", max);
		}
		pids[(*npids)++] = (pid_t)atoi(de->d_name);
	}
	closedir(proc);
	return 0;
}
