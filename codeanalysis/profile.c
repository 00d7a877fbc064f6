/*
 * profile.c — the functions of a module that earlier runs reached: a
 * bitmap beside its repository entry that guides the agent's look-ahead.
 *
 * When the agent instruments a function F it also instruments, in the same
 * batch, F's direct callees and its caller's other direct callees (agent/
 * core/core.c).  In a compiler most of them are never called (cc1: 135,000
 * sites with the look-ahead, 68,000 without), in python3 most are.  So
 * `sptrace run` learns, after each run, which functions of each module were
 * reached, and the agent keeps a candidate only if an earlier run reached it.
 * A function the profile lacks is still instrumented when it is reached (the
 * slow path): the trace never depends on the profile, only the start's cost.
 *
 * The file, <dir>/<first two of key>/<key>.spp:
 *
 *     prof_hdr (below)                 magic, version, nfuncs, key
 *     uint8_t bits[(nfuncs + 7) / 8]   bit f (byte f / 8, bit f % 8): function
 *                                      f of the entry reached
 *
 * The protocol:
 *   1. Written (ca_profile_merge, by `sptrace run` after the program ended,
 *      cli/lookahead.c) only into a repository that is the caller's own: the
 *      repository directory and the key's subdirectory are directories of
 *      the caller's (the effective uid) that no one else may write, the
 *      subdirectory not a link, and the entry itself (<key>.spr) a regular
 *      file of the caller's.  So a user's run never writes root's
 *      repository, and root never writes into a directory, or beside an
 *      entry, another user could have planted.  The subdirectory is opened
 *      (O_NOFOLLOW) and checked through its descriptor, and the old profile
 *      read and the new one written through it (/proc/self/fd/N/...): a
 *      directory swapped after the check is never written into.
 *   2. The old profile, read as in 3, and the functions this run reached
 *      are merged (a union): written only when the run reached a function
 *      the profile lacked, atomically (ca_repo_write_atomic: a temporary
 *      file, fsync, rename), mode 0644.  Two runs that merge at once may
 *      lose one's new functions (the last rename wins): a heuristic, learnt
 *      again at the next run.
 *   3. Read (ca_profile_map: the agent, and 2) without following a link,
 *      and used only if it is a regular file that root or the reader owns
 *      and neither its group nor others may write (trust.c's rule for the
 *      files analysed, ca_file_trust), of exactly the size nfuncs asks, for
 *      the same key and the same function count as the entry the reader
 *      uses.  Anything else: no profile (the look-ahead as without one),
 *      and the reader says why.
 *   4. Mapped read-only (private): files are only ever replaced by rename,
 *      never truncated in place, so a mapping stays whole (image.c, 3).
 */
#include "ca_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROFILE_MAGIC "SPTRPROF"
#define PROFILE_VERSION 1
#define PROFILE_SUFFIX ".spp"

typedef struct prof_hdr {
	char magic[8];
	uint32_t version, hdr_size;
	uint32_t nfuncs, nreached;
	char key[160];
} prof_hdr;

static size_t prof_size(uint32_t nfuncs)
{
	return sizeof(prof_hdr) + ((size_t)nfuncs + 7) / 8;
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

/* Point 3 for the file at out->path. */
static int map_path(const char *key, uint32_t nfuncs, ca_profile *out, char *why, size_t whylen)
{
	char trust[256];
	struct stat st;
	const prof_hdr *h;
	void *base;
	int fd;

	fd = open(out->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
	if (fd < 0 && errno == ENOENT)
		return 1;
	if (fd < 0)
		return WHY("%s", errno == ELOOP ? "a symbolic link" : strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return WHY("not a regular file");
	}
	if (!ca_file_trust(&st, trust, sizeof trust)) {
		close(fd);
		return WHY("%s", trust);
	}
	if ((uint64_t)st.st_size != prof_size(nfuncs)) {
		close(fd);
		return WHY("%lld bytes, not the %zu of a profile of %u functions", (long long)st.st_size,
			   prof_size(nfuncs), nfuncs);
	}
	base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return WHY("mmap: %s", strerror(errno));
	h = base;
	if (memcmp(h->magic, PROFILE_MAGIC, 8) != 0 || h->version != PROFILE_VERSION ||
	    h->hdr_size != sizeof *h || h->nfuncs != nfuncs ||
	    memchr(h->key, 0, sizeof h->key) == NULL || strcmp(h->key, key) != 0) {
		munmap(base, (size_t)st.st_size);
		return WHY("not a profile of this version for %u functions of %s", nfuncs, key);
	}
	out->map = base;
	out->map_len = (size_t)st.st_size;
	out->bits = (const uint8_t *)base + sizeof *h;
	out->nfuncs = nfuncs;
	out->nreached = h->nreached;
	return 0;
}

int ca_profile_map(const char *dir, const char *key, uint32_t nfuncs, ca_profile *out,
		   char *why, size_t whylen)
{
	sp_err err;

	memset(out, 0, sizeof *out);
	if (ca_repo_key_path(&dir, key, PROFILE_SUFFIX, out->path, sizeof out->path, &err) < 0)
		return WHY("%s", err.msg);
	return map_path(key, nfuncs, out, why, whylen);
}

void ca_profile_unmap(ca_profile *p)
{
	if (p->map)
		munmap(p->map, p->map_len);
	memset(p, 0, sizeof *p);
}

/* Protocol point 1: a directory of the caller's only it may write (fd:
 * opened, else -1: by path). */
static int own_dir(const char *dir, int fd, char *why, size_t whylen)
{
	struct stat st;
	int opened = fd < 0, own;

	if (opened && (fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return WHY("%s: %s", dir, strerror(errno));
	own = sp_fd_private(fd, &st);
	if (opened)
		close(fd);
	if (!S_ISDIR(st.st_mode))
		return WHY("%s is not a directory", dir);
	if (!own && st.st_uid != geteuid())
		return WHY("%s is uid %u's, not this user's (uid %u)", dir, (unsigned)st.st_uid,
			   (unsigned)geteuid());
	if (!own)
		return WHY("others may write into %s (mode %04o)", dir,
			   (unsigned)(st.st_mode & 07777));
	return 0;
}

int ca_profile_merge(const char *dir, const char *key, uint32_t nfuncs, const uint8_t *reached,
		     uint32_t *nnew, sp_err *err)
{
	char entry[4096], sub[4096], why[512] = "";
	size_t nbytes = ((size_t)nfuncs + 7) / 8;
	ca_profile old;
	prof_hdr *h;
	struct stat st;
	uint8_t *buf, *bits;
	uint32_t added = 0, total = 0;
	int rc, sfd;

	*nnew = 0;
	if (ca_repo_key_path(&dir, key, ".spr", entry, sizeof entry, err) < 0)
		return -1;
	/* The key's subdirectory, opened without following a link, is where
	 * everything below happens (through /proc/self/fd/N): a directory
	 * renamed or replaced after its check is never written into. */
	snprintf(sub, sizeof sub, "%s/%.2s", dir, key);
	sfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0 || own_dir(dir, -1, why, sizeof why) < 0 || own_dir(sub, sfd, why, sizeof why) < 0) {
		if (sfd < 0)
			snprintf(why, sizeof why, "%.300s: %s", sub, strerror(errno));
		else
			close(sfd);
		return sp_fail(err, "repository %s is not this user's own: %s", dir, why), 2;
	}
	snprintf(entry, sizeof entry, "%s" ".spr", key);
	if (fstatat(sfd, entry, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
	    st.st_uid != geteuid()) {
		close(sfd);
		return sp_fail(err, "%s/%s: no entry of this user's", sub, entry), 2;
	}
	memset(&old, 0, sizeof old);
	snprintf(old.path, sizeof old.path, "/proc/self/fd/%d/%s" PROFILE_SUFFIX, sfd, key);
	if (map_path(key, nfuncs, &old, why, sizeof why) != 0)
		old.bits = NULL;        /* none, or not usable: replaced */
	buf = calloc(1, prof_size(nfuncs));
	if (!buf) {
		ca_profile_unmap(&old);
		close(sfd);
		return sp_fail(err, "out of memory");
	}
	h = (prof_hdr *)buf;
	bits = buf + sizeof *h;
	for (size_t i = 0; i < nbytes; i++) {
		uint8_t was = old.bits ? old.bits[i] : 0, now = was | reached[i];

		if (i == nbytes - 1 && nfuncs % 8)
			now &= (uint8_t)((1u << (nfuncs % 8)) - 1);
		bits[i] = now;
		added += (uint32_t)__builtin_popcount(now & ~was);
		total += (uint32_t)__builtin_popcount(now);
	}
	rc = 1;
	if (added || !old.bits) {
		memcpy(h->magic, PROFILE_MAGIC, 8);
		h->version = PROFILE_VERSION;
		h->hdr_size = sizeof *h;
		h->nfuncs = nfuncs;
		h->nreached = total;
		snprintf(h->key, sizeof h->key, "%s", key);
		snprintf(entry, sizeof entry, "/proc/self/fd/%d/%s" PROFILE_SUFFIX, sfd, key);
		rc = ca_repo_write_atomic(entry, buf, prof_size(nfuncs), err) < 0 ? -1 : 0;
		if (rc < 0)
			sp_failctx(err, "the look-ahead profile %s/%s" PROFILE_SUFFIX, sub, key);
	}
	*nnew = added;
	free(buf);
	ca_profile_unmap(&old);
	close(sfd);
	return rc;
}
