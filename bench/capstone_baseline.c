/*
 * bench/capstone_baseline.c — how fast capstone alone decodes a file: a
 * linear sweep of every executable section, with the analyser's settings
 * (detail on, cs_disasm_iter).  This is the floor for "one decoding pass per
 * byte": analyze_bench quotes the analysis time as a multiple of it.
 *
 *   capstone_baseline [-n RUNS] FILE...
 *
 * Prints a Markdown table: one row per file, median and minimum wall time
 * over RUNS sweeps, instructions/s and MB/s of code at the median.
 */
#include "sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 1000

static void usage(void)
{
	fprintf(stderr, "usage: capstone_baseline [-n RUNS] FILE...\n");
	exit(2);
}

/* Sweep `path` `runs` times and print its table row.  Returns 0 or -1. */
static int bench_file(const char *path, int runs)
{
	uint64_t total[MAX_RUNS], decode[MAX_RUNS];
	bench_sweep s;
	sp_err err;
	double med, dec;

	for (int i = 0; i < runs; i++) {
		if (bench_sweep_file(path, &s, &err)) {
			fprintf(stderr, "capstone_baseline: %s\n", err.msg);
			return -1;
		}
		total[i] = s.ns;
		decode[i] = s.decode_ns;
	}
	med = (double)bench_median(total, runs) / 1e9;
	dec = (double)bench_median(decode, runs) / 1e9;
	printf("| %s | %.2f | %llu | %llu | %.3f | %.3f | %.3f | %.2f | %.2f |\n",
	       path, (double)s.text_bytes / 1e6, (unsigned long long)s.ninsns,
	       (unsigned long long)s.skipped, med, (double)bench_min(total, runs) / 1e9,
	       dec, (double)s.ninsns / med / 1e6, (double)s.text_bytes / med / 1e6);
	return 0;
}

int main(int argc, char **argv)
{
	int runs = 5, i = 1, rc = 0;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
			runs = atoi(argv[++i]);
		else
			usage();
	}
	if (i == argc || runs < 1 || runs > MAX_RUNS)
		usage();
	printf("capstone linear sweep, detail on, %d runs per file (times in s, MB = 10^6 bytes)\n\n", runs);
	printf("| file | code MB | instructions | undecodable bytes | median | min | "
	       "decode only (median) | M insns/s | MB/s |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (; i < argc; i++)
		if (bench_file(argv[i], runs))
			rc = 1;
	return rc;
}
