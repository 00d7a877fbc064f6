/*
 * tier.c — a small 3-tier application for the propagation tests
 * (tests/e2e/test_propagate.py): one binary, a role per argument.
 *
 *   tier backend PORT
 *       listens on every address; per connection, reads lines "N\n" and
 *       answers "backend N -> work(N)\n" (keep-alive: many per connection).
 *   tier frontend PORT BACKEND_IP BACKEND_PORT MONITOR_IP MONITOR_PORT
 *       listens; per client line "N\n": asks the backend over one kept
 *       connection, hands N to its helper child over a pipe (the helper
 *       answers on another pipe), sends a UDP heartbeat "beat N\n" to the
 *       monitor, and answers "front(BACKEND ANSWER, helper H)\n".
 *   tier forkbackend PORT
 *       the backend as a server that forks a child per connection (after a
 *       pause of 0.3 s: the request is there when it accepts); the child
 *       serves it and prints "child PID got HEX" at its end.
 *   tier monitor PORT
 *       counts UDP heartbeats.
 *   tier client IP PORT N...
 *       one connection; sends each N, prints each answer.
 *
 * With TIER_OOBINLINE=1 in the environment, the TCP listeners (and so every
 * connection they accept) read urgent data in line (SO_OOBINLINE); with
 * TIER_PKTINFO=1 the monitor asks IP_PKTINFO and reads each datagram with
 * recvmsg, keeping after its bytes the level and type of every control
 * message it got ("[L/T]").
 *
 * Servers print "ready PORT" once listening.  When their standard input
 * closes they print, on standard output, every byte they received, in
 * hexadecimal per connection ("got HEX"), so a test compares a traced run
 * with an untraced one byte for byte; the frontend's helper prints what it
 * read from the pipe.  The servers' work is in functions a trace shows:
 * work(), ask_backend(), ask_helper(), heartbeat(), serve_line().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa))

static char got[1 << 16];              /* every byte received, in order */
static size_t ngot;

static KEEP long work(long n)
{
	long s = 0;

	for (long i = 0; i < n * 1000; i++)
		s += i % 7;
	return s;
}

static void keep_bytes(const char *buf, size_t n)
{
	if (ngot + n < sizeof got) {
		memcpy(got + ngot, buf, n);
		ngot += n;
	}
}

static void print_got(const char *who)
{
	printf("%s got ", who);
	for (size_t i = 0; i < ngot; i++)
		printf("%02x", (unsigned char)got[i]);
	printf("\n");
	fflush(stdout);
}

static int listen_on(int port, int type)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, type, 0), one = 1;

	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (type == SOCK_STREAM && getenv("TIER_OOBINLINE"))
		setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &one, sizeof one);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    (type == SOCK_STREAM && listen(fd, 64) != 0)) {
		perror("tier: listen");
		exit(1);
	}
	printf("ready %d\n", port);
	fflush(stdout);
	return fd;
}

static int connect_to(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a,
								  sizeof a) != 0) {
		fprintf(stderr, "tier: connect %s:%d: %s\n", ip, port, strerror(errno));
		exit(1);
	}
	return fd;
}

/* One line from fd into buf (without the newline); its length, -1 at the end. */
static int read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;

	while (n + 1 < len) {
		char c;
		ssize_t r = read(fd, &c, 1);

		if (r <= 0)
			return n ? (int)n : -1;
		keep_bytes(&c, 1);
		if (c == '\n')
			break;
		buf[n++] = c;
	}
	buf[n] = '\0';
	return (int)n;
}

/* Serve connections on lfd until stdin closes: each line through fn. */
static void serve(int lfd, void (*fn)(int fd, const char *line), const char *who)
{
	struct pollfd p[66] = { { .fd = 0, .events = POLLIN }, { .fd = lfd, .events = POLLIN } };
	int n = 2;

	for (;;) {
		if (poll(p, (nfds_t)n, -1) < 0)
			continue;
		if (p[0].revents) {
			print_got(who);
			return;
		}
		if ((p[1].revents & POLLIN) && n < 66) {
			p[n].fd = accept(lfd, NULL, NULL);
			p[n++].events = POLLIN;
		}
		for (int i = 2; i < n; i++) {
			char line[256];

			if (!p[i].revents)
				continue;
			if (read_line(p[i].fd, line, sizeof line) < 0) {
				close(p[i].fd);
				p[i--] = p[--n];
				continue;
			}
			fn(p[i].fd, line);
		}
	}
}

static KEEP void backend_line(int fd, const char *line)
{
	char out[128];
	long n = atol(line);
	int k = snprintf(out, sizeof out, "backend %ld -> %ld\n", n, work(n));

	if (write(fd, out, (size_t)k) != k)
		perror("tier: backend write");
}

/* Accept each connection, after a pause, and serve it in a child of its own
 * until stdin closes. */
static void fork_serve(int lfd)
{
	struct pollfd p[2] = { { .fd = 0, .events = POLLIN }, { .fd = lfd, .events = POLLIN } };

	for (;;) {
		if (poll(p, 2, -1) < 0)
			continue;
		if (p[0].revents)
			break;
		usleep(300000);
		int fd = accept(lfd, NULL, NULL);

		if (fd < 0)
			continue;
		fflush(stdout);
		if (fork() == 0) {
			char line[256], name[32];

			close(lfd);
			while (read_line(fd, line, sizeof line) >= 0)
				backend_line(fd, line);
			snprintf(name, sizeof name, "child %d", (int)getpid());
			print_got(name);
			_exit(0);
		}
		close(fd);
	}
	while (wait(NULL) > 0)
		;
}

/* ---- frontend ---- */

static int back_fd = -1, to_helper = -1, from_helper = -1, udp_fd = -1;
static struct sockaddr_in monitor;

static KEEP void ask_backend(const char *line, char *answer, size_t len)
{
	char req[64];
	int k = snprintf(req, sizeof req, "%s\n", line);

	if (send(back_fd, req, (size_t)k, 0) != k || read_line(back_fd, answer, len) < 0)
		snprintf(answer, len, "no backend");
}

static KEEP long ask_helper(long n)
{
	char buf[64];

	if (write(to_helper, &n, sizeof n) != sizeof n ||
	    read(from_helper, buf, sizeof buf) <= 0)
		return -1;
	return atol(buf);
}

static KEEP void heartbeat(long n)
{
	char beat[64];
	int k = snprintf(beat, sizeof beat, "beat %ld\n", n);

	sendto(udp_fd, beat, (size_t)k, 0, (struct sockaddr *)&monitor, sizeof monitor);
}

static KEEP void serve_line(int fd, const char *line)
{
	char back[128], out[256];
	long n = atol(line), h;

	ask_backend(line, back, sizeof back);
	h = ask_helper(n);
	heartbeat(n);
	int k = snprintf(out, sizeof out, "front(%s, helper %ld)\n", back, h);

	if (write(fd, out, (size_t)k) != k)
		perror("tier: frontend write");
}

static KEEP void helper(int in, int out)
{
	long n, total = 0;
	char ans[64];

	while (read(in, &n, sizeof n) == sizeof n) {
		total += n;
		int k = snprintf(ans, sizeof ans, "%ld", n * 2);

		if (write(out, ans, (size_t)k) != k)
			break;
	}
	printf("helper total %ld\n", total);
	fflush(stdout);
	_exit(0);
}

static int frontend(char **argv)
{
	int down[2], up[2];

	if (pipe(down) || pipe(up))
		return 1;
	fflush(stdout);
	pid_t h = fork();

	if (h == 0) {
		close(down[1]);
		close(up[0]);
		helper(down[0], up[1]);
	}
	close(down[0]);
	close(up[1]);
	to_helper = down[1];
	from_helper = up[0];
	monitor.sin_family = AF_INET;
	monitor.sin_port = htons((uint16_t)atoi(argv[5]));
	inet_pton(AF_INET, argv[4], &monitor.sin_addr);
	udp_fd = socket(AF_INET, SOCK_DGRAM, 0);
	back_fd = connect_to(argv[2], atoi(argv[3]));
	serve(listen_on(atoi(argv[1]), SOCK_STREAM), serve_line, "frontend");
	close(to_helper);
	waitpid(h, NULL, 0);
	return 0;
}

static int monitor_main(int port)
{
	int fd = listen_on(port, SOCK_DGRAM);
	struct pollfd p[2] = { { .fd = 0, .events = POLLIN }, { .fd = fd, .events = POLLIN } };
	long beats = 0;
	char buf[256];
	int pktinfo = getenv("TIER_PKTINFO") != NULL;
	int one = 1;

	if (pktinfo)
		setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
	for (;;) {
		union {
			struct cmsghdr h;
			char b[256];
		} ctl;
		struct iovec v = { buf, sizeof buf };
		struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b,
				    .msg_controllen = sizeof ctl.b };

		if (poll(p, 2, -1) < 0)
			continue;
		/* input closed: the datagrams already here are read first (a
		 * traced monitor is slower to come to them) */
		int last = p[0].revents != 0;
		ssize_t r = pktinfo ? recvmsg(fd, &m, last ? MSG_DONTWAIT : 0)
			    : recv(fd, buf, sizeof buf, last ? MSG_DONTWAIT : 0);

		if (last && r < 0)
			break;
		if (r > 0) {
			keep_bytes(buf, (size_t)r);
			beats++;
		}
		for (struct cmsghdr *c = pktinfo && r >= 0 ? CMSG_FIRSTHDR(&m) : NULL; c;
		     c = CMSG_NXTHDR(&m, c)) {
			char t[32];
			int k = snprintf(t, sizeof t, "[%d/%d]", c->cmsg_level, c->cmsg_type);

			keep_bytes(t, (size_t)k);
		}
		if (pktinfo && r >= 0 && (m.msg_flags & MSG_CTRUNC))
			keep_bytes("[ctrunc]", 8);
	}
	printf("monitor beats %ld\n", beats);
	print_got("monitor");
	return 0;
}

static int client(int argc, char **argv)
{
	int fd = connect_to(argv[0], atoi(argv[1]));

	for (int i = 2; i < argc; i++) {
		char req[64], line[256];
		int k = snprintf(req, sizeof req, "%s\n", argv[i]);

		if (write(fd, req, (size_t)k) != k || read_line(fd, line, sizeof line) < 0) {
			fprintf(stderr, "tier: client: no answer to %s\n", argv[i]);
			return 1;
		}
		printf("%s\n", line);
	}
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "backend") == 0)
		serve(listen_on(atoi(argv[2]), SOCK_STREAM), backend_line, "backend");
	else if (argc == 7 && strcmp(argv[1], "frontend") == 0)
		return frontend(argv + 1);
	else if (argc == 3 && strcmp(argv[1], "forkbackend") == 0)
		fork_serve(listen_on(atoi(argv[2]), SOCK_STREAM));
	else if (argc == 3 && strcmp(argv[1], "monitor") == 0)
		return monitor_main(atoi(argv[2]));
	else if (argc >= 5 && strcmp(argv[1], "client") == 0)
		return client(argc - 2, argv + 2);
	else {
		fprintf(stderr, "usage: tier backend PORT | forkbackend PORT | frontend PORT BIP BPORT MIP "
			"MPORT | monitor PORT | client IP PORT N...\n");
		return 2;
	}
	return 0;
}
