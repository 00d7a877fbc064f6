/*
 * inject.c — loading a shared object into a running process.
 *
 * The protocol (a thread of the target is stopped only for the first part):
 *
 *   1. Find a thread at a safe point.  Each thread in turn is seized and
 *      interrupted (PTRACE_SEIZE + PTRACE_INTERRUPT) until one is found
 *      stopped at the exit of a waiting system call (epoll_wait, accept,
 *      read, poll, futex, nanosleep, ...) made from the C library's own code
 *      or from a Go runtime's (safe_point): such a thread holds none of the
 *      C library's locks (malloc's, the loader's), so functions called on it
 *      cannot deadlock.  Others are let go at once.  A thread interrupted in
 *      a system call that would now return EINTR is set to make the call
 *      again, so the program never sees an EINTR of ours; calls the kernel
 *      restarts itself (ERESTART*) are restarted by the kernel when the
 *      original registers come back.  A group stop met here (kill -STOP)
 *      ends the attempt: a stopped process would load the agent only after
 *      a SIGCONT, long after we gave up.
 *   2. Save its registers and its whole XSAVE state.  Make a stack of our
 *      own: mmap as a raw system call on the thread's own syscall
 *      instruction (rsyscall: no stack used), since the thread's stack may
 *      be a goroutine's few kilobytes.  Make remote calls on it: registers
 *      set for the System V ABI, orig_rax = -1 (no syscall restart
 *      meddles), the stack pointer at our stack's top, 16-byte aligned, and
 *      a return address of 0: the function's return faults at address 0,
 *      which ptrace reports and we swallow.  Other signals arriving
 *      meanwhile are held and sent again at the end.  The calls: mmap (data
 *      block), mmap (code page), memfd_create; the object is written into
 *      the memfd through /proc/PID/fd (so the target's mount namespace does
 *      not matter); then pthread_create of the loader thread (loader.S) on a
 *      page written through /proc/PID/mem.
 *   3. Unmap our stack, restore the registers and the XSAVE state, detach.
 *      The thread runs on as if nothing happened (a waiting call is
 *      restarted).
 *   4. The loader thread -- a real thread of the C library -- calls dlopen
 *      on /proc/self/fd/N, then the entry function with its argument, and
 *      sets a flag that the injector polls through /proc/PID/mem.  If we
 *      give up waiting before the entry function is called, the loader
 *      closes the object instead (cancel_load): no load stays pending.
 *
 * dlopen and malloc thus never run on the stopped thread; pthread_create
 * does, at the safe point.
 */
#include "injector.h"

#include <ctype.h>
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern const char inj_loader_start[], inj_loader_end[];

#define DATA_SIZE (64 * 1024)
#define XSTATE_MAX (16 * 1024)
#ifndef NT_X86_XSTATE
#define NT_X86_XSTATE 0x202
#endif
#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- what the target is ---- */

/* A field of /proc/PID/status, or of /proc/PID/task/TID/status when tid is
 * not 0. */
static int task_status_field(pid_t pid, pid_t tid, const char *key, char *out, size_t len)
{
	char path[96], line[512];
	size_t k = strlen(key);
	FILE *f;
	int found = 0;

	if (tid)
		snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, (int)tid);
	else
		snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	while (!found && fgets(line, sizeof line, f))
		if (strncmp(line, key, k) == 0 && line[k] == ':') {
			char *v = line + k + 1;

			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = '\0';
			snprintf(out, len, "%s", v);
			found = 1;
		}
	fclose(f);
	return found ? 0 : -1;
}

static int status_field(pid_t pid, const char *key, char *out, size_t len)
{
	return task_status_field(pid, 0, key, out, len);
}

/* A signal-set field of a thread's status (SigBlk, SigPnd, ShdPnd, ...). */
static bool task_sigset_has(pid_t pid, pid_t tid, const char *key, int sig)
{
	char v[64];

	return task_status_field(pid, tid, key, v, sizeof v) == 0 &&
	       (strtoull(v, NULL, 16) >> (sig - 1) & 1);
}

/* Is any thread of pid stopped by job control (kill -STOP, ^Z: state T)?
 * Its tid, else 0. */
static pid_t stopped_thread(pid_t pid)
{
	char path[64], v[64];
	struct dirent *de;
	pid_t found = 0;
	DIR *d;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return 0;
	while (!found && (de = readdir(d)))
		if (isdigit((unsigned char)de->d_name[0]) &&
		    task_status_field(pid, atoi(de->d_name), "State", v, sizeof v) == 0 && v[0] == 'T')
			found = atoi(de->d_name);
	closedir(d);
	return found;
}

static int fail_stopped(sp_err *err, pid_t pid)
{
	return sp_fail(err, "pid %d is stopped (kill -STOP, or a shell's job control): it could "
		       "not load the agent until it runs again, so nothing is attempted; resume it "
		       "with 'kill -CONT %d' and attach again", (int)pid, (int)pid);
}

int inj_has_mapping(pid_t pid, const char *name)
{
	char path[64], line[PATH_MAX + 128];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, name) != NULL;
	fclose(f);
	return found;
}

/* The target's C library: its load address and its path as the target sees
 * it.  0, or -1 when there is none (static, or not glibc). */
static int find_libc(pid_t pid, uint64_t *base, uint64_t *text_lo, uint64_t *text_hi,
		     char *file, size_t len)
{
	char path[64], line[PATH_MAX + 128];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	*text_lo = *text_hi = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi, off;
		char perms[8], name[PATH_MAX];

		name[0] = '\0';
		if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095[^\n]", &lo, &hi, perms, &off, name) < 4)
			continue;
		const char *slash = strrchr(name, '/');

		if (!slash || strncmp(slash + 1, "libc.so.6", 9) != 0)
			continue;
		if (off == 0 && !found) {
			*base = lo;
			snprintf(file, len, "%s", name);
			found = 1;
		}
		if (perms[2] == 'x') {
			*text_lo = lo;
			*text_hi = hi;
		}
	}
	fclose(f);
	return found && *text_hi ? 0 : -1;
}

/* Why the kernel keeps us out of pid (its /proc/PID/exe was refused): the
 * three reasons ptrace_may_access has, as far as /proc/PID/status tells. */
static int denied(pid_t pid, sp_err *err)
{
	char v[256], ours[64];
	unsigned long long theirs_caps = 0, our_caps = 0;
	unsigned euid = 0;

	if (status_field(pid, "Uid", v, sizeof v) == 0)
		sscanf(v, "%*u %u", &euid);
	if (euid != (unsigned)geteuid())
		return sp_fail(err, "pid %d: permission denied: it runs as uid %u, not as you; run "
			       "sptrace as that user or as root (CAP_SYS_PTRACE)", (int)pid, euid);
	if (status_field(pid, "CapPrm", v, sizeof v) == 0)
		theirs_caps = strtoull(v, NULL, 16);
	if (status_field(getpid(), "CapEff", ours, sizeof ours) == 0)
		our_caps = strtoull(ours, NULL, 16);
	if (theirs_caps & ~our_caps)
		return sp_fail(err, "pid %d: permission denied: it runs as your user (uid %u) but "
			       "holds capabilities sptrace lacks (its CapPrm %s, sptrace's CapEff %s), "
			       "and the kernel lets no process trace a more privileged one", (int)pid,
			       euid, v, ours);
	return sp_fail(err, "pid %d: permission denied: it runs as your user (uid %u) but is not "
		       "dumpable (it changed its credentials, or said so with prctl), or "
		       "kernel.yama.ptrace_scope forbids it; run sptrace as root", (int)pid, euid);
}

int inj_check(pid_t pid, sp_err *err)
{
	char v[256], path[64], exe[PATH_MAX], file[PATH_MAX];
	unsigned char ident[EI_NIDENT];
	uint64_t base, lo, hi;
	ssize_t n;
	int fd;

	if (pid <= 0)
		return sp_fail(err, "'%d' is not a process id", (int)pid);
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return sp_fail(err, "pid %d: no such process", (int)pid);
	if (pid == getpid())
		return sp_fail(err, "pid %d is sptrace itself", (int)pid);
	/* init: if it faulted (or the agent in it), the kernel would panic, or
	 * the container end -- no trace is worth that. */
	if (pid == 1) {
		if (status_field(pid, "Name", v, sizeof v) != 0)
			snprintf(v, sizeof v, "?");
		return sp_fail(err, "pid 1 (%s) is the init process: if it died the whole system (or "
			       "container) would go with it, so sptrace never attaches to it", v);
	}
	snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
	n = readlink(path, exe, sizeof exe - 1);
	if (n < 0) {
		if (errno == EACCES || errno == EPERM)
			return denied(pid, err);
		return sp_fail(err, "pid %d: cannot read %s: %s (a kernel thread?)", (int)pid, path,
			       strerror(errno));
	}
	exe[n] = '\0';
	if (status_field(pid, "TracerPid", v, sizeof v) == 0 && atoi(v) != 0)
		return sp_fail(err, "pid %d is already traced by pid %s (a debugger or another "
			       "tracer); detach it first", (int)pid, v);
	/* A stopped process would take the agent only after a SIGCONT, long
	 * after attach gave up: refused before anything is touched. */
	if (stopped_thread(pid))
		return fail_stopped(err, pid);
	if (status_field(pid, "Seccomp", v, sizeof v) == 0 && atoi(v) == 2)
		return sp_fail(err, "pid %d runs under a seccomp filter, which may forbid (or kill "
			       "the process for) the calls the agent needs: memfd_create, mmap, "
			       "clone, perf_event_open, membarrier; not attempted", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, ident, sizeof ident);
		close(fd);
		if (n == EI_NIDENT && memcmp(ident, ELFMAG, SELFMAG) == 0 &&
		    ident[EI_CLASS] != ELFCLASS64)
			return sp_fail(err, "pid %d runs %s, a 32-bit program: not supported (x86-64 "
				       "only)", (int)pid, exe);
	}
	if (find_libc(pid, &base, &lo, &hi, file, sizeof file) != 0)
		return sp_fail(err, "pid %d runs %s, which does not use the GNU C library "
			       "(statically linked, or musl): not supported", (int)pid, exe);
	n = 0;
	fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char s[8] = "";

		n = read(fd, s, sizeof s - 1);
		close(fd);
		if (n > 0 && atoi(s) == 3)
			return sp_fail(err, "ptrace is disabled on this machine (kernel.yama."
				       "ptrace_scope = 3); no process can be attached to");
	}
	return 0;
}

/* ---- symbols of the target's libc ---- */

typedef struct libc_syms {
	uint64_t dlopen, dlsym, dlerror, close, pthread_detach, pthread_self;
	uint64_t mmap, memfd_create, pthread_create, dlclose;
} libc_syms;

static int resolve_syms(pid_t pid, uint64_t base, const char *file, libc_syms *s, sp_err *err)
{
	static const char *const names[] = { "dlopen", "dlsym", "dlerror", "close",
					     "pthread_detach", "pthread_self", "mmap",
					     "memfd_create", "pthread_create", "dlclose" };
	uint64_t *slot[] = { &s->dlopen, &s->dlsym, &s->dlerror, &s->close, &s->pthread_detach,
			     &s->pthread_self, &s->mmap, &s->memfd_create, &s->pthread_create,
			     &s->dlclose };
	char path[PATH_MAX + 64];
	Elf_Scn *scn = NULL, *versym_scn = NULL;
	GElf_Shdr sh, dyn_sh;
	Elf_Data *syms = NULL, *vers = NULL;
	Elf *e;
	int fd;
	size_t strndx = 0, nsyms = 0;

	/* The file as the target sees it (its mount namespace): /proc/PID/root. */
	snprintf(path, sizeof path, "/proc/%d/root%s", (int)pid, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sp_fail(err, "pid %d: cannot open its C library %s: %s", (int)pid, path,
			       strerror(errno));
	elf_version(EV_CURRENT);
	e = elf_begin(fd, ELF_C_READ, NULL);
	while (e && (scn = elf_nextscn(e, scn))) {
		if (!gelf_getshdr(scn, &sh))
			continue;
		if (sh.sh_type == SHT_DYNSYM) {
			syms = elf_getdata(scn, NULL);
			dyn_sh = sh;
			strndx = sh.sh_link;
			nsyms = sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
		} else if (sh.sh_type == SHT_GNU_versym) {
			versym_scn = scn;
		}
	}
	if (versym_scn)
		vers = elf_getdata(versym_scn, NULL);
	memset(s, 0, sizeof *s);
	for (size_t i = 0; syms && i < nsyms; i++) {
		GElf_Sym sym;
		const char *nm;

		if (!gelf_getsym(syms, (int)i, &sym) || sym.st_value == 0 ||
		    GELF_ST_TYPE(sym.st_info) != STT_FUNC)
			continue;
		nm = elf_strptr(e, strndx, sym.st_name);
		if (!nm)
			continue;
		/* The default version of a versioned symbol (not "hidden"). */
		if (vers && i * 2 + 2 <= vers->d_size &&
		    (((const uint16_t *)vers->d_buf)[i] & 0x8000))
			continue;
		for (size_t k = 0; k < sizeof names / sizeof *names; k++)
			if (strcmp(nm, names[k]) == 0)
				*slot[k] = base + sym.st_value;
	}
	(void)dyn_sh;
	if (e)
		elf_end(e);
	close(fd);
	for (size_t k = 0; k < sizeof names / sizeof *names; k++)
		if (!*slot[k])
			return sp_fail(err, "pid %d: its C library %s has no %s (glibc older than "
				       "2.34, which has dlopen in libc?): not supported", (int)pid,
				       file, names[k]);
	return 0;
}

/* ---- a stopped thread ---- */

typedef struct tgt {
	pid_t pid, tid;
	int mem;                           /* /proc/PID/mem */
	struct user_regs_struct regs;      /* as the thread was */
	uint8_t xstate[XSTATE_MAX];
	size_t xstate_len;
	uint64_t held_signals;             /* arrived during our calls: sent again */
	uint64_t held_queued;              /* ... of those, sent with held_info */
	siginfo_t held_info[64];
	uint64_t stack;                    /* our stack for the remote calls (STACK_SIZE) */
	bool restart;                      /* its system call is to be made again */
	bool reniced;                      /* its nice level is ours for now ... */
	int nice;                          /* ... and this is its own */
} tgt;

/*
 * A signal that arrived while we held the thread (it stands in its
 * signal-delivery stop): kept from it now, sent again at release.  One that
 * was queued (si_code < 0 but not tgkill's: sigqueue, and the agent's own
 * activation and relocation requests, which it knows by their sender and
 * value) goes again with its siginfo; sent again by tgkill it would arrive
 * anonymous, and the agent would take its own request for the program's
 * SIGTRAP, whose default action kills (an attach with --on 'timer 0'
 * activated while we still held threads).
 */
static void hold_signal(tgt *t, int sig)
{
	siginfo_t si;

	if (sig < 1 || sig > 64)
		return;
	t->held_signals |= 1ull << (sig - 1);
	if (ptrace(PTRACE_GETSIGINFO, t->tid, 0, &si) == 0 && si.si_signo == sig &&
	    si.si_code < 0 && si.si_code != SI_TKILL) {
		t->held_info[sig - 1] = si;
		t->held_queued |= 1ull << (sig - 1);
	}
}

#define STACK_SIZE (256 * 1024)

static int mem_write(tgt *t, uint64_t addr, const void *buf, size_t n)
{
	return pwrite(t->mem, buf, n, (off_t)addr) == (ssize_t)n ? 0 : -1;
}

static int mem_read(int mem, uint64_t addr, void *buf, size_t n)
{
	return pread(mem, buf, n, (off_t)addr) == (ssize_t)n ? 0 : -1;
}

/* System calls a thread waits in.  Their names are for messages. */
static const char *waiting_call(long nr)
{
	switch (nr) {
	case SYS_read: return "read";
	case SYS_poll: return "poll";
	case SYS_select: return "select";
	case SYS_pause: return "pause";
	case SYS_nanosleep: return "nanosleep";
	case SYS_accept: return "accept";
	case SYS_recvfrom: return "recvfrom";
	case SYS_recvmsg: return "recvmsg";
	case SYS_wait4: return "wait4";
	case SYS_futex: return "futex";
	case SYS_epoll_wait: return "epoll_wait";
	case SYS_clock_nanosleep: return "clock_nanosleep";
	case SYS_epoll_pwait: return "epoll_pwait";
	case SYS_accept4: return "accept4";
	case SYS_ppoll: return "ppoll";
	case SYS_pselect6: return "pselect6";
	case SYS_rt_sigtimedwait: return "rt_sigtimedwait";
	case SYS_rt_sigsuspend: return "rt_sigsuspend";
	case SYS_waitid: return "waitid";
	case SYS_recvmmsg: return "recvmmsg";
	case SYS_msgrcv: return "msgrcv";
	case SYS_semtimedop: return "semtimedop";
	/* One of those with a timeout, made again after a stop (the kernel
	 * restarts it through restart_syscall) */
	case SYS_restart_syscall: return "a restarted wait (restart_syscall)";
#ifdef SYS_epoll_pwait2
	case SYS_epoll_pwait2: return "epoll_pwait2";
#endif
	default: return NULL;
	}
}

/* Seize and stop one thread: 0 stopped (regs read); -1 error; -2 the
 * process is stopped by job control (err says what to do). */
static int seize(tgt *t, pid_t tid, sp_err *err)
{
	int st;

	t->tid = tid;
	/* TRACESYSGOOD: the system-call stops of rsyscall() are told apart
	 * from a real SIGTRAP. */
	if (ptrace(PTRACE_SEIZE, tid, 0, (void *)(long)PTRACE_O_TRACESYSGOOD) != 0) {
		if (errno == EPERM) {
			char scope[8] = "";
			int fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);

			if (fd >= 0) {
				if (read(fd, scope, sizeof scope - 1) < 0)
					scope[0] = '\0';
				close(fd);
			}
			if (atoi(scope) >= 1 && geteuid() != 0)
				return sp_fail(err, "pid %d: ptrace not permitted: kernel.yama."
					       "ptrace_scope is %d, which lets only a parent trace "
					       "its children; run as root (or with CAP_SYS_PTRACE), or "
					       "set it to 0", (int)t->pid, atoi(scope));
			return sp_fail(err, "pid %d: ptrace not permitted (another user's process, "
				       "or no CAP_SYS_PTRACE); run sptrace as its user or as root",
				       (int)t->pid);
		}
		return sp_fail(err, "pid %d: cannot attach to thread %d: %s", (int)t->pid, (int)tid,
			       strerror(errno));
	}
	if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) != 0) {
		ptrace(PTRACE_DETACH, tid, 0, 0);
		return sp_fail(err, "pid %d: cannot stop thread %d: %s", (int)t->pid, (int)tid,
			       strerror(errno));
	}
	for (;;) {
		if (waitpid(tid, &st, __WALL) < 0)
			return sp_fail(err, "pid %d: waiting for thread %d: %s", (int)t->pid, (int)tid,
				       strerror(errno));
		if (WIFEXITED(st) || WIFSIGNALED(st))
			return sp_fail(err, "pid %d: thread %d ended", (int)t->pid, (int)tid);
		if (WIFSTOPPED(st) && (st >> 16) == PTRACE_EVENT_STOP) {
			/* Our interrupt stops with SIGTRAP; a group stop (the
			 * process was stopped since inj_check) with the stopping
			 * signal.  Detached, it stays stopped, as it was. */
			if (WSTOPSIG(st) == SIGTRAP)
				break;
			ptrace(PTRACE_DETACH, tid, 0, 0);
			fail_stopped(err, t->pid);
			return -2;
		}
		/* A signal on its way to the thread: hold it, it goes again at the end. */
		if (WIFSTOPPED(st)) {
			hold_signal(t, WSTOPSIG(st));
			ptrace(PTRACE_CONT, tid, 0, 0);
		}
	}
	if (ptrace(PTRACE_GETREGS, tid, 0, &t->regs) != 0) {
		ptrace(PTRACE_DETACH, tid, 0, 0);
		return sp_fail(err, "pid %d: cannot read the registers of thread %d: %s", (int)t->pid,
			       (int)tid, strerror(errno));
	}
	return 0;
}

/* Did our stop make the thread's system call fail with EINTR?  Then it is
 * made again at release; calls the kernel restarts itself (ERESTART*) are
 * restarted when the original registers come back.  Also: does the thread
 * stand right after a syscall instruction (*at_syscall)? */
static void note_restart(tgt *t, bool *at_syscall)
{
	uint8_t code[2];
	bool sc = (long long)t->regs.orig_rax >= 0 &&
		  mem_read(t->mem, t->regs.rip - 2, code, 2) == 0 && code[0] == 0x0f &&
		  code[1] == 0x05;

	t->restart = sc && (long long)t->regs.rax == -EINTR;
	if (at_syscall)
		*at_syscall = sc;
}

/* The kernel's codes for a system call it makes again itself when the
 * thread goes back to user space with no handler to run (never seen by a
 * program): include/linux/errno.h. */
#define K_ERESTARTSYS 512
#define K_ERESTARTNOINTR 513
#define K_ERESTARTNOHAND 514
#define K_ERESTART_RESTARTBLOCK 516

/* Does the thread go back into its system call when let go (release): one
 * our stop made fail with EINTR (made again), or one the kernel restarts? */
static bool goes_back(const tgt *t)
{
	long long rax = (long long)t->regs.rax;

	return t->restart || rax == -K_ERESTARTSYS || rax == -K_ERESTARTNOINTR ||
	       rax == -K_ERESTARTNOHAND || rax == -K_ERESTART_RESTARTBLOCK;
}

/* Let the thread go with its registers as they were (and, if it was made
 * to return EINTR by our stop, its system call made again). */
static void release(tgt *t)
{
	struct user_regs_struct r = t->regs;

	if (t->restart) {
		r.rip -= 2;
		r.rax = r.orig_rax;
	}
	ptrace(PTRACE_SETREGS, t->tid, 0, &r);
	if (t->xstate_len) {
		struct iovec iov = { t->xstate, t->xstate_len };

		ptrace(PTRACE_SETREGSET, t->tid, NT_X86_XSTATE, &iov);
	}
	ptrace(PTRACE_DETACH, t->tid, 0, 0);
	if (t->reniced && setpriority(PRIO_PROCESS, (id_t)t->tid, t->nice) == 0)
		t->reniced = false;
	for (int s = 1; s <= 64; s++)
		if (t->held_queued & (1ull << (s - 1)))
			syscall(SYS_rt_tgsigqueueinfo, t->pid, t->tid, s, &t->held_info[s - 1]);
		else if (t->held_signals & (1ull << (s - 1)))
			syscall(SYS_tgkill, t->pid, t->tid, s);
	t->held_signals = t->held_queued = 0;
}

/* ---- where a thread stands ---- */

/* The module holding addr in the target (its path, or a [name]), and
 * whether that module is Go code (a Go runtime's text: a .note.go.buildid
 * or .gopclntab section). */
typedef struct module_kind {
	char path[PATH_MAX];
	bool go;
} module_kind;

static bool elf_is_go(pid_t pid, const char *file)
{
	char path[PATH_MAX + 64];
	Elf_Scn *scn = NULL;
	GElf_Shdr sh;
	size_t shstr;
	bool go = false;
	Elf *e;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/root%s", (int)pid, file);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	elf_version(EV_CURRENT);
	e = elf_begin(fd, ELF_C_READ, NULL);
	if (e && elf_getshdrstrndx(e, &shstr) == 0)
		while (!go && (scn = elf_nextscn(e, scn))) {
			const char *nm = gelf_getshdr(scn, &sh) ? elf_strptr(e, shstr, sh.sh_name) : NULL;

			go = nm && (strcmp(nm, ".note.go.buildid") == 0 || strcmp(nm, ".gopclntab") == 0);
		}
	if (e)
		elf_end(e);
	close(fd);
	return go;
}

static void module_of(pid_t pid, uint64_t addr, module_kind *mk)
{
	static module_kind cache[16];
	static pid_t cache_pid;
	char path[64], line[PATH_MAX + 128];
	FILE *f;

	snprintf(mk->path, sizeof mk->path, "an anonymous mapping");
	mk->go = false;
	snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
	if (!(f = fopen(path, "re")))
		return;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		char name[PATH_MAX] = "";

		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %4095[^\n]", &lo, &hi, name) >= 2 &&
		    addr >= lo && addr < hi) {
			if (name[0])
				snprintf(mk->path, sizeof mk->path, "%s", name);
			break;
		}
	}
	fclose(f);
	if (mk->path[0] != '/')
		return;
	if (cache_pid != pid) {
		memset(cache, 0, sizeof cache);
		cache_pid = pid;
	}
	for (size_t i = 0; i < sizeof cache / sizeof *cache; i++) {
		if (strcmp(cache[i].path, mk->path) == 0) {
			mk->go = cache[i].go;
			return;
		}
		if (!cache[i].path[0]) {
			mk->go = elf_is_go(pid, mk->path);
			cache[i] = *mk;
			return;
		}
	}
	mk->go = elf_is_go(pid, mk->path);
}

/* What the last look at a thread found, for the message when no thread
 * was at a safe point. */
typedef struct seen {
	pid_t tid;
	const char *call;            /* a waiting call, or NULL: not waiting */
	long nr;                     /* the system call (-1: none, running) */
	char module[PATH_MAX];       /* where it was made from, if waiting */
} seen;

/*
 * Is the stopped thread at a safe point: waiting in a system call made by
 * the C library's own code, or by a Go runtime's (a Go program with cgo:
 * its threads wait in futex or epoll_pwait from Go code, which never holds
 * a lock of the C library)?  Either holds none of the C library's locks, so
 * pthread_create can run on it; the remote calls run on a stack of our own
 * (rcall), so a small goroutine stack does not matter.  A system call made
 * from any other module may be made under a lock of the C library (inside
 * a callback), and is not used.  Fills *sn with what was found.
 */
static bool safe_point(tgt *t, uint64_t text_lo, uint64_t text_hi, seen *sn)
{
	module_kind mk;
	bool at_syscall;

	note_restart(t, &at_syscall);
	sn->tid = t->tid;
	sn->nr = (long long)t->regs.orig_rax >= 0 ? (long)t->regs.orig_rax : -1;
	sn->call = sn->nr >= 0 ? waiting_call(sn->nr) : NULL;
	sn->module[0] = '\0';
	if (!sn->call || !at_syscall)
		return false;
	if (t->regs.rip >= text_lo && t->regs.rip < text_hi) {
		snprintf(sn->module, sizeof sn->module, "the C library");
		return true;
	}
	module_of(t->pid, t->regs.rip, &mk);
	snprintf(sn->module, sizeof sn->module, "%s", mk.path);
	return mk.go;
}

/* The next stop of thread t (its status in *st); -1 if the target ended or
 * cannot be waited for. */
static int wait_stopped(tgt *t, int *st, sp_err *err)
{
	for (;;) {
		if (waitpid(t->tid, st, __WALL) < 0)
			return sp_fail(err, "pid %d: waiting for thread %d: %s", (int)t->pid,
				       (int)t->tid, strerror(errno));
		if (WIFEXITED(*st) || WIFSIGNALED(*st))
			return sp_fail(err, "pid %d ended during the injection", (int)t->pid);
		if (WIFSTOPPED(*st))
			return 0;
	}
}

static int rsyscall(tgt *t, long nr, const uint64_t *a, int n, uint64_t *ret, sp_err *err);

/*
 * The agent moves its descriptors high (sp_agent_fd_base), which grows the
 * kernel's descriptor table of a program that has a small one.  Growing it
 * waits for an RCU grace period when the table is shared -- as it is once
 * the agent's thread runs: 10-20 ms of the agent's start, seen.  While the
 * target has one thread, and it is stopped here, the table grows at no such
 * cost: a descriptor duplicated at the base and closed at once.  (A target
 * with threads of its own pays the grace period in the agent, as before.)
 */
static void grow_fd_table(tgt *t, uint64_t fd)
{
	char v[64];
	struct rlimit lim;
	uint64_t nfd, ignored;
	sp_err e;

	if (status_field(t->pid, "Threads", v, sizeof v) != 0 || atoi(v) != 1)
		return;
	if (prlimit(t->pid, RLIMIT_NOFILE, NULL, &lim) != 0)
		lim.rlim_cur = 1024;
	uint64_t a_dup[3] = { fd, F_DUPFD_CLOEXEC, (uint64_t)sp_agent_fd_base(lim.rlim_cur) };

	if (rsyscall(t, SYS_fcntl, a_dup, 3, &nfd, &e) == 0 && (int64_t)nfd >= 0) {
		uint64_t a_close[1] = { nfd };

		rsyscall(t, SYS_close, a_close, 1, &ignored, &e);
	}
}

/*
 * A system call made by the stopped thread itself, on its own syscall
 * instruction (at rip - 2: safe_point checked it), with no stack: how the
 * stack for the remote calls is made.  orig_rax = -1 first, so the kernel
 * does not restart the interrupted call meanwhile; PTRACE_SYSCALL stops at
 * the call's entry and exit (SIGTRAP | 0x80 with TRACESYSGOOD).
 */
static int rsyscall(tgt *t, long nr, const uint64_t *a, int n, uint64_t *ret, sp_err *err)
{
	struct user_regs_struct r = t->regs, now;
	unsigned long long *argreg[] = { &r.rdi, &r.rsi, &r.rdx, &r.r10, &r.r8, &r.r9 };
	int st, stops = 0;

	for (int i = 0; i < n && i < 6; i++)
		*argreg[i] = a[i];
	r.rip = t->regs.rip - 2;
	r.rax = (unsigned long long)nr;
	r.orig_rax = (unsigned long long)-1;
	if (ptrace(PTRACE_SETREGS, t->tid, 0, &r) != 0 || ptrace(PTRACE_SYSCALL, t->tid, 0, 0) != 0)
		return sp_fail(err, "pid %d: cannot run thread %d: %s", (int)t->pid, (int)t->tid,
			       strerror(errno));
	for (;;) {
		if (wait_stopped(t, &st, err))
			return -1;
		if (WSTOPSIG(st) == (SIGTRAP | 0x80)) {
			if (++stops == 2)
				break;                  /* the exit */
		} else if ((st >> 16) != PTRACE_EVENT_STOP) {
			if (WSTOPSIG(st) == SIGSEGV || WSTOPSIG(st) == SIGBUS ||
			    WSTOPSIG(st) == SIGILL)
				return sp_fail(err, "pid %d: a system call in the target faulted "
					       "(signal %d); the target is left as it was", (int)t->pid,
					       WSTOPSIG(st));
			hold_signal(t, WSTOPSIG(st));
		}
		ptrace(PTRACE_SYSCALL, t->tid, 0, 0);
	}
	if (ptrace(PTRACE_GETREGS, t->tid, 0, &now) != 0)
		return sp_fail(err, "pid %d: cannot read the registers of thread %d: %s", (int)t->pid,
			       (int)t->tid, strerror(errno));
	*ret = now.rax;
	return 0;
}

/* Call fn(a...) on the stopped thread, on our stack; its return value in *ret. */
static int rcall(tgt *t, uint64_t fn, const uint64_t *a, int n, uint64_t *ret, sp_err *err)
{
	struct user_regs_struct r = t->regs, now;
	uint64_t sp = ((t->stack + STACK_SIZE) & ~15ull) - 8, zero = 0;
	unsigned long long *argreg[] = { &r.rdi, &r.rsi, &r.rdx, &r.rcx, &r.r8, &r.r9 };
	int st;

	if (mem_write(t, sp, &zero, 8))
		return sp_fail(err, "pid %d: cannot write the stack of thread %d: %s", (int)t->pid,
			       (int)t->tid, strerror(errno));
	for (int i = 0; i < n && i < 6; i++)
		*argreg[i] = a[i];
	r.rip = fn;
	r.rsp = sp;
	r.rax = 0;
	r.orig_rax = (unsigned long long)-1;
	if (ptrace(PTRACE_SETREGS, t->tid, 0, &r) != 0 || ptrace(PTRACE_CONT, t->tid, 0, 0) != 0)
		return sp_fail(err, "pid %d: cannot run thread %d: %s", (int)t->pid, (int)t->tid,
			       strerror(errno));
	for (;;) {
		if (wait_stopped(t, &st, err))
			return -1;
		if ((st >> 16) == PTRACE_EVENT_STOP) {
			ptrace(PTRACE_CONT, t->tid, 0, 0);
			continue;
		}
		if (WSTOPSIG(st) == SIGSEGV && ptrace(PTRACE_GETREGS, t->tid, 0, &now) == 0 &&
		    now.rip == 0) {
			*ret = now.rax;
			return 0;
		}
		if (WSTOPSIG(st) == SIGSEGV || WSTOPSIG(st) == SIGBUS || WSTOPSIG(st) == SIGILL ||
		    WSTOPSIG(st) == SIGFPE)
			return sp_fail(err, "pid %d: a remote call faulted (signal %d); the target is "
				       "left as it was", (int)t->pid, WSTOPSIG(st));
		hold_signal(t, WSTOPSIG(st));
		ptrace(PTRACE_CONT, t->tid, 0, 0);
	}
}

/* ---- the whole ---- */

static int copy_file_to(const char *from, const char *to, sp_err *err, pid_t pid)
{
	char buf[65536];
	int in = open(from, O_RDONLY | O_CLOEXEC), out;
	ssize_t n;

	if (in < 0)
		return sp_fail(err, "cannot read %s: %s", from, strerror(errno));
	out = open(to, O_WRONLY | O_CLOEXEC);
	if (out < 0) {
		close(in);
		return sp_fail(err, "pid %d: cannot open its memfd %s: %s", (int)pid, to,
			       strerror(errno));
	}
	while ((n = read(in, buf, sizeof buf)) > 0)
		if (sp_write_all(out, buf, (size_t)n) != 0)
			break;
	close(in);
	if (close(out) != 0 || n != 0)
		return sp_fail(err, "pid %d: cannot write the object into its memfd: %s", (int)pid,
			       strerror(errno));
	return 0;
}

static int list_threads(pid_t pid, pid_t *out, int cap)
{
	char path[64];
	DIR *d;
	struct dirent *de;
	int n = 0;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return -1;
	out[n++] = pid;                    /* the main thread first */
	while (n < cap && (de = readdir(d)))
		if (isdigit((unsigned char)de->d_name[0]) && atoi(de->d_name) != pid)
			out[n++] = atoi(de->d_name);
	closedir(d);
	return n;
}

/* The data block the loader thread works from (loader.S lists the same). */
enum {
	D_HANDLE = 56, D_RET = 64, D_DLCLOSE = 72, D_DONE = 80, D_CANCEL = 84, D_STARTED = 88,
	D_ARGP = 96, D_PATH = 128, D_ENTRY = 192, D_ERRMSG = 4096, D_MEMFD_NAME = 8192,
	D_THREAD = 8192 + 64, D_ARG = 16384,
};

/* The message when no thread was at a safe point: what each was doing. */
static void explain_no_safe_point(sp_err *err, pid_t pid, double secs, const seen *sn, int n)
{
	char what[700] = "";
	size_t len = 0;
	int shown = 0, foreign = 0;

	for (int i = 0; i < n; i++)
		foreign += sn[i].call && sn[i].module[0];
	for (int i = 0; i < n && shown < 6 && len < sizeof what - 1; i++, shown++) {
		int k;

		if (sn[i].call && sn[i].module[0])
			k = snprintf(what + len, sizeof what - len, "%sthread %d in %s from %s",
				     shown ? "; " : "", (int)sn[i].tid, sn[i].call, sn[i].module);
		else if (sn[i].nr >= 0)
			k = snprintf(what + len, sizeof what - len, "%sthread %d in system call %ld",
				     shown ? "; " : "", (int)sn[i].tid, sn[i].nr);
		else
			k = snprintf(what + len, sizeof what - len, "%sthread %d running",
				     shown ? "; " : "", (int)sn[i].tid);
		if (k < 0)
			break;
		len += (size_t)k < sizeof what - len ? (size_t)k : sizeof what - len - 1;
	}
	if (n > shown && len < sizeof what - 1)
		snprintf(what + len, sizeof what - len, "; %d more", n - shown);
	sp_fail(err, "pid %d: in %.1f s no thread was waiting in a system call made by the C "
		"library or a Go runtime, the only places where loading holds no lock of the C "
		"library (found: %s); %s", (int)pid, secs, what,
		foreign ? "its waiting threads called the kernel from their own code: attaching "
			  "to this program is not supported"
			: "its threads were busy: try again when the process waits (less load)");
}

/*
 * Called off after a timeout: the loader thread, if it has not called the
 * entry function yet, will not (it closes the object again: nothing stays
 * behind).  The two sides write, then read the other's word, each with a
 * full fence between (Dekker): the loader writes STARTED then reads CANCEL,
 * we write CANCEL then read STARTED -- at least one sees the other.  True
 * when the entry function is already running (it cannot be called off).
 */
static bool cancel_load(tgt *t, uint64_t data)
{
	uint32_t one = 1, started = 0;

	if (mem_write(t, data + D_CANCEL, &one, 4))
		return false;                    /* the process is gone */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return mem_read(t->mem, data + D_STARTED, &started, 4) == 0 && started;
}

int inj_load(pid_t pid, const inj_opts *o, inj_result *r, sp_err *err)
{
	static tgt t;
	static seen sn[64];
	double t0 = now_ms(), stop_at = 0;
	char libc_file[PATH_MAX], path[128];
	uint64_t base, lo, hi, data = 0, code = 0, fd = 0, th = 0, ret;
	size_t code_len = (size_t)(inj_loader_end - inj_loader_start);
	libc_syms s;
	pid_t tids[4096];
	int rc = -1, found = 0, nseen = 0;

	memset(r, 0, sizeof *r);
	memset(&t, 0, sizeof t);
	t.pid = pid;
	if (inj_check(pid, err) || find_libc(pid, &base, &lo, &hi, libc_file, sizeof libc_file) ||
	    resolve_syms(pid, base, libc_file, &s, err))
		return -1;
	if (strlen(o->entry) >= 64 || strlen(o->arg) + 96 >= DATA_SIZE - D_ARG)
		return sp_fail(err, "injector: entry name or argument too long");
	snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
	t.mem = open(path, O_RDWR | O_CLOEXEC);
	if (t.mem < 0)
		return sp_fail(err, "pid %d: cannot open %s: %s", (int)pid, path, strerror(errno));

	/* 1. a thread at a safe point */
	while (!found && now_ms() - t0 < o->safe_wait * 1e3) {
		int n = list_threads(pid, tids, (int)(sizeof tids / sizeof *tids));

		if (n <= 0) {
			sp_fail(err, "pid %d: no such process", (int)pid);
			goto out;
		}
		nseen = 0;
		for (int i = 0; i < n && !found; i++) {
			int st;
			seen one;

			r->tries++;
			t.held_signals = t.held_queued = 0;
			if ((st = seize(&t, tids[i], err)) != 0) {
				if (st == -2 || (i == 0 && r->tries == 1))
					goto out;          /* stopped, permission and the like: say so */
				continue;                  /* the thread ended meanwhile */
			}
			stop_at = now_ms();
			found = safe_point(&t, lo, hi, &one);
			if (found)
				break;
			if (nseen < (int)(sizeof sn / sizeof *sn))
				sn[nseen++] = one;
			release(&t);
		}
		if (!found)
			usleep(2000);
	}
	if (!found) {
		explain_no_safe_point(err, pid, o->safe_wait, sn, nseen);
		goto out;
	}
	r->tid = t.tid;
	/* Our calls on the thread should not wait behind the target's busy
	 * threads for a CPU: the thread gets the highest nice level while it
	 * is ours (as root; its own is put back at release). */
	errno = 0;
	t.nice = getpriority(PRIO_PROCESS, (id_t)t.tid);
	t.reniced = errno == 0 && setpriority(PRIO_PROCESS, (id_t)t.tid, -20) == 0;
	{
		struct iovec iov = { t.xstate, sizeof t.xstate };

		if (ptrace(PTRACE_GETREGSET, t.tid, NT_X86_XSTATE, &iov) == 0)
			t.xstate_len = iov.iov_len;
	}

	/* 2. remote calls, on a stack of our own */
	{
		uint64_t a_stack[6] = { 0, STACK_SIZE, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, (uint64_t)-1, 0 };
		uint64_t a_data[6] = { 0, DATA_SIZE, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, (uint64_t)-1, 0 };
		uint64_t a_code[6] = { 0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS,
				       (uint64_t)-1, 0 };
		static const char memfd_name[] = "sptrace-agent";
		char stopped[96];
		uint64_t stack = 0, argp;
		uint8_t block[256];

		if (rsyscall(&t, SYS_mmap, a_stack, 6, &stack, err))
			goto release;
		if ((int64_t)stack < 0 && (int64_t)stack > -4096) {
			sp_fail(err, "pid %d: mmap in the target failed: %s", (int)pid,
				strerror((int)-(int64_t)stack));
			goto release;
		}
		t.stack = stack;
		if (rcall(&t, s.mmap, a_data, 6, &data, err))
			goto release;
		if (data == (uint64_t)MAP_FAILED || data == 0) {
			sp_fail(err, "pid %d: mmap in the target failed", (int)pid);
			goto release;
		}
		if (rcall(&t, s.mmap, a_code, 6, &code, err))
			goto release;
		if (code == (uint64_t)MAP_FAILED || code == 0) {
			sp_fail(err, "pid %d: mmap in the target failed", (int)pid);
			goto release;
		}
		if (mem_write(&t, data + D_MEMFD_NAME, memfd_name, sizeof memfd_name) ||
		    mem_write(&t, code, inj_loader_start, code_len)) {
			sp_fail(err, "pid %d: cannot write into its memory: %s", (int)pid, strerror(errno));
			goto release;
		}
		uint64_t a_memfd[2] = { data + D_MEMFD_NAME, MFD_CLOEXEC };

		if (rcall(&t, s.memfd_create, a_memfd, 2, &fd, err))
			goto release;
		if ((int64_t)fd < 0) {
			sp_fail(err, "pid %d: memfd_create in the target failed", (int)pid);
			goto release;
		}
		grow_fd_table(&t, fd);
		snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
		if (copy_file_to(o->so_path, path, err, pid))
			goto release;
		memset(block, 0, sizeof block);
		argp = data + D_ARG;
		memcpy(block + 0, &s.dlopen, 8);
		memcpy(block + 8, &s.dlsym, 8);
		memcpy(block + 16, &s.dlerror, 8);
		memcpy(block + 24, &s.close, 8);
		memcpy(block + 32, &s.pthread_detach, 8);
		memcpy(block + 40, &s.pthread_self, 8);
		memcpy(block + 48, &fd, 8);
		memcpy(block + D_DLCLOSE, &s.dlclose, 8);
		memcpy(block + D_ARGP, &argp, 8);
		/* The argument says which thread we stopped and, when it goes
		 * back into its system call after us, that call's number and the
		 * address it returns to: the agent watches a receive there from
		 * the start (agent/activate.c, ag_watch_blocked_calls), however
		 * late the thread gets back into it. */
		const char *nl = o->arg[0] && o->arg[strlen(o->arg) - 1] != '\n' ? "\n" : "";

		if (goes_back(&t))
			snprintf(stopped, sizeof stopped, "%sstopped=%d %lld %llx\n", nl, (int)t.tid,
				 (long long)t.regs.orig_rax, (unsigned long long)t.regs.rip);
		else
			snprintf(stopped, sizeof stopped, "%sstopped=%d\n", nl, (int)t.tid);
		snprintf((char *)block + D_PATH, 64, "/proc/self/fd/%d", (int)fd);
		snprintf((char *)block + D_ENTRY, 64, "%s", o->entry);
		if (mem_write(&t, data, block, sizeof block) ||
		    mem_write(&t, data + D_ARG, o->arg, strlen(o->arg)) ||
		    mem_write(&t, data + D_ARG + strlen(o->arg), stopped, strlen(stopped) + 1)) {
			sp_fail(err, "pid %d: cannot write into its memory: %s", (int)pid, strerror(errno));
			goto release;
		}
		uint64_t a_thread[4] = { data + D_THREAD, 0, code, data };

		if (rcall(&t, s.pthread_create, a_thread, 4, &th, err))
			goto release;
		if (th != 0) {
			sp_fail(err, "pid %d: pthread_create in the target failed: %s", (int)pid,
				strerror((int)th));
			goto release;
		}
	}
	rc = 0;
	if (getenv("SPTRACE_TEST_INJECT_HOLD_MS")) {
		/* Test knob: the thread held that long after the loader thread
		 * was made (at most 1 s), so that a test has the agent started
		 * before the thread is back in its system call, as on a busy
		 * machine. */
		long ms = strtol(getenv("SPTRACE_TEST_INJECT_HOLD_MS"), NULL, 10) % 1000;

		if (ms > 0)
			usleep((useconds_t)ms * 1000);
	}
release:
	/* 3. as it was (our stack goes: the loader thread has its own) */
	if (t.stack) {
		uint64_t a_unmap[2] = { t.stack, STACK_SIZE }, ignored;
		sp_err unmap_err;

		rsyscall(&t, SYS_munmap, a_unmap, 2, &ignored, &unmap_err);
	}
	release(&t);
	r->pause_ms = now_ms() - stop_at;
	if (rc)
		goto out;

	/* 4. wait for the loader thread */
	rc = -1;
	for (;;) {
		uint32_t done = 0;

		if (mem_read(t.mem, data + D_DONE, &done, 4)) {
			sp_fail(err, "pid %d ended while loading %s", (int)pid, o->so_path);
			goto out;
		}
		if (done)
			break;
		if (now_ms() - t0 > o->timeout * 1e3) {
			r->entry_running = cancel_load(&t, data);
			if (r->entry_running)
				sp_fail(err, "pid %d: the agent did not finish starting within %.0f s; "
					"it goes on starting in the process and will then do as asked "
					"('sptrace stop %d' stops it)", (int)pid, o->timeout, (int)pid);
			else
				sp_fail(err, "pid %d: the object was not loaded within %.0f s (its "
					"loading thread did not get that far); the load is called off: "
					"the thread unloads it if it gets to run, and nothing stays "
					"behind", (int)pid, o->timeout);
			goto out;
		}
		usleep(1000);
	}
	{
		uint64_t handle = 0;
		char msg[1024] = "";

		mem_read(t.mem, data + D_HANDLE, &handle, 8);
		mem_read(t.mem, data + D_RET, &ret, 8);
		if (!handle) {
			mem_read(t.mem, data + D_ERRMSG, msg, sizeof msg - 1);
			msg[sizeof msg - 1] = '\0';
			sp_fail(err, "pid %d: dlopen of %s failed: %s", (int)pid, o->so_path,
				msg[0] ? msg : "(no message)");
			goto out;
		}
		r->entry_rc = (long)ret;
	}
	r->total_ms = now_ms() - t0;
	rc = r->entry_rc == 0 ? 0 : sp_fail(err, "pid %d: %s() in the target returned %ld (see the "
					    "agent's log)", (int)pid, o->entry, r->entry_rc);
out:
	close(t.mem);
	return rc;
}

/* ---- SIGTRAP blocked before the attach ---- */

#ifndef PTRACE_GETSIGMASK
#define PTRACE_GETSIGMASK 0x420a
#define PTRACE_SETSIGMASK 0x420b
#endif

/* Worth a look: SIGTRAP in the thread's mask now, or a wait whose
 * temporary mask hides the thread's own (sigsuspend, ppoll, pselect,
 * epoll_pwait: PTRACE_GETSIGMASK gives the own one). */
static bool trap_maybe_blocked(pid_t pid, pid_t tid)
{
	char path[96], line[64] = "";
	long nr = -1;
	int fd;

	if (task_sigset_has(pid, tid, "SigBlk", SIGTRAP))
		return true;
	snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", (int)pid, (int)tid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
		ssize_t n = read(fd, line, sizeof line - 1);

		close(fd);
		if (n > 0) {
			line[n] = '\0';
			nr = strtol(line, NULL, 10);
		}
	}
	return nr == SYS_rt_sigsuspend || nr == SYS_ppoll || nr == SYS_pselect6 ||
#ifdef SYS_epoll_pwait2
	       nr == SYS_epoll_pwait2 ||
#endif
	       nr == SYS_epoll_pwait;
}

static bool listed(const inj_trap_thread *list, int n, pid_t tid)
{
	for (int i = 0; i < n; i++)
		if (list[i].tid == tid)
			return true;
	return false;
}

/* One thread: stopped, SIGTRAP taken out of (or put back into) its own
 * mask, let go; its thread pointer in *fs_base.  With expect_fs, only if
 * its thread pointer is that.  1 changed, 0 nothing to do, -1 error, -2
 * the process is stopped. */
static int set_trap_blocked(tgt *t, pid_t tid, bool block, uint64_t expect_fs, uint64_t *fs_base,
			    sp_err *err)
{
	uint64_t mask = 0, bit = 1ull << (SIGTRAP - 1);
	int rc, changed = 0;

	memset(&t->regs, 0, sizeof t->regs);
	t->held_signals = t->held_queued = 0;
	t->restart = false;
	t->xstate_len = 0;
	t->reniced = false;
	if ((rc = seize(t, tid, err)) != 0)
		return rc;
	note_restart(t, NULL);
	if (expect_fs && t->regs.fs_base != expect_fs) {
		release(t);             /* another thread under a reused tid */
		return 0;
	}
	if (ptrace(PTRACE_GETSIGMASK, tid, (void *)sizeof mask, &mask) != 0) {
		sp_fail(err, "pid %d: cannot read the signal mask of thread %d: %s", (int)t->pid,
			(int)tid, strerror(errno));
		release(t);
		return -1;
	}
	if (!block && (mask & bit)) {
		/* A SIGTRAP pending for it (its own, or a debugger's) would be
		 * delivered the moment it is open, before the agent is there to
		 * hold it. */
		if (task_sigset_has(t->pid, tid, "SigPnd", SIGTRAP) ||
		    task_sigset_has(t->pid, tid, "ShdPnd", SIGTRAP)) {
			sp_fail(err, "pid %d: thread %d blocks SIGTRAP and has one pending (its own "
				"or a debugger's); the agent needs SIGTRAP for itself and would take "
				"it: not attempted", (int)t->pid, (int)tid);
			release(t);
			return -1;
		}
		mask &= ~bit;
		changed = 1;
	} else if (block && !(mask & bit)) {
		mask |= bit;
		changed = 1;
	}
	/* SETSIGMASK also drops a wait's temporary mask (the kernel would put
	 * the own one back when the wait ends); the wait is made again on
	 * release and takes its temporary mask again. */
	if (changed && ptrace(PTRACE_SETSIGMASK, tid, (void *)sizeof mask, &mask) != 0) {
		sp_fail(err, "pid %d: cannot set the signal mask of thread %d: %s", (int)t->pid,
			(int)tid, strerror(errno));
		release(t);
		return -1;
	}
	if (fs_base)
		*fs_base = t->regs.fs_base;
	release(t);
	return changed;
}

int inj_open_sigtrap(pid_t pid, inj_trap_thread *out, int cap, int *n, sp_err *err)
{
	static tgt t;
	static pid_t tids[4096];
	char path[64];
	int rc = 0;

	*n = 0;
	memset(&t, 0, sizeof t);
	t.pid = pid;
	snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
	if ((t.mem = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return sp_fail(err, "pid %d: cannot open %s: %s", (int)pid, path, strerror(errno));
	/* A thread created meanwhile inherits its creator's mask: passes
	 * until one finds nothing new. */
	for (int pass = 0; pass < 4 && rc == 0; pass++) {
		int nt = list_threads(pid, tids, (int)(sizeof tids / sizeof *tids)), before = *n;

		for (int i = 0; i < nt && rc == 0; i++) {
			uint64_t fs = 0;
			int c;

			if (listed(out, *n, tids[i]) || !trap_maybe_blocked(pid, tids[i]))
				continue;
			c = set_trap_blocked(&t, tids[i], false, 0, &fs, err);
			if (c == 1) {
				if (*n == cap) {
					set_trap_blocked(&t, tids[i], true, fs, NULL, err);
					sp_fail(err, "pid %d: more than %d threads block SIGTRAP: not "
						"supported", (int)pid, cap);
					rc = -1;
					break;
				}
				out[*n].tid = tids[i];
				out[(*n)++].fs_base = fs;
			} else if (c < 0) {
				char task[96];

				snprintf(task, sizeof task, "/proc/%d/task/%d", (int)pid, (int)tids[i]);
				if (c == -2 || access(task, F_OK) == 0)
					rc = -1;        /* not a thread that ended meanwhile */
			}
		}
		if (*n == before)
			break;
	}
	close(t.mem);
	if (rc) {
		sp_err ignored;

		inj_close_sigtrap(pid, out, *n, &ignored);
		*n = 0;
	}
	return rc;
}

void inj_close_sigtrap(pid_t pid, const inj_trap_thread *list, int n, sp_err *err)
{
	static tgt t;
	char path[64];

	memset(&t, 0, sizeof t);
	t.pid = pid;
	snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
	if ((t.mem = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	/* Only the same thread: a tid is reused, its thread pointer too, but
	 * hardly both at once. */
	for (int i = 0; i < n; i++)
		set_trap_blocked(&t, list[i].tid, true, list[i].fs_base, NULL, err);
	close(t.mem);
}
