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
 *     connection, UDP to one peer, a pipe, a connected UNIX stream socket
 *     (its peer's inode, or, unknown here, its own: point 18), a UNIX
 *     datagram to one socket (its inode, or the
 *     path it is bound to); never the standard streams), on the first traced
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
 *     the accepted socket whose peer is the sender's INODE (sock_diag) --
 *     or, a UNIX datagram, `unixdgram INODE HASH`: the datagram to socket
 *     INODE (the daemon finds the one bound to the path a datagram was sent
 *     to) whose bytes hash to HASH.  A
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
 *     of one pipe (pre-forked workers, of any users) each read part of it:
 *     their agents share the readers' count that the daemon made when it
 *     had them follow the send (spdaemon/inject.c: readers_count, one per
 *     session and channel; of a UNIX stream socket, INODE theirs: point
 *     18).  Each agent asks for it as it arms (pipe_count_of: a
 *     CountRequest to the daemon of its network namespace, which serves it
 *     on a thread of its own while another one may be injecting this very
 *     process), and gets it as a writer gets the writers' count (points 15
 *     and 16: a sealed memfd of root's over SCM_RIGHTS, only to a process
 *     that holds the channel's receiving end); the first one to arm sets
 *     it to the writer's OFFSET less its backlog, and each read's first
 *     byte is that base plus the bytes all of them read before it -- exact
 *     while two readers' reads do not race between the read's return and
 *     the count's atomic add.  Without it (refused, no daemon) the reader
 *     counts alone, said in agent.log.  A match is used
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
 * The TCP mark (`mark=oob`, SPTRACE_MARK, `sptrace run --mark oob`; the
 * default marks nothing on the wire: offsets, points 5 and 6):
 *
 *  9. The request asks for it (InjectRequest.mark) unless this program
 *     itself used MSG_OOB (msgs.c tells, ag_mark_program_oob).  Each agent
 *     at the other end takes it (`expect ... oob`) only if no socket of its
 *     process on the channel's receiving address -- the connection, or the
 *     listener it will be accepted from -- has SO_OOBINLINE (the byte would
 *     be read in line) or a SIGURG owner (F_GETOWN: the signal would reach
 *     the program), and its program never used MSG_OOB; else it says why in
 *     agent.log and awaits by offset.  It writes `mark oob|offset LINE` into
 *     its meta before `expect LINE`, and spdaemon answers with each
 *     target's mark (InjectReply.Target.mark).
 * 10. The sender sends the byte only if every process that follows took
 *     it: one byte with MSG_OOB, corked (MSG_MORE) so that it leaves in the
 *     segment of the send's first bytes (no segment of its own, no wait
 *     for an ACK under Nagle).  It takes one sequence number: the channel's
 *     sent offset grows by one, as the kernel's counters do (msgs.c).
 * 11. Out of line, the kernel keeps the byte out of every ordinary read and
 *     stops a read that has copied bytes at it: the receive that starts
 *     after the hole is the send's.  While a mark is awaited, a receive on
 *     the channel's connection first reads the byte if it is there (MSG_OOB,
 *     not waiting: POLLPRI goes away, nothing is left for the program) and
 *     whether the stream stands at the mark (SIOCATMARK; ag_expect_before,
 *     this thread's `pre`): a receive that begins there and gets bytes is
 *     the send's.  (The stream's offset cannot tell: while an urgent byte
 *     is ahead, SIOCINQ counts only the bytes before it.)  A receive the
 *     mark came during (a thread blocked in it), or one of a send that was
 *     not marked after all (another receiver refused the byte), matches as
 *     by offset -- past the sender's offset, where the hole is when there is
 *     one; without it, two bytes (the hole and one) past all the bytes
 *     received at arming -- and only with no mark ahead of it (SIOCATMARK,
 *     an urgent byte still there).  The
 *     matched receive resyncs the channel's received offset (the program
 *     never saw the mark's byte: ag_msgs_resync).
 *
 * The UDP mark (the same `mark=oob`):
 *
 * 12. A datagram to an IPv4 peer asks with a sequence number (mark_seq,
 *     random).  The daemon that forwards the request to the peer's host
 *     first sends that host's daemon a probe datagram carrying the same IP
 *     option (spdaemon/inject.c: the probe), and the peer's daemon keeps
 *     the option only if the probe came with it: IP options that do not
 *     cross the network (stripped, or their datagrams dropped) are never
 *     put on the program's datagram.  The expectation then reads `udp ...
 *     HASH ipopt SEQ`.
 * 13. The option: Record Route (type 7), 11 bytes, its pointer past its end
 *     (full: no router writes into it), its 8 bytes "SPTR" and SEQ; an
 *     unprivileged socket may send it.  A receiving agent takes it (`mark
 *     ipopt LINE` in its meta) on the IPv4 sockets bound to the port that
 *     have no IP_RECVOPTS of the program's: it sets IP_RECVOPTS on them
 *     until the match or the expectation's end.  The sender puts IP_OPTIONS
 *     on its socket for the one send (none of the program's there: checked)
 *     and takes it off after (ag_mark_udp_sent).
 * 14. Before a receive on such a socket, the agent peeks at the datagram
 *     queued first (no bytes, its options only): the one whose option
 *     carries SEQ is the send's.  One queued without it is not, unless its
 *     content hash is the send's (the option did not arrive after all).  A
 *     datagram that came while the thread was in its receive shows no
 *     options: matched by content hash, as without the mark.  The meta's
 *     `matched` line says which (`sptrace replay` prints it).  A program's
 *     own recvmsg never sees the option's control message: msgs.c takes it
 *     out of the program's buffer (ag_mark_strip).
 *
 * A pipe's traced writers (the sending side's count):
 *
 * 15. Writers of one pipe that are one process and the children it forks
 *     count its bytes together in memory they share (msgs.c, point 5).
 *     Others -- programs exec'd apart, processes that opened a named pipe
 *     each, a descriptor passed over a UNIX socket, of any users -- count
 *     them in the session's count of the pipe's writers, 64 bytes (the
 *     count, then the inode) that spdaemon keeps (inject.c: writers_count)
 *     from the first writer that asks about the pipe (point 2) on.  The
 *     first asker's count goes in as it stands (its OFFSET: the bytes
 *     queued ahead of its send); a later asker's send is the count's value
 *     when the daemon reads it, and that is the OFFSET the readers are told
 *     (point 5), not the asker's own count.  The answer names that offset
 *     (InjectReply.sent_offset), and the daemon passes the count with it to
 *     an asker that holds the pipe's write end: a descriptor (SCM_RIGHTS)
 *     of a memfd of root's, sealed against shrinking and growing.
 * 16. The asker takes the descriptor with the answer's first bytes
 *     (recv_head: MSG_CMSG_CLOEXEC; any other descriptor closed at once)
 *     and maps it before its bytes go (sent_count_of, map_count_fd; a
 *     reader's agent takes its readers' count so too, point 6): only a
 *     regular file of root's, sealed so (no mapping of it can fault, whoever else holds
 *     it), 64 bytes, naming its inode -- opened by nobody but the daemon,
 *     never reached by a path -- then closes it (raw system calls; its
 *     number a low one for that instant, as the daemon's socket's), errno
 *     as the program left it.  Its channel's sent count
 *     is that one from then (msgs.c: before_send, point 6): every traced
 *     write of any of them adds its length with one atomic add, so each
 *     write names the bytes it carried, in the order the reader reads them.
 * 17. The mapping goes into a table of the process (ag_pipe_sent), which a
 *     fork copies with the mapping: a child forked after its parent took
 *     the count adds to it from its first write; one forked before takes it
 *     when it asks, on its own first traced write (its channel table is its
 *     own).  One page per pipe a process writes, for good.
 *
 * A UNIX stream socket's traced writers and readers (the same counts):
 *
 * 18. Writers of one connected UNIX stream socket -- a parent and the
 *     programs it exec'd, a client's two processes, each holding the socket
 *     -- count the bytes into its peer in the daemon's writers' count, and
 *     its readers -- pre-forked workers holding one accepted connection --
 *     count the bytes they read in its readers' count, INODE the receiving
 *     socket's in both (the one the request names: each direction of the
 *     connection its own counts, keyed by the socket it flows into), made
 *     and mapped as points 6 and 15 to 17 say for pipes (writers_count,
 *     readers_count, map_count_fd): the request names the sending socket too
 *     (Channel.src_inode), which the asker must hold for the daemon to make
 *     or hand out the writers' count.  A UNIX stream's sender cannot see
 *     what is queued at its peer (a pipe's FIONREAD, point 5): its OFFSET is
 *     its own count, from 0 at its first traced send, which the readers
 *     take as the end of the bytes queued when they armed -- exact when
 *     those were its own earlier bytes or none; an OFFSET below them leaves
 *     each reader's count its own (point 6).  A later writer's OFFSET is
 *     the writers' count's value, as with pipes.  A forked writer cannot
 *     learn its UNIX peer (msgs.c: unix_peer, point 1), but it takes the
 *     count its parent took before the fork: the table (point 17) keys a
 *     UNIX stream's count by the sending socket's inode, which it knows (a
 *     stream socket has one peer: the same channel).  One forked before
 *     that asks on its own first traced write with the sending socket
 *     alone (Channel.src_inode, no inode): the daemon, which serves the
 *     asker's network namespace, finds the peer by its own sock_diag
 *     request (spdaemon/holders.c: spd_unix_peer) for an asker that holds
 *     that socket, and names it in its answer (InjectReply.inode), which
 *     is then the channel's receiving end here as if the child had known
 *     it; a peer not accepted yet has no inode: the listener's path then,
 *     as for any writer (point 5: `unixfrom`).
 *
 * Left: a TCP channel whose sent offsets are relative (msgs.c: tcp_bases,
 * point 4) names no offset, and its receiver starts at the first receive on
 * the channel after arming; a UNIX datagram matched by its content hash is
 * mistaken for an earlier one of the same bytes; traced writers or readers
 * of another session, and one whose daemon did not answer in time (while
 * others took the count), count their bytes each alone; so do the writers
 * and readers of a channel once the daemon keeps SPD_MAX_COUNTS counts
 * (inject.c: kept for its life, lost when it restarts); a write's bytes
 * are counted when its call returns, so two writers (or two readers, point
 * 6) whose calls race between one's return and the other's add name each
 * other's bytes, and so does a reader following already when another
 * writer's bytes reach the pipe between the daemon's read of the count for
 * a later asker and that reader's arming (it lines up on the asker's
 * OFFSET, point 6); bytes an untraced writer puts into the pipe after the
 * first traced write are counted by its readers, not by its writers; a UNIX
 * stream's first traced writer cannot see what is queued at its peer: its
 * OFFSET is its own count, wrong when another process's bytes are queued
 * and fewer than it (point 18); each awaited pipe read maps its readers' count
 * for good (a page per request that reached this process) and holds, for
 * the instant of its descriptor's passing, a low descriptor number
 * (point 16); a receiving program
 * that sets SO_OOBINLINE or reads MSG_OOB after its agent took the mark
 * would see it (checked at arming only); only the followed datagram carries
 * the IP option, not every datagram of the channel (the analysis numbers
 * datagrams in time order: analysis/flows.c, rule 5); a program's recvmsg
 * whose control buffer had room for its own messages but not for the
 * option's too gets MSG_CTRUNC and loses some of its own; a program that
 * reads IP_RECVOPTS back while a datagram is awaited sees the agent's 1.
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
#include "arch.h"
#include "spd.pb-c.h"

#define SPD_SOCKET "sptrace-spdaemon"   /* spdaemon/spd.h: SPD_SOCKET */
#define SPD_PROTOCOL_VERSION 1          /* spdaemon/spd.h */
#define SPD_FRAME_MAX (1u << 20)        /* spdaemon/spd.h */
#define NO_DAEMON_NS 10000000000ull     /* point 4 */
#define MAX_EXPECT 64

static char session[65];
static uint32_t wait_ms = 3000;
static bool mark_oob;                    /* point 9: this agent's TCP sends */
static volatile int program_oob;         /* the program used MSG_OOB (msgs.c) */
#define MARK_BYTE 0xa5
static volatile uint64_t no_daemon_until;
static volatile int no_daemon_said;
static volatile uint64_t next_id = 1;

/* The writers' count of a pipe or a UNIX stream's receiving socket
 * (spdaemon/inject.c: writers_count), mapped by the agent of each traced
 * writer of the channel (points 15 to 18). */
typedef struct sent_count {
	volatile uint64_t sent;          /* the writers' count: the next byte written */
	uint64_t inode;                  /* the pipe's, the receiving UNIX socket's */
	uint64_t unused[6];
} sent_count;

#define MAX_SENT 64
#define COUNT_FILE_BYTES 64              /* spdaemon/inject.c: a count file's size */
static struct {
	volatile uint64_t inode;         /* the pipe's, the sending UNIX socket's (point
	                                  * 18); 0: free; set after count and kind */
	int kind;                        /* AG_FLOW_PIPE, AG_FLOW_UNIX */
	sent_count *count;
} sents[MAX_SENT];                       /* point 17: copied by fork with the mappings */
static volatile unsigned nsents;

/* The readers' count of a pipe or a UNIX stream's receiving socket
 * (spdaemon/inject.c: readers_count), mapped by the agent of each reader of
 * the channel (point 6). */
typedef struct pipe_count {
	volatile uint64_t state;         /* 0 new, 1 being set, 2 set */
	uint64_t inode;                  /* the pipe's, the receiving UNIX socket's */
	volatile uint64_t base;          /* the writer's offset of the first byte counted */
	volatile uint64_t read;          /* bytes every reader read since */
	volatile uint64_t offset;        /* the writer's OFFSET it was set for */
	uint64_t unused[3];
} pipe_count;

_Static_assert(sizeof(sent_count) == COUNT_FILE_BYTES && sizeof(pipe_count) == COUNT_FILE_BYTES &&
	       offsetof(sent_count, inode) == offsetof(pipe_count, inode),
	       "a count is what spdaemon makes");

typedef struct expect {
	volatile int state;              /* 0 free, 1 being written, 2 waiting */
	int kind;                        /* AG_FLOW_* */
	int family;
	uint8_t src[16], dst[16];        /* the sender's end, the receiver's end */
	uint16_t sport, dport;
	bool at_offset;                  /* offset (TCP) or hash (UDP) is known */
	bool oob;                        /* TCP: awaits the urgent byte (point 11) */
	bool armed_known;                /* oob: armed_pos is known */
	uint64_t armed_pos;              /* oob: the bytes received at arming (the mark
	                                  * comes after them) */
	bool ipopt;                      /* UDP: awaits the IP option seq (point 13) */
	uint32_t seq;
	int nopt;                        /* sockets the agent set IP_RECVOPTS on */
	int optfd[8];
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
static volatile int noob;                /* waiting with oob (point 11) */
static expect came_from[MAX_EXPECT];     /* matched ones (point 3), round robin */
static volatile unsigned ncame;

static long sys(long nr, long a, long b, long c, long d, long e)
{
	return ag_arch_syscall6(nr, a, b, c, d, e, 0);
}

/* Point 1. */
void ag_propagate_init(const char *name, const char *wait, const char *mark)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0)
		return;
	if (mark && strcmp(mark, "oob") == 0)
		mark_oob = true;
	else if (mark && *mark && strcmp(mark, "offset") != 0)
		ag_log("propagation: mark '%.40s' is not 'offset' or 'oob'; marking by offset",
		       mark);
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
	       "agents; TCP sends marked by %s", session, wait_ms,
	       mark_oob ? "an urgent byte (oob)" : "their stream offset");
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

const char *ag_propagate_mark(void)
{
	return mark_oob ? "oob" : "offset";
}

void ag_mark_program_oob(void)
{
	if (!__atomic_exchange_n(&program_oob, 1, __ATOMIC_ACQ_REL) && session[0])
		ag_log("propagation: the program uses MSG_OOB: its TCP channels are marked by "
		       "offset, never by an urgent byte");
}

/* Point 10: the urgent byte, corked into the send's first segment. */
int ag_mark_send(int fd)
{
	static const uint8_t b = MARK_BYTE;
	long rc = sys(SYS_sendto, fd, (long)&b, 1, MSG_OOB | MSG_MORE | MSG_NOSIGNAL, 0);

	if (rc != 1)
		ag_log("propagation: fd %d: the mark's urgent byte was not sent (%s); its "
		       "receivers will not start at this send", fd, strerror(rc < 0 ? (int)-rc : EAGAIN));
	return rc == 1 ? 0 : -1;
}

static uint32_t udp_seq(void)
{
	uint64_t h = ag_flow_hash(&(uint64_t){ ag_rdtsc() }, 8, AG_FLOW_HASH0);
	uint32_t s = (uint32_t)(h ^ h >> 32 ^ (uint64_t)getpid() << 8);

	return s ? s : 1;
}

volatile int ag_udp_marking;
static __thread int udp_mark_fd __attribute__((tls_model("initial-exec"))) = -1;

/* Point 13, the sender: the option on fd for its next send. */
void ag_mark_udp(int fd, uint32_t seq)
{
	uint8_t o[SP_IPMARK_LEN], had[40];
	socklen_t hl = sizeof had;
	long rc;

	if (sys(SYS_getsockopt, fd, IPPROTO_IP, IP_OPTIONS, (long)had, (long)&hl) == 0 && hl) {
		ag_log("propagation: fd %d has IP options of the program's: its datagram is not "
		       "marked (its receivers match it by content hash)", fd);
		return;
	}
	sp_ipmark_build(o, seq);
	rc = sys(SYS_setsockopt, fd, IPPROTO_IP, IP_OPTIONS, (long)o, sizeof o);
	if (rc != 0) {
		ag_log("propagation: fd %d: IP_OPTIONS: %s; its datagram is not marked (its "
		       "receivers match it by content hash)", fd, strerror((int)-rc));
		return;
	}
	udp_mark_fd = fd;
	__atomic_add_fetch(&ag_udp_marking, 1, __ATOMIC_RELEASE);
}

void ag_mark_udp_sent(int fd)
{
	int saved = errno;

	if (udp_mark_fd != fd)
		return;
	sys(SYS_setsockopt, fd, IPPROTO_IP, IP_OPTIONS, 0, 0);
	udp_mark_fd = -1;
	__atomic_sub_fetch(&ag_udp_marking, 1, __ATOMIC_RELEASE);
	errno = saved;
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
	size_t mapped;                   /* the mapping's length (exchange() takes the
	                                  * answer's bytes off the end of `size`) */
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
		if (rc == 0 || (rc != -EINTR && rc != -EAGAIN) || ag_mono_ns() >= deadline)
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

/* Point 16: the answer's length, and the descriptor that comes with it
 * (SCM_RIGHTS, close-on-exec: the writers' count) in *cfd, or -1; any
 * other descriptor that came is closed at once. */
static int recv_head(int fd, uint8_t *head, int *cfd, uint64_t deadline)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} u;
	struct iovec io = { .iov_base = head, .iov_len = 4 };
	struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b,
			    .msg_controllen = sizeof u.b };
	long rc;

	do
		rc = sys(SYS_recvmsg, fd, (long)&m, MSG_CMSG_CLOEXEC, 0, 0);
	while ((rc == -EINTR || rc == -EAGAIN) && ag_mono_ns() < deadline);
	for (struct cmsghdr *cm = rc > 0 ? CMSG_FIRSTHDR(&m) : NULL; cm; cm = CMSG_NXTHDR(&m, cm))
		for (size_t k = 0; cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
		     k < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
			int x;

			memcpy(&x, CMSG_DATA(cm) + k * sizeof(int), sizeof x);
			if (*cfd < 0)
				*cfd = x;
			else
				sys(SYS_close, x, 0, 0, 0, 0);
		}
	if (rc <= 0)
		return -1;
	return io_all(fd, head + rc, 4 - (size_t)rc, false, deadline);
}

/* Point 2: the exchange with the daemon; 0 and *reply (and *cfd, point 16,
 * or -1: the caller closes it), or -1 and why. */
static int exchange(const uint8_t *req, size_t len, arena *ar, Sptrace__Spd__Frame **reply,
		    int *cfd, char *why, size_t whylen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				      strlen(SPD_SOCKET));
	uint64_t deadline = ag_mono_ns() + (uint64_t)wait_ms * 1000000ull;
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
	*cfd = -1;
	if (io_all(fd, head, 4, true, deadline) || io_all(fd, (uint8_t *)req, len, true, deadline) ||
	    recv_head(fd, head, cfd, deadline)) {
		snprintf(why, whylen, "the spdaemon did not answer within %u ms", wait_ms);
		goto fail;
	}
	n = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
	if (n > SPD_FRAME_MAX || n > ar->size / 2) {
		snprintf(why, whylen, "the spdaemon's answer is %u bytes: too long", n);
		goto fail;
	}
	uint8_t *buf = ar->base + ar->size - n;

	ar->size -= n;
	if (io_all(fd, buf, n, false, deadline)) {
		snprintf(why, whylen, "the spdaemon did not answer within %u ms", wait_ms);
		goto fail;
	}
	ag_fd_drop(ask_fd);
	ProtobufCAllocator alloc = { arena_alloc, arena_free, ar };

	*reply = sptrace__spd__frame__unpack(&alloc, n, buf);
	if (!*reply) {
		snprintf(why, whylen, "the spdaemon's answer does not parse");
		goto drop;
	}
	return 0;
fail:
	ag_fd_drop(ask_fd);
drop:
	if (*cfd >= 0)
		sys(SYS_close, *cfd, 0, 0, 0, 0);
	*cfd = -1;
	return -1;
}

volatile uint64_t *ag_pipe_sent(int kind, uint64_t inode)
{
	unsigned n = __atomic_load_n(&nsents, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; inode && i < n && i < MAX_SENT; i++)
		if (__atomic_load_n(&sents[i].inode, __ATOMIC_ACQUIRE) == inode &&
		    sents[i].kind == kind)
			return &sents[i].count->sent;
	return NULL;
}

/* A count spdaemon passed (points 6 and 16), mapped from its descriptor
 * `fd` (not closed here): only a memfd of root's sealed against shrinking
 * and growing (no mapping of it can fault, whoever else holds it),
 * COUNT_FILE_BYTES long, naming `inode` -- opened by nobody but the daemon,
 * never reached by a path.  NULL, and why, if not. */
static void *map_count_fd(long fd, uint64_t inode, const char *what, char *why, size_t len)
{
	struct stat st;
	long seals;
	void *p;

	if (sys(SYS_fstat, fd, (long)&st, 0, 0, 0) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size != COUNT_FILE_BYTES || st.st_uid != 0 ||
	    (seals = sys(SYS_fcntl, fd, F_GET_SEALS, 0, 0, 0)) < 0 ||
	    (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		snprintf(why, len, "the spdaemon's descriptor is not a count of %d bytes of root's, "
			 "sealed", COUNT_FILE_BYTES);
		return NULL;
	}
	p = mmap(NULL, COUNT_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
	if (p == MAP_FAILED) {
		snprintf(why, len, "%s: cannot map it", what);
		return NULL;
	}
	if (((sent_count *)p)->inode != inode) {
		munmap(p, COUNT_FILE_BYTES);
		snprintf(why, len, "the spdaemon's %s counts another channel", what);
		return NULL;
	}
	return p;
}

/* Point 16: the count the daemon passed (its descriptor `cfd`, closed by
 * the caller) for pipe `inode` (kind AG_FLOW_PIPE) or the UNIX stream from
 * socket `src` into socket `inode` (AG_FLOW_UNIX, point 18), mapped (once
 * per process: point 17); NULL, and why, if it is not a count of this
 * channel. */
static volatile uint64_t *sent_count_of(int kind, int cfd, uint64_t inode, uint64_t src,
					char *why, size_t len)
{
	uint64_t key = kind == AG_FLOW_PIPE ? inode : src;
	volatile uint64_t *have = ag_pipe_sent(kind, key);
	sent_count *sc;

	if (have)
		return have;
	if (cfd < 0) {
		snprintf(why, len, "the spdaemon passed no count of its writers: see its log");
		return NULL;
	}
	if (!(sc = map_count_fd(cfd, inode, "writers' count", why, len)))
		return NULL;
	unsigned i = __atomic_fetch_add(&nsents, 1, __ATOMIC_ACQ_REL);

	if (i < MAX_SENT) {
		sents[i].count = sc;
		sents[i].kind = kind;
		__atomic_store_n(&sents[i].inode, key, __ATOMIC_RELEASE);
	} else {
		__atomic_store_n(&nsents, MAX_SENT, __ATOMIC_RELEASE);
	}
	return &sc->sent;
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

int ag_propagate_ask(ag_flow_chan *fc)
{
	static const char *const kinds[] = { [AG_FLOW_TCP] = "tcp", [AG_FLOW_UDP] = "udp",
					     [AG_FLOW_PIPE] = "pipe", [AG_FLOW_UNIX] = "unix",
					     [AG_FLOW_UNIXFROM] = "unixfrom",
					     [AG_FLOW_UNIXDGRAM] = "unixdgram" };
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__InjectRequest q = SPTRACE__SPD__INJECT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;
	Sptrace__Spd__Endpoint src = SPTRACE__SPD__ENDPOINT__INIT, dst = SPTRACE__SPD__ENDPOINT__INIT;
	uint8_t req[512], local[16], peer[16];
	char from[64], to[64], what[160], where[160], why[200] = "";
	uint64_t t0 = ag_mono_ns();
	arena ar = { 0 };
	size_t len;
	int rc, cfd = -1, saved = errno;

	if (!session[0] || t0 < no_daemon_until || came_from_peer(fc) ||
	    (fc->kind == AG_FLOW_UNIX && !fc->inode && !fc->src_inode) ||
	    (fc->kind == AG_FLOW_UNIXDGRAM && !fc->inode && !fc->path[0]))
		return 0;
	q.channel = &ch;
	q.session = session;
	q.on = (char *)"";
	q.at_offset = fc->at_offset;
	q.offset = fc->offset;
	q.wait_ms = wait_ms;
	q.follow = 1;
	/* the session's way, for the receivers' own sends; this one's byte
	 * never where the program uses MSG_OOB itself */
	q.mark = (char *)(mark_oob && (fc->kind != AG_FLOW_TCP ||
				       !__atomic_load_n(&program_oob, __ATOMIC_ACQUIRE)) ? "oob" : "");
	if (fc->kind == AG_FLOW_UDP && *q.mark && fc->family == AF_INET && fc->at_offset)
		q.mark_seq = fc->mark_seq = udp_seq();           /* point 12 */
	if (fc->kind == AG_FLOW_UNIXDGRAM) {
		/* the receiving socket, or the path it is bound to */
		ch.kind = SPTRACE__SPD__CHANNEL__KIND__UNIX_DGRAM;
		ch.inode = fc->inode;
		ch.path = (char *)(fc->inode ? "" : fc->path);
		if (fc->inode)
			snprintf(what, sizeof what, "%s %lu", kinds[fc->kind], (unsigned long)fc->inode);
		else
			snprintf(what, sizeof what, "%s -> %s", kinds[fc->kind], fc->path);
		snprintf(where, sizeof where, "%lu", (unsigned long)fc->inode);
	} else if (fc->kind == AG_FLOW_PIPE || fc->kind == AG_FLOW_UNIX) {
		ch.kind = fc->kind == AG_FLOW_PIPE ? SPTRACE__SPD__CHANNEL__KIND__PIPE
			  : SPTRACE__SPD__CHANNEL__KIND__UNIX;
		ch.inode = fc->inode;
		if (!fc->inode)                   /* not accepted yet, or unknown here */
			ch.path = (char *)fc->path;
		if (fc->kind == AG_FLOW_UNIX)     /* the writers' count holds it (point 18) */
			ch.src_inode = fc->src_inode;
		snprintf(what, sizeof what, fc->inode ? "%s %lu" : "%s %lu -> %s", kinds[fc->kind],
			 (unsigned long)(fc->inode ? fc->inode : fc->src_inode),
			 fc->path[0] ? fc->path : "its peer");
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
	ar.size = ar.mapped = 2 * SPD_FRAME_MAX + (1u << 20);
	ar.base = mmap(NULL, ar.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ar.base == MAP_FAILED) {
		ag_log("propagation: %s: no memory for the answer", what);
		errno = saved;
		return -1;
	}
	rc = exchange(req, len, &ar, &rep, &cfd, why, sizeof why);
	double ms = (double)(ag_mono_ns() - t0) / 1e6;
	char off[40];

	/* point 18: a peer this process could not learn, the daemon found */
	if (rc == 0 && fc->kind == AG_FLOW_UNIX && !fc->inode &&
	    rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY && rep->inject_reply->inode) {
		fc->inode = rep->inject_reply->inode;
		snprintf(where, sizeof where, "%lu", (unsigned long)fc->inode);
	}

	if (rc == 0 && (fc->kind == AG_FLOW_PIPE || (fc->kind == AG_FLOW_UNIX && fc->inode)) &&
	    rep->body_case == SPTRACE__SPD__FRAME__BODY_INJECT_REPLY) {  /* points 15, 16, 18 */
		const char *path = rep->inject_reply->sent_count;
		char no[300] = "";

		if ((fc->sent = sent_count_of(fc->kind, cfd, fc->inode, fc->src_inode, no,
					      sizeof no))) {
			if (rep->inject_reply->sent_offset != fc->offset)
				ag_log("propagation: %s: its traced writers count its bytes together "
				       "(%.200s): this send is their byte %llu (this process counted "
				       "%llu)", what, path,
				       (unsigned long long)rep->inject_reply->sent_offset,
				       (unsigned long long)fc->offset);
			fc->offset = rep->inject_reply->sent_offset;
		} else {
			ag_log("propagation: %s: this process counts its bytes alone (%s); a reader's "
			       "reads may name other bytes than another traced writer's writes", what,
			       no);
		}
	}
	if (cfd >= 0)
		sys(SYS_close, cfd, 0, 0, 0, 0);
	snprintf(off, sizeof off, fc->kind == AG_FLOW_TCP ? "offset %s%lu" : fc->kind == AG_FLOW_UDP ||
		 fc->kind == AG_FLOW_UNIXDGRAM ? "hash %s%lx" : "%s%lu", fc->at_offset ? "" : "~",
		 (unsigned long)fc->offset);
	if (rc == -2) {
		no_daemon_until = ag_mono_ns() + NO_DAEMON_NS;
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
		unsigned got = 0, oob = 0, ipopt = 0;

		for (size_t i = 0; i < r->n_targets; i++) {
			bool in = r->targets[i]->injected || r->targets[i]->following;

			got += in;
			oob += in && r->targets[i]->mark && strcmp(r->targets[i]->mark, "oob") == 0;
			ipopt += in && r->targets[i]->mark && strcmp(r->targets[i]->mark, "ipopt") == 0;
			ag_log("propagation: %s: host %s pid %d: %s%s", what, host, r->targets[i]->pid,
			       r->targets[i]->injected ? "" : r->targets[i]->following ? "" :
			       "not traced: ", r->targets[i]->why);
		}
		/* point 10: the byte only if every follower awaits it */
		bool mark = fc->kind == AG_FLOW_TCP && *q.mark && got && oob == got;
		bool opt = fc->kind == AG_FLOW_UDP && q.mark_seq && got && ipopt == got;

		ag_log("propagation: %s: host %s answered in %.1f ms: %u of %zu processes at the "
		       "other end follow%s%s", what, host, ms, got, r->n_targets,
		       r->n_targets ? "" : " (no process there holds it)",
		       !*q.mark || !got || (fc->kind != AG_FLOW_TCP && !q.mark_seq) ? ""
		       : mark ? "; marked by an urgent byte (oob)"
		       : opt ? "; marked by an IP option (ipopt)"
		       : fc->kind == AG_FLOW_UDP ? "; matched by content hash (no IP option: see the "
						   "receivers' agent.log and the daemons' logs)"
		       : "; marked by offset (a follower cannot take an urgent byte)");
		ag_meta_note("%s %lu %s %s %s host %s targets %u%s\n", TRACE_META_PROPAGATED,
			     (unsigned long)ag_rdtsc(), kinds[fc->kind], where, off, host, got,
			     mark ? " mark oob" : opt ? " mark ipopt" : "");
		if (mark)
			rc = AG_MARK_OOB;
		if (opt)
			rc = AG_MARK_IPOPT;
	}
	munmap(ar.base, ar.mapped);
	errno = saved;
	return rc >= 0 ? rc : -1;
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

static void addr_bytes(const struct sockaddr_storage *ss, int *family, uint8_t out[16],
		       uint16_t *port);
static bool is_any(const uint8_t a[16]);

/* Point 9: can e's receiving end take an urgent byte unseen?  Looks at this
 * process's sockets on e's receiving address: the connection from e's
 * sender (where its stream stands now: e->armed_pos) or a listener it
 * will be accepted from (an accepted socket inherits its options).  false
 * and why. */
static bool oob_usable(expect *e, char *why, size_t len)
{
	if (__atomic_load_n(&program_oob, __ATOMIC_ACQUIRE)) {
		snprintf(why, len, "the program uses MSG_OOB");
		return false;
	}
	for (int fd = 0; fd < 4096; fd++) {
		struct sockaddr_storage la, pa;
		socklen_t ll = sizeof la, pl = sizeof pa, ol = sizeof(int);
		struct f_owner_ex own = { 0 };
		uint8_t l[16], p[16];
		uint16_t lp = 0, pp = 0;
		int fam, type = 0, inl = 0;
		socklen_t tl = sizeof type;

		if (ag_fd_is_ours(fd) || sys(SYS_getsockname, fd, (long)&la, (long)&ll, 0, 0) != 0 ||
		    la.ss_family != e->family ||
		    sys(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tl) != 0 ||
		    type != SOCK_STREAM)
			continue;
		addr_bytes(&la, &fam, l, &lp);
		if (lp != e->dport || (!is_any(l) && memcmp(l, e->dst, 16) != 0))
			continue;
		bool conn = sys(SYS_getpeername, fd, (long)&pa, (long)&pl, 0, 0) == 0;

		if (conn) {
			addr_bytes(&pa, &fam, p, &pp);
			if (pp != e->sport || memcmp(p, e->src, 16) != 0)
				continue;          /* another connection to the same port */
		}
		if (sys(SYS_getsockopt, fd, SOL_SOCKET, SO_OOBINLINE, (long)&inl, (long)&ol) == 0 &&
		    inl) {
			snprintf(why, len, "fd %d has SO_OOBINLINE (the byte would be read in line)",
				 fd);
			return false;
		}
		if (sys(SYS_fcntl, fd, F_GETOWN_EX, (long)&own, 0, 0) == 0 && own.pid) {
			snprintf(why, len, "fd %d has an owner of its SIGURG (F_SETOWN %d)", fd,
				 own.pid);
			return false;
		}
		struct tcp_info ti;
		socklen_t til = sizeof ti;

		if (conn && sys(SYS_getsockopt, fd, IPPROTO_TCP, TCP_INFO, (long)&ti, (long)&til) == 0 &&
		    til >= offsetof(struct tcp_info, tcpi_bytes_received) + 8) {
			e->armed_pos = ti.tcpi_bytes_received;
			e->armed_known = true;
		}
	}
	return true;
}

volatile int ag_recvopts_on;            /* sockets with the agent's IP_RECVOPTS */

/* Point 13: e's IPv4 sockets bound to its port take IP_RECVOPTS, if none has
 * it from the program; false and why. */
static bool ipopt_usable(expect *e, char *why, size_t len)
{
	int fds[8], n = 0, one = 1;

	if (e->family != AF_INET) {
		snprintf(why, len, "IPv6 (the agent's option is IPv4's)");
		return false;
	}
	for (int fd = 0; fd < 4096 && n < 8; fd++) {
		struct sockaddr_storage la;
		socklen_t ll = sizeof la, ol = sizeof(int), tl = sizeof(int);
		uint8_t l[16];
		uint16_t lp = 0;
		int fam, type = 0, on = 0;

		if (ag_fd_is_ours(fd) || sys(SYS_getsockname, fd, (long)&la, (long)&ll, 0, 0) != 0 ||
		    la.ss_family != AF_INET ||
		    sys(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tl) != 0 ||
		    type != SOCK_DGRAM)
			continue;
		addr_bytes(&la, &fam, l, &lp);
		if (lp != e->dport || (!is_any(l) && memcmp(l, e->dst, 16) != 0))
			continue;
		if (sys(SYS_getsockopt, fd, IPPROTO_IP, IP_RECVOPTS, (long)&on, (long)&ol) != 0 || on) {
			snprintf(why, len, "fd %d has IP_RECVOPTS of the program's (it would see the "
				 "option)", fd);
			return false;
		}
		fds[n++] = fd;
	}
	if (!n) {
		snprintf(why, len, "no IPv4 datagram socket of this process is bound to port %u",
			 e->dport);
		return false;
	}
	for (int i = 0; i < n; i++)
		if (sys(SYS_setsockopt, fds[i], IPPROTO_IP, IP_RECVOPTS, (long)&one, sizeof one) == 0)
			e->optfd[e->nopt++] = fds[i];
	__atomic_add_fetch(&ag_recvopts_on, e->nopt, __ATOMIC_RELEASE);
	return e->nopt > 0;
}

/* Point 13: e's sockets as the program left them. */
static void recvopts_off(expect *e)
{
	int zero = 0, n = e->nopt;

	for (int i = 0; i < n; i++)
		sys(SYS_setsockopt, e->optfd[i], IPPROTO_IP, IP_RECVOPTS, (long)&zero, sizeof zero);
	e->nopt = 0;
	if (n)
		__atomic_sub_fetch(&ag_recvopts_on, n, __ATOMIC_RELEASE);
}

/* Point 14: the option's control message out of the program's recvmsg on
 * a socket the agent set IP_RECVOPTS on. */
void ag_mark_strip(int fd, struct msghdr *m)
{
	bool ours = false;

	for (int i = 0; i < MAX_EXPECT && !ours; i++)
		for (int k = 0; k < expects[i].nopt && !ours; k++)
			ours = expects[i].optfd[k] == fd;
	if (!ours || !m)
		return;
	if (!m->msg_control || !m->msg_controllen) {
		m->msg_flags &= ~MSG_CTRUNC;    /* the option found no room: asked for none */
		return;
	}
	char *p = m->msg_control, *out = p;
	size_t left = m->msg_controllen;

	/* each message moved down over the ones taken out; the next found
	 * before (the move may cover this one's header, never the next's) */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m), *nx; c; c = nx) {
		nx = CMSG_NXTHDR(m, c);
		size_t sz = nx ? (size_t)((char *)nx - (char *)c) : (size_t)(p + left - (char *)c);

		if (c->cmsg_level == IPPROTO_IP && (c->cmsg_type == IP_RECVOPTS ||
						    c->cmsg_type == IP_OPTIONS))
			continue;
		if ((char *)c != out)
			memmove(out, c, sz);
		out += sz;
	}
	m->msg_controllen = (size_t)(out - p);
}

/* Point 6: the readers' count of pipe `inode` (kind AG_FLOW_PIPE) or of
 * UNIX socket `inode` (AG_FLOW_UNIX), asked of the daemon (a CountRequest:
 * it answers only an asker that holds the channel's receiving end, with the
 * count's descriptor, point 16's way), mapped; NULL, and why, if not. */
static pipe_count *readers_count_of(int kind, uint64_t inode, char *why, size_t len)
{
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__CountRequest q = SPTRACE__SPD__COUNT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;
	uint8_t req[256];
	arena ar = { .size = 1u << 16, .mapped = 1u << 16 };
	pipe_count *pc = NULL;
	int cfd = -1, rc;

	ch.kind = kind == AG_FLOW_PIPE ? SPTRACE__SPD__CHANNEL__KIND__PIPE
		  : SPTRACE__SPD__CHANNEL__KIND__UNIX;
	ch.inode = inode;
	q.session = session;
	q.channel = &ch;
	f.version = SPD_PROTOCOL_VERSION;
	f.id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
	f.body_case = SPTRACE__SPD__FRAME__BODY_COUNT;
	f.count = &q;
	if (sptrace__spd__frame__get_packed_size(&f) > sizeof req) {
		snprintf(why, len, "the request is too long");
		return NULL;
	}
	ar.base = mmap(NULL, ar.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ar.base == MAP_FAILED) {
		snprintf(why, len, "no memory for the answer");
		return NULL;
	}
	rc = exchange(req, sptrace__spd__frame__pack(&f, req), &ar, &rep, &cfd, why, len);
	if (rc == 0 && rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR)
		snprintf(why, len, "the spdaemon refused: %.200s", rep->error->message);
	else if (rc == 0 && rep->body_case != SPTRACE__SPD__FRAME__BODY_COUNT_REPLY)
		snprintf(why, len, "the spdaemon answered something else");
	else if (rc == 0 && cfd < 0)
		snprintf(why, len, "the spdaemon passed no count");
	else if (rc == 0)
		pc = map_count_fd(cfd, inode, "readers' count", why, len);
	if (cfd >= 0)
		sys(SYS_close, cfd, 0, 0, 0, 0);
	munmap(ar.base, ar.mapped);
	return pc;
}

/* Point 6: the count this channel's readers share, set up by the first of
 * them for the writer's `offset` (its base: that less the bytes queued
 * then); NULL if there is none (said in agent.log), or it was set for
 * another write (another writer's request: its offsets are its own). */
static pipe_count *pipe_count_of(const char *line, int kind, uint64_t inode, uint64_t offset,
				 uint64_t base)
{
	char why[300];
	pipe_count *pc = readers_count_of(kind, inode, why, sizeof why);
	uint64_t zero = 0;

	if (!pc) {
		ag_log("expect '%.200s': no count shared with the channel's other readers (%s): "
		       "this reader counts alone", line, why);
		return NULL;
	}
	if (__atomic_compare_exchange_n(&pc->state, &zero, 1, false, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		pc->base = base;
		pc->read = 0;
		pc->offset = offset;
		__atomic_store_n(&pc->state, 2, __ATOMIC_RELEASE);
	}
	for (int i = 0; i < 1000000 && __atomic_load_n(&pc->state, __ATOMIC_ACQUIRE) != 2; i++)
		ag_arch_relax();
	if (__atomic_load_n(&pc->state, __ATOMIC_ACQUIRE) != 2 || pc->offset != offset) {
		munmap(pc, COUNT_FILE_BYTES);
		return NULL;
	}
	return pc;
}

/* "tcp SRC SPORT DST DPORT OFFSET|- [oob]", "udp SRC SPORT DST DPORT
 * HASH|- [ipopt SEQ]", "pipe INODE [OFFSET]", "unix INODE [OFFSET]", "unixdgram INODE HASH|-": 0, or
 * -1 (said in agent.log). */
int ag_expect_add(const char *line)
{
	char kind[8], a[64], b[64], last[32], mark[8], why[200];
	unsigned sp, dp;
	unsigned long long inode;
	int fa, fb, nf;
	unsigned seq = 0;
	expect e = { 0 };

	if (sscanf(line, "unixdgram %llu %31s", &inode, last) == 2 && inode) {
		e.kind = AG_FLOW_UNIXDGRAM;     /* a datagram to socket INODE, by its hash */
		e.inode = inode;
		e.at_offset = strcmp(last, "-") != 0;
		e.offset = e.at_offset ? strtoull(last, NULL, 16) : 0;
	} else if (sscanf(line, "unixfrom %llu", &inode) == 1 && inode) {
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
		/* Late: a reader traced already read past the writer's byte --
		 * the request came after the write it announced, which this end
		 * counted (a second writer of the pipe; the daemon's line reached
		 * the control thread after the read).  Awaiting the next read
		 * would name it with bytes it does not carry. */
		uint64_t have;

		if (e.at_offset && ag_msgs_recv_count(inode, &have) && have > e.offset) {
			ag_log("expect '%.200s': read past the writer's byte already (this end "
			       "counts %llu): nothing to await", line, (unsigned long long)have);
			return 0;
		}
		if (e.at_offset)
			e.shared = pipe_count_of(line, e.kind, inode, e.offset, e.offset - e.backlog);
	} else if ((nf = sscanf(line, "%7s %63s %u %63s %u %31s %7s %u", kind, a, &sp, b, &dp, last,
			       mark, &seq)) >= 6 && (nf == 6 || (nf == 7 && strcmp(mark, "oob") == 0) ||
						     (nf == 8 && strcmp(mark, "ipopt") == 0 && seq)) &&
		   (strcmp(kind, "tcp") == 0 || strcmp(kind, "udp") == 0) && sp <= 65535 &&
		   dp <= 65535 && parse_addr(a, &fa, e.src) == 0 && parse_addr(b, &fb, e.dst) == 0 &&
		   fa == fb) {
		e.kind = kind[0] == 't' ? AG_FLOW_TCP : AG_FLOW_UDP;
		e.family = fa;
		e.sport = (uint16_t)sp;
		e.dport = (uint16_t)dp;
		e.at_offset = strcmp(last, "-") != 0;
		e.offset = e.at_offset ? strtoull(last, NULL, e.kind == AG_FLOW_UDP ? 16 : 10) : 0;
		if (nf == 7 && e.kind == AG_FLOW_TCP) {                /* point 9 */
			e.oob = oob_usable(&e, why, sizeof why);
			if (!e.oob)
				ag_log("expect '%.200s': no urgent byte here: %s; awaiting the "
				       "receive by its stream offset instead", line, why);
			ag_meta_note("%s %s %s\n", TRACE_META_MARK, e.oob ? "oob" : "offset", line);
		}
		if (nf == 8 && e.kind == AG_FLOW_UDP) {                /* point 13 */
			e.seq = seq;
			e.ipopt = ipopt_usable(&e, why, sizeof why);
			if (!e.ipopt)
				ag_log("expect '%.200s': no IP option here: %s; awaiting the "
				       "datagram by its content hash instead", line, why);
			ag_meta_note("%s %s %s\n", TRACE_META_MARK, e.ipopt ? "ipopt" : "hash", line);
		}
	} else {
		ag_log("expect '%.200s': not 'tcp SRC SPORT DST DPORT OFFSET|- [oob]', 'udp SRC "
		       "SPORT DST DPORT HASH|- [ipopt SEQ]', 'unixdgram INODE HASH|-' or "
		       "'pipe|unix|unixfrom INODE'", line);
		return -1;
	}
	e.until = ag_mono_ns() + EXPECT_NS;
	__atomic_store_n(&expect_mode, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < MAX_EXPECT; i++) {
		int zero = 0;

		if (__atomic_compare_exchange_n(&expects[i].state, &zero, 1, false, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED)) {
			e.state = 1;
			expects[i] = e;
			__atomic_store_n(&expects[i].state, 2, __ATOMIC_RELEASE);
			if (e.oob || e.ipopt)
				__atomic_add_fetch(&noob, 1, __ATOMIC_RELEASE);
			__atomic_add_fetch(&nexpect, 1, __ATOMIC_RELEASE);
			if (e.oob)
				ag_log("expecting the receive of tcp %s:%u -> %s:%u after its urgent "
				       "byte (oob mark)", a, sp, b, dp);
			else if (e.ipopt)
				ag_log("expecting the datagram udp %s:%u -> %s:%u with the IP option "
				       "of sequence number %u (ipopt mark), or content hash %s", a, sp,
				       b, dp, seq, last);
			else if (e.kind == AG_FLOW_UNIXDGRAM)
				ag_log("expecting the datagram to UNIX socket %llu %s%s", inode,
				       e.at_offset ? "with content hash " : "(the first one)",
				       e.at_offset ? last : "");
			else if (e.kind == AG_FLOW_UNIXFROM)
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
	if (e->oob || e->ipopt)
		__atomic_sub_fetch(&noob, 1, __ATOMIC_RELEASE);
	recvopts_off(e);
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

/* Point 11: where this thread's receive on fd began (ag_expect_before). */
static __thread struct {
	int fd;
	bool at_mark;                    /* the receive began at the mark */
	int udp;                         /* point 14: 0 unknown, 1 no option, 2 the option */
	uint32_t seq;                    /* ... its sequence number */
} pre __attribute__((tls_model("initial-exec")));

/* What a match used, for agent.log and meta's `matched` line. */
static __thread const char *matched_by __attribute__((tls_model("initial-exec")));

static bool oob_tuple(const expect *e, const seen *w)
{
	return e->oob && w->kind == AG_FLOW_TCP && e->family == w->family &&
	       e->sport == w->pp && e->dport == w->lp && memcmp(e->src, w->p, 16) == 0 &&
	       memcmp(e->dst, w->l, 16) == 0;
}

/* Point 11, before a receive on fd: the urgent byte read if it is there,
 * and whether the receive begins at it. */
void ag_expect_before(int fd)
{
	int saved = errno, at = 0;
	bool ours = false;
	uint8_t b;
	seen w;

	pre.at_mark = false;
	pre.udp = 0;
	if (!__atomic_load_n(&noob, __ATOMIC_ACQUIRE))
		return;
	what_fd(fd, &w);
	for (int i = 0; i < MAX_EXPECT && !ours && w.kind == AG_FLOW_UDP; i++)
		for (int k = 0; k < expects[i].nopt && !ours; k++)
			ours = expects[i].optfd[k] == fd;
	if (ours) {                      /* point 14: the queued datagram's options */
		union {                  /* the program's own control messages too */
			struct cmsghdr h;
			char buf[1024];
		} ctl;
		struct msghdr mh = { .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf };

		if (sys(SYS_recvmsg, fd, (long)&mh, MSG_PEEK | MSG_DONTWAIT | MSG_TRUNC, 0, 0) >= 0) {
			pre.fd = fd;
			pre.udp = 1;
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
				if (c->cmsg_level == IPPROTO_IP && (c->cmsg_type == IP_RECVOPTS ||
								    c->cmsg_type == IP_OPTIONS) &&
				    sp_ipmark_find(CMSG_DATA(c), c->cmsg_len - CMSG_LEN(0), &pre.seq))
					pre.udp = 2;
		}
		errno = saved;
		return;
	}
	for (int i = 0; i < MAX_EXPECT && !ours && w.kind == AG_FLOW_TCP; i++)
		ours = __atomic_load_n(&expects[i].state, __ATOMIC_ACQUIRE) == 2 &&
		       oob_tuple(&expects[i], &w);
	if (ours) {
		if (sys(SYS_recvfrom, fd, (long)&b, 1, MSG_OOB | MSG_DONTWAIT, 0) == 1)
			ag_log("fd %d: the mark's urgent byte read before the program's receive",
			       fd);
		pre.fd = fd;
		pre.at_mark = sys(SYS_ioctl, fd, SIOCATMARK, (long)&at, 0, 0) == 0 && at;
	}
	errno = saved;
}

/* Point 11, a receive not seen before: is the mark still ahead of fd's
 * stream (the receive stopped at it, or it is further on)? */
static bool mark_ahead(int fd)
{
	int at = 0;
	uint8_t b;

	return (sys(SYS_ioctl, fd, SIOCATMARK, (long)&at, 0, 0) == 0 && at) ||
	       sys(SYS_recvfrom, fd, (long)&b, 1, MSG_OOB | MSG_PEEK | MSG_DONTWAIT, 0) == 1;
}

/* Point 6: is this receive, on fd, of rc bytes (data: them, or NULL) the
 * one e awaits?  *end is the TCP stream's end, read once (-2: not yet); a
 * pipe's or UNIX socket's: the bytes read since arming, this read's too. */
static bool matches(expect *e, const seen *w, int fd, long rc, const void *data, int64_t *end)
{
	matched_by = e->kind == AG_FLOW_UNIXFROM ? "the peer's inode" : "bytes counted";
	if (e->kind == AG_FLOW_UNIXFROM)          /* an accepted socket whose peer sent it */
		return w->kind == AG_FLOW_UNIX && ag_unix_peer(w->inode) == e->inode;
	if (e->kind == AG_FLOW_UNIXDGRAM) {       /* the socket, and the datagram's hash */
		matched_by = e->at_offset ? "hash" : "the first datagram";
		return w->kind == AG_FLOW_UNIX && w->inode == e->inode &&
		       (!e->at_offset || !data ||
			ag_flow_hash(data, (size_t)rc, AG_FLOW_HASH0) == e->offset);
	}
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
		if (e->ipopt && pre.fd == fd && pre.udp == 2) {         /* point 14 */
			matched_by = "ipopt";
			return pre.seq == e->seq;
		}
		matched_by = !e->ipopt ? "hash" : pre.fd == fd && pre.udp == 1 ?
			     "hash (its IP option did not arrive)" :
			     "hash (it came while the thread was in its receive)";
		return !e->at_offset || !data || ag_flow_hash(data, (size_t)rc, AG_FLOW_HASH0) ==
						     e->offset;
	case AG_FLOW_TCP:
		if (e->family != w->family || e->sport != w->pp || e->dport != w->lp ||
		    memcmp(e->src, w->p, 16) != 0 || memcmp(e->dst, w->l, 16) != 0)
			return false;
		if (!e->at_offset && !e->oob)
			return true;
		if (*end == -2) {
			uint64_t e2;

			*end = ag_tcp_received(fd, &e2) == 0 ? (int64_t)e2 : -1;
		}
		matched_by = e->oob && pre.at_mark && pre.fd == fd ? "oob"
			     : e->oob ? "offset (no urgent byte seen: it came while the thread was "
					"in its receive, or was not sent)"
			     : e->at_offset ? "offset" : "the first receive";
		if (e->oob && pre.at_mark && pre.fd == fd)    /* point 11: after the hole */
			return true;
		if (e->oob) {
			/* point 11, not seen: past the sender's offset (with the mark,
			 * the hole is at it) or the hole and a byte past all that had
			 * come at arming; never short of a mark still ahead */
			bool past = e->at_offset ? *end >= 0 && (uint64_t)*end > e->offset
				    : !e->armed_known || (*end >= 0 &&
							   (uint64_t)*end >= e->armed_pos + 2);

			return past && !mark_ahead(fd);
		}
		/* bytes sent before the traced send start nothing */
		return *end < 0 || (uint64_t)*end > e->offset;
	default:
		return false;
	}
}

/* The awaited receive e was found on fd, by matched_by: agent.log, meta. */
static void note_matched(const expect *e, int fd)
{
	static const char *const kinds[] = { [AG_FLOW_TCP] = "tcp", [AG_FLOW_UDP] = "udp",
					     [AG_FLOW_PIPE] = "pipe", [AG_FLOW_UNIX] = "unix",
					     [AG_FLOW_UNIXFROM] = "unixfrom",
					     [AG_FLOW_UNIXDGRAM] = "unixdgram" };
	char what[160], from[64], to[64];

	if (e->kind == AG_FLOW_TCP || e->kind == AG_FLOW_UDP) {
		format_addr(e->family, e->src, e->sport, from, sizeof from);
		format_addr(e->family, e->dst, e->dport, to, sizeof to);
		snprintf(what, sizeof what, "%s %s -> %s", kinds[e->kind], from, to);
	} else {
		snprintf(what, sizeof what, "%s %lu", kinds[e->kind], (unsigned long)e->inode);
	}
	ag_log("fd %d: the awaited receive of %s, found by %s", fd, what,
	       matched_by ? matched_by : "?");
	ag_meta_note("%s %s by %s\n", TRACE_META_MATCHED, what, matched_by ? matched_by : "?");
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
	uint64_t now = ag_mono_ns();

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
		if (e->oob) {
			/* point 11: the program never saw the mark's byte */
			if (end == -2)
				end = ag_tcp_received(fd, (uint64_t *)&end) == 0 ? end : -1;
			if (end >= 0)
				ag_msgs_resync(fd, (uint64_t)end, rc);
			ag_log(pre.at_mark && pre.fd == fd ?
			       "fd %d: the receive that begins at the mark's urgent byte: the "
			       "traced send's (stream at %lld)" :
			       "fd %d: a receive with no urgent byte seen before it (the thread was "
			       "in it when the byte came, or the sender sent none), past the "
			       "traced send's offset: the traced send's (stream at %lld)",
			       fd, (long long)end);
			__atomic_sub_fetch(&noob, 1, __ATOMIC_RELEASE);
		}
		if (e->ipopt) {                                         /* point 14 */
			__atomic_sub_fetch(&noob, 1, __ATOMIC_RELEASE);
			recvopts_off(e);
		}
		if (c->shared)
			ag_msgs_recv_at(fd, (uint64_t)end, &c->shared->read, c->shared->base);
		else if ((c->kind == AG_FLOW_PIPE || c->kind == AG_FLOW_UNIX) && c->at_offset)
			/* point 6: the backlog's end is the writer's offset; this
			 * read began `end - rc` bytes after arming */
			ag_msgs_recv_at(fd, c->offset - c->backlog + ((uint64_t)end - (uint64_t)rc),
					NULL, 0);
		note_matched(e, fd);
		__atomic_store_n(&e->state, 0, __ATOMIC_RELEASE);
		__atomic_sub_fetch(&nexpect, 1, __ATOMIC_RELEASE);
		hit = true;
	}
	pre.at_mark = false;
	pre.udp = 0;
	errno = saved;
	return hit;
}
