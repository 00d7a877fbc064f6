/*
 * spd.h — the spdaemon library: what the daemon (spdaemon/main.c) and the
 * `sptrace` commands that talk to daemons (keys, collect) share.
 *
 * Sections name the files that define what they declare.
 */
#ifndef SPD_H
#define SPD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sp.h"
#include "spd.pb-c.h"

struct ssl_st;
struct ssl_ctx_st;

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

/*
 * holders.c — the processes of this host that hold the receiving end of a
 * channel (the ones tracing must follow a message into).
 */
typedef struct spd_endpoint {
	int family;                  /* AF_INET, AF_INET6 */
	uint8_t addr[16];            /* network byte order; 4 bytes for AF_INET */
	uint16_t port;               /* host byte order */
} spd_endpoint;

typedef enum spd_channel_kind {
	SPD_CH_TCP, SPD_CH_UDP, SPD_CH_UNIX, SPD_CH_PIPE, SPD_CH_UNIX_DGRAM,
} spd_channel_kind;

/* One direction of a channel: src sends, dst receives (TCP, UDP); pipes
 * and UNIX sockets are named by the receiving end's inode. */
typedef struct spd_channel {
	spd_channel_kind kind;
	spd_endpoint src, dst;
	uint64_t inode;
	char path[108];              /* UNIX, not accepted yet: the listener's (proto) */
	uint64_t src_inode;          /* UNIX: the sender's socket */
} spd_channel;

/* The socket (or pipe) inodes on this host that receive what `ch` carries
 * (the rules are in holders.c); *n may be 0: nothing receives it here.
 * *listener (may be NULL): they are a TCP listener's, the connection is
 * not accepted yet. */
int spd_channel_inodes(const spd_channel *ch, uint64_t *inodes, size_t max, size_t *n,
		       bool *listener, sp_err *err);
/* The processes holding a descriptor of one of the inodes (fifos: named
 * pipes' too, one stat per descriptor naming a path). */
int spd_holders(const uint64_t *inodes, size_t n, bool fifos, pid_t *pids, size_t max,
		size_t *npids, sp_err *err);
/* Does pid hold a descriptor of socket or pipe `inode` (fifos: a named
 * pipe's too), and, for SPD_END_READ or SPD_END_WRITE, one open for reading
 * only, or for writing (a pipe's read or write end)? */
enum spd_end { SPD_END_ANY, SPD_END_READ, SPD_END_WRITE };
bool spd_pid_holds(pid_t pid, uint64_t inode, bool fifos, enum spd_end end);
/* The inode of the peer of this namespace's UNIX socket `inode` (sock_diag,
 * UDIAG_SHOW_PEER); 0: none, or not accepted yet (no inode), or no answer. */
uint64_t spd_unix_peer(uint64_t inode);

/*
 * frame.c — the protocol's frames (proto/spd.proto says how they look).
 * A connection is a socket, with TLS when it leads to another host.
 */
#define SPD_PROTOCOL_VERSION 1
#define SPD_FRAME_MAX (1u << 20)     /* bytes of one frame, the length excluded */
#define SPD_PORT 7470                /* where daemons listen for other hosts */
#define SPD_SOCKET "sptrace-spdaemon" /* the abstract UNIX socket, one per network namespace */
#define SPD_COLLECT_CHUNK (256u << 10) /* data bytes of one CollectChunk: a frame stays far
					* below SPD_FRAME_MAX */
#define SPD_COLLECT_WAIT 240           /* seconds a relay waits for the next chunk; a
					* collector waits longer (the relay's answer) */

typedef struct spd_conn {
	int fd;
	struct ssl_st *ssl;          /* NULL: the local socket, no TLS */
	char peer[160];              /* for messages and the log: who is at the other end */
	uid_t uid;                   /* a local peer's credentials (SO_PEERCRED) */
	pid_t pid;                   /*   (-1: a remote peer) */
	int remote;                  /* a daemon's connection from another host */
} spd_conn;

/* The next frame: 1 and *out (free with spd_frame_free), 0 at the end of
 * the stream, -1 with a message naming the peer and the fault. */
int spd_frame_read(spd_conn *c, Sptrace__Spd__Frame **out, sp_err *err);
/* Send `f` (its version is set here). */
int spd_frame_write(spd_conn *c, Sptrace__Spd__Frame *f, sp_err *err);
/* The same, `fd` (>= 0) passed with it (SCM_RIGHTS): a local peer only. */
int spd_frame_write_fd(spd_conn *c, Sptrace__Spd__Frame *f, int fd, sp_err *err);
/* A frame from its bytes (no length prefix): the check every frame read
 * passes (size, parse, a known body).  NULL with a message. */
Sptrace__Spd__Frame *spd_frame_decode(const uint8_t *buf, size_t len, const char *peer,
				      sp_err *err);
#define spd_frame_free(f) sptrace__spd__frame__free_unpacked((f), NULL)
/* Whether a CollectChunk's path may name a file below the collector's
 * directory (relative, no "..", no ".part": see frame.c): 1 or 0. */
#define SPD_CHUNK_PATH_MAX 4000
int spd_chunk_path_ok(const char *path);
/* An Error frame answering request `id`; 0 if it was sent. */
int spd_send_error(spd_conn *c, uint64_t id, const char *message);

/*
 * tls.c — mutual TLS 1.3 between hosts: each side presents KEYDIR/NAME.crt
 * and accepts only a peer whose certificate KEYDIR/ca.crt signed.
 */
struct ssl_ctx_st *spd_tls_context(const char *keydir, const char *name, int server,
				   sp_err *err);
void spd_tls_context_free(struct ssl_ctx_st *ctx);
/* Connect to host:port (a name or an address) within `timeout_s`, and
 * check that the daemon's certificate names `host`. */
int spd_tls_connect(struct ssl_ctx_st *ctx, const char *host, int port, double timeout_s,
		    spd_conn *c, sp_err *err);
/* The server's side of the handshake on accepted socket c->fd (c->peer
 * holds its address); c->peer then names the certificate too. */
int spd_tls_accept(struct ssl_ctx_st *ctx, spd_conn *c, sp_err *err);
/* Reads and writes on c give up after `seconds`. */
void spd_conn_timeout(spd_conn *c, double seconds);
/* Connect to this network namespace's daemon (SPD_SOCKET). */
int spd_local_connect(spd_conn *c, sp_err *err);
void spd_conn_close(spd_conn *c);

#endif
