/*
 * cmd_stop.c — `sptrace stop PID | --all`: deactivate the agent in running
 * processes.  Every patched byte is put back (the code is again identical to
 * the files) and the trace is completed; the program goes on untraced.
 *
 * The agent registers each traced process as a link
 * $XDG_RUNTIME_DIR/sptrace/<pid>-<start time> (or /tmp/sptrace-<uid>/...) to
 * its trace directory, where a FIFO named `control` takes the command
 * (agent/control.c).
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "registry.h"
#include "trace_format.h"

static const char help[] =
	"usage: sptrace stop PID...\n"
	"       sptrace stop --all\n"
	"\n"
	"Stop tracing in running processes started with 'sptrace run': the agent puts\n"
	"back every byte of code it patched, closes the trace and goes dormant for\n"
	"good; the program runs on untraced.  Waits until the agent confirms.\n"
	"\n"
	"options:\n"
	"  --all               every traced process of this user\n"
	"  --timeout SECONDS   how long to wait for each agent (default 10)\n"
	"  -h, --help          this text\n";

static int stop_one(const char *reg, const char *pid, double timeout)
{
	char link[PATH_MAX], dir[PATH_MAX], fifo[PATH_MAX + 16], why[512];
	struct timespec t0, now;
	ssize_t n;
	int fd;

	for (const char *p = pid; *p; p++)
		if (*p < '0' || *p > '9')
			return cli_error("stop: '%s' is not a process id", pid);
	snprintf(link, sizeof link, "%s/%s-%llu", reg, pid, sp_proc_start_time(pid));
	n = readlink(link, dir, sizeof dir - 1);
	if (n <= 0) {
		if (kill(atoi(pid), 0) != 0 && errno == ESRCH)
			return cli_error("stop: pid %s: no such process", pid);
		return cli_error("stop: pid %s is not traced by sptrace (nothing registered in %s); "
				 "start programs with 'sptrace run'", pid, reg);
	}
	dir[n] = '\0';
	if (kill(atoi(pid), 0) != 0 && errno == ESRCH) {
		unlink(link);
		return cli_error("stop: pid %s has exited; its trace is in %s", pid, dir);
	}
	if (cli_meta_end(dir, why, sizeof why))
		return cli_error("stop: pid %s: tracing already ended (%s); trace in %s", pid, why, dir);
	snprintf(fifo, sizeof fifo, "%s/control", dir);
	fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return cli_error("stop: pid %s: the agent does not answer on %s: %s", pid, fifo,
				 errno == ENXIO ? "no control thread is listening" : strerror(errno));
	if (write(fd, "stop\n", 5) != 5) {
		close(fd);
		return cli_error("stop: pid %s: cannot write to %s: %s", pid, fifo, strerror(errno));
	}
	close(fd);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if (cli_meta_end(dir, why, sizeof why)) {
			printf("sptrace: pid %s: %s; trace in %s\n", pid, why, dir);
			return 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 > timeout)
			return cli_error("stop: pid %s: no confirmation from the agent within %.0f s; "
					 "see %s/agent.log", pid, timeout, dir);
		usleep(10000);
	}
}

int cmd_stop(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "all", no_argument, 0, 'a' }, { "timeout", required_argument, 0, 't' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	char reg[PATH_MAX];
	double timeout = 10;
	int c, all = 0, failed = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'a': all = 1; break;
		case 't': timeout = atof(optarg); break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("stop: option '%s' needs a value; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		default:
			return cli_error("stop: unknown option '%s'; see 'sptrace stop --help'",
					 argv[optind - 1]), 2;
		}
	}
	sp_registry_dir(reg, sizeof reg);
	if (all) {
		DIR *d = opendir(reg);
		struct dirent *de;
		int any = 0;

		while (d && (de = readdir(d))) {
			char pid[32], stale[PATH_MAX + 300];
			const char *dash = strchr(de->d_name, '-');

			if (de->d_name[0] < '0' || de->d_name[0] > '9' || !dash ||
			    (size_t)(dash - de->d_name) >= sizeof pid)
				continue;
			snprintf(pid, sizeof pid, "%.*s", (int)(dash - de->d_name), de->d_name);
			if (strtoull(dash + 1, NULL, 10) != sp_proc_start_time(pid)) {
				/* left by a process that is gone: not ours to stop */
				snprintf(stale, sizeof stale, "%s/%s", reg, de->d_name);
				unlink(stale);
				continue;
			}
			any = 1;
			failed |= stop_one(reg, pid, timeout);
		}
		if (d)
			closedir(d);
		if (!any)
			printf("sptrace: no traced process is registered in %s\n", reg);
		return failed;
	}
	if (optind >= argc)
		return cli_error("stop: no process id given; see 'sptrace stop --help'"), 2;
	for (int i = optind; i < argc; i++)
		failed |= stop_one(reg, argv[i], timeout);
	return failed;
}
