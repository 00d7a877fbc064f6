/*
 * repo.c — the code-analysis repository: one file per analysed module,
 * named by the module's key (GNU build-id, else a hash of the file), so that
 * the agent loads an analysis instead of disassembling on its hot path.
 *
 * An entry lives at <dir>/<first two characters of key>/<key>.spr and is
 *
 *     offset  size  field (little-endian)
 *          0     8  magic "SPTRREPO"
 *          8     4  header version (REPO_HDR_VERSION)
 *         12     4  zlib crc32 of the payload
 *         16     8  payload length in bytes
 *         24     n  payload: an sptrace.repo.Entry message (proto/repo.proto)
 *
 * The header exists because protobuf happily parses a truncated message: the
 * length catches truncation, the checksum catches corruption, and both get a
 * message that says so.  The payload stores every array column by column
 * (one packed fixed-width field per struct member) so that protobuf-c unpacks
 * each column with a memcpy; loading then converts columns back to records.
 * Loading reads the file once into a block that also serves as protobuf-c's
 * allocation arena, so a load costs one malloc for the file and the unpacked
 * message plus one per record array.
 *
 * A loaded module is trusted by the agent, so the reader checks everything an
 * index or offset could break: equal column lengths, string offsets inside
 * the string table, function/block/edge/site indices and ranges in bounds,
 * narrow members that fit, sorted functions and lines.  Any failure is -1
 * with a message naming the file and what is wrong; ca_repo_get() then
 * re-analyses the module and overwrites the entry.  What the entry was made
 * from (the code's hash, each site's bytes) and who may store one is
 * trust.c's.
 *
 * Entries are written atomically (temporary file in the same directory,
 * fsync, rename), so a reader sees the old entry or the new one, never half.
 * Beside each, <key>.spc holds its calls view as records the agent maps and
 * uses in place (image.c), written just before it, and <key>.spp the
 * functions earlier runs reached, which guide the agent's look-ahead
 * (profile.c).
 */
#include "ca_internal.h"
#include "repo.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <pthread.h>
#include <dirent.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define REPO_MAGIC "SPTRREPO"
#define REPO_HDR_VERSION 1
#define REPO_HDR_SIZE 24
/* Version of proto/repo.proto's meaning; bump on incompatible changes. */
#define REPO_SCHEMA_VERSION 2   /* 2: code_sha256, sites' code */
/* Refuse to read anything bigger: no real module comes close. */
#define REPO_MAX_ENTRY ((uint64_t)1 << 30)
#define REPO_SUFFIX ".spr"
#define IMAGE_SUFFIX ".spc"

typedef Sptrace__Repo__Entry Entry;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* What to tell the user after a failed file-system call in the repository. */
static const char *errno_hint(int e)
{
	switch (e) {
	case EACCES:
	case EPERM:
	case EROFS:
		return "; set SPTRACE_REPO to a writable directory";
	case ENOSPC:
	case EDQUOT:
		return "; free some space or set SPTRACE_REPO to another file system";
	case ENOTDIR:
	case EEXIST:
		return "; a component of the path is not a directory: "
		       "remove it or set SPTRACE_REPO to another directory";
	default:
		return "";
	}
}

/*
 * A key names a file, and ca_repo_load() may get one from a trace or a
 * peer, so it must not be able to climb out of the repository: lowercase hex
 * (a build-id) or "sha256-" and 64 hex digits.
 */
static bool key_is_valid(const char *key)
{
	const char *hex = key;
	size_t n;

	if (strncmp(key, "sha256-", 7) == 0)
		hex = key + 7;
	n = strspn(hex, "0123456789abcdef");
	if (hex[n] != '\0' || n < 2 || n > 128 || n % 2)
		return false;
	return hex == key || n == 64;
}

static int check_key(const char *key, sp_err *err)
{
	if (!key || !key_is_valid(key))
		return sp_fail(err, "invalid repository key \"%.200s\": expected a "
			       "lowercase hex build-id or sha256-<64 hex digits>",
			       key ? key : "(null)");
	return 0;
}

static int resolve_dir(const char **dir, sp_err *err)
{
	if (!*dir)
		*dir = ca_repo_default_dir();
	if (!**dir)
		return sp_fail(err, "no repository directory (HOME is not set and "
			       "there is no password entry): set SPTRACE_REPO");
	return 0;
}

/* <dir>/<first two of key>/<key><suffix>: the entry, its calls image,
 * its look-ahead profile. */
static int key_path(const char *dir, const char *key, const char *suffix, char *path,
		    size_t len, sp_err *err)
{
	int n = snprintf(path, len, "%s/%.2s/%s%s", dir, key, key, suffix);

	if (n < 0 || (size_t)n >= len)
		return sp_fail(err, "repository path for %s under %s is too long", key, dir);
	return 0;
}

static int entry_path(const char *dir, const char *key, char *path, size_t len,
		      sp_err *err)
{
	return key_path(dir, key, REPO_SUFFIX, path, len, err);
}

int ca_repo_key_path(const char **dir, const char *key, const char *suffix, char *path,
		     size_t len, sp_err *err)
{
	if (check_key(key, err) < 0 || resolve_dir(dir, err) < 0)
		return -1;
	return key_path(*dir, key, suffix, path, len, err);
}

/* The calls image beside the entry (image.c). */
static int image_path(const char *dir, const char *key, char *path, size_t len, sp_err *err)
{
	return key_path(dir, key, IMAGE_SUFFIX, path, len, err);
}

/* ------------------------------------------------------------------------ */
/* Directory                                                                 */
/* ------------------------------------------------------------------------ */

static const char *default_dir_now(void);

/* Worked out once (the environment and the home directory do not change
 * under us).  No thread-local buffer: the agent, which has this code, may be
 * loaded into a running process, where static TLS space is scarce. */
static char default_dir[PATH_MAX];
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void find_default_dir(void)
{
	snprintf(default_dir, sizeof default_dir, "%s", default_dir_now());
}

const char *ca_repo_default_dir(void)
{
	pthread_once(&default_once, find_default_dir);
	return default_dir;
}

static const char *default_dir_now(void)
{
	static char buf[PATH_MAX];
	const char *env = getenv("SPTRACE_REPO");
	const char *home;

	if (env && *env)
		return env;
	if (geteuid() == 0)
		return "/var/lib/sptrace/repo";
	home = getenv("HOME");
	if (!home || !*home) {
		struct passwd pw, *res = NULL;
		char pwbuf[4096];

		if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof pwbuf, &res) != 0 ||
		    !res || !pw.pw_dir || !*pw.pw_dir)
			return "";
		home = pw.pw_dir;
	}
	if ((size_t)snprintf(buf, sizeof buf, "%s/.cache/sptrace/repo", home) >=
	    sizeof buf)
		return "";
	return buf;
}

static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:  return "a regular file";
	case S_IFIFO:  return "a FIFO";
	case S_IFSOCK: return "a socket";
	case S_IFCHR:  return "a character device";
	case S_IFBLK:  return "a block device";
	case S_IFLNK:  return "a symbolic link";
	default:       return "not a directory";
	}
}

/* `dir` exists (mkdir said EEXIST) but is no directory: say what it is. */
static int not_a_dir(const char *dir, const char *target, sp_err *err)
{
	struct stat st;
	char to[PATH_MAX];
	ssize_t n;

	if (lstat(dir, &st) < 0)
		return sp_fail(err, "cannot create repository directory %s: %s: %s",
			       target, dir, strerror(errno));
	if (!S_ISLNK(st.st_mode))
		return sp_fail(err, "cannot create repository directory %s: %s is %s, not a "
			       "directory; remove it or set SPTRACE_REPO to another directory",
			       target, dir, file_kind(st.st_mode));
	n = readlink(dir, to, sizeof to - 1);
	to[n < 0 ? 0 : n] = '\0';
	if (stat(dir, &st) < 0)
		return sp_fail(err, "cannot create repository directory %s: %s is a dangling "
			       "symbolic link to %s (%s); create that directory, or remove the "
			       "link, or set SPTRACE_REPO to another directory", target, dir, to,
			       strerror(errno));
	return sp_fail(err, "cannot create repository directory %s: %s is a symbolic link to "
		       "%s, which is %s, not a directory; remove the link or set SPTRACE_REPO "
		       "to another directory", target, dir, to, file_kind(st.st_mode));
}

/* Create `dir`, one component of `target`; an existing directory is fine. */
static int make_one_dir(const char *dir, const char *target, sp_err *err)
{
	struct stat st;
	int e;

	if (mkdir(dir, 0755) == 0)
		return 0;
	e = errno;
	if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
		return 0;
	if (e == EEXIST)
		return not_a_dir(dir, target, err);
	if (strcmp(dir, target) != 0)
		return sp_fail(err, "cannot create repository directory %s: "
			       "creating %s: %s%s", target, dir, strerror(e),
			       errno_hint(e));
	return sp_fail(err, "cannot create repository directory %s: %s%s",
		       dir, strerror(e), errno_hint(e));
}

/* mkdir -p, mode 0755 (less the umask). */
static int make_dirs(const char *dir, sp_err *err)
{
	char buf[PATH_MAX];
	struct stat st;
	size_t len = strlen(dir);

	if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
		return 0;
	if (len >= sizeof buf)
		return sp_fail(err, "repository directory %s: path too long", dir);
	memcpy(buf, dir, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/' || p[-1] == '/')
			continue;
		*p = '\0';
		if (make_one_dir(buf, dir, err) < 0)
			return -1;
		*p = '/';
	}
	return make_one_dir(buf, dir, err);
}

/* ------------------------------------------------------------------------ */
/* Writing: module -> columns -> Entry -> header + payload -> file           */
/* ------------------------------------------------------------------------ */

/* Reading side (below): would this entry load?  Run before writing, so that
 * an analyser bug shows up as an error here rather than as an entry that is
 * rejected and re-analysed on every load. */
static int check_loadable(const Entry *e, sp_err *err);

/* One allocation holding every column of the message being written. */
typedef struct arena {
	uint8_t *base;
	size_t used, cap;
} arena;

static void *arena_take(arena *a, size_t n, size_t elsize)
{
	size_t off = (a->used + 7) & ~(size_t)7;
	void *p;

	if (off > a->cap || n * elsize > a->cap - off)
		return NULL;  /* cannot happen: the cap is computed to fit */
	p = a->base + off;
	a->used = off + n * elsize;
	return p;
}

/* Point column `f` of message `msg` at n fresh elements of type `t`. */
#define COLUMN(a, msg, f, t, n) \
	((msg).n_##f = (n), (msg).f = arena_take((a), (n), sizeof(t)))

static void stats_to_msg(const ca_stats *s, Sptrace__Repo__Stats *o)
{
	o->text_bytes = s->text_bytes;
	o->decoded_bytes = s->decoded_bytes;
	o->undecodable_bytes = s->undecodable_bytes;
	o->nundecodable = s->nundecodable;
	o->ninsns = s->ninsns;
	o->nfuncs = s->nfuncs;
	o->nblocks = s->nblocks;
	o->nedges = s->nedges;
	o->nsites = s->nsites;
	o->nlines = s->nlines;
	o->n_nfuncs_by_source = sizeof s->nfuncs_by_source / sizeof(uint32_t);
	o->nfuncs_by_source = (uint32_t *)s->nfuncs_by_source;
	o->n_nsites_by_kind = sizeof s->nsites_by_kind / sizeof(uint32_t);
	o->nsites_by_kind = (uint32_t *)s->nsites_by_kind;
	o->n_nsites_by_method = sizeof s->nsites_by_method / sizeof(uint32_t);
	o->nsites_by_method = (uint32_t *)s->nsites_by_method;
	o->njump_tables = s->njump_tables;
	o->njump_table_targets = s->njump_table_targets;
	o->nfragments = s->nfragments;
	o->nnoreturn = s->nnoreturn;
	o->nlanding_pads = s->nlanding_pads;
	o->analyze_ns = s->analyze_ns;
	o->lines_ns = s->lines_ns;
}

/* The messages of one entry, filled by module_to_msgs(). */
typedef struct entry_msgs {
	Entry e;
	Sptrace__Repo__Stats stats;
	Sptrace__Repo__Funcs funcs;
	Sptrace__Repo__Blocks blocks;
	Sptrace__Repo__Edges edges;
	Sptrace__Repo__Sites sites;
	Sptrace__Repo__Lines lines;
	Sptrace__Repo__Undecodable undec;
	Sptrace__Repo__Runtimes runtimes;
	arena cols;
} entry_msgs;

static void fill_funcs(const ca_module *m, arena *a, Sptrace__Repo__Funcs *o)
{
	size_t n = m->nfuncs;

	COLUMN(a, *o, addr, uint64_t, n);
	COLUMN(a, *o, size, uint64_t, n);
	COLUMN(a, *o, name, uint32_t, n);
	COLUMN(a, *o, parent, uint32_t, n);
	COLUMN(a, *o, first_block, uint32_t, n);
	COLUMN(a, *o, nblocks, uint32_t, n);
	COLUMN(a, *o, first_site, uint32_t, n);
	COLUMN(a, *o, nsites, uint32_t, n);
	COLUMN(a, *o, sources, uint32_t, n);
	COLUMN(a, *o, flags, uint32_t, n);
	COLUMN(a, *o, ninsns, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		const ca_func *f = &m->funcs[i];

		o->addr[i] = f->addr;
		o->size[i] = f->size;
		o->name[i] = f->name;
		o->parent[i] = f->parent;
		o->first_block[i] = f->first_block;
		o->nblocks[i] = f->nblocks;
		o->first_site[i] = f->first_site;
		o->nsites[i] = f->nsites;
		o->sources[i] = f->sources;
		o->flags[i] = f->flags;
		o->ninsns[i] = f->ninsns;
	}
}

static void fill_blocks(const ca_module *m, arena *a, Sptrace__Repo__Blocks *o)
{
	size_t n = m->nblocks;

	COLUMN(a, *o, addr, uint64_t, n);
	COLUMN(a, *o, size, uint32_t, n);
	COLUMN(a, *o, func, uint32_t, n);
	COLUMN(a, *o, first_edge, uint32_t, n);
	COLUMN(a, *o, nedges, uint32_t, n);
	COLUMN(a, *o, flags, uint32_t, n);
	COLUMN(a, *o, ninsns, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		const ca_block *b = &m->blocks[i];

		o->addr[i] = b->addr;
		o->size[i] = b->size;
		o->func[i] = b->func;
		o->first_edge[i] = b->first_edge;
		o->nedges[i] = b->nedges;
		o->flags[i] = b->flags;
		o->ninsns[i] = b->ninsns;
	}
}

static void fill_edges(const ca_module *m, arena *a, Sptrace__Repo__Edges *o)
{
	size_t n = m->nedges;

	COLUMN(a, *o, to, uint32_t, n);
	COLUMN(a, *o, kind, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		o->to[i] = m->edges[i].to;
		o->kind[i] = m->edges[i].kind;
	}
}

static void fill_sites(const ca_module *m, arena *a, Sptrace__Repo__Sites *o)
{
	size_t n = m->nsites;

	COLUMN(a, *o, addr, uint64_t, n);
	COLUMN(a, *o, target, uint64_t, n);
	COLUMN(a, *o, patch_addr, uint64_t, n);
	COLUMN(a, *o, func, uint32_t, n);
	COLUMN(a, *o, callee, uint32_t, n);
	COLUMN(a, *o, import, uint32_t, n);
	COLUMN(a, *o, len, uint32_t, n);
	COLUMN(a, *o, kind, uint32_t, n);
	COLUMN(a, *o, method, uint32_t, n);
	COLUMN(a, *o, reason, uint32_t, n);
	COLUMN(a, *o, flags, uint32_t, n);
	COLUMN(a, *o, patch_len, uint32_t, n);
	COLUMN(a, *o, reloc_rip, uint32_t, n);
	COLUMN(a, *o, code, uint64_t, n);
	for (size_t i = 0; i < n; i++) {
		const ca_site *s = &m->sites[i];

		o->addr[i] = s->addr;
		o->target[i] = s->target;
		o->patch_addr[i] = s->patch_addr;
		o->func[i] = s->func;
		o->callee[i] = s->callee;
		o->import[i] = s->import;
		o->len[i] = s->len;
		o->kind[i] = s->kind;
		o->method[i] = s->method;
		o->reason[i] = s->reason;
		o->flags[i] = s->flags;
		o->patch_len[i] = s->patch_len;
		o->reloc_rip[i] = s->reloc_rip;
		o->code[i] = s->code;
	}
}

static void fill_lines(const ca_module *m, arena *a, Sptrace__Repo__Lines *o)
{
	size_t n = m->nlines;

	COLUMN(a, *o, addr, uint64_t, n);
	COLUMN(a, *o, file, uint32_t, n);
	COLUMN(a, *o, line, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		o->addr[i] = m->lines[i].addr;
		o->file[i] = m->lines[i].file;
		o->line[i] = m->lines[i].line;
	}
}

static void fill_undec(const ca_module *m, arena *a, Sptrace__Repo__Undecodable *o)
{
	size_t n = m->nundec;

	COLUMN(a, *o, addr, uint64_t, n);
	COLUMN(a, *o, size, uint32_t, n);
	COLUMN(a, *o, func, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		o->addr[i] = m->undec[i].addr;
		o->size[i] = m->undec[i].size;
		o->func[i] = m->undec[i].func;
	}
}

static void fill_runtimes(const ca_module *m, arena *a, Sptrace__Repo__Runtimes *o)
{
	size_t n = m->nruntimes;

	COLUMN(a, *o, lo, uint64_t, n);
	COLUMN(a, *o, hi, uint64_t, n);
	COLUMN(a, *o, kind, uint32_t, n);
	COLUMN(a, *o, how, uint32_t, n);
	for (size_t i = 0; i < n; i++) {
		o->lo[i] = m->runtimes[i].lo;
		o->hi[i] = m->runtimes[i].hi;
		o->kind[i] = m->runtimes[i].kind;
		o->how[i] = m->runtimes[i].how;
	}
}

/* Build the Entry for `m`; its columns live in x->cols (free x->cols.base). */
static int module_to_msgs(const ca_module *m, entry_msgs *x, sp_err *err)
{
	static const uint8_t empty_strs[1] = { 0 };
	/* Bytes per record summed over each table's columns, plus alignment
	 * slack for the 45 columns. */
	size_t cap = m->nfuncs * (2 * 8 + 9 * 4) + m->nblocks * (8 + 6 * 4) +
		     m->nedges * (2 * 4) + m->nsites * (4 * 8 + 10 * 4) +
		     m->nlines * (8 + 2 * 4) + m->nundec * (8 + 2 * 4) +
		     m->nruntimes * (2 * 8 + 2 * 4) + 45 * 8;

	*x = (entry_msgs){
		.e = SPTRACE__REPO__ENTRY__INIT,
		.stats = SPTRACE__REPO__STATS__INIT,
		.funcs = SPTRACE__REPO__FUNCS__INIT,
		.blocks = SPTRACE__REPO__BLOCKS__INIT,
		.edges = SPTRACE__REPO__EDGES__INIT,
		.sites = SPTRACE__REPO__SITES__INIT,
		.lines = SPTRACE__REPO__LINES__INIT,
		.undec = SPTRACE__REPO__UNDECODABLE__INIT,
		.runtimes = SPTRACE__REPO__RUNTIMES__INIT,
	};
	x->cols.base = malloc(cap);
	x->cols.cap = cap;
	if (!x->cols.base)
		return sp_fail(err, "out of memory (%zu bytes) writing the "
			       "repository entry of %s", cap, m->path);

	x->e.schema_version = REPO_SCHEMA_VERSION;
	x->e.analyzer_version = CA_ANALYZER_VERSION;
	x->e.path = m->path ? m->path : (char *)"";
	x->e.key = (char *)m->key;
	x->e.buildid = (char *)m->buildid;
	x->e.file_size = m->file_size;
	x->e.is_dyn = m->is_dyn != 0;
	x->e.lines_pending = m->lines_pending;
	x->e.lines_source = (char *)m->lines_source;
	x->e.code_sha256.data = (uint8_t *)m->code_sha256;
	x->e.code_sha256.len = sizeof m->code_sha256;
	x->e.n_file_id = CA_FILE_ID_N;
	x->e.file_id = (uint64_t *)m->file_id;
	stats_to_msg(&m->stats, &x->stats);
	x->e.stats = &x->stats;
	if (m->nstrs) {
		x->e.strs.data = (uint8_t *)m->strs;
		x->e.strs.len = m->nstrs;
	} else {
		x->e.strs.data = (uint8_t *)empty_strs;
		x->e.strs.len = 1;
	}
	fill_funcs(m, &x->cols, &x->funcs);
	fill_blocks(m, &x->cols, &x->blocks);
	fill_edges(m, &x->cols, &x->edges);
	fill_sites(m, &x->cols, &x->sites);
	fill_lines(m, &x->cols, &x->lines);
	fill_undec(m, &x->cols, &x->undec);
	fill_runtimes(m, &x->cols, &x->runtimes);
	x->e.funcs = &x->funcs;
	x->e.blocks = &x->blocks;
	x->e.edges = &x->edges;
	x->e.sites = &x->sites;
	x->e.lines = &x->lines;
	x->e.undecodable = &x->undec;
	x->e.runtimes = &x->runtimes;
	return 0;
}

/*
 * Temporary files left by a writer that died (kill -9 during sptrace
 * analyze-binary) would stay hidden in the repository for ever.  Before a
 * write, the temporaries in the same directory are removed when all hold:
 *   - the name is one write_atomic makes: ".<key>.spr.<pid>.XXXXXX", or
 *     ".<key>.spr.XXXXXX" as sptrace made them before the pid was added;
 *   - it is a regular file (not a link: never followed) owned by the caller;
 *   - it is older than STALE_SECONDS (a write takes well under a second)
 *     and the pid in its name is gone -- both, since a repository shared
 *     with a container sees pids of another namespace; a name without a pid
 *     must be older than STALE_SECONDS_NO_PID.
 * Best effort: a file that cannot be removed stays, the write goes on.
 */
#define STALE_SECONDS (10 * 60)
#define STALE_SECONDS_NO_PID (60 * 60)

/* The writer's pid in a temporary's name: >0, 0 for a name without one,
 * -1 for a name write_atomic does not make. */
static long temp_pid(const char *name)
{
	size_t n = strlen(name), ks = strlen(REPO_SUFFIX);
	const char *end, *dot;
	long pid = 0;

	if (name[0] != '.' || n < 1 + ks + 7 || name[n - 7] != '.')
		return -1;
	end = name + n - 7;                      /* the ".XXXXXX" of mkstemp */
	for (dot = end; dot > name && dot[-1] != '.'; dot--)
		;
	if (dot > name + 1 && dot < end && strspn(dot, "0123456789") == (size_t)(end - dot)) {
		for (const char *p = dot; p < end && pid < 1L << 30; p++)
			pid = pid * 10 + (*p - '0');
		end = dot - 1;                   /* the '.' before the pid */
	}
	if ((size_t)(end - name) < 1 + ks || memcmp(end - ks, REPO_SUFFIX, ks) != 0)
		return -1;
	return pid;
}

static void remove_stale_temps(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	time_t now = time(NULL);

	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		long pid = temp_pid(de->d_name);

		if (pid < 0 ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
		    now - st.st_mtime < (pid ? STALE_SECONDS : STALE_SECONDS_NO_PID))
			continue;
		if (pid && (pid == getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH))
			continue;
		(void)unlinkat(dirfd(d), de->d_name, 0);
	}
	closedir(d);
}

/*
 * Replace `path` with `buf` atomically:
 *   0. remove the temporaries of writers that died (remove_stale_temps);
 *   1. create a temporary file beside it (same directory, so same file
 *      system and rename() is atomic);
 *   2. write and fsync it, so after a crash the renamed file has its data;
 *   3. rename it over `path`: readers see the old entry or the new, never a
 *      partial one;
 *   4. fsync the directory so the rename itself survives a crash (best
 *      effort: some file systems refuse fsync on directories).
 * On any failure the temporary file is removed.
 */
int ca_repo_write_atomic(const char *path, const uint8_t *buf, size_t len, sp_err *err)
{
	char tmp[PATH_MAX], dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t dlen = slash ? (size_t)(slash - path) : 1;
	int fd, e, dfd;

	/* The pid in the name tells remove_stale_temps whether its writer lives. */
	if ((size_t)snprintf(tmp, sizeof tmp, "%.*s/.%s.%ld.XXXXXX", (int)dlen,
			     slash ? path : ".", slash ? slash + 1 : path,
			     (long)getpid()) >= sizeof tmp)
		return sp_fail(err, "repository path %s is too long", path);
	snprintf(dir, sizeof dir, "%.*s", (int)dlen, slash ? path : ".");
	remove_stale_temps(dir);

	fd = mkstemp(tmp);
	if (fd < 0) {
		e = errno;
		return sp_fail(err, "cannot create a temporary file in %s: %s%s",
			       dir, strerror(e), errno_hint(e));
	}
	/* mkstemp makes it 0600; entries are meant to be shared (an agent
	 * inside another user's process reads root's repository). */
	if (fchmod(fd, 0644) < 0 || sp_write_all(fd, buf, len) < 0 || fsync(fd) < 0) {
		e = errno;
		close(fd);
		unlink(tmp);
		return sp_fail(err, "writing %s: %s%s", tmp, strerror(e),
			       errno_hint(e));
	}
	if (close(fd) < 0) {
		e = errno;
		unlink(tmp);
		return sp_fail(err, "writing %s: %s%s", tmp, strerror(e),
			       errno_hint(e));
	}
	if (rename(tmp, path) < 0) {
		e = errno;
		unlink(tmp);
		return sp_fail(err, "renaming %s to %s: %s%s", tmp, path,
			       strerror(e), errno_hint(e));
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd);
		close(dfd);
	}
	return 0;
}

int ca_repo_store(const ca_module *m, const char *dir, char *path_out,
		  size_t path_len, sp_err *err)
{
	char path[PATH_MAX], sub[PATH_MAX], ipath[PATH_MAX];
	sp_err ignored;
	entry_msgs x;
	uint8_t *buf;
	size_t plen;
	int rc;

	if (check_key(m->key, err) < 0)
		return sp_failctx(err, "storing the analysis of %s",
				  m->path ? m->path : "(unnamed module)");
	if (m->untrusted[0])
		return sp_fail(err, "not storing the analysis of %s in the repository: the file "
			       "is %s, and whoever reads the entry would trust it",
			       m->path ? m->path : "(unnamed module)", m->untrusted);
	if (resolve_dir(&dir, err) < 0 ||
	    entry_path(dir, m->key, path, sizeof path, err) < 0)
		return -1;
	if (snprintf(sub, sizeof sub, "%s/%.2s", dir, m->key) >= (int)sizeof sub)
		return sp_fail(err, "repository path under %s is too long", dir);
	if (make_dirs(sub, err) < 0)
		return -1;

	/* The image first, never older than the entry (image.c, step 1): one
	 * that cannot be written is removed, the entry is read instead. */
	if (image_path(dir, m->key, ipath, sizeof ipath, err) < 0)
		return -1;
	if (ca_image_store(m, ipath, &ignored) < 0)
		unlink(ipath);
	if (module_to_msgs(m, &x, err) < 0)
		return -1;
	if (check_loadable(&x.e, err) < 0) {
		free(x.cols.base);
		return sp_failctx(err, "not storing the analysis of %s, it would "
				  "not load back (an analyser bug)", m->path);
	}
	plen = sptrace__repo__entry__get_packed_size(&x.e);
	buf = malloc(REPO_HDR_SIZE + plen);
	if (!buf) {
		free(x.cols.base);
		return sp_fail(err, "out of memory (%zu bytes) writing %s",
			       REPO_HDR_SIZE + plen, path);
	}
	sptrace__repo__entry__pack(&x.e, buf + REPO_HDR_SIZE);
	free(x.cols.base);

	memcpy(buf, REPO_MAGIC, 8);
	put_le32(buf + 8, REPO_HDR_VERSION);
	put_le32(buf + 12, (uint32_t)crc32_z(0, buf + REPO_HDR_SIZE, plen));
	put_le64(buf + 16, plen);
	rc = ca_repo_write_atomic(path, buf, REPO_HDR_SIZE + plen, err);
	free(buf);
	if (rc < 0)
		return -1;
	if (path_out && path_len)
		snprintf(path_out, path_len, "%s", path);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Reading: file -> header checks -> Entry -> validated module               */
/* ------------------------------------------------------------------------ */

/*
 * The checks below fail with a message that callers prefix with the file
 * name; `what` is the table and the index of the bad record.
 */
#define BAD(...) sp_fail(err, "corrupt entry: " __VA_ARGS__)

/* All columns of a table must have the table's length. */
static int same_len(const char *table, const char *col, size_t got, size_t n,
		    sp_err *err)
{
	if (got != n)
		return BAD("%s column %s has %zu values, the table has %zu",
			   table, col, got, n);
	return 0;
}

#define SAME(table, msg, f, n) \
	if (same_len(table, #f, (msg)->n_##f, (n), err) < 0) \
		return -1

static int check_str(const char *what, size_t i, const char *field,
		     uint32_t off, size_t nstrs, sp_err *err)
{
	if (off >= nstrs)
		return BAD("%s %zu: %s string offset %u is beyond the string "
			   "table (%zu bytes)", what, i, field, off, nstrs);
	return 0;
}

static int check_idx(const char *what, size_t i, const char *field,
		     uint32_t idx, size_t n, const char *of, bool none_ok,
		     sp_err *err)
{
	if (idx < n || (none_ok && idx == CA_NONE))
		return 0;
	return BAD("%s %zu: %s %u is out of range (%zu %s)", what, i, field,
		   idx, n, of);
}

static int check_range(const char *what, size_t i, const char *field,
		       uint32_t first, uint32_t count, size_t n, sp_err *err)
{
	if ((uint64_t)first + count <= n)
		return 0;
	return BAD("%s %zu: %s %u+%u runs past the end (%zu)", what, i, field,
		   first, count, n);
}

static int check_fits(const char *what, size_t i, const char *field,
		      uint32_t v, uint32_t max, sp_err *err)
{
	if (v <= max)
		return 0;
	return BAD("%s %zu: %s %u is out of range (maximum %u)", what, i, field,
		   v, max);
}

/* Allocate the array for `n` records (a real pointer even for n == 0, so
 * the checks for failure stay simple).  Records with padding (ca_block,
 * ca_site) are zeroed so that equal modules compare equal with memcmp. */
static void *alloc_records(size_t n, size_t elsize, bool zero, sp_err *err)
{
	void *p = zero ? calloc(n ? n : 1, elsize) : malloc(n ? n * elsize : 1);

	if (!p)
		sp_fail(err, "out of memory loading %zu records", n);
	return p;
}

static int load_funcs(const Sptrace__Repo__Funcs *c, ca_module *m, size_t nblocks,
		      size_t nsites, bool calls_only, sp_err *err)
{
	size_t n = c ? c->n_addr : 0;

	m->nfuncs = m->capfuncs = 0;
	m->funcs = alloc_records(n, sizeof *m->funcs, false, err);
	if (!m->funcs)
		return -1;
	if (!c)
		return 0;
	SAME("funcs", c, size, n);
	SAME("funcs", c, name, n);
	SAME("funcs", c, parent, n);
	SAME("funcs", c, first_block, n);
	SAME("funcs", c, nblocks, n);
	SAME("funcs", c, first_site, n);
	SAME("funcs", c, nsites, n);
	SAME("funcs", c, sources, n);
	SAME("funcs", c, flags, n);
	SAME("funcs", c, ninsns, n);
	for (size_t i = 0; i < n; i++) {
		ca_func *f = &m->funcs[i];

		if (check_str("function", i, "name", c->name[i], m->nstrs, err) < 0 ||
		    check_idx("function", i, "parent", c->parent[i], n,
			      "functions", true, err) < 0 ||
		    (!calls_only && check_range("function", i, "blocks", c->first_block[i],
						c->nblocks[i], nblocks, err) < 0) ||
		    check_range("function", i, "sites", c->first_site[i],
				c->nsites[i], nsites, err) < 0 ||
		    check_fits("function", i, "sources", c->sources[i], 0xffff, err) < 0 ||
		    check_fits("function", i, "flags", c->flags[i], 0xffff, err) < 0)
			return -1;
		if (i && c->addr[i] < c->addr[i - 1])
			return BAD("function %zu: address 0x%llx is below its "
				   "predecessor's (functions must be sorted)", i,
				   (unsigned long long)c->addr[i]);
		f->addr = c->addr[i];
		f->size = c->size[i];
		f->name = c->name[i];
		f->parent = c->parent[i];
		f->first_block = calls_only ? 0 : c->first_block[i];
		f->nblocks = calls_only ? 0 : c->nblocks[i];  /* the view has no blocks */
		f->first_site = c->first_site[i];
		f->nsites = c->nsites[i];
		f->sources = (uint16_t)c->sources[i];
		f->flags = (uint16_t)c->flags[i];
		f->ninsns = c->ninsns[i];
	}
	m->nfuncs = m->capfuncs = n;
	return 0;
}

static int load_blocks(const Sptrace__Repo__Blocks *c, ca_module *m,
		       size_t nfuncs, size_t nedges, sp_err *err)
{
	size_t n = c ? c->n_addr : 0;

	m->nblocks = m->capblocks = 0;
	m->blocks = alloc_records(n, sizeof *m->blocks, true, err);
	if (!m->blocks)
		return -1;
	if (!c)
		return 0;
	SAME("blocks", c, size, n);
	SAME("blocks", c, func, n);
	SAME("blocks", c, first_edge, n);
	SAME("blocks", c, nedges, n);
	SAME("blocks", c, flags, n);
	SAME("blocks", c, ninsns, n);
	for (size_t i = 0; i < n; i++) {
		ca_block *b = &m->blocks[i];

		if (check_idx("block", i, "func", c->func[i], nfuncs, "functions",
			      false, err) < 0 ||
		    check_fits("block", i, "nedges", c->nedges[i], 0xffff, err) < 0 ||
		    check_fits("block", i, "flags", c->flags[i], 0xffff, err) < 0 ||
		    check_range("block", i, "edges", c->first_edge[i],
				c->nedges[i], nedges, err) < 0)
			return -1;
		b->addr = c->addr[i];
		b->size = c->size[i];
		b->func = c->func[i];
		b->first_edge = c->first_edge[i];
		b->nedges = (uint16_t)c->nedges[i];
		b->flags = (uint16_t)c->flags[i];
		b->ninsns = c->ninsns[i];
	}
	m->nblocks = m->capblocks = n;
	return 0;
}

static int load_edges(const Sptrace__Repo__Edges *c, ca_module *m,
		      size_t nblocks, sp_err *err)
{
	size_t n = c ? c->n_to : 0;

	m->nedges = m->capedges = 0;
	m->edges = alloc_records(n, sizeof *m->edges, false, err);
	if (!m->edges)
		return -1;
	if (!c)
		return 0;
	SAME("edges", c, kind, n);
	for (size_t i = 0; i < n; i++) {
		if (check_idx("edge", i, "to", c->to[i], nblocks, "blocks", false,
			      err) < 0 ||
		    check_fits("edge", i, "kind", c->kind[i], CA_EDGE_TABLE, err) < 0)
			return -1;
		m->edges[i].to = c->to[i];
		m->edges[i].kind = c->kind[i];
	}
	m->nedges = m->capedges = n;
	return 0;
}

static int load_sites(const Sptrace__Repo__Sites *c, ca_module *m,
		      size_t nfuncs, sp_err *err)
{
	size_t n = c ? c->n_addr : 0;

	m->nsites = m->capsites = 0;
	m->sites = alloc_records(n, sizeof *m->sites, true, err);
	if (!m->sites)
		return -1;
	if (!c)
		return 0;
	SAME("sites", c, target, n);
	SAME("sites", c, patch_addr, n);
	SAME("sites", c, func, n);
	SAME("sites", c, callee, n);
	SAME("sites", c, import, n);
	SAME("sites", c, len, n);
	SAME("sites", c, kind, n);
	SAME("sites", c, method, n);
	SAME("sites", c, reason, n);
	SAME("sites", c, flags, n);
	SAME("sites", c, patch_len, n);
	SAME("sites", c, reloc_rip, n);
	SAME("sites", c, code, n);
	for (size_t i = 0; i < n; i++) {
		ca_site *s = &m->sites[i];

		if (check_idx("site", i, "func", c->func[i], nfuncs, "functions",
			      false, err) < 0 ||
		    check_idx("site", i, "callee", c->callee[i], nfuncs,
			      "functions", true, err) < 0 ||
		    (c->import[i] != CA_NONE &&
		     check_str("site", i, "import", c->import[i], m->nstrs, err) < 0) ||
		    check_fits("site", i, "len", c->len[i], 0xff, err) < 0 ||
		    /* kind and method index the stats arrays and name tables */
		    check_fits("site", i, "kind", c->kind[i], CA_SITE_KIND_MAX - 1, err) < 0 ||
		    check_fits("site", i, "method", c->method[i], CA_PATCH_METHOD_MAX - 1, err) < 0 ||
		    check_fits("site", i, "reason", c->reason[i], CA_WHY_REASON_MAX - 1, err) < 0 ||
		    check_fits("site", i, "flags", c->flags[i], 0xff, err) < 0 ||
		    check_fits("site", i, "patch_len", c->patch_len[i], 0xff, err) < 0 ||
		    check_fits("site", i, "reloc_rip", c->reloc_rip[i], 0xff, err) < 0)
			return -1;
		s->addr = c->addr[i];
		s->target = c->target[i];
		s->patch_addr = c->patch_addr[i];
		s->func = c->func[i];
		s->callee = c->callee[i];
		s->import = c->import[i];
		s->len = (uint8_t)c->len[i];
		s->kind = (uint8_t)c->kind[i];
		s->method = (uint8_t)c->method[i];
		s->reason = (uint8_t)c->reason[i];
		s->flags = (uint8_t)c->flags[i];
		s->patch_len = (uint8_t)c->patch_len[i];
		s->reloc_rip = (uint8_t)c->reloc_rip[i];
		s->pad_ = 0;
		s->code = c->code[i];
	}
	m->nsites = m->capsites = n;
	return 0;
}

static int load_lines(const Sptrace__Repo__Lines *c, ca_module *m, sp_err *err)
{
	size_t n = c ? c->n_addr : 0;

	m->nlines = m->caplines = 0;
	m->lines = alloc_records(n, sizeof *m->lines, false, err);
	if (!m->lines)
		return -1;
	if (!c)
		return 0;
	SAME("lines", c, file, n);
	SAME("lines", c, line, n);
	for (size_t i = 0; i < n; i++) {
		if (check_str("line", i, "file", c->file[i], m->nstrs, err) < 0)
			return -1;
		if (i && c->addr[i] < c->addr[i - 1])
			return BAD("line %zu: address 0x%llx is below its "
				   "predecessor's (lines must be sorted)", i,
				   (unsigned long long)c->addr[i]);
		m->lines[i].addr = c->addr[i];
		m->lines[i].file = c->file[i];
		m->lines[i].line = c->line[i];
	}
	m->nlines = m->caplines = n;
	return 0;
}

static int load_undec(const Sptrace__Repo__Undecodable *c, ca_module *m,
		      size_t nfuncs, sp_err *err)
{
	size_t n = c ? c->n_addr : 0;

	m->nundec = m->capundec = 0;
	m->undec = alloc_records(n, sizeof *m->undec, false, err);
	if (!m->undec)
		return -1;
	if (!c)
		return 0;
	SAME("undecodable", c, size, n);
	SAME("undecodable", c, func, n);
	for (size_t i = 0; i < n; i++) {
		if (check_idx("undecodable region", i, "func", c->func[i], nfuncs,
			      "functions", true, err) < 0)
			return -1;
		m->undec[i].addr = c->addr[i];
		m->undec[i].size = c->size[i];
		m->undec[i].func = c->func[i];
	}
	m->nundec = m->capundec = n;
	return 0;
}

static int load_runtimes(const Sptrace__Repo__Runtimes *c, ca_module *m, sp_err *err)
{
	size_t n = c ? c->n_lo : 0;

	m->nruntimes = m->capruntimes = 0;
	m->runtimes = alloc_records(n, sizeof *m->runtimes, false, err);
	if (!m->runtimes)
		return -1;
	if (!c)
		return 0;
	SAME("runtimes", c, hi, n);
	SAME("runtimes", c, kind, n);
	SAME("runtimes", c, how, n);
	for (size_t i = 0; i < n; i++) {
		if (check_str("runtime region", i, "how", c->how[i], m->nstrs, err) < 0)
			return -1;
		if (c->lo[i] >= c->hi[i] || c->kind[i] == 0 || c->kind[i] >= CA_RUNTIME_KIND_MAX ||
		    (i && c->lo[i] < c->lo[i - 1]))
			return BAD("runtime region %zu: [0x%llx, 0x%llx) of kind %u (regions "
				   "must be non-empty, of a known kind, sorted)", i,
				   (unsigned long long)c->lo[i], (unsigned long long)c->hi[i],
				   (unsigned)c->kind[i]);
		m->runtimes[i] = (ca_runtime){ c->lo[i], c->hi[i], c->kind[i], c->how[i] };
	}
	m->nruntimes = m->capruntimes = n;
	return 0;
}

static int load_stats(const Sptrace__Repo__Stats *c, ca_stats *s, sp_err *err)
{
	memset(s, 0, sizeof *s);
	if (!c)
		return 0;
	if (c->n_nfuncs_by_source > sizeof s->nfuncs_by_source / sizeof(uint32_t) ||
	    c->n_nsites_by_kind > sizeof s->nsites_by_kind / sizeof(uint32_t) ||
	    c->n_nsites_by_method > sizeof s->nsites_by_method / sizeof(uint32_t))
		return BAD("stats arrays are longer than this analyser's");
	s->text_bytes = c->text_bytes;
	s->decoded_bytes = c->decoded_bytes;
	s->undecodable_bytes = c->undecodable_bytes;
	s->nundecodable = c->nundecodable;
	s->ninsns = c->ninsns;
	s->nfuncs = c->nfuncs;
	s->nblocks = c->nblocks;
	s->nedges = c->nedges;
	s->nsites = c->nsites;
	s->nlines = c->nlines;
	if (c->n_nfuncs_by_source)
		memcpy(s->nfuncs_by_source, c->nfuncs_by_source,
		       c->n_nfuncs_by_source * sizeof(uint32_t));
	if (c->n_nsites_by_kind)
		memcpy(s->nsites_by_kind, c->nsites_by_kind,
		       c->n_nsites_by_kind * sizeof(uint32_t));
	if (c->n_nsites_by_method)
		memcpy(s->nsites_by_method, c->nsites_by_method,
		       c->n_nsites_by_method * sizeof(uint32_t));
	s->njump_tables = c->njump_tables;
	s->njump_table_targets = c->njump_table_targets;
	s->nfragments = c->nfragments;
	s->nnoreturn = c->nnoreturn;
	s->nlanding_pads = c->nlanding_pads;
	s->analyze_ns = c->analyze_ns;
	s->lines_ns = c->lines_ns;
	return 0;
}

static int copy_field(char *dst, size_t cap, const char *src, const char *name,
		      sp_err *err)
{
	size_t n = strlen(src);

	if (n >= cap)
		return BAD("%s is %zu bytes long (at most %zu)", name, n, cap - 1);
	memcpy(dst, src, n + 1);
	return 0;
}

/* Number of records in a table: the length of its first column. */
#define NREC(msg, f) ((msg) ? (msg)->n_##f : 0)

/* Turn a checked-version Entry into a module, validating as it goes. */
static int entry_to_module(const Entry *e, ca_module *m, bool calls_only, sp_err *err)
{
	size_t nfuncs = NREC(e->funcs, addr), nblocks = NREC(e->blocks, addr);
	size_t nedges = NREC(e->edges, to), nsites = NREC(e->sites, addr);

	if (nfuncs >= CA_NONE || nblocks >= CA_NONE || nedges >= CA_NONE ||
	    nsites >= CA_NONE)
		return BAD("tables too large for 32-bit indices");
	if (copy_field(m->key, sizeof m->key, e->key, "key", err) < 0 ||
	    copy_field(m->buildid, sizeof m->buildid, e->buildid, "build-id", err) < 0 ||
	    copy_field(m->lines_source, sizeof m->lines_source, e->lines_source,
		       "lines_source", err) < 0)
		return -1;
	free(m->path);
	m->path = strdup(e->path);
	if (!m->path)
		return sp_fail(err, "out of memory");
	m->file_size = e->file_size;
	m->is_dyn = e->is_dyn != 0;
	m->lines_pending = e->lines_pending != 0;
	if (e->code_sha256.len != sizeof m->code_sha256)
		return BAD("code_sha256 has %zu bytes, not %zu", e->code_sha256.len,
			   sizeof m->code_sha256);
	memcpy(m->code_sha256, e->code_sha256.data, sizeof m->code_sha256);
	if (e->n_file_id != 0 && e->n_file_id != CA_FILE_ID_N)
		return BAD("file_id has %zu values, not %d", e->n_file_id, CA_FILE_ID_N);
	memset(m->file_id, 0, sizeof m->file_id);
	if (e->n_file_id)
		memcpy(m->file_id, e->file_id, sizeof m->file_id);

	/* The string table: offset 0 is "" and every string ends inside it. */
	if (e->strs.len == 0 || e->strs.data[0] != 0 ||
	    e->strs.data[e->strs.len - 1] != 0)
		return BAD("string table (%zu bytes) must start and end with NUL",
			   e->strs.len);
	if (e->strs.len >= CA_NONE)
		return BAD("string table too large for 32-bit offsets");
	free(m->strs);
	m->nstrs = m->capstrs = 0;
	m->strs = malloc(e->strs.len);
	if (!m->strs)
		return sp_fail(err, "out of memory");
	memcpy(m->strs, e->strs.data, e->strs.len);
	m->nstrs = m->capstrs = e->strs.len;

	free(m->funcs);
	free(m->blocks);
	free(m->edges);
	free(m->sites);
	free(m->lines);
	free(m->undec);
	free(m->runtimes);
	m->funcs = NULL;
	m->blocks = NULL;
	m->edges = NULL;
	m->sites = NULL;
	m->lines = NULL;
	m->undec = NULL;
	m->runtimes = NULL;
	if (load_funcs(e->funcs, m, nblocks, nsites, calls_only, err) < 0 ||
	    load_blocks(e->blocks, m, nfuncs, nedges, err) < 0 ||
	    load_edges(e->edges, m, nblocks, err) < 0 ||
	    load_sites(e->sites, m, nfuncs, err) < 0 ||
	    load_lines(e->lines, m, err) < 0 ||
	    load_undec(e->undecodable, m, nfuncs, err) < 0 ||
	    load_runtimes(e->runtimes, m, err) < 0 ||
	    load_stats(e->stats, &m->stats, err) < 0)
		return -1;
	return 0;
}

static int check_loadable(const Entry *e, sp_err *err)
{
	ca_module *m = ca_module_new();
	int rc;

	if (!m)
		return sp_fail(err, "out of memory");
	rc = entry_to_module(e, m, false, err);
	ca_module_free(m);
	return rc;
}

/*
 * protobuf-c allocates every message, string and column it unpacks.  They
 * are served from one arena, allocated together with the buffer the file is
 * read into, instead of by some fifty calls to malloc: the columns of a big
 * module are megabytes each, which malloc would map fresh from the kernel
 * (and unmap again) on every load, whereas one block of the same size is
 * reused by the next load.  A hostile payload whose unpacked form outgrows
 * the arena (varints and unknown fields expand) falls back to malloc.
 */
typedef struct unpack_arena {
	ProtobufCAllocator al;
	uint8_t *base;
	size_t used, cap;
} unpack_arena;

/* Room for everything a valid entry unpacks to besides its columns and
 * strings (which take no more than their payload bytes): the message
 * structs and the alignment of each allocation. */
#define ARENA_SLACK (64 * 1024)

static void *arena_alloc(void *data, size_t n)
{
	unpack_arena *a = data;
	size_t off = (a->used + 15) & ~(size_t)15;

	if (off <= a->cap && n <= a->cap - off) {
		a->used = off + n;
		return a->base + off;
	}
	return malloc(n);
}

static void arena_free(void *data, void *p)
{
	unpack_arena *a = data;
	uint8_t *q = p;

	if (q < a->base || q >= a->base + a->cap)
		free(p);
}

/* Check the header and the payload of the file image `buf`, then build the
 * module.  The payload is unpacked into `arena`.  Messages do not name the
 * file; the caller adds it. */
static int parse_payload(const uint8_t *payload, size_t plen, const char *key,
			 unpack_arena *arena, bool calls_only, ca_module **out, sp_err *err);

/* The header of an entry of `size` bytes: magic, version, and a payload
 * length that fills the rest of the file exactly (*plen). */
static int check_header(const uint8_t *hdr, size_t size, uint64_t *plen, sp_err *err)
{
	if (size < REPO_HDR_SIZE)
		return sp_fail(err, "truncated: %zu of %d header bytes", size,
			       REPO_HDR_SIZE);
	if (memcmp(hdr, REPO_MAGIC, 8) != 0)
		return sp_fail(err, "not a repository entry (bad magic)");
	if (get_le32(hdr + 8) != REPO_HDR_VERSION)
		return sp_fail(err, "header version %u, this reader knows %d",
			       get_le32(hdr + 8), REPO_HDR_VERSION);
	*plen = get_le64(hdr + 16);
	if (*plen > REPO_MAX_ENTRY)
		return sp_fail(err, "payload length %llu in the header is "
			       "implausible", (unsigned long long)*plen);
	if (size - REPO_HDR_SIZE < *plen)
		return sp_fail(err, "truncated: %zu of %llu bytes", size,
			       (unsigned long long)(*plen + REPO_HDR_SIZE));
	if (size - REPO_HDR_SIZE > *plen)
		return sp_fail(err, "%zu bytes of trailing garbage after the "
			       "payload", size - REPO_HDR_SIZE - (size_t)*plen);
	return 0;
}

static int parse_entry(const uint8_t *buf, size_t size, const char *key,
		       unpack_arena *arena, ca_module **out, sp_err *err)
{
	uint64_t plen;
	uint32_t crc, want;

	if (check_header(buf, size, &plen, err) < 0)
		return -1;
	want = get_le32(buf + 12);
	crc = (uint32_t)crc32_z(0, buf + REPO_HDR_SIZE, plen);
	if (crc != want)
		return sp_fail(err, "checksum mismatch (header says 0x%08x, "
			       "payload has 0x%08x)", want, crc);
	return parse_payload(buf + REPO_HDR_SIZE, plen, key, arena, false, out, err);
}

static int parse_payload(const uint8_t *payload, size_t plen, const char *key,
			 unpack_arena *arena, bool calls_only, ca_module **out, sp_err *err)
{
	Entry *e;
	ca_module *m;
	int rc = -1;

	arena->al = (ProtobufCAllocator){ arena_alloc, arena_free, arena };
	e = sptrace__repo__entry__unpack(&arena->al, plen, payload);
	if (!e)
		return sp_fail(err, "corrupt entry: the payload is not a valid "
			       "repository message");
	if (e->schema_version != REPO_SCHEMA_VERSION) {
		sp_fail(err, "written with schema version %u, this is %d",
			e->schema_version, REPO_SCHEMA_VERSION);
		goto out;
	}
	if (e->analyzer_version != CA_ANALYZER_VERSION) {
		sp_fail(err, "written by analyser version %u, this is %d",
			e->analyzer_version, CA_ANALYZER_VERSION);
		goto out;
	}
	if (strcmp(e->key, key) != 0) {
		sp_fail(err, "holds the module with key %.160s, not %s", e->key, key);
		goto out;
	}
	m = ca_module_new();
	if (!m) {
		sp_fail(err, "out of memory");
		goto out;
	}
	if (entry_to_module(e, m, calls_only, err) < 0) {
		ca_module_free(m);
		goto out;
	}
	*out = m;
	rc = 0;
out:
	sptrace__repo__entry__free_unpacked(e, &arena->al);
	return rc;
}

/* Open the entry for `key`: 0 with *fd and *size, 1 if there is none, -1. */
static int open_entry(const char *dir, const char *key, char *path, size_t pathlen, int *fd,
		      size_t *size, sp_err *err)
{
	struct stat st;
	int e;

	if (check_key(key, err) < 0 || resolve_dir(&dir, err) < 0 ||
	    entry_path(dir, key, path, pathlen, err) < 0)
		return -1;
	/* O_NONBLOCK: a FIFO planted at the entry's path must not hang us. */
	*fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (*fd < 0) {
		e = errno;
		if (e == ENOENT || e == ENOTDIR)
			return 1;
		return sp_fail(err, "opening repository entry %s: %s", path,
			       strerror(e));
	}
	if (fstat(*fd, &st) < 0) {
		e = errno;
		close(*fd);
		return sp_fail(err, "repository entry %s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(*fd);
		return sp_fail(err, "repository entry %s is not a regular file",
			       path);
	}
	if ((uint64_t)st.st_size > REPO_MAX_ENTRY + REPO_HDR_SIZE) {
		close(*fd);
		return sp_fail(err, "repository entry %s: %lld bytes is "
			       "implausibly large", path, (long long)st.st_size);
	}
	*size = (size_t)st.st_size;
	return 0;
}

int ca_repo_load(const char *dir, const char *key, ca_module **out, sp_err *err)
{
	char path[PATH_MAX];
	unpack_arena arena;
	uint8_t *buf;
	size_t size, bufcap, got = 0;
	int fd, e, rc;

	*out = NULL;
	rc = open_entry(dir, key, path, sizeof path, &fd, &size, err);
	if (rc != 0)
		return rc;
	/*
	 * One read of the whole file into the first part of one block; the
	 * rest is the unpack arena.  Not mmap, although it would save a copy:
	 * a file truncated under the mapping would raise SIGBUS inside the
	 * traced process that loads it.
	 */
	bufcap = (size + 15) & ~(size_t)15;
	arena.cap = size + ARENA_SLACK;
	buf = malloc(bufcap + arena.cap);
	if (!buf) {
		close(fd);
		return sp_fail(err, "repository entry %s: out of memory (%zu bytes)",
			       path, bufcap + arena.cap);
	}
	arena.base = buf + bufcap;
	arena.used = 0;
	while (got < size) {
		ssize_t r = read(fd, buf + got, size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			e = errno;
			free(buf);
			close(fd);
			return sp_fail(err, "reading repository entry %s: %s", path,
				       strerror(e));
		}
		if (r == 0)
			break;  /* shrank since fstat: the header check says so */
		got += (size_t)r;
	}
	close(fd);
	rc = parse_entry(buf, got, key, &arena, out, err);
	free(buf);
	if (rc < 0)
		return sp_failctx(err, "repository entry %s", path);
	return 0;
}

/* A protobuf varint at p[0..n): its length, 0 if it does not end there. */
static size_t get_varint(const uint8_t *p, size_t n, uint64_t *v)
{
	*v = 0;
	for (size_t i = 0; i < n && i < 10; i++) {
		*v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (!(p[i] & 0x80))
			return i + 1;
	}
	return 0;
}

/* Entry fields the calls view leaves out (proto/repo.proto): blocks,
 * edges, lines, undecodable -- four fifths of a typical entry. */
static bool calls_view_skips(uint64_t field)
{
	return field == 12 || field == 13 || field == 15 || field == 16;
}

#define CALLS_VIEW_MAX_FIELDS 64

/*
 * The calls view: one look at each top-level field's key and length (a
 * pread of a few bytes each), then one pread per wanted field into one
 * block, which is parsed as a whole entry without the skipped fields.
 */
static int load_calls(int fd, size_t size, const char *key, ca_module **out, sp_err *err)
{
	struct { uint64_t off, len; } part[CALLS_VIEW_MAX_FIELDS];
	uint8_t hdr[REPO_HDR_SIZE], h[24];
	uint64_t plen, pos, end, total = 0;
	size_t nparts = 0, bufcap;
	unpack_arena arena;
	uint8_t *buf;
	int rc;

	if (size >= REPO_HDR_SIZE && sp_pread_all(fd, hdr, REPO_HDR_SIZE, 0) < 0)
		return sp_fail(err, "truncated: the header is not all there");
	if (check_header(hdr, size, &plen, err) < 0)
		return -1;
	end = REPO_HDR_SIZE + plen;
	for (pos = REPO_HDR_SIZE; pos < end;) {
		size_t n = end - pos < sizeof h ? (size_t)(end - pos) : sizeof h, kl, ll;
		uint64_t k, v, flen;

		if (sp_pread_all(fd, h, n, pos) < 0)
			return sp_fail(err, "truncated at offset %llu", (unsigned long long)pos);
		kl = get_varint(h, n, &k);
		if (!kl)
			return sp_fail(err, "bad field key at offset %llu", (unsigned long long)pos);
		switch (k & 7) {
		case 0:
			ll = get_varint(h + kl, n - kl, &v);
			flen = kl + ll;
			break;
		case 1:
			ll = 1;
			flen = kl + 8;
			break;
		case 2:
			ll = get_varint(h + kl, n - kl, &v);
			flen = kl + ll + v;
			break;
		case 5:
			ll = 1;
			flen = kl + 4;
			break;
		default:
			ll = 0;
			flen = 0;
		}
		if (!ll || flen > end - pos)
			return sp_fail(err, "bad field %llu at offset %llu",
				       (unsigned long long)(k >> 3), (unsigned long long)pos);
		if (!calls_view_skips(k >> 3)) {
			if (nparts == CALLS_VIEW_MAX_FIELDS)
				return sp_fail(err, "more than %d top-level fields",
					       CALLS_VIEW_MAX_FIELDS);
			part[nparts].off = pos;
			part[nparts++].len = flen;
			total += flen;
		}
		pos += flen;
	}
	bufcap = ((size_t)total + 15) & ~(size_t)15;
	arena.cap = (size_t)total + ARENA_SLACK;
	buf = malloc(bufcap + arena.cap);
	if (!buf)
		return sp_fail(err, "out of memory (%zu bytes)", bufcap + arena.cap);
	arena.base = buf + bufcap;
	arena.used = 0;
	pos = 0;
	for (size_t i = 0; i < nparts; i++) {
		if (sp_pread_all(fd, buf + pos, part[i].len, part[i].off) < 0) {
			free(buf);
			return sp_fail(err, "truncated at offset %llu",
				       (unsigned long long)part[i].off);
		}
		pos += part[i].len;
	}
	rc = parse_payload(buf, (size_t)total, key, &arena, true, out, err);
	free(buf);
	return rc;
}

int ca_repo_load_calls(const char *dir, const char *key, ca_module **out, sp_err *err)
{
	char path[PATH_MAX], why[200] = "";
	struct stat st;
	size_t size;
	int fd, rc;

	*out = NULL;
	/* The image only beside its entry: an entry removed takes it along. */
	if (check_key(key, err) < 0 || resolve_dir(&dir, err) < 0 ||
	    entry_path(dir, key, path, sizeof path, err) < 0)
		return -1;
	if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
	    image_path(dir, key, path, sizeof path, err) == 0 &&
	    ca_image_map(path, key, out, why, sizeof why) == 0)
		return 0;
	rc = open_entry(dir, key, path, sizeof path, &fd, &size, err);
	if (rc != 0)
		return rc;
	rc = load_calls(fd, size, key, out, err);
	close(fd);
	if (rc < 0)
		return sp_failctx(err, "repository entry %s", path);
	return 0;
}

int ca_repo_code_matches(const char *dir, const char *key, const char *path, sp_err *err)
{
	uint64_t id[CA_FILE_ID_N];
	ca_module *m = NULL;
	sp_err ignored;
	int rc;

	if (ca_repo_load_calls(dir, key, &m, err) != 0)
		return 0;
	rc = ca_code_matches_id(m, path, id, err);
	/* Read from its entry: its image is missing or unusable, made now. */
	if (rc == 1 && !m->mapped)
		rc = 2;
	ca_module_free(m);
	if (rc != 2)
		return rc;
	/* The whole entry, to store it again with the identity (and its
	 * image): a failure here costs the next check a hash, nothing else. */
	if (ca_repo_load(dir, key, &m, &ignored) == 0) {
		memcpy(m->file_id, id, sizeof id);
		ca_repo_store(m, dir, NULL, 0, &ignored);
		ca_module_free(m);
	}
	return 1;
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                      */
/* ------------------------------------------------------------------------ */

static void to_hex(const uint8_t *p, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * n] = '\0';
}

/* Find NT_GNU_BUILD_ID in one block of notes; its length, or 0. */
static size_t note_buildid(Elf_Data *d, const uint8_t **id)
{
	GElf_Nhdr nh;
	size_t off = 0, next, name_off, desc_off;

	while (d && d->d_buf && off < d->d_size &&
	       (next = gelf_getnote(d, off, &nh, &name_off, &desc_off)) > 0) {
		if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
		    memcmp((const char *)d->d_buf + name_off, "GNU", 4) == 0 &&
		    nh.n_descsz > 0 && nh.n_descsz <= 64) {
			*id = (const uint8_t *)d->d_buf + desc_off;
			return nh.n_descsz;
		}
		off = next;
	}
	return 0;
}

/* The key from the note segments of a loaded image (ca_module_key_of_notes). */
int ca_module_key_of_notes(const void *notes, size_t size, size_t align, char *key,
			   size_t keylen)
{
	const uint8_t *p = notes;
	size_t off = 0, a = align == 8 ? 8 : 4;

	while (p && size >= 12 && off <= size - 12) {
		uint32_t hdr[3];
		size_t name, desc, next;

		memcpy(hdr, p + off, sizeof hdr);
		name = off + 12;
		desc = name + ((hdr[0] + a - 1) & ~(a - 1));
		next = desc + ((hdr[1] + a - 1) & ~(a - 1));
		if (hdr[0] > size || hdr[1] > size || next > size || next <= off)
			return -1;
		if (hdr[2] == NT_GNU_BUILD_ID && hdr[0] == 4 && memcmp(p + name, "GNU", 4) == 0 &&
		    hdr[1] > 0 && hdr[1] <= 64) {
			if (keylen < 2 * hdr[1] + 1)
				return -1;
			to_hex(p + desc, hdr[1], key);
			return 0;
		}
		off = next;
	}
	return -1;
}

/* The GNU build-id from the note segments, else the note sections. */
static size_t elf_buildid(Elf *elf, const uint8_t **id)
{
	size_t nph = 0, n;
	Elf_Scn *scn = NULL;

	if (elf_getphdrnum(elf, &nph) == 0) {
		for (size_t i = 0; i < nph; i++) {
			GElf_Phdr ph;
			Elf_Data *d;

			if (!gelf_getphdr(elf, (int)i, &ph) || ph.p_type != PT_NOTE)
				continue;
			d = elf_getdata_rawchunk(elf, (int64_t)ph.p_offset,
						 ph.p_filesz, ph.p_align == 8 ?
						 ELF_T_NHDR8 : ELF_T_NHDR);
			if ((n = note_buildid(d, id)) > 0)
				return n;
		}
	}
	while ((scn = elf_nextscn(elf, scn)) != NULL) {
		GElf_Shdr sh;

		if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE)
			continue;
		if ((n = note_buildid(elf_getdata(scn, NULL), id)) > 0)
			return n;
	}
	return 0;
}

/* "sha256-" and the hash of the whole file read from `fd`. */
static int hash_file(int fd, const char *path, char *key, size_t keylen,
		     sp_err *err)
{
	static const size_t chunk = 1 << 20;
	unsigned char md[32];
	sp_sha256 ctx;
	uint8_t *buf;
	int rc = -1;

	if (keylen < 7 + 64 + 1)
		return sp_fail(err, "key buffer too small (%zu bytes)", keylen);
	if (lseek(fd, 0, SEEK_SET) < 0)
		return sp_fail(err, "%s: %s", path, strerror(errno));
	buf = malloc(chunk);
	if (!buf) {
		sp_fail(err, "hashing %s: out of memory", path);
		goto out;
	}
	sp_sha256_init(&ctx);
	for (;;) {
		ssize_t r = read(fd, buf, chunk);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			sp_fail(err, "reading %s: %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		sp_sha256_update(&ctx, buf, (size_t)r);
	}
	sp_sha256_final(&ctx, md);
	memcpy(key, "sha256-", 7);
	to_hex(md, sizeof md, key + 7);
	rc = 0;
out:
	free(buf);
	return rc;
}

int ca_module_key_of(const char *path, char *key, size_t keylen, sp_err *err)
{
	const uint8_t *id = NULL;
	struct stat st;
	Elf *elf;
	size_t n;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  /* a FIFO: no hang */
	if (fd < 0)
		return sp_fail(err, "cannot open %s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		bool dir = S_ISDIR(st.st_mode);

		close(fd);
		return sp_fail(err, dir ? "%s: is a directory, not an ELF file"
				       : "%s: not a regular file", path);
	}
	elf_version(EV_CURRENT);
	/* ELF_C_READ, not _MMAP: reads what it needs, no SIGBUS if the file
	 * shrinks under us. */
	elf = elf_begin(fd, ELF_C_READ, NULL);
	if (!elf || elf_kind(elf) != ELF_K_ELF) {
		elf_end(elf);
		close(fd);
		return sp_fail(err, "%s is not an ELF file", path);
	}
	n = elf_buildid(elf, &id);
	if (n > 0) {
		if (keylen < 2 * n + 1)
			rc = sp_fail(err, "key buffer too small (%zu bytes)", keylen);
		else {
			to_hex(id, n, key);
			rc = 0;
		}
	} else {
		rc = hash_file(fd, path, key, keylen, err);
	}
	elf_end(elf);
	close(fd);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* The usual entry point                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Load the entry for `path`, else analyse it and store the result.  A
 * missing entry (1) and a corrupt or stale one (-1) are treated alike: the
 * analysis is redone and the entry overwritten.
 *
 * An entry made without source lines (lines_pending: the agent analysed
 * the module inside a traced program) is completed when this caller wants
 * lines: analysed again here, with them, and replaced.  Should that fail,
 * the entry as it was is still the answer.
 *
 * Storing is best effort: if the repository is read-only or full, or the
 * file is one another user could have written (trust.c), the freshly
 * analysed module is still returned (0, *from_repo = 0) and the store
 * failure is dropped.  An entry found is not checked against the file's code
 * here (a hash of the whole code, which the agent cannot afford at every
 * start): the sptrace command does that before run and attach
 * (cli/preanalyze.c), and the agent checks each site's bytes as it patches.  Callers that must know whether the entry was
 * written (the CLI's `analyze`) call ca_repo_store() themselves.
 */
static bool wants_lines(const ca_options *opt)
{
	return !opt || (!opt->no_lines && !opt->calls_only);
}

int ca_repo_get(const char *dir, const char *path, const ca_options *opt,
		ca_module **out, int *from_repo, sp_err *err)
{
	char key[160];
	ca_module *m = NULL, *partial = NULL;
	sp_err ignored;
	int rc;

	*out = NULL;
	if (from_repo)
		*from_repo = 0;
	if (opt && opt->key && *opt->key)
		snprintf(key, sizeof key, "%s", opt->key);
	else if (ca_module_key_of(path, key, sizeof key, err) < 0)
		return -1;
	rc = opt && opt->calls_only ? ca_repo_load_calls(dir, key, &m, &ignored)
				    : ca_repo_load(dir, key, &m, &ignored);
	if (rc == 0 && m->lines_pending && wants_lines(opt)) {
		partial = m;
		m = NULL;
		rc = 1;
	}
	if (rc == 0) {
		/* Same build-id (or content) means the same module, wherever
		 * it lives now: report it under the name we were given. */
		char *p = strdup(path);

		if (!p) {
			ca_module_free(m);
			return sp_fail(err, "out of memory");
		}
		free(m->path);
		m->path = p;
		*out = m;
		if (from_repo)
			*from_repo = 1;
		return 0;
	}
	if (ca_analyze(path, opt, &m, err) < 0) {
		if (!partial)
			return -1;
		m = partial;
		partial = NULL;
		if (from_repo)
			*from_repo = 1;
	} else {
		(void)ca_repo_store(m, dir, NULL, 0, &ignored);
	}
	ca_module_free(partial);
	/* A kept entry names the file it was made from: report ours, as above. */
	if (strcmp(m->path, path) != 0) {
		char *p = strdup(path);

		if (p) {
			free(m->path);
			m->path = p;
		}
	}
	*out = m;
	return 0;
}
