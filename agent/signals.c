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
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "agent.h"

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

#define NSIG_MAX 65

static struct sigaction user[NSIG_MAX];     /* what the program installed */
static volatile uint32_t root_site[NSIG_MAX];
static sigaction_fn real_sigaction;

static bool resolve_real(void)
{
	if (!real_sigaction)
		real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
	return real_sigaction != NULL;
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
	uint64_t fn = (uint64_t)(uintptr_t)((sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction
									: (void *)sa.sa_handler);
	ag_module *m = ag_active() && !ag_busy() ? ag_module_of(fn) : NULL;
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
	if (sig <= 0 || sig >= NSIG_MAX || sig == SIGKILL || sig == SIGSTOP)
		return real_sigaction(sig, act, old);
	if (sig == SIGTRAP)
		return ag_trap_chain(act, old);
	keep = user[sig];
	if (act && is_function(act)) {
		/* The program's handler is recorded before the kernel can call
		 * the wrapper for it. */
		user[sig] = *act;
		mine = *act;
		mine.sa_flags |= SA_SIGINFO;
		mine.sa_sigaction = ag_sig_wrapper;
		rc = real_sigaction(sig, &mine, &prev);
	} else {
		rc = real_sigaction(sig, act, &prev);
	}
	if (rc != 0) {
		user[sig] = keep;
		return rc;
	}
	/* What the program installed before, as it installed it. */
	if (old)
		*old = prev.sa_sigaction == ag_sig_wrapper ? keep : prev;
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
