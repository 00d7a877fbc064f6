/*
 * modules.c — the modules the agent traces and their code analysis.
 *
 * Each module's analysis comes from the repository (analysed on the spot and
 * stored when missing).  This happens while the agent is dormant, before the
 * activation event, so the activation and the first calls never wait for a
 * disassembler.  For now the main executable is traced; shared libraries
 * follow with PLT propagation.
 */
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

#define MAX_MODULES 1024

static ag_module *modules[MAX_MODULES];
static uint32_t nmodules;

typedef struct find_main {
	uint64_t bias, lo, hi;
	bool found;
} find_main;

static int main_phdrs(struct dl_phdr_info *info, size_t size, void *arg)
{
	find_main *fm = arg;

	if (fm->found)
		return 1;
	/* The first object is the executable (its name is ""). */
	fm->found = true;
	fm->bias = info->dlpi_addr;
	fm->lo = UINT64_MAX;
	fm->hi = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		if (info->dlpi_addr + ph->p_vaddr < fm->lo)
			fm->lo = info->dlpi_addr + ph->p_vaddr;
		if (info->dlpi_addr + ph->p_vaddr + ph->p_memsz > fm->hi)
			fm->hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
	}
	return 1;
}

int ag_modules_init(char *err, size_t errlen)
{
	ag_module *m = ag_alloc(sizeof *m);
	find_main fm = { 0 };
	sp_err e = { "" };
	ssize_t n;
	int from_repo = 0;
	size_t nfuncs, nsites;

	if (!m) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	n = readlink("/proc/self/exe", m->path, sizeof m->path - 1);
	if (n <= 0) {
		snprintf(err, errlen, "cannot read /proc/self/exe: %s", strerror(errno));
		return -1;
	}
	m->path[n] = '\0';
	dl_iterate_phdr(main_phdrs, &fm);
	if (!fm.found || fm.lo >= fm.hi) {
		snprintf(err, errlen, "cannot find the executable's code segments");
		return -1;
	}
	m->bias = fm.bias;
	m->text_lo = fm.lo;
	m->text_hi = fm.hi;
	if (ca_repo_get(NULL, m->path, NULL, &m->ca, &from_repo, &e)) {
		snprintf(err, errlen, "analysing %s: %s", m->path, e.msg);
		return -1;
	}
	ca_module_funcs(m->ca, &nfuncs);
	ca_module_sites(m->ca, &nsites);
	m->pool = ag_pool_near(m->text_lo, m->text_hi);
	if (!m->pool) {
		snprintf(err, errlen, "no memory for patch areas near %s", m->path);
		return -1;
	}
	m->func_state = ag_pool_data(m->pool, nfuncs ? nfuncs : 1);
	m->site_ids = ag_alloc((nsites ? nsites : 1) * sizeof *m->site_ids);
	if (!m->func_state || !m->site_ids) {
		snprintf(err, errlen, "out of memory for %s's %zu functions", m->path, nfuncs);
		return -1;
	}
	m->index = nmodules;
	modules[nmodules++] = m;
	ag_log("module %u: %s bias %#lx, %zu functions, %zu sites (%s)", m->index, m->path,
	       (unsigned long)m->bias, nfuncs, nsites, from_repo ? "from the repository" : "analysed now");
	return 0;
}

ag_module *ag_module_of(uint64_t addr)
{
	for (uint32_t i = 0; i < nmodules; i++)
		if (addr >= modules[i]->text_lo && addr < modules[i]->text_hi)
			return modules[i];
	return NULL;
}

uint32_t ag_module_count(void)
{
	return nmodules;
}

ag_module *ag_module_at(uint32_t index)
{
	return index < nmodules ? modules[index] : NULL;
}
