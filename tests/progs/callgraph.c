/*
 * callgraph.c — a program whose call graph is known exactly, for the e2e
 * tests of `sptrace analyze-binary` (tests/e2e/test_callgraph.py holds the
 * same graph as a literal edge list; change both together).
 *
 * Every function is noipa (noinline, noclone, no inter-procedural
 * propagation) so that -O0 and -O2 keep the same functions under the same
 * names and the same edges.  What each part exercises:
 *   nest_a -> nest_b -> nest_c -> leaf   nested direct calls
 *   fact                                 direct recursion
 *   is_even <-> is_odd                   mutual recursion
 *   apply                                a call through a function pointer
 *   tail_caller -> tail_target           a tail call: `jmp tail_target` at -O2
 *   check_args -> die -> exit            a noreturn error path
 *   hot_work -> report_problem           a cold callee: gcc splits the
 *                                        unlikely path into hot_work.cold
 */
#include <stdio.h>
#include <stdlib.h>

#define NOIPA __attribute__((noipa))

volatile int g_sink;

NOIPA static int leaf(int x)
{
	return x * 3 + 1;
}

NOIPA static int nest_c(int x)
{
	return leaf(x) + 2;
}

NOIPA static int nest_b(int x)
{
	return nest_c(x) * 5;
}

NOIPA int nest_a(int x)
{
	return nest_b(x) - 7;
}

NOIPA int fact(int n)
{
	int r;

	if (n <= 1)
		return 1;
	r = fact(n - 1);
	g_sink = r; /* a side effect after the call keeps the recursion a call */
	return n * r;
}

NOIPA int is_odd(unsigned n);

NOIPA int is_even(unsigned n)
{
	if (n == 0)
		return 1;
	g_sink = n;
	return is_odd(n - 1) ? 1 : 0;
}

NOIPA int is_odd(unsigned n)
{
	if (n == 0)
		return 0;
	g_sink = n;
	return is_even(n - 1) ? 1 : 0;
}

NOIPA static int square(int x)
{
	return x * x;
}

NOIPA static int apply(int (*fn)(int), int x)
{
	return fn(x) + 1;
}

NOIPA int tail_target(int x)
{
	g_sink = x;
	return x ^ 0x55;
}

/* At -O2 the call is the function's last action: gcc emits `jmp tail_target`. */
NOIPA int tail_caller(int x)
{
	g_sink = x + 1;
	return tail_target(x * 2);
}

__attribute__((noreturn)) NOIPA static void die(const char *why)
{
	fprintf(stderr, "callgraph: %s\n", why);
	exit(2);
}

NOIPA static void check_args(int argc)
{
	if (argc > 100)
		die("too many arguments");
	if (argc < 0)
		abort();
}

__attribute__((cold, noinline)) void report_problem(int x)
{
	fprintf(stderr, "callgraph: problem with %d\n", x);
}

/* The report_problem branch is cold, so -O2 moves it to hot_work.cold. */
NOIPA int hot_work(int x)
{
	int acc = 0;

	for (int i = 0; i < x; i++) {
		if (__builtin_expect(i == 1000000, 0)) {
			report_problem(i);
			acc -= 3;
		}
		acc += i * x;
	}
	return acc;
}

int main(int argc, char **argv)
{
	int r = 0;

	check_args(argc);
	r += nest_a(argc);
	r += fact(argc + 4);
	r += is_even((unsigned)argc + 10);
	r += apply(square, argc);
	r += tail_caller(argc);
	r += hot_work(argc + 20);
	printf("%d %s\n", r, argv[0] ? "ok" : "?");
	return 0;
}
