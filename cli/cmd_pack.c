/*
 * cmd_pack.c — `sptrace pack DIR`, and the packing `sptrace run` does while
 * it waits for the program (cli_pack_rings): a trace's files of every record
 * re-encoded into packed.<tid> (analysis/pack.c; trace_format.h, "Packed
 * blocks").
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"

/*
 * Compaction (trace_format.h, "Packed blocks"): every file of every record
 * in DIR and its exec'd images' subdirectories has its finished chunks
 * packed (an_pack_ring); those of process `gone` (0: none; AN_PACK_DEAD:
 * any process no longer running), which can write no more, all their
 * records.  0, or -1 once an error was said (the
 * caller stops compacting: the records stay raw, as with --no-compact).
 */
int cli_pack_rings(const char *dir, int gone, int depth)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = opendir(dir);
	int rc = 0;

	if (!d)
		return 0;
	while (rc == 0 && (de = readdir(d))) {
		sp_err err;

		if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= sizeof path)
			continue;
		if (depth < 16 && strncmp(de->d_name, "exec.", 5) == 0) {
			struct stat st;

			/* (a directory of its own, never through a link) */
			if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
				rc = cli_pack_rings(path, gone, depth + 1);
		} else if (strncmp(de->d_name, "ring.", 5) == 0 &&
			   an_pack_ring(path, gone, &err) < 0) {
			cli_error("%s: %s; the records not packed yet stay as written (8 bytes "
				  "each)", gone == AN_PACK_DEAD ? "pack" : "run", err.msg);
			rc = -1;
		}
	}
	closedir(d);
	return rc < 0 ? -1 : 0;
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
	return cli_pack_rings(argv[1], AN_PACK_DEAD, 0) < 0 ? 1 : 0;
}
