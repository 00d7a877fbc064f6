/*
 * cmd_replay.c — `sptrace replay`: each thread's calls as an indented tree,
 * in uftrace's replay layout (duration, thread id, function).
 */
#include "cli.h"

#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "trace_format.h"
#include "analysis.h"

/* Images of one process replayed one after the other (exec after exec), as
 * many as sptrace run follows (cmd_run.c). */
#define MAX_IMAGES 64

static const char help[] =
	"usage: sptrace replay [OPTIONS] DIR\n"
	"\n"
	"Print the calls each traced thread made, as a tree, thread after thread:\n"
	"\n"
	"  # DURATION     TID     FUNCTION\n"
	"              [ 1234] | main() {\n"
	"     0.512 us [ 1234] |   b();\n"
	"     1.234 us [ 1234] | } /* main */\n"
	"\n"
	"A call without nested calls prints as 'f();' with its duration; others\n"
	"open with 'f() {' and close with '} /* f */' and the duration.  Marks:\n"
	"  (no exit: the trace ended)     still running when the records end; the\n"
	"                                 duration runs to the thread's last record\n"
	"  (no exit: unwound by longjmp or exception)\n"
	"                                 an outer call returned first; the duration\n"
	"                                 runs to that return\n"
	"  (no exit: tracing stopped)     sptrace stop came while it ran; the\n"
	"                                 duration runs to the stop\n"
	"  (exit without a recorded entry)  the call began before the records do\n"
	"  /* activate */, /* signal */ ...  events of the thread\n"
	"  /* budget: f() from g counted from here, not timed */\n"
	"                                 sptrace run --budget: calls through that\n"
	"                                 site are counted, not timed (shown only\n"
	"                                 sampled, 1 in 256), until /* budget: f()\n"
	"                                 from g timed again */\n"
	"  /* counted: f() x N (from g) */  N calls through such a site this thread\n"
	"                                 made since its last such line\n"
	"  /* N records lost ... */       the ring was full and overwrote its oldest\n"
	"                                 (or at a thread's end: its file could not\n"
	"                                 grow); the first line of the output says\n"
	"                                 how many records the whole trace lost\n"
	"A function reached by a tail jump returns with its caller: its duration\n"
	"runs to the caller's return.\n"
	"\n"
	"options:\n"
	"  --tid TID[,TID...]  only these threads\n"
	"  --depth N           only calls nested less than N deep (N >= 1); the\n"
	"                      deepest shown print as 'f();' with their whole time\n"
	"  --since TIME        only calls running at or after TIME\n"
	"  --until TIME        only calls running at or before TIME\n"
	"                      TIME is seconds since tracing began (the first ring\n"
	"                      was made), with an optional unit: 1.5, 1.5s, 200ms,\n"
	"                      30us, 100ns; or @SECONDS, an absolute CLOCK_REALTIME\n"
	"                      time (seconds since the epoch, as 'date +%s.%N')\n"
	"  --srcline           add the callee's file:line to each call\n"
	"  --diff DIR2         compare with the trace DIR2 (another run): each\n"
	"                      thread's calls aligned with its partner's (threads in\n"
	"                      tid order); shows the calls of one run only ('-' DIR,\n"
	"                      '+' DIR2) and those whose duration changed, with both\n"
	"                      durations and the calls around them\n"
	"  --min-change PCT    with --diff: the change a duration must show (default\n"
	"                      20, and 1 us at least)\n"
	"  --demangle TYPE     how C++ names are shown (as uftrace's --demangle):\n"
	"                      simple  the name only: ns::Box::get (the default)\n"
	"                      full    all of it, parameters too (so no '()' is\n"
	"                              added): ns::Box<int>::get(int) const\n"
	"                      no      the symbol: _ZNK2ns3BoxIiE3getEi\n"
	"  --repo DIR          code-analysis repository (default: $SPTRACE_REPO, else\n"
	"                      /var/lib/sptrace/repo as root, ~/.cache/sptrace/repo)\n"
	"  -h, --help          this text\n"
	"\n"
	"Functions are named from the code analysis of each traced module: the\n"
	"repository's entry for its build-id, else the analysis of the module's\n"
	"file (stored in the repository), if it is still the traced one.\n";

typedef struct time_bound {
	int set, absolute;
	int64_t ns;              /* since tracing began, or CLOCK_REALTIME */
} time_bound;

typedef struct replay_opts {
	const char *tids;
	uint32_t max_depth;      /* 0: no limit */
	time_bound since, until;
	int srcline;
	an_open_opts open;
} replay_opts;

/* What one thread's printing needs. */
typedef struct printer {
	an_trace *t;
	const an_thread *th;
	const replay_opts *o;
	const an_call *c;
	size_t n;
	size_t *open;            /* calls whose lines are begun, innermost last */
	unsigned char *opened;   /* per entry of open[]: "f() {" printed */
	size_t nopen;
} printer;

/*
 * TIME: "[@]DIGITS[.DIGITS][unit]", unit s (default), ms, us or ns; '@'
 * means CLOCK_REALTIME seconds (no unit).  Parsed exactly, not as a double,
 * so that nanoseconds of an epoch time survive.
 */
static int parse_time(const char *s, time_bound *b)
{
	static const struct { const char *name; int64_t ns; } units[] = {
		{ "", 1000000000 }, { "s", 1000000000 }, { "ms", 1000000 },
		{ "us", 1000 }, { "ns", 1 },
	};
	int64_t whole = 0, frac = 0, scale = 1;
	const char *p = s;

	b->absolute = *p == '@';
	p += b->absolute;
	if (!isdigit((unsigned char)*p))
		return -1;
	for (; isdigit((unsigned char)*p); p++) {
		if (whole > (INT64_MAX - 9) / 10)
			return -1;
		whole = whole * 10 + (*p - '0');
	}
	if (*p == '.')
		for (p++; isdigit((unsigned char)*p); p++)
			if (scale < 1000000000) {
				frac = frac * 10 + (*p - '0');
				scale *= 10;
			}
	for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
		if (strcmp(p, units[i].name) != 0 || (b->absolute && *p))
			continue;
		if (whole > INT64_MAX / units[i].ns - 1)
			return -1;
		b->ns = whole * units[i].ns + (int64_t)((__int128)frac * units[i].ns / scale);
		b->set = 1;
		return 0;
	}
	return -1;
}

/* Where `tsc` falls for the --since/--until bounds. */
static int64_t bound_time(const an_trace *t, const time_bound *b, uint64_t tsc)
{
	if (b->absolute)
		return an_realtime_ns(t, tsc);
	uint64_t start = an_trace_start_tsc(t);
	return tsc >= start ? (int64_t)an_tsc_ns(t, start, tsc) : -(int64_t)an_tsc_ns(t, tsc, start);
}

static int visible(const printer *p, const an_call *c)
{
	const replay_opts *o = p->o;

	if (o->max_depth && c->depth >= o->max_depth)
		return 0;
	if (o->since.set && bound_time(p->t, &o->since, c->t1) < o->since.ns)
		return 0;
	if (o->until.set && bound_time(p->t, &o->until, c->t0) > o->until.ns)
		return 0;
	return 1;
}

static void line(const printer *p, const char *dur, uint32_t depth, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void line(const printer *p, const char *dur, uint32_t depth, const char *fmt, ...)
{
	va_list ap;

	printf("%11s [%5u] | %*s", dur, p->th->tid, (int)(depth > 1000 ? 2000 : depth * 2), "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static const an_func *callee(const printer *p, uint32_t site)
{
	return an_func_get(p->t, an_site(p->t, site)->callee);
}

/* "()" after a name, as uftrace prints it; none after a full signature
 * (--demangle=full), which has its parameters already. */
static const char *parens(const an_func *f)
{
	return f->signature ? "" : "()";
}

/* A join directive's value (trace_format.h, "Values"): hex, or negative. */
static void value_text(int64_t v, char *buf, size_t len)
{
	if (v < 0)
		snprintf(buf, len, "%" PRId64, v);
	else
		snprintf(buf, len, "%#" PRIx64, (uint64_t)v);
}

/* Call i's recorded values (items of its own, one level in: the agent
 * writes arguments right after the entry, the return value right before the
 * exit, so only the first and the last nested items are looked at): its
 * arguments as "(arg1=0x2a)" in args (else parens), its return value as
 * " = 0x2a" in ret (else ""). */
static void call_values(const printer *p, size_t i, char *args, size_t alen, char *ret,
			size_t rlen)
{
	const an_call *c = &p->c[i];
	size_t at = 0;

	snprintf(args, alen, "%s", parens(callee(p, c->id)));
	ret[0] = '\0';
	for (size_t k = i + 1; k < c->last && k < p->n; k++) {
		const an_call *v = &p->c[k];
		char text[32];
		int64_t val;

		if (v->kind != AN_EVENT || v->id != TRACE_EV_VALUE || v->depth != c->depth + 1 ||
		    an_trace_value(p->t, v->end, &val) < 0) {
			if (k + 1 < c->last - 1)
				k = c->last - 2;        /* on to the last nested item */
			continue;
		}
		value_text(val, text, sizeof text);
		if (AN_VALUE_ARG(v) == 0)
			snprintf(ret, rlen, " = %s", text);
		else if (at + 1 < alen)
			at += (size_t)snprintf(args + at, alen - at, "%sarg%u=%s",
					       at ? ", " : "(", AN_VALUE_ARG(v), text);
	}
	if (at && at + 1 < alen)
		snprintf(args + at, alen - at, ")");
}

static void srcline(const printer *p, const an_func *f, char *buf, size_t len)
{
	if (p->o->srcline && f->src[0])
		snprintf(buf, len, " /* %s */", f->src);
	else
		buf[0] = '\0';
}

/* Print "f() {" for the begun calls that have not printed it yet. */
static void open_pending(printer *p)
{
	char src[4300], args[200], ret[40];

	for (size_t i = 0; i < p->nopen; i++) {
		const an_call *c = &p->c[p->open[i]];
		const an_func *f;

		if (p->opened[i])
			continue;
		f = callee(p, c->id);
		srcline(p, f, src, sizeof src);
		call_values(p, p->open[i], args, sizeof args, ret, sizeof ret);
		line(p, "", c->depth, "%s%s {%s%s", f->name, args, src,
		     c->flags & AN_CONTINUED ? " /* continued */" : "");
		p->opened[i] = 1;
	}
}

/* Finish the innermost begun call: its closing line, or its only line. */
static void close_call(printer *p)
{
	const an_call *c = &p->c[p->open[--p->nopen]];
	const an_func *f = callee(p, c->id);
	const char *why = c->end == AN_END_TRACE ? "no exit: the trace ended"
			  : c->end == AN_END_UNWOUND ? "no exit: unwound by longjmp or exception"
			  : c->end == AN_END_STOPPED ? "no exit: tracing stopped"
			  : c->end == AN_END_SWITCHED ? "suspended: the thread switched stacks"
			  : NULL;
	char dur[24], src[4300], args[200], ret[40];

	call_values(p, p->open[p->nopen], args, sizeof args, ret, sizeof ret);
	if (!p->opened[p->nopen] && (c->flags & AN_CONTINUED))
		why = why ? "continued; suspended again" : "continued";

	an_fmt_duration(an_tsc_ns(p->t, c->t0, c->t1), dur);
	if (p->opened[p->nopen]) {
		if (why)
			line(p, dur, c->depth, "}%s /* %s (%s) */", ret, f->name, why);
		else
			line(p, dur, c->depth, "}%s /* %s */", ret, f->name);
		return;
	}
	srcline(p, f, src, sizeof src);
	if (why)
		line(p, dur, c->depth, "%s%s%s;%s /* %s */", f->name, args, ret, src, why);
	else
		line(p, dur, c->depth, "%s%s%s;%s", f->name, args, ret, src);
}

/* A budget event (trace_format.h): a site demoted to counting or promoted
 * back, or calls this thread made through a counted site. */
static void budget_line(printer *p, const an_call *c)
{
	const an_budget *b = an_trace_budget(p->t, c->end);
	const an_site_info *s;
	const an_func *f, *g;

	if (!b)
		return;
	s = an_site(p->t, b->site);
	f = an_func_get(p->t, s->callee);
	g = an_func_get(p->t, s->caller);
	if (!f)
		return;
	if (c->id == TRACE_EV_COUNT)
		line(p, "", c->depth, "/* counted: %s%s x %" PRIu64 " (from %s) */", f->name,
		     parens(f), b->n, g ? g->name : "?");
	else if (b->mode == TRACE_BUDGET_COUNTED)
		line(p, "", c->depth, "/* budget: %s%s from %s counted from here, not timed */",
		     f->name, parens(f), g ? g->name : "?");
	else
		line(p, "", c->depth, "/* budget: %s%s from %s timed again */", f->name, parens(f),
		     g ? g->name : "?");
}

/*
 * Print the tree.  A call's first line waits until something nested in it is
 * printed: if nothing is (no nested calls, or all filtered out), the call is
 * a leaf and prints as one "f();" line.
 */
static void print_calls(printer *p)
{
	char name[40];

	for (size_t i = 0; i < p->n; i++) {
		const an_call *c = &p->c[i];

		while (p->nopen && p->c[p->open[p->nopen - 1]].last <= i)
			close_call(p);
		if (!visible(p, c)) {
			if (c->kind == AN_CALL)
				i = c->last - 1;
			continue;
		}
		if (c->kind == AN_EVENT && (trace_event_is_agent(c->id) || c->id == TRACE_EV_VALUE))
			continue;        /* the tracer's own time (trace_format.h); values
					    show with their calls (call_values) */
		open_pending(p);
		if (c->kind == AN_CALL) {
			p->opened[p->nopen] = 0;
			p->open[p->nopen++] = i;
		} else if (c->kind == AN_EVENT && c->id == TRACE_EV_CTX_LOAD) {
			if (c->end)
				line(p, "", c->depth, "/* switched to stack %u%s */", c->end,
				     c->flags & AN_NEW_STACK ? " (new)" : "");
			else
				line(p, "", c->depth, "/* switched to the thread's own stack */");
		} else if (c->kind == AN_EVENT && (c->id == TRACE_EV_BUDGET || c->id == TRACE_EV_COUNT)) {
			budget_line(p, c);
		} else if (c->kind == AN_EVENT && trace_event_is_msg(c->id)) {
			const an_msg *m = an_trace_msg(p->t, c->end);
			char text[400];

			if (m)
				line(p, "", c->depth, "/* %s */", an_msg_text(p->t, m, text, sizeof text));
		} else if (c->kind == AN_EVENT) {
			line(p, "", c->depth, "/* %s */", an_event_name(c->id, name, sizeof name));
		} else {
			line(p, "", c->depth, "} /* %s (exit without a recorded entry) */",
			     callee(p, c->id)->name);
		}
	}
	while (p->nopen)
		close_call(p);
}

static int replay_thread(an_trace *t, const an_thread *th, const replay_opts *o)
{
	printer p = { .t = t, .th = th, .o = o };
	an_call *calls;
	an_iter_stats st;
	sp_err err;

	if (an_thread_calls(t, th, &calls, &p.n, &st, &err) < 0)
		return cli_error("replay: %s", err.msg);
	p.c = calls;
	/* The open stack is never deeper than the tree. */
	p.open = malloc((p.n + 1) * sizeof *p.open);
	p.opened = malloc(p.n + 1);
	if (!p.open || !p.opened) {
		free(p.open);
		free(p.opened);
		free(calls);
		return cli_error("replay: %s: out of memory", th->path);
	}
	if (th->lost && (th->lost_why == AN_LOST_RING || th->lost_why == AN_LOST_DRAIN))
		line(&p, "", 0, "/* %" PRIu64 " records lost: %s */", th->lost,
		     th->lost_why == AN_LOST_RING ? "the ring was full and overwrote its oldest"
		     : "the ring came round before they were copied");
	print_calls(&p);
	if (th->lost && th->lost_why == AN_LOST_GROW)
		line(&p, "", 0, "/* %" PRIu64 " records lost from here on: the trace file could "
		     "not grow (%s) */", th->lost, strerror(th->lost_errno));
	else if (th->lost && th->lost_why == AN_LOST_CUT)
		line(&p, "", 0, "/* %" PRIu64 " records lost from here on: the trace file ends "
		     "before them */", th->lost);
	fflush(stdout);
	if (st.nbad_sites)
		fprintf(stderr, "sptrace: replay: warning: %s: %zu records name site ids the "
			"sites file (ids 1-%zu) does not have; shown as '?site <id>'\n",
			th->path, st.nbad_sites, an_nsites(t) ? an_nsites(t) - 1 : 0);
	if (st.nbad_syncs)
		fprintf(stderr, "sptrace: replay: warning: %s: %zu malformed SYNC records ignored; "
			"times after them may be off by multiples of 2^38 TSC ticks\n",
			th->path, st.nbad_syncs);
	if (st.nbad_msgs)
		fprintf(stderr, "sptrace: replay: warning: %s: %zu message events cut short (the "
			"trace ends inside them) not shown\n", th->path, st.nbad_msgs);
	if (st.nbad_counts)
		fprintf(stderr, "sptrace: replay: warning: %s: %zu counts of calls cut short (the "
			"trace ends inside them) not shown\n", th->path, st.nbad_counts);
	free(p.open);
	free(p.opened);
	free(calls);
	return 0;
}

/* After an image's records, from its meta: where the children (fork,
 * vfork) that exec'd have their traces, and how each receive a propagated
 * request started at was found (agent/propagate.c: offset, oob, ipopt,
 * hash, ...). */
static void meta_notes(const char *dir)
{
	char sub[256], prog[PATH_MAX];
	int pid = -1, epid;
	an_meta *m;
	sp_err e;

	if (an_meta_read(dir, &m, &e) < 0)
		return;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		const char *key = an_meta_key(m, l), *v = an_meta_val(m, l);

		if (strcmp(key, TRACE_META_PID) == 0)
			pid = atoi(v);
		else if (strcmp(key, TRACE_META_EXEC) == 0 &&
			 sscanf(v, "%255s %d %4095[^\n]", sub, &epid, prog) == 3 && epid != pid)
			printf("# child pid %d exec'd %s: its trace is in %s/%s\n", epid, prog, dir, sub);
		else if (strcmp(key, TRACE_META_MATCHED) == 0)
			printf("# followed from a traced send: the receive of %s\n", v);
	}
	an_meta_free(m);
}

/* One image's trace.  A --tid list names threads of the first; a later
 * image shows the listed threads it has. */
static int replay_dir(const char *dir, replay_opts *o, int first)
{
	an_trace *t;
	unsigned char *sel;
	sp_err err;
	int rc = 0;

	if (an_trace_open_opts(dir, &o->open, &t, &err) < 0)
		return cli_error("replay: %s", err.msg);
	sel = malloc(an_trace_nthreads(t) + 1);
	if (!sel) {
		an_trace_close(t);
		return cli_error("replay: out of memory");
	}
	memset(sel, 1, an_trace_nthreads(t) + 1);
	if (o->tids && an_select_threads(t, o->tids, sel, &err) < 0) {
		if (first) {
			free(sel);
			an_trace_close(t);
			return cli_error("replay: --tid: %s", err.msg);
		}
		memset(sel, 0, an_trace_nthreads(t) + 1);
	}
	for (size_t i = 0; i < an_trace_nwarnings(t); i++)
		fprintf(stderr, "sptrace: replay: warning: %s\n", an_trace_warning(t, i));
	printf("# DURATION     TID     FUNCTION\n");
	for (size_t i = 0; i < an_trace_nthreads(t) && !rc; i++)
		if (sel[i])
			rc = replay_thread(t, an_trace_thread(t, i), o);
	free(sel);
	an_trace_close(t);
	return rc;
}

/* One process: its images one after the other, each exec'd one traced in
 * a subdirectory (agent/exec.c).  `first`: a --tid list must name threads
 * of its first image. */
static int replay_process(const char *start, replay_opts *o, int first)
{
	int rc = 0;
	char dir[PATH_MAX], next[PATH_MAX];
	struct stat seen[MAX_IMAGES];

	snprintf(dir, sizeof dir, "%s", start);
	for (int k = 0; rc == 0; k++) {
		/* Each directory once, and a bounded chain: a damaged meta (or a
		 * link) that leads back to a directory seen would replay the
		 * trace for ever. */
		if (stat(dir, &seen[k]) < 0)
			memset(&seen[k], 0, sizeof seen[k]);   /* replay_dir says why */
		else
			for (int j = 0; j < k; j++)
				if (seen[j].st_dev == seen[k].st_dev && seen[j].st_ino == seen[k].st_ino)
					return cli_error("replay: %s: shown already: the exec "
							 "lines of meta lead back to it (a damaged "
							 "meta file)", dir);
		rc = replay_dir(dir, o, first && k == 0);
		meta_notes(dir);
		if (rc || !cli_exec_successor(dir, next, sizeof next))
			break;
		if (k + 1 == MAX_IMAGES)
			return cli_error("replay: %s: more than %d exec'd images in one trace: "
					 "the rest (from %s) is not shown; replay it on its own",
					 start, MAX_IMAGES, next);
		printf("# exec: the process went on in a new image, traced in %s\n", next);
		snprintf(dir, sizeof dir, "%s", next);
	}
	return rc;
}

static int replay_collected(const char *dir, void *o)
{
	return replay_process(dir, o, 0);
}

int cmd_replay(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "tid", required_argument, 0, 't' },   { "depth", required_argument, 0, 'D' },
		{ "since", required_argument, 0, 'S' }, { "until", required_argument, 0, 'U' },
		{ "srcline", no_argument, 0, 'l' },     { "repo", required_argument, 0, 'r' },
		{ "demangle", required_argument, 0, 'M' }, { "diff", required_argument, 0, 'd' },
		{ "min-change", required_argument, 0, 'm' },
		{ "help", no_argument, 0, 'h' },        { 0, 0, 0, 0 },
	};
	const char *diff = NULL;
	double min_change = 20;
	replay_opts o;
	char *end;
	int c;

	memset(&o, 0, sizeof o);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 't': o.tids = optarg; break;
		case 'D': {
			unsigned long v = strtoul(optarg, &end, 10);
			if (!isdigit((unsigned char)*optarg) || *end || v < 1 || v > UINT32_MAX)
				return cli_error("replay: --depth '%s': give a whole number of "
						 "levels, 1 or more", optarg), 2;
			o.max_depth = (uint32_t)v;
			break;
		}
		case 'S':
		case 'U':
			if (parse_time(optarg, c == 'S' ? &o.since : &o.until) < 0)
				return cli_error("replay: --%s '%s': give seconds since tracing "
						 "began (1.5, 200ms, 30us) or @EPOCH-SECONDS",
						 c == 'S' ? "since" : "until", optarg), 2;
			break;
		case 'l': o.srcline = 1; break;
		case 'd': diff = optarg; break;
		case 'm':
			min_change = strtod(optarg, &end);
			if (end == optarg || *end || !(min_change >= 0))
				return cli_error("replay: --min-change '%s': give a percentage, 0 "
						 "or more", optarg), 2;
			break;
		case 'r': o.open.repo = optarg; break;
		case 'M':
			if ((o.open.demangle = an_demangle_style(optarg)) < 0)
				return cli_error("replay: --demangle '%s': use simple, full or no",
						 optarg), 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("replay: option '%s' needs a value; see 'sptrace replay "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("replay: unknown option '%s'; see 'sptrace replay --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("replay: %s; see 'sptrace replay --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	if (o.since.set && o.until.set && o.since.absolute == o.until.absolute &&
	    o.since.ns > o.until.ns)
		return cli_error("replay: --since is after --until: nothing to show"), 2;
	/* Records lost: said before anything else. */
	cli_say_lost_dir("replay", argv[optind], stdout);
	if (diff) {
		if (o.tids || o.max_depth || o.since.set || o.until.set || o.srcline)
			return cli_error("replay: --diff compares whole threads: --tid, --depth, "
					 "--since, --until and --srcline do not apply"), 2;
		if (cli_collected_tree(argv[optind]) || cli_collected_tree(diff))
			return cli_error("replay: --diff compares two traces, not trees made by "
					 "'sptrace collect': give one process's directory of each "
					 "(OUT/HOST/PID)"), 2;
		cli_say_lost_dir("replay", diff, stdout);
		return cli_replay_diff(argv[optind], diff, &o.open, min_change);
	}
	/* A tree made by `sptrace collect`: every process of every host. */
	if (cli_collected_tree(argv[optind]))
		return cli_collected_each(argv[optind], replay_collected, &o);
	return replay_process(argv[optind], &o, 1);
}
