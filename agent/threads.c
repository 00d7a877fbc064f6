/*
 * threads.c — threads created after activation are traced from their start
 * routine on; so are coroutines started by makecontext (below).
 *
 * The agent interposes pthread_create (it comes first in the lookup order,
 * through LD_PRELOAD) and starts the thread in ag_thread_start instead, which
 * records the start routine as the thread's root call, instruments it (so
 * tracing propagates from there) and calls it.  Before activation, and for
 * start routines outside the traced modules, the wrapper only passes the
 * call on: the thread runs exactly as it would have.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

typedef struct start_ctx {
	void *(*start)(void *);
	void *arg;
	ag_module *m;
	uint32_t func;
	bool may_trace;          /* its creator's (--threads event) */
	bool traced;             /* false: only its belief about SIGTRAP is passed on */
	uint8_t trap_view;       /* its creator believed SIGTRAP blocked (signals.c) */
	ag_start_slot slot;      /* while the C library starts it (patch.c) */
} start_ctx;

static create_fn real_create;

/* An untraced thread's start routine; its end is announced all the same:
 * code may be written meanwhile (patch.c). */
static void *start_untraced(const start_ctx *c)
{
	void *ret = c->start(c->arg);

	if (ag_active())
		ag_thread_ending();
	return ret;
}

static void *ag_thread_start(void *p)
{
	start_ctx c = *(start_ctx *)p;
	trace_ring_header *ring;
	uint32_t site;
	void *ret;

	ag_start_end(c.slot, false);    /* the C library has restored its mask */
	free(p);
	ag_trap_view_set(c.trap_view);
	if (!c.traced)
		return start_untraced(&c);
	ag_may_trace_set(c.may_trace);
	if (!ag_may_trace())
		return start_untraced(&c);
	ring = ag_enter();
	if (!ring)
		ring = ag_ring_create();
	if (!ring) {            /* a thread that cannot read the TSC, say (tsc.c) */
		ag_leave(ring);
		return start_untraced(&c);
	}
	site = ag_site_root(c.m, c.func);
	ag_ring_put(ring, TRACE_EVENT, TRACE_EV_ACTIVATE);
	ag_ring_put(ring, TRACE_ENTRY, site);
	ag_instrument_root(c.m, c.func);
	ag_leave(ring);
	ret = c.start(c.arg);
	if (ag_active())
		ag_thread_ending();     /* the C library's end of a thread (patch.c) */
	ring = ag_enter();
	if (ag_active())
		ag_ring_put(ring, TRACE_EXIT, site);
	ag_budget_thread_end(ring);
	ag_leave(ring);
	return ret;
}

int ag_real_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *),
			   void *arg)
{
	if (!real_create)
		real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
	return real_create ? real_create(th, attr, start, arg) : EAGAIN;
}

/* pthread_exit: the thread's end, announced (patch.c); the C library's
 * then unwinds to its start, past ag_thread_start. */
AG_EXPORT void pthread_exit(void *ret)
{
	static void (*real_exit)(void *);

	if (!real_exit)
		real_exit = (void (*)(void *))dlsym(RTLD_NEXT, "pthread_exit");
	ag_unwind_need(true, "pthread_exit");   /* it unwinds: unwind.c, step 3 */
	if (ag_active())
		ag_thread_ending();
	real_exit(ret);
	__builtin_unreachable();
}

/* pthread_cancel: the C library loads libgcc_s here, and the thread
 * cancelled unwinds through its areas (unwind.c, step 3). */
AG_EXPORT int pthread_cancel(pthread_t th)
{
	static int (*real_cancel)(pthread_t);

	if (!real_cancel)
		real_cancel = (int (*)(pthread_t))dlsym(RTLD_NEXT, "pthread_cancel");
	ag_unwind_need(true, "pthread_cancel");
	return real_cancel ? real_cancel(th) : ESRCH;
}

AG_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *),
			     void *arg)
{
	/* The new thread inherits its creator's mask from the kernel, and
	 * so its belief about SIGTRAP (which the kernel mask no longer shows)
	 * from the agent. */
	uint8_t view = ag_trap_view_get();
	bool traced = false;
	ag_module *m = NULL;
	uint32_t func = CA_NONE;
	start_ctx *c;
	int rc;

	if (ag_active()) {
		m = ag_module_of((uint64_t)(uintptr_t)start);
		func = m ? ca_func_at(m->ca, (uint64_t)(uintptr_t)start - m->bias) : CA_NONE;
		traced = func != CA_NONE &&
			 ca_module_funcs(m->ca, NULL)[func].addr == (uint64_t)(uintptr_t)start - m->bias;
	}
	/* Active, code may be written while the thread starts: its start is
	 * announced (patch.c), and it says when it is in ag_thread_start. */
	if ((!traced && !view && !ag_active()) || !(c = malloc(sizeof *c)))
		return ag_real_pthread_create(th, attr, start, arg);
	*c = (start_ctx){ start, arg, m, func, ag_may_trace_get(), traced, view, { -1, 0 } };
	if (ag_active()) {
		ag_start_slot s[2];

		ag_start_begin(s, 2);
		c->slot = s[1];
		rc = ag_real_pthread_create(th, attr, ag_thread_start, c);
		ag_start_end(s[0], true);
		if (rc != 0)
			ag_start_end(s[1], false);
	} else {
		rc = ag_real_pthread_create(th, attr, ag_thread_start, c);
	}
	if (rc != 0)
		free(c);
	return rc;
}

/*
 * makecontext: like a thread's start routine, a coroutine's function is
 * entered by no call site.  The agent's interposer starts it through
 * ag_context_start, which records it as a root call and instruments it.
 * makecontext passes int arguments; the wrapper takes the context record's
 * address as two of them and passes on the program's, up to four (with more
 * the function is started directly, untraced).
 */
typedef int (*makecontext_fn)(ucontext_t *, void (*)(void), int, ...);

typedef struct ctx_start {
	void (*func)(void);
	ag_module *m;
	uint32_t f;
	const ucontext_t *link;  /* where the context goes when func returns */
} ctx_start;

/* A context event in the ring of a thread that is tracing. */
static void note_context(uint32_t event, const void *ucp)
{
	trace_ring_header *ring = ag_enter();

	if (ring && ag_active())
		ag_ring_put_key(ring, event, trace_ctx_key(ucp));
	ag_leave(ring);
}

static void ag_context_start(unsigned hi, unsigned lo, int a0, int a1, int a2, int a3)
{
	ctx_start *c = (ctx_start *)(uintptr_t)((uint64_t)hi << 32 | lo);
	trace_ring_header *ring = ag_enter();
	uint32_t site = 0;

	if (ag_active() && !ag_tls_quiet) {
		if (!ring)
			ring = ag_ring_create();
		site = ag_site_root(c->m, c->f);
		ag_ring_put(ring, TRACE_ENTRY, site);
		ag_instrument(c->m, c->f);
	}
	ag_leave(ring);
	((void (*)(int, int, int, int))c->func)(a0, a1, a2, a3);
	ring = ag_enter();
	if (site && ag_active())
		ag_ring_put(ring, TRACE_EXIT, site);
	ag_leave(ring);
	/* The C library goes on to uc_link (its internal setcontext). */
	if (c->link)
		note_context(TRACE_EV_CTX_LOAD, c->link);
}

#define CTX_MAX_ARGS 32

AG_EXPORT void makecontext(ucontext_t *ucp, void (*func)(void), int argc, ...)
{
	static makecontext_fn real;
	int a[CTX_MAX_ARGS] = { 0 };
	ag_module *m = ag_module_of((uint64_t)(uintptr_t)func);
	uint32_t f = m ? ca_func_at(m->ca, (uint64_t)(uintptr_t)func - m->bias) : CA_NONE;
	ctx_start *c = NULL;
	va_list ap;

	if (!real)
		real = (makecontext_fn)dlsym(RTLD_NEXT, "makecontext");
	if (!real)
		return;
	if (argc > CTX_MAX_ARGS)
		ag_log("makecontext with %d arguments: only %d are passed on", argc, CTX_MAX_ARGS);
	va_start(ap, argc);
	for (int i = 0; i < argc && i < CTX_MAX_ARGS; i++)
		a[i] = va_arg(ap, int);
	va_end(ap);
	if (argc <= 4 && f != CA_NONE &&
	    ca_module_funcs(m->ca, NULL)[f].addr == (uint64_t)(uintptr_t)func - m->bias)
		c = ag_alloc(sizeof *c);
	if (!c) {
		/* The call as the program made it: makecontext reads argc of them. */
		real(ucp, func, argc > CTX_MAX_ARGS ? CTX_MAX_ARGS : argc, a[0], a[1], a[2], a[3],
		     a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
		     a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26],
		     a[27], a[28], a[29], a[30], a[31]);
		note_context(TRACE_EV_CTX_NEW, ucp);
		return;
	}
	*c = (ctx_start){ func, m, f, ucp->uc_link };
	real(ucp, (void (*)(void))ag_context_start, 6, (unsigned)((uint64_t)(uintptr_t)c >> 32),
	     (unsigned)(uintptr_t)c, a[0], a[1], a[2], a[3]);
	note_context(TRACE_EV_CTX_NEW, ucp);
}

/*
 * getcontext, setcontext, swapcontext (x86_64/context.S) come here first:
 * the context events that tell the reader which stack the thread goes on
 * on (trace_format.h), then the C library's function.
 */
uint64_t ag_context_note(unsigned which, const void *a, const void *b)
{
	static const char *const names[] = { "getcontext", "setcontext", "swapcontext" };
	static void *const ours[] = { (void *)getcontext, (void *)setcontext, (void *)swapcontext };
	static uint64_t real[3];
	uint64_t fn = __atomic_load_n(&real[which], __ATOMIC_RELAXED);

	if (!fn) {
		/* Found by ag_hooks_init when the agent started; without
		 * SPTRACE_DIR it never did. */
		fn = ag_hook_real((uint64_t)(uintptr_t)ours[which]);
		if (!fn)
			fn = (uint64_t)(uintptr_t)dlsym(RTLD_NEXT, names[which]);
		__atomic_store_n(&real[which], fn, __ATOMIC_RELAXED);
	}
	if (which == AG_CTX_GET || which == AG_CTX_SWAP)
		note_context(TRACE_EV_CTX_SAVE, a);
	if (which == AG_CTX_SET)
		note_context(TRACE_EV_CTX_LOAD, a);
	if (which == AG_CTX_SWAP)
		note_context(TRACE_EV_CTX_LOAD, b);
	return fn;
}

/*
 * fork: the child is a copy with the same patched code, so it goes on
 * tracing -- into its own ring: the parent's ring file is shared memory and
 * the child must never write there, not even from the libc code that runs
 * in the child before the atfork handlers.  So the forking thread stops
 * recording in `prepare` (ag_enter: its TLS ring is NULL, nested slow paths
 * skip), the parent takes its ring back afterwards, and the child starts
 * without one: its first record creates ring.<child tid>.  Site ids come
 * from the counter shared through the sites file.  The child shares the
 * patch areas in use with its parent and makes its own beside them (the
 * return stubs are copied) -- the instrument lock is held from `prepare` to
 * the end so that no area or patch is made meanwhile -- and opens its own
 * /proc/self/mem (see pool.c, patch.c).  Nor does
 * the control thread walk the loader's module list across a fork (it would
 * leave the child the loader's lock held: modules.c).  The handlers' work
 * in the parent is the agent's own time (AGENT_BEGIN/END, trace_format.h):
 * the pools' copies are system calls a kernel trace would show.
 */
static __thread trace_ring_header *ring_before_fork __attribute__((tls_model("initial-exec")));

static void prepare_fork(void)
{
	ring_before_fork = ag_enter();
	if (ring_before_fork)
		ag_ring_put(ring_before_fork, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
	ag_instrument_hints_apply();    /* before the locks: it takes them */
	ag_modules_fork_lock();
	ag_instrument_lock();
	ag_pools_snapshot();
	ag_fds_fork_lock();
	if (ring_before_fork)
		ag_ring_put(ring_before_fork, TRACE_EVENT, TRACE_EV_AGENT_END);
}

static void parent_after_fork(void)
{
	if (ring_before_fork)
		ag_ring_put(ring_before_fork, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
	ag_fds_fork_unlock();
	ag_pools_snapshot_done();
	ag_instrument_unlock();
	ag_modules_fork_unlock();
	if (ring_before_fork)
		ag_ring_put(ring_before_fork, TRACE_EVENT, TRACE_EV_AGENT_END);
	ag_leave(ring_before_fork);
}

/* This process's pid: a vfork child, which runs on its parent's memory
 * without the fork handlers, sees its parent's (exec.c). */
pid_t ag_self_pid;

static void proc_cache_after_fork(void);

static void child_after_fork(void)
{
	ag_self_pid = getpid();
	ag_fds_fork_unlock();
	proc_cache_after_fork();
	ag_patch_after_fork();
	ag_pools_after_fork();
	ag_modules_after_fork();
	ag_instrument_after_fork();
	ag_instrument_unlock();
	ag_forked_child();
	ag_msgs_forked();
	ag_leave(NULL);
}

int ag_threads_init(void)
{
	ag_self_pid = getpid();
	ag_instrument_hints_init();
	return pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
}

/*
 * The /proc files the agent reads again and again (the task list, each
 * thread's syscall line) stay open, at high numbers (fds.c), and are read
 * from offset 0 each time.  Opened anew each time, each took for a moment
 * the lowest free number -- the one the program's own open() on another
 * thread was about to get: its descriptors came out numbered differently
 * than natively (relocation rounds and activations read them every few
 * milliseconds).  A thread's file is opened once, the first time it is
 * looked at (the threads there when the control thread starts: then, before
 * the program goes on), and dropped when the thread is gone.
 */
#define PROC_CACHE 512
static volatile int task_dir_fd = -1;
static volatile int task_dir_busy;
static struct {
	volatile int tid;          /* 0: free */
	volatile int fd;
} syscall_fds[PROC_CACHE];

/* The task directory, rewound, for the caller alone (-1: busy or none; the
 * caller then opens its own). */
static int task_dir_take(void)
{
	if (__atomic_exchange_n(&task_dir_busy, 1, __ATOMIC_ACQUIRE))
		return -1;
	if (task_dir_fd < 0) {
		task_dir_fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		ag_fd_keep(&task_dir_fd, "/proc/self/task", O_RDONLY | O_DIRECTORY);
	}
	if (task_dir_fd >= 0 && lseek(task_dir_fd, 0, SEEK_SET) == 0)
		return task_dir_fd;
	__atomic_store_n(&task_dir_busy, 0, __ATOMIC_RELEASE);
	return -1;
}

/* Thread tid's syscall file, kept open (*kept; else, the cache full, the
 * caller closes it); -1 if it cannot be opened. */
static int syscall_fd(int tid, bool *kept)
{
	char path[64];
	int fd;

	*kept = true;
	for (int i = 0; i < PROC_CACHE; i++)
		if (__atomic_load_n(&syscall_fds[i].tid, __ATOMIC_ACQUIRE) == tid &&
		    syscall_fds[i].fd >= 0)
			return syscall_fds[i].fd;
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	for (int i = 0; i < PROC_CACHE; i++) {
		int free_ = 0;

		if (syscall_fds[i].tid == 0 &&
		    __atomic_compare_exchange_n(&syscall_fds[i].tid, &free_, -1, false,
						__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			syscall_fds[i].fd = fd;
			ag_fd_keep(&syscall_fds[i].fd, NULL, 0);
			fd = syscall_fds[i].fd;
			__atomic_store_n(&syscall_fds[i].tid, tid, __ATOMIC_RELEASE);
			return fd;
		}
	}
	*kept = false;
	return fd;
}

/* Thread tid is gone: its file goes. */
static void syscall_fd_forget(int tid)
{
	for (int i = 0; i < PROC_CACHE; i++) {
		int t = tid;

		if (__atomic_compare_exchange_n(&syscall_fds[i].tid, &t, -1, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			ag_fd_drop(syscall_fds[i].fd);
			syscall_fds[i].fd = -1;
			__atomic_store_n(&syscall_fds[i].tid, 0, __ATOMIC_RELEASE);
		}
	}
}

/* A forked child: the files are its parent's threads' ("self" was the
 * parent when they were opened). */
static void proc_cache_after_fork(void)
{
	task_dir_busy = 0;
	if (task_dir_fd >= 0) {
		ag_fd_drop(task_dir_fd);
		task_dir_fd = -1;
	}
	for (int i = 0; i < PROC_CACHE; i++) {
		if (syscall_fds[i].tid > 0)
			ag_fd_drop(syscall_fds[i].fd);
		syscall_fds[i].tid = 0;
		syscall_fds[i].fd = -1;
	}
}

static int preopen_one(int tid, void *arg)
{
	bool kept;
	int fd = syscall_fd(tid, &kept);

	(void)arg;
	if (fd >= 0 && !kept)
		close(fd);
	return 0;
}

/* The control thread, as it starts: the files of the threads there now. */
void ag_threads_preopen(void)
{
	ag_for_other_threads(preopen_one, NULL);
}

/* A start that failed (control.c, point 4): they go. */
void ag_threads_preopen_undo(void)
{
	proc_cache_after_fork();
}

/*
 * fn(tid, arg) for every thread of the process but the calling one and the
 * agent's control thread, until fn returns non-zero.  Returns how many
 * threads it was called for.
 */
int ag_for_other_threads(int (*fn)(int tid, void *arg), void *arg)
{
	/* getdents64 into a buffer on the stack, not opendir: callers hold the
	 * instrument lock, and a thread holding malloc's lock may be waiting
	 * for it. */
	struct linux_dirent64 {
		uint64_t d_ino;
		int64_t d_off;
		unsigned short d_reclen;
		unsigned char d_type;
		char d_name[];
	};
	char buf[4096] __attribute__((aligned(8)));
	int self = (int)syscall(SYS_gettid), ctl = ag_control_tid(), n = 0, stop = 0;
	int fd = task_dir_take();
	bool cached = fd >= 0;
	long got;

	if (!cached)
		fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	while (fd >= 0 && !stop && (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
		for (long off = 0; off < got && !stop;) {
			const struct linux_dirent64 *de = (const void *)(buf + off);
			int tid = atoi(de->d_name);

			off += de->d_reclen;
			if (tid <= 0 || tid == self || tid == ctl)
				continue;
			n++;
			stop = fn(tid, arg);
		}
	}
	if (cached)
		__atomic_store_n(&task_dir_busy, 0, __ATOMIC_RELEASE);
	else if (fd >= 0)
		close(fd);
	return n;
}

/*
 * Where thread `tid` stands, from /proc/self/task/T/syscall: 1 when it is
 * blocked in the kernel (*nr the system call, -1 for none: a page fault, a
 * stop), *pc the address it returns to in user space; 0 when it is running
 * or runnable (the kernel cannot say where); -1 when it is gone.
 */
int ag_thread_where(int tid, long *nr, uint64_t *pc)
{
	char buf[512];
	unsigned long n_, args[6], sp, pc_;
	ssize_t n;
	bool kept;
	int fd = syscall_fd(tid, &kept), err;

	n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
	err = errno;
	if (fd >= 0 && !kept)
		close(fd);
	errno = err;
	if (n <= 0) {
		/* Gone: its file goes.  EAGAIN (the thread woke up while the
		 * kernel looked) keeps it: reopening would take a low number
		 * for a moment, the one the program's next open() gets. */
		if (n == 0 || errno != EAGAIN)
			syscall_fd_forget(tid);
		return -1;
	}
	buf[n] = '\0';
	if (strncmp(buf, "running", 7) == 0)
		return 0;
	if (sscanf(buf, "-1 %lx %lx", &sp, &pc_) == 2) {
		*nr = -1;
		*pc = pc_;
		return 1;
	}
	if (sscanf(buf, "%lu %lx %lx %lx %lx %lx %lx %lx %lx", &n_, &args[0], &args[1], &args[2],
		   &args[3], &args[4], &args[5], &sp, &pc_) != 9)
		return -1;
	*nr = (long)n_;
	*pc = pc_;
	return 1;
}

/* A SIGTRAP for thread tid, code SI_QUEUE, carrying `magic` (the agent's
 * requests: activation walks, relocated windows).  False if not queued. */
bool ag_queue_sigtrap(int tid, const void *magic)
{
	siginfo_t si;

	memset(&si, 0, sizeof si);
	si.si_signo = SIGTRAP;
	si.si_code = SI_QUEUE;
	si.si_pid = getpid();
	si.si_uid = getuid();
	si.si_value.sival_ptr = (void *)magic;
	return syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGTRAP, &si) == 0;
}
