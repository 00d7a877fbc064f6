/*
 * bench/analyze_bench.c — how fast the codeanalysis library analyses a file
 * and reads its repository entry back, quoted against capstone's linear
 * sweep of the same file measured in the same run.
 *
 *   analyze_bench [-n RUNS] [-l LOADS] [--analyze-only [--no-lines]] FILE...
 *
 * For each file, RUNS rounds (default 5), each round in turn: one linear
 * sweep (sweep.c), one ca_analyze with source lines, one without.  Taking the
 * three in the same round spreads the noise of a shared machine over all of
 * them alike, so the ratios hold better than the absolute times.  Then the
 * module is stored in a temporary repository and loaded back LOADS times
 * (default 20).  Prints Markdown tables.
 *
 * --analyze-only runs ca_analyze (with lines, unless --no-lines) RUNS times
 * and nothing else: the mode for
 * `valgrind --tool=callgrind --toggle-collect=ca_analyze`.
 */
#include "codeanalysis.h"
#include "sweep.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RUNS 1000

/* Everything measured for one file. */
typedef struct result {
	const char *path;
	ca_stats st;              /* of the analysis with lines */
	bench_sweep sweep;        /* of the last sweep */
	uint64_t t_lines[MAX_RUNS], t_nolines[MAX_RUNS], t_sweep[MAX_RUNS];
	uint64_t lines_ns[MAX_RUNS];
	uint64_t t_load[MAX_RUNS];
	uint64_t store_ns, entry_bytes;
	char lines_from[256];
} result;

static void usage(void)
{
	fprintf(stderr, "usage: analyze_bench [-n RUNS] [-l LOADS] [--analyze-only [--no-lines]] FILE...\n");
	exit(2);
}

static double s_of(uint64_t ns)
{
	return (double)ns / 1e9;
}

/* One ca_analyze; returns its wall time in ns (0 on error).  Keeps the stats
 * of the run if `st` is given. */
static uint64_t analyze_once(const char *path, int no_lines, ca_stats *st, uint64_t *lines_ns,
			     char *lines_from, size_t lflen)
{
	ca_options opt = { .no_lines = no_lines };
	ca_module *m;
	sp_err err;
	uint64_t t0 = sp_now_ns(), t;

	if (ca_analyze(path, &opt, &m, &err)) {
		fprintf(stderr, "analyze_bench: %s\n", err.msg);
		return 0;
	}
	t = sp_now_ns() - t0;
	if (st)
		*st = *ca_module_stats(m);
	if (lines_ns)
		*lines_ns = ca_module_stats(m)->lines_ns;
	if (lines_from)
		snprintf(lines_from, lflen, "%s", ca_module_lines_source(m));
	ca_module_free(m);
	return t;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	return remove(path) < 0 ? -1 : 0;
}

/* Remove the temporary repository, however the library lays it out. */
static void remove_tree(const char *dir)
{
	if (nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) < 0)
		fprintf(stderr, "analyze_bench: cannot remove %s: %m\n", dir);
}

/* Store the analysis of r->path in a fresh temporary repository, load it
 * back `loads` times, remove the repository. */
static int bench_repo(result *r, int loads)
{
	char dir[] = "/tmp/sptrace-bench-repo.XXXXXX", entry[4096];
	ca_options opt = { 0 };
	ca_module *m, *back;
	struct stat st;
	sp_err err;
	uint64_t t0;
	int rc = -1;

	if (!mkdtemp(dir)) {
		perror("analyze_bench: mkdtemp");
		return -1;
	}
	if (ca_analyze(r->path, &opt, &m, &err)) {
		fprintf(stderr, "analyze_bench: %s\n", err.msg);
		remove_tree(dir);
		return -1;
	}
	t0 = sp_now_ns();
	if (ca_repo_store(m, dir, entry, sizeof entry, &err)) {
		fprintf(stderr, "analyze_bench: storing %s: %s\n", r->path, err.msg);
		goto out;
	}
	r->store_ns = sp_now_ns() - t0;
	if (stat(entry, &st) == 0)
		r->entry_bytes = (uint64_t)st.st_size;
	for (int i = 0; i < loads; i++) {
		t0 = sp_now_ns();
		if (ca_repo_load(dir, ca_module_key(m), &back, &err) != 0) {
			fprintf(stderr, "analyze_bench: loading %s back: %s\n", r->path, err.msg);
			goto out;
		}
		r->t_load[i] = sp_now_ns() - t0;
		ca_module_free(back);
	}
	rc = 0;
out:
	ca_module_free(m);
	remove_tree(dir);
	return rc;
}

/* Measure one file: `runs` interleaved rounds, then the repository. */
static int bench_file(result *r, int runs, int loads)
{
	sp_err err;

	for (int i = 0; i < runs; i++) {
		if (bench_sweep_file(r->path, &r->sweep, &err)) {
			fprintf(stderr, "analyze_bench: %s\n", err.msg);
			return -1;
		}
		r->t_sweep[i] = r->sweep.ns;
		r->t_lines[i] = analyze_once(r->path, 0, &r->st, &r->lines_ns[i],
					     r->lines_from, sizeof r->lines_from);
		r->t_nolines[i] = analyze_once(r->path, 1, NULL, NULL, NULL, 0);
		if (!r->t_lines[i] || !r->t_nolines[i])
			return -1;
	}
	return bench_repo(r, loads);
}

static void print_tables(result *rs, size_t nfiles, int runs, int loads)
{
	size_t i;

	printf("### Analysis (ca_analyze, %d runs per file; times in s, MB = 10^6 bytes of code)\n\n", runs);
	printf("| file | code MB | decoded | functions | instructions | lines | median | min | functions/s | MB/s | of which lines (median) |\n");
	printf("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
	for (i = 0; i < nfiles; i++) {
		result *r = &rs[i];
		double mb = (double)r->st.text_bytes / 1e6;
		double ml = s_of(bench_median(r->t_lines, runs));
		double mn = s_of(bench_median(r->t_nolines, runs));
		double dec = r->st.text_bytes ? 100.0 * (double)r->st.decoded_bytes / (double)r->st.text_bytes : 0;

		printf("| %s | %.2f | %.1f%% | %u | %u | with (%u rows) | %.3f | %.3f | %.0f | %.2f | %.3f |\n",
		       r->path, mb, dec, r->st.nfuncs, r->st.ninsns, r->st.nlines, ml,
		       s_of(bench_min(r->t_lines, runs)), r->st.nfuncs / ml, mb / ml,
		       s_of(bench_median(r->lines_ns, runs)));
		printf("| %s | %.2f | %.1f%% | %u | %u | without | %.3f | %.3f | %.0f | %.2f | — |\n",
		       r->path, mb, dec, r->st.nfuncs, r->st.ninsns, mn,
		       s_of(bench_min(r->t_nolines, runs)), r->st.nfuncs / mn, mb / mn);
	}
	printf("\n### Against capstone's linear sweep of the same file, same rounds\n\n");
	printf("| file | sweep median s | sweep min s | sweep insns | sweep M insns/s | "
	       "analysis ÷ sweep (without lines) | analysis ÷ sweep (with lines) | "
	       "min ÷ min (without lines) |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
	for (i = 0; i < nfiles; i++) {
		result *r = &rs[i];
		uint64_t smin = bench_min(r->t_sweep, runs), nmin = bench_min(r->t_nolines, runs);
		double sm = s_of(bench_median(r->t_sweep, runs));

		printf("| %s | %.3f | %.3f | %llu | %.2f | %.2f | %.2f | %.2f |\n", r->path, sm,
		       s_of(smin), (unsigned long long)r->sweep.ninsns,
		       (double)r->sweep.ninsns / sm / 1e6,
		       s_of(bench_median(r->t_nolines, runs)) / sm,
		       s_of(bench_median(r->t_lines, runs)) / sm, (double)nmin / (double)smin);
	}
	printf("\n### Repository entry (ca_repo_store once, ca_repo_load %d times; warm page cache)\n\n", loads);
	printf("| file | key | entry bytes | store ms | load median ms | load min ms |\n");
	printf("|---|---|---:|---:|---:|---:|\n");
	for (i = 0; i < nfiles; i++) {
		result *r = &rs[i];
		char key[200];
		sp_err err;

		if (ca_module_key_of(r->path, key, sizeof key, &err))
			snprintf(key, sizeof key, "?");
		printf("| %s | %.16s… | %llu | %.2f | %.3f | %.3f |\n", r->path, key,
		       (unsigned long long)r->entry_bytes, (double)r->store_ns / 1e6,
		       (double)bench_median(r->t_load, loads) / 1e6,
		       (double)bench_min(r->t_load, loads) / 1e6);
	}
	printf("\nSource lines came from: ");
	for (i = 0; i < nfiles; i++)
		printf("%s%s → %s", i ? "; " : "", rs[i].path,
		       rs[i].lines_from[0] ? rs[i].lines_from : "(none found)");
	printf("\n");
}

int main(int argc, char **argv)
{
	int runs = 5, loads = 20, analyze_only = 0, no_lines = 0, i = 1, rc = 0;
	size_t nfiles;
	struct rusage ru;
	result *rs;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
			runs = atoi(argv[++i]);
		else if (strcmp(argv[i], "-l") == 0 && i + 1 < argc)
			loads = atoi(argv[++i]);
		else if (strcmp(argv[i], "--analyze-only") == 0)
			analyze_only = 1;
		else if (strcmp(argv[i], "--no-lines") == 0)
			no_lines = 1;
		else
			usage();
	}
	if (i == argc || runs < 1 || runs > MAX_RUNS || loads < 1 || loads > MAX_RUNS)
		usage();
	nfiles = (size_t)(argc - i);
	if (analyze_only) {
		for (size_t f = 0; f < nfiles; f++)
			for (int k = 0; k < runs; k++)
				if (!analyze_once(argv[i + f], no_lines, NULL, NULL, NULL, 0))
					return 1;
		return 0;
	}
	rs = calloc(nfiles, sizeof *rs);
	if (!rs)
		return 1;
	for (size_t f = 0; f < nfiles; f++) {
		rs[f].path = argv[i + f];
		if (bench_file(&rs[f], runs, loads))
			return 1;
	}
	print_tables(rs, nfiles, runs, loads);
	if (getrusage(RUSAGE_SELF, &ru) == 0)
		printf("\nPeak RSS of the benchmark process: %.1f MB\n", (double)ru.ru_maxrss / 1024);
	free(rs);
	return rc;
}
