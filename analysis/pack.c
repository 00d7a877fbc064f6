/*
 * pack.c — packed.<tid>: a thread's records re-encoded compactly by
 * `sptrace run` (an_pack_ring), and read back by the iterator (an_pack_scan,
 * an_pack_decode).  The layout and its rules: trace_format.h, "Packed
 * blocks" (points 1-4).
 */
#include "an_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <inttypes.h>
#include <pthread.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

#define TSC_MASK ((1ull << TRACE_TSC_LOW_BITS) - 1)
#define STACK_MASK (TRACE_PACK_STACK - 1)
/* Column bytes at most per record: a kind, a 24-bit id (4 varint bytes),
 * a 38-bit delta or payload (6 each). */
#define COL_MAX_PER_REC 17
#define ZSTD_LEVEL 1

void an_pack_path(const char *ring_path, char *out, size_t len)
{
	const char *base = strrchr(ring_path, '/');

	base = base ? base + 1 : ring_path;
	snprintf(out, len, "%.*spacked.%s", (int)(base - ring_path), ring_path, base + 5);
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* -1: the column ends inside the varint, or it is longer than 64 bits. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;

	for (unsigned shift = 0; shift < 64; shift += 7) {
		uint8_t b;

		if (*p >= end)
			return -1;
		b = *(*p)++;
		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -1;
}

/* The EXIT stack of point 4: st[(sp - 1 - d) & STACK_MASK] is the entry d
 * below the top, for d < avail. */
typedef struct pstack {
	uint32_t st[TRACE_PACK_STACK];
} pstack;

/* (Kept in locals by the loops below, stored back at the end: through
 * the struct, every byte the loops write could alias them.) */
#define PUSH(st, sp, avail, id)                                               \
	do {                                                                  \
		(st)[(sp)++ & STACK_MASK] = (id);                             \
		if ((avail) < TRACE_PACK_STACK)                               \
			(avail)++;                                            \
	} while (0)

/* Point 4's columns of n records into cols (n * COL_MAX_PER_REC bytes):
 * contiguous, their lengths into ncol. */
static void encode(const uint64_t *rec, uint32_t n, uint8_t *cols, uint32_t ncol[4], pstack *s,
		   uint8_t *entered)
{
	uint8_t *k = cols, *id0 = cols + n, *id = id0, *dl0 = id0 + 4 * (size_t)n, *dl = dl0;
	uint8_t *pl0 = dl0 + 6 * (size_t)n, *pl = pl0;
	uint64_t prev = 0, sp = 0;
	uint32_t *st = s->st;
	unsigned avail = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t r = rec[i], t = r >> TRACE_TSC_SHIFT;
		uint32_t site = trace_rec_id(r);
		unsigned kind = trace_rec_kind(r), d;

		if (r == 0) {
			*k++ = TRACE_PACK_ZERO;
			continue;
		}
		switch (kind) {
		case TRACE_ENTRY:
			*k++ = TRACE_PACK_ENTRY;
			if (entered)
				entered[site >> 3] |= (uint8_t)(1u << (site & 7));
			id = put_varint(id, site);
			PUSH(st, sp, avail, site);
			break;
		case TRACE_EXIT:
			for (d = 0; d < 16 && d < avail; d++)
				if (st[(sp - 1 - d) & STACK_MASK] == site)
					break;
			if (d < 16 && d < avail) {
				*k++ = d ? (uint8_t)(TRACE_PACK_EXIT_DEEP + d) : TRACE_PACK_EXIT_TOP;
				sp -= d + 1;
				avail -= d + 1;
			} else {
				*k++ = TRACE_PACK_EXIT_ID;
				id = put_varint(id, site);
			}
			break;
		default:
			*k++ = kind == TRACE_EVENT ? TRACE_PACK_EVENT : TRACE_PACK_SYNC;
			id = put_varint(id, site);
			pl = put_varint(pl, t);
			continue;
		}
		dl = put_varint(dl, (t - prev) & TSC_MASK);
		prev = t;
	}
	ncol[0] = n;
	ncol[1] = (uint32_t)(id - id0);
	ncol[2] = (uint32_t)(dl - dl0);
	ncol[3] = (uint32_t)(pl - pl0);
	memmove(cols + n + ncol[1], dl0, ncol[2]);
	memmove(cols + n + ncol[1] + ncol[2], pl0, ncol[3]);
}

/* The inverse: n records from the columns, 0 or -1 (*why says) when the
 * columns do not make n records exactly. */
static int decode(const uint8_t *cols, const uint32_t ncol[4], uint32_t n, uint64_t *rec,
		  pstack *s, const char **why)
{
	const uint8_t *k = cols, *id = cols + ncol[0], *id_end = id + ncol[1];
	const uint8_t *dl = id_end, *dl_end = dl + ncol[2], *pl = dl_end, *pl_end = pl + ncol[3];
	uint64_t prev = 0, v, w, sp = 0;
	uint32_t *st = s->st;
	unsigned avail = 0;

	*why = "its columns are inconsistent";
	if (ncol[0] != n)
		return -1;
	for (uint32_t i = 0; i < n; i++) {
		unsigned c = k[i], d = 0;
		uint32_t site;

		switch (c) {
		case TRACE_PACK_ZERO:
			rec[i] = 0;
			continue;
		case TRACE_PACK_EVENT:
		case TRACE_PACK_SYNC:
			if (get_varint(&id, id_end, &v) || v > TRACE_ID_MAX ||
			    get_varint(&pl, pl_end, &w) || w > TSC_MASK)
				return -1;
			rec[i] = trace_rec(c == TRACE_PACK_EVENT ? TRACE_EVENT : TRACE_SYNC,
					   (uint32_t)v, w);
			continue;
		case TRACE_PACK_ENTRY:
		case TRACE_PACK_EXIT_ID:
			if (get_varint(&id, id_end, &v) || v > TRACE_ID_MAX)
				return -1;
			site = (uint32_t)v;
			if (c == TRACE_PACK_ENTRY)
				PUSH(st, sp, avail, site);
			break;
		default:
			if (c != TRACE_PACK_EXIT_TOP && (c <= TRACE_PACK_EXIT_DEEP || c >= TRACE_PACK_EXIT_DEEP + 16))
				return -1;
			d = c == TRACE_PACK_EXIT_TOP ? 0 : c - TRACE_PACK_EXIT_DEEP;
			if (d >= avail)
				return -1;
			site = st[(sp - 1 - d) & STACK_MASK];
			sp -= d + 1;
			avail -= d + 1;
			break;
		}
		if (get_varint(&dl, dl_end, &v) || v > TSC_MASK)
			return -1;
		prev = (prev + v) & TSC_MASK;
		rec[i] = trace_rec(c == TRACE_PACK_ENTRY ? TRACE_ENTRY : TRACE_EXIT, site, prev);
	}
	if (id != id_end || dl != dl_end || pl != pl_end)
		return -1;
	return 0;
}

static uint32_t block_crc(const trace_pack_block *b, const void *z)
{
	trace_pack_block h = *b;
	uLong c;

	h.crc = 0;
	c = crc32_z(0, (const Bytef *)&h, sizeof h);
	return (uint32_t)crc32_z(c, z, b->zlen);
}

static uint64_t col_total(const uint32_t ncol[4])
{
	return (uint64_t)ncol[0] + ncol[1] + ncol[2] + ncol[3];
}

void an_pack_free(pack_data *pd)
{
	free(pd->blks);
	if (pd->fd >= 0)
		close(pd->fd);
	memset(pd, 0, sizeof *pd);
	pd->fd = -1;
}

/*
 * The valid blocks of packed.<tid> beside ring_path (point 3), from the
 * start.  With check 0 only the headers and the file's size are looked at
 * (the writer, which wrote them); with 1 each block is read and its crc
 * checked too.  A block whole but damaged (its checksum) is listed with
 * `bad` set, and the next ones are read; one that is not whole (cut short,
 * not a block) ends the list.  pd->bad is the first failing block's
 * offset, and pd->why says what is wrong with it.  No file: no blocks.  -1 only
 * when the file exists and cannot be read (err).
 */
int an_pack_scan(const char *ring_path, pack_data *pd, int check, int fd_rw, sp_err *err)
{
	struct stat st;
	off_t off = 0;
	void *z = NULL;
	size_t zcap = 0;

	memset(pd, 0, sizeof *pd);
	pd->fd = -1;
	pd->bad = -1;
	an_pack_path(ring_path, pd->path, sizeof pd->path);
	if (fd_rw >= 0)
		pd->fd = fd_rw;
	else if ((pd->fd = sp_open_regular(pd->path, 1)) < 0)
		return errno == ENOENT ? 0 : sp_fail(err, "%s: cannot open: %s", pd->path,
						     sp_open_why(errno));
	if (fstat(pd->fd, &st) < 0) {
		int e = errno;

		an_pack_free(pd);
		return sp_fail(err, "%s: cannot read: %s", pd->path, strerror(e));
	}
	pd->size = st.st_size;
	while (off < st.st_size) {
		trace_pack_block b;
		const char *why = NULL, *cut = NULL;
		int damaged = 0;        /* whole, but its data is not what it wrote */

		if (st.st_size - off < (off_t)sizeof b)
			why = cut = "a block header cut short (the writer was stopped while writing it?)";
		else if (an_read_full(pd->fd, &b, sizeof b, off) < 0)
			why = "cannot read its header";
		else if (b.magic != TRACE_PACK_MAGIC)
			why = "not a packed block (bad magic)";
		else if (b.first != pd->end)
			why = "it does not start where the block before ended";
		else if (b.n == 0 || b.n > TRACE_PACK_MAX_RECORDS || b.reserved ||
			 col_total(b.ncol) > (uint64_t)b.n * COL_MAX_PER_REC ||
			 b.zlen > ZSTD_compressBound((size_t)b.n * COL_MAX_PER_REC))
			why = "a corrupt header";
		else if (st.st_size - off - (off_t)sizeof b < (off_t)b.zlen)
			why = cut = "cut short (the writer was stopped while writing it?)";
		else if (check) {
			if (zcap < b.zlen) {
				void *nz = realloc(z, b.zlen);

				if (!nz) {
					free(z);
					an_pack_free(pd);
					return sp_fail(err, "%s: out of memory", pd->path);
				}
				z = nz;
				zcap = b.zlen;
			}
			if (an_read_full(pd->fd, z, b.zlen, off + (off_t)sizeof b) < 0)
				why = "cannot read its data";
			else if (block_crc(&b, z) != b.crc)
				why = "its checksum does not match (a damaged file)";
			damaged = why != NULL;
		}
		if (why && pd->bad < 0) {
			pd->bad = off;
			pd->cut = cut != NULL;
			snprintf(pd->why, sizeof pd->why, "%s", why);
		}
		if (why && !damaged)
			break;
		if (sp_grow((void **)&pd->blks, &pd->cap, pd->nblks + 1, sizeof *pd->blks)) {
			free(z);
			an_pack_free(pd);
			return sp_fail(err, "%s: out of memory", pd->path);
		}
		pd->blks[pd->nblks++] = (pack_blk){ off, b, damaged };
		pd->end = b.first + b.n;
		off += (off_t)(sizeof b + b.zlen);
	}
	pd->valid_len = off;
	free(z);
	return 0;
}

int an_pack_decode(const pack_data *pd, size_t k, uint64_t *rec, const char **why)
{
	const trace_pack_block *b = &pd->blks[k].h;
	size_t total = (size_t)col_total(b->ncol);
	uint8_t *z = malloc(b->zlen ? b->zlen : 1), *cols = malloc(total ? total : 1);
	pstack *s = malloc(sizeof *s);
	int rc = -1;

	*why = "out of memory";
	if (z && cols && s) {
		size_t got;

		if (an_read_full(pd->fd, z, b->zlen, pd->blks[k].off + (off_t)sizeof *b) < 0)
			*why = "cannot read its data";
		else if (block_crc(b, z) != b->crc)
			*why = "its checksum does not match (a damaged file)";
		else if (ZSTD_isError(got = ZSTD_decompress(cols, total, z, b->zlen)) ||
			 got != total)
			*why = "its data does not decompress";
		else
			rc = decode(cols, b->ncol, b->n, rec, s, why);
	}
	free(z);
	free(cols);
	free(s);
	return rc;
}

/*
 * Where ring.<tid>'s raw records go on after the packed ones: index `end`,
 * unless the bytes there were punched out or cut off (their block is
 * missing or invalid: points 3, 5): then the first index whose bytes are
 * still in the file (SEEK_DATA), or `top` when none are.  Records in between are lost.
 */
uint64_t an_pack_raw_from(int ring_fd, const trace_ring_header *h, uint64_t end, uint64_t top)
{
	uint64_t r = 0;
	off_t at = (off_t)(h->header_size + end * 8), data;
	struct stat st;

	if (end >= top)
		return end;
	if (fstat(ring_fd, &st) == 0 && at >= st.st_size)
		return top;     /* past the file's end (point 5) */
	if (an_read_full(ring_fd, &r, 8, at) < 0 || r != 0)
		return end;
	data = lseek(ring_fd, at, SEEK_DATA);
	if (data < 0)
		return errno == ENXIO ? top : end;
	if (data == at)
		return end;     /* a zero slot in the data: a hole of the agent's */
	data = (off_t)((uint64_t)(data - h->header_size) / 8);
	return (uint64_t)data < top ? (uint64_t)data : top;
}

/*
 * The writer's memory of the files it packed: where each one's blocks end
 * (file identity, length, records), so that a file whose length is what
 * it left is not read again at each call (sptrace run calls every 50 ms,
 * and a file has a block per chunk: thousands with small chunks).  A file
 * of another length is scanned.
 */
#define PACK_CACHE 1024
static struct pack_cached {
	dev_t dev;
	ino_t ino;
	off_t len;
	uint64_t end;
} pack_cache[PACK_CACHE];

static struct pack_cached *cache_slot(const struct stat *st)
{
	return &pack_cache[((uint64_t)st->st_ino * 0x9e3779b97f4a7c15ull) >> 54];
}

static void cache_put(const struct stat *st, off_t len, uint64_t end)
{
	*cache_slot(st) = (struct pack_cached){ st->st_dev, st->st_ino, len, end };
}

static int scan_cached(const char *ring_path, pack_data *pd, int pfd, const struct stat *pst,
		       sp_err *err)
{
	const struct pack_cached *c = cache_slot(pst);

	if (c->len && c->dev == pst->st_dev && c->ino == pst->st_ino && c->len == pst->st_size) {
		memset(pd, 0, sizeof *pd);
		an_pack_path(ring_path, pd->path, sizeof pd->path);
		pd->fd = pfd;
		pd->bad = -1;
		pd->size = pd->valid_len = c->len;
		pd->end = c->end;
		return 0;
	}
	if (an_pack_scan(ring_path, pd, 0, pfd, err) < 0)
		return -1;
	cache_put(pst, pd->valid_len, pd->end);
	return 0;
}

/*
 * The site ids packing met an ENTRY record of, per trace directory (by the
 * directory's identity: packing reaches its files through /proc/self/fd),
 * for `sptrace run`'s look-ahead profiles (cli/lookahead.c).  A bitmap of
 * every 24-bit id, made when the directory's first record is packed (2 MiB
 * of address space, its pages touched as ids are met).
 */
#define ENTERED_DIRS 1024
#define ENTERED_BYTES (((size_t)1 << TRACE_ID_BITS) / 8)

static struct entered_dir {
	dev_t dev;
	ino_t ino;
	uint8_t *bits;
} entered_dirs[ENTERED_DIRS];
static size_t nentered;
static pthread_mutex_t entered_lock = PTHREAD_MUTEX_INITIALIZER;

static uint8_t *entered_of(const char *ring_path, bool make)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(ring_path, '/');
	struct stat st;
	uint8_t *bits = NULL;

	snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - ring_path) : 1,
		 slash ? ring_path : ".");
	if (stat(dir, &st) < 0)
		return NULL;
	pthread_mutex_lock(&entered_lock);
	for (size_t i = 0; i < nentered && !bits; i++)
		if (entered_dirs[i].dev == st.st_dev && entered_dirs[i].ino == st.st_ino)
			bits = entered_dirs[i].bits;
	if (!bits && make && nentered < ENTERED_DIRS && (bits = calloc(1, ENTERED_BYTES)))
		entered_dirs[nentered++] = (struct entered_dir){ st.st_dev, st.st_ino, bits };
	pthread_mutex_unlock(&entered_lock);
	return bits;
}

const uint8_t *an_pack_entered(const char *dir, size_t *nbits)
{
	char probe[PATH_MAX];

	snprintf(probe, sizeof probe, "%s/-", dir);
	*nbits = (size_t)1 << TRACE_ID_BITS;
	return entered_of(probe, false);
}

/* Point 2's free: records [first, first + n) of the ring file punched out.
 * A file system that cannot punch keeps them (readers take the block). */
static int punch(int fd, const trace_ring_header *h, uint64_t first, uint64_t n,
		 const char *ring_path, sp_err *err)
{
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)(h->header_size + first * 8), (off_t)(n * 8)) < 0 &&
	    errno != EOPNOTSUPP)
		return sp_fail(err, "%s: cannot free the records packed: %s", ring_path,
			       strerror(errno));
	return 0;
}

/*
 * The buffers of a chunk's packing, kept from one call to the next (like
 * the compression context): made anew at each call, as they were, the
 * packer of `sptrace run` spent a quarter of its time in the page faults of
 * fresh buffers and in giving them back (a traced `cc -c`: 130 of its 480
 * samples).  Grown for a bigger chunk; never shrunk.  Packing runs on one
 * thread at a time (the compression context already says so).
 */
static struct {
	uint64_t most;          /* records a chunk of them holds, 0: none yet */
	uint64_t *raw;
	uint8_t *cols, *z;
	pstack *s;
} bufs;

static int buffers_for(uint64_t most)
{
	if (most <= bufs.most)
		return 0;
	free(bufs.raw);
	free(bufs.cols);
	free(bufs.z);
	free(bufs.s);
	bufs.raw = malloc(most * 8);
	bufs.cols = malloc(most * COL_MAX_PER_REC);
	bufs.z = malloc(ZSTD_compressBound(most * COL_MAX_PER_REC));
	bufs.s = malloc(sizeof *bufs.s);
	bufs.most = bufs.raw && bufs.cols && bufs.z && bufs.s ? most : 0;
	return bufs.most ? 0 : -1;
}

/*
 * sptrace run's side (point 2).  The ring file's records below `to` -- the
 * chunks the agent is done with, or when the file is process `gone`'s
 * (which can write no more) every record it holds -- that are not in packed.<tid> yet are encoded
 * into new blocks, one per chunk, and punched out of the ring file.
 */
int64_t an_pack_ring(const char *ring_path, int gone, sp_err *err)
{
	int final;
	trace_ring_header h;
	struct stat st, pst;
	pack_data pd;
	uint64_t to, slots, *raw = NULL;
	uint8_t *cols = NULL, *z = NULL, *entered = NULL;
	pstack *s = NULL;
	static ZSTD_CCtx *cctx;
	uint64_t unpunched = 0;         /* 1 + the first record packed, not punched yet */
	int64_t packed = 0;
	int fd, pfd;

	fd = open(ring_path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : sp_fail(err, "%s: cannot open: %s", ring_path,
						     strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
	    an_read_full(fd, &h, RING_FIXED_HEADER, 0) < 0 || h.magic != TRACE_RING_MAGIC ||
	    h.version < 2 || !h.chunk || h.chunk > TRACE_PACK_MAX_RECORDS ||
	    h.header_size != TRACE_RING_HEADER_SIZE || h.count > RING_MAX_COUNT) {
		close(fd);
		return 0;       /* a ring, or not (yet) a file of every record: nothing to do */
	}
	final = gone > 0 ? h.pid == (uint32_t)gone :
		gone == AN_PACK_DEAD && h.pid && kill((pid_t)h.pid, 0) < 0 && errno == ESRCH;
	slots = (uint64_t)st.st_size > h.header_size ? ((uint64_t)st.st_size - h.header_size) / 8 : 0;
	to = final || h.limit == ~0ull ? h.count : h.limit >= h.chunk ? h.limit - h.chunk : 0;
	if (to > h.count)
		to = h.count;
	if (to > h.kept_end)
		to = h.kept_end;
	if (to > slots)
		to = slots;
	if (to == 0) {
		close(fd);
		return 0;       /* nothing to pack (yet), or all of it packed (point 5) */
	}
	an_pack_path(ring_path, pd.path, sizeof pd.path);
	pfd = open(pd.path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
		   st.st_mode & 0666);
	if (pfd < 0) {
		int e = errno;

		close(fd);
		return sp_fail(err, "%s: cannot open: %s", pd.path, strerror(e));
	}
	if (fstat(pfd, &pst) < 0 || !S_ISREG(pst.st_mode) || pst.st_nlink != 1) {
		close(pfd);
		close(fd);
		return sp_fail(err, "%s: not a regular file of its own: left alone", pd.path);
	}
	/* the ring's owner and mode (0640 in a trace shared with a group:
	 * sptrace --group), whatever the packer's umask */
	if (pst.st_size == 0 && (((pst.st_uid != st.st_uid || pst.st_gid != st.st_gid) &&
				  fchown(pfd, st.st_uid, st.st_gid) < 0) ||
				 ((pst.st_mode & 0777) != (st.st_mode & 0666) &&
				  fchmod(pfd, st.st_mode & 0666) < 0))) {
		int e = errno;

		close(pfd);
		close(fd);
		return sp_fail(err, "%s: cannot give it the ring's owner and mode: %s", pd.path,
			       strerror(e));
	}
	if (scan_cached(ring_path, &pd, pfd, &pst, err) < 0) {
		close(fd);
		return -1;
	}
	/* A block cut short by a writer that was stopped: its records are
	 * still raw (point 2); it goes.  Anything else wrong after the valid
	 * blocks is damage this writer did not do: it leaves the file alone. */
	if (pd.size > pd.valid_len && !pd.cut) {
		packed = sp_fail(err, "%s: damaged at offset %lld (%s): nothing more is packed "
				 "into it", pd.path, (long long)pd.valid_len, pd.why);
		goto out;
	}
	if (pd.size > pd.valid_len && ftruncate(pd.fd, pd.valid_len) < 0) {
		int e = errno;

		an_pack_free(&pd);
		close(fd);
		return sp_fail(err, "%s: cannot cut off its last, partial block: %s", pd.path,
			       strerror(e));
	}
	if (pd.end < to && h.chunk) {
		if (!cctx)
			cctx = ZSTD_createCCtx();
		if (buffers_for(h.chunk) < 0 || !cctx) {
			packed = sp_fail(err, "%s: out of memory", pd.path);
			goto out;
		}
		raw = bufs.raw;
		cols = bufs.cols;
		z = bufs.z;
		s = bufs.s;
	}
	while (pd.end < to) {
		uint64_t first = pd.end, n = h.chunk - first % h.chunk;
		trace_pack_block b = { .magic = TRACE_PACK_MAGIC, .first = first };
		size_t zlen;

		if (n > to - first)
			n = to - first;
		if (!final && first % h.chunk + n < h.chunk && h.limit != ~0ull)
			break;          /* (a chunk not finished: not while the agent writes) */
		if (an_read_full(fd, raw, n * 8, (off_t)(h.header_size + first * 8)) < 0) {
			packed = sp_fail(err, "%s: cannot read records %" PRIu64 "..%" PRIu64 ": %s",
					 ring_path, first, first + n, strerror(errno));
			goto out;
		}
		b.n = (uint32_t)n;
		if (!entered)
			entered = entered_of(ring_path, true);
		encode(raw, b.n, cols, b.ncol, s, entered);
		zlen = ZSTD_compressCCtx(cctx, z, ZSTD_compressBound(n * COL_MAX_PER_REC), cols,
					 (size_t)col_total(b.ncol), ZSTD_LEVEL);
		if (ZSTD_isError(zlen)) {
			packed = sp_fail(err, "%s: cannot compress: %s", pd.path,
					 ZSTD_getErrorName(zlen));
			goto out;
		}
		b.zlen = (uint32_t)zlen;
		b.crc = block_crc(&b, z);
		if (pwrite(pd.fd, &b, sizeof b, pd.valid_len) != (ssize_t)sizeof b ||
		    pwrite(pd.fd, z, zlen, pd.valid_len + (off_t)sizeof b) != (ssize_t)zlen) {
			int e = errno;

			/* (the partial block goes at the next call: point 2) */
			packed = sp_fail(err, "%s: cannot write: %s", pd.path, strerror(e));
			goto out;
		}
		pd.valid_len += (off_t)(sizeof b + zlen);
		pd.end = first + n;
		cache_put(&pst, pd.valid_len, pd.end);
		packed += (int64_t)n;
		/* Point 2: the raw records go only now (a file of a process
		 * gone: after the loop, point 5). */
		if (!final && punch(fd, &h, first, n, ring_path, err) < 0) {
			packed = -1;
			goto out;
		}
		if (final && !unpunched)
			unpunched = first + 1;
	}
	/* The process is gone and every record is packed: the file is cut to
	 * its header (point 5), which frees the blocks packed and the chunk
	 * mapped ahead alike.  Freeing blocks is slow on a file system mounted
	 * with `discard` (each free waits for the device: 0.1-2 ms), so the
	 * blocks of this call were not punched one by one: the cut frees them,
	 * or, where there is none to make, one punch. */
	if (final && pd.end == h.count && h.count <= h.kept_end) {
		if (st.st_size > (off_t)h.header_size && ftruncate(fd, (off_t)h.header_size) < 0) {
			packed = sp_fail(err, "%s: cannot cut it to its header: %s", ring_path,
					 strerror(errno));
			goto out;
		}
	} else if (unpunched &&
		   punch(fd, &h, unpunched - 1, pd.end - (unpunched - 1), ring_path, err) < 0) {
		packed = -1;
	}
out:
	an_pack_free(&pd);
	close(fd);
	return packed;
}
