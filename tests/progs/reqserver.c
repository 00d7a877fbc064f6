/*
 * reqserver.c — a TCP server whose requests say how they behave: the ground
 * truth of `sptrace analyze` by flow (tests/e2e/test_analyze.py).
 *
 *   reqserver thread|poll|queue [ADDR:]PORT N
 *   reqserver client ROUNDS ADDR:PORT:KIND...
 *
 * Listens on 127.0.0.1:PORT (or ADDR:PORT), prints "ready" and serves N connections, one
 * request each: a line "ID KIND\n", answered "ok ID\n".  `thread` serves
 * each connection on a thread of its own; `poll` serves them all on one
 * thread in a poll() loop, gathering each request's bytes as they come (a
 * request sent in pieces is served between others'); `queue` reads each
 * request on the accepting thread, which puts it on a queue (enqueue(req))
 * for 2 worker threads, made at the first accept, that take it
 * (dequeue() returns req), serve it and answer: a request's work crosses
 * two threads with no message between them (`sptrace run --join
 * enqueue:entry:arg1 --join dequeue:exit:ret` joins them).  Every request runs handle() -> parse_request(),
 * lookup(), render(); its KIND adds:
 *   normal  nothing
 *   slow    slow_path(): three times the request's work more (clear of a
 *           30 ms preemption of a normal request on a loaded machine)
 *   cover   lookup() misses its table and goes through fallback_lookup() ->
 *           legacy_scan() -> compare_entry(): a few microseconds, visible in
 *           the coverage of call paths and hardly in their times
 *   rare    rare_report(): twice the work too, a normal but rare request
 *   loop    spin_forever(): a loop that calls nothing, never answered
 *   alt     the same work, lookup() called from another call site of
 *           handle(): one path with the others unless call sites count
 *   chatty  the same work, its answer sent one byte per send() (reply()):
 *           visible in the messages only, not in times or call paths
 *
 * `client` sends ROUNDS rounds of one request to each server in turn, one
 * connection each ("ID KIND\n"), waiting at most 2 s for each answer; a
 * server that did not answer is not asked again.  KIND is the server's
 * requests' kind, or KIND@R: that kind in round R, normal in the others.
 * Prints "answered N of M".
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
#include <sys/time.h>
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
	sink += compute(3 * WORK);
}

static KEEP void spin_forever(void)
{
	for (;;)
		sink++;
}

static KEEP void rare_report(void)
{
	sink += compute(WORK);
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
	if (strcmp(kind, "alt") == 0) {
		/* the same work from another call site */
		__asm__ volatile("" ::: "memory");
		sink += lookup(id, 0);
		__asm__ volatile("nop");
	} else {
		sink += lookup(id, strcmp(kind, "cover") == 0);
	}
	if (strcmp(kind, "slow") == 0)
		slow_path();
	if (strcmp(kind, "rare") == 0)
		rare_report();
	if (strcmp(kind, "loop") == 0)
		spin_forever();
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

/* Send the answer `out` to the request `in`: a chatty one byte by byte. */
static KEEP void reply(int fd, const char *in, const char *out, int n)
{
	size_t piece = strstr(in, " chatty") ? 1 : (size_t)n;

	for (size_t at = 0; at < (size_t)n; at += piece)
		if (send(fd, out + at, piece < n - at ? piece : n - at, MSG_NOSIGNAL) < 0) {
			perror("reqserver: send");
			return;
		}
}

static KEEP void *serve(void *arg)
{
	int fd = (int)(long)arg;
	char in[128], out[64];

	if (read_line(fd, in, sizeof in) > 0)
		reply(fd, in, out, handle(in, out, sizeof out));
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

/* The queue: requests read by the accepting thread, served by workers. */
struct req {
	int fd;
	char line[128];
	struct req *next;
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct req *q_head, **q_tail = &q_head;
static int q_closed;

static KEEP void enqueue(struct req *r)
{
	pthread_mutex_lock(&q_lock);
	r->next = NULL;
	*q_tail = r;
	q_tail = &r->next;
	pthread_cond_signal(&q_cond);
	pthread_mutex_unlock(&q_lock);
}

/* The next request, NULL once the queue is closed and empty. */
static KEEP struct req *dequeue(void)
{
	struct req *r;

	pthread_mutex_lock(&q_lock);
	while (!q_head && !q_closed)
		pthread_cond_wait(&q_cond, &q_lock);
	r = q_head;
	if (r && !(q_head = r->next))
		q_tail = &q_head;
	pthread_mutex_unlock(&q_lock);
	return r;
}

static KEEP void *worker(void *arg)
{
	struct req *r;

	(void)arg;
	while ((r = dequeue())) {
		char out[64];
		reply(r->fd, r->line, out, handle(r->line, out, sizeof out));
		close(r->fd);
		free(r);
	}
	return NULL;
}

static void serve_queue(int ls, int n)
{
	pthread_t w[2];

	for (int i = 0; i < n; i++) {
		struct req *r = calloc(1, sizeof *r);
		int fd = accept(ls, NULL, NULL);

		if (!r || fd < 0) {
			perror("reqserver: accept");
			exit(1);
		}
		if (i == 0)
			for (int k = 0; k < 2; k++)
				if (pthread_create(&w[k], NULL, worker, NULL) != 0) {
					perror("reqserver: pthread_create");
					exit(1);
				}
		r->fd = fd;
		if (read_line(fd, r->line, sizeof r->line) <= 0) {
			close(fd);
			free(r);
			continue;
		}
		enqueue(r);
	}
	pthread_mutex_lock(&q_lock);
	q_closed = 1;
	pthread_cond_broadcast(&q_cond);
	pthread_mutex_unlock(&q_lock);
	for (int k = 0; k < 2; k++)
		pthread_join(w[k], NULL);
}

/* The poll() loop: the listener and every open connection, one request
 * each.  A connection's bytes are gathered as they come, one recv() per
 * wakeup, so requests sent in pieces interleave: the loop serves others
 * between a request's pieces.  Answered and closed at its newline. */
static void serve_poll(int ls, int n)
{
	struct pollfd *p = calloc((size_t)n + 1, sizeof *p);
	char (*buf)[128] = calloc((size_t)n + 1, sizeof *buf);
	size_t *len = calloc((size_t)n + 1, sizeof *len);
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
			char out[64];
			ssize_t r;

			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
				continue;
			r = recv(p[i].fd, buf[i] + len[i], sizeof buf[i] - 1 - len[i], 0);
			if (r > 0)
				len[i] += (size_t)r;
			buf[i][len[i]] = 0;
			if (r > 0 && !memchr(buf[i], '\n', len[i]) && len[i] + 1 < sizeof buf[i])
				continue;                   /* more of it to come */
			if (r > 0)
				reply(p[i].fd, buf[i], out, handle(buf[i], out, sizeof out));
			close(p[i].fd);
			p[i].fd = -1;
			served++;
		}
	}
	free(len);
	free(buf);
	free(p);
}

/* One request to ADDR:PORT; 1 when answered. */
static KEEP int ask(const char *addr, int port, long id, const char *kind)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 2, 0 };
	char line[64], in[64];
	int fd = socket(AF_INET, SOCK_STREAM, 0), n, ok = 0;

	if (fd < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
	    connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("reqserver client: connect");
		if (fd >= 0)
			close(fd);
		return 0;
	}
	n = snprintf(line, sizeof line, "%ld %s\n", id, kind);
	if (send(fd, line, (size_t)n, MSG_NOSIGNAL) == n && read_line(fd, in, sizeof in) > 0)
		ok = strncmp(in, "ok ", 3) == 0;
	close(fd);
	return ok;
}

static int client(int rounds, int n, char **servers)
{
	int answered = 0, asked = 0;
	char *dead = calloc((size_t)n, 1);
	long id = 0;

	for (int r = 0; r < rounds; r++)
		for (int i = 0; i < n; i++) {
			char addr[64], kind[16], *at;
			int port;

			if (sscanf(servers[i], "%63[^:]:%d:%15s", addr, &port, kind) != 3) {
				fprintf(stderr, "reqserver client: '%s': give ADDR:PORT:KIND\n",
					servers[i]);
				return 2;
			}
			if ((at = strchr(kind, '@'))) {
				*at = 0;
				if (atoi(at + 1) != r)
					strcpy(kind, "normal");
			}
			if (dead[i])
				continue;
			if (ask(addr, port, id++, kind))
				answered++;
			else
				dead[i] = 1;
			asked++;
		}
	free(dead);
	printf("answered %d of %d\n", answered, asked);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int ls, n, one = 1;

	if (argc >= 4 && strcmp(argv[1], "client") == 0 && atoi(argv[2]) > 0)
		return client(atoi(argv[2]), argc - 3, argv + 3);
	if (argc != 4 || (strcmp(argv[1], "thread") && strcmp(argv[1], "poll") &&
			  strcmp(argv[1], "queue")) || (n = atoi(argv[3])) < 1) {
		fprintf(stderr, "usage: reqserver thread|poll|queue PORT N\n"
			"       reqserver client ROUNDS ADDR:PORT:KIND...\n");
		return 2;
	}
	/* PORT on loopback, or ADDR:PORT */
	const char *colon = strchr(argv[2], ':');
	char addr[64] = "127.0.0.1";

	if (colon)
		snprintf(addr, sizeof addr, "%.*s", (int)(colon - argv[2]), argv[2]);
	a.sin_port = htons((uint16_t)atoi(colon ? colon + 1 : argv[2]));
	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
		fprintf(stderr, "reqserver: '%s': give PORT or ADDR:PORT\n", argv[2]);
		return 2;
	}
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
	else if (strcmp(argv[1], "queue") == 0)
		serve_queue(ls, n);
	else
		serve_poll(ls, n);
	close(ls);
	return 0;
}
