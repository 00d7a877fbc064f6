/*
 * session.c — a session's directory in the daemon's state directory:
 *
 *   STATE/sessions/                 root's (the daemon's), 0711
 *   STATE/sessions/SESSION/         root's, 0711: others may only pass
 *   STATE/sessions/SESSION/PID/     one traced process's, its user's, 0700
 *   STATE/sessions/SESSION/peers    root's, 0600: the hosts this daemon
 *                                   asked to follow the session, one a line
 *
 * Everything is reached through descriptors opened O_NOFOLLOW: a user owns
 * the PID directories below, never the names the daemon itself opens.
 */
#include "spd_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int spd_session_check(const char *session, sp_err *err)
{
	size_t n = session ? strlen(session) : 0;

	if (n == 0 || n > 64 || strspn(session, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				       "0123456789._-") != n || session[0] == '.')
		return sp_fail(err, "session name '%.80s': use 1 to 64 letters, digits, '.', '_' "
			       "or '-', not starting with '.'", session ? session : "");
	return 0;
}

int spd_session_open(const spd_daemon *d, const char *session, int create, sp_err *err)
{
	int sfd, fd;

	if (spd_session_check(session, err) != 0)
		return -1;
	if ((create && mkdirat(d->state_fd, "sessions", 0711) != 0 && errno != EEXIST) ||
	    (sfd = openat(d->state_fd, "sessions", O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			  O_CLOEXEC)) < 0)
		return sp_fail(err, "%s/sessions: %s", d->state_dir,
			       errno == ENOENT ? "no session was ever traced on this host"
			       : strerror(errno));
	if (create)
		fchmod(sfd, 0711);
	if ((create && mkdirat(sfd, session, 0711) != 0 && errno != EEXIST) ||
	    (fd = openat(sfd, session, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		int e = errno;

		close(sfd);
		sp_fail(err, "%s/sessions/%s: %s", d->state_dir, session,
			       e == ENOENT ? "no trace of this session on this host" : strerror(e));
		return e == ENOENT && !create ? -2 : -1;
	}
	close(sfd);
	if (create)
		fchmod(fd, 0711);
	return fd;
}

/* The peers file's text (at most SPD_PEERS_MAX bytes), NUL-terminated, from
 * fd at its start; its length. */
static size_t read_peers(int fd, char *buf, size_t len)
{
	size_t got = 0;
	ssize_t r;

	while (got < len - 1 && (r = pread(fd, buf + got, len - 1 - got, (off_t)got)) > 0)
		got += (size_t)r;
	buf[got] = '\0';
	return got;
}

static int listed(const char *text, const char *host)
{
	size_t n = strlen(host);

	for (const char *p = text; *p; p += strcspn(p, "\n"), p += *p == '\n')
		if (strncmp(p, host, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
			return 1;
	return 0;
}

/*
 * The file is appended to by every thread that forwards an inject request
 * of the session; flock makes the check-then-append one step, so a host is
 * listed once however many requests follow the session to it at once.
 */
int spd_session_add_peer(const spd_daemon *d, const char *session, const char *host,
			 sp_err *err)
{
	char text[SPD_PEERS_MAX], line[300];
	struct stat st;
	int sfd, fd, rc = 0;

	if (spd_host_name_kind(host, err) < 0)
		return -1;
	if ((sfd = spd_session_open(d, session, 1, err)) < 0)
		return -1;
	fd = openat(sfd, "peers", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
	close(sfd);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		if (fd >= 0)
			close(fd);
		return sp_fail(err, "%s/sessions/%s/peers: not a file of the daemon's own",
			       d->state_dir, session);
	}
	flock(fd, LOCK_EX);
	if (read_peers(fd, text, sizeof text) + strlen(host) + 2 > sizeof text)
		rc = sp_fail(err, "%s/sessions/%s/peers: full (%d bytes): %s is not added",
			     d->state_dir, session, SPD_PEERS_MAX, host);
	else if (!listed(text, host)) {
		int n = snprintf(line, sizeof line, "%s\n", host);

		if (lseek(fd, 0, SEEK_END) < 0 || sp_write_all(fd, line, (size_t)n) != 0)
			rc = sp_fail(err, "%s/sessions/%s/peers: %s", d->state_dir, session,
				     strerror(errno));
	}
	flock(fd, LOCK_UN);
	close(fd);
	return rc;
}

int spd_session_peers(int sfd, char ***out, size_t *n)
{
	char text[SPD_PEERS_MAX], **v = NULL;
	size_t cap = 0;
	struct stat st;
	sp_err err;
	int fd = openat(sfd, "peers", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

	*out = NULL;
	*n = 0;
	if (fd < 0)
		return 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		close(fd);
		return 0;
	}
	read_peers(fd, text, sizeof text);
	close(fd);
	for (char *p = text, *e; *p; p = e + (*e == '\n')) {
		e = p + strcspn(p, "\n");
		char save = *e;

		*e = '\0';
		if (spd_host_name_kind(p, &err) >= 0) {
			if (sp_grow((void **)&v, &cap, *n + 1, sizeof *v) != 0 || !(v[*n] = strdup(p)))
				break;
			(*n)++;
		}
		*e = save;
	}
	*out = v;
	return 0;
}

void spd_session_peers_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

int spd_agent_tell(int dirfd, uid_t owner, const char *line)
{
	char proc[64];
	struct stat st;
	size_t n = strlen(line);
	int fd = openat(dirfd, "control", O_PATH | O_NOFOLLOW | O_CLOEXEC), wfd = -1, rc = -1, e;

	if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_uid != owner))
		errno = EPERM;
	else if (fd >= 0) {
		snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
		wfd = open(proc, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	}
	if (wfd >= 0 && write(wfd, line, n) == (ssize_t)n)
		rc = 0;
	e = errno;
	if (wfd >= 0)
		close(wfd);
	if (fd >= 0)
		close(fd);
	errno = e;
	return rc;
}
