/*
 * modules.c — the code analysis of each traced module. See analysis.h for
 * what each promises.
 */
#include "an_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Module analyses                                                           */
/* ------------------------------------------------------------------------ */

/*
 * The analysis must be of the very module that was traced: first the
 * repository entry under the key meta names (the file may have been replaced
 * since), then the file at the path if its key is the traced one, analysed
 * if the repository lacks it -- and stored only if no other user could have
 * written the file (codeanalysis/trust.c): a trace directory is anyone's to
 * make, and its meta may name a file built to carry a build-id of root's
 * programs.  An entry the agent made inside the program has no source
 * lines (lines_pending): ca_repo_get reads them from the file, if it is
 * still the traced module, and replaces the entry; else the entry serves
 * without them.
 */
/*
 * The kernel's functions (`sptrace run --kernel`): no analysis, their names
 * from kernel.syms (trace_format.h), a file of the trace and so anyone's to
 * make: lines that do not parse are skipped, and the file's size is bounded.
 */
static int kname_cmp(const void *a, const void *b)
{
	const an_kname *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/*
 * The kernel's functions (`sptrace run --kernel`): no analysis, their names
 * from kernel.syms (trace_format.h), a file of the trace and so anyone's to
 * make: lines that do not parse are skipped, the file's size is bounded,
 * and of two names for one address the first is kept.
 */
static void load_kernel_names(an_trace *t, module *m)
{
	char path[PATH_MAX], *buf, *line, *save = NULL;
	size_t len, cap = 0, k = 0;

	snprintf(path, sizeof path, "%s/kernel.syms", t->dir);
	if (an_slurp(path, 64u << 20, &buf, &len) < 0) {
		an_warn(t, "%s: cannot read: %s; the kernel's functions are named by address", path,
			an_errno_text(errno));
		return;
	}
	buf[len] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *end, *name;
		uint64_t a = strtoull(line, &end, 16);

		if (end == line || *end != ' ' || !*(name = end + 1) || strlen(name) > 512)
			continue;
		if (m->nknames == cap) {
			size_t nc = cap ? 2 * cap : 256;
			an_kname *nk = realloc(m->knames, nc * sizeof *nk);

			if (!nk)
				break;
			m->knames = nk;
			cap = nc;
		}
		if (!(m->knames[m->nknames].name = strdup(name)))
			break;
		m->knames[m->nknames++].addr = a;
	}
	free(buf);
	if (!m->nknames)
		return;
	qsort(m->knames, m->nknames, sizeof *m->knames, kname_cmp);
	for (size_t i = 0; i < m->nknames; i++) {
		if (k && m->knames[k - 1].addr == m->knames[i].addr)
			free(m->knames[i].name);
		else
			m->knames[k++] = m->knames[i];
	}
	m->nknames = k;
}

const char *an_kernel_name(const module *m, uint64_t addr)
{
	size_t lo = 0, hi = m->nknames;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (m->knames[mid].addr < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < m->nknames && m->knames[lo].addr == addr ? m->knames[lo].name : NULL;
}

void an_module_free(module *m)
{
	ca_module_free(m->ca);
	for (size_t i = 0; i < m->nknames; i++)
		free(m->knames[i].name);
	free(m->knames);
}

void an_load_module(an_trace *t, module *m, const char *repo)
{
	if (strcmp(m->pub.path, TRACE_KERNEL_MODULE_PATH) == 0 &&
	    strcmp(m->pub.key, TRACE_KERNEL_MODULE_KEY) == 0) {
		load_kernel_names(t, m);
		return;
	}

	ca_options opt = { 0 };
	ca_module *ca = NULL;
	sp_err e = { "" };
	char key[160];
	int from_repo = 0, rc = ca_repo_load(repo, m->pub.key, &ca, &e);

	if (rc == 0 && ca_module_lines_pending(ca)) {
		ca_module *full = NULL;

		if (ca_module_key_of(m->pub.path, key, sizeof key, &e) == 0 &&
		    strcmp(key, m->pub.key) == 0 &&
		    ca_repo_get(repo, m->pub.path, &opt, &full, NULL, &e) == 0) {
			ca_module_free(ca);
			ca = full;
		}
	}
	if (rc == 0) {
		m->ca = ca;
		m->pub.ca = ca;
		return;
	}
	if (rc < 0)
		an_warn(t, "module %u %s: %s; analysing the file again", m->pub.index, m->pub.path,
		     e.msg);
	/* Not even analysed unless it carries the traced build-id. */
	if (ca_module_key_of(m->pub.path, key, sizeof key, &e) < 0) {
		an_warn(t, "module %u: %s; its functions are named by address", m->pub.index, e.msg);
		return;
	}
	if (strcmp(key, m->pub.key) != 0) {
		an_warn(t, "module %u %s: the file is not the traced module (key %s, the trace has "
		     "%s): it changed since the trace; its functions are named by address",
		     m->pub.index, m->pub.path, key, m->pub.key);
		return;
	}
	if (ca_repo_get(repo, m->pub.path, &opt, &ca, &from_repo, &e) < 0) {
		an_warn(t, "module %u: %s; its functions are named by address", m->pub.index, e.msg);
		return;
	}
	/* A file another user could have written names functions here, for
	 * this reader only: whoever reads the repository trusts its entries. */
	if (!from_repo && ca_module_untrusted(ca)[0])
		an_warn(t, "module %u %s: analysed for this command only, not stored in the "
		     "code-analysis repository: the file is %s", m->pub.index, m->pub.path,
		     ca_module_untrusted(ca));
	m->ca = ca;
	m->pub.ca = ca;
}

