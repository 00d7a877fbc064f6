/*
 * frame.c — the one reader and writer of the spdaemon protocol
 * (proto/spd.proto): length-prefixed frames over a connection, plain (the
 * local UNIX socket) or TLS (other hosts).
 *
 * The reader trusts nothing: the length is checked against SPD_FRAME_MAX
 * before a byte of the payload is read, the payload must parse, and the
 * body must be one this version knows.  Every failure is a message naming
 * the peer and what was wrong with its frame.
 */
#include "spd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "ossl.h"       /* OpenSSL, loaded at the first call */

/* Read exactly n bytes: 1, 0 at end of stream before the first byte, -1. */
static int read_exact(spd_conn *c, void *buf, size_t n, sp_err *err)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r;

		if (c->ssl) {
			size_t k = 0;

			r = SSL_read_ex(c->ssl, (char *)buf + got, n - got, &k) == 1 ? (ssize_t)k : -1;
			if (r < 0 && SSL_get_error(c->ssl, 0) == SSL_ERROR_ZERO_RETURN)
				r = 0;
		} else {
			r = read(c->fd, (char *)buf + got, n - got);
			if (r < 0 && errno == EINTR)
				continue;
		}
		if (r == 0 && got == 0)
			return 0;
		if (r <= 0)
			return sp_fail(err, "%s: %s", c->peer,
				       r == 0 ? "the connection ended inside a frame"
				       : errno == EAGAIN ? "no data within the time limit"
				       : "the connection broke");
		got += (size_t)r;
	}
	return 1;
}

static int write_exact(spd_conn *c, const void *buf, size_t n, sp_err *err)
{
	if (c->ssl) {
		size_t k = 0;

		if (SSL_write_ex(c->ssl, buf, n, &k) != 1 || k != n)
			return sp_fail(err, "%s: cannot send: the TLS connection broke", c->peer);
		return 0;
	}
	if (sp_write_all(c->fd, buf, n) != 0)
		return sp_fail(err, "%s: cannot send: %s", c->peer, strerror(errno));
	return 0;
}

Sptrace__Spd__Frame *spd_frame_decode(const uint8_t *buf, size_t len, const char *peer,
				      sp_err *err)
{
	Sptrace__Spd__Frame *f;

	if (len > SPD_FRAME_MAX) {
		sp_fail(err, "%s: a frame of %zu bytes (at most %u)", peer, len, SPD_FRAME_MAX);
		return NULL;
	}
	f = sptrace__spd__frame__unpack(NULL, len, buf);
	if (!f) {
		sp_fail(err, "%s: a frame of %zu bytes that is not a protocol message", peer, len);
		return NULL;
	}
	if (f->body_case == SPTRACE__SPD__FRAME__BODY__NOT_SET) {
		sp_fail(err, "%s: a frame (version %u) with no request or reply this daemon "
			"knows%s", peer, f->version,
			f->version > SPD_PROTOCOL_VERSION ? "; the peer is newer: update this host"
			: "");
		sptrace__spd__frame__free_unpacked(f, NULL);
		return NULL;
	}
	return f;
}

int spd_frame_read(spd_conn *c, Sptrace__Spd__Frame **out, sp_err *err)
{
	uint8_t head[4], *buf;
	uint32_t len;
	int r;

	*out = NULL;
	if ((r = read_exact(c, head, sizeof head, err)) <= 0)
		return r;
	len = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
	if (len > SPD_FRAME_MAX)
		return sp_fail(err, "%s: announces a frame of %u bytes (at most %u)", c->peer, len,
			       SPD_FRAME_MAX);
	if (!(buf = malloc(len ? len : 1)))
		return sp_fail(err, "%s: out of memory for a frame of %u bytes", c->peer, len);
	if (len && (r = read_exact(c, buf, len, err)) != 1) {
		if (r == 0)
			sp_fail(err, "%s: the connection ended inside a frame", c->peer);
		free(buf);
		return -1;
	}
	*out = spd_frame_decode(buf, len, c->peer, err);
	free(buf);
	return *out ? 1 : -1;
}

/* The frame's first bytes carry `fd` (SCM_RIGHTS): a local connection's
 * only, never a remote one's (no TLS, no other host). */
static int write_with_fd(spd_conn *c, const uint8_t *buf, size_t n, int fd, sp_err *err)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec io = { .iov_base = (void *)buf, .iov_len = n };
	struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b,
			    .msg_controllen = sizeof u.b };
	struct cmsghdr *cm;
	ssize_t r;

	memset(&u, 0, sizeof u);
	cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof fd);
	do
		r = sendmsg(c->fd, &m, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r <= 0)
		return sp_fail(err, "%s: cannot send: %s", c->peer, r < 0 ? strerror(errno) : "");
	return write_exact(c, buf + r, n - (size_t)r, err);
}

int spd_frame_write(spd_conn *c, Sptrace__Spd__Frame *f, sp_err *err)
{
	return spd_frame_write_fd(c, f, -1, err);
}

int spd_frame_write_fd(spd_conn *c, Sptrace__Spd__Frame *f, int fd, sp_err *err)
{
	size_t len;
	uint8_t *buf;
	int rc;

	if (fd >= 0 && (c->ssl || c->remote))
		return sp_fail(err, "%s: a descriptor goes to a local peer only", c->peer);

	f->version = SPD_PROTOCOL_VERSION;
	len = sptrace__spd__frame__get_packed_size(f);
	if (len > SPD_FRAME_MAX)
		return sp_fail(err, "%s: a frame of %zu bytes is too long to send", c->peer, len);
	if (!(buf = malloc(len + 4)))
		return sp_fail(err, "out of memory for a frame of %zu bytes", len);
	buf[0] = (uint8_t)(len >> 24);
	buf[1] = (uint8_t)(len >> 16);
	buf[2] = (uint8_t)(len >> 8);
	buf[3] = (uint8_t)len;
	sptrace__spd__frame__pack(f, buf + 4);
	rc = fd >= 0 ? write_with_fd(c, buf, len + 4, fd, err) : write_exact(c, buf, len + 4, err);
	free(buf);
	return rc;
}

int spd_send_error(spd_conn *c, uint64_t id, const char *message)
{
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__Error e = SPTRACE__SPD__ERROR__INIT;
	sp_err ignored;

	e.message = (char *)message;
	f.id = id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_ERROR;
	f.error = &e;
	return spd_frame_write(c, &f, &ignored);
}

/*
 * A CollectChunk's path is written below the requester's OUT/HOST by
 * `sptrace collect`, and the daemon that sent it may be hostile: only
 * components of 1..NAME_MAX-5 bytes (room for ".part"), none "." or "..",
 * none ending in ".part" (the collector's own), no control characters, no
 * leading or trailing '/'.
 */
int spd_chunk_path_ok(const char *p)
{
	size_t n = p ? strlen(p) : 0;

	if (n == 0 || n >= SPD_CHUNK_PATH_MAX || p[0] == '/' || p[n - 1] == '/')
		return 0;
	for (const char *c = p; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			return 0;
	for (const char *c = p; *c;) {
		size_t k = strcspn(c, "/");

		if (k == 0 || k > 255 - 5 || (k == 1 && c[0] == '.') ||
		    (k == 2 && c[0] == '.' && c[1] == '.') ||
		    (k >= 5 && memcmp(c + k - 5, ".part", 5) == 0))
			return 0;
		c += k;
		c += *c == '/';
	}
	return 1;
}
