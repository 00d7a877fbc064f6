/*
 * trace.c — an_trace_open/close, the trace's accessors, clocks and the
 * helpers for printers. See analysis.h for what each promises.
 */
#include "an_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* The trace                                                                 */
/* ------------------------------------------------------------------------ */


/* Remember a warning (printf style).  Out of memory loses the warning only. */
__attribute__((format(printf, 2, 3)))
void an_warn(an_trace *t, const char *fmt, ...)
{
	va_list ap;
	char *s;

	if (sp_grow((void **)&t->warn, &t->capwarn, t->nwarn + 1, sizeof *t->warn))
		return;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) >= 0)
		t->warn[t->nwarn++] = s;
	va_end(ap);
}

const char *an_trace_dir(const an_trace *t) { return t->dir; }
size_t an_trace_nwarnings(const an_trace *t) { return t->nwarn; }
const char *an_trace_warning(const an_trace *t, size_t i) { return i < t->nwarn ? t->warn[i] : NULL; }
size_t an_trace_nmodules(const an_trace *t) { return t->nmods; }
size_t an_trace_nthreads(const an_trace *t) { return t->nthreads; }
size_t an_nsites(const an_trace *t) { return t->nsites; }
size_t an_nfuncs(const an_trace *t) { return t->nfuncs; }
uint64_t an_trace_start_tsc(const an_trace *t) { return t->start_tsc; }

const an_module *an_trace_module(const an_trace *t, size_t i)
{
	return i < t->nmods ? &t->mods[i].pub : NULL;
}

const an_thread *an_trace_thread(const an_trace *t, size_t i)
{
	return i < t->nthreads ? &t->threads[i] : NULL;
}

const an_thread *an_trace_thread_by_tid(const an_trace *t, uint32_t tid)
{
	for (size_t i = 0; i < t->nthreads; i++)
		if (t->threads[i].tid == tid)
			return &t->threads[i];
	return NULL;
}

const an_func *an_func_get(const an_trace *t, uint32_t i)
{
	return i < t->nfuncs ? t->funcs[i] : NULL;
}

const char *an_trace_meta(const an_trace *t, const char *key)
{
	return an_meta_get(t->meta, key);
}

/* Read a whole small regular file (never a FIFO, a device or a link: see
 * sp_open_regular).  0 and *buf (NUL-terminated) or -1 with errno. */
int an_slurp(const char *path, size_t max, char **buf, size_t *len)
{
	struct stat st = { 0 };
	int fd = sp_open_regular(path, 1);
	size_t got = 0;

	*buf = NULL;
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size > max) {
		int e = (uint64_t)st.st_size > max ? EFBIG : errno;

		close(fd);
		errno = e;
		return -1;
	}
	*buf = malloc((size_t)st.st_size + 1);
	if (!*buf) {
		close(fd);
		errno = ENOMEM;
		return -1;
	}
	/* No more than fstat said: a file growing meanwhile is read as it was. */
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, *buf + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	(*buf)[got] = '\0';
	*len = got;
	return 0;
}

const char *an_errno_text(int e)
{
	if (e == EFBIG)
		return "implausibly large";
	return sp_open_why(e);
}


/* ------------------------------------------------------------------------ */
/* Open and close                                                            */
/* ------------------------------------------------------------------------ */

int an_trace_open(const char *dir, an_trace **out, sp_err *err)
{
	return an_trace_open_opts(dir, NULL, out, err);
}

int an_trace_open_opts(const char *dir, const an_open_opts *opt, an_trace **out, sp_err *err)
{
	an_open_opts none = { 0 };
	an_trace *t;
	struct stat st;

	*out = NULL;
	if (!opt)
		opt = &none;
	if (strlen(dir) > PATH_MAX - 64)
		return sp_fail(err, "%.100s...: path too long", dir);
	if (stat(dir, &st) < 0)
		return sp_fail(err, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return sp_fail(err, "%s: not a directory (a trace is a directory holding meta, "
			       "sites and ring.<tid> files)", dir);
	if (opt->demangle < AN_DEMANGLE_SIMPLE || opt->demangle > AN_DEMANGLE_NO)
		return sp_fail(err, "demangle style %d is not an enum an_demangle", opt->demangle);
	t = calloc(1, sizeof *t);
	if (!t || !(t->dir = strdup(dir))) {
		free(t);
		return sp_fail(err, "out of memory");
	}
	t->demangle = opt->demangle;
	/* The files first, so that a damaged one is reported before the
	 * modules are analysed (seconds for a large library). */
	if (an_read_meta(t, err) < 0 || an_read_sites(t, err) < 0 || an_read_channels(t, err) < 0 ||
	    an_read_rings(t, err) < 0)
		goto fail;
	if (!opt->no_modules)
		for (size_t i = 0; i < t->nmods; i++)
			an_load_module(t, &t->mods[i], opt->repo);
	if (an_name_sites(t, err) < 0)
		goto fail;
	*out = t;
	return 0;
fail:
	an_trace_close(t);
	return -1;
}

void an_trace_close(an_trace *t)
{
	if (!t)
		return;
	an_meta_free(t->meta);
	for (size_t i = 0; i < t->nmods; i++)
		an_module_free(&t->mods[i]);
	free(t->mods);
	for (size_t i = 1; i < t->nsites; i++)
		free((char *)t->sites[i].src);
	free(t->sites);
	free(t->raw_sites);
	for (size_t i = 0; i < t->nbad; i++)
		free(t->bad[i]);
	free(t->bad);
	free(t->bad_many);
	an_map_free(&t->bad_ids);
	for (size_t i = 0; i < t->nfuncs; i++) {
		free((char *)t->funcs[i]->name);
		free((char *)t->funcs[i]->src);
		free(t->funcs[i]);
	}
	free(t->funcs);
	an_map_free(&t->func_ids);
	for (size_t i = 0; i < t->ndemangled; i++)
		free(t->demangled[i]);
	free(t->demangled);
	an_map_free(&t->demangled_ids);
	for (size_t i = 0; i < t->nthreads; i++)
		free((char *)t->threads[i].path);
	free(t->threads);
	for (size_t i = 0; i < t->nwarn; i++)
		free(t->warn[i]);
	free(t->warn);
	free(t->chans);
	free(t->msgs);
	free(t->values);
	free(t->budget);
	free(t->dir);
	free(t);
}


/* ------------------------------------------------------------------------ */
/* Clocks                                                                    */
/* ------------------------------------------------------------------------ */

static __int128 ticks_ns(const an_trace *t, __int128 ticks)
{
	return ticks * 1000000000 / (__int128)t->tsc_hz;
}

static int64_t clamp64(__int128 v)
{
	return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (int64_t)v;
}

uint64_t an_tsc_ns(const an_trace *t, uint64_t a, uint64_t b)
{
	__int128 ns = b > a ? ticks_ns(t, (__int128)(b - a)) : 0;

	return ns > (__int128)UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}

int64_t an_realtime_ns(const an_trace *t, uint64_t tsc)
{
	return clamp64(t->real0 + t->align_ns + ticks_ns(t, (__int128)tsc - (__int128)t->tsc0));
}

int64_t an_monotonic_ns(const an_trace *t, uint64_t tsc)
{
	return clamp64(t->mono0 + ticks_ns(t, (__int128)tsc - (__int128)t->tsc0));
}


/* ------------------------------------------------------------------------ */
/* For printers                                                              */
/* ------------------------------------------------------------------------ */

int an_select_threads(const an_trace *t, const char *list, unsigned char *sel, sp_err *err)
{
	const char *p = list;

	memset(sel, 0, t->nthreads);
	for (;;) {
		char *end;
		unsigned long long tid;
		int found = 0;

		if (!isdigit((unsigned char)*p))
			return sp_fail(err, "'%s' is not a thread id or a comma-separated list of them",
				       list);
		errno = 0;
		tid = strtoull(p, &end, 10);
		if (errno || tid > UINT32_MAX || (*end && *end != ','))
			return sp_fail(err, "'%s' is not a thread id or a comma-separated list of them",
				       list);
		for (size_t i = 0; i < t->nthreads; i++)
			if (t->threads[i].tid == tid)
				sel[i] = found = 1;
		if (!found) {
			char have[256] = "";
			size_t len = 0;

			for (size_t i = 0; i < t->nthreads && len + 16 < sizeof have; i++)
				len += (size_t)snprintf(have + len, sizeof have - len, "%s%u",
							i ? ", " : "", t->threads[i].tid);
			if (t->nthreads && len + 16 >= sizeof have)
				snprintf(have + len, sizeof have - len, ", ...");
			return sp_fail(err, "%s: no thread %llu in this trace (it has %s)", t->dir, tid,
				       t->nthreads ? have : "none");
		}
		if (!*end)
			return 0;
		p = end + 1;
	}
}

char *an_fmt_duration(uint64_t ns, char buf[24])
{
	if (ns < 1000000ull)
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 " us", ns / 1000, ns % 1000);
	else if (ns < 1000000000ull)
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 " ms", ns / 1000000,
			 ns / 1000 % 1000);
	else
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 "  s", ns / 1000000000,
			 ns / 1000000 % 1000);
	return buf;
}

