/*
 * tls.c — connections: mutual TLS 1.3 to and from other hosts' daemons,
 * and the plain local socket of this host's daemon.
 *
 * A host is who its certificate says, and only the cluster CA says it: the
 * server requires a client certificate (SSL_VERIFY_FAIL_IF_NO_PEER_CERT),
 * and the client checks that the server's certificate names the host it
 * dialled (subjectAltName DNS or IP), so a daemon cannot pose as another.
 */
#include "spd_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ossl.h"       /* OpenSSL, loaded at the first call */

static const char *ssl_why(void)
{
	static __thread char buf[256];
	unsigned long e = ERR_get_error();

	if (!e)
		return errno ? strerror(errno) : "the peer closed the connection";
	ERR_error_string_n(e, buf, sizeof buf);
	ERR_clear_error();
	return buf;
}

SSL_CTX *spd_tls_context(const char *keydir, const char *name, int server, sp_err *err)
{
	char crt[300], key[300];
	SSL_CTX *ctx = NULL;
	X509 *ca = NULL, *cert = NULL;
	EVP_PKEY *pkey = NULL;
	int dfd, ok = 0;

	if ((dfd = spd_keys_open_dir(keydir, 0, err)) < 0)
		return NULL;
	snprintf(crt, sizeof crt, "%s.crt", name);
	snprintf(key, sizeof key, "%s.key", name);
	if (!(ca = spd_keys_read(dfd, keydir, "ca.crt", 0, err)) ||
	    !(cert = spd_keys_read(dfd, keydir, crt, 0, err)) ||
	    !(pkey = spd_keys_read(dfd, keydir, key, 1, err)))
		goto out;
	ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    SSL_CTX_use_certificate(ctx, cert) != 1 || SSL_CTX_use_PrivateKey(ctx, pkey) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1 ||
	    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca) != 1) {
		sp_fail(err, "%s/%s with %s and ca.crt: %s", keydir, crt, key, ssl_why());
		goto out;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	/* Connections are not resumed: no session tickets, whose records
	 * after the handshake would hold the first answer back (below). */
	SSL_CTX_set_num_tickets(ctx, 0);
	ok = 1;
out:
	if (!ok) {
		SSL_CTX_free(ctx);
		ctx = NULL;
	}
	X509_free(ca);
	X509_free(cert);
	EVP_PKEY_free(pkey);
	close(dfd);
	return ctx;
}

void spd_tls_context_free(SSL_CTX *ctx)
{
	SSL_CTX_free(ctx);
}

/* A TCP connection to host:port within timeout_s; the fd or -1. */
static int dial(const char *host, int port, double timeout_s, sp_err *err)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	char service[16];
	int fd = -1, rc, e = 0;

	snprintf(service, sizeof service, "%d", port);
	if ((rc = getaddrinfo(host, service, &hints, &res)) != 0)
		return sp_fail(err, "%s: %s", host, gai_strerror(rc));
	for (ai = res; ai && fd < 0; ai = ai->ai_next) {
		struct pollfd p;
		socklen_t len = sizeof e;

		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
			e = errno;
		} else {
			p = (struct pollfd){ .fd = fd, .events = POLLOUT };
			if (poll(&p, 1, (int)(timeout_s * 1000)) != 1)
				e = ETIMEDOUT;
			else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
				e = errno;
		}
		if (e) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		return sp_fail(err, "cannot reach the spdaemon of %s at port %d: %s%s", host, port,
			       strerror(e), e == ECONNREFUSED ? " (is spdaemon running there?)" : "");
	return fd;
}

/* Reads and writes give up after timeout_s: a silent peer never holds a
 * thread for ever. */
static void set_timeouts(int fd, double timeout_s)
{
	struct timeval tv = { .tv_sec = (time_t)timeout_s,
			      .tv_usec = (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6) };
	int flags = fcntl(fd, F_GETFL);

	fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* The subject CN of the peer's (verified) certificate into out. */
static void peer_cn(SSL *ssl, char *out, size_t len)
{
	X509 *cert = SSL_get1_peer_certificate(ssl);

	out[0] = '\0';
	if (cert)
		X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, out,
					  (int)len);
	X509_free(cert);
}

/* A request and its answer are one small frame each, written whole: Nagle's
 * algorithm would hold one back behind the peer's delayed ACK (40 ms a
 * forwarded request, measured). */
static void no_delay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int spd_tls_connect(SSL_CTX *ctx, const char *host, int port, double timeout_s, spd_conn *c,
		    sp_err *err)
{
	unsigned char addr[16];
	int is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
	char cn[128];

	*c = (spd_conn){ .fd = -1, .uid = (uid_t)-1, .pid = -1 };
	snprintf(c->peer, sizeof c->peer, "spdaemon of %s:%d", host, port);
	if ((c->fd = dial(host, port, timeout_s, err)) < 0)
		return -1;
	set_timeouts(c->fd, timeout_s);
	no_delay(c->fd);
	if (!(c->ssl = SSL_new(ctx)) || SSL_set_fd(c->ssl, c->fd) != 1 ||
	    !(is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host)
	      : SSL_set1_host(c->ssl, host)) ||
	    (!is_ip && SSL_set_tlsext_host_name(c->ssl, host) != 1)) {
		sp_fail(err, "%s: %s", c->peer, ssl_why());
		spd_conn_close(c);
		return -1;
	}
	if (SSL_connect(c->ssl) != 1) {
		long v = SSL_get_verify_result(c->ssl);
		int e = errno;

		if (v == X509_V_OK && (e == EAGAIN || e == EWOULDBLOCK))
			sp_fail(err, "%s: no TLS handshake within %.1f s (something there accepts "
				"connections but does not answer)", c->peer, timeout_s);
		else
			sp_fail(err, "%s: TLS handshake failed: %s", c->peer,
				v != X509_V_OK ? X509_verify_cert_error_string(v) : ssl_why());
		spd_conn_close(c);
		return -1;
	}
	peer_cn(c->ssl, cn, sizeof cn);
	snprintf(c->peer, sizeof c->peer, "spdaemon %s at %s:%d", cn, host, port);
	return 0;
}

int spd_tls_accept(SSL_CTX *ctx, spd_conn *c, sp_err *err)
{
	char cn[128], addr[sizeof c->peer];

	set_timeouts(c->fd, 10);
	no_delay(c->fd);
	if (!(c->ssl = SSL_new(ctx)) || SSL_set_fd(c->ssl, c->fd) != 1 ||
	    SSL_accept(c->ssl) != 1) {
		long v = c->ssl ? SSL_get_verify_result(c->ssl) : X509_V_OK;

		return sp_fail(err, "%s: TLS handshake refused: %s", c->peer,
			       v != X509_V_OK ? X509_verify_cert_error_string(v) : ssl_why());
	}
	peer_cn(c->ssl, cn, sizeof cn);
	snprintf(addr, sizeof addr, "%s", c->peer);
	snprintf(c->peer, sizeof c->peer, "host %.50s (%.100s)", cn, addr);   /* fits in 160 */
	set_timeouts(c->fd, 60);
	return 0;
}

void spd_conn_timeout(spd_conn *c, double seconds)
{
	set_timeouts(c->fd, seconds);
}

int spd_local_connect(spd_conn *c, sp_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				    strlen(SPD_SOCKET));

	*c = (spd_conn){ .fd = -1, .uid = (uid_t)-1, .pid = -1 };
	snprintf(c->peer, sizeof c->peer, "the spdaemon of this host");
	memcpy(sa.sun_path + 1, SPD_SOCKET, strlen(SPD_SOCKET));
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, len) != 0) {
		int e = errno;

		spd_conn_close(c);
		return sp_fail(err, "no spdaemon serves this host (network namespace): %s%s",
			       strerror(e), e == ECONNREFUSED ? "; start one with 'spdaemon --keys "
			       "KEYDIR --name NAME --state-dir DIR'" : "");
	}
	set_timeouts(c->fd, 60);
	return 0;
}

void spd_conn_close(spd_conn *c)
{
	if (c->ssl) {
		SSL_shutdown(c->ssl);
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}
