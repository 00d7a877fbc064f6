/*
 * iter.c — a thread's records with full timestamps, streamed (an_iter). See
 * analysis.h for what each promises.
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
/* Records                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * The iterator streams: it keeps a window of WINDOW records, never the
 * thread's whole history (a ring is 16 MiB by default, and the drained
 * seg.<tid> can hold gigabytes).  The records are a sequence of pieces --
 * each drained chunk of seg.<tid>, then the ring's part after the last
 * chunk -- read on demand by position.
 *   1. an_iter_open reads the ring header once: the count it says fixes
 *      which records the iteration covers (a live agent goes on writing;
 *      records it overwrites before they are read come back newer, as
 *      they would from a copy taken a moment later).
 *   2. Where the high TSC bits are known anew (after a gap: a chunk after
 *      lost records, the ring's part after a wrap) is found at open by
 *      scanning to that part's first SYNC, usually its first record.
 *   3. A message head needs its TRACE_MSG_NDATA data records: reading them
 *      may move the window past the head, which has been taken already.
 *   4. The thread's kernel records (kernel.<tid>, `sptrace run --kernel`)
 *      are few next to its own: read whole at open, and merged with the
 *      ring's records by timestamp, so they come out nested under the
 *      system call that ran them.  Left out: those between an AGENT_BEGIN
 *      and its AGENT_END (the agent's own system calls), and those while
 *      no traced call is open (before the first, after the root's return:
 *      the loader's, the agent's start and end, exit handlers untraced).
 * A file that keeps every record (trace_format.h) is a piece per block of
 * packed.<tid> (decoded whole when the window reaches it), then one piece
 * of the raw records after them, up to kept_end; a damaged block is read
 * raw where its records still are, and those punched out are a gap.
 */
#define WINDOW 4096

typedef struct piece {
	size_t pos;              /* its first record in the thread's sequence */
	uint64_t n;
	int fd;
	off_t off;               /* a chunk: file offset of its first record */
	int ring;                /* the ring's part: slots wrap at ring_cap */
	long blk;                /* a block of packed.<tid> (its index); -1: raw */
} piece;

struct an_iter {
	const char *path;        /* the ring file, for messages */
	int seg_fd, ring_fd;
	pack_data pk;            /* packed.<tid>'s valid blocks (a file of every record) */
	uint64_t *dec;           /* the records of block dec_blk, decoded */
	long dec_blk;
	piece *pieces;
	size_t npieces, cur;     /* cur: the piece the window last read from */
	uint64_t ring_from;      /* record index of the ring part's first record */
	uint64_t ring_cap;
	off_t ring_hdr;          /* file offset of slot 0 */
	uint64_t win[WINDOW];    /* records [win_pos, win_pos + win_n) */
	size_t win_pos, win_n;
	size_t n, pos;
	size_t first_sync;       /* after a gap: the first SYNC's position; records
				    before it have guessed high bits */
	size_t guess_from;       /* ... counted from here (n if no gap) */
	uint64_t high;           /* current TSC bits 38..63 */
	struct reset *resets;    /* where the high bits are known anew */
	size_t nresets, nextreset;
	const an_site_info *sites;
	size_t nsites;
	an_iter_stats st;
	trace_kernel_rec *krecs; /* step 4 */
	size_t nkrecs, kpos;
	an_record user;          /* the next of the thread's own records ... */
	int have_user, user_done; /* ... when taken already */
	int in_agent;            /* between AGENT_BEGIN and AGENT_END */
	uint64_t open_calls;     /* the thread's calls entered, not yet left */
};

/* Read the window starting at position i.  -1 (errno) on a read error. */
static int window_fill(an_iter *it, size_t i)
{
	size_t got = 0;

	if (it->cur >= it->npieces || it->pieces[it->cur].pos > i)
		it->cur = 0;
	while (it->cur < it->npieces && i >= it->pieces[it->cur].pos + it->pieces[it->cur].n)
		it->cur++;
	for (size_t k = it->cur; k < it->npieces && got < WINDOW && i + got < it->n; k++) {
		const piece *p = &it->pieces[k];

		while (got < WINDOW && i + got < p->pos + p->n) {
			uint64_t in = i + got - p->pos, want = p->pos + p->n - (i + got);
			off_t off = p->off + (off_t)(in * 8);

			if (p->blk >= 0) {
				const char *why;

				if (it->dec_blk != p->blk) {
					free(it->dec);
					it->dec_blk = -1;
					it->dec = malloc(p->n * 8);
					if (!it->dec || an_pack_decode(&it->pk, (size_t)p->blk, it->dec,
								       &why) < 0)
						return -1;
					it->dec_blk = p->blk;
				}
				if (want > WINDOW - got)
					want = WINDOW - got;
				memcpy(it->win + got, it->dec + in, want * 8);
				got += want;
				continue;
			}
			if (p->ring) {
				uint64_t slot = (it->ring_from + in) & (it->ring_cap - 1);

				off = it->ring_hdr + (off_t)(slot * 8);
				if (want > it->ring_cap - slot)
					want = it->ring_cap - slot;
			}
			if (want > WINDOW - got)
				want = WINDOW - got;
			if (an_read_full(p->fd, it->win + got, want * 8, off) < 0)
				return -1;
			got += want;
		}
	}
	it->win_pos = i;
	it->win_n = got;
	return got ? 0 : -1;
}

/* Record i (below it->n) into *r: 0, or -1 when it cannot be read. */
static int rec_at(an_iter *it, size_t i, uint64_t *r)
{
	if (i < it->win_pos || i >= it->win_pos + it->win_n) {
		if (window_fill(it, i) < 0)
			return -1;
	}
	*r = it->win[i - it->win_pos];
	return 0;
}

/* The high bits in force at the first of n records from `from` that follow
 * a gap: those of their first SYNC minus one (a SYNC marks a change), else
 * `fallback`.  *first_sync: that SYNC's position, from + n if none. */
static uint64_t epoch_after_gap(an_iter *it, size_t from, uint64_t n, uint64_t fallback,
				size_t *first_sync)
{
	uint64_t r;

	for (size_t i = from; i < from + n && rec_at(it, i, &r) == 0; i++)
		if (an_is_sync(r)) {
			uint64_t hi = trace_sync_high(r);

			*first_sync = i;
			return hi ? hi - 1 : 0;
		}
	*first_sync = from + n;
	return fallback;
}

static int add_piece(an_iter *it, size_t pos, uint64_t n, int fd, off_t off, int ring, long blk)
{
	piece *np = realloc(it->pieces, (it->npieces + 1) * sizeof *np);

	if (!np)
		return -1;
	np[it->npieces++] = (piece){ pos, n, fd, off, ring, blk };
	it->pieces = np;
	return 0;
}

/* Step 4: the thread's kernel.<tid>, if any; -1 (it closed) with err. */
static int kernel_records(an_iter *it, const an_thread *th, sp_err *err)
{
	char kpath[PATH_MAX], *buf;
	const char *base = strrchr(th->path, '/');
	size_t len;

	base = base ? base + 1 : th->path;
	snprintf(kpath, sizeof kpath, "%.*skernel.%s", (int)(base - th->path), th->path, base + 5);
	if (an_slurp(kpath, TRACE_KERNEL_MAX_BYTES, &buf, &len) == 0) {
		it->krecs = (trace_kernel_rec *)buf;
		it->nkrecs = len / sizeof(trace_kernel_rec);
	} else if (errno != ENOENT) {
		int e = errno;

		an_iter_close(it);
		return sp_fail(err, "%s: cannot read: %s", kpath, an_errno_text(e));
	}
	return 0;
}

int an_iter_open(an_trace *t, const an_thread *th, an_iter **out, sp_err *err)
{
	trace_ring_header h;
	uint64_t ring_from, cap_n, said;
	size_t nring, first_sync;
	seg_data sd;
	an_iter *it;
	int fd;

	*out = NULL;
	memset(&sd, 0, sizeof sd);
	sd.fd = -1;
	if (!th->chunk && an_seg_read(th->path, &sd, 1, err) < 0)
		return -1;
	fd = an_ring_open(th->path, &h, &said, err);
	if (fd < 0) {
		free(sd.chunks);
		if (sd.fd >= 0)
			close(sd.fd);
		return -1;
	}
	if (!(it = calloc(1, sizeof *it))) {
		free(sd.chunks);
		if (sd.fd >= 0)
			close(sd.fd);
		close(fd);
		return sp_fail(err, "%s: out of memory", th->path);
	}
	it->path = th->path;
	it->seg_fd = sd.fd;
	it->ring_fd = fd;
	it->pk.fd = -1;
	it->dec_blk = -1;
	if (h.chunk) {
		/* Every record in order, up to what the file keeps: the blocks
		 * of packed.<tid>, then the raw ones from where they resume
		 * (trace_format.h, "Packed blocks", point 3). */
		uint64_t top = h.count < h.kept_end ? h.count : h.kept_end, from;
		size_t pos = 0, ngaps = 0, gaps[2 * 64];

		if (an_pack_scan(th->path, &it->pk, 1, -1, err) < 0) {
			an_iter_close(it);
			return -1;
		}
		if (it->pk.end > top)
			top = it->pk.end;   /* (a header that says less than the blocks) */

		it->sites = t->sites;
		it->nsites = t->nsites;
		it->high = h.start_tsc >> TRACE_TSC_LOW_BITS;
		/* The blocks; a damaged one's records raw where they still are
		 * (records lost before them: a gap, see step 2), then the tail. */
		for (size_t k = 0; k <= it->pk.nblks; k++) {
			const pack_blk *b = k < it->pk.nblks ? &it->pk.blks[k] : NULL;
			uint64_t first = b ? b->h.first : it->pk.end, end = b ? first + b->h.n : top;

			if (b && !b->bad) {
				if (add_piece(it, pos, b->h.n, it->pk.fd, 0, 0, (long)k))
					goto nomem;
				pos += b->h.n;
				continue;
			}
			from = an_pack_raw_from(fd, &h, first, end);
			if (end <= from)
				continue;
			if (from > first && ngaps < sizeof gaps / sizeof *gaps / 2) {
				gaps[2 * ngaps] = pos;
				gaps[2 * ngaps++ + 1] = (size_t)(end - from);
			}
			if (add_piece(it, pos, end - from, fd, (off_t)(h.header_size + from * 8), 0, -1))
				goto nomem;
			pos += end - from;
		}
		it->n = pos;
		it->first_sync = it->guess_from = it->n;
		for (size_t g = 0; g < ngaps; g++) {
			size_t fs;
			uint64_t epoch = epoch_after_gap(it, gaps[2 * g], gaps[2 * g + 1], h.epoch, &fs);

			if (g == 0) {
				it->guess_from = gaps[0];
				it->first_sync = fs;
			}
			if (an_add_reset(&it->resets, &it->nresets, gaps[2 * g], epoch))
				goto nomem;
		}
		if (kernel_records(it, th, err) < 0)
			return -1;
		*out = it;
		return 0;
	}
	/* Step 1: counts from this read, not from an_trace_open. */
	cap_n = h.count < h.capacity ? h.count : h.capacity;
	ring_from = h.count - cap_n;
	if (sd.end > ring_from)
		ring_from = sd.end < h.count ? sd.end : h.count;
	nring = (size_t)(h.count - ring_from);
	it->ring_from = ring_from;
	it->ring_cap = h.capacity;
	it->ring_hdr = (off_t)h.header_size;
	it->n = sd.n + nring;
	it->sites = t->sites;
	it->nsites = t->nsites;
	it->first_sync = it->guess_from = it->n;
	/* The ring starts with a SYNC; start_tsc covers a writer that did not. */
	it->high = h.start_tsc >> TRACE_TSC_LOW_BITS;
	for (size_t k = 0; k < sd.nchunks; k++)
		if (add_piece(it, sd.chunks[k].pos, sd.chunks[k].n, sd.fd, sd.chunks[k].off, 0, -1))
			goto nomem;
	if (nring && add_piece(it, sd.n, nring, fd, 0, 1, -1))
		goto nomem;
	/* Step 2. */
	for (size_t k = 0; k < sd.nchunks; k++)
		if (sd.chunks[k].after_gap &&
		    an_add_reset(&it->resets, &it->nresets, sd.chunks[k].pos,
				 epoch_after_gap(it, sd.chunks[k].pos, sd.chunks[k].n,
						 sd.chunks[k].epoch, &first_sync)))
			goto nomem;
	if (ring_from > 0 && !(sd.n && sd.end == ring_from) && nring) {
		/* The ring's part follows a gap: the header's last SYNC, unless
		 * the part has one of its own (records before it are guessed). */
		uint64_t epoch = epoch_after_gap(it, sd.n, nring, h.epoch, &it->first_sync);

		it->guess_from = sd.n;
		if (an_add_reset(&it->resets, &it->nresets, sd.n, epoch))
			goto nomem;
	}
	free(sd.chunks);
	if (kernel_records(it, th, err) < 0)
		return -1;
	*out = it;
	return 0;
nomem:
	free(sd.chunks);
	an_iter_close(it);
	return sp_fail(err, "%s: out of memory", th->path);
}

static int user_next(an_iter *it, an_record *r);

/* A call through this site has no EXIT of its own (trace_format.h). */
static int entry_only(const an_iter *it, uint32_t id)
{
	const an_site_info *s;

	if (id >= it->nsites || !it->sites[id].valid)
		return 1;
	s = &it->sites[id];
	return s->kind == CA_SITE_TAIL_DIRECT || s->kind == CA_SITE_TAIL_INDIRECT ||
	       (s->flags & TRACE_SITE_NO_EXIT);
}

/* The next kernel record (step 4) into *r: 0 when there is none. */
static int kernel_next(an_iter *it, an_record *r)
{
	while (it->kpos < it->nkrecs) {
		const trace_kernel_rec *k = &it->krecs[it->kpos++];

		if (k->kind != TRACE_ENTRY && k->kind != TRACE_EXIT) {
			it->st.nbad_sites++;
			continue;
		}
		memset(r, 0, sizeof *r);
		r->kind = k->kind;
		r->id = k->site;
		r->tsc = k->tsc;
		if (r->id >= it->nsites || !it->sites[r->id].valid)
			it->st.nbad_sites++;
		it->st.nrecords++;
		return 1;
	}
	return 0;
}

int an_iter_next(an_iter *it, an_record *r)
{
	if (!it->have_user && !it->user_done) {
		if (user_next(it, &it->user))
			it->have_user = 1;
		else
			it->user_done = 1;
	}
	while (it->kpos < it->nkrecs && (!it->have_user || it->krecs[it->kpos].tsc < it->user.tsc)) {
		if (!it->in_agent && it->open_calls)
			return kernel_next(it, r) ? 1 : an_iter_next(it, r);
		it->kpos++;
	}
	if (it->have_user) {
		*r = it->user;
		it->have_user = 0;
		if (r->kind == TRACE_EVENT && r->id == TRACE_EV_AGENT_BEGIN)
			it->in_agent = 1;
		else if (r->kind == TRACE_EVENT && r->id == TRACE_EV_AGENT_END)
			it->in_agent = 0;
		else if (r->kind == TRACE_ENTRY && !entry_only(it, r->id))
			it->open_calls++;
		else if (r->kind == TRACE_EXIT && r->id < it->nsites && it->sites[r->id].valid &&
			 (it->sites[r->id].flags & TRACE_SITE_ROOT))
			it->open_calls = 0;     /* the root's return closes every call */
		else if (r->kind == TRACE_EXIT && it->open_calls)
			it->open_calls--;
		return 1;
	}
	return 0;
}

/* A return value's time: that of the EXIT it comes before (a SYNC may come
 * between), else `dflt`. */
static uint64_t exit_after(an_iter *it, size_t i, uint64_t dflt)
{
	uint64_t high = it->high, d;

	for (size_t k = i + 1; k < it->n && k <= i + 2; k++) {
		if (rec_at(it, k, &d) < 0)
			break;
		if (trace_rec_kind(d) == TRACE_SYNC && an_is_sync(d)) {
			high = trace_sync_high(d);
			continue;
		}
		if (trace_rec_kind(d) == TRACE_EXIT)
			return high << TRACE_TSC_LOW_BITS | trace_rec_tsc_low(d);
		break;
	}
	return dflt;
}

static int user_next(an_iter *it, an_record *r)
{
	while (it->pos < it->n) {
		size_t i = it->pos++;
		uint64_t raw;
		unsigned kind;

		if (rec_at(it, i, &raw) < 0) {
			it->st.nunread = it->n - i;        /* a read failed: the rest is lost */
			it->pos = it->n;
			return 0;
		}
		if (raw == 0) {
			it->st.nholes++;           /* a slot taken, never written */
			continue;
		}
		kind = trace_rec_kind(raw);
		while (it->nextreset < it->nresets && it->resets[it->nextreset].pos <= i)
			it->high = it->resets[it->nextreset++].epoch;

		if (kind == TRACE_SYNC) {
			if (an_is_sync(raw))
				it->high = trace_sync_high(raw);
			else
				it->st.nbad_syncs++;
			continue;
		}
		r->kind = kind;
		r->id = trace_rec_id(raw);
		r->key = 0;
		if (kind == TRACE_EVENT && r->id == TRACE_EV_MSG_DATA) {
			it->st.nstray_data++;      /* its head was overwritten */
			continue;
		}
		if (kind == TRACE_EVENT && trace_event_is_msg(r->id)) {
			uint64_t data[TRACE_MSG_NDATA], d;
			unsigned k;

			/* Step 3. */
			for (k = 0; k < TRACE_MSG_NDATA && i + 1 + k < it->n; k++) {
				if (rec_at(it, i + 1 + k, &d) < 0 || trace_rec_kind(d) != TRACE_EVENT ||
				    trace_rec_id(d) != TRACE_EV_MSG_DATA)
					break;
				data[k] = trace_rec_tsc_low(d);
			}
			it->pos = i + 1 + k;
			if (k < TRACE_MSG_NDATA) {
				it->st.nbad_msgs++;        /* cut short: dropped */
				continue;
			}
			trace_msg_unpack(data, &r->msg.chan, &r->msg.call, &r->msg.flags,
					 &r->msg.off, &r->msg.len);
			r->msg.recv = r->id == TRACE_EV_MSG_RECV;
		}
		if (kind == TRACE_EVENT && trace_event_is_value(r->id)) {
			/* a join directive's value (trace_format.h, "Values") */
			r->value = trace_value_unpack(r->id, trace_rec_tsc_low(raw), &r->value_arg);
			r->id = TRACE_EV_VALUE;
			r->tsc = it->st.last_tsc ? it->st.last_tsc : it->high << TRACE_TSC_LOW_BITS;
			if (r->value_arg == 0)
				r->tsc = exit_after(it, i, r->tsc);
			it->st.nrecords++;
			return 1;
		}
		if (kind == TRACE_EVENT && r->id == TRACE_EV_COUNT_DATA) {
			it->st.nstray_data++;      /* its COUNT was overwritten */
			continue;
		}
		if (kind == TRACE_EVENT && (r->id == TRACE_EV_BUDGET || r->id == TRACE_EV_COUNT)) {
			uint64_t p = trace_rec_tsc_low(raw), d;

			memset(&r->budget, 0, sizeof r->budget);
			r->budget.site = trace_budget_site(p);
			r->budget.mode = trace_budget_mode(p);
			if (r->id == TRACE_EV_COUNT) {
				/* Its data record follows: a pair without it is dropped. */
				if (i + 1 >= it->n || rec_at(it, i + 1, &d) < 0 ||
				    trace_rec_kind(d) != TRACE_EVENT ||
				    trace_rec_id(d) != TRACE_EV_COUNT_DATA) {
					it->st.nbad_counts++;
					continue;
				}
				it->pos = i + 2;
				r->budget.mode = TRACE_BUDGET_COUNTED;
				r->budget.n = trace_rec_tsc_low(d);
			}
			r->tsc = it->st.last_tsc ? it->st.last_tsc : it->high << TRACE_TSC_LOW_BITS;
			it->st.nrecords++;
			return 1;
		}
		if (kind == TRACE_EVENT && trace_event_has_key(r->id)) {
			r->key = trace_rec_tsc_low(raw);
			r->tsc = it->st.last_tsc ? it->st.last_tsc : it->high << TRACE_TSC_LOW_BITS;
			it->st.nrecords++;
			return 1;
		}
		r->tsc = it->high << TRACE_TSC_LOW_BITS | trace_rec_tsc_low(raw);
		if (i >= it->guess_from && i < it->first_sync && it->first_sync < it->n)
			it->st.nguessed++;
		if (kind != TRACE_EVENT && (r->id >= it->nsites || !it->sites[r->id].valid))
			it->st.nbad_sites++;
		it->st.nrecords++;
		it->st.last_tsc = r->tsc;
		return 1;
	}
	return 0;
}

const an_iter_stats *an_iter_stats_get(const an_iter *it)
{
	return &it->st;
}

void an_iter_close(an_iter *it)
{
	if (!it)
		return;
	if (it->seg_fd >= 0)
		close(it->seg_fd);
	if (it->ring_fd >= 0)
		close(it->ring_fd);
	free(it->pieces);
	free(it->dec);
	an_pack_free(&it->pk);
	free(it->resets);
	free(it->krecs);
	free(it);
}

