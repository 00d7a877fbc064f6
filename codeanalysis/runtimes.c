/*
 * runtimes.c — code that a language runtime manages and inspects, found in
 * the ELF file (see ca_runtime in codeanalysis.h).
 *
 * Such a runtime walks its own stacks by return address and looks every
 * one up in its own tables: Go's traceback (GC stack scans, stack growth)
 * in the pclntab, V8's stack walk (GC) among its code objects and embedded
 * builtins.  A return address in a patch area is found in neither and the
 * program aborts.  So the agent must patch no call site inside that code
 * and trace no call into it; it must know where that code is:
 *
 *   Go  the module has .gopclntab (or .go.buildinfo): the Go text is
 *       [runtime.text, runtime.etext), from those symbols or, stripped,
 *       from the pclntab header and function table.  cgo's C side (gcc's
 *       code, outside that range) stays traceable; its functions that Go
 *       calls (_cgo_*, x_cgo_*) are flagged CA_FUNC_RUNTIME_ENTRY, since
 *       nothing traced calls them.
 *   V8  the module defines v8::internal::DefaultEmbeddedBlobCode() and
 *       ...CodeSize() (exported by libnode, in node's symbol table):
 *       their few instructions are read to learn the blob's address and
 *       size, which V8 keeps as local symbols only.
 *
 * A runtime recognised whose range cannot be read leaves the module's
 * whole code alone: a module untraced is better than a program killed.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ca_internal.h"

static int add_region(ca_module *m, uint64_t lo, uint64_t hi, unsigned kind, const char *how,
		      sp_err *err)
{
	uint32_t s = ca_str_add(m, how);

	if (s == CA_NONE ||
	    sp_grow((void **)&m->runtimes, &m->capruntimes, m->nruntimes + 1, sizeof *m->runtimes))
		return sp_fail(err, "%s: out of memory", m->path);
	m->runtimes[m->nruntimes++] = (ca_runtime){ lo, hi, kind, s };
	return 0;
}

/* Every executable section: the fallback when a runtime's range is unknown. */
static int add_all_code(ca_module *m, const ca_elf *e, unsigned kind, const char *how,
			sp_err *err)
{
	for (size_t i = 0; i < e->nsecs; i++)
		if (e->secs[i].exec && add_region(m, e->secs[i].addr,
						  e->secs[i].addr + e->secs[i].size, kind, how, err))
			return -1;
	return 0;
}

static const ca_sym *sym_named(const ca_elf *e, const char *name)
{
	for (size_t i = 0; i < e->nsyms; i++)
		if (e->syms[i].name && strcmp(e->syms[i].name, name) == 0)
			return &e->syms[i];
	return NULL;
}

static bool read_u64(const ca_elf *e, uint64_t addr, uint64_t *v)
{
	return ca_elf_read(e, addr, v, 8);
}

/* A pointer-sized word as the loader leaves it: in a PIE or shared object
 * it is relocated (R_X86_64_RELATIVE, the addend is the link-time value). */
static bool read_ptr(const ca_elf *e, uint64_t addr, uint64_t *v)
{
	for (size_t i = 0; i < e->nrelative; i++)
		if (e->relative[i].addr == addr) {
			*v = e->relative[i].resolver;
			return true;
		}
	return read_u64(e, addr, v);
}

/* ---- Go ---- */

/*
 * The Go text range from the pclntab (runtime/symtab.go, pcHeader):
 *   1.18+   magic 0xfffffff0/0xfffffff1, then pad, pad, minLC, ptrSize;
 *           nfunc at 8, textStart at 24, pclnOffset at 64; the function
 *           table there: nfunc+1 pairs {entryoff u32, funcoff u32}, the
 *           last entryoff the end of the text.
 *   1.16-17 magic 0xfffffffa; nfunc at 8, pclnOffset at 56; pairs
 *           {entry u64, funcoff u64}, the last entry the end.
 *   1.2-15  magic 0xfffffffb; nfunc at 8, pairs {pc u64, off u64} from
 *           16, then the end pc.
 */
static bool go_text_from_pclntab(const ca_elf *e, const ca_section *s, uint64_t *lo,
				 uint64_t *hi)
{
	uint32_t magic, first, last;
	uint64_t nfunc, off, base = s->addr;

	if (!ca_elf_read(e, base, &magic, 4) || !read_u64(e, base + 8, &nfunc) || nfunc == 0 ||
	    nfunc > s->size / 8)
		return false;
	switch (magic) {
	case 0xfffffff0:
	case 0xfffffff1:
		if (!read_ptr(e, base + 24, lo) || !read_u64(e, base + 64, &off) ||
		    !ca_elf_read(e, base + off, &first, 4) ||
		    !ca_elf_read(e, base + off + nfunc * 8, &last, 4))
			return false;
		*hi = *lo + last;
		*lo += first;
		break;
	case 0xfffffffa:
		if (!read_u64(e, base + 56, &off) || !read_ptr(e, base + off, lo) ||
		    !read_ptr(e, base + off + nfunc * 16, hi))
			return false;
		break;
	case 0xfffffffb:
		if (!read_ptr(e, base + 16, lo) || !read_ptr(e, base + 16 + nfunc * 16, hi))
			return false;
		break;
	default:
		return false;
	}
	/* It must be code of this module. */
	const ca_section *t = ca_elf_section_at(e, *lo);

	return *lo && *lo < *hi && t && t->exec && *hi <= t->addr + t->size;
}

static int find_go(ca_module *m, const ca_elf *e, sp_err *err)
{
	const ca_section *pcln = ca_elf_section_named(e, ".gopclntab");
	const ca_sym *text = sym_named(e, "runtime.text"), *etext = sym_named(e, "runtime.etext");
	uint64_t lo, hi;

	if (!pcln && !ca_elf_section_named(e, ".go.buildinfo"))
		return 0;
	if (text && etext && text->addr < etext->addr)
		return add_region(m, text->addr, etext->addr, CA_RUNTIME_GO,
				  "Go text, runtime.text..runtime.etext", err);
	if (pcln && pcln->data && go_text_from_pclntab(e, pcln, &lo, &hi))
		return add_region(m, lo, hi, CA_RUNTIME_GO, "Go text, from .gopclntab", err);
	return add_all_code(m, e, CA_RUNTIME_GO,
			    "Go module whose Go text could not be located: all its code", err);
}

/* cgo's C functions that Go calls: generated wrappers and runtime/cgo's helpers. */
static bool go_calls_it(const char *name)
{
	return strncmp(name, "_cgo_", 5) == 0 || strncmp(name, "x_cgo_", 6) == 0;
}

/* ---- V8 ---- */

/*
 * What a function of the form "return CONSTANT" returns: it follows rax
 * through the few instructions compilers emit for it --
 *   lea d(%rip),%rax | mov $imm,%eax | mov d(%rip),%rax | mov d(%rip),%eax
 *   then optionally mov (%rax),%rax | mov (%rax),%eax
 *   ret
 * (with endbr64 and a frame-pointer prologue/epilogue allowed).
 */
static bool returned_constant(const ca_elf *e, uint64_t fn, uint64_t *out)
{
	uint8_t c[48];
	uint64_t rax = 0, v;
	uint32_t v32;
	int32_t d;
	bool known = false;
	size_t i = 0;

	if (!ca_elf_read(e, fn, c, sizeof c))
		return false;
	while (i + 8 <= sizeof c) {
		const uint8_t *p = c + i;

		if (memcmp(p, "\xf3\x0f\x1e\xfa", 4) == 0) {            /* endbr64 */
			i += 4;
		} else if (p[0] == 0x55 || p[0] == 0x5d) {              /* push/pop %rbp */
			i += 1;
		} else if (memcmp(p, "\x48\x89\xe5", 3) == 0) {         /* mov %rsp,%rbp */
			i += 3;
		} else if (memcmp(p, "\x48\x8d\x05", 3) == 0) {         /* lea d(%rip),%rax */
			memcpy(&d, p + 3, 4);
			rax = fn + i + 7 + (uint64_t)(int64_t)d;
			known = true;
			i += 7;
		} else if (memcmp(p, "\x48\x8b\x05", 3) == 0) {         /* mov d(%rip),%rax */
			memcpy(&d, p + 3, 4);
			if (!read_ptr(e, fn + i + 7 + (uint64_t)(int64_t)d, &rax))
				return false;
			known = true;
			i += 7;
		} else if (p[0] == 0x8b && p[1] == 0x05) {              /* mov d(%rip),%eax */
			memcpy(&d, p + 2, 4);
			if (!ca_elf_read(e, fn + i + 6 + (uint64_t)(int64_t)d, &v32, 4))
				return false;
			rax = v32;
			known = true;
			i += 6;
		} else if (p[0] == 0xb8) {                              /* mov $imm,%eax */
			memcpy(&v32, p + 1, 4);
			rax = v32;
			known = true;
			i += 5;
		} else if (known && memcmp(p, "\x48\x8b\x00", 3) == 0) { /* mov (%rax),%rax */
			if (!read_ptr(e, rax, &v))
				return false;
			rax = v;
			i += 3;
		} else if (known && p[0] == 0x8b && p[1] == 0x00) {     /* mov (%rax),%eax */
			if (!ca_elf_read(e, rax, &v32, 4))
				return false;
			rax = v32;
			i += 2;
		} else if (p[0] == 0xc3) {                              /* ret */
			*out = rax;
			return known;
		} else {
			return false;
		}
	}
	return false;
}

static int find_v8(ca_module *m, const ca_elf *e, sp_err *err)
{
	const ca_sym *code = sym_named(e, "_ZN2v88internal23DefaultEmbeddedBlobCodeEv");
	const ca_sym *size = sym_named(e, "_ZN2v88internal27DefaultEmbeddedBlobCodeSizeEv");
	uint64_t lo, n;
	const ca_section *t;

	if (!code || !size)
		return 0;
	if (returned_constant(e, code->addr, &lo) && returned_constant(e, size->addr, &n) && n &&
	    (t = ca_elf_section_at(e, lo)) && t->exec && lo + n <= t->addr + t->size)
		return add_region(m, lo, lo + n, CA_RUNTIME_V8,
				  "V8 embedded builtins, from DefaultEmbeddedBlobCode()", err);
	return add_all_code(m, e, CA_RUNTIME_V8,
			    "V8 whose embedded builtins could not be located: all its code", err);
}

static int by_lo(const void *a, const void *b)
{
	const ca_runtime *x = a, *y = b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int ca_runtimes_find(ca_module *m, const ca_elf *e, sp_err *err)
{
	bool go;

	if (find_go(m, e, err) || find_v8(m, e, err))
		return -1;
	if (!m->nruntimes)
		return 0;
	qsort(m->runtimes, m->nruntimes, sizeof *m->runtimes, by_lo);
	go = false;
	for (size_t i = 0; i < m->nruntimes; i++)
		go |= m->runtimes[i].kind == CA_RUNTIME_GO;
	for (size_t i = 0; i < m->nfuncs; i++) {
		ca_func *f = &m->funcs[i];

		if (ca_runtime_at(m, f->addr))
			f->flags |= CA_FUNC_RUNTIME;
		else if (go && go_calls_it(ca_str(m, f->name)))
			f->flags |= CA_FUNC_RUNTIME_ENTRY;
	}
	return 0;
}

const ca_runtime *ca_runtime_at(const ca_module *m, uint64_t addr)
{
	/* A handful at most: a linear look. */
	for (size_t i = 0; i < m->nruntimes; i++)
		if (addr >= m->runtimes[i].lo && addr < m->runtimes[i].hi)
			return &m->runtimes[i];
	return NULL;
}

const char *ca_runtime_kind_name(unsigned kind)
{
	static const char *const n[] = { "?", "Go runtime", "V8 builtins" };

	return kind < sizeof n / sizeof *n ? n[kind] : "?";
}
