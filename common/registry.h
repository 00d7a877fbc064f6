/*
 * registry.h — how `sptrace stop` finds the agent of a running process: a
 * link <registry dir>/<pid>-<start time> to the process's trace directory.
 * The start time (clock ticks since boot, /proc/PID/stat field 22) makes the
 * name unique even when the pid is reused after a process was killed and
 * could not remove its link.  Used by the agent (agent/control.c) and the CLI
 * (cli/cmd_control.c); libc only, no allocation.  A process of another user
 * (an attached nginx worker runs as nobody) registers in its own user's dir,
 * where root's sptrace looks too (sp_registry_dir_of).
 */
#ifndef SP_REGISTRY_H
#define SP_REGISTRY_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* $XDG_RUNTIME_DIR/sptrace, else /tmp/sptrace-<uid>. */
static inline void sp_registry_dir(char *out, size_t len)
{
	const char *run = getenv("XDG_RUNTIME_DIR");

	if (run && *run)
		snprintf(out, len, "%s/sptrace", run);
	else
		snprintf(out, len, "/tmp/sptrace-%u", (unsigned)getuid());
}

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

/* The registry dir of process `pid` as its agent computes it: from its
 * environment (XDG_RUNTIME_DIR) and its real uid.  0, or -1 if /proc/PID
 * cannot be read. */
static inline int sp_registry_dir_of(const char *pid, char *out, size_t len)
{
	char buf[65536];
	const char *u;
	unsigned uid;
	ssize_t n;

	if (sp_read_proc(pid, "status", buf, sizeof buf) <= 0 || !(u = strstr(buf, "\nUid:")) ||
	    sscanf(u + 5, "%u", &uid) != 1)
		return -1;
	snprintf(out, len, "/tmp/sptrace-%u", uid);
	n = sp_read_proc(pid, "environ", buf, sizeof buf);
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
		if (strncmp(buf + i, "XDG_RUNTIME_DIR=", 16) == 0 && buf[i + 16])
			snprintf(out, len, "%s/sptrace", buf + i + 16);
	return 0;
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

#endif
