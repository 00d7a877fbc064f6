/*
 * tests/fuzz/fuzz_analyze.c — libFuzzer target for the codeanalysis readers:
 * ELF (libelf, sections, symbols, notes, relocations), .eh_frame and the LSDA,
 * recursive disassembly with jump tables, and DWARF line tables.
 *
 * Each input is written to a fresh memfd and analysed through its
 * /proc/self/fd path, exactly as a file on disk would be, with source lines
 * on so that .debug_line in the input is parsed too.  Debug files are looked
 * up only in a directory that does not exist, so a run depends on the input
 * alone, never on what /usr/lib/debug holds.  Everything is freed per input:
 * libFuzzer's leak check (ASan builds) reports any leak as a crash.
 */
#include "codeanalysis.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Write all of `data` to `fd`; false on a short write. */
static int write_all(int fd, const uint8_t *data, size_t size)
{
	while (size) {
		ssize_t n = write(fd, data, size);

		if (n <= 0)
			return 0;
		data += n;
		size -= (size_t)n;
	}
	return 1;
}

/* Read every result the way the CLI and the agent would, so that an index
 * or string offset pointing outside its array is caught by ASan here. */
static size_t read_results(const ca_module *m)
{
	const ca_func *fn;
	const ca_site *site;
	const ca_line *line;
	size_t i, n, total = 0;

	fn = ca_module_funcs(m, &n);
	for (i = 0; i < n; i++) {
		total += strlen(ca_str(m, fn[i].name));
		total += ca_func_at(m, fn[i].addr) == i;
		if (ca_line_at(m, fn[i].addr))
			total++;
	}
	site = ca_module_sites(m, &n);
	for (i = 0; i < n; i++)
		if (site[i].import != CA_NONE)
			total += strlen(ca_str(m, site[i].import));
	line = ca_module_lines(m, &n);
	for (i = 0; i < n; i++)
		total += strlen(ca_str(m, line[i].file));
	return total + strlen(ca_module_key(m)) + strlen(ca_module_lines_source(m));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const ca_options opt = { .no_lines = 0,
					.debug_dir = "/nonexistent/sptrace-fuzz-debug" };
	char path[64], key[256];
	ca_module *m = NULL;
	sp_err err;
	int fd;

	fd = memfd_create("sptrace-fuzz", MFD_CLOEXEC);
	if (fd < 0) {
		perror("memfd_create");
		return 0;
	}
	if (!write_all(fd, data, size)) {
		close(fd);
		return 0;
	}
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	if (ca_analyze(path, &opt, &m, &err) == 0) {
		read_results(m);
		ca_module_free(m);
	}
	ca_module_key_of(path, key, sizeof key, &err);
	close(fd);
	return 0;
}
