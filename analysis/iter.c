/*
 * iter.c — a thread's records with full timestamps (an_iter).  See analysis.h for what each promises.
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

struct an_iter {
	uint64_t *raw;           /* the thread's records, oldest first */
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
};

int an_iter_open(an_trace *t, const an_thread *th, an_iter **out, sp_err *err)
{
	trace_ring_header h;
	uint64_t *ring = NULL, ring_from, cap_n, said;
	size_t nring;
	seg_data sd;
	an_iter *it;
	int fd;

	*out = NULL;
	if (an_seg_read(th->path, &sd, 1, err) < 0)
		return -1;
	fd = an_ring_open(th->path, &h, &said, err);
	if (fd < 0) {
		free(sd.recs);
		free(sd.resets);
		return -1;
	}
	/* Counts from this read, not from an_trace_open: a live agent goes on. */
	cap_n = h.count < h.capacity ? h.count : h.capacity;
	ring_from = h.count - cap_n;
	if (sd.end > ring_from)
		ring_from = sd.end < h.count ? sd.end : h.count;
	nring = (size_t)(h.count - ring_from);
	it = calloc(1, sizeof *it);
	ring = malloc(cap_n ? cap_n * 8 : 8);
	if (it)
		it->raw = malloc((sd.n + nring) * 8 + 8);
	if (!it || !ring || !it->raw || an_read_full(fd, ring, cap_n * 8, h.header_size) < 0) {
		int e = errno;

		if (it)
			free(it->raw);
		free(it);
		free(ring);
		free(sd.recs);
		free(sd.resets);
		close(fd);
		return sp_fail(err, "%s: cannot read %" PRIu64 " records: %s", th->path,
			       cap_n, it && ring ? strerror(e) : "out of memory");
	}
	close(fd);
	if (sd.n)
		memcpy(it->raw, sd.recs, sd.n * 8);
	for (size_t i = 0; i < nring; i++)
		it->raw[sd.n + i] = ring[(ring_from + i) & (h.capacity - 1)];
	free(ring);
	free(sd.recs);
	it->n = sd.n + nring;
	it->resets = sd.resets;
	it->nresets = sd.nresets;
	it->sites = t->sites;
	it->nsites = t->nsites;
	it->first_sync = it->guess_from = it->n;
	/* The ring starts with a SYNC; start_tsc covers a writer that did not. */
	it->high = h.start_tsc >> TRACE_TSC_LOW_BITS;
	if (ring_from > 0 && !(sd.n && sd.end == ring_from) && nring) {
		/* The ring's part follows a gap: the header's last SYNC, unless
		 * the part has one of its own (records before it are guessed). */
		uint64_t epoch = an_epoch_after_gap(it->raw + sd.n, nring, h.epoch, &it->first_sync);

		it->first_sync += sd.n;
		it->guess_from = sd.n;
		if (an_add_reset(&it->resets, &it->nresets, sd.n, epoch)) {
			an_iter_close(it);
			return sp_fail(err, "%s: out of memory", th->path);
		}
	}
	*out = it;
	return 0;
}

int an_iter_next(an_iter *it, an_record *r)
{
	while (it->pos < it->n) {
		size_t i = it->pos++;
		uint64_t raw = it->raw[i];
		unsigned kind = trace_rec_kind(raw);

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
			uint64_t data[TRACE_MSG_NDATA];
			unsigned k;

			for (k = 0; k < TRACE_MSG_NDATA && i + 1 + k < it->n; k++) {
				uint64_t d = it->raw[i + 1 + k];

				if (trace_rec_kind(d) != TRACE_EVENT ||
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
	free(it->raw);
	free(it->resets);
	free(it);
}

