/*
 * budget_check.c — per function of a trace: its calls (ENTRY records plus
 * counted calls, sptrace run --budget), how many of them were counted, and
 * how many timed calls lasted 1 us or more.  For bench/budget_bench.py,
 * which compares a trace taken with --budget with one taken without.
 *
 *   budget_check DIR      one line per function called:
 *                         NAME<TAB>CALLS<TAB>COUNTED<TAB>LONG<TAB>LONGP
 *
 * LONG: timed calls of 1 us or more; LONGP: those of 1 us or more once the
 * tracer's cost of the records written inside them is taken off (REC_NS
 * each), an estimate of the calls that took 1 us of the program's time.
 *
 * Reads the records with the analysis library's iterator (no call tree in
 * memory: traces of hundreds of millions of records).  An EXIT closes the
 * innermost open call of its site (those above it: tail jumps and calls
 * unwound, not timed).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"
#include "trace_format.h"

typedef struct fstat {
	uint64_t calls, counted, longc, longp;
} fstat;

typedef struct open_call {
	uint32_t site;
	uint64_t tsc, rec;       /* its ENTRY's time and index among the records */
} open_call;

/* The tracer's cost of a record with every record kept (agent.h,
 * AG_BUDGET_REC_NS_KEEP): a call's program time is its duration less
 * this for each record written inside it. */
#define REC_NS 14

static fstat *fs;
static size_t nfs;

static fstat *of(uint32_t f)
{
	if (f >= nfs) {
		size_t n = (size_t)f + 1024;

		fs = realloc(fs, n * sizeof *fs);
		if (!fs) {
			fputs("budget_check: out of memory\n", stderr);
			exit(1);
		}
		memset(fs + nfs, 0, (n - nfs) * sizeof *fs);
		nfs = n;
	}
	return &fs[f];
}

static int thread(an_trace *t, const an_thread *th, uint64_t long_ticks)
{
	static open_call stack[4096];
	size_t depth = 0;
	uint64_t rec = 0;
	an_iter *it;
	an_record r;
	sp_err err;

	if (an_iter_open(t, th, &it, &err) < 0) {
		fprintf(stderr, "budget_check: %s\n", err.msg);
		return -1;
	}
	while (an_iter_next(it, &r)) {
		rec++;
		if (r.kind == TRACE_EVENT && r.id == TRACE_EV_COUNT) {
			fstat *s = of(an_site(t, r.budget.site)->callee);

			s->calls += r.budget.n;
			s->counted += r.budget.n;
		} else if (r.kind == TRACE_ENTRY) {
			of(an_site(t, r.id)->callee)->calls++;
			if (depth < sizeof stack / sizeof *stack)
				stack[depth] = (open_call){ r.id, r.tsc, rec };
			depth++;
		} else if (r.kind == TRACE_EXIT) {
			size_t k = depth < sizeof stack / sizeof *stack ? depth : sizeof stack / sizeof *stack;

			while (k > 0 && stack[k - 1].site != r.id)
				k--;
			if (k == 0)
				continue;
			uint64_t d = r.tsc - stack[k - 1].tsc, in = (rec - stack[k - 1].rec - 1) *
				     REC_NS * long_ticks / 1000;

			if (d >= long_ticks)
				of(an_site(t, r.id)->callee)->longc++;
			if (d >= long_ticks + in)
				of(an_site(t, r.id)->callee)->longp++;
			depth = k - 1;
		}
	}
	an_iter_close(it);
	return 0;
}

int main(int argc, char **argv)
{
	an_trace *t;
	sp_err err;
	uint64_t long_ticks;

	if (argc != 2) {
		fputs("usage: budget_check DIR\n", stderr);
		return 2;
	}
	if (an_trace_open(argv[1], &t, &err) < 0) {
		fprintf(stderr, "budget_check: %s\n", err.msg);
		return 1;
	}
	/* The ticks of 1 us: an_tsc_ns is linear. */
	long_ticks = 1000000000ull / (an_tsc_ns(t, 0, 1000000000ull) / 1000 ?: 1);
	for (size_t i = 0; i < an_trace_nthreads(t); i++)
		if (thread(t, an_trace_thread(t, i), long_ticks) < 0)
			return 1;
	for (size_t f = 0; f < nfs; f++)
		if (fs[f].calls)
			printf("%s\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\n",
			       an_func_get(t, (uint32_t)f)->name, fs[f].calls, fs[f].counted,
			       fs[f].longc, fs[f].longp);
	an_trace_close(t);
	free(fs);
	return 0;
}
