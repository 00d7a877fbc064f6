/*
 * codeanalysis.h — the offline code analyser's public interface.
 *
 * ca_analyze() reads one ELF module (x86-64), finds every function even when
 * the module is stripped, disassembles each by recursive traversal, builds
 * basic blocks, the CFG and the call graph, classifies every call site and
 * plans how the agent will patch it.  The result is a ca_module: an opaque
 * handle whose contents are read through the accessors below as flat arrays
 * of plain records.  ca_repo_store() / ca_repo_load() keep one entry per
 * module in the repository, keyed by GNU build-id, so the agent never has to
 * disassemble on its hot path.
 *
 * Addresses are link-time virtual addresses as in the ELF file (p_vaddr
 * space); at run time add the module's load bias.
 */
#ifndef CODEANALYSIS_H
#define CODEANALYSIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ca_records.h"   /* ca_func, ca_site and their enums */
#include "sp.h"

typedef struct ca_module ca_module;

/* How control leaves a basic block (one record per successor). */
enum ca_edge_kind {
	CA_EDGE_FALLTHROUGH = 1, /* next block, no branch */
	CA_EDGE_JUMP,            /* unconditional direct jump */
	CA_EDGE_TAKEN,           /* conditional branch taken */
	CA_EDGE_NOT_TAKEN,       /* conditional branch falls through */
	CA_EDGE_TABLE,           /* jump-table target */
};

typedef struct ca_edge {
	uint32_t to;         /* block index */
	uint32_t kind;       /* enum ca_edge_kind */
} ca_edge;

enum ca_block_flag {
	CA_BLOCK_ENTRY = 1 << 0,      /* function entry */
	CA_BLOCK_RET = 1 << 1,        /* ends in ret */
	CA_BLOCK_TAIL = 1 << 2,       /* ends in a tail jump out of the function */
	CA_BLOCK_NORETURN = 1 << 3,   /* ends in a call that does not return */
	CA_BLOCK_INDIRECT = 1 << 4,   /* ends in an unresolved indirect jump */
	CA_BLOCK_LANDING_PAD = 1 << 5,/* exception landing pad (from the LSDA) */
	CA_BLOCK_SWEPT = 1 << 6,      /* found by sweeping a hole, not by flow */
	CA_BLOCK_UNDECODABLE = 1 << 7,/* decoding stopped at undecodable bytes */
};

typedef struct ca_block {
	uint64_t addr;
	uint32_t size;
	uint32_t func;       /* function index */
	uint32_t first_edge; /* into ca_module_edges() */
	uint16_t nedges;
	uint16_t flags;      /* enum ca_block_flag bits */
	uint32_t ninsns;
} ca_block;

/* A region capstone could not decode (AVX-512 with capstone 4, data...). */
typedef struct ca_undecodable {
	uint64_t addr;
	uint32_t size;
	uint32_t func;
} ca_undecodable;

/*
 * Code a language runtime manages and inspects: its own stack walks read
 * the return addresses of its frames and die on one they do not know (Go's
 * traceback, "unknown pc"; V8's GC, "Check failed: maybe_code.has_value()").
 * The agent patches nothing inside, traces no call into it, and a stack
 * walk stops at it (runtimes.c finds them).
 */
enum ca_runtime_kind {
	CA_RUNTIME_GO = 1,    /* Go's text: runtime.text .. runtime.etext (pclntab) */
	CA_RUNTIME_V8,        /* V8's embedded builtins blob */
	CA_RUNTIME_KIND_MAX
};

typedef struct ca_runtime {
	uint64_t lo, hi;      /* [lo, hi) */
	uint32_t kind;        /* enum ca_runtime_kind */
	uint32_t how;         /* string offset: how it was found */
} ca_runtime;

/* One row of the line table (sorted by address). */
typedef struct ca_line {
	uint64_t addr;
	uint32_t file;        /* string offset of the source file path */
	uint32_t line;
} ca_line;

/* What ca_analyze() should do. */
typedef struct ca_options {
	int no_lines;         /* skip DWARF source lines: the entry is marked so
	                       * (ca_module_lines_pending) and whoever wants lines
	                       * later reads them (ca_repo_get).  The agent analyses
	                       * this way: reading lines forks a child (lines.c) */
	const char *debug_dir;/* root of build-id debug files (default /usr/lib/debug) */
	int calls_only;       /* ca_repo_get: a repository entry gives functions, call
	                       * sites and strings only -- no blocks, edges, lines or
	                       * undecodable regions (the agent's view: a fifth of
	                       * the bytes of a typical entry, read without the rest) */
	const char *key;      /* ca_repo_get: the file's key (ca_module_key_of), when
	                       * the caller has it: the file is not read for it again */
} ca_options;

/* Totals for the summary. */
typedef struct ca_stats {
	uint64_t text_bytes;       /* bytes of executable sections */
	uint64_t decoded_bytes;    /* bytes covered by decoded instructions */
	uint64_t undecodable_bytes;
	uint32_t nundecodable;     /* undecodable regions */
	uint32_t ninsns;
	uint32_t nfuncs, nblocks, nedges, nsites, nlines;
	uint32_t nfuncs_by_source[8];       /* index = bit number of ca_func_source */
	uint32_t nsites_by_kind[CA_SITE_KIND_MAX];
	uint32_t nsites_by_method[CA_PATCH_METHOD_MAX];
	uint32_t njump_tables, njump_table_targets;
	uint32_t nfragments, nnoreturn, nlanding_pads;
	uint64_t analyze_ns;       /* wall time of ca_analyze */
	uint64_t lines_ns;         /* of which reading source lines */
} ca_stats;

/* Analyse the ELF file at `path`.  Returns 0 and *out, or -1 with err set. */
int ca_analyze(const char *path, const ca_options *opt, ca_module **out, sp_err *err);
void ca_module_free(ca_module *m);

/* Identity of the module. */
const char *ca_module_path(const ca_module *m);
const char *ca_module_key(const ca_module *m);     /* build-id hex, or "sha256-<hex>" */
const char *ca_module_buildid(const ca_module *m); /* hex, "" if none */
uint64_t ca_module_file_size(const ca_module *m);
int ca_module_is_pie_or_dso(const ca_module *m);   /* ET_DYN */
const char *ca_module_lines_source(const ca_module *m); /* file DWARF came from, "" if none */
/* Why source lines are missing although DWARF exists ("" if not so).  Corrupt
 * DWARF costs the lines, never the analysis.  Not kept in the repository. */
const char *ca_module_lines_error(const ca_module *m);
/* SHA-256 of the file bytes of the module's executable segments (see
 * ca_module_code_matches): the code the analysis was made from. */
const uint8_t *ca_module_code_sha256(const ca_module *m);
/* Why the file analysed may not be stored in the repository ("" if it may):
 * another user could have written it (trust.c states the rule).  Set by
 * ca_analyze() from the very descriptor it read; ca_repo_store() refuses
 * such a module, ca_repo_get() uses it without storing it. */
const char *ca_module_untrusted(const ca_module *m);
/* Analysed without source lines (ca_options.no_lines, e.g. inside a traced
 * program): the module may have lines nobody has read yet.  Kept in the
 * repository; ca_repo_get() with lines wanted reads them and replaces it. */
int ca_module_lines_pending(const ca_module *m);

/* Flat arrays: functions sorted by address, blocks grouped by function in
 * address order, sites grouped by function in address order. */
const ca_func *ca_module_funcs(const ca_module *m, size_t *n);
const ca_block *ca_module_blocks(const ca_module *m, size_t *n);
const ca_edge *ca_module_edges(const ca_module *m, size_t *n);
const ca_site *ca_module_sites(const ca_module *m, size_t *n);
const ca_line *ca_module_lines(const ca_module *m, size_t *n);
const ca_undecodable *ca_module_undecodable(const ca_module *m, size_t *n);
const ca_runtime *ca_module_runtimes(const ca_module *m, size_t *n);  /* sorted by lo */
/* The region holding addr, or NULL. */
const ca_runtime *ca_runtime_at(const ca_module *m, uint64_t addr);
const ca_stats *ca_module_stats(const ca_module *m);
const char *ca_str(const ca_module *m, uint32_t off);

/* Lookups (binary search).  CA_NONE / NULL when not found. */
uint32_t ca_func_at(const ca_module *m, uint64_t addr);       /* containing */
uint32_t ca_func_by_name(const ca_module *m, const char *name);
const ca_line *ca_line_at(const ca_module *m, uint64_t addr);

/* Names for printing. */
const char *ca_site_kind_name(unsigned kind);
const char *ca_patch_method_name(unsigned method);
const char *ca_patch_reason_text(unsigned reason);
const char *ca_edge_kind_name(unsigned kind);
const char *ca_runtime_kind_name(unsigned kind);   /* "Go runtime", "V8 builtins" */

/*
 * Repository: one file per module under `dir` named by its key, written
 * atomically.  dir NULL means the default: $SPTRACE_REPO, else
 * /var/lib/sptrace/repo for root, else ~/.cache/sptrace/repo.
 */
const char *ca_repo_default_dir(void);
/* Refuses (-1) a module whose file another user could have written
 * (ca_module_untrusted), saying so. */
int ca_repo_store(const ca_module *m, const char *dir, char *path_out, size_t path_len, sp_err *err);
/* Load the entry for `key`.  Returns 0, 1 if there is none, -1 if the entry
 * is corrupt, truncated or of another version (err says which file). */
int ca_repo_load(const char *dir, const char *key, ca_module **out, sp_err *err);
/* The same, the calls view only (see ca_options.calls_only): functions have
 * no blocks there.  The entry's checksum covers bytes this does not read, so
 * it is not checked; every record is still checked against what it indexes. */
int ca_repo_load_calls(const char *dir, const char *key, ca_module **out, sp_err *err);
/* A calls image's identity: as the file system gives it (the file is only
 * ever replaced by rename, never written in place: image.c, step 3), and
 * the nonce its store wrote. */
typedef struct ca_image_id {
	uint64_t dev, ino, size, ctime_ns, nonce;
} ca_image_id;
/* Who remembers the images whose every record was checked (image.c, step
 * 2): `seen` says whether one of this identity was, `checked` hears of each
 * checked now.  NULL, the default: every image is checked whole. */
typedef struct ca_image_memo {
	bool (*seen)(const ca_image_id *id);
	void (*checked)(const ca_image_id *id);
} ca_image_memo;
void ca_image_set_memo(const ca_image_memo *memo);
/*
 * What an analysis was made from (trust.c).  The code hash is the SHA-256
 * of the file bytes of the executable PT_LOAD segments, in program-header
 * order; ca_module_code_matches tells whether the file at path has m's code
 * (without hashing it when it is the very file m was made from, unchanged).
 * ca_site_spans: the bytes a patch of site s reads or overwrites, as link-time
 * address and length: [0] the site, from the start of a relocated window;
 * [1] a springboard's 5 bytes (length 0 if none).  ca_code_hash: FNV-1a
 * (64 bits) of n bytes, chained from h (CA_CODE_HASH_SEED to begin); over
 * both spans, in order, it gives ca_site.code.
 */
#define CA_CODE_HASH_SEED 0xcbf29ce484222325ull
/* Was m made from the code of the file at path?  1 yes, 0 no, -1 (err). */
int ca_module_code_matches(const ca_module *m, const char *path, sp_err *err);
/* The same for the entry `key` of repository `dir` (NULL: the default):
 * 1 yes, 0 no (no entry, or other code), -1 (err).  When the code is the
 * same but the file is not the one the entry recorded (a package upgrade
 * touched it, a copy), the entry learns the file's identity: the next check
 * needs no hash of the code (some 4 ms for libc, at every run).  An entry
 * whose calls image is missing or unusable gets it (image.c). */
int ca_repo_code_matches(const char *dir, const char *key, const char *path, sp_err *err);
void ca_site_spans(const ca_site *s, uint64_t addr[2], unsigned len[2]);
uint64_t ca_code_hash(uint64_t h, const void *p, size_t n);
/* Key of an ELF file without analysing it (build-id, else content hash). */
int ca_module_key_of(const char *path, char *key, size_t keylen, sp_err *err);
/* The same key from the note segments of an image already loaded (its
 * PT_NOTE at run time, `size` bytes, aligned to `align`): no file read.
 * -1: no build-id there (ca_module_key_of then hashes the file). */
int ca_module_key_of_notes(const void *notes, size_t size, size_t align, char *key,
			   size_t keylen);
/* The usual entry point: load the entry for `path` from the repository, or
 * analyse the file and store it (a corrupt entry is replaced).  *from_repo
 * tells which happened.  An entry whose lines are pending is analysed again
 * with lines and replaced when opt wants lines (neither no_lines nor
 * calls_only).  A module analysed from a file another user could have
 * written is returned but not stored (ca_module_untrusted says why). */
int ca_repo_get(const char *dir, const char *path, const ca_options *opt,
		ca_module **out, int *from_repo, sp_err *err);

/*
 * Look-ahead profiles (profile.c): beside an entry, the functions earlier
 * runs reached, one bit per function of the entry; the agent's look-ahead
 * takes only those.  Its protocol: profile.c.
 */
typedef struct ca_profile {
	const uint8_t *bits;     /* bit f: function f reached; NULL: none */
	uint32_t nfuncs, nreached;
	char path[4096];
	void *map;
	size_t map_len;
} ca_profile;

/* Map the profile of entry `key` of repository `dir` (NULL: the default),
 * made for nfuncs functions: 0 and *out, 1 if there is none, -1 if there is
 * one that cannot be used (why: a link, another user's, another size...).
 * out->path names the file in every case it could be named. */
int ca_profile_map(const char *dir, const char *key, uint32_t nfuncs, ca_profile *out,
		   char *why, size_t whylen);
void ca_profile_unmap(ca_profile *p);
/* Add the functions `reached` (nfuncs bits) to the profile of entry `key`:
 * 0 written (*nnew of them new), 1 nothing new (not written), 2 not written:
 * the repository or the entry is not the caller's own (err says why), -1
 * (err). */
int ca_profile_merge(const char *dir, const char *key, uint32_t nfuncs, const uint8_t *reached,
		     uint32_t *nnew, sp_err *err);

#endif
