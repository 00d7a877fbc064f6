/*
 * switch.c — switch-heavy code for the e2e jump-table tests of
 * `sptrace analyze-binary` (tests/e2e/test_jumptables.py).
 *
 * Four dense switches (12, 16, 32 and 40 cases) for which gcc emits jump
 * tables (-O2: `movslq (%rdx,%rax,4),%rax; add %rdx,%rax; jmp *%rax`; -O0:
 * `mov (%rdx,%rax,1),%eax; cltq; lea TABLE(%rip),%rdx; add %rdx,%rax;
 * jmp *%rax`), and one sparse switch that becomes a compare tree.  Every
 * case body is different so gcc can neither merge cases nor turn a switch
 * into a lookup table; each function is noipa so it keeps its name and its
 * switch.
 *
 * SWITCH_FUNCS below lists each dense switch and its number of distinct case
 * bodies; the test reads it from this file, so keep it in step.
 */
#include <stdio.h>

#define NOIPA __attribute__((noipa))

/* SWITCH_FUNCS: state_step=12 classify_char=16 dispatch_opcode=32 big_switch=40 */

volatile int g_sink;
int g_hist[16];

NOIPA static int note(int tag, int x)
{
	g_hist[tag % 16] += x;
	return tag + x;
}


/* 12 dense cases: a state machine step. */
NOIPA int state_step(int state, int x)
{
	int acc = x;

	switch (state) {
	case 0:
		g_hist[3 % 16]++; acc += 3;
		break;
	case 1:
		acc = (acc >> 1) | 10;
		break;
	case 2:
		acc = acc * 17 + x;
		break;
	case 3:
		acc = note(24, x);
		break;
	case 4:
		if (x > 31) acc += 3; else acc -= 31;
		break;
	case 5:
		acc ^= x << (38 % 13);
		break;
	case 6:
		acc -= x * x + 45;
		break;
	case 7:
		acc += g_hist[52 % 16] * 52;
		break;
	case 8:
		g_hist[59 % 16]++; acc += 59;
		break;
	case 9:
		acc = (acc >> 1) | 66;
		break;
	case 10:
		acc = acc * 73 + x;
		break;
	case 11:
		acc = note(80, x);
		break;
	default:
		acc = -1;
		break;
	}
	g_sink = acc;
	return acc;
}

/* 16 dense cases starting at 'a' (the table is indexed by c - 'a'). */
NOIPA int classify_char(int c, int x)
{
	int acc = x;

	switch (c) {
	case 'a':
		acc = (acc >> 1) | 3;
		break;
	case 'b':
		acc = acc * 10 + x;
		break;
	case 'c':
		acc = note(17, x);
		break;
	case 'd':
		if (x > 24) acc += 3; else acc -= 24;
		break;
	case 'e':
		acc ^= x << (31 % 13);
		break;
	case 'f':
		acc -= x * x + 38;
		break;
	case 'g':
		acc += g_hist[45 % 16] * 45;
		break;
	case 'h':
		g_hist[52 % 16]++; acc += 52;
		break;
	case 'i':
		acc = (acc >> 1) | 59;
		break;
	case 'j':
		acc = acc * 66 + x;
		break;
	case 'k':
		acc = note(73, x);
		break;
	case 'l':
		if (x > 80) acc += 3; else acc -= 80;
		break;
	case 'm':
		acc ^= x << (87 % 13);
		break;
	case 'n':
		acc -= x * x + 94;
		break;
	case 'o':
		acc += g_hist[101 % 16] * 101;
		break;
	case 'p':
		g_hist[108 % 16]++; acc += 108;
		break;
	default:
		acc = -1;
		break;
	}
	g_sink = acc;
	return acc;
}

/* 32 dense cases: an interpreter's opcode dispatch. */
NOIPA int dispatch_opcode(int op, int x)
{
	int acc = x;

	switch (op) {
	case 0:
		acc += g_hist[3 % 16] * 3;
		break;
	case 1:
		g_hist[10 % 16]++; acc += 10;
		break;
	case 2:
		acc = (acc >> 1) | 17;
		break;
	case 3:
		acc = acc * 24 + x;
		break;
	case 4:
		acc = note(31, x);
		break;
	case 5:
		if (x > 38) acc += 3; else acc -= 38;
		break;
	case 6:
		acc ^= x << (45 % 13);
		break;
	case 7:
		acc -= x * x + 52;
		break;
	case 8:
		acc += g_hist[59 % 16] * 59;
		break;
	case 9:
		g_hist[66 % 16]++; acc += 66;
		break;
	case 10:
		acc = (acc >> 1) | 73;
		break;
	case 11:
		acc = acc * 80 + x;
		break;
	case 12:
		acc = note(87, x);
		break;
	case 13:
		if (x > 94) acc += 3; else acc -= 94;
		break;
	case 14:
		acc ^= x << (101 % 13);
		break;
	case 15:
		acc -= x * x + 108;
		break;
	case 16:
		acc += g_hist[115 % 16] * 115;
		break;
	case 17:
		g_hist[122 % 16]++; acc += 122;
		break;
	case 18:
		acc = (acc >> 1) | 129;
		break;
	case 19:
		acc = acc * 136 + x;
		break;
	case 20:
		acc = note(143, x);
		break;
	case 21:
		if (x > 150) acc += 3; else acc -= 150;
		break;
	case 22:
		acc ^= x << (157 % 13);
		break;
	case 23:
		acc -= x * x + 164;
		break;
	case 24:
		acc += g_hist[171 % 16] * 171;
		break;
	case 25:
		g_hist[178 % 16]++; acc += 178;
		break;
	case 26:
		acc = (acc >> 1) | 185;
		break;
	case 27:
		acc = acc * 192 + x;
		break;
	case 28:
		acc = note(199, x);
		break;
	case 29:
		if (x > 206) acc += 3; else acc -= 206;
		break;
	case 30:
		acc ^= x << (213 % 13);
		break;
	case 31:
		acc -= x * x + 220;
		break;
	default:
		acc = -1;
		break;
	}
	g_sink = acc;
	return acc;
}

/* 40 dense cases from 100 to 139. */
NOIPA int big_switch(int k, int x)
{
	int acc = x;

	switch (k) {
	case 100:
		g_hist[3 % 16]++; acc += 3;
		break;
	case 101:
		acc = (acc >> 1) | 10;
		break;
	case 102:
		acc = acc * 17 + x;
		break;
	case 103:
		acc = note(24, x);
		break;
	case 104:
		if (x > 31) acc += 3; else acc -= 31;
		break;
	case 105:
		acc ^= x << (38 % 13);
		break;
	case 106:
		acc -= x * x + 45;
		break;
	case 107:
		acc += g_hist[52 % 16] * 52;
		break;
	case 108:
		g_hist[59 % 16]++; acc += 59;
		break;
	case 109:
		acc = (acc >> 1) | 66;
		break;
	case 110:
		acc = acc * 73 + x;
		break;
	case 111:
		acc = note(80, x);
		break;
	case 112:
		if (x > 87) acc += 3; else acc -= 87;
		break;
	case 113:
		acc ^= x << (94 % 13);
		break;
	case 114:
		acc -= x * x + 101;
		break;
	case 115:
		acc += g_hist[108 % 16] * 108;
		break;
	case 116:
		g_hist[115 % 16]++; acc += 115;
		break;
	case 117:
		acc = (acc >> 1) | 122;
		break;
	case 118:
		acc = acc * 129 + x;
		break;
	case 119:
		acc = note(136, x);
		break;
	case 120:
		if (x > 143) acc += 3; else acc -= 143;
		break;
	case 121:
		acc ^= x << (150 % 13);
		break;
	case 122:
		acc -= x * x + 157;
		break;
	case 123:
		acc += g_hist[164 % 16] * 164;
		break;
	case 124:
		g_hist[171 % 16]++; acc += 171;
		break;
	case 125:
		acc = (acc >> 1) | 178;
		break;
	case 126:
		acc = acc * 185 + x;
		break;
	case 127:
		acc = note(192, x);
		break;
	case 128:
		if (x > 199) acc += 3; else acc -= 199;
		break;
	case 129:
		acc ^= x << (206 % 13);
		break;
	case 130:
		acc -= x * x + 213;
		break;
	case 131:
		acc += g_hist[220 % 16] * 220;
		break;
	case 132:
		g_hist[227 % 16]++; acc += 227;
		break;
	case 133:
		acc = (acc >> 1) | 234;
		break;
	case 134:
		acc = acc * 241 + x;
		break;
	case 135:
		acc = note(248, x);
		break;
	case 136:
		if (x > 255) acc += 3; else acc -= 255;
		break;
	case 137:
		acc ^= x << (262 % 13);
		break;
	case 138:
		acc -= x * x + 269;
		break;
	case 139:
		acc += g_hist[276 % 16] * 276;
		break;
	default:
		acc = -1;
		break;
	}
	g_sink = acc;
	return acc;
}

/* A sparse switch: gcc emits compares, not a table. */
NOIPA int sparse_switch(int v, int x)
{
	int acc = x;

	switch (v) {
	case 1:
		acc = (acc >> 1) | 3;
		break;
	case 100:
		acc = acc * 10 + x;
		break;
	case 1000:
		acc = note(17, x);
		break;
	case 5000:
		if (x > 24) acc += 3; else acc -= 24;
		break;
	case 77777:
		acc ^= x << (31 % 13);
		break;
	case 1000000:
		acc -= x * x + 38;
		break;
	default:
		acc = -1;
		break;
	}
	g_sink = acc;
	return acc;
}

int main(int argc, char **argv)
{
	int r = 0;

	for (int i = 0; i < 48; i++) {
		r += state_step(i % 13, argc);
		r += classify_char('a' + i % 17, argc);
		r += dispatch_opcode(i % 33, argc);
		r += big_switch(99 + i, argc);
		r += sparse_switch(i * 1000, argc);
	}
	printf("%d %s\n", r, argv[0] ? "ok" : "?");
	return 0;
}
