/*
 * spd.h — the spdaemon library: what the daemon (spdaemon/main.c) and the
 * `sptrace` commands that talk to daemons (keys, collect) share.
 *
 * Sections name the files that define what they declare.
 */
#ifndef SPD_H
#define SPD_H

#include "sp.h"

/*
 * keys.c — the cluster's keys.  One CA signs a certificate per host; the
 * daemons of two hosts accept each other when both certificates chain to
 * that CA (mutual TLS 1.3).  Files in KEYDIR (mode 0700, the caller's):
 *
 *   ca.crt, ca.key      spd_keys_init
 *   NAME.crt, NAME.key  spd_keys_issue; NAME a host name or an IP address,
 *                       which the certificate names (subjectAltName)
 *
 * Private keys are 0600, certificates 0644.  Nothing existing is ever
 * replaced: a file already there is an error naming it.
 */
#define SPD_CA_DAYS 3650        /* default validity of the CA */
#define SPD_HOST_DAYS 825       /* default validity of a host's certificate */

int spd_keys_init(const char *keydir, int days, sp_err *err);
int spd_keys_issue(const char *keydir, const char *name, int days, sp_err *err);
/* Whether NAME can name a host: a DNS name (letters, digits, '-', '.';
 * labels of 1..63, 253 at most) or an IPv4/IPv6 address; 1 for an address,
 * 0 for a DNS name, -1 (message) otherwise. */
int spd_host_name_kind(const char *name, sp_err *err);

#endif
