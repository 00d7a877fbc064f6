/*
 * session.c — every traced image of a trace directory, or of a tree made
 * by `sptrace collect` (OUT/<host>/<pid>/...), and their records merged in
 * time order.  See analysis.h for what each promises.
 */
#include "an_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Bounds past which a tree is damaged (or hostile) rather than large. */
#define MAX_IMAGES 4096
#define MAX_DEPTH 16

typedef struct image {
	an_image pub;
	an_trace *t;             /* opened on first use */
	int failed;              /* opening it failed (a warning says why) */
	dev_t dev;
	ino_t ino;
} image;

struct an_session {
	char *dir;
	an_open_opts opt;
	int collected;
	image *imgs;
	size_t nimgs, capimgs;
	char **warn;
	size_t nwarn, capwarn;
};

__attribute__((format(printf, 2, 3)))
static void swarn(an_session *s, const char *fmt, ...)
{
	va_list ap;
	char *w;

	if (sp_grow((void **)&s->warn, &s->capwarn, s->nwarn + 1, sizeof *s->warn))
		return;
	va_start(ap, fmt);
	if (vasprintf(&w, fmt, ap) >= 0)
		s->warn[s->nwarn++] = w;
	va_end(ap);
}

static int is_dir(const char *path, struct stat *st)
{
	return lstat(path, st) == 0 && S_ISDIR(st->st_mode);
}

static int has_meta(const char *dir)
{
	char path[PATH_MAX + 300];
	struct stat st;

	snprintf(path, sizeof path, "%s/meta", dir);
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/*
 * Add the image traced in `dir` and, through its meta's exec lines, the
 * images exec'd from it: by the process itself (the same pid) or by a child
 * sharing its directory (a forked child's threads are in the image's own
 * rings, with their pid).
 *   1. An exec line's SUBDIR must be a plain name: "." or ".." or a path
 *      would lead back up the tree, round and round.
 *   2. Each directory once (device and inode), at most MAX_DEPTH deep and
 *      MAX_IMAGES in all: a damaged meta or a planted link cannot make the
 *      session endless.
 *   3. A process of a collected tree whose meta cannot be read is an image
 *      all the same (pid 0, program "?"): whoever reads it says what is
 *      wrong (an_session_trace warns), as for a single trace.
 */
static int add_image(an_session *s, const char *dir, const char *host, size_t exec_of,
		     int depth, sp_err *err)
{
	char hostbuf[256];
	struct stat st;
	an_meta *m;
	sp_err e;
	image *im;
	size_t self;
	const char *v;

	if (!is_dir(dir, &st))
		return 0;
	for (size_t i = 0; i < s->nimgs; i++)          /* step 2 */
		if (s->imgs[i].dev == st.st_dev && s->imgs[i].ino == st.st_ino) {
			swarn(s, "%s: reached twice through exec lines (a damaged meta file): "
			      "read once", dir);
			return 0;
		}
	if (s->nimgs >= MAX_IMAGES || depth > MAX_DEPTH) {
		swarn(s, "%s: more than %d images, or exec'd images %d deep: not read", dir,
		      MAX_IMAGES, MAX_DEPTH);
		return 0;
	}
	if (an_meta_read(dir, &m, &e) < 0) {
		if (!(s->collected && depth == 0)) {
			swarn(s, "%s", e.msg);
			return 0;
		}
		m = NULL;        /* step 3: an_session_trace will say why */
	}
	if (sp_grow((void **)&s->imgs, &s->capimgs, s->nimgs + 1, sizeof *s->imgs)) {
		an_meta_free(m);
		return sp_fail(err, "out of memory");
	}
	self = s->nimgs++;
	im = &s->imgs[self];
	memset(im, 0, sizeof *im);
	im->dev = st.st_dev;
	im->ino = st.st_ino;
	im->pub.exec_of = exec_of;
	im->pub.pid = (v = an_meta_get(m, TRACE_META_PID)) ? (uint32_t)strtoul(v, NULL, 10) : 0;
	if (!host) {
		snprintf(hostbuf, sizeof hostbuf, "%s", (v = an_meta_get(m, TRACE_META_HOST)) ? v : "");
		host = hostbuf;
	}
	im->pub.dir = strdup(dir);
	im->pub.host = strdup(host);
	im->pub.program = strdup((v = an_meta_get(m, TRACE_META_PROGRAM)) ? v : "?");
	if (!im->pub.dir || !im->pub.host || !im->pub.program) {
		an_meta_free(m);
		return sp_fail(err, "out of memory");
	}
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		char sub[256], failed[256], path[PATH_MAX];
		int failed_too = 0;

		if (strcmp(an_meta_key(m, l), TRACE_META_EXEC) != 0 ||
		    sscanf(an_meta_val(m, l), "%255s", sub) != 1)
			continue;
		if (strchr(sub, '/') || strcmp(sub, ".") == 0 || strcmp(sub, "..") == 0) {
			swarn(s, "%s/meta: exec line names '%s', not a subdirectory of the trace: "
			      "ignored (a damaged meta file)", dir, sub);     /* step 1 */
			continue;
		}
		for (size_t k = l + 1; k < an_meta_nlines(m); k++)
			if (strcmp(an_meta_key(m, k), TRACE_META_EXEC_FAILED) == 0 &&
			    sscanf(an_meta_val(m, k), "%255s", failed) == 1 && strcmp(failed, sub) == 0)
				failed_too = 1;
		if (failed_too || (size_t)snprintf(path, sizeof path, "%s/%s", dir, sub) >= sizeof path)
			continue;
		snprintf(hostbuf, sizeof hostbuf, "%s", s->imgs[self].pub.host);
		if (add_image(s, path, hostbuf, self, depth + 1, err) < 0) {
			an_meta_free(m);
			return -1;
		}
	}
	an_meta_free(m);
	return 0;
}

static int not_hidden(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Process directories by pid, then by name (as cli/collected.c shows them). */
static int by_pid(const struct dirent **a, const struct dirent **b)
{
	long x = strtol((*a)->d_name, NULL, 10), y = strtol((*b)->d_name, NULL, 10);

	return x != y ? (x < y ? -1 : 1) : strcmp((*a)->d_name, (*b)->d_name);
}

/* OUT/<host>/<pid>: hosts by name, processes by pid; links not followed. */
static int add_collected(an_session *s, sp_err *err)
{
	struct dirent **hosts = NULL;
	int nh = scandir(s->dir, &hosts, not_hidden, alphasort), rc = 0;

	for (int i = 0; i < nh; i++) {
		char hdir[PATH_MAX];
		struct dirent **procs = NULL;
		struct stat st;
		int np;

		snprintf(hdir, sizeof hdir, "%s/%s", s->dir, hosts[i]->d_name);
		np = is_dir(hdir, &st) ? scandir(hdir, &procs, not_hidden, by_pid) : 0;
		for (int j = 0; j < np; j++) {
			char pdir[PATH_MAX + 256];

			snprintf(pdir, sizeof pdir, "%s/%s", hdir, procs[j]->d_name);
			if (!rc && is_dir(pdir, &st) && has_meta(pdir))
				rc = add_image(s, pdir, hosts[i]->d_name, AN_NONE, 0, err);
			free(procs[j]);
		}
		free(procs);
		free(hosts[i]);
	}
	free(hosts);
	return rc;
}

int an_session_open(const char *dir, const an_open_opts *opt, an_session **out, sp_err *err)
{
	an_session *s;
	struct stat st;

	*out = NULL;
	if (stat(dir, &st) < 0)
		return sp_fail(err, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return sp_fail(err, "%s: not a directory (a trace directory, or a tree made by "
			       "'sptrace collect')", dir);
	if (!(s = calloc(1, sizeof *s)) || !(s->dir = strdup(dir))) {
		free(s);
		return sp_fail(err, "out of memory");
	}
	if (opt)
		s->opt = *opt;
	s->collected = !has_meta(dir);
	if ((s->collected ? add_collected(s, err) : add_image(s, dir, NULL, AN_NONE, 0, err)) < 0)
		goto fail;
	if (!s->nimgs) {
		if (!s->collected && s->nwarn)
			sp_fail(err, "%s", s->warn[0]);       /* why its meta cannot be read */
		else
			sp_fail(err, "%s: no trace there: neither a trace directory (no %s/meta) "
				"nor a tree made by 'sptrace collect' (no HOST/PID/meta below)",
				dir, dir);
		goto fail;
	}
	*out = s;
	return 0;
fail:
	an_session_close(s);
	return -1;
}

void an_session_close(an_session *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->nimgs; i++) {
		an_trace_close(s->imgs[i].t);
		free((char *)s->imgs[i].pub.dir);
		free((char *)s->imgs[i].pub.host);
		free((char *)s->imgs[i].pub.program);
	}
	free(s->imgs);
	for (size_t i = 0; i < s->nwarn; i++)
		free(s->warn[i]);
	free(s->warn);
	free(s->dir);
	free(s);
}

int an_session_collected(const an_session *s) { return s->collected; }
size_t an_session_nimages(const an_session *s) { return s->nimgs; }
size_t an_session_nwarnings(const an_session *s) { return s->nwarn; }

const an_image *an_session_image(const an_session *s, size_t i)
{
	return i < s->nimgs ? &s->imgs[i].pub : NULL;
}

const char *an_session_warning(const an_session *s, size_t i)
{
	return i < s->nwarn ? s->warn[i] : NULL;
}

void an_session_lost(an_session *s, an_lost *l)
{
	memset(l, 0, sizeof *l);
	for (size_t i = 0; i < s->nimgs; i++)
		an_dir_lost_add(s->imgs[i].pub.dir, l);
}

an_trace *an_session_trace(an_session *s, size_t i)
{
	image *im;
	sp_err e;

	if (i >= s->nimgs)
		return NULL;
	im = &s->imgs[i];
	if (!im->t && !im->failed && an_trace_open_opts(im->pub.dir, &s->opt, &im->t, &e) < 0) {
		im->failed = 1;
		swarn(s, "%s", e.msg);
	}
	return im->t;
}

/* ------------------------------------------------------------------------ */
/* Records of every thread of every image, in time order                    */
/* ------------------------------------------------------------------------ */

/*
 * A heap of the threads' next records, keyed by CLOCK_REALTIME nanoseconds
 * (each image's own clock: the TSCs of two hosts are not comparable, their
 * realtime clocks roughly are), then by image and thread, so that the order
 * is the same on every run.  One open iterator per thread.
 */
typedef struct head {
	an_iter *it;
	size_t image;
	const an_thread *th;
	an_record rec;
	int64_t ns;
} head;

struct an_merge {
	an_session *s;
	head *h;
	size_t n;
};

static int head_less(const head *a, const head *b)
{
	if (a->ns != b->ns)
		return a->ns < b->ns;
	if (a->image != b->image)
		return a->image < b->image;
	return a->th->tid < b->th->tid;
}

static void sift_down(an_merge *m, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, min = i;
		head tmp;

		if (l < m->n && head_less(&m->h[l], &m->h[min]))
			min = l;
		if (r < m->n && head_less(&m->h[r], &m->h[min]))
			min = r;
		if (min == i)
			return;
		tmp = m->h[i];
		m->h[i] = m->h[min];
		m->h[min] = tmp;
		i = min;
	}
}

int an_merge_open(an_session *s, an_merge **out, sp_err *err)
{
	an_merge *m = calloc(1, sizeof *m);
	size_t cap = 0;

	*out = NULL;
	if (!m)
		return sp_fail(err, "out of memory");
	m->s = s;
	for (size_t i = 0; i < s->nimgs; i++) {
		an_trace *t = an_session_trace(s, i);

		for (size_t k = 0; t && k < an_trace_nthreads(t); k++) {
			head hd = { .image = i, .th = an_trace_thread(t, k) };

			if (an_iter_open(t, hd.th, &hd.it, err) < 0) {
				an_merge_close(m);
				return -1;
			}
			if (!an_iter_next(hd.it, &hd.rec)) {
				an_iter_close(hd.it);
				continue;
			}
			hd.ns = an_realtime_ns(t, hd.rec.tsc);
			if (sp_grow((void **)&m->h, &cap, m->n + 1, sizeof *m->h)) {
				an_iter_close(hd.it);
				an_merge_close(m);
				return sp_fail(err, "out of memory");
			}
			m->h[m->n++] = hd;
		}
	}
	for (size_t i = m->n / 2; i-- > 0; )
		sift_down(m, i);
	*out = m;
	return 0;
}

int an_merge_next(an_merge *m, an_event *ev)
{
	head *top;

	if (!m->n)
		return 0;
	top = &m->h[0];
	ev->image = top->image;
	ev->thread = top->th;
	ev->rec = top->rec;
	ev->ns = top->ns;
	if (an_iter_next(top->it, &top->rec)) {
		top->ns = an_realtime_ns(m->s->imgs[top->image].t, top->rec.tsc);
	} else {
		an_iter_close(top->it);
		m->h[0] = m->h[--m->n];
	}
	sift_down(m, 0);
	return 1;
}

void an_merge_close(an_merge *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++)
		an_iter_close(m->h[i].it);
	free(m->h);
	free(m);
}
