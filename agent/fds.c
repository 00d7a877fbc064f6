/*
 * fds.c — the agent's own descriptors, out of the program's reach.
 *
 * The agent holds descriptors for as long as it runs: agent.log,
 * /proc/self/mem, the sites file, the control FIFO and its wake-up eventfd,
 * perf breakpoints.  A program may close, reuse or dup over any number it
 * did not open -- a daemon's `for (fd = 0; fd < 1024; fd++) close(fd)`,
 * close_range, closefrom, dup2 onto a number -- and the next file it opens
 * would then get the agent's number: the agent wrote code bytes into one of
 * the program's files at an address-sized offset, and its log lines into
 * another.  The rules:
 *
 *  1. Every long-lived descriptor of the agent's is moved to a high number
 *     (ag_fd_keep: F_DUPFD_CLOEXEC from 7/8 of the descriptor limit, at
 *     most 896), out of the range open() hands out first, so the numbers
 *     the program gets are the ones it gets natively; and it is registered,
 *     with its device and inode, in a bitmap that answers "is this ours"
 *     without a lock or a system call.
 *  2. close, close_range and closefrom leave the agent's descriptors open
 *     and give the program what it gets natively for numbers it never
 *     opened: close fails with EBADF; close_range and closefrom close the
 *     rest of the range.
 *  3. dup2 and dup3 onto one of the agent's numbers: the agent's descriptor
 *     moves to another free number first (its owner's variable follows),
 *     then the program's call goes through and gets exactly the number it
 *     asked for.  dup, dup2, dup3 and fcntl given one of the agent's
 *     numbers fail with EBADF, as natively.
 *  4. Nothing stops a raw system call (a runtime's own close loop).  So
 *     before the agent writes through a descriptor it asks ag_fd_checked(),
 *     which compares the number's device and inode with what was
 *     registered (one fstat); a descriptor that is no longer the agent's is
 *     forgotten -- never closed, it is the program's now -- and reopened by
 *     path where it has one (agent.log, /proc/self/mem, the sites file),
 *     else reported gone.  A write therefore never reaches a file the
 *     program opened.
 *
 *  5. The libraries linked into the agent (agent/meson.build) open no
 *     descriptors of their own: the agent opens every file they read.
 *
 * Left: a raw close followed by the program's open of that number between
 * the agent's check and its write (a window of two system calls), and the
 * program's sight of the numbers in /proc/self/fd.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

#define FD_BITS 65536                  /* numbers the bitmap covers */
#define MAX_KEPT 6144                  /* breakpoints per thread included */

typedef struct kept {
	volatile int *where;           /* the owner's variable; NULL: free entry */
	int fd;
	dev_t dev;
	ino_t ino;
	const char *path;              /* reopen by path (NULL: cannot) */
	int flags;
} kept;

static uint64_t ours[FD_BITS / 64];    /* rule 1: "is this number ours" */
static kept *table;                    /* ag_alloc'd: MAX_KEPT entries */
static uint16_t *slot_of;              /* fd -> its entry + 1 (0: none) */
static volatile int lock;              /* changes to the table (never in a signal
					* handler: the checks read without it) */

typedef int (*close_fn)(int);
typedef int (*close_range_fn)(unsigned, unsigned, int);
typedef void (*closefrom_fn)(int);
typedef int (*dup_fn)(int);
typedef int (*dup2_fn)(int, int);
typedef int (*dup3_fn)(int, int, int);
typedef int (*fcntl_fn)(int, int, ...);

static close_fn real_close;
static close_range_fn real_close_range;
static closefrom_fn real_closefrom;
static dup_fn real_dup;
static dup2_fn real_dup2;
static dup3_fn real_dup3;
static fcntl_fn real_fcntl, real_fcntl64;

static bool is_ours(int fd)
{
	return fd >= 0 && fd < FD_BITS &&
	       (__atomic_load_n(&ours[fd / 64], __ATOMIC_ACQUIRE) >> (fd % 64) & 1);
}

/* Number fd is (on) or is no longer the agent's, entry e's. */
static void mark(int fd, kept *e, bool on)
{
	if (fd < 0 || fd >= FD_BITS)
		return;
	if (on) {
		__atomic_store_n(&slot_of[fd], (uint16_t)(e - table + 1), __ATOMIC_RELEASE);
		__atomic_or_fetch(&ours[fd / 64], 1ull << (fd % 64), __ATOMIC_RELEASE);
	} else {
		__atomic_and_fetch(&ours[fd / 64], ~(1ull << (fd % 64)), __ATOMIC_RELEASE);
		__atomic_store_n(&slot_of[fd], 0, __ATOMIC_RELEASE);
	}
}

static void take(void)
{
	while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
		;
}

static void give(void)
{
	__atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
}

/* The C library's function behind the interposer `mine`; before they are
 * known (a constructor running ahead of the agent's) the system calls do.
 * Attached, the lookup may find the agent's own interposer (the agent is
 * not behind the C library in the lookup order): never that one. */
static void *next(const char *name, void *mine)
{
	void *fn = dlsym(RTLD_NEXT, name);

	if (!fn)
		fn = dlsym(RTLD_DEFAULT, name);
	return fn == mine ? NULL : fn;
}

void ag_fds_init(void)
{
	if (!table) {
		table = ag_alloc(MAX_KEPT * sizeof *table);
		slot_of = ag_alloc(FD_BITS * sizeof *slot_of);
		if (!slot_of)
			table = NULL;
	}
	real_close = (close_fn)next("close", (void *)close);
	real_close_range = (close_range_fn)next("close_range", (void *)close_range);
	real_closefrom = (closefrom_fn)next("closefrom", (void *)closefrom);
	real_dup = (dup_fn)next("dup", (void *)dup);
	real_dup2 = (dup2_fn)next("dup2", (void *)dup2);
	real_dup3 = (dup3_fn)next("dup3", (void *)dup3);
	real_fcntl = (fcntl_fn)next("fcntl", (void *)ag_fcntl);
	real_fcntl64 = (fcntl_fn)next("fcntl64", (void *)ag_fcntl64);
}

/* fstat as one system call: the C library's fstat calls on to fstatat, a
 * call site the agent may be patching right now, on this very thread (a
 * stop restores code from the control thread, which writes through here). */
static int raw_fstat(int fd, struct stat *st)
{
	return (int)syscall(SYS_fstat, fd, st);
}

static int sys_close(int fd)
{
	return real_close ? real_close(fd) : (int)syscall(SYS_close, fd);
}

/* Where the agent's descriptors go (sp.h). */
static int high_base(void)
{
	struct rlimit rl;

	if (syscall(SYS_getrlimit, RLIMIT_NOFILE, &rl) != 0)
		rl.rlim_cur = 1024;
	return sp_agent_fd_base(rl.rlim_cur);
}

/* A copy of fd at a high number (fd itself if there is none). */
static int move_high(int fd)
{
	int base = high_base(), nfd = -1;

	if (fd < base)
		nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, base);
	if (nfd < 0)
		return fd;
	syscall(SYS_close, fd);
	return nfd;
}

static kept *entry_of(int fd)
{
	unsigned i;

	if (fd < 0 || fd >= FD_BITS || !table)
		return NULL;
	i = __atomic_load_n(&slot_of[fd], __ATOMIC_ACQUIRE);
	return i && table[i - 1].where && table[i - 1].fd == fd ? &table[i - 1] : NULL;
}

int ag_fd_keep(volatile int *where, const char *path, int flags)
{
	struct stat st;
	int fd = *where;
	kept *e = NULL;

	if (fd < 0 || !table)
		return fd;
	fd = move_high(fd);
	*where = fd;
	if (raw_fstat(fd, &st) != 0)
		return fd;
	take();
	for (int i = 0; i < MAX_KEPT && !e; i++)
		if (!table[i].where)
			e = &table[i];
	if (e) {
		*e = (kept){ .where = where, .fd = fd, .dev = st.st_dev, .ino = st.st_ino,
			     .path = path, .flags = flags };
		mark(fd, e, true);
	}
	give();
	if (!e)
		ag_log("fds: more than %d descriptors of the agent's; %d is not protected from "
		       "the program's close calls", MAX_KEPT, fd);
	return fd;
}

/* fork: no other thread is inside a change of the table when the child is
 * made (a lock copied held would never be given back in the child, whose
 * first ag_fd_drop would spin for ever: a postgres backend forked while
 * the control thread dropped a dead thread's file never shut down). */
void ag_fds_fork_lock(void)
{
	take();
}

void ag_fds_fork_unlock(void)
{
	give();
}

void ag_fd_drop(int fd)
{
	kept *e;

	if (fd < 0)
		return;
	take();
	e = entry_of(fd);
	if (e) {
		mark(fd, e, false);
		e->where = NULL;
	}
	give();
	sys_close(fd);
}

/* Rule 4: still the file registered?  Otherwise forget it (the number is
 * the program's now), and reopen by path if it has one. */
int ag_fd_checked(volatile int *where)
{
	struct stat st;
	int fd = *where;
	kept *e;
	const char *path;
	int flags;

	/* A thread in strict seccomp mode may write, but an fstat would kill
	 * the process (tsc.c): its writes go unchecked. */
	if (fd < 0 || !is_ours(fd) || ag_tls_quiet == AG_QUIET_STRICT)
		return fd;
	e = entry_of(fd);
	if (!e || (raw_fstat(fd, &st) == 0 && st.st_dev == e->dev && st.st_ino == e->ino))
		return fd;
	take();
	if (entry_of(fd) != e || *where != fd) {
		give();
		return *where;          /* another thread got here first */
	}
	path = e->path;
	flags = e->flags;
	mark(fd, e, false);
	e->where = NULL;
	*where = -1;
	give();
	if (path) {
		*where = open(path, flags | O_CLOEXEC);
		if (*where >= 0)
			ag_fd_keep(where, path, flags);
	}
	/* After the reopen: agent.log may be the descriptor being replaced. */
	ag_log("fds: descriptor %d was closed behind the agent's back (a raw system call); "
	       "%s%s", fd, path ? "reopened " : "it is gone", path ? path : "");
	return *where;
}

/* Rule 3: the agent's fd leaves for another number; its owner follows. */
static void vacate(int fd)
{
	kept *e;
	int nfd;

	take();
	e = entry_of(fd);
	if (e) {
		nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, high_base());
		if (nfd < 0)
			nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 3);
		int old = fd;

		mark(fd, e, false);
		if (nfd >= 0) {
			e->fd = nfd;
			mark(nfd, e, true);
			__atomic_compare_exchange_n(e->where, &old, nfd, false, __ATOMIC_ACQ_REL,
						    __ATOMIC_ACQUIRE);
		} else {
			e->where = NULL;        /* nowhere to go: the program's call wins */
		}
	}
	give();
}

static int ebadf(void)
{
	errno = EBADF;
	return -1;
}

bool ag_fd_is_ours(int fd)
{
	return is_ours(fd);
}

/* Rule 4's look without its repair, in one raw system call (no errno, no C
 * library code: a window's move, ring.c): is fd still the file registered
 * as ours?  If not, the caller leaves it alone. */
bool ag_fd_still_ours(int fd)
{
	struct stat st;
	kept *e = is_ours(fd) ? entry_of(fd) : NULL;

	return e && ag_arch_syscall6(SYS_fstat, fd, (long)&st, 0, 0, 0, 0) == 0 &&
	       st.st_dev == e->dev && st.st_ino == e->ino;
}

/* ---- the interposers (hooks.c lists them for an attached agent) ---- */

/* Each also tells msgs.c which numbers no longer name their channel. */
AG_EXPORT int close(int fd)
{
	if (is_ours(fd))
		return ebadf();
	ag_msgs_forget(fd);
	return sys_close(fd);
}

static int range_part(unsigned lo, unsigned hi, int flags)
{
	if (real_close_range)
		return real_close_range(lo, hi, flags);
	return (int)syscall(SYS_close_range, lo, hi, flags);
}

AG_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	unsigned lo = first;
	int rc = 0;

	if (first > last)
		return range_part(first, last, flags);   /* its EINVAL */
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		ag_msgs_forget_range(first, last);
	/* The parts of [first, last] between the agent's numbers; the last
	 * part may reach ~0U (closefrom). */
	for (unsigned fd = first; fd <= last && fd < FD_BITS; fd++) {
		if (!is_ours((int)fd))
			continue;
		if (fd > lo && (rc = range_part(lo, fd - 1, flags)) != 0)
			return rc;
		flags &= ~(int)CLOSE_RANGE_UNSHARE;      /* unshared once is enough */
		lo = fd + 1;
	}
	if (lo == 0 || lo > last)
		return 0;
	return range_part(lo, last, flags);
}

AG_EXPORT void closefrom(int lowfd)
{
	int saved = errno;

	if (lowfd < 0)
		lowfd = 0;
	if (close_range((unsigned)lowfd, ~0U, 0) != 0) {
		/* No close_range (an old kernel): one close per open number, as
		 * the C library falls back to. */
		DIR *d = opendir("/proc/self/fd");
		struct dirent *de;

		while (d && (de = readdir(d)) != NULL) {
			int fd = atoi(de->d_name);

			if (de->d_name[0] != '.' && fd >= lowfd && fd != dirfd(d) && !is_ours(fd))
				sys_close(fd);
		}
		if (d)
			closedir(d);
	}
	errno = saved;
}

AG_EXPORT int dup(int fd)
{
	int rc;

	if (is_ours(fd))
		return ebadf();
	rc = real_dup ? real_dup(fd) : (int)syscall(SYS_dup, fd);
	ag_msgs_forget(rc);
	return rc;
}

AG_EXPORT int dup2(int fd, int fd2)
{
	int rc;

	if (is_ours(fd))
		return ebadf();
	ag_msgs_forget(fd2);
	if (!is_ours(fd2))
		return real_dup2 ? real_dup2(fd, fd2) : (int)syscall(SYS_dup2, fd, fd2);
	vacate(fd2);
	rc = real_dup2 ? real_dup2(fd, fd2) : (int)syscall(SYS_dup2, fd, fd2);
	if (rc < 0) {
		int saved = errno;

		syscall(SYS_close, fd2);        /* the agent's old copy, moved away */
		errno = saved;
	}
	return rc;
}

AG_EXPORT int dup3(int fd, int fd2, int flags)
{
	int rc;

	if (is_ours(fd))
		return ebadf();
	if (fd != fd2)
		ag_msgs_forget(fd2);
	if (!is_ours(fd2) || fd == fd2)
		return real_dup3 ? real_dup3(fd, fd2, flags) : (int)syscall(SYS_dup3, fd, fd2, flags);
	vacate(fd2);
	rc = real_dup3 ? real_dup3(fd, fd2, flags) : (int)syscall(SYS_dup3, fd, fd2, flags);
	if (rc < 0) {
		int saved = errno;

		syscall(SYS_close, fd2);
		errno = saved;
	}
	return rc;
}

/* Every fcntl argument is an int, a long or a pointer: one register. */
static int fcntl_common(fcntl_fn real, int fd, int cmd, va_list ap)
{
	void *arg = va_arg(ap, void *);
	int rc;

	if (is_ours(fd))
		return ebadf();
	rc = real ? real(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		ag_msgs_forget(rc);
	return rc;
}

AG_EXPORT int ag_fcntl(int fd, int cmd, ...)
{
	va_list ap;
	int rc;

	va_start(ap, cmd);
	rc = fcntl_common(real_fcntl, fd, cmd, ap);
	va_end(ap);
	return rc;
}

AG_EXPORT int ag_fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	int rc;

	va_start(ap, cmd);
	rc = fcntl_common(real_fcntl64 ? real_fcntl64 : real_fcntl, fd, cmd, ap);
	va_end(ap);
	return rc;
}
