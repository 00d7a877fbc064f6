/*
 * packcost.c — the packer's CPU per record, by part: analysis/pack.c's
 * column encoder and zstd at several levels, over the raw records of
 * ring.<tid> files of a --no-compact trace; run by bench/packcost_bench.py.
 *
 *   packcost RING_FILE...
 *
 * pack.c is included whole, for its static encode(); its other functions
 * are not called here (the stubs below stand for the library functions
 * they would call).  Prints per level: the encoder's and zstd's thread CPU
 * time per record, the columns' bytes per call before zstd and after.
 */
#include "../analysis/pack.c"

#include <time.h>

int an_read_full(int fd, void *buf, size_t len, off_t off) { abort(); }
int sp_fail(sp_err *err, const char *fmt, ...) { abort(); }
int sp_grow(void **p, size_t *cap, size_t need, size_t size) { abort(); }
int sp_open_regular(const char *path, int for_write) { abort(); }
const char *sp_open_why(int e) { abort(); }

static double cpu(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	static const int levels[] = { 1, -1, -5, 3 };

	for (size_t li = 0; li < sizeof levels / sizeof *levels; li++) {
		double te = 0, tz = 0;
		uint64_t zb = 0, cb = 0, recs = 0;

		for (int a = 1; a < argc; a++) {
			int fd = open(argv[a], O_RDONLY);
			trace_ring_header h;
			uint64_t *raw, n, chunk;
			uint8_t *cols, *z;
			pstack *s = malloc(sizeof *s);
			ZSTD_CCtx *cc = ZSTD_createCCtx();

			if (fd < 0 || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || !h.chunk)
				continue;
			n = h.count;
			chunk = h.chunk;
			raw = malloc(n * 8 + 8);
			cols = malloc(chunk * COL_MAX_PER_REC);
			z = malloc(ZSTD_compressBound(chunk * COL_MAX_PER_REC));
			if (!raw || !cols || !z || !s || !cc ||
			    pread(fd, raw, n * 8, (off_t)h.header_size) != (ssize_t)(n * 8))
				return fprintf(stderr, "%s: cannot read\n", argv[a]), 1;
			for (uint64_t f = 0; f + chunk <= n; f += chunk) {
				uint32_t nc[4];
				double t0 = cpu(), t1;
				size_t zl;

				encode(raw + f, (uint32_t)chunk, cols, nc, s);
				t1 = cpu();
				zl = ZSTD_compressCCtx(cc, z, ZSTD_compressBound(chunk * COL_MAX_PER_REC),
						       cols, (size_t)col_total(nc), levels[li]);
				tz += cpu() - t1;
				te += t1 - t0;
				zb += zl;
				cb += col_total(nc);
				recs += chunk;
			}
			free(raw);
			free(cols);
			free(z);
			free(s);
			ZSTD_freeCCtx(cc);
			close(fd);
		}
		if (!recs)
			return fprintf(stderr, "no finished chunk in the files\n"), 1;
		printf("level %d encode_ns %.3f zstd_ns %.3f cols_bytes_per_call %.3f "
		       "zstd_bytes_per_call %.3f records %llu\n", levels[li], te / (double)recs * 1e9,
		       tz / (double)recs * 1e9, (double)cb / ((double)recs / 2),
		       (double)zb / ((double)recs / 2), (unsigned long long)recs);
	}
	return 0;
}
