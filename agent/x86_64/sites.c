/*
 * sites.c — x86-64 encoding and decoding at the call sites themselves: the
 * GOT slot behind a PLT stub, an indirect call's operand re-encoded as a
 * load, the jumps and int3 written over a site, its springboard, and the
 * words at the start of an area slot.  instrument.c (the user-space platform
 * of agent/core/) builds areas and patches only through these and emit.c.
 */
#include <string.h>

#include "agent.h"

/* The GOT slot a PLT stub jumps through: [endbr64] [bnd] jmp *disp32(%rip). */
uint64_t ag_x86_plt_slot(uint64_t stub)
{
	const uint8_t *p = (const uint8_t *)(uintptr_t)stub;
	int32_t disp;

	if (p[0] == 0xf3 && p[1] == 0x0f && p[2] == 0x1e && p[3] == 0xfa)
		p += 4;
	if (p[0] == 0xf2)
		p++;
	if (p[0] != 0xff || p[1] != 0x25)
		return 0;
	memcpy(&disp, p + 2, 4);
	return (uint64_t)(uintptr_t)(p + 6) + (uint64_t)(int64_t)disp;
}

/*
 * `call *OP` (ff /2) or `jmp *OP` (ff /4) at run-time address `at`,
 * re-encoded into spec as `mov OP,%r11`:
 * [3e] [REX] ff /op modrm [sib] [disp]
 * becomes REX.W|R|X|B 8b modrm' [sib] [disp] with the reg field set to r11;
 * a rip-relative operand's target is kept (spec->load_rip_target).
 * false if the instruction is not of that form.
 */
bool ag_x86_load_of_call(const uint8_t *c, size_t len, uint64_t at, bool jump,
			 ag_area_spec *spec)
{
	size_t i = 0, n;
	uint8_t rex = 0, modrm;
	unsigned op = jump ? 4 : 2;

	if (i < len && c[i] == 0x3e)
		i++;                            /* notrack */
	if (i < len && (c[i] & 0xf0) == 0x40)
		rex = c[i++];
	if (i + 1 >= len || c[i] != 0xff || ((c[i + 1] >> 3) & 7) != op)
		return false;
	modrm = c[i + 1];
	spec->load[0] = (uint8_t)(0x4c | (rex & 0x03));     /* REX.W + R, keep X and B */
	spec->load[1] = 0x8b;
	spec->load[2] = (uint8_t)((modrm & 0xc7) | (3 << 3)); /* reg = r11 (with REX.R) */
	n = len - (i + 2);
	memcpy(spec->load + 3, c + i + 2, n);
	spec->load_len = (uint8_t)(3 + n);
	spec->load_rip_at = (modrm & 0xc7) == 0x05 ? 3 : 0; /* mod 00, rm 101: rip+disp32 */
	if (spec->load_rip_at) {
		int32_t disp;

		memcpy(&disp, c + len - 4, 4);
		spec->load_rip_target = at + len + (uint64_t)(int64_t)disp;
	}
	return true;
}

/* The rel32 at buf[at..at+4), which reached its target from `from`, re-aimed
 * to reach it from `to`; false when out of reach. */
bool ag_x86_reaim_rel32(uint8_t *buf, size_t at, uint64_t from, uint64_t to)
{
	int32_t d;
	int64_t nd;

	memcpy(&d, buf + at, 4);
	nd = (int64_t)d - (int64_t)(to - from);
	if (nd != (int32_t)nd)
		return false;
	memcpy(buf + at, &(int32_t){ (int32_t)nd }, 4);
	return true;
}

/*
 * Opcodes of one-byte instructions (push/pop, nop/xchg, cdq, lahf/sahf,
 * string instructions without prefix, leave, flag instructions...).  A
 * window that starts with one is not used: a thread standing right after
 * the window's int3 must be one that executed it (see the SIGTRAP handler
 * in patch.c), never one that ran the old instruction.
 */
bool ag_x86_one_byte_insn(uint8_t b)
{
	return (b >= 0x50 && b <= 0x5f) || (b >= 0x90 && b <= 0x99) || (b >= 0x9b && b <= 0x9f) ||
	       (b >= 0xa4 && b <= 0xa7) || (b >= 0xaa && b <= 0xaf) || (b >= 0x6c && b <= 0x6f) ||
	       (b >= 0xec && b <= 0xef) || b == 0xc9 || b == 0xcc || b == 0xd7 || b == 0xf4 ||
	       b == 0xf5 || (b >= 0xf8 && b <= 0xfd);
}

/* A function that starts with [endbr64] xor %ebp,%ebp: a thread's or a
 * process's first frame. */
bool ag_x86_outermost_frame(const uint8_t *code, uint64_t size)
{
	if (size >= 6 && memcmp(code, "\xf3\x0f\x1e\xfa", 4) == 0)
		code += 4;
	return code[0] == 0x31 && code[1] == 0xed;
}

/* A tail jump's form at `code`: with a springboard, jmp rel8 (eb) or jcc
 * rel8 (7x), which stays; else jmp rel32 (e9) or jcc rel32 (0f 8x, *cond
 * and *cc set).  false: neither. */
bool ag_x86_tail_jump(const uint8_t *code, bool springboard, bool *cond, uint8_t *cc)
{
	*cond = false;
	if (springboard)
		return code[0] == 0xeb || (code[0] & 0xf0) == 0x70;
	if (code[0] == 0x0f && (code[1] & 0xf0) == 0x80) {
		*cond = true;
		*cc = code[1] & 0x0f;
		return true;
	}
	return code[0] == 0xe9;
}

/* `jmp rel32` from `at` to `to` in out[0..5); false when out of reach. */
static bool jmp_rel32(uint8_t *out, uint64_t at, uint64_t to)
{
	int64_t rel = (int64_t)(to - (at + 5));

	if (rel != (int32_t)rel)
		return false;
	out[0] = 0xe9;
	memcpy(out + 1, &(int32_t){ (int32_t)rel }, 4);
	return true;
}

/* The patch that sends the site at `site` (len bytes) to the area at rx:
 * directly (jmp rel32, the rest int3, never executed), or with a
 * springboard at `board` (non-zero) through *sb.  Returns 0, 1 (with a
 * springboard), -1 out of reach. */
int ag_x86_site_patch(uint64_t site, uint8_t len, uint64_t board, uint64_t rx, ag_patch *p,
		      ag_patch *sb)
{
	memset(p, 0, sizeof *p);
	p->addr = site;
	p->len = len;
	memcpy(p->old, (const void *)(uintptr_t)site, len);
	if (board) {
		int64_t d8 = (int64_t)(board - (site + 2));

		memset(sb, 0, sizeof *sb);
		sb->addr = board;
		sb->len = 5;
		sb->board = 1;
		memcpy(sb->old, (const void *)(uintptr_t)board, 5);
		if (d8 != (int8_t)d8 || !jmp_rel32(sb->new, board, rx))
			return -1;
		sb->redirect = rx;
		/* A jmp/jcc rel8 stays the same jump, retargeted to the springboard;
		 * a short indirect call becomes jmp rel8. */
		p->new[0] = (p->old[0] == 0xeb || (p->old[0] & 0xf0) == 0x70) ? p->old[0] : 0xeb;
		p->new[1] = (uint8_t)(int8_t)d8;
		/* A thread that traps on the site's int3 goes to the area itself,
		 * not to the springboard: it may be parked there until a stop
		 * restores the padding. */
		p->redirect = rx;
		return 1;
	}
	if (!jmp_rel32(p->new, site, rx))
		return -1;
	memset(p->new + 5, 0xcc, len - 5u);
	p->redirect = rx;
	return 0;
}

/* An int3 at `at` that sends a thread to rx; with a relocated window, *jump
 * is the 5-byte jmp that replaces it later (old: `keep` bytes saved).
 * false when the window's jump is out of reach. */
bool ag_x86_trap_patch(uint64_t at, uint64_t rx, ag_patch *p, ag_patch *jump)
{
	memset(p, 0, sizeof *p);
	p->addr = at;
	p->len = 1;
	memcpy(p->old, (const void *)(uintptr_t)at, jump ? 5 : 1);
	p->new[0] = 0xcc;
	p->redirect = rx;
	if (jump) {
		*jump = *p;
		jump->len = 5;
		if (!jmp_rel32(jump->new, at, rx))
			return false;
	}
	return true;
}

/* The words at the start of an area slot (agent.h): the callee's ag_callee
 * or an indirect site's ag_indirect_site (tramp.S's stubs find them there),
 * the site id of its exit
 * record (0 for an indirect site, whose id depends on the callee), the
 * caller's return address S+len, the magic that marks a call area, and
 * S+len-1 for the unwinder. */
void ag_x86_slot_words(uint8_t *rw, uint64_t ret, uint32_t site, const void *ref)
{
	uint64_t magic = AG_SLOT_MAGIC_VALUE, ra = ret - 1, id = site;
	uint64_t r = (uint64_t)(uintptr_t)ref;

	memcpy(rw + AG_SLOT_REF, &r, 8);
	memcpy(rw + AG_SLOT_SITE, &id, 8);
	memcpy(rw + AG_SLOT_RET, &ret, 8);
	memcpy(rw + AG_SLOT_MAGIC, &magic, 8);
	memcpy(rw + AG_SLOT_RA, &ra, 8);
}
