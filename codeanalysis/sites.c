/*
 * sites.c — classify every call site and plan how the agent patches it.
 *
 * A site is a call (direct, through the PLT, through a register or memory) or
 * a tail jump to another function.  The agent replaces the site so that
 * control reaches a per-site patch area (record entry, do the call, record
 * exit, jump back).  The plan, in order of preference:
 *
 *   DIRECT       the site is >= 5 bytes: overwrite it with `jmp rel32`.
 *   SPRINGBOARD  a shorter site gets a 2-byte `jmp rel8` (or `jcc rel8`) to a
 *                5-byte `jmp rel32` written into dead padding within reach
 *                (-128..+127 from the end of the 2-byte jump).  Dead means:
 *                bytes no instruction covers, that follow an instruction which
 *                never falls through (ret, jmp, ud2, hlt, int3), that are all
 *                padding (nop, int3, zero), that no branch targets and that
 *                hold no function entry.  Alignment NOPs inside a function
 *                execute and are never used.
 *   RELOCATE     the instructions before the site in the same basic block
 *                (none of them a branch target, a call or a system call) are
 *                moved with the site to the patch area, and a 5-byte jump
 *                covers [patch_addr, site end).
 *   TRAP         int3 on the first byte; the agent's SIGTRAP handler emulates.
 *
 * No plan ever writes a byte after a call instruction: a thread may be inside
 * the callee and will return there.
 */
#include "ca_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct slot {
	uint64_t addr;
	bool used;
} slot;

typedef struct slots {
	slot *v;
	size_t n, cap;
} slots;

static bool no_fallthrough(const ca_insn *r)
{
	return r->cls == CA_I_RET || r->cls == CA_I_JMP || r->cls == CA_I_JMP_IND ||
	       r->cls == CA_I_STOP;
}

/* Mark bytes that a direct branch targets but nobody decoded: never dead. */
static void reserve_branch_targets(ca_work *w)
{
	for (size_t i = 0; i < w->nins; i++) {
		const ca_insn *r = &w->ins[i];
		ca_textmap *tm;

		if (r->cls != CA_I_JMP && r->cls != CA_I_JCC && r->cls != CA_I_CALL)
			continue;
		tm = ca_textmap_at(w, r->target);
		if (tm && !tm->covered[r->target - tm->sec->addr])
			tm->covered[r->target - tm->sec->addr] = 2;
	}
}

static bool padding_byte_run(const uint8_t *p, size_t n)
{
	/* Accept int3/zero fill and the NOP encodings assemblers use for
	 * alignment: 90, 66 90, 0f 1f /0 forms with any 66/2e prefixes. */
	size_t i = 0;

	while (i < n) {
		size_t j = i;

		if (p[i] == 0xcc || p[i] == 0x00 || p[i] == 0x90) {
			i++;
			continue;
		}
		while (j < n && (p[j] == 0x66 || p[j] == 0x2e))
			j++;
		if (j < n && p[j] == 0x90) {
			i = j + 1;
			continue;
		}
		if (j + 2 < n && p[j] == 0x0f && p[j + 1] == 0x1f) {
			uint8_t modrm = p[j + 2];
			size_t len = 3;
			unsigned mod = modrm >> 6, rm = modrm & 7;

			if ((modrm & 0x38) != 0)
				return false;
			if (mod != 3 && rm == 4)
				len++;                  /* SIB */
			if (mod == 1)
				len += 1;
			else if (mod == 2 || (mod == 0 && rm == 5))
				len += 4;
			if (j + len > n)
				return false;
			i = j + len;
			continue;
		}
		return false;
	}
	return true;
}

static int add_slots(slots *sl, uint64_t start, uint64_t end)
{
	for (uint64_t a = start; a + 5 <= end; a += 5) {
		if (sp_grow((void **)&sl->v, &sl->cap, sl->n + 1, sizeof *sl->v))
			return -1;
		sl->v[sl->n++] = (slot){ a, false };
	}
	return 0;
}

/* Find the dead gaps of every code section and cut them into 5-byte slots. */
static int find_slots(ca_work *w, slots *sl)
{
	reserve_branch_targets(w);
	for (size_t t = 0; t < w->ntm; t++) {
		const ca_textmap *tm = &w->tm[t];
		const ca_section *s = tm->sec;
		size_t i = 1;

		if (strncmp(s->name, ".plt", 4) == 0)
			continue;
		while (i < s->size) {
			size_t j;
			uint32_t prev;
			bool ok;

			if (tm->covered[i] || tm->covered[i - 1] != 1) {
				i++;
				continue;
			}
			for (j = i; j < s->size && !tm->covered[j]; j++)
				;
			/* The instruction ending at i-1 must not fall through. */
			prev = CA_NONE;
			for (size_t back = 1; back <= 15 && back <= i; back++) {
				uint32_t v = tm->start[i - back];
				if (v) {
					prev = v - 1;
					break;
				}
			}
			ok = prev != CA_NONE && w->ins[prev].addr + w->ins[prev].len == s->addr + i &&
			     no_fallthrough(&w->ins[prev]) && padding_byte_run(s->data + i, j - i);
			for (size_t k = i; ok && k < j; k++)
				if (ca_fn_find(w, s->addr + k) != CA_NONE)
					ok = false;
			if (ok && add_slots(sl, s->addr + i, s->addr + j))
				return -1;
			i = j;
		}
	}
	return 0;
}

/* The nearest free slot that a 2-byte jump at `site` reaches. */
static uint64_t take_slot(slots *sl, uint64_t site)
{
	int64_t from = (int64_t)site + 2;
	size_t lo = 0, hi = sl->n, best = SIZE_MAX;
	uint64_t bestd = UINT64_MAX;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if ((int64_t)sl->v[mid].addr < from - 128)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < sl->n && (int64_t)sl->v[lo].addr <= from + 127; lo++) {
		int64_t d = (int64_t)sl->v[lo].addr - from;
		uint64_t ad = (uint64_t)(d < 0 ? -d : d);

		if (!sl->v[lo].used && ad < bestd) {
			bestd = ad;
			best = lo;
		}
	}
	if (best == SIZE_MAX)
		return 0;
	sl->v[best].used = true;
	return sl->v[best].addr;
}

/* Where in a RIP-relative instruction its disp32 lies (the one place its
 * bytes hold target - end), 0 if not exactly one. */
static unsigned disp_offset(const ca_work *w, const ca_insn *in)
{
	const ca_section *sec = ca_elf_section_at(w->e, in->addr);
	int32_t disp = (int32_t)(in->target - (in->addr + in->len));
	unsigned found = 0, at = 0;

	if (!sec || !sec->data || in->addr + in->len > sec->addr + sec->size)
		return 0;
	for (unsigned p = 1; p + 4 <= in->len; p++)
		if (memcmp(sec->data + (in->addr - sec->addr) + p, &disp, 4) == 0) {
			found++;
			at = p;
		}
	return found == 1 ? at : 0;
}

/* Try to relocate the instructions before the site (position k in the
 * function's order).  Returns the reason; fills the site on success.  A
 * window moved into a patch area keeps a RIP-relative operand right when
 * its disp32 is re-aimed: reloc_rip says where it is. */
static unsigned plan_relocation(const ca_work *w, const ca_wfunc *fn, uint32_t k, ca_site *s)
{
	const ca_insn *site = &w->ins[w->order[fn->first_insn + k]];
	uint64_t start = site->addr, end = site->addr + site->len, disp_at = 0;
	unsigned nrip = 0;
	uint8_t rip = 0;

	while (end - start < 5) {
		const ca_insn *cur = &w->ins[w->order[fn->first_insn + k]];
		const ca_insn *prev;

		if ((cur->flags & CA_INSF_LEADER) || k == 0)
			return CA_WHY_NO_ROOM;
		prev = &w->ins[w->order[fn->first_insn + --k]];
		if (prev->addr + prev->len != start)
			return CA_WHY_NO_ROOM;
		if (prev->cls != CA_I_OTHER || prev->undec || prev->overlap)
			return CA_WHY_UNMOVABLE;
		if (prev->flags & CA_INSF_RIPREL) {
			unsigned at = disp_offset(w, prev);

			nrip++;
			disp_at = at ? prev->addr + at : 0;
		}
		start = prev->addr;
	}
	if (nrip)
		rip = nrip == 1 && disp_at && disp_at - start + 1 < CA_RELOC_RIP_UNKNOWN
			      ? (uint8_t)(disp_at - start + 1) : CA_RELOC_RIP_UNKNOWN;
	s->method = CA_PATCH_RELOCATE;
	s->patch_addr = start;
	s->patch_len = (uint8_t)(end - start);
	s->reloc_rip = rip;
	return CA_WHY_BLOCK_ROOM;
}

/*
 * Two decoded instructions sharing bytes means one decoding is wrong (a bad
 * jump-table entry) or the code plays tricks (a jump over a lock prefix).
 * Either way no byte there is patched.
 */
static bool overlaps(const ca_work *w, const ca_insn *r)
{
	const ca_textmap *tm = ca_textmap_at(w, r->addr);
	size_t off = r->addr - tm->sec->addr;

	for (size_t k = 1; k < r->len && off + k < tm->sec->size; k++)
		if (tm->start[off + k])
			return true;
	for (size_t back = 1; back < 16 && back <= off; back++) {
		uint32_t v = tm->start[off - back];
		if (v)
			return w->ins[v - 1].len > back;
	}
	return false;
}

static void plan(ca_work *w, const ca_wfunc *fn, uint32_t k, slots *sl, ca_site *s)
{
	unsigned why;

	if (w->ins[w->order[fn->first_insn + k]].overlap) {
		s->method = CA_PATCH_NONE;
		s->reason = CA_WHY_OVERLAP;
		return;
	}
	if (s->len >= 5) {
		s->method = CA_PATCH_DIRECT;
		s->reason = CA_WHY_LONG_ENOUGH;
		return;
	}
	s->patch_addr = take_slot(sl, s->addr);
	if (s->patch_addr) {
		s->method = CA_PATCH_SPRINGBOARD;
		s->reason = CA_WHY_GAP_NEARBY;
		s->patch_len = 5;
		return;
	}
	why = plan_relocation(w, fn, k, s);
	if (why == CA_WHY_BLOCK_ROOM) {
		s->reason = (uint8_t)why;
		return;
	}
	s->method = CA_PATCH_TRAP;
	s->reason = (uint8_t)why;
	s->patch_addr = 0;
	s->patch_len = 0;
}

/* Is this jump a tail call, i.e. does it leave the function for another? */
static bool is_tail(const ca_work *w, uint32_t f, const ca_insn *r, uint32_t *callee)
{
	const ca_wfunc *fn = &w->fn[f];
	uint32_t t = ca_fn_find(w, r->target);
	uint32_t root = fn->parent != CA_NONE ? fn->parent : f;

	*callee = CA_NONE;
	if (r->target >= fn->addr && r->target < fn->limit && (t == CA_NONE || t == f))
		return false;                   /* inside the function */
	if (t == CA_NONE)
		return false;                   /* into the middle of other code: a fragment's */
	if (t == root || w->fn[t].parent == root)
		return false;                   /* to its own parent or a sibling fragment */
	*callee = t;
	return true;
}

static int add_site(ca_work *w, uint32_t f, uint32_t k, slots *sl)
{
	ca_module *m = w->m;
	const ca_wfunc *fn = &w->fn[f];
	const ca_insn *r = &w->ins[w->order[fn->first_insn + k]];
	ca_site s;
	uint32_t callee = CA_NONE;
	const char *import = NULL;

	memset(&s, 0, sizeof s);
	switch (r->cls) {
	case CA_I_CALL:
		callee = ca_fn_find(w, r->target);
		s.kind = callee != CA_NONE && (w->fn[callee].flags & CA_FUNC_PLT) ? CA_SITE_PLT
									      : CA_SITE_DIRECT;
		if (callee == CA_NONE)
			s.flags |= CA_SITEF_OUTSIDE;
		break;
	case CA_I_CALL_IND:
		s.kind = (r->flags & CA_INSF_RIPREL) ? CA_SITE_INDIRECT_RIP
			 : (r->flags & CA_INSF_OP_REG) ? CA_SITE_INDIRECT_REG : CA_SITE_INDIRECT_MEM;
		if (s.kind == CA_SITE_INDIRECT_RIP)
			import = ca_elf_got_name(w->e, r->target);
		break;
	case CA_I_JMP:
	case CA_I_JCC:
		if (!is_tail(w, f, r, &callee))
			return 0;
		s.kind = CA_SITE_TAIL_DIRECT;
		if (r->cls == CA_I_JCC)
			s.flags |= CA_SITEF_COND;
		break;
	case CA_I_JMP_IND:
		if (r->flags & CA_INSF_TABLE)
			return 0;
		s.kind = CA_SITE_TAIL_INDIRECT;
		if (r->flags & CA_INSF_RIPREL)
			import = ca_elf_got_name(w->e, r->target);
		{
			unsigned reg;
			int64_t off;

			if (ca_ehframe_cfa_at(w->e, r->addr, &reg, &off) && reg == 7 && off == 8)
				s.flags |= CA_SITEF_TAILPOS;
		}
		break;
	default:
		return 0;
	}
	if (callee != CA_NONE && (w->fn[callee].flags & CA_FUNC_PLT))
		import = w->fn[callee].name;
	if (callee != CA_NONE && (w->fn[callee].flags & CA_FUNC_NORETURN))
		s.flags |= CA_SITEF_NORETURN;
	s.addr = r->addr;
	s.len = r->len;
	s.target = r->target;
	s.func = fn->final;
	s.callee = callee == CA_NONE ? CA_NONE : w->fn[callee].final;
	s.import = CA_NONE;
	if (import && (s.import = ca_str_add(m, import)) == CA_NONE)
		return -1;
	plan(w, fn, k, sl, &s);
	if (sp_grow((void **)&m->sites, &m->capsites, m->nsites + 1, sizeof *m->sites))
		return -1;
	m->sites[m->nsites++] = s;
	return 0;
}

int ca_sites_plan(ca_work *w, sp_err *err)
{
	ca_module *m = w->m;
	slots sl = { 0 };
	int rc = 0;

	for (size_t i = 0; i < w->nins; i++)
		w->ins[i].overlap = overlaps(w, &w->ins[i]);
	if (find_slots(w, &sl)) {
		free(sl.v);
		return sp_fail(err, "out of memory");
	}
	for (size_t i = 0; i < m->nfuncs && !rc; i++) {
		uint32_t f = w->fmap[i];
		const ca_wfunc *fn = &w->fn[f];

		m->funcs[i].first_site = (uint32_t)m->nsites;
		if (!(fn->flags & CA_FUNC_PLT))
			for (uint32_t k = 0; k < fn->ninsns && !rc; k++)
				rc = add_site(w, f, k, &sl);
		m->funcs[i].nsites = (uint32_t)(m->nsites - m->funcs[i].first_site);
	}
	free(sl.v);
	if (rc)
		return sp_fail(err, "out of memory");
	return 0;
}
