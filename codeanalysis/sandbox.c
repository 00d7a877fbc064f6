/*
 * sandbox.c — shut a child process in before it parses untrusted bytes.
 *
 * lines.c runs libdwarf in a child (libdwarf 20210528 has memory-safety bugs
 * on malformed DWARF).  That child may be root, and the DWARF comes from the
 * file being analysed, which anyone may have written.  ca_sandbox_enter()
 * takes away everything the child does not need to turn those bytes into
 * rows and write them to its parent:
 *
 *   1. Descriptors: every one but stdin/stdout/stderr and the caller's
 *      (the DWARF file, the result pipe) is closed, so that nothing the
 *      parent had open (a repository entry being written, a socket, a
 *      ptrace'd process's memory) is reachable.
 *   2. Identity: if any of its user ids is 0, it becomes nobody/nogroup
 *      (65534, no supplementary groups), with no capabilities left.  The
 *      files it reads are already open; it needs no permission at all.
 *   3. PR_SET_NO_NEW_PRIVS: required to install a filter without
 *      CAP_SYS_ADMIN, and no exec can give privileges back.
 *   4. A seccomp filter (classic BPF, below): the system calls malloc, stdio
 *      and the readers make on open descriptors, and nothing else.  No
 *      open/openat, socket, exec, ptrace, kill; write only to the result
 *      pipe and stderr; a signal only to itself (abort()); no executable
 *      mapping.  Anything else kills the process (SIGSYS), which the
 *      parent reports like a crash.
 *
 * Each step is checked; a failure leaves the caller unsandboxed with an
 * error, and the caller then reads nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ca_internal.h"

#define NOBODY 65534

#define ARCH_OFF offsetof(struct seccomp_data, arch)
#define NR_OFF   offsetof(struct seccomp_data, nr)
/* The low 32 bits of an argument (x86-64 is little endian). */
#define ARG_OFF(i) offsetof(struct seccomp_data, args[i])

#define KILL  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS)
#define ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define ALLOW_NR(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), ALLOW

/* Close every descriptor from 3 up but those in keep[]. */
static int close_others(const int *keep, size_t nkeep, sp_err *err)
{
	unsigned next = 3;

	for (;;) {
		unsigned upto = ~0u;   /* the next kept descriptor above `next` */

		for (size_t i = 0; i < nkeep; i++)
			if (keep[i] >= (int)next && (unsigned)keep[i] < upto)
				upto = (unsigned)keep[i];
		if (upto > next && close_range(next, upto - 1, 0) < 0)
			return sp_fail(err, "close_range: %s", strerror(errno));
		if (upto == ~0u)
			return 0;
		next = upto + 1;
	}
}

static int drop_root(sp_err *err)
{
	uid_t r, e, s;
	gid_t rg, eg, sg;

	if (getresuid(&r, &e, &s) < 0)
		return sp_fail(err, "getresuid: %s", strerror(errno));
	if (r != 0 && e != 0 && s != 0)
		return 0;
	if (setgroups(0, NULL) < 0)
		return sp_fail(err, "setgroups: %s", strerror(errno));
	if (setresgid(NOBODY, NOBODY, NOBODY) < 0)
		return sp_fail(err, "setresgid(%d): %s", NOBODY, strerror(errno));
	if (setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return sp_fail(err, "setresuid(%d): %s", NOBODY, strerror(errno));
	if (getresuid(&r, &e, &s) < 0 || getresgid(&rg, &eg, &sg) < 0 ||
	    r != NOBODY || e != NOBODY || s != NOBODY || rg != NOBODY || eg != NOBODY ||
	    sg != NOBODY)
		return sp_fail(err, "the user and group ids are not %d after setresuid", NOBODY);
	return 0;
}

static int install_filter(int out_fd, sp_err *err)
{
	pid_t self = getpid();
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARCH_OFF),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		KILL,
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR_OFF),
		/* the x32 ABI's numbers have this bit: not ours */
		BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1),
		KILL,

		/* write, writev: the result pipe and stderr (sanitizer reports,
		 * glibc's "double free detected") only */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_write, 1, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_writev, 0, 5),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_OFF(0)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)out_fd, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, STDERR_FILENO, 1, 0),
		KILL,
		ALLOW,

		/* tgkill: only to itself (abort() after glibc finds a corrupt
		 * heap, so that a crash reads as SIGABRT, not as SIGSYS) */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_tgkill, 0, 4),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_OFF(0)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)self, 1, 0),
		KILL,
		ALLOW,

		/* mmap, mprotect: never executable */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, 1, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mprotect, 0, 4),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_OFF(2)),
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
		KILL,
		ALLOW,

		/* fcntl: F_GETFD, F_GETFL only (libelf's elf_begin checks its
		 * descriptor) */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fcntl, 0, 5),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_OFF(1)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, F_GETFD, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, F_GETFL, 1, 0),
		KILL,
		ALLOW,

		/* reading the open DWARF file (libdwarf: lseek+read; libelf:
		 * mmap, pread) */
		ALLOW_NR(__NR_read),
		ALLOW_NR(__NR_pread64),
		ALLOW_NR(__NR_lseek),
		/* glibc's fstat is newfstatat(fd, "", AT_EMPTY_PATH); a path
		 * there gives metadata only, and nothing leaves but the pipe */
		ALLOW_NR(__NR_fstat),
		ALLOW_NR(__NR_newfstatat),
		/* memory */
		ALLOW_NR(__NR_munmap),
		ALLOW_NR(__NR_mremap),
		ALLOW_NR(__NR_brk),
		ALLOW_NR(__NR_madvise),
		ALLOW_NR(__NR_getrandom),     /* glibc malloc's first call */
		/* leaving */
		ALLOW_NR(__NR_close),
		ALLOW_NR(__NR_exit),
		ALLOW_NR(__NR_exit_group),
		ALLOW_NR(__NR_rt_sigreturn),
		ALLOW_NR(__NR_rt_sigprocmask),
		ALLOW_NR(__NR_getpid),
		ALLOW_NR(__NR_gettid),
		ALLOW_NR(__NR_sigaltstack),   /* ASan's _exit interceptor */
		KILL,
	};
	struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return sp_fail(err, "PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		return sp_fail(err, "installing the seccomp filter: %s", strerror(errno));
	return 0;
}

int ca_sandbox_enter(const int *keep, size_t nkeep, int out_fd, sp_err *err)
{
	if (close_others(keep, nkeep, err) < 0 || drop_root(err) < 0 ||
	    install_filter(out_fd, err) < 0)
		return -1;
	return 0;
}
