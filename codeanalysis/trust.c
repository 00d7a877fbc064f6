/*
 * trust.c — what an analysis was made from, and whether it may be kept.
 *
 * A repository entry is trusted by every agent that later reads it: the
 * agent patches the addresses it names.  So an entry must be the analysis of
 * the code the agent patches, whoever made the file the analysis was read
 * from.  Three guards, each here:
 *
 *   1. Storing (ca_file_trust): an analysis is stored only if its file could
 *      not have been written by another user.  A file that another user
 *      chose -- say one built with the build-id of a program of root's --
 *      would otherwise put its analysis under that program's key.
 *   2. The code an entry was made from (ca_code_sha256_fd): the SHA-256 of
 *      the file bytes of the module's executable segments, kept in the entry
 *      with the identity of the file (ca_file_id).  The sptrace command
 *      checks it before run or attach (cli/preanalyze.c, through
 *      ca_module_code_matches) and replaces an entry made from other code.
 *   3. The bytes of each site (ca_site.code): the agent hashes the bytes
 *      a patch would read or overwrite right before it patches (agent/
 *      instrument.c) and leaves the site alone unless they are those the
 *      analysis saw.  This also catches a stale entry, code the program
 *      changed itself and a JIT's code, and costs some 20 bytes of hashing
 *      per site, at the moment the site is patched -- unlike guard 2, which
 *      would cost the agent a hash of each whole module (libc: 1.4 MB, some
 *      4 ms) at every start.
 */
#include "ca_internal.h"

#include <elf.h>
#include <errno.h>
#include <gelf.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * The rule for storing.  The analysis is read from one open file (ca_analyze
 * maps the descriptor it checks: no time between the check and the read),
 * and the entry is keyed by what that file holds (its build-id), not by its
 * path.  So what matters is who could have written those bytes:
 *
 *   - the file's owner is root or the caller (the effective uid), and
 *   - neither its group nor others may write it.
 *
 * The directories of its path are NOT checked, on purpose: they decide which
 * file a path names, and the analysis is of the file opened, whatever path
 * led there.  A root-owned file that only root can write, reached through a
 * directory a user controls (a link, a hard link), holds root's bytes and
 * its analysis is right for its build-id.  (The path stored in the entry is
 * only a name to show; source lines, which a separate debug file may give,
 * name code, they never decide what is patched.)
 *
 * What the rule cannot see -- a file root owns whose bytes a user chose (a
 * container image's layers, a copy root made) -- guards 2 and 3 catch: an
 * entry made from other code is replaced before a run, and never patches a
 * site whose bytes differ.
 *
 * The same rule holds for every caller: a user's repository is trusted by
 * that user's agents as root's is by root's.
 */
bool ca_file_trust(const struct stat *st, char *why, size_t len)
{
	uid_t me = geteuid();

	if (st->st_uid != 0 && st->st_uid != me) {
		snprintf(why, len, "owned by uid %u, neither root nor this user (uid %u)",
			 (unsigned)st->st_uid, (unsigned)me);
		return false;
	}
	if (st->st_mode & (S_IWGRP | S_IWOTH)) {
		snprintf(why, len, "writable by %s (mode %04o)",
			 st->st_mode & S_IWOTH ? "every user" : "its group",
			 (unsigned)(st->st_mode & 07777));
		return false;
	}
	if (len)
		why[0] = '\0';
	return true;
}

int ca_code_sha256_fd(int fd, const char *path, uint8_t out[32], sp_err *err)
{
	static const size_t chunk = 64 * 1024;
	Elf64_Ehdr eh;
	sp_sha256 ctx;
	uint8_t *buf;
	int rc = -1;

	if (sp_pread_all(fd, &eh, sizeof eh, 0) < 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64)
		return sp_fail(err, "%s: not a 64-bit ELF file", path);
	/* No program headers (an object file): no code is loaded, the hash is
	 * that of nothing. */
	if (eh.e_phnum != 0 && (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum >= PN_XNUM))
		return sp_fail(err, "%s: unusable program headers (%u of %u bytes)", path,
			       (unsigned)eh.e_phnum, (unsigned)eh.e_phentsize);
	buf = malloc(chunk);
	if (!buf)
		return sp_fail(err, "%s: out of memory", path);
	sp_sha256_init(&ctx);
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;

		if (sp_pread_all(fd, &ph, sizeof ph, eh.e_phoff + (uint64_t)i * sizeof ph) < 0) {
			sp_fail(err, "%s: program header %u is cut off", path, i);
			goto out;
		}
		if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X))
			continue;
		for (uint64_t done = 0; done < ph.p_filesz;) {
			size_t n = ph.p_filesz - done < chunk ? (size_t)(ph.p_filesz - done) : chunk;

			if (sp_pread_all(fd, buf, n, ph.p_offset + done) < 0) {
				sp_fail(err, "%s: executable segment %u is cut off", path, i);
				goto out;
			}
			sp_sha256_update(&ctx, buf, n);
			done += n;
		}
	}
	sp_sha256_final(&ctx, out);
	rc = 0;
out:
	free(buf);
	return rc;
}

void ca_file_id(const struct stat *st, uint64_t id[CA_FILE_ID_N])
{
	id[0] = (uint64_t)st->st_dev;
	id[1] = (uint64_t)st->st_ino;
	id[2] = (uint64_t)st->st_size;
	id[3] = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
	id[4] = (uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec;
}

/*
 * Guard 2, for the sptrace command before each run or attach.  Hashing the
 * code of every module at every start costs (libc: 1.4 MB, some 4 ms, and
 * run hashes again after the program to find what it dlopen'd), so a file
 * with the identity the entry recorded -- the same inode, size, mtime and
 * ctime -- is taken as the file analysed, unchanged: any write changes its
 * ctime, and nobody but the kernel (and root, through the clock) sets that.
 * Any other file, among them one built to carry the same build-id, is
 * hashed.
 */
int ca_module_code_matches(const ca_module *m, const char *path, sp_err *err)
{
	uint64_t id[CA_FILE_ID_N];
	int rc = ca_code_matches_id(m, path, id, err);

	return rc == 2 ? 1 : rc;
}

int ca_code_matches_id(const ca_module *m, const char *path, uint64_t id[CA_FILE_ID_N],
		       sp_err *err)
{
	static const uint64_t unknown[CA_FILE_ID_N];
	uint8_t h[32];
	struct stat st;
	int fd = sp_open_regular(path, 0), rc;

	if (fd < 0)
		return sp_fail(err, "%s: %s", path, sp_open_why(errno));
	if (fstat(fd, &st) < 0) {
		rc = sp_fail(err, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	ca_file_id(&st, id);
	if (memcmp(m->file_id, unknown, sizeof m->file_id) != 0 &&
	    memcmp(m->file_id, id, sizeof m->file_id) == 0) {
		close(fd);
		return 1;
	}
	rc = ca_code_sha256_fd(fd, path, h, err);
	close(fd);
	if (rc < 0)
		return -1;
	return memcmp(h, m->code_sha256, sizeof h) == 0 ? 2 : 0;
}

void ca_site_spans(const ca_site *s, uint64_t addr[2], unsigned len[2])
{
	addr[0] = s->addr;
	len[0] = s->len;
	if (s->method == CA_PATCH_RELOCATE && s->patch_addr < s->addr &&
	    s->addr - s->patch_addr < 256) {
		addr[0] = s->patch_addr;
		len[0] = (unsigned)(s->addr - s->patch_addr) + s->len;
	}
	addr[1] = s->patch_addr;
	len[1] = s->method == CA_PATCH_SPRINGBOARD ? 5 : 0;
}

uint64_t ca_code_hash(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* n bytes at link-time address addr, as the loader maps them: from the
 * file bytes of the PT_LOAD segment holding them all.  (Not by section: a
 * springboard may sit in padding between two sections.) */
static bool segment_read(const ca_elf *e, uint64_t addr, void *buf, size_t n)
{
	size_t nph = 0;

	if (elf_getphdrnum(e->elf, &nph) != 0)
		return false;
	for (size_t i = 0; i < nph; i++) {
		GElf_Phdr ph;
		uint64_t off;

		if (!gelf_getphdr(e->elf, (int)i, &ph) || ph.p_type != PT_LOAD ||
		    addr < ph.p_vaddr)
			continue;
		off = addr - ph.p_vaddr;
		if (off > ph.p_filesz || n > ph.p_filesz - off || ph.p_offset > e->map_size ||
		    off > e->map_size - ph.p_offset || n > e->map_size - ph.p_offset - off)
			continue;
		memcpy(buf, e->map + ph.p_offset + off, n);
		return true;
	}
	return false;
}

void ca_sites_hash(ca_module *m, const ca_elf *e)
{
	uint8_t bytes[256 + 16];

	for (size_t i = 0; i < m->nsites; i++) {
		ca_site *s = &m->sites[i];
		uint64_t addr[2], h = CA_CODE_HASH_SEED;
		unsigned len[2];

		ca_site_spans(s, addr, len);
		for (int k = 0; k < 2; k++) {
			if (!len[k])
				continue;
			/* Bytes the file does not hold: a hash no code gives. */
			if (len[k] > sizeof bytes || !segment_read(e, addr[k], bytes, len[k])) {
				h = 0;
				break;
			}
			h = ca_code_hash(h, bytes, len[k]);
		}
		s->code = h;
	}
}
