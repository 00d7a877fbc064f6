/*
 * bench/sweep.h — the "one decoding pass" floor: a linear sweep of every
 * executable section of an ELF file with capstone, using the same settings
 * as the analyser (x86-64, CS_OPT_DETAIL on, cs_disasm_iter).  Shared by
 * capstone_baseline.c and analyze_bench.c so both measure the same thing.
 */
#ifndef BENCH_SWEEP_H
#define BENCH_SWEEP_H

#include <stdint.h>

#include "sp.h"

typedef struct bench_sweep {
	uint64_t text_bytes;   /* bytes of executable sections (as ca_stats) */
	uint64_t ninsns;       /* instructions decoded */
	uint64_t skipped;      /* bytes capstone could not decode (skipped one by one) */
	uint64_t nsecs;        /* executable sections swept */
	uint64_t ns;           /* wall time: open, read sections, decode, close */
	uint64_t decode_ns;    /* of which decoding only */
} bench_sweep;

/* Sweep `path` once.  Returns 0, or -1 with err set. */
int bench_sweep_file(const char *path, bench_sweep *out, sp_err *err);

/* Median and minimum of n timings (sorts v in place). */
uint64_t bench_median(uint64_t *v, int n);
uint64_t bench_min(const uint64_t *v, int n);

#endif
