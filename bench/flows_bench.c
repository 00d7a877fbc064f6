/*
 * bench/flows_bench.c — how fast the analysis library reads a session and
 * separates its flows, scores them, and how much memory that takes; and how
 * fast `sptrace export --format perfetto` writes them (issue 14's budget:
 * reading + flow separation >= 20 M events/s on one core; suspect scores
 * for 10,000 flows <= 2 s; <= 64 bytes of memory per event; a Perfetto
 * export of 3 M events <= 1 s).
 *
 *   flows_bench [-r REQUESTS] [-t THREADS] [-c CALLS] [-n RUNS] PROG SPTRACE DIR
 *
 * Writes DIR: a server's trace as the agent would (tests/analysis/tracegen.c,
 * sites of PROG = tests/analysis/traced.c): THREADS threads serving
 * REQUESTS requests (default 10,000 on 8 threads), each a receive from an
 * untraced client, CALLS calls (default 60: worker() -> middle() -> leaf()
 * and fact()), the answer; every 97th request calls deep() as well, the
 * anomaly to find.  Then RUNS times (default 3): open the session and build
 * its flows; find the anomalies of the flows; run SPTRACE export
 * --format perfetto into DIR.pftrace.  Prints a Markdown table with the
 * medians, and the peak resident memory of this process per event.
 */
#include "analysis.h"
#include "../tests/analysis/tracegen.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RUNS 50

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_u64);
	return v[n / 2];
}

static void put_msg(tg_ring *r, uint32_t ev, uint64_t tsc, uint32_t chan, unsigned call,
		    uint64_t off, uint64_t len)
{
	uint64_t data[TRACE_MSG_NDATA];

	trace_msg_pack(data, chan, call, 0, off, len);
	tg_put(r, TRACE_EVENT, ev, tsc);
	for (unsigned i = 0; i < TRACE_MSG_NDATA; i++)
		tg_put_raw(r, trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[i]));
}

/* The session: its records, in *records. */
static void generate(const char *prog, const char *dir, unsigned requests, unsigned threads,
		     unsigned calls, uint64_t *records)
{
	trace_site sites[S_COUNT];
	trace_channel *ch = calloc(threads + 1, sizeof *ch);
	unsigned per = (requests + threads - 1) / threads;
	/* records per request: 5 + 5 (two messages), 2 per call, 4 for the anomaly */
	uint64_t need = (uint64_t)per * (10 + 2 * calls + 6) + 16, cap = 64;

	if (!ch)
		tg_die("out of memory");
	while (cap < need)
		cap *= 2;
	tg_sites(prog, sites);
	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	ch[0].proto = (uint16_t)(threads + 1);          /* the header record: count */
	ch[0].pid = sizeof(trace_channel);
	for (unsigned t = 0; t < threads; t++) {
		trace_channel *c = &ch[t + 1];

		c->proto = TRACE_PROTO_TCP;
		c->family = 2;                              /* AF_INET */
		c->local_port = 7000;
		c->peer_port = (uint16_t)(40000 + t);
		c->local_addr[0] = 10, c->local_addr[3] = 1;
		c->peer_addr[0] = 10, c->peer_addr[3] = 9;
		c->flags = TRACE_CHAN_PEER | TRACE_CHAN_ABS_SEND | TRACE_CHAN_ABS_RECV;
	}
	tg_write(dir, "channels", ch, (threads + 1) * sizeof *ch);
	*records = 0;
	for (unsigned t = 0; t < threads; t++) {
		tg_ring r;
		uint64_t tsc = TG_TSC0 + 1000 + t, in = 0, out = 0;

		tg_ring_init(&r, 1234 + t, cap, TG_TSC0);
		for (unsigned q = t; q < requests; q += threads) {
			put_msg(&r, TRACE_EV_MSG_RECV, tsc += 500, t + 1, TRACE_CALL_RECV, in, 64);
			in += 64;
			tg_put(&r, TRACE_ENTRY, S_WORKER, tsc += 10);
			for (unsigned k = 0; k + 1 < calls; k += 4) {
				tg_put(&r, TRACE_ENTRY, S_W_MIDDLE, tsc += 20);
				tg_put(&r, TRACE_ENTRY, S_LEAF, tsc += 15);
				tg_put(&r, TRACE_EXIT, S_LEAF, tsc += 40 + (q * 7 + k) % 13);
				tg_put(&r, TRACE_EXIT, S_W_MIDDLE, tsc += 10);
			}
			if (q % 97 == 0) {
				tg_put(&r, TRACE_ENTRY, S_DEEP, tsc += 10);
				tg_put(&r, TRACE_EXIT, S_DEEP, tsc += 20000);
			}
			tg_put(&r, TRACE_EXIT, S_WORKER, tsc += 10);
			put_msg(&r, TRACE_EV_MSG_SEND, tsc += 30, t + 1, TRACE_CALL_SEND, out, 32);
			out += 32;
		}
		*records += r.count;
		tg_ring_write(&r, dir, NULL, -1);
		tg_ring_free(&r);
	}
	free(ch);
}

/* `sptrace export DIR --format perfetto -o DIR.pftrace`: its wall time. */
static uint64_t export_once(const char *sptrace, const char *dir)
{
	char out[4200];
	uint64_t t0;
	pid_t pid;
	int st;

	snprintf(out, sizeof out, "%s.pftrace", dir);
	t0 = now_ns();
	pid = fork();
	if (pid == 0) {
		execl(sptrace, sptrace, "export", dir, "--format", "perfetto", "-o", out,
		      (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		tg_die("%s export %s failed", sptrace, dir);
	return now_ns() - t0;
}

int main(int argc, char **argv)
{
	unsigned requests = 10000, threads = 8, calls = 60;
	uint64_t t_flows[MAX_RUNS], t_anom[MAX_RUNS], t_export[MAX_RUNS], records, events = 0;
	size_t nflows = 0;
	int runs = 3, c;
	long rss0, rss1 = 0, rss2 = 0;
	struct rusage ru;
	const an_suspect *top = NULL;
	char topbuf[256] = "";

	while ((c = getopt(argc, argv, "r:t:c:n:")) != -1) {
		switch (c) {
		case 'r': requests = (unsigned)atoi(optarg); break;
		case 't': threads = (unsigned)atoi(optarg); break;
		case 'c': calls = (unsigned)atoi(optarg); break;
		case 'n': runs = atoi(optarg); break;
		default: goto usage;
		}
	}
	if (argc - optind != 3 || !requests || !threads || threads > 1000 || runs < 1 ||
	    runs > MAX_RUNS || calls < 4)
		goto usage;
	const char *prog = argv[optind], *sptrace = argv[optind + 1], *dir = argv[optind + 2];

	tg_rmtree(dir);
	if (mkdir(dir, 0755) < 0)
		tg_die("mkdir %s: %s", dir, strerror(errno));
	generate(prog, dir, requests, threads, calls, &records);
	getrusage(RUSAGE_SELF, &ru);
	rss0 = ru.ru_maxrss;
	for (int i = 0; i < runs; i++) {
		an_session *s;
		an_flows *f;
		an_anomalies *a;
		an_anomaly_opts o = { .units = AN_UNITS_FLOW, .profile = AN_PROFILE_COMPOSITE };
		sp_err err;
		uint64_t t0 = now_ns();

		if (an_session_open(dir, NULL, &s, &err) < 0 || an_flows_build(s, &f, &err) < 0)
			tg_die("%s: %s", dir, err.msg);
		t_flows[i] = now_ns() - t0;
		getrusage(RUSAGE_SELF, &ru);
		if (i == 0)
			rss1 = ru.ru_maxrss;
		nflows = an_flows_count(f);
		events = 0;
		for (size_t k = 0; k < nflows; k++)
			events += an_flows_get(f, k)->events;
		an_flows_free(f);
		t0 = now_ns();
		if (an_anomalies_find(s, NULL, &o, &a, &err) < 0)
			tg_die("%s: %s", dir, err.msg);
		t_anom[i] = now_ns() - t0;
		getrusage(RUSAGE_SELF, &ru);
		if (i == 0)
			rss2 = ru.ru_maxrss;
		top = an_anomalies_get(a, 0);
		if (top && i == 0)
			snprintf(topbuf, sizeof topbuf, "%s (%s), culprit %s", top->flow ? top->flow : "?",
				 top->method, top->npath ? top->path[top->npath - 1] : "none");
		an_anomalies_free(a);
		an_session_close(s);
		t_export[i] = export_once(sptrace, dir);
	}
	uint64_t mf = median(t_flows, runs), ma = median(t_anom, runs), me = median(t_export, runs);

	printf("| what | figure |\n|---|---:|\n");
	printf("| session | %u requests on %u threads, %" PRIu64 " records, %zu flows, %" PRIu64
	       " events in flows |\n", requests, threads, records, nflows, events);
	printf("| open + flow separation (median of %d) | %.1f ms: **%.1f M events/s** |\n", runs,
	       (double)mf / 1e6, (double)events / ((double)mf / 1e9) / 1e6);
	printf("| suspect scores for %zu flows (median) | **%.2f s** |\n", nflows, (double)ma / 1e9);
	printf("| peak resident memory of the first run's separation, over the generator's | "
	       "%.1f MiB: **%.1f bytes per event** |\n", (double)(rss1 - rss0) / 1024,
	       (double)(rss1 - rss0) * 1024 / (double)(events ? events : 1));
	printf("| ... and of its suspect scores (the flows' profiles) | %.1f MiB: **%.1f bytes per "
	       "event** |\n", (double)(rss2 - rss0) / 1024,
	       (double)(rss2 - rss0) * 1024 / (double)(events ? events : 1));
	printf("| sptrace export --format perfetto (median, whole command) | **%.2f s** for %"
	       PRIu64 " events |\n", (double)me / 1e9, events);
	printf("| most suspect flow (every 97th request calls deep()) | %s |\n", topbuf);
	return 0;
usage:
	fprintf(stderr, "usage: flows_bench [-r REQUESTS] [-t THREADS] [-c CALLS] [-n RUNS] PROG "
		"SPTRACE DIR\n");
	return 2;
}
