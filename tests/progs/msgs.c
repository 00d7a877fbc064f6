/*
 * msgs.c — a program that talks, for the message events of tests/e2e
 * (test_msgs.py): known byte counts over every kind of channel.
 *
 *  - TCP over loopback: a server thread accepts one connection; the client
 *    (main) sends 118 bytes with send(), the server reads them with recv()
 *    and answers 42 bytes with write(), which the client reads with read();
 *  - a pipe: 5 bytes written, then read, then the end after its write end
 *    is closed;
 *  - UDP: an unconnected socket sends 12 bytes with sendto() to another,
 *    which gets them with recvfrom() and answers 7 bytes with sendto();
 *  - a UNIX socketpair: 9 bytes with sendmsg(), read with recvmsg(); then
 *    shutdown(SHUT_WR) on the sending end and a recv() that gets its end;
 *    the next descriptor number the program gets is printed (the agent
 *    asked the kernel for the socketpair's peers meanwhile);
 *  - errno: a write to a closed descriptor (EBADF) and a send to a socket
 *    whose peer is gone (EPIPE) print the errno they leave.
 *
 * Stdout is the same natively and traced; the ports go to stderr as
 * "tcp SERVERPORT CLIENTPORT" and "udp APORT BPORT" for the test.
 *
 * `msgs late`: a TCP connection that carried bytes before tracing began,
 * for absolute offsets (run with `--on call late_traced`).  Before: the
 * client sends 1000 bytes, the server reads 300 of them and answers 5,
 * which the client reads.  Then, in late_traced(), the server reads the
 * other 700 (bytes 300..1000 of the stream), answers 7 (5..12), the client
 * sends 50 more (1000..1050) which the server reads, reads the 7, shuts
 * its sending down (at 1050); the server reads the end (at 1050) and
 * closes, the client reads its end (at 12).  Ports on stderr:
 * "late SERVERPORT CLIENTPORT".
 *
 * `msgs forkfirst`: the channels file of a family (bench/STARTWORK.md: it
 * gets its first record when the first channel is met).  A child forked
 * before its parent met any channel writes 5 bytes into a pipe
 * (child_writes), then the parent reads them; the parent writes 3 bytes
 * into another pipe and forks a child that reads them (child_reads).
 * Stderr: "forkfirst PARENT CHILD1 CHILD2".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static int listener;

static void die(const char *what)
{
	perror(what);
	exit(2);
}

static unsigned short port_of(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;

	if (getsockname(fd, (struct sockaddr *)&a, &l) != 0)
		die("getsockname");
	return ntohs(a.sin_port);
}

static size_t recv_all(int fd, char *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = recv(fd, buf + got, n - got, 0);

		if (k <= 0)
			die("recv");
		got += (size_t)k;
	}
	return got;
}

static void *server_tcp(void *arg)
{
	char buf[118], answer[42];
	int c = accept(listener, NULL, NULL);

	(void)arg;
	if (c < 0)
		die("accept");
	recv_all(c, buf, sizeof buf);
	memset(answer, 'a', sizeof answer);
	if (write(c, answer, sizeof answer) != (ssize_t)sizeof answer)
		die("write");
	close(c);
	return NULL;
}

static void client_tcp(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char msg[118], answer[42];
	size_t got = 0;
	pthread_t th;
	int s;

	listener = socket(AF_INET, SOCK_STREAM, 0);
	if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) != 0 ||
	    listen(listener, 1) != 0)
		die("listen");
	a.sin_port = htons(port_of(listener));
	if (pthread_create(&th, NULL, server_tcp, NULL) != 0)
		die("pthread_create");
	s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0)
		die("connect");
	fprintf(stderr, "tcp %u %u\n", ntohs(a.sin_port), port_of(s));
	memset(msg, 'm', sizeof msg);
	if (send(s, msg, sizeof msg, 0) != (ssize_t)sizeof msg)
		die("send");
	while (got < sizeof answer) {
		ssize_t k = read(s, answer + got, sizeof answer - got);

		if (k <= 0)
			die("read");
		got += (size_t)k;
	}
	pthread_join(th, NULL);
	close(s);
	close(listener);
	printf("tcp: sent %zu, got %zu\n", sizeof msg, got);
}

static void pipe_exchange(void)
{
	int p[2];
	char buf[8];

	if (pipe(p) != 0 || write(p[1], "hello", 5) != 5 || read(p[0], buf, sizeof buf) != 5)
		die("pipe");
	close(p[1]);
	if (read(p[0], buf, sizeof buf) != 0)
		die("pipe end");
	close(p[0]);
	printf("pipe: 5 bytes, then the end\n");
}

static int udp_socket(struct sockaddr_in *a)
{
	socklen_t l = sizeof *a;
	int s = socket(AF_INET, SOCK_DGRAM, 0);

	*a = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (s < 0 || bind(s, (struct sockaddr *)a, sizeof *a) != 0 ||
	    getsockname(s, (struct sockaddr *)a, &l) != 0)
		die("udp");
	return s;
}

static void udp_exchange(void)
{
	struct sockaddr_in a, b, from;
	socklen_t fl = sizeof from;
	char buf[32];
	int sa = udp_socket(&a), sb = udp_socket(&b);

	fprintf(stderr, "udp %u %u\n", ntohs(a.sin_port), ntohs(b.sin_port));
	if (sendto(sa, "datagram-one", 12, 0, (struct sockaddr *)&b, sizeof b) != 12 ||
	    recvfrom(sb, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl) != 12 ||
	    sendto(sb, "answer!", 7, 0, (struct sockaddr *)&from, fl) != 7 ||
	    recvfrom(sa, buf, sizeof buf, 0, NULL, NULL) != 7)
		die("udp exchange");
	close(sa);
	close(sb);
	printf("udp: 12 and 7 bytes\n");
}

static void unix_exchange(void)
{
	int sv[2];
	char buf[16];
	struct iovec out = { "unix-msg!", 9 }, in = { buf, sizeof buf };
	struct msghdr mo = { .msg_iov = &out, .msg_iovlen = 1 }, mi = { .msg_iov = &in, .msg_iovlen = 1 };
	int next;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 || sendmsg(sv[0], &mo, 0) != 9 ||
	    recvmsg(sv[1], &mi, 0) != 9)
		die("unix");
	if (shutdown(sv[0], SHUT_WR) != 0 || recv(sv[1], buf, sizeof buf, 0) != 0)
		die("unix shutdown");
	next = dup(0);
	printf("unix: the next descriptor is %d\n", next);
	close(next);
	close(sv[0]);
	close(sv[1]);
	printf("unix: 9 bytes, shutdown, the end\n");
}

static void errnos(void)
{
	int sv[2], fd;
	ssize_t rc;

	fd = dup(1);
	close(fd);
	errno = 0;
	rc = write(fd, "x", 1);
	printf("write to a closed descriptor: %zd errno %d\n", rc, errno);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		die("socketpair");
	close(sv[1]);
	errno = 0;
	rc = send(sv[0], "x", 1, MSG_NOSIGNAL);
	printf("send to a closed peer: %zd errno %d\n", rc, errno);
	errno = 0;
	rc = write(sv[0], "x", 1);
	printf("write to a closed peer: %zd errno %d\n", rc, errno);
	close(sv[0]);
}

static void send_n(int fd, char c, size_t n)
{
	char buf[1000];

	memset(buf, c, n);
	if (send(fd, buf, n, 0) != (ssize_t)n)
		die("send");
}

/* Where `msgs late` starts tracing (--on call late_traced). */
__attribute__((noinline)) void late_traced(int srv, int cli)
{
	char buf[1000];

	recv_all(srv, buf, 700);
	send_n(srv, 'b', 7);
	send_n(cli, 'c', 50);
	recv_all(srv, buf, 50);
	recv_all(cli, buf, 7);
	if (shutdown(cli, SHUT_WR) != 0 || recv(srv, buf, sizeof buf, 0) != 0)
		die("late: the end");
	close(srv);
	if (read(cli, buf, sizeof buf) != 0)
		die("late: the server's end");
	close(cli);
}

static void late(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char buf[1000];
	int l = socket(AF_INET, SOCK_STREAM, 0), cli, srv;

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0)
		die("listen");
	a.sin_port = htons(port_of(l));
	cli = socket(AF_INET, SOCK_STREAM, 0);
	if (cli < 0 || connect(cli, (struct sockaddr *)&a, sizeof a) != 0 ||
	    (srv = accept(l, NULL, NULL)) < 0)
		die("connect");
	close(l);
	fprintf(stderr, "late %u %u\n", ntohs(a.sin_port), port_of(cli));
	send_n(cli, 'a', 1000);
	recv_all(srv, buf, 300);
	send_n(srv, 'b', 5);
	recv_all(cli, buf, 5);
	late_traced(srv, cli);
	printf("late: 1050 bytes one way, 12 the other\n");
}

__attribute__((noinline)) int child_writes(int fd)
{
	return write(fd, "child", 5) == 5 ? 0 : 1;
}

__attribute__((noinline)) int child_reads(int fd)
{
	char buf[8];

	return read(fd, buf, sizeof buf) == 3 ? 0 : 1;
}

static void fork_first(void)
{
	int p[2], q[2], st = -1;
	char buf[8];
	pid_t c1, c2;

	if (pipe(p) != 0)
		die("pipe");
	c1 = fork();
	if (c1 == 0)
		_exit(child_writes(p[1]));
	if (c1 < 0 || waitpid(c1, &st, 0) != c1 || st != 0 || read(p[0], buf, sizeof buf) != 5)
		die("the first child's pipe");
	if (pipe(q) != 0 || write(q[1], "abc", 3) != 3)
		die("pipe");
	c2 = fork();
	if (c2 == 0)
		_exit(child_reads(q[0]));
	if (c2 < 0 || waitpid(c2, &st, 0) != c2 || st != 0)
		die("the second child's pipe");
	fprintf(stderr, "forkfirst %d %d %d\n", (int)getpid(), (int)c1, (int)c2);
	printf("forkfirst: 5 bytes from a child, 3 to another\n");
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "late") == 0) {
		late();
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "forkfirst") == 0) {
		fork_first();
		return 0;
	}
	client_tcp();
	pipe_exchange();
	udp_exchange();
	unix_exchange();
	errnos();
	return 0;
}
