/*
 * reqserver.c — a TCP server whose requests say how they behave: the ground
 * truth of `sptrace analyze` by flow (tests/e2e/test_analyze.py).
 *
 *   reqserver thread|poll PORT N
 *
 * Listens on 127.0.0.1:PORT, prints "ready" and serves N connections, one
 * request each: a line "ID KIND\n", answered "ok ID\n".  `thread` serves
 * each connection on a thread of its own; `poll` serves them all on one
 * thread in a poll() loop.  Every request runs handle() -> parse_request(),
 * lookup(), render(); its KIND adds:
 *   normal  nothing
 *   slow    slow_path(): twice the request's work
 *   cover   lookup() misses its table and goes through fallback_lookup() ->
 *           legacy_scan() -> compare_entry(): a few microseconds, visible in
 *           the coverage of call paths and hardly in their times
 *   rare    rare_report(): half again the work, a normal but rare request
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa))
#define WORK 40000000L

static volatile long sink;

static KEEP long compute(long n)
{
	long s = 0;

	for (long i = 0; i < n; i++)
		s += i % 7;
	return s;
}

static KEEP int parse_request(const char *line, long *id, char *kind, size_t len)
{
	char k[16];

	if (sscanf(line, "%ld %15s", id, k) != 2)
		return -1;
	snprintf(kind, len, "%s", k);
	return 0;
}

static KEEP long compare_entry(long a, long b)
{
	return a == b;
}

static KEEP long legacy_scan(long id)
{
	long hit = 0;

	for (long i = 0; i < 4; i++)
		hit += compare_entry(i * 13, id);
	return hit;
}

static KEEP long fallback_lookup(long id)
{
	return legacy_scan(id) + 1;
}

static KEEP long lookup(long id, int miss)
{
	long v = compute(WORK);

	return miss ? v + fallback_lookup(id) : v + id;
}

static KEEP void slow_path(void)
{
	sink += compute(WORK);
}

static KEEP void rare_report(void)
{
	sink += compute(WORK / 2);
}

static KEEP int render(char *out, size_t len, long id)
{
	return snprintf(out, len, "ok %ld\n", id);
}

/* One request: the line in `in`, the answer into `out`. */
static KEEP int handle(const char *in, char *out, size_t len)
{
	char kind[16];
	long id;

	if (parse_request(in, &id, kind, sizeof kind) != 0)
		return snprintf(out, len, "bad request\n");
	sink += lookup(id, strcmp(kind, "cover") == 0);
	if (strcmp(kind, "slow") == 0)
		slow_path();
	if (strcmp(kind, "rare") == 0)
		rare_report();
	return render(out, len, id);
}

/* Read one line (the request) from fd: its length, -1 at the end. */
static int read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;

	while (n + 1 < len) {
		ssize_t r = recv(fd, buf + n, len - 1 - n, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		n += (size_t)r;
		if (memchr(buf, '\n', n))
			break;
	}
	buf[n] = 0;
	return (int)n;
}

static KEEP void *serve(void *arg)
{
	int fd = (int)(long)arg;
	char in[128], out[64];

	if (read_line(fd, in, sizeof in) > 0) {
		int n = handle(in, out, sizeof out);

		if (send(fd, out, (size_t)n, MSG_NOSIGNAL) < 0)
			perror("reqserver: send");
	}
	close(fd);
	return NULL;
}

static void serve_threads(int ls, int n)
{
	pthread_t *t = calloc((size_t)n, sizeof *t);

	for (int i = 0; i < n; i++) {
		int fd = accept(ls, NULL, NULL);

		if (fd < 0 || pthread_create(&t[i], NULL, serve, (void *)(long)fd) != 0) {
			perror("reqserver: accept");
			exit(1);
		}
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	free(t);
}

/* The poll() loop: the listener and every open connection, one request
 * each (read whole, then answered and closed). */
static void serve_poll(int ls, int n)
{
	struct pollfd *p = calloc((size_t)n + 1, sizeof *p);
	int served = 0, accepted = 0, np = 1;

	p[0] = (struct pollfd){ .fd = ls, .events = POLLIN };
	while (served < n) {
		if (poll(p, (nfds_t)np, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("reqserver: poll");
			exit(1);
		}
		if ((p[0].revents & POLLIN) && accepted < n) {
			int fd = accept(ls, NULL, NULL);

			if (fd >= 0) {
				p[np++] = (struct pollfd){ .fd = fd, .events = POLLIN };
				accepted++;
			}
		}
		for (int i = 1; i < np; i++) {
			char in[128], out[64];

			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
				continue;
			if (read_line(p[i].fd, in, sizeof in) > 0) {
				int k = handle(in, out, sizeof out);

				if (send(p[i].fd, out, (size_t)k, MSG_NOSIGNAL) < 0)
					perror("reqserver: send");
			}
			close(p[i].fd);
			p[i].fd = -1;
			served++;
		}
	}
	free(p);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int ls, n, one = 1;

	if (argc != 4 || (strcmp(argv[1], "thread") && strcmp(argv[1], "poll")) ||
	    (n = atoi(argv[3])) < 1) {
		fprintf(stderr, "usage: reqserver thread|poll PORT N\n");
		return 2;
	}
	a.sin_port = htons((uint16_t)atoi(argv[2]));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
	    bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 64) != 0) {
		perror("reqserver: listen");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	if (strcmp(argv[1], "thread") == 0)
		serve_threads(ls, n);
	else
		serve_poll(ls, n);
	close(ls);
	return 0;
}
