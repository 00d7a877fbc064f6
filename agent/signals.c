/*
 * signals.c — signal handlers are traced from their start, and the agent's
 * own SIGTRAP handler stays in place whatever the program installs.
 *
 * A handler is entered by the kernel, not through a call site, so tracing
 * cannot propagate into it.  The agent interposes sigaction() and signal()
 * (it comes first through LD_PRELOAD): the kernel gets ag_sig_wrapper, which
 * records the handler as a root call (like a thread's start routine),
 * instruments it and calls it.  The program always sees its own handler
 * when it asks (sigaction(sig, NULL, &old)).
 *
 * For SIGTRAP the program's handler is only remembered: the agent's handler
 * stays installed (patching needs it) and passes on every trap that is not
 * the agent's (patch.c).
 *
 * The wrapper runs in signal context: ring writes and instrument() use no
 * locks that ordinary code holds, and if the signal interrupted the agent
 * itself on this thread (busy) the handler is called untraced.
 *
 * SIGTRAP is never really blocked.  A thread that reaches an int3 of the
 * agent's (a site being patched, patch.c) while SIGTRAP is blocked is killed
 * by the kernel, and the activation breakpoint's signal would stay pending
 * for ever.  Programs block every signal routinely (sigfillset + pthread_
 * sigmask in worker threads, the sigwait pattern; sa_mask = all in handlers),
 * so pthread_sigmask, sigprocmask and sigsuspend are interposed and SIGTRAP
 * is taken out of what reaches the kernel, and out of the sa_mask given with
 * a handler.  The program keeps its view: each thread remembers whether it
 * believes SIGTRAP blocked, and the old masks it reads back say so.  A
 * SIGTRAP the program sends itself meanwhile (raise, kill) is held by the
 * agent's handler and raised again when the program unblocks it -- as the
 * kernel would have kept it pending.
 * Not covered: masks set by raw rt_sigprocmask system calls (glibc's own
 * short all-blocked windows in pthread_create, fork and posix_spawn among
 * them), which the agent cannot see.
 *
 * Attached (sptrace attach), the masks threads set before the agent came
 * were never seen.  The protocol for them:
 *
 *   1. The injector, before the agent is loaded, stops each thread whose
 *      own mask holds SIGTRAP, takes SIGTRAP out (PTRACE_SETSIGMASK) and
 *      lets it go, its system call as it was (injector/inject.c,
 *      inj_open_sigtrap).  Before the agent exists: no int3 of ours can be
 *      met by a thread that could not take it.
 *   2. The tids, each with its thread pointer (a tid can be reused), come
 *      in the attach configuration (ag_signals_attached): a table.
 *   3. A thread's view is its TLS once known; the first time a thread needs
 *      it (a mask call, a SIGTRAP of its own, a handler) it looks itself up
 *      in the table: listed, it believes SIGTRAP blocked, as before the
 *      attach; its entry is spent.  Threads the agent starts (threads.c)
 *      take their creator's view, as the kernel gives them its mask.
 *   4. signalfd, sigwait, sigwaitinfo and sigtimedwait never take an agent
 *      SIGTRAP: SIGTRAP is taken out of the set they wait for (interposed;
 *      attached, through hooks.c), and signalfds made before the attach
 *      get their mask changed the same way (ag_signals_attached).
 * Between step 1 and the agent's SIGTRAP handler (a few milliseconds) a
 * SIGTRAP the program sends itself would reach its own disposition rather
 * than stay pending; one already pending makes the injector refuse.
 * Threads that block SIGTRAP with a raw system call after step 1 and
 * before the agent's hooks are in are not seen.
 *
 * Fatal signals are recorded before they take effect.  Where the program
 * leaves a deadly signal at its default action (SIGSEGV, SIGABRT, SIGTERM,
 * ...), the agent's on_fatal stands in: it puts a SIGNAL event into the
 * thread's ring and a "fatal" line into meta, restores the default action
 * and lets the signal happen as it would have -- a fault by returning (the
 * instruction faults again, with the default action now: same core dump,
 * same registers in it), a sent signal by sending it again.  The program
 * still sees SIG_DFL when it asks, and whatever it installs replaces
 * on_fatal.  (A stack overflow is not recorded: the handler has no stack.)
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef int (*sigmask_fn)(int, const sigset_t *, sigset_t *);
typedef int (*sigsuspend_fn)(const sigset_t *);
typedef int (*signalfd_fn)(int, const sigset_t *, int);
typedef int (*sigwait_fn)(const sigset_t *, int *);
typedef int (*sigwaitinfo_fn)(const sigset_t *, siginfo_t *);
typedef int (*sigtimedwait_fn)(const sigset_t *, siginfo_t *, const struct timespec *);

#define NSIG_MAX 65

static struct sigaction user[NSIG_MAX];     /* what the program installed */
static volatile uint32_t root_site[NSIG_MAX];
static sigaction_fn real_sigaction;
static sigmask_fn real_pthread_sigmask, real_sigprocmask;
static sigsuspend_fn real_sigsuspend;
static signalfd_fn real_signalfd;
static sigwait_fn real_sigwait;
static sigwaitinfo_fn real_sigwaitinfo;
static sigtimedwait_fn real_sigtimedwait;
static bool keep_trap_open;      /* the agent is tracing this process */
static bool stay_out;            /* ... or not at all: every call goes on unchanged */

/* Per thread: the program believes SIGTRAP blocked; a SIGTRAP it sent
 * itself waits for the unblock.  trap_view_known: trap_view_blocked is
 * the thread's (else the table below may hold its view). */
static __thread uint8_t trap_view_blocked __attribute__((tls_model("initial-exec")));
static __thread uint8_t trap_view_known __attribute__((tls_model("initial-exec")));
static __thread uint8_t trap_held __attribute__((tls_model("initial-exec")));

/* Threads that blocked SIGTRAP before the attach (step 2 above); written
 * before any program thread can look, an entry spent by its thread. */
#define PRE_MAX 1024
static struct pre_blocked {
	volatile int tid;            /* 0: spent */
	uint64_t self;               /* its thread pointer */
} pre[PRE_MAX];
static uint32_t npre;

/* This thread's belief (step 3): async-signal-safe, so on_trap may ask. */
static uint8_t *trap_view(void)
{
	if (!trap_view_known) {
		trap_view_known = 1;
		if (__atomic_load_n(&npre, __ATOMIC_ACQUIRE)) {
			int tid = (int)syscall(SYS_gettid);
			uint64_t self = (uint64_t)pthread_self();

			for (uint32_t i = 0; i < npre; i++)
				if (pre[i].tid == tid && pre[i].self == self) {
					trap_view_blocked = 1;
					pre[i].tid = 0;
				}
		}
	}
	return &trap_view_blocked;
}

/* A thread the agent starts (threads.c) believes what its creator did. */
uint8_t ag_trap_view_get(void)
{
	return *trap_view();
}

void ag_trap_view_set(uint8_t blocked)
{
	trap_view_known = 1;
	trap_view_blocked = blocked;
}

static const int fatal_sigs[] = {
	SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGQUIT, SIGTERM, SIGINT, SIGHUP,
	SIGPIPE, SIGXCPU, SIGXFSZ,
};

static bool is_fatal(int sig)
{
	for (size_t i = 0; i < sizeof fatal_sigs / sizeof *fatal_sigs; i++)
		if (fatal_sigs[i] == sig)
			return true;
	return false;
}

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
	struct sigaction dfl;
	int saved = errno;

	/* An rdtsc of the agent's on a thread that forbade it (tsc.c). */
	if (ag_tsc_fault(sig, si, uc)) {
		errno = saved;
		return;
	}
	if (ag_tls_quiet == AG_QUIET_STRICT) {
		/* No system call may be made here: the fault happens again
		 * with the signal blocked, which the kernel answers with the
		 * default action.  (A signal sent to this thread is not sent
		 * again: not covered.) */
		sigaddset(&((ucontext_t *)uc)->uc_sigmask, sig);
		errno = saved;
		return;
	}
	if (ag_active() && ag_tls_ring)
		ag_ring_put(ag_tls_ring, TRACE_EVENT, TRACE_EV_SIGNAL);
	ag_note_fatal(sig, si->si_code, (uint64_t)(uintptr_t)si->si_addr,
		      ag_uc_pc((ucontext_t *)uc), ag_uc_sp((ucontext_t *)uc));
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	real_sigaction(sig, &dfl, NULL);
	/* A fault repeats when the handler returns; anything else is sent
	 * again, and arrives when the handler returns. */
	if (si->si_code <= 0 || sig == SIGABRT || sig == SIGTERM || sig == SIGINT || sig == SIGHUP ||
	    sig == SIGQUIT || sig == SIGPIPE)
		syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), sig);
	errno = saved;
}

static int install_fatal(int sig)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fatal;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	return real_sigaction(sig, &sa, NULL);
}

/* At start: on_fatal where the program has the default action. */
void ag_signals_fatal_init(void)
{
	for (size_t i = 0; i < sizeof fatal_sigs / sizeof *fatal_sigs; i++) {
		struct sigaction cur;

		if (real_sigaction(fatal_sigs[i], NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
		    cur.sa_handler == SIG_DFL && install_fatal(fatal_sigs[i]) != 0)
			ag_log("signals: cannot watch signal %d: %s", fatal_sigs[i], strerror(errno));
	}
}

static bool resolve_real(void)
{
	if (!real_sigaction)
		real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
	return real_sigaction != NULL;
}

/* Resolved once at start: dlsym is not async-signal-safe, and the program
 * may change its mask in a signal handler. */
void ag_signals_init(void)
{
	resolve_real();
	real_pthread_sigmask = (sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
	real_sigprocmask = (sigmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
	real_sigsuspend = (sigsuspend_fn)dlsym(RTLD_NEXT, "sigsuspend");
	real_signalfd = (signalfd_fn)dlsym(RTLD_NEXT, "signalfd");
	real_sigwait = (sigwait_fn)dlsym(RTLD_NEXT, "sigwait");
	real_sigwaitinfo = (sigwaitinfo_fn)dlsym(RTLD_NEXT, "sigwaitinfo");
	real_sigtimedwait = (sigtimedwait_fn)dlsym(RTLD_NEXT, "sigtimedwait");
	keep_trap_open = real_pthread_sigmask && real_sigprocmask && real_sigsuspend;
	if (!keep_trap_open)
		ag_log("signals: cannot find the C library's signal-mask functions; a thread that "
		       "blocks SIGTRAP may be killed by a pending patch");
}

/* The agent leaves the process alone (a debugger traces it, main.c): the
 * interposers pass the program's calls on as they are. */
void ag_signals_stay_out(void)
{
	stay_out = true;
	keep_trap_open = false;
}

bool ag_trap_program_blocked(void)
{
	return *trap_view() != 0;
}

void ag_trap_hold(void)
{
	trap_held = 1;
}

/* What reaches the kernel: the program's mask without SIGTRAP.  *view is the
 * thread's belief after the call. */
static const sigset_t *open_trap(int how, const sigset_t *set, sigset_t *copy, uint8_t *view)
{
	*view = *trap_view();
	if (!set || !keep_trap_open)
		return set;
	if (sigismember(set, SIGTRAP) == 1) {
		*copy = *set;
		sigdelset(copy, SIGTRAP);
		if (how == SIG_BLOCK || how == SIG_SETMASK)
			*view = 1;
		else if (how == SIG_UNBLOCK)
			*view = 0;
		return copy;
	}
	if (how == SIG_SETMASK)
		*view = 0;
	return set;
}

static void mask_done(sigset_t *old, uint8_t view)
{
	if (!keep_trap_open)
		return;
	if (old && *trap_view())
		sigaddset(old, SIGTRAP);
	trap_view_blocked = view;
	if (!view && trap_held) {
		trap_held = 0;
		raise(SIGTRAP);
	}
}

static int set_mask(sigmask_fn real, int how, const sigset_t *set, sigset_t *old, bool errno_style)
{
	sigset_t copy;
	uint8_t view;
	const sigset_t *pass = open_trap(how, set, &copy, &view);
	int rc;

	if (!real) {
		if (errno_style)
			errno = ENOSYS;
		return errno_style ? -1 : ENOSYS;
	}
	rc = real(how, pass, old);
	if (rc == 0)
		mask_done(old, view);
	return rc;
}

AG_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	if (!real_pthread_sigmask)
		real_pthread_sigmask = (sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
	return set_mask(real_pthread_sigmask, how, set, old, false);
}

AG_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	if (!real_sigprocmask)
		real_sigprocmask = (sigmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
	return set_mask(real_sigprocmask, how, set, old, true);
}

/* A wait's set without SIGTRAP, which is the agent's: the signals a wait
 * takes (signalfd, sigwait*: step 4) never include it, and those blocked
 * while sigsuspend waits never do either.  A set of SIGTRAP alone waits for
 * nothing the program could have sent but SIGTRAP -- which the agent's
 * handler now holds. */
static const sigset_t *wait_set(const sigset_t *set, sigset_t *copy)
{
	if (!set || !keep_trap_open || sigismember(set, SIGTRAP) != 1)
		return set;
	*copy = *set;
	sigdelset(copy, SIGTRAP);
	return copy;
}

AG_EXPORT int sigsuspend(const sigset_t *mask)
{
	sigset_t copy;

	if (!real_sigsuspend)
		real_sigsuspend = (sigsuspend_fn)dlsym(RTLD_NEXT, "sigsuspend");
	if (!real_sigsuspend) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigsuspend(wait_set(mask, &copy));
}

AG_EXPORT int signalfd(int fd, const sigset_t *mask, int flags)
{
	sigset_t copy;

	if (!real_signalfd)
		real_signalfd = (signalfd_fn)dlsym(RTLD_NEXT, "signalfd");
	if (!real_signalfd) {
		errno = ENOSYS;
		return -1;
	}
	return real_signalfd(fd, wait_set(mask, &copy), flags);
}

AG_EXPORT int sigwait(const sigset_t *set, int *sig)
{
	sigset_t copy;

	if (!real_sigwait)
		real_sigwait = (sigwait_fn)dlsym(RTLD_NEXT, "sigwait");
	if (!real_sigwait)
		return ENOSYS;
	return real_sigwait(wait_set(set, &copy), sig);
}

AG_EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
	sigset_t copy;

	if (!real_sigwaitinfo)
		real_sigwaitinfo = (sigwaitinfo_fn)dlsym(RTLD_NEXT, "sigwaitinfo");
	if (!real_sigwaitinfo) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigwaitinfo(wait_set(set, &copy), info);
}

AG_EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
	sigset_t copy;

	if (!real_sigtimedwait)
		real_sigtimedwait = (sigtimedwait_fn)dlsym(RTLD_NEXT, "sigtimedwait");
	if (!real_sigtimedwait) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigtimedwait(wait_set(set, &copy), info, timeout);
}

/* Signalfds made before the attach (step 4): their masks lose SIGTRAP.
 * /proc/self/fdinfo shows a signalfd's mask as "sigmask:" in hex. */
static void open_old_signalfds(void)
{
	DIR *d = opendir("/proc/self/fdinfo");
	struct dirent *de;

	while (d && (de = readdir(d))) {
		char path[300], line[128];
		unsigned long long bits = 0;
		bool is_sfd = false;
		int fd = atoi(de->d_name);
		FILE *f;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof path, "/proc/self/fdinfo/%s", de->d_name);
		if (!(f = fopen(path, "re")))
			continue;
		while (fgets(line, sizeof line, f))
			if (strncmp(line, "sigmask:", 8) == 0) {
				bits = strtoull(line + 8, NULL, 16);
				is_sfd = true;
			}
		fclose(f);
		if (!is_sfd || !(bits >> (SIGTRAP - 1) & 1))
			continue;
		sigset_t mask;

		sigemptyset(&mask);
		for (int s = 1; s <= 64; s++)
			if (s != SIGTRAP && (bits >> (s - 1) & 1))
				sigaddset(&mask, s);
		if (real_signalfd && real_signalfd(fd, &mask, 0) == fd)
			ag_log("attach: signalfd %d waited for SIGTRAP too: no longer (the agent's)", fd);
		else
			ag_log("attach: signalfd %d waits for SIGTRAP too and cannot be changed (%s): it "
			       "may return the agent's", fd, strerror(errno));
	}
	if (d)
		closedir(d);
}

/* Attached: "TID:SELF,..." (hex thread pointers), the threads whose
 * SIGTRAP the injector opened (steps 1-2); and the old signalfds. */
void ag_signals_attached(const char *list)
{
	const char *p = list;
	uint32_t n = 0;

	while (p && *p && n < PRE_MAX) {
		char *end;
		long tid = strtol(p, &end, 10);

		if (end == p || *end != ':')
			break;
		pre[n].self = strtoull(end + 1, &end, 16);
		pre[n].tid = (int)tid;
		n++;
		ag_log("attach: thread %ld had SIGTRAP blocked: unblocked, the program still sees "
		       "it blocked", tid);
		p = *end == ',' ? end + 1 : NULL;
	}
	__atomic_store_n(&npre, n, __ATOMIC_RELEASE);
	open_old_signalfds();
}

/* The C library's sigaction, for the agent's own handlers (its calls to
 * sigaction() would reach the interposer above). */
int ag_real_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (!resolve_real()) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigaction(sig, act, old);
}

static bool is_function(const struct sigaction *sa)
{
	return (sa->sa_flags & SA_SIGINFO) ? sa->sa_sigaction != NULL
		: (sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN);
}

static void handle(int sig, siginfo_t *si, void *uc, const struct sigaction *user_sa);

static void call_user(int sig, siginfo_t *si, void *uc, const struct sigaction *sa)
{
	if (sa->sa_flags & SA_SIGINFO)
		sa->sa_sigaction(sig, si, uc);
	else if (sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN)
		sa->sa_handler(sig);
}

static void ag_sig_wrapper(int sig, siginfo_t *si, void *uc)
{
	struct sigaction sa = user[sig];
	uint8_t view = *trap_view();
	/* The interrupted code may be an indirect call's miss, between putting
	 * its target in ag_tls_target and taking it back (x86_64/emit.c): the
	 * handler's own misses must not leave theirs there. */
	uint64_t target = ag_tls_target;

	/* The program's SIGSEGV handler never sees a fault of the agent's. */
	if (ag_tsc_fault(sig, si, uc))
		return;

	/* While the handler runs the program believes SIGTRAP blocked if its
	 * sa_mask said so (the kernel was given the mask without it). */
	if (keep_trap_open && sigismember(&sa.sa_mask, SIGTRAP) == 1)
		trap_view_blocked = 1;
	handle(sig, si, uc, &sa);
	trap_view_blocked = view;
	ag_tls_target = target;
}

static void handle(int sig, siginfo_t *si, void *uc, const struct sigaction *user_sa)
{
	struct sigaction sa = *user_sa;
	uint64_t fn = (uint64_t)(uintptr_t)((sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction
									: (void *)sa.sa_handler);
	ag_module *m = ag_active() && !ag_busy() && !ag_tls_quiet && ag_may_trace()
		       ? ag_module_of(fn) : NULL;
	uint32_t func = m ? ca_func_at(m->ca, fn - m->bias) : CA_NONE;
	trace_ring_header *ring;
	uint32_t site;
	int saved = errno;

	if (sa.sa_flags & SA_RESETHAND)
		memset(&user[sig], 0, sizeof user[sig]);    /* the kernel reset ours too */

	if (func == CA_NONE || ca_module_funcs(m->ca, NULL)[func].addr != fn - m->bias) {
		errno = saved;
		call_user(sig, si, uc, &sa);
		return;
	}
	ring = ag_enter();
	if (!ring)
		ring = ag_ring_create();
	site = root_site[sig];
	if (!site)
		root_site[sig] = site = ag_site_root(m, func);
	ag_ring_put(ring, TRACE_ENTRY, site);
	ag_instrument(m, func);
	ag_leave(ring);
	errno = saved;
	call_user(sig, si, uc, &sa);
	saved = errno;
	ring = ag_enter();
	if (ag_active())
		ag_ring_put(ring, TRACE_EXIT, site);
	ag_leave(ring);
	errno = saved;
}

AG_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction mine, prev, keep;
	int rc;

	if (!resolve_real()) {
		errno = ENOSYS;
		return -1;
	}
	if (sig <= 0 || sig >= NSIG_MAX || sig == SIGKILL || sig == SIGSTOP || stay_out)
		return real_sigaction(sig, act, old);
	if (sig == SIGTRAP)
		return ag_trap_chain(act, old);
	keep = user[sig];
	if (act && keep_trap_open && is_fatal(sig) && !(act->sa_flags & SA_SIGINFO) &&
	    act->sa_handler == SIG_DFL) {
		/* Back to the default action: on_fatal stands in for it. */
		memset(&user[sig], 0, sizeof user[sig]);
		user[sig].sa_mask = act->sa_mask;
		rc = real_sigaction(sig, NULL, &prev);
		if (rc == 0)
			rc = install_fatal(sig);
	} else if (act && is_function(act)) {
		/* The program's handler is recorded before the kernel can call
		 * the wrapper for it. */
		user[sig] = *act;
		mine = *act;
		mine.sa_flags |= SA_SIGINFO;
		mine.sa_sigaction = ag_sig_wrapper;
		if (keep_trap_open)
			sigdelset(&mine.sa_mask, SIGTRAP);
		rc = real_sigaction(sig, &mine, &prev);
	} else {
		rc = real_sigaction(sig, act, &prev);
	}
	if (rc != 0) {
		user[sig] = keep;
		return rc;
	}
	/* What the program installed before, as it installed it. */
	if (old) {
		if (prev.sa_sigaction == ag_sig_wrapper)
			*old = keep;
		else if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == on_fatal) {
			memset(old, 0, sizeof *old);    /* SIG_DFL, as far as the program knows */
			old->sa_handler = SIG_DFL;
		} else
			*old = prev;
	}
	return 0;
}

AG_EXPORT __sighandler_t signal(int sig, __sighandler_t handler)
{
	struct sigaction sa, old;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sa.sa_flags = SA_RESTART;       /* glibc's signal(): BSD semantics */
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, sig);
	if (sigaction(sig, &sa, &old) != 0)
		return SIG_ERR;
	return old.sa_handler;
}
