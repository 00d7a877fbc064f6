/*
 * tests/fuzz/frame_seed.c — writes a seed for fuzz_frame: the stream of a
 * status request and its reply, then a collect request (with a file it
 * has), two chunks of a file and the stream's last chunk, and a stop
 * request and its reply, as they cross a connection.
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
	Sptrace__Spd__CollectRequest q = SPTRACE__SPD__COLLECT_REQUEST__INIT;
	Sptrace__Spd__CollectRequest__Have h = SPTRACE__SPD__COLLECT_REQUEST__HAVE__INIT, *hp = &h;
	Sptrace__Spd__CollectChunk c1 = SPTRACE__SPD__COLLECT_CHUNK__INIT,
				   c2 = SPTRACE__SPD__COLLECT_CHUNK__INIT,
				   end = SPTRACE__SPD__COLLECT_CHUNK__INIT;
	Sptrace__Spd__StopRequest sq = SPTRACE__SPD__STOP_REQUEST__INIT;
	Sptrace__Spd__StopReply sr = SPTRACE__SPD__STOP_REPLY__INIT;
	Sptrace__Spd__StopReply__Host sh = SPTRACE__SPD__STOP_REPLY__HOST__INIT, *shp = &sh;
	Sptrace__Spd__Frame fq = SPTRACE__SPD__FRAME__INIT, f1 = SPTRACE__SPD__FRAME__INIT,
			    f2 = SPTRACE__SPD__FRAME__INIT, fe = SPTRACE__SPD__FRAME__INIT,
			    fs = SPTRACE__SPD__FRAME__INIT, fr = SPTRACE__SPD__FRAME__INIT;
	static uint8_t sum[32] = { 0xe3, 0xb0, 0xc4 }, data[] = "pid 42\nsession s1\n";
	char *peers[] = { "10.0.0.2", "host-c" };

	h.path = "42/meta";
	h.size = 18;
	h.sha256.data = sum;
	h.sha256.len = 32;
	q.session = "s1";
	q.host = "10.0.0.2";
	q.n_have = 1;
	q.have = &hp;
	fq.id = 2;
	fq.body_case = SPTRACE__SPD__FRAME__BODY_COLLECT;
	fq.collect = &q;
	c1.path = c2.path = "42/exec.42.1/meta";
	c1.host = c2.host = end.host = "host-a";
	c1.size = c2.size = sizeof data - 1;
	c1.mode = c2.mode = 0600;
	c1.data.data = data;
	c1.data.len = 7;
	c2.offset = 7;
	c2.data.data = data + 7;
	c2.data.len = sizeof data - 8;
	c2.eof = 1;
	c2.sha256.data = sum;
	c2.sha256.len = 32;
	end.last = 1;
	end.peers = peers;
	end.n_peers = 2;
	end.processes = 1;
	end.withheld = 2;
	end.files = 1;
	end.bytes = sizeof data - 1;
	f1.id = f2.id = fe.id = 2;
	f1.body_case = f2.body_case = fe.body_case = SPTRACE__SPD__FRAME__BODY_COLLECT_CHUNK;
	f1.collect_chunk = &c1;
	f2.collect_chunk = &c2;
	fe.collect_chunk = &end;
	sq.session = "s1";
	sq.relayed = sq.for_user = 1;
	sq.uid = 1000;
	fs.id = 3;
	fs.body_case = SPTRACE__SPD__FRAME__BODY_STOP;
	fs.stop = &sq;
	sh.host = "host-a";
	sh.stopped = 1;
	sh.error = "";
	sh.peers = peers;
	sh.n_peers = 2;
	sr.n_hosts = 1;
	sr.hosts = &shp;
	fr.id = 3;
	fr.body_case = SPTRACE__SPD__FRAME__BODY_STOP_REPLY;
	fr.stop_reply = &sr;
	if (spd_frame_write(&c, &req, &err) || spd_frame_write(&c, &rep, &err) ||
	    spd_frame_write(&c, &fq, &err) || spd_frame_write(&c, &f1, &err) ||
	    spd_frame_write(&c, &f2, &err) || spd_frame_write(&c, &fe, &err) ||
	    spd_frame_write(&c, &fs, &err) || spd_frame_write(&c, &fr, &err)) {
		fprintf(stderr, "frame_seed: %s\n", err.msg);
		return 1;
	}
	return close(c.fd) != 0;
}
