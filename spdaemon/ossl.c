/*
 * ossl.c -- spd_ossl's slots, filled from libssl.so.3 at the first call of
 * any of them (ossl.h).
 */
#define SPD_OSSL_LOADER
#include "ossl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "sp.h"

struct spd_ossl spd_ossl;

#define SPD_OSSL_ONE(f) + 1
enum { NFUNCS = 0 SPD_OSSL_FUNCS(SPD_OSSL_ONE) };
#undef SPD_OSSL_ONE
_Static_assert(sizeof spd_ossl == NFUNCS * sizeof(void *), "one slot a function, no gap");

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
#define SPD_OSSL_NAME(f) #f,
	static const char *const names[] = { SPD_OSSL_FUNCS(SPD_OSSL_NAME) };
#undef SPD_OSSL_NAME
	char why[256];

	if (sp_dl_table("libssl.so.3", names, NFUNCS, (void **)&spd_ossl, why, sizeof why) < 0) {
		fprintf(stderr, "%s: the TLS library cannot be loaded: %s (Debian's libssl3 has "
			"it)\n", program_invocation_short_name, why);
		exit(1);
	}
}

void spd_ossl_need(void)
{
	pthread_once(&once, load);
}
