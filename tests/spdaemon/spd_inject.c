/*
 * spd_inject.c — a test driver of spdaemon's inject request, as an agent
 * will send it: over this host's local socket, for one TCP channel.
 *
 *   spd_inject SRC_IP:PORT DST_IP:PORT SESSION [ON]
 *
 * Prints one line per process the daemon considered: "PID injected DIR" or
 * "PID refused WHY"; "none" if no process holds the channel; an Error
 * frame's message as "error: ..." with exit status 1.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spd.h"

static int endpoint(const char *arg, uint8_t addr[16], size_t *len, uint32_t *port)
{
	char host[64];
	const char *colon = strrchr(arg, ':');

	if (!colon || (size_t)(colon - arg) >= sizeof host)
		return -1;
	snprintf(host, sizeof host, "%.*s", (int)(colon - arg), arg);
	*port = (uint32_t)atoi(colon + 1);
	if (inet_pton(AF_INET, host, addr) == 1)
		*len = 4;
	else if (inet_pton(AF_INET6, host, addr) == 1)
		*len = 16;
	else
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, *rep;
	Sptrace__Spd__InjectRequest q = SPTRACE__SPD__INJECT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;
	Sptrace__Spd__Endpoint src = SPTRACE__SPD__ENDPOINT__INIT, dst = SPTRACE__SPD__ENDPOINT__INIT;
	uint8_t sa[16], da[16];
	spd_conn c;
	sp_err err;

	if (argc < 4 || argc > 5 || endpoint(argv[1], sa, &src.addr.len, &src.port) ||
	    endpoint(argv[2], da, &dst.addr.len, &dst.port)) {
		fprintf(stderr, "usage: spd_inject SRC_IP:PORT DST_IP:PORT SESSION [ON]\n");
		return 2;
	}
	src.addr.data = sa;
	dst.addr.data = da;
	ch.kind = SPTRACE__SPD__CHANNEL__KIND__TCP;
	ch.src = &src;
	ch.dst = &dst;
	q.channel = &ch;
	q.session = argv[3];
	q.on = argc > 4 ? argv[4] : "";
	req.id = 7;
	req.body_case = SPTRACE__SPD__FRAME__BODY_INJECT;
	req.inject = &q;
	if (spd_local_connect(&c, &err) || spd_frame_write(&c, &req, &err) ||
	    spd_frame_read(&c, &rep, &err) != 1) {
		fprintf(stderr, "spd_inject: %s\n", err.msg);
		return 1;
	}
	spd_conn_close(&c);
	if (rep->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		printf("error: %s\n", rep->error->message);
		spd_frame_free(rep);
		return 1;
	}
	if (rep->body_case != SPTRACE__SPD__FRAME__BODY_INJECT_REPLY || rep->id != 7) {
		fprintf(stderr, "spd_inject: an answer that is not the inject reply\n");
		return 1;
	}
	if (rep->inject_reply->n_targets == 0)
		printf("none\n");
	for (size_t i = 0; i < rep->inject_reply->n_targets; i++) {
		Sptrace__Spd__InjectReply__Target *t = rep->inject_reply->targets[i];

		if (t->injected)
			printf("%d injected %s\n", (int)t->pid, t->dir);
		else
			printf("%d refused %s\n", (int)t->pid, t->why);
	}
	spd_frame_free(rep);
	return 0;
}
