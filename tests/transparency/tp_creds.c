/*
 * tp_creds.c — a program that drops root the way setpriv does (agent/creds.c):
 * it keeps its capabilities through setresuid (prctl PR_SET_KEEPCAPS), sets
 * them on its one thread with capset -- once through syscall(), as libcap
 * does, once through the C library's capset -- and calls setresgid after
 * each.  Alone in its process, glibc makes each setresgid on this thread
 * only; under the agent, on the agent's thread too, whose result must agree
 * (glibc aborts otherwise): the first succeeds (CAP_SETGID in effect), the
 * second fails with EPERM (none in effect).  Run as root; otherwise it says
 * so and does nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "tp.h"

#define BIT(c) (1u << (c))

int tp_setup(const char *scratch)
{
	(void)scratch;
	return 0;
}

/* effective and permitted sets of the calling thread; libc: through the C
 * library's capset, else syscall() */
TP_NOINLINE static int set_caps(unsigned eff, unsigned perm, int libc)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2] = { { eff, perm, 0 }, { 0, 0, 0 } };
	extern int capset(cap_user_header_t, cap_user_data_t);

	return libc ? capset(&h, d) : (int)syscall(SYS_capset, &h, d);
}

static void say(const char *what, int rc)
{
	printf("%s: %d%s\n", what, rc, rc ? (errno == EPERM ? " EPERM" : " other error") : "");
}

int tp_after_go(const char *scratch)
{
	uid_t r, e, s;
	gid_t gr, ge, gs;

	(void)scratch;
	if (getuid() != 0) {
		printf("not root: nothing to drop\n");
		return 0;
	}
	say("prctl(PR_SET_KEEPCAPS, 1)", prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0));
	say("setresuid(61001)", setresuid(61001, 61001, 61001));
	say("syscall(SYS_capset): CAP_SETGID in effect",
	    set_caps(BIT(CAP_SETGID), BIT(CAP_SETGID) | BIT(CAP_SETUID), 0));
	say("setresgid(61002)", setresgid(61002, 61002, 61002));
	say("capset: nothing in effect", set_caps(0, BIT(CAP_SETGID), 1));
	say("setresgid(61001)", setresgid(61001, 61001, 61001));
	getresuid(&r, &e, &s);
	getresgid(&gr, &ge, &gs);
	printf("uids %u %u %u, gids %u %u %u\n", (unsigned)r, (unsigned)e, (unsigned)s,
	       (unsigned)gr, (unsigned)ge, (unsigned)gs);
	return 0;
}
