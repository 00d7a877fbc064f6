/*
 * test_trace_read.c — the trace reader (analysis/trace_read.h) on trace
 * directories written by hand (tracegen.h):
 *
 *   1. names: sites of tests/analysis/traced.c resolve to its functions and
 *      source lines through codeanalysis; roots, PLT callees, unknown
 *      indirect callees, modules without analysis, module indexes meta lacks,
 *      site ids the sites file lacks;
 *   2. timestamps: the full TSC rebuilt across 38-bit wraps and long gaps,
 *      in a wrapped ring with a SYNC in its window (bits inferred before it)
 *      and without one (the header's epoch);
 *   2b. segments: records drained into seg.<tid> followed by the ring's,
 *      a gap counted lost, a chunk cut short;
 *   2c. chunked: a file of every record (format version 2): holes skipped,
 *      records past kept_end or past a cut file's end counted lost;
 *   2d. packed: the same file's finished chunks packed into packed.<tid>
 *      (sptrace run's compaction), then the raw chunks: the same records;
 *      all of it packed once the process is gone; a block damaged or cut
 *      short said with its file and offset, its punched records lost;
 *   3. clocks: TSC to nanoseconds at a non-1 GHz rate;
 *   4. calls: nesting, unwinding on a mismatched exit, exits without entry,
 *      calls without exit, tail jumps (no exit of their own); holes in the
 *      sites file;
 *   5. printing helpers: durations, thread selection;
 *   6. C++ names: an_demangle in each style on names of every shape
 *      (namespaces, templates, operators, lambdas, local names, clone, PLT
 *      and version suffixes, invalid and over-long symbols);
 *   7. C++ names in a trace of tests/analysis/traced_cxx.cpp, in each style.
 *
 * usage: test_trace_read TRACED-PROGRAM TRACED-CXX-PROGRAM.  Returns 0 when
 * all pass.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"
#include "tracegen.h"

static int failures;
static const char *prog, *cxx_prog;
static char root[] = "/tmp/sptrace-test-trace-read-XXXXXX";
static trace_site sites[S_COUNT];

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "test_trace_read:%d: FAIL: ", __LINE__);  \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			failures++;                                               \
		}                                                                 \
	} while (0)

static int ends_with(const char *s, const char *suffix)
{
	size_t ls = strlen(s), lx = strlen(suffix);

	return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static an_trace *open_ok(const char *dir)
{
	an_trace *t = NULL;
	sp_err err;

	if (an_trace_open(dir, &t, &err) < 0) {
		CHECK(0, "opening %s: %s", dir, err.msg);
		return NULL;
	}
	return t;
}

static const char *callee_name(an_trace *t, uint32_t id)
{
	return an_func_get(t, an_site(t, id)->callee)->name;
}

/* 1. Names. */
static void test_names(void)
{
	char *dir = tg_dir(root, "names");
	trace_site s[S_COUNT + 2];
	tg_ring r;
	an_trace *t;
	char want[128];
	const an_site_info *si;

	memcpy(s, sites, sizeof sites);
	/* S_COUNT: a function in a module without analysis; S_COUNT+1: a module
	 * meta does not list. */
	s[S_COUNT] = (trace_site){ .caller_module = 0, .callee_module = 1,
				   .caller_func = tg_func("main"), .callee_func = 0x1234 };
	s[S_COUNT + 1] = (trace_site){ .caller_module = 0, .callee_module = 7,
				       .caller_func = tg_func("main"), .callee_func = 0x1234 };
	tg_meta(dir, prog, "module 1 /nonexistent/lib gone.so deadbeef00 7f0000000000\n");
	tg_write_sites(dir, s, S_COUNT + 2);
	tg_ring_init(&r, 1234, 8, TG_TSC0);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;

	CHECK(an_trace_nmodules(t) == 2, "%zu modules, expected 2", an_trace_nmodules(t));
	CHECK(an_trace_module(t, 0)->ca != NULL, "module 0 (%s) has no analysis", prog);
	CHECK(an_trace_module(t, 1)->ca == NULL && an_trace_module(t, 1)->bias == 0x7f0000000000 &&
	      strcmp(an_trace_module(t, 1)->path, "/nonexistent/lib gone.so") == 0,
	      "module 1: path '%s' (a path with a space), bias %#" PRIx64,
	      an_trace_module(t, 1)->path, an_trace_module(t, 1)->bias);
	CHECK(strcmp(an_trace_meta(t, "host"), "testhost") == 0, "meta host is '%s'",
	      an_trace_meta(t, "host"));
	CHECK(an_nsites(t) == S_COUNT + 2, "%zu sites, expected %d", an_nsites(t), S_COUNT + 2);

	CHECK(strcmp(callee_name(t, S_LEAF), "leaf") == 0, "S_LEAF names '%s'", callee_name(t, S_LEAF));
	si = an_site(t, S_LEAF);
	CHECK(ends_with(an_func_get(t, si->callee)->src, "traced.c:20"),
	      "leaf's source is '%s', expected traced.c:20", an_func_get(t, si->callee)->src);
	CHECK(si->caller != AN_NONE && strcmp(an_func_get(t, si->caller)->name, "middle") == 0,
	      "S_LEAF's caller is not middle");
	CHECK(ends_with(si->src, "traced.c:21"), "the call to leaf is at '%s', expected traced.c:21",
	      si->src);
	CHECK(an_site(t, S_MIDDLE)->callee == an_site(t, S_W_MIDDLE)->callee,
	      "two sites calling middle give two functions");
	si = an_site(t, S_MAIN);
	CHECK(si->valid && si->caller == AN_NONE && (si->flags & TRACE_SITE_ROOT) &&
	      strcmp(callee_name(t, S_MAIN), "main") == 0, "the root site is not main's");
	CHECK(strcmp(callee_name(t, S_PRINTF), "printf@plt") == 0, "S_PRINTF names '%s'",
	      callee_name(t, S_PRINTF));
	snprintf(want, sizeof want, "<indirect@main+0x%" PRIx64 ">",
		 sites[S_HOOK].site_addr - tg_func("main"));
	CHECK(strcmp(callee_name(t, S_HOOK), want) == 0, "S_HOOK names '%s', expected '%s'",
	      callee_name(t, S_HOOK), want);
	CHECK(strcmp(callee_name(t, S_COUNT), "lib gone.so+0x1234") == 0,
	      "a function of a module without analysis is '%s'", callee_name(t, S_COUNT));
	CHECK(strcmp(callee_name(t, S_COUNT + 1), "?module7+0x1234") == 0,
	      "a function of an unknown module is '%s'", callee_name(t, S_COUNT + 1));
	si = an_site(t, 99);
	CHECK(!si->valid && strcmp(callee_name(t, 99), "?site 99") == 0 && an_site(t, 99) == si,
	      "site 99 (not in the file) is '%s'", callee_name(t, 99));
	CHECK(strcmp(callee_name(t, 0), "?site 0") == 0, "site 0 is '%s'", callee_name(t, 0));

	/* Two warnings: module 1 has no analysis, and a site names module 7. */
	CHECK(an_trace_nwarnings(t) == 2, "%zu warnings, expected 2", an_trace_nwarnings(t));
	for (size_t i = 0; i < an_trace_nwarnings(t); i++)
		CHECK(strstr(an_trace_warning(t, i), "module 1") ||
		      strstr(an_trace_warning(t, i), "name a module meta has no"),
		      "unexpected warning: %s", an_trace_warning(t, i));
	an_trace_close(t);

	/* A partial site record at the end is a warning, not an error. */
	tg_write_sites(dir, s, S_COUNT);
	{
		FILE *f;
		char path[4200];

		snprintf(path, sizeof path, "%s/sites", dir);
		f = fopen(path, "a");
		fwrite("\1\2\3", 1, 3, f);
		fclose(f);
	}
	if ((t = open_ok(dir))) {
		int found = 0;
		for (size_t i = 0; i < an_trace_nwarnings(t); i++)
			found |= strstr(an_trace_warning(t, i), "3 bytes after the last whole site") != NULL;
		CHECK(found, "no warning about the partial site record");
		CHECK(an_nsites(t) == S_COUNT, "%zu sites after a partial record", an_nsites(t));
		an_trace_close(t);
	}
out:
	free(dir);
}

/* Iterate thread 0 of dir and compare with want[]. */
static void check_records(const char *what, const char *dir, const an_record *want, size_t n,
			  size_t nguessed)
{
	an_trace *t = open_ok(dir);
	an_iter *it;
	an_record r;
	sp_err err;
	size_t i = 0;

	if (!t)
		return;
	if (an_iter_open(t, an_trace_thread(t, 0), &it, &err) < 0) {
		CHECK(0, "%s: %s", what, err.msg);
		an_trace_close(t);
		return;
	}
	while (an_iter_next(it, &r)) {
		if (i < n)
			CHECK(r.tsc == want[i].tsc && r.kind == want[i].kind && r.id == want[i].id,
			      "%s: record %zu is kind %u id %u tsc %#" PRIx64 ", expected kind %u "
			      "id %u tsc %#" PRIx64, what, i, r.kind, r.id, r.tsc, want[i].kind,
			      want[i].id, want[i].tsc);
		i++;
	}
	CHECK(i == n, "%s: %zu records, expected %zu", what, i, n);
	CHECK(an_iter_stats_get(it)->nguessed == nguessed, "%s: %zu records guessed, expected %zu",
	      what, an_iter_stats_get(it)->nguessed, nguessed);
	an_iter_close(it);
	an_trace_close(t);
}

/* 2. Timestamps. */
static void test_tsc(void)
{
	char *dir = tg_dir(root, "tsc");
	const uint64_t P = 1ull << 38;
	an_record want[16];
	size_t n = 0;
	tg_ring r;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);

	/* Across a wrap of the low bits, and a gap of three periods. */
	tg_ring_init(&r, 1234, 16, 5 * P - 1000);
	want[n++] = (an_record){ 5 * P - 500, S_MAIN, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	want[n++] = (an_record){ 5 * P - 100, S_LEAF, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	want[n++] = (an_record){ 5 * P + 400, S_LEAF, TRACE_EXIT, 0, { { 0 } }, 0, 0 };
	want[n++] = (an_record){ 5 * P + 500, S_WORKER, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	want[n++] = (an_record){ 8 * P + 500, S_WORKER, TRACE_EXIT, 0, { { 0 } }, 0, 0 };
	want[n++] = (an_record){ 8 * P + 1000, S_MAIN, TRACE_EXIT, 0, { { 0 } }, 0, 0 };
	for (size_t i = 0; i < n; i++)
		tg_put(&r, want[i].kind, want[i].id, want[i].tsc);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	check_records("38-bit wrap", dir, want, n, 0);

	/* Wrapped, a SYNC in the window: the 4 records before it take its high
	 * bits minus one. */
	n = 0;
	tg_ring_init(&r, 1234, 8, 4 * P);
	for (int i = 0; i < 10; i++)
		tg_put(&r, TRACE_ENTRY, S_FACT_REC, 4 * P + 100 * (uint64_t)i);
	for (int i = 0; i < 3; i++)
		tg_put(&r, TRACE_EXIT, S_FACT_REC, 5 * P + 100 * (uint64_t)i);
	for (int i = 6; i < 10; i++)
		want[n++] = (an_record){ 4 * P + 100 * (uint64_t)i, S_FACT_REC, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	for (int i = 0; i < 3; i++)
		want[n++] = (an_record){ 5 * P + 100 * (uint64_t)i, S_FACT_REC, TRACE_EXIT, 0, { { 0 } }, 0, 0 };
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	check_records("wrapped, SYNC in window", dir, want, n, 4);

	/* Wrapped, no SYNC left: the header's epoch. */
	n = 0;
	tg_ring_init(&r, 1234, 4, 6 * P + 7);
	for (int i = 0; i < 10; i++)
		tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, 6 * P + 10 + (uint64_t)i);
	for (int i = 6; i < 10; i++)
		want[n++] = (an_record){ 6 * P + 10 + (uint64_t)i, TRACE_EV_ACTIVATE, TRACE_EVENT, 0, { { 0 } }, 0, 0 };
	tg_ring_write(&r, dir, NULL, -1);
	{
		an_trace *t = open_ok(dir);
		if (t) {
			CHECK(an_trace_thread(t, 0)->lost == 7 && an_trace_thread(t, 0)->count == 11,
			      "lost %" PRIu64 " of %" PRIu64 ", expected 7 of 11",
			      an_trace_thread(t, 0)->lost, an_trace_thread(t, 0)->count);
			CHECK(strcmp(an_trace_thread(t, 0)->name, "t1234") == 0, "thread name '%s'",
			      an_trace_thread(t, 0)->name);
			an_trace_close(t);
		}
	}
	tg_ring_free(&r);
	check_records("wrapped, no SYNC in window", dir, want, n, 0);
	free(dir);
}

/*
 * 2b. Records drained by `sptrace run` (seg.<tid>): a ring of 16 slots that
 * took 60 records (a SYNC, then entries at T + index); chunk A holds indices
 * 0-29, chunk B 37-44 (the drain fell behind in between), a third chunk is
 * cut short (a crash while it was written: ignored).  The thread's records:
 * 0-29, 37-44, then the ring's from 45; 30-36 are lost.
 */
static void test_segments(void)
{
	char *dir = tg_dir(root, "segments"), path[4200];
	const uint64_t T = 4 * (1ull << 38) + 1000;
	uint64_t all[60];
	an_record want[60];
	size_t n = 0;
	an_trace *t;
	tg_ring r;
	FILE *f;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_ring_init(&r, 1234, 16, T);
	all[0] = TRACE_SYNC | (T >> TRACE_TSC_LOW_BITS) << 2;
	for (uint64_t i = 1; i < 60; i++) {
		all[i] = trace_rec(TRACE_ENTRY, S_FACT_REC, T + i);
		tg_put_raw(&r, all[i]);
	}
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	snprintf(path, sizeof path, "%s/seg.1234", dir);
	f = fopen(path, "w");
	if (!f)
		tg_die("cannot write %s", path);
	{
		trace_seg_chunk a = { TRACE_SEG_MAGIC, 0, 30, T >> TRACE_TSC_LOW_BITS };
		trace_seg_chunk b = { TRACE_SEG_MAGIC, 37, 8, T >> TRACE_TSC_LOW_BITS };
		trace_seg_chunk c = { TRACE_SEG_MAGIC, 45, 100, T >> TRACE_TSC_LOW_BITS };

		fwrite(&a, sizeof a, 1, f);
		fwrite(all, 8, 30, f);
		fwrite(&b, sizeof b, 1, f);
		fwrite(all + 37, 8, 8, f);
		fwrite(&c, sizeof c, 1, f);
		fwrite(all + 45, 8, 3, f);
	}
	fclose(f);
	for (uint64_t i = 1; i < 60; i++)
		if (i < 30 || i >= 37)
			want[n++] = (an_record){ T + i, S_FACT_REC, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	check_records("segments", dir, want, n, 0);
	if ((t = open_ok(dir))) {
		const an_thread *th = an_trace_thread(t, 0);

		CHECK(th->lost == 7 && th->drained == 38,
		      "segments: %" PRIu64 " lost and %" PRIu64 " drained, expected 7 and 38",
		      th->lost, th->drained);
		an_trace_close(t);
	}
	free(dir);
}

/*
 * 2c. A file of every record (format version 2, trace_format.h "Rings and
 * chunks"): chunks of 8 records, a window of 16; 40 records written (a
 * SYNC, then entries at T + index) in order after the header, the one at
 * index 20 a zero slot (skipped: a hole), the file growing stopped at
 * kept_end 32 (ENOSPC): the thread's records are 0-31 but 20, the 8 after
 * are lost and said so.  Then the same file cut to 28 records with no
 * kept_end: 12 lost, warned of as a cut file.
 */
static void write_chunked(const char *dir, const uint64_t *all, uint64_t count,
			  uint64_t in_file, uint64_t kept_end, int err_no, uint64_t start)
{
	char path[4200];
	trace_ring_header h;
	FILE *f;

	memset(&h, 0, sizeof h);
	h.magic = TRACE_RING_MAGIC;
	h.version = TRACE_FORMAT_VERSION;
	h.header_size = TRACE_RING_HEADER_SIZE;
	h.capacity = 16;
	h.mask = 15;
	h.chunk = 8;
	h.limit = 40;
	h.count = count;
	h.kept_end = kept_end;
	h.kept_errno = err_no;
	h.pid = 1234;
	h.tid = 1234;
	h.start_tsc = start;
	h.epoch = start >> TRACE_TSC_LOW_BITS;
	snprintf(path, sizeof path, "%s/ring.1234", dir);
	f = fopen(path, "w");
	if (!f || fwrite(&h, sizeof h, 1, f) != 1 || fwrite(all, 8, in_file, f) != in_file)
		tg_die("cannot write %s", path);
	fclose(f);
}

static void test_chunked(void)
{
	char *dir = tg_dir(root, "chunked");
	const uint64_t T = 3 * (1ull << 38) + 500;
	uint64_t all[48] = { 0 };
	an_record want[48];
	size_t n = 0;
	an_trace *t;
	an_lost l;
	char text[512];

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	all[0] = TRACE_SYNC | (T >> TRACE_TSC_LOW_BITS) << 2;
	for (uint64_t i = 1; i < 40; i++)
		all[i] = i == 20 ? 0 : trace_rec(TRACE_ENTRY, S_FACT_REC, T + i);
	/* The file grown to 48 slots (the chunk ahead), kept_end 32. */
	write_chunked(dir, all, 40, 48, 32, ENOSPC, T);
	for (uint64_t i = 1; i < 32; i++)
		if (i != 20)
			want[n++] = (an_record){ T + i, S_FACT_REC, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	check_records("chunked", dir, want, n, 0);
	if ((t = open_ok(dir))) {
		const an_thread *th = an_trace_thread(t, 0);

		CHECK(th->chunk == 8 && th->lost == 8 && th->lost_why == AN_LOST_GROW &&
		      th->lost_errno == ENOSPC,
		      "chunked: chunk %" PRIu64 ", %" PRIu64 " lost (why %d, errno %d), expected "
		      "8, 8 lost (the file could not grow, ENOSPC)", th->chunk, th->lost,
		      th->lost_why, th->lost_errno);
		an_trace_lost(t, &l);
		an_lost_text(&l, text, sizeof text);
		CHECK(l.written == 40 && l.lost == 8 &&
		      strstr(text, "8 of 40 records lost") && strstr(text, "could not grow") &&
		      strstr(text, strerror(ENOSPC)), "chunked: lost text '%s'", text);
		an_trace_close(t);
	}
	/* Cut to 28 records: 12 lost, and a warning. */
	write_chunked(dir, all, 40, 28, ~0ull, 0, T);
	n = 0;
	for (uint64_t i = 1; i < 28; i++)
		if (i != 20)
			want[n++] = (an_record){ T + i, S_FACT_REC, TRACE_ENTRY, 0, { { 0 } }, 0, 0 };
	check_records("chunked, cut", dir, want, n, 0);
	if ((t = open_ok(dir))) {
		const an_thread *th = an_trace_thread(t, 0);
		int warned = 0;

		for (size_t i = 0; i < an_trace_nwarnings(t); i++)
			warned |= strstr(an_trace_warning(t, i), "a file cut short") != NULL;
		CHECK(th->lost == 12 && th->lost_why == AN_LOST_CUT && warned,
		      "chunked, cut: %" PRIu64 " lost (why %d), warned %d; expected 12, cut, 1",
		      th->lost, th->lost_why, warned);
		an_trace_close(t);
	}
	free(dir);
}

/*
 * 2d. Packed blocks (trace_format.h, "Packed blocks").  A file of every
 * record with chunks of 512 (a page of records apiece, so punched chunks
 * are holes), 4 chunks and 100 records written: nested calls, exits of
 * entries deep in the stack and of none, events, a zero slot, SYNCs, a
 * TSC wrap.  The agent's window is chunks 3 and 4 (limit 2048): chunks 0-2
 * are finished.  Packing them (an_pack_ring, as `sptrace run` does while
 * the process runs) must give the same records as the raw file, with
 * chunks 0-2 freed in ring.<tid>; packing again adds nothing; packing once
 * the process is gone packs the rest and cuts ring.<tid> to its header
 * (nothing lost, nothing said).  Then the second block damaged (a
 * flipped byte: its 512 records, punched, counted lost, the next blocks
 * read), and cut short (the blocks from there on are gone: 1024 records
 * lost): said, with packed.<tid> and the block's offset; the rest read.
 */
#define PK_CHUNK 512

static size_t collect(const char *dir, an_record *out, size_t max)
{
	an_trace *t = open_ok(dir);
	an_iter *it;
	an_record r;
	sp_err err;
	size_t n = 0;

	if (!t)
		return 0;
	if (an_iter_open(t, an_trace_thread(t, 0), &it, &err) < 0) {
		CHECK(0, "%s: %s", dir, err.msg);
		an_trace_close(t);
		return 0;
	}
	while (an_iter_next(it, &r))
		if (n < max)
			out[n++] = r;
	an_iter_close(it);
	an_trace_close(t);
	return n;
}

static void same_records(const char *what, const char *dir, const char *want_dir)
{
	static an_record got[8 * PK_CHUNK], want[8 * PK_CHUNK];
	size_t n = collect(dir, got, 8 * PK_CHUNK), m = collect(want_dir, want, 8 * PK_CHUNK);
	size_t bad = 0;

	CHECK(n == m && n > 0, "%s: %zu records, expected %zu", what, n, m);
	for (size_t i = 0; i < n && i < m; i++)
		if (memcmp(&got[i], &want[i], sizeof got[i]) && bad++ < 3)
			CHECK(0, "%s: record %zu is kind %u id %u tsc %#" PRIx64 ", expected kind %u "
			      "id %u tsc %#" PRIx64, what, i, got[i].kind, got[i].id, got[i].tsc,
			      want[i].kind, want[i].id, want[i].tsc);
}

static void write_packable(const char *dir, const uint64_t *all, uint64_t count)
{
	char path[4200];
	trace_ring_header h;
	FILE *f;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	memset(&h, 0, sizeof h);
	h.magic = TRACE_RING_MAGIC;
	h.version = TRACE_FORMAT_VERSION;
	h.header_size = TRACE_RING_HEADER_SIZE;
	h.capacity = 2 * PK_CHUNK;
	h.mask = 2 * PK_CHUNK - 1;
	h.chunk = PK_CHUNK;
	h.limit = 4 * PK_CHUNK;
	h.count = count;
	h.kept_end = ~0ull;
	h.pid = (uint32_t)getpid();     /* running: only finished chunks are packed */
	h.tid = 1234;
	h.start_tsc = all[0] >> 2 << TRACE_TSC_LOW_BITS;
	for (uint64_t i = 0; i < count; i++)   /* the last SYNC's, as the agent keeps it */
		if (all[i] && trace_rec_kind(all[i]) == TRACE_SYNC)
			h.epoch = trace_sync_high(all[i]);
	snprintf(path, sizeof path, "%s/packed.1234", dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/ring.1234", dir);
	f = fopen(path, "w");
	if (!f || fwrite(&h, sizeof h, 1, f) != 1 || fwrite(all, 8, count, f) != count)
		tg_die("cannot write %s", path);
	fclose(f);
}

static long file_blocks(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (long)st.st_blocks : -1;
}

static void test_packed(void)
{
	static uint64_t all[4 * PK_CHUNK + 100];
	const uint64_t n = 4 * PK_CHUNK + 100, P = 1ull << 38;
	uint64_t tsc = 5 * P - 3000, high = tsc >> TRACE_TSC_LOW_BITS;
	char *raw = tg_dir(root, "packed-raw"), *pk = tg_dir(root, "packed"), path[4200];
	char *lost = tg_dir(root, "packed-lost");
	an_trace *t;
	uint32_t stack[64];
	unsigned sp = 0;
	sp_err err;
	int64_t got;

	all[0] = trace_sync_rec(high);
	for (uint64_t i = 1; i < n; i++) {
		tsc += 1 + (i * 7919) % 13;
		if (tsc >> TRACE_TSC_LOW_BITS != high || i == 2 * PK_CHUNK) {
			high = tsc >> TRACE_TSC_LOW_BITS;
			all[i] = trace_sync_rec(high);   /* a wrap; and one where chunk 2 starts */
			continue;
		}
		if (i == 700)
			all[i] = 0;                                        /* a zero slot */
		else if (i % 97 == 0)
			all[i] = trace_rec(TRACE_EVENT, TRACE_EV_SIGNAL, tsc);
		else if (i % 89 == 0)
			all[i] = trace_rec(TRACE_EXIT, S_HOOK, tsc);     /* on no entry */
		else if (sp && (sp == 64 || (i * 31) % 5 < 2)) {
			unsigned d = i % 11 == 0 && sp > 3 ? 2 : 0;        /* below the top */

			sp -= d;
			all[i] = trace_rec(TRACE_EXIT, stack[--sp], tsc);
		} else {
			stack[sp] = S_MIDDLE + (uint32_t)((i * 13) % (S_COUNT - 2));
			all[i] = trace_rec(TRACE_ENTRY, stack[sp++], tsc);
		}
	}
	write_packable(raw, all, n);
	write_packable(pk, all, n);
	snprintf(path, sizeof path, "%s/ring.1234", pk);
	got = an_pack_ring(path, 0, &err);
	CHECK(got == 3 * PK_CHUNK, "packed: %" PRId64 " records packed (%s), expected %d", got,
	      got < 0 ? err.msg : "", 3 * PK_CHUNK);
	CHECK(file_blocks(path) * 512 <= TRACE_RING_HEADER_SIZE + (long)(PK_CHUNK + 100) * 8 + 4096,
	      "packed: ring.1234 holds %ld bytes, expected its packed chunks freed",
	      file_blocks(path) * 512);
	same_records("packed, running", pk, raw);
	got = an_pack_ring(path, 0, &err);
	CHECK(got == 0, "packed again: %" PRId64 " records packed, expected 0", got);
	got = an_pack_ring(path, (int)getpid(), &err);
	CHECK(got == PK_CHUNK + 100, "packed, gone: %" PRId64 " records packed, expected %d",
	      got, PK_CHUNK + 100);
	{
		struct stat st;

		CHECK(stat(path, &st) == 0 && st.st_size == TRACE_RING_HEADER_SIZE,
		      "packed, gone: ring.1234 is %lld bytes, expected cut to its header",
		      (long long)st.st_size);
	}
	same_records("packed, gone", pk, raw);
	if ((t = open_ok(pk))) {
		CHECK(an_trace_thread(t, 0)->lost == 0 && an_trace_nwarnings(t) == 0,
		      "packed, gone: %" PRIu64 " lost, %zu warnings (%s), expected none",
		      an_trace_thread(t, 0)->lost, an_trace_nwarnings(t),
		      an_trace_nwarnings(t) ? an_trace_warning(t, 0) : "");
		an_trace_close(t);
	}

	/* Block 1 (records 512-1023) damaged: expected, those records zero
	 * (skipped as holes; lost), and the SYNC at 1024 so they come back
	 * alike.  Written fresh: blocks 0-2 packed, chunk 3 raw. */
	for (int cut = 0; cut < 2; cut++) {
		static uint64_t holed[4 * PK_CHUNK + 100];
		char ppath[4200];
		off_t off1;
		int fd, said = 0;
		trace_pack_block b;

		memcpy(holed, all, sizeof all);
		/* (cut short, block 2 goes too: its records were punched) */
		memset(holed + PK_CHUNK, 0, (cut ? 2 : 1) * PK_CHUNK * 8);
		write_packable(lost, holed, n);
		write_packable(pk, all, n);
		if (an_pack_ring(path, 0, &err) != 3 * PK_CHUNK)
			CHECK(0, "packed, damaged: %s", err.msg);
		snprintf(ppath, sizeof ppath, "%s/packed.1234", pk);
		fd = open(ppath, O_RDWR);
		if (fd < 0 || pread(fd, &b, sizeof b, 0) != (ssize_t)sizeof b)
			tg_die("cannot read %s", ppath);
		off1 = (off_t)(sizeof b + b.zlen);
		if (cut) {
			if (ftruncate(fd, off1 + (off_t)sizeof b + 3) < 0)
				tg_die("cannot cut %s", ppath);
		} else {
			char c;

			if (pread(fd, &c, 1, off1 + (off_t)sizeof b + 5) != 1)
				tg_die("cannot read %s", ppath);
			c ^= 0x10;
			if (pwrite(fd, &c, 1, off1 + (off_t)sizeof b + 5) != 1)
				tg_die("cannot write %s", ppath);
		}
		close(fd);
		same_records(cut ? "packed, cut short" : "packed, damaged", pk, lost);
		if ((t = open_ok(pk))) {
			char want[4300];

			snprintf(want, sizeof want, "packed.1234: the block at offset %lld is "
				 "unreadable: %s", (long long)off1, cut ? "cut short" :
				 "its checksum does not match");
			for (size_t i = 0; i < an_trace_nwarnings(t); i++)
				said |= strstr(an_trace_warning(t, i), want) != NULL;
			CHECK(said && an_trace_thread(t, 0)->lost == (cut ? 2u : 1u) * PK_CHUNK,
			      "packed, %s: said %d ('%s' expected), %" PRIu64 " lost, expected %d",
			      cut ? "cut short" : "damaged", said, want,
			      an_trace_thread(t, 0)->lost, (cut ? 2 : 1) * PK_CHUNK);
			an_trace_close(t);
		}
	}
	free(raw);
	free(pk);
	free(lost);
}

/* 3. Clocks at 3 GHz. */
static void test_clocks(void)
{
	char *dir = tg_dir(root, "clocks"), text[512];
	tg_ring r;
	an_trace *t;

	snprintf(text, sizeof text,
		 "version 1\ntsc_hz 3000000000\ntsc0 3000000\nmono0_ns 77\nreal0_ns %lld\n",
		 TG_REAL0);
	tg_write(dir, "meta", text, strlen(text));
	tg_write_sites(dir, sites, S_COUNT);
	tg_ring_init(&r, 11, 8, 9000000);
	tg_ring_write(&r, dir, NULL, -1);
	r.tid = 10;
	r.start_tsc = 6000000;
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	CHECK(an_tsc_ns(t, 0, 3000) == 1000, "3000 ticks at 3 GHz are %" PRIu64 " ns",
	      an_tsc_ns(t, 0, 3000));
	CHECK(an_tsc_ns(t, 3000, 0) == 0, "a negative duration is not 0");
	CHECK(an_realtime_ns(t, 3000000 + 3000000000ull) == TG_REAL0 + 1000000000,
	      "realtime one second after tsc0 is %" PRId64, an_realtime_ns(t, 3000000 + 3000000000ull));
	CHECK(an_monotonic_ns(t, 0) == 77 - 1000000, "monotonic at TSC 0 is %" PRId64,
	      an_monotonic_ns(t, 0));
	CHECK(an_trace_start_tsc(t) == 6000000, "trace start is %" PRIu64 ", expected the "
	      "earliest ring's 6000000", an_trace_start_tsc(t));
	CHECK(an_trace_nthreads(t) == 2 && an_trace_thread(t, 0)->tid == 10 &&
	      an_trace_thread(t, 1)->tid == 11, "threads not sorted by tid");
	CHECK(an_trace_nmodules(t) == 0 && an_trace_meta(t, "pid") == NULL, "a meta without "
	      "modules or pid has some");
	an_trace_close(t);
out:
	free(dir);
}

/* 4. Calls: a mismatched exit unwinds; an unknown exit stands alone. */
static void test_calls(void)
{
	static const struct { unsigned kind; uint32_t id; } recs[] = {
		{ TRACE_ENTRY, S_MAIN }, { TRACE_ENTRY, S_WORKER }, { TRACE_ENTRY, S_W_MIDDLE },
		{ TRACE_ENTRY, S_LEAF }, { TRACE_EXIT, S_WORKER }, { TRACE_EXIT, S_W_LEAF },
		{ TRACE_EVENT, TRACE_EV_SIGNAL }, { TRACE_ENTRY, S_FACT },
	};
	static const an_call want[] = {
		/* kind, flags, end, id, depth, last, t0, t1 (offsets from T) */
		{ AN_CALL, 0, AN_END_TRACE, S_MAIN, 0, 7, 0, 700 },
		{ AN_CALL, 0, AN_END_EXIT, S_WORKER, 1, 4, 100, 400 },
		{ AN_CALL, 0, AN_END_UNWOUND, S_W_MIDDLE, 2, 4, 200, 400 },
		{ AN_CALL, 0, AN_END_UNWOUND, S_LEAF, 3, 4, 300, 400 },
		{ AN_EXIT_ONLY, 0, 0, S_W_LEAF, 1, 0, 500, 500 },
		{ AN_EVENT, 0, 0, TRACE_EV_SIGNAL, 1, 0, 600, 600 },
		{ AN_CALL, 0, AN_END_TRACE, S_FACT, 1, 7, 700, 700 },
	};
	const uint64_t T = TG_TSC0 + 1000;
	char *dir = tg_dir(root, "calls");
	an_call *c;
	size_t n;
	an_trace *t;
	sp_err err;
	tg_ring r;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	for (size_t i = 0; i < sizeof recs / sizeof *recs; i++)
		tg_put(&r, recs[i].kind, recs[i].id, T + 100 * i);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	if (an_thread_calls(t, an_trace_thread(t, 0), &c, &n, NULL, &err) < 0) {
		CHECK(0, "an_thread_calls: %s", err.msg);
	} else {
		CHECK(n == sizeof want / sizeof *want, "%zu items, expected %zu", n,
		      sizeof want / sizeof *want);
		for (size_t i = 0; i < n && i < sizeof want / sizeof *want; i++) {
			const an_call *w = &want[i];
			CHECK(c[i].kind == w->kind && c[i].end == w->end && c[i].id == w->id &&
			      c[i].depth == w->depth && (w->kind != AN_CALL || c[i].last == w->last) &&
			      c[i].t0 == T + w->t0 && c[i].t1 == T + w->t1,
			      "item %zu: kind %u end %u id %u depth %u last %zu t %" PRIu64 "..%" PRIu64
			      "; expected kind %u end %u id %u depth %u last %zu t %" PRIu64 "..%" PRIu64,
			      i, c[i].kind, c[i].end, c[i].id, c[i].depth, c[i].last, c[i].t0 - T,
			      c[i].t1 - T, w->kind, w->end, w->id, w->depth, w->last, w->t0, w->t1);
		}
		free(c);
	}
	an_trace_close(t);
out:
	free(dir);
}

/* 4b. Tail jumps close with their caller; a hole in the sites file is a bad id. */
static void test_tail_and_holes(void)
{
	static const struct { unsigned kind; uint32_t id; } recs[] = {
		{ TRACE_ENTRY, S_MAIN }, { TRACE_ENTRY, S_MIDDLE }, { TRACE_ENTRY, S_TAIL },
		{ TRACE_EXIT, S_MIDDLE },                /* leaf returned for middle */
		{ TRACE_ENTRY, S_WORKER }, { TRACE_ENTRY, S_TAIL },
		{ TRACE_EXIT, S_MAIN },                  /* worker never returned */
		{ TRACE_ENTRY, S_FACT }, { TRACE_EXIT, S_FACT },  /* S_FACT: a hole */
	};
	static const an_call want[] = {
		{ AN_CALL, 0, AN_END_EXIT, S_MAIN, 0, 5, 0, 600 },
		{ AN_CALL, 0, AN_END_EXIT, S_MIDDLE, 1, 3, 100, 300 },
		{ AN_CALL, 0, AN_END_TAIL, S_TAIL, 2, 3, 200, 300 },
		{ AN_CALL, 0, AN_END_UNWOUND, S_WORKER, 1, 5, 400, 600 },
		{ AN_CALL, 0, AN_END_UNWOUND, S_TAIL, 2, 5, 500, 600 },
		{ AN_CALL, 0, AN_END_EXIT, S_FACT, 0, 6, 700, 800 },
	};
	const uint64_t T = TG_TSC0 + 1000;
	char *dir = tg_dir(root, "tail");
	trace_site s[S_COUNT];
	an_iter_stats st;
	an_call *c;
	size_t n;
	an_trace *t;
	sp_err err;
	tg_ring r;

	memcpy(s, sites, sizeof s);
	memset(&s[S_FACT], 0, sizeof s[S_FACT]);
	tg_meta(dir, prog, "");
	tg_write_sites(dir, s, S_COUNT);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	for (size_t i = 0; i < sizeof recs / sizeof *recs; i++)
		tg_put(&r, recs[i].kind, recs[i].id, T + 100 * i);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	CHECK(an_site_is_tail(an_site(t, S_TAIL)) && !an_site_is_tail(an_site(t, S_LEAF)),
	      "S_TAIL is not a tail jump, or S_LEAF is");
	if (an_thread_calls(t, an_trace_thread(t, 0), &c, &n, &st, &err) < 0) {
		CHECK(0, "an_thread_calls: %s", err.msg);
	} else {
		CHECK(n == sizeof want / sizeof *want, "%zu items, expected %zu", n,
		      sizeof want / sizeof *want);
		for (size_t i = 0; i < n && i < sizeof want / sizeof *want; i++) {
			const an_call *w = &want[i];
			CHECK(c[i].kind == w->kind && c[i].end == w->end && c[i].id == w->id &&
			      c[i].depth == w->depth && c[i].last == w->last &&
			      c[i].t0 == T + w->t0 && c[i].t1 == T + w->t1,
			      "tail item %zu: kind %u end %u id %u depth %u last %zu t %" PRIu64
			      "..%" PRIu64, i, c[i].kind, c[i].end, c[i].id, c[i].depth, c[i].last,
			      c[i].t0 - T, c[i].t1 - T);
		}
		CHECK(st.nbad_sites == 2, "%zu records with bad site ids, expected the 2 of the "
		      "hole", st.nbad_sites);
		free(c);
	}
	CHECK(!an_site(t, S_FACT)->valid && strcmp(callee_name(t, S_FACT), "?site 4") == 0,
	      "the hole S_FACT is '%s'", callee_name(t, S_FACT));
	an_trace_close(t);
out:
	free(dir);
}

/* 5. Printing helpers. */
static void test_helpers(void)
{
	static const struct { uint64_t ns; const char *s; } d[] = {
		{ 0, "   0.000 us" }, { 512, "   0.512 us" }, { 999999, " 999.999 us" },
		{ 1000000, "   1.000 ms" }, { 1500000000, "   1.500  s" },
		{ 824633720832ull, " 824.633  s" },
	};
	char buf[24], *dir = tg_dir(root, "helpers");
	unsigned char sel[3];
	an_trace *t;
	sp_err err;
	tg_ring r;

	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		CHECK(strcmp(an_fmt_duration(d[i].ns, buf), d[i].s) == 0,
		      "%" PRIu64 " ns prints as '%s', expected '%s'", d[i].ns, buf, d[i].s);

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_ring_init(&r, 5, 8, TG_TSC0);
	tg_ring_write(&r, dir, NULL, -1);
	r.tid = 6;
	tg_ring_write(&r, dir, NULL, -1);
	r.tid = 7;
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	CHECK(an_select_threads(t, "7,5", sel, &err) == 0 && sel[0] && !sel[1] && sel[2],
	      "selecting 7,5 failed");
	CHECK(an_select_threads(t, "5,x", sel, &err) < 0 &&
	      strstr(err.msg, "'5,x' is not a thread id"), "'5,x' was accepted");
	CHECK(an_select_threads(t, "8", sel, &err) < 0 &&
	      strstr(err.msg, "no thread 8 in this trace (it has 5, 6, 7)"),
	      "selecting thread 8: '%s'", err.msg);
	an_trace_close(t);
out:
	free(dir);
}

/* 6. C++ names: an_demangle on names of every shape, in each style. */
static void test_demangle_strings(void)
{
	static const struct { const char *sym, *simple, *full; } d[] = {
		/* not C++, or not a valid mangling: as they are */
		{ "main", "main", "main" },
		{ "sub_1234", "sub_1234", "sub_1234" },
		{ "printf@plt", "printf@plt", "printf@plt" },
		{ "_Z", "_Z", "_Z" },
		{ "_Zxx", "_Zxx", "_Zxx" },
		{ "_Zfoo.cold", "_Zfoo.cold", "_Zfoo.cold" },
		/* namespaces, classes, qualifiers */
		{ "_ZN2ns5Class6methodEi", "ns::Class::method", "ns::Class::method(int)" },
		{ "_ZNK2ns5Class7cmethodEv", "ns::Class::cmethod", "ns::Class::cmethod() const" },
		{ "_ZN2ns5ClassD2Ev", "ns::Class::~Class", "ns::Class::~Class()" },
		{ "_ZN2ns12_GLOBAL__N_16hiddenEi", "ns::(anonymous namespace)::hidden",
		  "ns::(anonymous namespace)::hidden(int)" },
		{ "_ZN2ns3abiB5cxx11Ei", "ns::abi", "ns::abi[abi:cxx11](int)" },
		/* templates: arguments and the return type go */
		{ "_ZNK2ns3BoxIiE3getIiEET_i", "ns::Box::get",
		  "int ns::Box<int>::get<int>(int) const" },
		{ "_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector::push_back",
		  "std::vector<int, std::allocator<int> >::push_back(int const&)" },
		{ "_ZNKSt8functionIFviEEclEi", "std::function::operator()",
		  "std::function<void (int)>::operator()(int) const" },
		{ "_Z5tfptrIcEPFiiET_", "tfptr", "int (*tfptr<char>(char))(int)" },
		{ "_Z1fIiERA3_iT_", "f", "int (&f<int>(int)) [3]" },
		{ "_Z1fIiEDTcl1gfp_EET_", "f", "decltype (g({parm#1})) f<int>(int)" },
		/* operators */
		{ "_ZNK2ns5ClassltERKS0_", "ns::Class::operator<",
		  "ns::Class::operator<(ns::Class const&) const" },
		{ "_ZN2ns5ClasslsEi", "ns::Class::operator<<", "ns::Class::operator<<(int)" },
		{ "_ZN1AltIiEEbi", "A::operator<", "bool A::operator< <int>(int)" },
		{ "_ZStlsISt11char_traitsIcEERSt13basic_ostreamIcT_ES5_PKc", "std::operator<<",
		  "std::basic_ostream<char, std::char_traits<char> >& std::operator<< "
		  "<std::char_traits<char> >(std::basic_ostream<char, std::char_traits<char> >&, "
		  "char const*)" },
		{ "_ZN1AssERKS_", "A::operator<=>", "A::operator<=>(A const&)" },
		{ "_ZN1AptEv", "A::operator->", "A::operator->()" },
		{ "_ZN1AixEi", "A::operator[]", "A::operator[](int)" },
		{ "_ZN2ns5ClassclEi", "ns::Class::operator()", "ns::Class::operator()(int)" },
		{ "_ZN1AnaEm", "A::operator new[]", "A::operator new[](unsigned long)" },
		{ "_ZNK2ns5ClasscviEv", "ns::Class::operator int", "ns::Class::operator int() const" },
		{ "_Zli2_kPKcm", "operator\"\" _k", "operator\"\" _k(char const*, unsigned long)" },
		/* local names, lambdas */
		{ "_ZZ5outeriEN5Local1fEi", "outer::Local::f", "outer(int)::Local::f(int)" },
		{ "_ZZNK1A1fEvEN1B1gEv", "A::f::B::g", "A::f() const::B::g()" },
		{ "_ZZ4mainENKUliE_clEi", "main::{lambda(int)#1}::operator()",
		  "main::{lambda(int)#1}::operator()(int) const" },
		/* special names */
		{ "_ZThn8_N13FtraceServiceD0Ev", "FtraceService::~FtraceService",
		  "non-virtual thunk to FtraceService::~FtraceService()" },
		/* suffixes: clones, PLT entries, symbol versions */
		{ "_Z3foov.cold", "foo.cold", "foo() [clone .cold]" },
		{ "_Z3foov.part.0", "foo.part.0", "foo() [clone .part.0]" },
		{ "_Z3foov.constprop.0.isra.0", "foo.constprop.0.isra.0",
		  "foo() [clone .constprop.0] [clone .isra.0]" },
		{ "_Z3foov.odd-suffix", "foo.odd-suffix", "foo().odd-suffix" },
		{ "_ZNSolsEi@plt", "std::ostream::operator<<@plt", "std::ostream::operator<<(int)@plt" },
		{ "_ZN1A1fEv.cold@plt", "A::f.cold@plt", "A::f() [clone .cold]@plt" },
		{ "_ZNSi6ignoreEl@@GLIBCXX_3.4.5", "std::istream::ignore@@GLIBCXX_3.4.5",
		  "std::istream::ignore(long)@@GLIBCXX_3.4.5" },
	};
	char *s, *big;
	size_t n;

	for (size_t i = 0; i < sizeof d / sizeof *d; i++) {
		const char *want[3] = { d[i].simple, d[i].full, d[i].sym };

		for (int style = AN_DEMANGLE_SIMPLE; style <= AN_DEMANGLE_NO; style++) {
			s = an_demangle(d[i].sym, style);
			CHECK(s && strcmp(s, want[style]) == 0, "%s in style %d is '%s', expected '%s'",
			      d[i].sym, style, s ? s : "(null)", want[style]);
			free(s);
		}
	}
	CHECK(an_demangle_style("simple") == AN_DEMANGLE_SIMPLE &&
	      an_demangle_style("full") == AN_DEMANGLE_FULL &&
	      an_demangle_style("no") == AN_DEMANGLE_NO && an_demangle_style("none") == -1 &&
	      an_demangle_style("") == -1, "an_demangle_style parses wrongly");

	/* "_ZN" + "1a" * n + "Ev": a name of n parts is demangled; one too deep
	 * for the runtime (its recursion limit) or over 16 KiB is kept as is. */
	for (size_t k = 0; k < 3; k++) {
		n = k == 0 ? 100 : k == 1 ? 1000 : 8190;
		big = malloc(2 * n + 6);
		if (!big)
			tg_die("out of memory");
		strcpy(big, "_ZN");
		for (size_t i = 0; i < n; i++)
			strcat(big + 3 + 2 * i, "1a");
		strcat(big, "Ev");
		s = an_demangle(big, AN_DEMANGLE_SIMPLE);
		if (k == 0)
			CHECK(s && strlen(s) == 3 * n - 2 && strncmp(s, "a::a::", 6) == 0,
			      "a name of %zu parts is '%.40s...'", n, s ? s : "(null)");
		else
			CHECK(s && strcmp(s, big) == 0, "a %zu-character symbol was demangled",
			      strlen(big));
		free(s);
		free(big);
	}
}

/* 7. C++ names in a trace of traced_cxx.cpp: each function demangled in the
 * style the trace was opened with, also as the caller of an indirect call. */
static void test_demangle_trace(void)
{
	static const struct { const char *simple, *full; } want[X_COUNT] = {
		[X_GET] = { "ns::Box::get", "ns::Box<long>::get(int) const" },
		[X_LESS] = { "ns::Vec::operator<", "ns::Vec::operator<(ns::Vec const&) const" },
		[X_BIGGEST] = { "ns::biggest", "long ns::biggest<long>(long, long)" },
		[X_LAMBDA] = { "main::{lambda(int)#1}::operator()",
			       "main::{lambda(int)#1}::operator()(int) const" },
		[X_PLAIN] = { "plain_c", "plain_c" },
		[X_NEW] = { "operator new@plt", "operator new(unsigned long)@plt" },
	};
	trace_site s[X_COUNT];
	char *dir = tg_dir(root, "cxx"), indirect[3][128];
	const char *mangled[X_COUNT] = { 0 };
	uint64_t off;
	tg_ring r;

	tg_cxx_sites(cxx_prog, s);
	tg_meta(dir, cxx_prog, "");
	tg_write_sites(dir, s, X_COUNT);
	tg_ring_init(&r, 1234, 8, TG_TSC0);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	mangled[X_GET] = "_ZNK2ns3BoxIlE3getEi";
	mangled[X_LESS] = "_ZNK2ns3VecltERKS0_";
	mangled[X_BIGGEST] = "_ZN2ns7biggestIlEET_S1_S1_";
	mangled[X_LAMBDA] = "_ZZ4mainENKUliE_clEi";
	mangled[X_PLAIN] = "plain_c";
	mangled[X_NEW] = "_Znwm@plt";
	off = s[X_APPLY_F].site_addr - s[X_APPLY_F].caller_func;
	snprintf(indirect[0], sizeof *indirect, "<indirect@ns::apply+0x%" PRIx64 ">", off);
	snprintf(indirect[1], sizeof *indirect, "<indirect@ns::apply(int (*)(int), int)+0x%"
		 PRIx64 ">", off);
	snprintf(indirect[2], sizeof *indirect, "<indirect@_ZN2ns5applyEPFiiEi+0x%" PRIx64 ">", off);

	for (int style = AN_DEMANGLE_SIMPLE; style <= AN_DEMANGLE_NO; style++) {
		an_open_opts o = { .demangle = style };
		an_trace *t;
		sp_err err;

		if (an_trace_open_opts(dir, &o, &t, &err) < 0) {
			CHECK(0, "opening %s in style %d: %s", dir, style, err.msg);
			continue;
		}
		for (int id = 0; id < X_COUNT; id++) {
			const an_func *f;
			const char *w;

			if (!mangled[id])
				continue;
			f = an_func_get(t, an_site(t, (uint32_t)id)->callee);
			w = style == AN_DEMANGLE_SIMPLE ? want[id].simple
			    : style == AN_DEMANGLE_FULL ? want[id].full : mangled[id];
			CHECK(strcmp(f->name, w) == 0, "style %d: site %d calls '%s', expected '%s'",
			      style, id, f->name, w);
			CHECK(f->signature == (style == AN_DEMANGLE_FULL && id != X_PLAIN),
			      "style %d: '%s' is%s taken for a full signature", style, f->name,
			      f->signature ? "" : " not");
		}
		CHECK(strcmp(callee_name(t, X_APPLY_F), indirect[style]) == 0,
		      "style %d: the indirect call in ns::apply is '%s', expected '%s'", style,
		      callee_name(t, X_APPLY_F), indirect[style]);
		CHECK(!an_func_get(t, an_site(t, X_APPLY_F)->callee)->signature,
		      "style %d: an indirect callee is taken for a full signature", style);
		an_trace_close(t);
	}
	{
		an_open_opts o = { .demangle = 7 };
		an_trace *t;
		sp_err err;

		CHECK(an_trace_open_opts(dir, &o, &t, &err) < 0 && strstr(err.msg, "demangle style 7"),
		      "demangle style 7 was accepted");
	}
	free(dir);
}

/* 9. Message events: a head and its data records make one message, named
 * by the channels file; data whose head the ring overwrote are skipped, and
 * a head cut short by the end of the records is dropped. */
static void put_msg(tg_ring *r, uint32_t ev, uint64_t tsc, uint32_t chan, unsigned call,
		    unsigned flags, uint64_t off, uint64_t len, unsigned ndata)
{
	uint64_t data[TRACE_MSG_NDATA];

	trace_msg_pack(data, chan, call, flags, off, len);
	tg_put(r, TRACE_EVENT, ev, tsc);
	for (unsigned i = 0; i < ndata; i++)
		tg_put_raw(r, trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[i]));
}

static void test_messages(void)
{
	const uint64_t T = TG_TSC0 + 1000;
	char *dir = tg_dir(root, "msgs"), text[400];
	trace_channel ch[3];
	an_call *c;
	size_t n, nmsg = 0;
	an_iter_stats st;
	an_trace *t;
	sp_err err;
	tg_ring r;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	memset(ch, 0, sizeof ch);
	ch[0].proto = 3;
	ch[0].pid = sizeof(trace_channel);
	ch[1] = (trace_channel){ .proto = TRACE_PROTO_TCP, .family = AF_INET, .local_port = 40112,
				 .peer_port = 7000, .flags = TRACE_CHAN_PEER };
	memcpy(ch[1].local_addr, "\x0a\0\0\x01", 4);
	memcpy(ch[1].peer_addr, "\x0a\0\0\x02", 4);
	ch[2] = (trace_channel){ .proto = TRACE_PROTO_PIPE, .inode = 123456 };
	tg_write(dir, "channels", ch, sizeof ch);
	/* 19 records in 16 slots: the first SYNC, the first message's head and
	 * its first data record are overwritten, its other three stay. */
	tg_ring_init(&r, 1234, 16, TG_TSC0);
	put_msg(&r, TRACE_EV_MSG_SEND, T, 1, TRACE_CALL_SEND, TRACE_MSG_RELATIVE, 0, 1, 4);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 100);
	put_msg(&r, TRACE_EV_MSG_SEND, T + 200, 1, TRACE_CALL_SEND, TRACE_MSG_RELATIVE,
		1ull << 40, 118, 4);
	put_msg(&r, TRACE_EV_MSG_RECV, T + 300, 2, TRACE_CALL_READ, TRACE_MSG_RELATIVE, 0, 5, 4);
	put_msg(&r, TRACE_EV_MSG_RECV, T + 400, 2, TRACE_CALL_READ, TRACE_MSG_RELATIVE, 5, 5, 1);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	if (an_thread_calls(t, an_trace_thread(t, 0), &c, &n, &st, &err) < 0) {
		CHECK(0, "an_thread_calls: %s", err.msg);
	} else {
		for (size_t i = 0; i < n; i++) {
			const an_msg *m;

			if (c[i].kind != AN_EVENT || !trace_event_is_msg(c[i].id))
				continue;
			m = an_trace_msg(t, c[i].end);
			CHECK(m != NULL, "message %zu: no an_msg", nmsg);
			if (!m)
				continue;
			an_msg_text(t, m, text, sizeof text);
			if (nmsg == 0)
				CHECK(strcmp(text, "send(tcp 10.0.0.1:40112 -> 10.0.0.2:7000, bytes "
					     "1099511627776..1099511627894)") == 0 && c[i].t0 == T + 200 &&
				      c[i].depth == 1, "first message: %s at +%" PRIu64 " depth %u", text,
				      c[i].t0 - T, c[i].depth);
			else if (nmsg == 1)
				CHECK(strcmp(text, "read(pipe 123456, bytes 0..5)") == 0,
				      "second message: %s", text);
			nmsg++;
		}
		CHECK(nmsg == 2, "%zu messages, expected 2 (one overwritten, one cut short)", nmsg);
		CHECK(st.nstray_data == 3 && st.nbad_msgs == 1, "stray data %zu (expected 3), cut "
		      "short %zu (expected 1)", st.nstray_data, st.nbad_msgs);
		free(c);
	}
	CHECK(strcmp(an_channel_text(t, 1, 1, text, sizeof text),
		     "tcp 10.0.0.1:40112 <- 10.0.0.2:7000") == 0, "channel 1 received: %s", text);
	CHECK(strcmp(an_channel_text(t, 9, 0, text, sizeof text), "channel 9") == 0,
	      "an unknown channel: %s", text);
	an_trace_close(t);
out:
	free(dir);
}

/*
 * 9b. The overhead budget's events (trace_format.h): a BUDGET event and
 * COUNT pairs, with a payload in place of the time; a COUNT cut short by
 * the end of the records is dropped and counted.  The call tree keeps them
 * as events at the time of the record before, their payload in
 * an_trace_budget.
 */
static void test_budget_events(void)
{
	const uint64_t T = TG_TSC0 + 1000;
	char *dir = tg_dir(root, "budget");
	const an_budget *b;
	an_call *c;
	size_t n, nb = 0;
	an_iter_stats st;
	an_trace *t;
	sp_err err;
	tg_ring r;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_ring_init(&r, 1234, 32, TG_TSC0);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T);
	tg_put(&r, TRACE_ENTRY, S_LEAF, T + 10);
	tg_put(&r, TRACE_EXIT, S_LEAF, T + 20);
	tg_put_raw(&r, trace_rec(TRACE_EVENT, TRACE_EV_BUDGET,
				 trace_budget_pack(S_LEAF, TRACE_BUDGET_COUNTED)));
	tg_put_raw(&r, trace_rec(TRACE_EVENT, TRACE_EV_COUNT, S_LEAF));
	tg_put_raw(&r, trace_rec(TRACE_EVENT, TRACE_EV_COUNT_DATA, (1ull << 37) + 5));
	tg_put(&r, TRACE_EXIT, S_MAIN, T + 1000);
	tg_put_raw(&r, trace_rec(TRACE_EVENT, TRACE_EV_COUNT, S_LEAF));   /* cut short */
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	if (!(t = open_ok(dir)))
		goto out;
	if (an_thread_calls(t, an_trace_thread(t, 0), &c, &n, &st, &err) < 0) {
		CHECK(0, "an_thread_calls: %s", err.msg);
	} else {
		for (size_t i = 0; i < n; i++) {
			if (c[i].kind != AN_EVENT || (c[i].id != TRACE_EV_BUDGET &&
						      c[i].id != TRACE_EV_COUNT))
				continue;
			b = an_trace_budget(t, c[i].end);
			CHECK(b != NULL, "budget event %zu: no an_budget", nb);
			if (!b)
				continue;
			if (nb == 0)
				CHECK(c[i].id == TRACE_EV_BUDGET && b->site == S_LEAF &&
				      b->mode == TRACE_BUDGET_COUNTED && c[i].t0 == T + 20 &&
				      c[i].depth == 1, "demotion: event %u site %u mode %u at +%" PRIu64
				      " depth %u", c[i].id, b->site, b->mode, c[i].t0 - T, c[i].depth);
			else if (nb == 1)
				CHECK(c[i].id == TRACE_EV_COUNT && b->site == S_LEAF &&
				      b->n == (1ull << 37) + 5 && c[i].t0 == T + 20,
				      "count: event %u site %u n %" PRIu64 " at +%" PRIu64, c[i].id,
				      b->site, b->n, c[i].t0 - T);
			nb++;
		}
		CHECK(nb == 2, "%zu budget events, expected 2 (one cut short)", nb);
		CHECK(st.nbad_counts == 1, "%zu counts cut short, expected 1", st.nbad_counts);
		free(c);
	}
	an_trace_close(t);
out:
	free(dir);
}

/* 10. The channels file's layouts: record 0 gives the record size; a file
 * of the first layout (0 there, 128-byte records) reads with the later
 * fields zero; an impossible size is refused.  A shutdown and an end of
 * stream are messages of no bytes, shown at their offset; absolute
 * offsets come with the channel's bases. */
static void write_chan_trace(const char *dir, const void *chans, size_t len)
{
	tg_ring r;

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_write(dir, "channels", chans, len);
	tg_ring_init(&r, 1234, 16, TG_TSC0);
	tg_put(&r, TRACE_ENTRY, S_MAIN, TG_TSC0 + 100);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
}

static void test_channel_layouts(void)
{
	char *dir, text[400];
	trace_channel ch[3];
	uint8_t v1[3][TRACE_CHANNEL_V1_SIZE];
	const trace_channel *c;
	an_msg m = { .chan = 1, .call = TRACE_CALL_EOF, .recv = 1, .off = 1050, .len = 0 };
	an_trace *t;
	sp_err err;

	/* the current layout, a TCP channel with absolute offsets */
	dir = tg_dir(root, "chan-now");
	memset(ch, 0, sizeof ch);
	ch[0].proto = 3;
	ch[0].pid = sizeof(trace_channel);
	ch[2] = (trace_channel){ .proto = TRACE_PROTO_UNIX_STREAM, .family = AF_UNIX, .inode = 11,
				 .flags = TRACE_CHAN_PEER | TRACE_CHAN_PEER_INODE, .peer_inode = 22 };
	ch[1] = (trace_channel){ .proto = TRACE_PROTO_TCP, .family = AF_INET, .local_port = 40112,
				 .peer_port = 7000, .flags = TRACE_CHAN_PEER | TRACE_CHAN_ABS_SEND |
				 TRACE_CHAN_ABS_RECV, .base = { 5, 300 } };
	memcpy(ch[1].local_addr, "\x0a\0\0\x01", 4);
	memcpy(ch[1].peer_addr, "\x0a\0\0\x02", 4);
	write_chan_trace(dir, ch, sizeof ch);
	if ((t = open_ok(dir)) != NULL) {
		c = an_channel(t, 1);
		CHECK(c && c->base[0] == 5 && c->base[1] == 300 &&
		      c->flags == (TRACE_CHAN_PEER | TRACE_CHAN_ABS_SEND | TRACE_CHAN_ABS_RECV) &&
		      an_nchannels(t) == 3, "channel 1 of the current layout read as %s",
		      c ? "other fields" : "no channel");
		an_msg_text(t, &m, text, sizeof text);
		CHECK(strcmp(text, "eof(tcp 10.0.0.1:40112 <- 10.0.0.2:7000, at byte 1050)") == 0,
		      "an end of stream: %s", text);
		m = (an_msg){ .chan = 1, .call = TRACE_CALL_SHUTDOWN, .recv = 0, .off = 12 };
		an_msg_text(t, &m, text, sizeof text);
		CHECK(strcmp(text, "shutdown(tcp 10.0.0.1:40112 -> 10.0.0.2:7000, at byte 12)") == 0,
		      "a shutdown: %s", text);
		CHECK(strcmp(an_channel_text(t, 2, 0, text, sizeof text), "unix 11 -> 22") == 0,
		      "a UNIX socket with its peer, sending: %s", text);
		CHECK(strcmp(an_channel_text(t, 2, 1, text, sizeof text), "unix 11 <- 22") == 0,
		      "a UNIX socket with its peer, receiving: %s", text);
		an_trace_close(t);
	}
	free(dir);

	/* the first layout: 128-byte records, no size in record 0 */
	dir = tg_dir(root, "chan-v1");
	memset(v1, 0, sizeof v1);
	memcpy(&ch[1], &(trace_channel){ .proto = TRACE_PROTO_PIPE, .inode = 123456 }, sizeof ch[1]);
	v1[0][0] = 3;
	memcpy(v1[2], &ch[1], TRACE_CHANNEL_V1_SIZE);
	write_chan_trace(dir, v1, sizeof v1);
	if ((t = open_ok(dir)) != NULL) {
		c = an_channel(t, 2);
		CHECK(an_nchannels(t) == 3 && c && c->proto == TRACE_PROTO_PIPE && c->inode == 123456 &&
		      c->base[0] == 0 && c->base[1] == 0 && !an_channel(t, 1),
		      "a channels file of the first layout: %zu records, channel 2 %s",
		      an_nchannels(t), c ? "misread" : "missing");
		an_trace_close(t);
	}
	free(dir);

	/* a record size no layout has */
	dir = tg_dir(root, "chan-bad");
	ch[0].pid = 100;
	write_chan_trace(dir, ch, sizeof ch);
	t = NULL;
	CHECK(an_trace_open(dir, &t, &err) < 0 && strstr(err.msg, "record size of 100"),
	      "a channels file with 100-byte records was accepted");
	if (t)
		an_trace_close(t);
	free(dir);
}

int main(int argc, char **argv)
{
	char repo[sizeof root + 8];

	if (argc != 3) {
		fprintf(stderr, "usage: test_trace_read TRACED-PROGRAM TRACED-CXX-PROGRAM\n");
		return 2;
	}
	prog = argv[1];
	cxx_prog = argv[2];
	if (!mkdtemp(root))
		tg_die("mkdtemp: %m");
	snprintf(repo, sizeof repo, "%s/repo", root);
	setenv("SPTRACE_REPO", repo, 1);
	tg_sites(prog, sites);

	test_names();
	test_tsc();
	test_segments();
	test_chunked();
	test_packed();
	test_clocks();
	test_calls();
	test_tail_and_holes();
	test_helpers();
	test_demangle_strings();
	test_demangle_trace();
	test_messages();
	test_budget_events();
	test_channel_layouts();

	tg_rmtree(root);
	ca_module_free((ca_module *)tg_prog());
	ca_module_free((ca_module *)tg_cxx_prog());
	if (failures) {
		fprintf(stderr, "test_trace_read: %d failures\n", failures);
		return 1;
	}
	printf("test_trace_read: all passed\n");
	return 0;
}
