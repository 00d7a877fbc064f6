/*
 * rings.c — ring headers and the chunks `sptrace run` drained (seg.<tid>).
 * See analysis.h for what each promises.
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
/* Ring headers                                                              */
/* ------------------------------------------------------------------------ */

int an_read_full(int fd, void *buf, size_t len, off_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t r = pread(fd, (char *)buf + got, len - got, off + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0) {
			errno = EIO;   /* shrank since fstat */
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

/* Slot i of the ring is all zero: never written (the agent writes no zero
 * record: kind ENTRY needs a site id, and id 0 is none). */
static int slot_zero(int fd, const trace_ring_header *h, uint64_t i)
{
	uint64_t r;

	return an_read_full(fd, &r, 8, (off_t)(h->header_size + i * 8)) == 0 && r == 0;
}

/* Slots of the file a reader may look at: the ring's, or in the layout
 * that keeps every record, as many as the file holds (trace_format.h). */
static uint64_t file_slots(const trace_ring_header *h, uint64_t size)
{
	if (!h->chunk)
		return h->capacity;
	return size > h->header_size ? (size - h->header_size) / 8 : 0;
}

/*
 * The count the ring's records bear out.  The agent takes slots in order, so
 * the newest records are written: a count whose newest slot and the one
 * before are both zero says more than was ever written -- a corrupt count
 * (a flipped bit made a 4-record ring claim 131076, and a replay of 535 MB
 * of "?site 0").  A single zero is allowed: a crash between taking a slot and
 * filling it leaves that hole.  A ring that came round (count > capacity)
 * has written every slot, so there its last two slots are the test.  Then
 * the count is one past the last slot written.  Reads only two slots unless
 * the count is wrong.
 */
static uint64_t ring_written(int fd, const trace_ring_header *h, uint64_t slots, uint64_t floor)
{
	uint64_t top = h->count > slots ? slots : h->count, buf[1024];

	if (top <= floor || !slot_zero(fd, h, top - 1) || (top > floor + 1 && !slot_zero(fd, h, top - 2)))
		return h->count;        /* (a file of every record cut short keeps its last
					 * slots written: its count stands, the rest is lost;
					 * records below floor are in packed.<tid>) */
	while (top > floor) {
		uint64_t n = top < 1024 ? top : 1024;

		if (n > top - floor)
			n = top - floor;
		if (an_read_full(fd, buf, n * 8, (off_t)(h->header_size + (top - n) * 8)) < 0)
			return h->count;        /* shrank: the caller's read says so */
		for (uint64_t i = n; i > 0; i--)
			if (buf[i - 1])
				return top - n + i;
		top -= n;
	}
	return floor;
}

/* The records of a file of every record that packed.<tid> holds
 * (trace_format.h, "Packed blocks"): the end of its valid blocks, from
 * their headers. */
static uint64_t packed_end(const char *path)
{
	pack_data pd;
	sp_err e;
	uint64_t end;

	if (an_pack_scan(path, &pd, 0, -1, &e) < 0)
		return 0;
	end = pd.end;
	an_pack_free(&pd);
	return end;
}

/* Open a ring file and check its header against its size.  -2: an empty
 * ring (the agent was making it when the process died), to be skipped.
 * *said: the header's count when the records show it wrong (h->count is
 * then the count they bear out, see ring_written), else equal to it. */
int an_ring_open(const char *path, trace_ring_header *h, uint64_t *said, sp_err *err)
{
	struct stat st;
	int fd = sp_open_regular(path, 1);
	uint64_t need, pend, slots;

	if (fd < 0)
		return sp_fail(err, "%s: cannot open: %s", path, sp_open_why(errno));
	if (fstat(fd, &st) < 0) {
		int e = errno;

		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(e));
	}
	if (st.st_size == 0) {
		close(fd);
		return -2;      /* made, never sized: the process died right there */
	}
	if ((uint64_t)st.st_size < RING_FIXED_HEADER) {
		close(fd);
		return sp_fail(err, "%s: truncated: %lld bytes, shorter than a ring header (%zu)",
			       path, (long long)st.st_size, (size_t)RING_FIXED_HEADER);
	}
	memset(h, 0, sizeof *h);
	if (an_read_full(fd, h, RING_FIXED_HEADER, 0) < 0) {
		int e = errno;
		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(e));
	}
	if (h->magic == 0 && h->count == 0) {
		close(fd);
		return -2;      /* sized, header not yet written: likewise */
	}
	if (h->magic != TRACE_RING_MAGIC) {
		close(fd);
		return sp_fail(err, "%s: not an sptrace ring (magic %#" PRIx64 ", expected %#llx)",
			       path, h->magic, TRACE_RING_MAGIC);
	}
	if (h->version < TRACE_FORMAT_VERSION_MIN || h->version > TRACE_FORMAT_VERSION) {
		close(fd);
		return sp_fail(err, "%s: ring format version %u; this sptrace reads versions %d to "
			       "%d%s", path, h->version, TRACE_FORMAT_VERSION_MIN,
			       TRACE_FORMAT_VERSION, h->version > TRACE_FORMAT_VERSION ?
			       ": read it with the sptrace that wrote it, or a newer one" : "");
	}
	if (h->version == 1) {
		/* Before the fields of version 2 (zero there): a ring. */
		h->limit = ~0ull;
		h->chunk = 0;
		h->kept_end = ~0ull;
		h->kept_errno = 0;
	}
	if (h->header_size < RING_FIXED_HEADER || h->header_size % 8 ||
	    h->header_size > RING_MAX_HEADER) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: header size %u", path, h->header_size);
	}
	if (h->capacity == 0 || (h->capacity & (h->capacity - 1)) ||
	    h->capacity > RING_MAX_CAPACITY) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: capacity %" PRIu64 " is not a power of "
			       "two up to 2^36", path, h->capacity);
	}
	if (h->mask != h->capacity - 1) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: mask %#" PRIx64 " does not match "
			       "capacity %" PRIu64, path, h->mask, h->capacity);
	}
	if (h->count > RING_MAX_COUNT) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: write count %" PRIu64 " is implausible "
			       "(over 2^56 records)", path, h->count);
	}
	if (h->chunk && h->capacity != 2 * h->chunk) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: chunks of %" PRIu64 " records, but a window "
			       "of %" PRIu64 " (two chunks expected)", path, h->chunk, h->capacity);
	}
	/* A file that keeps every record grows as it goes (its first part,
	 * then two chunks, then a chunk at a time: trace_format.h); its records
	 * past its end (a cut copy) are counted lost, not refused. */
	need = h->header_size + (h->chunk ? 0 : h->capacity * 8);
	if ((uint64_t)st.st_size < need) {
		close(fd);
		return sp_fail(err, "%s: truncated: %lld bytes, but its header says %" PRIu64
			       " records (%" PRIu64 " bytes with the header)", path,
			       (long long)st.st_size, h->capacity, need);
	}
	*said = h->count;
	pend = h->chunk ? packed_end(path) : 0;
	slots = file_slots(h, (uint64_t)st.st_size);
	h->count = ring_written(fd, h, slots, pend);
	if (h->chunk && h->kept_end > (slots > pend ? slots : pend))
		h->kept_end = slots > pend ? slots : pend;  /* the file's end, or the
							     * packed blocks' */
	return fd;
}

int an_is_sync(uint64_t r)
{
	return trace_rec_kind(r) == TRACE_SYNC && (r >> 28) == 0;
}


int an_add_reset(struct reset **r, size_t *n, size_t pos, uint64_t epoch)
{
	struct reset *nr = realloc(*r, (*n + 1) * sizeof *nr);

	if (!nr)
		return -1;
	nr[(*n)++] = (struct reset){ pos, epoch };
	*r = nr;
	return 0;
}

/*
 * seg.<tid> beside ring.<tid> (trace_format.h): the chunks `sptrace run`
 * drained.  With want_chunks 0 only the counts: records kept, and the index
 * after the last chunk; with 1 also where each chunk's records are, and the
 * file left open (sd->fd) for the iterator to read them.  A chunk that is
 * not whole (a crash while it was written, a damaged file) ends the
 * reading: the records after it are counted lost.
 */

static void seg_path(const char *ring_path, char *out, size_t len)
{
	const char *base = strrchr(ring_path, '/');

	base = base ? base + 1 : ring_path;
	snprintf(out, len, "%.*sseg.%s", (int)(base - ring_path), ring_path, base + 5);
}

int an_seg_read(const char *ring_path, seg_data *sd, int want_chunks, sp_err *err)
{
	char path[PATH_MAX];
	trace_seg_chunk ch;
	struct stat st;
	off_t off = 0;
	int fd;

	memset(sd, 0, sizeof *sd);
	sd->fd = -1;
	seg_path(ring_path, path, sizeof path);
	fd = sp_open_regular(path, 1);
	if (fd < 0)
		return errno == ENOENT ? 0 : sp_fail(err, "%s: cannot open: %s", path,
						     sp_open_why(errno));
	if (fstat(fd, &st) < 0) {
		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(errno));
	}
	while (off + (off_t)sizeof ch <= st.st_size &&
	       an_read_full(fd, &ch, sizeof ch, off) == 0 && ch.magic == TRACE_SEG_MAGIC &&
	       ch.first >= sd->end && ch.n > 0 &&
	       ch.n <= (uint64_t)(st.st_size - off - (off_t)sizeof ch) / 8) {
		if (want_chunks) {
			seg_chunk *c;

			if (sp_grow((void **)&sd->chunks, &sd->capchunks, sd->nchunks + 1,
				    sizeof *sd->chunks)) {
				free(sd->chunks);
				close(fd);
				return sp_fail(err, "%s: out of memory", path);
			}
			c = &sd->chunks[sd->nchunks++];
			c->off = off + (off_t)sizeof ch;
			c->pos = sd->n;
			c->n = ch.n;
			c->epoch = ch.epoch;
			/* After a gap: the ring's last SYNC when it was drained,
			 * unless the chunk has a SYNC of its own. */
			c->after_gap = ch.first != sd->end || !sd->n;
		}
		sd->n += ch.n;
		sd->end = ch.first + ch.n;
		off += (off_t)(sizeof ch + ch.n * 8);
	}
	if (want_chunks)
		sd->fd = fd;
	else
		close(fd);
	return 0;
}

/* Records the thread lost: count minus what the chunks and the ring keep
 * (a file of every record: what it holds, up to kept_end). */
static uint64_t thread_lost(const trace_ring_header *h, const seg_data *sd)
{
	if (h->chunk)
		return h->count > h->kept_end ? h->count - h->kept_end : 0;
	uint64_t ring_from = h->count > h->capacity ? h->count - h->capacity : 0;

	if (sd->end > ring_from)
		ring_from = sd->end;
	if (ring_from > h->count)
		ring_from = h->count;
	return h->count - (h->count - ring_from) - sd->n;
}

/* Records of a file of every record neither in a valid block of
 * packed.<tid> nor raw in the file any more (punched, and their block is
 * damaged or gone: trace_format.h, "Packed blocks", point 3), into *lost;
 * a damaged block is said.  -1: out of memory. */
static int packed_lost(an_trace *t, const char *path, int fd, const trace_ring_header *h,
		       uint64_t *lost)
{
	uint64_t top = h->count < h->kept_end ? h->count : h->kept_end, from;
	pack_data pd;
	sp_err e;

	*lost = 0;
	if (an_pack_scan(path, &pd, 1, -1, &e) < 0) {
		an_warn(t, "%s", e.msg);
		return 0;
	}
	for (size_t k = 0; k < pd.nblks; k++)
		if (pd.blks[k].bad) {
			uint64_t first = pd.blks[k].h.first, end = first + pd.blks[k].h.n;

			*lost += an_pack_raw_from(fd, h, first, end) - first;
		}
	from = an_pack_raw_from(fd, h, pd.end, top);
	*lost += from - pd.end;
	if (pd.bad >= 0)
		an_warn(t, "%s: the block at offset %lld is unreadable: %s; records from %" PRIu64
			" on are read from %s%s", pd.path, (long long)pd.bad, pd.why, pd.end, path,
			*lost ? ", where some were freed already: counted lost" : "");
	an_pack_free(&pd);
	return 0;
}

static int thread_cmp(const void *a, const void *b)
{
	const an_thread *x = a, *y = b;

	return x->tid < y->tid ? -1 : x->tid > y->tid;
}

int an_read_rings(an_trace *t, sp_err *err)
{
	DIR *d = opendir(t->dir);
	struct dirent *de;
	trace_ring_header h;
	char path[PATH_MAX];
	int rc = 0;

	if (!d)
		return sp_fail(err, "%s: cannot list: %s", t->dir, strerror(errno));
	while (rc == 0 && (de = readdir(d))) {
		uint64_t ftid, said, plost = 0;
		an_thread *th;
		int fd;

		if (strncmp(de->d_name, "ring.", 5) != 0)
			continue;
		if (an_parse_u64(de->d_name + 5, 10, &ftid) || ftid > UINT32_MAX) {
			an_warn(t, "%s/%s: ignored: not named ring.<tid>", t->dir, de->d_name);
			continue;
		}
		snprintf(path, sizeof path, "%s/%s", t->dir, de->d_name);
		fd = an_ring_open(path, &h, &said, err);
		if (fd == -2) {
			/* A header of zeros: the process died while the agent was
			 * making this ring, before its first record.  Nothing lost. */
			an_warn(t, "%s: ignored: an empty ring (the thread ended while its ring was being "
			     "made)", path);
			continue;
		}
		if (fd < 0) {
			rc = -1;
			break;
		}
		if (h.chunk && packed_lost(t, path, fd, &h, &plost) < 0) {
			close(fd);
			rc = sp_fail(err, "out of memory");
			break;
		}
		close(fd);
		if (h.chunk && !h.kept_errno && h.count > h.kept_end)
			an_warn(t, "%s: its header counts %" PRIu64 " records written, but the file "
				"holds %" PRIu64 ": a file cut short, or a corrupt header; the rest "
				"is counted lost", path, h.count, h.kept_end);
		if (said != h.count)
			an_warn(t, "%s: corrupt header: it counts %" PRIu64 " records written, but "
			     "only the first %" PRIu64 " slots of the ring were ever written: read "
			     "as %" PRIu64 " records", path, said, h.count, h.count);
		if (sp_grow((void **)&t->threads, &t->capthreads, t->nthreads + 1,
			    sizeof *t->threads)) {
			rc = sp_fail(err, "out of memory");
			break;
		}
		th = &t->threads[t->nthreads];
		memset(th, 0, sizeof *th);
		th->path = strdup(path);
		if (!th->path) {
			rc = sp_fail(err, "out of memory");
			break;
		}
		t->nthreads++;
		if (h.tid != ftid)
			an_warn(t, "%s: its header says thread %u; shown under that id", path, h.tid);
		th->tid = h.tid;
		th->pid = h.pid;
		for (int i = 0; i < 16 && h.thread_name[i]; i++)
			th->name[i] = isprint((unsigned char)h.thread_name[i]) ? h.thread_name[i] : '?';
		th->capacity = h.capacity;
		th->count = h.count;
		th->chunk = h.chunk;
		{
			seg_data sd = { .fd = -1 };

			/* seg.<tid>: version 1 only (a file of every record
			 * has none to add). */
			if (!h.chunk && an_seg_read(path, &sd, 0, err) < 0) {
				rc = -1;
				break;
			}
			th->lost = thread_lost(&h, &sd) + (h.chunk ? plost : 0);
			th->drained = sd.n;
			if (th->lost)
				th->lost_why = h.chunk ? (h.kept_errno ? AN_LOST_GROW : AN_LOST_CUT)
					   : sd.n || sd.end ? AN_LOST_DRAIN : AN_LOST_RING;
			th->lost_errno = h.kept_errno;
		}
		th->flags = h.flags;
		th->start_tsc = h.start_tsc;
		th->epoch = h.epoch;
	}
	closedir(d);
	if (rc)
		return rc;
	if (t->nthreads)
		qsort(t->threads, t->nthreads, sizeof *t->threads, thread_cmp);
	/* Tracing began when the first ring was made; meta's clock reading if
	 * no ring says. */
	t->start_tsc = 0;
	for (size_t i = 0; i < t->nthreads; i++)
		if (t->threads[i].start_tsc &&
		    (!t->start_tsc || t->threads[i].start_tsc < t->start_tsc))
			t->start_tsc = t->threads[i].start_tsc;
	if (!t->start_tsc)
		t->start_tsc = t->tsc0;
	if (!t->nthreads)
		an_warn(t, "%s: no ring files: no thread wrote a record", t->dir);
	return 0;
}


/* ------------------------------------------------------------------------ */
/* Records lost                                                              */
/* ------------------------------------------------------------------------ */

static void lost_add(an_lost *l, const an_thread *th)
{
	l->threads++;
	l->written += th->count;
	if (!th->lost)
		return;
	l->threads_lost++;
	l->lost += th->lost;
	if (th->lost_why > 0 && th->lost_why < AN_LOST_NWHY)
		l->by_why[th->lost_why] += th->lost;
	if (th->lost_why == AN_LOST_GROW && !l->grow_errno)
		l->grow_errno = th->lost_errno;
}

void an_trace_lost(const an_trace *t, an_lost *l)
{
	memset(l, 0, sizeof *l);
	for (size_t i = 0; i < t->nthreads; i++)
		lost_add(l, &t->threads[i]);
}

/* The rings of the trace in dir, headers only: no records, no modules. */
void an_dir_lost_add(const char *dir, an_lost *l)
{
	an_trace t;
	sp_err e;

	memset(&t, 0, sizeof t);
	t.dir = (char *)dir;
	if (an_read_rings(&t, &e) == 0)
		for (size_t i = 0; i < t.nthreads; i++)
			lost_add(l, &t.threads[i]);
	for (size_t i = 0; i < t.nthreads; i++)
		free((char *)t.threads[i].path);
	free(t.threads);
	for (size_t i = 0; i < t.nwarn; i++)
		free(t.warn[i]);
	free(t.warn);
}

void an_lost_text(const an_lost *l, char *buf, size_t len)
{
	static const char *const why[AN_LOST_NWHY] = {
		[AN_LOST_RING] = "overwritten in a full ring (flight-recorder mode keeps each "
				 "thread's newest --ring-size MB)",
		[AN_LOST_DRAIN] = "not copied before the ring came round (the copying drain "
				  "of sptrace run before format version 2 fell behind)",
		[AN_LOST_GROW] = "the trace file could not grow",
		[AN_LOST_CUT] = "the trace file ends before its records do (cut or damaged)",
	};
	size_t n;
	int first = 1;

	n = (size_t)snprintf(buf, len, "%" PRIu64 " of %" PRIu64 " records lost (%.1f%%) in %zu "
			     "of %zu threads: ", l->lost, l->written,
			     l->written ? 100.0 * (double)l->lost / (double)l->written : 0.0,
			     l->threads_lost, l->threads);
	for (int w = 1; w < AN_LOST_NWHY && n < len; w++) {
		if (!l->by_why[w])
			continue;
		n += (size_t)snprintf(buf + n, len - n, "%s%" PRIu64 " %s%s%s%s", first ? "" : "; ",
				      l->by_why[w], why[w], w == AN_LOST_GROW ? " (" : "",
				      w == AN_LOST_GROW ? strerror(l->grow_errno) : "",
				      w == AN_LOST_GROW ? ")" : "");
		first = 0;
	}
	if (n < len)
		snprintf(buf + n, len - n, "; the trace is incomplete");
}
