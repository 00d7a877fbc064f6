/*
 * pipes.c — a writer and readers of one pipe, for the propagation
 * tests of pipes (tests/e2e/test_propagate.py: pipe-backlog, pipe-readers,
 * pipe-writers, pipe-fifo-writers, pipe-users-writers, pipe-users-readers) and
 * of a connected UNIX stream socket (unix-writers, unix-readers,
 * unix-users-readers, unix-forked-writers, unix-early-writers: PIPE the
 * number of an inherited socket, each end's).
 *
 *   pipes reader PIPE K     (PIPE: a path, or the number of an inherited
 *                            descriptor: a pipe's or a socket's)
 *       opens PIPE for reading, forks K - 1 more readers sharing that end
 *       (pre-forked workers, reading at once), prints "ready" and waits for
 *       a line on its standard input before it reads too; each reader
 *       reads the pipe, at most 64 bytes a read, until its end, and prints
 *       "got PID HEX" for every read (with K > 1, then sleeps 0.1 s: the
 *       readers take turns).
 *   pipes writer PIPE MSG...
 *       opens PIPE for writing and writes each MSG in one write, printing
 *       "wrote N" after each, and waits until the readers took it all
 *       (FIONREAD is 0; a socket's SIOCOUTQ), and 50 ms more, before the
 *       next one: each read takes one message
 *       -- the first read also what was queued before the writer came.
 *   pipes usersreader PIPE UID...
 *       `reader PIPE K`, K the number of UIDs, reader j as user and group
 *       UID j (no other groups; the first one the parent): it becomes the
 *       user first, without an exec, and stays dumpable (its injector and
 *       /proc see it as the user's); "ready" once every one of them did.
 *   pipes writers PIPE K MSG...
 *       opens PIPE and forks K writers one after the other (pre-forked
 *       workers sharing the descriptor), writer j writing MSG j, j + K, ...
 *       as `writer` does.
 *   pipes leadwriters PIPE K MSG...
 *       `writers` after the parent wrote the first MSG itself (its first
 *       write, before any fork), the children the others.
 *   pipes earlywriters PIPE MSG...
 *       forks a child first, then writes the first MSG itself (as
 *       `writer`), and only then lets the child write the others (a
 *       signal): a writer forked before its parent's first write.
 *   pipes stepwriter PIPE MSG...
 *       `writer`, each MSG only after a line on its standard input (the
 *       test says whose turn it is), printing "wrote PID N" once the
 *       readers took it (stops at the input's end).
 *   pipes userwriter UID PIPE MSG...
 *       `stepwriter` as user and group UID (no other groups), which it
 *       becomes first, without an exec: its agent's trace stays where it
 *       was (pipe-users-writers).
 */
#include <ctype.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <grp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* PIPE: an inherited descriptor's number, or a path opened with flags. */
static int pipe_fd(const char *arg, int flags)
{
	return isdigit((unsigned char)arg[0]) ? atoi(arg) : open(arg, flags);
}

/* This process as user and group u, dumpable; 0, or -1 (said). */
static int become(uid_t u)
{
	if (setgroups(0, NULL) != 0 || setgid(u) != 0 || setuid(u) != 0 ||
	    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
		perror("pipes: becoming the user");
		return -1;
	}
	return 0;
}

/* k readers; with uids, reader j becomes uids[j] (0: the parent). */
static int reader(const char *path, int k, char **uids)
{
	int fd = pipe_fd(path, O_RDONLY | O_NONBLOCK), done[2];
	char line[16], buf[64];
	ssize_t n;

	if (fd < 0 || fcntl(fd, F_SETFL, 0) != 0 || pipe(done) != 0) {
		perror("pipes: open");
		return 1;
	}
	fflush(stdout);
	for (int i = 1; i < k; i++)
		if (fork() == 0) {
			close(done[0]);
			if (uids && become((uid_t)atoi(uids[i])) != 0)
				_exit(1);
			close(done[1]);         /* the parent's read ends when all did */
			goto read;              /* a worker reads at once */
		}
	close(done[1]);
	while (read(done[0], buf, 1) > 0)
		;
	close(done[0]);
	if (uids && become((uid_t)atoi(uids[0])) != 0)
		return 1;
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
read:
	while ((n = read(fd, buf, sizeof buf)) > 0) {
		printf("got %d ", (int)getpid());
		for (ssize_t i = 0; i < n; i++)
			printf("%02x", (unsigned char)buf[i]);
		printf("\n");
		fflush(stdout);
		if (k > 1)
			usleep(100000);     /* the next message is another reader's */
	}
	while (wait(NULL) > 0)
		;
	return 0;
}

/* Write msgs[0], msgs[step], ... of n into fd, each taken before the next
 * (turns: each after a line on stdin). */
static int write_msgs(int fd, int n, char **msgs, int step, bool turns)
{
	char line[16];
	struct stat st;
	int q;
	/* what its readers have not taken yet: a pipe's queue, a socket's
	 * bytes its peer has not read */
	unsigned long queued = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? SIOCOUTQ : FIONREAD;

	for (int i = 0; i < n; i += step) {
		size_t len = strlen(msgs[i]);

		if (turns && !fgets(line, sizeof line, stdin))
			return 0;
		if (write(fd, msgs[i], len) != (ssize_t)len) {
			perror("pipes: write");
			return 1;
		}
		if (!turns)
			printf("wrote %d\n", i + 1);
		fflush(stdout);
		for (int t = 0; t < 60000 && ioctl(fd, queued, &q) == 0 && q > 0; t++)
			usleep(1000);
		/* The reader that took it counts it before the next message can
		 * reach another reader: two readers' reads racing between one's
		 * return and the other's count name each other's bytes (a limit
		 * agent/propagate.c, point 6, states), seen once under load. */
		if (i + step < n)
			usleep(50000);
		if (turns) {                    /* the reader took it: the next turn */
			printf("wrote %d %d\n", (int)getpid(), i + 1);
			fflush(stdout);
		}
	}
	return 0;
}

static int writer(const char *path, int n, char **msgs, bool turns)
{
	int fd = pipe_fd(path, O_WRONLY), rc;

	if (fd < 0) {
		perror("pipes: open");
		return 1;
	}
	rc = write_msgs(fd, n, msgs, 1, turns);
	close(fd);
	return rc;
}

static int writers(const char *path, int k, int n, char **msgs, bool lead)
{
	int fd = pipe_fd(path, O_WRONLY), st, rc = 0;

	if (fd < 0 || k < 1) {
		perror("pipes: open");
		return 1;
	}
	if (lead && (rc = write_msgs(fd, 1, msgs, 1, false)) == 0)
		n--, msgs++;
	if (rc)
		return rc;
	for (int j = 0; j < k && j < n; j++) {
		fflush(stdout);
		pid_t p = fork();

		if (p == 0)
			_exit(write_msgs(fd, n - j, msgs + j, k, false));
		if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st))
			rc = 1;
	}
	close(fd);
	return rc;
}

/* earlywriters: the child waits for SIGUSR1 (blocked before the fork),
 * which the parent sends once its own first message was taken. */
static int early_writers(const char *path, int n, char **msgs)
{
	int fd = pipe_fd(path, O_WRONLY), st, sig, rc;
	sigset_t usr1;

	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (fd < 0 || sigprocmask(SIG_BLOCK, &usr1, NULL) != 0) {
		perror("pipes: open");
		return 1;
	}
	fflush(stdout);
	pid_t p = fork();

	if (p == 0)
		_exit(sigwait(&usr1, &sig) != 0 || write_msgs(fd, n - 1, msgs + 1, 1, false));
	if (p < 0)
		return 1;
	rc = write_msgs(fd, 1, msgs, 1, false);
	kill(p, SIGUSR1);
	if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st))
		rc = 1;
	close(fd);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "reader") == 0)
		return reader(argv[2], atoi(argv[3]), NULL);
	if (argc >= 4 && strcmp(argv[1], "usersreader") == 0)
		return reader(argv[2], argc - 3, argv + 3);
	if (argc >= 4 && strcmp(argv[1], "writer") == 0)
		return writer(argv[2], argc - 3, argv + 3, false);
	if (argc >= 4 && strcmp(argv[1], "stepwriter") == 0)
		return writer(argv[2], argc - 3, argv + 3, true);
	if (argc >= 5 && strcmp(argv[1], "userwriter") == 0) {
		uid_t u = (uid_t)atoi(argv[2]);

		if (setgroups(0, NULL) != 0 || setgid(u) != 0 || setuid(u) != 0) {
			perror("pipes: becoming the user");
			return 1;
		}
		return writer(argv[3], argc - 4, argv + 4, true);
	}
	if (argc >= 5 && strcmp(argv[1], "earlywriters") == 0)
		return early_writers(argv[2], argc - 3, argv + 3);
	if (argc >= 5 && strcmp(argv[1], "writers") == 0)
		return writers(argv[2], atoi(argv[3]), argc - 4, argv + 4, false);
	if (argc >= 6 && strcmp(argv[1], "leadwriters") == 0)
		return writers(argv[2], atoi(argv[3]), argc - 4, argv + 4, true);
	fprintf(stderr, "usage: pipes reader PIPE K | usersreader PIPE UID... | writer PIPE MSG... | "
		"writers PIPE K MSG... | stepwriter PIPE MSG... | userwriter UID PIPE MSG... | "
		"leadwriters PIPE K MSG... | earlywriters PIPE MSG...\n");
	return 2;
}
