/*
 * exec.c — the agent comes back after exec: tracing goes on in the new image
 * of the same process.
 *
 * The agent restored the program's environment at start (main.c), so an
 * exec would lose it.  The exec functions are interposed (execve, execv,
 * execvp, execvpe, execl, execle, execlp, fexecve): each passes the new
 * image an environment with the agent put back -- LD_PRELOAD, LD_BIND_NOW
 * and the SPTRACE_* variables (SPTRACE_SPARE too: the new image takes its
 * files from the same stock, spare.c; SPTRACE_IMAGES: the calls images
 * already checked, modules.c), the program's own LD_PRELOAD/LD_BIND_NOW
 * kept aside for the new agent to restore -- and changes nothing else.
 *
 * The new image has other modules, so it writes a trace of its own, in a
 * subdirectory DIR/exec.PID.N; meta here gets "exec exec.PID.N PATH" first
 * (and "exec_failed exec.PID.N" if the exec returns).  It starts tracing at
 * its main if this image was tracing, else it waits for the same event.
 *
 * An exec may run in a vfork child, which shares the parent's memory: no
 * allocation here, everything is built on the stack.
 *
 * posix_spawn and posix_spawnp exec in their child through an internal
 * entry of the C library: they are interposed too, and spawn the child with
 * the same environment; the child's pid is known when they return, and meta
 * gets "exec spawn.PID.N CHILD PATH" then, as for a forked child's exec.
 * system() spawns its shell through that internal entry with the program's
 * environ, which no longer names the agent: so the agent has its own system,
 * built on spawn_traced as POSIX describes it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#define MAX_ENV 4096
#define MAX_ARGS 4096
#define ENV_TEXT 16384

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			const posix_spawnattr_t *, char *const[], char *const[]);

static execve_fn real_execve, real_execvpe;
static fexecve_fn real_fexecve;
static spawn_fn real_spawn, real_spawnp;
static char agent_path[4096];
static char ring_bytes[32];
static unsigned exec_seq;
extern char **environ;

/* The C library's functions behind the interposers below, looked up when
 * the agent is loaded, whether or not it starts: loaded without sptrace run
 * (no SPTRACE_DIR) it stays out of the way, and every exec and spawn must
 * still work (they failed with ENOSYS).  Not later: dlsym is not for a
 * vfork child. */
void ag_exec_resolve(void)
{
	if (real_execve)
		return;
	real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
	real_execvpe = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
	real_fexecve = (fexecve_fn)dlsym(RTLD_NEXT, "fexecve");
	real_spawn = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
	real_spawnp = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
}

/* At start (dlsym and dladdr are not for a vfork child). */
void ag_exec_init(const char *ring)
{
	Dl_info di;

	ag_exec_resolve();
	/* Attached, the agent came from a memfd (/proc/self/fd/N), which a new
	 * image could not load: it would only print an error. */
	if (dladdr((void *)ag_exec_init, &di) && di.dli_fname && di.dli_fname[0] == '/' &&
	    strncmp(di.dli_fname, "/proc/self/fd/", 14) != 0)
		snprintf(agent_path, sizeof agent_path, "%s", di.dli_fname);
	else
		ag_log("exec: cannot tell where the agent was loaded from; an exec'd image will "
		       "run untraced");
	if (ring)
		snprintf(ring_bytes, sizeof ring_bytes, "%s", ring);
}

typedef struct env_buf {
	char *env[MAX_ENV];
	size_t n;
	char text[ENV_TEXT];
	size_t used;
	char sub[64];            /* exec.PID.N */
} env_buf;

/* The budget, carried into the new image as SPTRACE_BUDGET. */
static const char *budget_text(void)
{
	static char text[16];

	snprintf(text, sizeof text, "%u", ag_budget_percent());
	return text;
}

static int put(env_buf *b, const char *name, const char *value)
{
	int k;

	if (b->n + 1 >= MAX_ENV)
		return -1;
	k = snprintf(b->text + b->used, sizeof b->text - b->used, "%s=%s", name, value);
	if (k < 0 || (size_t)k >= sizeof b->text - b->used)
		return -1;
	b->env[b->n++] = b->text + b->used;
	b->used += (size_t)k + 1;
	return 0;
}

static bool named(const char *var, const char *name)
{
	size_t k = strlen(name);

	return strncmp(var, name, k) == 0 && var[k] == '=';
}

/*
 * The new image's environment: the program's, with the agent put back.
 * NULL if it does not fit (the exec then goes ahead untraced).
 */
static char *const *traced_env_as(env_buf *b, char *const envp[], const char *path,
				  const char *kind);

static char *const *traced_env(env_buf *b, char *const envp[], const char *path)
{
	return traced_env_as(b, envp, path, "exec");
}

/* kind "exec": this process's image is replaced, meta says so now; "spawn":
 * a child's, the caller says so with its pid. */
static char *const *traced_env_as(env_buf *b, char *const envp[], const char *path,
				  const char *kind)
{
	const char *preload = NULL, *bind = NULL;
	char dir[4300], hz[24] = "", images[3000];

	if (!agent_path[0] || !ag_dir[0])
		return NULL;
	b->n = 0;
	b->used = 0;
	for (size_t i = 0; envp && envp[i]; i++) {
		if (named(envp[i], "LD_PRELOAD"))
			preload = envp[i] + 11;
		else if (named(envp[i], "LD_BIND_NOW"))
			bind = envp[i] + 12;
		else if (strncmp(envp[i], "SPTRACE_", 8) != 0 ||
			 named(envp[i], "SPTRACE_REPO")) {   /* the user's, not ours */
			if (b->n + 16 >= MAX_ENV)
				return NULL;
			b->env[b->n++] = envp[i];
		}
	}
	snprintf(b->sub, sizeof b->sub, "%s.%d.%u", kind, (int)getpid(),
		 __atomic_add_fetch(&exec_seq, 1, __ATOMIC_RELAXED));
	snprintf(dir, sizeof dir, "%s/%s", ag_dir, b->sub);
	if (ag_tsc_hz())
		snprintf(hz, sizeof hz, "%llu", (unsigned long long)ag_tsc_hz());
	if (put(b, "LD_PRELOAD", agent_path))
		return NULL;
	if (preload && *preload) {
		/* agent:program's -- the new entry is the last text written */
		size_t k = strlen(preload);

		if (b->used + k + 1 >= sizeof b->text)
			return NULL;
		b->text[b->used - 1] = ':';
		memcpy(b->text + b->used, preload, k + 1);
		b->used += k + 1;
	}
	if (put(b, "SPTRACE_LD_PRELOAD", preload && *preload ? preload : "-") ||
	    put(b, "SPTRACE_LD_BIND_NOW", bind ? bind : "-") ||
	    put(b, "LD_BIND_NOW", "1") || put(b, "SPTRACE_DIR", dir) ||
	    put(b, "SPTRACE_ON", ag_active() ? "start" : ag_on_event()) ||
	    put(b, "SPTRACE_EXEC_OF", ag_dir) ||
	    (hz[0] && put(b, "SPTRACE_TSC_HZ", hz)) || put(b, "SPTRACE_CPU", ag_arch_env()) ||
	    (ring_bytes[0] && put(b, "SPTRACE_RING_BYTES", ring_bytes)) ||
	    (ag_ring_keeps_all() && put(b, "SPTRACE_RECORDS", "all")) ||
	    (ag_join_env()[0] && put(b, "SPTRACE_JOIN", ag_join_env())) ||
	    (ag_budget_percent() && put(b, "SPTRACE_BUDGET", budget_text())) ||
	    (ag_spare_dir() && put(b, "SPTRACE_SPARE", ag_spare_dir())) ||
	    (ag_lookahead_whole() && put(b, "SPTRACE_LOOKAHEAD", "all")) ||
	    (ag_propagate_session() && (put(b, "SPTRACE_SESSION", ag_propagate_session()) ||
					put(b, "SPTRACE_PROPAGATE_WAIT", ag_propagate_wait()) ||
					put(b, "SPTRACE_MARK", ag_propagate_mark()))))
		return NULL;
	/* Optional: without it the new image checks every image itself. */
	if (ag_modules_images_env(images, sizeof images))
		(void)put(b, "SPTRACE_IMAGES", images);
	b->env[b->n] = NULL;
	if (strcmp(kind, "exec") == 0)
		ag_note_exec(b->sub, path, getpid());
	return b->env;
}

static int failed(env_buf *b)
{
	int e = errno;

	ag_note_exec_failed(b->sub);
	errno = e;
	return -1;
}

/*
 * The exec itself, under the instrument lock: a signal pending when exec
 * succeeds stays pending in the new image, whose handlers are the
 * defaults -- a SIGTRAP the agent queued to this thread (a relocated
 * windows round, relocate.c, or an activation's walk, activate.c, both
 * queued under the lock) would kill it.  Holding the lock, none is queued;
 * those queued before are delivered first.
 * The thread is inside the agent meanwhile (ag_enter): the C library's
 * execvpe may reach call sites of its own not instrumented yet, whose slow
 * path would wait for the lock this thread holds.
 * Not in a vfork child: it runs on its parent's memory, and a successful
 * exec would leave the lock held there (and the parent inside the agent).
 */
typedef struct exec_guard {
	bool locked;
	trace_ring_header *ring;
} exec_guard;

static exec_guard exec_lock(void)
{
	exec_guard g = { syscall(SYS_getpid) == ag_self_pid, NULL };

	if (g.locked) {
		g.ring = ag_enter();
		ag_instrument_lock();
		/* A request queued before we held the lock (an activation's walk
		 * too: it queues under the lock) is delivered on the way out of
		 * this system call. */
		syscall(SYS_getpid);
	}
	return g;
}

static int exec_unlock(exec_guard g, int rc)
{
	int e = errno;

	if (g.locked) {
		ag_instrument_unlock();
		ag_leave(g.ring);
	}
	errno = e;
	return rc;
}

static int exec_locked(execve_fn real, const char *file, char *const argv[], char *const envp[])
{
	exec_guard g = exec_lock();

	return exec_unlock(g, real(file, argv, envp));
}

/* An exec through `real` (execve or execvpe) with the traced environment. */
static int exec_traced(execve_fn real, const char *file, char *const argv[], char *const envp[])
{
	env_buf b;
	char *const *env;

	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	env = traced_env(&b, envp, file);
	if (!env)
		return exec_locked(real, file, argv, envp);
	exec_locked(real, file, argv, env);
	return failed(&b);
}

AG_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	return exec_traced(real_execve, path, argv, envp);
}

AG_EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

AG_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	return exec_traced(real_execvpe, file, argv, envp);
}

AG_EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

AG_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	env_buf b;
	char *const *env;
	char what[32];

	if (!real_fexecve) {
		errno = ENOSYS;
		return -1;
	}
	snprintf(what, sizeof what, "fd %d", fd);
	env = traced_env(&b, envp, what);
	exec_guard g = exec_lock();

	if (!env)
		return exec_unlock(g, real_fexecve(fd, argv, envp));
	exec_unlock(g, real_fexecve(fd, argv, env));
	return failed(&b);
}

/* execl and friends: the arguments into an array on the stack (and, for
 * execle, the environment after them), then the traced exec. */
static int exec_list(execve_fn real, const char *file, const char *arg0, va_list ap,
		     bool env_follows)
{
	char *argv[MAX_ARGS + 1], **envp = environ;
	size_t n = 0;

	argv[n++] = (char *)arg0;
	while (arg0 && n < MAX_ARGS) {
		argv[n] = va_arg(ap, char *);
		if (!argv[n])
			break;
		n++;
	}
	if (n >= MAX_ARGS) {
		errno = E2BIG;
		return -1;
	}
	argv[n] = NULL;
	if (env_follows)
		envp = va_arg(ap, char **);
	return exec_traced(real, file, argv, envp);
}

AG_EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(real_execve, path, arg, ap, false);
	va_end(ap);
	return rc;
}

AG_EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(real_execvpe, file, arg, ap, false);
	va_end(ap);
	return rc;
}

AG_EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(real_execve, path, arg, ap, true);
	va_end(ap);
	return rc;
}

/* posix_spawn(p): the child gets the traced environment; its trace is in
 * DIR/spawn.PID.N (the buffer is large: not for a vfork child, this runs
 * in the program's own thread). */
static int spawn_traced(spawn_fn real, pid_t *pid, const char *file,
			const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
			char *const argv[], char *const envp[])
{
	static __thread env_buf *tls_b;  /* not on the stack: 48 KiB */
	env_buf *b = tls_b;
	char *const *env;
	ag_start_slot slot = { -1, 0 };
	pid_t child;
	int rc;

	if (!real)
		return ENOSYS;
	if (!b)
		b = tls_b = ag_alloc(sizeof *b);
	env = b ? traced_env_as(b, envp, file, "spawn") : NULL;
	/* The child runs with every signal blocked until its exec, and the
	 * caller waits for that: no code is written meanwhile (patch.c). */
	if (ag_active())
		ag_start_begin(&slot, 1);
	if (!env)
		rc = real(pid, file, fa, attr, argv, envp);
	else
		rc = real(&child, file, fa, attr, argv, env);
	ag_start_end(slot, true);
	if (!env)
		return rc;
	if (rc == 0) {
		ag_note_exec(b->sub, file, child);
		if (pid)
			*pid = child;
	}
	return rc;
}

AG_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
			  const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_traced(real_spawn, pid, path, fa, attr, argv, envp);
}

AG_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			   const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_traced(real_spawnp, pid, file, fa, attr, argv, envp);
}

/*
 * system(line): as POSIX and the C library do it -- SIGINT and SIGQUIT
 * ignored and SIGCHLD blocked in the caller while the command runs (the
 * first of concurrent calls saves the two actions, the last puts them
 * back), the shell started with the caller's mask and those two signals'
 * default actions unless they were ignored, and 127 as the shell's exit
 * status when it cannot be spawned -- but spawned traced, into
 * DIR/spawn.PID.N.  The wait is the one cancellation point: a thread
 * cancelled there kills the shell, reaps it and puts the signals back
 * before it goes (cancellation is held off while the shell is started, so
 * it never leaves a half-made spawn behind).
 */
static pthread_mutex_t system_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned system_running;
static struct sigaction system_intr, system_quit;

typedef struct system_call {
	pid_t pid;
	sigset_t omask;
} system_call;

static void system_done(const system_call *sc)
{
	pthread_mutex_lock(&system_lock);
	if (--system_running == 0) {
		sigaction(SIGINT, &system_intr, NULL);
		sigaction(SIGQUIT, &system_quit, NULL);
	}
	pthread_mutex_unlock(&system_lock);
	sigprocmask(SIG_SETMASK, &sc->omask, NULL);
}

static void system_cancelled(void *arg)
{
	system_call *sc = arg;
	trace_ring_header *ring = ag_enter();

	kill(sc->pid, SIGKILL);
	while (waitpid(sc->pid, NULL, 0) < 0 && errno == EINTR)
		;
	system_done(sc);
	ag_leave(ring);
}

AG_EXPORT int system(const char *line)
{
	static int (*real)(const char *);
	struct sigaction ign = { .sa_handler = SIG_IGN };
	sigset_t chld, dfl;
	posix_spawnattr_t attr;
	system_call sc;
	int status = -1, rc, cancel;
	trace_ring_header *ring;

	if (!real)
		real = (int (*)(const char *))dlsym(RTLD_NEXT, "system");
	if (!line || !real_spawn)
		return real ? real(line) : -1;  /* NULL: is there a shell? */
	/* The agent's own work records nothing: the trace shows system()
	 * (it is the C library's to the program), not the C library code the
	 * agent runs for it -- half of which, reached from sites the agent
	 * never patches, would hang in the tree without its callers. */
	ring = ag_enter();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	pthread_mutex_lock(&system_lock);
	if (system_running++ == 0) {
		sigemptyset(&ign.sa_mask);
		sigaction(SIGINT, &ign, &system_intr);
		sigaction(SIGQUIT, &ign, &system_quit);
	}
	pthread_mutex_unlock(&system_lock);
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &sc.omask);
	sigemptyset(&dfl);
	if (system_intr.sa_handler != SIG_IGN)
		sigaddset(&dfl, SIGINT);
	if (system_quit.sa_handler != SIG_IGN)
		sigaddset(&dfl, SIGQUIT);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigmask(&attr, &sc.omask);
	posix_spawnattr_setsigdefault(&attr, &dfl);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	rc = spawn_traced(real_spawn, &sc.pid, "/bin/sh", NULL, &attr,
			  (char *const[]){ "sh", "-c", "--", (char *)line, NULL }, environ);
	posix_spawnattr_destroy(&attr);
	pthread_setcancelstate(cancel, NULL);
	ag_leave(ring);
	if (rc == 0) {
		pthread_cleanup_push(system_cancelled, &sc);
		while (waitpid(sc.pid, &status, 0) != sc.pid)
			if (errno != EINTR) {
				status = -1;
				break;
			}
		pthread_cleanup_pop(0);
	} else {
		status = W_EXITCODE(127, 0);
	}
	ring = ag_enter();
	system_done(&sc);
	ag_leave(ring);
	if (rc)
		errno = rc;
	return status;
}
