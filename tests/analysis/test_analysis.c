/*
 * test_analysis.c — the analysis library's pieces above the trace reader
 * (analysis.h), on trace directories written by hand (tracegen.h):
 *
 *   1. meta: an_meta, the one reader of meta every command uses: lines in
 *      order, first and last values, counts, line numbers, comments and
 *      empty lines skipped, a key without a value; a missing meta and one
 *      with a NUL byte are errors naming the file;
 *   2. streaming: the iterator over threads longer than its window, with
 *      message heads whose data records straddle a window's edge, and a
 *      ring that came round, records exact;
 *   3. sessions: a trace with an exec'd image (and an exec line that would
 *      lead back up, ignored); a tree made by `sptrace collect`, hosts by
 *      name and processes by pid; records of all merged in time order;
 *   4. flows: two hosts, a request sent by one and received by the other
 *      (in two reads: two matches, an_flows_match) is one flow crossing
 *      both processes; a receive no traced send
 *      matches starts a flow of its own; an activation named by meta; an
 *      image the process exec'd goes on with the flow it was in;
 *   5. join directives (rules 9 and 10 of flows.c): values read back
 *      exact (a 47-bit pointer, a negative number); a worker thread that
 *      takes two items given by the accepting thread joins their flows,
 *      whole at its start, inside a scope from the scope's entry and back
 *      to the flow before at its return; a worker whose life is a scope,
 *      begun before its item was given; a value nobody took counted.
 *
 * usage: test_analysis TRACED-PROGRAM.  Returns 0 when all pass.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "analysis.h"
#include "tracegen.h"

static int failures;
static const char *prog;
static char root[] = "/tmp/sptrace-test-analysis-XXXXXX";
static trace_site sites[S_COUNT];

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "test_analysis:%d: FAIL: ", __LINE__);    \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			failures++;                                               \
		}                                                                 \
	} while (0)

/* 1. meta */
static void test_meta(void)
{
	char *dir = tg_dir(root, "meta"), *empty = tg_dir(root, "nometa");
	an_meta *m = NULL;
	sp_err err;

	tg_meta(dir, prog, "exec exec.1234.1 1234 /bin/true\n\n# a comment\n"
		"exec exec.1234.2 1234 /bin/false\nnovalue\n");
	CHECK(an_meta_read(dir, &m, &err) == 0, "reading %s/meta: %s", dir, err.msg);
	if (m) {
		CHECK(an_meta_nlines(m) == 14, "%zu lines, expected 14 (no comment, no empty one)",
		      an_meta_nlines(m));
		CHECK(an_meta_get(m, "pid") && strcmp(an_meta_get(m, "pid"), "1234") == 0,
		      "pid is '%s'", an_meta_get(m, "pid"));
		CHECK(an_meta_count(m, "exec") == 2, "%zu exec lines", an_meta_count(m, "exec"));
		CHECK(strcmp(an_meta_get(m, "exec"), "exec.1234.1 1234 /bin/true") == 0 &&
		      strcmp(an_meta_last(m, "exec"), "exec.1234.2 1234 /bin/false") == 0,
		      "first exec '%s', last '%s'", an_meta_get(m, "exec"), an_meta_last(m, "exec"));
		CHECK(an_meta_get(m, "novalue") && !an_meta_get(m, "novalue")[0],
		      "a key without a value");
		CHECK(!an_meta_get(m, "# a comment") && !an_meta_get(m, "absent"), "a comment read");
		CHECK(strcmp(an_meta_key(m, 1), "pid") == 0 && an_meta_lineno(m, 1) == 2 &&
		      an_meta_lineno(m, 13) == 16, "line numbers: pid on %zu, the last on %zu",
		      an_meta_lineno(m, 1), an_meta_lineno(m, 13));
		CHECK(!an_meta_key(m, 14) && !an_meta_val(m, 14), "a line past the end");
		an_meta_free(m);
	}
	m = NULL;
	CHECK(an_meta_read(empty, &m, &err) < 0 && errno == ENOENT && !m &&
	      strstr(err.msg, "/nometa/meta") && strstr(err.msg, "trace directory"),
	      "a missing meta: '%s'", err.msg);
	tg_write(empty, "meta", "version 1\npid\0 12\n", 18);
	CHECK(an_meta_read(empty, &m, &err) < 0 && strstr(err.msg, "NUL"),
	      "a meta with a NUL byte: '%s'", err.msg);
	free(dir);
	free(empty);
}

/* 2. streaming: `n` records after the ring's SYNC, a message every 997
 * records (its head at 4094 straddles the first window's edge), then
 * the iterator's records compared one by one. */
static void check_stream(const char *name, uint64_t cap, size_t n)
{
	const uint64_t T = TG_TSC0 + 1000;
	char *dir = tg_dir(root, name);
	size_t pos = 1, first, got = 0, msgs = 0, bad = 0;
	uint64_t *tscs = calloc(n * 5 + 8, 8), *kinds = calloc(n * 5 + 8, 8);
	an_trace *t = NULL;
	an_iter *it = NULL;
	an_record r;
	sp_err err;
	tg_ring ring;
	trace_channel ch[2];

	memset(ch, 0, sizeof ch);
	ch[0].proto = 2;
	ch[0].pid = sizeof(trace_channel);
	ch[1] = (trace_channel){ .proto = TRACE_PROTO_PIPE, .inode = 99 };
	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	tg_write(dir, "channels", ch, sizeof ch);
	tg_ring_init(&ring, 1234, cap, TG_TSC0);
	/* positions as the ring counts them: the SYNC is 0 */
	for (size_t i = 0; i < n; i++) {
		uint64_t tsc = T + i * 10;

		if (pos == 4094 || (i % 997 == 500)) {
			tg_put_msg(&ring, TRACE_EV_MSG_SEND, tsc, 1, TRACE_CALL_WRITE, TRACE_MSG_RELATIVE,
				i, 7);
			tscs[pos] = tsc;
			kinds[pos] = 3;
			pos += 1 + TRACE_MSG_NDATA;
		} else {
			tg_put(&ring, i % 2 ? TRACE_EXIT : TRACE_ENTRY, S_MAIN, tsc);
			tscs[pos] = tsc;
			kinds[pos] = i % 2 ? 2 : 1;
			pos++;
		}
	}
	tg_ring_write(&ring, dir, NULL, -1);
	tg_ring_free(&ring);
	/* a ring that came round keeps the last `cap` records; a message whose
	 * head was overwritten leaves data records, skipped */
	first = pos > cap ? pos - cap : 1;
	if (an_trace_open(dir, &t, &err) < 0 || an_iter_open(t, an_trace_thread(t, 0), &it, &err) < 0) {
		CHECK(0, "%s: %s", name, err.msg);
		goto out;
	}
	for (size_t p = first; p < pos; p++) {
		if (!kinds[p])
			continue;          /* a data record */
		if (!an_iter_next(it, &r)) {
			CHECK(0, "%s: the records end at position %zu of %zu", name, p, pos);
			break;
		}
		got++;
		if (r.tsc != tscs[p] || (kinds[p] == 3) != (r.kind == TRACE_EVENT))
			bad++;
		if (kinds[p] == 3) {
			msgs++;
			if (r.id != TRACE_EV_MSG_SEND || r.msg.chan != 1 || r.msg.len != 7 ||
			    r.msg.recv)
				bad++;
		}
	}
	CHECK(!bad, "%s: %zu records differ from those written", name, bad);
	CHECK(!an_iter_next(it, &r), "%s: records after the last one written", name);
	CHECK(an_iter_stats_get(it)->nrecords == got && an_iter_stats_get(it)->nbad_msgs == 0 &&
	      an_iter_stats_get(it)->nunread == 0 && msgs > 3,
	      "%s: %zu records (%zu expected), %zu messages, %zu cut short", name,
	      an_iter_stats_get(it)->nrecords, got, msgs, an_iter_stats_get(it)->nbad_msgs);
out:
	an_iter_close(it);
	an_trace_close(t);
	free(tscs);
	free(kinds);
	free(dir);
}

static void test_stream(void)
{
	check_stream("stream", 1 << 15, 20000);         /* 5 windows, not wrapped */
	check_stream("stream-wrapped", 1 << 13, 20000); /* the last 8192 records */
}

/* 3. sessions */
static void test_session(void)
{
	char *dir = tg_dir(root, "sess"), *out = tg_dir(root, "collected"), *sub, *h;
	an_session *s = NULL;
	an_merge *m = NULL;
	an_event ev;
	sp_err err;
	tg_ring r;
	int64_t last = INT64_MIN;
	size_t n = 0, disorder = 0;

	tg_meta(dir, prog, "exec exec.1234.1 1234 /bin/true\nexec .. 1234 /bin/loop\n");
	sub = tg_dir(dir, "exec.1234.1");
	tg_meta(sub, prog, "exec_of ..\n");
	CHECK(an_session_open(dir, NULL, &s, &err) == 0, "a session of %s: %s", dir, err.msg);
	if (s) {
		CHECK(!an_session_collected(s) && an_session_nimages(s) == 2 &&
		      strcmp(an_session_image(s, 1)->dir, sub) == 0 &&
		      an_session_image(s, 1)->exec_of == 0 && an_session_image(s, 0)->exec_of == AN_NONE &&
		      strcmp(an_session_image(s, 0)->host, "testhost") == 0 &&
		      an_session_image(s, 0)->pid == 1234,
		      "%zu images, the second %s", an_session_nimages(s),
		      an_session_nimages(s) > 1 ? an_session_image(s, 1)->dir : "missing");
		CHECK(an_session_nwarnings(s) == 1 && strstr(an_session_warning(s, 0), "'..'"),
		      "the exec line naming '..' is not said: %s",
		      an_session_nwarnings(s) ? an_session_warning(s, 0) : "no warning");
		an_session_close(s);
		s = NULL;
	}
	/* OUT/<host>/<pid>: hosts by name, processes by pid (10 before 9 by name) */
	h = tg_dir(out, "hostB");
	free(tg_dir(h, "10"));
	free(tg_dir(h, "9"));
	free(h);
	free(tg_dir(out, "hostA"));
	free(tg_dir(out, "hostA/77"));
	const char *order[] = { "hostA/77", "hostB/9", "hostB/10" };
	for (int i = 0; i < 3; i++) {
		char *p;
		if (asprintf(&p, "%s/%s", out, order[i]) < 0)
			tg_die("out of memory");
		tg_meta(p, prog, "");
		tg_write_sites(p, sites, S_COUNT);
		tg_ring_init(&r, 100 + (uint32_t)i, 64, TG_TSC0);
		/* interleaved in time: image i writes at T + i, T + 3 + i, ... */
		for (int k = 0; k < 10; k++)
			tg_put(&r, k % 2 ? TRACE_EXIT : TRACE_ENTRY, S_MAIN,
			       TG_TSC0 + 1000 + (uint64_t)(3 * k + i));
		tg_ring_write(&r, p, NULL, -1);
		tg_ring_free(&r);
		free(p);
	}
	CHECK(an_session_open(out, NULL, &s, &err) == 0, "a session of %s: %s", out, err.msg);
	if (s) {
		CHECK(an_session_collected(s) && an_session_nimages(s) == 3 &&
		      strcmp(an_session_image(s, 0)->host, "hostA") == 0 &&
		      strcmp(an_session_image(s, 2)->host, "hostB") == 0 &&
		      strstr(an_session_image(s, 1)->dir, "hostB/9") &&
		      strstr(an_session_image(s, 2)->dir, "hostB/10"),
		      "the collected tree's images are not hosts by name, pids by number");
		CHECK(an_merge_open(s, &m, &err) == 0, "merging: %s", err.msg);
		while (m && an_merge_next(m, &ev)) {
			if (ev.ns < last || ev.image != n % 3)
				disorder++;
			last = ev.ns;
			n++;
		}
		CHECK(n == 30 && !disorder, "merged: %zu records (30 expected), %zu out of order", n,
		      disorder);
		an_merge_close(m);
		an_session_close(s);
	}
	h = tg_dir(root, "empty");
	s = NULL;
	CHECK(an_session_open(h, NULL, &s, &err) < 0 && !s && strstr(err.msg, "no trace there"),
	      "a directory with no trace: '%s'", s ? "opened" : err.msg);
	an_session_close(s);
	free(h);
	free(sub);
	free(dir);
	free(out);
}

/* 4. flows */
static void tcp_chan(trace_channel *c, const char *la, uint16_t lp, const char *pa, uint16_t pp)
{
	*c = (trace_channel){ .proto = TRACE_PROTO_TCP, .family = AF_INET, .local_port = lp,
			      .peer_port = pp, .flags = TRACE_CHAN_PEER | TRACE_CHAN_ABS_SEND |
			      TRACE_CHAN_ABS_RECV };
	inet_pton(AF_INET, la, c->local_addr);
	inet_pton(AF_INET, pa, c->peer_addr);
}

/* A host's process 1234 under out/HOST: meta (with `extra`), sites, the
 * channels ch[0..n) (ch[0] the header); its directory, malloc'ed. */
static char *host_trace(const char *out, const char *host, const char *extra,
			const trace_channel *ch, size_t n)
{
	char *top = tg_dir(out, host), *dir = tg_dir(top, "1234");

	tg_meta(dir, prog, extra);
	tg_write_sites(dir, sites, S_COUNT);
	tg_write(dir, "channels", ch, n * sizeof *ch);
	free(top);
	return dir;
}

static void test_flows(void)
{
	const uint64_t T = TG_TSC0 + 100000;
	char *out = tg_dir(root, "flows"), *a, *b, extra[100];
	trace_channel ch[3];
	an_session *s = NULL;
	an_flows *f = NULL;
	sp_err err;
	tg_ring r;

	free(tg_dir(out, "a"));
	free(tg_dir(out, "b"));
	a = tg_dir(out, "a/1234");
	b = tg_dir(out, "b/1234");
	/* host a: activated at start, sends a request to b */
	snprintf(extra, sizeof extra, "activated %" PRIu64 " start\n", T + 5);
	tg_meta(a, prog, extra);
	tg_write_sites(a, sites, S_COUNT);
	memset(ch, 0, sizeof ch);
	ch[0].proto = 2;
	ch[0].pid = sizeof(trace_channel);
	tcp_chan(&ch[1], "10.0.0.1", 40000, "10.0.0.2", 7000);
	tg_write(a, "channels", ch, sizeof ch);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 10);
	tg_put_msg(&r, TRACE_EV_MSG_SEND, T + 20, 1, TRACE_CALL_SEND, 0, 1000, 10);
	tg_put(&r, TRACE_EXIT, S_MAIN, T + 900);
	tg_ring_write(&r, a, NULL, -1);
	tg_ring_free(&r);
	/* host b: traced from the receive of a's request (bytes 1000..1010,
	 * read in two calls), answers; then a request from an untraced client */
	tg_meta(b, prog, "");
	tg_write_sites(b, sites, S_COUNT);
	tcp_chan(&ch[1], "10.0.0.2", 7000, "10.0.0.1", 40000);
	tcp_chan(&ch[2], "10.0.0.2", 7000, "10.0.0.3", 50000);
	ch[0].proto = 3;
	tg_write(b, "channels", ch, sizeof ch);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T + 100);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 101);
	tg_put(&r, TRACE_EVENT, TRACE_EV_RECV, T + 102);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T + 110, 1, TRACE_CALL_READ, 0, 1000, 4);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T + 120, 1, TRACE_CALL_READ, 0, 1004, 6);
	tg_put_msg(&r, TRACE_EV_MSG_SEND, T + 130, 1, TRACE_CALL_WRITE, 0, 500, 20);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T + 5000, 2, TRACE_CALL_READ, 0, 0, 8);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 5010);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T + 5020);
	tg_ring_write(&r, b, NULL, -1);
	tg_ring_free(&r);

	if (an_session_open(out, NULL, &s, &err) < 0 || an_flows_build(s, &f, &err) < 0) {
		CHECK(0, "flows of %s: %s", out, err.msg);
		goto done;
	}
	CHECK(an_flows_count(f) == 2, "%zu flows, expected 2", an_flows_count(f));
	if (an_flows_count(f) == 2) {
		const an_flow *f1 = an_flows_get(f, 0), *f2 = an_flows_get(f, 1);

		CHECK(strcmp(f1->id, "f1") == 0 && strcmp(f1->host, "a") == 0 && f1->pid == 1234 &&
		      f1->tid == 1234 && strcmp(f1->event, "start") == 0,
		      "flow 1 starts at %s %s:%u/%u", f1->event, f1->host, f1->pid, f1->tid);
		CHECK(f1->nprocs == 2 && strcmp(f1->procs[0].host, "a") == 0 &&
		      strcmp(f1->procs[1].host, "b") == 0,
		      "flow 1 crosses %zu processes, expected a:1234 then b:1234", f1->nprocs);
		/* a's 4 records, b's 6 up to the other client's request */
		CHECK(f1->events == 10 && f1->end_ns - f1->start_ns == 900,
		      "flow 1: %" PRIu64 " events (10 expected), %" PRId64 " ns (900 expected)",
		      f1->events, f1->end_ns - f1->start_ns);
		CHECK(strcmp(f2->host, "b") == 0 && strcmp(f2->event, "recv") == 0 &&
		      f2->nprocs == 1 && f2->events == 3 && f2->end_ns - f2->start_ns == 20,
		      "flow 2: %s at %s, %zu processes, %" PRIu64 " events, %" PRId64 " ns", f2->event,
		      f2->host, f2->nprocs, f2->events, f2->end_ns - f2->start_ns);
	}
	/* the edges: a's one send, read by b in two receives */
	CHECK(an_flows_nmatches(f) == 2, "%zu matched receives, expected 2", an_flows_nmatches(f));
	for (size_t i = 0; i < an_flows_nmatches(f) && i < 2; i++) {
		const an_msg_match *m = an_flows_match(f, i);

		CHECK(m->send_image == 0 && m->send_tid == 1234 && m->send_tsc == T + 20 &&
		      m->recv_image == 1 && m->recv_tid == 1234 && m->recv_tsc == T + 110 + 10 * i,
		      "match %zu: image %zu tid %u TSC %" PRIu64 " -> image %zu tid %u "
		      "TSC %" PRIu64,
		      i, m->send_image, m->send_tid, m->send_tsc, m->recv_image, m->recv_tid,
		      m->recv_tsc);
	}
	CHECK(an_flows_match(f, 2) == NULL, "a third match");
done:
	an_flows_free(f);
	an_session_close(s);
	f = NULL;
	s = NULL;
	free(a);
	free(b);
	free(out);

	/* an image the process exec'd (the same pid): one flow */
	out = tg_dir(root, "flows-exec");
	a = tg_dir(out, "exec.1234.1");
	snprintf(extra, sizeof extra, "exec exec.1234.1 1234 %s\nactivated %" PRIu64 " start\n",
		 prog, T + 5);
	tg_meta(out, prog, extra);
	tg_write_sites(out, sites, S_COUNT);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 10);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 20);
	tg_ring_write(&r, out, NULL, -1);
	tg_ring_free(&r);
	snprintf(extra, sizeof extra, "activated %" PRIu64 " start\n", T + 1005);
	tg_meta(a, prog, extra);
	tg_write_sites(a, sites, S_COUNT);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T + 1000);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 1010);
	tg_ring_write(&r, a, NULL, -1);
	tg_ring_free(&r);
	if (an_session_open(out, NULL, &s, &err) < 0 || an_flows_build(s, &f, &err) < 0) {
		CHECK(0, "flows of %s: %s", out, err.msg);
	} else {
		CHECK(an_flows_count(f) == 1 && an_flows_get(f, 0)->events == 5 &&
		      an_flows_get(f, 0)->nprocs == 1 &&
		      an_flows_get(f, 0)->end_ns - an_flows_get(f, 0)->start_ns == 1010,
		      "an exec'd image: %zu flows (1 expected), the first of %" PRIu64 " events",
		      an_flows_count(f), an_flows_count(f) ? an_flows_get(f, 0)->events : 0);
	}
	an_flows_free(f);
	an_session_close(s);
	free(a);
	free(out);
}

/*
 * Rules 7 and 8 of flows.c: hosts a and b talk both ways with clocks that
 * cannot be made to agree (a's receive of b's answer, on a's clock, comes
 * before b sent it by any offset that keeps b's receive after a's send):
 * b's clock is set to the middle of its bounds, one aligned clock reported
 * with both ways, and both receives counted as before their sends.
 */
static void test_clocks(void)
{
	const uint64_t T = TG_TSC0 + 100000;
	char *out = tg_dir(root, "clocks"), *a, *b;
	trace_channel ch[2];
	an_session *s = NULL;
	an_flows *f = NULL;
	sp_err err;
	tg_ring r;

	memset(ch, 0, sizeof ch);
	ch[0].proto = 2;
	ch[0].pid = sizeof(trace_channel);
	/* a: sends 10 bytes at T, reads b's 20 at T + 5 */
	tcp_chan(&ch[1], "10.0.0.1", 40000, "10.0.0.2", 7000);
	a = host_trace(out, "a", "", ch, 2);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T - 10);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T - 5);
	tg_put_msg(&r, TRACE_EV_MSG_SEND, T, 1, TRACE_CALL_SEND, 0, 0, 10);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T + 5, 1, TRACE_CALL_RECV, 0, 0, 20);
	tg_put(&r, TRACE_EXIT, S_MAIN, T + 50);
	tg_ring_write(&r, a, NULL, -1);
	tg_ring_free(&r);
	/* b: reads a's 10 at T + 10, answers 20 at T + 20 */
	tcp_chan(&ch[1], "10.0.0.2", 7000, "10.0.0.1", 40000);
	b = host_trace(out, "b", "", ch, 2);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T + 8);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T + 9);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T + 10, 1, TRACE_CALL_RECV, 0, 0, 10);
	tg_put_msg(&r, TRACE_EV_MSG_SEND, T + 20, 1, TRACE_CALL_SEND, 0, 0, 20);
	tg_put(&r, TRACE_EXIT, S_MAIN, T + 30);
	tg_ring_write(&r, b, NULL, -1);
	tg_ring_free(&r);

	if (an_session_open(out, NULL, &s, &err) < 0 || an_flows_build(s, &f, &err) < 0) {
		CHECK(0, "flows of %s: %s", out, err.msg);
		goto done;
	}
	/* bounds on b - a: >= 0 - 10 = -10 (a to b), <= 5 - 20 = -15 (b to a) */
	CHECK(an_flows_nclocks(f) == 1, "%zu clocks aligned, expected b's", an_flows_nclocks(f));
	if (an_flows_nclocks(f) == 1) {
		const an_clock *c = an_flows_clock(f, 0);

		CHECK(strcmp(c->host, "b") == 0 && strcmp(c->to, "a") == 0 && c->messages == 2 &&
		      c->both_ways && c->offset_ns == -12,
		      "clock of %s to %s: %" PRId64 " ns from %zu messages (both ways %d), expected "
		      "b to a, -12 ns (the middle of -10 and -15), 2, both", c->host, c->to,
		      c->offset_ns, c->messages, c->both_ways);
	}
	CHECK(an_flows_nbackwards(f) == 2, "%zu receives before their sends, expected 2",
	      an_flows_nbackwards(f));
	CHECK(an_flows_count(f) == 1 && an_flows_get(f, 0)->starts <= 1,
	      "%zu flows, the first with %u starts: expected one flow, one start at most",
	      an_flows_count(f), an_flows_count(f) ? an_flows_get(f, 0)->starts : 0);
done:
	an_flows_free(f);
	an_session_close(s);
	free(out);
	free(a);
	free(b);
}

/* 5. join directives */
static void put_value(tg_ring *r, unsigned arg, int64_t v)
{
	tg_put_raw(r, trace_rec(TRACE_EVENT, trace_value_id(arg, (uint64_t)v),
				(uint64_t)v & TRACE_PAYLOAD_MASK));
}

static void test_joins(void)
{
	const uint64_t T = TG_TSC0 + 100000;
	const int64_t ptr = 0x7f0000001000;
	const char *scope[] = { "fact:scope" };
	an_flows_opts o = { NULL, 0, scope, 1 };
	char *out = tg_dir(root, "joins");
	an_session *s = NULL;
	an_flows *f = NULL;
	sp_err err;
	tg_ring r;

	tg_meta(out, prog, "join middle:entry:arg1\njoin leaf:exit:ret\n");
	tg_write_sites(out, sites, S_COUNT);
	/* the accepting thread: two requests, each given to the queue
	 * (middle), then a value nobody takes */
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACCEPT, T);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 10);
	put_value(&r, 1, 0x5000);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T + 20);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACCEPT, T + 100);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 110);
	put_value(&r, 1, ptr);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T + 120);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 300);
	put_value(&r, 2, -3);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T + 310);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACCEPT, T + 380);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T + 390);
	put_value(&r, 1, 0x9000);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T + 395);
	tg_ring_write(&r, out, NULL, -1);
	tg_ring_free(&r);
	/* the worker: takes the first (leaf returns it) at its start, works;
	 * takes the second inside a call of fact; works after it */
	tg_ring_init(&r, 1235, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T + 1);
	tg_put(&r, TRACE_ENTRY, S_LEAF, T + 2);
	put_value(&r, 0, 0x5000);
	tg_put(&r, TRACE_EXIT, S_LEAF, T + 30);
	tg_put(&r, TRACE_ENTRY, S_W_MIDDLE, T + 40);
	tg_put(&r, TRACE_EXIT, S_W_MIDDLE, T + 50);
	tg_put(&r, TRACE_ENTRY, S_FACT, T + 130);
	tg_put(&r, TRACE_ENTRY, S_LEAF, T + 131);
	put_value(&r, 0, ptr);
	tg_put(&r, TRACE_EXIT, S_LEAF, T + 135);
	tg_put(&r, TRACE_EXIT, S_FACT, T + 150);
	tg_put(&r, TRACE_ENTRY, S_W_LEAF, T + 200);
	tg_put(&r, TRACE_EXIT, S_W_LEAF, T + 210);
	tg_ring_write(&r, out, NULL, -1);
	tg_ring_free(&r);
	/* a worker whose life is a scope, waiting in it before the third item
	 * is given; its loop after it */
	tg_ring_init(&r, 1236, 64, TG_TSC0);
	tg_put(&r, TRACE_ENTRY, S_FACT, T + 370);
	tg_put(&r, TRACE_ENTRY, S_LEAF, T + 371);
	put_value(&r, 0, 0x9000);
	tg_put(&r, TRACE_EXIT, S_LEAF, T + 405);
	tg_put(&r, TRACE_EXIT, S_FACT, T + 420);
	tg_put(&r, TRACE_ENTRY, S_W_LEAF, T + 430);
	tg_put(&r, TRACE_EXIT, S_W_LEAF, T + 431);
	tg_ring_write(&r, out, NULL, -1);
	tg_ring_free(&r);

	if (an_session_open(out, NULL, &s, &err) < 0) {
		CHECK(0, "session of %s: %s", out, err.msg);
		free(out);
		return;
	}
	{
		/* the values, exact */
		an_trace *t = an_session_trace(s, 0);
		an_iter *it;
		an_record rec;
		int64_t got[3];
		unsigned args[3], n = 0;

		if (!t || an_iter_open(t, an_trace_thread(t, 0), &it, &err) < 0) {
			CHECK(0, "records of %s: %s", out, t ? err.msg : "no trace");
		} else {
			while (an_iter_next(it, &rec))
				if (rec.kind == TRACE_EVENT && rec.id == TRACE_EV_VALUE && n < 3) {
					got[n] = rec.value;
					args[n++] = rec.value_arg;
				}
			an_iter_close(it);
			CHECK(n == 3 && got[0] == 0x5000 && got[1] == ptr && got[2] == -3 &&
			      args[0] == 1 && args[2] == 2, "values read back: %u, %" PRId64 " %" PRId64
			      " %" PRId64 ", args %u %u", n, got[0], n > 1 ? got[1] : 0,
			      n > 2 ? got[2] : 0, args[0], n > 2 ? args[2] : 0);
		}
	}
	for (int with_scope = 0; with_scope < 2; with_scope++) {
		if (an_flows_build_opts(s, with_scope ? &o : NULL, &f, &err) < 0) {
			CHECK(0, "flows of %s: %s", out, err.msg);
			break;
		}
		CHECK(an_flows_count(f) == 3 && an_flows_ntakes(f) == 3 && an_flows_nuntaken(f) == 1,
		      "scope %d: %zu flows (3 expected), %zu takes (3), %zu untaken (1)", with_scope,
		      an_flows_count(f), an_flows_ntakes(f), an_flows_nuntaken(f));
		if (an_flows_count(f) == 3) {
			const an_flow *f1 = an_flows_get(f, 0), *f2 = an_flows_get(f, 1);
			const an_flow *f3 = an_flows_get(f, 2);

			/* the third: from the accept, though the worker's scope began
			 * before it; the worker's loop after the scope in it too */
			CHECK(f3->tid == 1234 && strcmp(f3->event, "accept") == 0 && f3->nparts == 2 &&
			      f3->events == 11 && f3->starts == 1,
			      "scope %d: f3 %s at tid %u, %zu parts, %" PRIu64 " events, %u starts",
			      with_scope, f3->event, f3->tid, f3->nparts, f3->events, f3->starts);
			int64_t w2 = INT64_MIN;

			for (size_t k = 0; k < f2->nparts; k++)
				if (f2->parts[k].tid == 1235)
					w2 = f2->parts[k].start_ns - f2->start_ns;
			/* f1: the receiver's part and the worker's from its start;
			 * with the scope, its work after the scope too.  f2: the
			 * worker from the take (its return value, at the EXIT after
			 * it), or from the scope's entry. */
			CHECK(f1->tid == 1234 && strcmp(f1->event, "accept") == 0 &&
			      f1->nparts == (size_t)(with_scope ? 3 : 2) && f1->events == 12 &&
			      f2->nparts == 2 && w2 == (with_scope ? 30 : 35) && f2->events == 12,
			      "scope %d: f1 %s, %zu parts, %" PRIu64 " events; f2 %zu parts, the "
			      "worker's from %" PRId64 " ns, %" PRIu64 " events", with_scope, f1->event,
			      f1->nparts, f1->events, f2->nparts, w2, f2->events);
		}
		an_flows_free(f);
		f = NULL;
	}
	an_session_close(s);
	free(out);
}

int main(int argc, char **argv)
{
	char repo[sizeof root + 8];

	if (argc != 2) {
		fprintf(stderr, "usage: test_analysis TRACED-PROGRAM\n");
		return 2;
	}
	prog = argv[1];
	if (!mkdtemp(root))
		tg_die("mkdtemp: %m");
	snprintf(repo, sizeof repo, "%s/repo", root);
	setenv("SPTRACE_REPO", repo, 1);
	tg_sites(prog, sites);

	test_meta();
	test_stream();
	test_session();
	test_flows();
	test_clocks();
	test_joins();

	tg_rmtree(root);
	ca_module_free((ca_module *)tg_prog());
	if (failures) {
		fprintf(stderr, "test_analysis: %d failures\n", failures);
		return 1;
	}
	printf("test_analysis: all passed\n");
	return 0;
}
