/*
 * msgs.c — message events: what a traced thread sends and receives on
 * sockets and pipes (the record layout: common/trace_format.h, "Message
 * events"; the channel table: its "channels file").
 *
 * The interposers below are in hooks.c's table.  Each calls the C library's
 * function first and returns exactly what it returned, errno included.  Then,
 * only on a thread that is tracing (it has a ring and the agent is active)
 * and only for a call that moved bytes, it records a message:
 *
 *  1. The descriptor's channel comes from a per-descriptor cache: one 64-bit
 *     word per number, read with one atomic load, no lock.  A word holds the
 *     process's cache generation, a state (not a channel; a channel; an
 *     unconnected datagram socket, whose channel depends on the peer of each
 *     datagram) and the channel's index.  A regular file or a terminal is
 *     "not a channel" after its first transfer: no system call ever again.
 *  2. A number not in the cache is classified once (fstat, SO_TYPE,
 *     SO_PROTOCOL, getsockname, getpeername, as raw system calls) and its
 *     channel found or made in the process's channel table, keyed by the
 *     inode and the peer: the two ends of a pipe, and a socket's dup'd
 *     numbers, share one channel and its offsets.  A new channel takes an id
 *     from the channels file's shared counter and writes its record there.
 *     Threads racing to make the same channel: the first one published in
 *     the table wins, the other's record stays unused (never named).
 *  3. close, close_range, closefrom, dup2, dup3 (fds.c) and the calls that
 *     hand out a number (accept, socket, pipe, socketpair, dup, fcntl's
 *     F_DUPFD) clear the number's word; connect clears it too (a datagram
 *     socket's peer changes).  A forked child starts a new generation and an
 *     empty table: its channels are its own, with its pid, its offsets
 *     counting from 0 -- but a pipe's, which its family counts together
 *     (point 5).
 *  4. A receive with MSG_PEEK leaves the bytes where they are: no message.
 *     The message: offsets by one atomic add on the channel's counter of
 *     that direction, then five ring records taken with one atomic add
 *     (ring.c: ag_ring_put_msg).  A send's time is when its call began
 *     (send_t0, read as the interposer calls the C library's function), a
 *     receive's when it returned: the kernel wakes a reader within the
 *     writer's call, and the writer may then wait for a CPU for
 *     milliseconds, so a send stamped at its return showed after the
 *     receive of its own bytes.  Nothing here takes a lock but the rare
 *     growth of the channels file; the hot path is signal-safe.
 *  5. A TCP channel's counters start at the stream's absolute offsets,
 *     read from the kernel once, when it is classified (tcp_bases); a
 *     pipe's sent one, classified before its first traced write (the send
 *     propagation asks about), at the bytes queued in it then (FIONREAD:
 *     the reader reads them first); other channels' at 0.  An awaited
 *     receive moves the reader's count to the sender's (ag_msgs_recv_at),
 *     or to a count the pipe's readers share (propagate.c, point 6).  A
 *     pipe's two counts are the family's: a process and the children it
 *     forks (pre-forked workers writing or reading one pipe) add to the
 *     same ones (pipe_slot_of, memory shared since before any fork), so
 *     each one's writes name bytes of their own.  A
 *     connected UNIX socket's record names its peer's inode (unix_peer),
 *     also asked once.  shutdown() and a receive that finds the end of a
 *     stream are messages of no bytes at the current offset.
 *  6. A pipe's traced writers that are no one family -- programs exec'd
 *     apart, processes that opened a named pipe each, of any users --
 *     share one sent count too: the session's, which spdaemon keeps and
 *     passes with its answer (propagate.c, points 15 to 17).  So do a
 *     connected UNIX stream socket's traced writers that are programs
 *     exec'd apart: the count of the bytes into its peer socket
 *     (propagate.c, point 18); one forked after the agent came knows no
 *     peer (unix_peer, point 1) and asks by its own socket alone (the
 *     daemon finds the peer).  A writer's channel takes it when its first
 *     traced write asks about the channel (before_send: the answer names
 *     it and that write's first byte in it), or when it is classified in a
 *     process whose parent took it before the fork (ag_pipe_sent); the
 *     family's count is left then -- a pipe's or a UNIX stream's member
 *     forked earlier takes the session's when it asks, on its own first
 *     traced write.  Every traced write adds its length to it with one
 *     atomic add, when its call returned.
 *
 * The agent's own reads and writes run inside ag_enter (no ring) or on the
 * control thread (no ring): they are never messages.  Its descriptors are
 * skipped as well (fds.c).
 *
 * Left:
 *  - a descriptor closed where no interposer sees it (the C library's
 *    internal close in fclose, a raw system call) keeps its word until its
 *    number comes back through one of the calls of point 3; meanwhile a new
 *    file opened at that number by open() is taken for the old channel;
 *  - a UNIX socket's peer is asked of the kernel over a netlink socket
 *    (unix_peer) that holds a low number for the instant before it is moved
 *    high;
 *  - TCP sent offsets stay relative on a descriptor whose connect or accept
 *    the agent did not see and sock_diag did not answer for (tcp_bases,
 *    point 4); an end of stream returned
 *    by recvmmsg, splice or sendfile is not recorded.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <linux/netlink.h>
#include <linux/inet_diag.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <linux/unix_diag.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#define FD_MAX 65536                   /* numbers the cache covers */
#define MAX_CHANS 65536                /* channels per process */
#define NSLOTS (2 * MAX_CHANS)         /* the table's hash index */

enum { ST_NONE = 1, ST_CHAN = 2, ST_UNCONN = 3 };
enum { DIR_SEND = 0, DIR_RECV = 1 };
enum { OPENED_ACTIVE = 1, OPENED_PASSIVE = 2 };   /* a number's TCP connection (tcp_bases) */

typedef struct chan {
	uint32_t id;                   /* in the channels file; 0: none */
	uint8_t proto, dgram, peer_known;
	uint8_t asked;                 /* propagate.c was asked about it (before_send) */
	uint8_t msg_flags[2];          /* TRACE_MSG_* of its messages, per direction */
	uint16_t family, peer_port;
	uint64_t inode;
	uint8_t peer[16];              /* the key's peer (AF_UNIX: a hash of the path) */
	uint64_t off[2];               /* bytes (streams) or datagrams, per direction */
	volatile uint64_t *send_shared; /* a pipe's sent count, its forked family's (point 5)
	                                 * or its traced writers' (point 6); a UNIX stream's
	                                 * traced writers' (point 6) */
	volatile uint64_t *recv_shared; /* a pipe's received count, its readers' (point 5) */
	uint64_t recv_base;            /* ... from the writer's offset recv_base */
	volatile uint8_t recv_counted; /* the next receive is at off[DIR_RECV], counted */
} chan;

/* Point 5: a pipe's counts, shared by a process and the children it forks
 * (MAP_SHARED, made before any fork): pre-forked writers or readers of one
 * pipe count its bytes together.  An inode 0 slot is free. */
typedef struct pipe_slot {
	volatile uint64_t inode;
	volatile uint64_t off[2];
} pipe_slot;
#define PIPE_SLOTS 4096
static pipe_slot *pipe_slots;

static uint64_t *fdcache;              /* FD_MAX words (point 1) */
static uint8_t *opened;                /* FD_MAX: OPENED_*, 0 unknown (tcp_bases) */
static chan *chans;
static uint32_t *slots;                /* chan index + 1, 0: free */
static volatile uint32_t nchans;
static uint32_t gen = 1;               /* 24 bits */

static volatile int chan_fd = -1;
static char chan_path[4200];
static uint8_t *chan_map;
static volatile uint32_t *next_chan;
static volatile off_t chan_size;
static volatile int chan_lock;
static bool chan_full_said;

#define CHAN_CHUNK ((off_t)sizeof(trace_channel) * 8192)   /* 1 MiB */
#define CHAN_SPAN ((size_t)sizeof(trace_channel) * (1u << 22))

/* ---- the C library's functions ---- */

typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef int (*sendmmsg_fn)(int, struct mmsghdr *, unsigned, int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);
typedef int (*recvmmsg_fn)(int, struct mmsghdr *, unsigned, int, struct timespec *);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef ssize_t (*read_chk_fn)(int, void *, size_t, size_t);
typedef ssize_t (*recv_chk_fn)(int, void *, size_t, size_t, int);
typedef ssize_t (*recvfrom_chk_fn)(int, void *, size_t, size_t, int, struct sockaddr *,
				   socklen_t *);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*socket_fn)(int, int, int);
typedef int (*pipe_fn)(int *);
typedef int (*pipe2_fn)(int *, int);
typedef int (*socketpair_fn)(int, int, int, int *);
typedef ssize_t (*splice_fn)(int, loff_t *, int, loff_t *, size_t, unsigned);
typedef ssize_t (*sendfile_fn)(int, int, off_t *, size_t);
typedef int (*shutdown_fn)(int, int);

static send_fn real_send;
static sendto_fn real_sendto;
static sendmsg_fn real_sendmsg;
static sendmmsg_fn real_sendmmsg;
static write_fn real_write;
static writev_fn real_writev;
static recv_fn real_recv;
static recvfrom_fn real_recvfrom;
static recvmsg_fn real_recvmsg;
static recvmmsg_fn real_recvmmsg;
static read_fn real_read;
static readv_fn real_readv;
static read_chk_fn real_read_chk;
static recv_chk_fn real_recv_chk;
static recvfrom_chk_fn real_recvfrom_chk;
static connect_fn real_connect;
static accept_fn real_accept;
static accept4_fn real_accept4;
static socket_fn real_socket;
static pipe_fn real_pipe;
static pipe2_fn real_pipe2;
static socketpair_fn real_socketpair;
static splice_fn real_splice;
static sendfile_fn real_sendfile, real_sendfile64;
static shutdown_fn real_shutdown;

/* As fds.c: the next definition; attached, never the agent's own. */
static void *next(const char *name, void *mine)
{
	void *fn = dlsym(RTLD_NEXT, name);

	if (!fn)
		fn = dlsym(RTLD_DEFAULT, name);
	return fn == mine ? NULL : fn;
}

#define REAL(var, name) (var = (__typeof__(var))next(#name, (void *)name))

extern ssize_t __read_chk(int, void *, size_t, size_t);
extern ssize_t __recv_chk(int, void *, size_t, size_t, int);
extern ssize_t __recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

/* The C library's functions (before this runs, the interposers make the
 * system calls themselves), and the cache's memory. */
void ag_msgs_init(void)
{
	REAL(real_send, send); REAL(real_sendto, sendto); REAL(real_sendmsg, sendmsg);
	REAL(real_sendmmsg, sendmmsg); REAL(real_write, write); REAL(real_writev, writev);
	REAL(real_recv, recv); REAL(real_recvfrom, recvfrom); REAL(real_recvmsg, recvmsg);
	REAL(real_recvmmsg, recvmmsg); REAL(real_read, read); REAL(real_readv, readv);
	REAL(real_read_chk, __read_chk); REAL(real_recv_chk, __recv_chk);
	REAL(real_recvfrom_chk, __recvfrom_chk); REAL(real_connect, connect);
	REAL(real_accept, accept); REAL(real_accept4, accept4); REAL(real_socket, socket);
	REAL(real_pipe, pipe); REAL(real_pipe2, pipe2); REAL(real_socketpair, socketpair);
	REAL(real_splice, splice); REAL(real_shutdown, shutdown);
	real_sendfile = (sendfile_fn)next("sendfile", (void *)ag_sendfile);
	real_sendfile64 = (sendfile_fn)next("sendfile64", (void *)ag_sendfile64);
	if (!fdcache) {
		void *p = mmap(NULL, FD_MAX * 8 + MAX_CHANS * sizeof(chan) + NSLOTS * 4 + FD_MAX,
			       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);

		/* slots whole pages of their own: a forked child drops them
		 * (ag_msgs_forked) */
		if (p != MAP_FAILED) {
			slots = (uint32_t *)((char *)p + FD_MAX * 8);
			chans = (chan *)(slots + NSLOTS);
			opened = (uint8_t *)(chans + MAX_CHANS);
			__atomic_store_n(&fdcache, (uint64_t *)p, __ATOMIC_RELEASE);
		}
	}
	if (!pipe_slots) {
		void *p = mmap(NULL, PIPE_SLOTS * sizeof *pipe_slots, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		pipe_slots = p == MAP_FAILED ? NULL : p;
	}
}

/* Point 5: the counts of pipe `inode` this process's family shares, made
 * with a sent count of `base`; NULL when the table is full. */
static pipe_slot *pipe_slot_of(uint64_t inode, uint64_t base)
{
	size_t h = (size_t)(inode * 0x9e3779b97f4a7c15ull >> 52) & (PIPE_SLOTS - 1);

	for (size_t i = 0; pipe_slots && inode && i < PIPE_SLOTS; i++, h = (h + 1) & (PIPE_SLOTS - 1)) {
		uint64_t zero = 0;
		pipe_slot *ps = &pipe_slots[h];

		if (__atomic_load_n(&ps->inode, __ATOMIC_ACQUIRE) == inode)
			return ps;
		/* the maker sets the count before it names the slot's inode */
		if (__atomic_load_n(&ps->inode, __ATOMIC_ACQUIRE) == 0 &&
		    __atomic_compare_exchange_n(&ps->inode, &zero, ~0ull, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			ps->off[0] = base;
			ps->off[1] = 0;
			__atomic_store_n(&ps->inode, inode, __ATOMIC_RELEASE);
			return ps;
		}
		/* bounded: a maker forked away in between never finishes */
		for (int n = 0; n < 100000 && __atomic_load_n(&ps->inode, __ATOMIC_ACQUIRE) == ~0ull;
		     n++)
			ag_arch_relax();
		if (__atomic_load_n(&ps->inode, __ATOMIC_ACQUIRE) == inode)
			return ps;
	}
	return NULL;
}

/* ---- the channels file (like the sites file: instrument.c) ---- */

static int chan_grow(off_t from, off_t len)
{
	struct stat st;
	int fd = ag_fd_checked(&chan_fd);

	if (fallocate(fd, 0, from, len) == 0)
		return 0;
	if (errno != EOPNOTSUPP || syscall(SYS_fstat, fd, &st) != 0)
		return -1;
	return st.st_size >= from + len ? 0 : ftruncate(fd, from + len);
}

/*
 * The channels file is made at the start (a process that changes its user
 * later could not make it in the trace directory then), empty: most
 * processes meet no channel, and its first chunk and header are written
 * only when the first channel is recorded (chan_ready):
 *
 *  1. The size first, under chan_lock: a page of the mapping beyond the
 *     end of the file would be a SIGBUS in the program.  fallocate never
 *     shrinks the file: a forked child that shares it (the same file, the
 *     same mapping, its own idea of the size) and grows it from an older
 *     size cannot cut off what its parent wrote.
 *  2. Then the header: the shared counter goes from 0 to 1 (id 0 is never
 *     used) by a compare-and-swap, so a child or parent that got there
 *     first, whose records follow, is left as it was; the record size
 *     beside it is the same value from anyone.
 *  3. chan_size, released, says both are done: a thread that reads it
 *     non-zero takes an id at once.
 *  4. A forked child starts with chan_lock free (a thread that held it
 *     stayed in the parent: ag_msgs_forked).
 */
int ag_channels_open(const char *dir)
{
	snprintf(chan_path, sizeof chan_path, "%s/channels", dir);
	chan_fd = ag_trace_open(chan_path, O_RDWR | O_TRUNC);
	ag_fd_keep(&chan_fd, chan_path, O_RDWR);
	if (chan_fd < 0) {
		ag_log("cannot create %s: %s; no message events", chan_path, strerror(errno));
		return -1;
	}
	chan_map = mmap(NULL, CHAN_SPAN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
			chan_fd, 0);
	if (chan_map == MAP_FAILED) {
		chan_map = NULL;
		ag_log("cannot map %s: %s; no message events", chan_path, strerror(errno));
		return -1;
	}
	/* No read-ahead (as the sites file: instrument.c). */
	madvise(chan_map, CHAN_SPAN, MADV_RANDOM);
	next_chan = (volatile uint32_t *)chan_map;
	return 0;
}

/* Points 1 to 3: the file holds its header and first chunk; false if it
 * cannot (errno says why). */
static bool chan_ready(void)
{
	bool ok = true;

	if (__atomic_load_n(&chan_size, __ATOMIC_ACQUIRE) > 0)
		return true;
	while (__atomic_exchange_n(&chan_lock, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
	if (chan_size == 0) {
		uint32_t none = 0;

		ok = chan_grow(0, CHAN_CHUNK) == 0;                        /* 1 */
		if (ok) {
			__atomic_compare_exchange_n(next_chan, &none, 1, false,    /* 2 */
						    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
			next_chan[1] = sizeof(trace_channel);   /* record 0's pid: the record size */
			__atomic_store_n(&chan_size, CHAN_CHUNK, __ATOMIC_RELEASE);   /* 3 */
		}
	}
	__atomic_store_n(&chan_lock, 0, __ATOMIC_RELEASE);
	return ok;
}

/* A record for a new channel: its id, 0 when there is no room. */
static uint32_t chan_record(const trace_channel *tc)
{
	uint32_t id;
	off_t end;

	if (!next_chan)
		return 0;
	if (!chan_ready())
		goto full;
	id = __atomic_fetch_add(next_chan, 1, __ATOMIC_ACQ_REL);
	end = ((off_t)id + 1) * (off_t)sizeof *tc;
	if ((size_t)end > CHAN_SPAN)
		goto full;
	if (end > __atomic_load_n(&chan_size, __ATOMIC_ACQUIRE)) {
		while (__atomic_exchange_n(&chan_lock, 1, __ATOMIC_ACQUIRE))
			ag_arch_relax();
		while (end > chan_size) {
			if (chan_grow(chan_size, CHAN_CHUNK) != 0) {
				__atomic_store_n(&chan_lock, 0, __ATOMIC_RELEASE);
				goto full;
			}
			__atomic_store_n(&chan_size, chan_size + CHAN_CHUNK, __ATOMIC_RELEASE);
		}
		__atomic_store_n(&chan_lock, 0, __ATOMIC_RELEASE);
	}
	memcpy(chan_map + (size_t)id * sizeof *tc, tc, sizeof *tc);
	return id;
full:
	if (!__atomic_exchange_n(&chan_full_said, 1, __ATOMIC_ACQ_REL))
		ag_log("channels: the file cannot grow (%s); messages on new channels are not "
		       "recorded (said once)", strerror(errno));
	return 0;
}

/* ---- the per-descriptor cache (point 1) ---- */

static uint64_t fd_word(int fd)
{
	uint64_t *c = __atomic_load_n(&fdcache, __ATOMIC_ACQUIRE), w;

	if (!c || (unsigned)fd >= FD_MAX)
		return 0;
	w = __atomic_load_n(&c[fd], __ATOMIC_RELAXED);
	return (w >> 40) == gen ? w : 0;
}

static void fd_set_word(int fd, unsigned state, uint32_t idx)
{
	if (fdcache && (unsigned)fd < FD_MAX)
		__atomic_store_n(&fdcache[fd], (uint64_t)gen << 40 | (uint64_t)state << 32 | idx,
				 __ATOMIC_RELAXED);
}

void ag_msgs_forget(int fd)
{
	if (fdcache && (unsigned)fd < FD_MAX) {
		__atomic_store_n(&fdcache[fd], 0, __ATOMIC_RELAXED);
		__atomic_store_n(&opened[fd], 0, __ATOMIC_RELAXED);
	}
}

void ag_msgs_forget_range(unsigned lo, unsigned hi)
{
	for (unsigned fd = lo; fdcache && fd <= hi && fd < FD_MAX; fd++) {
		__atomic_store_n(&fdcache[fd], 0, __ATOMIC_RELAXED);
		__atomic_store_n(&opened[fd], 0, __ATOMIC_RELAXED);
	}
}

/* Which end opened fd's connection (connect: active, accept: passive). */
static void set_opened(int fd, uint8_t how)
{
	if (fdcache && (unsigned)fd < FD_MAX)
		__atomic_store_n(&opened[fd], how, __ATOMIC_RELAXED);
}

/* A forked child: a new generation, an empty table (point 3). */
void ag_msgs_forked(void)
{
	chan_lock = 0;                  /* the channels file, point 4 */
	if (!fdcache)
		return;
	gen = (gen + 1) & 0xffffff;
	if (!gen)
		gen = 1;
	/* Zero pages again without touching them: a memset wrote every page
	 * of the index (512 KB) in every child, present in the parent or not. */
	if (nchans && madvise(slots, NSLOTS * sizeof *slots, MADV_DONTNEED) != 0)
		memset(slots, 0, NSLOTS * sizeof *slots);
	nchans = 0;
}

/* ---- the channel table (point 2) ---- */

typedef struct chan_key {
	uint64_t inode;
	uint16_t family, peer_port;
	uint8_t peer_known;
	uint8_t peer[16];
} chan_key;

/* The path of a UNIX address: "" unnamed, "@name" abstract. */
static void unix_path(const struct sockaddr *sa, socklen_t len, char out[32])
{
	const struct sockaddr_un *su = (const struct sockaddr_un *)sa;
	size_t n = len > offsetof(struct sockaddr_un, sun_path) ?
		   len - offsetof(struct sockaddr_un, sun_path) : 0, k = 0;

	memset(out, 0, 32);
	if (n > sizeof su->sun_path)
		n = sizeof su->sun_path;
	if (n && su->sun_path[0] == '\0') {
		out[k++] = '@';
		for (size_t i = 1; i < n && k < 31; i++)
			out[k++] = su->sun_path[i] ? su->sun_path[i] : '@';
		return;
	}
	for (size_t i = 0; i < n && su->sun_path[i] && k < 31; i++)
		out[k++] = su->sun_path[i];
}

/* An address as the key's peer, and as a record's address fields. */
static void addr_of(const struct sockaddr *sa, socklen_t len, uint8_t addr[16], uint16_t *port,
		    char path[32])
{
	memset(addr, 0, 16);
	*port = 0;
	if (path)
		memset(path, 0, 32);
	if (!sa || len < sizeof(sa_family_t))
		return;
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		memcpy(addr, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

		memcpy(addr, &in6->sin6_addr, 16);
		*port = ntohs(in6->sin6_port);
	} else if (sa->sa_family == AF_UNIX) {
		char p[32];
		uint64_t h[2];
		size_t n = len - sizeof(sa_family_t);

		unix_path(sa, len, p);
		if (path)
			memcpy(path, p, 32);
		h[0] = ag_flow_hash(((const struct sockaddr_un *)sa)->sun_path, n, AG_FLOW_HASH0);
		h[1] = ag_flow_hash(((const struct sockaddr_un *)sa)->sun_path, n,
				    0x84222325cbf29ce4ull);
		memcpy(addr, h, 16);
	}
}

static size_t key_hash(const chan_key *k)
{
	uint64_t h = k->inode * 0x9e3779b97f4a7c15ull, a, b;

	memcpy(&a, k->peer, 8);
	memcpy(&b, k->peer + 8, 8);
	h ^= (a + b * 31 + k->peer_port) * 0xc2b2ae3d27d4eb4full;
	return (size_t)(h ^ h >> 29) & (NSLOTS - 1);
}

static bool key_is(const chan *c, const chan_key *k)
{
	return c->inode == k->inode && c->peer_known == k->peer_known &&
	       c->peer_port == k->peer_port && memcmp(c->peer, k->peer, 16) == 0;
}

/* The channel of key k, made (with its record `tc`) if new; NULL if the
 * table is full. */
static chan *chan_get(const chan_key *k, const trace_channel *tc, unsigned proto, bool dgram)
{
	size_t h = key_hash(k);
	uint32_t mine = 0;

	for (size_t probe = 0; probe < NSLOTS; probe++, h = (h + 1) & (NSLOTS - 1)) {
		uint32_t s = __atomic_load_n(&slots[h], __ATOMIC_ACQUIRE);

		if (!s) {
			if (!mine) {
				uint32_t i = __atomic_fetch_add(&nchans, 1, __ATOMIC_ACQ_REL);
				chan *c;

				if (i >= MAX_CHANS)
					return NULL;
				c = &chans[i];
				*c = (chan){ .proto = (uint8_t)proto, .dgram = dgram,
					     .peer_known = k->peer_known, .family = k->family,
					     .peer_port = k->peer_port, .inode = k->inode };
				for (int d = 0; d < 2; d++) {
					bool abs = tc->flags & (d ? TRACE_CHAN_ABS_RECV
								  : TRACE_CHAN_ABS_SEND);

					c->off[d] = tc->base[d];   /* 0 unless point 5 */
					c->msg_flags[d] = (abs ? 0 : TRACE_MSG_RELATIVE) |
							  (dgram ? TRACE_MSG_DGRAM : 0);
				}
				memcpy(c->peer, k->peer, 16);
				c->id = chan_record(tc);
				mine = i + 1;
			}
			if (__atomic_compare_exchange_n(&slots[h], &s, mine, false, __ATOMIC_ACQ_REL,
							__ATOMIC_ACQUIRE))
				return &chans[mine - 1];
			/* another thread took the slot: s is its entry now */
		}
		if (key_is(&chans[s - 1], k))
			return &chans[s - 1];
	}
	return NULL;
}

static long sys(long nr, long a, long b, long c, long d, long e)
{
	return syscall(nr, a, b, c, d, e);
}

/*
 * Absolute TCP offsets: where the stream stands in each direction when a
 * channel is first classified, from the kernel's counters of the socket,
 * read once per channel (five system calls), never per message.  Byte 0 of
 * a direction is the first data byte its sender ever wrote, so the sender's
 * trace and the receiver's, each started whenever, name the same range.
 *
 *  1. Read SIOCINQ and SIOCOUTQ, then TCP_INFO, then the two queues again;
 *     if a queue moved meanwhile (a segment or an ACK came in between),
 *     read again (three tries, then give up: relative offsets).  The
 *     kernel's counters and queues are read under the socket's lock one
 *     call at a time, not together: equal queues on both sides of TCP_INFO
 *     say nothing arrived in between.
 *  2. Received: tcpi_bytes_received counts every in-order byte the kernel
 *     took (rcv_nxt - irs - 1); SIOCINQ is what of it the program has not
 *     read yet (rcv_nxt - copied_seq).  The difference is the offset of the
 *     next byte the program reads.  Bytes still arriving raise both terms
 *     alike: the difference stays put.
 *  3. Sent: tcpi_bytes_acked counts what the peer acknowledged (snd_una
 *     moved by) and SIOCOUTQ what is queued and not acknowledged yet
 *     (write_seq - snd_una, sent or not): the sum is the offset of the next
 *     byte the program writes.  ACKs move bytes from one term to the other.
 *  4. The SYN takes a sequence number: the end that connected counts it in
 *     tcpi_bytes_acked (its snd_una starts at the SYN), the end that
 *     accepted does not (its snd_una starts after its SYN-ACK).  Which end
 *     this is: connect() or accept() handed the number out under the agent
 *     (`opened`); else (an attach, an inherited descriptor, a dup, a kept
 *     connection made before the agent came) sock_diag says whether a
 *     listener holds this end's address (opened_by_lookup).  Neither
 *     answering, sent offsets stay relative.
 *  5. The FIN takes one too: once this end sent its FIN (FIN_WAIT1, FIN_WAIT2,
 *     CLOSING, TIME_WAIT, LAST_ACK) write_seq counts it, take 1 off the sent
 *     offset; once the peer's came in (CLOSE_WAIT, LAST_ACK, CLOSING,
 *     TIME_WAIT) bytes_received counts it and SIOCINQ leaves it out, take 1
 *     off the received one.  A closed socket (TCP_CLOSE): no offsets.
 *  6. The counters say where the stream is now, after the call that made
 *     the program's first message on it: that message's own length comes
 *     off its direction (`dir`, `len`), so the channel's base is the
 *     message's first byte.  Another thread's transfer on the same socket
 *     between that call and this reading would shift the base by its
 *     length (not guarded: two threads on one stream socket interleave
 *     their bytes anyway).
 */
/* tcpi_state (the kernel's net/tcp_states.h; <netinet/tcp.h>, which names
 * them, cannot come with <linux/tcp.h>, which has the whole tcp_info) */
enum { S_SYN_SENT = 2, S_SYN_RECV, S_FIN_WAIT1, S_FIN_WAIT2, S_TIME_WAIT, S_CLOSE,
       S_CLOSE_WAIT, S_LAST_ACK, S_LISTEN, S_CLOSING };

static uint8_t opened_by_lookup(int fd);

/* Points 1, 2, 3 and 5: where the stream stands now in each direction (the
 * sent offset counts the SYN of an end that connected: point 4 is the
 * caller's).  0, or -1 when the kernel does not say. */
static int tcp_positions(int fd, uint64_t pos[2])
{
	struct tcp_info ti;
	socklen_t tl;
	int in0, out0, in1, out1;
	int tries;

	for (tries = 0; tries < 3; tries++) {                          /* 1 */
		tl = sizeof ti;
		memset(&ti, 0, sizeof ti);
		if (sys(SYS_ioctl, fd, SIOCINQ, (long)&in0, 0, 0) != 0 ||
		    sys(SYS_ioctl, fd, SIOCOUTQ, (long)&out0, 0, 0) != 0 ||
		    sys(SYS_getsockopt, fd, IPPROTO_TCP, TCP_INFO, (long)&ti, (long)&tl) != 0 ||
		    sys(SYS_ioctl, fd, SIOCINQ, (long)&in1, 0, 0) != 0 ||
		    sys(SYS_ioctl, fd, SIOCOUTQ, (long)&out1, 0, 0) != 0)
			return -1;
		if (in0 == in1 && out0 == out1)
			break;
	}
	if (tries == 3 || tl < offsetof(struct tcp_info, tcpi_bytes_received) + 8 ||
	    ti.tcpi_state == S_CLOSE || ti.tcpi_state == S_LISTEN ||
	    ti.tcpi_state == S_SYN_SENT || ti.tcpi_state == S_SYN_RECV)
		return -1;
	pos[DIR_RECV] = ti.tcpi_bytes_received - (uint64_t)in0;       /* 2 */
	pos[DIR_SEND] = ti.tcpi_bytes_acked + (uint64_t)out0;          /* 3 */
	switch (ti.tcpi_state) {                                       /* 5 */
	case S_FIN_WAIT1: case S_FIN_WAIT2:
		pos[DIR_SEND] -= 1;
		break;
	case S_CLOSE_WAIT:
		pos[DIR_RECV] -= 1;
		break;
	case S_LAST_ACK: case S_CLOSING: case S_TIME_WAIT:
		pos[DIR_SEND] -= 1;
		pos[DIR_RECV] -= 1;
		break;
	default:
		break;
	}
	return 0;
}

int ag_tcp_received(int fd, uint64_t *end)
{
	uint64_t pos[2];

	if (tcp_positions(fd, pos) != 0)
		return -1;
	*end = pos[DIR_RECV];
	return 0;
}

void ag_msgs_resync(int fd, uint64_t end, long rc)
{
	uint64_t w = fd_word(fd);
	chan *c;

	if (((w >> 32) & 0xff) != ST_CHAN || rc < 0 || end < (uint64_t)rc)
		return;
	c = &chans[(uint32_t)w];
	if (c->proto == TRACE_PROTO_TCP && !(c->msg_flags[DIR_RECV] & TRACE_MSG_RELATIVE))
		__atomic_store_n(&c->off[DIR_RECV], end - (uint64_t)rc, __ATOMIC_RELAXED);
}

static void tcp_bases(int fd, unsigned dir, uint64_t len, trace_channel *tc)
{
	uint64_t pos[2];
	uint8_t how = (unsigned)fd < FD_MAX ? __atomic_load_n(&opened[fd], __ATOMIC_RELAXED) : 0;

	if (tcp_positions(fd, pos) != 0)
		return;
	if (!how)
		how = opened_by_lookup(fd);                            /* 4 */
	if (how == OPENED_ACTIVE)
		pos[DIR_SEND] -= 1;
	pos[dir] -= len;                                               /* 6 */
	tc->base[DIR_RECV] = pos[DIR_RECV];
	tc->flags |= TRACE_CHAN_ABS_RECV;
	if (how) {
		tc->base[DIR_SEND] = pos[DIR_SEND];
		tc->flags |= TRACE_CHAN_ABS_SEND;
	}
}

/*
 * The peer of a connected UNIX socket: its inode, asked of the kernel's
 * sock_diag (NETLINK_SOCK_DIAG, UDIAG_SHOW_PEER) once, when the channel is
 * classified; /proc/net/unix lists inodes, not peers.  With it the two ends
 * of a socketpair or a connection name each other.
 *
 *  1. The netlink socket is the agent's (fds.c's rules): made once by a raw
 *     system call while the program still waits for the control thread
 *     (ag_msgs_preopen: the moment it holds a low number, before fds.c
 *     moves it high, no thread of the program can open anything), kept,
 *     and used under a lock, one question at a time.  A forked child shares
 *     it with its parent, whose answers it could read: the child asks
 *     nothing, its UNIX peers stay unknown (propagation asks spdaemon to
 *     find the peer: propagate.c, point 18).
 *  2. One request for one inode (no dump), cookie "none": the kernel
 *     answers within the sendto, one unix_diag_msg with its attributes,
 *     UNIX_DIAG_PEER among them when the socket has a peer; the receive
 *     does not wait (MSG_DONTWAIT).
 *  3. Any failure (a kernel without unix_diag, a seccomp filter, no room
 *     for a descriptor) leaves the peer unknown: 0.
 */
static volatile int diag_fd = -1;      /* the netlink socket; -1: none */
static pid_t diag_pid;                  /* the process that made it */
static volatile int diag_lock;

typedef union diag_answer {
	struct nlmsghdr nh;
	char buf[1024];
} diag_answer;

/* Points 1 and 2 for any sock_diag request q: the kernel's first answer
 * message, checked by NLMSG_OK; 0 when there is none. */
static int diag_ask(const void *q, size_t len, diag_answer *a)
{
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	struct timespec nap = { 0, 10000 };
	int fd = diag_fd, ok = 0;
	long n;

	if (fd < 0 || diag_pid != getpid())
		return 0;
	while (__atomic_exchange_n(&diag_lock, 1, __ATOMIC_ACQUIRE))
		nanosleep(&nap, NULL);
	/* an answer left over from an earlier question that timed out */
	while (sys(SYS_recvfrom, fd, (long)a, sizeof *a, MSG_DONTWAIT, 0) > 0)
		;
	ok = syscall(SYS_sendto, fd, q, len, 0, &kernel, sizeof kernel) == (long)len &&
	     (n = sys(SYS_recvfrom, fd, (long)a, sizeof *a, MSG_DONTWAIT, 0)) > 0 &&
	     NLMSG_OK(&a->nh, (unsigned long)n);
	__atomic_store_n(&diag_lock, 0, __ATOMIC_RELEASE);
	return ok;
}

static uint64_t unix_peer(uint64_t inode)
{
	uint8_t q[SP_UNIX_PEER_REQ_BYTES];
	size_t len = sp_unix_peer_request(q, inode);
	diag_answer a;

	if (inode > UINT32_MAX)
		return 0;                                               /* 1 */
	if (!diag_ask(q, len, &a))                                      /* 2 */
		return 0;
	return sp_unix_peer_answer(a.buf, sizeof a.buf, inode);        /* 3 */
}

/*
 * A TCP connection whose connect or accept the agent did not see (it was
 * made before the agent came: an attach, a kept connection of a pool):
 * which end opened it, asked of sock_diag once, when it is classified
 * (tcp_bases, point 4).  One exact lookup of this end's address with no
 * peer finds, as the kernel does for an incoming SYN, the listener there
 * if there is one: then this end was accepted; none (ENOENT): it connected.
 * 0: unknown (no answer).  Wrong only for a connection accepted from a
 * listener closed since (its sent offsets are then one too high).
 */
static uint8_t opened_by_lookup(int fd)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 req;
	} q = { .nh = { .nlmsg_len = sizeof q, .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = 2 },
		.req = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u,
			 .id = { .idiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } } } };
	struct sockaddr_storage la;
	socklen_t ll = sizeof la;
	diag_answer a;

	if (sys(SYS_getsockname, fd, (long)&la, (long)&ll, 0, 0) != 0)
		return 0;
	q.req.sdiag_family = (uint8_t)la.ss_family;
	if (la.ss_family == AF_INET) {
		memcpy(q.req.id.idiag_src, &((struct sockaddr_in *)&la)->sin_addr, 4);
		q.req.id.idiag_sport = ((struct sockaddr_in *)&la)->sin_port;
	} else if (la.ss_family == AF_INET6) {
		memcpy(q.req.id.idiag_src, &((struct sockaddr_in6 *)&la)->sin6_addr, 16);
		q.req.id.idiag_sport = ((struct sockaddr_in6 *)&la)->sin6_port;
	} else {
		return 0;
	}
	if (!diag_ask(&q, sizeof q, &a))
		return 0;
	if (a.nh.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
	    a.nh.nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
		return ((struct inet_diag_msg *)NLMSG_DATA(&a.nh))->idiag_state == S_LISTEN
		       ? OPENED_PASSIVE : 0;
	if (a.nh.nlmsg_type == NLMSG_ERROR &&
	    ((struct nlmsgerr *)NLMSG_DATA(&a.nh))->error == -ENOENT)
		return OPENED_ACTIVE;
	return 0;
}

uint64_t ag_unix_peer(uint64_t inode)
{
	return unix_peer(inode);
}

/* A UNIX address as /proc/net/unix shows it (an abstract name with '@'),
 * "" if unnamed. */
static void unix_addr_path(const struct sockaddr *to, socklen_t len, char *out, size_t outlen)
{
	const struct sockaddr_un *su = (const struct sockaddr_un *)to;
	size_t n;

	out[0] = '\0';
	if (!to || to->sa_family != AF_UNIX || len <= offsetof(struct sockaddr_un, sun_path))
		return;
	n = len - offsetof(struct sockaddr_un, sun_path);
	if (n > sizeof su->sun_path)
		n = sizeof su->sun_path;
	if (su->sun_path[0] == '\0')
		snprintf(out, outlen, "@%.*s", (int)(n - 1), su->sun_path + 1);
	else
		snprintf(out, outlen, "%.*s", (int)strnlen(su->sun_path, n), su->sun_path);
}

/* A connected UNIX socket's peer address, the same way. */
static void peer_path(int fd, char *out, size_t len)
{
	struct sockaddr_un sa;
	socklen_t sl = sizeof sa;

	out[0] = '\0';
	if (sys(SYS_getpeername, fd, (long)&sa, (long)&sl, 0, 0) == 0)
		unix_addr_path((struct sockaddr *)&sa, sl, out, len);
}

/* Point 1: the netlink socket, made while the program waits (control.c). */
void ag_msgs_preopen(void)
{
	if (diag_fd >= 0)
		return;
	diag_fd = (int)sys(SYS_socket, AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG,
			   0, 0);
	if (diag_fd < 0)
		return;
	ag_fd_keep(&diag_fd, NULL, 0);
	diag_pid = getpid();
}

/* A start that failed (control.c, point 4): the socket goes. */
void ag_msgs_preopen_undo(void)
{
	if (diag_fd >= 0 && diag_pid == getpid())
		ag_fd_drop(diag_fd);
	diag_fd = -1;
}

/* What descriptor fd is (point 2): its word, written into the cache.  The
 * call that asks moved `len` bytes in direction `dir` (0 before a call). */
static uint64_t classify(int fd, unsigned dir, uint64_t len)
{
	struct stat st;
	struct sockaddr_storage la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	int type = 0, protocol = 0;
	socklen_t tl = sizeof type, pl2 = sizeof protocol;
	trace_channel tc = { .pid = (uint32_t)getpid(), .fd = fd };
	chan_key k = { 0 };
	unsigned proto = 0;
	bool dgram = false, connected;
	chan *c;

	if (sys(SYS_fstat, fd, (long)&st, 0, 0, 0) != 0)
		return 0;                       /* gone already: ask again next time */
	k.inode = tc.inode = st.st_ino;
	if (S_ISFIFO(st.st_mode)) {
		int queued = 0;

		tc.proto = TRACE_PROTO_PIPE;
		/* point 5: before the first write, what the reader reads first */
		if (dir == DIR_SEND && len == 0 &&
		    sys(SYS_ioctl, fd, FIONREAD, (long)&queued, 0, 0) == 0 && queued > 0)
			tc.base[DIR_SEND] = (uint64_t)queued;
		c = chan_get(&k, &tc, TRACE_PROTO_PIPE, false);
		pipe_slot *ps = c ? pipe_slot_of(st.st_ino, tc.base[DIR_SEND]) : NULL;
		/* point 6: the session's writers', which the parent joined */
		volatile uint64_t *sent = c ? ag_pipe_sent(AG_FLOW_PIPE, st.st_ino) : NULL;
		volatile uint64_t *none = NULL;

		if (sent || ps)                 /* the family's counts (point 5) */
			__atomic_compare_exchange_n(&c->send_shared, &none,
						    sent ? sent : &ps->off[DIR_SEND], false,
						    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
		none = NULL;
		if (ps)
			__atomic_compare_exchange_n(&c->recv_shared, &none, &ps->off[DIR_RECV], false,
						    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
		goto done;
	}
	if (!S_ISSOCK(st.st_mode) ||
	    sys(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tl) != 0 ||
	    sys(SYS_getsockname, fd, (long)&la, (long)&ll, 0, 0) != 0)
		goto not_channel;
	sys(SYS_getsockopt, fd, SOL_SOCKET, SO_PROTOCOL, (long)&protocol, (long)&pl2);
	connected = sys(SYS_getpeername, fd, (long)&pa, (long)&pl, 0, 0) == 0;
	switch (la.ss_family) {
	case AF_INET:
	case AF_INET6:
		if (type == SOCK_STREAM && (protocol == IPPROTO_TCP || protocol == 262 /* MPTCP */))
			proto = TRACE_PROTO_TCP;
		else if (type == SOCK_DGRAM && protocol == IPPROTO_UDP)
			proto = TRACE_PROTO_UDP, dgram = true;
		break;
	case AF_UNIX:
		proto = type == SOCK_STREAM ? TRACE_PROTO_UNIX_STREAM
			: type == SOCK_DGRAM ? TRACE_PROTO_UNIX_DGRAM
			: type == SOCK_SEQPACKET ? TRACE_PROTO_UNIX_SEQPACKET : 0;
		dgram = type != SOCK_STREAM;
		break;
	default:
		break;
	}
	if (!proto)
		goto not_channel;
	if (!connected && !dgram)
		return 0;                       /* a stream not connected yet: ask again */
	tc.proto = proto;
	tc.family = la.ss_family;
	addr_of((struct sockaddr *)&la, ll, tc.local_addr, &tc.local_port, tc.local_path);
	if (la.ss_family == AF_UNIX)
		memset(tc.local_addr, 0, 16);   /* the hash is the key's, not the record's */
	k.family = la.ss_family;
	if (connected) {
		tc.flags = TRACE_CHAN_PEER;
		if (proto == TRACE_PROTO_TCP)
			tcp_bases(fd, dir, len, &tc);
		if ((proto == TRACE_PROTO_UNIX_STREAM || proto == TRACE_PROTO_UNIX_SEQPACKET) &&
		    (tc.peer_inode = unix_peer(st.st_ino)) != 0)
			tc.flags |= TRACE_CHAN_PEER_INODE;
		addr_of((struct sockaddr *)&pa, pl, tc.peer_addr, &tc.peer_port, tc.peer_path);
		addr_of((struct sockaddr *)&pa, pl, k.peer, &k.peer_port, NULL);
		if (la.ss_family == AF_UNIX)
			memset(tc.peer_addr, 0, 16);
		k.peer_known = 1;
	}
	c = chan_get(&k, &tc, proto, dgram);
	/* point 6: the count its traced writers share, which the parent took
	 * (by this socket: a forked child knows no peer) */
	volatile uint64_t *sent = c && proto == TRACE_PROTO_UNIX_STREAM && connected ?
				  ag_pipe_sent(AG_FLOW_UNIX, st.st_ino) : NULL;
	volatile uint64_t *none = NULL;

	if (sent)
		__atomic_compare_exchange_n(&c->send_shared, &none, sent, false, __ATOMIC_ACQ_REL,
					    __ATOMIC_RELAXED);
	if (c && !connected) {
		fd_set_word(fd, ST_UNCONN, (uint32_t)(c - chans));
		return fd_word(fd);
	}
done:
	if (!c)
		return 0;
	fd_set_word(fd, ST_CHAN, (uint32_t)(c - chans));
	return fd_word(fd);
not_channel:
	fd_set_word(fd, ST_NONE, 0);
	return fd_word(fd);
}

/* The channel of an unconnected datagram socket's datagram to or from
 * `peer` (base: the socket's own, peer unknown). */
static chan *chan_peer(chan *base, const struct sockaddr *peer, socklen_t len)
{
	chan_key k = { .inode = base->inode, .family = base->family, .peer_known = 1 };
	trace_channel tc;

	if (!peer || len < sizeof(sa_family_t) || peer->sa_family != base->family || !base->id)
		return base;
	addr_of(peer, len, k.peer, &k.peer_port, NULL);
	memcpy(&tc, chan_map + (size_t)base->id * sizeof tc, sizeof tc);
	tc.flags |= TRACE_CHAN_PEER;
	addr_of(peer, len, tc.peer_addr, &tc.peer_port, tc.peer_path);
	if (base->family == AF_UNIX)
		memset(tc.peer_addr, 0, 16);
	chan *c = chan_get(&k, &tc, base->proto, true);

	return c ? c : base;
}

/* ---- recording (point 4) ---- */

/* The TSC when this thread's send call began (0: none pending). */
static __thread uint64_t send_t0 __attribute__((tls_model("initial-exec")));

static inline bool tracing(void)
{
	return ag_tls_ring && ag_active();
}

/* Point 4: a send call is about to begin. */
static inline void send_begins(void)
{
	if (tracing())
		send_t0 = ag_rdtsc();
}

/* The word of fd, classified now if unknown (on a tracing thread), for a
 * call that moved len bytes in direction dir (classify).  Classifying is
 * the agent's own time, system calls included (trace_format.h): in the
 * thread's ring r, if it has one, between AGENT_BEGIN and AGENT_END. */
static uint64_t word_of(trace_ring_header *r, int fd, unsigned dir, uint64_t len)
{
	uint64_t w = fd_word(fd);

	if (w)
		return w;
	if (r)
		ag_ring_put(r, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
	w = classify(fd, dir, len);
	if (r)
		ag_ring_put(r, TRACE_EVENT, TRACE_EV_AGENT_END);
	return w;
}

/* The message itself: no system call, no lock, no library call. */
static void record(trace_ring_header *r, chan *c, unsigned dir, unsigned call, uint64_t len)
{
	uint64_t data[TRACE_MSG_NDATA], off;

	if (!c->id || (len == 0 && c->dgram))  /* no end of stream on datagrams */
		return;
	if (dir == DIR_RECV && c->recv_shared)
		off = __atomic_exchange_n(&c->recv_counted, 0, __ATOMIC_ACQ_REL) ? c->off[DIR_RECV]
		      : c->recv_base + __atomic_fetch_add(c->recv_shared, len, __ATOMIC_RELAXED);
	else if (dir == DIR_SEND && c->send_shared)
		off = __atomic_fetch_add(c->send_shared, len, __ATOMIC_RELAXED);
	else
		off = __atomic_fetch_add(&c->off[dir], c->dgram ? 1 : len, __ATOMIC_RELAXED);
	trace_msg_pack(data, c->id, call, c->msg_flags[dir], off, len);
	ag_ring_put_msg(r, dir == DIR_SEND ? TRACE_EV_MSG_SEND : TRACE_EV_MSG_RECV, data,
			dir == DIR_SEND ? send_t0 : 0);
}

/* The slow path: classify fd, or find a datagram's channel by its peer. */
static void put(trace_ring_header *r, int fd, unsigned dir, unsigned call, uint64_t len,
		const struct sockaddr *peer, socklen_t plen)
{
	uint64_t w;

	if (ag_fd_is_ours(fd) || !(w = word_of(r, fd, dir, len)))
		return;
	switch ((w >> 32) & 0xff) {
	case ST_CHAN:
		record(r, &chans[(uint32_t)w], dir, call, len);
		break;
	case ST_UNCONN:
		record(r, chan_peer(&chans[(uint32_t)w], peer, plen), dir, call, len);
		break;
	default:
		break;
	}
}

/* A call moved `len` bytes over fd: its message, if fd is a channel.  A
 * descriptor known not to be one costs a load and a test; one known to be
 * a connected channel is recorded at once, without ag_enter (nothing here
 * calls traced code) and without touching errno (no system call). */
static void msg(int fd, unsigned dir, unsigned call, uint64_t len, const struct sockaddr *peer,
		socklen_t plen)
{
	uint64_t w = fd_word(fd);
	unsigned st = (w >> 32) & 0xff;
	int saved;
	trace_ring_header *r;

	if (st == ST_NONE)
		return;
	if (st == ST_CHAN && (r = ag_tls_ring) != NULL) {
		record(r, &chans[(uint32_t)w], dir, call, len);
		return;
	}
	saved = errno;
	r = ag_enter();
	if (r)
		put(r, fd, dir, call, len, peer, plen);
	ag_leave(r);
	errno = saved;
}

/* Each datagram of sendmmsg/recvmmsg. */
static void msgs_v(int fd, unsigned dir, unsigned call, const struct mmsghdr *v, int n)
{
	for (int i = 0; i < n; i++)
		msg(fd, dir, call, v[i].msg_len, (const struct sockaddr *)v[i].msg_hdr.msg_name,
		    v[i].msg_hdr.msg_namelen);
}

/* A receive on an unconnected datagram socket without an address of the
 * caller's: the agent passes its own, to know the peer. */
static bool wants_peer(int fd)
{
	uint64_t w = fd_word(fd);
	int saved;
	trace_ring_header *r;

	if (w)
		return ((w >> 32) & 0xff) == ST_UNCONN;
	saved = errno;
	r = ag_enter();
	w = r && !ag_fd_is_ours(fd) ? word_of(r, fd, DIR_RECV, 0) : 0;
	ag_leave(r);
	errno = saved;
	return ((w >> 32) & 0xff) == ST_UNCONN;
}

/* A receive asked for bytes and got 0: on a stream, its end (record()
 * drops it on a datagram channel: an empty datagram). */
static void eof(int fd, size_t asked, int flags)
{
	if (asked && !(flags & MSG_PEEK) && tracing())
		msg(fd, DIR_RECV, TRACE_CALL_EOF, 0, NULL, 0);
}

static size_t iov_len(const struct iovec *iov, size_t n)
{
	size_t total = 0;

	for (size_t i = 0; iov && i < n; i++)
		total += iov[i].iov_len;
	return total;
}

/* The bytes a receive of rc bytes into iov put in one piece, or NULL. */
static const void *first_iov(const struct iovec *iov, size_t n, long rc)
{
	return n && iov && rc >= 0 && (size_t)rc <= iov[0].iov_len ? iov[0].iov_base : NULL;
}

/* --on recv, --on accept (events.c) */
static void event(const char *what, long rc, int fd, const void *data)
{
	/* The event activates a dormant agent only, or one more thread of one
	 * that awaits the receive of a traced send (propagate.c) */
	if (!ag_active() || ag_expecting())
		ag_event_after(what, rc, fd, data);
}

/* --on recv: a read of a socket is a receive too (many servers read their
 * connections rather than recv them); a read of a file, a pipe or a
 * terminal is not -- but a pipe's is while the agent awaits the receive of
 * a traced write into a pipe (propagate.c).  Looked at only while the
 * agent waits for that event. */
static void read_event(int fd, long rc, const void *data)
{
	/* awaited receives are matched by what fd is (propagate.c) */
	if (rc > 0 && ag_event_wanted("recv") && (ag_expecting() || ag_fd_is_socket(fd)))
		event("recv", rc, fd, data);
}

bool ag_fd_is_socket(int fd)
{
	struct stat st;
	int e = errno;
	bool yes = sys(SYS_fstat, fd, (long)&st, 0, 0, 0) == 0 && S_ISSOCK(st.st_mode);

	errno = e;
	return yes;
}

/*
 * Before a traced send: the first one on a channel -- TCP, UDP to one
 * peer, a pipe, a connected UNIX stream socket (its peer unknown here: the
 * daemon finds it, or the listener's path names it), a UNIX
 * datagram to a peer socket or a path -- asks
 * spdaemon to follow it to its other end, and waits (propagate.c, points 2
 * and 3).  A channel asked about already costs a load and a test.  The
 * standard streams are never followed: a program's output read by a pipe
 * goes to whoever started it -- a shell pipeline, the command that runs a
 * test -- which is not the request's way.  Classified here, before
 * its first send, a TCP channel's base is the offset of that send's first
 * byte (tcp_bases with len 0).  A datagram is named by the hash of its
 * bytes (iov), which its receiver compares.
 */
static void before_send(int fd, const struct sockaddr *to, socklen_t tolen,
			const struct iovec *iov, size_t niov)
{
	uint64_t w = fd_word(fd);
	unsigned st = (w >> 32) & 0xff;
	trace_ring_header *r;
	int saved;

	if (st == ST_NONE || fd <= 2 ||
	    (st == ST_CHAN && __atomic_load_n(&chans[(uint32_t)w].asked, __ATOMIC_RELAXED)))
		return;
	saved = errno;
	r = ag_enter();
	if (r && !ag_fd_is_ours(fd) && (w = word_of(r, fd, DIR_SEND, 0)) != 0 &&
	    (((w >> 32) & 0xff) == ST_CHAN || ((w >> 32) & 0xff) == ST_UNCONN)) {
		chan *c = &chans[(uint32_t)w];

		if (((w >> 32) & 0xff) == ST_UNCONN)
			c = to ? chan_peer(c, to, tolen) : NULL;
		if (c && !__atomic_exchange_n(&c->asked, 1, __ATOMIC_ACQ_REL) && c->id &&
		    (c->proto == TRACE_PROTO_PIPE || c->proto == TRACE_PROTO_UNIX_STREAM ||
		     (c->peer_known && (c->proto == TRACE_PROTO_TCP || c->proto == TRACE_PROTO_UDP ||
					c->proto == TRACE_PROTO_UNIX_DGRAM)))) {
			trace_channel tc;
			ag_flow_chan fc = { .family = c->family, .inode = c->inode };

			memcpy(&tc, chan_map + (size_t)c->id * sizeof tc, sizeof tc);
			memcpy(fc.local, tc.local_addr, 16);
			memcpy(fc.peer, tc.peer_addr, 16);
			fc.lport = tc.local_port;
			fc.pport = tc.peer_port;
			if (c->proto == TRACE_PROTO_PIPE) {
				fc.kind = AG_FLOW_PIPE;
				fc.at_offset = true;    /* the reader lines up on it */
				fc.offset = __atomic_load_n(c->send_shared ? c->send_shared
							    : &c->off[DIR_SEND], __ATOMIC_RELAXED);
			} else if (c->proto == TRACE_PROTO_UNIX_STREAM) {
				/* the receiving end: the peer's inode; a connection not
				 * accepted yet has none: the listener's path then */
				fc.kind = AG_FLOW_UNIX;
				fc.inode = tc.flags & TRACE_CHAN_PEER_INODE ? tc.peer_inode
					   : unix_peer(c->inode);
				fc.src_inode = c->inode;        /* came-from (propagate.c) */
				/* its own count: its peer's queue is not seen
				 * (propagate.c, point 18); a peer unknown here (a
				 * forked child's) the daemon may find */
				fc.at_offset = true;
				fc.offset = __atomic_load_n(c->send_shared ? c->send_shared
							    : &c->off[DIR_SEND], __ATOMIC_RELAXED);
				if (!fc.inode)
					peer_path(fd, fc.path, sizeof fc.path);
			} else if (c->proto == TRACE_PROTO_UNIX_DGRAM) {
				/* the receiving socket: the peer's inode, else the
				 * path it is bound to (the daemon finds it) */
				fc.kind = AG_FLOW_UNIXDGRAM;
				fc.inode = ((w >> 32) & 0xff) == ST_CHAN ? unix_peer(c->inode) : 0;
				if (!fc.inode && to)
					unix_addr_path(to, tolen, fc.path, sizeof fc.path);
				else if (!fc.inode)
					peer_path(fd, fc.path, sizeof fc.path);
				fc.offset = AG_FLOW_HASH0;
				for (size_t i = 0; i < niov; i++)
					fc.offset = ag_flow_hash(iov[i].iov_base, iov[i].iov_len,
								 fc.offset);
				fc.at_offset = iov != NULL;
			} else if (c->proto == TRACE_PROTO_UDP) {
				fc.kind = AG_FLOW_UDP;
				fc.offset = AG_FLOW_HASH0;
				for (size_t i = 0; i < niov; i++)
					fc.offset = ag_flow_hash(iov[i].iov_base, iov[i].iov_len,
								 fc.offset);
				fc.at_offset = iov != NULL;
			} else {
				fc.kind = AG_FLOW_TCP;
				fc.at_offset = (tc.flags & TRACE_CHAN_ABS_SEND) != 0;
				fc.offset = __atomic_load_n(&c->off[DIR_SEND], __ATOMIC_RELAXED);
			}
			int mark = ag_propagate_ask(&fc);

			/* point 6: the count the channel's traced writers share */
			if ((fc.kind == AG_FLOW_PIPE || fc.kind == AG_FLOW_UNIX) && fc.sent)
				__atomic_store_n(&c->send_shared, fc.sent, __ATOMIC_RELEASE);

			/* the mark's byte takes a sequence number, as the kernel counts */
			if (mark == AG_MARK_OOB && ag_mark_send(fd) == 0)
				__atomic_add_fetch(&c->off[DIR_SEND], 1, __ATOMIC_RELAXED);
			else if (mark == AG_MARK_IPOPT)
				ag_mark_udp(fd, fc.mark_seq);   /* until the send ends: after_send */
		}
	}
	ag_leave(r);
	errno = saved;
}

static inline void propagate(int fd, const struct sockaddr *to, socklen_t tolen,
			     const struct iovec *iov, size_t niov)
{
	if (ag_propagating() && tracing())
		before_send(fd, to, tolen, iov, niov);
	send_begins();
}

/* The same, for one buffer. */
static inline void propagate1(int fd, const struct sockaddr *to, socklen_t tolen,
			      const void *buf, size_t n)
{
	if (ag_propagating() && tracing()) {
		struct iovec v = { (void *)buf, n };

		before_send(fd, to, tolen, &v, 1);
	}
	send_begins();
}

bool ag_msgs_recv_count(uint64_t inode, uint64_t *count)
{
	uint32_t n = chans ? __atomic_load_n(&nchans, __ATOMIC_ACQUIRE) : 0;

	for (uint32_t i = 0; i < n && i < MAX_CHANS; i++) {
		chan *c = &chans[i];
		volatile uint64_t *sh = __atomic_load_n(&c->recv_shared, __ATOMIC_ACQUIRE);

		if (c->inode != inode || c->dgram ||
		    (c->proto != TRACE_PROTO_PIPE && c->proto != TRACE_PROTO_UNIX_STREAM))
			continue;
		*count = sh && !c->recv_counted ? c->recv_base + __atomic_load_n(sh, __ATOMIC_RELAXED)
			 : __atomic_load_n(&c->off[DIR_RECV], __ATOMIC_RELAXED);
		return *count > 0;
	}
	return false;
}

/* Point 5: fd's received count moves to the sender's, at off -- or, with
 * `shared`, to the count every reader of the pipe adds to, from base (the
 * awaited receive itself, at off, is counted in it already).
 * Called at the awaited receive, before its message is recorded; raw
 * system calls only (it may be in activate.c's SIGTRAP handler). */
void ag_msgs_recv_at(int fd, uint64_t off, volatile uint64_t *shared, uint64_t base)
{
	uint64_t w;

	if (ag_fd_is_ours(fd) || !(w = word_of(NULL, fd, DIR_RECV, 0)) ||
	    ((w >> 32) & 0xff) != ST_CHAN)
		return;
	chan *c = &chans[(uint32_t)w];

	if (c->dgram)
		return;
	if (!shared && c->recv_shared) {        /* the family's count moves with it */
		__atomic_store_n(c->recv_shared, off - c->recv_base, __ATOMIC_RELAXED);
		return;
	}
	c->recv_base = base;
	__atomic_store_n(&c->off[DIR_RECV], off, __ATOMIC_RELAXED);
	__atomic_store_n(&c->recv_counted, shared != NULL, __ATOMIC_RELAXED);
	__atomic_store_n(&c->recv_shared, shared, __ATOMIC_RELEASE);
}

/* A receive of rc bytes by system call nr that no interposer saw (a thread
 * that was blocked in it when the agent came: activate.c's breakpoint, in
 * its SIGTRAP handler -- the thread holds none of the agent's locks). */
void ag_msgs_received(int fd, long nr, long rc)
{
	unsigned call = nr == SYS_read ? TRACE_CALL_READ : nr == SYS_readv ? TRACE_CALL_READV
			: nr == SYS_recvmsg ? TRACE_CALL_RECVMSG : TRACE_CALL_RECVFROM;

	if (rc > 0 && tracing())
		msg(fd, DIR_RECV, call, (uint64_t)rc, NULL, 0);
}

/* After a send: the IP option of a marked datagram off again (propagate.c,
 * point 13). */
static inline void after_send(int fd)
{
	if (__builtin_expect(__atomic_load_n(&ag_udp_marking, __ATOMIC_RELAXED), 0))
		ag_mark_udp_sent(fd);
}

/* Before a receive: the program's own MSG_OOB is noted (propagate.c,
 * point 9); an awaited urgent byte is read first (point 11). */
static inline void before_recv(int fd, int flags)
{
	if (__builtin_expect(flags & MSG_OOB, 0))
		ag_mark_program_oob();
	else if (ag_expecting())
		ag_expect_before(fd);
}

/* ---- the interposers (hooks.c's table) ---- */

AG_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	ssize_t rc;

	if (flags & MSG_OOB)
		ag_mark_program_oob();
	propagate1(fd, NULL, 0, buf, n);
	rc = real_send ? real_send(fd, buf, n, flags)
	     : sys(SYS_sendto, fd, (long)buf, (long)n, flags, 0);
	after_send(fd);
	if (rc > 0 && tracing())
		msg(fd, DIR_SEND, TRACE_CALL_SEND, (uint64_t)rc, NULL, 0);
	return rc;
}

AG_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
			 const struct sockaddr *addr, socklen_t len)
{
	ssize_t rc;

	if (flags & MSG_OOB)
		ag_mark_program_oob();
	propagate1(fd, addr, len, buf, n);
	rc = real_sendto ? real_sendto(fd, buf, n, flags, addr, len)
	     : syscall(SYS_sendto, fd, buf, n, flags, addr, len);
	after_send(fd);
	if (rc > 0 && tracing())
		msg(fd, DIR_SEND, TRACE_CALL_SENDTO, (uint64_t)rc, addr, len);
	return rc;
}

AG_EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	ssize_t rc;

	if (flags & MSG_OOB)
		ag_mark_program_oob();
	if (m)                  /* else the C library says EFAULT */
		propagate(fd, (const struct sockaddr *)m->msg_name, m->msg_namelen, m->msg_iov,
			  m->msg_iovlen);
	rc = real_sendmsg ? real_sendmsg(fd, m, flags)
	     : sys(SYS_sendmsg, fd, (long)m, flags, 0, 0);
	after_send(fd);
	if (rc > 0 && tracing())
		msg(fd, DIR_SEND, TRACE_CALL_SENDMSG, (uint64_t)rc,
		    (const struct sockaddr *)m->msg_name, m->msg_namelen);
	return rc;
}

AG_EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	int rc;

	if (n && v)
		propagate(fd, (const struct sockaddr *)v[0].msg_hdr.msg_name,
			  v[0].msg_hdr.msg_namelen, v[0].msg_hdr.msg_iov, v[0].msg_hdr.msg_iovlen);
	rc = real_sendmmsg ? real_sendmmsg(fd, v, n, flags)
	     : (int)sys(SYS_sendmmsg, fd, (long)v, n, flags, 0);
	after_send(fd);
	if (rc > 0 && tracing())
		msgs_v(fd, DIR_SEND, TRACE_CALL_SENDMMSG, v, rc);
	return rc;
}

AG_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	ssize_t rc;

	propagate1(fd, NULL, 0, buf, n);
	rc = real_write ? real_write(fd, buf, n) : sys(SYS_write, fd, (long)buf, (long)n, 0, 0);
	after_send(fd);
	if (rc > 0 && tracing())
		msg(fd, DIR_SEND, TRACE_CALL_WRITE, (uint64_t)rc, NULL, 0);
	return rc;
}

AG_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	ssize_t rc;

	propagate(fd, NULL, 0, iov, n > 0 ? (size_t)n : 0);
	rc = real_writev ? real_writev(fd, iov, n) : sys(SYS_writev, fd, (long)iov, n, 0, 0);
	after_send(fd);
	if (rc > 0 && tracing())
		msg(fd, DIR_SEND, TRACE_CALL_WRITEV, (uint64_t)rc, NULL, 0);
	return rc;
}

static ssize_t recvfrom_common(recvfrom_chk_fn chk, size_t buflen, int fd, void *buf, size_t n,
			       int flags, struct sockaddr *addr, socklen_t *len, unsigned call)
{
	struct sockaddr_storage own;
	socklen_t ownlen = sizeof own;
	ssize_t rc;

	if (!addr && tracing() && wants_peer(fd)) {
		addr = (struct sockaddr *)&own;
		len = &ownlen;
	}
	before_recv(fd, flags);
	if (chk)
		rc = chk(fd, buf, n, buflen, flags, addr, len);
	else if (real_recvfrom)
		rc = real_recvfrom(fd, buf, n, flags, addr, len);
	else
		rc = syscall(SYS_recvfrom, fd, buf, n, flags, addr, len);
	if (rc > 0) {
		event("recv", rc, fd, buf);
		if (tracing() && !(flags & MSG_PEEK))
			msg(fd, DIR_RECV, call, (uint64_t)rc, addr, addr && len ? *len : 0);
	} else if (rc == 0) {
		eof(fd, n, flags);
	}
	return rc;
}

/* After recv or __recv_chk returned rc: the activation event, the message,
 * or the end of the stream (each keeps errno as the call left it). */
static ssize_t recv_after(int fd, ssize_t rc, const void *buf, size_t n, int flags)
{
	if (rc > 0) {
		event("recv", rc, fd, buf);
		if (tracing() && !(flags & MSG_PEEK))
			msg(fd, DIR_RECV, TRACE_CALL_RECV, (uint64_t)rc, NULL, 0);
	} else if (rc == 0) {
		eof(fd, n, flags);
	}
	return rc;
}

AG_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	ssize_t rc;

	if (tracing() && wants_peer(fd))
		return recvfrom_common(NULL, 0, fd, buf, n, flags, NULL, NULL, TRACE_CALL_RECV);
	before_recv(fd, flags);
	rc = real_recv ? real_recv(fd, buf, n, flags)
	     : syscall(SYS_recvfrom, fd, buf, n, flags, NULL, NULL);
	return recv_after(fd, rc, buf, n, flags);
}

AG_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr,
			   socklen_t *len)
{
	return recvfrom_common(NULL, 0, fd, buf, n, flags, addr, len, TRACE_CALL_RECVFROM);
}

AG_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	ssize_t rc;

	before_recv(fd, flags);
	rc = real_recv_chk ? real_recv_chk(fd, buf, n, buflen, flags)
	     : syscall(SYS_recvfrom, fd, buf, n, flags, NULL, NULL);

	return recv_after(fd, rc, buf, n, flags);
}

AG_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
				 struct sockaddr *addr, socklen_t *len)
{
	return recvfrom_common(real_recvfrom_chk, buflen, fd, buf, n, flags, addr, len,
			       TRACE_CALL_RECVFROM);
}

AG_EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	ssize_t rc;

	before_recv(fd, flags);
	rc = real_recvmsg ? real_recvmsg(fd, m, flags) : sys(SYS_recvmsg, fd, (long)m, flags, 0, 0);
	if (rc >= 0 && __builtin_expect(__atomic_load_n(&ag_recvopts_on, __ATOMIC_RELAXED), 0))
		ag_mark_strip(fd, m);           /* propagate.c, point 14 */

	if (rc > 0) {
		event("recv", rc, fd, first_iov(m->msg_iov, m->msg_iovlen, rc));
		if (tracing() && !(flags & MSG_PEEK))
			msg(fd, DIR_RECV, TRACE_CALL_RECVMSG, (uint64_t)rc,
			    (const struct sockaddr *)m->msg_name, m->msg_namelen);
	} else if (rc == 0) {
		eof(fd, iov_len(m->msg_iov, m->msg_iovlen), flags);
	}
	return rc;
}

AG_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *to)
{
	int rc;

	before_recv(fd, flags);
	rc = real_recvmmsg ? real_recvmmsg(fd, v, n, flags, to)
	     : (int)sys(SYS_recvmmsg, fd, (long)v, n, flags, (long)to);
	for (int i = 0; i < rc && __atomic_load_n(&ag_recvopts_on, __ATOMIC_RELAXED); i++)
		ag_mark_strip(fd, &v[i].msg_hdr);

	if (rc > 0) {
		event("recv", (long)v[0].msg_len, fd,
		      first_iov(v[0].msg_hdr.msg_iov, v[0].msg_hdr.msg_iovlen, v[0].msg_len));
		if (tracing() && !(flags & MSG_PEEK))
			msgs_v(fd, DIR_RECV, TRACE_CALL_RECVMMSG, v, rc);
	}
	return rc;
}

/* After read, __read_chk or readv (call) returned rc of `asked` bytes: the
 * activation event, the message, or the end of the stream. */
static ssize_t read_after(int fd, ssize_t rc, const void *data, unsigned call, size_t asked)
{
	read_event(fd, rc, data);
	if (rc > 0 && tracing())
		msg(fd, DIR_RECV, call, (uint64_t)rc, NULL, 0);
	else if (rc == 0)
		eof(fd, asked, 0);
	return rc;
}

AG_EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	ssize_t rc;

	before_recv(fd, 0);
	rc = real_read ? real_read(fd, buf, n) : sys(SYS_read, fd, (long)buf, (long)n, 0, 0);

	return read_after(fd, rc, buf, TRACE_CALL_READ, n);
}

AG_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	ssize_t rc;

	before_recv(fd, 0);
	rc = real_read_chk ? real_read_chk(fd, buf, n, buflen)
	     : sys(SYS_read, fd, (long)buf, (long)n, 0, 0);

	return read_after(fd, rc, buf, TRACE_CALL_READ, n);
}

AG_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	ssize_t rc;

	before_recv(fd, 0);
	rc = real_readv ? real_readv(fd, iov, n) : sys(SYS_readv, fd, (long)iov, n, 0, 0);

	return read_after(fd, rc, n > 0 ? first_iov(iov, (size_t)n, rc) : NULL, TRACE_CALL_READV,
			  rc == 0 && n > 0 ? iov_len(iov, (size_t)n) : 0);
}

AG_EXPORT ssize_t splice(int in, loff_t *inoff, int out, loff_t *outoff, size_t n, unsigned flags)
{
	send_begins();
	ssize_t rc = real_splice ? real_splice(in, inoff, out, outoff, n, flags)
		     : syscall(SYS_splice, in, inoff, out, outoff, n, flags);

	if (rc > 0 && tracing()) {
		msg(in, DIR_RECV, TRACE_CALL_SPLICE, (uint64_t)rc, NULL, 0);
		msg(out, DIR_SEND, TRACE_CALL_SPLICE, (uint64_t)rc, NULL, 0);
	}
	return rc;
}

static ssize_t sendfile_common(sendfile_fn real, int out, int in, off_t *off, size_t n)
{
	send_begins();
	ssize_t rc = real ? real(out, in, off, n) : sys(SYS_sendfile, out, in, (long)off, (long)n, 0);

	if (rc > 0 && tracing()) {
		msg(in, DIR_RECV, TRACE_CALL_SENDFILE, (uint64_t)rc, NULL, 0);
		msg(out, DIR_SEND, TRACE_CALL_SENDFILE, (uint64_t)rc, NULL, 0);
	}
	return rc;
}

AG_EXPORT ssize_t ag_sendfile(int out, int in, off_t *off, size_t n)
{
	return sendfile_common(real_sendfile, out, in, off, n);
}

AG_EXPORT ssize_t ag_sendfile64(int out, int in, off_t *off, size_t n)
{
	return sendfile_common(real_sendfile64 ? real_sendfile64 : real_sendfile, out, in, off, n);
}

/* shutdown: a message of length 0 per direction shut (trace_format.h,
 * "Message events", point 4). */
AG_EXPORT int shutdown(int fd, int how)
{
	send_begins();
	int rc = real_shutdown ? real_shutdown(fd, how) : (int)sys(SYS_shutdown, fd, how, 0, 0, 0);

	if (rc == 0 && tracing()) {
		if (how == SHUT_WR || how == SHUT_RDWR)
			msg(fd, DIR_SEND, TRACE_CALL_SHUTDOWN, 0, NULL, 0);
		if (how == SHUT_RD || how == SHUT_RDWR)
			msg(fd, DIR_RECV, TRACE_CALL_SHUTDOWN, 0, NULL, 0);
	}
	return rc;
}

/* Calls that change a number's channel or hand out a number (point 3). */

AG_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	int rc, saved;

	ag_msgs_forget(fd);
	rc = real_connect ? real_connect(fd, addr, len) : (int)sys(SYS_connect, fd, (long)addr, len, 0, 0);
	saved = errno;
	ag_msgs_forget(fd);        /* a thread's message in between classified it */
	if (rc == 0 || errno == EINPROGRESS)
		set_opened(fd, OPENED_ACTIVE);
	errno = saved;
	return rc;
}

AG_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	int rc = real_accept ? real_accept(fd, addr, len)
		 : (int)sys(SYS_accept, fd, (long)addr, (long)len, 0, 0);

	if (rc >= 0) {
		ag_msgs_forget(rc);
		set_opened(rc, OPENED_PASSIVE);
		event("accept", rc, fd, NULL);
	}
	return rc;
}

AG_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	int rc = real_accept4 ? real_accept4(fd, addr, len, flags)
		 : (int)sys(SYS_accept4, fd, (long)addr, (long)len, flags, 0);

	if (rc >= 0) {
		ag_msgs_forget(rc);
		set_opened(rc, OPENED_PASSIVE);
		event("accept", rc, fd, NULL);
	}
	return rc;
}

AG_EXPORT int socket(int domain, int type, int protocol)
{
	int rc = real_socket ? real_socket(domain, type, protocol)
		 : (int)sys(SYS_socket, domain, type, protocol, 0, 0);

	ag_msgs_forget(rc);
	return rc;
}

AG_EXPORT int socketpair(int domain, int type, int protocol, int sv[2])
{
	int rc = real_socketpair ? real_socketpair(domain, type, protocol, sv)
		 : (int)sys(SYS_socketpair, domain, type, protocol, (long)sv, 0);

	if (rc == 0) {
		ag_msgs_forget(sv[0]);
		ag_msgs_forget(sv[1]);
	}
	return rc;
}

AG_EXPORT int pipe(int fds[2])
{
	int rc = real_pipe ? real_pipe(fds) : (int)sys(SYS_pipe2, (long)fds, 0, 0, 0, 0);

	if (rc == 0) {
		ag_msgs_forget(fds[0]);
		ag_msgs_forget(fds[1]);
	}
	return rc;
}

AG_EXPORT int pipe2(int fds[2], int flags)
{
	int rc = real_pipe2 ? real_pipe2(fds, flags) : (int)sys(SYS_pipe2, (long)fds, flags, 0, 0, 0);

	if (rc == 0) {
		ag_msgs_forget(fds[0]);
		ag_msgs_forget(fds[1]);
	}
	return rc;
}
