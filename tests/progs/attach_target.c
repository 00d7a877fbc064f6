/*
 * attach_target.c — a process to attach to (tests/e2e/test_attach.py).
 *
 * Threads blocked in accept, read, epoll_wait, nanosleep and a condition
 * variable (futex), and 16 busy threads, while `sptrace attach` loads the
 * agent and tracing starts and stops.  Each checks what it can see of it:
 * no call may fail with EINTR, a sleep may not end early, a wait with a
 * timeout may not end before it, the busy threads' sums stay right.
 * It listens on loopback (on every address with --any), prints its port
 * and "ready", serves each connection (reads a number,
 * answers work(number)), and when standard input closes prints one line:
 * "eintr N early N wrong N served N".
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* noipa: gcc must not find work() pure and hoist it out of the busy loops */
#define KEEP __attribute__((noinline, noipa))

static volatile int done;
static int eintr, early, wrong, served;
static int listen_fd, pipe_fd[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void bump(int *counter)
{
	__atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
}

KEEP long work(long n)
{
	long s = 0;

	for (long i = 0; i < n; i++)
		s += (i * 7) % 13;
	return s;
}

KEEP void serve(int c)
{
	char buf[64];
	ssize_t n = read(c, buf, sizeof buf - 1);

	if (n < 0 && errno == EINTR)
		bump(&eintr);
	if (n > 0) {
		buf[n] = '\0';
		n = snprintf(buf, sizeof buf, "%ld\n", work(atol(buf)));
		if (write(c, buf, (size_t)n) != n)
			bump(&wrong);
		bump(&served);
	}
	close(c);
}

KEEP void *acceptor(void *arg)
{
	(void)arg;
	while (!done) {
		int c = accept(listen_fd, NULL, NULL);

		if (c < 0) {
			if (errno == EINTR)
				bump(&eintr);
			continue;
		}
		serve(c);
	}
	return NULL;
}

KEEP void *reader(void *arg)
{
	char b;

	(void)arg;
	while (!done)
		if (read(pipe_fd[0], &b, 1) < 0 && errno == EINTR)
			bump(&eintr);
	return NULL;
}

KEEP void *poller(void *arg)
{
	int ep = epoll_create1(0);
	struct epoll_event ev;

	(void)arg;
	while (!done) {
		double t0 = now_s();
		int n = epoll_wait(ep, &ev, 1, 300);

		if (n < 0 && errno == EINTR)
			bump(&eintr);
		else if (n == 0 && now_s() - t0 < 0.29)
			bump(&early);
	}
	close(ep);
	return NULL;
}

KEEP void *sleeper(void *arg)
{
	(void)arg;
	while (!done) {
		struct timespec d = { 0, 200000000 };
		double t0 = now_s();

		if (nanosleep(&d, NULL) != 0)
			bump(&eintr);
		else if (now_s() - t0 < 0.199)
			bump(&early);
	}
	return NULL;
}

KEEP void *waiter(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	while (!done)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return NULL;
}

KEEP void *busy(void *arg)
{
	long want = work(1000 + (long)arg);

	while (!done)
		if (work(1000 + (long)arg) != want)
			bump(&wrong);
	return NULL;
}

int main(int argc, char **argv)
{
	/* --any: on every address (another host connects), else loopback */
	int any = argc > 1 && strcmp(argv[1], "--any") == 0;
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(any ? INADDR_ANY : INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	pthread_t t[32];
	int n = 0;
	char buf[64];

	listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) ||
	    listen(listen_fd, 64) || getsockname(listen_fd, (struct sockaddr *)&a, &len) ||
	    pipe(pipe_fd))
		return 1;
	pthread_create(&t[n++], NULL, acceptor, NULL);
	pthread_create(&t[n++], NULL, reader, NULL);
	pthread_create(&t[n++], NULL, poller, NULL);
	pthread_create(&t[n++], NULL, sleeper, NULL);
	pthread_create(&t[n++], NULL, waiter, NULL);
	for (long i = 0; i < 16; i++)
		pthread_create(&t[n++], NULL, busy, (void *)i);
	printf("%d\nready\n", ntohs(a.sin_port));
	fflush(stdout);
	while (read(0, buf, sizeof buf) > 0)
		;
	done = 1;
	pthread_mutex_lock(&mu);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (write(pipe_fd[1], "x", 1) != 1)
		return 1;
	shutdown(listen_fd, SHUT_RDWR);
	{
		/* wake the acceptor */
		int c = socket(AF_INET, SOCK_STREAM, 0);

		if (c >= 0) {
			connect(c, (struct sockaddr *)&a, sizeof a);
			close(c);
		}
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	printf("eintr %d early %d wrong %d served %d\n", eintr, early, wrong, served);
	return 0;
}
