/*
 * cmd_pack.c — `sptrace pack DIR`, and the packing `sptrace run` does while
 * it waits for the program (cli_pack_rings): a trace's files of every record
 * re-encoded into packed.<tid> (analysis/pack.c; trace_format.h, "Packed
 * blocks").
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"
#include "trace_format.h"

/*
 * The directories of a trace, for every pass that writes beside its files
 * (packing, the look-ahead profiles: cli/lookahead.c).  Root never follows
 * a path another user could have planted:
 *   1. DIR and its exec'd images' and spawned children's subdirectories
 *      (exec.*, spawn.*, at most 16 deep) are each opened without following
 *      a link (O_NOFOLLOW | O_DIRECTORY, from its parent's descriptor) and
 *      taken only if it is the caller's and no one else may write into it
 *      (no group or other write bit): nothing in it is another user's
 *      doing;
 *   2. its files are reached through that descriptor (/proc/self/fd/N/NAME
 *      or *at calls), so a directory renamed or replaced meanwhile is never
 *      entered by name;
 *   3. a directory that fails 1 is left as it is: visit(-1, shown, WHY).
 * For a directory taken: visit(dfd, shown, NULL) first, then
 * visit(dfd, shown, NAME) for each of its entries but the subdirectories
 * walked.  A visit's -1 ends the walk.  0, or -1.
 */
static int walk(int dfd, const char *shown, int depth, cli_trace_visit visit, void *arg)
{
	char sub[PATH_MAX];
	struct dirent *de;
	struct stat st;
	DIR *d;
	int rc;

	if (!sp_fd_private(dfd, &st)) {
		close(dfd);
		return visit(-1, shown, st.st_uid != geteuid() ? "not yours" :
			     "others may write into it", arg) < 0 ? -1 : 0;
	}
	if ((rc = visit(dfd, shown, NULL, arg)) < 0 || !(d = fdopendir(dfd))) {
		close(dfd);
		return rc < 0 ? -1 : 0;
	}
	rc = 0;
	while (rc == 0 && (de = readdir(d))) {
		if (depth < 16 && (strncmp(de->d_name, "exec.", 5) == 0 ||
				   strncmp(de->d_name, "spawn.", 6) == 0)) {
			int sfd = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sfd >= 0 && (size_t)snprintf(sub, sizeof sub, "%s/%s", shown,
							 de->d_name) < sizeof sub)
				rc = walk(sfd, sub, depth + 1, visit, arg);
			else if (sfd >= 0)
				close(sfd);
		} else {
			rc = visit(dirfd(d), shown, de->d_name, arg);
		}
	}
	closedir(d);
	return rc < 0 ? -1 : 0;
}

int cli_trace_walk(const char *dir, cli_trace_visit visit, void *arg)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return dfd < 0 ? 0 : walk(dfd, dir, 0, visit, arg);
}

/*
 * Compaction (trace_format.h, "Packed blocks"): every file of every record
 * in the trace's directories (cli_trace_walk) has its finished chunks
 * packed (an_pack_ring), and all its records once its process is gone
 * (AN_PACK_DEAD): while `sptrace run` waits, so that a program of many short
 * processes leaves little to do after its end.  A directory not the
 * caller's own keeps its records raw (every reader reads them), said once,
 * in the last pass.  -1 once an error was said (the caller stops
 * compacting: the records stay raw, as with --no-compact).
 */
struct pack_pass {
	const char *cmd;
	bool last;
	int64_t packed;            /* records packed in this pass */
};

static int pack_one(int dfd, const char *shown, const char *name, void *arg)
{
	struct pack_pass *pass = arg;
	char path[PATH_MAX];
	struct stat st;
	int64_t n;
	sp_err err;

	if (dfd < 0) {
		if (pass->last)
			cli_error("%s: %s: %s: left as it is (its records stay raw; every reader "
				  "reads them); pack it as its owner", pass->cmd, shown, name);
		return 0;
	}
	/* A file cut to its header is packed whole (trace_format.h, "Packed
	 * blocks", point 5): one look at its size, at every pass. */
	if (!name || strncmp(name, "ring.", 5) != 0 ||
	    (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
	     st.st_size <= TRACE_RING_HEADER_SIZE) ||
	    (size_t)snprintf(path, sizeof path, "/proc/self/fd/%d/%s", dfd, name) >= sizeof path)
		return 0;
	if ((n = an_pack_ring(path, AN_PACK_DEAD, &err)) >= 0) {
		pass->packed += n;
		return 0;
	}
	cli_error("%s: %s: %s; the records not packed yet stay as written (8 bytes each)",
		  pass->cmd, shown, err.msg);
	return -1;
}

int64_t cli_pack_rings(const char *cmd, const char *dir, bool last)
{
	struct pack_pass pass = { cmd, last, 0 };

	return cli_trace_walk(dir, pack_one, &pass) < 0 ? -1 : pass.packed;
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
	return cli_pack_rings("pack", argv[1], true) < 0 ? 1 : 0;
}
