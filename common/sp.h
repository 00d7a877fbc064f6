/*
 * common/sp.h — what every sptrace component shares: the error type that
 * carries a message naming the object that failed, small string helpers,
 * whole-buffer I/O, time and SHA-256.  Kept libc-only so the agent can use it too.
 */
#ifndef SP_H
#define SP_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/*
 * An error message filled by the function that failed.  Libraries never print
 * and never exit; they return a negative status and describe the failure here,
 * naming the file, pid, host or offset and, where one exists, what to do.
 */
typedef struct sp_err {
	char msg[1024];
} sp_err;

/* Set the message (printf style); returns -1 so callers can `return sp_fail()`. */
int sp_fail(sp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix an existing message with more context ("reading X: <old message>"). */
int sp_failctx(sp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t sp_now_ns(void);

/*
 * The time-stamp counter's rate, in ticks per second, measured once per
 * process: between sp_tsc_hz_start's reading (the first call of either
 * does it) and the first sp_tsc_hz, at least 2 ms apart -- sp_tsc_hz waits
 * for what is missing.  sptrace hands it to every agent it starts, which
 * then need not spend 2 ms measuring it (the counter ticks at one rate in
 * every process of a machine: constant_tsc).  0 if the clock failed.
 */
void sp_tsc_hz_start(void);
uint64_t sp_tsc_hz(void);
/* CLOCK_MONOTONIC (*mono, ns) and the time-stamp counter (*tsc) at one
 * instant: the clock read between two counter readings, paired with their
 * middle, the closest pair of 5.  Read one after the other, an interrupt
 * or the first call's fault-in of the vDSO's data between the two made the
 * rate measured over 2 ms 1e-4 to 1e-3 low. */
void sp_clock_pair(uint64_t *tsc, uint64_t *mono);
/* The counter's rate from the pair (tsc0, mono0) to one taken at least 2 ms
 * later (waited for, if need be). */
uint64_t sp_tsc_hz_since(uint64_t tsc0, uint64_t mono0);

/*
 * Where the agent's descriptors go in a process whose soft RLIMIT_NOFILE is
 * `nofile`: 7/8 of it, at most 896 -- above what a program opens first,
 * below FD_SETSIZE, and without growing the kernel's descriptor table past
 * 1024 entries (agent/fds.c; the injector grows the table there first:
 * injector/inject.c).
 */
static inline int sp_agent_fd_base(unsigned long long nofile)
{
	return (int)((nofile < 1024 ? nofile : 1024) * 7 / 8);
}

/* Growable array helper: ensure room for `need` elements of `elsize` bytes. */
int sp_grow(void **arr, size_t *cap, size_t need, size_t elsize);

/*
 * Write or read all n bytes, retrying on EINTR and short counts; 0, or -1
 * with errno set (EIO when the file ends or takes no more bytes).
 */
int sp_write_all(int fd, const void *buf, size_t n);
int sp_read_all(int fd, void *buf, size_t n);
/* All n bytes at offset off (pread), the same way. */
int sp_pread_all(int fd, void *buf, size_t n, uint64_t off);

/*
 * The IP option that marks a traced UDP datagram (ipmark.c; the protocol:
 * agent/propagate.c, points 12 to 14): Record Route, full, carrying "SPTR"
 * and a sequence number, SP_IPMARK_LEN bytes with its end.  _find: 1 and
 * *seq when options p (n bytes, as IP_RECVOPTS gives them) carry it.
 */
#define SP_IPMARK_LEN 12
void sp_ipmark_build(uint8_t o[SP_IPMARK_LEN], uint32_t seq);
int sp_ipmark_find(const uint8_t *p, size_t n, uint32_t *seq);

/* unixdiag.c: a UNIX socket's peer, asked of sock_diag on the caller's own
 * NETLINK_SOCK_DIAG socket.  request: writes the question for socket
 * `inode` into buf (SP_UNIX_PEER_REQ_BYTES), returns its length; answer:
 * the peer's inode the kernel's answer of n bytes names, 0 when none (not
 * connected, gone, another socket's, not an answer). */
#define SP_UNIX_PEER_REQ_BYTES 64
size_t sp_unix_peer_request(void *buf, uint64_t inode);
uint64_t sp_unix_peer_answer(const void *buf, size_t n, uint64_t inode);

/*
 * THE TRUST RULES.  sptrace runs as root on hosts where other users run
 * programs; root never follows a path another user could have planted, and
 * a trace is its owner's alone.  What each command trusts, and where the
 * rule is kept:
 *
 *  1. Trace directories (cli/trace_dir.c).  Made through the parent's
 *     descriptor: mkdirat 0700, reopened O_NOFOLLOW and checked to be the
 *     one made, then fchown/fchmod on that descriptor (root attaching to a
 *     user's process gives the trace to that user).  As root, only where
 *     every directory on the way is root's (or the trace owner's) and not
 *     writable by others unless sticky.  Moving DIR to DIR.old and removing
 *     the DIR.old before never follows a link, stays on one file system and
 *     removes only a trace's names, all of the trace owner's; anything else
 *     leaves everything in place and is named.  Files 0600, directories
 *     0700 (--group: 2750/0640), whatever the umask.
 *  2. The registry (common/registry.h).  User U's registry is written only
 *     by U and root: checked owner and mode, not a link, on every use.  A
 *     command is written only into a FIFO of the traced process's user,
 *     opened without following a link and checked before it is opened for
 *     writing.
 *  3. Trace files read by replay, report, stop and drain (io.c below,
 *     cli/main.c cli_meta_open): regular files only -- never a FIFO, a
 *     device or, where an attacker could plant one, a link -- and every
 *     loop bounded by what the file can hold.
 *  4. Code analyses (codeanalysis/trust.c).  Stored only from a file no
 *     other user could have written (owner root or the caller, not group-
 *     or world-writable), checked on the descriptor the analysis reads; an
 *     entry records the SHA-256 of the code it was made from and each
 *     site's bytes, and the agent never patches a site whose bytes differ.
 *  5. Debug files (codeanalysis/lines.c).  As root, read only if every
 *     directory, link and the file itself on the way is root's or the
 *     module owner's, no directory writable by others unless sticky; and
 *     DWARF is parsed in a child with no other descriptors, as nobody, with
 *     no_new_privs and a seccomp filter (codeanalysis/sandbox.c).
 *  6. The daemon's keys and state (spdaemon/keys.c, spdaemon/main.c).  Key
 *     and state directories are the caller's and writable by no one else,
 *     opened O_NOFOLLOW, written relative to their descriptors; a private
 *     key others may read is not used; nothing existing is replaced.
 *  7. The wire (spdaemon/frame.c, tls.c).  A frame is checked for size,
 *     parse and kind before anything acts on it; another host is who the
 *     cluster CA's certificate says, a local client who SO_PEERCRED says.
 *  8. Injection by the daemon (spdaemon/inject.c).  A local requester gets
 *     the agent put only into processes all of whose uids are its own
 *     (root: any); another host only as `remote-inject` allows (by default
 *     no root process); never pid 1.  The agent file it injects is root's
 *     and writable by no one else.  Each trace goes into a directory made
 *     through descriptors and given to the traced process's user, 0700.
 */

/*
 * Open `path` for reading only if it is a regular file (io.c): a FIFO, a
 * device (/dev/urandom, /dev/zero) or a directory would block the reader or
 * never end.  O_NONBLOCK makes the open of a FIFO return at once (its fstat
 * then refuses it); with `nofollow`, a symbolic link is refused too (O_NOFOLLOW).
 * The fd, or -1 with errno: ENOENT and the like from open, ELOOP for a link,
 * EFTYPE_SP for anything not a regular file.  sp_open_why() words errno.
 */
#define EFTYPE_SP EMEDIUMTYPE
int sp_open_regular(const char *path, int nofollow);
const char *sp_open_why(int e);

/* Is fd's file the caller's (effective uid) and writable by no one else (no
 * group or other write bit)?  Then nothing in such a directory is another
 * user's doing.  *st gets its fstat, for a message naming owner and mode
 * (st_uid 0 and st_mode 0 when fstat failed). */
struct stat;
int sp_fd_private(int fd, struct stat *st);

/* dl.c: the functions `names` of the library `soname` (loaded now, its
 * symbols kept to it) into slots[0..n), in that order: 0, or -1 with why
 * (dlerror's, or the function missing).  A table of function pointers
 * filled so: one library loaded at its first use, not at every start. */
int sp_dl_table(const char *soname, const char *const *names, size_t n, void **slots,
		char *why, size_t len);

/* SHA-256 (sha256.c). */
typedef struct sp_sha256 {
	uint32_t h[8];
	uint64_t len;            /* bytes so far */
	uint8_t buf[64];
	size_t fill;             /* bytes in buf */
} sp_sha256;
void sp_sha256_init(sp_sha256 *s);
void sp_sha256_update(sp_sha256 *s, const void *data, size_t n);
void sp_sha256_final(sp_sha256 *s, uint8_t out[32]);

#endif
