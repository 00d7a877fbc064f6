/*
 * replay_diff.c — `sptrace replay --diff DIR2 DIR`: the call trees of two
 * runs side by side, aligned call by call.
 *
 *  1. Threads pair up in the order the traces list them (by tid: the main
 *     thread first); a thread without a partner is said, not shown.
 *  2. Each thread's calls, in call order, are lines "depth, function name";
 *     the two sequences are aligned by the shortest edit script (Myers'
 *     O((N+M)D) algorithm: a call is kept, only in DIR, or only in DIR2).
 *     Past MAX_EDITS differences the rest of the thread is not aligned
 *     (said): two runs that far apart are not one program's twice.
 *  3. Shown: the calls only in one run ('-' DIR, '+' DIR2), the calls in
 *     both whose duration changed by at least --min-change percent (default
 *     20) and 1 us, and the calls that contain any of those (for context),
 *     each with both durations and the change.
 *
 * `sptrace analyze` aligns two flows the same way (cli_flow_diff): a flow's
 * calls are those its parts hold (entered within a part's work: from its
 * first receive or take to its last send or give, as anomaly.c counts), part
 * by part in the order they began, at their depths on their threads (flows
 * of one role run on threads alike).
 */
#include "cli.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"

#define MAX_EDITS 4000

typedef struct line {
	uint32_t depth;
	const char *name;
	uint64_t hash;
	uint64_t ns;
	int parens;              /* print "()" after the name */
} line;

typedef struct side {
	an_trace *t;
	line *l;
	size_t n;
} side;

/* Point 2: a thread's calls as lines. */
static int lines_of(an_trace *t, const an_thread *th, line **out, size_t *n)
{
	an_call *c;
	size_t nc, k = 0;
	sp_err err;

	*out = NULL;
	*n = 0;
	if (an_thread_calls(t, th, &c, &nc, NULL, &err) < 0)
		return cli_error("replay: %s", err.msg);
	if (!(*out = calloc(nc + 1, sizeof **out))) {
		free(c);
		return cli_error("replay: out of memory");
	}
	for (size_t i = 0; i < nc; i++) {
		const an_func *f;

		if (c[i].kind != AN_CALL || (c[i].flags & AN_CONTINUED))
			continue;
		f = an_func_get(t, an_site(t, c[i].id)->callee);
		(*out)[k++] = (line){ c[i].depth, f->name,
				      an_hash_str(f->name) * 31 + c[i].depth,
				      an_tsc_ns(t, c[i].t0, c[i].t1), !f->signature };
	}
	*n = k;
	free(c);
	return 0;
}

static int same(const line *a, const line *b)
{
	return a->hash == b->hash && a->depth == b->depth && strcmp(a->name, b->name) == 0;
}

/* One step of the alignment: a line of a (op '-'), of b ('+') or of both (' '). */
typedef struct step {
	char op;
	size_t ia, ib;
} step;

/*
 * Point 2: Myers' greedy algorithm, keeping each round's furthest reaching
 * paths to walk back.  *steps is malloc'ed; -1 with *steps NULL when the
 * two differ by more than MAX_EDITS (the caller says so).
 */
static int align(const line *a, size_t n, const line *b, size_t m, step **steps, size_t *ns)
{
	long max = (long)(n + m) < MAX_EDITS ? (long)(n + m) : MAX_EDITS;
	long off = max + 1, width = 2 * max + 3, d, k, found = -1;
	long *v = calloc((size_t)width, sizeof *v);
	long **hist = calloc((size_t)max + 1, sizeof *hist);

	*steps = NULL;
	*ns = 0;
	if (!v || !hist)
		goto fail;
	for (d = 0; d <= max && found < 0; d++) {
		for (k = -d; k <= d; k += 2) {
			long x = k == -d || (k != d && v[off + k - 1] < v[off + k + 1])
				 ? v[off + k + 1] : v[off + k - 1] + 1;
			long y = x - k;

			while (x < (long)n && y < (long)m && same(&a[x], &b[y])) {
				x++;
				y++;
			}
			v[off + k] = x;
			if (x >= (long)n && y >= (long)m) {
				found = d;
				break;
			}
		}
		if (!(hist[d] = malloc((size_t)width * sizeof **hist)))
			goto fail;
		memcpy(hist[d], v, (size_t)width * sizeof *v);
	}
	if (found < 0)
		goto fail;
	/* walk back from (n, m) */
	step *s = malloc((n + m + 1) * sizeof *s);
	size_t at = n + m + 1;
	long x = (long)n, y = (long)m;

	if (!s)
		goto fail;
	for (d = found; d > 0; d--) {
		const long *vd = hist[d - 1];
		long kk = x - y;
		bool down = kk == -d || (kk != d && vd[off + kk - 1] < vd[off + kk + 1]);
		long pk = down ? kk + 1 : kk - 1, px = vd[off + pk], py = px - pk;
		long sx = down ? px : px + 1, sy = down ? py + 1 : py;   /* after the edit */

		while (x > sx && y > sy)
			s[--at] = (step){ ' ', (size_t)--x, (size_t)--y };
		if (down)
			s[--at] = (step){ '+', (size_t)px, (size_t)py };
		else
			s[--at] = (step){ '-', (size_t)px, (size_t)py };
		x = px;
		y = py;
	}
	while (x > 0 && y > 0)
		s[--at] = (step){ ' ', (size_t)--x, (size_t)--y };
	memmove(s, s + at, (n + m + 1 - at) * sizeof *s);
	*steps = s;
	*ns = n + m + 1 - at;
	for (d = 0; d <= max; d++)
		free(hist[d]);
	free(hist);
	free(v);
	return 0;
fail:
	for (d = 0; hist && d <= max; d++)
		free(hist[d]);
	free(hist);
	free(v);
	return -1;
}

static void dur(uint64_t ns, int have, char buf[24])
{
	if (have)
		an_fmt_duration(ns, buf);
	else
		snprintf(buf, 24, "%11s", "-");
}

/* Point 3: print the steps worth showing of one thread pair. */
static void show(FILE *out, const side *A, const side *B, const step *s, size_t ns,
		 double min_change)
{
	unsigned char *keep = calloc(ns + 1, 1);
	size_t *stack = malloc((ns + 1) * sizeof *stack), depth = 0, shown = 0;
	char da[24], db[24];

	if (!keep || !stack) {
		free(keep);
		free(stack);
		cli_error("replay: out of memory");
		return;
	}
	/* mark, then mark the enclosing calls of what is marked */
	for (size_t i = 0; i < ns; i++) {
		const line *l = s[i].op == '+' ? &B->l[s[i].ib] : &A->l[s[i].ia];

		while (depth && (s[stack[depth - 1]].op == '+' ? B->l[s[stack[depth - 1]].ib].depth
				 : A->l[s[stack[depth - 1]].ia].depth) >= l->depth)
			depth--;
		if (s[i].op != ' ') {
			keep[i] = 1;
		} else {
			uint64_t x = A->l[s[i].ia].ns, y = B->l[s[i].ib].ns;
			uint64_t dd = x > y ? x - y : y - x;

			keep[i] = dd >= 1000 && (double)dd >= min_change / 100.0 * (double)(x > y ? x : y);
		}
		if (keep[i])
			for (size_t k = 0; k < depth; k++)
				keep[stack[k]] = 1;
		stack[depth++] = i;
	}
	for (size_t i = 0; i < ns; i++) {
		const line *l = s[i].op == '+' ? &B->l[s[i].ib] : &A->l[s[i].ia];
		char change[24] = "";

		if (!keep[i])
			continue;
		shown++;
		dur(s[i].op == '+' ? 0 : A->l[s[i].ia].ns, s[i].op != '+', da);
		dur(s[i].op == '-' ? 0 : B->l[s[i].ib].ns, s[i].op != '-', db);
		if (s[i].op == ' ' && A->l[s[i].ia].ns)
			snprintf(change, sizeof change, "%+.0f%%",
				 100.0 * ((double)B->l[s[i].ib].ns - (double)A->l[s[i].ia].ns) /
				 (double)A->l[s[i].ia].ns);
		fprintf(out, "%c %s %s %7s | %*s%s%s\n", s[i].op, da, db, change,
			(int)(2 * l->depth), "", l->name, l->parens ? "()" : "");
	}
	if (!shown)
		fprintf(out, "  (the same calls, no duration changed by %.0f%% and 1 us or more)\n",
			min_change);
	free(keep);
	free(stack);
}

int cli_replay_diff(const char *dir, const char *dir2, const an_open_opts *oo, double min_change)
{
	side A = { 0 }, B = { 0 };
	sp_err err;
	int rc = 0;

	if (an_trace_open_opts(dir, oo, &A.t, &err) < 0)
		return cli_error("replay: %s", err.msg);
	if (an_trace_open_opts(dir2, oo, &B.t, &err) < 0) {
		an_trace_close(A.t);
		return cli_error("replay: --diff: %s", err.msg);
	}
	printf("# %s (A) and %s (B): '-' calls of A only, '+' of B only; calls in both shown "
	       "when their duration changed by %.0f%% and 1 us or more, with the calls around "
	       "them\n", dir, dir2, min_change);
	printf("#     DURATION A  DURATION B  CHANGE | FUNCTION\n");
	size_t na = an_trace_nthreads(A.t), nb = an_trace_nthreads(B.t);

	for (size_t i = 0; i < na || i < nb; i++) {
		const an_thread *ta = i < na ? an_trace_thread(A.t, i) : NULL;
		const an_thread *tb = i < nb ? an_trace_thread(B.t, i) : NULL;
		step *s;
		size_t ns;

		if (!ta || !tb) {
			printf("# thread %" PRIu32 " of %s has no partner in the other run\n",
			       ta ? ta->tid : tb->tid, ta ? dir : dir2);
			continue;
		}
		printf("# thread %" PRIu32 " (A) and %" PRIu32 " (B)\n", ta->tid, tb->tid);
		if (lines_of(A.t, ta, &A.l, &A.n) || lines_of(B.t, tb, &B.l, &B.n)) {
			rc = 1;
			free(A.l);
			free(B.l);
			break;
		}
		if (align(A.l, A.n, B.l, B.n, &s, &ns) < 0)
			printf("# these threads differ by more than %d calls (%zu and %zu calls): not "
			       "aligned; compare them with 'sptrace report --diff'\n", MAX_EDITS, A.n,
			       B.n);
		else
			show(stdout, &A, &B, s, ns, min_change);
		free(s);
		free(A.l);
		free(B.l);
		A.l = B.l = NULL;
	}
	an_trace_close(A.t);
	an_trace_close(B.t);
	return rc;
}

/* A flow's calls as lines (see the top): those of each part's thread
 * entered within the part's span. */
static int flow_lines(an_session *s, const an_flow *f, line **out, size_t *n)
{
	size_t cap = 0;

	*out = NULL;
	*n = 0;
	for (size_t p = 0; p < f->nparts; p++) {
		const an_flow_part *pt = &f->parts[p];
		an_trace *t = an_session_trace(s, pt->image);
		const an_thread *th = t ? an_trace_thread_by_tid(t, pt->tid) : NULL;
		an_call *c;
		size_t nc;
		sp_err err;

		if (!th)
			continue;
		if (an_thread_calls(t, th, &c, &nc, NULL, &err) < 0)
			return cli_error("analyze: %s", err.msg);
		for (size_t i = 0; i < nc; i++) {
			const an_func *fn;
			int64_t at;

			if (c[i].kind != AN_CALL || (c[i].flags & AN_CONTINUED))
				continue;
			at = an_realtime_ns(t, c[i].t0);
			if (at < pt->work_start_ns || at > pt->work_end_ns)
				continue;
			if (sp_grow((void **)out, &cap, *n + 1, sizeof **out)) {
				free(c);
				return cli_error("analyze: out of memory");
			}
			fn = an_func_get(t, an_site(t, c[i].id)->callee);
			(*out)[(*n)++] = (line){ c[i].depth, fn->name,
						 an_hash_str(fn->name) * 31 + c[i].depth,
						 an_tsc_ns(t, c[i].t0, c[i].t1), !fn->signature };
		}
		free(c);
	}
	return 0;
}

int cli_flow_diff(FILE *out, an_session *s, const an_flows *fl, const char *id, an_session *s2,
		  const an_flows *fl2, const char *id2, double min_change)
{
	const an_flow *a = an_flows_find(fl, id, NULL), *b = an_flows_find(fl2, id2, NULL);
	side A = { 0 }, B = { 0 };
	step *st = NULL;
	size_t ns;

	if (!a || !b)
		return cli_error("analyze: no flow %s to compare", !a ? id : id2);
	if (flow_lines(s, a, &A.l, &A.n) || flow_lines(s2, b, &B.l, &B.n)) {
		free(A.l);
		free(B.l);
		return -1;
	}
	/* A: the normal flow, B: the anomalous one ('+' its calls only) */
	if (align(B.l, B.n, A.l, A.n, &st, &ns) < 0)
		fprintf(out, "# the two flows differ by more than %d calls (%zu and %zu calls): not "
			"aligned\n", MAX_EDITS, A.n, B.n);
	else
		show(out, &B, &A, st, ns, min_change);
	free(st);
	free(A.l);
	free(B.l);
	return 0;
}
