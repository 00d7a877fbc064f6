/*
 * bench/sweep.c — linear-sweep decode of an ELF file's executable sections
 * (see sweep.h).  The sections are the ones the analyser counts in
 * ca_stats.text_bytes: allocated, SHF_EXECINSTR, with file bytes.  Bytes
 * capstone cannot decode are skipped one at a time, so the sweep always
 * covers every byte, like the analyser, which records such regions and goes on.
 */
#include "sweep.h"

#include <capstone/capstone.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Decode [code, code + size) at address `addr` from start to end. */
static void sweep_section(csh cs, cs_insn *in, const uint8_t *code, size_t size,
			  uint64_t addr, bench_sweep *out)
{
	size_t left = size;

	while (left) {
		if (cs_disasm_iter(cs, &code, &left, &addr, in)) {
			out->ninsns++;
			continue;
		}
		code++;
		left--;
		addr++;
		out->skipped++;
	}
}

int bench_sweep_file(const char *path, bench_sweep *out, sp_err *err)
{
	uint64_t t0 = sp_now_ns(), t1;
	struct stat st;
	Elf_Scn *scn = NULL;
	Elf *elf = NULL;
	uint8_t *map = MAP_FAILED;
	cs_insn *in = NULL;
	csh cs = 0;
	int fd, rc = -1;

	memset(out, 0, sizeof *out);
	elf_version(EV_CURRENT);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		sp_fail(err, "%s: cannot open: %m", path);
		goto done;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
	if (map == MAP_FAILED || !elf || elf_kind(elf) != ELF_K_ELF) {
		sp_fail(err, "%s: not an ELF file", path);
		goto done;
	}
	if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs) != CS_ERR_OK) {
		sp_fail(err, "capstone: cannot open an x86-64 disassembler");
		goto done;
	}
	cs_option(cs, CS_OPT_DETAIL, CS_OPT_ON);
	in = cs_malloc(cs);
	t1 = sp_now_ns();
	while ((scn = elf_nextscn(elf, scn))) {
		GElf_Shdr sh;

		if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS ||
		    !(sh.sh_flags & SHF_ALLOC) || !(sh.sh_flags & SHF_EXECINSTR) ||
		    sh.sh_size == 0)
			continue;
		if (sh.sh_offset > (uint64_t)st.st_size ||
		    sh.sh_size > (uint64_t)st.st_size - sh.sh_offset) {
			sp_fail(err, "%s: section at offset %#llx extends past the end of the file",
				path, (unsigned long long)sh.sh_offset);
			goto done;
		}
		out->nsecs++;
		out->text_bytes += sh.sh_size;
		sweep_section(cs, in, map + sh.sh_offset, sh.sh_size, sh.sh_addr, out);
	}
	out->decode_ns = sp_now_ns() - t1;
	rc = 0;
done:
	if (in)
		cs_free(in, 1);
	if (cs)
		cs_close(&cs);
	if (elf)
		elf_end(elf);
	if (map != MAP_FAILED)
		munmap(map, (size_t)st.st_size);
	if (fd >= 0)
		close(fd);
	out->ns = sp_now_ns() - t0;
	return rc;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

uint64_t bench_median(uint64_t *v, int n)
{
	if (n <= 0)
		return 0;
	qsort(v, (size_t)n, sizeof *v, cmp_u64);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t bench_min(const uint64_t *v, int n)
{
	uint64_t m = n > 0 ? v[0] : 0;

	for (int i = 1; i < n; i++)
		if (v[i] < m)
			m = v[i];
	return m;
}
