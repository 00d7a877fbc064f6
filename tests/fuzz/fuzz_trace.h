/*
 * tests/fuzz/fuzz_trace.h — the input format of fuzz_trace.c, shared with
 * the seed writer trace_seed.c: meta, sites, ring.1, seg.1, channels and packed.1, one
 * after the other, separated by this string (absent from real trace files' text and
 * unlikely in their binary parts).
 */
#ifndef FUZZ_TRACE_H
#define FUZZ_TRACE_H

#define FUZZ_TRACE_SEP "\n#-sptrace-fuzz-file-#\n"

#endif
