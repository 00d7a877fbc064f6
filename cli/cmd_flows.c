/*
 * cmd_flows.c — `sptrace flows`: a trace's (or a collected session's)
 * records separated into flows, one per request or job (analysis.h,
 * an_flows_build), listed as a table or as JSON.
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "analysis.h"

static const char help[] =
	"usage: sptrace flows [OPTIONS] DIR\n"
	"\n"
	"Separate the records of the trace DIR -- with the images it exec'd, or\n"
	"every process of every host of a tree made by 'sptrace collect' -- into\n"
	"flows, one per request or job, and list them in the order they started:\n"
	"\n"
	"    FLOW  START   HOST:PID/TID          DURATION    EVENTS  PROCESSES\n"
	"    f1    accept  web1:4242/4242      1.250 ms        86  web1:4242 db:77\n"
	"\n"
	"A flow starts at an activation (--on start, call, timer, signal), at the\n"
	"accept or receive tracing began at, or at a receive no traced send\n"
	"matches (a new request from outside); it follows its thread, and a\n"
	"receive of bytes a traced process sent joins the sender's flow: TCP by\n"
	"connection and byte range, pipes and UNIX sockets by inode, datagrams by\n"
	"their number.  EVENTS counts its records (entries, exits, events,\n"
	"messages); DURATION runs from its first to its last.\n"
	"\n"
	"options:\n"
	"  --json      one JSON object instead of the table:\n"
	"              {\"flows\":[{\"id\":S,\"start\":{\"host\":S,\"pid\":N,\"tid\":N,\n"
	"              \"event\":S},\"processes\":[{\"host\":S,\"pid\":N}],\n"
	"              \"duration_ns\":N,\"events\":N}]}\n"
	"  -h, --help  this text\n";

static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static uint64_t duration(const an_flow *f)
{
	return f->end_ns > f->start_ns ? (uint64_t)(f->end_ns - f->start_ns) : 0;
}

static void print_json(const an_flows *fl)
{
	printf("{\"flows\":[");
	for (size_t i = 0; i < an_flows_count(fl); i++) {
		const an_flow *f = an_flows_get(fl, i);

		printf("%s{\"id\":", i ? "," : "");
		json_str(f->id);
		printf(",\"start\":{\"host\":");
		json_str(f->host);
		printf(",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32 ",\"event\":", f->pid, f->tid);
		json_str(f->event);
		printf("},\"processes\":[");
		for (size_t p = 0; p < f->nprocs; p++) {
			printf("%s{\"host\":", p ? "," : "");
			json_str(f->procs[p].host);
			printf(",\"pid\":%" PRIu32 "}", f->procs[p].pid);
		}
		printf("],\"duration_ns\":%" PRIu64 ",\"events\":%" PRIu64 "}", duration(f),
		       f->events);
	}
	printf("]}\n");
}

static void print_table(const char *dir, const an_flows *fl)
{
	char where[300], dur[24];

	printf("# %zu flow%s in %s\n", an_flows_count(fl), an_flows_count(fl) == 1 ? "" : "s",
	       dir);
	printf("# FLOW  START   HOST:PID/TID            DURATION      EVENTS  PROCESSES\n");
	for (size_t i = 0; i < an_flows_count(fl); i++) {
		const an_flow *f = an_flows_get(fl, i);

		snprintf(where, sizeof where, "%s:%" PRIu32 "/%" PRIu32, f->host, f->pid, f->tid);
		printf("  %-5s %-7s %-22s %s  %10" PRIu64 " ", f->id, f->event, where,
		       an_fmt_duration(duration(f), dur), f->events);
		for (size_t p = 0; p < f->nprocs; p++)
			printf(" %s:%" PRIu32, f->procs[p].host, f->procs[p].pid);
		putchar('\n');
	}
}

int cmd_flows(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	an_open_opts oo = { .no_modules = 1 };    /* flows need no function names */
	an_session *s;
	an_flows *fl;
	sp_err err;
	int c, json = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'h': fputs(help, stdout); return 0;
		default:
			return cli_error("flows: unknown option '%s'; see 'sptrace flows --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("flows: %s; see 'sptrace flows --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	if (an_session_open(argv[optind], &oo, &s, &err) < 0)
		return cli_error("flows: %s", err.msg);
	if (an_flows_build(s, &fl, &err) < 0) {
		an_session_close(s);
		return cli_error("flows: %s", err.msg);
	}
	for (size_t i = 0; i < an_session_nwarnings(s); i++)
		fprintf(stderr, "sptrace: flows: warning: %s\n", an_session_warning(s, i));
	if (json)
		print_json(fl);
	else
		print_table(argv[optind], fl);
	an_flows_free(fl);
	an_session_close(s);
	return 0;
}
