/*
 * test_repo.c — the code-analysis repository through codeanalysis.h:
 * round trip (every record and string equal), atomic writes, and rejection
 * of truncated, corrupt, stale and hostile entries without crashing.
 *
 * Usage: test_repo [ELF file]   (default /proc/self/exe)
 * Exit 0 when every check passes; otherwise each failure is printed.
 *
 * The hostile-entry cases edit a valid entry in place.  They know the file
 * header (codeanalysis/repo.c) and the field numbers of proto/repo.proto;
 * keep them in step with those two files.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "codeanalysis.h"

static int failures;

#define CHECK(cond, ...) do { \
	if (!(cond)) { \
		fprintf(stderr, "test_repo: FAIL line %d: %s: ", __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__); \
		fputc('\n', stderr); \
		failures++; \
	} \
} while (0)

#define FATAL(...) do { \
	fprintf(stderr, "test_repo: FATAL line %d: ", __LINE__); \
	fprintf(stderr, __VA_ARGS__); \
	fputc('\n', stderr); \
	exit(2); \
} while (0)

#ifndef FUZZ_ITERS
#define FUZZ_ITERS 300
#endif

/* The fixed header before the payload (see repo.c). */
#define HDR_SIZE 24

/* ---- files ---------------------------------------------------------- */

typedef struct blob {
	uint8_t *p;
	size_t n;
} blob;

static blob read_whole(const char *path)
{
	blob b = { 0 };
	struct stat st;
	FILE *f = fopen(path, "rb");

	if (!f || fstat(fileno(f), &st) < 0)
		FATAL("reading %s: %s", path, strerror(errno));
	b.n = (size_t)st.st_size;
	b.p = malloc(b.n ? b.n : 1);
	if (!b.p || fread(b.p, 1, b.n, f) != b.n)
		FATAL("reading %s", path);
	fclose(f);
	return b;
}

static void write_whole(const char *path, const uint8_t *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
		FATAL("writing %s: %s", path, strerror(errno));
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Write `b` back as the entry after fixing its header checksum, so that
 * the payload's own validation is what gets tested. */
static void write_with_crc(const char *path, blob b)
{
	put_le32(b.p + 12, (uint32_t)crc32(0, b.p + HDR_SIZE, (uInt)(b.n - HDR_SIZE)));
	write_whole(path, b.p, b.n);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	chmod(p, 0700);
	return remove(p);
}

/* Every file below `dir`: count them and note any that is not an entry. */
static void list_files(const char *dir, int *nfiles, int *nstray, char *stray,
		       size_t straylen)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		char p[4096];
		struct stat st;
		size_t n = strlen(de->d_name);

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		if (lstat(p, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			list_files(p, nfiles, nstray, stray, straylen);
			continue;
		}
		(*nfiles)++;
		if (de->d_name[0] == '.' || n < 4 || strcmp(de->d_name + n - 4, ".spr")) {
			(*nstray)++;
			snprintf(stray, straylen, "%s", p);
		}
	}
	closedir(d);
}

/* ---- protobuf wire walking (just enough to find a field) ------------- */

static int varint(const uint8_t *p, size_t n, size_t *off, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64 && *off < n; shift += 7) {
		uint8_t c = p[(*off)++];

		*v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return 0;
	}
	return -1;
}

/*
 * Find field `num` in the message at p[0, n): its offset (the value of a
 * varint, or the first byte after a length prefix) and, for length-
 * delimited fields, its length.  Returns -1 if absent.
 */
static int find_field(const uint8_t *p, size_t n, unsigned num, size_t *at,
		      size_t *len)
{
	size_t off = 0;

	while (off < n) {
		uint64_t tag, v;
		size_t start;

		if (varint(p, n, &off, &tag) < 0)
			return -1;
		start = off;
		switch (tag & 7) {
		case 0:
			if (varint(p, n, &off, &v) < 0)
				return -1;
			*len = off - start;
			break;
		case 1:
			off += 8;
			*len = 8;
			break;
		case 5:
			off += 4;
			*len = 4;
			break;
		case 2:
			if (varint(p, n, &off, &v) < 0 || v > n - off)
				return -1;
			start = off;
			*len = (size_t)v;
			off += (size_t)v;
			break;
		default:
			return -1;
		}
		if ((tag >> 3) == num) {
			*at = start;
			return 0;
		}
	}
	return -1;
}

/* Field numbers from proto/repo.proto. */
enum {
	E_ANALYZER_VERSION = 2, E_STRS = 10, E_FUNCS = 11, E_BLOCKS = 12,
	E_EDGES = 13, E_SITES = 14,
	F_ADDR = 1, F_SIZE = 2, F_NAME = 3, F_PARENT = 4, F_FIRST_BLOCK = 5,
	B_FUNC = 3, B_NEDGES = 5,
	ED_TO = 1,
	S_FUNC = 4, S_CALLEE = 5, S_KIND = 8,
};

/* Offset in the file of column `col` of table `table` (packed data), or 0. */
static size_t column_at(blob b, unsigned table, unsigned col, size_t *len)
{
	size_t t_at, t_len, c_at;

	if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, table, &t_at, &t_len) < 0 ||
	    find_field(b.p + HDR_SIZE + t_at, t_len, col, &c_at, len) < 0)
		return 0;
	return HDR_SIZE + t_at + c_at;
}

/* ---- comparison -------------------------------------------------------- */

static void compare_modules(const ca_module *a, const ca_module *b)
{
	size_t na, nb;

	CHECK(!strcmp(ca_module_path(a), ca_module_path(b)), "%s vs %s",
	      ca_module_path(a), ca_module_path(b));
	CHECK(!strcmp(ca_module_key(a), ca_module_key(b)), "key");
	CHECK(!strcmp(ca_module_buildid(a), ca_module_buildid(b)), "build-id");
	CHECK(!strcmp(ca_module_lines_source(a), ca_module_lines_source(b)),
	      "lines source");
	CHECK(ca_module_file_size(a) == ca_module_file_size(b), "file size");
	CHECK(ca_module_is_pie_or_dso(a) == ca_module_is_pie_or_dso(b), "is_dyn");
	CHECK(!memcmp(ca_module_stats(a), ca_module_stats(b), sizeof(ca_stats)),
	      "stats differ");

	/* Records without padding compare whole; blocks and sites have
	 * padding bytes whose value nobody promises, so field by field. */
	const ca_func *fa = ca_module_funcs(a, &na), *fb = ca_module_funcs(b, &nb);
	CHECK(na == nb, "nfuncs %zu vs %zu", na, nb);
	for (size_t i = 0; i < na && na == nb; i++) {
		if (memcmp(&fa[i], &fb[i], sizeof fa[i])) {
			CHECK(0, "function %zu differs", i);
			break;
		}
		CHECK(!strcmp(ca_str(a, fa[i].name), ca_str(b, fb[i].name)),
		      "function %zu name", i);
	}

	const ca_block *ba = ca_module_blocks(a, &na), *bb = ca_module_blocks(b, &nb);
	CHECK(na == nb, "nblocks %zu vs %zu", na, nb);
	for (size_t i = 0; i < na && na == nb; i++) {
		const ca_block *x = &ba[i], *y = &bb[i];

		if (x->addr != y->addr || x->size != y->size || x->func != y->func ||
		    x->first_edge != y->first_edge || x->nedges != y->nedges ||
		    x->flags != y->flags || x->ninsns != y->ninsns) {
			CHECK(0, "block %zu differs", i);
			break;
		}
	}

	const ca_edge *ea = ca_module_edges(a, &na), *eb = ca_module_edges(b, &nb);
	CHECK(na == nb, "nedges %zu vs %zu", na, nb);
	CHECK(na != nb || !na || !memcmp(ea, eb, na * sizeof *ea), "edges differ");

	const ca_site *sa = ca_module_sites(a, &na), *sb = ca_module_sites(b, &nb);
	CHECK(na == nb, "nsites %zu vs %zu", na, nb);
	for (size_t i = 0; i < na && na == nb; i++) {
		const ca_site *x = &sa[i], *y = &sb[i];

		if (x->addr != y->addr || x->target != y->target ||
		    x->patch_addr != y->patch_addr || x->func != y->func ||
		    x->callee != y->callee || x->import != y->import ||
		    x->len != y->len || x->kind != y->kind ||
		    x->method != y->method || x->reason != y->reason ||
		    x->flags != y->flags || x->patch_len != y->patch_len ||
		    x->reloc_rip != y->reloc_rip) {
			CHECK(0, "site %zu differs", i);
			break;
		}
		if (x->import != CA_NONE)
			CHECK(!strcmp(ca_str(a, x->import), ca_str(b, y->import)),
			      "site %zu import", i);
	}

	const ca_line *la = ca_module_lines(a, &na), *lb = ca_module_lines(b, &nb);
	CHECK(na == nb, "nlines %zu vs %zu", na, nb);
	CHECK(na != nb || !na || !memcmp(la, lb, na * sizeof *la), "lines differ");
	for (size_t i = 0; i < na && na == nb; i++)
		if (strcmp(ca_str(a, la[i].file), ca_str(b, lb[i].file))) {
			CHECK(0, "line %zu file", i);
			break;
		}

	const ca_undecodable *ua = ca_module_undecodable(a, &na);
	const ca_undecodable *ub = ca_module_undecodable(b, &nb);
	CHECK(na == nb, "nundecodable %zu vs %zu", na, nb);
	CHECK(na != nb || !na || !memcmp(ua, ub, na * sizeof *ua),
	      "undecodable regions differ");
}

/* ---- cases ----------------------------------------------------------- */

/* Load must fail (-1) with a message containing `want` and the entry path. */
static void expect_reject(const char *repo, const char *key, const char *entry,
			  const char *want, const char *what)
{
	ca_module *m = NULL;
	sp_err err = { "" };
	int rc = ca_repo_load(repo, key, &m, &err);

	CHECK(rc == -1, "%s: load returned %d", what, rc);
	CHECK(m == NULL, "%s: module returned on failure", what);
	CHECK(strstr(err.msg, want) != NULL, "%s: message \"%s\" lacks \"%s\"",
	      what, err.msg, want);
	CHECK(strstr(err.msg, entry) != NULL, "%s: message \"%s\" lacks the path",
	      what, err.msg);
	printf("test_repo: %s: %s\n", what, err.msg);
	if (rc == 0)
		ca_module_free(m);
}

/* Overwrite the little-endian u32 at `col_off + 4*idx` and expect rejection. */
static void poke_column(const char *repo, const char *key, const char *entry,
			blob orig, unsigned table, unsigned col, size_t idx_from_end,
			uint32_t value, const char *want, const char *what)
{
	size_t len, at = column_at(orig, table, col, &len);
	blob b = { malloc(orig.n), orig.n };

	if (!at || len < 4) {
		printf("test_repo: skip %s (column empty in this module)\n", what);
		free(b.p);
		return;
	}
	memcpy(b.p, orig.p, orig.n);
	put_le32(b.p + at + len - 4 * (idx_from_end + 1), value);
	write_with_crc(entry, b);
	expect_reject(repo, key, entry, want, what);
	free(b.p);
}

/* Flip random payload bytes (checksum fixed up) and truncate at random:
 * load may succeed or fail but must not crash (run under ASan). */
static void fuzz(const char *repo, const char *key, const char *entry, blob orig)
{
	blob b = { malloc(orig.n), orig.n };
	int nok = 0, nfail = 0;

	srand(12345);
	for (int iter = 0; iter < FUZZ_ITERS; iter++) {
		ca_module *m = NULL;
		sp_err err;
		int nflips = 1 + rand() % 8;

		memcpy(b.p, orig.p, orig.n);
		for (int k = 0; k < nflips; k++) {
			size_t off = HDR_SIZE + (size_t)rand() % (orig.n - HDR_SIZE);

			b.p[off] ^= (uint8_t)(1 + rand() % 255);
		}
		write_with_crc(entry, b);
		int rc = ca_repo_load(repo, key, &m, &err);
		CHECK(rc == 0 || rc == -1, "fuzz: rc %d", rc);
		if (rc == 0) {
			nok++;
			ca_module_free(m);
		} else {
			nfail++;
		}
	}
	for (int iter = 0; iter < 50; iter++) {
		ca_module *m = NULL;
		sp_err err;
		size_t n = (size_t)rand() % orig.n;

		write_whole(entry, orig.p, n);
		CHECK(ca_repo_load(repo, key, &m, &err) == -1,
		      "truncated to %zu bytes accepted", n);
	}
	printf("test_repo: fuzz: %d mutated entries loaded, %d rejected\n", nok, nfail);
	free(b.p);
}

int main(int argc, char **argv)
{
	const char *target = argc > 1 ? argv[1] : "/proc/self/exe";
	char tmp[] = "/tmp/test_repo.XXXXXX", repo[512], entry[4096], key[160];
	char notdir[600], stray[4096] = "";
	ca_options opt = { 0 };
	ca_module *m = NULL, *l = NULL;
	sp_err err = { "" };
	int rc, from_repo, nfiles = 0, nstray = 0;
	blob orig;

	if (!mkdtemp(tmp))
		FATAL("mkdtemp: %s", strerror(errno));
	/* Nested and missing: the store has to create it. */
	snprintf(repo, sizeof repo, "%s/a/b/repo", tmp);

	/* Key without analysis, and its errors. */
	if (ca_module_key_of(target, key, sizeof key, &err) < 0)
		FATAL("key of %s: %s", target, err.msg);
	CHECK(ca_module_key_of("/nonexistent/x", key + 100, 50, &err) == -1 &&
	      strstr(err.msg, "/nonexistent/x"), "missing file: %s", err.msg);
	snprintf(notdir, sizeof notdir, "%s/text", tmp);
	write_whole(notdir, (const uint8_t *)"hello\n", 6);
	CHECK(ca_module_key_of(notdir, key + 100, 50, &err) == -1 &&
	      strstr(err.msg, notdir) && strstr(err.msg, "not an ELF"),
	      "non-ELF: %s", err.msg);
	unlink(notdir);

	/* Round trip. */
	if (ca_analyze(target, &opt, &m, &err) < 0)
		FATAL("analysing %s: %s", target, err.msg);
	CHECK(!strcmp(key, ca_module_key(m)), "key_of %s, analysis %s", key,
	      ca_module_key(m));
	if (ca_repo_store(m, repo, entry, sizeof entry, &err) < 0)
		FATAL("store: %s", err.msg);
	CHECK(strstr(entry, repo) == entry && strstr(entry, ".spr"), "entry %s", entry);
	rc = ca_repo_load(repo, ca_module_key(m), &l, &err);
	CHECK(rc == 0, "load: %d %s", rc, err.msg);
	if (rc == 0) {
		compare_modules(m, l);
		ca_module_free(l);
	}
	/* Storing again replaces the entry, and leaves no temporary files. */
	CHECK(ca_repo_store(m, repo, NULL, 0, &err) == 0, "second store: %s", err.msg);
	list_files(repo, &nfiles, &nstray, stray, sizeof stray);
	CHECK(nfiles == 1 && nstray == 0, "%d files, %d stray (%s)", nfiles, nstray,
	      stray);

	orig = read_whole(entry);
	printf("test_repo: %s: entry %s, %zu bytes\n", target, entry, orig.n);

	/* Missing and malformed keys. */
	CHECK(ca_repo_load(repo, "00112233445566778899aabbccddeeff00112233", &l,
			   &err) == 1, "missing key");
	CHECK(ca_repo_load(repo, "../../etc/passwd", &l, &err) == -1 &&
	      strstr(err.msg, "invalid"), "bad key: %s", err.msg);

	/* Truncation: inside the payload, and inside the header. */
	write_whole(entry, orig.p, orig.n - 7);
	expect_reject(repo, key, entry, "truncated", "truncated payload");
	write_whole(entry, orig.p, 10);
	expect_reject(repo, key, entry, "truncated", "truncated header");
	write_whole(entry, orig.p, 0);
	expect_reject(repo, key, entry, "truncated", "empty file");

	/* One flipped payload byte. */
	{
		blob b = { malloc(orig.n), orig.n };

		memcpy(b.p, orig.p, orig.n);
		b.p[HDR_SIZE + (orig.n - HDR_SIZE) / 2] ^= 0x40;
		write_whole(entry, b.p, b.n);
		expect_reject(repo, key, entry, "checksum", "flipped byte");

		/* Bad magic. */
		memcpy(b.p, orig.p, orig.n);
		b.p[0] = 'X';
		write_whole(entry, b.p, b.n);
		expect_reject(repo, key, entry, "magic", "bad magic");

		/* Garbage payload with a valid checksum. */
		memcpy(b.p, orig.p, orig.n);
		srand(1);
		for (size_t i = HDR_SIZE; i < b.n; i++)
			b.p[i] = (uint8_t)rand();
		write_with_crc(entry, b);
		expect_reject(repo, key, entry, "corrupt", "garbage payload");

		/* Another analyser version. */
		size_t at, len;
		memcpy(b.p, orig.p, orig.n);
		if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, E_ANALYZER_VERSION,
			       &at, &len) == 0 && len == 1) {
			b.p[HDR_SIZE + at] ^= 0x40;
			write_with_crc(entry, b);
			expect_reject(repo, key, entry, "analyser version",
				      "analyser version");
		} else {
			CHECK(0, "analyser_version field not found");
		}

		/* Column lengths disagree: retag funcs.size as funcs.addr, so
		 * addr gets 2n values and size none. */
		memcpy(b.p, orig.p, orig.n);
		at = column_at(b, E_FUNCS, F_SIZE, &len);
		if (at) {
			/* the tag is just before the length prefix */
			size_t t = at - 1;

			while (t > 0 && (b.p[t - 1] & 0x80))
				t--;
			/* t is the first byte of the length varint; the
			 * one-byte tag precedes it */
			CHECK(b.p[t - 1] == (F_SIZE << 3 | 2), "tag found");
			b.p[t - 1] = F_ADDR << 3 | 2;
			write_with_crc(entry, b);
			expect_reject(repo, key, entry, "values", "column lengths");
		}
		/* String table without its leading NUL. */
		memcpy(b.p, orig.p, orig.n);
		if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, E_STRS, &at, &len) == 0 &&
		    len > 0) {
			b.p[HDR_SIZE + at] = 'x';
			write_with_crc(entry, b);
			expect_reject(repo, key, entry, "string table", "string table");
		}
		free(b.p);
	}

	/* Indices, offsets and ranges out of bounds. */
	poke_column(repo, key, entry, orig, E_FUNCS, F_PARENT, 0, 0x7fffffff,
		    "parent", "function parent");
	poke_column(repo, key, entry, orig, E_FUNCS, F_NAME, 0, 0xfffffff0,
		    "string offset", "function name");
	poke_column(repo, key, entry, orig, E_FUNCS, F_FIRST_BLOCK, 0, 0xfffffff0,
		    "blocks", "function blocks range");
	/* addr is fixed64: u32 3 from the end is the low half of the
	 * last-but-one address, which then exceeds the last one. */
	poke_column(repo, key, entry, orig, E_FUNCS, F_ADDR, 3, 0xffffffff,
		    "sorted", "unsorted functions");
	poke_column(repo, key, entry, orig, E_BLOCKS, B_FUNC, 0, 0x7ffffff0,
		    "func", "block function");
	poke_column(repo, key, entry, orig, E_BLOCKS, B_NEDGES, 0, 0x10000,
		    "nedges", "block nedges");
	poke_column(repo, key, entry, orig, E_EDGES, ED_TO, 0, 0x7ffffff0,
		    "to", "edge target");
	poke_column(repo, key, entry, orig, E_SITES, S_FUNC, 0, 0xfffffff0,
		    "func", "site function");
	poke_column(repo, key, entry, orig, E_SITES, S_CALLEE, 0, 0x7ffffff0,
		    "callee", "site callee");
	poke_column(repo, key, entry, orig, E_SITES, S_KIND, 0, 200,
		    "out of range", "site kind");

	fuzz(repo, key, entry, orig);

	/* ca_repo_get replaces a corrupt entry, then finds it. */
	orig.p[orig.n - 1] ^= 1;
	write_whole(entry, orig.p, orig.n);
	rc = ca_repo_get(repo, target, &opt, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get over corrupt: rc %d from_repo %d %s",
	      rc, from_repo, err.msg);
	if (rc == 0)
		ca_module_free(l);
	rc = ca_repo_get(repo, target, &opt, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 1, "get again: rc %d from_repo %d %s", rc,
	      from_repo, err.msg);
	if (rc == 0) {
		CHECK(!strcmp(ca_module_path(l), target), "path %s", ca_module_path(l));
		compare_modules(m, l);
		ca_module_free(l);
	}
	free(orig.p);

	/* A repository that cannot be a directory: a regular file in the way
	 * (chmod would not stop root). */
	snprintf(notdir, sizeof notdir, "%s/plainfile", tmp);
	write_whole(notdir, (const uint8_t *)"x", 1);
	CHECK(ca_repo_store(m, notdir, NULL, 0, &err) == -1 &&
	      strstr(err.msg, notdir) && strstr(err.msg, "SPTRACE_REPO"),
	      "repo is a file: %s", err.msg);
	printf("test_repo: unwritable repository: %s\n", err.msg);
	snprintf(notdir, sizeof notdir, "%s/plainfile/sub", tmp);
	CHECK(ca_repo_store(m, notdir, NULL, 0, &err) == -1 &&
	      strstr(err.msg, notdir), "repo below a file: %s", err.msg);
	CHECK(ca_repo_load(notdir, key, &l, &err) == 1, "load below a file");

	ca_module_free(m);
	nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	if (failures) {
		fprintf(stderr, "test_repo: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_repo: all checks passed\n");
	return 0;
}
