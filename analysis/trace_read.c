/*
 * trace_read.c — reading a trace directory: meta, sites, ring headers, module
 * analyses (an_trace_open); a thread's records with full timestamps
 * (an_iter); entries paired with exits (an_thread_calls); names of sites and
 * functions, C++ ones demangled as uftrace shows them (an_demangle).  See
 * trace_read.h for what each promises.
 */
#include "trace_read.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Limits past which a file is corrupt rather than large. */
#define RING_MAX_CAPACITY (1ull << 36)   /* 512 GiB of records */
#define RING_MAX_COUNT (1ull << 56)      /* 2 years at 10^9 records/s */
#define RING_MAX_HEADER (1u << 20)
#define RING_FIXED_HEADER offsetof(trace_ring_header, reserved)

/* ------------------------------------------------------------------------ */
/* A small hash map: (a, b) -> uint32, for function identities and the open */
/* calls of each site.                                                      */
/* ------------------------------------------------------------------------ */

typedef struct map_slot {
	uint64_t a, b;
	uint32_t val;
	uint32_t used;
} map_slot;

typedef struct map {
	map_slot *slot;
	size_t cap, n;           /* cap: a power of two or 0 */
} map;

static size_t map_hash(uint64_t a, uint64_t b)
{
	uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xc2b2ae3d27d4eb4full;

	return (size_t)(h ^ (h >> 29));
}

static map_slot *map_find(const map *m, uint64_t a, uint64_t b)
{
	if (!m->cap)
		return NULL;
	for (size_t i = map_hash(a, b) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (!m->slot[i].used)
			return NULL;
		if (m->slot[i].a == a && m->slot[i].b == b)
			return &m->slot[i];
	}
}

/* The slot for (a, b), created with val 0 if new; NULL when out of memory. */
static map_slot *map_get(map *m, uint64_t a, uint64_t b)
{
	map_slot *s = map_find(m, a, b);

	if (s)
		return s;
	if ((m->n + 1) * 2 > m->cap) {
		size_t ncap = m->cap ? m->cap * 2 : 64;
		map_slot *ns = calloc(ncap, sizeof *ns);

		if (!ns)
			return NULL;
		for (size_t i = 0; i < m->cap; i++) {
			if (!m->slot[i].used)
				continue;
			size_t j = map_hash(m->slot[i].a, m->slot[i].b) & (ncap - 1);
			while (ns[j].used)
				j = (j + 1) & (ncap - 1);
			ns[j] = m->slot[i];
		}
		free(m->slot);
		m->slot = ns;
		m->cap = ncap;
	}
	size_t i = map_hash(a, b) & (m->cap - 1);
	while (m->slot[i].used)
		i = (i + 1) & (m->cap - 1);
	m->slot[i] = (map_slot){ a, b, 0, 1 };
	m->n++;
	return &m->slot[i];
}

static void map_free(map *m)
{
	free(m->slot);
	m->slot = NULL;
	m->cap = m->n = 0;
}

/* ------------------------------------------------------------------------ */
/* The trace                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct meta_kv {
	char *key, *val;
} meta_kv;

typedef struct module {
	an_module pub;
	ca_module *ca;
	size_t line;             /* of its line in meta */
} module;

/* Distinct bad site ids given their own "?site N" entry; more share one. */
#define MAX_BAD_SITES 4096

struct an_trace {
	char *dir;
	char *meta_text;         /* the meta file; meta[] points into it */
	meta_kv *meta;
	size_t nmeta, capmeta;
	uint64_t tsc_hz, tsc0;
	int64_t mono0, real0;
	module *mods;            /* sorted by index */
	size_t nmods, capmods;
	trace_site *raw_sites;
	an_site_info *sites;     /* nsites entries; id 0 is never valid */
	size_t nsites;
	map bad_ids;             /* bad site id -> 1 + index in bad[] */
	an_site_info **bad;      /* "?site N" entries, made on first use */
	size_t nbad, capbad;
	an_site_info *bad_many;  /* "?site": beyond MAX_BAD_SITES */
	an_func **funcs;         /* each allocated once, so pointers stay valid */
	size_t nfuncs, capfuncs;
	map func_ids;            /* (module, addr) -> function index */
	int demangle;            /* enum an_demangle */
	map demangled_ids;       /* (module, ca_func index) -> 1 + index in demangled[] */
	char **demangled;        /* symbols as shown, each demangled once */
	size_t ndemangled, capdemangled;
	an_thread *threads;
	size_t nthreads, capthreads;
	char **warn;
	size_t nwarn, capwarn;
	uint64_t start_tsc;
	trace_channel *chans;    /* the channels file; nchans records, [0] no channel */
	size_t nchans;
	an_msg *msgs;            /* message events of the call trees built so far */
	size_t nmsgs, capmsgs;
};

/* Remember a warning (printf style).  Out of memory loses the warning only. */
__attribute__((format(printf, 2, 3)))
static void warn(an_trace *t, const char *fmt, ...)
{
	va_list ap;
	char *s;

	if (sp_grow((void **)&t->warn, &t->capwarn, t->nwarn + 1, sizeof *t->warn))
		return;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) >= 0)
		t->warn[t->nwarn++] = s;
	va_end(ap);
}

const char *an_trace_dir(const an_trace *t) { return t->dir; }
size_t an_trace_nwarnings(const an_trace *t) { return t->nwarn; }
const char *an_trace_warning(const an_trace *t, size_t i) { return i < t->nwarn ? t->warn[i] : NULL; }
size_t an_trace_nmodules(const an_trace *t) { return t->nmods; }
size_t an_trace_nthreads(const an_trace *t) { return t->nthreads; }
size_t an_nsites(const an_trace *t) { return t->nsites; }
size_t an_nfuncs(const an_trace *t) { return t->nfuncs; }
uint64_t an_trace_start_tsc(const an_trace *t) { return t->start_tsc; }

const an_module *an_trace_module(const an_trace *t, size_t i)
{
	return i < t->nmods ? &t->mods[i].pub : NULL;
}

const an_thread *an_trace_thread(const an_trace *t, size_t i)
{
	return i < t->nthreads ? &t->threads[i] : NULL;
}

const an_thread *an_trace_thread_by_tid(const an_trace *t, uint32_t tid)
{
	for (size_t i = 0; i < t->nthreads; i++)
		if (t->threads[i].tid == tid)
			return &t->threads[i];
	return NULL;
}

const an_func *an_func_get(const an_trace *t, uint32_t i)
{
	return i < t->nfuncs ? t->funcs[i] : NULL;
}

const char *an_trace_meta(const an_trace *t, const char *key)
{
	for (size_t i = 0; i < t->nmeta; i++)
		if (strcmp(t->meta[i].key, key) == 0)
			return t->meta[i].val;
	return NULL;
}

/* Read a whole small regular file (never a FIFO, a device or a link: see
 * sp_open_regular).  0 and *buf (NUL-terminated) or -1 with errno. */
static int slurp(const char *path, size_t max, char **buf, size_t *len)
{
	struct stat st = { 0 };
	int fd = sp_open_regular(path, 1);
	size_t got = 0;

	*buf = NULL;
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size > max) {
		int e = (uint64_t)st.st_size > max ? EFBIG : errno;

		close(fd);
		errno = e;
		return -1;
	}
	*buf = malloc((size_t)st.st_size + 1);
	if (!*buf) {
		close(fd);
		errno = ENOMEM;
		return -1;
	}
	/* No more than fstat said: a file growing meanwhile is read as it was. */
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, *buf + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	(*buf)[got] = '\0';
	*len = got;
	return 0;
}

static const char *errno_text(int e)
{
	if (e == EFBIG)
		return "implausibly large";
	return sp_open_why(e);
}

/* ------------------------------------------------------------------------ */
/* meta                                                                      */
/* ------------------------------------------------------------------------ */

/* A whole string as an unsigned number in `base` (16 allows "0x"). */
static int parse_u64(const char *s, int base, uint64_t *out)
{
	char *end;

	if (!isxdigit((unsigned char)*s))
		return -1;
	errno = 0;
	*out = strtoull(s, &end, base);
	return errno || *end ? -1 : 0;
}

static int module_cmp(const void *a, const void *b)
{
	const module *x = a, *y = b;

	if (x->pub.index != y->pub.index)
		return x->pub.index < y->pub.index ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

/* "module <index> <path> <key> <bias-hex>": the path may hold spaces, so
 * the key and bias are taken from the right. */
static int parse_module(an_trace *t, const char *where, size_t line, char *v, sp_err *err)
{
	char *sp1 = strchr(v, ' '), *sp3 = strrchr(v, ' '), *sp2;
	uint64_t index, bias;
	module *m;

	if (!sp1 || sp3 == sp1)
		goto bad;
	*sp3 = '\0';
	sp2 = strrchr(v, ' ');
	if (sp2 == sp1 || sp2 == sp1 + 1)
		goto bad;
	*sp1 = *sp2 = '\0';
	if (parse_u64(v, 10, &index) || index >= AN_NONE || parse_u64(sp3 + 1, 16, &bias))
		goto bad;
	if (!sp2[1])
		goto bad;
	for (const char *k = sp2 + 1; *k; k++)
		if (!isalnum((unsigned char)*k) && *k != '-')
			return sp_fail(err, "%s: module key '%s' is not a build-id or content hash",
				       where, sp2 + 1);
	if (sp_grow((void **)&t->mods, &t->capmods, t->nmods + 1, sizeof *t->mods))
		return sp_fail(err, "out of memory");
	m = &t->mods[t->nmods++];
	memset(m, 0, sizeof *m);
	m->pub.index = (uint32_t)index;
	m->pub.bias = bias;
	m->pub.path = sp1 + 1;   /* point into the meta value, which stays */
	m->pub.key = sp2 + 1;
	m->line = line;
	return 0;
bad:
	return sp_fail(err, "%s: malformed module line (expected 'module <index> <path> "
		       "<key> <bias-hex>')", where);
}

/* A required numeric meta value. */
static int meta_number(an_trace *t, const char *meta_path, const char *key, const char *what,
		       uint64_t *out, sp_err *err)
{
	const char *v = an_trace_meta(t, key);

	if (!v)
		return sp_fail(err, "%s: no '%s' line (%s); the agent writes it when the trace "
			       "starts, so the file is incomplete", meta_path, key, what);
	if (parse_u64(v, 10, out))
		return sp_fail(err, "%s: '%s' is '%s', not an unsigned decimal number", meta_path,
			       key, v);
	return 0;
}

static int read_meta(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], where[PATH_MAX + 32], *buf, *p;
	size_t len, lineno = 0;
	uint64_t v;

	snprintf(path, sizeof path, "%s/meta", t->dir);
	if (slurp(path, TRACE_META_MAX_BYTES, &buf, &len) < 0)
		return sp_fail(err, "%s: cannot read: %s%s", path, errno_text(errno),
			       errno == ENOENT ? " (is this a trace directory?)" : "");
	if (strlen(buf) != len) {
		free(buf);
		return sp_fail(err, "%s: holds a NUL byte: not a meta file, or a corrupt one", path);
	}
	t->meta_text = buf;      /* keys and values point into it */
	for (p = buf; *p; ) {
		char *line = p, *nl = strchr(p, '\n'), *sp;

		lineno++;
		if (nl) {
			*nl = '\0';
			p = nl + 1;
		} else {
			p += strlen(p);
		}
		if (*line == '\0' || *line == '#')
			continue;
		if (sp_grow((void **)&t->meta, &t->capmeta, t->nmeta + 1, sizeof *t->meta))
			return sp_fail(err, "out of memory");
		sp = strchr(line, ' ');
		if (sp)
			*sp = '\0';
		t->meta[t->nmeta].key = line;
		t->meta[t->nmeta].val = sp ? sp + 1 : line + strlen(line);
		t->nmeta++;
		if (strcmp(line, TRACE_META_MODULE) == 0) {
			snprintf(where, sizeof where, "%s:%zu", path, lineno);
			if (parse_module(t, where, lineno, t->meta[t->nmeta - 1].val, err))
				return -1;
		}
	}
	if (!t->nmeta)
		return sp_fail(err, "%s: empty; the agent writes it when the trace starts", path);
	if (!an_trace_meta(t, TRACE_META_VERSION))
		return sp_fail(err, "%s: no 'version' line: not an sptrace trace, or an "
			       "incomplete one", path);
	if (parse_u64(an_trace_meta(t, TRACE_META_VERSION), 10, &v) || v != TRACE_FORMAT_VERSION)
		return sp_fail(err, "%s: trace format version '%s'; this sptrace reads version %d",
			       path, an_trace_meta(t, TRACE_META_VERSION), TRACE_FORMAT_VERSION);
	if (meta_number(t, path, TRACE_META_TSC_HZ, "the TSC frequency", &t->tsc_hz, err) ||
	    meta_number(t, path, TRACE_META_TSC0, "the TSC at the clock reading", &t->tsc0, err) ||
	    meta_number(t, path, TRACE_META_MONO0, "CLOCK_MONOTONIC at tsc0", &v, err))
		return -1;
	if (v > INT64_MAX)
		return sp_fail(err, "%s: '%s' %" PRIu64 " is out of range", path, TRACE_META_MONO0, v);
	t->mono0 = (int64_t)v;
	if (meta_number(t, path, TRACE_META_REAL0, "CLOCK_REALTIME at tsc0", &v, err))
		return -1;
	if (v > INT64_MAX)
		return sp_fail(err, "%s: '%s' %" PRIu64 " is out of range", path, TRACE_META_REAL0, v);
	t->real0 = (int64_t)v;
	if (t->tsc_hz == 0)
		return sp_fail(err, "%s: 'tsc_hz' is 0; the TSC frequency must be positive", path);
	if (t->nmods)
		qsort(t->mods, t->nmods, sizeof *t->mods, module_cmp);
	for (size_t i = 1; i < t->nmods; i++)
		if (t->mods[i].pub.index == t->mods[i - 1].pub.index)
			return sp_fail(err, "%s:%zu: module index %u appears twice (also line %zu)",
				       path, t->mods[i].line > t->mods[i - 1].line ? t->mods[i].line
				       : t->mods[i - 1].line, t->mods[i].pub.index,
				       t->mods[i].line > t->mods[i - 1].line ? t->mods[i - 1].line
				       : t->mods[i].line);
	return 0;
}

static module *module_by_index(an_trace *t, uint32_t index)
{
	size_t lo = 0, hi = t->nmods;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t->mods[mid].pub.index == index)
			return &t->mods[mid];
		if (t->mods[mid].pub.index < index)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* Module analyses                                                           */
/* ------------------------------------------------------------------------ */

/*
 * The analysis must be of the very module that was traced: first the
 * repository entry under the key meta names (the file may have been replaced
 * since), then the file at the path if its key is the traced one, analysed
 * if the repository lacks it -- and stored only if no other user could have
 * written the file (codeanalysis/trust.c): a trace directory is anyone's to
 * make, and its meta may name a file built to carry a build-id of root's
 * programs.  An entry the agent made inside the program has no source
 * lines (lines_pending): ca_repo_get reads them from the file, if it is
 * still the traced module, and replaces the entry; else the entry serves
 * without them.
 */
static void load_module(an_trace *t, module *m, const char *repo)
{
	ca_options opt = { 0 };
	ca_module *ca = NULL;
	sp_err e = { "" };
	char key[160];
	int from_repo = 0, rc = ca_repo_load(repo, m->pub.key, &ca, &e);

	if (rc == 0 && ca_module_lines_pending(ca)) {
		ca_module *full = NULL;

		if (ca_module_key_of(m->pub.path, key, sizeof key, &e) == 0 &&
		    strcmp(key, m->pub.key) == 0 &&
		    ca_repo_get(repo, m->pub.path, &opt, &full, NULL, &e) == 0) {
			ca_module_free(ca);
			ca = full;
		}
	}
	if (rc == 0) {
		m->ca = ca;
		m->pub.ca = ca;
		return;
	}
	if (rc < 0)
		warn(t, "module %u %s: %s; analysing the file again", m->pub.index, m->pub.path,
		     e.msg);
	/* Not even analysed unless it carries the traced build-id. */
	if (ca_module_key_of(m->pub.path, key, sizeof key, &e) < 0) {
		warn(t, "module %u: %s; its functions are named by address", m->pub.index, e.msg);
		return;
	}
	if (strcmp(key, m->pub.key) != 0) {
		warn(t, "module %u %s: the file is not the traced module (key %s, the trace has "
		     "%s): it changed since the trace; its functions are named by address",
		     m->pub.index, m->pub.path, key, m->pub.key);
		return;
	}
	if (ca_repo_get(repo, m->pub.path, &opt, &ca, &from_repo, &e) < 0) {
		warn(t, "module %u: %s; its functions are named by address", m->pub.index, e.msg);
		return;
	}
	/* A file another user could have written names functions here, for
	 * this reader only: whoever reads the repository trusts its entries. */
	if (!from_repo && ca_module_untrusted(ca)[0])
		warn(t, "module %u %s: analysed for this command only, not stored in the "
		     "code-analysis repository: the file is %s", m->pub.index, m->pub.path,
		     ca_module_untrusted(ca));
	m->ca = ca;
	m->pub.ca = ca;
}

/* ------------------------------------------------------------------------ */
/* C++ names                                                                 */
/* ------------------------------------------------------------------------ */

/* The C++ runtime's demangler (libstdc++, <cxxabi.h>; linked through
 * meson): a malloc'ed string, or NULL with *status < 0. */
extern char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

/* Longer symbols are shown as they are: the demangler keeps its work space
 * on the stack, tens of bytes per character of the symbol.  (It also gives
 * up, and the symbol is shown as it is, on names nested some 500 deep.) */
#define DEMANGLE_MAX_SYMBOL 16384

static int starts(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int is_ident(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* p at `open`: past its matching `close`, NULL if there is none. */
static const char *skip_group(const char *p, char open, char close)
{
	int depth = 0;

	for (; *p; p++) {
		if (*p == open)
			depth++;
		else if (*p == close && --depth == 0)
			return p + 1;
	}
	return NULL;
}

/* p at the '<' of template arguments: past the matching '>'.  An argument
 * may be an expression; the demangler puts one holding '<' or '>' in
 * parentheses ("Box<((1)>(2))>"), so angle brackets count outside them only. */
static const char *skip_template_args(const char *p)
{
	int angles = 0, parens = 0;

	for (; *p; p++) {
		if (*p == '(')
			parens++;
		else if (*p == ')')
			parens--;
		else if (parens == 0 && *p == '<')
			angles++;
		else if (parens == 0 && *p == '>' && --angles == 0)
			return p + 1;
	}
	return NULL;
}

/* p just after a parameter list: past the qualifiers that may follow it
 * (" const", " &&", " noexcept" ...).  NULL if malformed. */
static const char *skip_qualifiers(const char *p)
{
	static const char *const quals[] = {
		" const", " volatile", " restrict", " &&", " &", " noexcept", " throw",
		" transaction_safe",
	};

	for (;;) {
		size_t i, n = 0;

		for (i = 0; i < sizeof quals / sizeof *quals; i++) {
			n = strlen(quals[i]);
			if (strncmp(p, quals[i], n) == 0 && (quals[i][n - 1] == '&' || !is_ident(p[n])))
				break;
		}
		if (i == sizeof quals / sizeof *quals)
			return p;
		p += n;
		if (*p == '(' && (quals[i][1] == 'n' || quals[i][1] == 't') &&
		    !(p = skip_group(p, '(', ')')))
			return NULL;
	}
}

/*
 * What follows the ')' of a parameter list at p, after its qualifiers: the
 * end of the name (these were the function's parameters), "::" (they were
 * those of a function enclosing a local name: "outer(int)::Local::f()"),
 * or ')' (the function's, inside a declarator: "int (*f(char))(int)").
 */
enum after_params { AFTER_OTHER, AFTER_END, AFTER_SCOPE, AFTER_DECLARATOR };

static enum after_params after_params(const char *p)
{
	p = skip_qualifiers(p);
	if (!p)
		return AFTER_OTHER;
	if (!*p || starts(p, " [clone "))
		return AFTER_END;
	if (starts(p, "::"))
		return AFTER_SCOPE;
	return *p == ')' ? AFTER_DECLARATOR : AFTER_OTHER;
}

/*
 * After "operator" at p: its token, appended to out[*n], and p past it.
 * The token is punctuation ("<<", "()", "->*"), a word (" new[]"), a
 * literal suffix ("\"\" _km") or, for a conversion operator, a type (" int",
 * " char const*") that runs up to the empty parameter list ending the name.
 * NULL when the name does not parse.
 */
static const char *copy_operator(const char *p, char *out, size_t *n)
{
	static const char *const ops[] = {   /* longest first */
		"->*", "<=>", "<<=", ">>=", "()", "[]", "->", "++", "--", "<<", ">>", "<=",
		">=", "==", "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
		"+", "-", "*", "/", "%", "^", "&", "|", "~", "!", "=", "<", ">", ",",
		" new[]", " delete[]", " new", " delete", " co_await",
	};
	const char *q;

	for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
		size_t len = strlen(ops[i]);

		if (strncmp(p, ops[i], len) != 0 || (is_ident(ops[i][len - 1]) && is_ident(p[len])))
			continue;
		memcpy(out + *n, p, len);
		*n += len;
		p += len;
		/* "operator<< <char>(...)": the space keeps "<<<" apart. */
		return starts(p, " <") ? p + 1 : p;
	}
	if (*p == '"') {
		q = strchr(p, '(');
	} else if (*p == ' ') {
		for (q = p; q && *q; ) {
			if (*q == '<') {
				q = skip_template_args(q);
			} else if (*q == '(') {
				const char *r = skip_group(q, '(', ')');

				if (r == q + 2 && after_params(r) != AFTER_OTHER)
					break;
				q = r;
			} else {
				q++;
			}
		}
	} else {
		return NULL;
	}
	if (!q)
		return NULL;
	memcpy(out + *n, p, (size_t)(q - p));
	*n += (size_t)(q - p);
	return q;
}

/*
 * uftrace's "simple" form of a demangled function name: the qualified name
 * alone.  Template arguments, ABI tags and parameter lists are dropped,
 * also those of an enclosing function ("outer(int)::Local::f(int)" is
 * "outer::Local::f"), and so is whatever precedes the name after a space
 * (the return type of a template function, "non-virtual thunk to").
 * Lambdas and unnamed types keep their "{lambda(int)#1}".  A name this does
 * not parse is returned whole.  NULL when out of memory.
 */
static char *simple_name(const char *d)
{
	char *out = malloc(strlen(d) + 1);
	const char *p = d;
	size_t n = 0;
	int declarator = 0;

	if (!out)
		return NULL;
	while (p && *p) {
		const char *q;

		if (starts(p, "(anonymous namespace)")) {
			memcpy(out + n, p, 21);
			n += 21;
			p += 21;
		} else if (starts(p, "operator") && !is_ident(p[8]) && (p == d || !is_ident(p[-1]))) {
			memcpy(out + n, p, 8);
			n += 8;
			p = copy_operator(p + 8, out, &n);
		} else if (*p == '{') {
			if ((q = skip_group(p, '{', '}'))) {
				memcpy(out + n, p, (size_t)(q - p));
				n += (size_t)(q - p);
			}
			p = q;
		} else if (*p == '[') {
			p = skip_group(p, '[', ']');
		} else if (*p == '<') {
			p = skip_template_args(p);
		} else if (n == 0 && starts(p, "decltype (")) {
			p = skip_group(p + 9, '(', ')');   /* a return type */
		} else if (*p == '(' && n == 0) {
			/* A declarator around the name: "int (*f(char))(int)". */
			for (p++; *p == '*' || *p == '&'; p++)
				;
			declarator = 1;
		} else if (*p == '(') {
			enum after_params a = (q = skip_group(p, '(', ')')) ? after_params(q)
					      : AFTER_OTHER;

			if (a == AFTER_END || (a == AFTER_DECLARATOR && declarator))
				break;
			p = a == AFTER_SCOPE ? skip_qualifiers(q) : NULL;
		} else if (*p == ' ') {
			n = 0;   /* what came before was a return type */
			p++;
		} else {
			out[n++] = *p++;
		}
	}
	if (!p || n == 0) {
		free(out);
		return strdup(d);
	}
	out[n] = '\0';
	return out;
}

int an_demangle_style(const char *name)
{
	if (strcmp(name, "simple") == 0)
		return AN_DEMANGLE_SIMPLE;
	if (strcmp(name, "full") == 0)
		return AN_DEMANGLE_FULL;
	if (strcmp(name, "no") == 0)
		return AN_DEMANGLE_NO;
	return -1;
}

/* __cxa_demangle of the first len characters of sym; NULL if they are not
 * a mangled name (or out of memory). */
static char *demangle_prefix(const char *sym, size_t len)
{
	char *head = strndup(sym, len), *d;
	int status = 0;

	if (!head)
		return NULL;
	d = __cxa_demangle(head, NULL, NULL, &status);
	free(head);
	return status == 0 ? d : NULL;
}

/*
 * The runtime demangles a symbol, not a PLT entry's "sym@plt" or a versioned
 * "sym@@VER": the part before '@' is demangled and the rest kept.  It also
 * knows clone suffixes (".cold" becomes " [clone .cold]"), which the full
 * form keeps that way; the simple form demangles the part before the first
 * '.' and keeps ".cold" as it is.
 */
char *an_demangle(const char *sym, int style)
{
	size_t at = strcspn(sym, "@"), dot = strcspn(sym, ".@");
	const char *suffix;
	char *d = NULL, *name, *out;

	if (style == AN_DEMANGLE_NO || !starts(sym, "_Z") || at > DEMANGLE_MAX_SYMBOL)
		return strdup(sym);
	if (style == AN_DEMANGLE_FULL && dot < at && (d = demangle_prefix(sym, at)))
		suffix = sym + at;
	else if ((d = demangle_prefix(sym, dot)))
		suffix = sym + dot;
	else
		return strdup(sym);
	name = style == AN_DEMANGLE_SIMPLE ? simple_name(d) : d;
	if (name != d)
		free(d);
	if (!name || !*suffix)
		return name;
	if (asprintf(&out, "%s%s", name, suffix) < 0)
		out = NULL;
	free(name);
	return out;
}

/* The name of function fi of module m as the trace shows it, demangled once
 * per function; NULL when out of memory. */
static const char *symbol_name(an_trace *t, const module *m, uint32_t fi)
{
	size_t nf;
	const char *sym = ca_str(m->ca, ca_module_funcs(m->ca, &nf)[fi].name);
	map_slot *slot;
	char *name;

	if (t->demangle == AN_DEMANGLE_NO || !starts(sym, "_Z"))
		return sym;
	if (!(slot = map_get(&t->demangled_ids, m->pub.index, fi)))
		return NULL;
	if (slot->val)
		return t->demangled[slot->val - 1];
	if (sp_grow((void **)&t->demangled, &t->capdemangled, t->ndemangled + 1,
		    sizeof *t->demangled) ||
	    !(name = an_demangle(sym, t->demangle)))
		return NULL;
	t->demangled[t->ndemangled++] = name;
	slot->val = (uint32_t)t->ndemangled;
	return name;
}

/* ------------------------------------------------------------------------ */
/* Functions and sites                                                       */
/* ------------------------------------------------------------------------ */

static void source_line(const ca_module *ca, uint64_t addr, char *buf, size_t len)
{
	const ca_line *l = ca ? ca_line_at(ca, addr) : NULL;

	if (l)
		snprintf(buf, len, "%s:%u", ca_str(ca, l->file), l->line);
	else
		buf[0] = '\0';
}

/* Append a function; its index, or AN_NONE when out of memory. */
static uint32_t func_add(an_trace *t, const char *name, const char *src, uint32_t module,
			 uint64_t addr)
{
	an_func *f;

	if (t->nfuncs >= AN_NONE ||
	    sp_grow((void **)&t->funcs, &t->capfuncs, t->nfuncs + 1, sizeof *t->funcs))
		return AN_NONE;
	f = malloc(sizeof *f);
	if (!f)
		return AN_NONE;
	f->name = strdup(name);
	f->src = strdup(src);
	f->module = module;
	f->addr = addr;
	f->signature = 0;
	if (!f->name || !f->src) {
		free((char *)f->name);
		free((char *)f->src);
		free(f);
		return AN_NONE;
	}
	t->funcs[t->nfuncs] = f;
	return (uint32_t)t->nfuncs++;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

/* The function at link-time `addr` of module `index`, named as trace_read.h
 * says.  AN_NONE when out of memory. */
static uint32_t func_at(an_trace *t, uint32_t index, uint64_t addr)
{
	map_slot *slot = map_get(&t->func_ids, index, addr);
	module *m = module_by_index(t, index);
	char *name = NULL, src[4200] = "";
	const char *sym;
	int n = 0, signature = 0;

	if (!slot)
		return AN_NONE;
	if (slot->val)
		return slot->val - 1;
	if (!m) {
		n = asprintf(&name, "?module%u+0x%" PRIx64, index, addr);
	} else if (!m->ca) {
		n = asprintf(&name, "%s+0x%" PRIx64, base_name(m->pub.path), addr);
	} else {
		size_t nf;
		const ca_func *f = ca_module_funcs(m->ca, &nf);
		uint32_t fi = ca_func_at(m->ca, addr);

		if (fi == CA_NONE)
			n = asprintf(&name, "sub_%" PRIx64, addr);
		else if (!(sym = symbol_name(t, m, fi)))
			return AN_NONE;
		else if (f[fi].addr == addr) {
			n = (name = strdup(sym)) ? 0 : -1;
			/* The runtime's demangling of a function always ends
			 * with its parameters (and qualifiers). */
			signature = t->demangle == AN_DEMANGLE_FULL &&
				    strcmp(sym, ca_str(m->ca, f[fi].name)) != 0;
		} else
			n = asprintf(&name, "%s+0x%" PRIx64, sym, addr - f[fi].addr);
		source_line(m->ca, addr, src, sizeof src);
	}
	if (n < 0)
		return AN_NONE;
	uint32_t i = func_add(t, name, src, index, addr);
	free(name);
	if (i != AN_NONE) {
		t->funcs[i]->signature = signature;
		slot->val = i + 1;
	}
	return i;
}

static int name_site(an_trace *t, uint32_t id, sp_err *err)
{
	const trace_site *s = &t->raw_sites[id];
	an_site_info *info = &t->sites[id];
	module *cm = module_by_index(t, s->caller_module);
	char src[4200] = "";
	int root = (s->flags & TRACE_SITE_ROOT) != 0;

	info->addr = s->site_addr;
	info->kind = s->kind;
	info->flags = s->flags;
	info->valid = 1;
	info->caller = root ? AN_NONE : func_at(t, s->caller_module, s->caller_func);
	if (s->callee_module != UINT32_MAX) {
		info->callee = func_at(t, s->callee_module, s->callee_func);
	} else if (root) {
		info->callee = func_at(t, s->caller_module, s->caller_func);
	} else {
		uint32_t caller = func_at(t, s->caller_module, s->caller_func);
		char *name;

		if (asprintf(&name, "<indirect@%s+0x%" PRIx64 ">",
			     caller == AN_NONE ? "?" : t->funcs[caller]->name,
			     s->site_addr - s->caller_func) < 0)
			return sp_fail(err, "out of memory naming %zu sites", t->nsites);
		info->callee = func_add(t, name, "", AN_NONE, 0);
		free(name);
	}
	if (!root && cm && cm->ca)
		source_line(cm->ca, s->site_addr, src, sizeof src);
	info->src = strdup(src);
	if (info->callee == AN_NONE || (!root && info->caller == AN_NONE) || !info->src)
		return sp_fail(err, "out of memory naming %zu sites", t->nsites);
	return 0;
}

static int read_sites(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], *buf;
	size_t len;

	snprintf(path, sizeof path, "%s/sites", t->dir);
	if (slurp(path, (size_t)(TRACE_ID_MAX + 1) * sizeof(trace_site), &buf, &len) < 0)
		return sp_fail(err, "%s: cannot read: %s%s", path, errno_text(errno),
			       errno == ENOENT ? " (the agent writes it with the first "
			       "instrumented site; without it no call can be named)" : "");
	if (len % sizeof(trace_site))
		warn(t, "%s: %zu bytes after the last whole site record ignored (a record the "
		     "agent was writing)", path, len % sizeof(trace_site));
	t->raw_sites = (trace_site *)buf;
	t->nsites = len / sizeof(trace_site);
	t->sites = calloc(t->nsites ? t->nsites : 1, sizeof *t->sites);
	if (!t->sites)
		return sp_fail(err, "out of memory");
	return 0;
}

/* The channels file (message events).  An older agent wrote none: no
 * channel is known then, and messages name channel ids only. */
static int read_channels(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], *buf;
	size_t len;
	uint32_t rec = 0;

	snprintf(path, sizeof path, "%s/channels", t->dir);
	if (slurp(path, (size_t)(1u << 22) * sizeof(trace_channel), &buf, &len) < 0) {
		if (errno == ENOENT)
			return 0;
		return sp_fail(err, "%s: cannot read: %s", path, errno_text(errno));
	}
	if (len >= 8)
		memcpy(&rec, buf + 4, 4);       /* record 0's pid: the record size */
	if (rec == 0)
		rec = TRACE_CHANNEL_V1_SIZE;
	if (rec < TRACE_CHANNEL_V1_SIZE || rec > 4096 || rec % 8) {
		free(buf);
		return sp_fail(err, "%s: a record size of %u bytes in record 0; not a channels file "
			       "of this sptrace (records of %zu bytes)", path, rec,
			       sizeof(trace_channel));
	}
	if (len % rec)
		warn(t, "%s: %zu bytes after the last whole channel record ignored (a record the "
		     "agent was writing)", path, len % rec);
	t->nchans = len / rec;
	if (rec != sizeof(trace_channel)) {
		/* another layout: each record copied, later fields zero, unknown ones cut */
		trace_channel *c = calloc(t->nchans ? t->nchans : 1, sizeof *c);

		if (!c) {
			free(buf);
			return sp_fail(err, "out of memory");
		}
		for (size_t i = 0; i < t->nchans; i++)
			memcpy(&c[i], buf + i * rec, rec < sizeof *c ? rec : sizeof *c);
		free(buf);
		buf = (char *)c;
	}
	t->chans = (trace_channel *)buf;
	return 0;
}

const trace_channel *an_channel(const an_trace *t, uint32_t id)
{
	if (id == 0 || id >= t->nchans || t->chans[id].proto == 0 ||
	    t->chans[id].proto > TRACE_PROTO_MAX)
		return NULL;
	return &t->chans[id];
}

size_t an_nchannels(const an_trace *t)
{
	return t->nchans;
}

const an_msg *an_trace_msg(const an_trace *t, uint32_t i)
{
	return i < t->nmsgs ? &t->msgs[i] : NULL;
}

static const char *proto_name(uint32_t p)
{
	switch (p) {
	case TRACE_PROTO_TCP: return "tcp";
	case TRACE_PROTO_UDP: return "udp";
	case TRACE_PROTO_UNIX_STREAM: return "unix";
	case TRACE_PROTO_UNIX_DGRAM: return "unix-dgram";
	case TRACE_PROTO_UNIX_SEQPACKET: return "unix-seqpacket";
	case TRACE_PROTO_PIPE: return "pipe";
	default: return "?";
	}
}

static void addr_text(const trace_channel *c, int local, char *buf, size_t len)
{
	const uint8_t *a = local ? c->local_addr : c->peer_addr;
	unsigned port = local ? c->local_port : c->peer_port;
	const char *path = local ? c->local_path : c->peer_path;
	char ip[INET6_ADDRSTRLEN];

	if (!local && !(c->flags & TRACE_CHAN_PEER)) {
		snprintf(buf, len, "?");
	} else if (c->family == AF_INET) {
		inet_ntop(AF_INET, a, ip, sizeof ip);
		snprintf(buf, len, "%s:%u", ip, port);
	} else if (c->family == AF_INET6) {
		inet_ntop(AF_INET6, a, ip, sizeof ip);
		snprintf(buf, len, "[%s]:%u", ip, port);
	} else {
		snprintf(buf, len, "%.31s", path[0] ? path : "(unnamed)");
	}
}

char *an_channel_text(const an_trace *t, uint32_t id, int recv, char *buf, size_t len)
{
	const trace_channel *c = an_channel(t, id);
	char l[80], p[80];

	if (!c) {
		snprintf(buf, len, "channel %u", id);
		return buf;
	}
	if (c->proto == TRACE_PROTO_PIPE) {
		snprintf(buf, len, "pipe %" PRIu64, c->inode);
		return buf;
	}
	addr_text(c, 1, l, sizeof l);
	addr_text(c, 0, p, sizeof p);
	if (c->family == AF_UNIX && (c->flags & TRACE_CHAN_PEER_INODE) && !c->local_path[0] &&
	    !c->peer_path[0])
		snprintf(buf, len, "%s %" PRIu64 " %s %" PRIu64, proto_name(c->proto), c->inode,
			 recv ? "<-" : "->", c->peer_inode);
	else if (c->family == AF_UNIX && (c->flags & TRACE_CHAN_PEER_INODE))
		snprintf(buf, len, "%s %" PRIu64 " %s %s %s %" PRIu64, proto_name(c->proto),
			 c->inode, l, recv ? "<-" : "->", p, c->peer_inode);
	else if (c->family == AF_UNIX && !c->local_path[0] && !c->peer_path[0])
		snprintf(buf, len, "%s %" PRIu64, proto_name(c->proto), c->inode);
	else if (c->family == AF_UNIX)
		snprintf(buf, len, "%s %" PRIu64 " %s %s %s", proto_name(c->proto), c->inode, l,
			 recv ? "<-" : "->", p);
	else
		snprintf(buf, len, "%s %s %s %s", proto_name(c->proto), l, recv ? "<-" : "->", p);
	return buf;
}

static const char *const call_names[] = {
	[TRACE_CALL_SEND] = "send", [TRACE_CALL_SENDTO] = "sendto",
	[TRACE_CALL_SENDMSG] = "sendmsg", [TRACE_CALL_SENDMMSG] = "sendmmsg",
	[TRACE_CALL_WRITE] = "write", [TRACE_CALL_WRITEV] = "writev",
	[TRACE_CALL_RECV] = "recv", [TRACE_CALL_RECVFROM] = "recvfrom",
	[TRACE_CALL_RECVMSG] = "recvmsg", [TRACE_CALL_RECVMMSG] = "recvmmsg",
	[TRACE_CALL_READ] = "read", [TRACE_CALL_READV] = "readv",
	[TRACE_CALL_SPLICE] = "splice", [TRACE_CALL_SENDFILE] = "sendfile",
	[TRACE_CALL_SHUTDOWN] = "shutdown", [TRACE_CALL_EOF] = "eof",
};

char *an_msg_text(const an_trace *t, const an_msg *m, char *buf, size_t len)
{
	char ch[300];
	const char *call = m->call <= TRACE_CALL_MAX && call_names[m->call] ? call_names[m->call]
			   : m->recv ? "recv?" : "send?";

	an_channel_text(t, m->chan, m->recv, ch, sizeof ch);
	if (m->flags & TRACE_MSG_DGRAM)
		snprintf(buf, len, "%s(%s, datagram %" PRIu64 ", %" PRIu64 " bytes)", call, ch,
			 m->off, m->len);
	else if (m->len == 0)
		snprintf(buf, len, "%s(%s, at byte %" PRIu64 ")", call, ch, m->off);
	else
		snprintf(buf, len, "%s(%s, bytes %" PRIu64 "..%" PRIu64 ")", call, ch, m->off,
			 m->off + m->len);
	return buf;
}

/* Name every site of the file (after the modules are loaded).  A record of
 * zeros is a hole the agent never wrote: such ids stay invalid. */
static int name_sites(an_trace *t, sp_err *err)
{
	static const trace_site zero;
	size_t nbadmod = 0;
	uint32_t first_badmod = 0;
	map same = { 0 };

	for (size_t id = 1; id < t->nsites; id++) {
		const trace_site *s = &t->raw_sites[id];
		map_slot *slot;

		if (memcmp(s, &zero, sizeof zero) == 0)
			continue;
		/* Ids of one call instruction share a canonical id (roots never do). */
		slot = (s->flags & TRACE_SITE_ROOT) ? NULL :
		       map_get(&same, s->caller_module + 1, s->site_addr);
		if (!(s->flags & TRACE_SITE_ROOT) && !slot) {
			map_free(&same);
			return sp_fail(err, "out of memory");
		}
		if (slot && !slot->val)
			slot->val = (uint32_t)id;
		t->sites[id].canon = slot ? slot->val : (uint32_t)id;
		if (!module_by_index(t, s->caller_module) ||
		    (s->callee_module != UINT32_MAX && !module_by_index(t, s->callee_module))) {
			if (!nbadmod++)
				first_badmod = (uint32_t)id;
		}
		if (name_site(t, (uint32_t)id, err)) {
			map_free(&same);
			return -1;
		}
	}
	map_free(&same);
	if (nbadmod)
		warn(t, "%s/sites: %zu sites (the first: id %u) name a module meta has no "
		     "'module' line for; their functions are shown as ?module<N>+0x<addr>",
		     t->dir, nbadmod, first_badmod);
	return 0;
}

static an_site_info *bad_site_new(an_trace *t, const char *name)
{
	an_site_info *info = calloc(1, sizeof *info);

	if (!info)
		return NULL;
	info->callee = func_add(t, name, "", AN_NONE, 0);
	info->caller = AN_NONE;
	info->src = "";
	if (info->callee == AN_NONE) {
		free(info);
		return NULL;
	}
	return info;
}

const an_site_info *an_site(an_trace *t, uint32_t id)
{
	static an_site_info oom = { AN_NONE, AN_NONE, "", 0, 0, 0, 0, 0 };
	char name[32];
	an_site_info *info;
	map_slot *slot;

	if (id > 0 && id < t->nsites && t->sites[id].valid)
		return &t->sites[id];
	slot = map_find(&t->bad_ids, id, 0);
	if (slot)
		return t->bad[slot->val - 1];
	if (t->nbad >= MAX_BAD_SITES) {
		if (!t->bad_many)
			t->bad_many = bad_site_new(t, "?site");
		return t->bad_many ? t->bad_many : &oom;
	}
	if (sp_grow((void **)&t->bad, &t->capbad, t->nbad + 1, sizeof *t->bad) ||
	    !(slot = map_get(&t->bad_ids, id, 0)))
		return &oom;
	snprintf(name, sizeof name, "?site %u", id);
	if (!(info = bad_site_new(t, name)))
		return &oom;
	t->bad[t->nbad++] = info;
	slot->val = (uint32_t)t->nbad;
	return info;
}

int an_site_is_tail(const an_site_info *s)
{
	return s->kind == CA_SITE_TAIL_DIRECT || s->kind == CA_SITE_TAIL_INDIRECT;
}

const char *an_event_name(uint32_t id, char *buf, size_t len)
{
	switch (id) {
	case TRACE_EV_ACTIVATE: return "activate";
	case TRACE_EV_DEACTIVATE: return "deactivate";
	case TRACE_EV_THREAD_EXIT: return "thread exit";
	case TRACE_EV_SIGNAL: return "signal";
	case TRACE_EV_ACCEPT: return "accept";
	case TRACE_EV_RECV: return "recv";
	case TRACE_EV_CTX_SAVE: return "context saved";
	case TRACE_EV_CTX_LOAD: return "context switch";
	case TRACE_EV_CTX_NEW: return "context made";
	case TRACE_EV_MSG_SEND: return "message sent";
	case TRACE_EV_MSG_RECV: return "message received";
	case TRACE_EV_MSG_DATA: return "message data";
	}
	snprintf(buf, len, "event %u", id);
	return buf;
}

/* ------------------------------------------------------------------------ */
/* Ring headers                                                              */
/* ------------------------------------------------------------------------ */

static int read_full(int fd, void *buf, size_t len, off_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t r = pread(fd, (char *)buf + got, len - got, off + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0) {
			errno = EIO;   /* shrank since fstat */
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

/* Slot i of the ring is all zero: never written (the agent writes no zero
 * record: kind ENTRY needs a site id, and id 0 is none). */
static int slot_zero(int fd, const trace_ring_header *h, uint64_t i)
{
	uint64_t r;

	return read_full(fd, &r, 8, (off_t)(h->header_size + i * 8)) == 0 && r == 0;
}

/*
 * The count the ring's records bear out.  The agent takes slots in order, so
 * the newest records are written: a count whose newest slot and the one
 * before are both zero says more than was ever written -- a corrupt count
 * (a flipped bit made a 4-record ring claim 131076, and a replay of 535 MB
 * of "?site 0").  A single zero is allowed: a crash between taking a slot and
 * filling it leaves that hole.  A ring that came round (count > capacity)
 * has written every slot, so there its last two slots are the test.  Then
 * the count is one past the last slot written.  Reads only two slots unless
 * the count is wrong.
 */
static uint64_t ring_written(int fd, const trace_ring_header *h)
{
	uint64_t top = h->count > h->capacity ? h->capacity : h->count, buf[1024];

	if (top == 0 || !slot_zero(fd, h, top - 1) || (top > 1 && !slot_zero(fd, h, top - 2)))
		return h->count;
	while (top > 0) {
		uint64_t n = top < 1024 ? top : 1024;

		if (read_full(fd, buf, n * 8, (off_t)(h->header_size + (top - n) * 8)) < 0)
			return h->count;        /* shrank: the caller's read says so */
		for (uint64_t i = n; i > 0; i--)
			if (buf[i - 1])
				return top - n + i;
		top -= n;
	}
	return 0;
}

/* Open a ring file and check its header against its size.  -2: an empty
 * ring (the agent was making it when the process died), to be skipped.
 * *said: the header's count when the records show it wrong (h->count is
 * then the count they bear out, see ring_written), else equal to it. */
static int ring_open(const char *path, trace_ring_header *h, uint64_t *said, sp_err *err)
{
	struct stat st;
	int fd = sp_open_regular(path, 1);
	uint64_t need;

	if (fd < 0)
		return sp_fail(err, "%s: cannot open: %s", path, sp_open_why(errno));
	if (fstat(fd, &st) < 0) {
		int e = errno;

		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(e));
	}
	if (st.st_size == 0) {
		close(fd);
		return -2;      /* made, never sized: the process died right there */
	}
	if ((uint64_t)st.st_size < RING_FIXED_HEADER) {
		close(fd);
		return sp_fail(err, "%s: truncated: %lld bytes, shorter than a ring header (%zu)",
			       path, (long long)st.st_size, (size_t)RING_FIXED_HEADER);
	}
	memset(h, 0, sizeof *h);
	if (read_full(fd, h, RING_FIXED_HEADER, 0) < 0) {
		int e = errno;
		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(e));
	}
	if (h->magic == 0 && h->count == 0) {
		close(fd);
		return -2;      /* sized, header not yet written: likewise */
	}
	if (h->magic != TRACE_RING_MAGIC) {
		close(fd);
		return sp_fail(err, "%s: not an sptrace ring (magic %#" PRIx64 ", expected %#llx)",
			       path, h->magic, TRACE_RING_MAGIC);
	}
	if (h->version != TRACE_FORMAT_VERSION) {
		close(fd);
		return sp_fail(err, "%s: ring format version %u; this sptrace reads version %d",
			       path, h->version, TRACE_FORMAT_VERSION);
	}
	if (h->header_size < RING_FIXED_HEADER || h->header_size % 8 ||
	    h->header_size > RING_MAX_HEADER) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: header size %u", path, h->header_size);
	}
	if (h->capacity == 0 || (h->capacity & (h->capacity - 1)) ||
	    h->capacity > RING_MAX_CAPACITY) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: capacity %" PRIu64 " is not a power of "
			       "two up to 2^36", path, h->capacity);
	}
	if (h->mask != h->capacity - 1) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: mask %#" PRIx64 " does not match "
			       "capacity %" PRIu64, path, h->mask, h->capacity);
	}
	if (h->count > RING_MAX_COUNT) {
		close(fd);
		return sp_fail(err, "%s: corrupt header: write count %" PRIu64 " is implausible "
			       "(over 2^56 records)", path, h->count);
	}
	need = h->header_size + h->capacity * 8;
	if ((uint64_t)st.st_size < need) {
		close(fd);
		return sp_fail(err, "%s: truncated: %lld bytes, but its header says %" PRIu64
			       " records (%" PRIu64 " bytes with the header)", path,
			       (long long)st.st_size, h->capacity, need);
	}
	*said = h->count;
	h->count = ring_written(fd, h);
	return fd;
}

static int is_sync(uint64_t r)
{
	return trace_rec_kind(r) == TRACE_SYNC && (r >> 28) == 0;
}

/* A position in a thread's records where the TSC's high bits are known. */
struct reset {
	size_t pos;
	uint64_t epoch;
};

static int add_reset(struct reset **r, size_t *n, size_t pos, uint64_t epoch)
{
	struct reset *nr = realloc(*r, (*n + 1) * sizeof *nr);

	if (!nr)
		return -1;
	nr[(*n)++] = (struct reset){ pos, epoch };
	*r = nr;
	return 0;
}

/* The high bits in force at the first of n records that follow a gap:
 * those of their first SYNC minus one (a SYNC marks a change), else
 * `fallback`.  *first_sync: that SYNC's index, n if none. */
static uint64_t epoch_after_gap(const uint64_t *recs, size_t n, uint64_t fallback,
				size_t *first_sync)
{
	for (size_t i = 0; i < n; i++)
		if (is_sync(recs[i])) {
			uint64_t hi = trace_sync_high(recs[i]);

			*first_sync = i;
			return hi ? hi - 1 : 0;
		}
	*first_sync = n;
	return fallback;
}

/*
 * seg.<tid> beside ring.<tid> (trace_format.h): the chunks `sptrace run`
 * drained.  With want_recs 0 only the counts: records kept, and the index
 * after the last chunk.  A chunk that is not whole (a crash while it was
 * written, a damaged file) ends the reading: the records after it are
 * counted lost.
 */
typedef struct seg_data {
	uint64_t *recs;
	size_t n;                /* records kept */
	uint64_t end;            /* index after the last chunk's last record */
	struct reset *resets;    /* one per chunk after a gap */
	size_t nresets;
} seg_data;

static void seg_path(const char *ring_path, char *out, size_t len)
{
	const char *base = strrchr(ring_path, '/');

	base = base ? base + 1 : ring_path;
	snprintf(out, len, "%.*sseg.%s", (int)(base - ring_path), ring_path, base + 5);
}

static int seg_read(const char *ring_path, seg_data *sd, int want_recs, sp_err *err)
{
	char path[PATH_MAX];
	trace_seg_chunk ch;
	struct stat st;
	off_t off = 0;
	int fd;

	memset(sd, 0, sizeof *sd);
	seg_path(ring_path, path, sizeof path);
	fd = sp_open_regular(path, 1);
	if (fd < 0)
		return errno == ENOENT ? 0 : sp_fail(err, "%s: cannot open: %s", path,
						     sp_open_why(errno));
	if (fstat(fd, &st) < 0) {
		close(fd);
		return sp_fail(err, "%s: cannot read: %s", path, strerror(errno));
	}
	if (want_recs && !(sd->recs = malloc(st.st_size > 8 ? (size_t)st.st_size : 8)))
		goto fail;
	while (off + (off_t)sizeof ch <= st.st_size &&
	       read_full(fd, &ch, sizeof ch, off) == 0 && ch.magic == TRACE_SEG_MAGIC &&
	       ch.first >= sd->end && ch.n > 0 &&
	       ch.n <= (uint64_t)(st.st_size - off - (off_t)sizeof ch) / 8) {
		if (want_recs) {
			uint64_t *recs = sd->recs + sd->n;
			size_t first_sync;

			if (read_full(fd, recs, ch.n * 8, off + (off_t)sizeof ch) < 0)
				goto fail;
			/* After a gap: the ring's last SYNC when it was drained,
			 * unless the chunk has a SYNC of its own. */
			if ((ch.first != sd->end || !sd->n) &&
			    add_reset(&sd->resets, &sd->nresets, sd->n,
				      epoch_after_gap(recs, ch.n, ch.epoch, &first_sync)))
				goto fail;
		}
		sd->n += ch.n;
		sd->end = ch.first + ch.n;
		off += (off_t)(sizeof ch + ch.n * 8);
	}
	close(fd);
	return 0;
fail:
	free(sd->resets);
	free(sd->recs);
	close(fd);
	return sp_fail(err, "%s: cannot read %lld bytes: %s", path, (long long)st.st_size,
		       errno ? strerror(errno) : "out of memory");
}

/* Records the thread lost: count minus what the chunks and the ring keep. */
static uint64_t thread_lost(const trace_ring_header *h, const seg_data *sd)
{
	uint64_t ring_from = h->count > h->capacity ? h->count - h->capacity : 0;

	if (sd->end > ring_from)
		ring_from = sd->end;
	if (ring_from > h->count)
		ring_from = h->count;
	return h->count - (h->count - ring_from) - sd->n;
}

static int thread_cmp(const void *a, const void *b)
{
	const an_thread *x = a, *y = b;

	return x->tid < y->tid ? -1 : x->tid > y->tid;
}

static int read_rings(an_trace *t, sp_err *err)
{
	DIR *d = opendir(t->dir);
	struct dirent *de;
	trace_ring_header h;
	char path[PATH_MAX];
	int rc = 0;

	if (!d)
		return sp_fail(err, "%s: cannot list: %s", t->dir, strerror(errno));
	while (rc == 0 && (de = readdir(d))) {
		uint64_t ftid, said;
		an_thread *th;
		int fd;

		if (strncmp(de->d_name, "ring.", 5) != 0)
			continue;
		if (parse_u64(de->d_name + 5, 10, &ftid) || ftid > UINT32_MAX) {
			warn(t, "%s/%s: ignored: not named ring.<tid>", t->dir, de->d_name);
			continue;
		}
		snprintf(path, sizeof path, "%s/%s", t->dir, de->d_name);
		fd = ring_open(path, &h, &said, err);
		if (fd == -2) {
			/* A header of zeros: the process died while the agent was
			 * making this ring, before its first record.  Nothing lost. */
			warn(t, "%s: ignored: an empty ring (the thread ended while its ring was being "
			     "made)", path);
			continue;
		}
		if (fd < 0) {
			rc = -1;
			break;
		}
		close(fd);
		if (said != h.count)
			warn(t, "%s: corrupt header: it counts %" PRIu64 " records written, but "
			     "only the first %" PRIu64 " slots of the ring were ever written: read "
			     "as %" PRIu64 " records", path, said, h.count, h.count);
		if (sp_grow((void **)&t->threads, &t->capthreads, t->nthreads + 1,
			    sizeof *t->threads)) {
			rc = sp_fail(err, "out of memory");
			break;
		}
		th = &t->threads[t->nthreads];
		memset(th, 0, sizeof *th);
		th->path = strdup(path);
		if (!th->path) {
			rc = sp_fail(err, "out of memory");
			break;
		}
		t->nthreads++;
		if (h.tid != ftid)
			warn(t, "%s: its header says thread %u; shown under that id", path, h.tid);
		th->tid = h.tid;
		th->pid = h.pid;
		for (int i = 0; i < 16 && h.thread_name[i]; i++)
			th->name[i] = isprint((unsigned char)h.thread_name[i]) ? h.thread_name[i] : '?';
		th->capacity = h.capacity;
		th->count = h.count;
		{
			seg_data sd;

			if (seg_read(path, &sd, 0, err) < 0) {
				rc = -1;
				break;
			}
			th->lost = thread_lost(&h, &sd);
			th->drained = sd.n;
		}
		th->flags = h.flags;
		th->start_tsc = h.start_tsc;
		th->epoch = h.epoch;
	}
	closedir(d);
	if (rc)
		return rc;
	if (t->nthreads)
		qsort(t->threads, t->nthreads, sizeof *t->threads, thread_cmp);
	/* Tracing began when the first ring was made; meta's clock reading if
	 * no ring says. */
	t->start_tsc = 0;
	for (size_t i = 0; i < t->nthreads; i++)
		if (t->threads[i].start_tsc &&
		    (!t->start_tsc || t->threads[i].start_tsc < t->start_tsc))
			t->start_tsc = t->threads[i].start_tsc;
	if (!t->start_tsc)
		t->start_tsc = t->tsc0;
	if (!t->nthreads)
		warn(t, "%s: no ring files: no thread wrote a record", t->dir);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                            */
/* ------------------------------------------------------------------------ */

int an_trace_open(const char *dir, an_trace **out, sp_err *err)
{
	return an_trace_open_opts(dir, NULL, out, err);
}

int an_trace_open_opts(const char *dir, const an_open_opts *opt, an_trace **out, sp_err *err)
{
	an_open_opts none = { 0 };
	an_trace *t;
	struct stat st;

	*out = NULL;
	if (!opt)
		opt = &none;
	if (strlen(dir) > PATH_MAX - 64)
		return sp_fail(err, "%.100s...: path too long", dir);
	if (stat(dir, &st) < 0)
		return sp_fail(err, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return sp_fail(err, "%s: not a directory (a trace is a directory holding meta, "
			       "sites and ring.<tid> files)", dir);
	if (opt->demangle < AN_DEMANGLE_SIMPLE || opt->demangle > AN_DEMANGLE_NO)
		return sp_fail(err, "demangle style %d is not an enum an_demangle", opt->demangle);
	t = calloc(1, sizeof *t);
	if (!t || !(t->dir = strdup(dir))) {
		free(t);
		return sp_fail(err, "out of memory");
	}
	t->demangle = opt->demangle;
	/* The files first, so that a damaged one is reported before the
	 * modules are analysed (seconds for a large library). */
	if (read_meta(t, err) < 0 || read_sites(t, err) < 0 || read_channels(t, err) < 0 ||
	    read_rings(t, err) < 0)
		goto fail;
	if (!opt->no_modules)
		for (size_t i = 0; i < t->nmods; i++)
			load_module(t, &t->mods[i], opt->repo);
	if (name_sites(t, err) < 0)
		goto fail;
	*out = t;
	return 0;
fail:
	an_trace_close(t);
	return -1;
}

void an_trace_close(an_trace *t)
{
	if (!t)
		return;
	free(t->meta_text);
	free(t->meta);
	for (size_t i = 0; i < t->nmods; i++)
		ca_module_free(t->mods[i].ca);
	free(t->mods);
	for (size_t i = 1; i < t->nsites; i++)
		free((char *)t->sites[i].src);
	free(t->sites);
	free(t->raw_sites);
	for (size_t i = 0; i < t->nbad; i++)
		free(t->bad[i]);
	free(t->bad);
	free(t->bad_many);
	map_free(&t->bad_ids);
	for (size_t i = 0; i < t->nfuncs; i++) {
		free((char *)t->funcs[i]->name);
		free((char *)t->funcs[i]->src);
		free(t->funcs[i]);
	}
	free(t->funcs);
	map_free(&t->func_ids);
	for (size_t i = 0; i < t->ndemangled; i++)
		free(t->demangled[i]);
	free(t->demangled);
	map_free(&t->demangled_ids);
	for (size_t i = 0; i < t->nthreads; i++)
		free((char *)t->threads[i].path);
	free(t->threads);
	for (size_t i = 0; i < t->nwarn; i++)
		free(t->warn[i]);
	free(t->warn);
	free(t->chans);
	free(t->msgs);
	free(t->dir);
	free(t);
}

/* ------------------------------------------------------------------------ */
/* Records                                                                   */
/* ------------------------------------------------------------------------ */

struct an_iter {
	uint64_t *raw;           /* the thread's records, oldest first */
	size_t n, pos;
	size_t first_sync;       /* after a gap: the first SYNC's position; records
				    before it have guessed high bits */
	size_t guess_from;       /* ... counted from here (n if no gap) */
	uint64_t high;           /* current TSC bits 38..63 */
	struct reset *resets;    /* where the high bits are known anew */
	size_t nresets, nextreset;
	const an_site_info *sites;
	size_t nsites;
	an_iter_stats st;
};

int an_iter_open(an_trace *t, const an_thread *th, an_iter **out, sp_err *err)
{
	trace_ring_header h;
	uint64_t *ring = NULL, ring_from, cap_n, said;
	size_t nring;
	seg_data sd;
	an_iter *it;
	int fd;

	*out = NULL;
	if (seg_read(th->path, &sd, 1, err) < 0)
		return -1;
	fd = ring_open(th->path, &h, &said, err);
	if (fd < 0) {
		free(sd.recs);
		free(sd.resets);
		return -1;
	}
	/* Counts from this read, not from an_trace_open: a live agent goes on. */
	cap_n = h.count < h.capacity ? h.count : h.capacity;
	ring_from = h.count - cap_n;
	if (sd.end > ring_from)
		ring_from = sd.end < h.count ? sd.end : h.count;
	nring = (size_t)(h.count - ring_from);
	it = calloc(1, sizeof *it);
	ring = malloc(cap_n ? cap_n * 8 : 8);
	if (it)
		it->raw = malloc((sd.n + nring) * 8 + 8);
	if (!it || !ring || !it->raw || read_full(fd, ring, cap_n * 8, h.header_size) < 0) {
		int e = errno;

		if (it)
			free(it->raw);
		free(it);
		free(ring);
		free(sd.recs);
		free(sd.resets);
		close(fd);
		return sp_fail(err, "%s: cannot read %" PRIu64 " records: %s", th->path,
			       cap_n, it && ring ? strerror(e) : "out of memory");
	}
	close(fd);
	if (sd.n)
		memcpy(it->raw, sd.recs, sd.n * 8);
	for (size_t i = 0; i < nring; i++)
		it->raw[sd.n + i] = ring[(ring_from + i) & (h.capacity - 1)];
	free(ring);
	free(sd.recs);
	it->n = sd.n + nring;
	it->resets = sd.resets;
	it->nresets = sd.nresets;
	it->sites = t->sites;
	it->nsites = t->nsites;
	it->first_sync = it->guess_from = it->n;
	/* The ring starts with a SYNC; start_tsc covers a writer that did not. */
	it->high = h.start_tsc >> TRACE_TSC_LOW_BITS;
	if (ring_from > 0 && !(sd.n && sd.end == ring_from) && nring) {
		/* The ring's part follows a gap: the header's last SYNC, unless
		 * the part has one of its own (records before it are guessed). */
		uint64_t epoch = epoch_after_gap(it->raw + sd.n, nring, h.epoch, &it->first_sync);

		it->first_sync += sd.n;
		it->guess_from = sd.n;
		if (add_reset(&it->resets, &it->nresets, sd.n, epoch)) {
			an_iter_close(it);
			return sp_fail(err, "%s: out of memory", th->path);
		}
	}
	*out = it;
	return 0;
}

int an_iter_next(an_iter *it, an_record *r)
{
	while (it->pos < it->n) {
		size_t i = it->pos++;
		uint64_t raw = it->raw[i];
		unsigned kind = trace_rec_kind(raw);

		while (it->nextreset < it->nresets && it->resets[it->nextreset].pos <= i)
			it->high = it->resets[it->nextreset++].epoch;

		if (kind == TRACE_SYNC) {
			if (is_sync(raw))
				it->high = trace_sync_high(raw);
			else
				it->st.nbad_syncs++;
			continue;
		}
		r->kind = kind;
		r->id = trace_rec_id(raw);
		r->key = 0;
		if (kind == TRACE_EVENT && r->id == TRACE_EV_MSG_DATA) {
			it->st.nstray_data++;      /* its head was overwritten */
			continue;
		}
		if (kind == TRACE_EVENT && trace_event_is_msg(r->id)) {
			uint64_t data[TRACE_MSG_NDATA];
			unsigned k;

			for (k = 0; k < TRACE_MSG_NDATA && i + 1 + k < it->n; k++) {
				uint64_t d = it->raw[i + 1 + k];

				if (trace_rec_kind(d) != TRACE_EVENT ||
				    trace_rec_id(d) != TRACE_EV_MSG_DATA)
					break;
				data[k] = trace_rec_tsc_low(d);
			}
			it->pos = i + 1 + k;
			if (k < TRACE_MSG_NDATA) {
				it->st.nbad_msgs++;        /* cut short: dropped */
				continue;
			}
			trace_msg_unpack(data, &r->msg.chan, &r->msg.call, &r->msg.flags,
					 &r->msg.off, &r->msg.len);
			r->msg.recv = r->id == TRACE_EV_MSG_RECV;
		}
		if (kind == TRACE_EVENT && trace_event_has_key(r->id)) {
			r->key = trace_rec_tsc_low(raw);
			r->tsc = it->st.last_tsc ? it->st.last_tsc : it->high << TRACE_TSC_LOW_BITS;
			it->st.nrecords++;
			return 1;
		}
		r->tsc = it->high << TRACE_TSC_LOW_BITS | trace_rec_tsc_low(raw);
		if (i >= it->guess_from && i < it->first_sync && it->first_sync < it->n)
			it->st.nguessed++;
		if (kind != TRACE_EVENT && (r->id >= it->nsites || !it->sites[r->id].valid))
			it->st.nbad_sites++;
		it->st.nrecords++;
		it->st.last_tsc = r->tsc;
		return 1;
	}
	return 0;
}

const an_iter_stats *an_iter_stats_get(const an_iter *it)
{
	return &it->st;
}

void an_iter_close(an_iter *it)
{
	if (!it)
		return;
	free(it->raw);
	free(it->resets);
	free(it);
}

/* ------------------------------------------------------------------------ */
/* Clocks                                                                    */
/* ------------------------------------------------------------------------ */

static __int128 ticks_ns(const an_trace *t, __int128 ticks)
{
	return ticks * 1000000000 / (__int128)t->tsc_hz;
}

static int64_t clamp64(__int128 v)
{
	return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (int64_t)v;
}

uint64_t an_tsc_ns(const an_trace *t, uint64_t a, uint64_t b)
{
	__int128 ns = b > a ? ticks_ns(t, (__int128)(b - a)) : 0;

	return ns > (__int128)UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}

int64_t an_realtime_ns(const an_trace *t, uint64_t tsc)
{
	return clamp64(t->real0 + ticks_ns(t, (__int128)tsc - (__int128)t->tsc0));
}

int64_t an_monotonic_ns(const an_trace *t, uint64_t tsc)
{
	return clamp64(t->mono0 + ticks_ns(t, (__int128)tsc - (__int128)t->tsc0));
}

/* ------------------------------------------------------------------------ */
/* For printers                                                              */
/* ------------------------------------------------------------------------ */

int an_select_threads(const an_trace *t, const char *list, unsigned char *sel, sp_err *err)
{
	const char *p = list;

	memset(sel, 0, t->nthreads);
	for (;;) {
		char *end;
		unsigned long long tid;
		int found = 0;

		if (!isdigit((unsigned char)*p))
			return sp_fail(err, "'%s' is not a thread id or a comma-separated list of them",
				       list);
		errno = 0;
		tid = strtoull(p, &end, 10);
		if (errno || tid > UINT32_MAX || (*end && *end != ','))
			return sp_fail(err, "'%s' is not a thread id or a comma-separated list of them",
				       list);
		for (size_t i = 0; i < t->nthreads; i++)
			if (t->threads[i].tid == tid)
				sel[i] = found = 1;
		if (!found) {
			char have[256] = "";
			size_t len = 0;

			for (size_t i = 0; i < t->nthreads && len + 16 < sizeof have; i++)
				len += (size_t)snprintf(have + len, sizeof have - len, "%s%u",
							i ? ", " : "", t->threads[i].tid);
			if (t->nthreads && len + 16 >= sizeof have)
				snprintf(have + len, sizeof have - len, ", ...");
			return sp_fail(err, "%s: no thread %llu in this trace (it has %s)", t->dir, tid,
				       t->nthreads ? have : "none");
		}
		if (!*end)
			return 0;
		p = end + 1;
	}
}

char *an_fmt_duration(uint64_t ns, char buf[24])
{
	if (ns < 1000000ull)
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 " us", ns / 1000, ns % 1000);
	else if (ns < 1000000000ull)
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 " ms", ns / 1000000,
			 ns / 1000 % 1000);
	else
		snprintf(buf, 24, "%4" PRIu64 ".%03" PRIu64 "  s", ns / 1000000000,
			 ns / 1000000 % 1000);
	return buf;
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                     */
/* ------------------------------------------------------------------------ */

/* One stack the thread runs on, once context events say it has several. */
typedef struct shadow {
	uint32_t *saved;         /* site ids of its calls while suspended, outermost first */
	size_t nsaved, capsaved;
	size_t base;             /* in the chain: the depth its calls start at */
	int in_chain;
	int entered;             /* the thread has run on it */
} shadow;

typedef struct calls_build {
	an_trace *t;
	an_call *c;
	size_t n, cap;
	size_t *stack;           /* indices of open AN_CALL items */
	size_t depth, capstack;
	map open;                /* site id -> number of open calls of it */
	int stopped;             /* between a DEACTIVATE and the next ACTIVATE */
	shadow *sh;              /* stacks; [0] the thread's own (none: one stack) */
	size_t nsh, capsh;
	size_t *chain;           /* indices into sh, outermost first */
	size_t nchain, capchain;
	map keys;                /* context key -> index into sh + 1 */
} calls_build;

static an_call *call_add(calls_build *b, uint32_t kind, uint32_t id, uint64_t tsc)
{
	an_call *c;

	if (sp_grow((void **)&b->c, &b->cap, b->n + 1, sizeof *b->c))
		return NULL;
	c = &b->c[b->n++];
	*c = (an_call){ (uint16_t)kind, 0, 0, id,
			(uint32_t)(b->depth > UINT32_MAX ? UINT32_MAX : b->depth), 0, tsc, tsc };
	return c;
}

/* Close the innermost open call. */
static uint32_t canon_id(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && t->sites[id].canon ? t->sites[id].canon : id;
}

static void call_close(calls_build *b, uint32_t end, uint64_t tsc)
{
	an_call *c = &b->c[b->stack[--b->depth]];
	map_slot *s = map_find(&b->open, canon_id(b->t, c->id), 0);

	c->end = end;
	c->t1 = tsc;
	c->last = b->n;
	if (s)
		s->val--;
}

static int site_is_tail(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && an_site_is_tail(&t->sites[id]);
}

/* A call whose callee returns to the caller directly (TRACE_SITE_NO_EXIT). */
static int site_no_exit(const an_trace *t, uint32_t id)
{
	return id < t->nsites && t->sites[id].valid && (t->sites[id].flags & TRACE_SITE_NO_EXIT);
}

/* Close, as unwound, the open calls above the innermost one that entered
 * the function making call `id` (nothing if none is open). */
static void resync_to_caller(calls_build *b, uint32_t id, uint64_t tsc)
{
	const an_trace *t = b->t;
	size_t k = b->depth;

	if (id >= t->nsites || !t->sites[id].valid || t->sites[id].caller == AN_NONE)
		return;
	while (k > 0) {
		uint32_t open = b->c[b->stack[k - 1]].id;

		if (open < t->nsites && t->sites[open].valid &&
		    t->sites[open].callee == t->sites[id].caller)
			break;
		k--;
	}
	if (k == 0)
		return;
	while (b->depth > k)
		call_close(b, AN_END_UNWOUND, tsc);
}

/* ---- stacks (context events) ---- */

static void stacks_free(calls_build *b)
{
	for (size_t i = 0; i < b->nsh; i++)
		free(b->sh[i].saved);
	free(b->sh);
	free(b->chain);
	map_free(&b->keys);
	b->sh = NULL;
	b->chain = NULL;
	b->nsh = b->capsh = b->nchain = b->capchain = 0;
}

/* A new stack, not run on yet. */
static long stack_new(calls_build *b)
{
	if (sp_grow((void **)&b->sh, &b->capsh, b->nsh + 1, sizeof *b->sh))
		return -1;
	b->sh[b->nsh] = (shadow){ 0 };
	return (long)b->nsh++;
}

/* At the first context event: stack 0, the thread's own, with its calls. */
static int stacks_start(calls_build *b)
{
	if (sp_grow((void **)&b->chain, &b->capchain, 1, sizeof *b->chain) || stack_new(b) < 0)
		return -1;
	b->sh[0].in_chain = b->sh[0].entered = 1;
	b->chain[b->nchain++] = 0;
	return 0;
}

/* Suspend the top stack of the chain: its open calls end AN_END_SWITCHED
 * and are kept to go on when the thread comes back. */
static int stack_suspend(calls_build *b, uint64_t tsc)
{
	shadow *s = &b->sh[b->chain[--b->nchain]];
	size_t n = b->depth - s->base;

	if (sp_grow((void **)&s->saved, &s->capsaved, n, sizeof *s->saved))
		return -1;
	for (size_t i = 0; i < n; i++)
		s->saved[i] = b->c[b->stack[s->base + i]].id;
	s->nsaved = n;
	s->in_chain = 0;
	while (b->depth > s->base)
		call_close(b, AN_END_SWITCHED, tsc);
	return 0;
}

/* Put stack i on top of the chain: its suspended calls go on. */
static int stack_resume(calls_build *b, size_t i, uint64_t tsc)
{
	shadow *s;

	if (sp_grow((void **)&b->chain, &b->capchain, b->nchain + 1, sizeof *b->chain))
		return -1;
	b->chain[b->nchain++] = i;
	s = &b->sh[i];
	s->in_chain = 1;
	s->base = b->depth;
	for (size_t k = 0; k < s->nsaved; k++) {
		map_slot *o;
		an_call *c = call_add(b, AN_CALL, s->saved[k], tsc);

		if (!c || sp_grow((void **)&b->stack, &b->capstack, b->depth + 1, sizeof *b->stack) ||
		    !(o = map_get(&b->open, canon_id(b->t, s->saved[k]), 0)))
			return -1;
		c->flags = AN_CONTINUED;
		o->val++;
		b->stack[b->depth++] = b->n - 1;
	}
	s->nsaved = 0;
	return 0;
}

/* The stack a context key names; a new one if none did. */
static long stack_of(calls_build *b, uint64_t key)
{
	map_slot *k = map_get(&b->keys, key, 0);
	long i;

	if (!k)
		return -1;
	if (k->val)
		return (long)k->val - 1;
	if ((i = stack_new(b)) >= 0)
		k->val = (uint32_t)i + 1;
	return i;
}

static int context_event(calls_build *b, const an_record *r)
{
	map_slot *k;
	an_call *c;
	long i;

	if (!b->nsh && stacks_start(b) < 0)
		return -1;
	switch (r->id) {
	case TRACE_EV_CTX_SAVE:
		if (!(k = map_get(&b->keys, r->key, 0)))
			return -1;
		k->val = (uint32_t)b->chain[b->nchain - 1] + 1;
		return 0;
	case TRACE_EV_CTX_NEW:
		if ((i = stack_new(b)) < 0 || !(k = map_get(&b->keys, r->key, 0)))
			return -1;
		k->val = (uint32_t)i + 1;
		return 0;
	default:
		if ((i = stack_of(b, r->key)) < 0)
			return -1;
		if ((size_t)i == b->chain[b->nchain - 1])
			return 0;                       /* setcontext on the same stack */
		if (b->sh[i].in_chain) {
			while (b->chain[b->nchain - 1] != (size_t)i)
				if (stack_suspend(b, r->tsc))
					return -1;
		}
		if (!(c = call_add(b, AN_EVENT, r->id, r->tsc)))
			return -1;
		c->end = (uint32_t)i;
		c->flags = b->sh[i].entered ? 0 : AN_NEW_STACK;
		b->sh[i].entered = 1;
		if (!b->sh[i].in_chain)
			return stack_resume(b, (size_t)i, r->tsc);
		return 0;
	}
}

static int calls_record(calls_build *b, const an_record *r)
{
	map_slot *s;
	uint32_t key = canon_id(b->t, r->id);

	if (b->stopped && r->kind != TRACE_EVENT)
		return 0;
	switch (r->kind) {
	case TRACE_ENTRY:
		if (!call_add(b, AN_CALL, r->id, r->tsc) ||
		    sp_grow((void **)&b->stack, &b->capstack, b->depth + 1, sizeof *b->stack) ||
		    !(s = map_get(&b->open, key, 0)))
			return -1;
		s->val++;
		b->stack[b->depth++] = b->n - 1;
		/* A tail jump with nothing open below it comes from a function
		 * the trace never entered (called from untraced code, e.g. a new
		 * thread's start in libc): nothing will close it, so it counts as
		 * a call of unknown length. */
		if ((b->depth == 1 && site_is_tail(b->t, r->id)) || site_no_exit(b->t, r->id))
			call_close(b, AN_END_TAIL, r->tsc);
		return 0;
	case TRACE_EXIT:
		s = map_find(&b->open, key, 0);
		if (!s || !s->val) {
			/* A call returning whose entry is closed: a second return
			 * of setjmp after a longjmp, say.  The function that made the
			 * call is the innermost running one: close what lies above it. */
			resync_to_caller(b, r->id, r->tsc);
			return call_add(b, AN_EXIT_ONLY, r->id, r->tsc) ? 0 : -1;
		}
		/* The innermost open call of this site, at k.  Above it: first the
		 * callees of tail jumps, which return with it; then calls left
		 * without their exit (longjmp, exception). */
		size_t k = b->depth - 1, j;

		while (canon_id(b->t, b->c[b->stack[k]].id) != key)
			k--;
		for (j = k + 1; j < b->depth && site_is_tail(b->t, b->c[b->stack[j]].id); j++)
			;
		while (b->depth > j)
			call_close(b, AN_END_UNWOUND, r->tsc);
		while (b->depth > k + 1)
			call_close(b, AN_END_TAIL, r->tsc);
		call_close(b, AN_END_EXIT, r->tsc);
		return 0;
	default:
		if (trace_event_has_key(r->id))
			return context_event(b, r);
		if (r->id == TRACE_EV_DEACTIVATE) {
			while (b->depth)
				call_close(b, AN_END_STOPPED, r->tsc);
			stacks_free(b);             /* begin again with one stack */
			b->stopped = 1;
		} else if (r->id == TRACE_EV_ACTIVATE) {
			b->stopped = 0;
		} else if (trace_event_is_msg(r->id)) {
			an_trace *t = b->t;
			an_call *c;

			if (t->nmsgs >= UINT32_MAX ||
			    sp_grow((void **)&t->msgs, &t->capmsgs, t->nmsgs + 1, sizeof *t->msgs) ||
			    !(c = call_add(b, AN_EVENT, r->id, r->tsc)))
				return -1;
			t->msgs[t->nmsgs] = r->msg;
			c->end = (uint32_t)t->nmsgs++;
			return 0;
		}
		return call_add(b, AN_EVENT, r->id, r->tsc) ? 0 : -1;
	}
}

int an_thread_calls(an_trace *t, const an_thread *th, an_call **out, size_t *n,
		    an_iter_stats *stats, sp_err *err)
{
	calls_build b = { .t = t };
	an_iter *it;
	an_record r;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (an_iter_open(t, th, &it, err) < 0)
		return -1;
	while (rc == 0 && an_iter_next(it, &r))
		rc = calls_record(&b, &r);
	if (rc == 0)
		while (b.depth)
			call_close(&b, AN_END_TRACE, an_iter_stats_get(it)->last_tsc);
	if (stats)
		*stats = *an_iter_stats_get(it);
	an_iter_close(it);
	free(b.stack);
	map_free(&b.open);
	stacks_free(&b);
	if (rc) {
		free(b.c);
		return sp_fail(err, "%s: out of memory building the call tree", th->path);
	}
	*out = b.c;
	*n = b.n;
	return 0;
}
