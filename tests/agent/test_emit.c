/*
 * test_emit.c — the patch areas of agent/x86_64/emit.c, emitted for the
 * largest form of every kind of site: each fits the room for code of its
 * slot (a small one, agent.h, for a plain call with one value or none, a
 * call without exit and a plain tail jump; a big one for the others),
 * decodes (capstone) into whole
 * instructions to its last byte, has no rdtsc (records are the stubs'),
 * and makes no call through memory but the callee's GOT slot and the stubs
 * through its pool's table (the words at spec.stubs).
 */
#include <capstone/capstone.h>
#include <stdio.h>
#include <string.h>

#include "agent.h"

static int failures;
static csh cs;

#define CHECK(cond, ...)                                                         \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "test_emit:%d: FAIL: ", __LINE__);       \
			fprintf(stderr, __VA_ARGS__);                            \
			fputc('\n', stderr);                                     \
			failures++;                                              \
		}                                                                \
	} while (0)

/* Run-time addresses of the synthetic layout: a module's code, then its
 * pool's areas, then the pool's data. */
#define SITE 0x555555601000ull
#define RX (0x555556000000ull + AG_SLOT_WORDS)     /* the code, after the slot's words */
#define DATA 0x555556800000ull
#define STUBS DATA

static uint8_t flag, mode;

static ag_area_spec base(void)
{
	ag_area_spec s;

	memset(&s, 0, sizeof s);
	s.site = SITE;
	s.site_len = 5;
	s.callee = SITE + 0x4000;
	s.site_id = (1u << 24) - 1;         /* the widest id */
	s.callee_flag = &flag;
	s.stubs = STUBS;
	return s;
}

/* A 16-byte window (two 8-byte nops) and a 16-byte `mov OP,%r11`: the
 * largest an indirect area copies. */
static void indirect(ag_area_spec *s, bool tail)
{
	static const uint8_t nop8[] = { 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00 };
	/* mov %fs:0x12345678(%rax,%rbx,8),%r11 padded with prefixes to 16 bytes
	 * is not valid; an 8-byte operand load and 8 bytes of nop before it do */
	static const uint8_t load[] = { 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
					0x4e, 0x8b, 0x9c, 0xd8, 0x78, 0x56, 0x34, 0x12 };

	memcpy(s->prefix, nop8, 8);
	memcpy(s->prefix + 8, nop8, 8);
	s->prefix_len = 16;
	memcpy(s->load, load, sizeof load);
	s->load_len = sizeof load;
	s->cache = DATA + 0x100;
	s->tail_jump = tail;
	s->budget_indirect = true;
}

static ag_area_spec s;

static void check_area(const char *what, size_t slot, const uint8_t *code, size_t len)
{
	cs_insn *insn;
	size_t n, at = 0;

	printf("test_emit: %-48s %3zu bytes (a %zu-byte slot)\n", what, len, slot);
	CHECK(len > 0 && len <= AG_SLOT_CODE(slot), "%s: %zu bytes, its %zu-byte slot has room for %zu",
	      what, len, slot, (size_t)AG_SLOT_CODE(slot));
	n = cs_disasm(cs, code, len, RX, 0, &insn);
	for (size_t i = 0; i < n; i++) {
		at += insn[i].size;
		/* call *disp(%rip): ff 15; only to the stubs' table */
		if (insn[i].size == 6 && insn[i].bytes[0] == 0xff && insn[i].bytes[1] == 0x15) {
			int32_t d;
			uint64_t word;

			memcpy(&d, insn[i].bytes + 2, 4);
			word = insn[i].address + 6 + (uint64_t)(int64_t)d;
			/* tramp.S's ag_instrument_stub finds the slot with the
			 * small mask: the call must end in the first small slot */
			if (word == STUBS + 8 * AG_STUB_INSTRUMENT)
				CHECK(AG_SLOT_WORDS + insn[i].address + 6 - RX < AG_SLOT_SMALL,
				      "%s: the instrument stub's call ends at +%lu", what,
				      (unsigned long)(AG_SLOT_WORDS + insn[i].address + 6 - RX));
			CHECK((word >= STUBS && word < STUBS + 8 * AG_STUBS && (word - STUBS) % 8 == 0) ||
				      (s.slot && word == s.slot),
			      "%s: call *%#lx(%%rip) at +%#lx is neither a stub nor the callee's slot", what,
			      (unsigned long)word, (unsigned long)(insn[i].address - RX));
		}
		CHECK(strcmp(insn[i].mnemonic, "rdtsc") != 0, "%s: an rdtsc in the area", what);
	}
	CHECK(at == len, "%s: %zu of %zu bytes decode into whole instructions", what, at, len);
	if (n)
		cs_free(insn, n);
}

int main(void)
{
	static uint8_t buf[AG_AREA_SCRATCH];

	if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs) != CS_ERR_OK) {
		fprintf(stderr, "test_emit: capstone does not open\n");
		return 1;
	}

	s = base();
	check_area("call", AG_SLOT_SMALL, buf, ag_emit_call(&s, buf, RX));
	s.slot = DATA + 0x200;
	check_area("call through a slot", AG_SLOT_SMALL, buf, ag_emit_call(&s, buf, RX));
	s.value_arg = 3;
	s.value_ret = true;
	check_area("call through a slot, both values", AG_SLOT_BIG, buf, ag_emit_call(&s, buf, RX));
	for (unsigned arg = 1; arg <= 6; arg++) {
		s = base();
		s.value_arg = (uint8_t)arg;
		check_area("call, an argument's value", AG_SLOT_SMALL, buf, ag_emit_call(&s, buf, RX));
	}
	s = base();
	s.slot = DATA + 0x200;
	s.budget_mode = &mode;
	check_area("call with a budget", AG_SLOT_BIG, buf, ag_emit_call_budget(&s, buf, RX));
	s = base();
	s.cond = true;
	s.cond_code = 0x5;
	check_area("conditional tail jump", AG_SLOT_SMALL, buf, ag_emit_tail(&s, buf, RX));
	s.budget_mode = &mode;
	check_area("conditional tail jump with a budget", AG_SLOT_BIG, buf, ag_emit_tail(&s, buf, RX));
	s = base();
	s.cond = true;
	s.fix_return = true;
	check_area("tail jump to a caller-sensitive function", AG_SLOT_BIG, buf, ag_emit_tail(&s, buf, RX));
	s = base();
	s.slot = DATA + 0x200;
	check_area("call without exit", AG_SLOT_SMALL, buf,
		   ag_emit_call_noexit(&s, buf, RX, RX - AG_SLOT_WORDS + AG_SLOT_RET));
	s = base();
	indirect(&s, false);
	check_area("indirect call with a window and a budget", AG_SLOT_BIG, buf, ag_emit_indirect(&s, buf, RX));
	s = base();
	indirect(&s, true);
	check_area("indirect tail jump with a window and a budget", AG_SLOT_BIG, buf,
		   ag_emit_indirect(&s, buf, RX));
	cs_close(&cs);
	if (failures)
		return 1;
	printf("test_emit: ok\n");
	return 0;
}
