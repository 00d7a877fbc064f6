/*
 * test_repo.c — the code-analysis repository through codeanalysis.h:
 * round trip (every record and string equal), atomic writes (temporaries
 * of dead writers cleaned, nothing else), and rejection
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
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "codeanalysis.h"
#include "sp.h"

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
		if (de->d_name[0] == '.' || n < 4 ||
		    (strcmp(de->d_name + n - 4, ".spr") && strcmp(de->d_name + n - 4, ".spc"))) {
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
	S_FUNC = 4, S_CALLEE = 5, S_KIND = 8, S_CODE = 14,
	E_CODE_SHA256 = 19,
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

/* `same_analysis`: b was loaded from a's entry, so even the timings match;
 * otherwise b comes from another run of the analysis and they may not. */
static void compare_modules(const ca_module *a, const ca_module *b,
			    int same_analysis)
{
	ca_stats sta = *ca_module_stats(a), stb = *ca_module_stats(b);
	size_t na, nb;

	CHECK(!strcmp(ca_module_path(a), ca_module_path(b)), "%s vs %s",
	      ca_module_path(a), ca_module_path(b));
	CHECK(!strcmp(ca_module_key(a), ca_module_key(b)), "key");
	CHECK(!strcmp(ca_module_buildid(a), ca_module_buildid(b)), "build-id");
	CHECK(!strcmp(ca_module_lines_source(a), ca_module_lines_source(b)),
	      "lines source");
	CHECK(ca_module_file_size(a) == ca_module_file_size(b), "file size");
	CHECK(ca_module_is_pie_or_dso(a) == ca_module_is_pie_or_dso(b), "is_dyn");
	if (!same_analysis) {
		sta.analyze_ns = stb.analyze_ns = 0;
		sta.lines_ns = stb.lines_ns = 0;
	}
	CHECK(!memcmp(&sta, &stb, sizeof sta), "stats differ");

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

/* What every case needs: the module under test and where its entry is. */
typedef struct ctx {
	const char *target;  /* the ELF file analysed */
	char tmp[64];        /* scratch directory, removed at the end */
	char repo[512];      /* repository inside it */
	char key[160];
	char entry[4096];    /* path of the module's entry */
	ca_options opt;
	ca_module *m;        /* ca_analyze(target) */
	blob orig;           /* the entry's bytes as first stored */
} ctx;

/* Load must fail (-1) with a message containing `want` and the entry path. */
static void expect_reject(const ctx *c, const char *want, const char *what)
{
	ca_module *m = NULL;
	sp_err err = { "" };
	int rc = ca_repo_load(c->repo, c->key, &m, &err);

	CHECK(rc == -1, "%s: load returned %d", what, rc);
	CHECK(m == NULL, "%s: module returned on failure", what);
	CHECK(strstr(err.msg, want) != NULL, "%s: message \"%s\" lacks \"%s\"",
	      what, err.msg, want);
	CHECK(strstr(err.msg, c->entry) != NULL, "%s: message \"%s\" lacks the path",
	      what, err.msg);
	printf("test_repo: %s: %s\n", what, err.msg);
	if (rc == 0)
		ca_module_free(m);
}

/* A fresh copy of the stored entry to damage. */
static blob entry_copy(const ctx *c)
{
	blob b = { malloc(c->orig.n), c->orig.n };

	if (!b.p)
		FATAL("out of memory");
	memcpy(b.p, c->orig.p, c->orig.n);
	return b;
}

static void test_key_of(ctx *c)
{
	char key[160], path[600];
	sp_err err = { "" };

	if (ca_module_key_of(c->target, c->key, sizeof c->key, &err) < 0)
		FATAL("key of %s: %s", c->target, err.msg);
	CHECK(ca_module_key_of("/nonexistent/x", key, sizeof key, &err) == -1 &&
	      strstr(err.msg, "/nonexistent/x"), "missing file: %s", err.msg);
	snprintf(path, sizeof path, "%s/text", c->tmp);
	write_whole(path, (const uint8_t *)"hello\n", 6);
	CHECK(ca_module_key_of(path, key, sizeof key, &err) == -1 &&
	      strstr(err.msg, path) && strstr(err.msg, "not an ELF"),
	      "non-ELF: %s", err.msg);
	unlink(path);
}

/* The key from a loaded image's notes (what the agent reads at start) is
 * its file's; notes cut short or lying about their sizes give none. */
static int key_of_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
	int *n = arg;
	char mem[160], file[160], path[4096];
	const char *name = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
	sp_err err = { "" };

	(void)size;
	if (strstr(name, "linux-vdso"))
		return 0;
	snprintf(path, sizeof path, "%s", name);
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		const uint8_t *notes = (const uint8_t *)(uintptr_t)(info->dlpi_addr + ph->p_vaddr);
		uint8_t bad[64];

		if (ph->p_type != PT_NOTE ||
		    ca_module_key_of_notes(notes, ph->p_memsz, ph->p_align, mem, sizeof mem) < 0)
			continue;
		CHECK(ca_module_key_of(path, file, sizeof file, &err) == 0 && strcmp(mem, file) == 0,
		      "%s: key %s from memory, %s from the file (%s)", path, mem, file, err.msg);
		CHECK(ca_module_key_of_notes(notes, ph->p_memsz, ph->p_align, mem, 8) == -1,
		      "%s: a key longer than its buffer", path);
		for (size_t cut = 0; cut < 16 && cut < ph->p_memsz; cut++)
			CHECK(ca_module_key_of_notes(notes, cut, ph->p_align, mem, sizeof mem) == -1,
			      "%s: a key from %zu bytes of notes", path, cut);
		if (ph->p_memsz <= sizeof bad) {
			memcpy(bad, notes, ph->p_memsz);
			memset(bad + 4, 0xff, 4);       /* the first note's descsz */
			CHECK(ca_module_key_of_notes(bad, ph->p_memsz, ph->p_align, mem,
						     sizeof mem) == -1,
			      "%s: a key from a note longer than the segment", path);
		}
		++*n;
		break;
	}
	return 0;
}

static void test_key_in_memory(void)
{
	int n = 0;

	dl_iterate_phdr(key_of_loaded, &n);
	CHECK(n >= 2, "only %d loaded modules had a build-id in memory", n);
}

/* Analyse, store, load: equal records; no temporary files left behind. */
static void test_round_trip(ctx *c)
{
	char stray[4096] = "";
	int nfiles = 0, nstray = 0, rc;
	ca_module *l = NULL;
	sp_err err = { "" };

	if (ca_analyze(c->target, &c->opt, &c->m, &err) < 0)
		FATAL("analysing %s: %s", c->target, err.msg);
	CHECK(!strcmp(c->key, ca_module_key(c->m)), "key_of %s, analysis %s",
	      c->key, ca_module_key(c->m));
	/* The repository (and its parents) do not exist yet. */
	if (ca_repo_store(c->m, c->repo, c->entry, sizeof c->entry, &err) < 0)
		FATAL("store: %s", err.msg);
	CHECK(strstr(c->entry, c->repo) == c->entry && strstr(c->entry, ".spr"),
	      "entry %s", c->entry);
	rc = ca_repo_load(c->repo, ca_module_key(c->m), &l, &err);
	CHECK(rc == 0, "load: %d %s", rc, err.msg);
	if (rc == 0) {
		compare_modules(c->m, l, 1);
		ca_module_free(l);
	}
	/* Storing again replaces the entry. */
	CHECK(ca_repo_store(c->m, c->repo, NULL, 0, &err) == 0, "second store: %s",
	      err.msg);
	list_files(c->repo, &nfiles, &nstray, stray, sizeof stray);
	CHECK(nfiles == 2 && nstray == 0, "%d files (an entry and its calls image), %d stray (%s)",
	      nfiles, nstray, stray);
	c->orig = read_whole(c->entry);
	printf("test_repo: %s: entry %s, %zu bytes\n", c->target, c->entry,
	       c->orig.n);

	/* Missing and malformed keys. */
	CHECK(ca_repo_load(c->repo, "00112233445566778899aabbccddeeff00112233",
			   &l, &err) == 1, "missing key");
	CHECK(ca_repo_load(c->repo, "../../etc/passwd", &l, &err) == -1 &&
	      strstr(err.msg, "invalid"), "bad key: %s", err.msg);
}

/* Damage the header or the payload as a whole. */
static void test_damaged(const ctx *c)
{
	blob b;

	write_whole(c->entry, c->orig.p, c->orig.n - 7);
	expect_reject(c, "truncated", "truncated payload");
	write_whole(c->entry, c->orig.p, 10);
	expect_reject(c, "truncated", "truncated header");
	write_whole(c->entry, c->orig.p, 0);
	expect_reject(c, "truncated", "empty file");

	b = entry_copy(c);
	b.p[HDR_SIZE + (b.n - HDR_SIZE) / 2] ^= 0x40;
	write_whole(c->entry, b.p, b.n);
	expect_reject(c, "checksum", "flipped byte");
	free(b.p);

	b = entry_copy(c);
	b.p[0] = 'X';
	write_whole(c->entry, b.p, b.n);
	expect_reject(c, "magic", "bad magic");
	free(b.p);

	/* Garbage payload with a valid checksum: protobuf sees the garbage. */
	b = entry_copy(c);
	srand(1);
	for (size_t i = HDR_SIZE; i < b.n; i++)
		b.p[i] = (uint8_t)rand();
	write_with_crc(c->entry, b);
	expect_reject(c, "corrupt", "garbage payload");
	free(b.p);
}

/* Well-formed protobuf whose content is wrong. */
static void test_bad_content(const ctx *c)
{
	size_t at, len;
	blob b;

	/* Written by another analyser version. */
	b = entry_copy(c);
	if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, E_ANALYZER_VERSION, &at,
		       &len) == 0 && len == 1) {
		b.p[HDR_SIZE + at] ^= 0x40;
		write_with_crc(c->entry, b);
		expect_reject(c, "analyser version", "analyser version");
	} else {
		CHECK(0, "analyser_version field not found");
	}
	free(b.p);

	/* Column lengths disagree: retag funcs.size as funcs.addr, so addr
	 * gets 2n values and size none. */
	b = entry_copy(c);
	at = column_at(b, E_FUNCS, F_SIZE, &len);
	if (at) {
		size_t t = at - 1;  /* last byte of the length varint */

		while (t > 0 && (b.p[t - 1] & 0x80))
			t--;
		/* t is the first byte of the length; the one-byte tag is before */
		CHECK(b.p[t - 1] == (F_SIZE << 3 | 2), "funcs.size tag not found");
		b.p[t - 1] = F_ADDR << 3 | 2;
		write_with_crc(c->entry, b);
		expect_reject(c, "values", "column lengths");
	}
	free(b.p);

	/* Without what it was made from: the code hash, the sites' bytes
	 * (each retagged as a field nobody reads). */
	b = entry_copy(c);
	if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, E_CODE_SHA256, &at, &len) == 0 &&
	    len == 32 && b.p[HDR_SIZE + at - 3] == (uint8_t)(E_CODE_SHA256 << 3 | 2 | 0x80)) {
		b.p[HDR_SIZE + at - 3] = (uint8_t)(28 << 3 | 2 | 0x80);   /* field 28 */
		write_with_crc(c->entry, b);
		expect_reject(c, "code_sha256", "no code hash");
	} else {
		CHECK(0, "code_sha256 field not found");
	}
	free(b.p);
	b = entry_copy(c);
	at = column_at(b, E_SITES, S_CODE, &len);
	if (at) {
		size_t t = at - 1;

		while (t > 0 && (b.p[t - 1] & 0x80))
			t--;
		CHECK(b.p[t - 1] == (S_CODE << 3 | 2), "sites.code tag not found");
		b.p[t - 1] = 15 << 3 | 2;                                  /* field 15 */
		write_with_crc(c->entry, b);
		expect_reject(c, "values", "sites without their bytes' hash");
	} else {
		CHECK(0, "sites.code column not found");
	}
	free(b.p);

	/* String table without its leading NUL. */
	b = entry_copy(c);
	if (find_field(b.p + HDR_SIZE, b.n - HDR_SIZE, E_STRS, &at, &len) == 0 &&
	    len > 0) {
		b.p[HDR_SIZE + at] = 'x';
		write_with_crc(c->entry, b);
		expect_reject(c, "string table", "string table");
	}
	free(b.p);
}

/* Overwrite the little-endian u32 `idx_from_end` u32s before the end of a
 * column and expect rejection. */
static void poke_column(const ctx *c, unsigned table, unsigned col,
			size_t idx_from_end, uint32_t value, const char *want,
			const char *what)
{
	size_t len, at = column_at(c->orig, table, col, &len);
	blob b;

	if (!at || len < 4 * (idx_from_end + 1)) {
		printf("test_repo: skip %s (column too short in this module)\n", what);
		return;
	}
	b = entry_copy(c);
	put_le32(b.p + at + len - 4 * (idx_from_end + 1), value);
	write_with_crc(c->entry, b);
	expect_reject(c, want, what);
	free(b.p);
}

/* Indices, string offsets and ranges out of bounds. */
static void test_out_of_bounds(const ctx *c)
{
	poke_column(c, E_FUNCS, F_PARENT, 0, 0x7fffffff, "parent",
		    "function parent");
	poke_column(c, E_FUNCS, F_NAME, 0, 0xfffffff0, "string offset",
		    "function name");
	poke_column(c, E_FUNCS, F_FIRST_BLOCK, 0, 0xfffffff0, "blocks",
		    "function blocks range");
	/* addr is fixed64: u32 3 from the end is the low half of the
	 * last-but-one address, which then exceeds the last one. */
	poke_column(c, E_FUNCS, F_ADDR, 3, 0xffffffff, "sorted",
		    "unsorted functions");
	poke_column(c, E_BLOCKS, B_FUNC, 0, 0x7ffffff0, "func", "block function");
	poke_column(c, E_BLOCKS, B_NEDGES, 0, 0x10000, "nedges", "block nedges");
	poke_column(c, E_EDGES, ED_TO, 0, 0x7ffffff0, "to", "edge target");
	poke_column(c, E_SITES, S_FUNC, 0, 0xfffffff0, "func", "site function");
	poke_column(c, E_SITES, S_CALLEE, 0, 0x7ffffff0, "callee", "site callee");
	poke_column(c, E_SITES, S_KIND, 0, 200, "out of range", "site kind");
}

/* Flip random payload bytes (checksum fixed up) and truncate at random:
 * load may succeed or fail but must not crash (run under ASan). */
static void test_fuzz(const ctx *c)
{
	int nok = 0, nfail = 0;

	srand(12345);
	for (int iter = 0; iter < FUZZ_ITERS; iter++) {
		blob b = entry_copy(c);
		ca_module *m = NULL;
		sp_err err;
		int nflips = 1 + rand() % 8, rc;

		for (int k = 0; k < nflips; k++)
			b.p[HDR_SIZE + (size_t)rand() % (b.n - HDR_SIZE)] ^=
				(uint8_t)(1 + rand() % 255);
		write_with_crc(c->entry, b);
		free(b.p);
		rc = ca_repo_load(c->repo, c->key, &m, &err);
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
		size_t n = (size_t)rand() % c->orig.n;

		write_whole(c->entry, c->orig.p, n);
		CHECK(ca_repo_load(c->repo, c->key, &m, &err) == -1,
		      "truncated to %zu bytes accepted", n);
	}
	printf("test_repo: fuzz: %d mutated entries loaded, %d rejected\n", nok,
	       nfail);
}

/*
 * The calls view (ca_repo_load_calls): the same functions (without their
 * blocks), call sites, strings and stats as the full load, no blocks,
 * edges or lines; damaged entries are refused or loaded, never a crash.
 */
/* The calls image beside the entry (codeanalysis/image.c). */
static void image_path(const ctx *c, char *path, size_t len)
{
	snprintf(path, len, "%.*s.spc", (int)(strlen(c->entry) - 4), c->entry);
}

/* v is the calls view of the full analysis m: every function, site and
 * string the same, no blocks. */
static void compare_calls_view(const ca_module *m, const ca_module *v, const char *what)
{
	size_t na, nb;

	CHECK(!memcmp(ca_module_stats(m), ca_module_stats(v), sizeof(ca_stats)),
	      "%s: stats differ", what);
	CHECK(!strcmp(ca_module_path(m), ca_module_path(v)) &&
	      !strcmp(ca_module_key(m), ca_module_key(v)) &&
	      !strcmp(ca_module_buildid(m), ca_module_buildid(v)), "%s: path or key", what);
	const ca_func *fa = ca_module_funcs(m, &na), *fb = ca_module_funcs(v, &nb);

	CHECK(na == nb && na > 0, "%s: %zu functions, %zu in the full entry", what, nb, na);
	for (size_t i = 0; i < na && na == nb; i++)
		if (fa[i].addr != fb[i].addr || fa[i].size != fb[i].size ||
		    fa[i].first_site != fb[i].first_site || fa[i].nsites != fb[i].nsites ||
		    fa[i].flags != fb[i].flags || fa[i].parent != fb[i].parent ||
		    fb[i].nblocks != 0 || strcmp(ca_str(m, fa[i].name), ca_str(v, fb[i].name))) {
			CHECK(0, "%s: function %zu differs", what, i);
			break;
		}
	const ca_site *sa = ca_module_sites(m, &na), *sb = ca_module_sites(v, &nb);

	CHECK(na == nb && na > 0, "%s: %zu sites, %zu in the full entry", what, nb, na);
	for (size_t i = 0; i < na && na == nb; i++)
		if (sa[i].addr != sb[i].addr || sa[i].target != sb[i].target ||
		    sa[i].callee != sb[i].callee || sa[i].method != sb[i].method ||
		    sa[i].patch_addr != sb[i].patch_addr || sa[i].kind != sb[i].kind ||
		    sa[i].code != sb[i].code ||
		    (sa[i].import != CA_NONE) != (sb[i].import != CA_NONE) ||
		    (sa[i].import != CA_NONE && strcmp(ca_str(m, sa[i].import),
						       ca_str(v, sb[i].import)))) {
			CHECK(0, "%s: site %zu differs", what, i);
			break;
		}
	const ca_runtime *ra = ca_module_runtimes(m, &na), *rb = ca_module_runtimes(v, &nb);

	CHECK(na == nb, "%s: %zu runtime regions, %zu in the full entry", what, nb, na);
	for (size_t i = 0; i < na && na == nb; i++)
		CHECK(ra[i].lo == rb[i].lo && ra[i].hi == rb[i].hi && ra[i].kind == rb[i].kind &&
		      !strcmp(ca_str(m, ra[i].how), ca_str(v, rb[i].how)),
		      "%s: runtime region %zu differs", what, i);
	ca_module_blocks(v, &na);
	ca_module_edges(v, &nb);
	CHECK(na == 0 && nb == 0, "%s: %zu blocks, %zu edges", what, na, nb);
}

/*
 * The calls image (codeanalysis/image.c): written with the entry, read in
 * place by ca_repo_load_calls with the same records as the entry's calls
 * view; a damaged image -- mutated, truncated, another key's, a directory
 * -- never crashes the reader, which then reads the entry.
 */
static void test_image(const ctx *c)
{
	char image[4200];
	ca_module *v = NULL;
	sp_err err = { "" };
	blob good;
	int nmapped = 0;

	write_whole(c->entry, c->orig.p, c->orig.n);
	image_path(c, image, sizeof image);
	CHECK(access(image, R_OK) == 0, "no calls image %s beside the entry", image);
	if (access(image, R_OK) != 0)
		return;
	good = read_whole(image);
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0, "image: %s", err.msg);
	if (v) {
		compare_calls_view(c->m, v, "calls image");
		ca_module_free(v);
	}
	srand(4242);
	for (int iter = 0; iter < FUZZ_ITERS; iter++) {
		blob b = { malloc(good.n), good.n };

		memcpy(b.p, good.p, good.n);
		if (iter % 3 == 0)
			b.n = (size_t)rand() % good.n;
		else
			for (int k = 0, n = 1 + rand() % 8; k < n; k++)
				b.p[(size_t)rand() % b.n] ^= (uint8_t)(1 + rand() % 255);
		write_whole(image, b.p, b.n);
		free(b.p);
		v = NULL;
		/* The entry is whole: always a module, from one or the other. */
		CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0,
		      "damaged image %d: %s", iter, err.msg);
		if (v && iter % 3 == 0)
			compare_calls_view(c->m, v, "truncated image");
		ca_module_free(v);
		nmapped++;
	}
	/* Another key's image under this name. */
	good.p[100] ^= 1;               /* inside the key (image_hdr) */
	write_whole(image, good.p, good.n);
	good.p[100] ^= 1;
	v = NULL;
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0, "other key: %s", err.msg);
	if (v) {
		compare_calls_view(c->m, v, "image of another key");
		ca_module_free(v);
	}
	unlink(image);
	mkdir(image, 0700);
	v = NULL;
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0, "image a directory: %s",
	      err.msg);
	ca_module_free(v);
	rmdir(image);
	write_whole(image, good.p, good.n);
	free(good.p);
	printf("test_repo: calls image %s: %d damaged copies read safely\n", image, nmapped);
}

/*
 * The memo of images checked whole (image.c, step 2; the agent's is in
 * agent/modules.c): an image is checked once under its identity, not again
 * while its identity holds; stored again (a new nonce, whatever inode and
 * time the file gets) or damaged and renamed into place, it is checked anew
 * -- and a damaged copy is still refused.
 */
static ca_image_id memo_ids[8];
static int memo_n, memo_seen_asked;

static bool memo_seen(const ca_image_id *id)
{
	memo_seen_asked++;
	for (int i = 0; i < memo_n; i++)
		if (!memcmp(&memo_ids[i], id, sizeof *id))
			return true;
	return false;
}

static void memo_checked(const ca_image_id *id)
{
	if (memo_n < 8)
		memo_ids[memo_n++] = *id;
}

static void test_image_memo(const ctx *c)
{
	static const ca_image_memo memo = { memo_seen, memo_checked };
	char image[4200], tmp[4300];
	ca_module *v = NULL;
	sp_err err = { "" };
	struct stat st;
	blob good;

	write_whole(c->entry, c->orig.p, c->orig.n);
	CHECK(ca_repo_store(c->m, c->repo, NULL, 0, &err) == 0, "store: %s", err.msg);
	image_path(c, image, sizeof image);
	ca_image_set_memo(&memo);
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0 && v, "memo: %s", err.msg);
	ca_module_free(v);
	stat(image, &st);
	CHECK(memo_n == 1 && memo_ids[0].dev == (uint64_t)st.st_dev &&
	      memo_ids[0].ino == (uint64_t)st.st_ino && memo_ids[0].size == (uint64_t)st.st_size &&
	      memo_ids[0].ctime_ns == (uint64_t)st.st_ctim.tv_sec * 1000000000u +
	      (uint64_t)st.st_ctim.tv_nsec && memo_ids[0].nonce != 0,
	      "the first load's image is not remembered with its identity (%d)", memo_n);
	/* Again: seen, not checked again. */
	v = NULL;
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0 && v, "memo again: %s", err.msg);
	if (v)
		compare_calls_view(c->m, v, "an image seen before");
	ca_module_free(v);
	CHECK(memo_n == 1 && memo_seen_asked == 2, "seen again: %d remembered, asked %d times",
	      memo_n, memo_seen_asked);
	/* Stored again: another nonce, checked anew. */
	CHECK(ca_repo_store(c->m, c->repo, NULL, 0, &err) == 0, "store again: %s", err.msg);
	v = NULL;
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0 && v, "memo stored: %s", err.msg);
	ca_module_free(v);
	CHECK(memo_n == 2 && memo_ids[1].nonce != memo_ids[0].nonce,
	      "an image stored again was not checked anew (%d remembered)", memo_n);
	/* Damaged copies renamed into place, as a store would: never taken for
	 * the image checked before, never a crash; from the image or the
	 * entry, the records are the analysis's. */
	good = read_whole(image);
	snprintf(tmp, sizeof tmp, "%s.damaged", image);
	srand(777);
	for (int iter = 0; iter < 200; iter++) {
		blob b = { malloc(good.n), good.n };

		memcpy(b.p, good.p, good.n);
		for (int k = 0, n = 1 + rand() % 4; k < n; k++)
			b.p[good.n / 4 + (size_t)rand() % (good.n - good.n / 4)] ^=
				(uint8_t)(1 + rand() % 255);
		write_whole(tmp, b.p, b.n);
		free(b.p);
		rename(tmp, image);
		v = NULL;
		CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0 && v,
		      "damaged image %d: %s", iter, err.msg);
		ca_module_free(v);
	}
	CHECK(memo_seen_asked >= 200, "the memo was not asked about the damaged copies");
	ca_image_set_memo(NULL);
	write_whole(image, good.p, good.n);
	free(good.p);
}

/*
 * An entry learns the identity of a file with its code (ca_repo_code_
 * matches): a copy of the target chmod'ed (a new ctime: as a package
 * upgrade leaves a library) still matches, its entry is written again once
 * -- then it matches without hashing, and the entry is left alone.
 */
static void test_learns_identity(const ctx *c)
{
	char copy[600], repo[600], key[160], entry[4200];
	ca_module *m = NULL;
	sp_err err = { "" };
	struct stat a, b;
	blob t = read_whole(c->target);

	snprintf(copy, sizeof copy, "%s/identity-copy", c->tmp);
	snprintf(repo, sizeof repo, "%s/identity-repo", c->tmp);
	write_whole(copy, t.p, t.n);
	free(t.p);
	chmod(copy, 0755);
	if (ca_module_key_of(copy, key, sizeof key, &err) < 0 ||
	    ca_analyze(copy, &c->opt, &m, &err) < 0 ||
	    ca_repo_store(m, repo, entry, sizeof entry, &err) < 0) {
		CHECK(0, "identity: %s", err.msg);
		ca_module_free(m);
		return;
	}
	ca_module_free(m);
	CHECK(ca_repo_code_matches(repo, key, copy, &err) == 1, "the file analysed: %s",
	      err.msg);
	stat(entry, &a);
	usleep(10000);
	chmod(copy, 0750);              /* the same bytes, another ctime */
	CHECK(ca_repo_code_matches(repo, key, copy, &err) == 1, "the file touched: %s",
	      err.msg);
	stat(entry, &b);
	CHECK(a.st_ino != b.st_ino, "the entry did not learn the touched file's identity");
	CHECK(ca_repo_code_matches(repo, key, copy, &err) == 1, "again: %s", err.msg);
	stat(entry, &a);
	CHECK(a.st_ino == b.st_ino, "the entry was written again for a file it knows");
	CHECK(ca_repo_code_matches(repo, "00112233445566778899aabbccddeeff00112233", copy,
				   &err) == 0, "no entry: not a match");
}

static void test_calls_view(const ctx *c)
{
	ca_module *v = NULL;
	sp_err err = { "" };
	char image[4200];
	int nok = 0, nfail = 0;

	/* The entry's own calls view: without the image beside it. */
	image_path(c, image, sizeof image);
	unlink(image);
	write_whole(c->entry, c->orig.p, c->orig.n);
	CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == 0, "calls view: %s", err.msg);
	if (!v)
		return;
	compare_calls_view(c->m, v, "calls view");
	ca_module_free(v);

	/* Mutated (the view does not check the checksum: every byte counts)
	 * and truncated entries. */
	srand(777);
	for (int iter = 0; iter < FUZZ_ITERS; iter++) {
		blob b = entry_copy(c);
		int rc;

		for (int k = 0, n = 1 + rand() % 8; k < n; k++)
			b.p[HDR_SIZE + (size_t)rand() % (b.n - HDR_SIZE)] ^= (uint8_t)(1 + rand() % 255);
		write_whole(c->entry, b.p, b.n);
		free(b.p);
		v = NULL;
		rc = ca_repo_load_calls(c->repo, c->key, &v, &err);
		CHECK(rc == 0 || rc == -1, "calls view fuzz: rc %d", rc);
		if (rc == 0) {
			nok++;
			ca_module_free(v);
		} else {
			nfail++;
		}
	}
	for (int iter = 0; iter < 50; iter++) {
		size_t n = (size_t)rand() % c->orig.n;

		write_whole(c->entry, c->orig.p, n);
		v = NULL;
		CHECK(ca_repo_load_calls(c->repo, c->key, &v, &err) == -1,
		      "calls view: truncated to %zu bytes accepted", n);
	}
	write_whole(c->entry, c->orig.p, c->orig.n);
	printf("test_repo: calls view: %d mutated entries loaded, %d rejected\n", nok, nfail);
}

/* ca_repo_get replaces a corrupt entry, then finds it. */
static void test_get_regenerates(const ctx *c)
{
	blob b = entry_copy(c);
	ca_module *l = NULL;
	sp_err err = { "" };
	int rc, from_repo = -1;

	b.p[b.n - 1] ^= 1;
	write_whole(c->entry, b.p, b.n);
	free(b.p);
	rc = ca_repo_get(c->repo, c->target, &c->opt, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get over corrupt: rc %d from_repo %d %s",
	      rc, from_repo, err.msg);
	if (rc == 0)
		ca_module_free(l);
	rc = ca_repo_get(c->repo, c->target, &c->opt, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 1, "get again: rc %d from_repo %d %s", rc,
	      from_repo, err.msg);
	if (rc == 0) {
		CHECK(!strcmp(ca_module_path(l), c->target), "path %s",
		      ca_module_path(l));
		compare_modules(c->m, l, 0);
		ca_module_free(l);
	}
}

/* ca_repo_get given the key (the agent read it already): the entry is found
 * by that key, the file not read for it again -- here a path where no file
 * is, which without the key fails. */
static void test_get_keyed(const ctx *c)
{
	char gone[PATH_MAX];
	ca_options keyed = { .calls_only = 1, .no_lines = 1, .key = c->key };
	ca_options plain = { .calls_only = 1, .no_lines = 1 };
	ca_module *l = NULL;
	sp_err err = { "" };
	int rc, from_repo = -1;

	snprintf(gone, sizeof gone, "%s/no-such-module", c->tmp);
	rc = ca_repo_get(c->repo, gone, &keyed, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 1, "get with a key: rc %d from_repo %d %s", rc, from_repo,
	      err.msg);
	if (rc == 0) {
		CHECK(!strcmp(ca_module_path(l), gone), "get with a key: path %s",
		      ca_module_path(l));
		ca_module_free(l);
	}
	rc = ca_repo_get(c->repo, gone, &plain, &l, &from_repo, &err);
	CHECK(rc < 0, "get without a key of a missing file: rc %d", rc);
	if (rc == 0)
		ca_module_free(l);
}

/*
 * The agent's way (no_lines, the calls view): the entry is stored marked
 * lines-pending, the calls view and a no-lines caller take it as it is, and
 * a caller that wants lines gets them -- the entry is analysed again and
 * replaced, so the next plain load has them too.  The target has lines
 * (the test is built with -g).
 */
static void test_lines_pending(const ctx *c)
{
	ca_options agent = { .calls_only = 1, .no_lines = 1 }, full = { 0 };
	ca_module *l = NULL;
	sp_err err = { "" };
	size_t n = 0, want = 0;
	int rc, from_repo = -1;

	ca_module_lines(c->m, &want);
	CHECK(want > 0, "the target %s has no lines to test with", c->target);
	unlink(c->entry);
	rc = ca_repo_get(c->repo, c->target, &agent, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "agent's get: rc %d from_repo %d %s", rc, from_repo,
	      err.msg);
	if (rc == 0) {
		CHECK(ca_module_lines_pending(l), "analysed with no_lines, not marked pending");
		ca_module_free(l);
	}
	rc = ca_repo_load(c->repo, c->key, &l, &err);
	CHECK(rc == 0, "load of the no-lines entry: %s", err.msg);
	if (rc == 0) {
		ca_module_lines(l, &n);
		CHECK(ca_module_lines_pending(l) && n == 0,
		      "stored entry: pending %d, %zu lines (want pending, none)",
		      ca_module_lines_pending(l), n);
		ca_module_free(l);
	}
	rc = ca_repo_get(c->repo, c->target, &agent, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 1 && ca_module_lines_pending(l),
	      "agent's get again: rc %d from_repo %d", rc, from_repo);
	if (rc == 0)
		ca_module_free(l);
	rc = ca_repo_get(c->repo, c->target, &full, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get with lines: rc %d from_repo %d %s", rc,
	      from_repo, err.msg);
	if (rc == 0) {
		ca_module_lines(l, &n);
		CHECK(!ca_module_lines_pending(l) && n == want,
		      "get with lines: pending %d, %zu lines of %zu", ca_module_lines_pending(l),
		      n, want);
		ca_module_free(l);
	}
	rc = ca_repo_load(c->repo, c->key, &l, &err);
	CHECK(rc == 0, "load after completion: %s", err.msg);
	if (rc == 0) {
		ca_module_lines(l, &n);
		CHECK(!ca_module_lines_pending(l) && n == want,
		      "completed entry: pending %d, %zu lines of %zu", ca_module_lines_pending(l),
		      n, want);
		compare_modules(c->m, l, 0);
		ca_module_free(l);
	}
}

/*
 * Copy the target with its NT_GNU_BUILD_ID note turned into an unknown note
 * type: the key must become "sha256-<64 hex>", and ca_repo_get must store
 * and then find the copy under it.
 */
static void test_no_buildid(const ctx *c)
{
	uint8_t pat[4 + 64];
	size_t idlen = strlen(c->key) / 2;
	char copy[600], key[160];
	blob b;
	ca_module *m = NULL;
	sp_err err = { "" };
	int from_repo = -1, rc;
	uint8_t *note;

	if (idlen > 64 || !strncmp(c->key, "sha256-", 7)) {
		printf("test_repo: skip no-build-id case (target has none)\n");
		return;
	}
	memcpy(pat, "GNU", 4);
	for (size_t i = 0; i < idlen; i++)
		sscanf(c->key + 2 * i, "%2hhx", &pat[4 + i]);
	b = read_whole(c->target);
	note = memmem(b.p, b.n, pat, 4 + idlen);
	if (!note || note - b.p < 12) {
		printf("test_repo: skip no-build-id case (note not found)\n");
		free(b.p);
		return;
	}
	for (; note; note = memmem(note + 1, b.n - (size_t)(note + 1 - b.p), pat,
				   4 + idlen))
		put_le32(note - 4, 0x7fff0001);  /* n_type */
	snprintf(copy, sizeof copy, "%s/no-build-id", c->tmp);
	write_whole(copy, b.p, b.n);
	free(b.p);

	CHECK(ca_module_key_of(copy, key, sizeof key, &err) == 0, "%s", err.msg);
	CHECK(!strncmp(key, "sha256-", 7) && strlen(key) == 71, "key %s", key);
	{
		/* The key is the file's SHA-256, as coreutils computes it. */
		char cmd[700], want[80] = "";
		FILE *p;

		snprintf(cmd, sizeof cmd, "sha256sum '%s'", copy);
		p = popen(cmd, "r");
		CHECK(p && fscanf(p, "%64s", want) == 1 && !strcmp(key + 7, want),
		      "key %s, sha256sum %s", key, want);
		if (p)
			pclose(p);
	}
	rc = ca_repo_get(c->repo, copy, &c->opt, &m, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get no-build-id: %d %s", rc, err.msg);
	if (rc == 0) {
		CHECK(!strcmp(ca_module_key(m), key), "analysed key %s, key_of %s",
		      ca_module_key(m), key);
		ca_module_free(m);
	}
	rc = ca_repo_get(c->repo, copy, &c->opt, &m, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 1, "get no-build-id again: %d %s", rc,
	      err.msg);
	if (rc == 0)
		ca_module_free(m);
	unlink(copy);
}

/* SHA-256 (common/sha256.c) on FIPS 180-4's examples, fed whole and a byte
 * at a time, and a million 'a's across many block boundaries. */
static void test_sha256(void)
{
	static const struct {
		const char *msg, *hex;
	} v[] = {
		{ "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
		{ "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
	};
	uint8_t md[32], md2[32];
	char hex[65];
	sp_sha256 s, t;

	for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
		sp_sha256_init(&s);
		sp_sha256_update(&s, v[i].msg, strlen(v[i].msg));
		sp_sha256_final(&s, md);
		sp_sha256_init(&t);
		for (const char *c = v[i].msg; *c; c++)
			sp_sha256_update(&t, c, 1);
		sp_sha256_final(&t, md2);
		for (int k = 0; k < 32; k++)
			snprintf(hex + 2 * k, 3, "%02x", md[k]);
		CHECK(!strcmp(hex, v[i].hex) && !memcmp(md, md2, 32), "sha256(\"%s\") = %s", v[i].msg,
		      hex);
	}
	sp_sha256_init(&s);
	for (int i = 0; i < 1000; i++) {
		char a[1000];

		memset(a, 'a', sizeof a);
		sp_sha256_update(&s, a, sizeof a);
	}
	sp_sha256_final(&s, md);
	for (int k = 0; k < 32; k++)
		snprintf(hex + 2 * k, 3, "%02x", md[k]);
	CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
	      "sha256(a million a) = %s", hex);
}

/* A repository that cannot be a directory: a regular file in the way
 * (chmod 0500 would not stop root). */
static void test_unwritable(const ctx *c)
{
	char path[600];
	ca_module *l = NULL;
	sp_err err = { "" };
	int rc, from_repo = -1;

	snprintf(path, sizeof path, "%s/plainfile", c->tmp);
	write_whole(path, (const uint8_t *)"x", 1);
	CHECK(ca_repo_store(c->m, path, NULL, 0, &err) == -1 &&
	      strstr(err.msg, path) && strstr(err.msg, "SPTRACE_REPO"),
	      "repo is a file: %s", err.msg);
	printf("test_repo: unwritable repository: %s\n", err.msg);
	snprintf(path, sizeof path, "%s/plainfile/sub", c->tmp);
	CHECK(ca_repo_store(c->m, path, NULL, 0, &err) == -1 &&
	      strstr(err.msg, path), "repo below a file: %s", err.msg);
	CHECK(ca_repo_load(path, c->key, &l, &err) == 1, "load below a file");
	/* ca_repo_get still returns the analysis when it cannot store it. */
	rc = ca_repo_get(path, c->target, &c->opt, &l, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get with unwritable repo: %d %s", rc,
	      err.msg);
	if (rc == 0)
		ca_module_free(l);
}

/*
 * What an analysis was made from (codeanalysis/trust.c): a copy of the
 * target that its group may write (or, as root, that another user owns) is
 * analysed but never stored; every site carries the hash of its bytes; the
 * code hash tells the target from another file.
 */
static void test_trust(const ctx *c)
{
	char copy[600], repo[600], other[600];
	ca_module *m = NULL;
	sp_err err = { "" };
	size_t nsites, zero = 0;
	const ca_site *sites = ca_module_sites(c->m, &nsites);
	int rc, from_repo = -1;
	blob b = read_whole(c->target);

	for (size_t i = 0; i < nsites; i++)
		zero += sites[i].code == 0;
	CHECK(nsites > 0 && zero == 0, "%zu of %zu sites without the hash of their bytes", zero,
	      nsites);
	CHECK(ca_module_code_matches(c->m, c->target, &err) == 1, "code hash of %s: %s",
	      c->target, err.msg);
	/* One byte of the first site changed: other code, the same build-id. */
	if (nsites > 0 && b.n >= sizeof(Elf64_Ehdr)) {
		const Elf64_Ehdr *eh = (const Elf64_Ehdr *)b.p;
		uint64_t off = 0;

		for (unsigned i = 0; i < eh->e_phnum; i++) {
			const Elf64_Phdr *ph = (const Elf64_Phdr *)(b.p + eh->e_phoff) + i;

			if ((const uint8_t *)(ph + 1) > b.p + b.n)
				break;
			if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) &&
			    sites[0].addr >= ph->p_vaddr && sites[0].addr - ph->p_vaddr < ph->p_filesz)
				off = ph->p_offset + (sites[0].addr - ph->p_vaddr);
		}
		CHECK(off > 0 && off < b.n, "the first site (%#llx) is in no executable segment",
		      (unsigned long long)sites[0].addr);
		if (off > 0 && off < b.n) {
			snprintf(other, sizeof other, "%s/other-code", c->tmp);
			b.p[off] ^= 0xff;
			write_whole(other, b.p, b.n);
			b.p[off] ^= 0xff;
			CHECK(ca_module_code_matches(c->m, other, &err) == 0,
			      "a file with other code matches: %s", err.msg);
			unlink(other);
		}
	}
	CHECK(ca_module_code_matches(c->m, "/nonexistent/x", &err) == -1 &&
	      strstr(err.msg, "/nonexistent/x"), "code hash of a missing file: %s", err.msg);

	snprintf(copy, sizeof copy, "%s/group-writable", c->tmp);
	snprintf(repo, sizeof repo, "%s/trust-repo", c->tmp);
	write_whole(copy, b.p, b.n);
	free(b.p);
	chmod(copy, 0775);
	rc = ca_analyze(copy, &c->opt, &m, &err);
	CHECK(rc == 0 && strstr(ca_module_untrusted(m), "writable by its group"),
	      "group-writable: %d %s", rc, rc == 0 ? ca_module_untrusted(m) : err.msg);
	if (rc == 0) {
		CHECK(ca_repo_store(m, repo, NULL, 0, &err) == -1 && strstr(err.msg, copy) &&
		      strstr(err.msg, "not storing"), "stored a group-writable file: %s", err.msg);
		printf("test_repo: untrusted file: %s\n", err.msg);
		ca_module_free(m);
	}
	rc = ca_repo_get(repo, copy, &c->opt, &m, &from_repo, &err);
	CHECK(rc == 0 && from_repo == 0, "get of a group-writable file: %d %s", rc, err.msg);
	if (rc == 0)
		ca_module_free(m);
	CHECK(ca_repo_load(repo, c->key, &m, &err) == 1, "ca_repo_get stored a group-writable file");
	if (geteuid() == 0) {
		chmod(copy, 0755);
		CHECK(chown(copy, 1, 1) == 0, "chown: %s", strerror(errno));
		rc = ca_analyze(copy, &c->opt, &m, &err);
		CHECK(rc == 0 && strstr(ca_module_untrusted(m), "owned by uid 1"),
		      "another user's: %d %s", rc, rc == 0 ? ca_module_untrusted(m) : err.msg);
		if (rc == 0)
			ca_module_free(m);
	}
	unlink(copy);
}

/* A file of the entry's directory, with its times `age` seconds ago. */
static void stale_file(const char *dir, const char *name, time_t age, char *path, size_t len)
{
	struct timespec ts[2] = { { time(NULL) - age, 0 }, { time(NULL) - age, 0 } };

	snprintf(path, len, "%s/%s", dir, name);
	write_whole(path, (const uint8_t *)"partial", 7);
	if (utimensat(AT_FDCWD, path, ts, 0) < 0)
		FATAL("utimensat %s: %s", path, strerror(errno));
}

/*
 * kill -9 during a store leaves its temporary file (".<key>.spr.<pid>.XXXXXX")
 * hidden in the repository.  The next store into that directory removes the
 * temporaries of dead writers that are old enough -- regular files of the
 * caller only -- and nothing else.
 */
static void test_stale_temps(const ctx *c)
{
	char dir[4096], name[600], gone[2][4200], kept[6][4200], target[700];
	const char *slash = strrchr(c->entry, '/');
	struct timespec old[2] = { { time(NULL) - 3600, 0 }, { time(NULL) - 3600, 0 } };
	sp_err err = { "" };
	pid_t dead = fork();
	struct stat st;
	int nkept = 0;

	if (dead < 0)
		FATAL("fork: %s", strerror(errno));
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);          /* a pid no writer has any more */
	snprintf(dir, sizeof dir, "%.*s", (int)(slash - c->entry), c->entry);

	/* Removed: a dead writer's, an hour old; one named before pids were. */
	snprintf(name, sizeof name, ".%s.spr.%d.aaaaaa", c->key, (int)dead);
	stale_file(dir, name, 3600, gone[0], sizeof gone[0]);
	snprintf(name, sizeof name, ".%s.spr.bbbbbb", c->key);
	stale_file(dir, name, 7200, gone[1], sizeof gone[1]);
	/* Kept: a dead writer's but fresh (a shared repository's writer in
	 * another pid namespace); a live writer's (our parent); not a name
	 * write_atomic makes. */
	snprintf(name, sizeof name, ".%s.spr.%d.cccccc", c->key, (int)dead);
	stale_file(dir, name, 5, kept[nkept++], sizeof kept[0]);
	snprintf(name, sizeof name, ".%s.spr.%d.dddddd", c->key, (int)getppid());
	stale_file(dir, name, 3600, kept[nkept++], sizeof kept[0]);
	stale_file(dir, "notes.txt", 3600, kept[nkept++], sizeof kept[0]);
	/* Kept: a link named like a stale temporary (never followed), and
	 * what it points to. */
	snprintf(target, sizeof target, "%s/outside", c->tmp);
	write_whole(target, (const uint8_t *)"x", 1);
	snprintf(kept[nkept], sizeof kept[0], "%s/.%s.spr.%d.eeeeee", dir, c->key, (int)dead);
	if (symlink(target, kept[nkept]) < 0 ||
	    utimensat(AT_FDCWD, kept[nkept], old, AT_SYMLINK_NOFOLLOW) < 0)
		FATAL("symlink %s: %s", kept[nkept], strerror(errno));
	nkept++;
	/* Kept: another user's (root could remove it: it must not). */
	if (geteuid() == 0) {
		snprintf(name, sizeof name, ".%s.spr.%d.ffffff", c->key, (int)dead);
		stale_file(dir, name, 3600, kept[nkept], sizeof kept[0]);
		if (chown(kept[nkept], 65534, 65534) < 0)
			FATAL("chown %s: %s", kept[nkept], strerror(errno));
		utimensat(AT_FDCWD, kept[nkept], old, 0);
		nkept++;
	}

	CHECK(ca_repo_store(c->m, c->repo, NULL, 0, &err) == 0, "store: %s", err.msg);
	for (int i = 0; i < 2; i++)
		CHECK(lstat(gone[i], &st) < 0 && errno == ENOENT,
		      "stale temporary %s is still there after a store", gone[i]);
	for (int i = 0; i < nkept; i++) {
		CHECK(lstat(kept[i], &st) == 0, "%s was removed: %s", kept[i], strerror(errno));
		unlink(kept[i]);
	}
	CHECK(stat(target, &st) == 0, "the link's target %s was removed", target);
	unlink(target);
}

int main(int argc, char **argv)
{
	ctx c = { .target = argc > 1 ? argv[1] : "/proc/self/exe",
		  .tmp = "/tmp/test_repo.XXXXXX" };

	if (!mkdtemp(c.tmp))
		FATAL("mkdtemp: %s", strerror(errno));
	snprintf(c.repo, sizeof c.repo, "%s/a/b/repo", c.tmp);

	test_key_of(&c);
	test_key_in_memory();
	test_round_trip(&c);
	test_damaged(&c);
	test_bad_content(&c);
	test_out_of_bounds(&c);
	test_fuzz(&c);
	test_image(&c);
	test_image_memo(&c);
	test_learns_identity(&c);
	test_calls_view(&c);
	test_get_regenerates(&c);
	test_get_keyed(&c);
	test_sha256();
	test_lines_pending(&c);
	test_no_buildid(&c);
	test_stale_temps(&c);
	test_unwritable(&c);
	test_trust(&c);

	free(c.orig.p);
	ca_module_free(c.m);
	nftw(c.tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	if (failures) {
		fprintf(stderr, "test_repo: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_repo: all checks passed\n");
	return 0;
}
