/*
 * disasm.c — recursive-traversal disassembly with capstone, jump tables,
 * basic blocks and the CFG.
 *
 * Each function is decoded from its entry (and its landing pads) by following
 * the flow: fall-through, direct jumps inside its range, jump-table targets.
 * Each byte is decoded at most once: a per-byte map of the code sections
 * records where instructions start and which bytes they cover, and a path
 * that reaches decoded code stops there.  When the flow is exhausted, bytes
 * inside the function's known range that are neither decoded nor padding are
 * swept as extra roots (code reached only through unresolved indirect jumps).
 *
 * Bytes capstone cannot decode (AVX-512 with capstone 4, data) end the path
 * and are recorded; they never abort the analysis.
 */
#include "ca_internal.h"

#include <capstone/capstone.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIST 16          /* instructions remembered for jump-table patterns */
#define MAX_TABLE 4096   /* entries read from one jump table at most */

int ca_disasm_init(ca_work *w, sp_err *err)
{
	csh cs;
	size_t i, n = 0;

	if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs) != CS_ERR_OK)
		return sp_fail(err, "capstone: cannot open an x86-64 disassembler");
	cs_option(cs, CS_OPT_DETAIL, CS_OPT_ON);
	w->cs = (size_t)cs;
	w->tm = calloc(w->e->nsecs ? w->e->nsecs : 1, sizeof *w->tm);
	if (!w->tm)
		return sp_fail(err, "out of memory");
	for (i = 0; i < w->e->nsecs; i++) {
		const ca_section *s = &w->e->secs[i];
		ca_textmap *t;

		if (!s->exec || !s->data)
			continue;
		t = &w->tm[n++];
		t->sec = s;
		t->start = calloc(s->size, sizeof *t->start);
		t->covered = calloc(s->size, 1);
		if (!t->start || !t->covered)
			return sp_fail(err, "%s: out of memory for section %s (%llu bytes)",
				       w->e->path, s->name, (unsigned long long)s->size);
		w->m->stats.text_bytes += s->size;
	}
	w->ntm = n;
	return 0;
}

void ca_disasm_fini(ca_work *w)
{
	size_t i;

	if (w->cs) {
		csh cs = (csh)w->cs;
		cs_close(&cs);
	}
	for (i = 0; i < w->ntm; i++) {
		free(w->tm[i].start);
		free(w->tm[i].covered);
	}
	free(w->tm);
	w->tm = NULL;
	w->ntm = 0;
}

uint32_t ca_insn_at(const ca_work *w, uint64_t addr)
{
	const ca_textmap *t = ca_textmap_at(w, addr);
	uint32_t v;

	if (!t)
		return CA_NONE;
	v = t->start[addr - t->sec->addr];
	return v ? v - 1 : CA_NONE;
}

static bool is_jcc(unsigned id)
{
	switch (id) {
	case X86_INS_JAE: case X86_INS_JA: case X86_INS_JBE: case X86_INS_JB:
	case X86_INS_JCXZ: case X86_INS_JECXZ: case X86_INS_JRCXZ: case X86_INS_JE:
	case X86_INS_JGE: case X86_INS_JG: case X86_INS_JLE: case X86_INS_JL:
	case X86_INS_JNE: case X86_INS_JNO: case X86_INS_JNP: case X86_INS_JNS:
	case X86_INS_JO: case X86_INS_JP: case X86_INS_JS: case X86_INS_LOOP:
	case X86_INS_LOOPE: case X86_INS_LOOPNE:
		return true;
	default:
		return false;
	}
}

/* Classify a decoded instruction and fill target / operand flags. */
static void classify(const cs_insn *in, ca_insn *r)
{
	const cs_x86 *x = &in->detail->x86;
	const cs_x86_op *op = x->op_count ? &x->operands[0] : NULL;

	for (int i = 0; i < x->op_count; i++)
		if (x->operands[i].type == X86_OP_MEM && x->operands[i].mem.base == X86_REG_RIP) {
			r->flags |= CA_INSF_RIPREL;
			r->target = in->address + in->size + (uint64_t)x->operands[i].mem.disp;
		}
	switch (in->id) {
	case X86_INS_CALL:
	case X86_INS_JMP:
		if (op && op->type == X86_OP_IMM) {
			r->cls = in->id == X86_INS_CALL ? CA_I_CALL : CA_I_JMP;
			r->target = (uint64_t)op->imm;
		} else {
			r->cls = in->id == X86_INS_CALL ? CA_I_CALL_IND : CA_I_JMP_IND;
			r->flags |= op && op->type == X86_OP_REG ? CA_INSF_OP_REG : CA_INSF_OP_MEM;
		}
		return;
	case X86_INS_RET: case X86_INS_RETF: case X86_INS_RETFQ:
	case X86_INS_IRET: case X86_INS_IRETD: case X86_INS_IRETQ:
		r->cls = CA_I_RET;
		return;
	case X86_INS_UD2: case X86_INS_HLT: case X86_INS_INT3: case X86_INS_UD0:
		r->cls = CA_I_STOP;
		return;
	case X86_INS_SYSCALL: case X86_INS_SYSENTER: case X86_INS_INT:
		r->cls = CA_I_SYSCALL;
		return;
	default:
		if (is_jcc(in->id) && op && op->type == X86_OP_IMM) {
			r->cls = CA_I_JCC;
			r->target = (uint64_t)op->imm;
		}
		return;
	}
}

/* ---- jump tables ---- */

/* The 64-bit register a sub-register belongs to (capstone has no helper). */
static unsigned reg64(unsigned r)
{
	static const unsigned fam[][5] = {
		{ X86_REG_RAX, X86_REG_EAX, X86_REG_AX, X86_REG_AL, X86_REG_AH },
		{ X86_REG_RBX, X86_REG_EBX, X86_REG_BX, X86_REG_BL, X86_REG_BH },
		{ X86_REG_RCX, X86_REG_ECX, X86_REG_CX, X86_REG_CL, X86_REG_CH },
		{ X86_REG_RDX, X86_REG_EDX, X86_REG_DX, X86_REG_DL, X86_REG_DH },
		{ X86_REG_RSI, X86_REG_ESI, X86_REG_SI, X86_REG_SIL, 0 },
		{ X86_REG_RDI, X86_REG_EDI, X86_REG_DI, X86_REG_DIL, 0 },
		{ X86_REG_RBP, X86_REG_EBP, X86_REG_BP, X86_REG_BPL, 0 },
		{ X86_REG_RSP, X86_REG_ESP, X86_REG_SP, X86_REG_SPL, 0 },
		{ X86_REG_R8, X86_REG_R8D, X86_REG_R8W, X86_REG_R8B, 0 },
		{ X86_REG_R9, X86_REG_R9D, X86_REG_R9W, X86_REG_R9B, 0 },
		{ X86_REG_R10, X86_REG_R10D, X86_REG_R10W, X86_REG_R10B, 0 },
		{ X86_REG_R11, X86_REG_R11D, X86_REG_R11W, X86_REG_R11B, 0 },
		{ X86_REG_R12, X86_REG_R12D, X86_REG_R12W, X86_REG_R12B, 0 },
		{ X86_REG_R13, X86_REG_R13D, X86_REG_R13W, X86_REG_R13B, 0 },
		{ X86_REG_R14, X86_REG_R14D, X86_REG_R14W, X86_REG_R14B, 0 },
		{ X86_REG_R15, X86_REG_R15D, X86_REG_R15W, X86_REG_R15B, 0 },
	};
	for (size_t i = 0; i < sizeof fam / sizeof *fam; i++)
		for (int j = 0; j < 5; j++)
			if (fam[i][j] && fam[i][j] == r)
				return fam[i][0];
	return r;
}

/* What the pattern matcher learned about a table. */
typedef struct jtab {
	uint64_t table;     /* address of the first entry */
	uint64_t ebase;     /* int32 entries are relative to this (usually `table`) */
	unsigned esize;     /* 4: int32 relative to `ebase`; 8: absolute */
	unsigned index;     /* 64-bit index register, 0 unknown */
	unsigned tbase, ebase_reg; /* table/entry base registers still to find */
	unsigned slot_base; /* index loaded from disp(slot_base), for `cmp $N, mem` */
	int64_t slot_disp;
	uint64_t count;     /* 0: unknown, read while entries are valid */
} jtab;

static bool is_reg(const cs_x86 *x, int i)
{
	return x->op_count > i && x->operands[i].type == X86_OP_REG;
}

static bool is_mem(const cs_x86 *x, int i)
{
	return x->op_count > i && x->operands[i].type == X86_OP_MEM;
}

/* A memory operand's displacement; for RIP-relative ones the address. */
static int64_t slot_disp(const cs_insn *in, const x86_op_mem *mm)
{
	return mm->base == X86_REG_RIP ? (int64_t)(in->address + in->size) + mm->disp : mm->disp;
}

/*
 * One step of the backward search for the index register's bound: 1 when
 * `cmp $N,%idx` (N+1 entries), `cmp $N,slot` for the stack slot the index
 * was loaded from (-O0), or `and $2^k-1,%idx` bounds it; 0 to go on (a move
 * into the index register switches to its source); -1 when the index was
 * computed in a way that hides its bound.
 */
static int bound_step(const cs_insn *in, jtab *t)
{
	const cs_x86 *x = &in->detail->x86;
	int64_t imm;

	if (x->op_count != 2)
		return 0;
	imm = x->operands[1].type == X86_OP_IMM ? x->operands[1].imm : -1;
	if (in->id == X86_INS_CMP && is_mem(x, 0) && t->slot_base &&
	    reg64(x->operands[0].mem.base) == t->slot_base &&
	    slot_disp(in, &x->operands[0].mem) == t->slot_disp && imm >= 0 && imm < MAX_TABLE) {
		t->count = (uint64_t)imm + 1;
		return 1;
	}
	if (!is_reg(x, 0) || reg64(x->operands[0].reg) != t->index)
		return 0;
	if (in->id == X86_INS_CMP && imm >= 0 && imm < MAX_TABLE) {
		t->count = (uint64_t)imm + 1;
		return 1;
	}
	if (in->id == X86_INS_AND && imm > 0 && imm < MAX_TABLE && ((imm + 1) & imm) == 0) {
		t->count = (uint64_t)imm + 1;
		return 1;
	}
	if ((in->id == X86_INS_MOV || in->id == X86_INS_MOVZX || in->id == X86_INS_MOVSX ||
	     in->id == X86_INS_MOVSXD) && is_reg(x, 1)) {
		t->index = reg64(x->operands[1].reg);
		return 0;
	}
	if (in->id == X86_INS_MOV && is_mem(x, 1) && x->operands[1].mem.index == X86_REG_INVALID &&
	    x->operands[1].mem.base != X86_REG_INVALID) {
		/* Loaded from a stack slot (-O0) or a global: its compare bounds it. */
		t->slot_base = reg64(x->operands[1].mem.base);
		t->slot_disp = slot_disp(in, &x->operands[1].mem);
		t->index = 0;
		return 0;
	}
	if (in->id == X86_INS_CMP || in->id == X86_INS_TEST)
		return 0;               /* reads only */
	if (in->id == X86_INS_MOVSXD || in->id == X86_INS_LEA)
		return 0;               /* the table load itself, or the base */
	return -1;
}

/*
 * The table base is often loaded once, outside the loop that dispatches
 * (`lea T(%rip),%r12` in the entry block).  Look for it among the function's
 * instructions decoded so far: exactly one RIP-relative lea into the
 * register means that is the table (or the base its entries are relative to).
 */
static uint64_t hoisted_lea(ca_work *w, unsigned reg, cs_insn *in)
{
	uint64_t found = 0;

	for (size_t i = w->cur_first; i < w->nins; i++) {
		const ca_insn *r = &w->ins[i];
		const ca_textmap *tm;
		const uint8_t *code;
		size_t left;
		uint64_t a = r->addr;
		const cs_x86 *x;

		if (!(r->flags & CA_INSF_RIPREL) || r->cls != CA_I_OTHER || r->target == found)
			continue;
		tm = ca_textmap_at(w, a);
		code = tm->sec->data + (a - tm->sec->addr);
		left = r->len;
		if (!cs_disasm_iter((csh)w->cs, &code, &left, &a, in))
			continue;
		x = &in->detail->x86;
		if (in->id != X86_INS_LEA || !is_reg(x, 0) || reg64(x->operands[0].reg) != reg)
			continue;
		if (found)
			return 0;       /* two candidates: not sure which */
		found = r->target;
	}
	return found;
}

/*
 * What the backward walk from `jmp *%want` has established.  Registers are
 * 64-bit names; 0 means not known yet.
 *
 *   want = p1 + p2            add %p2,%p1 / lea (%p1,%p2),%want
 *   loaded = one of p1, p2    the table entry; the other is the entry base
 *   loaded = *(tbase+4*index) movslq (%tbase,%index,4),%loaded
 *   loaded = *(ta + tb)       mov (%ta,%tb,1),%e.. (-O0: one is T, one 4*index)
 */
typedef struct jstate {
	unsigned want, p1, p2, loaded, ebase, tbase, ta, tb, scaled;
} jstate;

static unsigned other_of(unsigned r, unsigned a, unsigned b)
{
	return r == a ? b : a;
}

/* Feed one instruction (walking backwards); true when the table is known. */
static bool jstep(const cs_insn *in, jstate *s, jtab *t)
{
	const cs_x86 *x = &in->detail->x86;
	const x86_op_mem *mm = is_mem(x, 1) ? &x->operands[1].mem : NULL;
	unsigned dst = is_reg(x, 0) ? reg64(x->operands[0].reg) : 0;
	uint64_t rip = mm && mm->base == X86_REG_RIP ? in->address + in->size + (uint64_t)mm->disp : 0;

	if (!dst || x->op_count != 2)
		return false;
	if (!s->p1 && dst == s->want) {
		if (in->id == X86_INS_ADD && is_reg(x, 1)) {
			s->p1 = s->want;
			s->p2 = reg64(x->operands[1].reg);
		} else if (in->id == X86_INS_LEA && mm && mm->base != X86_REG_INVALID && !rip &&
			   mm->index != X86_REG_INVALID && mm->scale == 1 && mm->disp == 0) {
			s->p1 = reg64(mm->base);
			s->p2 = reg64(mm->index);
		} else if (in->id == X86_INS_MOV && mm && mm->base == X86_REG_INVALID && mm->scale == 8 &&
			   mm->index != X86_REG_INVALID) {
			t->table = (uint64_t)mm->disp;          /* mov T(,%idx,8),%want */
			t->esize = 8;
			t->index = reg64(mm->index);
			return true;
		}
		return false;
	}
	if (!s->p1)
		return false;
	if (!s->loaded && (dst == s->p1 || dst == s->p2)) {
		if (rip && in->id == X86_INS_LEA) {             /* the entry base, seen first */
			s->ebase = dst;
			t->ebase = rip;
			s->loaded = other_of(dst, s->p1, s->p2);
			return false;
		}
		if (in->id != X86_INS_MOVSXD && in->id != X86_INS_MOV)
			return false;
		s->loaded = dst;
		s->ebase = other_of(dst, s->p1, s->p2);
	}
	if (dst == s->loaded && !s->tbase && !s->ta) {
		if (in->id == X86_INS_CDQE)
			return false;
		if (in->id == X86_INS_MOVSXD && mm && mm->scale == 4 && mm->base != X86_REG_INVALID) {
			s->tbase = reg64(mm->base);
			t->index = reg64(mm->index);
		} else if (in->id == X86_INS_MOV && mm && mm->scale == 1 && mm->index != X86_REG_INVALID &&
			   mm->base != X86_REG_INVALID && !rip) {
			s->ta = reg64(mm->base);
			s->tb = reg64(mm->index);
		}
		return false;
	}
	if (rip && in->id == X86_INS_LEA) {
		if (dst == s->ebase && !t->ebase)
			t->ebase = rip;
		if (dst == s->tbase && !t->table)
			t->table = rip;
		if ((dst == s->ta || dst == s->tb) && !t->table) {
			t->table = rip;
			s->scaled = other_of(dst, s->ta, s->tb);
		}
	} else if (dst == s->scaled && in->id == X86_INS_LEA && mm && mm->base == X86_REG_INVALID &&
		   mm->scale == 4 && mm->disp == 0) {
		t->index = reg64(mm->index);                    /* lea 0(,%idx,4),%scaled */
		s->scaled = 0;
	}
	t->esize = 4;
	return t->table && t->ebase && t->index;
}

/*
 * Recognise the table behind `jmp *%reg` or `jmp *T(,%idx,8)` from the
 * instructions before it on the same path (re-decoded here; this is rare):
 *   PIC (gcc, clang):  lea T(%rip),%rB; movslq (%rB,%rI,4),%rX; add %rB,%rX; jmp *%rX
 *   computed goto:     as PIC, with entries relative to another label
 *   -O0:               mov (%rA,%rB,1),%eX; cltq; lea T(%rip),%rB; add %rB,%rX; jmp *%rX
 *   non-PIC:           jmp *T(,%rI,8)   or   mov T(,%rI,8),%rX; jmp *%rX
 * and its bound from `cmp $N,%rI` (N+1 entries).
 */
static bool match_table(ca_work *w, const uint64_t *hist, int nh, const cs_insn *jmp, jtab *t)
{
	const cs_x86 *jx = &jmp->detail->x86;
	cs_insn *in = cs_malloc((csh)w->cs);
	jstate s = { 0 };
	bool found = false;

	memset(t, 0, sizeof *t);
	if (!in)
		return false;
	if (is_mem(jx, 0)) {
		const x86_op_mem *mm = &jx->operands[0].mem;

		if (mm->base != X86_REG_INVALID || mm->scale != 8 || mm->index == X86_REG_INVALID)
			goto out;
		*t = (jtab){ .table = (uint64_t)mm->disp, .esize = 8, .index = reg64(mm->index) };
		found = true;
	} else {
		s.want = reg64(jx->operands[0].reg);
	}
	for (int i = nh - 1; i >= 0; i--) {
		const ca_textmap *tm = ca_textmap_at(w, hist[i]);
		const uint8_t *code;
		size_t left;
		uint64_t a = hist[i];
		int b;

		if (!tm)
			break;
		code = tm->sec->data + (a - tm->sec->addr);
		left = tm->sec->size - (a - tm->sec->addr);
		if (!cs_disasm_iter((csh)w->cs, &code, &left, &a, in))
			break;
		if ((t->index || t->slot_base) && (b = bound_step(in, t)) != 0) {
			if (b > 0 || found)
				break;          /* bound found, or lost after the table was */
			t->index = t->slot_base = 0;
		}
		if (!found)
			found = jstep(in, &s, t);
	}
	if (!found && s.tbase) {
		/* The base comes from outside this path: the caller looks for it
		 * once the whole function is decoded. */
		t->tbase = s.tbase;
		t->ebase_reg = s.ebase;
		t->esize = 4;
		found = true;
	}
	if (found && t->esize == 8)
		t->ebase = 0;
	if (!found)
		t->count = 0;
out:
	cs_free(in, 1);
	return found;
}

/* The nearest address above `table` that another instruction of this
 * function refers to: an unbounded table cannot extend past it. */
static uint64_t next_data_ref(const ca_work *w, uint64_t table)
{
	uint64_t next = UINT64_MAX;

	for (size_t i = w->cur_first; i < w->nins; i++)
		if ((w->ins[i].flags & CA_INSF_RIPREL) && w->ins[i].target > table &&
		    w->ins[i].target < next)
			next = w->ins[i].target;
	return next;
}

static int push_work(ca_work *w, uint64_t a)
{
	if (sp_grow((void **)&w->work, &w->capwork, w->nwork + 1, sizeof *w->work))
		return -1;
	w->work[w->nwork++] = a;
	return 0;
}

static bool in_range(const ca_wfunc *fn, uint64_t a)
{
	return a >= fn->addr && a < fn->limit;
}

/* Read the table's entries; push valid targets.  Returns targets found. */
static int read_table(ca_work *w, const ca_wfunc *fn, uint32_t insn, const jtab *t)
{
	uint64_t max = t->count ? t->count : MAX_TABLE;
	uint64_t end = t->count ? UINT64_MAX : next_data_ref(w, t->table);
	int n = 0;

	for (uint64_t i = 0; i < max && t->table + i * t->esize < end; i++) {
		const ca_textmap *tm;
		uint64_t target;

		if (t->esize == 4) {
			int32_t e;
			if (!ca_elf_read(w->e, t->table + 4 * i, &e, 4))
				break;
			target = t->ebase + (uint64_t)(int64_t)e;
		} else {
			uint64_t e;
			if (!ca_elf_read(w->e, t->table + 8 * i, &e, 8))
				break;
			target = e;
		}
		/* A bounded table skips entries outside the function (they go to
		 * its .cold part, decoded on its own).  An unbounded one ends at
		 * the first entry that is not code at all; relative entries, which
		 * random data imitates easily, also end at the first one outside
		 * the function. */
		tm = ca_textmap_at(w, target);
		if (!tm || (tm->covered[target - tm->sec->addr] && !tm->start[target - tm->sec->addr])) {
			if (t->count)
				continue;       /* not code, or inside a decoded instruction */
			break;
		}
		if (!in_range(fn, target)) {
			if (t->count || t->esize == 8)
				continue;
			break;
		}
		if (sp_grow((void **)&w->jt, &w->capjt, w->njt + 1, sizeof *w->jt) ||
		    push_work(w, target))
			return -1;
		w->jt[w->njt++] = (ca_jtarget){ insn, target };
		n++;
	}
	return n;
}

static int use_table(ca_work *w, uint32_t f, uint32_t idx, const jtab *t)
{
	int n = read_table(w, &w->fn[f], idx, t);

	if (n > 0) {
		w->ins[idx].flags |= CA_INSF_TABLE;
		w->m->stats.njump_tables++;
		w->m->stats.njump_table_targets += (uint32_t)n;
	}
	return n;
}

/* ---- decoding one function ---- */

static int add_insn(ca_work *w, ca_textmap *tm, const cs_insn *in, uint32_t f, uint32_t *idx)
{
	size_t off = in->address - tm->sec->addr;
	ca_insn *r;

	if (sp_grow((void **)&w->ins, &w->capins, w->nins + 1, sizeof *w->ins))
		return -1;
	r = &w->ins[w->nins];
	memset(r, 0, sizeof *r);
	r->addr = in->address;
	r->len = (uint8_t)in->size;
	r->func = f;
	classify(in, r);
	tm->start[off] = (uint32_t)w->nins + 1;
	memset(tm->covered + off, 1, in->size);
	*idx = (uint32_t)w->nins++;
	return 0;
}

/* Follow the flow from `start` until a path ends.  `rootflag` marks it. */
static int follow(ca_work *w, uint32_t f, cs_insn *in, uint8_t rootflag)
{
	csh cs = (csh)w->cs;

	/* rootflag marks the root only, not the branch targets found from it. */
	while (w->nwork) {
		uint64_t a = w->work[--w->nwork], hist[HIST];
		int nh = 0;
		uint8_t flag = rootflag;

		rootflag = 0;

		for (;;) {
			ca_wfunc *fn = &w->fn[f];
			ca_textmap *tm = ca_textmap_at(w, a);
			const uint8_t *code;
			size_t off, left;
			uint64_t pc = a;
			uint32_t idx;
			ca_insn *r;

			if (!tm || !in_range(fn, a))
				break;
			off = a - tm->sec->addr;
			if (tm->start[off])
				break;                  /* decoded already */
			code = tm->sec->data + off;
			left = (fn->limit < tm->sec->addr + tm->sec->size ? fn->limit
			        : tm->sec->addr + tm->sec->size) - a;
			if (!cs_disasm_iter(cs, &code, &left, &pc, in)) {
				if (sp_grow((void **)&w->undec, &w->capundec, w->nundec + 1, sizeof *w->undec))
					return -1;
				w->undec[w->nundec++] = a;
				if (nh)
					w->ins[ca_insn_at(w, hist[nh - 1])].undec = 1;
				fn->flags |= CA_FUNC_UNDECODABLE;
				break;
			}
			if (add_insn(w, tm, in, f, &idx))
				return -1;
			r = &w->ins[idx];
			r->flags |= flag;
			flag = 0;
			if (nh == HIST) {
				memmove(hist, hist + 1, (HIST - 1) * sizeof *hist);
				nh--;
			}
			hist[nh++] = a;
			a += in->size;

			if (r->cls == CA_I_CALL) {
				const ca_section *s = ca_elf_section_at(w->e, r->target);
				uint32_t callee = CA_NONE;

				if (s && s->exec) {
					callee = ca_fn_add(w, r->target, CA_SRC_CALLTARGET);
					if (callee == CA_NONE)
						return -1;
					w->fn[callee].called = true;
					r = &w->ins[idx];       /* ca_fn_add may move w->fn only */
				}
				if (callee != CA_NONE && (w->fn[callee].flags & CA_FUNC_NORETURN)) {
					r->flags |= CA_INSF_NORET;
					break;
				}
			} else if (r->cls == CA_I_JMP || r->cls == CA_I_JCC) {
				uint32_t tf = ca_fn_find(w, r->target);

				if (in_range(&w->fn[f], r->target) && (tf == CA_NONE || tf == f)) {
					if (push_work(w, r->target))
						return -1;
				} else if (tf != CA_NONE && tf != f && w->fn[tf].jumped_from == CA_NONE) {
					w->fn[tf].jumped_from = f;
				} else if (tf == CA_NONE && !in_range(&w->fn[f], r->target)) {
					if (sp_grow((void **)&w->jout, &w->capjout, w->njout + 1,
						    sizeof *w->jout))
						return -1;
					w->jout[w->njout++] = r->target;
				}
				if (r->cls == CA_I_JMP)
					break;
			} else if (r->cls == CA_I_JMP_IND) {
				jtab t;

				if (in->detail->x86.op_count == 1 && match_table(w, hist, nh - 1, in, &t)) {
					/* An unbounded table is read once everything
					 * else of the function is decoded: the other
					 * data it refers to ends the table, and a target
					 * inside a decoded instruction is recognised. */
					if (!t.count || t.tbase) {
						if (sp_grow((void **)&w->deferred, &w->capdeferred,
							    w->ndeferred + 1, sizeof *w->deferred))
							return -1;
						w->deferred[w->ndeferred++] = (ca_deferred){
							idx, t.table, t.ebase, t.esize, t.count,
							t.tbase, t.ebase_reg };
						break;
					}
					if (use_table(w, f, idx, &t) < 0)
						return -1;
				}
				break;
			} else if (r->cls == CA_I_RET || r->cls == CA_I_STOP) {
				break;
			}
		}
	}
	return 0;
}

/* Is the instruction at `a` padding (nop, int3)?  Sets *len. */
static bool is_padding(ca_work *w, cs_insn *in, uint64_t a, uint64_t end, size_t *len)
{
	ca_textmap *tm = ca_textmap_at(w, a);
	const uint8_t *code;
	size_t left;
	uint64_t pc = a;

	if (!tm)
		return false;
	code = tm->sec->data + (a - tm->sec->addr);
	if (*code == 0x00 || *code == 0xcc) {
		*len = 1;
		return true;
	}
	left = end - a;
	if (!cs_disasm_iter((csh)w->cs, &code, &left, &pc, in))
		return false;
	*len = in->size;
	return in->id == X86_INS_NOP || in->id == X86_INS_INT3 ||
	       (in->id == X86_INS_XCHG && in->size <= 2 && in->bytes[in->size - 1] == 0x90);
}

static bool is_undec_point(const ca_work *w, uint64_t a)
{
	for (size_t i = 0; i < w->nundec; i++)
		if (w->undec[i] == a)
			return true;
	return false;
}

/*
 * Sweep the holes of a function with a known size: the first byte of a hole
 * that is not padding becomes a new root.  Undecodable bytes are skipped to
 * the next decoded instruction (there is nothing to resynchronise on).
 */
static int sweep_holes(ca_work *w, uint32_t f, cs_insn *in)
{
	uint64_t a = w->fn[f].addr, end = w->fn[f].limit;

	while (a < end) {
		ca_textmap *tm = ca_textmap_at(w, a);
		size_t len;

		if (!tm)
			break;
		if (tm->covered[a - tm->sec->addr]) {
			a++;
			continue;
		}
		if (is_undec_point(w, a)) {
			while (a < end && ca_textmap_at(w, a) == tm && !tm->covered[a - tm->sec->addr])
				a++;
			continue;
		}
		if (is_padding(w, in, a, end, &len)) {
			a += len;
			continue;
		}
		if (push_work(w, a) || follow(w, f, in, CA_INSF_SWEPT))
			return -1;
		if (!tm->covered[a - tm->sec->addr])
			a++;    /* undecodable root: recorded by follow */
	}
	return 0;
}

/* Decode function `f` within [addr, limit). */
static int decode_function(ca_work *w, uint32_t f, cs_insn *in)
{
	ca_wfunc *fn = &w->fn[f];

	fn->decoded = true;
	w->nwork = 0;
	w->cur_first = w->nins;
	if (push_work(w, fn->addr) || follow(w, f, in, 0))
		return -1;
	for (uint32_t i = 0; i < w->fn[f].npads; i++) {
		uint64_t pad = w->fn[f].pads[i];

		uint32_t idx;

		if (!in_range(&w->fn[f], pad))
			continue;
		if (push_work(w, pad) || follow(w, f, in, 0))
			return -1;
		/* Several call sites share a pad; count and mark it once. */
		idx = ca_insn_at(w, pad);
		if (idx != CA_NONE && !(w->ins[idx].flags & CA_INSF_PAD)) {
			w->ins[idx].flags |= CA_INSF_PAD;
			w->m->stats.nlanding_pads++;
		}
	}
	while (w->ndeferred) {
		ca_deferred d = w->deferred[--w->ndeferred];
		jtab t = { .table = d.table, .ebase = d.ebase, .esize = d.esize, .count = d.count };

		if (d.tbase) {
			t.table = hoisted_lea(w, d.tbase, in);
			t.ebase = d.tbase == d.ebase_reg ? t.table : hoisted_lea(w, d.ebase_reg, in);
			if (!t.table || !t.ebase)
				continue;       /* stays an indirect jump */
		}
		if (use_table(w, f, d.insn, &t) < 0 || follow(w, f, in, 0))
			return -1;
	}
	if (w->fn[f].size && sweep_holes(w, f, in))
		return -1;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Limits: a function with a known size stays inside it; one without stays
 * below the next known start.  Neither runs past the next start that a symbol
 * or an FDE vouches for.
 */
static int set_limits(ca_work *w)
{
	uint64_t *starts = malloc((w->nfn + 1) * sizeof *starts);
	size_t n = 0;

	if (!starts)
		return -1;
	for (size_t i = 0; i < w->nfn; i++)
		starts[n++] = w->fn[i].addr;
	qsort(starts, n, sizeof *starts, cmp_u64);
	for (size_t i = 0; i < w->nfn; i++) {
		ca_wfunc *fn = &w->fn[i];
		const ca_section *s = ca_elf_section_at(w->e, fn->addr);
		size_t lo = 0, hi = n;
		uint64_t next, secend = s ? s->addr + s->size : fn->addr;

		if (fn->decoded)
			continue;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (starts[mid] <= fn->addr)
				lo = mid + 1;
			else
				hi = mid;
		}
		next = lo < n ? starts[lo] : secend;
		if (next > secend)
			next = secend;
		if (fn->size && fn->addr + fn->size <= secend) {
			uint64_t end = fn->addr + fn->size;
			uint32_t nf = ca_fn_find(w, next);
			bool strong = nf != CA_NONE && (w->fn[nf].sources &
				      (CA_SRC_SYMTAB | CA_SRC_DYNSYM | CA_SRC_EHFRAME | CA_SRC_PLT));

			fn->limit = end <= next || !strong ? end : next;
		} else {
			fn->limit = next;
		}
		if (fn->size && fn->limit < fn->addr + fn->size)
			fn->size = fn->limit - fn->addr;
	}
	free(starts);
	return 0;
}

typedef struct range {
	uint64_t start, end;
} range;

static int cmp_range(const void *a, const void *b)
{
	const range *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/*
 * A jump out of a function to an address that no known function covers is a
 * tail call to a function that has neither symbol nor FDE (asm without CFI,
 * register_tm_clones).  Returns how many functions were added.
 */
static int add_jump_targets(ca_work *w)
{
	range *r = malloc((w->nfn + 1) * sizeof *r);
	size_t n = 0;
	int added = 0;

	if (!r)
		return -1;
	for (size_t i = 0; i < w->nfn; i++)
		r[n++] = (range){ w->fn[i].addr, w->fn[i].addr + (w->fn[i].size ? w->fn[i].size : 1) };
	qsort(r, n, sizeof *r, cmp_range);
	for (size_t j = 0; j < w->njout; j++) {
		uint64_t a = w->jout[j];
		ca_textmap *tm = ca_textmap_at(w, a);
		size_t lo = 0, hi = n;
		bool inside = false;

		if (!tm || tm->covered[a - tm->sec->addr] || ca_fn_find(w, a) != CA_NONE)
			continue;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (r[mid].start <= a)
				lo = mid + 1;
			else
				hi = mid;
		}
		/* Ranges may nest (a symbol inside an FDE): look back a little. */
		for (size_t k = lo; k > 0 && k + 8 > lo && !inside; k--)
			inside = a >= r[k - 1].start && a < r[k - 1].end;
		if (inside)
			continue;
		if (ca_fn_add(w, a, CA_SRC_JUMPTARGET) == CA_NONE) {
			free(r);
			return -1;
		}
		added++;
	}
	w->njout = 0;
	free(r);
	return added;
}

int ca_disasm_pending(ca_work *w, sp_err *err)
{
	cs_insn *in = cs_malloc((csh)w->cs);
	int rc = 0;

	if (!in)
		return sp_fail(err, "out of memory");
	/* Functions found while decoding (call targets) are decoded in turn. */
	for (size_t done = 0; done < w->nfn && rc == 0;) {
		if (set_limits(w)) {
			rc = -1;
			break;
		}
		size_t upto = w->nfn;
		for (size_t f = done; f < upto; f++) {
			if (w->fn[f].decoded)
				continue;
			if (decode_function(w, (uint32_t)f, in)) {
				rc = -1;
				break;
			}
		}
		done = upto;
		if (rc == 0 && done == w->nfn && w->njout) {
			int added = add_jump_targets(w);
			if (added < 0)
				rc = -1;
		}
	}
	cs_free(in, 1);
	if (rc)
		return sp_fail(err, "%s: out of memory while disassembling", w->e->path);
	return 0;
}

/* ---- blocks and edges ---- */

static int cmp_insn_addr(const void *a, const void *b, void *ctx)
{
	const ca_insn *ins = ctx;
	uint64_t x = ins[*(const uint32_t *)a].addr, y = ins[*(const uint32_t *)b].addr;

	return x < y ? -1 : x > y;
}

static int cmp_fn_addr(const void *a, const void *b, void *ctx)
{
	const ca_wfunc *fn = ctx;
	uint64_t x = fn[*(const uint32_t *)a].addr, y = fn[*(const uint32_t *)b].addr;

	return x < y ? -1 : x > y;
}

/* Group instructions by function, in address order; final function order. */
int ca_disasm_order(ca_work *w)
{
	uint32_t *count = calloc(w->nfn + 1, sizeof *count);

	w->order = malloc((w->nins + 1) * sizeof *w->order);
	w->fmap = malloc((w->nfn + 1) * sizeof *w->fmap);
	if (!count || !w->order || !w->fmap) {
		free(count);
		return -1;
	}
	for (size_t i = 0; i < w->nins; i++)
		count[w->ins[i].func]++;
	for (size_t f = 0, pos = 0; f < w->nfn; f++) {
		w->fn[f].first_insn = (uint32_t)pos;
		w->fn[f].ninsns = 0;
		pos += count[f];
	}
	for (size_t i = 0; i < w->nins; i++) {
		ca_wfunc *fn = &w->fn[w->ins[i].func];
		w->order[fn->first_insn + fn->ninsns++] = (uint32_t)i;
	}
	for (size_t f = 0; f < w->nfn; f++)
		qsort_r(w->order + w->fn[f].first_insn, w->fn[f].ninsns, sizeof *w->order,
			cmp_insn_addr, w->ins);
	for (size_t f = 0; f < w->nfn; f++)
		w->fmap[f] = (uint32_t)f;
	qsort_r(w->fmap, w->nfn, sizeof *w->fmap, cmp_fn_addr, w->fn);
	for (size_t i = 0; i < w->nfn; i++)
		w->fn[w->fmap[i]].final = (uint32_t)i;
	free(count);
	return 0;
}

static bool ends_block(const ca_insn *r)
{
	return r->cls == CA_I_JMP || r->cls == CA_I_JCC || r->cls == CA_I_JMP_IND ||
	       r->cls == CA_I_RET || r->cls == CA_I_STOP || (r->flags & CA_INSF_NORET) || r->undec;
}

static void mark_leader(ca_work *w, uint32_t f, uint64_t a)
{
	uint32_t i = ca_insn_at(w, a);

	if (i != CA_NONE && w->ins[i].func == f)
		w->ins[i].flags |= CA_INSF_LEADER;
}

static void mark_leaders(ca_work *w, uint32_t f)
{
	const ca_wfunc *fn = &w->fn[f];

	for (uint32_t k = 0; k < fn->ninsns; k++) {
		ca_insn *r = &w->ins[w->order[fn->first_insn + k]];

		if (k == 0 || r->addr == fn->addr || (r->flags & (CA_INSF_PAD | CA_INSF_SWEPT)))
			r->flags |= CA_INSF_LEADER;
		if ((r->cls == CA_I_JMP || r->cls == CA_I_JCC) && in_range(fn, r->target))
			mark_leader(w, f, r->target);
		if (k + 1 < fn->ninsns) {
			ca_insn *nx = &w->ins[w->order[fn->first_insn + k + 1]];
			if (ends_block(r) || nx->addr != r->addr + r->len)
				nx->flags |= CA_INSF_LEADER;
		}
	}
}

static uint32_t block_at(const ca_module *m, uint32_t first, uint32_t n, uint64_t a)
{
	uint32_t lo = first, hi = first + n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (m->blocks[mid].addr < a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < first + n && m->blocks[lo].addr == a ? lo : CA_NONE;
}

static int add_edge(ca_module *m, uint32_t to, uint32_t kind)
{
	if (to == CA_NONE)
		return 0;
	if (sp_grow((void **)&m->edges, &m->capedges, m->nedges + 1, sizeof *m->edges))
		return -1;
	m->edges[m->nedges++] = (ca_edge){ to, kind };
	return 0;
}

static int cmp_jt(const void *a, const void *b)
{
	const ca_jtarget *x = a, *y = b;

	if (x->insn != y->insn)
		return x->insn < y->insn ? -1 : 1;
	return x->target < y->target ? -1 : x->target > y->target;
}

static int block_edges(ca_work *w, uint32_t f, ca_block *b, const ca_insn *last, uint32_t lastidx)
{
	ca_module *m = w->m;
	const ca_func *mf = &m->funcs[w->fn[f].final];
	uint32_t first = mf->first_block, n = mf->nblocks;
	uint64_t next = last->addr + last->len;
	bool intra = in_range(&w->fn[f], last->target);

	b->first_edge = (uint32_t)m->nedges;
	switch (last->cls) {
	case CA_I_JCC:
		if (add_edge(m, intra ? block_at(m, first, n, last->target) : CA_NONE, CA_EDGE_TAKEN) ||
		    add_edge(m, block_at(m, first, n, next), CA_EDGE_NOT_TAKEN))
			return -1;
		if (!intra)
			b->flags |= CA_BLOCK_TAIL;
		break;
	case CA_I_JMP:
		if (intra) {
			if (add_edge(m, block_at(m, first, n, last->target), CA_EDGE_JUMP))
				return -1;
		} else {
			b->flags |= CA_BLOCK_TAIL;
		}
		break;
	case CA_I_JMP_IND:
		if (last->flags & CA_INSF_TABLE) {
			ca_jtarget key = { lastidx, 0 };
			size_t lo = 0, hi = w->njt;
			uint64_t prev = 0;

			while (lo < hi) {
				size_t mid = (lo + hi) / 2;
				if (cmp_jt(&w->jt[mid], &key) < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			for (; lo < w->njt && w->jt[lo].insn == lastidx; lo++) {
				if (w->jt[lo].target == prev)
					continue;
				prev = w->jt[lo].target;
				if (add_edge(m, block_at(m, first, n, prev), CA_EDGE_TABLE))
					return -1;
			}
		} else {
			b->flags |= CA_BLOCK_TAIL | CA_BLOCK_INDIRECT;
		}
		break;
	case CA_I_RET:
		b->flags |= CA_BLOCK_RET;
		break;
	case CA_I_STOP:
		break;
	default:
		if (last->flags & CA_INSF_NORET)
			b->flags |= CA_BLOCK_NORETURN;
		else if (!last->undec && add_edge(m, block_at(m, first, n, next), CA_EDGE_FALLTHROUGH))
			return -1;
		break;
	}
	if (last->undec)
		b->flags |= CA_BLOCK_UNDECODABLE;
	b->nedges = (uint16_t)(m->nedges - b->first_edge);
	return 0;
}

static int build_function(ca_work *w, uint32_t f)
{
	ca_module *m = w->m;
	const ca_wfunc *fn = &w->fn[f];
	ca_func *mf = &m->funcs[fn->final];

	mark_leaders(w, f);
	mf->first_block = (uint32_t)m->nblocks;
	for (uint32_t k = 0; k < fn->ninsns; k++) {
		const ca_insn *r = &w->ins[w->order[fn->first_insn + k]];
		ca_block *b;

		if (r->flags & CA_INSF_LEADER) {
			if (sp_grow((void **)&m->blocks, &m->capblocks, m->nblocks + 1, sizeof *m->blocks))
				return -1;
			b = &m->blocks[m->nblocks++];
			memset(b, 0, sizeof *b);
			b->addr = r->addr;
			b->func = fn->final;
			if (r->addr == fn->addr)
				b->flags |= CA_BLOCK_ENTRY;
			if (r->flags & CA_INSF_PAD)
				b->flags |= CA_BLOCK_LANDING_PAD;
			if (r->flags & CA_INSF_SWEPT)
				b->flags |= CA_BLOCK_SWEPT;
		}
		if (m->nblocks == mf->first_block)
			continue;
		b = &m->blocks[m->nblocks - 1];
		b->size = (uint32_t)(r->addr + r->len - b->addr);
		b->ninsns++;
	}
	mf->nblocks = (uint32_t)(m->nblocks - mf->first_block);
	/* Edges need every block of the function to exist first. */
	for (uint32_t k = 0, bi = mf->first_block; k < fn->ninsns; k++) {
		uint32_t idx = w->order[fn->first_insn + k];
		const ca_insn *r = &w->ins[idx];
		bool last = k + 1 == fn->ninsns ||
			    (w->ins[w->order[fn->first_insn + k + 1]].flags & CA_INSF_LEADER);

		if (last && block_edges(w, f, &m->blocks[bi++], r, idx))
			return -1;
	}
	return 0;
}

static char *func_name(ca_work *w, const ca_wfunc *fn, char *buf, size_t len)
{
	if (fn->name && (fn->flags & CA_FUNC_PLT))
		snprintf(buf, len, "%s@plt", fn->name);
	else if (fn->name)
		snprintf(buf, len, "%s", fn->name);
	else
		snprintf(buf, len, "sub_%llx", (unsigned long long)fn->addr);
	return buf;
}

int ca_blocks_build(ca_work *w, sp_err *err)
{
	ca_module *m = w->m;
	char name[1024];

	if (w->njt)
		qsort(w->jt, w->njt, sizeof *w->jt, cmp_jt);
	/* Calls to functions found noreturn after they were decoded. */
	for (size_t i = 0; i < w->nins; i++) {
		ca_insn *r = &w->ins[i];
		uint32_t callee = r->cls == CA_I_CALL ? ca_fn_find(w, r->target) : CA_NONE;

		if (callee != CA_NONE && (w->fn[callee].flags & CA_FUNC_NORETURN))
			r->flags |= CA_INSF_NORET;
	}
	m->funcs = calloc(w->nfn + 1, sizeof *m->funcs);
	if (!m->funcs)
		return sp_fail(err, "out of memory");
	m->nfuncs = m->capfuncs = w->nfn;
	for (size_t i = 0; i < w->nfn; i++) {
		const ca_wfunc *fn = &w->fn[w->fmap[i]];
		ca_func *mf = &m->funcs[i];

		mf->addr = fn->addr;
		mf->size = fn->size;
		if (!mf->size && fn->ninsns) {
			const ca_insn *last = &w->ins[w->order[fn->first_insn + fn->ninsns - 1]];
			mf->size = last->addr + last->len - fn->addr;
		}
		mf->name = ca_str_add(m, func_name(w, fn, name, sizeof name));
		if (mf->name == CA_NONE)
			return sp_fail(err, "out of memory");
		mf->parent = fn->parent == CA_NONE ? CA_NONE : w->fn[fn->parent].final;
		mf->sources = fn->sources;
		mf->flags = fn->flags | (fn->name ? CA_FUNC_NAMED : 0);
		mf->ninsns = fn->ninsns;
		mf->first_site = 0;
	}
	for (size_t i = 0; i < w->nfn; i++)
		if (build_function(w, w->fmap[i]))
			return sp_fail(err, "out of memory");
	return 0;
}
