/*
 * test_lines.c — source lines (codeanalysis/lines.c) through the public API:
 *
 *   1. this test's own executable (built with -g): a noinline function's
 *      entry maps to this file and to the line the function is on;
 *   2. libc.so.6, whose DWARF is in libc6-dbg's build-id debug file: lines
 *      come from /usr/lib/debug/.build-id/... and malloc's entry maps to a
 *      file of glibc's malloc/;
 *   3. opt.no_lines: no lines at all.
 *
 * Prints what failed and returns non-zero; returns 0 when all pass.
 */
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codeanalysis.h"

#define LIBC_PATH "/lib/x86_64-linux-gnu/libc.so.6"
#define DEBUG_DIR "/usr/lib/debug"

static int failures;

#define CHECK(cond, ...)                                                    \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "test_lines:%d: FAIL: ", __LINE__); \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
			failures++;                                         \
		}                                                           \
	} while (0)

/* The function looked up in case 1.  Kept on one line so that every row of
 * its line table says the same line, whichever row wins at its entry. */
static volatile int probe_line;
__attribute__((noinline)) int lines_probe(int x) { probe_line = __LINE__; return x * 3 + 1; }

static bool ends_with(const char *s, const char *suffix)
{
	size_t ls = strlen(s), lx = strlen(suffix);

	return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* The load bias of the object containing `addr` (ELF vaddr = addr - bias). */
struct bias_query {
	uintptr_t addr;
	uintptr_t bias;
	int found;
};

static int find_bias(struct dl_phdr_info *info, size_t size, void *data)
{
	struct bias_query *q = data;

	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && q->addr >= start && q->addr - start < ph->p_memsz) {
			q->bias = info->dlpi_addr;
			q->found = 1;
			return 1;
		}
	}
	return 0;
}

static void check_sorted(const ca_module *m, const char *what)
{
	size_t n;
	const ca_line *l = ca_module_lines(m, &n);

	for (size_t i = 1; i < n; i++)
		if (l[i - 1].addr >= l[i].addr) {
			CHECK(0, "%s: lines not sorted by address at row %zu (%#llx then %#llx)",
			      what, i, (unsigned long long)l[i - 1].addr,
			      (unsigned long long)l[i].addr);
			return;
		}
}

/* 1. Our own function, in our own DWARF. */
static void test_self(void)
{
	int (*volatile fp)(int) = lines_probe;
	struct bias_query q = { .addr = (uintptr_t)fp };
	ca_options opt = { 0 };
	ca_module *m = NULL;
	sp_err err;
	const ca_line *l;
	const char *file, *src;
	size_t n;
	uint64_t vaddr;

	CHECK(fp(1) == 4, "lines_probe(1) returned the wrong value");
	if (ca_analyze("/proc/self/exe", &opt, &m, &err) < 0) {
		CHECK(0, "analysing /proc/self/exe: %s", err.msg);
		return;
	}
	dl_iterate_phdr(find_bias, &q);
	CHECK(q.found, "no loaded segment contains lines_probe at %p", (void *)q.addr);
	vaddr = (uint64_t)(q.addr - q.bias);

	ca_module_lines(m, &n);
	CHECK(n > 0, "/proc/self/exe: no source lines (is the test built with -g?)");
	src = ca_module_lines_source(m);
	CHECK(src && src[0] && strncmp(src, DEBUG_DIR "/", strlen(DEBUG_DIR) + 1) != 0,
	      "/proc/self/exe: lines should come from the executable itself, not '%s'",
	      src ? src : "(null)");
	check_sorted(m, "/proc/self/exe");

	l = ca_line_at(m, vaddr);
	CHECK(l != NULL, "/proc/self/exe: no line at lines_probe (vaddr %#llx)",
	      (unsigned long long)vaddr);
	if (l) {
		file = ca_str(m, l->file);
		CHECK(file && ends_with(file, "test_lines.c"),
		      "lines_probe maps to file '%s', expected one ending in test_lines.c",
		      file ? file : "(null)");
		CHECK(l->line == (uint32_t)probe_line,
		      "lines_probe maps to line %u, expected %d", l->line, probe_line);
	}
	ca_module_free(m);
}

/* 2. libc through libc6-dbg's build-id debug file. */
static void test_libc(void)
{
	static const char *const names[] = { "malloc", "__libc_malloc" };
	ca_options opt = { 0 };
	ca_module *m = NULL;
	sp_err err;
	char debug_file[512];
	const char *bid, *src, *file;
	const ca_func *funcs;
	const ca_line *l;
	size_t n, nfuncs;
	uint32_t fi = CA_NONE;

	if (ca_analyze(LIBC_PATH, &opt, &m, &err) < 0) {
		CHECK(0, "analysing %s: %s", LIBC_PATH, err.msg);
		return;
	}
	bid = ca_module_buildid(m);
	if (!bid || strlen(bid) < 4) {
		CHECK(0, "%s has no build-id", LIBC_PATH);
		ca_module_free(m);
		return;
	}
	snprintf(debug_file, sizeof debug_file, DEBUG_DIR "/.build-id/%.2s/%s.debug", bid, bid + 2);
	if (access(debug_file, R_OK) != 0) {
		CHECK(0, "%s is missing: install libc6-dbg (apt-get install -y libc6-dbg; "
		      "test.sh does this) to test lines from a build-id debug file", debug_file);
		ca_module_free(m);
		return;
	}

	ca_module_lines(m, &n);
	CHECK(n > 0, "%s: no source lines although %s exists", LIBC_PATH, debug_file);
	src = ca_module_lines_source(m);
	CHECK(src && strcmp(src, debug_file) == 0, "%s: lines came from '%s', expected %s",
	      LIBC_PATH, src ? src : "(null)", debug_file);
	check_sorted(m, LIBC_PATH);

	for (size_t i = 0; i < sizeof names / sizeof names[0] && fi == CA_NONE; i++)
		fi = ca_func_by_name(m, names[i]);
	funcs = ca_module_funcs(m, &nfuncs);
	CHECK(fi != CA_NONE && fi < nfuncs, "%s: no function named malloc", LIBC_PATH);
	if (fi != CA_NONE && fi < nfuncs) {
		l = ca_line_at(m, funcs[fi].addr);
		CHECK(l != NULL, "%s: no line at malloc (%#llx)", LIBC_PATH,
		      (unsigned long long)funcs[fi].addr);
		if (l) {
			file = ca_str(m, l->file);
			CHECK(file && strstr(file, "malloc") && l->line > 0,
			      "%s: malloc (%#llx) maps to '%s:%u', expected glibc's malloc/malloc.c",
			      LIBC_PATH, (unsigned long long)funcs[fi].addr,
			      file ? file : "(null)", l->line);
		}
	}
	ca_module_free(m);
}

/* 3. opt.no_lines. */
static void test_no_lines(void)
{
	ca_options opt = { .no_lines = 1 };
	ca_module *m = NULL;
	sp_err err;
	const char *src;
	size_t n = 1;

	if (ca_analyze("/proc/self/exe", &opt, &m, &err) < 0) {
		CHECK(0, "analysing /proc/self/exe with no_lines: %s", err.msg);
		return;
	}
	ca_module_lines(m, &n);
	CHECK(n == 0, "no_lines: %zu lines, expected none", n);
	src = ca_module_lines_source(m);
	CHECK(src && src[0] == '\0', "no_lines: lines source is '%s', expected \"\"",
	      src ? src : "(null)");
	CHECK(ca_line_at(m, 0x1000) == NULL, "no_lines: ca_line_at found a line");
	ca_module_free(m);
}

int main(void)
{
	test_self();
	test_libc();
	test_no_lines();
	if (failures) {
		fprintf(stderr, "test_lines: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_lines: all passed\n");
	return 0;
}
