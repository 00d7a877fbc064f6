/*
 * test_replay.c — `sptrace replay` and `sptrace report` on trace directories
 * written by hand (tracegen.h), output checked exactly:
 *
 *   basic      two threads: nesting, recursion, leaf calls, a PLT callee, an
 *              unknown indirect callee, events; --tid, --depth, --since and
 *              --until (relative and @absolute), --srcline; report with each
 *              --sort and --tid
 *   lost       a wrapped ring: the lost-records line, exits without entry
 *   tscwrap    the 38-bit TSC wrapping, and a gap of three wrap periods
 *   noexit     calls still open when the records end
 *   longjmp    an exit that unwinds skipped frames; an exit matching nothing
 *   tail       a tail jump's callee closes with its caller, unmarked
 *   badsite    a site id the sites file does not hold
 *   events     signal and unknown events inside a call
 *   contexts   a coroutine's calls suspended and continued across
 *              swapcontext, in replay and report
 *   cxx        C++ names (traced_cxx.cpp) with --demangle simple (the
 *              default), full and no, in replay and report
 *   errors     corrupt and truncated rings, missing sites and meta, malformed
 *              meta, bad options: exit status, stderr, and nothing on stdout
 *
 * usage: test_replay SPTRACE TRACED-PROGRAM TRACED-CXX-PROGRAM.  Returns 0 when
 * all pass.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tracegen.h"

static int failures;
static const char *sptrace, *prog, *cxx_prog;
static char root[] = "/tmp/sptrace-test-replay-XXXXXX";
static trace_site sites[S_COUNT];
static char indirect[64];   /* the name of S_HOOK's callee */

/* Strings made for one check, freed together. */
static char *strs[64];
static size_t nstrs;

__attribute__((format(printf, 1, 2)))
static const char *S(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0 || nstrs == sizeof strs / sizeof *strs)
		tg_die("out of memory or too many strings");
	va_end(ap);
	strs[nstrs++] = s;
	return s;
}

static void free_strs(void)
{
	while (nstrs)
		free(strs[--nstrs]);
}

/*
 * Run sptrace with the NULL-terminated arguments and compare.  want_err NULL
 * means stderr must be empty.
 */
static void expect(const char *what, int want_rc, const char *want_out, const char *want_err,
		   ...)
{
	char *argv[32], *out, *err;
	int argc = 0, rc;
	va_list ap;

	argv[argc++] = (char *)sptrace;
	va_start(ap, want_err);
	while (argc < 31 && (argv[argc] = va_arg(ap, char *)))
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	rc = tg_run(argv, &out, &err);
	if (!want_err)
		want_err = "";
	if (rc != want_rc || strcmp(out, want_out) != 0 || strcmp(err, want_err) != 0) {
		fprintf(stderr, "test_replay: FAIL: %s:", what);
		for (int i = 1; i < argc; i++)
			fprintf(stderr, " %s", argv[i]);
		fprintf(stderr, "\n--- exit %d, expected %d\n--- stdout:\n%s--- expected:\n%s"
			"--- stderr:\n%s--- expected:\n%s---\n", rc, want_rc, out, want_out, err,
			want_err);
		failures++;
	}
	free(out);
	free(err);
	free_strs();
}

/* A record for write_ring: kind, id, TSC offset from the base (a context
 * event's key). */
typedef struct rec {
	unsigned kind;
	uint32_t id;
	uint64_t off;
} rec;

#define T0 (TG_TSC0 + 1000000)      /* 1 ms after tracing began */

static void write_ring(const char *dir, uint32_t tid, uint64_t cap, uint64_t base,
		       const rec *r, size_t n)
{
	tg_ring ring;

	tg_ring_init(&ring, tid, cap, TG_TSC0);
	for (size_t i = 0; i < n; i++) {
		if (r[i].kind == TRACE_EVENT && trace_event_has_key(r[i].id))
			tg_put_raw(&ring, trace_rec(TRACE_EVENT, r[i].id, r[i].off));
		else
			tg_put(&ring, r[i].kind, r[i].id, base + r[i].off);
	}
	tg_ring_write(&ring, dir, NULL, -1);
	tg_ring_free(&ring);
}

static char *standard_dir(const char *name)
{
	char *dir = tg_dir(root, name);

	tg_meta(dir, prog, "");
	tg_write_sites(dir, sites, S_COUNT);
	return dir;
}

static const char *src_of(const char *func)
{
	const ca_line *l = ca_line_at(tg_prog(), tg_func(func));

	if (!l)
		tg_die("the traced program has no line for %s", func);
	return S("%s:%u", ca_str(tg_prog(), l->file), l->line);
}

#define E(id, off) { TRACE_ENTRY, id, off }
#define X(id, off) { TRACE_EXIT, id, off }
#define EV(ev, off) { TRACE_EVENT, ev, off }
#define CTX(ev, key) { TRACE_EVENT, TRACE_EV_CTX_##ev, key }
#define N(a) (sizeof a / sizeof *a)

static const char HDR[] = "# DURATION     TID     FUNCTION\n";
static const char RHDR[] =
	"  Total time   Self time       Calls  Function\n"
	"  ==========  ==========  ==========  ====================\n";

static void test_basic(void)
{
	static const rec t1[] = {
		EV(TRACE_EV_ACTIVATE, 0), E(S_MAIN, 0), E(S_MIDDLE, 100), E(S_LEAF, 200),
		X(S_LEAF, 712), X(S_MIDDLE, 1000), E(S_FACT, 1100), E(S_FACT_REC, 1200),
		E(S_FACT_REC, 1300), X(S_FACT_REC, 1400), X(S_FACT_REC, 1500), X(S_FACT, 1600),
		E(S_PRINTF, 1700), X(S_PRINTF, 2700), X(S_MAIN, 3000),
		EV(TRACE_EV_DEACTIVATE, 3100),
	};
	static const rec t2[] = {
		E(S_WORKER, 0), E(S_W_MIDDLE, 10), E(S_LEAF, 20), X(S_LEAF, 30), X(S_W_MIDDLE, 40),
		E(S_W_LEAF, 50), X(S_W_LEAF, 2050), X(S_WORKER, 3000), E(S_HOOK, 3100),
		X(S_HOOK, 3200), EV(TRACE_EV_THREAD_EXIT, 3300),
	};
	static const char main_tree[] =
		"            [ 1234] | /* activate */\n"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   middle() {\n"
		"   0.512 us [ 1234] |     leaf();\n"
		"   0.900 us [ 1234] |   } /* middle */\n"
		"            [ 1234] |   fact() {\n"
		"            [ 1234] |     fact() {\n"
		"   0.100 us [ 1234] |       fact();\n"
		"   0.300 us [ 1234] |     } /* fact */\n"
		"   0.500 us [ 1234] |   } /* fact */\n"
		"   1.000 us [ 1234] |   printf@plt();\n"
		"   3.000 us [ 1234] | } /* main */\n"
		"            [ 1234] | /* deactivate */\n";
	char *dir = standard_dir("basic"), worker_tree[1024];

	write_ring(dir, 1234, 64, T0, t1, N(t1));
	write_ring(dir, 1240, 64, T0 + 1000000, t2, N(t2));
	/* S() strings last for one expect(); this one for all of them. */
	snprintf(worker_tree, sizeof worker_tree,
		 "            [ 1240] | worker() {\n"
		 "            [ 1240] |   middle() {\n"
		 "   0.010 us [ 1240] |     leaf();\n"
		 "   0.030 us [ 1240] |   } /* middle */\n"
		 "   2.000 us [ 1240] |   leaf();\n"
		 "   3.000 us [ 1240] | } /* worker */\n"
		 "   0.100 us [ 1240] | %s();\n"
		 "            [ 1240] | /* thread exit */\n", indirect);
	expect("basic", 0, S("%s%s%s", HDR, main_tree, worker_tree), NULL, "replay", dir, NULL);
	/* The second run finds the module in the repository. */
	expect("basic, from the repository", 0, S("%s%s", HDR, main_tree), NULL,
	       "replay", "--tid", "1234", dir, NULL);
	expect("--tid both", 0, S("%s%s%s", HDR, main_tree, worker_tree), NULL,
	       "replay", "--tid=1240,1234", dir, NULL);
	expect("--depth 1", 0, S("%s"
		"            [ 1234] | /* activate */\n"
		"   3.000 us [ 1234] | main();\n"
		"            [ 1234] | /* deactivate */\n"
		"   3.000 us [ 1240] | worker();\n"
		"   0.100 us [ 1240] | %s();\n"
		"            [ 1240] | /* thread exit */\n", HDR, indirect), NULL,
	       "replay", "--depth", "1", dir, NULL);
	expect("--depth 2", 0, S("%s"
		"            [ 1234] | /* activate */\n"
		"            [ 1234] | main() {\n"
		"   0.900 us [ 1234] |   middle();\n"
		"   0.500 us [ 1234] |   fact();\n"
		"   1.000 us [ 1234] |   printf@plt();\n"
		"   3.000 us [ 1234] | } /* main */\n"
		"            [ 1234] | /* deactivate */\n", HDR), NULL,
	       "replay", "--depth", "2", "--tid", "1234", dir, NULL);

	/* [T0+1100, T0+1650]: main, the facts; not middle, printf, the events. */
	static const char window[] =
		"            [ 1234] | main() {\n"
		"            [ 1234] |   fact() {\n"
		"            [ 1234] |     fact() {\n"
		"   0.100 us [ 1234] |       fact();\n"
		"   0.300 us [ 1234] |     } /* fact */\n"
		"   0.500 us [ 1234] |   } /* fact */\n"
		"   3.000 us [ 1234] | } /* main */\n";
	expect("--since/--until relative", 0, S("%s%s", HDR, window), NULL, "replay", "--tid",
	       "1234", "--since", "1.0011ms", "--until", "1001650ns", dir, NULL);
	expect("--since/--until absolute", 0, S("%s%s", HDR, window), NULL, "replay", "--tid",
	       "1234", "--since", "@1700000000.0010011", "--until", "@1700000000.00100165", dir,
	       NULL);
	/* middle's only child falls outside: middle prints as a leaf. */
	expect("--since hides a child", 0, S("%s"
		"            [ 1240] | worker() {\n"
		"   0.030 us [ 1240] |   middle();\n"
		"   3.000 us [ 1240] | } /* worker */\n", HDR), NULL,
	       "replay", "--since", "0.002000035", "--until", "2000045ns", "--tid", "1240", dir,
	       NULL);
	expect("--since after everything", 0, HDR, NULL, "replay", "--since", "10", dir, NULL);
	expect("--srcline", 0, S("%s"
		"            [ 1240] | worker() { /* %s */\n"
		"   0.030 us [ 1240] |   middle(); /* %s */\n"
		"   2.000 us [ 1240] |   leaf(); /* %s */\n"
		"   3.000 us [ 1240] | } /* worker */\n"
		"   0.100 us [ 1240] | %s();\n"
		"            [ 1240] | /* thread exit */\n", HDR, src_of("worker"),
		src_of("middle"), src_of("leaf"), indirect), NULL,
	       "replay", "--srcline", "--depth", "2", "--tid", "1240", dir, NULL);

	expect("report", 0, S("%s"
		"    3.000 us    0.600 us           1  main\n"
		"    3.000 us    0.970 us           1  worker\n"
		"    2.522 us    2.522 us           3  leaf\n"
		"    1.000 us    1.000 us           1  printf@plt\n"
		"    0.930 us    0.408 us           2  middle\n"
		"    0.500 us    0.500 us           3  fact\n"
		"    0.100 us    0.100 us           1  %s\n", RHDR, indirect), NULL,
	       "report", dir, NULL);
	expect("report --sort self", 0, S("%s"
		"    2.522 us    2.522 us           3  leaf\n"
		"    1.000 us    1.000 us           1  printf@plt\n"
		"    3.000 us    0.970 us           1  worker\n"
		"    3.000 us    0.600 us           1  main\n"
		"    0.500 us    0.500 us           3  fact\n"
		"    0.930 us    0.408 us           2  middle\n"
		"    0.100 us    0.100 us           1  %s\n", RHDR, indirect), NULL,
	       "report", "--sort", "self", dir, NULL);
	expect("report --sort calls", 0, S("%s"
		"    0.500 us    0.500 us           3  fact\n"
		"    2.522 us    2.522 us           3  leaf\n"
		"    0.930 us    0.408 us           2  middle\n"
		"    0.100 us    0.100 us           1  %s\n"
		"    3.000 us    0.600 us           1  main\n"
		"    1.000 us    1.000 us           1  printf@plt\n"
		"    3.000 us    0.970 us           1  worker\n", RHDR, indirect), NULL,
	       "report", "--sort=calls", dir, NULL);
	expect("report --tid", 0, S("%s"
		"    3.000 us    0.970 us           1  worker\n"
		"    2.010 us    2.010 us           2  leaf\n"
		"    0.100 us    0.100 us           1  %s\n"
		"    0.030 us    0.020 us           1  middle\n", RHDR, indirect), NULL,
	       "report", "--tid", "1240", dir, NULL);

	expect("--tid unknown", 1, "", S("sptrace: replay: --tid: %s: no thread 999 in this "
					 "trace (it has 1234, 1240)\n", dir),
	       "replay", "--tid", "999", dir, NULL);
	expect("--depth 0", 2, "", "sptrace: replay: --depth '0': give a whole number of "
	       "levels, 1 or more\n", "replay", "--depth", "0", dir, NULL);
	expect("--since bad", 2, "", "sptrace: replay: --since '1.5h': give seconds since "
	       "tracing began (1.5, 200ms, 30us) or @EPOCH-SECONDS\n",
	       "replay", "--since", "1.5h", dir, NULL);
	expect("--since > --until", 2, "", "sptrace: replay: --since is after --until: nothing "
	       "to show\n", "replay", "--since", "2", "--until", "1", dir, NULL);
	expect("report --sort bad", 2, "", "sptrace: report: --sort 'name': use total, self or "
	       "calls\n", "report", "--sort", "name", dir, NULL);
	expect("no dir", 2, "", "sptrace: replay: no trace directory given; see 'sptrace "
	       "replay --help'\n", "replay", NULL);
	free(dir);
}

#define LOST_TEXT "5 of 13 records lost (38.5%) in 1 of 1 threads: 5 overwritten in a full " \
	"ring (flight-recorder mode keeps each thread's newest --ring-size MB); the trace is " \
	"incomplete"
#define LOST "# WARNING: " LOST_TEXT "\n"

static void test_lost(void)
{
	static const rec r[] = {
		E(S_MAIN, 0), E(S_MIDDLE, 100), E(S_LEAF, 200), X(S_LEAF, 300), X(S_MIDDLE, 400),
		E(S_FACT, 500), X(S_FACT, 600), E(S_MIDDLE, 700), E(S_LEAF, 800), X(S_LEAF, 900),
		X(S_MIDDLE, 1000), X(S_MAIN, 1100),
	};
	char *dir = standard_dir("lost");

	/* 13 records (the first SYNC too) in 8 slots: 5 lost.  Said first, on
	 * stdout and stderr, by replay and report alike. */
	write_ring(dir, 1234, 8, T0, r, N(r));
	expect("lost", 0, S("%s%s"
		"            [ 1234] | /* 5 records lost: the ring was full and overwrote its "
		"oldest */\n"
		"            [ 1234] | } /* middle (exit without a recorded entry) */\n"
		"   0.100 us [ 1234] | fact();\n"
		"            [ 1234] | middle() {\n"
		"   0.100 us [ 1234] |   leaf();\n"
		"   0.300 us [ 1234] | } /* middle */\n"
		"            [ 1234] | } /* main (exit without a recorded entry) */\n", LOST, HDR),
	       S("sptrace: replay: warning: %s\n", LOST_TEXT), "replay", dir, NULL);
	expect("report lost", 0, S("%s%s"
		"    0.300 us    0.200 us           1  middle\n"
		"    0.100 us    0.100 us           1  fact\n"
		"    0.100 us    0.100 us           1  leaf\n"
		"\n"
		"# 2 exits without a recorded entry are not counted\n", LOST, RHDR),
	       S("sptrace: report: warning: %s\n", LOST_TEXT), "report", dir, NULL);
	free(dir);
}

static void test_tscwrap(void)
{
	const uint64_t P = 1ull << 38;
	char *dir = standard_dir("tscwrap");
	tg_ring r;

	tg_ring_init(&r, 1234, 64, 5 * P - 1000);
	tg_put(&r, TRACE_ENTRY, S_MAIN, 5 * P - 500);
	tg_put(&r, TRACE_ENTRY, S_LEAF, 5 * P - 100);
	tg_put(&r, TRACE_EXIT, S_LEAF, 5 * P + 400);      /* after a SYNC */
	tg_put(&r, TRACE_ENTRY, S_WORKER, 5 * P + 500);
	tg_put(&r, TRACE_EXIT, S_WORKER, 8 * P + 500);    /* 3 periods later */
	tg_put(&r, TRACE_EXIT, S_MAIN, 8 * P + 1000);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	/* 3 * 2^38 ns = 824.633720832 s */
	expect("tscwrap", 0, S("%s"
		"            [ 1234] | main() {\n"
		"   0.500 us [ 1234] |   leaf();\n"
		" 824.633  s [ 1234] |   worker();\n"
		" 824.633  s [ 1234] | } /* main */\n", HDR), NULL, "replay", dir, NULL);
	free(dir);
}

static void test_noexit(void)
{
	static const rec r[] = {
		E(S_MAIN, 0), E(S_MIDDLE, 100), E(S_LEAF, 200), X(S_LEAF, 300), E(S_FACT, 400),
	};
	char *dir = standard_dir("noexit");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("noexit", 0, S("%s"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   middle() {\n"
		"   0.100 us [ 1234] |     leaf();\n"
		"   0.000 us [ 1234] |     fact(); /* no exit: the trace ended */\n"
		"   0.300 us [ 1234] |   } /* middle (no exit: the trace ended) */\n"
		"   0.400 us [ 1234] | } /* main (no exit: the trace ended) */\n", HDR),
	       NULL, "replay", dir, NULL);
	expect("report noexit", 0, S("%s"
		"    0.400 us    0.100 us           1  main\n"
		"    0.300 us    0.200 us           1  middle\n"
		"    0.100 us    0.100 us           1  leaf\n"
		"    0.000 us    0.000 us           1  fact\n"
		"\n"
		"# 3 calls had no exit (the trace ended, or a longjmp or exception unwound "
		"them): counted to the last record or the outer return\n", RHDR),
	       NULL, "report", dir, NULL);
	free(dir);
}

static void test_longjmp(void)
{
	static const rec r[] = {
		E(S_MAIN, 0), E(S_WORKER, 100), E(S_W_MIDDLE, 200), E(S_LEAF, 300),
		X(S_WORKER, 400),       /* worker caught what leaf threw */
		X(S_W_LEAF, 500),       /* nothing open for this site */
		E(S_DEEP, 600), E(S_DEEP_REC, 700), E(S_DEEP_REC, 800),
		X(S_MAIN, 900),         /* deep longjmp'ed back into main */
	};
	char *dir = standard_dir("longjmp");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("longjmp", 0, S("%s"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   worker() {\n"
		"            [ 1234] |     middle() {\n"
		"   0.100 us [ 1234] |       leaf(); /* no exit: unwound by longjmp or exception */\n"
		"   0.200 us [ 1234] |     } /* middle (no exit: unwound by longjmp or exception) */\n"
		"   0.300 us [ 1234] |   } /* worker */\n"
		"            [ 1234] |   } /* leaf (exit without a recorded entry) */\n"
		"            [ 1234] |   deep() {\n"
		"            [ 1234] |     deep() {\n"
		"   0.100 us [ 1234] |       deep(); /* no exit: unwound by longjmp or exception */\n"
		"   0.200 us [ 1234] |     } /* deep (no exit: unwound by longjmp or exception) */\n"
		"   0.300 us [ 1234] |   } /* deep (no exit: unwound by longjmp or exception) */\n"
		"   0.900 us [ 1234] | } /* main */\n", HDR), NULL, "replay", dir, NULL);
	free(dir);
}

static void test_tail(void)
{
	static const rec r[] = {
		E(S_MAIN, 0), E(S_MIDDLE, 100), E(S_TAIL, 200), X(S_MIDDLE, 500), X(S_MAIN, 600),
	};
	char *dir = standard_dir("tail");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("tail", 0, S("%s"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   middle() {\n"
		"   0.300 us [ 1234] |     leaf();\n"
		"   0.400 us [ 1234] |   } /* middle */\n"
		"   0.600 us [ 1234] | } /* main */\n", HDR), NULL, "replay", dir, NULL);
	expect("report tail", 0, S("%s"
		"    0.600 us    0.200 us           1  main\n"
		"    0.400 us    0.100 us           1  middle\n"
		"    0.300 us    0.300 us           1  leaf\n", RHDR), NULL, "report", dir, NULL);
	free(dir);
}

static void test_badsite(void)
{
	static const rec r[] = { E(S_MAIN, 0), E(99, 10), X(99, 20), X(S_MAIN, 30) };
	char *dir = standard_dir("badsite");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("badsite", 0, S("%s"
		"            [ 1234] | main() {\n"
		"   0.010 us [ 1234] |   ?site 99();\n"
		"   0.030 us [ 1234] | } /* main */\n", HDR),
	       S("sptrace: replay: warning: %s/ring.1234: 2 records name site ids the sites "
		 "file (ids 1-%d) does not have; shown as '?site <id>'\n", dir, S_COUNT - 1),
	       "replay", dir, NULL);
	free(dir);
}

static void test_events(void)
{
	static const rec r[] = {
		EV(TRACE_EV_ACTIVATE, 0), E(S_MAIN, 0), EV(TRACE_EV_SIGNAL, 100), EV(99, 200),
	};
	char *dir = standard_dir("events");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("events", 0, S("%s"
		"            [ 1234] | /* activate */\n"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   /* signal */\n"
		"            [ 1234] |   /* event 99 */\n"
		"   0.200 us [ 1234] | } /* main (no exit: the trace ended) */\n", HDR),
	       NULL, "replay", dir, NULL);
	free(dir);
}

/* The "ts" of the first Chrome event of phase `ph` in json (microseconds),
 * -1 if none. */
static double chrome_ts(const char *json, const char *ph)
{
	char key[32];
	const char *p;

	snprintf(key, sizeof key, "\"ph\":\"%s\",\"ts\":", ph);
	p = strstr(json, key);
	return p ? strtod(p + strlen(key), NULL) : -1;
}

/*
 * sptrace export: a send is stamped when its call began but recorded when
 * the call returned, after the calls it made meanwhile (trace_format.h,
 * "Message events").  Thread 1234's middle() writes 10 bytes into a pipe:
 * the send stamped at 200 ns, leaf() (the C library around the system call)
 * from 300 to 400 ns, the send recorded after it; thread 1235 reads them at
 * 350 ns.  The arrow starts at 200 ns, inside middle() (written at the
 * call's return, 400 ns, it pointed back to the receive).
 */
static void test_export_send(void)
{
	char *dir = standard_dir("export-send"), *out, *err;
	char *argv[] = { (char *)sptrace, "export", dir, "--format", "chrome", "-o", "-", "-q",
			 NULL };
	static const char middle[] = "{\"name\":\"middle\",\"ph\":\"X\",\"ts\":";
	trace_channel ch[2];
	tg_ring r;
	double s_ts, f_ts, begin;
	const char *p;
	int rc;

	memset(ch, 0, sizeof ch);
	ch[0].proto = 2;
	ch[0].pid = sizeof(trace_channel);
	ch[1] = (trace_channel){ .proto = TRACE_PROTO_PIPE, .pid = 1234, .inode = 777 };
	tg_write(dir, "channels", ch, sizeof ch);
	tg_ring_init(&r, 1234, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T0);
	tg_put(&r, TRACE_ENTRY, S_MAIN, T0 + 10);
	tg_put(&r, TRACE_ENTRY, S_MIDDLE, T0 + 100);
	tg_put(&r, TRACE_ENTRY, S_LEAF, T0 + 300);
	tg_put(&r, TRACE_EXIT, S_LEAF, T0 + 400);
	tg_put_msg(&r, TRACE_EV_MSG_SEND, T0 + 200, 1, TRACE_CALL_WRITE, 0, 0, 10);
	tg_put(&r, TRACE_EXIT, S_MIDDLE, T0 + 500);
	tg_put(&r, TRACE_EXIT, S_MAIN, T0 + 900);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);
	tg_ring_init(&r, 1235, 64, TG_TSC0);
	tg_put(&r, TRACE_EVENT, TRACE_EV_ACTIVATE, T0);
	tg_put(&r, TRACE_ENTRY, S_WORKER, T0 + 50);
	tg_put_msg(&r, TRACE_EV_MSG_RECV, T0 + 350, 1, TRACE_CALL_READ, 0, 0, 10);
	tg_put(&r, TRACE_EXIT, S_WORKER, T0 + 800);
	tg_ring_write(&r, dir, NULL, -1);
	tg_ring_free(&r);

	rc = tg_run(argv, &out, &err);
	s_ts = chrome_ts(out, "s");
	f_ts = chrome_ts(out, "f");
	begin = (p = strstr(out, middle)) ? strtod(p + strlen(middle), NULL) : -1;
	if (rc != 0 || s_ts < 0 || f_ts < 0 || begin < 0 || f_ts - s_ts < 0.149 ||
	    f_ts - s_ts > 0.151 || s_ts - begin < 0.099 || s_ts - begin > 0.101) {
		fprintf(stderr, "test_replay: FAIL: export-send: exit %d; the arrow from %.3f to "
			"%.3f us (expected 0.150 us apart), middle() at %.3f us (the send 0.100 us "
			"after)\n--- stdout:\n%s--- stderr:\n%s---\n", rc, s_ts, f_ts, begin, out,
			err);
		failures++;
	}
	free(out);
	free(err);
	free(dir);
}

/*
 * A coroutine (swapcontext): main's middle() switches to a new stack where
 * worker() runs and switches back from inside leaf(); the second middle()
 * switches to it again, and worker returns to its uc_link.  The calls left
 * on the coroutine's stack are suspended, then continued, never unwound;
 * report counts each call once and its time on its stack.
 */
static void test_contexts(void)
{
	enum { K_MAIN = 11, K_CO = 22 };
	static const rec r[] = {
		E(S_MAIN, 0), E(S_MIDDLE, 100), CTX(SAVE, K_MAIN), CTX(LOAD, K_CO),
		E(S_WORKER, 200), E(S_W_LEAF, 300), CTX(SAVE, K_CO), CTX(LOAD, K_MAIN),
		X(S_MIDDLE, 400), E(S_MIDDLE, 500), CTX(SAVE, K_MAIN), CTX(LOAD, K_CO),
		X(S_W_LEAF, 600), X(S_WORKER, 700), CTX(LOAD, K_MAIN), X(S_MIDDLE, 800),
		CTX(SAVE, K_MAIN), CTX(LOAD, K_MAIN), X(S_MAIN, 900),
	};
	char *dir = standard_dir("contexts");

	write_ring(dir, 1234, 64, T0, r, N(r));
	expect("contexts", 0, S("%s"
		"            [ 1234] | main() {\n"
		"            [ 1234] |   middle() {\n"
		"            [ 1234] |     /* switched to stack 1 (new) */\n"
		"            [ 1234] |     worker() {\n"
		"   0.000 us [ 1234] |       leaf(); /* suspended: the thread switched stacks */\n"
		"   0.100 us [ 1234] |     } /* worker (suspended: the thread switched stacks) */\n"
		"            [ 1234] |     /* switched to the thread's own stack */\n"
		"   0.300 us [ 1234] |   } /* middle */\n"
		"            [ 1234] |   middle() {\n"
		"            [ 1234] |     /* switched to stack 1 */\n"
		"            [ 1234] |     worker() { /* continued */\n"
		"   0.100 us [ 1234] |       leaf(); /* continued */\n"
		"   0.200 us [ 1234] |     } /* worker */\n"
		"            [ 1234] |     /* switched to the thread's own stack */\n"
		"   0.300 us [ 1234] |   } /* middle */\n"
		"   0.900 us [ 1234] | } /* main */\n", HDR), NULL, "replay", dir, NULL);
	expect("report contexts", 0, S("%s"
		"    0.900 us    0.300 us           1  main\n"
		"    0.600 us    0.300 us           2  middle\n"
		"    0.300 us    0.200 us           1  worker\n"
		"    0.100 us    0.100 us           1  leaf\n", RHDR), NULL, "report", dir, NULL);
	free(dir);
}

/*
 * C++ names (traced_cxx.cpp) in each --demangle style.  A full name has its
 * parameters, so replay adds no "()" after it, as uftrace does.
 */
static void test_cxx(void)
{
	static const rec r[] = {
		E(X_MAIN, 0), E(X_GET, 100), X(X_GET, 110), E(X_ADD, 200), X(X_ADD, 220),
		E(X_LESS, 300), X(X_LESS, 330), E(X_CALL, 400), X(X_CALL, 440),
		E(X_BIGGEST, 500), X(X_BIGGEST, 550), E(X_LAMBDA, 600), X(X_LAMBDA, 660),
		E(X_HELPER, 700), X(X_HELPER, 770), E(X_PLAIN, 800), X(X_PLAIN, 880),
		E(X_APPLY, 900), E(X_APPLY_F, 910), X(X_APPLY_F, 1000), X(X_APPLY, 1100),
		E(X_NEW, 1200), X(X_NEW, 1300), E(X_DELETE, 1400), X(X_DELETE, 1510),
		E(X_DTOR, 1600), X(X_DTOR, 1720), X(X_MAIN, 2000),
	};
	/* Each style's names, in the order of the sites. */
	static const char *const names[3][X_COUNT] = {
		{ "", "main", "ns::Box::get", "ns::Vec::operator+=", "ns::Vec::operator<",
		  "ns::Vec::operator()", "ns::biggest", "main::{lambda(int)#1}::operator()",
		  "(anonymous namespace)::helper", "plain_c", "ns::apply",
		  "<indirect@ns::apply+0x%" PRIx64 ">", "operator new@plt",
		  "operator delete@plt", "ns::Vec::~Vec" },
		{ "", "main", "ns::Box<long>::get(int) const",
		  "ns::Vec::operator+=(ns::Vec const&)", "ns::Vec::operator<(ns::Vec const&) const",
		  "ns::Vec::operator()(int) const", "long ns::biggest<long>(long, long)",
		  "main::{lambda(int)#1}::operator()(int) const",
		  "(anonymous namespace)::helper(int)", "plain_c", "ns::apply(int (*)(int), int)",
		  "<indirect@ns::apply(int (*)(int), int)+0x%" PRIx64 ">",
		  "operator new(unsigned long)@plt", "operator delete(void*, unsigned long)@plt",
		  "ns::Vec::~Vec()" },
		{ "", "main", "_ZNK2ns3BoxIlE3getEi", "_ZN2ns3VecpLERKS0_", "_ZNK2ns3VecltERKS0_",
		  "_ZNK2ns3VecclEi", "_ZN2ns7biggestIlEET_S1_S1_", "_ZZ4mainENKUliE_clEi",
		  "_ZN12_GLOBAL__N_16helperEi", "plain_c", "_ZN2ns5applyEPFiiEi",
		  "<indirect@_ZN2ns5applyEPFiiEi+0x%" PRIx64 ">", "_Znwm@plt", "_ZdlPvm@plt",
		  "_ZN2ns3VecD2Ev" },
	};
	static const char *const style[3] = { "--demangle=simple", "--demangle=full",
					      "--demangle=no" };
	trace_site s[X_COUNT];
	char *dir = tg_dir(root, "cxx");
	uint64_t off;

	tg_cxx_sites(cxx_prog, s);
	tg_meta(dir, cxx_prog, "");
	tg_write_sites(dir, s, X_COUNT);
	write_ring(dir, 1234, 64, T0, r, N(r));
	off = s[X_APPLY_F].site_addr - s[X_APPLY_F].caller_func;

	for (int k = 0; k < 3; k++) {
		const char *const *n = names[k];
		/* A full name (not main's, plain_c's or the indirect one) has its
		 * parameters: no "()" is added. */
		const char *pp = k == 1 ? "" : "()";
		char indirect[128], *replay, *report;

		snprintf(indirect, sizeof indirect, n[X_APPLY_F], off);
		if (asprintf(&replay, "%s"
			"            [ 1234] | main() {\n"
			"   0.010 us [ 1234] |   %s%s;\n"
			"   0.020 us [ 1234] |   %s%s;\n"
			"   0.030 us [ 1234] |   %s%s;\n"
			"   0.040 us [ 1234] |   %s%s;\n"
			"   0.050 us [ 1234] |   %s%s;\n"
			"   0.060 us [ 1234] |   %s%s;\n"
			"   0.070 us [ 1234] |   %s%s;\n"
			"   0.080 us [ 1234] |   plain_c();\n"
			"            [ 1234] |   %s%s {\n"
			"   0.090 us [ 1234] |     %s();\n"
			"   0.200 us [ 1234] |   } /* %s */\n"
			"   0.100 us [ 1234] |   %s%s;\n"
			"   0.110 us [ 1234] |   %s%s;\n"
			"   0.120 us [ 1234] |   %s%s;\n"
			"   2.000 us [ 1234] | } /* main */\n", HDR,
			n[X_GET], pp, n[X_ADD], pp, n[X_LESS], pp, n[X_CALL], pp, n[X_BIGGEST], pp,
			n[X_LAMBDA], pp, n[X_HELPER], pp, n[X_APPLY], pp, indirect, n[X_APPLY],
			n[X_NEW], pp, n[X_DELETE], pp, n[X_DTOR], pp) < 0 ||
		    asprintf(&report, "%s"
			"    2.000 us    1.110 us           1  main\n"
			"    0.200 us    0.110 us           1  %s\n"
			"    0.120 us    0.120 us           1  %s\n"
			"    0.110 us    0.110 us           1  %s\n"
			"    0.100 us    0.100 us           1  %s\n"
			"    0.090 us    0.090 us           1  %s\n"
			"    0.080 us    0.080 us           1  plain_c\n"
			"    0.070 us    0.070 us           1  %s\n"
			"    0.060 us    0.060 us           1  %s\n"
			"    0.050 us    0.050 us           1  %s\n"
			"    0.040 us    0.040 us           1  %s\n"
			"    0.030 us    0.030 us           1  %s\n"
			"    0.020 us    0.020 us           1  %s\n"
			"    0.010 us    0.010 us           1  %s\n", RHDR,
			n[X_APPLY], n[X_DTOR], n[X_DELETE], n[X_NEW], indirect, n[X_HELPER],
			n[X_LAMBDA], n[X_BIGGEST], n[X_CALL], n[X_LESS], n[X_ADD], n[X_GET]) < 0)
			tg_die("out of memory");
		expect(S("cxx replay %s", style[k]), 0, replay, NULL, "replay", style[k], dir, NULL);
		expect(S("cxx report %s", style[k]), 0, report, NULL, "report", dir, "--demangle",
		       style[k] + 11, NULL);
		if (k == 0) {   /* simple is the default */
			expect("cxx replay, default", 0, replay, NULL, "replay", dir, NULL);
			expect("cxx report, default", 0, report, NULL, "report", dir, NULL);
		}
		free(replay);
		free(report);
	}
	expect("--demangle bad", 2, "", "sptrace: replay: --demangle 'yes': use simple, full or "
	       "no\n", "replay", "--demangle=yes", dir, NULL);
	expect("report --demangle bad", 2, "", "sptrace: report: --demangle 'short': use simple, "
	       "full or no\n", "report", "--demangle", "short", dir, NULL);
	free(dir);
}

/* A good ring 1234 and a bad ring 1240: nothing may be printed. */
static void bad_ring(const char *name, void (*edit)(trace_ring_header *), long size,
		     const char *why)
{
	static const rec r[] = { E(S_MAIN, 0), X(S_MAIN, 10) };
	char *dir = standard_dir(name);
	trace_ring_header h;
	tg_ring ring;

	write_ring(dir, 1234, 8, T0, r, N(r));
	tg_ring_init(&ring, 1240, 8, TG_TSC0);
	tg_ring_header(&ring, &h);
	if (edit)
		edit(&h);
	tg_ring_write(&ring, dir, &h, size);
	tg_ring_free(&ring);
	expect(name, 1, "", S("sptrace: replay: %s/ring.1240: %s\n", dir, why), "replay", dir,
	       NULL);
	free(dir);
}

/* A ring the agent was making when the process died (0 bytes, or a header
 * of zeros): skipped with a warning, the other threads replayed. */
static void empty_ring(const char *name, void (*edit)(trace_ring_header *), long size)
{
	static const rec r[] = { E(S_MAIN, 0), X(S_MAIN, 10) };
	char *dir = standard_dir(name);
	trace_ring_header h;
	tg_ring ring;

	write_ring(dir, 1234, 8, T0, r, N(r));
	tg_ring_init(&ring, 1240, 8, TG_TSC0);
	tg_ring_header(&ring, &h);
	if (edit)
		edit(&h);
	tg_ring_write(&ring, dir, &h, size);
	tg_ring_free(&ring);
	expect(name, 0, "# DURATION     TID     FUNCTION\n   0.010 us [ 1234] | main();\n",
	       S("sptrace: replay: warning: %s/ring.1240: ignored: an empty ring (the thread ended "
		 "while its ring was being made)\n", dir), "replay", dir, NULL);
	free(dir);
}

static void zero_header(trace_ring_header *h) { memset(h, 0, sizeof *h); }
static void bad_magic(trace_ring_header *h) { h->magic = 0x4141414141414141ull; }
static void bad_version(trace_ring_header *h) { h->version = 3; }
static void bad_capacity(trace_ring_header *h) { h->capacity = 6; h->mask = 5; }
static void bad_mask(trace_ring_header *h) { h->mask = 3; }
static void bad_count(trace_ring_header *h) { h->count = 1ull << 60; }
static void bad_header_size(trace_ring_header *h) { h->header_size = 12; }

static void bad_meta_len(const char *name, const char *text, size_t len, const char *why)
{
	char *dir = tg_dir(root, name);
	static const rec r[] = { E(S_MAIN, 0), X(S_MAIN, 10) };

	tg_write(dir, "meta", text, len);
	tg_write_sites(dir, sites, S_COUNT);
	write_ring(dir, 1234, 8, T0, r, N(r));
	expect(name, 1, "", S("sptrace: replay: %s/meta%s\n", dir, why), "replay", dir, NULL);
	free(dir);
}

static void bad_meta(const char *name, const char *text, const char *why)
{
	bad_meta_len(name, text, strlen(text), why);
}

static void test_errors(void)
{
	char *dir, path[4200];

	bad_ring("bad-magic", bad_magic, -1, "not an sptrace ring (magic 0x4141414141414141, "
		 "expected 0x31474e4952505354)");
	bad_ring("bad-version", bad_version, -1, "ring format version 3; this sptrace reads "
		 "versions 1 to 2: read it with the sptrace that wrote it, or a newer one");
	bad_ring("bad-capacity", bad_capacity, -1, "corrupt header: capacity 6 is not a power "
		 "of two up to 2^36");
	bad_ring("bad-mask", bad_mask, -1, "corrupt header: mask 0x3 does not match capacity 8");
	bad_ring("bad-count", bad_count, -1, "corrupt header: write count 1152921504606846976 "
		 "is implausible (over 2^56 records)");
	bad_ring("bad-header-size", bad_header_size, -1, "corrupt header: header size 12");
	bad_ring("truncated", NULL, 4096 + 8 * 8 - 3, "truncated: 4157 bytes, but its header "
		 "says 8 records (4160 bytes with the header)");
	bad_ring("truncated-header", NULL, 50, "truncated: 50 bytes, shorter than a ring "
		 "header (120)");
	empty_ring("empty-ring", NULL, 0);
	empty_ring("zero-header", zero_header, -1);

	dir = standard_dir("no-sites");
	write_ring(dir, 1234, 8, T0, NULL, 0);
	snprintf(path, sizeof path, "%s/sites", dir);
	unlink(path);
	expect("no sites", 1, "", S("sptrace: replay: %s/sites: cannot read: No such file or "
				    "directory (the agent writes it with the first instrumented "
				    "site; without it no call can be named)\n", dir),
	       "replay", dir, NULL);
	expect("report, no sites", 1, "", S("sptrace: report: %s/sites: cannot read: No such "
					    "file or directory (the agent writes it with the first "
					    "instrumented site; without it no call can be named)\n",
					    dir), "report", dir, NULL);
	snprintf(path, sizeof path, "%s/meta", dir);
	unlink(path);
	expect("no meta", 1, "", S("sptrace: replay: %s/meta: cannot read: No such file or "
				   "directory (is this a trace directory?)\n", dir),
	       "replay", dir, NULL);
	expect("not a dir", 1, "", S("sptrace: replay: %s/ring.1234: not a directory (a trace "
				     "is a directory holding meta, sites and ring.<tid> "
				     "files)\n", dir),
	       "replay", S("%s/ring.1234", dir), NULL);
	free(dir);

	bad_meta("meta-version", "version 3\ntsc_hz 1\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n",
		 ": trace format version '3'; this sptrace reads versions 1 to 2: read it with "
		 "the sptrace that wrote it, or a newer one");
	bad_meta("meta-no-hz", "version 1\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n",
		 ": no 'tsc_hz' line (the TSC frequency); the agent writes it when the trace "
		 "starts, so the file is incomplete");
	bad_meta("meta-hz-zero", "version 1\ntsc_hz 0\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n",
		 ": 'tsc_hz' is 0; the TSC frequency must be positive");
	bad_meta("meta-bad-number", "version 1\ntsc_hz 3.2e9\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n",
		 ": 'tsc_hz' is '3.2e9', not an unsigned decimal number");
	bad_meta("meta-module", "version 1\ntsc_hz 1\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n"
		 "module 0 /bin/true\n",
		 ":6: malformed module line (expected 'module <index> <path> <key> <bias-hex>')");
	bad_meta("meta-module-key", "version 1\ntsc_hz 1\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n"
		 "module 0 /bin/true ../../etc 0\n",
		 ":6: module key '../../etc' is not a build-id or content hash");
	bad_meta("meta-module-twice", "version 1\ntsc_hz 1\ntsc0 0\nmono0_ns 0\nreal0_ns 0\n"
		 "module 0 /bin/true abc 0\nmodule 0 /bin/false abd 0\n",
		 ":7: module index 0 appears twice (also line 6)");
	bad_meta("meta-empty", "", ": empty; the agent writes it when the trace starts");
	bad_meta_len("meta-nul", "version 1\n\0\n", 12, ": holds a NUL byte: not a meta file, or a "
		 "corrupt one");
}

int main(int argc, char **argv)
{
	char repo[sizeof root + 8];

	if (argc != 4) {
		fprintf(stderr, "usage: test_replay SPTRACE TRACED-PROGRAM TRACED-CXX-PROGRAM\n");
		return 2;
	}
	sptrace = argv[1];
	prog = argv[2];
	cxx_prog = argv[3];
	if (!mkdtemp(root))
		tg_die("mkdtemp: %m");
	snprintf(repo, sizeof repo, "%s/repo", root);
	setenv("SPTRACE_REPO", repo, 1);
	tg_sites(prog, sites);
	snprintf(indirect, sizeof indirect, "<indirect@main+0x%" PRIx64 ">",
		 sites[S_HOOK].site_addr - sites[S_HOOK].caller_func);

	test_basic();
	test_lost();
	test_tscwrap();
	test_noexit();
	test_longjmp();
	test_tail();
	test_badsite();
	test_events();
	test_export_send();
	test_contexts();
	test_cxx();
	test_errors();

	tg_rmtree(root);
	ca_module_free((ca_module *)tg_prog());
	ca_module_free((ca_module *)tg_cxx_prog());
	if (failures) {
		fprintf(stderr, "test_replay: %d failures\n", failures);
		return 1;
	}
	printf("test_replay: all passed\n");
	return 0;
}
