/*
 * tracegen.h — trace directories written by hand for the analysis tests, in
 * the format of common/trace_format.h: the meta and sites files, and rings
 * filled the way the agent fills them (a SYNC record first and whenever TSC
 * bits 38..63 change, overwriting the oldest record when full).
 *
 * The sites describe tests/analysis/traced.c (tg_sites) or
 * tests/analysis/traced_cxx.cpp (tg_cxx_sites), whose addresses these find by
 * analysing the program.
 */
#ifndef TRACEGEN_H
#define TRACEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "codeanalysis.h"
#include "trace_format.h"

/* Site ids of the standard sites file (see tg_sites). */
enum {
	S_MAIN = 1,      /* root: main, where tracing began */
	S_MIDDLE,        /* main -> middle */
	S_LEAF,          /* middle -> leaf */
	S_FACT,          /* main -> fact */
	S_FACT_REC,      /* fact -> fact */
	S_WORKER,        /* main -> worker */
	S_W_MIDDLE,      /* worker -> middle */
	S_W_LEAF,        /* worker -> leaf */
	S_DEEP,          /* main -> deep */
	S_DEEP_REC,      /* deep -> deep */
	S_PRINTF,        /* main -> printf@plt */
	S_HOOK,          /* main -> *hook, callee unknown */
	S_TAIL,          /* middle -> leaf as a tail jump (made up: -O0 has none) */
	S_COUNT
};

/* Site ids of the C++ sites file (see tg_cxx_sites): main of
 * tests/analysis/traced_cxx.cpp calling each kind of C++ name. */
enum {
	X_MAIN = 1,      /* root: main */
	X_GET,           /* main -> ns::Box<long>::get(int) const */
	X_ADD,           /* main -> ns::Vec::operator+=(ns::Vec const&) */
	X_LESS,          /* main -> ns::Vec::operator<(ns::Vec const&) const */
	X_CALL,          /* main -> ns::Vec::operator()(int) const */
	X_BIGGEST,       /* main -> long ns::biggest<long>(long, long) */
	X_LAMBDA,        /* main -> main::{lambda(int)#1}::operator()(int) const */
	X_HELPER,        /* main -> (anonymous namespace)::helper(int) */
	X_PLAIN,         /* main -> plain_c, extern "C" */
	X_APPLY,         /* main -> ns::apply(int (*)(int), int) */
	X_APPLY_F,       /* ns::apply -> *f, callee unknown */
	X_NEW,           /* main -> operator new(unsigned long)@plt */
	X_DELETE,        /* main -> operator delete(void*, unsigned long)@plt */
	X_DTOR,          /* main -> ns::Vec::~Vec() */
	X_COUNT
};

/* The clocks the standard meta declares: 1 GHz, so 1 tick = 1 ns. */
#define TG_HZ 1000000000ull
#define TG_TSC0 (3ull << 38)                 /* also every ring's start_tsc */
#define TG_REAL0 1700000000000000000ll       /* CLOCK_REALTIME at TG_TSC0 */

/* Print the message and exit(2): the tests cannot go on. */
void tg_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Analyse the traced program (once) and fill the standard site table. */
void tg_sites(const char *prog, trace_site out[S_COUNT]);
const ca_module *tg_prog(void);
uint64_t tg_func(const char *name);          /* link-time entry of `name` */
/* The same for the C++ program: its sites file, its analysis (free it with
 * ca_module_free at the end), the entry of a function by its symbol. */
void tg_cxx_sites(const char *prog, trace_site out[X_COUNT]);
const ca_module *tg_cxx_prog(void);
uint64_t tg_cxx_func(const char *symbol);

/* Make root/name afresh; its path, malloc'ed. */
char *tg_dir(const char *root, const char *name);
void tg_write(const char *dir, const char *file, const void *data, size_t len);
/* The standard meta file, module 0 = prog, plus `extra` lines ("" if none). */
void tg_meta(const char *dir, const char *prog, const char *extra);
void tg_write_sites(const char *dir, const trace_site *s, size_t n);

typedef struct tg_ring {
	uint32_t tid;
	uint64_t cap, count, epoch, start_tsc, flags;
	uint64_t *slot;
} tg_ring;

/* A ring as the agent creates it: a SYNC record of start_tsc first. */
void tg_ring_init(tg_ring *r, uint32_t tid, uint64_t cap, uint64_t start_tsc);
/* A record as the agent writes it: a SYNC first if the high bits changed. */
void tg_put(tg_ring *r, unsigned kind, uint32_t id, uint64_t tsc);
void tg_put_raw(tg_ring *r, uint64_t rec);
/* A message (trace_format.h, "Message events"): its head, event `ev`
 * (TRACE_EV_MSG_SEND or _RECV) at tsc, and its data records. */
void tg_put_msg(tg_ring *r, uint32_t ev, uint64_t tsc, uint32_t chan, unsigned call,
		unsigned flags, uint64_t off, uint64_t len);
void tg_ring_header(const tg_ring *r, trace_ring_header *h);
/* Write ring.<tid>: header `h` (NULL: the ring's own), then the records;
 * truncated to `size` bytes if size >= 0.  Frees nothing. */
void tg_ring_write(const tg_ring *r, const char *dir, const trace_ring_header *h, long size);
void tg_ring_free(tg_ring *r);

/* Run argv (argv[0] a path) with stdout and stderr captured (malloc'ed,
 * NUL-terminated).  Returns the exit status, or 128+signal. */
int tg_run(char *const argv[], char **out, char **err);

/* Remove a directory tree. */
void tg_rmtree(const char *path);

#endif
