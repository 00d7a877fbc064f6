/*
 * propagate.c — following a request to where it is received: a traced send
 * asks the host's spdaemon to put the agent into the processes at the other
 * end, and those agents start tracing at the receive that the send matches.
 *
 * The sending side (ag_propagate_ask, called by msgs.c's send interposers
 * before the bytes go):
 *
 *  1. Only with a session: SPTRACE_SESSION under `sptrace run` (set when a
 *     spdaemon serves the host), `session=` when a daemon injected the
 *     agent.  The session names where each host's daemon keeps the traces it
 *     injected (STATE/sessions/SESSION/PID) and what `sptrace collect`
 *     gathers.
 *  2. Once per channel (msgs.c claims it with one atomic exchange: a TCP
 *     connection, UDP to one peer, a pipe, a UNIX stream socket whose peer
 *     the kernel named; never the standard streams), on the first traced
 *     send, before the bytes go: an InjectRequest (proto/spd.proto) to the
 *     daemon of this network namespace, over its abstract UNIX socket, with
 *     the channel (this end -> the peer; a pipe or UNIX socket by the
 *     receiving end's inode), the session, and what names the send: TCP,
 *     the absolute stream offset of its first byte when the agent knows it
 *     (msgs.c: tcp_bases); UDP, the datagram's content hash.  The daemon
 *     forwards it to the daemon of the peer's host.  The thread waits for
 *     the answer, at most wait_ms
 *     (SPTRACE_PROPAGATE_WAIT, `wait=`; 3000 by default): when the daemon
 *     answers, the agents at the other end are armed.  Then the send goes.
 *  3. The socket is the agent's (fds.c: high, registered, dropped after the
 *     answer).  Everything here is raw system calls, a stack buffer for the
 *     request and an mmap'd arena for the answer (protobuf-c's allocator):
 *     no malloc, no lock of the program's, errno as the program left it.
 *     A TCP connection or UNIX stream socket whose peer sent this process
 *     the traced request (an expectation matched on it, point 6, or the
 *     accept or receive that started tracing) is not asked about: its other
 *     end is traced already -- the answer goes back to where the request
 *     came from.  (A pipe's answer goes back on another pipe: the daemon
 *     finds its reader following already.)
 *  4. No daemon (nothing listens at the socket): not asked again for 10 s,
 *     said once in agent.log.  Every answer goes into agent.log (each
 *     process and why) and meta (TRACE_META_PROPAGATED: the host that
 *     served it and how many processes got the agent).
 *
 * The receiving side (the expectations):
 *
 *  5. A daemon that injects the agent gives it the receive to start at, in
 *     the sender's terms: `expect=tcp SRC SPORT DST DPORT OFFSET`, `udp SRC
 *     SPORT DST DPORT HASH` (OFFSET, HASH "-": unknown), `pipe INODE [OFFSET]`
 *     or `unix INODE [OFFSET]` (the writer's count of its traced write's
 *     first byte: msgs.c, point 5) -- or, for a UNIX connection not accepted yet (its
 *     receiving socket has no inode yet), `unixfrom INODE`: the first read of
 *     the accepted socket whose peer is the sender's INODE (sock_diag).  A
 *     pipe's or UNIX socket's expectation takes the bytes
 *     queued in it now (FIONREAD) as written before the traced write: the
 *     sender waits, so nothing of the request is queued yet.  A daemon whose
 *     process has the agent of the session already writes the same line, as
 *     `expect ...`, into its control FIFO (control.c).  At most MAX_EXPECT
 *     wait at once.
 *  6. While one waits, every receive that returned data on a socket or an
 *     awaited pipe asks ag_expect_match.  TCP: the socket's peer must be
 *     SRC:SPORT and its own address DST:DPORT, and the receive's bytes must
 *     reach past OFFSET -- the kernel says where the stream is (TCP_INFO's
 *     bytes_received less what SIOCINQ says is still queued; a FIN received
 *     counts one); the bytes before OFFSET were sent before the traced
 *     request, and receives of them start nothing.  UDP: a datagram to
 *     DST:DPORT whose bytes hash to HASH.  Pipes and UNIX sockets: the read
 *     whose bytes, counted since arming, pass the backlog; the backlog's
 *     end is the writer's OFFSET, so that read's first byte is OFFSET -
 *     backlog + what was read before it since arming, and the reader's
 *     count starts there (msgs.c: ag_msgs_recv_at): both ends name the
 *     same bytes alike, however much was queued when the agent came.  An
 *     OFFSET below the backlog (another writer's bytes queued after the
 *     sender looked) leaves the reader's count its own.  Several readers
 *     of one pipe (pre-forked workers) each read part of it: their agents
 *     share the count in the daemon's SESSION/pipe-INODE (pipe_count_of),
 *     which the first one to arm sets to the writer's OFFSET less its
 *     backlog, and each read's first byte is that base plus the bytes all
 *     of them read before it -- exact while two readers' reads do not
 *     race between the read's return and the count's atomic add.  A match is used
 *     up; that thread starts tracing where it stands (main.c:
 *     ag_activate_on_event, or follow_thread when the agent traces
 *     already).
 *  7. All of it with raw system calls: the receive may be a breakpoint's
 *     (a thread blocked in recv at injection, activate.c), in a signal
 *     handler.
 *  8. An agent once given an expectation starts only at awaited receives,
 *     never at any receive; one not met within EXPECT_NS (its sender gave
 *     up, or the request went elsewhere) is given up, so a server injected
 *     in vain does not pay the look at every receive for ever.
 *
 * Left: a TCP channel whose sent offsets are relative (msgs.c: tcp_bases,
 * point 4) names no offset, and its receiver starts at the first receive on
 * the channel after arming; UNIX datagram sockets are not followed; a UNIX
 * socket with several readers, a pipe's readers of different users, and
 * traced writers of one pipe that are not one process and its forked
 * children count their bytes each alone; a
 * UNIX stream's sender cannot see what is queued at its peer, so it names
 * no OFFSET and the reader's count stays its own (exact when nothing was
 * queued); each awaited pipe read maps its shared count for good (a page
 * per request that reached this process).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"
#include "spd.pb-c.h"

#define SPD_SOCKET "sptrace-spdaemon"   /* spdaemon/spd.h: SPD_SOCKET */
#define SPD_PROTOCOL_VERSION 1          /* spdaemon/spd.h */
#define SPD_FRAME_MAX (1u << 20)        /* spdaemon/spd.h */
#define NO_DAEMON_NS 10000000000ull     /* point 4 */
#define MAX_EXPECT 64

static char session[65];
static uint32_t wait_ms = 3000;
static volatile uint64_t no_daemon_until;
static volatile int no_daemon_said;
static volatile uint64_t next_id = 1;

/* SESSION/pipe-INODE (spdaemon/inject.c: pipe_counts), mapped by the agent
 * of each reader of the pipe (point 6). */
typedef struct pipe_count {
	volatile uint64_t state;         /* 0 new, 1 being set, 2 set */
	volatile uint64_t base;          /* the writer's offset of the first byte counted */
	volatile uint64_t read;          /* bytes every reader read since */
	volatile uint64_t offset;        /* the writer's OFFSET it was set for */
} pipe_count;

typedef struct expect {
	volatile int state;              /* 0 free, 1 being written, 2 waiting */
	int kind;                        /* AG_FLOW_* */
	int family;
	uint8_t src[16], dst[16];        /* the sender's end, the receiver's end */
	uint16_t sport, dport;
	bool at_offset;                  /* offset (TCP) or hash (UDP) is known */
	uint64_t offset;                 /* TCP: stream offset; UDP: content hash */
	uint64_t inode;                  /* pipes */
	uint64_t backlog;                /* pipes: bytes queued when armed */
	volatile uint64_t seen;          /* pipes: bytes read since */
	pipe_count *shared;              /* pipes: the count the readers share, or NULL */
	uint64_t until;                  /* CLOCK_MONOTONIC ns: given up after */
} expect;

#define EXPECT_NS 60000000000ull        /* point 8 */
static volatile int expect_mode;         /* given an expectation once: point 8 */

static expect expects[MAX_EXPECT];
static volatile int nexpect;             /* waiting (2) */
static expect came_from[MAX_EXPECT];     /* matched ones (point 3), round robin */
static volatile unsigned ncame;

static long sys(long nr, long a, long b, long c, long d, long e)
{
	long rc;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;

	__asm__ volatile("syscall" : "=a"(rc) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
			 : "rcx", "r11", "memory");
	return rc;
}

static uint64_t now_ns(void)
{
	struct timespec t;

	sys(SYS_clock_gettime, CLOCK_MONOTONIC, (long)&t, 0, 0, 0);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Point 1. */
void ag_propagate_init(const char *name, const char *wait)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0)
		return;
	if (n > 64 || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
	    != n || name[0] == '.') {
		ag_log("propagation off: session name '%.80s' is not 1 to 64 letters, digits, '.', "
		       "'_' or '-'", name);
		return;
	}
	memcpy(session, name, n + 1);
	if (wait && *wait) {
		char *end;
		unsigned long ms = strtoul(wait, &end, 10);

		if (*end || ms > 600000)
			ag_log("propagation: wait '%s' is not a number of milliseconds up to 600000; "
			       "waiting %u ms", wait, wait_ms);
		else
			wait_ms = (uint32_t)ms;
	}
	ag_log("propagation: session %s; a traced send waits up to %u ms for the receiving "
	       "agents", session, wait_ms);
}

const char *ag_propagate_session(void)
{
	return session[0] ? session : NULL;
}

/* For an exec'd image (exec.c): SPTRACE_PROPAGATE_WAIT. */
const char *ag_propagate_wait(void)
{
	static char text[16];

	snprintf(text, sizeof text, "%u", wait_ms);
	return text;
}

bool ag_propagating(void)
{
	return session[0] != '\0';
}

/* ---- asking the daemon (points 2 to 4) ---- */

/* protobuf-c's allocator over an mmap'd arena (point 3). */
typedef struct arena {
	uint8_t *base;
	size_t size, used;
} arena;

static void *arena_alloc(void *data, size_t n)
{
	arena *a = data;
	size_t at = (a->used + 15) & ~(size_t)15;

	if (at + n > a->size)
		return NULL;
	a->used = at + n;
	return a->base + at;
}

static void arena_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

/* All of buf, or -1 (the deadline passed, or the socket failed). */
static int io_all(int fd, uint8_t *buf, size_t len, bool out, uint64_t deadline)
{
	size_t done = 0;

	while (done < len) {
		long rc = out ? sys(SYS_sendto, fd, (long)(buf + done), (long)(len - done),
				    MSG_NOSIGNAL, 0)
			  : sys(SYS_recvfrom, fd, (long)(buf + done), (long)(len - done), 0, 0);

		if (rc > 0) {
			done += (size_t)rc;
			continue;
		}
		if (rc == 0 || (rc != -EINTR && rc != -EAGAIN) || now_ns() >= deadline)
			return -1;
	}
	return 0;
}

static void endpoint(Sptrace__Spd__Endpoint *e, int family, uint8_t *addr, uint16_t port)
{
	e->addr.len = family == AF_INET ? 4 : 16;
	e->addr.data = addr;
	e->port = port;
}

static void format_addr(int family, const uint8_t *addr, uint16_t port, char *out, size_t len)
{
	char a[INET6_ADDRSTRLEN] = "?";

	inet_ntop(family, addr, a, sizeof a);
	snprintf(out, len, family == AF_INET6 ? "[%s]:%u" : "%s:%u", a, port);
}

static __thread volatile int ask_fd __attribute__((tls_model("initial-exec"))) = -1;

/* Point 2: the exchange with the daemon; 0 and *reply, or -1 and why. */
static int exchange(const uint8_t *req, size_t len, arena *ar, Sptrace__Spd__Frame **reply,
		    char *why, size_t whylen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				      strlen(SPD_SOCKET));
	uint64_t deadline = now_ns() + (uint64_t)wait_ms * 1000000ull;
	struct timeval tv = { .tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000 };
	uint8_t head[4];
	uint32_t n;
	long rc;
	int fd;

	memcpy(sa.sun_path + 1, SPD_SOCKET, strlen(SPD_SOCKET));
	fd = (int)sys(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, 0, 0);
	if (fd < 0) {
		snprintf(why, whylen, "no socket: %s", strerror((int)-fd));
		return -1;
	}
	ask_fd = fd;
	ag_fd_keep(&ask_fd, NULL, 0);
	fd = ask_fd;
	sys(SYS_setsockopt, fd, SOL_SOCKET, SO_RCVTIMEO, (long)&tv, sizeof tv);
	sys(SYS_setsockopt, fd, SOL_SOCKET, SO_SNDTIMEO, (long)&tv, sizeof tv);
	rc = sys(SYS_connect, fd, (long)&sa, salen, 0, 0);
	if (rc != 0) {
		snprintf(why, whylen, "%s", rc == -ECONNREFUSED ? "no spdaemon serves this host" :
			 strerror((int)-rc));
		ag_fd_drop(ask_fd);
		return rc == -ECONNREFUSED ? -2 : -1;
	}
	head[0] = (uint8_t)(len >> 24), head[1] = (uint8_t)(len >> 16);
	head[2] = (uint8_t)(len >> 8), head[3] = (uint8_t)len;
	if (io_all(fd, head, 4, true, deadline) || io_all(fd, (uint8_t *)req, len, true, deadline) ||
	    io_all(fd, head, 4, false, deadline)) {
		snprintf(why, whylen, "the spdaemon did not answer within %u ms", wait_ms);
		ag_fd_drop(ask_fd);
		return -1;
	}
	n = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
	if (n > SPD_FRAME_MAX || n > ar->size / 2) {
		snprintf(why, whylen, "the spdaemon's answer is %u bytes: too long", n);
		ag_fd_drop(ask_fd);
		return -1;
	}
	uint8_t *buf = ar->base + ar->size - n;

	ar->size -= n;
	if (io_all(fd, buf, n, false, deadline)) {
		snprintf(why, whylen, "the spdaemon did not answer within %u ms", wait_ms);
		ag_fd_drop(ask_fd);
		return -1;
	}
	ag_fd_drop(ask_fd);
	ProtobufCAllocator alloc = { arena_alloc, arena_free, ar };

	*reply = sptrace__spd__frame__unpack(&alloc, n, buf);
	if (!*reply) {
		snprintf(why, whylen, "the spdaemon's answer does not parse");
		return -1;
	}
	return 0;
}

/* Point 3: a channel whose peer sent us the traced request -- a TCP
 * connection by its 4-tuple, a UNIX stream socket by its inode (the request
 * came in on it) or its peer's (the sender's, awaited before the accept). */
static bool came_from_peer(const ag_flow_chan *fc)
{
	for (unsigned i = 0; i < MAX_EXPECT && i < __atomic_load_n(&ncame, __ATOMIC_ACQUIRE); i++) {
		const expect *e = &came_from[i];

		if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) != 2)
			continue;
		if (e->kind == fc->kind &&
		    fc->kind == AG_FLOW_TCP && e->family == fc->family && e->sport == fc->pport &&
		    e->dport == fc->lport && memcmp(e->src, fc->peer, 16) == 0 &&
		    memcmp(e->dst, fc->local, 16) == 0)
			return true;
		if (fc->kind == AG_FLOW_UNIX &&
		    ((e->kind == AG_FLOW_UNIX && e->inode == fc->src_inode) ||
		     (e->kind == AG_FLOW_UNIXFROM && fc->inode && e->inode == fc->inode)))
			return true;
	}
	return false;
}

int ag_propagate_ask(const ag_flow_chan *fc)
{
	static const char *const kinds[] = { [AG_FLOW_TCP] = "tcp", [AG_FLOW_UDP] = "udp",
					     [AG_FLOW_PIPE] = "pipe", [AG_FLOW_UNIX] = "unix" };
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__InjectRequest q = SPTRACE__SPD__INJECT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;
	Sptrace__Spd__Endpoint src = SPTRACE__SPD__ENDPOINT__INIT, dst = SPTRACE__SPD__ENDPOINT__INIT;
	uint8_t req[512], local[16], peer[16];
	char from[64], to[64], what[160], where[160], why[200] = "";
	uint64_t t0 = now_ns();
	arena ar = { 0 };
	size_t len;
	int rc, saved = errno;

	if (!session[0] || t0 < no_daemon_until || came_from_peer(fc) ||
	    (fc->kind == AG_FLOW_UNIX && !fc->inode && (!fc->src_inode || !fc->path[0])))
		return 0;
	q.channel = &ch;
	q.session = session;
	q.on = (char *)"";
	q.at_offset = fc->at_offset;
	q.offset = fc->offset;
	q.wait_ms = wait_ms;
	q.follow = 1;
	if (fc->kind == AG_FLOW_PIPE || fc->kind == AG_FLOW_UNIX) {
		ch.kind = fc->kind == AG_FLOW_PIPE ? SPTRACE__SPD__CHANNEL__KIND__PIPE
			  : SPTRACE__SPD__CHANNEL__KIND__UNIX;
		ch.inode = fc->inode;
		if (!fc->inode) {                 /* not accepted yet */
			ch.path = (char *)fc->path;
			ch.src_inode = fc->src_inode;
		}
		snprintf(what, sizeof what, fc->inode ? "%s %lu" : "%s %lu -> %s", kinds[fc->kind],
			 (unsigned long)(fc->inode ? fc->inode : fc->src_inode), fc->path);
		snprintf(where, sizeof where, "%lu", (unsigned long)fc->inode);
	} else {
		memcpy(local, fc->local, 16);
		memcpy(peer, fc->peer, 16);
		endpoint(&src, fc->family, local, fc->lport);
		endpoint(&dst, fc->family, peer, fc->pport);
		ch.kind = fc->kind == AG_FLOW_UDP ? SPTRACE__SPD__CHANNEL__KIND__UDP
			  : SPTRACE__SPD__CHANNEL__KIND__TCP;
		ch.src = &src;
		ch.dst = &dst;
		format_addr(fc->family, fc->local, fc->lport, from, sizeof from);
		format_addr(fc->family, fc->peer, fc->pport, to, sizeof to);
		snprintf(what, sizeof what, "%s %s -> %s", kinds[fc->kind], from, to);
		snprintf(where, sizeof where, "%s %s", from, to);
	}
	f.version = SPD_PROTOCOL_VERSION;
	f.id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
	f.body_case = SPTRACE__SPD__FRAME__BODY_INJECT;
	f.inject = &q;
	len = sptrace__spd__frame__get_packed_size(&f);
	if (len > sizeof req) {
		errno = saved;
		return -1;
	}
	sptrace__spd__frame__pack(&f, req);
	ar.size = 2 * SPD_FRAME_MAX + (1u << 20);
	ar.base = mmap(NULL, ar.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ar.base == MAP_FAILED) {
		ag_log("propagation: %s: no memory for the answer", what);
		errno = saved;
		return -1;
	}
	rc = exchange(req, len, &ar, &rep, why, sizeof why);
	double ms = (double)(now_ns() - t0) / 1e6;
	char off[40];

	snprintf(off, sizeof off, fc->kind == AG_FLOW_TCP ? "offset %s%lu" : fc->kind == AG_FLOW_UDP
		 ? "hash %s%lx" : "%s%lu", fc->at_offset ? "" : "~", (unsigned long)fc->offset);
	if (rc == -2) {
		no_daemon_until = now_ns() + NO_DAEMON_NS;
		if (!__atomic_exchange_n(&no_daemon_said, 1, __ATOMIC_RELAXED))
			ag_log("propagation: %s: %s; the agent asks again in 10 s at the earliest "
			       "(start spdaemon to follow requests across processes)", what, why);
	} else if (rc != 0) {
		ag_log("propagation: %s: %s (after %.1f ms); the send goes on, not followed", what,
		       why, ms);
	} else if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		ag_log("propagation: %s: the spdaemon refused: %s (after %.1f ms)", what,
		       rep->error->message, ms);
		ag_meta_note("%s %lu %s %s %s host - targets 0\n", TRACE_META_PROPAGATED,
			     (unsigned long)ag_rdtsc(), kinds[fc->kind], where, off);
	} else if (rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY) {
		Sptrace__Spd__InjectReply *r = rep->inject_reply;
		const char *host = r->host && *r->host ? r->host : "?";
		unsigned got = 0;

		for (size_t i = 0; i < r->n_targets; i++) {
			got += r->targets[i]->injected || r->targets[i]->following;
			ag_log("propagation: %s: host %s pid %d: %s%s", what, host, r->targets[i]->pid,
			       r->targets[i]->injected ? "" : r->targets[i]->following ? "" :
			       "not traced: ", r->targets[i]->why);
		}
		ag_log("propagation: %s: host %s answered in %.1f ms: %u of %zu processes at the "
		       "other end follow%s", what, host, ms, got, r->n_targets,
		       r->n_targets ? "" : " (no process there holds it)");
		ag_meta_note("%s %lu %s %s %s host %s targets %u\n", TRACE_META_PROPAGATED,
			     (unsigned long)ag_rdtsc(), kinds[fc->kind], where, off, host, got);
	}
	munmap(ar.base, ar.size);
	errno = saved;
	return rc == 0 ? 0 : -1;
}

/* ---- expectations (points 5 to 7) ---- */

static int parse_addr(const char *s, int *family, uint8_t out[16])
{
	memset(out, 0, 16);
	if (inet_pton(AF_INET, s, out) == 1) {
		*family = AF_INET;
		return 0;
	}
	if (inet_pton(AF_INET6, s, out) == 1) {
		*family = AF_INET6;
		return 0;
	}
	return -1;
}

/* Point 5, pipes and UNIX sockets: the bytes queued in it now (FIONREAD on
 * one of this process's descriptors of it), which were written before the
 * traced write. */
static uint64_t backlog_of(uint64_t inode)
{
	struct stat st;
	int q;

	for (int fd = 0; fd < 4096; fd++)
		if (sys(SYS_fstat, fd, (long)&st, 0, 0, 0) == 0 &&
		    (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) && (uint64_t)st.st_ino == inode &&
		    sys(SYS_ioctl, fd, FIONREAD, (long)&q, 0, 0) == 0)
			return (uint64_t)q;
	return 0;
}

/* Point 6: the count this pipe's readers share, set up by the first of
 * them for the writer's `offset` (its base: that less the bytes queued
 * then); NULL if there is none, or it was set for another write (another
 * writer's request: its offsets are its own).  Only in a directory that
 * root alone writes (spdaemon's session directory, the parent of a trace it
 * injected), a regular file of this process's user: nothing another user
 * could have put there. */
static pipe_count *pipe_count_of(uint64_t inode, uint64_t offset, uint64_t base)
{
	char path[4200];
	struct stat st;
	char *slash;
	pipe_count *pc;
	long fd;

	snprintf(path, sizeof path, "%s", ag_dir);
	slash = strrchr(path, '/');
	if (!slash || slash == path)
		return NULL;
	*slash = '\0';
	if (sys(SYS_stat, (long)path, (long)&st, 0, 0, 0) != 0 || st.st_uid != 0 ||
	    (st.st_mode & 022))
		return NULL;
	snprintf(slash, sizeof path - (size_t)(slash - path), "/pipe-%llu",
		 (unsigned long long)inode);
	fd = sys(SYS_open, (long)path, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return NULL;
	if (sys(SYS_fstat, fd, (long)&st, 0, 0, 0) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_uid != geteuid() || st.st_size < (off_t)sizeof *pc) {
		sys(SYS_close, fd, 0, 0, 0, 0);
		return NULL;
	}
	pc = mmap(NULL, sizeof *pc, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
	sys(SYS_close, fd, 0, 0, 0, 0);
	if (pc == MAP_FAILED)
		return NULL;
	uint64_t zero = 0;

	if (__atomic_compare_exchange_n(&pc->state, &zero, 1, false, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		pc->base = base;
		pc->read = 0;
		pc->offset = offset;
		__atomic_store_n(&pc->state, 2, __ATOMIC_RELEASE);
	}
	for (int i = 0; i < 1000000 && __atomic_load_n(&pc->state, __ATOMIC_ACQUIRE) != 2; i++)
		__builtin_ia32_pause();
	if (__atomic_load_n(&pc->state, __ATOMIC_ACQUIRE) != 2 || pc->offset != offset) {
		munmap(pc, sizeof *pc);
		return NULL;
	}
	return pc;
}

/* "tcp SRC SPORT DST DPORT OFFSET|-", "udp SRC SPORT DST DPORT HASH|-" or
 * "pipe INODE": 0, or -1 (said in agent.log). */
int ag_expect_add(const char *line)
{
	char kind[8], a[64], b[64], last[32];
	unsigned sp, dp;
	unsigned long long inode;
	int fa, fb;
	expect e = { 0 };

	if (sscanf(line, "unixfrom %llu", &inode) == 1 && inode) {
		e.kind = AG_FLOW_UNIXFROM;      /* not accepted yet: by the peer */
		e.inode = inode;
	} else if ((sscanf(line, "pipe %llu", &inode) == 1 ||
		    sscanf(line, "unix %llu", &inode) == 1) && inode) {
		unsigned long long off;

		e.kind = line[0] == 'p' ? AG_FLOW_PIPE : AG_FLOW_UNIX;
		e.inode = inode;
		e.backlog = backlog_of(inode);
		/* point 6: the sender's offset of its traced write, if it said */
		e.at_offset = sscanf(line + 5, "%*u %llu", &off) == 1;
		e.offset = e.at_offset ? off : 0;
		if (e.at_offset && e.offset < e.backlog) {
			ag_log("expect '%.200s': %lu bytes queued, more than the writer's offset "
			       "(another writer's bytes): this end's offsets stay its own",
			       line, (unsigned long)e.backlog);
			e.at_offset = false;
		}
		if (e.kind == AG_FLOW_PIPE && e.at_offset)
			e.shared = pipe_count_of(inode, e.offset, e.offset - e.backlog);
	} else if (sscanf(line, "%7s %63s %u %63s %u %31s", kind, a, &sp, b, &dp, last) == 6 &&
		   (strcmp(kind, "tcp") == 0 || strcmp(kind, "udp") == 0) && sp <= 65535 &&
		   dp <= 65535 && parse_addr(a, &fa, e.src) == 0 && parse_addr(b, &fb, e.dst) == 0 &&
		   fa == fb) {
		e.kind = kind[0] == 't' ? AG_FLOW_TCP : AG_FLOW_UDP;
		e.family = fa;
		e.sport = (uint16_t)sp;
		e.dport = (uint16_t)dp;
		e.at_offset = strcmp(last, "-") != 0;
		e.offset = e.at_offset ? strtoull(last, NULL, e.kind == AG_FLOW_UDP ? 16 : 10) : 0;
	} else {
		ag_log("expect '%.200s': not 'tcp|udp SRC SPORT DST DPORT OFFSET|HASH|-' or "
		       "'pipe|unix INODE'", line);
		return -1;
	}
	e.until = now_ns() + EXPECT_NS;
	__atomic_store_n(&expect_mode, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < MAX_EXPECT; i++) {
		int zero = 0;

		if (__atomic_compare_exchange_n(&expects[i].state, &zero, 1, false, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED)) {
			e.state = 1;
			expects[i] = e;
			__atomic_store_n(&expects[i].state, 2, __ATOMIC_RELEASE);
			__atomic_add_fetch(&nexpect, 1, __ATOMIC_RELEASE);
			if (e.kind == AG_FLOW_UNIXFROM)
				ag_log("expecting the first read of the connection from UNIX socket "
				       "%llu, once accepted", inode);
			else if (e.kind == AG_FLOW_PIPE || e.kind == AG_FLOW_UNIX)
				ag_log("expecting the read of %s %llu past its %lu bytes queued now "
				       "(the writer's byte %s%lu)", e.kind == AG_FLOW_PIPE ? "pipe"
				       : "unix socket", inode, (unsigned long)e.backlog,
				       e.at_offset ? "" : "~", (unsigned long)e.offset);
			else
				ag_log("expecting the receive of %s %s:%u -> %s:%u %s%s", kind, a, sp,
				       b, dp, !e.at_offset ? "(the first one)" : e.kind == AG_FLOW_TCP
				       ? "at stream offset " : "with content hash ",
				       e.at_offset ? last : "");
			/* spdaemon waits for this line (inject.c, step 4) */
			ag_meta_note("%s %s\n", TRACE_META_EXPECT, line);
			return 0;
		}
	}
	ag_log("expect '%.200s': %d receives are awaited already", line, MAX_EXPECT);
	return -1;
}

bool ag_expecting(void)
{
	return __atomic_load_n(&nexpect, __ATOMIC_ACQUIRE) > 0;
}

bool ag_expect_mode(void)
{
	return __atomic_load_n(&expect_mode, __ATOMIC_ACQUIRE) != 0;
}

/* Point 8: e was not met in time; true if it is given up now. */
static bool expired(expect *e, uint64_t now)
{
	int two = 2;

	if (now < e->until || !__atomic_compare_exchange_n(&e->state, &two, 0, false,
							  __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return false;
	__atomic_sub_fetch(&nexpect, 1, __ATOMIC_RELEASE);
	ag_log("an awaited receive did not come within %llu s: given up (its sender's request "
	       "was not followed here)", EXPECT_NS / 1000000000ull);
	return true;
}

static void addr_bytes(const struct sockaddr_storage *ss, int *family, uint8_t out[16],
		       uint16_t *port)
{
	memset(out, 0, 16);
	*family = ss->ss_family;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)ss;

		memcpy(out, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)ss;

		memcpy(out, &in6->sin6_addr, 16);
		*port = ntohs(in6->sin6_port);
	}
}

uint64_t ag_flow_hash(const void *data, size_t n, uint64_t h)
{
	const uint8_t *p = data;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* What a receive on fd is, for matching (point 6). */
typedef struct seen {
	int kind;                        /* AG_FLOW_*; 0: none of them */
	int family;
	uint8_t l[16], p[16];
	uint16_t lp, pp;
	uint64_t inode;
} seen;

static void what_fd(int fd, seen *w)
{
	struct sockaddr_storage la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	struct stat st;
	int type = 0, lf;
	socklen_t tl = sizeof type;

	memset(w, 0, sizeof *w);
	if (sys(SYS_fstat, fd, (long)&st, 0, 0, 0) != 0)
		return;
	if (S_ISFIFO(st.st_mode)) {
		w->kind = AG_FLOW_PIPE;
		w->inode = st.st_ino;
		return;
	}
	if (!S_ISSOCK(st.st_mode) || sys(SYS_getsockname, fd, (long)&la, (long)&ll, 0, 0) != 0)
		return;
	if (la.ss_family == AF_UNIX) {
		w->kind = AG_FLOW_UNIX;
		w->inode = st.st_ino;
		return;
	}
	if ((la.ss_family != AF_INET && la.ss_family != AF_INET6) ||
	    sys(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tl) != 0)
		return;
	addr_bytes(&la, &lf, w->l, &w->lp);
	w->family = lf;
	if (type == SOCK_DGRAM) {
		w->kind = AG_FLOW_UDP;
		return;
	}
	if (type == SOCK_STREAM && sys(SYS_getpeername, fd, (long)&pa, (long)&pl, 0, 0) == 0) {
		addr_bytes(&pa, &lf, w->p, &w->pp);
		w->kind = AG_FLOW_TCP;
	}
}

static bool is_any(const uint8_t a[16])
{
	static const uint8_t zero[16];

	return memcmp(a, zero, 16) == 0;
}

/* Point 6: is this receive, on fd, of rc bytes (data: them, or NULL) the
 * one e awaits?  *end is the TCP stream's end, read once (-2: not yet); a
 * pipe's or UNIX socket's: the bytes read since arming, this read's too. */
static bool matches(expect *e, const seen *w, int fd, long rc, const void *data, int64_t *end)
{
	if (e->kind == AG_FLOW_UNIXFROM)          /* an accepted socket whose peer sent it */
		return w->kind == AG_FLOW_UNIX && ag_unix_peer(w->inode) == e->inode;
	if (e->kind != w->kind)
		return false;
	switch (e->kind) {
	case AG_FLOW_PIPE:
	case AG_FLOW_UNIX:
		if (e->inode != w->inode)
			return false;
		if (e->shared) {
			/* counted at once, before this thread starts tracing (a
			 * stack walk: another reader's reads meanwhile come
			 * after); *end: this read's first byte, the writer's */
			pipe_count *pc = e->shared;

			*end = (int64_t)(pc->base + __atomic_fetch_add(&pc->read, (uint64_t)rc,
									__ATOMIC_ACQ_REL));
			return (uint64_t)*end + (uint64_t)rc > e->offset;
		}
		/* bytes written before the traced write are read first */
		*end = (int64_t)__atomic_add_fetch(&e->seen, (uint64_t)rc, __ATOMIC_ACQ_REL);
		return (uint64_t)*end > e->backlog;
	case AG_FLOW_UDP:
		if (e->family != w->family || e->dport != w->lp ||
		    (!is_any(w->l) && !is_any(e->dst) && memcmp(e->dst, w->l, 16) != 0))
			return false;
		return !e->at_offset || !data || ag_flow_hash(data, (size_t)rc, AG_FLOW_HASH0) ==
						     e->offset;
	case AG_FLOW_TCP:
		if (e->family != w->family || e->sport != w->pp || e->dport != w->lp ||
		    memcmp(e->src, w->p, 16) != 0 || memcmp(e->dst, w->l, 16) != 0)
			return false;
		if (!e->at_offset)
			return true;
		if (*end == -2) {
			uint64_t e2;

			*end = ag_tcp_received(fd, &e2) == 0 ? (int64_t)e2 : -1;
		}
		/* bytes sent before the traced send start nothing */
		return *end < 0 || (uint64_t)*end > e->offset;
	default:
		return false;
	}
}

/* Point 3: tracing began at an accept or a receive on fd (an activation
 * event, not an awaited receive): its peer sent the request. */
void ag_came_from_fd(int fd)
{
	int saved = errno;
	seen w;

	what_fd(fd, &w);
	if (w.kind == AG_FLOW_UNIX) {
		expect *c = &came_from[__atomic_fetch_add(&ncame, 1, __ATOMIC_ACQ_REL) % MAX_EXPECT];

		__atomic_store_n(&c->state, 0, __ATOMIC_RELEASE);
		c->kind = AG_FLOW_UNIX;
		c->inode = w.inode;
		__atomic_store_n(&c->state, 2, __ATOMIC_RELEASE);
	} else if (w.kind == AG_FLOW_TCP) {
		expect *c = &came_from[__atomic_fetch_add(&ncame, 1, __ATOMIC_ACQ_REL) % MAX_EXPECT];

		__atomic_store_n(&c->state, 0, __ATOMIC_RELEASE);
		c->kind = AG_FLOW_TCP;
		c->family = w.family;
		memcpy(c->src, w.p, 16);
		memcpy(c->dst, w.l, 16);
		c->sport = w.pp;
		c->dport = w.lp;
		__atomic_store_n(&c->state, 2, __ATOMIC_RELEASE);
	}
	errno = saved;
}

bool ag_expect_match(int fd, long rc, const void *data)
{
	int saved = errno;
	int64_t end = -2;
	bool hit = false;
	seen w;

	if (rc <= 0 || !ag_expecting()) {
		errno = saved;
		return false;
	}
	what_fd(fd, &w);
	uint64_t now = now_ns();

	for (int i = 0; i < MAX_EXPECT && !hit && w.kind; i++) {
		expect *e = &expects[i];
		int two = 2;

		if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) != 2 || expired(e, now) ||
		    !matches(e, &w, fd, rc, data, &end) ||
		    !__atomic_compare_exchange_n(&e->state, &two, 1, false, __ATOMIC_ACQ_REL,
						 __ATOMIC_RELAXED))
			continue;
		expect *c = &came_from[__atomic_fetch_add(&ncame, 1, __ATOMIC_ACQ_REL) % MAX_EXPECT];

		__atomic_store_n(&c->state, 0, __ATOMIC_RELEASE);
		*c = *e;
		if (c->kind == AG_FLOW_TCP || c->kind == AG_FLOW_UDP) {
			/* the channel as this end's sends see it (point 2's came-from check) */
			memcpy(c->src, w.p, 16);
			c->sport = w.pp;
		}
		__atomic_store_n(&c->state, 2, __ATOMIC_RELEASE);
		if (c->shared)
			ag_msgs_recv_at(fd, (uint64_t)end, &c->shared->read, c->shared->base);
		else if ((c->kind == AG_FLOW_PIPE || c->kind == AG_FLOW_UNIX) && c->at_offset)
			/* point 6: the backlog's end is the writer's offset; this
			 * read began `end - rc` bytes after arming */
			ag_msgs_recv_at(fd, c->offset - c->backlog + ((uint64_t)end - (uint64_t)rc),
					NULL, 0);
		__atomic_store_n(&e->state, 0, __ATOMIC_RELEASE);
		__atomic_sub_fetch(&nexpect, 1, __ATOMIC_RELEASE);
		hit = true;
	}
	errno = saved;
	return hit;
}
