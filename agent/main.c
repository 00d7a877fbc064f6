/*
 * main.c — the agent's life: configuration from the environment, dormancy,
 * the activation event, the slow paths called from generated code, and the
 * end of the trace.
 *
 * Environment (set by `sptrace run`):
 *   SPTRACE_DIR            trace directory (exists, absolute)
 *   SPTRACE_ON             "start" (trace from main), "call FUNC" (a name,
 *                          or 0xADDR as a link-time address in the executable),
 *                          "timer SECONDS" (after that long, every thread from
 *                          where it stands) or "signal" (at `sptrace activate`)
 *   SPTRACE_RING_BYTES     size of each thread's ring
 *   SPTRACE_RECORDS        "all": keep every record (each thread's file grows,
 *                          ring.c); otherwise flight-recorder rings
 *   SPTRACE_BUDGET         PERCENT: the overhead budget (budget.c); absent or
 *                          0: every call timed
 *   SPTRACE_LD_PRELOAD     the program's own LD_PRELOAD, restored at start so
 *                          the program sees its environment unchanged ("-"
 *                          when it had none)
 *   SPTRACE_LD_BIND_NOW    likewise for LD_BIND_NOW, which sptrace run sets so
 *                          that every PLT slot holds its callee from the start
 *   SPTRACE_THREADS        after an event on one thread (accept, recv): "event"
 *                          (that thread and those it creates trace) or "all"
 *   SPTRACE_EXEC_OF        set by the agent of an image that exec'd this one
 *                          (exec.c): SPTRACE_DIR is a new subdirectory of it
 *   SPTRACE_TSC_HZ         the time-stamp counter's rate as sptrace (or the
 *                          agent of the image that exec'd this one) measured
 *                          it: this agent need not spend 2 ms measuring it
 *   SPTRACE_JOIN           join directives, one a line (trace_format.h,
 *                          "Values"): the values to record, written to meta
 *   SPTRACE_SPARE          the stock of ready-made files, directories and
 *                          FIFOs `sptrace run` keeps (spare.c)
 *   SPTRACE_LOOKAHEAD      "all": the look-ahead takes every direct callee,
 *                          whatever earlier runs reached (lookahead.c)
 *   SPTRACE_IMAGES         set by the agent of an image that exec'd this one:
 *                          the repository's calls images already checked
 *                          record by record in this run (modules.c)
 *   SPTRACE_CPU            likewise: what the processor's state takes
 *                          (x86_64/cpu.c), not asked again
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

char ag_dir[4096];

static volatile int log_fd = -1;
static char log_path[4200];
/* The group the trace is shared with (its directory set-group-ID and
 * group-readable: sptrace --group), else -1. */
static gid_t share_gid = (gid_t)-1;
/* The process this trace is of: the one that started the agent (an exec'd
 * image keeps its pid).  A forked child inherits the agent and the trace
 * directory but not the trace: meta stays its owner's (see meta_append). */
static pid_t owner_pid;
static char on_event[512];
static ag_module *root_module;
static uint32_t root_func = CA_NONE;
static __thread uint64_t root_ret __attribute__((tls_model("initial-exec")));
static __thread uint32_t root_site __attribute__((tls_model("initial-exec")));
static volatile int finished;
static volatile int active;
static double timer_seconds = -1;
static bool threads_event_only;       /* --threads event */
/* The activation event is still awaited: not after it happened once, nor
 * after a stop (`sptrace activate` starts tracing again, not the event). */
static volatile int event_spent;

/* ---- memory: a bump allocator over mmap (never malloc: slow paths may run
 * in signal handlers or inside malloc) ---- */

void *ag_alloc(size_t n)
{
	static uint8_t *cur, *end;
	static volatile int lk;
	void *r = NULL;

	n = (n + 15) & ~(size_t)15;
	while (__atomic_exchange_n(&lk, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
	if (n >= (1u << 20)) {
		r = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		r = r == MAP_FAILED ? NULL : r;
	} else {
		if (!cur || (size_t)(end - cur) < n) {
			void *p = mmap(NULL, 4u << 20, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p != MAP_FAILED) {
				cur = p;
				end = cur + (4u << 20);
			}
		}
		if (cur && (size_t)(end - cur) >= n) {
			r = cur;
			cur += n;
		}
	}
	__atomic_store_n(&lk, 0, __ATOMIC_RELEASE);
	return r;
}

/* A file made here, counted (spare.c's count), or opened as it is. */
static int create_counted(const char *path, int flags)
{
	int fd = open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd >= 0)
		ag_spare_made();
	else if (errno == EEXIST)
		fd = open(path, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	return fd;
}

/* fchmod: the umask plays no part.  A file that did not get the
 * directory's group stays the owner's. */
static int trace_mode(int fd)
{
	struct stat st;
	mode_t want;

	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		want = share_gid != (gid_t)-1 && st.st_gid == share_gid ? 0640 : 0600;
		if ((st.st_mode & 07777) != want)       /* (a file opened again: already) */
			fchmod(fd, want);
	}
	return fd;
}

int ag_trace_open(const char *path, int flags)
{
	struct stat st;
	int fd, took;

	/* agent.log and meta are opened again and again (each line of meta,
	 * a forked child's log): one that exists is opened as it is, without
	 * asking for a spare. */
	if (flags & O_APPEND) {
		fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 || errno != ENOENT)
			return trace_mode(fd);
	}
	took = ag_spare_take(AG_SPARE_FILE, path);
	if (took > 0) {
		/* Point 4 of spare.c: what was taken, as a spare must be (looked
		 * at before any O_TRUNC: an empty file has nothing to lose). */
		fd = open(path, (flags & ~O_TRUNC) | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && fstat(fd, &st) == 0 && ag_spare_check(AG_SPARE_FILE, &st, path))
			return trace_mode(fd);
		if (fd >= 0)
			close(fd);
	}
	if (took == 0)
		return trace_mode(open(path, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
	return trace_mode(create_counted(path, flags));
}

/*
 * The trace directory must be ours (sptrace made it for this process's
 * user), a directory and not a link; an exec'd image's is made here, like
 * its parent's: 0700, or 2750 in a shared one (whose set-group-ID bit
 * hands the group down).  Whether the trace is shared is read
 * from the directory.  -1 after saying why on stderr: nowhere to write.
 */
static int trace_dir_check(const char *exec_of)
{
	struct stat st;
	mode_t want = 0700;
	int fd, took = -1;

	if (exec_of) {
		if (stat(exec_of, &st) == 0 && (st.st_mode & S_ISGID) && (st.st_mode & S_IRGRP))
			want = 02750;
		took = ag_spare_take_node(AG_SPARE_DIR, ag_dir);
		if (took <= 0 && mkdir(ag_dir, want & 0777) == 0)
			ag_spare_made();
		else if (took <= 0 && errno != EEXIST)
			return -1;      /* nowhere to write: run untraced */
	}
	fd = open(ag_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	/* The umask may have taken bits from the mode of the one made here.
	 * (The kernel keeps the set-group-ID bit in fchmod only for a member
	 * of the group: else the directory stays private.) */
	if (exec_of && fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
	    (st.st_mode & 07777) != want && fchmod(fd, want) != 0) {
		close(fd);
		return -1;
	}
	if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != geteuid()) {
		char msg[4400];
		int n = snprintf(msg, sizeof msg, "sptrace agent (pid %d): not tracing: the trace "
				 "directory %s is %s\n", (int)getpid(), ag_dir,
				 fd < 0 ? "not a directory (or a link)" : "another user's");

		if (fd >= 0)
			close(fd);
		if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0)
			return -1;
		return -1;
	}
	if ((st.st_mode & S_ISGID) && (st.st_mode & S_IRGRP))
		share_gid = st.st_gid;
	close(fd);
	return 0;
}

void ag_log(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n, k;

	if (log_fd < 0)
		return;
	/* A forked child shares agent.log: its lines say whose they are.
	 * (ag_self_pid, not getpid(): a thread in strict seccomp mode may
	 * only read and write, and logs why it stopped recording.) */
	n = ag_self_pid && owner_pid && ag_self_pid != owner_pid
		    ? snprintf(buf, sizeof buf, "pid %d: ", (int)ag_self_pid) : 0;
	va_start(ap, fmt);
	k = vsnprintf(buf + n, sizeof buf - 1 - (size_t)n, fmt, ap);
	va_end(ap);
	if (k < 0)
		return;
	n += k;
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	if (write(ag_fd_checked(&log_fd), buf, (size_t)n) < 0)
		return;
}

static uint64_t ns(clockid_t c)
{
	struct timespec ts;

	/* The vDSO's clock_gettime reads the TSC: not on a thread that
	 * cannot (tsc.c). */
	if (ag_tls_quiet)
		syscall(SYS_clock_gettime, c, &ts);
	else
		clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t ag_mono_ns(void)
{
	struct timespec ts;

	syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- meta ----
 *
 * meta is its owner's: only the traced process writes it.  A forked child
 * (fork before or after the activation) runs on with a copy of the agent
 * and the same trace directory -- its records go into rings of its own,
 * ring.<its tid> -- but its activation, its stop, its fatal signal and its
 * exit are not the trace's: an "end exit" line from a child that exited
 * made `sptrace stop` and `activate` answer "tracing already ended" while
 * the traced process ran on, patched.  What a child says goes to agent.log.
 * The one kind of line a child adds is the link to a trace of its own: the
 * "exec SUB PID PATH" (and "exec_failed SUB") of its exec, under its pid
 * (meta_append_any). */

/* The lines a preloaded agent's start writes (write_meta to meta_release),
 * held and written at once: each line opens the file again (five system
 * calls a line).  Only the main thread writes meta then (the control
 * thread waits for control_go; the program has not started). */
static char meta_held[16384];
static size_t meta_held_len;
static bool meta_holding;

static void meta_write(const char *buf, size_t n)
{
	char path[4200];
	int fd;

	snprintf(path, sizeof path, "%s/meta", ag_dir);
	fd = ag_trace_open(path, O_WRONLY | O_APPEND);
	if (fd < 0)
		return;
	if (write(fd, buf, n) < 0)
		ag_log("meta: %s", strerror(errno));
	close(fd);
}

static void meta_release(void)
{
	meta_holding = false;
	if (meta_held_len)
		meta_write(meta_held, meta_held_len);
	meta_held_len = 0;
}

static void meta_vappend(bool any_process, const char *fmt, va_list ap)
{
	char buf[8192];
	int n;

	/* getpid(), not ag_self_pid: a child made by a raw clone or fork
	 * system call ran no fork handler. */
	if (!any_process && getpid() != owner_pid)
		return;
	n = vsnprintf(buf, sizeof buf, fmt, ap);
	if (n < 0 || n >= (int)sizeof buf)
		return;
	if (meta_holding && getpid() == owner_pid) {
		if (meta_held_len + (size_t)n > sizeof meta_held)
			meta_release();         /* (and this line on its own, below) */
		else {
			memcpy(meta_held + meta_held_len, buf, (size_t)n);
			meta_held_len += (size_t)n;
			return;
		}
	}
	meta_write(buf, (size_t)n);
}

static void meta_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void meta_append(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	meta_vappend(false, fmt, ap);
	va_end(ap);
}

static void meta_append_any(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void meta_append_any(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	meta_vappend(true, fmt, ap);
	va_end(ap);
}

/* The TSC's rate handed to the agent (SPTRACE_TSC_HZ, attach's tsc_hz=),
 * 0 if none; one between 100 MHz and 100 GHz is taken. */
static uint64_t given_hz;

static void take_hz(const char *s)
{
	uint64_t hz = s ? strtoull(s, NULL, 10) : 0;

	given_hz = hz >= 100000000ull && hz <= 100000000000ull ? hz : 0;
}

/* The TSC's rate, and a reading of it with the clocks' (tsc0, mono0,
 * real0).  Measured over 2 ms of spinning unless it was handed over. */
static uint64_t calibrate(uint64_t *tsc0, uint64_t *mono0, uint64_t *real0)
{
	uint64_t t0, m0;

	ns(CLOCK_REALTIME);                /* the vDSO's data in */
	sp_clock_pair(&t0, &m0);           /* analysis/meta.c refines the rate */
	*real0 = ns(CLOCK_REALTIME);
	*real0 -= ns(CLOCK_MONOTONIC) - m0;  /* CLOCK_REALTIME at m0 */
	*tsc0 = t0;
	*mono0 = m0;
	return given_hz ? given_hz : sp_tsc_hz_since(t0, m0);
}

static void write_meta(void)
{
	char exe[4096] = "", host[256] = "";
	uint64_t tsc0, mono0, real0, hz = calibrate(&tsc0, &mono0, &real0);
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);

	ag_tsc_calibrated(hz, tsc0, mono0);
	ag_budget_clock(hz);
	if (n > 0)
		exe[n] = '\0';
	gethostname(host, sizeof host - 1);
	meta_append("%s %d\n%s %d\n%s %s\n%s %s\n%s %lu\n%s %lu\n%s %lu\n%s %lu\n%s %s\n",
		    TRACE_META_VERSION, TRACE_FORMAT_VERSION, TRACE_META_PID, (int)getpid(),
		    TRACE_META_PROGRAM, exe, TRACE_META_HOST, host, TRACE_META_TSC_HZ,
		    (unsigned long)hz, TRACE_META_TSC0, (unsigned long)tsc0, TRACE_META_MONO0,
		    (unsigned long)mono0, TRACE_META_REAL0, (unsigned long)real0, TRACE_META_EVENT,
		    on_event);
	if (ag_propagate_session())
		meta_append("%s %s\n", TRACE_META_SESSION, ag_propagate_session());
	for (uint32_t i = 0; i < ag_module_count(); i++)
		ag_meta_module(ag_module_at(i));
	ag_modules_untraced_meta();
}

/* A line of propagate.c's in meta. */
void ag_meta_note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	meta_vappend(false, fmt, ap);
	va_end(ap);
}

void ag_meta_untraced(const char *name, const char *why)
{
	meta_append("%s %s %s\n", TRACE_META_UNTRACED, name, why);
}

/* A "module" line in meta (also for modules found after the start). */
void ag_meta_module(const ag_module *m)
{
	meta_append("%s %u %s %s %lx\n", TRACE_META_MODULE, m->index, m->path, m->key,
		    (unsigned long)m->bias);
	if (__atomic_load_n(&m->ca, __ATOMIC_ACQUIRE))
		ag_meta_runtimes(m);
}

void ag_meta_runtimes(const ag_module *m)
{
	size_t nr;
	const ca_runtime *r = ca_module_runtimes(m->ca, &nr);

	for (size_t i = 0; i < nr; i++)
		meta_append("%s %u %s %lx %lx\n", TRACE_META_RUNTIME, m->index,
			    r[i].kind == CA_RUNTIME_GO ? "go" : "v8", (unsigned long)(m->bias + r[i].lo),
			    (unsigned long)(m->bias + r[i].hi));
}

void ag_meta_changed(void)
{
	for (uint32_t i = 0; i < ag_module_count(); i++) {
		ag_module *m = ag_module_at(i);
		uint64_t n = m ? m->sites_changed - m->sites_changed_said : 0;

		if (!n)
			continue;
		m->sites_changed_said += n;
		ag_log("%lu sites skipped in %s: code differs from the analysis (changed since it "
		       "was analysed, or by the program itself)", (unsigned long)n, m->path);
		meta_append("%s %u %lu\n", TRACE_META_CHANGED, m->index, (unsigned long)n);
	}
}

/* ---- activation ---- */

bool ag_active(void)
{
	return active;
}

/* What a language runtime calls (cgo's C side), at each activation: no
 * traced call reaches it (instrument.c). */
static void runtime_entries(void)
{
	uint32_t n = ag_instrument_runtime_entries();

	if (n)
		ag_log("activation: %u functions a language runtime calls into were instrumented "
		       "(their calls are traced; the runtime's code is not)", n);
}

static void on_activate(struct ucontext_t *ucp)
{
	ucontext_t *uc = (ucontext_t *)ucp;
	uint64_t *ret = ag_uc_entry_return(uc);
	const ca_func *rf = ca_module_funcs(root_module->ca, NULL) + root_func;
	uint64_t entry = root_module->bias + rf->addr;
	trace_ring_header *ring;

	ag_trap_disarm();      /* the trap code then resumes at the entry */
	ring = ag_enter();
	if (!ring)
		ring = ag_ring_create();
	if (ring) {
		ag_ring_put(ring, TRACE_EVENT, TRACE_EV_ACTIVATE);
		/* the rest is the agent's own time (trace_format.h): after the
		 * root's entry, instrumenting it and saying so in meta */
		if (rf->flags & CA_FUNC_RUNTIME) {
			ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
			/* Go's main: the runtime's own code, whose frames it
			 * walks -- no entry, no return hook, nothing patched. */
			active = 1;
			ag_log("activated in %s at %#lx, code a language runtime manages: it is "
			       "not traced, what it calls into is", ca_str(root_module->ca, rf->name),
			       (unsigned long)entry);
		} else {
			root_site = ag_site_root(root_module, root_func);
			ag_ring_put(ring, TRACE_ENTRY, root_site);
			ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
			active = 1;
			ag_instrument(root_module, root_func);
			/* See the root function return: its return address goes through us. */
			root_ret = *ret;
			*ret = (uint64_t)(uintptr_t)ag_tramp_return;
			ag_log("activated in %s at %#lx", ca_str(root_module->ca, rf->name),
			       (unsigned long)entry);
		}
		runtime_entries();
		meta_append("%s %lu %s\n", TRACE_META_ACTIVATED, (unsigned long)ag_rdtsc(), on_event);
		ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_END);
	}
	ag_leave(ring);
}

/*
 * Activation in mid-run (the control thread: --on timer, sptrace activate):
 * every other thread walks its stack and traces on from where it stands
 * (activate.c).  Also ends the wait of an armed start/call trap.
 */
uint64_t ag_activation_tsc;

void ag_activate_now(const char *why)
{
	if (finished)
		return;
	if (active) {
		/* Said so that `sptrace activate` gets its answer. */
		meta_append("%s %lu %s (already tracing)\n", TRACE_META_ACTIVATED,
			    (unsigned long)ag_rdtsc(), why);
		return;
	}
	ag_modules_load();              /* deferred analyses: all in first */
	ag_trap_disarm();
	ag_instrument_restart();
	ag_event_only(false);           /* activated for everyone */
	ag_activation_tsc = ag_rdtsc();
	active = 1;
	runtime_entries();
	ag_activate_running(true);
	ag_log("activated in mid-run (%s)", why);
	meta_append("%s %lu %s\n", TRACE_META_ACTIVATED, (unsigned long)ag_rdtsc(), why);
}

const char *ag_on_event(void)
{
	return on_event;
}

/* exec.c: this image is about to exec another, traced in DIR/sub. */
void ag_note_exec(const char *sub, const char *path, pid_t pid)
{
	/* The pid tells the traced process's own exec from a forked, vforked
	 * or spawned child's, which shares this trace directory. */
	meta_append_any("%s %s %d %s\n", TRACE_META_EXEC, sub, (int)pid, path);
}

void ag_note_exec_failed(const char *sub)
{
	meta_append_any("%s %s\n", TRACE_META_EXEC_FAILED, sub);
}

/* A deadly signal is about to take effect (signals.c, in its handler). */
void ag_note_fatal(int sig, int code, uint64_t addr, uint64_t pc, uint64_t sp)
{
	ag_module *m = ag_module_of(pc);

	/* Where the thread stood, for whoever reads the log after a crash:
	 * a module offset, or the agent's own pools and trampolines. */
	ag_log("fatal signal %d (code %d, address %#lx) in thread %ld at pc %#lx (%s+%#lx%s), "
	       "sp %#lx", sig, code, (unsigned long)addr, (long)syscall(SYS_gettid),
	       (unsigned long)pc, m ? m->path : "?", (unsigned long)(m ? pc - m->bias : 0),
	       ag_pool_holds(pc) ? ", in a patch area or stub" : "", (unsigned long)sp);
	meta_append("%s %d %ld %d %#lx %lu\n", TRACE_META_FATAL, sig, (long)syscall(SYS_gettid), code,
		    (unsigned long)addr, (unsigned long)ag_rdtsc());
}

/*
 * An event the agent waits for happened on this thread (events.c: accept
 * returned a connection, recv returned data).  This thread starts tracing
 * where it stands (it walks its own stack); with --threads all the others
 * are asked to walk too, with --threads event only this one (and threads it
 * creates) records.  The event itself is recorded after the walk's entries.
 */
static volatile int event_lock;

/* The agent traces already, this thread not: it received the message of
 * a traced send (propagate.c) and follows from where it stands. */
static void follow_thread(const char *what, int fd, struct ucontext_t *uc)
{
	ag_may_trace_set(true);
	ag_activation_round();
	ag_walk_self(uc);
	ag_came_from_fd(fd);
	if (ag_tls_ring)
		ag_ring_put(ag_tls_ring, TRACE_EVENT, TRACE_EV_RECV);
	ag_log("thread %ld follows too: %s (fd %d)", (long)syscall(SYS_gettid), what, fd);
	meta_append("%s %lu %s fd %d tid %ld\n", TRACE_META_ACTIVATED, (unsigned long)ag_rdtsc(),
		    what, fd, (long)syscall(SYS_gettid));
}

void ag_activate_on_event(const char *what, int fd, struct ucontext_t *uc)
{
	trace_ring_header *ring;

	if (__atomic_exchange_n(&event_lock, 1, __ATOMIC_ACQUIRE))
		return;                          /* another thread is activating */
	if (active && !finished && threads_event_only && !ag_may_trace_get()) {
		follow_thread(what, fd, uc);     /* propagate.c: one more flow */
		__atomic_store_n(&event_lock, 0, __ATOMIC_RELEASE);
		return;
	}
	if (active || finished) {
		__atomic_store_n(&event_lock, 0, __ATOMIC_RELEASE);
		return;
	}
	ag_modules_load();              /* deferred analyses: all in first */
	ag_instrument_restart();
	ag_activation_tsc = ag_rdtsc();
	event_spent = 1;
	ag_may_trace_set(true);
	ag_event_only(threads_event_only);
	ag_activation_round();
	active = 1;
	runtime_entries();
	ag_walk_self(uc);
	ring = ag_tls_ring;
	if (ring)
		ag_ring_put(ring, TRACE_EVENT, strcmp(what, "accept") == 0 ? TRACE_EV_ACCEPT
					       : TRACE_EV_RECV);
	/* the rest of the activation is the agent's own time (trace_format.h) */
	ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
	if (!threads_event_only)
		ag_activate_running(false);
	ag_came_from_fd(fd);
	ag_log("activated by %s (fd %d) in thread %ld", what, fd, (long)syscall(SYS_gettid));
	meta_append("%s %lu %s fd %d tid %ld\n", TRACE_META_ACTIVATED, (unsigned long)ag_rdtsc(), what,
		    fd, (long)syscall(SYS_gettid));
	ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_END);
	__atomic_store_n(&event_lock, 0, __ATOMIC_RELEASE);
}

double ag_timer_seconds(void)
{
	return timer_seconds;
}

uint64_t ag_root_return(void)
{
	trace_ring_header *ring = ag_enter();

	if (active)
		ag_ring_put(ring, TRACE_EXIT, root_site);
	ag_leave(ring);
	return root_ret;
}

/*
 * The slow paths, called from generated code through ag_tramp_slow.  While
 * one runs, the thread records nothing: whatever traced code the agent
 * itself calls (libc) sees no ring and skips its records, and a nested slow
 * path (a signal handler, say) answers "skip" at once.
 */
__thread int ag_tls_busy __attribute__((tls_model("initial-exec")));
__thread uint64_t ag_tls_target __attribute__((tls_model("initial-exec")));

bool ag_busy(void)
{
	return ag_tls_busy != 0;
}

trace_ring_header *ag_enter(void)
{
	trace_ring_header *r = ag_tls_ring;

	ag_tls_busy++;
	ag_tls_ring = NULL;
	ag_tls_counts = NULL;       /* nor counted (budget.c) */
	return r;
}

void ag_leave(trace_ring_header *ring)
{
	/* A thread that went quiet meanwhile (tsc.c) keeps no ring. */
	ag_tls_ring = ag_tls_quiet ? NULL : ring;
	ag_tls_counts = ag_tls_ring ? ag_budget_counts() : NULL;
	ag_tls_busy--;
}

/* Is SIGTRAP blocked in this thread's real mask?  (The raw system call:
 * the C library's wrappers may hold our int3s.) */
static bool trap_blocked(void)
{
	uint64_t mask = 0;

	return syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &mask, 8) == 0 &&
	       (mask & (1ull << (SIGTRAP - 1)));
}

/*
 * The slow paths.  A thread that runs with SIGTRAP blocked must never meet
 * an int3 of ours (a blocked trap kills the process), and these paths run
 * C library code that may hold one (a trap, a window's first byte, a site
 * being patched): making a ring file (snprintf), instrumenting.  Such a
 * thread is a new one in glibc's start_thread before it restores its mask
 * (reached now that pthread_create is traced: its clone's child calls the
 * start function through an instrumented site), or one in a C library
 * section that blocks every signal.  So a thread without a ring yet, and
 * any indirect miss, first asks the kernel for its mask (~0.1 us) and
 * records nothing while SIGTRAP is blocked.
 */
uint64_t ag_slow(uint64_t req)
{
	unsigned op = (unsigned)(req >> 56);
	trace_ring_header *ring;
	uint64_t answer = 0;

	/* (A busy or quiet thread never gets here: ag_tramp_slow answered
	 * "skip" before its save.) */
	/* A window's move, no lock of the agent's held: the thread stays
	 * unmarked, a signal handler meanwhile is traced (ring.c). */
	if (op == AG_SLOW_ROTATE && ag_ring_moves_alone(ag_tls_ring))
		return ag_ring_rotate(ag_tls_ring, req & ((1ull << 56) - 1));
	if ((op == AG_SLOW_RING || op == AG_SLOW_INDIRECT ||
	     (op == AG_SLOW_INSTRUMENT && !ag_tls_ring)) && trap_blocked())
		return op == AG_SLOW_INSTRUMENT;   /* instrument: go on (untraced) */
	ring = ag_enter();
	/* the agent's own time (trace_format.h): instrumenting, and an indirect
	 * call's new target */
	if (op == AG_SLOW_INSTRUMENT || op == AG_SLOW_INDIRECT)
		ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_BEGIN);
	switch (op) {
	case AG_SLOW_RING:
		if (!ring && ag_may_trace())
			ring = ag_ring_create();
		answer = ring != NULL;
		break;
	case AG_SLOW_ROTATE:
		answer = ring && ag_ring_rotate(ring, req & ((1ull << 56) - 1));
		break;
	case AG_SLOW_SYNC:
		if (ring) {
			ag_ring_sync(ring, ag_rdtsc());
			answer = 1;
		}
		break;
	case AG_SLOW_INDIRECT:
		answer = ag_indirect_miss((ag_indirect_site *)(uintptr_t)(req & ((1ull << 56) - 1)),
					  ag_tls_target);
		break;
	case AG_SLOW_INSTRUMENT: {
		const ag_callee *c = (const ag_callee *)(uintptr_t)(req & ((1ull << 56) - 1));
		ag_module *m = ag_module_at(c->module);

		if (m && ag_instrument_from(m, c->func, ag_module_at(c->caller_module), c->caller) == 0 &&
		    c->flag)
			__atomic_store_n(c->flag, 1, __ATOMIC_RELEASE);
		answer = 1;
		break;
	}
	default:
		break;
	}
	if (op == AG_SLOW_INSTRUMENT || op == AG_SLOW_INDIRECT)
		ag_ring_put(ring, TRACE_EVENT, TRACE_EV_AGENT_END);
	ag_leave(ring);
	return answer;
}

/* Which function does SPTRACE_ON name? */
static int find_root(char *err, size_t errlen)
{
	const char *what = "main";
	ca_module *ca;

	root_module = ag_module_at(0);
	ca = root_module->ca;
	if (strcmp(on_event, "signal") == 0 || strcmp(on_event, "accept") == 0 ||
	    strcmp(on_event, "recv") == 0)
		return 0;
	if (strncmp(on_event, "timer ", 6) == 0) {
		char *end;

		timer_seconds = strtod(on_event + 6, &end);
		if (end == on_event + 6 || *end || !(timer_seconds >= 0)) {
			snprintf(err, errlen, "activation event '%s': give the delay in seconds",
				 on_event);
			return -1;
		}
		return 0;
	}
	if (strncmp(on_event, "call ", 5) == 0)
		what = on_event + 5;
	else if (strcmp(on_event, "start") != 0) {
		snprintf(err, errlen, "unknown activation event '%s' (this agent knows 'start', "
			 "'call FUNC', 'timer SECONDS', 'signal', 'accept' and 'recv')", on_event);
		return -1;
	}
	root_func = ca_func_by_name(ca, what);
	if (root_func == CA_NONE && what[0] == '0' && what[1] == 'x') {
		uint64_t a = strtoull(what, NULL, 16);
		root_func = ca_func_at(ca, a);
		if (root_func != CA_NONE && ca_module_funcs(ca, NULL)[root_func].addr != a)
			root_func = CA_NONE;
	}
	if (root_func == CA_NONE) {
		snprintf(err, errlen, "%.600s has no function '%.200s'%s", root_module->path, what,
			 strcmp(what, "main") == 0 ? " (stripped? name one with --on 'call 0xADDR')" : "");
		return -1;
	}
	return 0;
}

/*
 * The environment is read and changed in place (environ), never through
 * getenv, setenv or unsetenv: a program may define its own.  bash does, over
 * its table of shell variables; before bash's main has made that table its
 * unsetenv changed nothing, and every bash script saw $SPTRACE_DIR and the
 * agent's $LD_PRELOAD.  An entry is removed by moving the later ones back,
 * as the C library does, in the very array main will get as envp; one
 * changed gets a string of the agent's (never freed: the program may hold
 * the pointer).
 */
static char **env_find(const char *name)
{
	size_t len = strlen(name);

	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
			return e;
	return NULL;
}

static const char *env_get(const char *name)
{
	char **e = env_find(name);

	return e ? *e + strlen(name) + 1 : NULL;
}

static void env_remove(const char *name)
{
	char **e;

	while ((e = env_find(name)))
		do
			e[0] = e[1];
		while (*e++);
}

/* NAME=value in place of NAME's entry; false when there is none (or no
 * memory): the caller removes it then. */
static bool env_replace(const char *name, const char *value)
{
	char **e = env_find(name);
	size_t n = strlen(name) + strlen(value) + 2;
	char *s = e ? ag_alloc(n) : NULL;

	if (!s)
		return false;
	snprintf(s, n, "%s=%s", name, value);
	*e = s;
	return true;
}

static void restore_env(void)
{
	static const char *const ours[] = {
		"SPTRACE_LD_PRELOAD", "SPTRACE_LD_BIND_NOW", "SPTRACE_DIR", "SPTRACE_ON",
		"SPTRACE_RING_BYTES", "SPTRACE_RECORDS", "SPTRACE_BUDGET", "SPTRACE_EXEC_OF",
		"SPTRACE_THREADS", "SPTRACE_SESSION", "SPTRACE_PROPAGATE_WAIT", "SPTRACE_TSC_HZ",
		"SPTRACE_JOIN", "SPTRACE_MARK", "SPTRACE_SPARE", "SPTRACE_LOOKAHEAD",
		"SPTRACE_IMAGES", "SPTRACE_CPU",
	};
	const char *orig = env_get("SPTRACE_LD_PRELOAD");

	/* Each value is copied before its source is removed. */
	if (!orig || strcmp(orig, "-") == 0 || !env_replace("LD_PRELOAD", orig))
		env_remove("LD_PRELOAD");
	orig = env_get("SPTRACE_LD_BIND_NOW");
	if (orig && (strcmp(orig, "-") == 0 || !env_replace("LD_BIND_NOW", orig)))
		env_remove("LD_BIND_NOW");
	for (size_t i = 0; i < sizeof ours / sizeof *ours; i++)
		env_remove(ours[i]);
}

/* Deactivate for good: put every patched byte back, close the rings and
 * end the trace.  (Also the path of a clean exit, without the restore.) */
static void end_trace(const char *why, bool restore)
{
	uint64_t sites, skind, splan, sunres, internal, rt_indirect = 0;

	if (__atomic_exchange_n(&finished, 1, __ATOMIC_ACQ_REL))
		return;
	active = 0;
	ag_trap_disarm();
	if (restore && ag_patch_restore_all())
		ag_log("stop: some patched bytes could not be restored");
	ag_budget_end();
	ag_rings_close_all();
	ag_instrument_stats(&sites, &skind, &splan, &sunres, &internal);
	ag_log("end (%s): %lu sites instrumented; not yet instrumentable: %lu by kind, %lu by "
	       "plan, %lu with a callee outside the traced modules; %lu indirect tail jumps "
	       "went within their own function; %lu sites left alone: they call runtime-managed "
	       "code (and %lu indirect calls met such a target: untraced)", why,
	       (unsigned long)sites, (unsigned long)skind, (unsigned long)splan,
	       (unsigned long)sunres, (unsigned long)internal,
	       (unsigned long)ag_instrument_skipped_runtime(&rt_indirect), (unsigned long)rt_indirect);
	if (ag_instrument_deferred())
		ag_log("end: %lu instrumentations were put off to a later call while threads "
		       "were being started (patch.c)", (unsigned long)ag_instrument_deferred());
	ag_meta_changed();
	ag_reloc_stats(&sites, &skind);
	ag_log("end: %lu relocated windows, %lu of them reached through a jump (the rest "
	       "through their int3); %lu hot traps put back", (unsigned long)sites,
	       (unsigned long)skind, (unsigned long)ag_traps_retired());
	ag_spare_log_end();
	ag_rings_populate_log();
	meta_append("%s %lu\n%s %lu\n%s %s\n", TRACE_META_TSC1, (unsigned long)ag_rdtsc(),
		    TRACE_META_MONO1, (unsigned long)ns(CLOCK_MONOTONIC), TRACE_META_END, why);
}

/*
 * sptrace stop (the control thread): put every patched byte back and go
 * dormant; `sptrace activate` may start tracing again.  The rings stay: a
 * DEACTIVATE event in each marks the stop (calls still running then finish
 * untraced, and the reader drops what they record until the next ACTIVATE).
 */
void ag_deactivate(const char *why)
{
	/* Whatever became of the trace, a stop restores the code: a process
	 * that still has the agent must never stay patched. */
	bool ended = finished;

	ag_trap_disarm();
	event_spent = 1;
	active = 0;
	ag_activate_quiesce();
	if (ag_instrument_stop())
		ag_log("stop: some patched bytes could not be restored");
	ag_meta_changed();
	if (!ended)
		ag_rings_event_all(TRACE_EV_DEACTIVATE);    /* ended: the rings are closed */
	ag_log("stopped (%s)%s", why, ended ? " after the trace had ended" : "");
	meta_append("%s %lu %s\n", TRACE_META_STOPPED, (unsigned long)ag_rdtsc(), why);
}

static void finish(void)
{
	/* The exiting thread records nothing more: the libc code the agent
	 * runs now (formatting the last log lines) and what exit() does after
	 * this handler are not the program's calls. */
	ag_enter();
	/* No windows round (relocate.c) from now on: none is running while we
	 * hold the lock, and none starts once inactive.  Its SIGTRAP would
	 * otherwise reach this thread inside the unlink calls below -- harmless
	 * for the kernel, but valgrind takes an asynchronous SIGTRAP during a
	 * system call for a fault and aborts (the callgrind bench). */
	ag_instrument_lock();
	active = 0;
	ag_instrument_unlock();
	ag_control_stop();
	ag_modules_register_late();
	end_trace("exit", false);
}

static void fail(const char *why)
{
	char msg[1200];
	int n = snprintf(msg, sizeof msg, "sptrace agent (pid %d): not tracing: %s\n", (int)getpid(), why);

	if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0)
		return;
	ag_log("not tracing: %s", why);
	meta_append("%s not tracing: %s\n", TRACE_META_END, why);
}

/*
 * Start the agent: trace files, analysis of the loaded modules, the
 * control thread, the activation trap; then dormant.  Returns 0, or -1 after
 * saying why (stderr, agent.log, meta).  `attached`: loaded into a running
 * process by sptrace attach, not preloaded.
 */
static bool attached;
#define PRE_LIST_MAX (1024 * 32)                 /* signals.c's PRE_MAX threads */
static char attach_trapblocked[PRE_LIST_MAX];  /* sptrace_agent_attach's "trapblocked=" */
static char attach_session[80], attach_wait[16]; /* ... "session=", "wait=" */
static char attach_mark[16], env_mark[16];      /* ... "mark=", SPTRACE_MARK */
static char attach_expect[4][200];              /* ... "expect=" */
static int attach_nexpect;
static int attach_stopped;                      /* ... "stopped=": the injector's thread, */
static long attach_stopped_nr = -1;             /* the call it goes back into (-1: none), */
static unsigned long attach_stopped_pc;         /* where that call returns */
static char env_session[80], env_wait[16];      /* SPTRACE_SESSION, ..._PROPAGATE_WAIT */
static char env_spare[4096];                    /* SPTRACE_SPARE (spare.c) */
static char env_cpu[32];                        /* SPTRACE_CPU (arch.h) */
static char join_list[AG_JOIN_MAX * 260];      /* SPTRACE_JOIN, or attach's "join=" lines */

/* The join directives of join_list, one a line, for the areas. */
static int joins_init(char *err, size_t errlen)
{
	for (char *p = join_list; *p;) {
		char *nl = strchr(p, '\n');

		if (nl)
			*nl = '\0';
		if (*p && ag_join_add(p, err, errlen))
			return -1;
		p = nl ? nl + 1 : p + strlen(p);
	}
	return 0;
}

bool ag_event_wanted(const char *what)
{
	if (finished)
		return false;
	if (ag_expect_mode())   /* propagate.c: an awaited receive, on a thread not tracing yet */
		return ag_expecting() && strcmp(what, "recv") == 0 &&
		       (!active || (threads_event_only && !ag_may_trace_get()));
	return !active && !event_spent && strcmp(on_event, what) == 0;
}

/*
 * A process that a debugger (or strace, ...) traces from its start -- gdb's
 * inferior, which inherits the agent through the environment -- is left
 * alone: no activation trap or hardware breakpoint, no SIGTRAP handler, no
 * patched byte, no signal handler or mask of the agent's.  Each of those
 * reaches the debugger first: it stops at every SIGTRAP of the agent's
 * (gdb: "Cannot insert breakpoint"), and its breakpoints share the debug
 * registers and the code with ours.  The interposers pass every call on;
 * an exec still carries the agent, so an image the debugger starts next
 * says the same.  Said in agent.log and meta ("end not tracing: ..."),
 * which `sptrace run` reports; nothing on the program's stderr.
 * (sptrace attach is itself the tracer while it injects: not asked then.)
 */
static bool stay_out_if_debugged(void)
{
	char buf[4096], comm[64] = "?", path[64];
	ssize_t n;
	const char *tp;
	int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC), tracer;

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	tp = strstr(buf, "\nTracerPid:");
	tracer = tp ? atoi(tp + 11) : 0;
	if (tracer <= 0)
		return false;
	snprintf(path, sizeof path, "/proc/%d/comm", tracer);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, comm, sizeof comm - 1);
		comm[n > 0 ? n : 0] = '\0';
		comm[strcspn(comm, "\n")] = '\0';
		close(fd);
	}
	finished = 1;                   /* no event, no activation, no stop */
	ag_signals_stay_out();
	ag_log("not tracing: this process is traced by %s (pid %d), a debugger: the agent stays "
	       "out of its way (no trap, no breakpoint, no patch, no handler)", comm, tracer);
	write_meta();
	meta_append("%s not tracing: traced by %s (pid %d), a debugger\n", TRACE_META_END, comm,
		    tracer);
	return true;
}

static int agent_start(const char *dir, const char *on, const char *ring, const char *exec_of,
		       const char *threads)
{
	char err[1024], parent[4096] = "";
	uint64_t t_start = ns(CLOCK_MONOTONIC);

	snprintf(ag_dir, sizeof ag_dir, "%s", dir);
	ag_fds_init();
	if (!attached)
		ag_spare_init(env_spare);       /* before the first file is made */
	ag_msgs_init();
	owner_pid = getpid();
	ag_signals_init();
	snprintf(on_event, sizeof on_event, "%s", on && *on ? on : "start");
	/* Who traces after an event on one thread: by default that thread (and
	 * what it starts) for accept and recv, every thread otherwise. */
	threads_event_only = threads && *threads ? strcmp(threads, "event") == 0
			     : strcmp(on_event, "accept") == 0 || strcmp(on_event, "recv") == 0;
	ag_exec_init(ring);
	if (exec_of)
		snprintf(parent, sizeof parent, "%s", exec_of);
	if (!attached)
		restore_env();
	if (trace_dir_check(exec_of))
		return -1;
	snprintf(log_path, sizeof log_path, "%s/agent.log", ag_dir);
	log_fd = ag_trace_open(log_path, O_WRONLY | O_APPEND);
	ag_fd_keep(&log_fd, log_path, O_WRONLY | O_APPEND);
	ag_spare_log_start();
	/* Before any hook: a receive must not be taken for the event while
	 * the receive the daemon asked for is not known yet. */
	ag_propagate_init(attached ? attach_session : env_session,
			  attached ? attach_wait : env_wait, attached ? attach_mark : env_mark);
	for (int i = 0; i < attach_nexpect; i++)
		ag_expect_add(attach_expect[i]);
	/* After the log is open: a size refused is said there. */
	if (ring)
		ag_ring_set_size(strtoull(ring, NULL, 10));
	if (!attached && stay_out_if_debugged())
		return -1;
	if (attached)
		ag_signals_attached(attach_trapblocked);
	ag_arch_init(attached ? NULL : env_cpu);
	if (ag_rings_init() || ag_sites_open(ag_dir)) {
		fail("cannot create the trace files");
		return -1;
	}
	ag_channels_open(ag_dir);       /* without it: no message events, said in agent.log */
	ag_signals_fatal_init();
	if (attached && strcmp(on_event, "start") == 0) {
		fail("attached to a running process: 'start' (main) is long past; use 'call FUNC', "
		     "'timer SECONDS' or 'signal'");
		return -1;
	}
	uint64_t t_mod = ns(CLOCK_MONOTONIC);

	/* Attached, the repository entries are read after "dormant", unless
	 * the event names a function to find in them. */
	bool defer = attached && strncmp(on_event, "call ", 5) != 0;

	ag_unwind_init();
	if (!attached) {
		ag_thread_known();      /* the program's first thread (patch.c) */
		ag_pools_keep_maps(true);       /* one read of the maps (pool.c, point 4) */
	}
	if (joins_init(err, sizeof err) || ag_patch_init(err, sizeof err, attached)) {
		ag_pools_keep_maps(false);
		fail(err);
		return -1;
	}
	/* Preloaded, the control thread starts now and its start overlaps the
	 * modules' analysis (control.c, points 1-4); attached, where it did.
	 * Its time is not the analysis's (t_mod). */
	uint64_t t_ctl = ns(CLOCK_MONOTONIC);

	if (!attached && ag_control_start())
		ag_log("no control thread: 'sptrace stop %d' will not work", (int)getpid());
	t_mod += ns(CLOCK_MONOTONIC) - t_ctl;
	if (ag_modules_init(err, sizeof err, defer) || find_root(err, sizeof err)) {
		ag_pools_keep_maps(false);
		ag_control_abandon();
		fail(err);
		return -1;
	}
	t_mod = ns(CLOCK_MONOTONIC) - t_mod;
	ag_hooks_init(attached);
	if (attached)
		ag_hooks_install();
	meta_holding = !attached;
	write_meta();
	if (parent[0])
		meta_append("%s %s\n", TRACE_META_EXEC_OF, parent);
	for (size_t i = 0; i < ag_join_count(); i++)
		meta_append("%s %s\n", TRACE_META_JOIN, ag_join_get(i));
	if (attached)
		meta_append("%s %lu\n", TRACE_META_ATTACHED, (unsigned long)ag_rdtsc());
	meta_release();
	atexit(finish);
	if (ag_threads_init())
		ag_log("no fork handler: a forked child would write into its parent's ring");
	if (ag_activate_init())
		ag_log("no return-stub pool: a mid-run activation will not record the exits of "
		       "the functions already running");
	ag_pools_keep_maps(false);
	if (attached && ag_control_start())
		ag_log("no control thread: 'sptrace stop %d' will not work", (int)getpid());
	ag_control_ready();     /* before the trap: control.c, point 3 */
	if (root_func != CA_NONE &&
	    ag_trap_arm(root_module->bias + ca_module_funcs(root_module->ca, NULL)[root_func].addr,
			on_activate, attached)) {
		fail("cannot place the activation trap");
		return -1;
	}
	if (attached && (strcmp(on_event, "accept") == 0 || strcmp(on_event, "recv") == 0))
		ag_watch_blocked_calls(on_event, attach_stopped, attach_stopped_nr,
				       attach_stopped_pc);
	ag_log("dormant; waiting for '%s' (started in %.1f ms, %.1f ms of it the %u modules' "
	       "%s)", on_event, (double)(ns(CLOCK_MONOTONIC) - t_start) / 1e6,
	       (double)t_mod / 1e6, ag_module_count(),
	       defer ? "registration; their analyses follow" : "analyses");
	return 0;
}

__attribute__((constructor)) static void agent_init(void)
{
	const char *dir = env_get("SPTRACE_DIR");

	ag_exec_resolve();              /* the interposers pass every call on, started or not */
	if (!dir || !*dir)
		return;                 /* loaded without sptrace run: stay out of the way */
	/* Read before agent_start takes them out of the environment */
	snprintf(env_session, sizeof env_session, "%s", env_get("SPTRACE_SESSION") ?: "");
	snprintf(env_wait, sizeof env_wait, "%s", env_get("SPTRACE_PROPAGATE_WAIT") ?: "");
	snprintf(join_list, sizeof join_list, "%s", env_get("SPTRACE_JOIN") ?: "");
	snprintf(env_mark, sizeof env_mark, "%s", env_get("SPTRACE_MARK") ?: "");
	ag_ring_keep_all(env_get("SPTRACE_RECORDS") && strcmp(env_get("SPTRACE_RECORDS"), "all") == 0);
	take_hz(env_get("SPTRACE_TSC_HZ"));
	ag_budget_init(env_get("SPTRACE_BUDGET"));
	snprintf(env_spare, sizeof env_spare, "%s", env_get("SPTRACE_SPARE") ?: "");
	snprintf(env_cpu, sizeof env_cpu, "%s", env_get("SPTRACE_CPU") ?: "");
	ag_lookahead_init(env_get("SPTRACE_LOOKAHEAD"));
	ag_modules_images_init(env_get("SPTRACE_IMAGES"));
	agent_start(dir, env_get("SPTRACE_ON"), env_get("SPTRACE_RING_BYTES"),
		    env_get("SPTRACE_EXEC_OF"), env_get("SPTRACE_THREADS"));
}

/*
 * sptrace attach: the injector dlopen's the agent into a running process
 * and calls this on a thread of its own with "dir=DIR\non=EVENT\n", and
 * optionally "ring=BYTES\n", "budget=PERCENT\n", "repo=DIR\n" (the code-analysis repository),
 * "prepared=DIR\n" (the repository sptrace attach analysed the process's
 * modules into, read when the agent's own lacks an entry: modules.c) and
 * "trapblocked=TID:SELF,...\n" (threads whose SIGTRAP the injector opened,
 * signals.c); from spdaemon "session=NAME\n", "wait=MS\n", "mark=offset|oob\n"
 * and "expect=tcp SRC SPORT DST DPORT OFFSET [oob]\n" (propagate.c);
 * "join=DIRECTIVE\n" for each join directive (trace_format.h, "Values");
 * from the injector "tsc_hz=HZ\n" (the counter's rate: no 2 ms of
 * measuring here) and "stopped=TID[ NR PC]\n" (the thread it stopped; the
 * system call it goes back into and the address that call returns to:
 * ag_watch_blocked_calls).
 * Returns 0, or 1 when not tracing (the reason is in DIR/agent.log and
 * meta), 2 when the agent was started already.
 */
AG_EXPORT int sptrace_agent_attach(const char *config)
{
	static int started;
	char dir[4096] = "", on[512] = "", ring[32] = "", threads[16] = "";

	if (__atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL) || ag_dir[0])
		return 2;
	for (const char *p = config; p && *p;) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (len > 4 && strncmp(p, "dir=", 4) == 0)
			snprintf(dir, sizeof dir, "%.*s", (int)(len - 4), p + 4);
		else if (len > 3 && strncmp(p, "on=", 3) == 0)
			snprintf(on, sizeof on, "%.*s", (int)(len - 3), p + 3);
		else if (len > 5 && strncmp(p, "ring=", 5) == 0)
			snprintf(ring, sizeof ring, "%.*s", (int)(len - 5), p + 5);
		else if (len > 7 && strncmp(p, "budget=", 7) == 0) {
			char pct[16];

			snprintf(pct, sizeof pct, "%.*s", (int)(len - 7), p + 7);
			ag_budget_init(pct);
		} else if (len > 8 && strncmp(p, "threads=", 8) == 0)
			snprintf(threads, sizeof threads, "%.*s", (int)(len - 8), p + 8);
		else if (len > 12 && strncmp(p, "trapblocked=", 12) == 0)
			snprintf(attach_trapblocked, sizeof attach_trapblocked, "%.*s", (int)(len - 12),
				 p + 12);
		else if (len > 5 && strncmp(p, "repo=", 5) == 0)
			snprintf(ag_repo_dir, sizeof ag_repo_dir, "%.*s", (int)(len - 5), p + 5);
		else if (len > 9 && strncmp(p, "prepared=", 9) == 0)
			snprintf(ag_prepared_dir, sizeof ag_prepared_dir, "%.*s", (int)(len - 9),
				 p + 9);
		else if (len > 8 && strncmp(p, "session=", 8) == 0)
			snprintf(attach_session, sizeof attach_session, "%.*s", (int)(len - 8), p + 8);
		else if (len > 5 && strncmp(p, "wait=", 5) == 0)
			snprintf(attach_wait, sizeof attach_wait, "%.*s", (int)(len - 5), p + 5);
		else if (len > 8 && strncmp(p, "stopped=", 8) == 0 && len < 80) {
			char st[80];

			snprintf(st, sizeof st, "%.*s", (int)(len - 8), p + 8);
			if (sscanf(st, "%d %ld %lx", &attach_stopped, &attach_stopped_nr,
				   &attach_stopped_pc) != 3)
				attach_stopped_nr = -1;
		}
		else if (len > 7 && strncmp(p, "tsc_hz=", 7) == 0 && len < 40) {
			char hz[40];

			snprintf(hz, sizeof hz, "%.*s", (int)(len - 7), p + 7);
			take_hz(hz);
		} else if (len > 5 && strncmp(p, "join=", 5) == 0) {
			size_t at = strlen(join_list);

			snprintf(join_list + at, sizeof join_list - at, "%.*s\n", (int)(len - 5),
				 p + 5);
		} else if (len > 5 && strncmp(p, "mark=", 5) == 0) {
			snprintf(attach_mark, sizeof attach_mark, "%.*s", (int)(len - 5), p + 5);
		} else if (len > 7 && strncmp(p, "expect=", 7) == 0 && attach_nexpect < 4)
			snprintf(attach_expect[attach_nexpect++], sizeof attach_expect[0], "%.*s",
				 (int)(len - 7), p + 7);
		p = nl ? nl + 1 : p + len;
	}
	if (!dir[0])
		return 1;
	attached = true;
	return agent_start(dir, on, ring[0] ? ring : NULL, NULL, threads) == 0 ? 0 : 1;
}
