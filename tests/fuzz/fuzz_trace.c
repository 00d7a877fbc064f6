/*
 * tests/fuzz/fuzz_trace.c — libFuzzer target for the trace-directory reader
 * (analysis/): meta, sites, a ring file, its seg file, the channels file
 * and the ring's packed blocks.
 *
 * An input is up to six files separated by FUZZ_TRACE_SEP (fuzz_trace.h):
 * meta, sites, ring.1, seg.1, channels, packed.1, in that order; a part left
 * out is a file absent.  They are written into a scratch directory made once per process,
 * which is then read as `sptrace replay` and `report` read it: an_trace_open
 * (modules not analysed: their paths in meta name files of this machine, and
 * the ELF readers have fuzz_analyze), then every thread's call tree, and
 * every site's, function's, message's and channel's name; then as `sptrace
 * flows` reads it: a session, its records merged in time order, its flows.
 * Everything is freed per input, so
 * libFuzzer's leak check (ASan builds) reports any leak as a crash.
 */
#include "fuzz_trace.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile size_t sink;

static const char *const files[] = { "meta", "sites", "ring.1", "seg.1", "channels",
				     "packed.1" };
static char dir[64];

static void put_file(const char *name, const uint8_t *p, size_t n)
{
	char path[128];
	int fd;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		perror(path);
		abort();             /* the scratch directory is gone: no use going on */
	}
	while (n) {
		ssize_t k = write(fd, p, n);

		if (k <= 0) {
			perror(path);
			abort();
		}
		p += k;
		n -= (size_t)k;
	}
	close(fd);
}

/* Read everything a printer reads, so that a bad index is caught by ASan. */
static size_t read_trace(an_trace *t)
{
	size_t total = 0;

	for (size_t i = 0; i < an_trace_nwarnings(t); i++)
		total += strlen(an_trace_warning(t, i));
	for (size_t i = 0; i < an_trace_nmodules(t); i++)
		total += strlen(an_trace_module(t, i)->path);
	for (size_t i = 0; i < an_trace_nthreads(t); i++) {
		const an_thread *th = an_trace_thread(t, i);
		an_call *c;
		size_t n;
		sp_err err;

		if (an_thread_calls(t, th, &c, &n, NULL, &err) < 0)
			continue;
		for (size_t k = 0; k < n; k++) {
			if (c[k].kind == AN_EVENT) {
				char buf[400];
				const an_msg *m;

				total += strlen(an_event_name(c[k].id, buf, sizeof buf));
				if (trace_event_is_msg(c[k].id) && (m = an_trace_msg(t, c[k].end)))
					total += strlen(an_msg_text(t, m, buf, sizeof buf));
				continue;
			}
			total += strlen(an_func_get(t, an_site(t, c[k].id)->callee)->name);
			total += an_tsc_ns(t, c[k].t0, c[k].t1) > 0;
			total += an_realtime_ns(t, c[k].t0) > 0;
		}
		free(c);
	}
	for (size_t i = 0; i < an_nsites(t); i++)
		total += strlen(an_site(t, (uint32_t)i)->src);
	for (size_t i = 0; i < an_nchannels(t) + 2; i++) {
		char buf[300];

		total += strlen(an_channel_text(t, (uint32_t)i, (int)(i & 1), buf, sizeof buf));
	}
	for (size_t i = 0; i < an_nfuncs(t); i++)
		total += strlen(an_func_get(t, (uint32_t)i)->name);
	return total;
}

/* At exit: the scratch directory goes, so that runs leave nothing in /tmp. */
static void remove_dir(void)
{
	char path[128];

	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
}

/* The directory as `sptrace flows` reads it. */
static void read_session(const an_open_opts *opt)
{
	an_session *s;
	an_merge *m;
	an_flows *f;
	an_event ev;
	sp_err err;
	size_t total = 0;

	if (an_session_open(dir, opt, &s, &err) < 0)
		return;
	if (an_merge_open(s, &m, &err) == 0) {
		while (an_merge_next(m, &ev))
			total += ev.rec.id;
		an_merge_close(m);
	}
	if (an_flows_build(s, &f, &err) == 0) {
		for (size_t i = 0; i < an_flows_count(f); i++) {
			const an_flow *fl = an_flows_get(f, i);

			total += strlen(fl->id) + strlen(fl->host) + strlen(fl->event) + fl->nprocs;
		}
		an_flows_free(f);
	}
	an_session_close(s);
	sink = total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const an_open_opts opt = { .repo = "/nonexistent/sptrace-fuzz-repo",
					  .no_modules = 1 };
	const uint8_t *p = data, *end = data + size;
	size_t sep = strlen(FUZZ_TRACE_SEP);
	an_trace *t;
	sp_err err;

	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/sptrace-fuzz-trace.XXXXXX");
		if (!mkdtemp(dir)) {
			perror("mkdtemp");
			abort();
		}
		atexit(remove_dir);
	}
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		const uint8_t *next = p;
		char path[128];

		while (next + sep <= end && memcmp(next, FUZZ_TRACE_SEP, sep) != 0)
			next++;
		if (next + sep > end)
			next = end;
		if (p < end || i == 0) {
			put_file(files[i], p, (size_t)(next - p));
		} else {
			snprintf(path, sizeof path, "%s/%s", dir, files[i]);
			unlink(path);
		}
		p = next + sep < end ? next + sep : end;
	}
	if (an_trace_open_opts(dir, &opt, &t, &err) == 0) {
		read_trace(t);
		an_trace_close(t);
	}
	read_session(&opt);
	return 0;
}
