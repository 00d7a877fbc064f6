/*
 * trace_dir.c — what `sptrace run` and `sptrace attach` share: finding the
 * agent, making (or clearing away) a trace directory, and checking the
 * options that go to the agent.
 *
 * A trace is its owner's alone (directories 0700, files 0600), or shared
 * with one group (--group: 2750 and 0640).  Making and removing one never
 * follows a link and never acts on what another user could have put in its
 * place (see the comments above remove_trace_at and open_parent).
 */
#include "cli.h"
#include "trace_format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The agent sits next to the sptrace binary in a build tree, else in the
 * installed libdir; $SPTRACE_AGENT overrides both. */
int cli_find_agent(const char *cmd, char *out, size_t len)
{
	char self[PATH_MAX], *slash;
	const char *env = getenv("SPTRACE_AGENT");
	ssize_t n;
	static const char *const rel[] = { "/../agent/libsptrace-agent.so",
					   "/../lib/sptrace/libsptrace-agent.so",
					   "/../lib/x86_64-linux-gnu/sptrace/libsptrace-agent.so" };

	if (env && *env) {
		if (access(env, R_OK) == 0) {
			snprintf(out, len, "%s", env);
			return 0;
		}
		return cli_error("%s: SPTRACE_AGENT=%s: %s", cmd, env, strerror(errno));
	}
	n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return cli_error("%s: cannot find my own executable: %s", cmd, strerror(errno));
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
		char cand[PATH_MAX + 64], real[PATH_MAX];

		snprintf(cand, sizeof cand, "%s%s", self, rel[i]);
		if (realpath(cand, real) && access(real, R_OK) == 0) {
			snprintf(out, len, "%s", real);
			return 0;
		}
	}
	return cli_error("%s: cannot find libsptrace-agent.so next to %s; set SPTRACE_AGENT to "
			 "its path", cmd, self);
}

/*
 * Removing a trace.  A new trace moves the previous one (DIR) to DIR.old,
 * which drops the DIR.old before it.  That directory may sit where other
 * users write (a sticky /tmp) and what it holds may have been planted: a
 * link named exec.1 towards a root-only directory once made root's
 * `sptrace run` delete the files there.  So a removal
 *   1. goes by descriptors: each directory is opened relative to its parent
 *      with O_NOFOLLOW|O_DIRECTORY and checked (fstat) to be the entry just
 *      looked at; entries go with unlinkat, which never follows a link;
 *   2. removes only what a trace holds, each of its own type: ring.*,
 *      seg.*, packed.*, sites, meta and agent.log (files), control (a FIFO), exec.*
 *      and spawn.* (the directories of exec'd and spawned images);
 *   3. keeps to one file system and one owner, the top directory's, which
 *      must be the caller or the user the trace was made for;
 *   4. looks at everything before it deletes anything: a link, an entry of
 *      another owner or file system, or a name no trace holds leaves the
 *      whole directory as it is, and the command names that entry.
 */
#define TREE_DEPTH_MAX 32

typedef struct tree {
	dev_t dev;
	uid_t uid;                 /* the one owner of everything removed */
	bool remove;               /* false: look only */
	char bad[PATH_MAX + 160];  /* the entry that stops the removal, and why */
} tree;

/* The type a trace's entry of this name has, or 0: none of a trace's. */
static mode_t trace_entry_type(const char *name)
{
	size_t k = strlen(TRACE_SPARE_PREFIX);

	if (strncmp(name, "exec.", 5) == 0 || strncmp(name, "spawn.", 6) == 0)
		return S_IFDIR;
	/* The stock of spares (spare.c) a killed sptrace run left behind. */
	if (strcmp(name, TRACE_SPARE_DIR) == 0 || strcmp(name, TRACE_SPARE_PREFIX "new") == 0)
		return S_IFDIR;
	if (strncmp(name, TRACE_SPARE_PREFIX, k) == 0 && name[k] && name[k + 1] == '.')
		return name[k] == 'f' ? S_IFREG : name[k] == 'd' ? S_IFDIR :
		       name[k] == 'p' ? S_IFIFO : 0;
	if (strcmp(name, "control") == 0)
		return S_IFIFO;
	if (strncmp(name, "ring.", 5) == 0 || strncmp(name, "seg.", 4) == 0 ||
	    strncmp(name, "packed.", 7) == 0 ||
	    strcmp(name, "sites") == 0 || strcmp(name, "channels") == 0 ||
	    strcmp(name, "meta") == 0 || strcmp(name, "agent.log") == 0)
		return S_IFREG;
	return 0;
}

static int tree_bad(tree *t, const char *path, const char *why)
{
	snprintf(t->bad, sizeof t->bad, "%.4000s %.150s", path, why);
	return -1;
}

/* Look at (or remove) what the directory `fd`, shown as `shown`, holds. */
static int tree_walk(tree *t, int fd, const char *shown, int depth)
{
	int dup_fd = dup(fd), rc = 0;
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *de;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return tree_bad(t, shown, "cannot be read");
	}
	rewinddir(d);          /* the dup shares its offset with fd: a second pass */
	while (rc == 0 && (de = readdir(d))) {
		char path[PATH_MAX + 300];
		struct stat st, sub_st;
		mode_t type;
		int sub;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", shown, de->d_name);
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			rc = tree_bad(t, path, "vanished while sptrace looked at it");
			break;
		}
		type = trace_entry_type(de->d_name);
		if (S_ISLNK(st.st_mode))
			rc = tree_bad(t, path, "is a symbolic link, which no trace holds");
		else if (!type || (st.st_mode & S_IFMT) != type)
			rc = tree_bad(t, path, "is not part of a trace");
		else if (st.st_uid != t->uid)
			rc = tree_bad(t, path, "belongs to another user than the trace's owner");
		else if (st.st_dev != t->dev)
			rc = tree_bad(t, path, "is on another file system");
		if (rc)
			break;
		if (type != S_IFDIR) {
			if (t->remove && unlinkat(fd, de->d_name, 0) != 0)
				rc = tree_bad(t, path, "cannot be removed");
			continue;
		}
		if (depth >= TREE_DEPTH_MAX) {
			rc = tree_bad(t, path, "is nested deeper than any trace");
			break;
		}
		sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0 || fstat(sub, &sub_st) != 0 || sub_st.st_dev != st.st_dev ||
		    sub_st.st_ino != st.st_ino)
			rc = tree_bad(t, path, "changed while sptrace looked at it");
		else
			rc = tree_walk(t, sub, path, depth + 1);
		if (sub >= 0)
			close(sub);
		if (rc == 0 && t->remove && unlinkat(fd, de->d_name, AT_REMOVEDIR) != 0)
			rc = tree_bad(t, path, "cannot be removed");
	}
	closedir(d);
	return rc;
}

/*
 * Remove the trace `name` in the directory `parent` (shown as `shown`) if
 * it belongs to `owner` or to the caller; else -1 and why in `why`.
 */
static int remove_trace_at(int parent, const char *name, const char *shown, uid_t owner,
			   char *why, size_t len)
{
	struct stat top, parent_st;
	tree t = { .remove = false };
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int rc = -1;

	if (fd < 0) {
		struct stat lst;

		if (fstatat(parent, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
			snprintf(why, len, "%s is a symbolic link, not a trace", shown);
		else
			snprintf(why, len, "%s: %s", shown, strerror(errno));
		return -1;
	}
	if (fstat(fd, &top) != 0 || fstat(parent, &parent_st) != 0) {
		snprintf(why, len, "%s: %s", shown, strerror(errno));
	} else if (top.st_uid != owner && top.st_uid != geteuid()) {
		snprintf(why, len, "%s belongs to another user (uid %u)", shown, (unsigned)top.st_uid);
	} else if (top.st_dev != parent_st.st_dev) {
		snprintf(why, len, "%s is another file system's (a mount point)", shown);
	} else {
		t.dev = top.st_dev;
		t.uid = top.st_uid;
		rc = tree_walk(&t, fd, shown, 0);       /* look first ... */
		if (rc == 0) {
			t.remove = true;                 /* ... then remove */
			rc = tree_walk(&t, fd, shown, 0);
		}
		if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR) != 0) {
			snprintf(t.bad, sizeof t.bad, "%s cannot be removed: %s", shown,
				 strerror(errno));
			rc = -1;
		}
		if (rc)
			snprintf(why, len, "%s", t.bad);
	}
	close(fd);
	return rc;
}

int cli_remove_trace_dir(const char *dir, uid_t owner)
{
	char parent[PATH_MAX], why[PATH_MAX + 200];
	const char *name = strrchr(dir, '/');
	int pfd, rc;

	if (!name || name == dir || !name[1])
		return -1;
	snprintf(parent, sizeof parent, "%.*s", (int)(name - dir), dir);
	pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0)
		return -1;
	rc = remove_trace_at(pfd, name + 1, dir, owner, why, sizeof why);
	close(pfd);
	return rc;
}

/*
 * Where a trace is made.  Root's traces hold what root's processes did, and
 * root's `sptrace run` and its agent write into them by path: a directory
 * on the way that another user could rename or replace would let that user
 * point root's writes anywhere.  So, for root, every directory from / down
 * to the trace's parent must be root's (or, for a trace made for another
 * user, that user's: nothing there is root's to lose), and not writable by
 * others unless sticky (then they cannot move root's entries).  The walk opens each level
 * with O_NOFOLLOW along the parent's real path, and the descriptor it ends
 * with is the one every later step goes through.
 */
static int level_unsafe(const char *cmd, int fd, const char *shown, uid_t owner)
{
	struct stat st;

	if (fstat(fd, &st) != 0)
		return cli_error("%s: %s: %s", cmd, shown, strerror(errno));
	if (geteuid() != 0 ||
	    ((st.st_uid == 0 || st.st_uid == owner) &&
	     (!(st.st_mode & 022) || (st.st_mode & S_ISVTX))))
		return 0;
	return cli_error("%s: %s can be changed by %s (uid %u): as root, sptrace makes traces "
			 "only where no other user could move them; choose another directory "
			 "with -o", cmd, shown, st.st_uid != 0 ? "its owner" : "other users",
			 (unsigned)st.st_uid);
}

static int open_parent(const char *cmd, const char *parent, uid_t owner, char *real,
		       size_t len)
{
	char buf[PATH_MAX];
	int fd;

	if (!realpath(parent, buf))
		return cli_error("%s: cannot make the trace directory in %s: %s", cmd, parent,
				 strerror(errno)), -1;
	snprintf(real, len, "%s", buf);
	fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0 && level_unsafe(cmd, fd, "/", owner)) {
		close(fd);
		return -1;
	}
	for (char *p = buf + 1; fd >= 0 && *p;) {
		char *slash = strchr(p, '/');
		int next;

		if (slash)
			*slash = '\0';               /* buf: the path down to this level */
		next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(fd);
		fd = next;
		if (fd >= 0 && level_unsafe(cmd, fd, buf, owner)) {
			close(fd);
			return -1;
		}
		if (!slash)
			break;
		*slash = '/';
		p = slash + 1;
	}
	if (fd < 0)
		return cli_error("%s: %s changed while sptrace looked at it", cmd, real), -1;
	return fd;
}

int cli_trace_group(const char *cmd, const char *arg, gid_t *gid)
{
	struct group *gr = getgrnam(arg);
	char *end;
	unsigned long n;

	if (gr) {
		*gid = gr->gr_gid;
		return 0;
	}
	n = strtoul(arg, &end, 10);
	if (*arg && !*end && n < (gid_t)-1) {
		*gid = (gid_t)n;
		return 0;
	}
	return cli_error("%s: --group '%s': no such group (give a group name or a gid)", cmd,
			 arg), 2;
}

/* Undo a trace directory just made (fd open on it, `name` in `pfd`). */
static int unmake(int pfd, int fd, const char *name)
{
	unlinkat(pfd, name, AT_REMOVEDIR);
	close(fd);
	close(pfd);
	return 1;
}

/*
 * Make the trace directory: DIR (an existing one moved to DIR.old, the
 * DIR.old before it removed as above), all through the parent's descriptor.
 * The new directory is created 0700, opened with O_NOFOLLOW and checked to
 * be the one just made, then given to its owner and its mode through that
 * descriptor (umask plays no part): 0700, or 2750 for a --group -- the
 * set-group-ID bit hands the group down to every file and directory made
 * in it, which the agent and the drain then make 0640 (0600 otherwise).
 */
int cli_prepare_trace_dir(const char *cmd, const char *dir, const cli_trace_owner *o,
			  char *abs)
{
	char parent[PATH_MAX], real[PATH_MAX], name[NAME_MAX + 1], old[NAME_MAX + 8];
	char why[PATH_MAX + 200], shown_old[PATH_MAX + 8];
	const char *slash;
	size_t len = strlen(dir), name_len;
	struct stat st, made;
	int pfd, fd;

	while (len > 1 && dir[len - 1] == '/')
		len--;
	slash = memrchr(dir, '/', len);
	name_len = slash ? len - (size_t)(slash + 1 - dir) : len;
	if (name_len == 0 || name_len > NAME_MAX)
		return cli_error("%s: -o %s: give the name of a new directory", cmd, dir);
	snprintf(name, sizeof name, "%.*s", (int)name_len, slash ? slash + 1 : dir);
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return cli_error("%s: -o %s: give the name of a new directory", cmd, dir);
	if (slash)
		snprintf(parent, sizeof parent, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
	else
		snprintf(parent, sizeof parent, ".");
	if ((pfd = open_parent(cmd, parent, o->uid, real, sizeof real)) < 0)
		return 1;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (S_ISLNK(st.st_mode)) {
			close(pfd);
			return cli_error("%s: %s is a symbolic link: sptrace neither writes a trace "
					 "through a link nor moves it aside; remove it or choose "
					 "another directory with -o", cmd, dir);
		}
		if (!S_ISDIR(st.st_mode)) {
			close(pfd);
			return cli_error("%s: %s exists and is not a directory; choose another with -o",
					 cmd, dir);
		}
		if (st.st_uid != geteuid() && st.st_uid != o->uid) {
			close(pfd);
			return cli_error("%s: %s belongs to another user (uid %u): sptrace does not "
					 "move it aside; choose another directory with -o", cmd, dir,
					 (unsigned)st.st_uid);
		}
		snprintf(old, sizeof old, "%s.old", name);
		snprintf(shown_old, sizeof shown_old, "%.*s.old", (int)len, dir);
		if (fstatat(pfd, old, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    remove_trace_at(pfd, old, shown_old, o->uid, why, sizeof why) != 0) {
			close(pfd);
			return cli_error("%s: the previous trace cannot make room for this one: %s; "
					 "sptrace left it as it was: remove it yourself or choose "
					 "another directory with -o", cmd, why);
		}
		if (renameat2(pfd, name, pfd, old, RENAME_NOREPLACE) != 0 &&
		    (errno != EINVAL || renameat(pfd, name, pfd, old) != 0)) {
			close(pfd);
			return cli_error("%s: cannot keep the previous trace as %s: %s", cmd, shown_old,
					 strerror(errno));
		}
	}
	if (mkdirat(pfd, name, 0700) != 0) {
		close(pfd);
		return cli_error("%s: cannot create the trace directory %s: %s", cmd, dir,
				 strerror(errno));
	}
	fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &made) != 0 || made.st_uid != geteuid()) {
		/* Replaced between mkdirat and openat: not ours to remove. */
		if (fd >= 0)
			close(fd);
		close(pfd);
		return cli_error("%s: %s changed while sptrace made it; choose another directory "
				 "with -o", cmd, dir);
	}
	if (strlen(real) > 3800) {
		unmake(pfd, fd, name);
		return cli_error("%s: the path of %s is too long (%zu bytes)", cmd, dir, strlen(real));
	}
	snprintf(abs, PATH_MAX, "%.3800s%s%.255s", real, strcmp(real, "/") == 0 ? "" : "/", name);
	if ((o->uid != geteuid() || o->group != (gid_t)-1) &&
	    fchown(fd, o->uid, o->group != (gid_t)-1 ? o->group : o->gid) != 0) {
		int e = errno;

		unmake(pfd, fd, name);
		if (o->group != (gid_t)-1 && e == EPERM) {
			struct group *gr = getgrgid(o->group);

			return cli_error("%s: --group %s (gid %u): you are not a member of that "
					 "group", cmd, gr ? gr->gr_name : "?", (unsigned)o->group);
		}
		return cli_error("%s: cannot give %s to uid %u: %s", cmd, abs, (unsigned)o->uid,
				 strerror(e));
	}
	/* The absolute path the agent gets must lead to this directory. */
	if (fchmod(fd, o->group != (gid_t)-1 ? 02750 : 0700) != 0 || stat(abs, &st) != 0 ||
	    st.st_dev != made.st_dev || st.st_ino != made.st_ino) {
		unmake(pfd, fd, name);
		return cli_error("%s: %s changed while sptrace made it; choose another directory "
				 "with -o", cmd, abs);
	}
	close(fd);
	close(pfd);
	return 0;
}

/* A file of the trace in `dir` (by the agent's rule: 0600, or 0640 when the
 * directory shares the trace with its group and the file has that group). */
int cli_trace_file(const char *dir, const char *name, int flags)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd;
	struct stat ds, fs;

	if (dfd < 0)
		return -1;
	fd = openat(dfd, name, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0 && fstat(dfd, &ds) == 0 && fstat(fd, &fs) == 0 && S_ISREG(fs.st_mode) &&
	    fchmod(fd, (ds.st_mode & S_ISGID) && (ds.st_mode & S_IRGRP) && fs.st_gid == ds.st_gid
		       ? 0640 : 0600) != 0) {
		close(fd);
		fd = -1;
	}
	close(dfd);
	return fd;
}

int cli_ring_size(const char *cmd, const char *arg, char *ring, size_t len)
{
	char *end;
	unsigned long mb = strtoul(arg, &end, 10);

	if (*end || mb == 0 || mb > 65536)
		return cli_error("%s: --ring-size wants megabytes (1..65536), not '%s'", cmd, arg), 2;
	snprintf(ring, len, "%lu", mb << 20);
	return 0;
}

int cli_budget(const char *cmd, const char *arg, char *budget, size_t len)
{
	char *end;
	unsigned long pct = strtoul(arg, &end, 10);

	if (*end || end == arg || arg[0] == '-' || pct > 1000)
		return cli_error("%s: --budget wants a percentage of the program's time (0..1000; "
				 "0: every call timed), not '%s'", cmd, arg), 2;
	snprintf(budget, len, "%lu", pct);
	return 0;
}

int cli_check_threads(const char *cmd, const char *arg)
{
	if (strcmp(arg, "event") != 0 && strcmp(arg, "all") != 0)
		return cli_error("%s: --threads '%s': use 'event' or 'all'", cmd, arg), 2;
	return 0;
}

int cli_add_join(const char *cmd, const char **room, size_t *n, const char *arg)
{
	unsigned long len;
	unsigned argno;

	if (trace_join_parse(arg, &len, &argno) < 0 || !len || strlen(arg) > 255 ||
	    strchr(arg, '\n'))
		return cli_error("%s: --join '%s': give FUNC:entry:argN (N 1..6), FUNC:exit:ret "
				 "or FUNC:scope", cmd, arg), 2;
	if (*n == CLI_JOIN_MAX)
		return cli_error("%s: --join '%s': at most %d directives", cmd, arg,
				 CLI_JOIN_MAX), 2;
	room[(*n)++] = arg;
	return 0;
}

int cli_check_event(const char *cmd, const char *on, const char *first)
{
	if (strncmp(on, "timer ", 6) == 0) {
		char *end;
		double s = strtod(on + 6, &end);

		if (end == on + 6 || *end || !(s >= 0) || s > 1e9)
			return cli_error("%s: --on '%s': give the delay in seconds, e.g. 'timer 2.5'",
					 cmd, on), 2;
	} else if (strncmp(on, "call ", 5) == 0) {
		if (!on[5 + strspn(on + 5, " \t")])
			return cli_error("%s: --on '%s': give a function name (or 0xADDR), e.g. "
					 "'call main'", cmd, on), 2;
	} else if (strcmp(on, first) != 0 &&
		   strcmp(on, "signal") != 0 && strcmp(on, "accept") != 0 && strcmp(on, "recv") != 0) {
		return cli_error("%s: unknown event '%s'; this version knows '%s', 'call FUNC', "
				 "'timer SECONDS', 'signal', 'accept' and 'recv'", cmd, on, first), 2;
	}
	return 0;
}
