/*
 * tests/fuzz/trace_seed.c — writes a seed for fuzz_trace (fuzz_trace.h): a
 * small valid trace of one thread, calls nested two deep with events and
 * message events (a TCP send, a datagram received), in
 * the shape the agent writes (trace_format.h), with the shortest ring
 * header the reader accepts so that the seed stays small.
 *
 *   trace_seed OUT plain     the ring holds everything, seg.1 its first part;
 *                            the channels file
 *   trace_seed OUT wrapped   the ring came round (count > capacity), no seg,
 *                            no channels file (messages name unknown ids)
 *   trace_seed OUT packed    a file of every record (chunks) whose records
 *                            were all packed (an_pack_ring, as sptrace run
 *                            does): ring.1 its header, packed.1 the blocks
 */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis.h"

#include "fuzz_trace.h"
#include "trace_format.h"

#define CAP 64

static char pack_dir[64];

static void remove_pack_dir(void)
{
	char path[128];

	snprintf(path, sizeof path, "%s/ring.1", pack_dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/packed.1", pack_dir);
	unlink(path);
	rmdir(pack_dir);
}

/* Append file dir/name to f. */
static int copy_file(FILE *f, const char *dir, const char *name)
{
	char path[128], buf[4096];
	size_t n;
	FILE *in;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	if (!(in = fopen(path, "rb")))
		return perror(path), 1;
	while ((n = fread(buf, 1, sizeof buf, in)) > 0)
		fwrite(buf, 1, n, f);
	fclose(in);
	return 0;
}

/* The packed variant: every record in a file of chunks (the agent's
 * keep-every-record form), packed as `sptrace run` packs a gone process's
 * file; ring.1 (then its header) goes to f, packed.1 after the channels. */
static int put_packed(FILE *f, const trace_ring_header *ring_h, const uint64_t *recs,
		      size_t count)
{
	trace_ring_header h = *ring_h;
	char path[128];
	sp_err err;
	FILE *r;

	snprintf(pack_dir, sizeof pack_dir, "/tmp/trace-seed-XXXXXX");
	if (!mkdtemp(pack_dir))
		return perror("mkdtemp"), 1;
	h.header_size = TRACE_RING_HEADER_SIZE;
	h.capacity = 16;
	h.mask = 15;
	h.chunk = 8;
	h.limit = 16;
	h.kept_end = ~0ull;
	h.pid = (uint32_t)getpid();      /* gone, as an_pack_ring is told below */
	h.flags = 0;
	snprintf(path, sizeof path, "%s/ring.1", pack_dir);
	if (!(r = fopen(path, "wb")) || fwrite(&h, sizeof h, 1, r) != 1 ||
	    fwrite(recs, 8, count, r) != count || fclose(r))
		return perror(path), 1;
	if (an_pack_ring(path, (int)getpid(), &err) != (int64_t)count) {
		fprintf(stderr, "trace_seed: %s\n", err.msg);
		return 1;
	}
	if (copy_file(f, pack_dir, "ring.1"))
		return 1;
	atexit(remove_pack_dir);
	return 0;
}

int main(int argc, char **argv)
{
	static const trace_site sites[] = {
		{ 0 },                                    /* record 0: the id counter */
		{ 0, 0, 0x1000, 0x1000, 0x1000, 0, TRACE_SITE_ROOT },
		{ 0, 0, 0x1010, 0x1000, 0x2000, 0, 0 },
		{ 0, UINT32_MAX, 0x2008, 0x2000, 0, 2, 0 },
	};
	uint64_t tsc = 1ull << 40, recs[CAP * 2], ring[CAP];
	trace_channel chans[3];
	uint64_t data[TRACE_MSG_NDATA];
	trace_ring_header h;
	trace_seg_chunk ch = { TRACE_SEG_MAGIC, 0, 4, tsc >> TRACE_TSC_LOW_BITS };
	size_t n = 0, count;
	int wrapped, packed;
	FILE *f;

	if (argc != 3 || (strcmp(argv[2], "plain") && strcmp(argv[2], "wrapped") &&
			  strcmp(argv[2], "packed"))) {
		fprintf(stderr, "usage: trace_seed OUT plain|wrapped|packed\n");
		return 2;
	}
	wrapped = strcmp(argv[2], "wrapped") == 0;
	packed = strcmp(argv[2], "packed") == 0;
	/* Records: root entry, a call, an indirect call in it, events. */
	recs[n++] = trace_sync_rec(tsc >> TRACE_TSC_LOW_BITS);
	recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_ACTIVATE, tsc);
	for (int rep = 0; rep < (wrapped ? 5 : 1); rep++) {
		recs[n++] = trace_rec(TRACE_ENTRY, 1, tsc += 100);
		recs[n++] = trace_rec(TRACE_ENTRY, 2, tsc += 100);
		recs[n++] = trace_rec(TRACE_ENTRY, 3, tsc += 100);
		/* a send of 118 bytes on channel 1, a datagram received on 2 */
		trace_msg_pack(data, 1, TRACE_CALL_SEND, TRACE_MSG_RELATIVE, 118ull * rep, 118);
		recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_SEND, tsc += 10);
		for (int k = 0; k < TRACE_MSG_NDATA; k++)
			recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[k]);
		trace_msg_pack(data, 2, TRACE_CALL_RECVFROM, TRACE_MSG_RELATIVE | TRACE_MSG_DGRAM,
			       (uint64_t)rep, 12);
		recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_RECV, tsc += 10);
		for (int k = 0; k < TRACE_MSG_NDATA; k++)
			recs[n++] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[k]);
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
	if (packed) {
		if (put_packed(f, &h, recs, count))
			return 1;
	} else {
		fwrite(&h, h.header_size, 1, f);
		fwrite(ring, sizeof ring, 1, f);
	}
	if (!wrapped) {
		fputs(FUZZ_TRACE_SEP, f);
		if (!packed) {
			fwrite(&ch, sizeof ch, 1, f);
			fwrite(recs, 8, ch.n, f);
		}
		memset(chans, 0, sizeof chans);
		chans[0].proto = 3;               /* record 0: the id counter (next id 3) */
		chans[0].pid = sizeof(trace_channel);   /* and the record size */
		chans[1] = (trace_channel){ .proto = TRACE_PROTO_TCP, .pid = 1, .inode = 77,
					    .family = AF_INET, .local_port = 40112,
					    .peer_port = 7000, .flags = TRACE_CHAN_PEER, .fd = 3 };
		memcpy(chans[1].local_addr, "\x0a\0\0\x01", 4);
		memcpy(chans[1].peer_addr, "\x0a\0\0\x02", 4);
		chans[2] = (trace_channel){ .proto = TRACE_PROTO_UDP, .pid = 1, .inode = 78,
					    .family = AF_INET6, .local_port = 53, .fd = 4 };
		fputs(FUZZ_TRACE_SEP, f);
		fwrite(chans, sizeof chans, 1, f);
	}
	if (packed && (fputs(FUZZ_TRACE_SEP, f) < 0 || copy_file(f, pack_dir, "packed.1")))
		return 1;
	return fclose(f) ? 1 : 0;
}
