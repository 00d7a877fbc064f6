/*
 * export.h — what `sptrace export` (cmd_export.c) shares with its writers,
 * one file per format: export_perfetto.c, export_chrome.c.
 *
 * cmd_export.c walks the session, thread after thread, and calls a writer's
 * functions in an order every format can rely on:
 *   - a process before any of its threads, a thread before any of its
 *     events (each once, ids unique per host: remapped, see cmd_export.c);
 *   - on one thread, times never go back: each begin is matched by one end
 *     (nested as calls are), an instant lies between them.
 * Times are CLOCK_REALTIME nanoseconds of each record's host.  A writer
 * returns 0, or -1 with errno set (EFBIG: the output passed the size limit).
 */
#ifndef SPTRACE_EXPORT_H
#define SPTRACE_EXPORT_H

#include <stdint.h>
#include <stdio.h>

typedef struct ex_writer ex_writer;

typedef struct ex_format {
	const char *name;        /* as --format says it */
	/* bytes a ring record costs at least in the file (about a third of the
	 * smallest event: a message fills a head and data records): a trace
	 * certain to pass the size limit is refused before any work */
	unsigned min_bytes;
	/* `base`: the earliest record of the session (Chrome's 0 µs) */
	ex_writer *(*open)(FILE *out, int64_t base_ns, uint64_t max_bytes);
	int (*process)(ex_writer *w, uint64_t uuid, int32_t pid, const char *name);
	int (*thread)(ex_writer *w, uint64_t uuid, uint64_t process_uuid, int32_t pid,
		      int32_t tid, const char *name);
	/* a call: entered at t0, ends at t1 (given again to end) */
	int (*begin)(ex_writer *w, uint64_t track, const char *name, int64_t t0, int64_t t1);
	int (*end)(ex_writer *w, uint64_t track, int64_t t1);
	/* an event; a message starts the flows `out` and ends the flows `in` */
	int (*instant)(ex_writer *w, uint64_t track, const char *name, int64_t t,
		       const uint64_t *out, size_t nout, const uint64_t *in, size_t nin);
	/* 0 after the last bytes were written; frees w either way */
	int (*close)(ex_writer *w);
	uint64_t (*bytes)(const ex_writer *w);
} ex_format;

extern const ex_format ex_perfetto;
extern const ex_format ex_chrome;

#endif
