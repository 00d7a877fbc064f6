/*
 * cmd_export.c — `sptrace export DIR --format perfetto|chrome -o FILE`: a
 * trace, or a collected session of many hosts, as a file a trace viewer
 * opens: the command around an_export (analysis.h).
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"

/* What viewers open: Perfetto's UI holds a trace in the browser's memory
 * and fails beyond about 500 MB (its docs point to trace_processor then). */
#define DEFAULT_MAX_MB 500

static const char help[] =
	"usage: sptrace export [OPTIONS] DIR --format perfetto|chrome -o FILE\n"
	"\n"
	"Write the trace DIR -- with the images it exec'd, or every process of every\n"
	"host of a tree made by 'sptrace collect' -- as a file a trace viewer opens:\n"
	"\n"
	"  perfetto  Perfetto's TrackEvent protobuf (ui.perfetto.dev, trace_processor):\n"
	"            a track per process (named \"PROGRAM (host HOST, pid PID)\") and\n"
	"            per thread, a slice per call, an instant per event and message,\n"
	"            and an arrow from each send to the receive that read it (the\n"
	"            matching of 'sptrace flows').\n"
	"  chrome    Trace Event JSON (chrome://tracing, speedscope): a complete\n"
	"            event (\"X\") per call, instants, process and thread names, flow\n"
	"            events for messages; times in microseconds from the earliest\n"
	"            record.\n"
	"\n"
	"Times are each host's CLOCK_REALTIME.  Two hosts may have processes of the\n"
	"same pid: the second gets another number in the file (its name keeps the\n"
	"real one).  A file over --max-size is not written: viewers cannot open it.\n"
	"\n"
	"options:\n"
	"  -f, --format F     perfetto or chrome\n"
	"  -o, --output FILE  the file to write (\"-\": standard output)\n"
	"  --flow ID          only flow ID's records (an id of 'sptrace flows DIR')\n"
	"  --max-size MB      refuse to write more (default 500; 0: no limit)\n"
	"  --repo DIR         code-analysis repository, for function names\n"
	"                     (default: $SPTRACE_REPO, else /var/lib/sptrace/repo as\n"
	"                     root, ~/.cache/sptrace/repo)\n"
	"  -q, --quiet        no progress on stderr\n"
	"  -h, --help         this text\n";

/* ---- processes and threads, numbered for the file ---- */

/* an_export's progress, on stderr. */
static void say_progress(void *arg, uint64_t done, uint64_t total, uint64_t bytes)
{
	(void)arg;
	fprintf(stderr, "sptrace: export: %" PRIu64 "%% (%.1f M of %.1f M records, %.0f MB "
		"written)\n", total ? done * 100 / total : 100, (double)done / 1e6,
		(double)total / 1e6, (double)bytes / 1e6);
}

int cmd_export(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "format", required_argument, 0, 'f' }, { "output", required_argument, 0, 'o' },
		{ "max-size", required_argument, 0, 'm' }, { "repo", required_argument, 0, 'r' },
		{ "flow", required_argument, 0, 'F' }, { "quiet", no_argument, 0, 'q' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	an_open_opts oo = { 0 };
	const char *format = NULL, *output = NULL, *flow = NULL, *dir;
	double max_mb = DEFAULT_MAX_MB;
	an_export_opts eo = { .progress = say_progress };
	an_session *s;
	char *tmp = NULL;
	FILE *out;
	sp_err err;
	char *end;
	int c, rc;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":f:o:qh", lo, NULL)) != -1) {
		switch (c) {
		case 'f': format = optarg; break;
		case 'o': output = optarg; break;
		case 'r': oo.repo = optarg; break;
		case 'q': eo.progress = NULL; break;
		case 'F': flow = optarg; break;
		case 'm':
			errno = 0;
			max_mb = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(max_mb >= 0) || max_mb > 1e12)
				return cli_error("export: --max-size %s: give megabytes (a "
						 "number; 0: no limit)", optarg), 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("export: option '%s' needs a value; see 'sptrace export "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("export: unknown option '%s'; see 'sptrace export --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("export: %s; see 'sptrace export --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	dir = argv[optind];
	if (!format)
		return cli_error("export: no --format given: perfetto or chrome; see 'sptrace "
				 "export --help'"), 2;
	if (strcmp(format, "perfetto") != 0 && strcmp(format, "chrome") != 0)
		return cli_error("export: --format %s: no such format; give perfetto or chrome",
				 format), 2;
	if (!output)
		return cli_error("export: no output file given: -o FILE (\"-\": standard "
				 "output)"), 2;
	if (an_session_open(dir, &oo, &s, &err) < 0)
		return cli_error("export: %s", err.msg);
	{
		an_lost l;

		an_session_lost(s, &l);
		cli_say_lost("export", &l, NULL);
	}
	for (size_t i = 0; i < an_session_nwarnings(s); i++)
		fprintf(stderr, "sptrace: export: warning: %s\n", an_session_warning(s, i));
	out = strcmp(output, "-") == 0 ? stdout : cli_create_beside("export", output, &tmp);
	if (!out) {
		rc = 1;
		goto done;
	}
	eo.format = format;
	eo.flow = flow;
	eo.max_bytes = (uint64_t)(max_mb * 1e6);
	rc = an_export(s, out, &eo, &err);
	if (rc == AN_EXPORT_TOO_BIG)
		rc = cli_error("export: %s would be over %g MB, more than a trace viewer opens: "
			       "not written; export one flow (--flow ID; 'sptrace flows DIR' lists "
			       "them), or give --max-size MB (0: no limit) to write it all", output,
			       max_mb);
	else if (rc < 0)
		rc = cli_error("export: %s to %s: %s", dir, output, err.msg);
	if (out == stdout && !rc && (fflush(out) != 0 || ferror(out)))
		rc = cli_error("export: cannot write to standard output: %s", strerror(errno));
	else if (out != stdout)
		rc = cli_finish_beside("export", out, tmp, output, !rc) || rc;
done:
	an_session_close(s);
	return rc;
}
