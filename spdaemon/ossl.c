/*
 * ossl.c -- spd_ossl's slots, filled from libssl.so.3 at the first call of
 * any of them (ossl.h).
 */
#define SPD_OSSL_LOADER
#include "ossl.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct spd_ossl spd_ossl;

#define SPD_OSSL_ONE(f) + 1
enum { NFUNCS = 0 SPD_OSSL_FUNCS(SPD_OSSL_ONE) };
#undef SPD_OSSL_ONE
_Static_assert(sizeof spd_ossl == NFUNCS * sizeof(void *), "one slot a function, no gap");

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
	void *h = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
	void **slot = (void **)&spd_ossl;
	size_t i = 0;

	if (!h) {
		fprintf(stderr, "%s: the TLS library cannot be loaded: %s (Debian's libssl3 has "
			"it)\n", program_invocation_short_name, dlerror());
		exit(1);
	}
#define SPD_OSSL_LOAD(f)							\
	if (!(slot[i++] = dlsym(h, #f))) {					\
		fprintf(stderr, "%s: libssl.so.3 has no %s\n",			\
			program_invocation_short_name, #f);				\
		exit(1);							\
	}
	SPD_OSSL_FUNCS(SPD_OSSL_LOAD)
#undef SPD_OSSL_LOAD
}

void spd_ossl_need(void)
{
	pthread_once(&once, load);
}
