/*
 * pagecost.c — the traced thread's page-cache cost per record in a file of
 * every record (issue 16), by how a chunk's pages are got; run by
 * bench/pagecost_bench.py.
 *
 *   pagecost MODE FILE CHUNKS
 *
 * One thread writes CHUNKS chunks of 8 MiB (1 M records of 8 bytes each,
 * one store per slot) through a window of two chunks, as agent/ring.c does:
 *
 *   fresh         fallocate the next chunk at the file's end and mmap it
 *                 MAP_FIXED over the finished half (ring.c today); the
 *                 packer's part, untimed: punch the finished chunk out.
 *   populate      fresh + madvise(MADV_POPULATE_WRITE) on the new chunk
 *                 (one call faulting every page in, instead of one fault
 *                 per page at the stores).
 *   recycle       a circular file of 4 chunks: the next chunk is mapped
 *                 (MAP_FIXED) over file pages the page cache still holds;
 *                 nothing freed.
 *   recycle-zero  recycle, the packer emptying each chunk it is done with
 *                 (FALLOC_FL_ZERO_RANGE, untimed).
 *   ring          a circular file of 4 chunks mapped once, never remapped
 *                 (the flight recorder's ring, in 4 chunks).
 *   ring-zero     ring, the packer emptying each chunk it is done with by
 *                 writing zeros into it (pwrite: the pages stay, and the
 *                 writer's mapping of them too; untimed).
 *   anon          the window in anonymous memory, mapped once (the floor).
 *
 * Prints the writer's thread CPU time per record (the packer's part
 * excluded) and the packer-side time apart.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define CH (8ul << 20)

static double now(clockid_t c)
{
	struct timespec t;

	clock_gettime(c, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	const char *mode, *path;
	int fd, recycle, pop, anon, ring;
	char *win, *rmap = NULL;
	double c0, c, side = 0;
	long nch;

	if (argc != 4) {
		fprintf(stderr, "usage: pagecost fresh|populate|recycle|recycle-zero|ring|ring-zero|anon "
			"FILE CHUNKS\n");
		return 2;
	}
	mode = argv[1];
	path = argv[2];
	nch = atol(argv[3]);
	recycle = !strncmp(mode, "recycle", 7);
	pop = !strcmp(mode, "populate");
	anon = !strcmp(mode, "anon");
	ring = !strncmp(mode, "ring", 4);
	if ((fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600)) < 0) {
		perror(path);
		return 1;
	}
	win = mmap(NULL, 2 * CH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (ring) {
		if (fallocate(fd, 0, 0, 4 * CH) < 0)
			return perror("fallocate"), 1;
		rmap = mmap(NULL, 4 * CH, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	if (win == MAP_FAILED || rmap == MAP_FAILED)
		return perror("mmap"), 1;
	c0 = now(CLOCK_THREAD_CPUTIME_ID);
	for (long k = 0; k < nch; k++) {
		char *half = ring ? rmap + (k % 4) * CH : win + (k & 1) * CH;
		off_t off = recycle ? (off_t)((k % 4) * CH) : (off_t)(k * CH);
		uint64_t *r = (uint64_t *)half;

		if (!anon && !ring) {
			if ((!recycle || k < 4) && fallocate(fd, 0, off, CH) < 0)
				return perror("fallocate"), 1;
			if (mmap(half, CH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
				 off) == MAP_FAILED)
				return perror("mmap"), 1;
			if (pop && madvise(half, CH, MADV_POPULATE_WRITE) < 0)
				return perror("madvise"), 1;
		}
		for (size_t i = 0; i < CH / 8; i++)
			r[i] = i * 0x9e3779b97f4a7c15ull | 1;
		if (k >= 1 && !strcmp(mode, "ring-zero")) {
			static char zeros[CH];
			double p0 = now(CLOCK_THREAD_CPUTIME_ID);

			if (pwrite(fd, zeros, CH, (off_t)(((k - 1) % 4) * CH)) != (ssize_t)CH)
				return perror("pwrite"), 1;
			side += now(CLOCK_THREAD_CPUTIME_ID) - p0;
		}
		if (k >= 1 && !anon && !ring && strcmp(mode, "recycle")) {
			double p0 = now(CLOCK_THREAD_CPUTIME_ID);
			off_t prev = recycle ? (off_t)(((k - 1) % 4) * CH) : (off_t)((k - 1) * CH);

			fallocate(fd, (recycle ? FALLOC_FL_ZERO_RANGE : FALLOC_FL_PUNCH_HOLE) |
				  FALLOC_FL_KEEP_SIZE, prev, CH);
			side += now(CLOCK_THREAD_CPUTIME_ID) - p0;
		}
	}
	c = now(CLOCK_THREAD_CPUTIME_ID) - c0 - side;
	printf("%s writer_ns_per_record %.3f side_ns_per_record %.3f\n", mode,
	       c / (double)(nch * (long)(CH / 8)) * 1e9,
	       side / (double)(nch * (long)(CH / 8)) * 1e9);
	unlink(path);
	return 0;
}
