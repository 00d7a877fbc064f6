/*
 * dl.c — a library loaded at its first use rather than linked (sp.h,
 * sp_dl_table): the CLI's libX11 (hotkey.c), libstdc++ (demangle.c) and
 * OpenSSL (spdaemon/ossl.c).  Not for the agent, which loads nothing into
 * the program.
 */
#include "sp.h"

#include <dlfcn.h>
#include <stdio.h>

int sp_dl_table(const char *soname, const char *const *names, size_t n, void **slots,
		char *why, size_t len)
{
	void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);

	if (!h)
		return snprintf(why, len, "%s", dlerror()), -1;
	for (size_t i = 0; i < n; i++)
		if (!(slots[i] = dlsym(h, names[i])))
			return snprintf(why, len, "%s has no %s", soname, names[i]), -1;
	return 0;
}
