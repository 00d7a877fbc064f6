/*
 * cmd_flows.c — `sptrace flows`: a trace's (or a collected session's)
 * records separated into flows, one per request or job (analysis.h,
 * an_flows_build), listed as a table or as JSON.
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"
#include "trace_format.h"

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
	"With --flow ID, the flow's records instead, across its processes in time\n"
	"order (CLOCK_REALTIME of each host): when, where, and each call, return,\n"
	"event and message, indented by the call depth of its thread.\n"
	"\n"
	"options:\n"
	"  --flow ID   show flow ID's records (an id of the table: f1, f2, ...)\n"
	"  --start FUNC\n"
	"              each outermost call of FUNC (as replay names it) starts a\n"
	"              flow of its own, event \"func\", ending at its return: jobs\n"
	"              a worker takes in a loop, without messages (repeatable)\n"
	"  --join DIRECTIVE\n"
	"              a join directive beside those the trace was made with (its\n"
	"              meta's, from 'sptrace run --join'): FUNC:scope makes each\n"
	"              outermost call of FUNC a scope, whose work joins the flow of\n"
	"              the value taken inside it; FUNC:entry:argN and FUNC:exit:ret\n"
	"              act through the values the agent recorded (repeatable)\n"
	"  --json      one JSON object instead of the table:\n"
	"              {\"flows\":[{\"id\":S,\"start\":{\"host\":S,\"pid\":N,\"tid\":N,\n"
	"              \"event\":S},\"processes\":[{\"host\":S,\"pid\":N}],\n"
	"              \"duration_ns\":N,\"events\":N}]}\n"
	"  --repo DIR  code-analysis repository, for --flow's function names\n"
	"              (default: $SPTRACE_REPO, else /var/lib/sptrace/repo as root,\n"
	"              ~/.cache/sptrace/repo)\n"
	"  -h, --help  this text\n";

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
		cli_json_str(f->id);
		printf(",\"start\":{\"host\":");
		cli_json_str(f->host);
		printf(",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32 ",\"event\":", f->pid, f->tid);
		cli_json_str(f->event);
		printf("},\"processes\":[");
		for (size_t p = 0; p < f->nprocs; p++) {
			printf("%s{\"host\":", p ? "," : "");
			cli_json_str(f->procs[p].host);
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
	for (size_t i = 0, said = 0; i < an_flows_count(fl); i++) {
		const an_flow *f = an_flows_get(fl, i);

		if (f->starts > 1 && said++ < 20)
			printf("# property: flow %s holds %" PRIu32 " requests' starts (a receive or a "
			       "child joined them): separate them with --start, or a directive\n",
			       f->id, f->starts);
	}
	if (an_flows_nuntaken(fl))
		printf("# property: %zu join value%s given and never taken (join directives: "
		       "a work item no thread took, or a directive on the wrong function)\n",
		       an_flows_nuntaken(fl), an_flows_nuntaken(fl) == 1 ? "" : "s");
	if (an_flows_ntakes(fl))
		printf("# joins: %zu value%s taken on another thread than the one that gave %s: "
		       "the taker's work joined the giver's flow\n", an_flows_ntakes(fl),
		       an_flows_ntakes(fl) == 1 ? "" : "s", an_flows_ntakes(fl) == 1 ? "it" : "them");
	if (an_flows_nbackwards(fl))
		printf("# property: %zu receive%s before the send%s they matched, even with the "
		       "clocks aligned (clocks drifting apart, or bytes matched to the wrong send)\n",
		       an_flows_nbackwards(fl), an_flows_nbackwards(fl) == 1 ? " comes" : "s come",
		       an_flows_nbackwards(fl) == 1 ? "" : "s");
	for (size_t i = 0; i < an_flows_nclocks(fl); i++) {
		const an_clock *c = an_flows_clock(fl, i);

		printf("# clock of host %s: %+.6f s to host %s's, from %zu message%s (%s)\n", c->host,
		       (double)c->offset_ns / 1e9, c->to, c->messages, c->messages == 1 ? "" : "s",
		       c->both_ways ? "both ways: the middle of the bounds"
				    : "one way: as little as a receive after its send needs");
	}
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

/* The part of flow f that holds a record of image/tid at ns, or NULL. */
static const an_flow_part *part_of(const an_flow *f, size_t image, uint32_t tid, int64_t ns)
{
	for (size_t i = 0; i < f->nparts; i++)
		if (f->parts[i].image == image && f->parts[i].tid == tid &&
		    f->parts[i].start_ns <= ns && ns <= f->parts[i].end_ns)
			return &f->parts[i];
	return NULL;
}

/* The open calls of each thread of the flow shown so far: whether each was
 * entered by a tail jump (it has no EXIT of its own: its caller's closes
 * it too, analysis.h an_thread_calls). */
#define MAX_SHOWN_DEPTH 256

typedef struct depth {
	size_t image;
	uint32_t tid;
	int n;
	unsigned char tail[MAX_SHOWN_DEPTH];
} depth;

static depth *depth_of(depth **d, size_t *n, size_t image, uint32_t tid)
{
	depth *nd;

	for (size_t i = 0; i < *n; i++)
		if ((*d)[i].image == image && (*d)[i].tid == tid)
			return &(*d)[i];
	if (!(nd = realloc(*d, (*n + 1) * sizeof *nd)))
		return NULL;
	*d = nd;
	memset(&nd[*n], 0, sizeof nd[*n]);
	nd[*n].image = image;
	nd[*n].tid = tid;
	return &nd[(*n)++];
}

/* Flow `id`'s records, merged in time order. */
/* Where the flow's time went, across its threads (an_flows_critical_path). */
static void print_critical(an_session *s, const an_flows *fl, const an_flow *f)
{
	an_crit_step *st;
	size_t n, idx = 0;
	sp_err err;
	int64_t on = 0;

	while (an_flows_get(fl, idx) != f)
		idx++;
	if (an_flows_critical_path(fl, idx, &st, &n, &err) < 0) {
		fprintf(stderr, "sptrace: flows: the critical path of %s: %s\n", f->id, err.msg);
		return;
	}
	for (size_t k = 0; k < n; k++)
		on += st[k].to_ns - st[k].from_ns;
	printf("# critical path of %s, from its start to its start thread's end: %zu step%s, "
	       "%.3f ms on them (the rest: messages in flight)\n", f->id, n, n == 1 ? "" : "s",
	       (double)on / 1e6);
	printf("#   FROM (ms)      TO (ms)    DURATION  HOST:PID/TID\n");
	for (size_t k = 0; k < n; k++) {
		const an_image *im = an_session_image(s, st[k].image);
		char dur[24];

		printf("# %11.3f  %11.3f  %s  %s:%" PRIu32 "/%" PRIu32 "%s\n",
		       (double)(st[k].from_ns - f->start_ns) / 1e6,
		       (double)(st[k].to_ns - f->start_ns) / 1e6,
		       an_fmt_duration((uint64_t)(st[k].to_ns - st[k].from_ns), dur), im->host,
		       st[k].pid, st[k].tid, st[k].via ? "  -> a message" : "");
	}
	free(st);
}

static int show_flow(an_session *s, const an_flows *fl, const char *id)
{
	const an_flow *f = NULL;
	an_merge *m;
	an_event ev;
	depth *d = NULL;
	size_t nd = 0;
	sp_err err;

	if (!(f = an_flows_find(fl, id, NULL)))
		return cli_error("flows: --flow %s: no such flow (this trace has %zu: f1..f%zu)", id,
				 an_flows_count(fl), an_flows_count(fl)), 2;
	if (an_merge_open(s, &m, &err) < 0)
		return cli_error("flows: %s", err.msg);
	printf("# flow %s: %s at %s:%" PRIu32 "/%" PRIu32 ", %" PRIu64 " events in %zu "
	       "process%s\n", f->id, f->event, f->host, f->pid, f->tid, f->events, f->nprocs,
	       f->nprocs == 1 ? "" : "es");
	for (size_t k = 0; k < f->nparts; k++) {
		const an_flow_part *pt = &f->parts[k];

		printf("# part: %s:%" PRIu32 "/%" PRIu32 " from %.3f to %.3f ms, %" PRIu64
		       " events\n", an_session_image(s, pt->image)->host, pt->pid, pt->tid,
		       (double)(pt->start_ns - f->start_ns) / 1e6,
		       (double)(pt->end_ns - f->start_ns) / 1e6, pt->events);
	}
	printf("# TIME (ms)   HOST:PID/TID            RECORD\n");
	while (an_merge_next(m, &ev)) {
		an_trace *t = an_session_trace(s, ev.image);
		const an_image *im = an_session_image(s, ev.image);
		char where[300], text[600];
		depth *dp;
		int indent;

		if (!part_of(f, ev.image, ev.thread->tid, ev.ns) ||
		    (ev.rec.kind == TRACE_EVENT && trace_event_is_agent(ev.rec.id)) ||
		    !(dp = depth_of(&d, &nd, ev.image, ev.thread->tid)))
			continue;
		snprintf(where, sizeof where, "%s:%" PRIu32 "/%" PRIu32, im->host,
			 ev.thread->pid ? ev.thread->pid : im->pid, ev.thread->tid);
		if (ev.rec.kind == TRACE_ENTRY) {
			snprintf(text, sizeof text, "%s() {%s",
				 an_func_get(t, an_site(t, ev.rec.id)->callee)->name,
				 an_site_is_tail(an_site(t, ev.rec.id)) ? "  /* tail jump */" : "");
		} else if (ev.rec.kind == TRACE_EXIT) {
			/* the calls entered by tail jumps close with their caller */
			while (dp->n > 0 && dp->n <= MAX_SHOWN_DEPTH && dp->tail[dp->n - 1])
				dp->n--;
			if (dp->n > 0)
				dp->n--;
			snprintf(text, sizeof text, "} /* %s */",
				 an_func_get(t, an_site(t, ev.rec.id)->callee)->name);
		} else if (ev.rec.id == TRACE_EV_VALUE) {
			if (ev.rec.value_arg)
				snprintf(text, sizeof text, "/* value: arg%u=%#" PRIx64 " */",
					 ev.rec.value_arg, (uint64_t)ev.rec.value);
			else
				snprintf(text, sizeof text, "/* value: returns %#" PRIx64 " */",
					 (uint64_t)ev.rec.value);
		} else if (trace_event_is_msg(ev.rec.id)) {
			char msg[512];

			snprintf(text, sizeof text, "/* %s */", an_msg_text(t, &ev.rec.msg, msg,
									     sizeof msg));
		} else {
			char name[32];

			snprintf(text, sizeof text, "/* %s */", an_event_name(ev.rec.id, name,
									    sizeof name));
		}
		indent = dp->n < 40 ? dp->n : 40;
		printf("%12.3f  %-22s  %*s%s\n", (double)(ev.ns - f->start_ns) / 1e6, where,
		       2 * indent, "", text);
		if (ev.rec.kind == TRACE_ENTRY) {
			if (dp->n < MAX_SHOWN_DEPTH)
				dp->tail[dp->n] = (unsigned char)an_site_is_tail(an_site(t, ev.rec.id));
			dp->n++;
		}
	}
	free(d);
	an_merge_close(m);
	print_critical(s, fl, f);
	return 0;
}

int cli_has_scopes(const char *dir)
{
	an_meta *m;
	sp_err err;
	int any = 0;

	if (an_meta_read(dir, &m, &err) < 0)
		return 1;       /* a collected tree: its processes' metas may */
	for (size_t l = 0; l < an_meta_nlines(m); l++)
		if (strcmp(an_meta_key(m, l), TRACE_META_JOIN) == 0 &&
		    strstr(an_meta_val(m, l), ":scope"))
			any = 1;
	an_meta_free(m);
	return any;
}

int cli_add_start(const char *cmd, an_flows_opts *o, const char **room, const char *name)
{
	if (o->nstart == CLI_MAX_START)
		return cli_error("%s: more than %d --start functions", cmd, CLI_MAX_START), 2;
	room[o->nstart++] = name;
	o->start = room;
	return 0;
}

int cmd_flows(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' }, { "flow", required_argument, 0, 'f' },
		{ "repo", required_argument, 0, 'r' }, { "start", required_argument, 0, 's' },
		{ "join", required_argument, 0, 'J' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	an_open_opts oo = { .no_modules = 1 };    /* the table needs no function names */
	const char *flow = NULL, *starts[CLI_MAX_START], *joins[CLI_JOIN_MAX];
	an_flows_opts fo = { starts, 0, joins, 0 };
	an_session *s;
	an_flows *fl;
	sp_err err;
	int c, json = 0, rc = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'f': flow = optarg; break;
		case 'r': oo.repo = optarg; break;
		case 's':
			if (cli_add_start("flows", &fo, starts, optarg))
				return 2;
			break;
		case 'J':
			if (cli_add_join("flows", joins, &fo.njoin, optarg))
				return 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("flows: option '%s' needs a value; see 'sptrace flows "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("flows: unknown option '%s'; see 'sptrace flows --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("flows: %s; see 'sptrace flows --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	if (flow && json)
		return cli_error("flows: --flow and --json: give one; see 'sptrace flows "
				 "--help'"), 2;
	/* --start and scopes name functions */
	oo.no_modules = !flow && !fo.nstart && !fo.njoin && !cli_has_scopes(argv[optind]);
	if (an_session_open(argv[optind], &oo, &s, &err) < 0)
		return cli_error("flows: %s", err.msg);
	{
		an_lost l;

		an_session_lost(s, &l);
		cli_say_lost("flows", &l, json ? NULL : stdout);
	}
	if (an_flows_build_opts(s, &fo, &fl, &err) < 0) {
		an_session_close(s);
		return cli_error("flows: %s", err.msg);
	}
	for (size_t i = 0; i < an_session_nwarnings(s); i++)
		fprintf(stderr, "sptrace: flows: warning: %s\n", an_session_warning(s, i));
	if (flow)
		rc = show_flow(s, fl, flow);
	else if (json)
		print_json(fl);
	else
		print_table(argv[optind], fl);
	an_flows_free(fl);
	an_session_close(s);
	return rc;
}
