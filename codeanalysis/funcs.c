/*
 * funcs.c — function discovery and naming.
 *
 * Starts come from, in order of trust: symbols (.symtab, .dynsym), .eh_frame
 * FDEs (the main source when stripped), PLT stubs (named by the GOT slot they
 * jump through), the ELF entry point, targets of direct calls (added while
 * disassembling), and endbr64 at an aligned address in bytes no function
 * covers.  After disassembly, ca_funcs_finish() decides noreturn functions,
 * attaches .cold/.part fragments to their parents and picks names.
 */
#include "ca_internal.h"

#include <capstone/capstone.h>
#include <elf.h>
#include <stdlib.h>
#include <string.h>

/* ---- address -> function index (open addressing, linear probing) ---- */

static size_t hash_addr(uint64_t a, size_t cap)
{
	return (size_t)((a * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static int fh_rehash(ca_work *w, size_t ncap)
{
	uint64_t *nk = calloc(ncap, sizeof *nk);
	uint32_t *nv = malloc(ncap * sizeof *nv);
	size_t i;

	if (!nk || !nv) {
		free(nk);
		free(nv);
		return -1;
	}
	for (i = 0; i < w->fhcap; i++) {
		size_t h;

		if (!w->fkeys[i])
			continue;
		for (h = hash_addr(w->fkeys[i], ncap); nk[h]; h = (h + 1) & (ncap - 1))
			;
		nk[h] = w->fkeys[i];
		nv[h] = w->fvals[i];
	}
	free(w->fkeys);
	free(w->fvals);
	w->fkeys = nk;
	w->fvals = nv;
	w->fhcap = ncap;
	return 0;
}

uint32_t ca_fn_find(const ca_work *w, uint64_t addr)
{
	size_t h;

	if (!w->fhcap || !addr)
		return CA_NONE;
	for (h = hash_addr(addr, w->fhcap); w->fkeys[h]; h = (h + 1) & (w->fhcap - 1))
		if (w->fkeys[h] == addr)
			return w->fvals[h];
	return CA_NONE;
}

uint32_t ca_fn_add(ca_work *w, uint64_t addr, uint16_t source)
{
	uint32_t i = ca_fn_find(w, addr);
	size_t h;

	if (i != CA_NONE) {
		w->fn[i].sources |= source;
		return i;
	}
	if ((w->nfn + 1) * 2 > w->fhcap && fh_rehash(w, w->fhcap ? w->fhcap * 2 : 1024))
		return CA_NONE;
	if (sp_grow((void **)&w->fn, &w->capfn, w->nfn + 1, sizeof *w->fn))
		return CA_NONE;
	i = (uint32_t)w->nfn++;
	memset(&w->fn[i], 0, sizeof w->fn[i]);
	w->fn[i].addr = addr;
	w->fn[i].sources = source;
	w->fn[i].parent = CA_NONE;
	w->fn[i].jumped_from = CA_NONE;
	w->fn[i].name_rank = 1 << 30;
	for (h = hash_addr(addr, w->fhcap); w->fkeys[h]; h = (h + 1) & (w->fhcap - 1))
		;
	w->fkeys[h] = addr;
	w->fvals[h] = i;
	return i;
}

ca_textmap *ca_textmap_at(const ca_work *w, uint64_t addr)
{
	size_t i;

	for (i = 0; i < w->ntm; i++)
		if (addr >= w->tm[i].sec->addr && addr - w->tm[i].sec->addr < w->tm[i].sec->size)
			return &w->tm[i];
	return NULL;
}

/* ---- names ---- */

/*
 * Several symbols often share an address (malloc, __libc_malloc, __malloc).
 * Prefer global over weak over local, then fewer leading underscores, then
 * the shorter name: what a user would call the function.
 */
static int name_rank(const ca_sym *s)
{
	int bind = s->bind == STB_GLOBAL ? 0 : s->bind == STB_WEAK ? 1 : 2;
	int us = 0;
	size_t len = strlen(s->name);

	while (s->name[us] == '_' && us < 9)
		us++;
	return bind * 100000 + us * 1000 + (int)(len < 999 ? len : 999);
}

static const char *const noreturn_names[] = {
	"exit", "_exit", "_Exit", "abort", "quick_exit", "__assert_fail",
	"__assert_perror_fail", "__stack_chk_fail", "__fortify_fail", "__chk_fail",
	"err", "errx", "verr", "verrx", "longjmp", "_longjmp", "siglongjmp",
	"__longjmp_chk", "pthread_exit", "__pthread_unwind", "__pthread_unwind_next",
	"__cxa_throw", "__cxa_rethrow", "__cxa_bad_cast", "__cxa_bad_typeid",
	"__cxa_pure_virtual", "__cxa_deleted_virtual", "__cxa_call_terminate",
	"__cxa_throw_bad_array_new_length", "_Unwind_Resume", "__libc_fatal",
	"__libc_start_main", "_ZSt9terminatev", "__terminate", "_dl_signal_error",
	"__libc_longjmp", "__libc_siglongjmp", "__chk_fail_local", "thrd_exit",
};

bool ca_name_noreturn(const char *name)
{
	size_t i;

	if (!name)
		return false;
	if (strncmp(name, "_ZSt", 4) == 0 && strstr(name, "__throw_"))
		return true;            /* std::__throw_length_error and friends */
	for (i = 0; i < sizeof noreturn_names / sizeof *noreturn_names; i++)
		if (strcmp(name, noreturn_names[i]) == 0)
			return true;
	return false;
}

/* ---- sources ---- */

static int add_symbols(ca_work *w)
{
	size_t i;

	for (i = 0; i < w->e->nsyms; i++) {
		const ca_sym *s = &w->e->syms[i];
		const ca_section *sec = ca_elf_section_at(w->e, s->addr);
		uint32_t f;
		int rank;

		if (!sec || !sec->exec)
			continue;
		f = ca_fn_add(w, s->addr, s->from_dynsym ? CA_SRC_DYNSYM : CA_SRC_SYMTAB);
		if (f == CA_NONE)
			return -1;
		if (s->size > w->fn[f].size)
			w->fn[f].size = s->size;
		if (s->type == STT_GNU_IFUNC)
			w->fn[f].flags |= CA_FUNC_IFUNC;
		rank = name_rank(s) + (s->from_dynsym ? 1 : 0);
		if (rank < w->fn[f].name_rank) {
			w->fn[f].name_rank = rank;
			w->fn[f].name = s->name;
		}
	}
	return 0;
}

static int add_fdes(ca_work *w)
{
	size_t i;

	for (i = 0; i < w->e->nfdes; i++) {
		const ca_fde *d = &w->e->fdes[i];
		const ca_section *sec = ca_elf_section_at(w->e, d->start);
		uint32_t f;

		if (!sec || !sec->exec || strncmp(sec->name, ".plt", 4) == 0)
			continue;       /* one FDE covers a whole PLT; stubs are added below */
		f = ca_fn_add(w, d->start, CA_SRC_EHFRAME);
		if (f == CA_NONE)
			return -1;
		if (!w->fn[f].size || w->fn[f].size < d->size)
			w->fn[f].size = d->size;
		w->fn[f].fde_mid = d->mid;
		w->fn[f].pads = d->npads ? w->e->pads + d->first_pad : NULL;
		w->fn[f].npads = d->npads;
	}
	return 0;
}

/*
 * PLT stubs: walk .plt, .plt.sec and .plt.got; a stub starts after the
 * previous jump (and any padding) and is named by the GOT slot its
 * `jmp *slot(%rip)` goes through.  Stubs without a named slot (PLT0, the lazy
 * halves of an IBT .plt) are left alone.
 */
static int add_plt_section(ca_work *w, const ca_section *s)
{
	csh cs = (csh)w->cs;
	cs_insn *in = cs_malloc(cs);
	const uint8_t *code = s->data;
	size_t left = s->size;
	uint64_t addr = s->addr, entry = 0;
	int rc = 0;

	if (!in)
		return -1;
	while (left && cs_disasm_iter(cs, &code, &left, &addr, in)) {
		cs_x86 *x = &in->detail->x86;

		if (!entry && in->id != X86_INS_NOP && in->id != X86_INS_INT3)
			entry = in->address;
		if (in->id != X86_INS_JMP)
			continue;
		if (x->op_count == 1 && x->operands[0].type == X86_OP_MEM &&
		    x->operands[0].mem.base == X86_REG_RIP && entry) {
			uint64_t slot = in->address + in->size + (uint64_t)x->operands[0].mem.disp;
			const char *name = ca_elf_got_name(w->e, slot);

			uint32_t f = ca_fn_add(w, entry, CA_SRC_PLT);

			if (f == CA_NONE) {
				rc = -1;
				break;
			}
			w->fn[f].flags |= CA_FUNC_PLT;
			w->fn[f].size = in->address + in->size - entry;
			if (name) {
				w->fn[f].name = name;
				w->fn[f].name_rank = -1;
			}
		}
		entry = 0;
	}
	cs_free(in, 1);
	return rc;
}

int ca_funcs_discover(ca_work *w, sp_err *err)
{
	static const char *const plts[] = { ".plt", ".plt.sec", ".plt.got" };
	size_t i;

	if (add_symbols(w) || add_fdes(w))
		return sp_fail(err, "%s: out of memory", w->e->path);
	for (i = 0; i < 3; i++) {
		const ca_section *s = ca_elf_section_named(w->e, plts[i]);

		if (s && s->data && add_plt_section(w, s))
			return sp_fail(err, "%s: out of memory", w->e->path);
	}
	/* What the loader calls: the entry point, DT_INIT/DT_FINI, the
	 * init/fini arrays, and the start of .init and .fini. */
	for (i = 0; i <= w->e->nentries + 2; i++) {
		uint64_t a = i < w->e->nentries ? w->e->entries[i] : 0;
		const ca_section *s;

		if (i == w->e->nentries)
			a = w->e->entry;
		else if (i > w->e->nentries) {
			s = ca_elf_section_named(w->e, i == w->e->nentries + 1 ? ".init" : ".fini");
			a = s ? s->addr : 0;
		}
		s = a ? ca_elf_section_at(w->e, a) : NULL;
		if (s && s->exec && ca_fn_add(w, a, CA_SRC_ENTRY) == CA_NONE)
			return sp_fail(err, "%s: out of memory", w->e->path);
	}
	for (i = 0; i < w->nfn; i++)
		if (ca_name_noreturn(w->fn[i].name))
			w->fn[i].flags |= CA_FUNC_NORETURN;
	return 0;
}

/*
 * endbr64 (f3 0f 1e fa) at a 16-byte-aligned address that no decoded
 * instruction covers is an address-taken function that has neither symbol
 * nor FDE nor direct caller.  Returns how many were added.
 */
int ca_funcs_scan_endbr(ca_work *w)
{
	static const uint8_t endbr[4] = { 0xf3, 0x0f, 0x1e, 0xfa };
	int added = 0;
	size_t t;

	for (t = 0; t < w->ntm; t++) {
		const ca_textmap *tm = &w->tm[t];
		uint64_t a = (tm->sec->addr + 15) & ~(uint64_t)15;

		for (; a + 4 <= tm->sec->addr + tm->sec->size; a += 16) {
			size_t off = a - tm->sec->addr;

			if (tm->covered[off] || memcmp(tm->sec->data + off, endbr, 4) != 0)
				continue;
			if (ca_fn_find(w, a) != CA_NONE)
				continue;
			if (ca_fn_add(w, a, CA_SRC_ENDBR) == CA_NONE)
				return -1;
			added++;
		}
	}
	return added;
}

/* ---- after disassembly ---- */

/* A function returns unless every way out of it is a call to a noreturn
 * function (or a tail jump to one).  Iterate to a fixpoint. */
static void infer_noreturn(ca_work *w)
{
	bool changed = true;

	while (changed) {
		changed = false;
		for (size_t f = 0; f < w->nfn; f++) {
			ca_wfunc *fn = &w->fn[f];
			bool exits = false, any = fn->ninsns > 0;

			if ((fn->flags & (CA_FUNC_NORETURN | CA_FUNC_PLT)) || !any)
				continue;
			for (uint32_t k = 0; k < fn->ninsns && !exits; k++) {
				const ca_insn *in = &w->ins[w->order[fn->first_insn + k]];
				uint32_t callee;

				switch (in->cls) {
				case CA_I_RET:
				case CA_I_JMP_IND:
				case CA_I_SYSCALL:  /* exit_group looks like this, but so does anything */
					exits = true;
					break;
				case CA_I_JMP:
				case CA_I_JCC:
					callee = ca_fn_find(w, in->target);
					if (callee != CA_NONE && callee != f &&
					    !(w->fn[callee].flags & CA_FUNC_NORETURN))
						exits = true;
					else if (callee == CA_NONE &&
						 (in->target < fn->addr || in->target >= fn->limit))
						exits = true;  /* jump out of range: be safe */
					break;
				default:
					break;
				}
				if (in->undec)
					exits = true;
			}
			if (!exits) {
				fn->flags |= CA_FUNC_NORETURN;
				changed = true;
			}
		}
	}
}

static uint32_t find_by_name(const ca_work *w, const char *name, size_t len)
{
	for (size_t f = 0; f < w->nfn; f++)
		if (w->fn[f].name && strncmp(w->fn[f].name, name, len) == 0 &&
		    w->fn[f].name[len] == '\0')
			return (uint32_t)f;
	return CA_NONE;
}

/*
 * Fragments.  Named: "foo.cold", "foo.cold.3", "foo.part.0" belong to "foo".
 * Stripped: a function whose FDE starts mid-function, that nobody calls and
 * that another function jumps to, belongs to that function.
 */
static void attach_fragments(ca_work *w)
{
	for (size_t f = 0; f < w->nfn; f++) {
		ca_wfunc *fn = &w->fn[f];
		const char *dot;

		if (fn->name && ((dot = strstr(fn->name, ".cold")) || (dot = strstr(fn->name, ".part.")))) {
			uint32_t p = find_by_name(w, fn->name, (size_t)(dot - fn->name));

			if (p != CA_NONE && p != f) {
				fn->parent = p;
				fn->flags |= CA_FUNC_FRAGMENT;
			}
		} else if (!fn->name && fn->fde_mid && !fn->called && fn->jumped_from != CA_NONE &&
			   fn->jumped_from != f) {
			fn->parent = fn->jumped_from;
			fn->flags |= CA_FUNC_FRAGMENT;
		}
	}
	/* A parent chain ends at a real function (fragments of fragments). */
	for (size_t f = 0; f < w->nfn; f++) {
		int guard = 0;

		while (w->fn[f].parent != CA_NONE && (w->fn[w->fn[f].parent].flags & CA_FUNC_FRAGMENT) &&
		       ++guard < 8)
			w->fn[f].parent = w->fn[w->fn[f].parent].parent;
		if (guard >= 8 || w->fn[f].parent == f) {
			w->fn[f].parent = CA_NONE;
			w->fn[f].flags &= (uint16_t)~CA_FUNC_FRAGMENT;
		}
	}
}

/*
 * A stripped executable's main has no name, yet it is what users ask for.
 * The C runtime's _start passes it to __libc_start_main as the first
 * argument: `lea main(%rip),%rdi` (PIE) or `mov $main,%rdi`, then the call.
 */
static void name_main(ca_work *w)
{
	uint32_t f = ca_fn_find(w, w->e->entry);
	cs_insn *in;
	uint64_t rdi = 0, found = 0;

	if (f == CA_NONE || find_by_name(w, "main", 4) != CA_NONE || !(in = cs_malloc((csh)w->cs)))
		return;
	for (uint32_t k = 0; k < w->fn[f].ninsns && !found; k++) {
		const ca_insn *r = &w->ins[w->order[w->fn[f].first_insn + k]];
		const ca_textmap *tm = ca_textmap_at(w, r->addr);
		const uint8_t *code = tm->sec->data + (r->addr - tm->sec->addr);
		size_t left = r->len;
		uint64_t a = r->addr;
		const cs_x86 *x;

		if (!cs_disasm_iter((csh)w->cs, &code, &left, &a, in))
			break;
		x = &in->detail->x86;
		if (r->cls == CA_I_CALL || r->cls == CA_I_CALL_IND || r->cls == CA_I_JMP_IND) {
			found = rdi;
		} else if (x->op_count == 2 && x->operands[0].type == X86_OP_REG &&
			   (x->operands[0].reg == X86_REG_RDI || x->operands[0].reg == X86_REG_EDI)) {
			if (in->id == X86_INS_LEA && (r->flags & CA_INSF_RIPREL))
				rdi = r->target;
			else if (in->id == X86_INS_MOV && x->operands[1].type == X86_OP_IMM)
				rdi = (uint64_t)x->operands[1].imm;
			else
				rdi = 0;
		}
	}
	cs_free(in, 1);
	f = found ? ca_fn_find(w, found) : CA_NONE;
	if (f != CA_NONE && !w->fn[f].name) {
		w->fn[f].name = "main";
		w->fn[f].name_rank = 0;
	}
}

int ca_funcs_finish(ca_work *w, sp_err *err)
{
	infer_noreturn(w);
	attach_fragments(w);
	name_main(w);
	return 0;
}
