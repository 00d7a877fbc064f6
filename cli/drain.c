/*
 * drain.c — `sptrace run` keeps every record: it copies each thread's ring
 * into seg.<tid> (trace_format.h) before the ring comes round to them.
 *
 * The agent writes its rings without locks or system calls and never waits
 * for a reader, so the drain has to follow a writer that may overwrite what
 * it is saving.  One drain of a ring:
 *
 *   1. c = count (acquire).  A writer takes index i (count++) before it
 *      stores record i, so the newest few slots may still hold the previous
 *      lap's records: drain only up to c - LAG (the owner thread, a signal
 *      handler nested in it and an event written by another thread each
 *      hold at most one reservation taken but not yet written: one slot, or
 *      a message event's five).
 *   2. Copy the slots of indices [from, upto), from = where the last drain
 *      stopped (or upto - capacity if the ring came round past it: the
 *      records in between are lost, and the reader counts the gap).
 *   3. c2 = count again (acquire): a record of index i was overwritten
 *      while it was copied only if i < c2 - capacity.  Those copies are
 *      dropped; the rest is written as one chunk, header and records in one
 *      pwritev.  (Writing straight from the mapping, or copy_file_range
 *      from the ring file, measured slower: the copy is made while the
 *      writer's cache lines are hot.)
 *
 * The ring itself keeps the newest records, so the final state needs no
 * last drain: the reader takes the chunks, then the ring from where they
 * end.  Rings appear while the program runs (threads, forked children, and
 * exec'd images in DIR/exec.* and DIR/spawn.*): the directory is looked at
 * again every few polls.  Processes that outlive `sptrace run` (a daemon)
 * go on in flight-recorder mode.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sp.h"
#include "trace_format.h"

#define LAG 256                    /* records left to the writers (step 1) */
#define COPY_MAX (1u << 20)        /* records per chunk */

typedef struct ring {
	char path[PATH_MAX];
	const trace_ring_header *h; /* mapped, with its records */
	size_t size;
	int seg;                    /* seg.<tid>, opened at the first chunk; -2 given up */
	off_t off;                  /* its size */
	uint64_t drained;           /* index after the last record drained */
} ring;

struct cli_drain {
	char dir[PATH_MAX];
	ring *r;
	size_t n, cap;
	unsigned polls;
	uint64_t *buf;              /* COPY_MAX records */
	int failed;                 /* a write failed: said once */
};

static int known(const cli_drain *d, const char *path)
{
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->r[i].path, path) == 0)
			return 1;
	return 0;
}

/* Map a ring once its header is complete (the agent fills it after the
 * file is sized). */
static void add_ring(cli_drain *d, const char *path)
{
	trace_ring_header h;
	struct stat st;
	void *map;
	ring *r;
	int fd;

	if (known(d, path) || (fd = sp_open_regular(path, 1)) < 0)
		return;         /* not yet there, or not a ring the agent made (a link, a FIFO) */
	if (fstat(fd, &st) < 0 || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
	    h.magic != TRACE_RING_MAGIC || h.capacity == 0 || (h.capacity & (h.capacity - 1)) ||
	    h.capacity > ((uint64_t)st.st_size - TRACE_RING_HEADER_SIZE) / 8 ||
	    (map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		close(fd);
		return;
	}
	close(fd);
	if (d->n == d->cap) {
		size_t ncap = d->cap ? 2 * d->cap : 16;
		ring *nr = realloc(d->r, ncap * sizeof *nr);

		if (!nr) {
			munmap(map, (size_t)st.st_size);
			return;
		}
		d->r = nr;
		d->cap = ncap;
	}
	r = &d->r[d->n++];
	memset(r, 0, sizeof *r);
	snprintf(r->path, sizeof r->path, "%s", path);
	r->h = map;
	r->size = (size_t)st.st_size;
	r->seg = -1;
}

/* ring.<tid> files in dir and in its exec.* / spawn.* subdirectories. */
static void scan(cli_drain *d, const char *dir, int depth)
{
	DIR *dd = opendir(dir);
	struct dirent *de;
	char path[PATH_MAX];

	if (!dd)
		return;
	while ((de = readdir(dd))) {
		if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= sizeof path)
			continue;
		if (strncmp(de->d_name, "ring.", 5) == 0)
			add_ring(d, path);
		else if (depth < 16 && (strncmp(de->d_name, "exec.", 5) == 0 ||
					strncmp(de->d_name, "spawn.", 6) == 0))
			scan(d, path, depth + 1);
	}
	closedir(dd);
}

static int seg_open(cli_drain *d, ring *r)
{
	char path[PATH_MAX], dir[PATH_MAX];
	const char *base = strrchr(r->path, '/');
	size_t dirlen = (size_t)(base - r->path);

	snprintf(path, sizeof path, "%.*s/seg.%s", (int)dirlen, r->path, base + 1 + 5);
	snprintf(dir, sizeof dir, "%.*s", (int)dirlen, r->path);
	r->seg = cli_trace_file(dir, path + dirlen + 1, O_WRONLY | O_TRUNC);
	if (r->seg < 0 && !d->failed++)
		cli_error("run: cannot create %s: %s; records overwritten in the ring from now on "
			  "are lost", path, strerror(errno));
	return r->seg < 0 ? -1 : 0;
}

static void give_up(cli_drain *d, ring *r, const char *what)
{
	if (!d->failed++)
		cli_error("run: cannot %s the records drained from %s: %s; the trace keeps what "
			  "the ring still holds", what, r->path, strerror(errno));
	if (r->seg >= 0) {
		if (ftruncate(r->seg, r->off) < 0)      /* no chunk half-written */
			cli_error("run: %s: a partly written chunk is left at its end (the reader "
				  "ignores it)", r->path);
		close(r->seg);
	}
	r->seg = -2;
}

/* Steps 1-3 of the protocol above, for one ring, in chunks of COPY_MAX.
 * Returns how many records it saved. */
static uint64_t drain_ring(cli_drain *d, ring *r, bool all)
{
	const uint64_t *slots = (const uint64_t *)((const char *)r->h + TRACE_RING_HEADER_SIZE);
	uint64_t cap = r->h->capacity, mask = cap - 1, saved = 0;
	uint64_t c = __atomic_load_n(&r->h->count, __ATOMIC_ACQUIRE);
	uint64_t upto = c > LAG ? c - LAG : 0;

	/* Big chunks: a ring an eighth full waits for the next poll. */
	if (!all && upto - r->drained < cap / 8)
		return 0;

	while (upto > r->drained && r->seg != -2) {
		uint64_t from = r->drained, end, c2, valid, epoch;
		trace_seg_chunk ch;
		struct iovec iov[2];
		size_t n;

		if (upto - from > cap)
			from = upto - cap;
		end = upto - from > COPY_MAX ? from + COPY_MAX : upto;
		epoch = __atomic_load_n(&r->h->epoch, __ATOMIC_ACQUIRE);
		for (uint64_t i = from; i < end;) {     /* one or two ranges of slots */
			uint64_t slot = i & mask, k = end - i < cap - slot ? end - i : cap - slot;

			memcpy(d->buf + (i - from), slots + slot, k * 8);
			i += k;
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		c2 = __atomic_load_n(&r->h->count, __ATOMIC_ACQUIRE);
		valid = c2 > cap && c2 - cap > from ? c2 - cap : from;
		r->drained = end;
		if (valid >= end)                       /* all overwritten meanwhile */
			continue;
		n = (size_t)(end - valid);
		ch = (trace_seg_chunk){ TRACE_SEG_MAGIC, valid, n, epoch };
		if (r->seg < 0 && seg_open(d, r) < 0) {
			r->seg = -2;
			return saved;
		}
		iov[0] = (struct iovec){ &ch, sizeof ch };
		iov[1] = (struct iovec){ d->buf + (valid - from), n * 8 };
		if (pwritev(r->seg, iov, 2, r->off) != (ssize_t)(sizeof ch + n * 8)) {
			give_up(d, r, "save");
			return saved;
		}
		r->off += (off_t)(sizeof ch + n * 8);
		saved += n;
	}
	return saved;
}

cli_drain *cli_drain_start(const char *dir)
{
	cli_drain *d = calloc(1, sizeof *d);

	if (!d || !(d->buf = malloc(COPY_MAX * sizeof *d->buf))) {
		free(d);
		return NULL;
	}
	snprintf(d->dir, sizeof d->dir, "%s", dir);
	return d;
}

int cli_drain_poll(cli_drain *d)
{
	uint64_t saved = 0;

	if (!d)
		return 0;
	if (d->polls++ % 32 == 0)
		scan(d, d->dir, 0);
	for (size_t i = 0; i < d->n; i++)
		saved += drain_ring(d, &d->r[i], false);
	return saved > 0;
}

void cli_drain_end(cli_drain *d)
{
	if (!d)
		return;
	scan(d, d->dir, 0);
	for (size_t i = 0; i < d->n; i++) {
		drain_ring(d, &d->r[i], true);
		if (d->r[i].seg >= 0)
			close(d->r[i].seg);
		munmap((void *)d->r[i].h, d->r[i].size);
	}
	free(d->r);
	free(d->buf);
	free(d);
}
