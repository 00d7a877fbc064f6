/*
 * test_holders.c — spd_channel_inodes and spd_holders (spdaemon/holders.c)
 * on real sockets of this process and its children:
 *
 *   1. a TCP listener shared by three pre-forked workers, a connection not
 *      accepted yet: every worker and the parent hold its receiving end;
 *   2. once one worker accepted it: that worker alone;
 *   3. the other direction of that connection: the client (this process);
 *   4. a dual-stack IPv6 listener reached from IPv4;
 *   5. UDP: an unconnected socket bound to the wildcard, then a connected
 *      one on the same port preferred for its peer;
 *   6. a pipe: the inode held by the parent and a child;
 *   7. an address nothing listens on: no inode.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spd.h"

static int failures;

#define CHECK(cond, ...)                                                                     \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                 \
			fprintf(stderr, __VA_ARGS__);                                        \
			fputc('\n', stderr);                                                 \
			failures++;                                                          \
		}                                                                            \
	} while (0)

static spd_endpoint ep_of(int fd, int peer)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	spd_endpoint ep = { 0 };

	if ((peer ? getpeername : getsockname)(fd, (struct sockaddr *)&ss, &len) != 0)
		abort();
	ep.family = ss.ss_family;
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)&ss;

		memcpy(ep.addr, &s->sin_addr, 4);
		ep.port = ntohs(s->sin_port);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;

		memcpy(ep.addr, &s->sin6_addr, 16);
		ep.port = ntohs(s->sin6_port);
	}
	return ep;
}

/* The holders of channel ch, sorted. */
static size_t holders_of(const spd_channel *ch, pid_t *pids, size_t max)
{
	uint64_t inodes[64];
	size_t n, np = 0;
	sp_err err;

	if (spd_channel_inodes(ch, inodes, 64, &n, NULL, &err) != 0) {
		fprintf(stderr, "spd_channel_inodes: %s\n", err.msg);
		failures++;
		return 0;
	}
	if (n && spd_holders(inodes, n, ch->kind == SPD_CH_PIPE, pids, max, &np, &err) != 0) {
		fprintf(stderr, "spd_holders: %s\n", err.msg);
		failures++;
		return 0;
	}
	for (size_t i = 1; i < np; i++)
		for (size_t j = i; j > 0 && pids[j - 1] > pids[j]; j--) {
			pid_t t = pids[j];

			pids[j] = pids[j - 1];
			pids[j - 1] = t;
		}
	return np;
}

static bool same_set(const pid_t *got, size_t ngot, pid_t *want, size_t nwant)
{
	for (size_t i = 1; i < nwant; i++)
		for (size_t j = i; j > 0 && want[j - 1] > want[j]; j--) {
			pid_t t = want[j];

			want[j] = want[j - 1];
			want[j - 1] = t;
		}
	return ngot == nwant && memcmp(got, want, ngot * sizeof *got) == 0;
}

static pid_t sleeper(int accept_from, int report)
{
	pid_t pid = fork();

	if (pid == 0) {
		if (accept_from >= 0) {
			char c;
			int fd;

			/* wait for the go, then accept */
			if (read(report, &c, 1) != 1)
				_exit(1);
			fd = accept(accept_from, NULL, NULL);
			if (fd < 0 || write(report, "a", 1) != 1)
				_exit(1);
		}
		pause();
		_exit(0);
	}
	return pid;
}

static void tcp_cases(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int lfd = socket(AF_INET, SOCK_STREAM, 0), cfd;
	int go[3][2];
	pid_t workers[3], got[16], want[8];
	spd_channel ch = { .kind = SPD_CH_TCP };
	size_t n;
	char c;

	if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 8) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &len))
		abort();
	for (int i = 0; i < 3; i++) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, go[i]))
			abort();
		workers[i] = sleeper(lfd, go[i][1]);
	}
	/* made after the fork: the workers do not inherit the client's end */
	cfd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(cfd, (struct sockaddr *)&sa, sizeof sa))
		abort();
	ch.src = ep_of(cfd, 0);
	ch.dst = ep_of(cfd, 1);
	/* 1. not accepted yet: the listener's holders */
	n = holders_of(&ch, got, 16);
	memcpy(want, workers, sizeof workers);
	want[3] = getpid();
	CHECK(same_set(got, n, want, 4), "a connection not accepted: %zu holders, want the 3 "
	      "workers and the parent", n);
	/* 2. worker 1 accepts it */
	if (write(go[1][0], "g", 1) != 1 || read(go[1][0], &c, 1) != 1)
		abort();
	n = holders_of(&ch, got, 16);
	want[0] = workers[1];
	CHECK(same_set(got, n, want, 1), "an accepted connection: %zu holders (first %d), want "
	      "worker %d alone", n, n ? (int)got[0] : 0, (int)workers[1]);
	/* 3. the reverse direction: this process, the client */
	spd_channel back = { .kind = SPD_CH_TCP, .src = ch.dst, .dst = ch.src };

	n = holders_of(&back, got, 16);
	want[0] = getpid();
	CHECK(same_set(got, n, want, 1), "the client's end: %zu holders, want this process", n);
	for (int i = 0; i < 3; i++) {
		kill(workers[i], SIGKILL);
		waitpid(workers[i], NULL, 0);
		close(go[i][0]);
		close(go[i][1]);
	}
	close(cfd);
	close(lfd);
}

static void dual_stack_case(void)
{
	struct sockaddr_in6 sa6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in sa4 = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa6;
	int zero = 0, lfd = socket(AF_INET6, SOCK_STREAM, 0), cfd = socket(AF_INET, SOCK_STREAM, 0);
	pid_t got[8], want[1] = { getpid() };
	spd_channel ch = { .kind = SPD_CH_TCP };
	size_t n;

	if (lfd < 0) {
		fprintf(stderr, "no IPv6: case 4 skipped\n");
		return;
	}
	setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	if (bind(lfd, (struct sockaddr *)&sa6, sizeof sa6) || listen(lfd, 8) ||
	    getsockname(lfd, (struct sockaddr *)&sa6, &len))
		abort();
	sa4.sin_port = sa6.sin6_port;
	if (connect(cfd, (struct sockaddr *)&sa4, sizeof sa4))
		abort();
	ch.src = ep_of(cfd, 0);
	ch.dst = ep_of(cfd, 1);
	n = holders_of(&ch, got, 8);
	CHECK(same_set(got, n, want, 1), "a dual-stack listener from IPv4: %zu holders", n);
	close(cfd);
	close(lfd);
}

static void udp_case(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int rfd = socket(AF_INET, SOCK_DGRAM, 0), sfd = socket(AF_INET, SOCK_DGRAM, 0);
	int one = 1;
	pid_t got[8], want[2], child;
	spd_channel ch = { .kind = SPD_CH_UDP };
	size_t n;

	setsockopt(rfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(rfd, (struct sockaddr *)&sa, sizeof sa) ||
	    getsockname(rfd, (struct sockaddr *)&sa, &len))
		abort();
	lo.sin_port = sa.sin_port;
	if (connect(sfd, (struct sockaddr *)&lo, sizeof lo))
		abort();
	ch.src = ep_of(sfd, 0);
	ch.dst = ep_of(sfd, 1);
	/* 5a. an unconnected socket bound to the wildcard, held by a child too */
	child = sleeper(-1, -1);
	n = holders_of(&ch, got, 8);
	want[0] = getpid();
	want[1] = child;
	CHECK(same_set(got, n, want, 2), "UDP to a wildcard-bound socket: %zu holders", n);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	/* 5b. a socket connected to the sender, on the same port, in a child:
	 * the exact match wins */
	int cfd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in me = lo;

	setsockopt(cfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in peer = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				    .sin_port = htons(ch.src.port) };

	if (bind(cfd, (struct sockaddr *)&me, sizeof me) ||
	    connect(cfd, (struct sockaddr *)&peer, sizeof peer))
		abort();
	child = fork();
	if (child == 0) {
		close(rfd);
		pause();
		_exit(0);
	}
	close(cfd);
	n = holders_of(&ch, got, 8);
	want[0] = child;
	CHECK(same_set(got, n, want, 1), "UDP with a connected receiver: %zu holders (first %d), "
	      "want the child %d", n, n ? (int)got[0] : 0, (int)child);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(rfd);
	close(sfd);
}

static void pipe_and_nothing_cases(void)
{
	int p[2];
	struct stat st;
	pid_t got[8], want[2], child;
	spd_channel ch = { .kind = SPD_CH_PIPE };
	size_t n;

	if (pipe(p) || fstat(p[0], &st))
		abort();
	child = sleeper(-1, -1);
	ch.inode = st.st_ino;
	n = holders_of(&ch, got, 8);
	want[0] = getpid();
	want[1] = child;
	CHECK(same_set(got, n, want, 2), "a pipe: %zu holders", n);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(p[0]);
	close(p[1]);

	spd_channel none = { .kind = SPD_CH_TCP, .src = { .family = AF_INET, .port = 1 },
			     .dst = { .family = AF_INET, .port = 9 } };
	uint64_t inodes[4];
	sp_err err;

	none.dst.addr[0] = 127;
	none.dst.addr[3] = 1;
	CHECK(spd_channel_inodes(&none, inodes, 4, &n, NULL, &err) == 0 && n == 0,
	      "a port nothing listens on has %zu inodes", n);
}

int main(void)
{
	tcp_cases();
	dual_stack_case();
	udp_case();
	pipe_and_nothing_cases();
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
