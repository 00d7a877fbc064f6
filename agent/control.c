/*
 * control.c — how `sptrace stop PID` reaches the agent.
 *
 * The agent keeps a FIFO, DIR/control, and a control thread blocked reading
 * it (with the program's asynchronous signals blocked, so they never land
 * there; no signal of the program's is taken over).  `sptrace stop` finds DIR
 * through the registry link $XDG_RUNTIME_DIR-or-/tmp/sptrace-<uid>/<pid>-<start>
 * (registry.h: only in a dir no other user could have written) and writes a
 * command line into the FIFO:
 *
 * Between commands it looks every 200 ms for modules loaded since (dlopen)
 * and analyses them -- off the program's threads, as the slow paths must not
 * allocate or wait for a disassembler -- and turns relocated windows that
 * are still reached through their int3 into jumps (relocate.c).
 *
 *   stop     restore every patched byte (the text of every module is then
 *            identical to its file) and go dormant; meta gets a "stopped"
 *            line.  Threads inside patch areas finish their calls there: the
 *            pools stay mapped.  The agent can be activated again.
 *   activate start tracing now, every thread from where it stands
 *            (activate.c); meta gets an "activated" line.
 *   expect tcp SRC SPORT DST DPORT OFFSET
 *            spdaemon: the thread whose receive on that connection reaches
 *            past OFFSET starts tracing (propagate.c, point 5).
 *
 * With `--on timer S` the same activation happens S seconds after start.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"
#include "registry.h"

static char fifo[4200];
static char xdg[4096];            /* XDG_RUNTIME_DIR when the agent started */
static char reg_name[64];         /* <pid>-<start time>, registered in reg_fd */
static volatile int reg_fd = -1;  /* the registry dir, checked (registry.h) */
static volatile int wake_fd = -1; /* ag_control_wake */
static volatile int wake_reloc, wake_populate;  /* why it was woken */
static volatile int fifo_fd = -1;
static pid_t owner;             /* the process that registered them (not a forked child) */
static volatile int control_ready;  /* its start is done (point 3 below) */
static volatile int control_go;     /* 1: go on, -1: quit (point 4) */
static volatile int control_tid;
static volatile int serving;      /* in its loop: it serves creds.c's mirrors */
static pthread_t control_th;
static bool control_started;       /* made, and not yet let go or joined */

int ag_control_tid(void)
{
	return control_tid;
}

/* Is this process's control thread alive (not a forked child's copy of
 * the variables) and past its start? */
bool ag_control_serving(void)
{
	return __atomic_load_n(&serving, __ATOMIC_ACQUIRE) && getpid() == owner;
}

/* Wait for a command, checking for newly loaded modules meanwhile. */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One command line from the FIFO. */
static void command(const char *line, double *due)
{
	if (strcmp(line, "stop") == 0) {
		*due = -1;
		ag_deactivate("sptrace stop");
	} else if (strcmp(line, "activate") == 0) {
		*due = -1;
		ag_activate_now("sptrace activate");
	} else if (strncmp(line, "expect ", 7) == 0) {
		ag_expect_add(line + 7);        /* spdaemon: propagate.c, point 5 */
	} else {
		ag_log("control: unknown command '%.40s'", line);
	}
}

/*
 * Register: a link <pid>-<start time> to the trace directory in the user's
 * registry dir, made through the dir's descriptor once registry.h's rule 1
 * holds for it (the descriptor is kept, high, for the unlink at exit).  A
 * dir another user could write is not used: tracing goes on, but `sptrace
 * stop` will not find this process, and agent.log says why.
 */
static void register_self(void)
{
	char path[4200], why[4400];
	int rc;

	reg_fd = sp_registry_open(xdg, (unsigned)getuid(), 1, path, sizeof path, why, sizeof why);
	ag_fd_keep(&reg_fd, NULL, 0);
	if (reg_fd < 0) {
		ag_log("control: not registered: %s; 'sptrace stop %d' will not find this process",
		       why, (int)getpid());
		return;
	}
	snprintf(reg_name, sizeof reg_name, "%d-%llu", (int)getpid(), sp_proc_start_time("self"));
	/* A link of this name left behind (a process of the same pid and start
	 * time, in a registry that outlived a reboot) is replaced -- looked for
	 * only then: an unlink of a name not there cost every start a lookup,
	 * which sometimes waited for the directory's block (0.2 ms). */
	rc = symlinkat(ag_dir, reg_fd, reg_name);
	if (rc != 0 && errno == EEXIST && unlinkat(reg_fd, reg_name, 0) == 0)
		rc = symlinkat(ag_dir, reg_fd, reg_name);
	if (rc != 0) {
		ag_log("control: cannot register %s/%s: %s", path, reg_name, strerror(errno));
		reg_name[0] = '\0';
	}
}

/* Asleep until *word is no longer `was` (a raw call: errno stays the
 * program's), and the other side's wake-up. */
static void wait_word(volatile int *word, int was)
{
	while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == was)
		ag_arch_syscall6(SYS_futex, (long)word, FUTEX_WAIT_PRIVATE, was, 0, 0, 0);
}

static void set_word(volatile int *word, int v)
{
	__atomic_store_n(word, v, __ATOMIC_RELEASE);
	ag_arch_syscall6(SYS_futex, (long)word, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

/*
 * The FIFO is opened for reading and writing: the thread is then a writer
 * too, so the FIFO never reads end-of-file between two `sptrace` commands
 * and is never closed and reopened.  (It was, once each writer had gone:
 * a command written between the read that saw end-of-file and the close
 * was thrown away with the pipe's buffer -- `sptrace activate` waited in
 * vain -- and a command in that window found no reader at all.)  A read
 * may bring several commands, a line each; every write is one whole line
 * (shorter than PIPE_BUF, so never split).
 */
static void *control_main(void *arg)
{
	char buf[512];
	double due;

	(void)arg;
	/* This thread is the agent's: it records nothing, ever (the libc code
	 * it runs may be instrumented). */
	ag_enter();
	/* Named by itself (prctl), not by the starting thread: the C library
	 * names another thread through /proc/self/task/TID/comm, and with that
	 * entry the parent's wait for this process spent its time in the
	 * kernel's d_invalidate over the dead process's /proc entries (from
	 * this process's end to the parent's wait4 return, 340 us median and
	 * 518 at p75; 293 and 339 without it). */
	prctl(PR_SET_NAME, "sptrace-ctl");
	control_tid = (int)syscall(SYS_gettid);
	__atomic_store_n(&serving, 1, __ATOMIC_RELEASE);
	/* Point 2 below: the descriptors this thread keeps, opened while the
	 * program still waits for it. */
	ag_threads_preopen();
	ag_msgs_preopen();
	register_self();
	ag_thread_known();
	fifo_fd = open(fifo, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	ag_fd_keep(&fifo_fd, fifo, O_RDWR | O_NONBLOCK);
	set_word(&control_ready, 1);                                    /* 3 */
	wait_word(&control_go, 0);                                      /* 4 */
	if (__atomic_load_n(&control_go, __ATOMIC_ACQUIRE) < 0) {
		__atomic_store_n(&serving, 0, __ATOMIC_RELEASE);
		return NULL;
	}
	due = ag_timer_seconds() >= 0 ? now_s() + ag_timer_seconds() : -1;
	/* attached: membarrier's registration, left out of the start (patch.c);
	 * the agent is dormant meanwhile, and the first patch waits for it */
	ag_patch_register();
	if (fifo_fd < 0) {
		ag_log("control: cannot open %s: %s; sptrace stop will not reach this process",
		       fifo, strerror(errno));
		__atomic_store_n(&serving, 0, __ATOMIC_RELEASE);
		ag_creds_serve();       /* one posted before the store above */
		return NULL;
	}
	ag_creds_serve();
	ag_modules_load();      /* attached: the repository entries (modules.c) */
	for (;;) {
		struct pollfd p[2];
		ssize_t n;
		int r;

		p[0] = (struct pollfd){ .fd = ag_fd_checked(&fifo_fd), .events = POLLIN };
		p[1] = (struct pollfd){ .fd = wake_fd, .events = POLLIN };
		if (due >= 0) {
			double left = due - now_s();

			if (left <= 0) {
				due = -1;
				ag_activate_now("timer");
				continue;
			}
			r = poll(p, 2, left < 0.2 ? (int)(left * 1000) + 1 : 200);
		} else {
			r = poll(p, 2, 200);
		}
		ag_creds_serve();       /* first: a program thread waits for it */
		if (r > 0 && (p[1].revents & POLLIN)) {
			/* Windows wait for their jumps: let the batch fill a little
			 * (the thread that queued them is instrumenting on). */
			uint64_t v;
			struct timespec nap = { 0, 2000000 };

			if (read(wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
				ag_log("control: wake-up: %s", strerror(errno));
			if (__atomic_exchange_n(&wake_populate, 0, __ATOMIC_ACQ_REL))
				ag_rings_populate();
			if (__atomic_exchange_n(&wake_reloc, 0, __ATOMIC_ACQ_REL)) {
				nanosleep(&nap, NULL);
				ag_reloc_upgrade();
				ag_instrument_lock();
				ag_traps_retire_hot();
				ag_instrument_unlock();
			}
			if (!(p[0].revents & POLLIN))
				continue;
		}
		if (r == 0 || (r < 0 && errno == EINTR)) {
			/* Modules dlopen'd since: analysed here, off the program's
			 * threads, then traced from the next function that reaches them. */
			ag_modules_refresh();
			ag_reloc_upgrade();
			continue;
		}
		n = read(fifo_fd, buf, sizeof buf - 1);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		for (char *save, *line = strtok_r(buf, "\n", &save); line;
		     line = strtok_r(NULL, "\n", &save))
			command(line, &due);
	}
}

/* Ask the control thread to look at relocated windows soon (relocate.c):
 * from a slow path, so one async-signal-safe write. */
void ag_control_wake(void)
{
	uint64_t one = 1;

	__atomic_store_n(&wake_reloc, 1, __ATOMIC_RELEASE);
	if (wake_fd >= 0 && write(ag_fd_checked(&wake_fd), &one, sizeof one) < 0)
		return;                         /* the counter is full: awake anyway */
}

/* A ring's next chunk waits to be faulted in (ring.c, point 4): from a
 * window's move, so raw system calls only; nothing in a forked child,
 * whose process has no control thread. */
void ag_control_wake_to_populate(void)
{
	uint64_t one = 1;
	int fd = wake_fd;

	if (fd < 0 || !__atomic_load_n(&serving, __ATOMIC_ACQUIRE) ||
	    ag_arch_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0) != owner || !ag_fd_still_ours(fd))
		return;
	__atomic_store_n(&wake_populate, 1, __ATOMIC_RELEASE);
	ag_arch_syscall6(SYS_write, fd, (long)&one, sizeof one, 0, 0, 0);
}

/*
 * The control thread's start, beside the rest of the agent's.  Preloaded,
 * ag_control_start comes right after ag_patch_init and ag_control_ready at
 * the end of agent_start (main.c): the thread's start (the C library's
 * thread start, then its opens) overlaps the analysis of the modules
 * instead of being waited for (bench/START.md).  Attached, the program runs
 * throughout: the two stay together where the start used to make the thread
 * (after ag_threads_init's fork handlers, which keep a fork of the program's
 * from copying fds.c's lock held by this thread).
 *
 *  1. Made only after the steps that are cheap in a process of one thread
 *     and cost an RCU grace period (10-20 ms) once a second one shares it:
 *     the descriptor table grown for fds.c's high numbers (the first
 *     ag_fd_keep, agent.log's) and membarrier's registration (ag_patch_init).
 *     The FIFO, the registry path and the signal mask are set on the main
 *     thread before the thread exists.
 *  2. The thread then runs the C library's thread start and opens what it
 *     keeps (threads.c's /proc files of the threads there, msgs.c's netlink
 *     socket, the registry dir and link, the FIFO) while the main thread
 *     analyses the modules.  What the two touch meanwhile:
 *     - fds.c's table: changed under its lock, its bits atomic.  Each
 *       descriptor of either thread holds a low number only for a moment
 *       (fds.c moves it high, or it is read and closed); all are back free
 *       by point 3, whichever thread took which, so the program's next
 *       open() gets the number it gets natively.
 *     - agent.log: open before 1; one write per line, O_APPEND.
 *     - the pools' kept ranges (pool.c, point 4): the main thread's alone;
 *       this thread makes no pool before point 4, and a mapping its start
 *       makes (a malloc arena) is one pool.c's point 2 already handles.
 *     - threads.c's caches and msgs.c's socket: this thread's alone until
 *       point 4.  ag_for_other_threads on the main thread would count this
 *       thread before it stored its id: the main thread runs none before 3.
 *     - patch.c: nothing is written to code before 3 (the agent is dormant,
 *       the activation trap comes after), so the C library's thread start,
 *       which runs with SIGTRAP blocked, never meets an int3 (a blocked
 *       trap kills the process); no start slot is involved (the C
 *       library's pthread_create, not the agent's).
 *  3. ag_control_ready: the main thread sleeps on `control_ready` until the
 *     thread is past 2 -- before the activation trap is armed and before
 *     the constructor returns, so no code of the program runs, and none is
 *     patched, until then.
 *  4. The thread then waits for `control_go` before anything else (creds.c's
 *     requests, membarrier when attached, the repository entries, the timer,
 *     commands, new modules): those start activations and make pools, as
 *     they did once the start was over.  A start that fails between 1 and 3
 *     (ag_control_abandon) sets it to -1 instead: the thread ends, the main
 *     thread joins it and removes the FIFO and the registry link, so a
 *     process that is not traced keeps no thread, link or FIFO of the
 *     agent's.
 */
int ag_control_start(void)
{
	pthread_attr_t attr;
	sigset_t all, old;
	int rc, took;

	owner = getpid();
	wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ag_fd_keep(&wake_fd, NULL, 0);
	snprintf(fifo, sizeof fifo, "%s/control", ag_dir);
	took = ag_spare_take_node(AG_SPARE_FIFO, fifo);
	if (took < 0 && mkfifo(fifo, 0600) == 0) {
		ag_spare_made();
	} else if (took < 0 && errno != EEXIST) {
		ag_log("control: mkfifo %s: %s", fifo, strerror(errno));
		return -1;
	}
	snprintf(xdg, sizeof xdg, "%s", getenv("XDG_RUNTIME_DIR") ? getenv("XDG_RUNTIME_DIR") : "");
	/* The program's signals never go to this thread; the synchronous ones
	 * stay open: it may meet a pending int3 in the libc code it runs, and a
	 * blocked SIGTRAP would kill the process. */
	sigfillset(&all);
	sigdelset(&all, SIGTRAP);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGILL);
	sigdelset(&all, SIGFPE);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	rc = ag_real_pthread_create(&control_th, &attr, control_main, NULL);   /* joinable: 4 */
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		return -1;
	control_started = true;
	return 0;
}

/* Point 3, then 4.  Asleep on the word, not yielding: a spinning main
 * thread took the CPU the starting thread needed, and the rest of the
 * machine's. */
void ag_control_ready(void)
{
	if (!control_started)
		return;
	wait_word(&control_ready, 0);
	set_word(&control_go, 1);
	pthread_detach(control_th);
	control_started = false;
}

/* Point 4, a start that failed: the thread ends, and what it made goes. */
void ag_control_abandon(void)
{
	if (!control_started)
		return;
	wait_word(&control_ready, 0);
	set_word(&control_go, -1);
	pthread_join(control_th, NULL);
	control_started = false;
	ag_control_stop();
	ag_fd_drop(fifo_fd);
	ag_fd_drop(reg_fd);
	ag_fd_drop(wake_fd);
	fifo_fd = reg_fd = wake_fd = -1;
	ag_threads_preopen_undo();
	ag_msgs_preopen_undo();
	fifo[0] = reg_name[0] = '\0';
}

void ag_control_stop(void)
{
	int dir;

	if (getpid() != owner)
		return;
	dir = reg_name[0] ? ag_fd_checked(&reg_fd) : -1;
	if (dir >= 0)
		unlinkat(dir, reg_name, 0);
	if (fifo[0])
		unlink(fifo);
}
