/*
 * spd_internal.h — what the spdaemon library's files share and its users
 * do not need.
 */
#ifndef SPD_INTERNAL_H
#define SPD_INTERNAL_H

#include "spd.h"

/* keys.c: KEYDIR opened O_NOFOLLOW and checked (the caller's, closed to
 * others), made 0700 first with `create`; the descriptor or -1. */
int spd_keys_open_dir(const char *keydir, int create, sp_err *err);
/* A PEM certificate (X509 *) or private key (EVP_PKEY *, `is_key`) from
 * KEYDIR/name: a regular file of the caller's; a key nobody else may read. */
void *spd_keys_read(int dfd, const char *keydir, const char *name, int is_key, sp_err *err);

#endif
