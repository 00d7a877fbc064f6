/*
 * ehframe.c — function ranges from .eh_frame, and exception landing pads from
 * the LSDAs in .gcc_except_table.
 *
 * In a stripped binary the FDEs are the best source of function starts and
 * sizes: the unwinder needs one for nearly every function, so they survive
 * `strip`.  Landing pads are reached only by the unwinder, never by a branch,
 * so recursive traversal needs them as extra roots or it misses the calls in
 * cleanup code.
 *
 * Hand-written rather than through libdwarf: we need only two numbers per FDE
 * plus the first few CFA instructions (to tell a .cold piece, whose CFI starts
 * mid-function, from a real entry), it must work on binaries with no other
 * DWARF, and every read is bounds-checked so this parser can be fuzzed.
 */
#include "ca_internal.h"

#include <stdlib.h>
#include <string.h>

/* A bounds-checked reader over bytes that live at virtual address `addr`. */
typedef struct cursor {
	const uint8_t *p, *end;
	uint64_t addr;  /* virtual address of *p */
	bool bad;
} cursor;

static uint64_t rd_bytes(cursor *c, unsigned n)
{
	uint64_t v = 0;
	unsigned i;

	if (c->bad || (size_t)(c->end - c->p) < n) {
		c->bad = true;
		return 0;
	}
	for (i = 0; i < n; i++)
		v |= (uint64_t)c->p[i] << (8 * i);
	c->p += n;
	c->addr += n;
	return v;
}

static uint64_t rd_uleb(cursor *c)
{
	uint64_t v = 0;
	unsigned shift = 0;

	while (!c->bad) {
		uint8_t b;

		if (c->p >= c->end) {
			c->bad = true;
			break;
		}
		b = *c->p++;
		c->addr++;
		if (shift < 64)
			v |= (uint64_t)(b & 0x7f) << shift;
		shift += 7;
		if (!(b & 0x80))
			break;
	}
	return v;
}

static int64_t rd_sleb(cursor *c)
{
	uint64_t v = 0;
	unsigned shift = 0;
	uint8_t b = 0;

	while (!c->bad) {
		if (c->p >= c->end) {
			c->bad = true;
			return 0;
		}
		b = *c->p++;
		c->addr++;
		if (shift < 64)
			v |= (uint64_t)(b & 0x7f) << shift;
		shift += 7;
		if (!(b & 0x80))
			break;
	}
	if (shift < 64 && (b & 0x40))
		v |= ~(uint64_t)0 << shift;
	return (int64_t)v;
}

enum { PE_OMIT = 0xff, PE_INDIRECT = 0x80 };

/* Read a DW_EH_PE-encoded pointer.  `base_func` serves DW_EH_PE_funcrel. */
static uint64_t rd_encoded(cursor *c, uint8_t enc, uint64_t base_func)
{
	uint64_t field = c->addr, v;

	switch (enc & 0x0f) {
	case 0x00: v = rd_bytes(c, 8); break;
	case 0x01: v = rd_uleb(c); break;
	case 0x02: v = rd_bytes(c, 2); break;
	case 0x03: v = rd_bytes(c, 4); break;
	case 0x04: v = rd_bytes(c, 8); break;
	case 0x09: v = (uint64_t)rd_sleb(c); break;
	case 0x0a: v = (uint64_t)(int64_t)(int16_t)rd_bytes(c, 2); break;
	case 0x0b: v = (uint64_t)(int64_t)(int32_t)rd_bytes(c, 4); break;
	case 0x0c: v = rd_bytes(c, 8); break;
	default: c->bad = true; return 0;
	}
	switch (enc & 0x70) {
	case 0x00: break;
	case 0x10: v += field; break;
	case 0x40: v += base_func; break;
	default: c->bad = true; return 0; /* textrel/datarel/aligned: not used on x86-64 */
	}
	return v;
}

/* The part of a CIE that its FDEs need. */
typedef struct cie_info {
	uint8_t fde_enc, lsda_enc;
	bool has_z;
	uint64_t code_align;
	int64_t data_align;
	const uint8_t *ins, *end;  /* initial instructions */
} cie_info;

static bool parse_cie(cursor c, cie_info *ci)
{
	const char *aug;
	size_t auglen;
	uint8_t version;

	memset(ci, 0, sizeof *ci);
	ci->lsda_enc = PE_OMIT;
	version = (uint8_t)rd_bytes(&c, 1);
	if (c.bad || (version != 1 && version != 3 && version != 4))
		return false;
	aug = (const char *)c.p;
	auglen = strnlen(aug, (size_t)(c.end - c.p));
	if (auglen == (size_t)(c.end - c.p))
		return false;
	c.p += auglen + 1;
	c.addr += auglen + 1;
	if (strstr(aug, "eh"))
		return false;           /* pre-GCC-3 format, never seen on x86-64 */
	if (version == 4)
		rd_bytes(&c, 2);        /* address_size, segment_size */
	ci->code_align = rd_uleb(&c);
	ci->data_align = rd_sleb(&c);
	if (version == 1)
		rd_bytes(&c, 1);
	else
		rd_uleb(&c);            /* return address register */
	ci->end = c.end;
	if (aug[0] != 'z') {
		ci->ins = c.p;
		return !c.bad;
	}
	ci->has_z = true;
	{
		uint64_t alen = rd_uleb(&c);    /* augmentation data length */

		if (c.bad || alen > (uint64_t)(c.end - c.p))
			return false;
		ci->ins = c.p + alen;
	}
	for (const char *a = aug + 1; *a && !c.bad; a++) {
		switch (*a) {
		case 'R': ci->fde_enc = (uint8_t)rd_bytes(&c, 1); break;
		case 'L': ci->lsda_enc = (uint8_t)rd_bytes(&c, 1); break;
		case 'P': {
			uint8_t penc = (uint8_t)rd_bytes(&c, 1);
			rd_encoded(&c, penc & 0x7f, 0);
			break;
		}
		case 'S': case 'B': case 'G': break;
		default: return false;  /* unknown augmentation: cannot skip it safely */
		}
	}
	return !c.bad;
}

/*
 * Does the FDE's CFI start in the middle of a function?  A real entry starts
 * with the CIE's state (CFA = rsp+8, nothing saved); a .cold or .part piece
 * entered by a jump starts with a larger CFA offset or saved registers, stated
 * before the first advance_loc.
 */
static bool cfi_starts_mid(cursor c)
{
	while (!c.bad && c.p < c.end) {
		uint8_t op = (uint8_t)rd_bytes(&c, 1);

		if (op == 0)            /* DW_CFA_nop */
			continue;
		if ((op & 0xc0) == 0x40)/* advance_loc */
			return false;
		if ((op & 0xc0) == 0x80)/* offset: a register is already saved */
			return true;
		switch (op) {
		case 0x02: case 0x03: case 0x04: /* advance_loc1/2/4 */
			return false;
		case 0x0e:                       /* def_cfa_offset */
			return rd_uleb(&c) != 8;
		case 0x0c: {                     /* def_cfa reg, off */
			uint64_t reg = rd_uleb(&c), off = rd_uleb(&c);
			return reg != 7 || off != 8;
		}
		case 0x0f: case 0x10: case 0x05: case 0x11: /* expressions, offset_extended */
			return true;
		default:
			return false;
		}
	}
	return false;
}

/* Landing pads of one LSDA (GCC's .gcc_except_table format). */
static int parse_lsda(ca_elf *e, uint64_t lsda, uint64_t func, size_t *cap)
{
	const ca_section *s = ca_elf_section_at(e, lsda);
	cursor c;
	uint8_t lpenc, ttenc, csenc;
	uint64_t lpstart = func, cslen;
	const uint8_t *csend;

	if (!s || !s->data)
		return 0;
	c = (cursor){ s->data + (lsda - s->addr), s->data + s->size, lsda, false };
	lpenc = (uint8_t)rd_bytes(&c, 1);
	if (lpenc != PE_OMIT)
		lpstart = rd_encoded(&c, lpenc, func);
	ttenc = (uint8_t)rd_bytes(&c, 1);
	if (ttenc != PE_OMIT)
		rd_uleb(&c);
	csenc = (uint8_t)rd_bytes(&c, 1);
	cslen = rd_uleb(&c);
	if (c.bad || cslen > (uint64_t)(c.end - c.p))
		return 0;
	csend = c.p + cslen;
	while (!c.bad && c.p < csend) {
		uint64_t lp;

		rd_encoded(&c, csenc, 0);       /* start */
		rd_encoded(&c, csenc, 0);       /* length */
		lp = rd_encoded(&c, csenc, 0);
		rd_uleb(&c);                    /* action */
		if (c.bad || lp == 0)
			continue;
		if (sp_grow((void **)&e->pads, cap, e->npads + 1, sizeof *e->pads))
			return -1;
		e->pads[e->npads++] = lpstart + lp;
	}
	return 0;
}

static int cmp_fde(const void *a, const void *b)
{
	const ca_fde *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

static int parse_fde(ca_elf *e, cursor c, const cie_info *ci, size_t *capf, size_t *capp)
{
	uint64_t start, range, lsda = 0;
	ca_fde *f;

	start = rd_encoded(&c, ci->fde_enc, 0);
	range = rd_encoded(&c, ci->fde_enc & 0x0f, 0);
	if (ci->has_z) {
		uint64_t alen = rd_uleb(&c);
		cursor a = c;

		if (alen > (uint64_t)(c.end - c.p))
			return 0;
		if (ci->lsda_enc != PE_OMIT && alen > 0)
			lsda = rd_encoded(&a, ci->lsda_enc & 0x7f, start);
		c.p += alen;
		c.addr += alen;
	}
	if (c.bad || range == 0 || start == 0)
		return 0;
	if (sp_grow((void **)&e->fdes, capf, e->nfdes + 1, sizeof *e->fdes))
		return -1;
	f = &e->fdes[e->nfdes++];
	*f = (ca_fde){ .start = start, .size = range, .first_pad = (uint32_t)e->npads,
		       .mid = cfi_starts_mid(c), .cie_ins = ci->ins, .cie_end = ci->end,
		       .ins = c.p, .end = c.end, .code_align = ci->code_align,
		       .data_align = ci->data_align };
	if (lsda && parse_lsda(e, lsda, start, capp))
		return -1;
	f->npads = (uint32_t)(e->npads - f->first_pad);
	return 0;
}

int ca_ehframe_parse(ca_elf *e, sp_err *err)
{
	const ca_section *s = ca_elf_section_named(e, ".eh_frame");
	size_t capf = 0, capp = 0;
	cursor c;

	if (!s || !s->data)
		return 0;
	c = (cursor){ s->data, s->data + s->size, s->addr, false };
	while (!c.bad && c.p < c.end) {
		uint64_t len = rd_bytes(&c, 4), id, idaddr;
		cursor rec;

		if (c.bad || len == 0)
			break;                  /* terminator */
		if (len == 0xffffffffu)
			len = rd_bytes(&c, 8);
		if (c.bad || len > (uint64_t)(c.end - c.p) || len < 4)
			break;
		rec = (cursor){ c.p, c.p + len, c.addr, false };
		c.p += len;
		c.addr += len;
		idaddr = rec.addr;
		id = rd_bytes(&rec, 4);
		if (id == 0)
			continue;               /* a CIE; read when an FDE points at it */
		{
			uint64_t cieaddr = idaddr - id;
			cie_info ci;
			cursor cc;
			uint64_t clen;

			if (cieaddr < s->addr || cieaddr - s->addr + 8 > s->size)
				continue;
			cc = (cursor){ s->data + (cieaddr - s->addr), s->data + s->size, cieaddr, false };
			clen = rd_bytes(&cc, 4);
			if (clen == 0xffffffffu || clen < 4 || clen > (uint64_t)(cc.end - cc.p))
				continue;
			cc.end = cc.p + clen;
			if (rd_bytes(&cc, 4) != 0 || !parse_cie(cc, &ci))
				continue;
			if (parse_fde(e, rec, &ci, &capf, &capp))
				return sp_fail(err, "%s: out of memory reading .eh_frame", e->path);
		}
	}
	if (e->nfdes)
		qsort(e->fdes, e->nfdes, sizeof *e->fdes, cmp_fde);
	return 0;
}

/*
 * The CFA rule at an address: the CIE's initial instructions, then the
 * FDE's up to the last advance that does not pass addr.  Only the CFA is
 * followed (register rules are skipped); remember/restore_state keep a
 * small stack.  An indirect jump where the CFA is rsp+8 has its frame torn
 * down: a tail call (sites.c).
 */
typedef struct cfa_state {
	unsigned reg;
	int64_t off;
} cfa_state;

/* Run one CFA program; false on what it cannot follow.  *stop once an
 * advance would pass addr. */
static bool cfa_run(const ca_fde *f, cursor c, uint64_t addr, uint64_t *loc, cfa_state *st,
		    cfa_state *stack, unsigned *depth, bool *stop)
{
	while (!*stop && !c.bad && c.p < c.end) {
		uint8_t op = (uint8_t)rd_bytes(&c, 1);
		uint64_t delta = 0;

		switch (op & 0xc0) {
		case 0x40: delta = op & 0x3f; goto advance;
		case 0x80: rd_uleb(&c); continue;               /* offset */
		case 0xc0: continue;                            /* restore */
		default: break;
		}
		switch (op) {
		case 0x00: continue;                            /* nop */
		case 0x02: delta = rd_bytes(&c, 1); goto advance;
		case 0x03: delta = rd_bytes(&c, 2); goto advance;
		case 0x04: delta = rd_bytes(&c, 4); goto advance;
		case 0x05: case 0x09: case 0x14: case 0x2f:     /* two ulebs */
			rd_uleb(&c);
			rd_uleb(&c);
			continue;
		case 0x06: case 0x07: case 0x08: case 0x2e:     /* one uleb */
			rd_uleb(&c);
			continue;
		case 0x11: case 0x15:                           /* uleb, sleb */
			rd_uleb(&c);
			rd_sleb(&c);
			continue;
		case 0x10: case 0x16: {                         /* reg, block */
			uint64_t n;

			rd_uleb(&c);
			n = rd_uleb(&c);
			if (n > (uint64_t)(c.end - c.p))
				return false;
			c.p += n;
			c.addr += n;
			continue;
		}
		case 0x0a:                                      /* remember_state */
			if (*depth == 8)
				return false;
			stack[(*depth)++] = *st;
			continue;
		case 0x0b:                                      /* restore_state */
			if (!*depth)
				return false;
			*st = stack[--*depth];
			continue;
		case 0x0c:                                      /* def_cfa */
			st->reg = (unsigned)rd_uleb(&c);
			st->off = (int64_t)rd_uleb(&c);
			continue;
		case 0x0d: st->reg = (unsigned)rd_uleb(&c); continue;
		case 0x0e: st->off = (int64_t)rd_uleb(&c); continue;
		case 0x12:                                      /* def_cfa_sf */
			st->reg = (unsigned)rd_uleb(&c);
			st->off = rd_sleb(&c) * f->data_align;
			continue;
		case 0x13: st->off = rd_sleb(&c) * f->data_align; continue;
		default:
			return false;   /* def_cfa_expression, set_loc, unknown */
		}
advance:
		if (*loc + delta * f->code_align > addr)
			*stop = true;
		else
			*loc += delta * f->code_align;
	}
	return !c.bad;
}

bool ca_ehframe_cfa_at(const ca_elf *e, uint64_t addr, unsigned *reg, int64_t *off)
{
	size_t lo = 0, hi = e->nfdes;
	const ca_fde *f = NULL;
	cfa_state st = { 7, 8 }, stack[8];
	unsigned depth = 0;
	uint64_t loc;
	bool stop = false;

	while (lo < hi) {                       /* the last FDE starting at or before addr */
		size_t mid = (lo + hi) / 2;

		if (e->fdes[mid].start <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo)
		f = &e->fdes[lo - 1];
	if (!f || addr >= f->start + f->size || !f->ins || !f->cie_ins)
		return false;
	loc = f->start;
	if (!cfa_run(f, (cursor){ f->cie_ins, f->cie_end, 0, false }, UINT64_MAX, &loc, &st,
		     stack, &depth, &stop))
		return false;
	loc = f->start;
	stop = false;
	if (!cfa_run(f, (cursor){ f->ins, f->end, 0, false }, addr, &loc, &st, stack, &depth,
		     &stop))
		return false;
	*reg = st.reg;
	*off = st.off;
	return true;
}
