/*
 * cmd_pack.c — `sptrace pack DIR`, and the packing `sptrace run` does while
 * it waits for the program (cli_pack_rings): a trace's files of every record
 * re-encoded into packed.<tid> (analysis/pack.c; trace_format.h, "Packed
 * blocks"), and the thread that does it while the program runs
 * (cli_packer_start).
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"

/*
 * Compaction (trace_format.h, "Packed blocks"): every file of every record
 * in DIR and its exec'd images' subdirectories has its finished chunks
 * packed (an_pack_ring); those of process `gone` (0: none; AN_PACK_DEAD:
 * any process no longer running), which can write no more, all their
 * records.
 *
 * Root never follows a path another user could have planted, and packing
 * writes (packed.<tid> made, ring.<tid> cut):
 *   1. each directory is opened without following a link (O_NOFOLLOW |
 *      O_DIRECTORY, from its parent's descriptor) and packed only if it is
 *      the caller's and no one else may write into it (no group or other
 *      write bit): nothing in it is another user's doing;
 *   2. its files are reached through that descriptor (/proc/self/fd/N/NAME),
 *      so a directory renamed or replaced meanwhile is never entered by
 *      name; an_pack_ring opens each without following a link;
 *   3. a directory that fails 1 is left as it is, its records raw (every
 *      reader reads them), and said once where nothing repeats the walk
 *      (`sptrace pack`, and run's last pass: `gone` AN_PACK_DEAD).
 * The records packed, or -1 once an error was said (the caller stops
 * compacting: the records stay raw, as with --no-compact).
 */
static int64_t pack_dir(int dfd, const char *shown, int gone, int depth)
{
	char path[PATH_MAX], sub[PATH_MAX];
	struct dirent *de;
	struct stat st;
	DIR *d;
	int64_t rc = 0, n;

	if (fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
		if (gone == AN_PACK_DEAD)
			cli_error("pack: %s: %s: left as it is (its records stay raw; every reader "
				  "reads them); pack it as its owner", shown,
				  st.st_uid != geteuid() ? "not yours" : "others may write into it");
		close(dfd);
		return 0;
	}
	if (!(d = fdopendir(dfd))) {
		close(dfd);
		return 0;
	}
	while (rc >= 0 && (de = readdir(d))) {
		sp_err err;

		if (depth < 16 && strncmp(de->d_name, "exec.", 5) == 0) {
			int sfd = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sfd >= 0 && (size_t)snprintf(sub, sizeof sub, "%s/%s", shown,
							 de->d_name) < sizeof sub) {
				n = pack_dir(sfd, sub, gone, depth + 1);
				rc = n < 0 ? -1 : rc + n;
			} else if (sfd >= 0) {
				close(sfd);
			}
		} else if (strncmp(de->d_name, "ring.", 5) == 0 &&
			   (size_t)snprintf(path, sizeof path, "/proc/self/fd/%d/%s", dirfd(d),
					    de->d_name) < sizeof path) {
			if ((n = an_pack_ring(path, gone, &err)) >= 0) {
				rc += n;
				continue;
			}
			cli_error("%s: %s: %s; the records not packed yet stay as written (8 bytes "
				  "each)", gone == AN_PACK_DEAD ? "pack" : "run", shown, err.msg);
			rc = -1;
		}
	}
	closedir(d);
	return rc;
}

int64_t cli_pack_rings(const char *dir, int gone)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return dfd < 0 ? 0 : pack_dir(dfd, dir, gone, 0);
}

/*
 * The packer: sptrace run's thread that packs the finished chunks while the
 * program runs, at idle priority, so that it takes no CPU from the program.
 *
 *   1. It packs every 50 ms (a thread's chunk is 8 MiB by default: filled
 *      in about 30 ms at full rate) under SCHED_IDLE: it runs only on a CPU
 *      nothing else wants.  A chunk not packed yet stays raw in ring.<tid>
 *      (16 bytes a call, in the page cache or written to disk): nothing is
 *      lost however far behind the packer is; what it has not packed when
 *      the program ends, sptrace run packs then (cli_pack_rings, gone).
 *   2. Bounded: an idle thread may not run at all for long on a busy
 *      machine, so sptrace run's main thread (cli_packer_check, at the
 *      normal priority) puts the packer back at the normal priority when
 *      it has finished no pass for STALL_NS; a pass that found BEHIND
 *      records or more to pack (every thread's raw backlog together) does
 *      too, and the packer goes idle again only after a pass that found
 *      less than CAUGHT_UP.  It goes idle only if it may come back (root,
 *      CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0: sched(7));
 *      otherwise it stays at the normal priority, as before.
 *   3. cli_packer_stop: told to stop (an atomic flag, and a byte in its
 *      pipe to end its 50 ms wait), and joined, put back at the normal
 *      priority every 100 ms meanwhile (the pass it is in finishes at full
 *      speed; a pass that ends as the flag is set may have made it idle
 *      again).  No lock is shared with the packer: an idle thread that held
 *      one could hold up sptrace run.  The caller then makes the last pass
 *      itself; only one thread packs at a time (an_pack_ring keeps its
 *      state in statics).
 *   4. An error ends the packer (said once by cli_pack_rings); the records
 *      stay raw from there, as with --no-compact.
 */
#define BEHIND (32ull << 20)     /* records: 256 MiB raw */
#define CAUGHT_UP (8ull << 20)   /* 64 MiB */
#define STALL_NS 1000000000ull

struct cli_packer {
	char dir[PATH_MAX];
	pthread_t thread;
	int wake[2];
	int may_idle;
	/* atomic: */
	pid_t tid;
	int stop, failed;
	uint64_t pass_end;      /* sp_now_ns() after the last pass */
};

static void set_policy(const cli_packer *p, int policy)
{
	struct sched_param sp = { 0 };
	pid_t tid = __atomic_load_n(&p->tid, __ATOMIC_ACQUIRE);

	if (tid)
		sched_setscheduler(tid, policy, &sp);
}

/* May a thread at SCHED_IDLE go back to SCHED_OTHER at nice 0 (point 2)? */
static int may_leave_idle(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	struct rlimit rl;

	if (getrlimit(RLIMIT_NICE, &rl) == 0 && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 20))
		return 1;
	return syscall(SYS_capget, &h, d) == 0 && (d[0].effective & (1u << CAP_SYS_NICE));
}

static void *packer_main(void *arg)
{
	cli_packer *p = arg;

	__atomic_store_n(&p->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	if (p->may_idle)
		set_policy(p, SCHED_IDLE);
	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pf = { p->wake[0], POLLIN, 0 };
		int64_t n = cli_pack_rings(p->dir, 0);

		if (n < 0) {
			__atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
			break;
		}
		__atomic_store_n(&p->pass_end, sp_now_ns(), __ATOMIC_RELEASE);
		/* point 2 (the main thread may have put it back at normal) */
		if ((uint64_t)n >= BEHIND)
			set_policy(p, SCHED_OTHER);
		else if (p->may_idle && (uint64_t)n < CAUGHT_UP)
			set_policy(p, SCHED_IDLE);
		poll(&pf, 1, 50);
	}
	return NULL;
}

cli_packer *cli_packer_start(const char *dir)
{
	cli_packer *p = calloc(1, sizeof *p);
	int e;

	if (!p)
		return NULL;
	snprintf(p->dir, sizeof p->dir, "%s", dir);
	p->may_idle = may_leave_idle();
	p->pass_end = sp_now_ns();
	if (pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		free(p);
		return NULL;
	}
	if ((e = pthread_create(&p->thread, NULL, packer_main, p)) != 0) {
		close(p->wake[0]);
		close(p->wake[1]);
		free(p);
		errno = e;
		return NULL;
	}
	return p;
}

void cli_packer_check(cli_packer *p)
{
	if (p && p->may_idle &&
	    sp_now_ns() - __atomic_load_n(&p->pass_end, __ATOMIC_ACQUIRE) >= STALL_NS)
		set_policy(p, SCHED_OTHER);             /* (point 2) */
}

int cli_packer_stop(cli_packer *p)
{
	int failed;

	if (!p)
		return 0;
	__atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
	if (write(p->wake[1], "", 1) < 0) { /* (full: it is awake already) */ }
	for (;;) {
		struct timespec t;

		set_policy(p, SCHED_OTHER);             /* (point 3) */
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_nsec += 100000000;
		if (t.tv_nsec >= 1000000000) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000;
		}
		if (pthread_timedjoin_np(p->thread, NULL, &t) == 0)
			break;
	}
	failed = __atomic_load_n(&p->failed, __ATOMIC_ACQUIRE);
	close(p->wake[0]);
	close(p->wake[1]);
	free(p);
	return failed ? -1 : 0;
}

static const char pack_help[] =
	"usage: sptrace pack DIR\n"
	"\n"
	"Store the records of the trace in DIR compactly, as 'sptrace run' does\n"
	"itself while the program runs (unless --no-compact): each thread's\n"
	"ring.<tid> file of every record is re-encoded into DIR/packed.<tid>\n"
	"(about 2-4 bytes a call instead of 16) and the records packed are freed\n"
	"in ring.<tid>.  For a trace made with --no-compact, or one whose\n"
	"'sptrace run' was killed before it could pack the rest.  The files of a\n"
	"process still running are packed up to the chunk its threads are\n"
	"writing; rings (--flight-recorder) are left as they are.  Every reader\n"
	"reads both forms.\n";

int cmd_pack(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
		return fputs(pack_help, stdout), 0;
	if (argc != 2 || argv[1][0] == '-')
		return cli_error("pack: usage: sptrace pack DIR; see 'sptrace pack --help'"), 2;
	if (access(argv[1], F_OK) != 0)
		return cli_error("pack: %s: %s", argv[1], strerror(errno)), 1;
	return cli_pack_rings(argv[1], AN_PACK_DEAD) < 0 ? 1 : 0;
}
