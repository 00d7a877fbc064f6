/*
 * spd_inject.c — a test driver of spdaemon's inject request, as an agent
 * will send it: over this host's local socket, for one TCP channel.
 *
 *   spd_inject SRC_IP:PORT DST_IP:PORT SESSION [ON]
 *   spd_inject count SESSION pipe|unix INODE
 *
 * Prints one line per process the daemon considered: "PID injected DIR" or
 * "PID refused WHY"; "none" if no process holds the channel; an Error
 * frame's message as "error: ..." with exit status 1.  `count`: the count
 * request a reader's agent makes (agent/propagate.c, point 6): "count
 * NAME" when the daemon answers with a count (its descriptor comes with
 * it), else "error: ...".
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

/* Send req, print the error if the answer is one: 0 and *rep, or 1. */
/* req sent to the local daemon, its answer into *rep, which must be of
 * `want` (what: its name, for the error); 0, or 1 said. */
static int ask(Sptrace__Spd__Frame *req, int want, const char *what, Sptrace__Spd__Frame **rep)
{
	spd_conn c;
	sp_err err;

	req->id = 7;
	if (spd_local_connect(&c, &err) || spd_frame_write(&c, req, &err) ||
	    spd_frame_read(&c, rep, &err) != 1) {
		fprintf(stderr, "spd_inject: %s\n", err.msg);
		return 1;
	}
	spd_conn_close(&c);
	if ((*rep)->body_case == SPTRACE__SPD__FRAME__BODY_ERROR) {
		printf("error: %s\n", (*rep)->error->message);
		spd_frame_free(*rep);
		return 1;
	}
	if ((*rep)->id != 7 || (int)(*rep)->body_case != want) {
		fprintf(stderr, "spd_inject: %s\n", (*rep)->id != 7 ? "an answer to another request"
			: what);
		spd_frame_free(*rep);
		return 1;
	}
	return 0;
}

static int count(char **argv)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, *rep;
	Sptrace__Spd__CountRequest q = SPTRACE__SPD__COUNT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;

	ch.kind = strcmp(argv[3], "pipe") == 0 ? SPTRACE__SPD__CHANNEL__KIND__PIPE
		  : SPTRACE__SPD__CHANNEL__KIND__UNIX;
	ch.inode = strtoull(argv[4], NULL, 10);
	q.session = argv[2];
	q.channel = &ch;
	req.body_case = SPTRACE__SPD__FRAME__BODY_COUNT;
	req.count = &q;
	if (ask(&req, SPTRACE__SPD__FRAME__BODY_COUNT_REPLY, "an answer that is not the count reply",
		&rep))
		return 1;
	printf("count %s\n", rep->count_reply->count);
	spd_frame_free(rep);
	return 0;
}

int main(int argc, char **argv)
{
	Sptrace__Spd__Frame req = SPTRACE__SPD__FRAME__INIT, *rep;
	Sptrace__Spd__InjectRequest q = SPTRACE__SPD__INJECT_REQUEST__INIT;
	Sptrace__Spd__Channel ch = SPTRACE__SPD__CHANNEL__INIT;
	Sptrace__Spd__Endpoint src = SPTRACE__SPD__ENDPOINT__INIT, dst = SPTRACE__SPD__ENDPOINT__INIT;
	uint8_t sa[16], da[16];

	if (argc == 5 && strcmp(argv[1], "count") == 0 &&
	    (strcmp(argv[3], "pipe") == 0 || strcmp(argv[3], "unix") == 0))
		return count(argv);
	if (argc < 4 || argc > 5 || endpoint(argv[1], sa, &src.addr.len, &src.port) ||
	    endpoint(argv[2], da, &dst.addr.len, &dst.port)) {
		fprintf(stderr, "usage: spd_inject SRC_IP:PORT DST_IP:PORT SESSION [ON] | "
			"spd_inject count SESSION pipe|unix INODE\n");
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
	req.body_case = SPTRACE__SPD__FRAME__BODY_INJECT;
	req.inject = &q;
	if (ask(&req, SPTRACE__SPD__FRAME__BODY_INJECT_REPLY,
		"an answer that is not the inject reply", &rep))
		return 1;
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
