/*
 * cmd_analyze.c — `sptrace analyze`: the flows, processes or hosts of a
 * trace (or of a collected session) ranked by how differently they behaved,
 * each with the call path most likely the cause (analysis.h,
 * an_anomalies_find; the rules are in analysis/anomaly.c).
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"

#define ANALYZE_DIFF_CHANGE 20   /* percent: a duration shown in the timed diff */

static const char help[] =
	"usage: sptrace analyze [OPTIONS] DIR\n"
	"\n"
	"Rank the requests (flows), processes or hosts of the trace DIR -- with the\n"
	"images it exec'd and the children it forked, or every process of every\n"
	"host of a tree made by 'sptrace collect' -- by how differently each\n"
	"behaved, and name for each the call path most likely the cause, with the\n"
	"evidence:\n"
	"\n"
	"  - a process whose last record is earlier than the others' by more than\n"
	"    10 ms and a tenth of the trace's span stopped (it crashed, hung in a\n"
	"    loop that calls nothing, or blocked): it ranks first, and its culprit\n"
	"    is the call open at its last record (earliest-last-timestamp);\n"
	"  - the others by a suspect score: the distance between their profiles\n"
	"    (the share of time spent in each call path, which call paths were\n"
	"    taken, and the messages and bytes sent and received through each) to\n"
	"    their k-th nearest neighbour of the same role (the same program and\n"
	"    outermost function), k = a quarter of them (knn-manhattan); the\n"
	"    culprit is the call path whose share differs most from the nearest\n"
	"    one's, or a path taken unlike the others when no share differs by\n"
	"    10%, or a path whose messages differ from the nearest one's;\n"
	"  - for the most suspect, when: the interval of the unit's time that held\n"
	"    its culprit (the stretch where its time in the path ran beyond the\n"
	"    nearest one's share), its last cause (kind interval).\n"
	"\n"
	"When the most suspect is a flow, the table ends with its timed diff: its\n"
	"calls aligned call by call with those of the flow it was compared with\n"
	"(as 'sptrace replay --diff' aligns two threads), with both durations.\n"
	"\n"
	"options:\n"
	"  --by flow|process|host\n"
	"                what to compare (default: the flows when there are 3 or more,\n"
	"                as 'sptrace flows' lists them, else the processes)\n"
	"  --profile composite|time|coverage|communication\n"
	"                what the distance compares: the share of time in each call\n"
	"                path, which call paths were taken, the messages sent (their\n"
	"                number) and the bytes sent and received through each call\n"
	"                path, or all three (default)\n"
	"  --sites       call paths name the call site of each call: callee@caller+0xOFF\n"
	"                (two calls of one function from one caller are two paths; the\n"
	"                culprit's \"function\" stays the callee's name)\n"
	"  --start FUNC  each call of FUNC (a job, a request handler; as replay names\n"
	"                it) is a flow of its own, compared with the other calls of\n"
	"                FUNC by the call paths under it (repeatable)\n"
	"  --join DIRECTIVE\n"
	"                a join directive beside those of the trace's meta, as\n"
	"                'sptrace flows --join' (repeatable)\n"
	"  --normal REF  REF is a trace (or collected tree) of known-normal runs: each\n"
	"                unit of DIR is scored by its distance to the nearest unit of\n"
	"                REF (nearest-normal) and flagged when that is farther than\n"
	"                REF's own units are from each other, so a normal but rare\n"
	"                behaviour seen in REF is not flagged\n"
	"  --json        one JSON object instead of the table:\n"
	"                {\"anomalies\":[{\"rank\":1,\"kind\":\"flow\"|\"process\"|\"host\",\n"
	"                \"flow\":S|null,\"host\":S,\"pid\":N,\"score\":X,\"method\":S,\n"
	"                \"flagged\":true|false|null,\"threshold\":X|null,\n"
	"                \"culprit\":{\"function\":S,\"path\":[S,...]},\n"
	"                \"causes\":[{\"rank\":N,\"kind\":\"time\"|\"coverage\"|\n"
	"                \"communication\"|\"interval\",\"path\":[S,...],\"why\":S}]}]};\n"
	"                an interval cause adds \"from_ns\":N,\"to_ns\":N, from the\n"
	"                unit's first record\n"
	"  --top N       the N most suspect only (default: all)\n"
	"  --html FILE   also write the analysis as one self-contained page: the\n"
	"                ranked table, the culprits and causes, a timeline of the\n"
	"                flows by host, process and thread with the messages between\n"
	"                them; click a row, bar or cause to highlight its unit\n"
	"  --repo DIR    code-analysis repository for the function names (default:\n"
	"                $SPTRACE_REPO, else /var/lib/sptrace/repo as root,\n"
	"                ~/.cache/sptrace/repo)\n"
	"  -h, --help    this text\n";

static const char *kind_name(int kind)
{
	return kind == AN_UNITS_FLOW ? "flow" : kind == AN_UNITS_HOST ? "host" : "process";
}

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

/* The culprit's function: with --sites, the callee before its '@'. */
static const char *function_of(const char *name, int sites, char *buf, size_t len)
{
	const char *at = sites ? strrchr(name, '@') : NULL;

	if (!at)
		return name;
	snprintf(buf, len, "%.*s", (int)(at - name), name);
	return buf;
}

static void print_json(const an_anomalies *a, size_t top, int sites)
{
	char fn[512];

	printf("{\"anomalies\":[");
	for (size_t i = 0; i < an_anomalies_count(a) && i < top; i++) {
		const an_suspect *s = an_anomalies_get(a, i);

		printf("%s{\"rank\":%zu,\"kind\":\"%s\",\"flow\":", i ? "," : "", i + 1,
		       kind_name(s->kind));
		if (s->flow)
			cli_json_str(s->flow);
		else
			printf("null");
		printf(",\"host\":");
		cli_json_str(s->host);
		printf(",\"pid\":%" PRIu32 ",\"score\":%.6g,\"method\":", s->pid, s->score);
		cli_json_str(s->method);
		printf(",\"flagged\":%s,\"threshold\":", s->flagged < 0 ? "null" :
		       s->flagged ? "true" : "false");
		if (strcmp(s->method, "nearest-normal") == 0 && s->threshold >= 0)
			printf("%.6g", s->threshold);
		else
			printf("null");
		printf(",\"culprit\":");
		if (s->npath) {
			printf("{\"function\":");
			cli_json_str(function_of(s->path[s->npath - 1], sites, fn, sizeof fn));
			printf(",\"path\":");
			json_path(s->path, s->npath);
			putchar('}');
		} else {
			printf("null");
		}
		printf(",\"causes\":[");
		for (size_t k = 0; k < s->ncauses; k++) {
			printf("%s{\"rank\":%zu,\"kind\":\"%s\",\"path\":", k ? "," : "", k + 1,
			       s->causes[k].kind);
			json_path(s->causes[k].path, s->causes[k].npath);
			printf(",\"why\":");
			cli_json_str(s->causes[k].why);
			if (strcmp(s->causes[k].kind, "interval") == 0)
				printf(",\"from_ns\":%" PRId64 ",\"to_ns\":%" PRId64,
				       s->interval_from_ns - s->first_ns,
				       s->interval_to_ns - s->first_ns);
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
	int kind = an_anomalies_kind(a);
	size_t n = an_anomalies_count(a);

	printf("# %zu %s%s of %s, most suspect first\n", n, kind_name(kind),
	       n == 1 ? "" : kind == AN_UNITS_PROCESS ? "es" : "s", dir);
	for (size_t i = 0; i < n && i < top; i++) {
		const an_suspect *s = an_anomalies_get(a, i);

		printf("%2zu. ", i + 1);
		if (s->flow)
			printf("flow %s (%s%spid %" PRIu32 ")", s->flow, s->host, s->host[0] ? ":" : "",
			       s->pid);
		else if (kind == AN_UNITS_HOST)
			printf("host %s", s->host[0] ? s->host : "(this host)");
		else
			printf("%s%spid %" PRIu32, s->host, s->host[0] ? ":" : "", s->pid);
		printf("  score %.4g (%s", s->score, s->method);
		if (s->flagged >= 0 && !s->failstop)
			printf(s->threshold >= 0 ? ", %s: threshold %.4g" : ", %s", s->flagged ?
			       "flagged" : "not flagged", s->threshold);
		printf(")\n");
		if (s->npath) {
			printf("    culprit: %s  (", s->path[s->npath - 1]);
			print_path(s->path, s->npath);
			printf(")\n");
		}
		for (size_t k = 0; k < s->ncauses; k++) {
			printf("    %zu) [%s] ", k + 1, s->causes[k].kind);
			print_path(s->causes[k].path, s->causes[k].npath);
			printf(": %s\n", s->causes[k].why);
		}
	}
}

/*
 * The timed diff: the most suspect flow's calls against those of the flow
 * it was compared with (its nearest neighbour, or the nearest flow of
 * --normal REF), aligned call by call (replay_diff.c), with both durations.
 */
int cli_analyze_diff(FILE *out, an_session *s, an_session *ref, const an_anomalies *a,
		     const an_flows_opts *fo)
{
	const an_suspect *top = an_anomalies_count(a) ? an_anomalies_get(a, 0) : NULL;
	int normal = top && strcmp(top->method, "nearest-normal") == 0;
	an_flows *fl = NULL, *fl2 = NULL;
	sp_err err;
	int rc;

	if (!top || !top->flow || !top->nearest || (normal && !ref))
		return 0;
	if (an_flows_build_opts(s, fo, &fl, &err) < 0 ||
	    (normal && an_flows_build_opts(ref, fo, &fl2, &err) < 0)) {
		an_flows_free(fl);
		return cli_error("analyze: %s", err.msg);
	}
	fprintf(out, "# timed diff of flow %s, the most suspect, against flow %s%s, the one it was "
		"compared with: '+' calls of %s only, '-' of %s only; calls in both shown when "
		"their duration changed by %d%% and 1 us or more, with the calls around them\n",
		top->flow, top->nearest, normal ? " of the reference" : "", top->flow,
		top->nearest, ANALYZE_DIFF_CHANGE);
	fprintf(out, "#     %10.10s  %10.10s  CHANGE | FUNCTION\n", top->nearest, top->flow);
	rc = cli_flow_diff(out, s, fl, top->flow, normal ? ref : s, normal ? fl2 : fl,
			   top->nearest, ANALYZE_DIFF_CHANGE);
	an_flows_free(fl);
	an_flows_free(fl2);
	return rc;
}

int cmd_analyze(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },        { "normal", required_argument, 0, 'n' },
		{ "top", required_argument, 0, 't' },   { "repo", required_argument, 0, 'r' },
		{ "by", required_argument, 0, 'b' },    { "profile", required_argument, 0, 'p' },
		{ "html", required_argument, 0, 'H' },  { "start", required_argument, 0, 's' },
		{ "join", required_argument, 0, 'J' },  { "help", no_argument, 0, 'h' },
		{ "sites", no_argument, 0, 'S' },
		{ 0, 0, 0, 0 },
	};
	an_open_opts oo = { 0 };
	const char *normal = NULL, *html = NULL;
	an_session *s = NULL, *ref = NULL;
	an_anomalies *a;
	size_t top = (size_t)-1;
	sp_err err;
	char *end;
	const char *starts[CLI_MAX_START], *joins[CLI_JOIN_MAX];
	an_anomaly_opts ao = { .units = AN_UNITS_AUTO, .profile = AN_PROFILE_COMPOSITE,
			       .flows = { NULL, 0, joins, 0 } };
	int c, json = 0, rc = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'H': html = optarg; break;
		case 'S': ao.sites = 1; break;
		case 's':
			if (cli_add_start("analyze", &ao.flows, starts, optarg))
				return 2;
			break;
		case 'J':
			if (cli_add_join("analyze", joins, &ao.flows.njoin, optarg))
				return 2;
			break;
		case 'b':
			if (strcmp(optarg, "flow") == 0)
				ao.units = AN_UNITS_FLOW;
			else if (strcmp(optarg, "process") == 0)
				ao.units = AN_UNITS_PROCESS;
			else if (strcmp(optarg, "host") == 0)
				ao.units = AN_UNITS_HOST;
			else
				return cli_error("analyze: --by '%s': give flow, process or host",
						 optarg), 2;
			break;
		case 'p':
			if (strcmp(optarg, "composite") == 0)
				ao.profile = AN_PROFILE_COMPOSITE;
			else if (strcmp(optarg, "time") == 0)
				ao.profile = AN_PROFILE_TIME;
			else if (strcmp(optarg, "coverage") == 0)
				ao.profile = AN_PROFILE_COVERAGE;
			else if (strcmp(optarg, "communication") == 0)
				ao.profile = AN_PROFILE_COMMUNICATION;
			else
				return cli_error("analyze: --profile '%s': give composite, time, "
						 "coverage or communication", optarg), 2;
			break;
		case 'n': normal = optarg; break;
		case 'r': oo.repo = optarg; break;
		case 't':
			top = strtoul(optarg, &end, 10);
			if (*end || !*optarg || top == 0)
				return cli_error("analyze: --top '%s': give a number, 1 or more", optarg), 2;
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
	if (an_anomalies_find(s, ref, &ao, &a, &err) < 0) {
		an_session_close(s);
		an_session_close(ref);
		return cli_error("analyze: %s", err.msg);
	}
	if (json) {
		print_json(a, top, ao.sites);
	} else {
		print_table(argv[optind], a, top);
		if (cli_analyze_diff(stdout, s, ref, a, &ao.flows) < 0)
			rc = 1;
	}
	if (html && cli_analyze_html(html, argv[optind], s, ref, a, &ao.flows, top) == 0)
		fprintf(stderr, "sptrace: analyze: the report is in %s\n", html);
	else if (html)
		rc = 1;
	an_anomalies_free(a);
	an_session_close(s);
	an_session_close(ref);
	return rc;
}
