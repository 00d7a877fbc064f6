/*
 * export_chrome.c — `sptrace export --format chrome`: the Trace Event
 * Format's JSON ({"traceEvents":[...]}), for chrome://tracing, speedscope
 * and Perfetto's legacy importer.
 *
 * Every event has name, ph, ts, pid and tid.  A call is one complete event
 * ("X") with its duration, written when it begins (export.h gives its end
 * then); events and messages are instants ("i", thread scope); a matched
 * message also gets a flow start ("s") at the send and a flow end ("f",
 * bound to the enclosing slice) at the receive, which chrome://tracing
 * draws and Perfetto ignores.  Times are microseconds from the earliest
 * record of the session, written from integer nanoseconds with three
 * decimals: exact, so nesting in nanoseconds stays nesting in the file.
 */
#include "an_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>

/* Tracks are known by uuid in export.h; the JSON wants pid and tid: kept
 * per track (cmd_export.c numbers tracks from 1, densely). */
typedef struct track {
	int32_t pid, tid;
} track;

struct ex_writer {
	FILE *out;
	int64_t base;
	uint64_t bytes, max;
	int n;                   /* events written: a comma before the next */
	track *tracks;
	size_t ntracks;
};

static int put(ex_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int put(ex_writer *w, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vfprintf(w->out, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -1;
	w->bytes += (uint64_t)n;
	if (w->max && w->bytes > w->max)
		return errno = EFBIG, -1;
	return 0;
}

static int put_str(ex_writer *w, const char *s)
{
	if (put(w, "\"") < 0)
		return -1;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if ((*p == '"' || *p == '\\' ? put(w, "\\%c", *p)
		     : *p < 0x20 || *p == 0x7f ? put(w, "\\u%04x", *p) : put(w, "%c", *p)) < 0)
			return -1;
	return put(w, "\"");
}

/* "12.345" µs for ns nanoseconds (never negative: clamped). */
static int put_us(ex_writer *w, int64_t ns)
{
	if (ns < 0)
		ns = 0;
	return put(w, "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
}

/* The start of an event: {"name":NAME,"ph":PH,"ts":T,"pid":P,"tid":T */
static int head(ex_writer *w, const char *name, const char *ph, int64_t t, int32_t pid,
		int32_t tid)
{
	if (put(w, "%s\n{\"name\":", w->n++ ? "," : "") < 0 || put_str(w, name) < 0 ||
	    put(w, ",\"ph\":\"%s\",\"ts\":", ph) < 0 || put_us(w, t - w->base) < 0)
		return -1;
	return put(w, ",\"pid\":%" PRId32 ",\"tid\":%" PRId32, pid, tid);
}

static ex_writer *ch_open(FILE *out, int64_t base_ns, uint64_t max_bytes)
{
	ex_writer *w = calloc(1, sizeof *w);

	if (!w)
		return NULL;
	w->out = out;
	w->base = base_ns;
	w->max = max_bytes;
	if (put(w, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[") < 0) {
		free(w);
		return NULL;
	}
	return w;
}

static int remember(ex_writer *w, uint64_t uuid, int32_t pid, int32_t tid)
{
	if (uuid >= w->ntracks) {
		size_t n = uuid * 2 + 16;
		track *t = realloc(w->tracks, n * sizeof *t);

		if (!t)
			return -1;
		for (size_t i = w->ntracks; i < n; i++)
			t[i] = (track){ 0, 0 };
		w->tracks = t;
		w->ntracks = n;
	}
	w->tracks[uuid] = (track){ pid, tid };
	return 0;
}

static int ch_process(ex_writer *w, uint64_t uuid, int32_t pid, const char *name)
{
	if (remember(w, uuid, pid, pid) < 0 ||
	    head(w, "process_name", "M", w->base, pid, pid) < 0 ||
	    put(w, ",\"args\":{\"name\":") < 0 || put_str(w, name) < 0)
		return -1;
	return put(w, "}}");
}

static int ch_thread(ex_writer *w, uint64_t uuid, uint64_t process_uuid, int32_t pid,
		     int32_t tid, const char *name)
{
	if (remember(w, uuid, pid, tid) < 0 || head(w, "thread_name", "M", w->base, pid, tid) < 0 ||
	    put(w, ",\"args\":{\"name\":") < 0 || put_str(w, name) < 0)
		return -1;
	return put(w, "}}");
}

/* A flow's events name it in their args ("flow":"f3"). */
static int put_flow(ex_writer *w, uint64_t corr)
{
	return corr ? put(w, ",\"args\":{\"flow\":\"f%" PRIu64 "\"}", corr) : 0;
}

static int ch_begin(ex_writer *w, uint64_t uuid, const char *name, int64_t t0, int64_t t1,
		    uint64_t corr)
{
	const track *t = &w->tracks[uuid];

	if (head(w, name, "X", t0, t->pid, t->tid) < 0 ||
	    put(w, ",\"cat\":\"call\",\"dur\":") < 0 || put_us(w, t1 - t0) < 0 ||
	    put_flow(w, corr) < 0)
		return -1;
	return put(w, "}");
}

static int ch_end(ex_writer *w, uint64_t track, int64_t t1)
{
	return 0;
}

static int ch_instant(ex_writer *w, uint64_t uuid, const char *name, int64_t ts,
		      uint64_t corr, const uint64_t *out, size_t nout, const uint64_t *in,
		      size_t nin)
{
	const track *t = &w->tracks[uuid];

	if (head(w, name, "i", ts, t->pid, t->tid) < 0 ||
	    put(w, ",\"cat\":\"event\",\"s\":\"t\"") < 0 || put_flow(w, corr) < 0 ||
	    put(w, "}") < 0)
		return -1;
	for (size_t i = 0; i < nout; i++)
		if (head(w, "message", "s", ts, t->pid, t->tid) < 0 ||
		    put(w, ",\"cat\":\"message\",\"id\":%" PRIu64 "}", out[i]) < 0)
			return -1;
	for (size_t i = 0; i < nin; i++)
		if (head(w, "message", "f", ts, t->pid, t->tid) < 0 ||
		    put(w, ",\"cat\":\"message\",\"bp\":\"e\",\"id\":%" PRIu64 "}", in[i]) < 0)
			return -1;
	return 0;
}

static int ch_close(ex_writer *w)
{
	int rc = put(w, "\n]}\n");

	free(w->tracks);
	free(w);
	return rc;
}

static uint64_t ch_bytes(const ex_writer *w) { return w->bytes; }

const ex_format ex_chrome = {
	"chrome", 12, ch_open, ch_process, ch_thread, ch_begin, ch_end, ch_instant, ch_close,
	ch_bytes,
};
