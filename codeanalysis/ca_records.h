/*
 * ca_records.h — the plain records of a code analysis that the agent's
 * propagation core reads: functions (ca_func) and call sites (ca_site), with
 * their kinds, flags and patch plans.  Part of codeanalysis.h, which
 * includes it; kept apart because agent/core/ is built freestanding (no C
 * library headers: stdint.h only).
 */
#ifndef CA_RECORDS_H
#define CA_RECORDS_H

#include <stdint.h>

#define CA_NONE UINT32_MAX

/* Where a function's start came from (bit set; several may apply). */
enum ca_func_source {
	CA_SRC_SYMTAB = 1 << 0,     /* .symtab STT_FUNC */
	CA_SRC_DYNSYM = 1 << 1,     /* .dynsym STT_FUNC / STT_GNU_IFUNC */
	CA_SRC_EHFRAME = 1 << 2,    /* .eh_frame FDE initial location */
	CA_SRC_CALLTARGET = 1 << 3, /* target of a direct call */
	CA_SRC_ENDBR = 1 << 4,      /* endbr64 at an aligned start in a gap */
	CA_SRC_PLT = 1 << 5,        /* a PLT stub */
	CA_SRC_ENTRY = 1 << 6,      /* ELF entry, DT_INIT/FINI, init/fini arrays */
	CA_SRC_JUMPTARGET = 1 << 7, /* target of a jump outside every known function */
};

enum ca_func_flag {
	CA_FUNC_NORETURN = 1 << 0,  /* never returns to its caller */
	CA_FUNC_PLT = 1 << 1,       /* PLT stub; name is the imported symbol */
	CA_FUNC_FRAGMENT = 1 << 2,  /* .cold/.part piece of `parent` */
	CA_FUNC_UNDECODABLE = 1 << 3, /* contains bytes capstone cannot decode */
	CA_FUNC_IFUNC = 1 << 4,     /* STT_GNU_IFUNC resolver */
	CA_FUNC_NAMED = 1 << 5,     /* name from a symbol (not sub_<offset>) */
	CA_FUNC_RUNTIME = 1 << 6,   /* inside a ca_runtime region: never patched, and
	                             * calls into it are not traced */
	CA_FUNC_RUNTIME_ENTRY = 1 << 7, /* outside them, but called by such a runtime
	                             * (cgo's C side): instrumented at activation */
};

typedef struct ca_func {
	uint64_t addr;       /* entry address */
	uint64_t size;       /* bytes of its range (symbol/FDE size, else extent) */
	uint32_t name;       /* string offset (ca_str) */
	uint32_t parent;     /* owning function for fragments, else CA_NONE */
	uint32_t first_block, nblocks;
	uint32_t first_site, nsites;
	uint16_t sources;    /* enum ca_func_source bits */
	uint16_t flags;      /* enum ca_func_flag bits */
	uint32_t ninsns;     /* instructions decoded */
} ca_func;

/* What kind of call site (or tail jump) this is. */
enum ca_site_kind {
	CA_SITE_DIRECT = 1,    /* call rel32 to a function of this module */
	CA_SITE_PLT,           /* call rel32 to a PLT stub; `import` names it */
	CA_SITE_INDIRECT_REG,  /* call *%reg */
	CA_SITE_INDIRECT_MEM,  /* call *disp(%base,%index,scale) */
	CA_SITE_INDIRECT_RIP,  /* call *disp(%rip); `import` if a GOT slot */
	CA_SITE_TAIL_DIRECT,   /* jmp/jcc to another function's entry */
	CA_SITE_TAIL_INDIRECT, /* jmp *reg/mem that is not a jump table */
	CA_SITE_KIND_MAX
};

#define CA_RELOC_RIP_UNKNOWN 0xff

enum ca_site_flag {
	CA_SITEF_NORETURN = 1 << 0,  /* the callee never returns */
	CA_SITEF_COND = 1 << 1,      /* conditional tail jump (jcc) */
	CA_SITEF_OUTSIDE = 1 << 2,   /* direct target outside any function */
	CA_SITEF_TAILPOS = 1 << 3,   /* indirect jump with the frame torn down (CFA =
	                              * rsp+8 by the CFI): a tail call, where the red
	                              * zone, r11 and the flags are dead */
};

/*
 * How the agent patches a site.  Never is a byte after a call instruction
 * overwritten: a thread may be inside the callee and return there.
 */
enum ca_patch_method {
	CA_PATCH_DIRECT = 1,  /* overwrite the site (>= 5 bytes) with jmp rel32 */
	CA_PATCH_SPRINGBOARD, /* 2-byte jmp rel8 to a 5-byte jmp in dead padding */
	CA_PATCH_RELOCATE,    /* move [patch_addr, site end) out; 5-byte jmp in */
	CA_PATCH_TRAP,        /* int3 on the first byte; handler emulates */
	CA_PATCH_NONE,        /* cannot be patched (see reason) */
	CA_PATCH_METHOD_MAX
};

/* Why the plan is what it is (for the short-site cases, why not better). */
enum ca_patch_reason {
	CA_WHY_LONG_ENOUGH = 1,    /* site is >= 5 bytes */
	CA_WHY_GAP_NEARBY,         /* short site; dead padding within rel8 reach */
	CA_WHY_BLOCK_ROOM,         /* short site; same-block instructions before it */
	CA_WHY_NO_ROOM,            /* no gap in reach; too few movable bytes before it */
	CA_WHY_UNMOVABLE,          /* preceding instructions cannot be relocated */
	CA_WHY_UNDECODABLE,        /* site lies in or next to undecodable bytes */
	CA_WHY_OVERLAP,            /* site overlaps another decoded instruction */
	CA_WHY_REASON_MAX
};

typedef struct ca_site {
	uint64_t addr;        /* address of the call/jmp instruction */
	uint64_t target;      /* direct target, or the memory slot for RIP-relative */
	uint64_t patch_addr;  /* SPRINGBOARD: springboard; RELOCATE: window start */
	uint32_t func;        /* containing function */
	uint32_t callee;      /* function index of a direct target, else CA_NONE */
	uint32_t import;      /* string offset of the imported name, else CA_NONE */
	uint8_t len;          /* instruction length */
	uint8_t kind;         /* enum ca_site_kind */
	uint8_t method;       /* enum ca_patch_method */
	uint8_t reason;       /* enum ca_patch_reason */
	uint8_t flags;        /* enum ca_site_flag */
	uint8_t patch_len;    /* RELOCATE: bytes from patch_addr to site end */
	uint8_t reloc_rip;    /* RELOCATE: 0, or the window holds a RIP-relative
	                       * operand: its disp32 at patch_addr + reloc_rip - 1
	                       * (CA_RELOC_RIP_UNKNOWN: not found) */
	uint8_t pad_;
	uint64_t code;        /* ca_code_hash of the bytes the analysis saw
	                       * there (0: the file holds no bytes there) */
} ca_site;

#endif
