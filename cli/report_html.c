/*
 * report_html.c — `sptrace analyze --html FILE`: the analysis as one
 * self-contained page (no fetches: its style, script and drawing are in the
 * file).
 *
 *   - the ranked table of the units (flows, processes or hosts), each with
 *     its score, method, verdict and culprit;
 *   - the culprit paths and the causes of the most suspect units, and for
 *     a flow its critical path (where its time went, thread by thread);
 *   - a timeline of the session's flows, one lane per thread grouped by
 *     host and process, a bar per part of a flow and an arrow per matched
 *     message (send -> receive);
 *   - clicking a row, a bar or a cause highlights that unit everywhere (and
 *     FILE#u=KEY opens with unit KEY highlighted: a flow id, HOST/PID or
 *     HOST).
 *
 * Written to FILE.XXXXXX beside FILE and renamed over it once complete, so
 * FILE is never half-written.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"

#define TIMELINE_W 1200          /* px of the time axis */
#define LANE_H 18
#define LABEL_W 260
#define MAX_LANES 400            /* threads drawn; more are counted, not drawn */
#define MAX_PARTS 20000          /* bars */
#define MAX_ARROWS 5000
#define CAUSE_UNITS 10           /* units whose causes are listed */

/* Text for HTML, escaped. */
static void esc(FILE *f, const char *s)
{
	for (; s && *s; s++) {
		switch (*s) {
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '&': fputs("&amp;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&#39;", f); break;
		default: fputc(*s, f);
		}
	}
}

static const char *kind_name(int kind)
{
	return kind == AN_UNITS_FLOW ? "flow" : kind == AN_UNITS_HOST ? "host" : "process";
}

/* The key a unit's elements carry (data-u): its flow id, "HOST/PID" or
 * "HOST". */
static void unit_key(char *buf, size_t len, const an_suspect *s)
{
	if (s->flow)
		snprintf(buf, len, "%s", s->flow);
	else if (s->kind == AN_UNITS_HOST)
		snprintf(buf, len, "%s", s->host);
	else
		snprintf(buf, len, "%s/%" PRIu32, s->host, s->pid);
}

static void path_html(FILE *f, const char *const *path, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (i)
			fputs(" <span class=sep>&rsaquo;</span> ", f);
		fputs(i + 1 == n ? "<b>" : "<span>", f);
		esc(f, path[i]);
		fputs(i + 1 == n ? "</b>" : "</span>", f);
	}
}

static const char style[] =
	"body{font:14px/1.4 sans-serif;margin:1.5em;color:#222}"
	"h1{font-size:20px}h2{font-size:16px;margin-top:1.6em}"
	"table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;"
	"text-align:left;vertical-align:top}th{background:#f3f3f3}"
	"tr.u{cursor:pointer}tr.u:hover{background:#f7f7ff}"
	".flag{color:#b00;font-weight:bold}.ok{color:#070}.path{font-family:monospace}"
	".sep{color:#999}.why{color:#555;font-size:13px}.kind{display:inline-block;"
	"min-width:5em;color:#fff;background:#68a;border-radius:3px;padding:0 4px;"
	"font-size:12px;text-align:center}.kind.coverage{background:#a86}"
	".kind.communication{background:#6a7}.kind.interval{background:#888}"
	".hl{background:#ffec99 !important}rect.hl{stroke:#000;stroke-width:2px}"
	"line.hl{stroke:#d00;stroke-width:2.5px}svg text{font:11px sans-serif}"
	"rect.part{cursor:pointer}line.arrow{stroke:#333;stroke-width:1px}"
	".note{color:#777;font-size:12px}table.crit{margin:4px 0 12px 24px;font-size:12px}"
	"table.crit caption{text-align:left;color:#555}";

/* Click: every element of the unit's key gets class hl, the others lose it. */
static const char script[] =
	"function hl(k){document.querySelectorAll('.hl').forEach(function(e){"
	"e.classList.remove('hl')});if(!k)return;document.querySelectorAll('[data-u]')"
	".forEach(function(e){if(e.getAttribute('data-u')===k||(e.getAttribute('data-p')"
	"===k)||(e.getAttribute('data-h')===k))e.classList.add('hl')});"
	"document.getElementById('selected').textContent=k}"
	"document.addEventListener('click',function(ev){var e=ev.target.closest('[data-u]');"
	"if(e)hl(e.getAttribute('data-u'))});"
	"if(location.hash.indexOf('#u=')===0)hl(decodeURIComponent(location.hash.slice(3)));";

/* ---- the timeline ---- */

typedef struct lane {
	size_t image;
	uint32_t tid;
	uint32_t pid;
	const char *host, *program;
} lane;

static int lane_cmp(const void *x, const void *y)
{
	const lane *a = x, *b = y;
	int c = strcmp(a->host, b->host);

	if (c)
		return c;
	if (a->pid != b->pid)
		return a->pid < b->pid ? -1 : 1;
	return a->tid < b->tid ? -1 : a->tid > b->tid;
}

static long lane_of(const lane *l, size_t n, size_t image, uint32_t tid)
{
	for (size_t i = 0; i < n; i++)
		if (l[i].image == image && l[i].tid == tid)
			return (long)i;
	return -1;
}

/* The flow whose part on (image, tid) holds time ns, NULL if none. */
static const an_flow *flow_at(const an_flows *fl, size_t image, uint32_t tid, int64_t ns)
{
	for (size_t i = 0; i < an_flows_count(fl); i++) {
		const an_flow *f = an_flows_get(fl, i);

		for (size_t k = 0; k < f->nparts; k++)
			if (f->parts[k].image == image && f->parts[k].tid == tid &&
			    f->parts[k].start_ns <= ns && ns <= f->parts[k].end_ns)
				return f;
	}
	return NULL;
}

static double x_of(int64_t ns, int64_t t0, int64_t span)
{
	return LABEL_W + (span > 0 ? (double)(ns - t0) * TIMELINE_W / (double)span : 0);
}

static unsigned hue(const char *s)
{
	return (unsigned)(an_hash_str(s) % 360);
}

/* The intervals of the most suspect flows (anomaly.c, point 7): a red band
 * under each of their bars, over the stretch where the culprit showed. */
static void intervals(FILE *f, const an_anomalies *a, const an_flows *fl, const lane *l,
		      size_t nl, int64_t t0, int64_t span)
{
	for (size_t i = 0; i < an_anomalies_count(a) && i < CAUSE_UNITS; i++) {
		const an_suspect *sp = an_anomalies_get(a, i);
		const an_flow *fw = sp->flow && sp->interval_to_ns ? an_flows_find(fl, sp->flow, NULL)
				    : NULL;

		for (size_t k = 0; fw && k < fw->nparts; k++) {
			const an_flow_part *p = &fw->parts[k];
			long ln = lane_of(l, nl, p->image, p->tid);
			int64_t lo = p->start_ns > sp->interval_from_ns ? p->start_ns
				     : sp->interval_from_ns;
			int64_t hi = p->end_ns < sp->interval_to_ns ? p->end_ns : sp->interval_to_ns;

			if (ln < 0 || hi < lo)
				continue;
			double x0 = x_of(lo, t0, span), x1 = x_of(hi, t0, span);

			fprintf(f, "<rect class=interval data-u='%s' x=%.1f y=%ld width=%.1f height=3 "
				"fill='#d00'><title>%s: when its culprit showed, +%.3f ms to +%.3f ms"
				"</title></rect>\n", fw->id, x0, ln * LANE_H + LANE_H - 3,
				x1 - x0 < 1 ? 1 : x1 - x0, fw->id,
				(double)(sp->interval_from_ns - sp->first_ns) / 1e6,
				(double)(sp->interval_to_ns - sp->first_ns) / 1e6);
		}
	}
}

static int timeline(FILE *f, an_session *s, const an_flows *fl, const an_anomalies *a)
{
	lane *l = NULL;
	size_t nl = 0, cap = 0, nparts = 0, lanes_left = 0;
	int64_t t0 = INT64_MAX, t1 = INT64_MIN;

	for (size_t i = 0; i < an_flows_count(fl); i++) {
		const an_flow *fw = an_flows_get(fl, i);

		for (size_t k = 0; k < fw->nparts; k++) {
			const an_flow_part *p = &fw->parts[k];
			const an_image *im = an_session_image(s, p->image);

			t0 = p->start_ns < t0 ? p->start_ns : t0;
			t1 = p->end_ns > t1 ? p->end_ns : t1;
			if (lane_of(l, nl, p->image, p->tid) >= 0)
				continue;
			if (nl == MAX_LANES) {
				lanes_left++;
				continue;
			}
			if (nl == cap) {
				size_t nc = cap ? 2 * cap : 32;
				lane *q = realloc(l, nc * sizeof *q);

				if (!q) {
					free(l);
					return -1;
				}
				l = q;
				cap = nc;
			}
			l[nl++] = (lane){ p->image, p->tid, p->pid, im->host ? im->host : "",
					  im->program ? im->program : "?" };
		}
	}
	if (!nl) {
		fputs("<p class=note>No flows: nothing to draw.</p>\n", f);
		free(l);
		return 0;
	}
	qsort(l, nl, sizeof *l, lane_cmp);
	int64_t span = t1 - t0;
	int height = (int)nl * LANE_H + 30;

	fprintf(f, "<p class=note>%zu thread%s, %.3f ms from the first flow's start to the last "
		"one's end; bars are flows' parts (hover for the flow), arrows messages from the "
		"send to the receive.%s</p>\n", nl, nl == 1 ? "" : "s", (double)span / 1e6,
		lanes_left ? " Threads beyond the first 400 are not drawn." : "");
	fprintf(f, "<svg id=timeline xmlns='http://www.w3.org/2000/svg' width=%d height=%d>\n"
		"<defs><marker id=ah viewBox='0 0 8 8' refX=8 refY=4 markerWidth=6 markerHeight=6 "
		"orient=auto><path d='M0,0L8,4L0,8z' fill='#333'/></marker></defs>\n",
		LABEL_W + TIMELINE_W + 10, height);
	for (size_t i = 0; i < nl; i++) {
		int y = (int)i * LANE_H;

		fprintf(f, "<g class=lane data-u='' data-p='");
		esc(f, l[i].host);
		fprintf(f, "/%" PRIu32 "' data-h='", l[i].pid);
		esc(f, l[i].host);
		fprintf(f, "'><rect x=0 y=%d width=%d height=%d fill='%s'/><text x=4 y=%d>", y,
			LABEL_W + TIMELINE_W, LANE_H, i % 2 ? "#fafafa" : "#f0f0f0", y + 13);
		if (l[i].host[0]) {
			esc(f, l[i].host);
			fputs(": ", f);
		}
		const char *base = strrchr(l[i].program, '/');

		esc(f, base ? base + 1 : l[i].program);
		fprintf(f, " %" PRIu32 "/%" PRIu32 "</text></g>\n", l[i].pid, l[i].tid);
	}
	for (size_t i = 0; i < an_flows_count(fl) && nparts < MAX_PARTS; i++) {
		const an_flow *fw = an_flows_get(fl, i);

		for (size_t k = 0; k < fw->nparts && nparts < MAX_PARTS; k++, nparts++) {
			const an_flow_part *p = &fw->parts[k];
			long ln = lane_of(l, nl, p->image, p->tid);

			if (ln < 0)
				continue;
			double x0 = x_of(p->start_ns, t0, span), x1 = x_of(p->end_ns, t0, span);

			fprintf(f, "<rect class=part data-u='%s' data-p='", fw->id);
			esc(f, l[ln].host);
			fprintf(f, "/%" PRIu32 "' data-h='", p->pid);
			esc(f, l[ln].host);
			fprintf(f, "' x=%.1f y=%ld width=%.1f height=%d fill='hsl(%u,60%%,60%%)'>"
				"<title>%s: %s, %.3f ms, %" PRIu64 " records</title></rect>\n", x0,
				ln * LANE_H + 3, x1 - x0 < 1 ? 1 : x1 - x0, LANE_H - 6, hue(fw->id),
				fw->id, fw->event, (double)(p->end_ns - p->start_ns) / 1e6, p->events);
		}
	}
	intervals(f, a, fl, l, nl, t0, span);
	for (size_t i = 0; i < an_flows_nmatches(fl) && i < MAX_ARROWS; i++) {
		const an_msg_match *m = an_flows_match(fl, i);
		long ls = lane_of(l, nl, m->send_image, m->send_tid);
		long lr = lane_of(l, nl, m->recv_image, m->recv_tid);
		int64_t a = m->send_ns, b = m->recv_ns;

		if (a == INT64_MIN || ls < 0 || lr < 0)
			continue;
		const an_flow *fw = flow_at(fl, m->send_image, m->send_tid, a);

		fprintf(f, "<line class=arrow data-u='%s' x1=%.1f y1=%ld x2=%.1f y2=%ld "
			"marker-end='url(#ah)'><title>message, %.3f ms in flight</title></line>\n",
			fw ? fw->id : "", x_of(a, t0, span), ls * LANE_H + LANE_H / 2,
			x_of(b, t0, span), lr * LANE_H + LANE_H / 2, (double)(b - a) / 1e6);
	}
	fprintf(f, "<text x=%d y=%d>0</text><text x=%d y=%d text-anchor=end>%.3f ms</text>\n",
		LABEL_W, height - 8, LABEL_W + TIMELINE_W, height - 8, (double)span / 1e6);
	fputs("</svg>\n", f);
	free(l);
	return 0;
}

/* A flow's critical path (an_flows_critical_path) as a small table. */
static void critical(FILE *f, an_session *s, const an_flows *fl, const char *id)
{
	an_crit_step *st;
	size_t n, i;
	sp_err err;

	const an_flow *fw = an_flows_find(fl, id, &i);

	if (!fw || an_flows_critical_path(fl, i, &st, &n, &err) < 0 || !n)
		return;

	fprintf(f, "<table class=crit data-u='%s'><caption>critical path of %s: where its time "
		"went</caption><tr><th>from (ms)</th><th>to (ms)</th><th>on</th></tr>\n", id, id);
	for (size_t k = 0; k < n; k++) {
		const an_image *im = an_session_image(s, st[k].image);

		fprintf(f, "<tr><td>%.3f</td><td>%.3f</td><td>", (double)(st[k].from_ns -
			fw->start_ns) / 1e6, (double)(st[k].to_ns - fw->start_ns) / 1e6);
		esc(f, im->host);
		fprintf(f, "%s%" PRIu32 "/%" PRIu32 " ", im->host[0] ? ":" : "", st[k].pid,
			st[k].tid);
		esc(f, im->program);
		fputs(st[k].via ? " &rarr;</td></tr>\n" : "</td></tr>\n", f);
	}
	fputs("</table>", f);
	free(st);
}

/* ---- the page ---- */

/* The timed diff of the most suspect flow (cli_analyze_diff), as text. */
static void timed_diff(FILE *f, an_session *s, an_session *ref, const an_anomalies *a,
		       const an_flows_opts *fo)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);

	if (!m)
		return;
	if (cli_analyze_diff(m, s, ref, a, fo) == 0 && fflush(m) == 0 && len) {
		fputs("<h2>Timed diff</h2>\n<pre id=diff>", f);
		esc(f, text);
		fputs("</pre>\n", f);
	}
	fclose(m);
	free(text);
}

static void page(FILE *f, const char *dir, an_session *s, an_session *ref,
		 const an_anomalies *a, const an_flows *fl, const an_flows_opts *fo, size_t top)
{
	int kind = an_anomalies_kind(a);
	size_t n = an_anomalies_count(a);
	char key[160];

	fputs("<!doctype html>\n<html lang=en><head><meta charset='utf-8'><title>sptrace analyze: ",
	      f);
	esc(f, dir);
	fprintf(f, "</title><style>%s</style></head><body>\n<h1>sptrace analyze: ", style);
	esc(f, dir);
	fprintf(f, "</h1>\n<p id=summary>%zu %s%s ranked, most suspect first; %zu image%s of %s. "
		"Click a row, a bar or a cause to highlight its unit (selected: <span "
		"id=selected>none</span>).</p>\n", n, kind_name(kind),
		n == 1 ? "" : kind == AN_UNITS_PROCESS ? "es" : "s", an_session_nimages(s),
		an_session_nimages(s) == 1 ? "" : "s",
		an_session_collected(s) ? "a collected session" : "a trace");
	fputs("<h2>Ranked</h2>\n<table id=ranked><thead><tr><th>#</th><th>unit</th><th>host</th>"
	      "<th>pid</th><th>score</th><th>method</th><th>verdict</th><th>culprit</th></tr>"
	      "</thead><tbody>\n", f);
	for (size_t i = 0; i < n && i < top; i++) {
		const an_suspect *u = an_anomalies_get(a, i);

		unit_key(key, sizeof key, u);
		fputs("<tr class=u data-u='", f);
		esc(f, key);
		fprintf(f, "'><td>%zu</td><td>%s ", i + 1, kind_name(u->kind));
		esc(f, u->flow ? u->flow : u->kind == AN_UNITS_HOST ? u->host : "");
		if (!u->flow && u->kind == AN_UNITS_PROCESS)
			fprintf(f, "%" PRIu32, u->pid);
		fputs("</td><td>", f);
		esc(f, u->host);
		fprintf(f, "</td><td>%" PRIu32 "</td><td>%.4g</td><td>%s</td><td>", u->pid, u->score,
			u->method);
		if (u->flagged > 0)
			fputs("<span class=flag>flagged</span>", f);
		else if (u->flagged == 0)
			fprintf(f, "<span class=ok>normal</span> (threshold %.3g)", u->threshold);
		else
			fputs("&ndash;", f);
		fputs("</td><td class=path>", f);
		if (u->npath)
			path_html(f, u->path, u->npath);
		fputs("</td></tr>\n", f);
	}
	fputs("</tbody></table>\n<h2>Culprits and causes</h2>\n", f);
	for (size_t i = 0; i < n && i < top && i < CAUSE_UNITS; i++) {
		const an_suspect *u = an_anomalies_get(a, i);

		unit_key(key, sizeof key, u);
		fputs("<div class=causes data-u='", f);
		esc(f, key);
		fprintf(f, "'><h3>%zu. %s ", i + 1, kind_name(u->kind));
		esc(f, key);
		fprintf(f, " &mdash; %s, score %.4g</h3><ol>\n", u->method, u->score);
		for (size_t k = 0; k < u->ncauses; k++) {
			const an_cause *c = &u->causes[k];

			fprintf(f, "<li><span class='kind %s'>%s</span> <span class=path>", c->kind,
				c->kind);
			path_html(f, c->path, c->npath);
			fputs("</span><div class=why>", f);
			esc(f, c->why);
			fputs("</div></li>\n", f);
		}
		fputs("</ol>", f);
		if (u->flow && fl)
			critical(f, s, fl, u->flow);
		fputs("</div>\n", f);
	}
	timed_diff(f, s, ref, a, fo);
	fputs("<h2>Timeline</h2>\n", f);
	if (fl)
		timeline(f, s, fl, a);
	fprintf(f, "<script>%s</script>\n</body></html>\n", script);
}

int cli_analyze_html(const char *path, const char *dir, an_session *s, an_session *ref,
		     const an_anomalies *a, const an_flows_opts *fo, size_t top)
{
	an_flows *fl = NULL;
	sp_err err;
	char *tmp;
	FILE *f = cli_create_beside("analyze: --html", path, &tmp);

	if (!f)
		return -1;
	if (an_flows_build_opts(s, fo, &fl, &err) != 0) {
		fprintf(stderr, "sptrace: analyze: warning: no timeline in %s: %s\n", path, err.msg);
		fl = NULL;
	}
	page(f, dir, s, ref, a, fl, fo, top);
	an_flows_free(fl);
	return cli_finish_beside("analyze: --html", f, tmp, path, 1) ? -1 : 0;
}
