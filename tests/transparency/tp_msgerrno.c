/*
 * tp_msgerrno.c — sends and receives whose errno and results must be the
 * same under the agent (issue 13: the agent interposes every send, recv,
 * read and write and looks at the descriptor behind them).
 *
 * Each call is made with errno set to a sentinel first, and the result and
 * errno printed: failing calls (a write to a closed descriptor, a send to a
 * socket whose peer is gone, a receive that would block) must leave the
 * errno they leave natively; successful ones -- the first on a descriptor,
 * when the agent classifies it with calls of its own (getpeername fails on
 * an unconnected UDP socket), and later ones -- must leave the sentinel.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tp.h"

static int sp[2], pp[2];

#define SHOW(what, call)                                                        \
	do {                                                                    \
		long rc_;                                                       \
		errno = 4242;                                                   \
		rc_ = (long)(call);                                             \
		printf("%s: %ld errno %d\n", what, rc_, errno);                 \
	} while (0)

TP_NOINLINE static void streams(void)
{
	char buf[64];
	int gone[2];
	struct iovec iov = { buf, 10 };

	SHOW("send", send(sp[0], "hello", 5, 0));
	SHOW("recv", recv(sp[1], buf, sizeof buf, 0));
	SHOW("write", write(sp[1], "world!", 6));
	SHOW("read", read(sp[0], buf, sizeof buf));
	SHOW("recv would block", recv(sp[0], buf, sizeof buf, MSG_DONTWAIT));
	SHOW("writev", writev(pp[1], &iov, 1));
	SHOW("read pipe", read(pp[0], buf, sizeof buf));
	SHOW("write closed fd", write(1000, "x", 1));
	SHOW("read closed fd", read(1000, buf, 1));
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, gone) != 0)
		exit(4);
	close(gone[1]);
	SHOW("send to a closed peer", send(gone[0], "x", 1, MSG_NOSIGNAL));
	SHOW("write to a closed peer", write(gone[0], "x", 1));
	SHOW("recv from a closed peer", recv(gone[0], buf, 1, 0));
	close(gone[0]);
	SHOW("send on a closed socket", send(gone[0], "x", 1, 0));
}

TP_NOINLINE static void datagrams(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof a;
	char buf[64];
	int u = socket(AF_INET, SOCK_DGRAM, 0);

	if (u < 0 || bind(u, (struct sockaddr *)&a, sizeof a) != 0 ||
	    getsockname(u, (struct sockaddr *)&a, &l) != 0)
		exit(5);
	SHOW("sendto self", sendto(u, "dgram", 5, 0, (struct sockaddr *)&a, sizeof a));
	SHOW("recv dgram", recv(u, buf, sizeof buf, 0));
	SHOW("sendto self again", sendto(u, "dgram2", 6, 0, (struct sockaddr *)&a, sizeof a));
	SHOW("recvfrom dgram", recvfrom(u, buf, sizeof buf, 0, NULL, NULL));
	SHOW("recv would block", recv(u, buf, sizeof buf, MSG_DONTWAIT));
	SHOW("send unconnected", send(u, "x", 1, 0));
	close(u);
}

int tp_setup(const char *scratch)
{
	(void)scratch;
	signal(SIGPIPE, SIG_IGN);
	return socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0 || pipe(pp) != 0;
}

int tp_after_go(const char *scratch)
{
	(void)scratch;
	for (int i = 0; i < 2; i++) {
		printf("round %d\n", i);
		streams();
		datagrams();
	}
	return 0;
}
