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

#endif
