/*
 * tests/fuzz/trace_seed.c — writes a seed for fuzz_trace (fuzz_trace.h): a
 * small valid trace of one thread, calls nested two deep with events, in
 * the shape the agent writes (trace_format.h), with the shortest ring
 * header the reader accepts so that the seed stays small.
 *
 *   trace_seed OUT plain     the ring holds everything, seg.1 its first part
 *   trace_seed OUT wrapped   the ring came round (count > capacity), no seg
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "fuzz_trace.h"
#include "trace_format.h"

#define CAP 32

int main(int argc, char **argv)
{
	static const trace_site sites[] = {
		{ 0 },                                    /* record 0: the id counter */
		{ 0, 0, 0x1000, 0x1000, 0x1000, 0, TRACE_SITE_ROOT },
		{ 0, 0, 0x1010, 0x1000, 0x2000, 0, 0 },
		{ 0, UINT32_MAX, 0x2008, 0x2000, 0, 2, 0 },
	};
	uint64_t tsc = 1ull << 40, recs[CAP * 2], ring[CAP];
	trace_ring_header h;
	trace_seg_chunk ch = { TRACE_SEG_MAGIC, 0, 4, tsc >> TRACE_TSC_LOW_BITS };
	size_t n = 0, count;
	int wrapped;
	FILE *f;

	if (argc != 3 || (strcmp(argv[2], "plain") && strcmp(argv[2], "wrapped"))) {
		fprintf(stderr, "usage: trace_seed OUT plain|wrapped\n");
		return 2;
	}
	wrapped = strcmp(argv[2], "wrapped") == 0;
	/* Records: root entry, a call, an indirect call in it, events. */
	recs[n++] = trace_sync_rec(tsc >> TRACE_TSC_LOW_BITS);
	recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_ACTIVATE, tsc);
	for (int rep = 0; rep < (wrapped ? 5 : 1); rep++) {
		recs[n++] = trace_rec(TRACE_ENTRY, 1, tsc += 100);
		recs[n++] = trace_rec(TRACE_ENTRY, 2, tsc += 100);
		recs[n++] = trace_rec(TRACE_ENTRY, 3, tsc += 100);
		recs[n++] = trace_rec(TRACE_EXIT, 3, tsc += 100);
		recs[n++] = trace_rec(TRACE_EXIT, 2, tsc += 100);
		recs[n++] = trace_rec(TRACE_EXIT, 1, tsc += 100);
	}
	recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_DEACTIVATE, tsc += 100);
	count = n;
	memset(ring, 0, sizeof ring);
	for (size_t i = 0; i < count; i++)
		ring[i % CAP] = recs[i];
	memset(&h, 0, sizeof h);
	h.magic = TRACE_RING_MAGIC;
	h.version = TRACE_FORMAT_VERSION;
	h.header_size = offsetof(trace_ring_header, reserved);
	h.capacity = CAP;
	h.count = count;
	h.mask = CAP - 1;
	h.epoch = tsc >> TRACE_TSC_LOW_BITS;
	h.pid = h.tid = 1;
	h.start_tsc = 1ull << 40;
	h.flags = TRACE_RING_CLOSED;
	memcpy(h.thread_name, "seed", 5);

	if (!(f = fopen(argv[1], "wb")))
		return perror(argv[1]), 1;
	fprintf(f, "version %d\npid 1\nprogram /seed\ntsc_hz 1000000000\ntsc0 %llu\n"
		"mono0_ns 1000\nreal0_ns 1000000000000000000\nmodule 0 /seed 00ff 0\n"
		"activated %llu start\nexec exec.1 2 /bin/true\nend exit\n",
		TRACE_FORMAT_VERSION, 1ull << 40, 1ull << 40);
	fputs(FUZZ_TRACE_SEP, f);
	fwrite(sites, sizeof sites, 1, f);
	fputs(FUZZ_TRACE_SEP, f);
	fwrite(&h, h.header_size, 1, f);
	fwrite(ring, sizeof ring, 1, f);
	if (!wrapped) {
		fputs(FUZZ_TRACE_SEP, f);
		fwrite(&ch, sizeof ch, 1, f);
		fwrite(recs, 8, ch.n, f);
	}
	return fclose(f) ? 1 : 0;
}
