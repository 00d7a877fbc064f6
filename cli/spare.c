/*
 * spare.c — `sptrace run`'s stock of ready-made files, directories and FIFOs
 * that its agents rename into place instead of creating their own: a new
 * traced process then spends no time in the file system's inode allocator
 * (agent/spare.c explains the protocol; this file is its points 1 and 6).
 *
 * DIR/.spare holds the slots (TRACE_SPARE_PREFIX f.N, d.N, p.N).  A thread
 * of sptrace run makes each slot in DIR/.spare/spare.new and renames it into
 * .spare: the slow creation locks spare.new, not .spare, so an agent taking
 * a slot from .spare meanwhile waits only for a rename.  The thread watches
 * .spare and makes again each slot an agent took.  It never allocates (the
 * run forks the program while it runs) and blocks every signal.
 *
 * It starts once the program has started a second traced process
 * (program_forked), then looks by fstatat, slot by slot, every 2 ms while agents take slots,
 * twice as long after each look that found nothing taken, up to 128 ms: a
 * burst of new processes finds the stock full, and an idle program costs a
 * look of 24 names 8 times a second.  (Not inotify: closing an inotify
 * instance waits for an SRCU grace period, 8 ms at the end of every run.)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli.h"
#include "trace_format.h"

#define STAGING TRACE_SPARE_PREFIX "new"

struct cli_spares {
	int dir_fd;               /* DIR */
	int spare_fd;             /* DIR/.spare */
	int new_fd;               /* DIR/.spare/spare.new */
	int stop_fd;              /* eventfd: the run is over */
	volatile int stopping;    /* ... and the fill stops at the next slot */
	pthread_t thread;
	char path[PATH_MAX];      /* DIR/.spare, for SPTRACE_SPARE */
};

static const struct {
	char letter;
	unsigned count;
} kinds[] = {
	{ 'f', TRACE_SPARE_FILES },
	{ 'd', TRACE_SPARE_DIRS },
	{ 'p', TRACE_SPARE_FIFOS },
};

#define NKINDS (sizeof kinds / sizeof kinds[0])

static void slot_name(char *out, size_t len, size_t kind, unsigned i)
{
	snprintf(out, len, "%s%c.%u", TRACE_SPARE_PREFIX, kinds[kind].letter, i);
}

/* Make one slot (if it is not there): in spare.new, then renamed into .spare. */
static void make_slot(cli_spares *s, size_t kind, const char *name)
{
	int rc = -1, fd;

	if (kinds[kind].letter == 'f') {
		fd = openat(s->new_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    0600);
		if (fd >= 0) {
			close(fd);
			rc = 0;
		}
	} else if (kinds[kind].letter == 'd') {
		rc = mkdirat(s->new_fd, name, 0700);
	} else {
		rc = mknodat(s->new_fd, name, S_IFIFO | 0600, 0);
	}
	if (rc != 0 && errno != EEXIST)
		return;
	if (renameat2(s->new_fd, name, s->spare_fd, name, RENAME_NOREPLACE) != 0)
		unlinkat(s->new_fd, name, kinds[kind].letter == 'd' ? AT_REMOVEDIR : 0);
}

/* Every slot not there; how many were made. */
static unsigned fill(cli_spares *s)
{
	char name[64];
	struct stat st;
	unsigned made = 0;

	for (unsigned i = 0; i < TRACE_SPARE_FILES; i++) {
		for (size_t kind = 0; kind < NKINDS; kind++) {
			if (i >= kinds[kind].count || __atomic_load_n(&s->stopping, __ATOMIC_RELAXED))
				continue;
			slot_name(name, sizeof name, kind, i);
			if (fstatat(s->spare_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
				make_slot(s, kind, name);
				made++;
			}
		}
	}
	return made;
}

#define LOOK_MIN_MS 2
#define LOOK_MAX_MS 128

/* Has the program started a second traced process: a forked child's ring
 * (ring.TID beside the first) or an exec'd image's directory (exec.*)?  A
 * program that never forks never pays for a stock (its making took the CPU
 * from the program, and its removal leaves deleted inodes, which make the
 * next creations dearer); the first processes make their own files, as
 * before, and the stock serves those started after.  Read with getdents64
 * into a buffer on the stack: nothing allocated. */
static bool program_forked(cli_spares *s)
{
	char buf[4096];
	int rings = 0;
	long n;

	if (lseek(s->dir_fd, 0, SEEK_SET) != 0)
		return false;
	while ((n = syscall(SYS_getdents64, s->dir_fd, buf, sizeof buf)) > 0)
		for (long off = 0; off < n;) {
			const struct dirent64 *d = (const struct dirent64 *)(buf + off);

			if (strncmp(d->d_name, "exec.", 5) == 0 ||
			    (strncmp(d->d_name, "ring.", 5) == 0 && ++rings > 1))
				return true;
			off += d->d_reclen;
		}
	return false;
}

static void *refill_main(void *arg)
{
	cli_spares *s = arg;
	int wait_ms = LOOK_MIN_MS;

	/* At the run's own priority: at nice 19 on a busy machine, the end
	 * of the run waited for this thread to be given the CPU again (its
	 * renames also hold the file system's rename lock, which an agent's
	 * take waits for). */
	while (!program_forked(s)) {
		struct pollfd p = { .fd = s->stop_fd, .events = POLLIN };

		if (poll(&p, 1, wait_ms) != 0)
			return NULL;    /* the run is over (or poll failed) */
		wait_ms = wait_ms * 2 > LOOK_MAX_MS ? LOOK_MAX_MS : wait_ms * 2;
	}
	wait_ms = LOOK_MIN_MS;
	if (__atomic_load_n(&s->stopping, __ATOMIC_RELAXED))
		return NULL;    /* the run ended before this thread ran */
	fill(s);
	for (;;) {
		struct pollfd p = { .fd = s->stop_fd, .events = POLLIN };
		int r = poll(&p, 1, wait_ms);

		if (r > 0 || (r < 0 && errno != EINTR))
			break;
		wait_ms = fill(s) ? LOOK_MIN_MS : wait_ms * 2 > LOOK_MAX_MS ? LOOK_MAX_MS :
			  wait_ms * 2;
	}
	return NULL;
}

static void close_all(cli_spares *s)
{
	int *fds[] = { &s->dir_fd, &s->spare_fd, &s->new_fd, &s->stop_fd };

	for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
		if (*fds[i] >= 0)
			close(*fds[i]);
	free(s);
}

/* Empty the stock and remove it (only the names a stock holds). */
static void remove_stock(cli_spares *s)
{
	char name[64];

	for (int pass = 0; pass < 2; pass++) {
		int fd = pass ? s->new_fd : s->spare_fd;

		for (size_t kind = 0; kind < NKINDS; kind++)
			for (unsigned i = 0; i < kinds[kind].count; i++) {
				slot_name(name, sizeof name, kind, i);
				unlinkat(fd, name, kinds[kind].letter == 'd' ? AT_REMOVEDIR : 0);
			}
	}
	unlinkat(s->spare_fd, STAGING, AT_REMOVEDIR);
	if (unlinkat(s->dir_fd, TRACE_SPARE_DIR, AT_REMOVEDIR) != 0)
		fprintf(stderr, "sptrace: run: cannot remove %s: %s (it holds no records: remove "
			"it yourself)\n", s->path, strerror(errno));
}

cli_spares *cli_spares_start(const char *absdir)
{
	cli_spares *s = calloc(1, sizeof *s);
	struct stat st;
	sigset_t all, old;
	mode_t mode;

	if (!s)
		return NULL;
	s->spare_fd = s->new_fd = s->stop_fd = -1;
	s->dir_fd = open(absdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s->dir_fd < 0 || fstat(s->dir_fd, &st) != 0 ||
	    (size_t)snprintf(s->path, sizeof s->path, "%s/%s", absdir, TRACE_SPARE_DIR) >=
		    sizeof s->path - 64) {
		close_all(s);
		return NULL;
	}
	/* The trace directory's mode: 0700, or 02750 shared with a group. */
	mode = (st.st_mode & S_ISGID) && (st.st_mode & S_IRGRP) ? 02750 : 0700;
	if (mkdirat(s->dir_fd, TRACE_SPARE_DIR, 0700) != 0 ||
	    (s->spare_fd = openat(s->dir_fd, TRACE_SPARE_DIR,
				  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    fstat(s->spare_fd, &st) != 0 || st.st_uid != geteuid() || fchmod(s->spare_fd, mode) ||
	    mkdirat(s->spare_fd, STAGING, 0700) != 0 ||
	    (s->new_fd = openat(s->spare_fd, STAGING,
				O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    (s->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0) {
		if (s->spare_fd >= 0)
			remove_stock(s);
		close_all(s);
		return NULL;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&s->thread, NULL, refill_main, s) != 0) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		remove_stock(s);
		close_all(s);
		return NULL;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return s;
}

const char *cli_spares_path(const cli_spares *s)
{
	return s ? s->path : NULL;
}

void cli_spares_end(cli_spares *s)
{
	uint64_t one = 1;

	if (!s)
		return;
	/* A program that ended at once (no fork) does not wait for the whole
	 * stock to be made. */
	__atomic_store_n(&s->stopping, 1, __ATOMIC_RELAXED);
	if (write(s->stop_fd, &one, sizeof one) != sizeof one)
		pthread_cancel(s->thread);
	pthread_join(s->thread, NULL);
	remove_stock(s);
	close_all(s);
}
