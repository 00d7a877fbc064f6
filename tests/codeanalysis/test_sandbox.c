/*
 * test_sandbox.c — the DWARF reader's sandbox (codeanalysis/sandbox.c),
 * entered by forked children: what the reader needs still works, what it
 * must not do kills it with SIGSYS, and (as root) it runs as nobody with no
 * capabilities, no_new_privs and a filter (checked in /proc/PID/status).
 *
 * The one test of an internal seam (ca_internal.h): lines.c's child cannot
 * be told to misbehave from codeanalysis.h, and this is what stands between
 * a libdwarf bug and root.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ca_internal.h"

static int failures;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "test_sandbox:%d: FAIL: ", __LINE__); \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
			failures++;                                        \
		}                                                          \
	} while (0)

/* What a child does once sandboxed; its return is its exit status. */
typedef int (*action)(int out, int extra);

/* Fork, sandbox the child (keeping `out`, a pipe, and nothing else), run
 * `act`; the child's wait status.  `extra` is a descriptor the child is
 * handed but not allowed to keep. */
static int run_sandboxed(action act, int extra)
{
	int fds[2], status = 0;
	char buf[64];
	pid_t pid;

	if (pipe(fds) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		sp_err err = { "" };

		close(fds[0]);
		if (ca_sandbox_enter(&fds[1], 1, fds[1], &err) < 0) {
			fprintf(stderr, "ca_sandbox_enter: %s\n", err.msg);
			_exit(100);
		}
		_exit(act(fds[1], extra));
	}
	close(fds[1]);
	while (read(fds[0], buf, sizeof buf) > 0)   /* until the child is gone */
		;
	close(fds[0]);
	waitpid(pid, &status, 0);
	return status;
}

static bool killed_by_sigsys(int status)
{
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS;
}

/* ---- what the reader needs ------------------------------------------- */

static int reader_work(int out, int extra)
{
	struct stat st;
	char *big = malloc(64 << 20), *small;   /* mmap'd by malloc */

	(void)extra;
	if (!big)
		return 1;
	memset(big, 1, 64 << 20);
	small = malloc(100);
	big = realloc(big, 128 << 20);          /* mremap */
	if (!small || !big)
		return 2;
	free(big);
	free(small);
	if (fstat(out, &st) < 0 || !S_ISFIFO(st.st_mode))
		return 3;
	if (write(out, "rows", 4) != 4)
		return 4;
	return 0;
}

static int reader_fd_closed(int out, int extra)
{
	(void)out;
	return fcntl(extra, F_GETFD) < 0 && errno == EBADF ? 0 : 1;
}

/* ---- what it must not do ---------------------------------------------- */

static int bad_open(int out, int extra)
{
	(void)out, (void)extra;
	return open("/etc/passwd", O_RDONLY) >= 0 ? 0 : 1;
}

static int bad_write_stdout(int out, int extra)
{
	(void)out, (void)extra;
	return write(STDOUT_FILENO, "", 0) == 0 ? 0 : 1;
}

static int bad_exec_mapping(int out, int extra)
{
	(void)out, (void)extra;
	return mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) !=
	       MAP_FAILED ? 0 : 1;
}

static int bad_socket(int out, int extra)
{
	(void)out, (void)extra;
	return socket(AF_INET, SOCK_STREAM, 0) >= 0 ? 0 : 1;
}

static int bad_kill(int out, int extra)
{
	(void)out, (void)extra;
	return kill(1, 0) == 0 ? 0 : 1;
}

/* A heap corruption glibc detects (what libdwarf's double free on a corrupt
 * .debug_rnglists is): its message and abort() must get through, so that
 * the parent reports a crash (SIGABRT), not a forbidden call.  With ASan the
 * sanitizer reports it instead, and may be stopped trying to symbolise. */
static int crash_double_free(int out, int extra)
{
	char *volatile p = malloc(32);

	(void)out, (void)extra;
	free(p);
	free(p);
	return 0;
}

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif

/* ---- identity, seen from outside ----------------------------------------- */

/* The child's /proc/PID/status line starting with `key`, in buf. */
static bool status_line(pid_t pid, const char *key, char *buf, size_t len)
{
	char path[64];
	FILE *f;
	bool found = false;

	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (!found && fgets(buf, (int)len, f))
		found = strncmp(buf, key, strlen(key)) == 0;
	fclose(f);
	if (found)
		buf[strcspn(buf, "\n")] = '\0';
	return found;
}

static void test_identity(void)
{
	int to_child[2], from_child[2], status = 0;
	char c, line[256];
	pid_t pid;

	if (pipe(to_child) < 0 || pipe(from_child) < 0)
		return;
	pid = fork();
	if (pid == 0) {
		int keep[2] = { to_child[0], from_child[1] };
		sp_err err = { "" };

		if (ca_sandbox_enter(keep, 2, from_child[1], &err) < 0)
			_exit(100);
		/* ready; then wait until the parent has looked */
		if (write(from_child[1], "r", 1) != 1 || read(to_child[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	close(to_child[0]);
	close(from_child[1]);
	CHECK(read(from_child[0], &c, 1) == 1, "the sandboxed child did not start");
	if (geteuid() == 0) {
		CHECK(status_line(pid, "Uid:", line, sizeof line) &&
		      strcmp(line, "Uid:\t65534\t65534\t65534\t65534") == 0,
		      "a root child should become nobody: %s", line);
		CHECK(status_line(pid, "Gid:", line, sizeof line) &&
		      strcmp(line, "Gid:\t65534\t65534\t65534\t65534") == 0,
		      "a root child should become nogroup: %s", line);
		CHECK(status_line(pid, "Groups:", line, sizeof line) &&
		      strspn(line + 7, " \t") == strlen(line + 7),
		      "a root child should have no supplementary groups: %s", line);
		CHECK(status_line(pid, "CapEff:", line, sizeof line) &&
		      strcmp(line, "CapEff:\t0000000000000000") == 0,
		      "a root child should have no capabilities left: %s", line);
	}
	CHECK(status_line(pid, "NoNewPrivs:", line, sizeof line) &&
	      strcmp(line, "NoNewPrivs:\t1") == 0, "no_new_privs should be set: %s", line);
	CHECK(status_line(pid, "Seccomp:", line, sizeof line) &&
	      strcmp(line, "Seccomp:\t2") == 0, "a seccomp filter should be on: %s", line);
	CHECK(write(to_child[1], "g", 1) == 1, "cannot release the child");
	close(to_child[1]);
	close(from_child[0]);
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the sandboxed child should exit 0, wait status 0x%x", status);
}

int main(void)
{
	static const struct {
		const char *what;
		action act;
	} forbidden[] = {
		{ "open(\"/etc/passwd\")", bad_open },
		{ "write to stdout", bad_write_stdout },
		{ "an executable mapping", bad_exec_mapping },
		{ "socket()", bad_socket },
		{ "kill()", bad_kill },
	};
	int status, extra = open("/dev/null", O_RDONLY);

	status = run_sandboxed(reader_work, -1);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "malloc, realloc, fstat and a write to the pipe should work in the sandbox "
	      "(wait status 0x%x)", status);
	status = run_sandboxed(reader_fd_closed, extra);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "a descriptor not kept should be closed in the sandbox (wait status 0x%x)", status);
	for (size_t i = 0; i < sizeof forbidden / sizeof forbidden[0]; i++) {
		status = run_sandboxed(forbidden[i].act, -1);
		CHECK(killed_by_sigsys(status), "%s should kill the sandboxed child with SIGSYS "
		      "(wait status 0x%x)", forbidden[i].what, status);
	}
	status = run_sandboxed(crash_double_free, -1);
#ifdef ASAN_BUILD
	CHECK(!WIFEXITED(status) || WEXITSTATUS(status) != 0,
	      "a double free should not look like success (wait status 0x%x)", status);
#else
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
	      "glibc's double-free abort should end the sandboxed child with SIGABRT, not "
	      "(wait status 0x%x)", status);
#endif
	test_identity();
	close(extra);
	if (failures) {
		fprintf(stderr, "test_sandbox: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_sandbox: all checks passed\n");
	return 0;
}
