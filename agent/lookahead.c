/*
 * lookahead.c — the look-ahead's profile: which functions of a module
 * earlier runs reached (codeanalysis/profile.c, its protocol), so that the
 * core's look-ahead (core/core.c) instruments only those ahead of the flow.
 *
 * Each module's profile is mapped, read-only, as its repository entry comes
 * in (modules.c), from the agent's own repository -- where `sptrace run`
 * writes it -- and checked there (profile.c, point 3: not a link, root's or
 * this user's and no one else's to write, the size of the entry's function
 * count, the same key).  A module without one keeps the whole look-ahead;
 * so does every module when SPTRACE_LOOKAHEAD is "all" (`sptrace run
 * --lookahead all`, carried into exec'd images by exec.c).  agent.log says,
 * per module, which.  Correctness never depends on it: a function the
 * profile lacks is instrumented when it is reached.
 */
#include <string.h>

#include "agent.h"

static bool whole;             /* SPTRACE_LOOKAHEAD=all: no profiles */

void ag_lookahead_init(const char *how)
{
	whole = how && strcmp(how, "all") == 0;
}

bool ag_lookahead_whole(void)
{
	return whole;
}

void ag_lookahead_profile(ag_module *m)
{
	ca_profile prof, *p = &prof, *kept;
	char why[512];
	size_t nfuncs;
	int rc;

	if (whole) {
		ag_log("module %u: look-ahead of every direct callee (SPTRACE_LOOKAHEAD=all)",
		       m->index);
		return;
	}
	ca_module_funcs(m->ca, &nfuncs);
	rc = ca_profile_map(ag_repo_dir[0] ? ag_repo_dir : NULL, m->key, (uint32_t)nfuncs, p,
			    why, sizeof why);
	if (rc == 0) {
		ag_log("module %u: look-ahead profile %s: %u of %u functions reached by earlier "
		       "runs; only those join a look-ahead batch", m->index, p->path, p->nreached,
		       p->nfuncs);
		if ((kept = ag_alloc(sizeof *kept)) != NULL) {
			*kept = prof;
			__atomic_store_n(&m->profile, kept, __ATOMIC_RELEASE);
		}
	} else if (rc == 1) {
		ag_log("module %u: no look-ahead profile (%s): look-ahead of every direct callee",
		       m->index, p->path[0] ? p->path : "none");
	} else {
		ag_log("module %u: look-ahead profile %s ignored: %s; look-ahead of every direct "
		       "callee", m->index, p->path[0] ? p->path : "-", why);
	}
}

bool cp_plat_likely(void *mod, uint32_t func)
{
	const ca_profile *p = __atomic_load_n(&((ag_module *)mod)->profile, __ATOMIC_ACQUIRE);

	return !p || (func < p->nfuncs && (p->bits[func >> 3] >> (func & 7) & 1));
}
