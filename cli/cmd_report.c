/*
 * cmd_report.c — `sptrace report`: time per function over the traced
 * threads (total, self, calls), in uftrace's report layout; then the
 * messages per channel and direction (message events, trace_format.h).
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"

static const char help[] =
	"usage: sptrace report [OPTIONS] DIR\n"
	"\n"
	"For each function called in the trace: its total time (from entry to\n"
	"exit, counted once for recursive calls: only the outermost), its self\n"
	"time (total minus the calls it made) and how often it was called, summed\n"
	"over the threads, largest total first:\n"
	"\n"
	"    Total time   Self time       Calls  Function\n"
	"    ==========  ==========  ==========  ====================\n"
	"     10.293 ms    9.000 us           1  main\n"
	"\n"
	"A call with no exit (the trace ended first, or a longjmp or exception\n"
	"unwound it) counts until the thread's last record or the outer call's\n"
	"return; an exit whose entry is not in the trace is not counted.  Notes\n"
	"after the table say how many of each there were.  Then, if the program\n"
	"sent or received on sockets or pipes: the messages and bytes per channel\n"
	"and direction.\n"
	"\n"
	"In a trace taken with 'sptrace run --budget', the calls of a function that\n"
	"the agent counted rather than timed are in Calls (exactly) and marked\n"
	"'[N counted]' after its name; their time is in their callers' self time.\n"
	"\n"
	"options:\n"
	"  --sort KEY          total (default), self or calls\n"
	"  --diff DIR2         compare with the trace DIR2 (another run of the same\n"
	"                      program): per function, DIR's and DIR2's total time,\n"
	"                      self time and calls and what changed (DIR2 - DIR),\n"
	"                      largest change of the --sort key first; functions\n"
	"                      called in one run only are marked\n"
	"  --tid TID[,TID...]  only these threads\n"
	"  --demangle TYPE     how C++ names are shown (as uftrace's --demangle):\n"
	"                      simple  the name only: ns::Box::get (the default)\n"
	"                      full    all of it: ns::Box<int>::get(int) const\n"
	"                      no      the symbol: _ZNK2ns3BoxIiE3getEi\n"
	"  --repo DIR          code-analysis repository (default: $SPTRACE_REPO, else\n"
	"                      /var/lib/sptrace/repo as root, ~/.cache/sptrace/repo)\n"
	"  -h, --help          this text\n";

enum sort_key { SORT_TOTAL, SORT_SELF, SORT_CALLS };

/* Per function, in TSC ticks. */
typedef struct func_stat {
	uint64_t total, self, calls;
	uint64_t counted;        /* of the calls: counted, not timed (--budget) */
	uint32_t active;         /* open calls right now (recursion) */
	uint32_t func;
} func_stat;

/* Messages of one channel in one direction. */
typedef struct chan_stat {
	uint64_t msgs, bytes;
} chan_stat;

typedef struct report {
	an_trace *t;
	func_stat *fs;
	size_t nfs;
	chan_stat *cs;           /* [2 * channel id + received] */
	size_t ncs;
	uint64_t no_exit, exit_only;
	uint64_t counted, counted_funcs;
} report;

/* An open call while walking a thread's tree. */
typedef struct frame {
	size_t idx;
	uint32_t func;
	uint64_t dur, children;
} frame;

static func_stat *stat_of(report *r, uint32_t func)
{
	if (func >= r->nfs) {
		size_t n = an_nfuncs(r->t) > func ? an_nfuncs(r->t) : (size_t)func + 1;
		func_stat *fs = realloc(r->fs, n * sizeof *fs);

		if (!fs)
			return NULL;
		memset(fs + r->nfs, 0, (n - r->nfs) * sizeof *fs);
		for (size_t i = r->nfs; i < n; i++)
			fs[i].func = (uint32_t)i;
		r->fs = fs;
		r->nfs = n;
	}
	return &r->fs[func];
}

static int count_msg(report *r, const an_call *c)
{
	const an_msg *m = an_trace_msg(r->t, c->end);
	size_t i;

	if (!m || (m->len == 0 && !(m->flags & TRACE_MSG_DGRAM)))
		return 0;                  /* a shutdown or an end of stream: no bytes */
	i = (size_t)m->chan * 2 + (m->recv != 0);
	if (i >= r->ncs) {
		size_t n = i + 64;
		chan_stat *cs = realloc(r->cs, n * sizeof *cs);

		if (!cs)
			return -1;
		memset(cs + r->ncs, 0, (n - r->ncs) * sizeof *cs);
		r->cs = cs;
		r->ncs = n;
	}
	r->cs[i].msgs++;
	r->cs[i].bytes += m->len;
	return 0;
}

static void print_msgs(const report *r)
{
	char ch[300];
	int head = 0;

	for (size_t i = 0; i < r->ncs; i++) {
		if (!r->cs[i].msgs)
			continue;
		if (!head++)
			printf("\n    Messages       Bytes  Channel\n"
			       "  ==========  ==========  ====================\n");
		printf(" %11" PRIu64 " %11" PRIu64 "  %s %s\n", r->cs[i].msgs, r->cs[i].bytes,
		       i % 2 ? "recv" : "send",
		       an_channel_text(r->t, (uint32_t)(i / 2), (int)(i % 2), ch, sizeof ch));
	}
}

static void frame_done(report *r, const frame *f)
{
	func_stat *s = &r->fs[f->func];

	s->self += f->dur > f->children ? f->dur - f->children : 0;
	s->active--;
}

static int add_thread(report *r, const an_thread *th)
{
	an_call *c;
	size_t n, depth = 0;
	frame *stack;
	an_iter_stats st;
	sp_err err;

	if (an_thread_calls(r->t, th, &c, &n, &st, &err) < 0)
		return cli_error("report: %s", err.msg);
	if (st.nbad_sites)
		fprintf(stderr, "sptrace: report: warning: %s: %zu records name site ids the "
			"sites file (ids 1-%zu) does not have; counted as '?site <id>'\n",
			th->path, st.nbad_sites, an_nsites(r->t) ? an_nsites(r->t) - 1 : 0);
	if (st.nbad_syncs)
		fprintf(stderr, "sptrace: report: warning: %s: %zu malformed SYNC records ignored; "
			"times after them may be off\n", th->path, st.nbad_syncs);
	stack = malloc((n + 1) * sizeof *stack);
	if (!stack) {
		free(c);
		return cli_error("report: %s: out of memory", th->path);
	}
	for (size_t i = 0; i < n; i++) {
		func_stat *s;
		frame *f;

		while (depth && c[stack[depth - 1].idx].last <= i)
			frame_done(r, &stack[--depth]);
		if (c[i].kind == AN_EXIT_ONLY)
			r->exit_only++;
		if (c[i].kind == AN_EVENT && trace_event_is_msg(c[i].id) && count_msg(r, &c[i])) {
			free(stack);
			free(c);
			return cli_error("report: out of memory");
		}
		if (c[i].kind == AN_EVENT && c[i].id == TRACE_EV_COUNT) {
			const an_budget *b = an_trace_budget(r->t, c[i].end);

			if (b && !(s = stat_of(r, an_site(r->t, b->site)->callee))) {
				free(stack);
				free(c);
				return cli_error("report: out of memory");
			}
			if (b) {
				s->calls += b->n;
				s->counted += b->n;
				r->counted += b->n;
			}
		}
		if (c[i].kind != AN_CALL)
			continue;
		f = &stack[depth];
		f->idx = i;
		f->func = an_site(r->t, c[i].id)->callee;
		f->dur = c[i].t1 > c[i].t0 ? c[i].t1 - c[i].t0 : 0;
		f->children = 0;
		if (!(s = stat_of(r, f->func))) {
			free(stack);
			free(c);
			return cli_error("report: out of memory");
		}
		if (c[i].end == AN_END_TRACE || c[i].end == AN_END_UNWOUND || c[i].end == AN_END_STOPPED)
			r->no_exit++;
		if (depth)
			stack[depth - 1].children += f->dur;
		if (!(c[i].flags & AN_CONTINUED))
			s->calls++;             /* a continued call was counted once */
		if (!s->active++)
			s->total += f->dur;
		depth++;
	}
	while (depth)
		frame_done(r, &stack[--depth]);
	free(stack);
	free(c);
	return 0;
}

static enum sort_key sort_by;
static const an_trace *sort_trace;

static int cmp_u64_desc(uint64_t a, uint64_t b)
{
	return a > b ? -1 : a < b;
}

static int stat_cmp(const void *pa, const void *pb)
{
	const func_stat *a = pa, *b = pb;
	int d = 0;

	switch (sort_by) {
	case SORT_TOTAL: d = cmp_u64_desc(a->total, b->total); break;
	case SORT_SELF: d = cmp_u64_desc(a->self, b->self); break;
	case SORT_CALLS: d = cmp_u64_desc(a->calls, b->calls); break;
	}
	if (!d)
		d = strcmp(an_func_get(sort_trace, a->func)->name,
			   an_func_get(sort_trace, b->func)->name);
	return d ? d : (a->func > b->func) - (a->func < b->func);
}

static void print_report(report *r)
{
	char tot[24], self[24];

	sort_trace = r->t;
	if (r->nfs)
		qsort(r->fs, r->nfs, sizeof *r->fs, stat_cmp);
	printf("  Total time   Self time       Calls  Function\n");
	printf("  ==========  ==========  ==========  ====================\n");
	for (size_t i = 0; i < r->nfs; i++) {
		const func_stat *s = &r->fs[i];

		if (!s->calls)
			continue;
		printf(" %s %s %11" PRIu64 "  %s",
		       an_fmt_duration(an_tsc_ns(r->t, 0, s->total), tot),
		       an_fmt_duration(an_tsc_ns(r->t, 0, s->self), self), s->calls,
		       an_func_get(r->t, s->func)->name);
		if (s->counted) {
			printf("  [%" PRIu64 " counted]", s->counted);
			r->counted_funcs++;
		}
		putchar('\n');
	}
	if (r->counted)
		printf("\n# %" PRIu64 " calls of %" PRIu64 " functions were counted, not timed "
		       "(sptrace run --budget: their sites' calls were shorter than 1 us; marked [N counted]): they are "
		       "in Calls, their time in their callers' self time\n", r->counted,
		       r->counted_funcs);
	if (r->no_exit)
		printf("\n# %" PRIu64 " calls had no exit (the trace ended, or a longjmp or "
		       "exception unwound them): counted to the last record or the outer "
		       "return\n", r->no_exit);
	if (r->exit_only)
		printf("%s# %" PRIu64 " exits without a recorded entry are not counted\n",
		       r->no_exit ? "" : "\n", r->exit_only);
	print_msgs(r);
}

/* What report_dir needs of the command line. */
typedef struct report_args {
	an_open_opts oo;
	const char *tids;
} report_args;

/* Read the trace in dir into r (its threads, or those --tid names). */
static int load(const char *dir, const report_args *a, report *r)
{
	unsigned char *sel;
	sp_err err;
	int rc = 0;

	memset(r, 0, sizeof *r);
	if (an_trace_open_opts(dir, &a->oo, &r->t, &err) < 0)
		return cli_error("report: %s", err.msg);
	sel = malloc(an_trace_nthreads(r->t) + 1);
	if (!sel)
		return cli_error("report: out of memory");
	memset(sel, 1, an_trace_nthreads(r->t) + 1);
	if (a->tids && an_select_threads(r->t, a->tids, sel, &err) < 0) {
		free(sel);
		return cli_error("report: --tid: %s", err.msg);
	}
	for (size_t i = 0; i < an_trace_nwarnings(r->t); i++)
		fprintf(stderr, "sptrace: report: warning: %s\n", an_trace_warning(r->t, i));
	for (size_t i = 0; i < an_trace_nthreads(r->t) && !rc; i++)
		if (sel[i])
			rc = add_thread(r, an_trace_thread(r->t, i));
	free(sel);
	return rc;
}

static void unload(report *r)
{
	free(r->fs);
	free(r->cs);
	an_trace_close(r->t);
}

/* The report of the trace in dir. */
static int report_dir(const char *dir, void *arg)
{
	report r;
	/* Everything is read before anything is printed: no half table. */
	int rc = load(dir, arg, &r);

	if (!rc)
		print_report(&r);
	unload(&r);
	return rc;
}

/* --diff: one function's figures in both runs, joined by name. */
typedef struct diff_row {
	const char *name;
	int64_t total[2], self[2];   /* ns */
	uint64_t calls[2];
	int in[2];
} diff_row;

static int64_t change(const diff_row *d)
{
	switch (sort_by) {
	case SORT_SELF: return d->self[1] - d->self[0];
	case SORT_CALLS: return (int64_t)d->calls[1] - (int64_t)d->calls[0];
	default: return d->total[1] - d->total[0];
	}
}

static int diff_cmp(const void *pa, const void *pb)
{
	const diff_row *a = pa, *b = pb;
	int64_t x = change(a), y = change(b);
	uint64_t ax = x < 0 ? (uint64_t)-x : (uint64_t)x, ay = y < 0 ? (uint64_t)-y : (uint64_t)y;

	return ax != ay ? (ax > ay ? -1 : 1) : strcmp(a->name, b->name);
}

static void fmt_change(int64_t a, int64_t b, char buf[24])
{
	char d[24];

	if (a == b) {
		snprintf(buf, 24, "%11s", "=");
		return;
	}
	an_fmt_duration((uint64_t)(b > a ? b - a : a - b), d);
	/* "   1.200 ms" -> "  +1.200 ms" */
	size_t i = 0;

	while (d[i] == ' ' && d[i + 1] == ' ')
		i++;
	d[i] = b > a ? '+' : '-';
	snprintf(buf, 24, "%s", d);
}

static int report_diff(const char *dir, const char *dir2, const report_args *a)
{
	report r[2];
	diff_row *rows = NULL;
	size_t nrows = 0, cap = 0;
	int rc;

	if ((rc = load(dir, a, &r[0])) == 0)
		rc = load(dir2, a, &r[1]);
	else
		memset(&r[1], 0, sizeof r[1]);
	for (int k = 0; k < 2 && !rc; k++)
		for (size_t i = 0; i < r[k].nfs; i++) {
			const func_stat *s = &r[k].fs[i];
			const char *name = an_func_get(r[k].t, s->func)->name;
			size_t j;

			if (!s->calls)
				continue;
			for (j = 0; j < nrows; j++)   /* by name: the same function in both */
				if (strcmp(rows[j].name, name) == 0)
					break;
			if (j == nrows) {
				if (nrows == cap) {
					size_t nc = cap ? 2 * cap : 256;
					diff_row *q = realloc(rows, nc * sizeof *q);

					if (!q) {
						rc = cli_error("report: out of memory");
						break;
					}
					rows = q;
					cap = nc;
				}
				memset(&rows[nrows], 0, sizeof *rows);
				rows[nrows++].name = name;
			}
			rows[j].in[k] = 1;
			rows[j].total[k] += (int64_t)an_tsc_ns(r[k].t, 0, s->total);
			rows[j].self[k] += (int64_t)an_tsc_ns(r[k].t, 0, s->self);
			rows[j].calls[k] += s->calls;
		}
	if (!rc) {
		char t0[24], t1[24], td[24], s0[24], s1[24], sd[24];

		if (nrows)
			qsort(rows, nrows, sizeof *rows, diff_cmp);
		printf("# %s (A) and %s (B): per function, B - A, largest change of %s first\n",
		       dir, dir2, sort_by == SORT_SELF ? "self time" : sort_by == SORT_CALLS ?
		       "calls" : "total time");
		printf("   Total A     Total B        Diff      Self A      Self B        Diff"
		       "     Calls A     Calls B  Function\n");
		printf("  ==========  ==========  ==========  ==========  ==========  =========="
		       "  ==========  ==========  ====================\n");
		for (size_t i = 0; i < nrows; i++) {
			const diff_row *d = &rows[i];

			fmt_change(d->total[0], d->total[1], td);
			fmt_change(d->self[0], d->self[1], sd);
			printf(" %s %s %s %s %s %s %11" PRIu64 " %11" PRIu64 "  %s%s\n",
			       an_fmt_duration((uint64_t)d->total[0], t0),
			       an_fmt_duration((uint64_t)d->total[1], t1), td,
			       an_fmt_duration((uint64_t)d->self[0], s0),
			       an_fmt_duration((uint64_t)d->self[1], s1), sd, d->calls[0], d->calls[1],
			       d->name, !d->in[0] ? "  [B only]" : !d->in[1] ? "  [A only]" : "");
		}
	}
	free(rows);
	unload(&r[0]);
	unload(&r[1]);
	return rc;
}

int cmd_report(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "sort", required_argument, 0, 's' }, { "tid", required_argument, 0, 't' },
		{ "repo", required_argument, 0, 'r' }, { "demangle", required_argument, 0, 'M' },
		{ "diff", required_argument, 0, 'd' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	report_args a = { 0 };
	const char *tids = NULL, *diff = NULL;
	int c;

	sort_by = SORT_TOTAL;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			if (strcmp(optarg, "total") == 0)
				sort_by = SORT_TOTAL;
			else if (strcmp(optarg, "self") == 0)
				sort_by = SORT_SELF;
			else if (strcmp(optarg, "calls") == 0)
				sort_by = SORT_CALLS;
			else
				return cli_error("report: --sort '%s': use total, self or calls",
						 optarg), 2;
			break;
		case 't': tids = optarg; break;
		case 'd': diff = optarg; break;
		case 'r': a.oo.repo = optarg; break;
		case 'M':
			if ((a.oo.demangle = an_demangle_style(optarg)) < 0)
				return cli_error("report: --demangle '%s': use simple, full or no",
						 optarg), 2;
			break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("report: option '%s' needs a value; see 'sptrace report "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("report: unknown option '%s'; see 'sptrace report --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind != argc - 1)
		return cli_error("report: %s; see 'sptrace report --help'",
				 optind >= argc ? "no trace directory given"
				 : "give one trace directory"), 2;
	a.tids = tids;
	/* Records lost: said before anything else. */
	cli_say_lost_dir("report", argv[optind], stdout);
	if (diff) {
		if (cli_collected_tree(argv[optind]) || cli_collected_tree(diff))
			return cli_error("report: --diff compares two traces, not trees made by "
					 "'sptrace collect': give one process's directory of each "
					 "(OUT/HOST/PID)"), 2;
		cli_say_lost_dir("report", diff, stdout);
		return report_diff(argv[optind], diff, &a) ? 1 : 0;
	}
	/* A tree made by `sptrace collect`: every process of every host. */
	if (cli_collected_tree(argv[optind]))
		return cli_collected_each(argv[optind], report_dir, &a);
	return report_dir(argv[optind], &a);
}
