/*
 * inject.c — loading a shared object into a running process.
 *
 * The protocol (a thread of the target is stopped only for the first part):
 *
 *   1. Find a thread at a safe point.  Each thread in turn is seized and
 *      interrupted (PTRACE_SEIZE + PTRACE_INTERRUPT) until one is found
 *      stopped at the exit of a waiting system call (epoll_wait, accept,
 *      read, poll, futex, nanosleep, ...) made from the C library's own code:
 *      such a thread holds none of the library's locks (malloc's, the
 *      loader's), so functions called on it cannot deadlock.  Others are let
 *      go at once.  A thread interrupted in a system call that would now
 *      return EINTR is set to make the call again, so the program never sees
 *      an EINTR of ours; calls the kernel restarts itself (ERESTART*) are
 *      restarted by the kernel when the original registers come back.
 *   2. Save its registers and its whole XSAVE state.  Make remote calls on
 *      it: registers set for the System V ABI, orig_rax = -1 (no syscall
 *      restart meddles), the stack pointer 512 bytes below the red zone and
 *      16-byte aligned, and a return address of 0: the function's return
 *      faults at address 0, which ptrace reports and we swallow.  Other
 *      signals arriving meanwhile are held and sent again at the end.  The
 *      calls: mmap (data block), mmap (code page), memfd_create; the object
 *      is written into the memfd through /proc/PID/fd (so the target's mount
 *      namespace does not matter); then pthread_create of the loader thread
 *      (loader.S) on a page written through /proc/PID/mem.
 *   3. Restore the registers and the XSAVE state, detach.  The thread runs on
 *      as if nothing happened (a waiting call is restarted).
 *   4. The loader thread -- a real thread of the C library -- calls dlopen
 *      on /proc/self/fd/N, then the entry function with its argument, and
 *      sets a flag that the injector polls through /proc/PID/mem.
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

static int status_field(pid_t pid, const char *key, char *out, size_t len)
{
	char path[64], line[512];
	size_t k = strlen(key);
	FILE *f;
	int found = 0;

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
	snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
	n = readlink(path, exe, sizeof exe - 1);
	if (n < 0) {
		if (errno == EACCES || errno == EPERM)
			return sp_fail(err, "pid %d: permission denied: it runs as another user; run "
				       "sptrace as that user or as root (CAP_SYS_PTRACE)", (int)pid);
		return sp_fail(err, "pid %d: cannot read %s: %s (a kernel thread?)", (int)pid, path,
			       strerror(errno));
	}
	exe[n] = '\0';
	if (status_field(pid, "TracerPid", v, sizeof v) == 0 && atoi(v) != 0)
		return sp_fail(err, "pid %d is already traced by pid %s (a debugger or another "
			       "tracer); detach it first", (int)pid, v);
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
	uint64_t mmap, memfd_create, pthread_create;
} libc_syms;

static int resolve_syms(pid_t pid, uint64_t base, const char *file, libc_syms *s, sp_err *err)
{
	static const char *const names[] = { "dlopen", "dlsym", "dlerror", "close",
					     "pthread_detach", "pthread_self", "mmap",
					     "memfd_create", "pthread_create" };
	uint64_t *slot[] = { &s->dlopen, &s->dlsym, &s->dlerror, &s->close, &s->pthread_detach,
			     &s->pthread_self, &s->mmap, &s->memfd_create, &s->pthread_create };
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
	bool restart;                      /* its system call is to be made again */
	bool reniced;                      /* its nice level is ours for now ... */
	int nice;                          /* ... and this is its own */
} tgt;

static int mem_write(tgt *t, uint64_t addr, const void *buf, size_t n)
{
	return pwrite(t->mem, buf, n, (off_t)addr) == (ssize_t)n ? 0 : -1;
}

static int mem_read(int mem, uint64_t addr, void *buf, size_t n)
{
	return pread(mem, buf, n, (off_t)addr) == (ssize_t)n ? 0 : -1;
}

/* System calls a thread waits in, from the C library's wrappers. */
static bool waiting_call(long nr)
{
	switch (nr) {
	case SYS_read: case SYS_poll: case SYS_select: case SYS_pause: case SYS_nanosleep:
	case SYS_accept: case SYS_recvfrom: case SYS_recvmsg: case SYS_wait4: case SYS_futex:
	case SYS_epoll_wait: case SYS_clock_nanosleep: case SYS_epoll_pwait: case SYS_accept4:
	case SYS_ppoll: case SYS_pselect6: case SYS_rt_sigtimedwait: case SYS_rt_sigsuspend:
	case SYS_waitid: case SYS_recvmmsg: case SYS_msgrcv: case SYS_semtimedop:
#ifdef SYS_epoll_pwait2
	case SYS_epoll_pwait2:
#endif
		return true;
	default:
		return false;
	}
}

/* Seize and stop one thread; 0 stopped (regs read), -1 error. */
static int seize(tgt *t, pid_t tid, sp_err *err)
{
	int st;

	t->tid = tid;
	if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0) {
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
		if (WIFSTOPPED(st) && (st >> 16) == PTRACE_EVENT_STOP)
			break;
		/* A signal on its way to the thread: hold it, it goes again at the end. */
		if (WIFSTOPPED(st)) {
			t->held_signals |= 1ull << (WSTOPSIG(st) - 1);
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
		if (t->held_signals & (1ull << (s - 1)))
			syscall(SYS_tgkill, t->pid, t->tid, s);
	t->held_signals = 0;
}

/* Stopped at a waiting call made by libc?  Also notes whether our stop made
 * that call fail with EINTR (then it is made again at release). */
static bool safe_point(tgt *t, uint64_t text_lo, uint64_t text_hi)
{
	uint8_t code[2];

	t->restart = false;
	if ((long long)t->regs.orig_rax < 0 || !waiting_call((long)t->regs.orig_rax))
		return false;
	if (t->regs.rip < text_lo || t->regs.rip >= text_hi)
		return false;
	if ((long long)t->regs.rax == -EINTR && mem_read(t->mem, t->regs.rip - 2, code, 2) == 0 &&
	    code[0] == 0x0f && code[1] == 0x05)
		t->restart = true;
	return true;
}

/* Call fn(a...) on the stopped thread; its return value in *ret. */
static int rcall(tgt *t, uint64_t fn, const uint64_t *a, int n, uint64_t *ret, sp_err *err)
{
	struct user_regs_struct r = t->regs, now;
	uint64_t sp = ((t->regs.rsp - 128 - 512) & ~15ull) - 8, zero = 0;
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
		if (waitpid(t->tid, &st, __WALL) < 0)
			return sp_fail(err, "pid %d: waiting for thread %d: %s", (int)t->pid,
				       (int)t->tid, strerror(errno));
		if (WIFEXITED(st) || WIFSIGNALED(st))
			return sp_fail(err, "pid %d ended during the injection", (int)t->pid);
		if (!WIFSTOPPED(st))
			continue;
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
		t->held_signals |= 1ull << (WSTOPSIG(st) - 1);
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

int inj_load(pid_t pid, const inj_opts *o, inj_result *r, sp_err *err)
{
	static tgt t;
	double t0 = now_ms(), stop_at = 0;
	char libc_file[PATH_MAX], path[128];
	uint64_t base, lo, hi, data = 0, code = 0, fd = 0, th = 0, ret;
	size_t code_len = (size_t)(inj_loader_end - inj_loader_start);
	libc_syms s;
	pid_t tids[4096];
	int rc = -1, found = 0;

	memset(r, 0, sizeof *r);
	memset(&t, 0, sizeof t);
	t.pid = pid;
	if (inj_check(pid, err) || find_libc(pid, &base, &lo, &hi, libc_file, sizeof libc_file) ||
	    resolve_syms(pid, base, libc_file, &s, err))
		return -1;
	if (strlen(o->entry) >= 64 || strlen(o->arg) >= 4096 - 256 - 1)
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
		for (int i = 0; i < n && !found; i++) {
			r->tries++;
			t.held_signals = 0;
			if (seize(&t, tids[i], err)) {
				if (i == 0 && r->tries == 1)
					goto out;          /* permission and the like: say so */
				continue;                  /* the thread ended meanwhile */
			}
			stop_at = now_ms();
			if (safe_point(&t, lo, hi)) {
				found = 1;
				break;
			}
			release(&t);
		}
		if (!found)
			usleep(2000);
	}
	if (!found) {
		sp_fail(err, "pid %d: in %.1f s no thread was waiting in a system call (all busy in "
			"their own code?); loading is only done from such a safe point: try again",
			(int)pid, o->safe_wait);
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

	/* 2. remote calls */
	{
		uint64_t a_data[6] = { 0, DATA_SIZE, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, (uint64_t)-1, 0 };
		uint64_t a_code[6] = { 0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS,
				       (uint64_t)-1, 0 };
		static const char memfd_name[] = "sptrace-agent";
		uint8_t block[512];

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
		if (mem_write(&t, data + 8192, memfd_name, sizeof memfd_name) ||
		    mem_write(&t, code, inj_loader_start, code_len)) {
			sp_fail(err, "pid %d: cannot write into its memory: %s", (int)pid, strerror(errno));
			goto release;
		}
		uint64_t a_memfd[2] = { data + 8192, MFD_CLOEXEC };

		if (rcall(&t, s.memfd_create, a_memfd, 2, &fd, err))
			goto release;
		if ((int64_t)fd < 0) {
			sp_fail(err, "pid %d: memfd_create in the target failed", (int)pid);
			goto release;
		}
		snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
		if (copy_file_to(o->so_path, path, err, pid))
			goto release;
		memset(block, 0, sizeof block);
		memcpy(block + 0, &s.dlopen, 8);
		memcpy(block + 8, &s.dlsym, 8);
		memcpy(block + 16, &s.dlerror, 8);
		memcpy(block + 24, &s.close, 8);
		memcpy(block + 32, &s.pthread_detach, 8);
		memcpy(block + 40, &s.pthread_self, 8);
		memcpy(block + 48, &fd, 8);
		snprintf((char *)block + 128, 64, "/proc/self/fd/%d", (int)fd);
		snprintf((char *)block + 192, 64, "%s", o->entry);
		if (mem_write(&t, data, block, 256) ||
		    mem_write(&t, data + 256, o->arg, strlen(o->arg) + 1)) {
			sp_fail(err, "pid %d: cannot write into its memory: %s", (int)pid, strerror(errno));
			goto release;
		}
		uint64_t a_thread[4] = { data + 8192 + 64, 0, code, data };

		if (rcall(&t, s.pthread_create, a_thread, 4, &th, err))
			goto release;
		if (th != 0) {
			sp_fail(err, "pid %d: pthread_create in the target failed: %s", (int)pid,
				strerror((int)th));
			goto release;
		}
	}
	rc = 0;
release:
	/* 3. as it was */
	release(&t);
	r->pause_ms = now_ms() - stop_at;
	if (rc)
		goto out;

	/* 4. wait for the loader thread */
	rc = -1;
	for (;;) {
		uint32_t done = 0;

		if (mem_read(t.mem, data + 80, &done, 4)) {
			sp_fail(err, "pid %d ended while loading %s", (int)pid, o->so_path);
			goto out;
		}
		if (done)
			break;
		if (now_ms() - t0 > o->timeout * 1e3) {
			sp_fail(err, "pid %d: the object was not loaded within %.0f s (the loader "
				"thread is still busy)", (int)pid, o->timeout);
			goto out;
		}
		usleep(1000);
	}
	{
		uint64_t handle = 0;
		char msg[1024] = "";

		mem_read(t.mem, data + 56, &handle, 8);
		mem_read(t.mem, data + 64, &ret, 8);
		if (!handle) {
			mem_read(t.mem, data + 4096, msg, sizeof msg - 1);
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
