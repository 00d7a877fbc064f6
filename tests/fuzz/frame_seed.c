/*
 * tests/fuzz/frame_seed.c — writes a seed for fuzz_frame: the stream of a
 * status request and its reply, as they cross a connection.
 *
 *   frame_seed OUT
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "spd.h"

int main(int argc, char **argv)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, rep = SPTRACE__SPD__FRAME__INIT;
	Sptrace__Spd__StatusRequest s = SPTRACE__SPD__STATUS_REQUEST__INIT;
	Sptrace__Spd__StatusReply r = SPTRACE__SPD__STATUS_REPLY__INIT;
	spd_conn c = { .peer = "seed" };
	sp_err err;

	if (argc != 2 || (c.fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
		return 1;
	req.id = 1;
	req.body_case = SPTRACE__SPD__FRAME__BODY_STATUS;
	req.status = &s;
	r.name = "host-a";
	r.version = "0.1.0";
	r.pid = 42;
	r.uptime_ms = 1500;
	r.port = SPD_PORT;
	r.peer = "local pid 7 uid 0";
	r.requests = 3;
	rep.id = 1;
	rep.body_case = SPTRACE__SPD__FRAME__BODY_STATUS_REPLY;
	rep.status_reply = &r;
	if (spd_frame_write(&c, &req, &err) || spd_frame_write(&c, &rep, &err)) {
		fprintf(stderr, "frame_seed: %s\n", err.msg);
		return 1;
	}
	return close(c.fd) != 0;
}
