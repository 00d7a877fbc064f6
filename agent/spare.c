/*
 * spare.c — the trace's files, directories and FIFOs taken ready-made from
 * `sptrace run`'s stock instead of created on the program's time.
 *
 * Creating an inode is the dearest system call of a new traced process's
 * start: on an ext4 file system without a journal, 175 us for a file and
 * 390 us for a directory or a FIFO (the inode allocator skips each recently
 * deleted inode one buffer lookup at a time), where renaming an existing
 * file into another directory costs 12 us.  A forked and exec'd process
 * makes about eight: its directory exec.PID.N, agent.log, sites, channels,
 * ring.TID, meta, the control FIFO (and a forked child's ring before its
 * exec).  `sptrace run` lives for the whole run and makes them ahead, in a
 * thread of its own (cli/spare.c); the agent renames one into place.
 *
 * The protocol:
 *  1. `sptrace run` makes DIR/.spare (TRACE_SPARE_DIR), owned by the user it
 *     runs as, 0700 (02750 in a --group trace: the mode and group the trace
 *     directory hands down), and fills fixed slots in it: spare.f.N (an
 *     empty regular file, 0600), spare.d.N (an empty directory, 0700),
 *     spare.p.N (a FIFO, 0600), N below the kind's count (trace_format.h).
 *     It fills them once the program's own agent has started (that first
 *     process makes its own files) and names the directory in
 *     SPTRACE_SPARE, which the agent takes out of the program's environment
 *     at start like every SPTRACE_ variable and puts back into an exec'd
 *     image's (exec.c).  Attached agents and
 *     spdaemon's get none: they create as before.
 *  2. The agent checks the directory once, at start, before its first file:
 *     a directory and not a link (O_NOFOLLOW | O_DIRECTORY), its euid's,
 *     writable by no one else (sp_fd_private): only its own user could put
 *     anything there.  It keeps that descriptor (high, fds.c) and takes
 *     every slot through it, so no path is followed again.  Else it says so
 *     in agent.log and takes nothing.
 *  3. To make PATH, the agent renames a slot onto it with renameat2's
 *     RENAME_NOREPLACE.  The rename is atomic: of the processes racing for
 *     one slot one gets it, the others ENOENT and try the next slot; a PATH
 *     that exists gives EEXIST, leaves the slot in place, and the caller
 *     opens PATH as before.  The slots tried start at a place given by the
 *     pid and go round from there, at most SPARE_TRIES of them: no readdir,
 *     and processes started together start at different slots.
 *  4. The caller then opens or uses PATH as it did, without creating it, and
 *     asks ag_spare_check whether it is what a spare is: of the kind asked,
 *     its euid's, empty (a file of one link and no byte, a FIFO of one link,
 *     a directory without subdirectories).  One that is not is removed,
 *     said once in agent.log, no spare is taken from then on, and PATH is
 *     created as without a stock.
 *  5. The euid is compared with the directory's owner at every take: a
 *     program that changed its user (setpriv) creates its files itself, as
 *     before (their owner is the user it now is).
 *  6. `sptrace run`'s thread sees a slot renamed away (it looks) and makes it
 *     again; at the end of the run it removes the stock.  A stock left by a
 *     killed run is harmless: readers look only at the names of a trace's
 *     files (ring.*, exec.*, ...), and sptrace's removal of an old trace
 *     (cli/trace_dir.c) knows the stock's names.
 *
 * The end of each trace's agent.log says how many were taken and how many
 * made here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "sp.h"

#define SPARE_TRIES 4

static char spare_dir[4096];           /* SPTRACE_SPARE as given ("" : none) */
/* The directory checked at point 2, kept open (high, fds.c; not reopened by
 * path if the program closes it: a reopened one would not be checked). */
static volatile int spare_fd = -1;
static volatile int usable;            /* point 2 passed, and nothing wrong since */
static uid_t spare_uid;
static char refused[4400];             /* why not (point 2), logged once the log is open */
static unsigned taken, made;
static unsigned next_slot[3];
static pid_t next_pid;                 /* whose next_slot (a forked child starts anew) */

static const struct {
	char letter;
	unsigned count;
	const char *what;
} kinds[3] = {
	[AG_SPARE_FILE] = { 'f', TRACE_SPARE_FILES, "an empty file of this user's (removed)" },
	[AG_SPARE_DIR] = { 'd', TRACE_SPARE_DIRS, "an empty directory of this user's (removed)" },
	[AG_SPARE_FIFO] = { 'p', TRACE_SPARE_FIFOS, "a FIFO of this user's (removed)" },
};

void ag_spare_init(const char *dir)
{
	struct stat st;
	int fd;

	if (!dir || !*dir || strlen(dir) >= sizeof spare_dir - 64)
		return;
	snprintf(spare_dir, sizeof spare_dir, "%s", dir);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0 && sp_fd_private(fd, &st)) {
		spare_uid = st.st_uid;
		spare_fd = fd;
		ag_fd_keep(&spare_fd, NULL, 0);
		usable = 1;
		return;
	}
	snprintf(refused, sizeof refused, "spares: %s ignored: %s; this process creates its "
		 "files itself", dir, fd < 0 ? "not a directory (or a link)" :
		 st.st_uid != geteuid() ? "another user's" : "others may write into it");
	if (fd >= 0)
		close(fd);
}

void ag_spare_log_start(void)
{
	if (refused[0])
		ag_log("%s", refused);
}

const char *ag_spare_dir(void)
{
	return spare_dir[0] ? spare_dir : NULL;
}

/* No spare from now on, said once (kept for ag_spare_log_start too: the
 * first file taken is agent.log itself). */
static void give_up(const char *path, const char *why, const char *detail)
{
	if (!__atomic_exchange_n(&usable, 0, __ATOMIC_ACQ_REL))
		return;
	snprintf(refused, sizeof refused, "spares: %s: %s%s; this process creates its files "
		 "itself", path, why, detail);
	ag_log("%s", refused);
}

int ag_spare_take(int kind, const char *path)
{
	char slot[32];
	pid_t pid;
	unsigned at;
	int dfd;

	if (!__atomic_load_n(&usable, __ATOMIC_ACQUIRE) || geteuid() != spare_uid ||
	    (dfd = ag_fd_checked(&spare_fd)) < 0)
		return -1;
	pid = getpid();
	if (__atomic_load_n(&next_pid, __ATOMIC_RELAXED) != pid) {
		/* This process's first take: start where the pid says. */
		for (int k = 0; k < 3; k++)
			__atomic_store_n(&next_slot[k], (unsigned)pid * 7u, __ATOMIC_RELAXED);
		__atomic_store_n(&next_pid, pid, __ATOMIC_RELAXED);
	}
	for (int i = 0; i < SPARE_TRIES; i++) {
		at = __atomic_fetch_add(&next_slot[kind], 1, __ATOMIC_RELAXED) % kinds[kind].count;
		snprintf(slot, sizeof slot, "%s%c.%u", TRACE_SPARE_PREFIX, kinds[kind].letter, at);
		if (renameat2(dfd, slot, AT_FDCWD, path, RENAME_NOREPLACE) == 0) {
			__atomic_add_fetch(&taken, 1, __ATOMIC_RELAXED);
			return 1;
		}
		if (errno == EEXIST)
			return 0;
		if (errno != ENOENT) {
			give_up(slot, "cannot rename it into place: ", strerror(errno));
			return -1;
		}
	}
	return -1;          /* taken by others, not made again yet */
}

bool ag_spare_check(int kind, const struct stat *st, const char *path)
{
	bool ok = st && st->st_uid == geteuid();

	if (ok && kind == AG_SPARE_FILE)
		ok = S_ISREG(st->st_mode) && st->st_nlink == 1 && st->st_size == 0;
	else if (ok && kind == AG_SPARE_DIR)
		ok = S_ISDIR(st->st_mode) && st->st_nlink == 2;
	else if (ok)
		ok = S_ISFIFO(st->st_mode) && st->st_nlink == 1;
	if (ok)
		return true;
	__atomic_sub_fetch(&taken, 1, __ATOMIC_RELAXED);
	/* (A directory with files in it stays: the caller's mkdir then finds
	 * it, and the trace directory's own checks apply.) */
	if (kind == AG_SPARE_DIR ? rmdir(path) : unlink(path))
		ag_log("spares: %s: cannot remove: %s", path, strerror(errno));
	give_up(path, "the spare taken for it was not ", kinds[kind].what);
	return false;
}

int ag_spare_take_node(int kind, const char *path)
{
	struct stat st;
	int took = ag_spare_take(kind, path);

	if (took > 0 && (lstat(path, &st) != 0 || !ag_spare_check(kind, &st, path)))
		return -1;
	return took;
}

void ag_spare_made(void)
{
	__atomic_add_fetch(&made, 1, __ATOMIC_RELAXED);
}

void ag_spare_log_end(void)
{
	ag_log("end: %u files, directories and FIFOs taken from sptrace run's spares, %u "
	       "created here%s", __atomic_load_n(&taken, __ATOMIC_RELAXED),
	       __atomic_load_n(&made, __ATOMIC_RELAXED),
	       !spare_dir[0] ? " (no spares: not started by sptrace run)" :
	       usable ? "" : " (spares not used: see above)");
}
