/*
 * no_perf_event.c — run a command with perf_event_open(2) failing (ENOSYS),
 * for the callgrind measurement of bench/agent/agent_bench.py.
 *
 *   no_perf_event PROGRAM [ARGS...]
 *
 * The agent's activation trap is a hardware execute breakpoint
 * (perf_event_open), which never fires under valgrind: valgrind runs its own
 * translation of the code, not the instruction at the breakpoint's address.
 * With perf_event_open refused, the agent falls back to an int3 at the
 * entry, which valgrind (--smc-check=all) does see.  A seccomp filter
 * refuses the call for this process and everything it runs; nothing else
 * changes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_perf_event_open, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof f / sizeof *f, .filter = f };

	if (argc < 2) {
		fprintf(stderr, "usage: no_perf_event PROGRAM [ARGS...]\n");
		return 2;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
		fprintf(stderr, "no_perf_event: cannot install the seccomp filter: %s\n", strerror(errno));
		return 126;
	}
	execvp(argv[1], argv + 1);
	fprintf(stderr, "no_perf_event: cannot run %s: %s\n", argv[1], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}
