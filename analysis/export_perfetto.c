/*
 * export_perfetto.c — `sptrace export --format perfetto`: a Perfetto trace,
 * TrackEvent protobuf (proto/perfetto_trace.proto), for ui.perfetto.dev and
 * trace_processor.
 *
 * The file is a Trace message written one packet at a time: each packet is
 * field 1 of Trace (tag 0x0a, its length as a varint, its bytes), which is
 * exactly how a repeated field is encoded, so the whole file is one Trace
 * without ever being in memory.  Every packet is on one sequence (id 1):
 *   1. the first packet clears the sequence's incremental state
 *      (SEQ_INCREMENTAL_STATE_CLEARED): the interned names start empty;
 *   2. a name is interned the first time it is used, in that packet's
 *      interned_data (iid, name), and referred to by name_iid from then on;
 *      packets that use interned names say SEQ_NEEDS_INCREMENTAL_STATE;
 *   3. tracks are described (TrackDescriptor: a process, a thread under it)
 *      before their first event, as export.h promises;
 *   4. a message instant carries flow_ids (a send: its matches) or
 *      terminating_flow_ids (a receive): Perfetto draws the arrow;
 *   5. a slice or instant of a flow (a request) carries its correlation_id,
 *      the flow's number (f3: 3), on every host: the UI links them.
 */
#include "an_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"
#include "perfetto_trace.pb-c.h"

#define SEQ_ID 1
#define CLEARED PERFETTO__PROTOS__TRACE_PACKET__SEQUENCE_FLAGS__SEQ_INCREMENTAL_STATE_CLEARED
#define NEEDS_STATE PERFETTO__PROTOS__TRACE_PACKET__SEQUENCE_FLAGS__SEQ_NEEDS_INCREMENTAL_STATE

typedef struct name_ent {
	char *name;
	uint64_t iid;
} name_ent;

struct ex_writer {
	FILE *out;
	uint64_t bytes, max;
	int first;               /* no packet written yet */
	name_ent *names;         /* open addressing, cap a power of two */
	size_t nnames, capnames;
	uint8_t *buf;
	size_t capbuf;
};

static int names_grow(ex_writer *w)
{
	size_t cap = w->capnames ? w->capnames * 2 : 1024;
	name_ent *n = calloc(cap, sizeof *n);

	if (!n)
		return -1;
	for (size_t i = 0; i < w->capnames; i++) {
		size_t j;

		if (!w->names[i].name)
			continue;
		for (j = an_hash_str(w->names[i].name) & (cap - 1); n[j].name; j = (j + 1) & (cap - 1))
			;
		n[j] = w->names[i];
	}
	free(w->names);
	w->names = n;
	w->capnames = cap;
	return 0;
}

/* The iid of `name`; *fresh = 1 when this is its first use. 0 if out of memory. */
static uint64_t intern(ex_writer *w, const char *name, int *fresh)
{
	size_t j;

	*fresh = 0;
	if (2 * (w->nnames + 1) > w->capnames && names_grow(w) < 0)
		return 0;
	for (j = an_hash_str(name) & (w->capnames - 1); w->names[j].name;
	     j = (j + 1) & (w->capnames - 1))
		if (strcmp(w->names[j].name, name) == 0)
			return w->names[j].iid;
	if (!(w->names[j].name = strdup(name)))
		return 0;
	w->names[j].iid = ++w->nnames;
	*fresh = 1;
	return w->names[j].iid;
}

static int emit(ex_writer *w, Perfetto__Protos__TracePacket *p, int needs_state)
{
	uint8_t head[11];
	size_t n, h = 0;
	uint64_t len;

	p->has_trusted_packet_sequence_id = 1;
	p->trusted_packet_sequence_id = SEQ_ID;
	p->has_sequence_flags = 1;
	p->sequence_flags = (w->first ? CLEARED : 0) | (needs_state ? NEEDS_STATE : 0);
	w->first = 0;
	len = perfetto__protos__trace_packet__get_packed_size(p);
	if (len > w->capbuf) {
		uint8_t *b = realloc(w->buf, len);

		if (!b)
			return -1;
		w->buf = b;
		w->capbuf = len;
	}
	n = perfetto__protos__trace_packet__pack(p, w->buf);
	head[h++] = 0x0a;        /* Trace.packet: field 1, length-delimited */
	for (len = n; len >= 0x80; len >>= 7)
		head[h++] = (uint8_t)(len | 0x80);
	head[h++] = (uint8_t)len;
	if (w->max && w->bytes + h + n > w->max) {
		errno = EFBIG;
		return -1;
	}
	if (fwrite(head, 1, h, w->out) != h || fwrite(w->buf, 1, n, w->out) != n)
		return -1;
	w->bytes += h + n;
	return 0;
}

static ex_writer *pf_open(FILE *out, int64_t base_ns, uint64_t max_bytes)
{
	ex_writer *w = calloc(1, sizeof *w);

	if (!w)
		return NULL;
	w->out = out;
	w->max = max_bytes;
	w->first = 1;
	return w;
}

static int pf_process(ex_writer *w, uint64_t uuid, int32_t pid, const char *name)
{
	Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
	Perfetto__Protos__TrackDescriptor td = PERFETTO__PROTOS__TRACK_DESCRIPTOR__INIT;
	Perfetto__Protos__ProcessDescriptor pd = PERFETTO__PROTOS__PROCESS_DESCRIPTOR__INIT;

	td.has_uuid = 1;
	td.uuid = uuid;
	pd.has_pid = 1;
	pd.pid = pid;
	pd.process_name = (char *)name;
	td.process = &pd;
	p.track_descriptor = &td;
	return emit(w, &p, 0);
}

static int pf_thread(ex_writer *w, uint64_t uuid, uint64_t process_uuid, int32_t pid,
		     int32_t tid, const char *name)
{
	Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
	Perfetto__Protos__TrackDescriptor td = PERFETTO__PROTOS__TRACK_DESCRIPTOR__INIT;
	Perfetto__Protos__ThreadDescriptor th = PERFETTO__PROTOS__THREAD_DESCRIPTOR__INIT;

	td.has_uuid = 1;
	td.uuid = uuid;
	td.has_parent_uuid = 1;
	td.parent_uuid = process_uuid;
	th.has_pid = 1;
	th.pid = pid;
	th.has_tid = 1;
	th.tid = tid;
	th.thread_name = (char *)name;
	td.thread = &th;
	p.track_descriptor = &td;
	return emit(w, &p, 0);
}

/* One TrackEvent packet; name NULL for a slice's end. */
static int event(ex_writer *w, uint64_t track, Perfetto__Protos__TrackEvent__Type type,
		 const char *name, int64_t t, uint64_t corr, const uint64_t *out, size_t nout,
		 const uint64_t *in, size_t nin)
{
	Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
	Perfetto__Protos__TrackEvent ev = PERFETTO__PROTOS__TRACK_EVENT__INIT;
	Perfetto__Protos__InternedData id = PERFETTO__PROTOS__INTERNED_DATA__INIT;
	Perfetto__Protos__EventName en = PERFETTO__PROTOS__EVENT_NAME__INIT, *enp = &en;

	p.has_timestamp = 1;
	p.timestamp = t > 0 ? (uint64_t)t : 0;
	ev.has_type = 1;
	ev.type = type;
	ev.has_track_uuid = 1;
	ev.track_uuid = track;
	if (name) {
		int fresh;
		uint64_t iid = intern(w, name, &fresh);

		if (!iid)
			return errno = ENOMEM, -1;
		ev.has_name_iid = 1;
		ev.name_iid = iid;
		if (fresh) {
			en.has_iid = 1;
			en.iid = iid;
			en.name = (char *)name;
			id.n_event_names = 1;
			id.event_names = &enp;
			p.interned_data = &id;
		}
	}
	ev.has_correlation_id = corr != 0;
	ev.correlation_id = corr;
	ev.n_flow_ids = nout;
	ev.flow_ids = (uint64_t *)out;
	ev.n_terminating_flow_ids = nin;
	ev.terminating_flow_ids = (uint64_t *)in;
	p.track_event = &ev;
	return emit(w, &p, name != NULL);
}

static int pf_begin(ex_writer *w, uint64_t track, const char *name, int64_t t0, int64_t t1,
		    uint64_t corr)
{
	return event(w, track, PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_SLICE_BEGIN, name, t0,
		     corr, NULL, 0, NULL, 0);
}

static int pf_end(ex_writer *w, uint64_t track, int64_t t1)
{
	return event(w, track, PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_SLICE_END, NULL, t1,
		     0, NULL, 0, NULL, 0);
}

static int pf_instant(ex_writer *w, uint64_t track, const char *name, int64_t t,
		      uint64_t corr, const uint64_t *out, size_t nout, const uint64_t *in,
		      size_t nin)
{
	return event(w, track, PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_INSTANT, name, t, corr,
		     out, nout, in, nin);
}

static int pf_close(ex_writer *w)
{
	for (size_t i = 0; i < w->capnames; i++)
		free(w->names[i].name);
	free(w->names);
	free(w->buf);
	free(w);
	return 0;
}

static uint64_t pf_bytes(const ex_writer *w) { return w->bytes; }

const ex_format ex_perfetto = {
	"perfetto", 6, pf_open, pf_process, pf_thread, pf_begin, pf_end, pf_instant, pf_close,
	pf_bytes,
};
