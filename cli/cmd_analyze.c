/*
 * cmd_analyze.c — `sptrace analyze`: the processes of a trace (or of a
 * collected session) ranked by how differently they behaved, each with the
 * call path most likely the cause (analysis.h, an_anomalies_find; the
 * rules are in analysis/anomaly.c).
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"

static const char help[] =
	"usage: sptrace analyze [OPTIONS] DIR\n"
	"\n"
	"Rank the processes of the trace DIR -- with the images it exec'd and the\n"
	"children it forked, or every process of every host of a tree made by\n"
	"'sptrace collect' -- by how differently each behaved, and name for each\n"
	"the call path most likely the cause, with the evidence:\n"
	"\n"
	"  - a process whose last record is earlier than every other's by more\n"
	"    than 10 ms and a tenth of the trace's span stopped (it crashed, hung\n"
	"    in a loop that calls nothing, or blocked): it ranks first, and its\n"
	"    culprit is the call open at its last record (earliest-last-timestamp);\n"
	"  - the others by a suspect score: the distance between their profiles\n"
	"    (the share of time spent in each call path) to their k-th nearest\n"
	"    neighbour, k = a quarter of the processes (knn-manhattan); the culprit\n"
	"    is the call path whose share differs most from the nearest one's.\n"
	"\n"
	"options:\n"
	"  --normal REF  REF is a trace (or collected tree) of known-normal runs: each\n"
	"                process of DIR is scored by its distance to the nearest\n"
	"                process of REF (nearest-normal), so a normal but rare\n"
	"                behaviour seen in REF is not flagged\n"
	"  --json        one JSON object instead of the table:\n"
	"                {\"anomalies\":[{\"rank\":1,\"kind\":\"process\",\"flow\":null,\n"
	"                \"host\":S,\"pid\":N,\"score\":X,\"method\":S,\"culprit\":{\n"
	"                \"function\":S,\"path\":[S,...]},\"causes\":[{\"rank\":N,\n"
	"                \"path\":[S,...],\"why\":S}]}]}\n"
	"  --top N       the N most suspect processes only (default: all)\n"
	"  --repo DIR    code-analysis repository for the function names (default:\n"
	"                $SPTRACE_REPO, else /var/lib/sptrace/repo as root,\n"
	"                ~/.cache/sptrace/repo)\n"
	"  -h, --help    this text\n";

static void json_path(const char *const *path, size_t n)
{
	putchar('[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			putchar(',');
		cli_json_str(path[i]);
	}
	putchar(']');
}

static void print_json(const an_anomalies *a, size_t top)
{
	printf("{\"anomalies\":[");
	for (size_t i = 0; i < an_anomalies_count(a) && i < top; i++) {
		const an_suspect *s = an_anomalies_get(a, i);

		printf("%s{\"rank\":%zu,\"kind\":\"process\",\"flow\":null,\"host\":", i ? "," : "",
		       i + 1);
		cli_json_str(s->host);
		printf(",\"pid\":%" PRIu32 ",\"score\":%.6g,\"method\":", s->pid, s->score);
		cli_json_str(s->method);
		printf(",\"culprit\":");
		if (s->npath) {
			printf("{\"function\":");
			cli_json_str(s->path[s->npath - 1]);
			printf(",\"path\":");
			json_path(s->path, s->npath);
			putchar('}');
		} else {
			printf("null");
		}
		printf(",\"causes\":[");
		for (size_t k = 0; k < s->ncauses; k++) {
			printf("%s{\"rank\":%zu,\"path\":", k ? "," : "", k + 1);
			json_path(s->causes[k].path, s->causes[k].npath);
			printf(",\"why\":");
			cli_json_str(s->causes[k].why);
			putchar('}');
		}
		printf("]}");
	}
	printf("]}\n");
}

static void print_path(const char *const *path, size_t n)
{
	for (size_t i = 0; i < n; i++)
		printf("%s%s", i ? " > " : "", path[i]);
}

static void print_table(const char *dir, const an_anomalies *a, size_t top)
{
	printf("# %zu process%s of %s, most suspect first\n", an_anomalies_count(a),
	       an_anomalies_count(a) == 1 ? "" : "es", dir);
	for (size_t i = 0; i < an_anomalies_count(a) && i < top; i++) {
		const an_suspect *s = an_anomalies_get(a, i);

		printf("%2zu. %s%spid %" PRIu32 "  score %.4g (%s)\n", i + 1, s->host,
		       s->host[0] ? ":" : "", s->pid, s->score, s->method);
		if (s->npath) {
			printf("    culprit: %s  (", s->path[s->npath - 1]);
			print_path(s->path, s->npath);
			printf(")\n");
		}
		for (size_t k = 0; k < s->ncauses; k++) {
			printf("    %zu) ", k + 1);
			print_path(s->causes[k].path, s->causes[k].npath);
			printf(": %s\n", s->causes[k].why);
		}
	}
}

int cmd_analyze(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },        { "normal", required_argument, 0, 'n' },
		{ "top", required_argument, 0, 't' },   { "repo", required_argument, 0, 'r' },
		{ "help", no_argument, 0, 'h' },        { 0, 0, 0, 0 },
	};
	an_open_opts oo = { 0 };
	const char *normal = NULL;
	an_session *s = NULL, *ref = NULL;
	an_anomalies *a;
	size_t top = (size_t)-1;
	sp_err err;
	char *end;
	int c, json = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'n': normal = optarg; break;
		case 'r': oo.repo = optarg; break;
		case 't':
			top = strtoul(optarg, &end, 10);
			if (*end || !*optarg || top == 0)
				return cli_error("analyze: --top '%s': give a number of processes, 1 "
						 "or more", optarg), 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("analyze: option '%s' needs a value; see 'sptrace analyze "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("analyze: unknown option '%s'; see 'sptrace analyze "
					 "--help'", argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("analyze: %s; see 'sptrace analyze --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	if (an_session_open(argv[optind], &oo, &s, &err) < 0)
		return cli_error("analyze: %s", err.msg);
	{
		an_lost l;

		an_session_lost(s, &l);
		cli_say_lost("analyze", &l, json ? NULL : stdout);
	}
	if (normal && an_session_open(normal, &oo, &ref, &err) < 0) {
		an_session_close(s);
		return cli_error("analyze: --normal: %s", err.msg);
	}
	for (size_t i = 0; i < an_session_nwarnings(s); i++)
		fprintf(stderr, "sptrace: analyze: warning: %s\n", an_session_warning(s, i));
	if (an_anomalies_find(s, ref, &a, &err) < 0) {
		an_session_close(s);
		an_session_close(ref);
		return cli_error("analyze: %s", err.msg);
	}
	if (json)
		print_json(a, top);
	else
		print_table(argv[optind], a, top);
	an_anomalies_free(a);
	an_session_close(s);
	an_session_close(ref);
	return 0;
}
