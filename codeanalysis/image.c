/*
 * image.c — the calls view of a repository entry as an image: the records
 * the agent uses, laid out as they are in memory, mapped and used in place.
 *
 * Every traced process starts by loading the calls view of each of its
 * modules (functions, sites, runtime regions, strings).  From the entry
 * (repo.c: protobuf columns) that is a parse, a copy into records and a
 * fresh allocation per table: 1.9 ms for the C library's in a new process,
 * most of it page faults on new memory.  The image beside the entry,
 * <dir>/<k2>/<key>.spc, holds the same records ready to use:
 *
 *     image_hdr (below)                  sizes of each record type, counts,
 *                                        offsets, the entry's scalars
 *     ca_func   funcs[nfuncs]            first_block, nblocks 0: no blocks
 *     ca_site   sites[nsites]
 *     ca_runtime runtimes[nruntimes]
 *     char      strs[nstrs]              offset 0 is "", every string ends
 *
 * The protocol:
 *   1. ca_repo_store writes the image with every entry (image first, then
 *      the entry; each atomically, by rename), so an image is never older
 *      than its entry's analysis of the same key.  A repository made before
 *      images existed has none: `sptrace run` and `attach` make the missing
 *      ones, and again those that cannot be used, for the modules they check
 *      (ca_repo_code_matches).
 *   2. ca_repo_load_calls, when the entry exists (one removed, or never
 *      written, takes its image along), maps the image read-only (private),
 *      checks the header -- the magic, the version, this build's record
 *      sizes, every table inside the file -- and every index and offset a
 *      record holds exactly as the entry's reader does (a linear pass, no
 *      copy), then points the module's tables into the mapping.  Anything
 *      wrong: the entry is read instead, as before images.  The records'
 *      pass (0.1 ms for the C library's) is skipped for an image the memo
 *      (ca_image_set_memo) has seen checked under the same identity --
 *      device, inode, size, change time and the nonce each store writes
 *      into the header: by step 3 the same bytes (an image stored again
 *      has another nonce, whatever inode and time it gets).  The
 *      agent's memo holds the images its process and the images before it
 *      in the same run checked (agent/modules.c); the header is checked
 *      every time.
 *   3. Files are only ever replaced by rename, never truncated in place, so
 *      a mapping stays whole while the process lives (a truncated file
 *      would raise SIGBUS in the traced program); the repository's
 *      directories are its owner's (repo.c).
 *   4. ca_module_free unmaps it.  Nothing writes to a loaded module's
 *      tables: a write would fault, in the traced program.
 */
#include "ca_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IMAGE_MAGIC "SPTRCALL"
#define IMAGE_VERSION 2          /* 2: the store's nonce */
#define IMAGE_MAX (256u << 20)

typedef struct image_hdr {
	char magic[8];
	uint32_t version, hdr_size;
	uint32_t func_size, site_size, runtime_size, stats_size;  /* this build's */
	uint32_t nfuncs, nsites, nruntimes, nstrs;
	uint64_t off_funcs, off_sites, off_runtimes, off_strs;
	uint64_t file_size;
	uint32_t is_dyn, lines_pending;
	uint32_t path, lines_source;          /* string offsets */
	uint64_t file_id[CA_FILE_ID_N];
	uint8_t code_sha256[32];
	char key[160], buildid[132];
	ca_stats stats;
	uint64_t nonce;                       /* new at every store (step 2's memo) */
} image_hdr;

static uint64_t align8(uint64_t v)
{
	return (v + 7) & ~(uint64_t)7;
}

int ca_image_store(const ca_module *m, const char *path, sp_err *err)
{
	image_hdr h = { .version = IMAGE_VERSION, .hdr_size = sizeof h };
	uint64_t size;
	uint8_t *buf;
	char *strs;
	size_t nstrs = m->nstrs ? m->nstrs : 1, plen = strlen(m->path ? m->path : "") + 1;
	size_t llen = strlen(m->lines_source) + 1;
	int rc;

	memcpy(h.magic, IMAGE_MAGIC, 8);
	h.func_size = sizeof(ca_func);
	h.site_size = sizeof(ca_site);
	h.runtime_size = sizeof(ca_runtime);
	h.stats_size = sizeof(ca_stats);
	h.nfuncs = (uint32_t)m->nfuncs;
	h.nsites = (uint32_t)m->nsites;
	h.nruntimes = (uint32_t)m->nruntimes;
	h.nstrs = (uint32_t)(nstrs + plen + llen);
	h.off_funcs = align8(sizeof h);
	h.off_sites = align8(h.off_funcs + m->nfuncs * sizeof(ca_func));
	h.off_runtimes = align8(h.off_sites + m->nsites * sizeof(ca_site));
	h.off_strs = align8(h.off_runtimes + m->nruntimes * sizeof(ca_runtime));
	h.file_size = m->file_size;
	h.is_dyn = (uint32_t)m->is_dyn;
	h.lines_pending = m->lines_pending;
	h.path = (uint32_t)nstrs;
	h.lines_source = (uint32_t)(nstrs + plen);
	memcpy(h.file_id, m->file_id, sizeof h.file_id);
	memcpy(h.code_sha256, m->code_sha256, sizeof h.code_sha256);
	snprintf(h.key, sizeof h.key, "%s", m->key);
	snprintf(h.buildid, sizeof h.buildid, "%s", m->buildid);
	h.stats = m->stats;
	if (getrandom(&h.nonce, sizeof h.nonce, GRND_NONBLOCK) != sizeof h.nonce) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		h.nonce = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
			  ((uint64_t)getpid() << 40);
	}
	size = h.off_strs + h.nstrs;
	if (size > IMAGE_MAX || m->nstrs >= CA_NONE - plen - llen)
		return sp_fail(err, "the calls image of %s would be %llu bytes", m->key,
			       (unsigned long long)size);
	buf = calloc(1, size);
	if (!buf)
		return sp_fail(err, "out of memory (%llu bytes)", (unsigned long long)size);
	memcpy(buf, &h, sizeof h);
	for (size_t i = 0; i < m->nfuncs; i++) {
		ca_func f = m->funcs[i];

		f.first_block = f.nblocks = 0;          /* the view has no blocks */
		memcpy(buf + h.off_funcs + i * sizeof f, &f, sizeof f);
	}
	if (m->nsites)
		memcpy(buf + h.off_sites, m->sites, m->nsites * sizeof(ca_site));
	if (m->nruntimes)
		memcpy(buf + h.off_runtimes, m->runtimes, m->nruntimes * sizeof(ca_runtime));
	strs = (char *)buf + h.off_strs;
	if (m->nstrs)
		memcpy(strs, m->strs, m->nstrs);
	memcpy(strs + nstrs, m->path ? m->path : "", plen);
	memcpy(strs + nstrs + plen, m->lines_source, llen);
	rc = ca_repo_write_atomic(path, buf, size, err);
	free(buf);
	return rc;
}

#define BAD(...) (snprintf(why, whylen, __VA_ARGS__), -1)

static bool str_ok(uint32_t off, uint32_t nstrs)
{
	return off < nstrs;
}

static const ca_image_memo *memo;

void ca_image_set_memo(const ca_image_memo *m)
{
	memo = m;
}

/* Step 2's checks: those of the entry's reader (repo.c), on records; with
 * `header_only`, those that read no record. */
static int check(const image_hdr *h, size_t size, const uint8_t *base, bool header_only,
		 char *why, size_t whylen)
{
	const ca_func *f;
	const ca_site *s;
	const ca_runtime *r;
	const char *strs;

	if (size < sizeof *h || memcmp(h->magic, IMAGE_MAGIC, 8) != 0 ||
	    h->version != IMAGE_VERSION || h->hdr_size != sizeof *h)
		return BAD("not a calls image of this version");
	if (h->func_size != sizeof(ca_func) || h->site_size != sizeof(ca_site) ||
	    h->runtime_size != sizeof(ca_runtime) || h->stats_size != sizeof(ca_stats))
		return BAD("made by a build with other record layouts");
	if (h->nfuncs >= CA_NONE || h->nsites >= CA_NONE || h->nstrs == 0 ||
	    h->off_funcs % 8 || h->off_sites % 8 || h->off_runtimes % 8 ||
	    h->off_funcs < sizeof *h ||
	    h->off_funcs + (uint64_t)h->nfuncs * sizeof *f > h->off_sites ||
	    h->off_sites + (uint64_t)h->nsites * sizeof *s > h->off_runtimes ||
	    h->off_runtimes + (uint64_t)h->nruntimes * sizeof *r > h->off_strs ||
	    h->off_strs + h->nstrs != size)
		return BAD("tables outside the file");
	if (memchr(h->key, 0, sizeof h->key) == NULL ||
	    memchr(h->buildid, 0, sizeof h->buildid) == NULL)
		return BAD("unterminated key");
	strs = (const char *)base + h->off_strs;
	if (strs[0] != 0 || strs[h->nstrs - 1] != 0 || !str_ok(h->path, h->nstrs) ||
	    !str_ok(h->lines_source, h->nstrs))
		return BAD("string table must start and end with NUL");
	if (header_only)
		return 0;
	f = (const ca_func *)(base + h->off_funcs);
	for (uint32_t i = 0; i < h->nfuncs; i++)
		if (!str_ok(f[i].name, h->nstrs) ||
		    (f[i].parent != CA_NONE && f[i].parent >= h->nfuncs) || f[i].nblocks ||
		    f[i].first_site > h->nsites || f[i].nsites > h->nsites - f[i].first_site ||
		    (i && f[i].addr < f[i - 1].addr))
			return BAD("function %u is out of bounds or unsorted", i);
	s = (const ca_site *)(base + h->off_sites);
	for (uint32_t i = 0; i < h->nsites; i++)
		if (s[i].func >= h->nfuncs || (s[i].callee != CA_NONE && s[i].callee >= h->nfuncs) ||
		    (s[i].import != CA_NONE && !str_ok(s[i].import, h->nstrs)) ||
		    s[i].kind >= CA_SITE_KIND_MAX || s[i].method >= CA_PATCH_METHOD_MAX ||
		    s[i].reason >= CA_WHY_REASON_MAX)
			return BAD("site %u is out of bounds", i);
	r = (const ca_runtime *)(base + h->off_runtimes);
	for (uint32_t i = 0; i < h->nruntimes; i++)
		if (!str_ok(r[i].how, h->nstrs) || r[i].lo >= r[i].hi || r[i].kind == 0 ||
		    r[i].kind >= CA_RUNTIME_KIND_MAX || (i && r[i].lo < r[i - 1].lo))
			return BAD("runtime region %u is out of bounds or unsorted", i);
	return 0;
}

int ca_image_map(const char *path, const char *key, ca_module **out, char *why, size_t whylen)
{
	struct stat st;
	const image_hdr *h;
	ca_image_id id;
	uint8_t *base;
	ca_module *m;
	bool seen;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);

	*out = NULL;
	if (fd < 0)
		return BAD("%s", strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof *h ||
	    st.st_size > (off_t)IMAGE_MAX) {
		close(fd);
		return BAD("not a regular file of a plausible size");
	}
	base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return BAD("mmap: %s", strerror(errno));
	h = (const image_hdr *)base;
	id = (ca_image_id){ (uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
			    (uint64_t)st.st_ctim.tv_sec * 1000000000u + (uint64_t)st.st_ctim.tv_nsec,
			    h->nonce };
	seen = memo && memo->seen(&id);
	if (check(h, (size_t)st.st_size, base, seen, why, whylen) < 0 ||
	    (strcmp(h->key, key) != 0 && BAD("made for another key") < 0) ||
	    (!(m = ca_module_new()) && BAD("out of memory") < 0)) {
		munmap(base, (size_t)st.st_size);
		return -1;
	}
	if (memo && !seen)
		memo->checked(&id);
	free(m->strs);                  /* ca_module_new's: the image has its own */
	m->capstrs = 0;
	m->mapped = base;
	m->mapped_len = (size_t)st.st_size;
	m->path = strdup((const char *)base + h->off_strs + h->path);
	snprintf(m->key, sizeof m->key, "%s", h->key);
	snprintf(m->buildid, sizeof m->buildid, "%s", h->buildid);
	snprintf(m->lines_source, sizeof m->lines_source, "%s",
		 (const char *)base + h->off_strs + h->lines_source);
	m->file_size = h->file_size;
	m->is_dyn = (int)h->is_dyn;
	m->lines_pending = h->lines_pending != 0;
	memcpy(m->code_sha256, h->code_sha256, sizeof m->code_sha256);
	memcpy(m->file_id, h->file_id, sizeof m->file_id);
	m->stats = h->stats;
	/* Tables in place: the capacities stay 0, nothing grows them. */
	m->funcs = (ca_func *)(base + h->off_funcs);
	m->nfuncs = h->nfuncs;
	m->sites = (ca_site *)(base + h->off_sites);
	m->nsites = h->nsites;
	m->runtimes = (ca_runtime *)(base + h->off_runtimes);
	m->nruntimes = h->nruntimes;
	m->strs = (char *)base + h->off_strs;
	m->nstrs = h->nstrs;
	if (!m->path) {
		ca_module_free(m);
		return BAD("out of memory");
	}
	*out = m;
	return 0;
}
