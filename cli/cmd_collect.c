/*
 * cmd_collect.c — `sptrace collect -o OUT DIR`: every host's traces of the
 * session DIR's trace belongs to, under one root (spdaemon/collect.c serves
 * them, proto/spd.proto's CollectRequest says how):
 *
 *   OUT/HOST/PID/...      what HOST's daemon keeps of the session
 *   OUT/HOST/PID/...      DIR itself, under this host's name and its pid
 *   OUT/.hosts            which daemon answered as which HOST (for resuming)
 *
 * How it goes:
 *
 *   1. The session is DIR/meta's "session" line: the agent writes it when
 *      the trace takes part in a session a spdaemon follows.
 *   2. OUT is made 0700 (the caller's), or reused if it is a directory of
 *      the caller's and no link: a second run resumes the first.
 *   3. Hosts are asked breadth-first: this host's daemon (the only one this
 *      command can reach: it speaks to other hosts' daemons for us, over
 *      their mutual TLS), then each host it names as a peer of the session,
 *      then their peers, each host once.  Each answer is a stream of file
 *      chunks, written as NAME.part and renamed to NAME once its size and
 *      SHA-256 are those the daemon sent; a mismatch is an error naming the
 *      file and the host, and the .part is removed.
 *   4. Resuming: before a host is asked, the files already complete under
 *      OUT/HOST are listed with their SHA-256 in the request; the daemon
 *      answers "unchanged" for those that still match, without their
 *      bytes.  A .part left by an interrupted run is removed then: it is
 *      fetched again from its start (a torn or corrupt .part is never
 *      trusted, and a complete file is never a .part).
 *   5. DIR is copied the same way into OUT/<this host>/<its pid>.
 *   6. A line per host on stderr (processes, files, bytes) or why it did
 *      not answer; a summary on stdout.  Exit status 1 if any host failed,
 *      with everything else kept.
 */
#include "cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "analysis.h"
#include "spd.h"
#include "trace_format.h"

#define COLLECT_MAX_HOSTS 256
#define COLLECT_DEPTH 20         /* directories below a host's (PID, exec'd images) */
#define COLLECT_HAVE_BYTES (SPD_FRAME_MAX / 2)  /* the Have list in a request, at most */

static const char help[] =
	"usage: sptrace collect -o OUT DIR\n"
	"\n"
	"Gather the traces of the session DIR's trace belongs to from every host it\n"
	"reached: DIR was traced with a spdaemon on this host (its meta names the\n"
	"session), and traced messages had the daemons of other hosts put the agent\n"
	"into their receivers.  This host's daemon is asked, then each host it\n"
	"followed the session to (it relays over mutual TLS), then their peers, each\n"
	"host once.  You get the traces of your own processes (root: all).\n"
	"\n"
	"  OUT/HOST/PID/...   each host's traces, HOST as its daemon names itself;\n"
	"                     DIR itself is OUT/<this host>/<its pid>\n"
	"\n"
	"Run it again to resume: files already complete (same SHA-256) are not\n"
	"fetched again.  Every file is checked against the daemon's SHA-256.  A\n"
	"host that does not answer is said, the others are collected, and the exit\n"
	"status is 1.  Then 'sptrace replay OUT' shows every process of every host.\n"
	"\n"
	"options:\n"
	"  -o, --output OUT   where to put them (made 0700; an existing one is resumed)\n"
	"  -h, --help         this text\n";

/* The hosts of the walk (step 3). */
typedef struct host {
	char asked[256];         /* "": this host's daemon; else the address or name asked */
	char name[256];          /* the daemon's name, once it answered */
	int failed;
} host;

typedef struct collect {
	const char *out;
	int outfd;
	host hosts[COLLECT_MAX_HOSTS];
	size_t nhosts;
	char (*map)[2][256];     /* OUT/.hosts: asked, name */
	size_t nmap, capmap;
	uint64_t bytes, files;
	unsigned processes, failed;
} collect;

/* The file a stream is writing. */
typedef struct sink {
	collect *co;
	host *h;
	int hostfd;              /* OUT/HOST, once the first chunk named HOST */
	char path[PATH_MAX];     /* relative to OUT/HOST; "" none */
	int dfd, fd;             /* its directory, its .part */
	char name[NAME_MAX + 1];
	uint64_t got;
	sp_sha256 sha;
	uint64_t files, unchanged, bytes;
	unsigned bad;            /* files whose size or SHA-256 did not match */
} sink;

/* ---- paths under OUT ------------------------------------------------------ */

/* Directory `name` in dfd, made 0700 if missing, a directory of ours and
 * no link: its descriptor, or -1 (errno). */
static int subdir(int dfd, const char *name)
{
	struct stat st;
	int fd;

	if (mkdirat(dfd, name, 0700) != 0 && errno != EEXIST)
		return -1;
	if ((fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return -1;
	if (fstat(fd, &st) != 0 || st.st_uid != geteuid()) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

/* The directory holding `rel` (made on the way) and its last component. */
static int parent_of(int root, const char *rel, char *last, size_t len)
{
	char buf[PATH_MAX], *p = buf, *slash;
	int fd = dup(root);

	snprintf(buf, sizeof buf, "%s", rel);
	while (fd >= 0 && (slash = strchr(p, '/'))) {
		int sub;

		*slash = '\0';
		sub = subdir(fd, p);
		close(fd);
		fd = sub;
		p = slash + 1;
	}
	if (strlen(p) >= len) {
		if (fd >= 0)
			close(fd);
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(last, p, strlen(p) + 1);
	return fd;
}

/* SHA-256 and size of the regular file fd; 0, or -1. */
static int hash_fd(int fd, uint8_t sum[32], uint64_t *size)
{
	static uint8_t buf[1 << 16];
	sp_sha256 s;
	ssize_t n;
	off_t off = 0;

	sp_sha256_init(&s);
	while ((n = pread(fd, buf, sizeof buf, off)) > 0) {
		sp_sha256_update(&s, buf, (size_t)n);
		off += n;
	}
	sp_sha256_final(&s, sum);
	*size = (uint64_t)off;
	return n < 0 ? -1 : 0;
}

/* ---- step 4: what OUT/HOST holds already -------------------------------- */

typedef struct haves {
	Sptrace__Spd__CollectRequest__Have **v;
	size_t n, cap, bytes;
} haves;

static void haves_free(haves *hv)
{
	for (size_t i = 0; i < hv->n; i++) {
		free(hv->v[i]->path);
		free(hv->v[i]->sha256.data);
		free(hv->v[i]);
	}
	free(hv->v);
}

/* Every complete file under dfd (`rel` its path) into hv; .part files go. */
static void list_haves(int dfd, const char *rel, int depth, haves *hv)
{
	DIR *dir;
	struct dirent *e;
	int fd = dup(dfd);

	if (fd < 0 || !(dir = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(dir))) {
		char path[PATH_MAX];
		size_t k = strlen(e->d_name);
		struct stat st;
		int sub;

		if (e->d_name[0] == '.' ||
		    fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    (size_t)snprintf(path, sizeof path, "%s%s%s", rel, *rel ? "/" : "",
				     e->d_name) >= sizeof path)
			continue;
		if (S_ISREG(st.st_mode) && k > 5 && strcmp(e->d_name + k - 5, ".part") == 0) {
			unlinkat(dfd, e->d_name, 0);
		} else if (S_ISREG(st.st_mode) && hv->bytes < COLLECT_HAVE_BYTES) {
			Sptrace__Spd__CollectRequest__Have *h = calloc(1, sizeof *h);
			uint8_t *sum = malloc(32);
			int f = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

			if (!h || !sum || f < 0 || sp_grow((void **)&hv->v, &hv->cap, hv->n + 1,
							   sizeof *hv->v) != 0) {
				free(h);
				free(sum);
				if (f >= 0)
					close(f);
				continue;
			}
			sptrace__spd__collect_request__have__init(h);
			if (hash_fd(f, sum, &h->size) != 0 || !(h->path = strdup(path))) {
				free(sum);
				free(h);
			} else {
				h->sha256.data = sum;
				h->sha256.len = 32;
				hv->v[hv->n++] = h;
				hv->bytes += strlen(path) + 48;
			}
			close(f);
		} else if (S_ISDIR(st.st_mode) && depth < COLLECT_DEPTH &&
			   (sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					 O_CLOEXEC)) >= 0) {
			list_haves(sub, path, depth + 1, hv);
			close(sub);
		}
	}
	closedir(dir);
}

/* ---- step 3: one chunk into OUT/HOST ------------------------------------ */

static void sink_drop(sink *s)
{
	if (s->fd >= 0) {
		close(s->fd);
		char part[NAME_MAX + 8];

		snprintf(part, sizeof part, "%s.part", s->name);
		unlinkat(s->dfd, part, 0);
	}
	if (s->dfd >= 0)
		close(s->dfd);
	s->fd = s->dfd = -1;
	s->path[0] = '\0';
}

/* The host of the stream, from its first chunk: OUT/HOST opened. */
static int sink_host(sink *s, const char *name, sp_err *err)
{
	if (s->hostfd >= 0)
		return strcmp(name, s->h->name) == 0 ? 0 :
		       sp_fail(err, "the daemon changed its name from %s to %.100s within one answer",
			       s->h->name, name);
	if (spd_host_name_kind(name, err) < 0 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return sp_fail(err, "the daemon names itself '%.100s', which cannot name a directory",
			       name);
	snprintf(s->h->name, sizeof s->h->name, "%s", name);
	if ((s->hostfd = subdir(s->co->outfd, name)) < 0)
		return sp_fail(err, "%s/%s: %s", s->co->out, name, strerror(errno));
	return 0;
}

/* 0, or -1 and why: a fault of the stream (the host fails) or of OUT. */
static int sink_chunk(sink *s, const Sptrace__Spd__CollectChunk *ch, sp_err *err)
{
	char part[NAME_MAX + 8];
	uint8_t sum[32];

	if (!ch->path || !spd_chunk_path_ok(ch->path))
		return sp_fail(err, "a file named '%.200s', which is not a path under its session "
			       "directory", ch->path ? ch->path : "");
	if (ch->unchanged) {
		s->files++;
		s->unchanged++;
		return 0;
	}
	if (!s->path[0]) {
		if (ch->offset != 0)
			return sp_fail(err, "%s: the first chunk starts at byte %llu", ch->path,
				       (unsigned long long)ch->offset);
		snprintf(s->path, sizeof s->path, "%s", ch->path);
		if ((s->dfd = parent_of(s->hostfd, ch->path, s->name, sizeof s->name)) < 0)
			return sp_fail(err, "%s/%s/%s: cannot make its directory: %s", s->co->out,
				       s->h->name, ch->path, strerror(errno));
		snprintf(part, sizeof part, "%s.part", s->name);
		s->fd = openat(s->dfd, part, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			       0600);
		if (s->fd < 0)
			return sp_fail(err, "%s/%s/%s.part: %s", s->co->out, s->h->name, ch->path,
				       strerror(errno));
		s->got = 0;
		sp_sha256_init(&s->sha);
	} else if (strcmp(s->path, ch->path) != 0 || ch->offset != s->got) {
		return sp_fail(err, "%s: a chunk at byte %llu of %.200s, which does not follow",
			       s->path, (unsigned long long)ch->offset, ch->path);
	}
	if (sp_write_all(s->fd, ch->data.data, ch->data.len) != 0)
		return sp_fail(err, "%s/%s/%s.part: %s", s->co->out, s->h->name, s->path,
			       strerror(errno));
	sp_sha256_update(&s->sha, ch->data.data, ch->data.len);
	s->got += ch->data.len;
	s->bytes += ch->data.len;
	if (!ch->eof)
		return 0;
	sp_sha256_final(&s->sha, sum);
	if (ch->size != s->got || ch->sha256.len != 32 || memcmp(sum, ch->sha256.data, 32) != 0) {
		cli_error("collect: host %s: %s: %s (%llu bytes received, %llu announced); the file "
			  "is not kept, collect again", s->h->name, s->path,
			  ch->size != s->got ? "the size does not match"
			  : "the SHA-256 does not match: the file was damaged on the way",
			  (unsigned long long)s->got, (unsigned long long)ch->size);
		s->bad++;
		sink_drop(s);
		return 0;
	}
	snprintf(part, sizeof part, "%s.part", s->name);
	if (fsync(s->fd) != 0 || renameat(s->dfd, part, s->dfd, s->name) != 0)
		return sp_fail(err, "%s/%s/%s: %s", s->co->out, s->h->name, s->path,
			       strerror(errno));
	close(s->fd);
	close(s->dfd);
	s->fd = s->dfd = -1;
	s->path[0] = '\0';
	s->files++;
	return 0;
}

/* ---- step 3: one host --------------------------------------------------- */

static const char *map_name(const collect *co, const char *asked)
{
	for (size_t i = 0; i < co->nmap; i++)
		if (strcmp(co->map[i][0], asked[0] ? asked : "-") == 0)
			return co->map[i][1];
	return asked[0] ? asked : NULL;
}

static void map_set(collect *co, const char *asked, const char *name)
{
	const char *key = asked[0] ? asked : "-";
	size_t i;

	for (i = 0; i < co->nmap && strcmp(co->map[i][0], key) != 0; i++)
		;
	if (i == co->nmap) {
		if (sp_grow((void **)&co->map, &co->capmap, co->nmap + 1, sizeof *co->map) != 0)
			return;
		co->nmap++;
	}
	snprintf(co->map[i][0], sizeof co->map[i][0], "%s", key);
	snprintf(co->map[i][1], sizeof co->map[i][1], "%s", name);
}

static int known(const collect *co, const char *s)
{
	for (size_t i = 0; i < co->nhosts; i++)
		if (strcmp(co->hosts[i].asked, s) == 0 || strcmp(co->hosts[i].name, s) == 0)
			return 1;
	return 0;
}

/* Ask for host h's traces of `session`; its peers join the walk.  0, or 1
 * after the line saying why it failed. */
static int collect_host(collect *co, host *h, const char *session)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__CollectRequest q = SPTRACE__SPD__COLLECT_REQUEST__INIT;
	sink s = { .co = co, .h = h, .hostfd = -1, .dfd = -1, .fd = -1 };
	const char *guess = map_name(co, h->asked);
	char who[300];
	haves hv = { 0 };
	spd_conn c;
	sp_err err;
	int r, done = 0, hfd;

	if (h->asked[0])
		snprintf(who, sizeof who, "host %s", h->asked);
	else
		snprintf(who, sizeof who, "this host's spdaemon");
	if (guess && spd_host_name_kind(guess, &err) >= 0 &&
	    (hfd = openat(co->outfd, guess, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0) {
		list_haves(hfd, "", 0, &hv);
		close(hfd);
	}
	q.session = (char *)session;
	q.host = h->asked;
	q.have = hv.v;
	q.n_have = hv.n;
	req.id = 1;
	req.body_case = SPTRACE__SPD__FRAME__BODY_COLLECT;
	req.collect = &q;
	/* Longer than a relaying daemon waits for its far daemon: its error
	 * arrives, rather than our time limit. */
	if (spd_local_connect(&c, &err) == 0)
		setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO,
			   &(struct timeval){ .tv_sec = SPD_COLLECT_WAIT + 60 },
			   sizeof(struct timeval));
	if (c.fd < 0 || spd_frame_write(&c, &req, &err) != 0) {
		haves_free(&hv);
		if (c.fd >= 0)
			spd_conn_close(&c);
		h->failed = 1;
		return cli_error("collect: %s did not answer: %s", who, err.msg);
	}
	haves_free(&hv);
	while (!done && (r = spd_frame_read(&c, &rep, &err)) == 1) {
		const Sptrace__Spd__CollectChunk *ch = rep->collect_chunk;

		if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
			sp_fail(&err, "%s", rep->error->message);
			break;
		}
		if (rep->body_case != SPTRACE__SPD__FRAME__BODY_COLLECT_CHUNK) {
			sp_fail(&err, "an answer that is not traces (body %d)", (int)rep->body_case);
			break;
		}
		if (sink_host(&s, ch->host ? ch->host : "", &err) != 0)
			break;
		if (ch->last) {
			if (s.path[0]) {
				sp_fail(&err, "the answer ended inside %s", s.path);
				break;
			}
			for (size_t i = 0; i < ch->n_peers; i++)
				if (co->nhosts < COLLECT_MAX_HOSTS && !known(co, ch->peers[i]) &&
				    spd_host_name_kind(ch->peers[i], &err) >= 0)
					snprintf(co->hosts[co->nhosts++].asked, sizeof h->asked, "%s",
						 ch->peers[i]);
			co->processes += ch->processes;
			fprintf(stderr, "collect: host %s: %u process%s, %llu file%s (%llu unchanged), "
				"%llu bytes%s%.0u%s\n", h->name, ch->processes,
				ch->processes == 1 ? "" : "es", (unsigned long long)s.files,
				s.files == 1 ? "" : "s", (unsigned long long)s.unchanged,
				(unsigned long long)s.bytes, ch->withheld ? "; " : "", ch->withheld,
				ch->withheld ? " of other users not given" : "");
			done = 1;
		} else if (sink_chunk(&s, ch, &err) != 0) {
			break;
		}
		if (!done && !s.path[0])
			cli_progress(h->name[0] ? h->name : who, (size_t)s.files, (size_t)s.files + 1);
		spd_frame_free(rep);
		rep = NULL;
	}
	cli_progress_end();
	spd_frame_free(rep);
	spd_conn_close(&c);
	sink_drop(&s);
	if (s.hostfd >= 0)
		close(s.hostfd);
	co->bytes += s.bytes;
	co->files += s.files;
	if (h->name[0])
		map_set(co, h->asked, h->name);
	if (!done) {
		if (r == 0)
			sp_fail(&err, "the daemon closed the connection before the end");
		h->failed = 1;
		if (h->name[0])
			return cli_error("collect: host %s: its answer broke off (the files that "
					 "arrived whole are kept; collect again): %s", h->name,
					 err.msg);
		return cli_error("collect: %s did not answer: %s", who, err.msg);
	}
	if (s.bad) {
		h->failed = 1;
		return cli_error("collect: host %s: %u files did not arrive whole (said above)",
				 h->name, s.bad);
	}
	return 0;
}

/* ---- step 5: DIR itself ------------------------------------------------- */

/* Copy the regular file `name` of sdfd into ddfd unless a copy with the
 * same bytes is there. */
static int copy_file(collect *co, int sdfd, int ddfd, const char *name, const char *shown)
{
	static uint8_t buf[1 << 16];
	char part[NAME_MAX + 8];
	uint8_t a[32], b[32];
	uint64_t as, bs;
	ssize_t n;
	int src = openat(sdfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), dst, rc = 0;
	struct stat st;

	if (src < 0 || fstat(src, &st) != 0 || !S_ISREG(st.st_mode)) {
		if (src >= 0)
			close(src);
		return 0;
	}
	co->files++;
	dst = openat(ddfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (dst >= 0 && hash_fd(dst, b, &bs) == 0 && hash_fd(src, a, &as) == 0 && as == bs &&
	    memcmp(a, b, 32) == 0) {
		close(dst);
		close(src);
		return 0;
	}
	if (dst >= 0)
		close(dst);
	snprintf(part, sizeof part, "%s.part", name);
	dst = openat(ddfd, part, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (dst < 0)
		rc = cli_error("collect: %s.part: %s", shown, strerror(errno));
	for (off_t off = 0; !rc && (n = pread(src, buf, sizeof buf, off)) != 0; off += n)
		if (n < 0 || sp_write_all(dst, buf, (size_t)n) != 0)
			rc = cli_error("collect: %s: %s", shown, strerror(errno));
		else
			co->bytes += (uint64_t)n;
	if (!rc && renameat(ddfd, part, ddfd, name) != 0)
		rc = cli_error("collect: %s: %s", shown, strerror(errno));
	if (rc && dst >= 0)
		unlinkat(ddfd, part, 0);
	if (dst >= 0)
		close(dst);
	close(src);
	return rc;
}

static int copy_dir(collect *co, int sdfd, int ddfd, const char *shown, int depth)
{
	DIR *dir;
	struct dirent *e;
	int rc = 0, fd = dup(sdfd);

	if (fd < 0 || !(dir = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return cli_error("collect: %s: %s", shown, strerror(errno));
	}
	while (!rc && (e = readdir(dir))) {
		char path[PATH_MAX];
		struct stat st;
		size_t k = strlen(e->d_name);

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
		    (k > 5 && strcmp(e->d_name + k - 5, ".part") == 0) ||
		    fstatat(sdfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", shown, e->d_name);
		if (S_ISREG(st.st_mode)) {
			rc = copy_file(co, sdfd, ddfd, e->d_name, path);
		} else if (S_ISDIR(st.st_mode) && depth < COLLECT_DEPTH) {
			int s = openat(sdfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int d = s >= 0 ? subdir(ddfd, e->d_name) : -1;

			if (s >= 0 && d < 0)
				rc = cli_error("collect: %s: %s", path, strerror(errno));
			else if (s >= 0)
				rc = copy_dir(co, s, d, path, depth + 1);
			if (s >= 0)
				close(s);
			if (d >= 0)
				close(d);
		}
	}
	closedir(dir);
	return rc;
}

/* DIR into OUT/HOST/PID (PID from its meta, else DIR's last name). */
static int copy_start(collect *co, const char *dir, const char *hostname)
{
	char pid[64] = "", base[PATH_MAX], shown[PATH_MAX + 300];
	int s, h, d = -1, rc;
	uint64_t before = co->bytes, files = co->files;

	if (!cli_meta_get(dir, TRACE_META_PID, pid, sizeof pid) || !pid[0] ||
	    strspn(pid, "0123456789") != strlen(pid)) {
		snprintf(base, sizeof base, "%s", dir);
		while (strlen(base) > 1 && base[strlen(base) - 1] == '/')
			base[strlen(base) - 1] = '\0';
		snprintf(pid, sizeof pid, "%.63s", strrchr(base, '/') ? strrchr(base, '/') + 1 : base);
	}
	if (!spd_chunk_path_ok(pid) || strchr(pid, '/'))
		snprintf(pid, sizeof pid, "start");
	snprintf(shown, sizeof shown, "%s/%s/%s", co->out, hostname, pid);
	if ((s = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return cli_error("collect: %s: %s", dir, strerror(errno));
	if ((h = subdir(co->outfd, hostname)) < 0 || (d = subdir(h, pid)) < 0) {
		rc = cli_error("collect: %s: %s", shown, strerror(errno));
	} else {
		rc = copy_dir(co, s, d, dir, 0);
		if (!rc)
			fprintf(stderr, "collect: %s: copied into %s (%llu file%s, %llu bytes)\n", dir,
				shown, (unsigned long long)(co->files - files),
				co->files - files == 1 ? "" : "s",
				(unsigned long long)(co->bytes - before));
	}
	close(s);
	if (h >= 0)
		close(h);
	if (d >= 0)
		close(d);
	return rc;
}

/* ---- OUT ---------------------------------------------------------------- */

static int open_out(collect *co)
{
	struct stat st;

	if (mkdir(co->out, 0700) != 0 && errno != EEXIST)
		return cli_error("collect: cannot create %s: %s", co->out, strerror(errno));
	co->outfd = open(co->out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (co->outfd < 0)
		return cli_error("collect: %s: %s", co->out, errno == ELOOP || errno == ENOTDIR ?
				 "not a directory (a link is not followed)" : strerror(errno));
	if (!sp_fd_private(co->outfd, &st))
		return cli_error("collect: %s belongs to uid %u with mode %03o: give a new "
				 "directory, or one of yours that no one else may write",
				 co->out, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
	fchmod(co->outfd, 0700);
	return 0;
}

static void read_map(collect *co)
{
	char line[600], a[256], n[256];
	int fd = openat(co->outfd, ".hosts", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while (co->nmap < COLLECT_MAX_HOSTS && fgets(line, sizeof line, f))
		if (sscanf(line, "%255s %255s", a, n) == 2)
			map_set(co, strcmp(a, "-") == 0 ? "" : a, n);
	fclose(f);
}

static void write_map(collect *co)
{
	int fd = openat(co->outfd, ".hosts.part", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW |
			O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return;
	}
	for (size_t i = 0; i < co->nmap; i++)
		fprintf(f, "%s %s\n", co->map[i][0], co->map[i][1]);
	if (fclose(f) == 0)
		renameat(co->outfd, ".hosts.part", co->outfd, ".hosts");
}

int cmd_collect(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "output", required_argument, 0, 'o' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	collect *co;
	char session[128], hostname[256];
	const char *out = NULL, *dir;
	unsigned whole = 0;
	int opt, rc = 0;

	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":ho:", lo, NULL)) != -1) {
		switch (opt) {
		case 'o': out = optarg; break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			return cli_error("collect: option '%s' needs a value; see 'sptrace collect "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("collect: unknown option '%s'; see 'sptrace collect --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (!out || optind != argc - 1)
		return cli_error("collect: %s; see 'sptrace collect --help'",
				 !out ? "give -o OUT, where the traces go"
				 : optind >= argc ? "give DIR, the trace where the flow started"
				 : "give one trace directory"), 2;
	dir = argv[optind];
	/* Step 1. */
	an_meta *meta;
	sp_err merr;

	if (an_meta_read(dir, &meta, &merr) < 0)
		return cli_error("collect: %s: no trace there (%s)", dir, merr.msg);
	an_meta_free(meta);
	if (!cli_meta_get(dir, TRACE_META_SESSION, session, sizeof session) || !session[0])
		return cli_error("collect: %s was not traced with a spdaemon on this host: nothing "
				 "to collect", dir);
	if (!(co = calloc(1, sizeof *co)))
		return cli_error("collect: out of memory");
	co->out = out;
	co->outfd = -1;
	/* Step 2. */
	if (open_out(co) != 0) {
		rc = 1;
		goto out;
	}
	read_map(co);
	/* Step 3: this host's daemon first, then breadth-first over peers. */
	co->nhosts = 1;
	for (size_t i = 0; i < co->nhosts; i++)
		if (collect_host(co, &co->hosts[i], session) != 0)
			co->failed++;
		else
			whole++;
	/* Step 5. */
	if (co->hosts[0].name[0])
		snprintf(hostname, sizeof hostname, "%s", co->hosts[0].name);
	else if (gethostname(hostname, sizeof hostname) != 0 ||
		 spd_host_name_kind(hostname, &(sp_err){ 0 }) < 0)
		snprintf(hostname, sizeof hostname, "localhost");
	if (copy_start(co, dir, hostname) != 0)
		rc = 1;
	else
		co->processes++;
	write_map(co);
	printf("collected session %s into %s: %u of %zu host%s whole%s, %u process%s, "
	       "%llu file%s, %llu bytes fetched\n", session, out, whole, co->nhosts,
	       co->nhosts == 1 ? "" : "s", co->failed ? " (the others failed: said above)" : "",
	       co->processes, co->processes == 1 ? "" : "es", (unsigned long long)co->files,
	       co->files == 1 ? "" : "s", (unsigned long long)co->bytes);
	rc |= co->failed ? 1 : 0;
out:
	if (co->outfd >= 0)
		close(co->outfd);
	free(co->map);
	free(co);
	return rc;
}
