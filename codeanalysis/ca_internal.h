/*
 * ca_internal.h — the codeanalysis library's private structures, shared by its
 * source files and by nothing else.
 *
 *   elf.c       open the file, sections, segments, symbols, PLT, build-id
 *   ehframe.c   .eh_frame FDEs and their LSDA landing pads
 *   funcs.c     function discovery and naming
 *   disasm.c    recursive-traversal disassembly, jump tables, blocks, CFG
 *   sites.c     call-site classification and patch plans
 *   lines.c     DWARF source lines (libdwarf), separate debug files
 *   sandbox.c   the unprivileged, seccomp-filtered child lines.c reads in
 *   runtimes.c  code a language runtime manages (Go, V8): left alone
 *   repo.c      repository entries (proto/repo.proto via protobuf-c)
 *   module.c    ca_analyze(), accessors, lookups, names
 *   trust.c     what an analysis was made from; whether it may be stored
 */
#ifndef CA_INTERNAL_H
#define CA_INTERNAL_H

#include <stdbool.h>

#include "codeanalysis.h"

/* Bumped whenever the analysis would give different results: repository
 * entries written by another analyser version are regenerated. */
#define CA_ANALYZER_VERSION 6

/* Values of a file's identity (trust.c, ca_file_id). */
#define CA_FILE_ID_N 5

/* An executable or data section of interest, with its file bytes. */
typedef struct ca_section {
	char name[32];
	uint64_t addr;
	uint64_t size;
	const uint8_t *data;  /* NULL for SHT_NOBITS */
	bool exec;
} ca_section;

/* A symbol worth knowing: a function symbol or a PLT/GOT import. */
typedef struct ca_sym {
	uint64_t addr;
	uint64_t size;
	const char *name;     /* points into the ELF string table */
	uint8_t type;         /* STT_* */
	uint8_t from_dynsym;
	uint8_t bind;         /* STB_* */
} ca_sym;

/* A GOT slot that the dynamic linker fills with an imported symbol. */
typedef struct ca_gotslot {
	uint64_t addr;
	const char *name;
	uint64_t resolver;    /* IRELATIVE: the ifunc resolver (named after) */
} ca_gotslot;

/* An FDE range and, when it has one, its landing pads. */
typedef struct ca_fde {
	uint64_t start, size;
	uint32_t first_pad, npads; /* into ca_elf.pads */
	bool mid;                  /* CFI starts mid-function: a .cold/.part piece */
	/* The CFA program (in the mapped .eh_frame): the CIE's initial
	 * instructions, then the FDE's, and the CIE's alignment factors. */
	const uint8_t *cie_ins, *cie_end, *ins, *end;
	uint64_t code_align;
	int64_t data_align;
} ca_fde;

/* Everything read from the ELF file, before analysis. */
typedef struct ca_elf {
	const char *path;
	int fd;
	uint8_t *map;          /* whole file, read-only mapping */
	size_t map_size;
	void *elf;             /* libelf Elf* */
	void *dbg_elf;         /* the separate debug file's Elf*, when its symbols are used */
	int dbg_fd;
	const char *debug_dir; /* where separate debug files live (NULL: /usr/lib/debug) */
	uint16_t e_type;
	uint64_t entry;
	ca_section *secs;
	size_t nsecs;
	ca_sym *syms;
	size_t nsyms;
	ca_gotslot *got;       /* sorted by addr */
	size_t ngot;
	uint64_t *entries;     /* code pointers: DT_INIT/FINI, init/fini arrays */
	size_t nentries;
	ca_gotslot *relative;  /* R_X86_64_RELATIVE: addr = slot, resolver = value */
	size_t nrelative, caprel;
	ca_fde *fdes;          /* sorted by start */
	size_t nfdes;
	uint64_t *pads;        /* landing-pad addresses */
	size_t npads;
	uint8_t buildid[64];
	size_t buildid_len;
	char untrusted[256];   /* ca_file_trust's verdict on the file mapped, "" if trusted */
	uint64_t file_id[CA_FILE_ID_N]; /* ca_file_id of the file mapped */
	char buildid_hex[2 * 64 + 1]; /* lowercase hex, "" if none */
	const char *debuglink; /* .gnu_debuglink file name, or NULL */
	uint32_t debuglink_crc;
} ca_elf;

/* The module: what ca_analyze produces and the repository stores. */
struct ca_module {
	char *path;
	char key[160];
	char buildid[132];
	char lines_source[4096];
	char lines_error[1024]; /* why DWARF could not be read (not stored) */
	uint64_t file_size;
	int is_dyn;
	bool lines_pending;     /* analysed with no_lines: lines not read yet (stored) */
	uint8_t code_sha256[32];/* ca_code_sha256_fd of the file analysed (stored) */
	char untrusted[256];    /* why it may not be stored, "" if it may (not stored) */
	uint64_t file_id[CA_FILE_ID_N]; /* ca_file_id of the file analysed, zeros if
	                         * unknown (stored) */

	ca_func *funcs;   size_t nfuncs, capfuncs;
	ca_block *blocks; size_t nblocks, capblocks;
	ca_edge *edges;   size_t nedges, capedges;
	ca_site *sites;   size_t nsites, capsites;
	ca_line *lines;   size_t nlines, caplines;
	ca_undecodable *undec; size_t nundec, capundec;
	ca_runtime *runtimes; size_t nruntimes, capruntimes;

	char *strs;       size_t nstrs, capstrs;  /* NUL-separated, offset 0 = "" */

	ca_stats stats;

	/* When loaded from the repository these arrays may live in one block
	 * owned here instead of being separately allocated. */
	void *owned_blob;
	/* Or in a calls image mapped read-only (image.c), unmapped at free. */
	void *mapped;
	size_t mapped_len;
};

/* image.c: the calls view as records used in place (see there).  Store:
 * 0, or -1 (err).  Map: 0, or -1 with why (then read the entry). */
int ca_image_store(const ca_module *m, const char *path, sp_err *err);
int ca_image_map(const char *path, const char *key, ca_module **out, char *why, size_t whylen);

/* repo.c: write a repository file whole or not at all (a temporary file,
 * fsync, rename). */
int ca_repo_write_atomic(const char *path, const uint8_t *buf, size_t len, sp_err *err);
/* repo.c: <dir>/<first two of key>/<key><suffix> (dir NULL: the default,
 * resolved into *dir); the key checked.  0, or -1 (err). */
int ca_repo_key_path(const char **dir, const char *key, const char *suffix, char *path,
		     size_t len, sp_err *err);

/* module.c */
uint32_t ca_str_add(ca_module *m, const char *s);  /* CA_NONE on ENOMEM */
ca_module *ca_module_new(void);

/* elf.c */
/* debug_dir: where separate debug files live (NULL: /usr/lib/debug). */
int ca_elf_open(ca_elf *e, const char *path, const char *debug_dir, sp_err *err);
void ca_elf_close(ca_elf *e);
const ca_section *ca_elf_section_at(const ca_elf *e, uint64_t addr); /* exec or data with bytes */
const ca_section *ca_elf_section_named(const ca_elf *e, const char *name);
const char *ca_elf_got_name(const ca_elf *e, uint64_t slot);        /* NULL if none */
/* <debug dir>/.build-id/xx/rest.debug for the module (debug_dir NULL:
 * /usr/lib/debug); false if it has no build-id. */
bool ca_elf_debug_path(const ca_elf *e, const char *debug_dir, char *out, size_t len);
/* Read `n` bytes at `addr` from any section with file bytes; false if out of range. */
bool ca_elf_read(const ca_elf *e, uint64_t addr, void *buf, size_t n);

/* trust.c */
struct stat;
/* The identity of the file `st` describes (CA_FILE_ID_N values): device,
 * inode, size, mtime and ctime in nanoseconds.  See ca_module_code_matches. */
void ca_file_id(const struct stat *st, uint64_t id[CA_FILE_ID_N]);
/* May an analysis of the file `st` describes be stored?  false with why. */
bool ca_file_trust(const struct stat *st, char *why, size_t len);
int ca_code_sha256_fd(int fd, const char *path, uint8_t out[32], sp_err *err);
/* ca_module_code_matches, saying how: 1 the very file m was made from
 * (same identity), 2 another file or a touched one with the same code
 * (hashed), 0 other code, -1 (err).  id: the identity of the file checked
 * (seen before its code was read). */
int ca_code_matches_id(const ca_module *m, const char *path, uint64_t id[CA_FILE_ID_N],
		       sp_err *err);
/* Fill every site's code (ca_code_hash over ca_site_spans) from the file's bytes. */
void ca_sites_hash(ca_module *m, const ca_elf *e);

/* ehframe.c: parse .eh_frame (and LSDAs in .gcc_except_table).  Bounds are
 * checked everywhere: a malformed section yields fewer FDEs, never a crash. */
int ca_ehframe_parse(ca_elf *e, sp_err *err);
/* The CFA rule at addr (register number in DWARF's x86-64 numbering, 7 =
 * rsp, and offset); false when no FDE covers addr or its CFI cannot be
 * followed there (expressions, set_loc). */
bool ca_ehframe_cfa_at(const ca_elf *e, uint64_t addr, unsigned *reg, int64_t *off);

/* lines.c: fill m->lines (sorted by addr) from the module's DWARF or its
 * separate debug file.  No DWARF anywhere is not an error (0, no lines). */
int ca_lines_read(ca_module *m, const ca_elf *e, const ca_options *opt, sp_err *err);

/* sandbox.c: close every descriptor but 0-2 and keep[], become nobody if
 * root, and let only the system calls of a reader of open files through
 * (write: out_fd and stderr only).  -1 with the step that failed. */
int ca_sandbox_enter(const int *keep, size_t nkeep, int out_fd, sp_err *err);

/* One decoded instruction, as the passes after decoding need it. */
enum ca_insn_class {
	CA_I_OTHER = 0,
	CA_I_CALL,      /* call rel32 */
	CA_I_CALL_IND,  /* call *reg / *mem */
	CA_I_JMP,       /* jmp rel */
	CA_I_JCC,       /* conditional jump rel (incl. loop/jrcxz) */
	CA_I_JMP_IND,   /* jmp *reg / *mem */
	CA_I_RET,
	CA_I_STOP,      /* ud2, hlt, int3: no fall-through */
	CA_I_SYSCALL,   /* syscall, sysenter, int N */
};

enum ca_insn_flag {
	CA_INSF_RIPREL = 1 << 0,   /* has a RIP-relative memory operand */
	CA_INSF_OP_REG = 1 << 1,   /* indirect through a register */
	CA_INSF_OP_MEM = 1 << 2,   /* indirect through memory */
	CA_INSF_TABLE = 1 << 3,    /* indirect jump resolved as a jump table */
	CA_INSF_NORET = 1 << 4,    /* call to a noreturn function */
	CA_INSF_LEADER = 1 << 5,   /* starts a basic block */
	CA_INSF_PAD = 1 << 6,      /* root from an LSDA landing pad */
	CA_INSF_SWEPT = 1 << 7,    /* root from sweeping a hole */
};

typedef struct ca_insn {
	uint64_t addr;
	uint64_t target;   /* branch/call target, or RIP-relative slot of an indirect */
	uint32_t func;     /* work-function index */
	uint8_t len;
	uint8_t cls;       /* enum ca_insn_class */
	uint8_t flags;     /* enum ca_insn_flag */
	uint8_t undec : 1;   /* decoding stopped right after this instruction */
	uint8_t overlap : 1; /* shares bytes with another decoded instruction */
} ca_insn;

/* A function while the analysis runs. */
typedef struct ca_wfunc {
	uint64_t addr;
	uint64_t size;        /* 0: unknown */
	uint64_t limit;       /* decoding stays below this address */
	const char *name;     /* symbol name (ELF string) or NULL */
	int name_rank;        /* lower is better (see funcs.c) */
	uint16_t sources, flags;
	uint32_t parent;      /* work index of the owner of a fragment */
	bool fde_mid;         /* FDE says its CFI starts mid-function */
	bool called;          /* target of a direct call */
	uint32_t jumped_from; /* work index of a function that jumps here, CA_NONE */
	uint32_t first_insn, ninsns; /* in ca_work.order */
	const uint64_t *pads; uint32_t npads;
	bool decoded;
	uint32_t final;       /* index in m->funcs */
} ca_wfunc;

/* An exec section's per-byte map: insn index + 1 where an instruction starts. */
typedef struct ca_textmap {
	const ca_section *sec;
	uint32_t *start;     /* sec->size entries */
	uint8_t *covered;    /* bytes inside a decoded instruction */
} ca_textmap;

typedef struct ca_jtarget {
	uint32_t insn;
	uint64_t target;
} ca_jtarget;

/* An unbounded jump table waiting for the rest of its function. */
typedef struct ca_deferred {
	uint32_t insn;
	uint64_t table, ebase;
	unsigned esize;
	uint64_t count;
	unsigned tbase, ebase_reg; /* registers whose RIP-relative lea gives the bases */
} ca_deferred;

/* The state shared by the passes of one ca_analyze() run. */
typedef struct ca_work {
	ca_module *m;
	ca_elf *e;
	const ca_options *opt;
	size_t cs;             /* capstone handle (csh) */
	ca_wfunc *fn; size_t nfn, capfn;
	uint64_t *fkeys; uint32_t *fvals; size_t fhcap; /* addr -> fn index hash */
	ca_insn *ins; size_t nins, capins;
	uint32_t *order;       /* instruction indices grouped by function, by address */
	ca_textmap *tm; size_t ntm;
	ca_jtarget *jt; size_t njt, capjt;
	uint64_t *work; size_t nwork, capwork; /* per-function worklist */
	uint64_t *undec; size_t nundec, capundec; /* addresses capstone refused */
	uint32_t *fmap;        /* final function index -> work index */
	size_t cur_first;      /* first instruction of the function being decoded */
	uint64_t *jout; size_t njout, capjout; /* jump targets outside every function */
	ca_deferred *deferred; size_t ndeferred, capdeferred;
} ca_work;

/* funcs.c */
uint32_t ca_fn_find(const ca_work *w, uint64_t addr);  /* entry -> index, CA_NONE */
uint32_t ca_fn_add(ca_work *w, uint64_t addr, uint16_t source); /* find or add */
bool ca_name_noreturn(const char *name);
ca_textmap *ca_textmap_at(const ca_work *w, uint64_t addr);
int ca_funcs_scan_endbr(ca_work *w);                /* functions added, -1 ENOMEM */
int ca_funcs_finish(ca_work *w, sp_err *err);       /* noreturn, fragments */

/* disasm.c */
int ca_disasm_init(ca_work *w, sp_err *err);
void ca_disasm_fini(ca_work *w);
int ca_disasm_pending(ca_work *w, sp_err *err);     /* decode functions not yet decoded */
int ca_disasm_order(ca_work *w);                    /* w->order, w->fmap; -1 ENOMEM */
int ca_blocks_build(ca_work *w, sp_err *err);       /* m->funcs, m->blocks, m->edges */
uint32_t ca_insn_at(const ca_work *w, uint64_t addr); /* insn index, CA_NONE */

/* funcs.c, disasm.c, sites.c: the analysis passes, run in this order. */
int ca_funcs_discover(ca_work *w, sp_err *err);
int ca_sites_plan(ca_work *w, sp_err *err);         /* m->sites */
/* runtimes.c, last: m->runtimes, and the CA_FUNC_RUNTIME* flags. */
int ca_runtimes_find(ca_module *m, const ca_elf *e, sp_err *err);

#endif
