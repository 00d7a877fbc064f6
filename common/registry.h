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

/* The registry dir of process `pid` as its agent computes it: from its
 * environment (XDG_RUNTIME_DIR) and its real uid.  0, or -1 if /proc/PID
 * cannot be read. */
static inline int sp_registry_dir_of(const char *pid, char *out, size_t len)
{
	char path[64], buf[65536], line[256];
	unsigned uid = 0;
	ssize_t n;
	int fd, found = 0;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%s/status", pid);
	if (!(f = fopen(path, "re")))
		return -1;
	while (!found && fgets(line, sizeof line, f))
		found = sscanf(line, "Uid: %u", &uid) == 1;
	fclose(f);
	if (!found)
		return -1;
	snprintf(out, len, "/tmp/sptrace-%u", uid);
	snprintf(path, sizeof path, "/proc/%s/environ", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t)strlen(buf + i) + 1) {
		buf[n] = '\0';
		if (strncmp(buf + i, "XDG_RUNTIME_DIR=", 16) == 0 && buf[i + 16])
			snprintf(out, len, "%s/sptrace", buf + i + 16);
	}
	return 0;
}

/* The start time of process `pid` ("self" for the caller); 0 if none. */
static inline unsigned long long sp_proc_start_time(const char *pid)
{
	char path[64], buf[1024], *p;
	unsigned long long v = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%s/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')');          /* the command name may hold spaces */
	for (int field = 2; p && field < 22; field++)
		p = strchr(p + 1, ' ');
	if (p)
		v = strtoull(p + 1, NULL, 10);
	return v;
}

#endif
