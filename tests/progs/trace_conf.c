/*
 * trace_conf.c — conformance program for `sptrace run`: each scenario has
 * a known call tree, written out in tests/e2e/test_run.py.  Every function is
 * noinline/noclone and does visible work, so -O2 keeps the calls.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* dl_iterate_phdr */
#endif
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <unwind.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noclone))

volatile int sink;

KEEP int leaf(int x) { sink += x; return x + 1; }
KEEP int mid(int x) { return leaf(x) + leaf(x + 1); }
KEEP int top(int x) { int s = mid(x); s += leaf(s); return s; }

KEEP int fact(int n) { if (n <= 1) return 1; int r = fact(n - 1); sink += r; return n * r; }

KEEP int even(int n);
KEEP int odd(int n) { sink++; return n == 0 ? 0 : even(n - 1) + 0 * sink; }
KEEP int even(int n) { sink++; return n == 0 ? 1 : odd(n - 1) + 0 * sink; }

KEEP int tail_target(int x) { sink += x; return x * 3; }
/* gcc -O2 turns this into `jmp tail_target`. */
KEEP int tail_caller(int x) { sink++; return tail_target(x + 1); }
/* ... and this into `jmp *ops(,%rdi,8)`: an indirect tail jump; the two
 * targets are reached by nothing else, their calls must be traced too. */
KEEP int tail_op_a(int x) { return leaf(x) + 1; }
KEEP int tail_op_b(int x) { return leaf(x) * 2; }
static int (*const volatile tail_ops[2])(int) = { tail_op_a, tail_op_b };
KEEP int dispatch(int i, int x) { return tail_ops[i & 1](x); }

KEEP void deep_exit(int code) { fflush(stdout); exit(code); }
KEEP void deep2(int code) { leaf(code); deep_exit(code); }

KEEP void crash(void) { abort(); }
KEEP void crash2(void) { leaf(1); crash(); }

KEEP void segv_inner(int *p) { leaf(2); *(volatile int *)p = 1; }
KEEP void segv_outer(void) { leaf(1); segv_inner(NULL); }

KEEP void spin(void) { for (;;) leaf(1); }

/* Many calls, each after some work: at this pace `sptrace run` saves the
 * rings faster than they fill, and the trace holds every call. */
KEEP int paced(int i)
{
	int s = 0;

	for (int k = 0; k < 2000; k++)
		s += (i ^ k) * 3 + (s >> 3);
	return leaf(s & 7);
}

KEEP void *worker(void *arg) { leaf(1); leaf(2); return arg; }
KEEP void *worker_exit(void *arg) { leaf(3); pthread_exit(arg); }

/* Caller-sensitive functions: dlsym(RTLD_NEXT) searches after the object
 * that called it, found from its return address. */
KEEP void *next_sym_tail(const char *n) { return dlsym(RTLD_NEXT, n); }
KEEP void *next_sym_call(const char *n)
{
	void *p = dlsym(RTLD_NEXT, n);

	sink++;
	return p;
}

/* The process's unwinder (libgcc_s): a C program loads it only when an
 * unwind needs it -- glibc's backtrace(), pthread_exit, pthread_cancel, or
 * a library that links it -- and the walk must then go through every traced
 * call up to main and beyond, as natively. */
static int find_gcc_s(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	if (info->dlpi_name && strstr(info->dlpi_name, "libgcc_s"))
		*(int *)arg = 1;
	return 0;
}

static const char *gcc_s_loaded(void)
{
	int found = 0;

	dl_iterate_phdr(find_gcc_s, &found);
	return found ? "yes" : "no";
}

typedef _Unwind_Reason_Code (*walk_fn)(_Unwind_Trace_Fn, void *);
static walk_fn unwind_walk;

static _Unwind_Reason_Code count_frame(struct _Unwind_Context *ctx, void *arg)
{
	(void)ctx;
	++*(int *)arg;
	return _URC_NO_REASON;
}

/* Frames above the deepest call: bt_leaf, bt_mid, bt_top, main and the C
 * library's start (natively 7 with backtrace, one more for the walk's own
 * callback frame); a walk that stops at the first traced call sees 1 or 2. */
KEEP int bt_leaf(int how)
{
	void *frames[64];
	int n = 0;

	if (how == 0)
		n = backtrace(frames, 64);
	else
		unwind_walk(count_frame, &n);
	sink++;
	return n;
}
KEEP int bt_mid(int how) { int n = bt_leaf(how); sink++; return n; }
KEEP int bt_top(int how) { int n = bt_mid(how); sink++; return n; }

/* how 0: glibc's backtrace(), which loads libgcc_s; 1: libstdc++ dlopen'd
 * (which brings libgcc_s), then libgcc_s's own walk. */
KEEP int unwinder(int how)
{
	void *h;

	printf("libgcc_s at start: %s\n", gcc_s_loaded());
	if (how == 1) {
		h = dlopen("libstdc++.so.6", RTLD_NOW);
		unwind_walk = h ? (walk_fn)(uintptr_t)dlsym(h, "_Unwind_Backtrace") : NULL;
		if (!unwind_walk) {
			printf("no libstdc++: %s\n", dlerror());
			return 1;
		}
	}
	printf("%s through traced calls: %s\n", how ? "_Unwind_Backtrace" : "backtrace",
	       bt_top(how) >= 6 ? "deep" : "cut short");
	printf("libgcc_s now: %s\n", gcc_s_loaded());
	return 0;
}

static jmp_buf jump_buf;

KEEP void jump_c(int x) { leaf(x); longjmp(jump_buf, x); }
KEEP void jump_b(int x) { jump_c(x + 1); sink++; }
KEEP void jump_a(int x) { jump_b(x + 1); sink++; }

KEEP int jumper(void)
{
	int r = setjmp(jump_buf);

	if (r == 0)
		jump_a(1);
	return leaf(r);
}

/*
 * Threads started without pause while code is patched (run with
 * SPTRACE_TEST_PATCH_DELAY_MS): each new thread runs the C library's
 * _setjmp with every signal blocked before its start routine, and main's
 * first setjmp has the agent patch _setjmp meanwhile.  Detached, each
 * thread's end frees its descriptor (__nptl_free_tcb) with every signal
 * blocked, and main's first pthread_join has the agent patch that.
 */
static volatile int churn_stop, churn_started, churn_live;

KEEP void *churn_child(void *arg)
{
	if (arg)
		usleep(2000);   /* detached: some end at any moment */
	__atomic_sub_fetch(&churn_live, 1, __ATOMIC_RELAXED);
	return NULL;
}

KEEP void *churner(void *arg)
{
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	if (arg)
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (!churn_stop) {
		pthread_t t;

		while (__atomic_load_n(&churn_live, __ATOMIC_RELAXED) > 8)
			sched_yield();
		__atomic_add_fetch(&churn_live, 1, __ATOMIC_RELAXED);
		if (pthread_create(&t, &attr, churn_child, arg) != 0)
			__atomic_sub_fetch(&churn_live, 1, __ATOMIC_RELAXED);
		else if (!arg)
			pthread_join(t, NULL);
		__atomic_add_fetch(&churn_started, 1, __ATOMIC_RELAXED);
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

KEEP int join_once(void)
{
	pthread_t t;

	__atomic_add_fetch(&churn_live, 1, __ATOMIC_RELAXED);
	pthread_create(&t, NULL, churn_child, NULL);
	return pthread_join(t, NULL) == 0 ? 4 : -1;
}

KEEP int churn(int detached)
{
	pthread_t c[2];
	int r, before;

	for (int i = 0; i < 2; i++)
		pthread_create(&c[i], NULL, churner, detached ? (void *)1 : NULL);
	while (__atomic_load_n(&churn_started, __ATOMIC_RELAXED) < 500)
		usleep(1000);           /* every function of the loop instrumented */
	/* the first setjmp, or the first join: _setjmp or __nptl_free_tcb is
	 * patched now */
	r = detached ? join_once() : jumper();
	before = __atomic_load_n(&churn_started, __ATOMIC_RELAXED);
	while (__atomic_load_n(&churn_started, __ATOMIC_RELAXED) < before + 200)
		usleep(1000);
	churn_stop = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(c[i], NULL);
	while (__atomic_load_n(&churn_live, __ATOMIC_RELAXED) > 0)
		usleep(1000);           /* the detached ones */
	return r;
}

/*
 * 300 threads end at once and each one's thread-specific destructor waits
 * for all the others at a barrier: the agent announces each end (patch.c,
 * step 6) but must not make one wait for a free slot (step 7) -- the slots'
 * holders are waiting for it.
 */
#define BARRIER_THREADS 300
static pthread_barrier_t ends_barrier;
static pthread_key_t ends_key;

static void ends_destructor(void *v)
{
	(void)v;
	pthread_barrier_wait(&ends_barrier);
}

KEEP void *ending_thread(void *arg)
{
	pthread_setspecific(ends_key, arg);
	return arg;
}

KEEP int ends_at_barrier(void)
{
	static pthread_t t[BARRIER_THREADS];
	pthread_attr_t attr;
	int n = 0;

	pthread_barrier_init(&ends_barrier, NULL, BARRIER_THREADS);
	pthread_key_create(&ends_key, ends_destructor);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	for (long i = 0; i < BARRIER_THREADS; i++)
		n += pthread_create(&t[i], &attr, ending_thread, (void *)(i + 1)) == 0;
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	pthread_attr_destroy(&attr);
	return n;
}

/* Timer signals arriving while traced code runs, the handler itself traced. */
static volatile sig_atomic_t alarms;

KEEP void on_alarm_work(void) { leaf(7); }

static void on_alarm(int sig)
{
	(void)sig;
	on_alarm_work();
	alarms++;
}

static volatile sig_atomic_t traps;

static void on_trap(int sig)
{
	(void)sig;
	traps++;
}

KEEP int signals(void)
{
	struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
	struct sigaction sa;
	long spins = 0;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigfillset(&sa.sa_mask);    /* a handler that blocks everything, SIGTRAP too */
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	while (alarms < 20)
		spins += leaf(1) > 0;
	/* 20 came; one more may come before the timer is off, even before this
	 * line (a 1 ms timer): not counted, or the output would race */
	int seen = alarms >= 20 ? 20 : alarms;

	memset(&it, 0, sizeof it);
	setitimer(ITIMER_REAL, &it, NULL);
	/* The program's own SIGTRAP handler next to the agent's. */
	signal(SIGTRAP, on_trap);
	raise(SIGTRAP);
	raise(SIGTRAP);
	/* SIGTRAP blocked by the program: a raised one waits for the unblock,
	 * and the mask read back says blocked. */
	sigset_t trap, now;
	int before = traps;

	sigemptyset(&trap);
	sigaddset(&trap, SIGTRAP);
	sigprocmask(SIG_BLOCK, &trap, NULL);
	raise(SIGTRAP);
	pthread_sigmask(SIG_BLOCK, NULL, &now);
	if (traps != before || !sigismember(&now, SIGTRAP))
		return -2;
	sigprocmask(SIG_UNBLOCK, &trap, NULL);
	if (traps != before + 1)
		return -3;
	return spins > 0 ? seen + 100 * traps : -1;
}

extern char **environ;

/* posix_spawn, system() and vfork+exec from traced code. */
KEEP int spawn_all(void)
{
	char *argv[] = { "/bin/echo", "spawned", NULL };
	int st = 0, r;
	pid_t p, v;

	fflush(stdout);
	if (posix_spawn(&p, "/bin/echo", NULL, NULL, argv, environ) == 0)
		waitpid(p, &st, 0);
	r = system("echo from-system; exit 3");
	v = vfork();
	if (v == 0) {
		execl("/bin/echo", "echo", "vforked", (char *)0);
		_exit(127);
	}
	waitpid(v, &st, 0);
	return WEXITSTATUS(r) * 10 + WEXITSTATUS(st);
}

/* system() as POSIX has it: SIGINT (here sent by the command to its
 * parent) ignored while the command runs, the program's handler back
 * after; the command's exit status returned. */
static volatile sig_atomic_t interrupts;
static void on_int(int sig) { (void)sig; interrupts++; }

KEEP int system_signals(void)
{
	int r;

	signal(SIGINT, on_int);
	fflush(stdout);
	r = system("kill -INT $PPID; echo from-the-shell; exit 4");
	printf("during %d\n", (int)interrupts);
	raise(SIGINT);
	return WEXITSTATUS(r) * 10 + interrupts;
}

/* A thread cancelled while system() waits: the shell is killed and reaped
 * (no child left), SIGINT's handler is back. */
static void *system_sleeper(void *arg)
{
	(void)arg;
	system("exec sleep 30");
	return NULL;
}

KEEP int system_cancel(void)
{
	struct timespec nap = { 0, 200000000 };
	int before = interrupts, st;
	pthread_t t;
	void *r;

	pthread_create(&t, NULL, system_sleeper, NULL);
	nanosleep(&nap, NULL);
	pthread_cancel(t);
	pthread_join(t, &r);
	raise(SIGINT);
	printf("cancelled %s, shell %s, handler %s\n", r == PTHREAD_CANCELED ? "yes" : "no",
	       waitpid(-1, &st, WNOHANG) < 0 && errno == ECHILD ? "reaped" : "left running",
	       interrupts == before + 1 ? "back" : "lost");
	return 0;
}

KEEP int child_work(void) { return leaf(1) + leaf(2); }
KEEP int parent_work(void) { return leaf(3); }

KEEP int forked(void)
{
	int st = 0;
	pid_t p;

	fflush(stdout);
	p = fork();
	if (p == 0)
		_exit(child_work());
	parent_work();
	waitpid(p, &st, 0);
	return WEXITSTATUS(st);
}

/*
 * fork-areas: parent and child each make new patch areas after the fork, the
 * child after the parent has made and run its own, and the parent then runs
 * its own again: the child's areas must not land on the parent's, which the
 * two share (agent/pool.c).  Called through a pointer: the look-ahead would
 * instrument a direct callee before the fork.
 */
KEEP int parent_late(void) { return leaf(3) * 2; }
KEEP int child_late(void) { return mid(10) + mid(20); }
static int (*volatile late_fn[2])(void) = { parent_late, child_late };

KEEP int fork_areas(void)
{
	int go[2], done[2], st = 0, a, b;
	char c = 0;
	pid_t p;

	if (pipe(go) || pipe(done))
		return -1;
	fflush(stdout);
	p = fork();
	if (p == 0) {
		int r;

		if (read(go[0], &c, 1) != 1)
			_exit(99);
		r = late_fn[1]();
		if (write(done[1], &c, 1) != 1)
			_exit(98);
		_exit(r & 0x7f);
	}
	a = late_fn[0]();
	if (write(go[1], &c, 1) != 1 || read(done[0], &c, 1) != 1)
		return -1;
	b = late_fn[0]();
	waitpid(p, &st, 0);
	printf("parent %d %d, child %d\n", a, b, WEXITSTATUS(st));
	return 0;
}

/*
 * fork-hints: 20 children forked one after the other, each calling a
 * function the parent never calls (through a pointer: no look-ahead), then
 * exiting without an exec.  The first child instruments it; the parent, told
 * so, instruments it before its next fork (agent/instrument.c, the hints),
 * and the later children inherit the patched code.
 */
KEEP int child_only(int i) { return leaf(i) + leaf(i + 1); }
static int (*volatile child_only_fn)(int) = child_only;

KEEP int fork_hints(void)
{
	int sum = 0;

	fflush(stdout);
	for (int i = 0; i < 20; i++) {
		int st = 0;
		pid_t p = fork();

		if (p == 0)
			_exit(child_only_fn(i) & 0x7f);
		if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st))
			return -1;
		sum += WEXITSTATUS(st);
	}
	printf("children said %d\n", sum);
	return 0;
}

/*
 * fork-stubs: a pre-forking server.  The parent listens on a loopback port,
 * forks two workers before any activation, and connects to itself twice.
 * Each worker waits in accept() at the bottom of a chain of its own
 * (fa1 -> fa2, fb1 -> fb2); under --on accept its accept activates it, and
 * the frames of its chain get return stubs.  Both workers hold on after
 * their accept until both have been activated, then return through their
 * stubs.  A worker's stubs must land in memory of its own, not in the
 * parent's pool the two share after the fork (agent/pool.c, point 4):
 * there the second worker's would send the first one's returns into the
 * other chain.  Worker a computes (1 + 1) * 3 + 7, worker b (2 + 1) * 5 +
 * 11, each its exit status.
 */
static int fs_listen = -1, fs_ready[2];

static int fs_accept(int x)
{
	int c = accept(fs_listen, NULL, NULL);
	char go;

	if (c < 0)
		return -100;
	/* activated (or natively, accepted): say so, then hold on for "go" */
	if (write(fs_ready[1], "a", 1) != 1 || read(c, &go, 1) != 1)
		return -100;
	close(c);
	return x + 1;
}
static int (*volatile fs_accept_fn)(int) = fs_accept;
KEEP int fa2(int x) { return fs_accept_fn(x) * 3; }
KEEP int fa1(int x) { return fa2(x) + 7; }
KEEP int fb2(int x) { return fs_accept_fn(x) * 5; }
KEEP int fb1(int x) { return fb2(x) + 11; }

KEEP int fork_stubs(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int c[2], st[2] = { 0, 0 };
	pid_t w[2];
	char got;

	fflush(stdout);
	fs_listen = socket(AF_INET, SOCK_STREAM, 0);
	if (fs_listen < 0 || bind(fs_listen, (struct sockaddr *)&sa, sizeof sa) != 0 ||
	    listen(fs_listen, 4) != 0 || getsockname(fs_listen, (struct sockaddr *)&sa, &len) != 0 ||
	    pipe(fs_ready) != 0)
		return -1;
	for (int k = 0; k < 2; k++) {
		w[k] = fork();
		if (w[k] == 0)
			_exit((k ? fb1(2) : fa1(1)) & 0xff);
		if (w[k] < 0)
			return -1;
	}
	/* both connected and both workers past their accept before either
	 * goes on */
	for (int k = 0; k < 2; k++) {
		c[k] = socket(AF_INET, SOCK_STREAM, 0);
		if (c[k] < 0 || connect(c[k], (struct sockaddr *)&sa, sizeof sa) != 0 ||
		    read(fs_ready[0], &got, 1) != 1)
			return -1;
	}
	for (int k = 0; k < 2; k++)
		if (write(c[k], "g", 1) != 1)
			return -1;
	for (int k = 0; k < 2; k++)
		if (waitpid(w[k], &st[k], 0) != w[k] || !WIFEXITED(st[k]))
			return -1;
	printf("fork-stubs workers %d %d\n", WEXITSTATUS(st[0]), WEXITSTATUS(st[1]));
	return 0;
}

KEEP int threads(void)
{
	pthread_t t[4];
	long sum = 0;

	for (long i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, i == 3 ? worker_exit : worker, (void *)i);
	for (int i = 0; i < 4; i++) {
		void *r;
		pthread_join(t[i], &r);
		sum += (long)r;
	}
	return (int)sum;
}

/*
 * Activation in mid-run (--on 'timer S' / signal): when it comes, main is
 * inside outer() -> middle(), one thread is blocked in read() and one in
 * nanosleep().  The sleepers must not notice (no EINTR, the full sleep) and
 * everything they do after waking is traced.
 */
static int wake_pipe[2];

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

KEEP int after_wake(int x) { return leaf(x) + 1; }

KEEP void *reader(void *arg)
{
	char c;

	(void)arg;
	if (read(wake_pipe[0], &c, 1) != 1)
		return (void *)-1L;
	return (void *)(long)after_wake(c);
}

KEEP void *napper(void *arg)
{
	struct timespec d = { 1, 200000000 };
	double t0 = now_s();

	(void)arg;
	if (nanosleep(&d, NULL) != 0 || now_s() - t0 < 1.2)
		return (void *)-1L;
	return (void *)(long)after_wake(2);
}

KEEP long inner(long i) { return leaf((int)(i & 7)); }

KEEP long middle(double seconds)
{
	double end = now_s() + seconds;
	long s = 0;

	struct timespec ms = { 0, 1000000 };

	while (now_s() < end) {
		for (int i = 0; i < 100; i++)
			s += inner(i) & 1;
		nanosleep(&ms, NULL);
	}
	return s;
}

KEEP long outer(double seconds) { return middle(seconds) > 0; }

KEEP void after(void) { leaf(5); }

KEEP int midrun(void)
{
	pthread_t r, n;
	void *rv, *nv;
	long o;

	if (pipe(wake_pipe) != 0)
		return -1;
	pthread_create(&r, NULL, reader, NULL);
	pthread_create(&n, NULL, napper, NULL);
	o = outer(0.8);
	after();
	if (write(wake_pipe[1], "\x05", 1) != 1)
		return -1;
	pthread_join(r, &rv);
	pthread_join(n, &nv);
	return (int)o + (int)(long)rv * 10 + (int)(long)nv * 100;
}

/* exec: the process becomes itself running "nest" (from main, or from a
 * second thread: then that thread takes over the process). */
static char self_exe[4096];

KEEP int do_exec(void)
{
	fflush(stdout);
	execl(self_exe, self_exe, "nest", (char *)0);
	return -1;
}

KEEP void *exec_thread(void *arg)
{
	(void)arg;
	leaf(4);
	return (void *)(long)do_exec();
}

KEEP int exec_from_thread(void)
{
	pthread_t t;
	void *r;

	pthread_create(&t, NULL, exec_thread, NULL);
	pthread_join(t, &r);
	return (int)(long)r;
}

/* swapcontext: a coroutine on its own stack yields three times. */
static ucontext_t main_ctx, co_ctx;
static int co_value;

KEEP int co_work(int i) { return leaf(i) + i; }

KEEP void coroutine(void)
{
	for (int i = 1; i <= 3; i++) {
		co_value += co_work(i);
		swapcontext(&co_ctx, &main_ctx);
	}
}

KEEP int contexts(void)
{
	static char stack[64 * 1024];
	int rounds = 0;

	getcontext(&co_ctx);
	co_ctx.uc_stack.ss_sp = stack;
	co_ctx.uc_stack.ss_size = sizeof stack;
	co_ctx.uc_link = &main_ctx;
	makecontext(&co_ctx, coroutine, 0);
	for (int i = 0; i < 4; i++) {
		swapcontext(&main_ctx, &co_ctx);
		rounds += leaf(1);
	}
	return co_value * 10 + rounds;
}

/* daemon(): the parent exits at once; the daemon goes on (traced) and
 * leaves a file to say it did. */
KEEP int daemon_work(const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fprintf(f, "daemon %d\n", leaf(3) + top(1));
	return fclose(f);
}

/*
 * Short call sites, written in assembly so their shape is certain: a
 * 2-byte `call *%rcx` with 130 bytes of straight code on both sides (no
 * dead padding within a rel8 jump: the analyser relocates the 6 bytes of
 * instructions before it with it), then a 2-byte `call *%rbx` right after
 * another call (nothing before it can move: a trap, put back once hot),
 * then a `call *%rcx` after a rip-relative load (a window whose copy must
 * be re-aimed).  And callees that
 * return a result in the flags: the caller reads them right after the call,
 * through a 5-byte direct site and a relocated short one.
 */
int short_sites(int (*f)(int), int x);
int (*short_fn)(int) = leaf;
unsigned long flags_probe(void);

__asm__(
	".text\n"
	".globl short_sites\n"
	".type short_sites,@function\n"
	"short_sites:\n"
	"	.cfi_startproc\n"
	"	push %rbx\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	push %r12\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	sub $8,%rsp\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	mov %rdi,%rbx\n"
	"	mov %esi,%r12d\n"
	"	.rept 34\n"
	"	add $1,%r8d\n"
	"	.endr\n"
	"	mov %r12d,%edi\n"
	"	mov %rbx,%rcx\n"
	"	call *%rcx\n"
	"	mov %eax,%r12d\n"
	"	mov %eax,%edi\n"
	"	call leaf\n"
	"	mov %eax,%edi\n"
	"	call *%rbx\n"
	"	add %r12d,%eax\n"
	"	mov %eax,%r12d\n"
	"	mov %eax,%edi\n"
	"	mov short_fn(%rip),%rcx\n"
	"	call *%rcx\n"
	"	add %r12d,%eax\n"
	"	.rept 34\n"
	"	add $1,%r8d\n"
	"	.endr\n"
	"	add $8,%rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %r12\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %rbx\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	ret\n"
	"	.cfi_endproc\n"
	".size short_sites, .-short_sites\n"
	"\n"
	/* OF SF CF set, ZF clear: 0x7fffffff + 1, then stc. */
	".globl flag_setter\n"
	".type flag_setter,@function\n"
	"flag_setter:\n"
	"	.cfi_startproc\n"
	"	mov $0x7fffffff,%eax\n"
	"	add $1,%eax\n"
	"	stc\n"
	"	ret\n"
	"	.cfi_endproc\n"
	".size flag_setter, .-flag_setter\n"
	"\n"
	/* ZF PF set, the others clear: 0 - 0. */
	".globl flag_zero\n"
	".type flag_zero,@function\n"
	"flag_zero:\n"
	"	.cfi_startproc\n"
	"	xor %eax,%eax\n"
	"	sub %eax,%eax\n"
	"	ret\n"
	"	.cfi_endproc\n"
	".size flag_zero, .-flag_zero\n"
	"\n"
	".globl flags_probe\n"
	".type flags_probe,@function\n"
	"flags_probe:\n"
	"	.cfi_startproc\n"
	"	push %rbx\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	call flag_setter\n"
	"	pushf\n"
	"	pop %rbx\n"
	"	and $0x8d5,%ebx\n"
	"	shl $16,%rbx\n"
	"	.rept 34\n"
	"	add $1,%r8d\n"
	"	.endr\n"
	"	lea flag_zero(%rip),%rcx\n"
	"	mov %rcx,%rdx\n"
	"	xor %esi,%esi\n"
	"	call *%rdx\n"
	"	pushf\n"
	"	pop %rax\n"
	"	and $0x8d5,%eax\n"
	"	or %rbx,%rax\n"
	"	.rept 34\n"
	"	add $1,%r8d\n"
	"	.endr\n"
	"	pop %rbx\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	ret\n"
	"	.cfi_endproc\n"
	".size flags_probe, .-flags_probe\n");

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "nest";
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);

	self_exe[n > 0 ? n : 0] = '\0';

	if (strcmp(what, "nest") == 0) {
		printf("%d\n", top(1) + top(2));
	} else if (strcmp(what, "recursion") == 0) {
		printf("%d %d\n", fact(4), even(3));
	} else if (strcmp(what, "tail") == 0) {
		int t = tail_caller(4), d = dispatch(0, 5);

		printf("%d %d\n", t, d + dispatch(1, 6));
	} else if (strcmp(what, "exit") == 0) {
		printf("exiting\n");
		deep2(7);
	} else if (strcmp(what, "abort") == 0) {
		crash2();
	} else if (strcmp(what, "segv") == 0) {
		segv_outer();
	} else if (strcmp(what, "fork") == 0) {
		printf("child said %d\n", forked());
	} else if (strcmp(what, "fork-areas") == 0) {
		return fork_areas() != 0;
	} else if (strcmp(what, "fork-hints") == 0) {
		return fork_hints() != 0;
	} else if (strcmp(what, "fork-stubs") == 0) {
		return fork_stubs() != 0;
	} else if (strcmp(what, "longjmp") == 0) {
		printf("longjmp %d\n", jumper());
	} else if (strcmp(what, "signals") == 0) {
		printf("alarms %d\n", signals());
	} else if (strcmp(what, "spawn") == 0) {
		printf("spawn %d\n", spawn_all());
	} else if (strcmp(what, "system") == 0) {
		printf("system %d\n", system_signals());
		system_cancel();
	} else if (strcmp(what, "dl") == 0) {
		void *h = dlopen("libm.so.6", RTLD_NOW);

		printf("tail %s, call %s, dlopen %s\n", next_sym_tail("puts") ? "found" : "missing",
		       next_sym_call("puts") ? "found" : "missing", h ? "ok" : dlerror());
	} else if (strcmp(what, "unwind-bt") == 0) {
		return unwinder(0) ? 1 : 3;
	} else if (strcmp(what, "unwind-dl") == 0) {
		return unwinder(1) ? 1 : 3;
	} else if (strcmp(what, "threads") == 0) {
		printf("%d\n", threads());
	} else if (strcmp(what, "churn") == 0) {
		printf("churn %d\n", churn(0));
	} else if (strcmp(what, "ends-barrier") == 0) {
		printf("ended %d\n", ends_at_barrier());
	} else if (strcmp(what, "churn-detached") == 0) {
		printf("churn %d\n", churn(1));
	} else if (strcmp(what, "ucontext") == 0) {
		printf("contexts %d\n", contexts());
	} else if (strcmp(what, "daemon") == 0 && argc > 2) {
		printf("daemonizing\n");
		fflush(stdout);
		if (daemon(0, 0) != 0)
			return 1;
		return daemon_work(argv[2]) == 0 ? 3 : 4;
	} else if (strcmp(what, "exec") == 0) {
		printf("exec failed: %d\n", do_exec());
	} else if (strcmp(what, "exec-thread") == 0) {
		printf("exec failed: %d\n", exec_from_thread());
	} else if (strcmp(what, "midrun") == 0) {
		printf("midrun %d\n", midrun());
	} else if (strcmp(what, "short") == 0) {
		/* The first call meets the window's int3; by the second the
		 * control thread has turned it into a jump (relocate.c). */
		int a = short_sites(leaf, 5);

		usleep(100000);
		printf("short %d %d\n", a, short_sites(leaf, 6));
	} else if (strcmp(what, "short-hot") == 0) {
		long sum = 0;

		for (int i = 0; i < 2000; i++)
			sum += short_sites(leaf, i);
		usleep(300000);         /* the control thread puts the trap back */
		for (int i = 0; i < 2000; i++)
			sum += short_sites(leaf, i);
		printf("short-hot %ld\n", sum);
	} else if (strcmp(what, "flags") == 0) {
		printf("flags %#lx\n", flags_probe());
	} else if (strcmp(what, "paced") == 0 && argc > 2) {
		long n = atol(argv[2]), sum = 0;

		for (long i = 0; i < n; i++)
			sum += paced((int)i);
		printf("paced %ld %ld\n", n, sum);
	} else if (strcmp(what, "spin") == 0) {
		printf("spinning\n");
		fflush(stdout);
		spin();
	} else {
		fprintf(stderr, "unknown scenario %s\n", what);
		return 2;
	}
	return 3;
}
