/*
 * registry.h — how `sptrace stop` finds the agent of a running process: a
 * link <registry dir>/<pid>-<start time> to the process's trace directory.
 * The start time (clock ticks since boot, /proc/PID/stat field 22) makes the
 * name unique even when the pid is reused after a process was killed and
 * could not remove its link.  Used by the agent (agent/control.c) and the CLI
 * (cli/cmd_control.c); libc only, no allocation.  A process of another user
 * (an attached nginx worker runs as nobody) registers in its own user's dir,
 * where root's sptrace looks too.
 *
 * The registry of user U is $XDG_RUNTIME_DIR/sptrace (an absolute
 * XDG_RUNTIME_DIR), else /tmp/sptrace-U.  Root's sptrace writes commands
 * through it, so whoever can write a registry could aim root's writes; the
 * rules (the checks are sp_registry_open's, shared by both sides):
 *
 *  1. Only U and root may write U's registry: the dir, and XDG_RUNTIME_DIR
 *     above it, must be directories (not links) owned by U or root and
 *     writable by their owner only.  /tmp/sptrace-U may have been made by
 *     anyone before U's first use: its owner and mode are checked on every
 *     use, never trusted from its name.
 *  2. The agent registers only in a dir that passes rule 1 (else it says so
 *     in agent.log and traces on, unregistered), through a descriptor of
 *     that dir (symlinkat, unlinkat): a path swapped after the check leads
 *     nowhere.
 *  3. The CLI reads links only in dirs that pass rule 1, for U = the caller
 *     or the traced process's real uid, and refuses any other, naming it.
 *  4. Even then the link's target is the traced user's to choose: before
 *     writing a command the CLI opens DIR/control without following a link
 *     and without opening it for writing (O_PATH), and writes only if it is
 *     a FIFO owned by the traced process's user, or by the registry's owner
 *     who made the link (root, for a daemon root started that dropped its
 *     privileges since); cli/cmd_control.c.  The trace files there are read
 *     only after that, and never through a link.
 */
#ifndef SP_REGISTRY_H
#define SP_REGISTRY_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* /proc/PID/NAME ("self" for the caller) into buf, NUL-terminated; the
 * bytes read, or -1. */
static inline ssize_t sp_read_proc(const char *pid, const char *name, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%s/%s", pid, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

/* The real, effective, saved and file-system uids of process `pid`
 * (/proc/PID/status): 0, or -1 if it cannot be read. */
static inline int sp_proc_uids(const char *pid, unsigned uids[4])
{
	char buf[4096];
	const char *u;

	if (sp_read_proc(pid, "status", buf, sizeof buf) <= 0 || !(u = strstr(buf, "\nUid:")))
		return -1;
	return sscanf(u + 5, "%u %u %u %u", &uids[0], &uids[1], &uids[2], &uids[3]) == 4 ? 0 : -1;
}

/* The XDG_RUNTIME_DIR of process `pid`'s environment into out ("" if it has
 * none, or its environment cannot be read). */
static inline void sp_proc_xdg(const char *pid, char *out, size_t len)
{
	char buf[65536];
	ssize_t n = sp_read_proc(pid, "environ", buf, sizeof buf);

	out[0] = '\0';
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
		if (strncmp(buf + i, "XDG_RUNTIME_DIR=", 16) == 0)
			snprintf(out, len, "%s", buf + i + 16);
}

/* The start time of process `pid` ("self" for the caller); 0 if none. */
static inline unsigned long long sp_proc_start_time(const char *pid)
{
	char buf[1024], *p;

	if (sp_read_proc(pid, "stat", buf, sizeof buf) <= 0)
		return 0;
	p = strrchr(buf, ')');          /* the command name may hold spaces */
	for (int field = 2; p && field < 22; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Rule 1 for `name` opened at `at`: its descriptor (O_DIRECTORY, never
 * through a link), or -1 with why filled (path: the name for messages). */
static inline int sp_registry_dir_checked(int at, const char *name, const char *path,
					  unsigned uid, char *why, size_t len)
{
	struct stat st;
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		int e = errno;

		snprintf(why, len, "%s: %s", path,
			 e == ELOOP || e == ENOTDIR ? "not a directory (a symbolic link or a file): "
			 "refused, another user may have planted it; remove it" : strerror(e));
		errno = e;
		return -1;
	}
	if (fstat(fd, &st) == 0 && (st.st_uid == uid || st.st_uid == 0) &&
	    !(st.st_mode & (S_IWGRP | S_IWOTH)))
		return fd;
	snprintf(why, len, "%s is owned by uid %u with mode %04o: refused, only uid %u or root "
		 "may own it and only its owner write it (another user could plant entries there); "
		 "remove it, sptrace makes it anew", path, (unsigned)st.st_uid,
		 (unsigned)(st.st_mode & 07777), uid);
	close(fd);
	errno = EPERM;
	return -1;
}

/* The registry dir of user `uid` whose XDG_RUNTIME_DIR is `xdg` (NULL or
 * "" if none; a relative one is ignored, as the XDG spec says), made first
 * (mode 0700) if `create`: its descriptor, checked by rule 1, and its path
 * in `path`; or -1 with why filled (errno ENOENT: it does not exist). */
static inline int sp_registry_open(const char *xdg, unsigned uid, int create, char *path,
				   size_t plen, char *why, size_t wlen)
{
	char name[32];
	int base, fd;

	if (xdg && xdg[0] == '/') {
		snprintf(path, plen, "%s/sptrace", xdg);
		snprintf(name, sizeof name, "sptrace");
		base = sp_registry_dir_checked(AT_FDCWD, xdg, xdg, uid, why, wlen);
	} else {
		snprintf(path, plen, "/tmp/sptrace-%u", uid);
		snprintf(name, sizeof name, "sptrace-%u", uid);
		base = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (base < 0)
			snprintf(why, wlen, "/tmp: %s", strerror(errno));
	}
	if (base < 0)
		return -1;
	if (create)
		mkdirat(base, name, 0700);
	fd = sp_registry_dir_checked(base, name, path, uid, why, wlen);
	int e = errno;

	close(base);
	errno = e;
	return fd;
}

#endif
