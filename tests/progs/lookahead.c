/*
 * lookahead.c — a function with many direct callees, few of them called,
 * and a caller with many callees it never calls: the look-ahead
 * instruments them all (agent/core/core.c); guided by a profile of an
 * earlier run (codeanalysis/profile.c) only those called
 * (tests/e2e/test_lookahead.py).  Deterministic: the same calls at every
 * run.  Generated shape, written out: pick() calls one of 40 functions,
 * main calls 3 of them, and 20 rare_* only when given an argument.
 */
#include <stdio.h>

__attribute__((noinline)) int work(int x)
{
	__asm__ volatile("" : "+r"(x));
	return x + 1;
}
__attribute__((noinline)) int c0(int x)
{
	return work(x * 3 + 0) + work(x ^ 1);
}
__attribute__((noinline)) int c1(int x)
{
	return work(x * 4 + 1) + work(x ^ 8);
}
__attribute__((noinline)) int c2(int x)
{
	return work(x * 5 + 2) + work(x ^ 15);
}
__attribute__((noinline)) int c3(int x)
{
	return work(x * 6 + 3) + work(x ^ 22);
}
__attribute__((noinline)) int c4(int x)
{
	return work(x * 7 + 4) + work(x ^ 29);
}
__attribute__((noinline)) int c5(int x)
{
	return work(x * 8 + 5) + work(x ^ 36);
}
__attribute__((noinline)) int c6(int x)
{
	return work(x * 9 + 6) + work(x ^ 43);
}
__attribute__((noinline)) int c7(int x)
{
	return work(x * 10 + 7) + work(x ^ 50);
}
__attribute__((noinline)) int c8(int x)
{
	return work(x * 11 + 8) + work(x ^ 57);
}
__attribute__((noinline)) int c9(int x)
{
	return work(x * 12 + 9) + work(x ^ 64);
}
__attribute__((noinline)) int c10(int x)
{
	return work(x * 13 + 10) + work(x ^ 71);
}
__attribute__((noinline)) int c11(int x)
{
	return work(x * 14 + 11) + work(x ^ 78);
}
__attribute__((noinline)) int c12(int x)
{
	return work(x * 15 + 12) + work(x ^ 85);
}
__attribute__((noinline)) int c13(int x)
{
	return work(x * 16 + 13) + work(x ^ 92);
}
__attribute__((noinline)) int c14(int x)
{
	return work(x * 17 + 14) + work(x ^ 99);
}
__attribute__((noinline)) int c15(int x)
{
	return work(x * 18 + 15) + work(x ^ 106);
}
__attribute__((noinline)) int c16(int x)
{
	return work(x * 19 + 16) + work(x ^ 113);
}
__attribute__((noinline)) int c17(int x)
{
	return work(x * 20 + 17) + work(x ^ 120);
}
__attribute__((noinline)) int c18(int x)
{
	return work(x * 21 + 18) + work(x ^ 127);
}
__attribute__((noinline)) int c19(int x)
{
	return work(x * 22 + 19) + work(x ^ 134);
}
__attribute__((noinline)) int c20(int x)
{
	return work(x * 23 + 20) + work(x ^ 141);
}
__attribute__((noinline)) int c21(int x)
{
	return work(x * 24 + 21) + work(x ^ 148);
}
__attribute__((noinline)) int c22(int x)
{
	return work(x * 25 + 22) + work(x ^ 155);
}
__attribute__((noinline)) int c23(int x)
{
	return work(x * 26 + 23) + work(x ^ 162);
}
__attribute__((noinline)) int c24(int x)
{
	return work(x * 27 + 24) + work(x ^ 169);
}
__attribute__((noinline)) int c25(int x)
{
	return work(x * 28 + 25) + work(x ^ 176);
}
__attribute__((noinline)) int c26(int x)
{
	return work(x * 29 + 26) + work(x ^ 183);
}
__attribute__((noinline)) int c27(int x)
{
	return work(x * 30 + 27) + work(x ^ 190);
}
__attribute__((noinline)) int c28(int x)
{
	return work(x * 31 + 28) + work(x ^ 197);
}
__attribute__((noinline)) int c29(int x)
{
	return work(x * 32 + 29) + work(x ^ 204);
}
__attribute__((noinline)) int c30(int x)
{
	return work(x * 33 + 30) + work(x ^ 211);
}
__attribute__((noinline)) int c31(int x)
{
	return work(x * 34 + 31) + work(x ^ 218);
}
__attribute__((noinline)) int c32(int x)
{
	return work(x * 35 + 32) + work(x ^ 225);
}
__attribute__((noinline)) int c33(int x)
{
	return work(x * 36 + 33) + work(x ^ 232);
}
__attribute__((noinline)) int c34(int x)
{
	return work(x * 37 + 34) + work(x ^ 239);
}
__attribute__((noinline)) int c35(int x)
{
	return work(x * 38 + 35) + work(x ^ 246);
}
__attribute__((noinline)) int c36(int x)
{
	return work(x * 39 + 36) + work(x ^ 253);
}
__attribute__((noinline)) int c37(int x)
{
	return work(x * 40 + 37) + work(x ^ 260);
}
__attribute__((noinline)) int c38(int x)
{
	return work(x * 41 + 38) + work(x ^ 267);
}
__attribute__((noinline)) int c39(int x)
{
	return work(x * 42 + 39) + work(x ^ 274);
}
__attribute__((noinline)) int rare_0(int x)
{
	return work(x - 0) * 2 + work(x + 3);
}
__attribute__((noinline)) int rare_1(int x)
{
	return work(x - 1) * 3 + work(x + 8);
}
__attribute__((noinline)) int rare_2(int x)
{
	return work(x - 2) * 4 + work(x + 13);
}
__attribute__((noinline)) int rare_3(int x)
{
	return work(x - 3) * 5 + work(x + 18);
}
__attribute__((noinline)) int rare_4(int x)
{
	return work(x - 4) * 6 + work(x + 23);
}
__attribute__((noinline)) int rare_5(int x)
{
	return work(x - 5) * 7 + work(x + 28);
}
__attribute__((noinline)) int rare_6(int x)
{
	return work(x - 6) * 8 + work(x + 33);
}
__attribute__((noinline)) int rare_7(int x)
{
	return work(x - 7) * 9 + work(x + 38);
}
__attribute__((noinline)) int rare_8(int x)
{
	return work(x - 8) * 10 + work(x + 43);
}
__attribute__((noinline)) int rare_9(int x)
{
	return work(x - 9) * 11 + work(x + 48);
}
__attribute__((noinline)) int rare_10(int x)
{
	return work(x - 10) * 12 + work(x + 53);
}
__attribute__((noinline)) int rare_11(int x)
{
	return work(x - 11) * 13 + work(x + 58);
}
__attribute__((noinline)) int rare_12(int x)
{
	return work(x - 12) * 14 + work(x + 63);
}
__attribute__((noinline)) int rare_13(int x)
{
	return work(x - 13) * 15 + work(x + 68);
}
__attribute__((noinline)) int rare_14(int x)
{
	return work(x - 14) * 16 + work(x + 73);
}
__attribute__((noinline)) int rare_15(int x)
{
	return work(x - 15) * 17 + work(x + 78);
}
__attribute__((noinline)) int rare_16(int x)
{
	return work(x - 16) * 18 + work(x + 83);
}
__attribute__((noinline)) int rare_17(int x)
{
	return work(x - 17) * 19 + work(x + 88);
}
__attribute__((noinline)) int rare_18(int x)
{
	return work(x - 18) * 20 + work(x + 93);
}
__attribute__((noinline)) int rare_19(int x)
{
	return work(x - 19) * 21 + work(x + 98);
}
__attribute__((noinline)) int pick(int k, int x)
{
	switch (k) {
	case 0: return c0(x) + 1;
	case 1: return c1(x) + 1;
	case 2: return c2(x) + 1;
	case 3: return c3(x) + 1;
	case 4: return c4(x) + 1;
	case 5: return c5(x) + 1;
	case 6: return c6(x) + 1;
	case 7: return c7(x) + 1;
	case 8: return c8(x) + 1;
	case 9: return c9(x) + 1;
	case 10: return c10(x) + 1;
	case 11: return c11(x) + 1;
	case 12: return c12(x) + 1;
	case 13: return c13(x) + 1;
	case 14: return c14(x) + 1;
	case 15: return c15(x) + 1;
	case 16: return c16(x) + 1;
	case 17: return c17(x) + 1;
	case 18: return c18(x) + 1;
	case 19: return c19(x) + 1;
	case 20: return c20(x) + 1;
	case 21: return c21(x) + 1;
	case 22: return c22(x) + 1;
	case 23: return c23(x) + 1;
	case 24: return c24(x) + 1;
	case 25: return c25(x) + 1;
	case 26: return c26(x) + 1;
	case 27: return c27(x) + 1;
	case 28: return c28(x) + 1;
	case 29: return c29(x) + 1;
	case 30: return c30(x) + 1;
	case 31: return c31(x) + 1;
	case 32: return c32(x) + 1;
	case 33: return c33(x) + 1;
	case 34: return c34(x) + 1;
	case 35: return c35(x) + 1;
	case 36: return c36(x) + 1;
	case 37: return c37(x) + 1;
	case 38: return c38(x) + 1;
	case 39: return c39(x) + 1;
	default: return 0;
	}
}

int main(int argc, char **argv)
{
	int sum = 0;

	if (argc > 1) {
		sum += rare_0(argc);
		sum += rare_1(argc);
		sum += rare_2(argc);
		sum += rare_3(argc);
		sum += rare_4(argc);
		sum += rare_5(argc);
		sum += rare_6(argc);
		sum += rare_7(argc);
		sum += rare_8(argc);
		sum += rare_9(argc);
		sum += rare_10(argc);
		sum += rare_11(argc);
		sum += rare_12(argc);
		sum += rare_13(argc);
		sum += rare_14(argc);
		sum += rare_15(argc);
		sum += rare_16(argc);
		sum += rare_17(argc);
		sum += rare_18(argc);
		sum += rare_19(argc);
	}
	for (int k = 0; k < 3; k++)
		sum += pick(k, k + argc);
	printf("%d\n", sum);
	return 0;
}
