/*
 * serve.c — what the daemon does for each request of a connection.
 *
 * A connection is served frame by frame until its peer closes it.  A frame
 * that is too long, does not parse or asks for something unknown is
 * answered with an Error frame and ends the connection (the peer may be
 * hostile; nothing it sent is trusted further); the daemon serves on.
 */
#include "spd_daemon.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void status(spd_daemon *d, spd_conn *c, Sptrace__Spd__Frame *req, sp_err *err)
{
	Sptrace__Spd__Frame f = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__StatusReply r = SPTRACE__SPD__STATUS_REPLY__INIT;
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	r.name = d->name;
	r.version = SPTRACE_VERSION;
	r.pid = (int32_t)getpid();
	r.uptime_ms = (uint64_t)(now.tv_sec - d->started.tv_sec) * 1000 +
		      (uint64_t)((now.tv_nsec - d->started.tv_nsec) / 1000000);
	r.port = (uint32_t)d->port;
	r.peer = c->peer;
	r.requests = __atomic_load_n(&d->requests, __ATOMIC_RELAXED);
	f.id = req->id;
	f.body_case = SPTRACE__SPD__FRAME__BODY_STATUS_REPLY;
	f.status_reply = &r;
	if (spd_frame_write(c, &f, err) == 0)
		spd_log("%s: status", c->peer);
}

void spd_serve(spd_daemon *d, spd_conn *c)
{
	Sptrace__Spd__Frame *req;
	sp_err err;
	int r;

	if (c->remote && spd_tls_accept(d->tls, c, &err) != 0) {
		spd_log("%s", err.msg);
		return;
	}
	err.msg[0] = '\0';
	while ((r = spd_frame_read(c, &req, &err)) == 1) {
		__atomic_add_fetch(&d->requests, 1, __ATOMIC_RELAXED);
		switch (req->body_case) {
		case SPTRACE__SPD__FRAME__BODY_STATUS:
			status(d, c, req, &err);
			break;
		case SPTRACE__SPD__FRAME__BODY_INJECT:
			spd_inject(d, c, req, &err);
			break;
		case SPTRACE__SPD__FRAME__BODY_COUNT:
			spd_count(d, c, req, &err);
			break;
		case SPTRACE__SPD__FRAME__BODY_COLLECT:
			spd_collect(d, c, req, &err);
			break;
		case SPTRACE__SPD__FRAME__BODY_STOP:
			spd_stop(d, c, req, &err);
			break;
		default:
			snprintf(err.msg, sizeof err.msg, "%s: a frame that is not a request (body "
				 "%d); closing", c->peer, (int)req->body_case);
			spd_send_error(c, req->id, err.msg);
			spd_log("%s", err.msg);
			spd_frame_free(req);
			return;
		}
		spd_frame_free(req);
	}
	if (r < 0) {
		spd_send_error(c, 0, err.msg);
		spd_log("%s; connection closed", err.msg);
	}
}
