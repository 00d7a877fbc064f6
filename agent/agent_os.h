/*
 * agent_os.h — the agent's declarations that name the C library's signal
 * and thread types (siginfo_t, pthread_t): what the SIGTRAP and
 * fatal-signal handlers hand on, and the real pthread_create.  Apart from
 * agent.h, which thus includes neither <signal.h> nor <pthread.h>; the
 * files that use these include this header.
 */
#ifndef AGENT_OS_H
#define AGENT_OS_H

#include <pthread.h>
#include <signal.h>
#include <ucontext.h>

#include "agent.h"

#ifndef TRAP_PERF
#define TRAP_PERF 6     /* si_code of a perf event's SIGTRAP (Linux 5.13) */
#endif

/* ---- activate.c ---- */
bool ag_activation_trap(siginfo_t *si, ucontext_t *uc);   /* patch.c's SIGTRAP handler */

/* ---- relocate.c ---- */
bool ag_reloc_trap(siginfo_t *si, ucontext_t *uc);        /* patch.c's SIGTRAP handler */

/* ---- tsc.c ---- */
/* Fatal-signal handlers first (signals.c): a SIGSEGV of an agent's rdtsc,
 * handled. */
bool ag_tsc_fault(int sig, const siginfo_t *si, ucontext_t *uc);

/* ---- threads.c ---- */
/* The C library's pthread_create, past the agent's interposer. */
int ag_real_pthread_create(pthread_t *th, const pthread_attr_t *attr,
			   void *(*start)(void *), void *arg);

#endif
