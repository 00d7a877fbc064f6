/*
 * traced.c — the program the synthetic traces of these tests describe.  It is
 * never run: the tests analyse it (codeanalysis) to learn the addresses of
 * its functions and call sites, and write trace directories whose "module"
 * line names it, so that replay and report resolve real names and lines.
 *
 * Each function sits on one line so that its entry maps to that line
 * whichever row of the line table wins; test_trace_read.c checks the line of
 * `leaf` (keep it on line 20).
 */
#include <setjmp.h>
#include <stdio.h>

#define NOIPA __attribute__((noipa))

static jmp_buf env;
static int (*volatile hook)(int);

/* line 20: */
NOIPA int leaf(int x) { return x + 1; }
NOIPA int middle(int x) { return leaf(x) * 2; }
NOIPA int fact(int n) { return n <= 1 ? 1 : n * fact(n - 1); }
NOIPA int worker(int x) { return middle(x) + leaf(x); }
NOIPA void deep(int n) { if (n) deep(n - 1); else longjmp(env, 1); }

int main(int argc, char **argv)
{
	int r = middle(argc) + fact(5) + worker(3);

	hook = leaf;
	r += hook(argc);
	if (!setjmp(env))
		deep(3);
	printf("%d %s\n", r, argv[0]);
	return 0;
}
