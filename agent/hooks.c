/*
 * hooks.c — every function the agent interposes, in one table, and how an
 * agent loaded into a running process (sptrace attach) puts them in place.
 *
 * Preloaded, the agent's sigaction, pthread_sigmask, pthread_create, exec*,
 * ... come first in the symbol lookup (signals.c, threads.c, exec.c).
 * Loaded later, the program's modules are already bound to the C library's.
 * So their GOT slots are rewritten: for every loaded module but the agent
 * and the loader, each R_X86_64_JUMP_SLOT or R_X86_64_GLOB_DAT relocation
 * of one of those names gets the agent's function.  The GOT is data, not
 * code (under full RELRO read-only data, written through /proc/self/mem
 * like code), so the text of every module stays identical to its file.
 * Calls inside the C library do not go through its GOT for these and stay
 * unseen, as with a preload.  Modules dlopen'd after the attach are not
 * hooked (yet): their calls to these functions reach the C library's.
 */
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"

typedef struct hook {
	const char *name;
	void *fn;                /* the agent's */
	uint64_t real;           /* the C library's, once ag_hooks_init ran */
} hook;

/* The agent's interposers (AG_EXPORT in signals.c, threads.c, exec.c, tsc.c,
 * msgs.c, fds.c; the context functions, syscall, dlopen, dlmopen and
 * backtrace in x86_64/context.S). */
extern int sigaction(int, const struct sigaction *, struct sigaction *);
extern int pthread_sigmask(int, const sigset_t *, sigset_t *);
extern int sigprocmask(int, const sigset_t *, sigset_t *);
extern int sigsuspend(const sigset_t *);
extern int signalfd(int, const sigset_t *, int);
extern int sigwait(const sigset_t *, int *);
extern int sigwaitinfo(const sigset_t *, siginfo_t *);
extern int sigtimedwait(const sigset_t *, siginfo_t *, const struct timespec *);
extern ssize_t __read_chk(int, void *, size_t, size_t);
extern ssize_t __recv_chk(int, void *, size_t, size_t, int);
extern ssize_t __recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

static hook hooks[] = {
	{ "sigaction", (void *)sigaction, 0 },
	{ "signal", (void *)signal, 0 },
	{ "pthread_sigmask", (void *)pthread_sigmask, 0 },
	{ "sigprocmask", (void *)sigprocmask, 0 },
	{ "sigsuspend", (void *)sigsuspend, 0 },
	{ "signalfd", (void *)signalfd, 0 },
	{ "sigwait", (void *)sigwait, 0 },
	{ "sigwaitinfo", (void *)sigwaitinfo, 0 },
	{ "sigtimedwait", (void *)sigtimedwait, 0 },
	{ "pthread_create", (void *)pthread_create, 0 },
	{ "pthread_exit", (void *)pthread_exit, 0 },
	{ "pthread_cancel", (void *)pthread_cancel, 0 },
	/* x86_64/unwind.c: libgcc_s before they need it (context.S) */
	{ "dlopen", (void *)dlopen, 0 },
	{ "dlmopen", (void *)dlmopen, 0 },
	{ "backtrace", (void *)backtrace, 0 },
	{ "makecontext", (void *)makecontext, 0 },
	{ "getcontext", (void *)getcontext, 0 },
	{ "setcontext", (void *)setcontext, 0 },
	{ "swapcontext", (void *)swapcontext, 0 },
	{ "execve", (void *)execve, 0 },
	{ "posix_spawn", (void *)posix_spawn, 0 },
	{ "posix_spawnp", (void *)posix_spawnp, 0 },
	{ "execv", (void *)execv, 0 },
	{ "execvp", (void *)execvp, 0 },
	{ "execvpe", (void *)execvpe, 0 },
	{ "execl", (void *)execl, 0 },
	{ "execlp", (void *)execlp, 0 },
	{ "execle", (void *)execle, 0 },
	{ "fexecve", (void *)fexecve, 0 },
	{ "system", (void *)system, 0 },
	/* msgs.c: message events (and events.c's accept and recv) */
	{ "send", (void *)send, 0 },
	{ "sendto", (void *)sendto, 0 },
	{ "sendmsg", (void *)sendmsg, 0 },
	{ "sendmmsg", (void *)sendmmsg, 0 },
	{ "write", (void *)write, 0 },
	{ "writev", (void *)writev, 0 },
	{ "recv", (void *)recv, 0 },
	{ "__recv_chk", (void *)__recv_chk, 0 },
	{ "recvfrom", (void *)recvfrom, 0 },
	{ "__recvfrom_chk", (void *)__recvfrom_chk, 0 },
	{ "recvmsg", (void *)recvmsg, 0 },
	{ "recvmmsg", (void *)recvmmsg, 0 },
	{ "read", (void *)read, 0 },
	{ "__read_chk", (void *)__read_chk, 0 },
	{ "readv", (void *)readv, 0 },
	{ "splice", (void *)splice, 0 },
	{ "shutdown", (void *)shutdown, 0 },
	{ "sendfile", (void *)ag_sendfile, 0 },
	{ "sendfile64", (void *)ag_sendfile64, 0 },
	{ "connect", (void *)connect, 0 },
	{ "accept", (void *)accept, 0 },
	{ "accept4", (void *)accept4, 0 },
	{ "socket", (void *)socket, 0 },
	{ "socketpair", (void *)socketpair, 0 },
	{ "pipe", (void *)pipe, 0 },
	{ "pipe2", (void *)pipe2, 0 },
	/* fds.c: the agent's descriptors stay its own */
	{ "close", (void *)close, 0 },
	{ "close_range", (void *)close_range, 0 },
	{ "closefrom", (void *)closefrom, 0 },
	{ "dup", (void *)dup, 0 },
	{ "dup2", (void *)dup2, 0 },
	{ "dup3", (void *)dup3, 0 },
	{ "fcntl", (void *)ag_fcntl, 0 },
	{ "fcntl64", (void *)ag_fcntl64, 0 },
	{ "prctl", (void *)prctl, 0 },
	/* creds.c: the control thread's capabilities follow the program's */
	{ "capset", (void *)capset, 0 },
	{ "syscall", (void *)syscall, 0 },
};

#define NHOOKS (sizeof hooks / sizeof *hooks)

static uint64_t agent_lo;

static void *hook_for(const char *name)
{
	for (size_t i = 0; i < NHOOKS; i++)
		if (strcmp(hooks[i].name, name) == 0)
			return hooks[i].fn;
	return NULL;
}

/*
 * The C library's function behind each interposer, looked up once while
 * the agent starts (dlsym may take locks and allocate: never under the
 * instrument lock).  Preloaded, the agent comes first and RTLD_NEXT finds
 * the C library's; attached, the agent is not in the global scope and
 * RTLD_DEFAULT does.
 */
void ag_hooks_init(bool attached)
{
	for (size_t i = 0; i < NHOOKS; i++) {
		void *real = dlsym(attached ? RTLD_DEFAULT : RTLD_NEXT, hooks[i].name);

		if (real != hooks[i].fn)
			hooks[i].real = (uint64_t)(uintptr_t)real;
	}
}

/* A call reaching the agent's interposer at addr is shown as a call of the
 * C library's function: its address (0 if addr is not an interposer). */
uint64_t ag_hook_real(uint64_t addr)
{
	for (size_t i = 0; i < NHOOKS; i++)
		if ((uint64_t)(uintptr_t)hooks[i].fn == addr)
			return hooks[i].real;
	return 0;
}

/* A walk over the modules: how many GOT slots it pointed at interposers. */
typedef struct hook_req {
	unsigned done;
} hook_req;

static void hook_relocs(hook_req *req, uint64_t bias, const ElfW(Rela) *rel, size_t n,
			const ElfW(Sym) *syms, const char *strs)
{
	for (size_t i = 0; i < n; i++) {
		unsigned type = ELF64_R_TYPE(rel[i].r_info);
		uint64_t fn;

		if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
			continue;
		fn = (uint64_t)(uintptr_t)hook_for(strs + syms[ELF64_R_SYM(rel[i].r_info)].st_name);
		if (!fn)
			continue;
		if (ag_write_text(bias + rel[i].r_offset, &fn, 8) == 0)
			req->done++;
	}
}

static int hook_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	hook_req *req = arg;
	const ElfW(Dyn) *dyn = NULL;
	const ElfW(Rela) *jmprel = NULL, *rela = NULL;
	const ElfW(Sym) *syms = NULL;
	const char *strs = NULL, *base;
	size_t pltrelsz = 0, relasz = 0;

	(void)size;
	base = strrchr(info->dlpi_name ? info->dlpi_name : "", '/');
	base = base ? base + 1 : info->dlpi_name ? info->dlpi_name : "";
	if (info->dlpi_addr == agent_lo || strncmp(base, "ld-linux", 8) == 0 ||
	    strncmp(base, "linux-vdso", 10) == 0)
		return 0;                        /* the agent itself, the loader */
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		/* The loader has turned these into run-time addresses. */
		switch (dyn->d_tag) {
		case DT_SYMTAB: syms = (const ElfW(Sym) *)dyn->d_un.d_ptr; break;
		case DT_STRTAB: strs = (const char *)dyn->d_un.d_ptr; break;
		case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn->d_un.d_ptr; break;
		case DT_PLTRELSZ: pltrelsz = dyn->d_un.d_val; break;
		case DT_RELA: rela = (const ElfW(Rela) *)dyn->d_un.d_ptr; break;
		case DT_RELASZ: relasz = dyn->d_un.d_val; break;
		default: break;
		}
	}
	if (!syms || !strs)
		return 0;
	if (jmprel)
		hook_relocs(req, info->dlpi_addr, jmprel, pltrelsz / sizeof *jmprel, syms, strs);
	if (rela)
		hook_relocs(req, info->dlpi_addr, rela, relasz / sizeof *rela, syms, strs);
	return 0;
}

/* Hook every module loaded now (at attach). */
void ag_hooks_install(void)
{
	Dl_info di;
	hook_req req = { 0 };

	if (!agent_lo && dladdr((void *)ag_hooks_install, &di)) {
		agent_lo = (uint64_t)(uintptr_t)di.dli_fbase;
	}
	dl_iterate_phdr(hook_object, &req);
	ag_log("attach: %u GOT slots now lead to the agent's interposers", req.done);
}
