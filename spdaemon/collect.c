/*
 * collect.c — the collect and stop requests: a session's traces on this
 * host, sent to `sptrace collect`; and stop, told to every agent of a
 * session.
 *
 * Collect, for a requester on `c`:
 *
 *   1. The request is checked: the session name (session.c) and, when it
 *      names another host, that it is a host name or address.
 *   2. Who the traces are for.  A local requester is who SO_PEERCRED says:
 *      it gets the PID directories owned by its uid (root: all).  A daemon
 *      of another host (a certificate of the cluster CA, so a daemon we
 *      trust as we trust it with inject requests) relays for one of its
 *      local users and says which uid (for_user, uid): it gets the
 *      directories of that uid (0: all).  Uids are assumed to be the same
 *      users on every host of the cluster, as for NFS; a cluster where they
 *      are not must not share a CA.  A remote request that names no user
 *      gets nothing.  The directories of other users are counted
 *      (`withheld`), not named.
 *   3. With a host: a local requester's request goes to that host's daemon
 *      over mutual TLS (the certificate must name that host), with its uid,
 *      and that daemon's stream comes back as it is, under the requester's
 *      id.  A daemon of another host may not have this daemon relay:
 *      refused, as for inject.
 *   4. Without: every regular file under STATE/sessions/SESSION/PID of the
 *      directories given, walked through descriptors.  Nothing is followed:
 *      every open is O_NOFOLLOW (a link is skipped), anything but a regular
 *      file or a directory is skipped (a FIFO would block the daemon, a
 *      device never end), and a file or directory that is not of the PID
 *      directory's owner is skipped (a user can plant a hard link to a file
 *      of someone else's in its own directory; the kernel's protected
 *      hardlinks may be off), and so is a file of more than 16 GiB (a
 *      sparse trap; rings are far smaller).  A file is read up to the size
 *      fstat gave when it was opened: an agent still writing cannot keep
 *      the daemon reading for ever, and the SHA-256 covers exactly the
 *      bytes sent.
 *   5. A file the requester listed (Have) with the same size and SHA-256 is
 *      answered `unchanged`, without its bytes: a second collect moves only
 *      what changed.
 *   6. Every chunk names this daemon (the requester learns where the files
 *      go from the first), the last one the session's peers (the hosts it
 *      asked to follow the session, session.c) and counts; each collect is
 *      one line in spdaemon.log.
 *
 * Stop: the same walk and the same policy, and in each PID directory given
 * the agent's control FIFO gets "stop\n" -- only if it is a FIFO (opened
 * O_PATH|O_NOFOLLOW, checked by fstat) of the directory's owner, reopened
 * through /proc/self/fd for writing without blocking, as `sptrace stop`
 * does (cli/cmd_control.c).  A local requester's stop goes on, relayed,
 * to every peer, then to the peers they name, each host once; a relayed
 * one goes no further itself.
 */
#include "spd_daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#define SPD_COLLECT_DEPTH 16     /* directories below a PID directory (exec'd images) */
#define SPD_COLLECT_FILE_MAX (16ull << 30)  /* bytes of one file: a ring is far smaller, a
					     * sparse file of a terabyte is a user's trap */

struct ssl_ctx_st *spd_tls_client(spd_daemon *d, sp_err *err)
{
	struct ssl_ctx_st *ctx;

	pthread_mutex_lock(&d->lock);
	if (!d->tls_client)
		d->tls_client = spd_tls_context(d->keys, d->name, 0, err);
	ctx = d->tls_client;
	pthread_mutex_unlock(&d->lock);
	return ctx;
}

/* Step 2: whose traces the requester gets. */
typedef struct requester {
	int all;                 /* root: every user's */
	uid_t uid;
} requester;

static int who(const spd_conn *c, int for_user, uint32_t uid, requester *r, sp_err *err)
{
	if (!c->remote) {
		r->uid = c->uid;
	} else if (!for_user) {
		return sp_fail(err, "a request from another host must name the user it is for");
	} else {
		r->uid = (uid_t)uid;
	}
	r->all = r->uid == 0;
	return 0;
}

/* One walk of a session's directories for collect (or stop). */
typedef struct walk {
	spd_conn *c;
	uint64_t id;
	char *host;                              /* this daemon's name, on every chunk */
	const Sptrace__Spd__CollectRequest *q;   /* NULL: stop */
	uint8_t *buf;                            /* SPD_COLLECT_CHUNK */
	uint64_t files, bytes, unchanged, skipped;
	uint32_t processes, withheld, stopped, nostop;
	sp_err *err;
} walk;

static int send_chunk(walk *w, Sptrace__Spd__CollectChunk *ch)
{
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;

	ch->host = w->host;
	f.id = w->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_COLLECT_CHUNK;
	f.collect_chunk = ch;
	return spd_frame_write(w->c, &f, w->err);
}

static const Sptrace__Spd__CollectRequest__Have *have(const walk *w, const char *path)
{
	for (size_t i = 0; i < w->q->n_have; i++)
		if (w->q->have[i]->path && strcmp(w->q->have[i]->path, path) == 0)
			return w->q->have[i];
	return NULL;
}

/* Step 5: whether the requester's copy is this file's first `size` bytes. */
static int same(walk *w, int fd, uint64_t size, const Sptrace__Spd__CollectRequest__Have *h,
		uint8_t sum[32])
{
	sp_sha256 s;
	uint64_t off = 0;

	if (!h || h->size != size || h->sha256.len != 32)
		return 0;
	sp_sha256_init(&s);
	while (off < size) {
		size_t want = size - off < SPD_COLLECT_CHUNK ? (size_t)(size - off) : SPD_COLLECT_CHUNK;
		ssize_t n = pread(fd, w->buf, want, (off_t)off);

		if (n <= 0)
			return 0;
		sp_sha256_update(&s, w->buf, (size_t)n);
		off += (uint64_t)n;
	}
	sp_sha256_final(&s, sum);
	return memcmp(sum, h->sha256.data, 32) == 0;
}

/* Step 4: one regular file, `rel` its path in the session directory. */
static int send_file(walk *w, int dfd, const char *name, const char *rel, uid_t owner)
{
	Sptrace__Spd__CollectChunk ch = SPTRACE__SPD__COLLECT_CHUNK__INIT;
	struct stat st;
	uint8_t sum[32];
	sp_sha256 s;
	uint64_t off = 0, size;
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner ||
	    (uint64_t)st.st_size > SPD_COLLECT_FILE_MAX) {
		if (fd >= 0)
			close(fd);
		w->skipped++;
		return 0;
	}
	size = (uint64_t)st.st_size;
	ch.path = (char *)rel;
	ch.mode = st.st_mode & 0777;
	ch.size = size;
	w->files++;
	if (same(w, fd, size, have(w, rel), sum)) {
		ch.unchanged = ch.eof = 1;
		ch.sha256.data = sum;
		ch.sha256.len = 32;
		w->unchanged++;
		close(fd);
		return send_chunk(w, &ch);
	}
	sp_sha256_init(&s);
	for (;;) {
		size_t want = size - off < SPD_COLLECT_CHUNK ? (size_t)(size - off) : SPD_COLLECT_CHUNK;
		ssize_t n = want ? pread(fd, w->buf, want, (off_t)off) : 0;

		if (n < 0) {
			sp_fail(w->err, "%s: %s", rel, strerror(errno));
			close(fd);
			return -1;
		}
		sp_sha256_update(&s, w->buf, (size_t)n);
		ch.offset = off;
		ch.data.data = w->buf;
		ch.data.len = (size_t)n;
		off += (uint64_t)n;
		/* A file cut shorter meanwhile ends where it ends now. */
		ch.eof = (size_t)n < want || off == size;
		if (ch.eof) {
			sp_sha256_final(&s, sum);
			ch.sha256.data = sum;
			ch.sha256.len = 32;
			ch.size = off;
		}
		if (send_chunk(w, &ch) != 0) {
			close(fd);
			return -1;
		}
		w->bytes += (uint64_t)n;
		if (ch.eof)
			break;
	}
	close(fd);
	return 0;
}

/* Step 4: a directory of `owner`'s, `rel` its path (no trailing '/'). */
static int send_dir(walk *w, int dfd, const char *rel, uid_t owner, int depth)
{
	DIR *dir;
	struct dirent *e;
	int rc = 0, fd = dup(dfd);

	if (fd < 0 || !(dir = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	while (rc == 0 && (e = readdir(dir))) {
		char path[4096];
		struct stat st;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
		    fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		/* A name the collector would refuse (spd_chunk_path_ok) is not sent:
		 * a user's own file "x.part" must not fail root's collect. */
		if ((size_t)snprintf(path, sizeof path, "%s/%s", rel, e->d_name) >= sizeof path ||
		    !spd_chunk_path_ok(path)) {
			w->skipped++;
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			rc = send_file(w, dfd, e->d_name, path, owner);
		} else if (S_ISDIR(st.st_mode) && depth < SPD_COLLECT_DEPTH) {
			int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub >= 0 && fstat(sub, &st) == 0 && st.st_uid == owner)
				rc = send_dir(w, sub, path, owner, depth + 1);
			else
				w->skipped++;
			if (sub >= 0)
				close(sub);
		} else {
			w->skipped++;
		}
	}
	closedir(dir);
	return rc;
}

/* Stop: "stop\n" into PID/control when it is the agent's FIFO. */
static void stop_dir(walk *w, int pfd, uid_t owner)
{
	if (spd_agent_tell(pfd, owner, "stop\n") == 0)
		w->stopped++;
	else
		w->nostop++;
}

/* Steps 2 and 4 over the session's PID directories. */
static int walk_session(walk *w, int sfd, const requester *r)
{
	DIR *dir;
	struct dirent *e;
	int rc = 0, fd = dup(sfd);

	if (fd < 0 || !(dir = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return sp_fail(w->err, "cannot read the session's directory: %s", strerror(errno));
	}
	while (rc == 0 && (e = readdir(dir))) {
		struct stat st;
		int pfd;

		if (e->d_name[0] == '.' ||
		    strspn(e->d_name, "0123456789") != strlen(e->d_name) ||
		    (pfd = openat(sfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				  O_CLOEXEC)) < 0)
			continue;
		if (fstat(pfd, &st) != 0 || (!r->all && st.st_uid != r->uid)) {
			w->withheld++;
		} else {
			w->processes++;
			if (w->q)
				rc = send_dir(w, pfd, e->d_name, st.st_uid, 0);
			else
				stop_dir(w, pfd, st.st_uid);
		}
		close(pfd);
	}
	closedir(dir);
	return rc;
}

/* Step 3: the stream of `host`'s daemon, passed on. */
static void relay(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	Sptrace__Spd__CollectRequest *q = req->collect, fq = *q;
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	struct ssl_ctx_st *ctx;
	const char *host = q->host;
	uint64_t chunks = 0, bytes = 0;
	spd_conn far;
	int r = -1;

	if (!(ctx = spd_tls_client(d, err)) ||
	    spd_tls_connect(ctx, host, d->port, 10, &far, err) != 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: collect session %s from %s: %s", c->peer, q->session, host, err->msg);
		return;
	}
	/* The far daemon hashes a file the requester has before it answers
	 * for it (step 5): a big ring takes longer than a handshake may. */
	setsockopt(far.fd, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){ .tv_sec = SPD_COLLECT_WAIT },
		   sizeof(struct timeval));
	fq.host = "";
	fq.for_user = 1;
	fq.uid = (uint32_t)c->uid;
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_COLLECT;
	f.collect = &fq;
	if (spd_frame_write(&far, &f, err) != 0)
		goto fail;
	for (;;) {
		if ((r = spd_frame_read(&far, &rep, err)) != 1) {
			if (r == 0)
				sp_fail(err, "%s closed the connection before the end of the traces",
					far.peer);
			goto fail;
		}
		rep->id = req->id;
		if (rep->body_case != SPTRACE__SPD__FRAME__BODY_COLLECT_CHUNK &&
		    rep->body_case != SPTRACE__SPD__FRAME__BODY_ERROR) {
			sp_fail(err, "%s answered something else than traces (body %d)", far.peer,
				(int)rep->body_case);
			goto fail;
		}
		if (spd_frame_write(c, rep, err) != 0) {
			spd_log("%s: collect session %s from %s: the requester went away: %s",
				c->peer, q->session, host, err->msg);
			spd_frame_free(rep);
			spd_conn_close(&far);
			return;
		}
		if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
			spd_log("%s: collect session %s from %s: it refused: %s", c->peer,
				q->session, host, rep->error->message);
			break;
		}
		chunks++;
		bytes += rep->collect_chunk->data.len;
		if (rep->collect_chunk->last) {
			spd_log("%s: collect session %s: relayed from %s (%s): %llu chunks, %llu "
				"bytes", c->peer, q->session, host, rep->collect_chunk->host,
				(unsigned long long)chunks, (unsigned long long)bytes);
			break;
		}
		spd_frame_free(rep);
		rep = NULL;
	}
	spd_frame_free(rep);
	spd_conn_close(&far);
	return;
fail:
	spd_frame_free(rep);
	spd_conn_close(&far);
	spd_send_error(c, req->id, err->msg);
	spd_log("%s: collect session %s from %s: %s", c->peer, q->session, host, err->msg);
}

void spd_collect(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	Sptrace__Spd__CollectRequest *q = req->collect;
	Sptrace__Spd__CollectChunk end = SPTRACE__SPD__COLLECT_CHUNK__INIT;
	walk w = { .c = c, .id = req->id, .host = d->name, .q = q, .err = err };
	char **peers = NULL;
	size_t npeers = 0;
	requester r;
	int sfd = -1;

	/* Steps 1 to 3. */
	if (spd_session_check(q->session, err) != 0 ||
	    (q->host && *q->host && spd_host_name_kind(q->host, err) < 0) ||
	    (q->host && *q->host && c->remote &&
	     sp_fail(err, "this daemon relays only its own host's users' requests, not another "
		     "host's (ask the daemon of %s yourself)", q->host)) ||
	    who(c, q->for_user, q->uid, &r, err) != 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: collect refused: %s", c->peer, err->msg);
		return;
	}
	if (q->host && *q->host) {
		relay(d, c, req, err);
		return;
	}
	/* Steps 4 to 6; a host that has no trace of the session (an inject
	 * found nothing to put the agent into) has nothing to send. */
	if ((sfd = spd_session_open(d, q->session, 0, err)) == -2)
		goto last;
	if (sfd < 0 || !(w.buf = malloc(SPD_COLLECT_CHUNK))) {
		if (sfd >= 0)
			sp_fail(err, "the daemon is out of memory");
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: collect session %s: %s", c->peer, q->session, err->msg);
		goto out;
	}
	if (walk_session(&w, sfd, &r) != 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: collect session %s: %s", c->peer, q->session, err->msg);
		goto out;
	}
	spd_session_peers(sfd, &peers, &npeers);
last:
	end.last = 1;
	end.host = d->name;
	end.peers = peers;
	end.n_peers = npeers;
	end.processes = w.processes;
	end.withheld = w.withheld;
	end.files = w.files;
	end.bytes = w.bytes;
	if (send_chunk(&w, &end) != 0)
		spd_log("%s: collect session %s: %s", c->peer, q->session, err->msg);
	else
		spd_log("%s: collect session %s for uid %u: %u processes (%u of other users "
			"withheld), %llu files (%llu unchanged, %llu skipped: not regular or not "
			"the owner's), %llu bytes; %zu peers", c->peer, q->session, (unsigned)r.uid,
			w.processes, w.withheld, (unsigned long long)w.files,
			(unsigned long long)w.unchanged, (unsigned long long)w.skipped,
			(unsigned long long)w.bytes, npeers);
out:
	spd_session_peers_free(peers, npeers);
	free(w.buf);
	if (sfd >= 0)
		close(sfd);
}

/* Stop on one peer, relayed: its StopReply's hosts[0] into h, its peers
 * into *peers (the caller frees them). */
static void stop_peer(spd_daemon *d, spd_conn *c, const char *session, const char *host,
		      Sptrace__Spd__StopReply__Host *h, char *why, size_t len,
		      char ***peers, size_t *npeers)
{
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT, *rep = NULL;
	Sptrace__Spd__StopRequest q = SPTRACE__SPD__STOP_REQUEST__INIT;
	struct ssl_ctx_st *ctx;
	spd_conn far;
	sp_err err;
	size_t cap = 0;
	int r;

	why[0] = '\0';
	if (!(ctx = spd_tls_client(d, &err)) ||
	    spd_tls_connect(ctx, host, d->port, 10, &far, &err) != 0) {
		snprintf(why, len, "%s", err.msg);
		return;
	}
	q.session = (char *)session;
	q.relayed = q.for_user = 1;
	q.uid = (uint32_t)c->uid;
	f.id = 1;
	f.body_case = SPTRACE__SPD__FRAME__BODY_STOP;
	f.stop = &q;
	r = spd_frame_write(&far, &f, &err) == 0 ? spd_frame_read(&far, &rep, &err) : -1;
	spd_conn_close(&far);
	if (r != 1) {
		snprintf(why, len, "%s", r == 0 ? "the daemon closed the connection without an "
			 "answer" : err.msg);
	} else if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		snprintf(why, len, "%s", rep->error->message);
	} else if (rep->body_case != SPTRACE__SPD__FRAME__BODY_STOP_REPLY ||
		   rep->stop_reply->n_hosts < 1) {
		snprintf(why, len, "an answer that is not the stop reply");
	} else {
		Sptrace__Spd__StopReply__Host *got = rep->stop_reply->hosts[0];

		h->stopped = got->stopped;
		h->skipped = got->skipped;
		for (size_t i = 0; i < got->n_peers; i++)
			if (sp_grow((void **)peers, &cap, *npeers + 1, sizeof **peers) == 0 &&
			    ((*peers)[*npeers] = strdup(got->peers[i])))
				(*npeers)++;
	}
	spd_frame_free(rep);
}

#define SPD_STOP_HOSTS 256

typedef struct stop_reply {
	Sptrace__Spd__StopReply__Host hosts[SPD_STOP_HOSTS], *hp[SPD_STOP_HOSTS];
	char name[SPD_STOP_HOSTS][256], why[SPD_STOP_HOSTS][1100];
	size_t n;
} stop_reply;

static int stop_seen(const stop_reply *s, const char *host)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->name[i], host) == 0)
			return 1;
	return 0;
}

/* A host into the reply (once); its entry, or NULL. */
static Sptrace__Spd__StopReply__Host *stop_add(stop_reply *s, const char *host)
{
	Sptrace__Spd__StopReply__Host *h;

	if (s->n == SPD_STOP_HOSTS || stop_seen(s, host))
		return NULL;
	h = &s->hosts[s->n];
	sptrace__spd__stop_reply__host__init(h);
	snprintf(s->name[s->n], sizeof s->name[s->n], "%s", host);
	s->why[s->n][0] = '\0';
	h->host = s->name[s->n];
	h->error = s->why[s->n];
	s->hp[s->n] = h;
	s->n++;
	return h;
}

void spd_stop(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	Sptrace__Spd__StopRequest *q = req->stop;
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__StopReply rep = SPTRACE__SPD__STOP_REPLY__INIT;
	Sptrace__Spd__StopReply__Host *self;
	walk w = { .c = c, .id = req->id, .err = err };
	char **peers = NULL;
	size_t npeers = 0;
	stop_reply *s;
	requester r;
	int sfd;

	if (spd_session_check(q->session, err) != 0 ||
	    (c->remote && !q->relayed &&
	     sp_fail(err, "a stop from another host is for this host alone: set relayed")) ||
	    who(c, q->for_user, q->uid, &r, err) != 0) {
		spd_send_error(c, req->id, err->msg);
		spd_log("%s: stop refused: %s", c->peer, err->msg);
		return;
	}
	if (!(s = calloc(1, sizeof *s))) {
		spd_send_error(c, req->id, "the daemon is out of memory");
		return;
	}
	self = stop_add(s, d->name);
	if ((sfd = spd_session_open(d, q->session, 0, err)) >= 0) {
		walk_session(&w, sfd, &r);
		spd_session_peers(sfd, &peers, &npeers);
		close(sfd);
	}
	self->stopped = w.stopped;
	self->skipped = w.nostop + w.withheld;
	self->peers = peers;
	self->n_peers = npeers;
	/* A local requester's stop reaches every host of the session:
	 * breadth-first over the peers' peers, each host once. */
	for (size_t i = 0; !q->relayed && i < s->n; i++) {
		char **more = i ? NULL : peers, **got = NULL;
		size_t nmore = i ? 0 : npeers, ngot = 0;

		if (i) {
			stop_peer(d, c, q->session, s->name[i], &s->hosts[i], s->why[i],
				  sizeof s->why[i], &got, &ngot);
			more = got;
			nmore = ngot;
		}
		for (size_t k = 0; k < nmore; k++)
			stop_add(s, more[k]);
		spd_session_peers_free(got, ngot);
	}
	spd_log("%s: stop session %s for uid %u: %u agents told, %u without a listening agent, "
		"%u of other users; %zu other hosts told", c->peer, q->session, (unsigned)r.uid,
		w.stopped, w.nostop, w.withheld, s->n - 1);
	rep.n_hosts = s->n;
	rep.hosts = s->hp;
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_STOP_REPLY;
	f.stop_reply = &rep;
	spd_frame_write(c, &f, err);
	spd_session_peers_free(peers, npeers);
	free(s);
}
