/*
 * lookahead.c — after a run, what it reached goes into each module's
 * look-ahead profile (codeanalysis/profile.c: the file and its protocol),
 * which the agents of the next runs read (agent/lookahead.c).
 *
 *   1. Packing met every record of the run (an_pack_ring; not with
 *      --no-compact or --flight-recorder, whose runs teach nothing) and kept,
 *      per trace directory, the site ids with an ENTRY record
 *      (an_pack_entered).  Only directories packing took are read: the
 *      caller's own, no one else's to write (cmd_pack.c, point 1).
 *   2. Each such directory (the trace, its exec'd images' and spawned
 *      children's subdirectories: cli_trace_walk, the walk packing makes)
 *      is opened without following a link and read through its descriptor:
 *      its meta's module lines give each module index's repository key, its
 *      sites file each entered id's callee (module index and link-time
 *      entry address).
 *   3. The callee's function index is looked up in the module's calls view
 *      (ca_repo_load_calls: the entry the agents used, by the same key), one
 *      bitmap per key over every directory of the run.
 *   4. Each key's bitmap is merged into its profile (ca_profile_merge: only
 *      in a repository that is the caller's own; written only when the run
 *      reached a function the profile lacked).
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"
#include "codeanalysis.h"
#include "trace_format.h"

#define MAX_KEYS 4096

typedef struct learnt {
	char key[160];
	ca_module *ca;           /* NULL: no calls view (skipped) */
	uint32_t nfuncs;
	uint8_t *reached;
} learnt;

typedef struct learning {
	learnt k[MAX_KEYS];
	size_t n;
} learning;

static learnt *key_of(learning *l, const char *key)
{
	learnt *k;
	sp_err err;
	size_t nf;

	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->k[i].key, key) == 0)
			return l->k[i].ca ? &l->k[i] : NULL;
	if (l->n == MAX_KEYS)
		return NULL;
	k = &l->k[l->n++];
	snprintf(k->key, sizeof k->key, "%s", key);
	if (ca_repo_load_calls(NULL, key, &k->ca, &err) != 0)
		return k->ca = NULL, NULL;
	ca_module_funcs(k->ca, &nf);
	k->nfuncs = (uint32_t)nf;
	k->reached = calloc(1, (nf + 7) / 8 + 1);
	if (!k->reached) {
		ca_module_free(k->ca);
		return k->ca = NULL, NULL;
	}
	return k;
}

/* Point 2 and 3 for the directory open at dfd. */
static void learn_dir(learning *l, int dfd)
{
	char path[PATH_MAX];
	const uint8_t *bits;
	learnt *bymod[1024] = { 0 };
	bool tried[1024] = { 0 };
	const char *keys[1024] = { 0 };
	an_meta *meta;
	struct stat st;
	trace_site *sites;
	size_t nbits, nsites;
	sp_err err;
	int fd;

	snprintf(path, sizeof path, "/proc/self/fd/%d", dfd);
	if (!(bits = an_pack_entered(path, &nbits)) || an_meta_read(path, &meta, &err) < 0)
		return;
	for (size_t i = 0; i < an_meta_nlines(meta); i++) {
		char v[PATH_MAX + 256];
		an_module mod;

		if (strcmp(an_meta_key(meta, i), TRACE_META_MODULE) != 0)
			continue;
		snprintf(v, sizeof v, "%s", an_meta_val(meta, i));
		if (an_module_line(v, &mod) == 0 && mod.index < 1024) {
			free((char *)keys[mod.index]);
			keys[mod.index] = strdup(mod.key);
		}
	}
	an_meta_free(meta);
	fd = openat(dfd, "sites", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
	    (size_t)st.st_size >= 2 * sizeof *sites) {
		nsites = (size_t)st.st_size / sizeof *sites;
		sites = mmap(NULL, nsites * sizeof *sites, PROT_READ, MAP_PRIVATE, fd, 0);
		if (sites != MAP_FAILED) {
			/* Record 0's first 4 bytes: the next id the agents hand out. */
			uint32_t next;

			memcpy(&next, &sites[0], sizeof next);
			if (next < nsites)
				nsites = next;
			for (size_t id = 1; id < nsites && id < nbits; id++) {
				const trace_site *s = &sites[id];
				uint32_t f, cm = s->callee_module;
				learnt *k;

				if (!(bits[id >> 3] >> (id & 7) & 1) || cm >= 1024 || !keys[cm])
					continue;
				if (!tried[cm]) {
					tried[cm] = true;
					bymod[cm] = key_of(l, keys[cm]);
				}
				if (!(k = bymod[cm]))
					continue;
				f = ca_func_at(k->ca, s->callee_func);
				if (f != CA_NONE && ca_module_funcs(k->ca, NULL)[f].addr == s->callee_func)
					k->reached[f >> 3] |= (uint8_t)(1u << (f & 7));
			}
			munmap(sites, (size_t)st.st_size / sizeof *sites * sizeof *sites);
		}
	}
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; i < 1024; i++)
		free((char *)keys[i]);
}

/* Point 2: each directory of the trace (cli_trace_walk), once. */
static int learn_one(int dfd, const char *shown, const char *name, void *arg)
{
	if (dfd >= 0 && !name)
		learn_dir(arg, dfd);
	return 0;
}

void cli_learn_lookahead(const char *cmd, const char *dir)
{
	learning *l = calloc(1, sizeof *l);

	if (!l)
		return;
	cli_trace_walk(dir, learn_one, l);
	for (size_t i = 0; i < l->n; i++) {
		learnt *k = &l->k[i];
		uint32_t nnew;
		sp_err err;

		if (!k->ca)
			continue;
		/* Point 4: a repository not ours (2) is left alone, silently. */
		if (ca_profile_merge(NULL, k->key, k->nfuncs, k->reached, &nnew, &err) < 0)
			cli_error("%s: the look-ahead profile of %s not updated: %s", cmd,
				  ca_module_path(k->ca), err.msg);
		ca_module_free(k->ca);
		free(k->reached);
	}
	free(l);
}
