/*
 * tests/fuzz/seed.c — a tiny program compiled at build time (gcc -g -O2) into
 * the fuzzer's seed corpus, so fuzzing starts from valid ELF files with what
 * the analyser reads: .eh_frame, a jump table, direct, indirect and tail
 * calls, a noreturn callee, a cold fragment and DWARF line tables.
 */
#include <stdio.h>
#include <stdlib.h>

typedef int (*op_fn)(int, int);

__attribute__((noinline)) static int add(int a, int b) { return a + b; }
__attribute__((noinline)) static int sub(int a, int b) { return a - b; }

__attribute__((noinline, noreturn)) static void die(const char *why)
{
	fprintf(stderr, "seed: %s\n", why);
	exit(2);
}

/* Dense cases: gcc -O2 emits a jump table. */
__attribute__((noinline)) int classify(int c)
{
	switch (c) {
	case 0: return 11;
	case 1: return add(c, 7);
	case 2: return 23;
	case 3: return sub(c, 5);
	case 4: return 47;
	case 5: return 53;
	case 6: return 61;
	case 7: return 79;
	default: return -1;
	}
}

/* The unlikely branch goes to a .cold fragment. */
__attribute__((noinline)) int checked(int v)
{
	if (__builtin_expect(v < 0, 0))
		die("negative");
	return v * 3;
}

/* Tail call through a table of function pointers. */
__attribute__((noinline)) int apply(int which, int a, int b)
{
	static op_fn const ops[] = { add, sub };

	return ops[which & 1](a, b);
}

int main(int argc, char **argv)
{
	int v = argc > 1 ? atoi(argv[1]) : 3;

	printf("%d %d %d\n", classify(v), checked(v), apply(v, v, argc));
	return 0;
}
