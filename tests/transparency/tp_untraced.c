/*
 * tp_untraced.c — every function the agent interposes (agent/hooks.c's
 * table), called once each, with what it returned printed.  Run natively
 * and with the agent preloaded but not started (no SPTRACE_DIR: loaded
 * without sptrace run, it must stay out of the way): the outputs must be
 * the same (test_untraced.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

extern char **environ;

static ucontext_t uc_main, uc_f;
static char stack[65536];

static void *thread_main(void *arg)
{
	return arg;
}

static void in_context(void)
{
	swapcontext(&uc_f, &uc_main);
}

static void say(const char *what, long rc)
{
	printf("%-14s %ld %s\n", what, rc, rc < 0 ? strerror(errno) : "");
}

#define T(what, expr) do { errno = 0; say(what, (long)(expr)); } while (0)

/* The status of a child that runs `how` (an exec of /bin/sh exiting 7). */
static void child(const char *what, int how)
{
	char *sh[] = { "sh", "-c", "exit 7", NULL };
	int status = 0;
	pid_t pid = fork();

	if (pid == 0) {
		if (how == 0)
			execve("/bin/sh", sh, environ);
		else if (how == 1)
			execvp("sh", sh);
		else if (how == 2)
			execl("/bin/sh", "sh", "-c", "exit 7", (char *)NULL);
		else
			execv("/bin/sh", sh);
		_exit(99);
	}
	waitpid(pid, &status, 0);
	printf("%-14s %d\n", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int main(void)
{
	struct sigaction sa = { .sa_handler = SIG_IGN };
	char *sh[] = { "sh", "-c", "exit 7", NULL };
	int sv[2], p[2], sig = 0, status = 0;
	struct iovec iov;
	char buf[8];
	sigset_t set;
	pthread_t t;
	pid_t pid;

	T("sigaction", sigaction(SIGUSR1, &sa, NULL));
	T("signal", signal(SIGUSR2, SIG_IGN) == SIG_ERR ? -1 : 0);
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	T("sigprocmask", sigprocmask(SIG_BLOCK, &set, NULL));
	T("pthread_sigmask", pthread_sigmask(SIG_BLOCK, &set, NULL));
	int sfd = signalfd(-1, &set, SFD_CLOEXEC);
	T("signalfd", sfd >= 0 ? 0 : -1);
	close(sfd);
	raise(SIGUSR1);
	T("sigwait", sigwait(&set, &sig));
	T("pthread_create", pthread_create(&t, NULL, thread_main, NULL));
	pthread_join(t, NULL);
	getcontext(&uc_f);
	uc_f.uc_stack.ss_sp = stack;
	uc_f.uc_stack.ss_size = sizeof stack;
	uc_f.uc_link = &uc_main;
	makecontext(&uc_f, in_context, 0);
	T("swapcontext", swapcontext(&uc_main, &uc_f));
	T("socketpair", socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	T("send", send(sv[0], "ab", 2, 0));
	T("recv", recv(sv[1], buf, 2, 0));
	T("write", write(sv[0], "cd", 2));
	T("read", read(sv[1], buf, 2));
	iov = (struct iovec){ buf, 2 };
	T("writev", writev(sv[0], &iov, 1));
	T("readv", readv(sv[1], &iov, 1));
	T("pipe2", pipe2(p, O_CLOEXEC));
	T("dup3", dup3(p[0], 50, O_CLOEXEC));
	T("fcntl", fcntl(50, F_GETFD));
	T("close", close(50));
	T("shutdown", shutdown(sv[0], SHUT_RDWR));
	T("prctl", prctl(PR_GET_DUMPABLE));
	T("syscall", syscall(SYS_getppid) > 0 ? 0 : -1);
	status = system("exit 7");
	T("system", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	T("posix_spawn", posix_spawn(&pid, "/bin/sh", NULL, NULL, sh, environ));
	waitpid(pid, &status, 0);
	T("  its status", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	T("posix_spawnp", posix_spawnp(&pid, "sh", NULL, NULL, sh, environ));
	waitpid(pid, &status, 0);
	T("  its status", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	child("execve", 0);
	child("execvp", 1);
	child("execl", 2);
	child("execv", 3);
	return 0;
}
