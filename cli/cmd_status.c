/*
 * cmd_status.c — `sptrace status`: whether a spdaemon serves this host, or
 * other hosts, and who it is (spdaemon/, proto/spd.proto).
 *
 *   sptrace status                                   this host's daemon
 *   sptrace status --keys KEYDIR --name NAME HOST... other hosts' daemons,
 *                                                    over mutual TLS as NAME
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "spd.h"

static const char status_help[] =
	"usage: sptrace status [--keys KEYDIR --name NAME [--port PORT] HOST...]\n"
	"\n"
	"Ask a spdaemon who it is: its host name, version, pid and uptime.  Without\n"
	"HOST, the daemon of this host (this network namespace), reached through its\n"
	"local socket.  With HOSTs, each host's daemon over mutual TLS 1.3,\n"
	"presenting KEYDIR/NAME.crt and accepting only a daemon whose certificate\n"
	"KEYDIR/ca.crt signed for that HOST.  One line per daemon; a host that does\n"
	"not answer is said, and the exit status is 1.\n"
	"\n"
	"options:\n"
	"  --keys KEYDIR   ca.crt, NAME.crt and NAME.key ('sptrace keys issue')\n"
	"  --name NAME     this host, as its certificate names it\n"
	"  --port PORT     the daemons' TCP port (default 7470)\n"
	"  --timeout S     seconds to wait for each daemon (default 10)\n"
	"  -h, --help      this text\n";

/* One status request on `c`: 0 and *rep (spd_frame_free), or -1 and a
 * message. */
static int status_of(spd_conn *c, Sptrace__Spd__Frame **rep, sp_err *err)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__StatusRequest s = SPTRACE__SPD__STATUS_REQUEST__INIT;
	int r;

	req.id = 1;
	req.body_case = SPTRACE__SPD__FRAME__BODY_STATUS;
	req.status = &s;
	if (spd_frame_write(c, &req, err) != 0)
		return -1;
	if ((r = spd_frame_read(c, rep, err)) <= 0)
		return r == 0 ? sp_fail(err, "the daemon closed the connection without an answer")
			      : -1;
	return 0;
}

int cli_local_daemon(char *name, size_t len)
{
	Sptrace__Spd__Frame *rep = NULL;
	spd_conn c;
	sp_err err;
	int r = -1;

	if (spd_local_connect(&c, &err) != 0)
		return -1;
	if (status_of(&c, &rep, &err) == 0 &&
	    rep->body_case == SPTRACE__SPD__FRAME__BODY_STATUS_REPLY) {
		snprintf(name, len, "%s", rep->status_reply->name);
		r = 0;
	}
	if (rep)
		spd_frame_free(rep);
	spd_conn_close(&c);
	return r;
}

/*
 * Propagation: when this host's spdaemon answers, a run or an attach is a
 * session the agents of every process its requests reach share
 * (agent/propagate.c): its name, unique per host and command.
 */
int cli_start_session(char *session, size_t len, char *daemon, size_t dlen)
{
	char name[64];
	size_t n;

	if (cli_local_daemon(daemon, dlen) != 0)
		return -1;
	snprintf(name, sizeof name, "%s", daemon);
	for (n = 0; name[n]; n++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
			    name[n]) || (n == 0 && name[n] == '.'))
			name[n] = '_';
	snprintf(session, len, "%.30s-%ld-%d", name, (long)time(NULL), (int)getpid());
	return 0;
}

int cli_propagate_wait(const char *cmd, const char *arg, char *out, size_t len)
{
	char *end;
	unsigned long ms = strtoul(arg, &end, 10);

	if (!*arg || *end || ms > 600000)
		return cli_error("%s: --propagate-wait '%s': give milliseconds, 0 to 600000", cmd,
				 arg), 2;
	snprintf(out, len, "%lu", ms);
	return 0;
}

int cli_propagate_mark(const char *cmd, const char *arg, char *out, size_t len)
{
	if (strcmp(arg, "offset") != 0 && strcmp(arg, "oob") != 0)
		return cli_error("%s: --mark '%s': give 'offset' or 'oob'", cmd, arg), 2;
	snprintf(out, len, "%s", arg);
	return 0;
}

/* One status request on `c`; prints the answer. */
static int ask(spd_conn *c, const char *who)
{
	Sptrace__Spd__Frame *rep = NULL;
	sp_err err;

	if (status_of(c, &rep, &err) != 0)
		return cli_error("status: %s", err.msg);
	if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		cli_error("status: %s refused: %s", who, rep->error->message);
	} else if (rep->body_case != SPTRACE__SPD__FRAME__BODY_STATUS_REPLY) {
		cli_error("status: %s answered something else (body %d)", who, (int)rep->body_case);
	} else {
		Sptrace__Spd__StatusReply *st = rep->status_reply;

		printf("%s: spdaemon %s, host %s, pid %d, up %.1f s, TCP port %u, %llu requests "
		       "served; it sees us as %s\n", who, st->version, st->name, (int)st->pid,
		       (double)st->uptime_ms / 1000, st->port, (unsigned long long)st->requests,
		       st->peer);
		spd_frame_free(rep);
		return 0;
	}
	spd_frame_free(rep);
	return 1;
}

int cmd_status(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "keys", required_argument, 0, 'k' }, { "name", required_argument, 0, 'n' },
		{ "port", required_argument, 0, 'p' }, { "timeout", required_argument, 0, 't' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *keys = NULL, *name = NULL;
	long port = SPD_PORT, timeout = 10;
	struct ssl_ctx_st *ctx;
	spd_conn c;
	sp_err err;
	char *end;
	int opt, failed = 0;

	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (opt) {
		case 'k': keys = optarg; break;
		case 'n': name = optarg; break;
		case 'p':
			port = strtol(optarg, &end, 10);
			if (*end || end == optarg || port < 1 || port > 65535)
				return cli_error("status: --port '%s': give a TCP port, 1 to 65535",
						 optarg), 2;
			break;
		case 't':
			timeout = strtol(optarg, &end, 10);
			if (*end || end == optarg || timeout < 1 || timeout > 3600)
				return cli_error("status: --timeout '%s': give whole seconds, 1 to "
						 "3600", optarg), 2;
			break;
		case 'h': fputs(status_help, stdout); return 0;
		case ':':
			return cli_error("status: option '%s' needs a value; see 'sptrace status "
					 "--help'", argv[optind - 1]), 2;
		default:
			return cli_error("status: unknown option '%s'; see 'sptrace status --help'",
					 argv[optind - 1]), 2;
		}
	}
	if (optind == argc) {
		if (keys || name)
			return cli_error("status: --keys and --name are for other hosts: name them "
					 "(sptrace status --keys KEYDIR --name NAME HOST...)"), 2;
		if (spd_local_connect(&c, &err) != 0)
			return cli_error("status: %s", err.msg);
		failed = ask(&c, "this host");
		spd_conn_close(&c);
		return failed;
	}
	if (!keys || !name)
		return cli_error("status: to reach other hosts, give --keys KEYDIR and --name NAME "
				 "(this host's certificate)"), 2;
	if (!(ctx = spd_tls_context(keys, name, 0, &err)))
		return cli_error("status: %s", err.msg);
	for (int i = optind; i < argc; i++) {
		if (spd_tls_connect(ctx, argv[i], (int)port, (int)timeout, &c, &err) != 0) {
			failed |= cli_error("status: %s", err.msg);
			continue;
		}
		failed |= ask(&c, argv[i]);
		spd_conn_close(&c);
	}
	spd_tls_context_free(ctx);
	return failed;
}
