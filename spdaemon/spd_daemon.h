/*
 * spd_daemon.h — the daemon's own state, shared by main.c (options, log,
 * listening) and serve.c (requests).
 */
#ifndef SPD_DAEMON_H
#define SPD_DAEMON_H

#include <pthread.h>
#include <time.h>

#include "spd_internal.h"

/* What other hosts' inject requests may reach (config remote-inject). */
enum { SPD_REMOTE_USERS, SPD_REMOTE_ALL, SPD_REMOTE_NONE };

typedef struct spd_daemon {
	char *keys, *name, *state_dir;   /* --keys, --name, --state-dir */
	char *agent;                     /* --agent: libsptrace-agent.so, checked */
	char state_abs[4096];            /* the state directory, absolute */
	int remote_inject;               /* SPD_REMOTE_* */
	int port;                        /* TCP port for other hosts */
	int foreground;
	struct ssl_ctx_st *tls;          /* server side: our certificate, the CA */
	struct ssl_ctx_st *tls_client;   /* to other hosts' daemons, made when first needed */
	pthread_mutex_t lock;            /* guards tls_client and traced */
	int state_fd, log_fd;            /* the state directory, spdaemon.log there */
	int local_fd, remote_fd;         /* listening sockets */
	int probe_fd;                    /* UDP, the probes of IP options (inject.c) */
	struct timespec started;         /* CLOCK_MONOTONIC */
	unsigned long long requests;     /* served (atomic) */
	struct spd_traced *traced;       /* the processes it put the agent into
	                                  * (inject.c), SPD_MAX_TRACED */
	size_t ntraced;                  /*   (guarded by `lock`) */
	int reaper;                      /* its thread runs (inject.c) */
} spd_daemon;

/* A process this daemon put the agent into, for a later request of the
 * same session that finds it again (inject.c, step 4). */
#define SPD_MAX_TRACED 4096
typedef struct spd_traced {
	pid_t pid;
	uid_t uid;                       /* the process's, who owns its trace */
	int gone;                        /* it ended; its trace was completed (reaper) */
	unsigned long long start;        /* /proc/PID/stat field 22: not a reused pid */
	char session[65];
	char dir[4096];                  /* its trace, absolute */
} spd_traced;

/* main.c: a line in spdaemon.log (and on stderr in the foreground). */
void spd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* serve.c: one connection, to its end (the TLS handshake first for a
 * remote one); every request and every refusal is logged. */
void spd_serve(spd_daemon *d, spd_conn *c);

/* inject.c: the inject request (answered on c, logged). */
void spd_inject(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err);
/* inject.c: a reader's agent asks for its channel's readers' count
 * (answered with its descriptor, or refused; logged). */
void spd_count(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err);
/* inject.c: the connections kept to other hosts' daemons, closed (a stop). */
void spd_inject_close_kept(void);

/* session.c: a session's directory, STATE/sessions/SESSION (see there). */
#define SPD_PEERS_MAX 16384              /* bytes of a session's peers file */
/* 0 if SESSION can name a directory ([A-Za-z0-9._-], 1..64, no leading
 * '.'), else -1 and why. */
int spd_session_check(const char *session, sp_err *err);
/* Its descriptor (made, 0711, with `create`), or -1 and why (-2: there
 * is none, without `create`). */
int spd_session_open(const spd_daemon *d, const char *session, int create, sp_err *err);
/* `host` (a name or an address) into the session's peers, once. */
/* A command line ("stop\n", "expect ...\n") into the control FIFO of the
 * agent whose trace directory is `dirfd`: only a FIFO owned by `owner`,
 * opened without following a link (O_PATH, fstat) and reopened for writing
 * through /proc/self/fd without blocking, as `sptrace stop` does.  0, or -1
 * (errno; EPERM: not the agent's FIFO). */
int spd_agent_tell(int dirfd, uid_t owner, const char *line);
int spd_session_add_peer(const spd_daemon *d, const char *session, const char *host,
			 sp_err *err);
/* The peers of the session whose directory is sfd (none: *n = 0); free
 * them with spd_session_peers_free. */
int spd_session_peers(int sfd, char ***out, size_t *n);
void spd_session_peers_free(char **v, size_t n);

/* collect.c: the collect request, a stream of chunks (logged). */
void spd_collect(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err);
/* collect.c: the stop request (logged). */
void spd_stop(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err);
/* collect.c: the client side of TLS to another host's daemon (made when
 * first needed, kept); NULL and why. */
struct ssl_ctx_st *spd_tls_client(spd_daemon *d, sp_err *err);

#endif
