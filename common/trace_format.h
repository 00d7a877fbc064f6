/*
 * trace_format.h — the on-disk trace: one source of truth for the agent that
 * writes it and every reader (replay, report, collect, analysis).
 *
 * A trace directory holds:
 *
 *   meta            text, one "key value" per line (see TRACE_META_*): pid,
 *                   program, clocks, activation event, why the trace ended,
 *                   and one "module" line per module with its load bias.
 *                   Written by the traced process only: a forked child
 *                   sharing the directory (its rings are ring.<its tid>)
 *                   adds nothing but its own "exec" lines, under its pid.
 *   sites           the site table: one fixed-size trace_site record per
 *                   site id the agent handed out, appended as sites are
 *                   instrumented (so it grows while the trace runs).
 *   ring.<tid>      one file per traced thread: a trace_ring_header, then a
 *                   power-of-two array of 8-byte records, mapped shared by
 *                   the agent so the records survive a crash of the process.
 *   seg.<tid>       the records `sptrace run` drained from ring.<tid> before
 *                   the ring came round to them (none in flight-recorder
 *                   mode): chunks of a trace_seg_chunk and its records.  The
 *                   thread's records are the chunks', then the ring's from
 *                   where the last chunk ends.
 *
 * Records are written without locks or system calls.  A full ring overwrites
 * its oldest records; the header's write count says how many were ever
 * written, so a reader knows how many were lost (count - capacity).
 *
 * Contracts between the agent and readers:
 *  - every ring starts with a SYNC record;
 *  - a call through a tail-jump site (sites file kind CA_SITE_TAIL_*) has an
 *    ENTRY only: the callee returns straight to its caller's caller, so it
 *    closes when the caller's EXIT arrives;
 *  - the sites file may have holes of zeros (records are written at their
 *    own offsets, and a crash can come between two writes).
 */
#ifndef TRACE_FORMAT_H
#define TRACE_FORMAT_H

#include <stdint.h>

#define TRACE_RING_MAGIC 0x31474e4952505354ull /* "TSPRING1" little-endian */
#define TRACE_FORMAT_VERSION 1

/*
 * One record, 8 bytes:
 *
 *   bits  0..1   kind (enum trace_kind)
 *   bits  2..25  site id (24 bits), an index into the sites file
 *   bits 26..63  timestamp: TSC bits 0..37
 *
 * A call costs two records (entry and exit): 16 bytes.  38 TSC bits wrap
 * after 2^38 cycles (about 90 s at 3 GHz); the writer emits a TRACE_SYNC
 * record whenever bits 38..63 of the TSC differ from the last ones it wrote,
 * so a reader rebuilds the full value.  A SYNC record carries TSC bits 38..63
 * in bits 2..27 and 0 elsewhere.
 */
enum trace_kind {
	TRACE_ENTRY = 0,  /* a call through site `id` is about to reach its callee */
	TRACE_EXIT = 1,   /* the call through site `id` returned */
	TRACE_EVENT = 2,  /* id is an enum trace_event; no payload */
	TRACE_SYNC = 3,   /* TSC high bits, see above */
};

#define TRACE_ID_BITS 24
#define TRACE_ID_MAX ((1u << TRACE_ID_BITS) - 1)
#define TRACE_TSC_SHIFT 26
#define TRACE_TSC_LOW_BITS 38

static inline uint64_t trace_rec(unsigned kind, uint32_t id, uint64_t tsc)
{
	return (uint64_t)kind | ((uint64_t)(id & TRACE_ID_MAX) << 2) | (tsc << TRACE_TSC_SHIFT);
}

static inline unsigned trace_rec_kind(uint64_t r) { return (unsigned)(r & 3); }
static inline uint32_t trace_rec_id(uint64_t r) { return (uint32_t)((r >> 2) & TRACE_ID_MAX); }
static inline uint64_t trace_rec_tsc_low(uint64_t r) { return r >> TRACE_TSC_SHIFT; }
static inline uint64_t trace_sync_high(uint64_t r) { return (r >> 2) & ((1ull << 26) - 1); }
static inline uint64_t trace_sync_rec(uint64_t high) { return TRACE_SYNC | (high << 2); }

/* TRACE_EVENT ids: things that happen to a thread, not calls. */
enum trace_event {
	TRACE_EV_ACTIVATE = 1,   /* tracing started on this thread */
	TRACE_EV_DEACTIVATE = 2, /* tracing stopped (sptrace stop, exit) */
	TRACE_EV_THREAD_EXIT = 3,
	TRACE_EV_SIGNAL = 4,     /* a fatal signal arrived; the trace ends here */
	TRACE_EV_ACCEPT = 5,     /* accept returned a connection: tracing began here */
	TRACE_EV_RECV = 6,       /* recv returned data: tracing began here */
	TRACE_EV_CTX_SAVE = 7,   /* context events: see below */
	TRACE_EV_CTX_LOAD = 8,
	TRACE_EV_CTX_NEW = 9,
};

/*
 * Context events: a thread switching stacks (getcontext, setcontext,
 * swapcontext, makecontext).  Calls left open on the stack a thread leaves
 * are suspended, not ended; they go on when the thread switches back.  The
 * agent records no stack pointers, so these events name the ucontext_t the
 * program passed: in place of the timestamp they carry a 38-bit key of its
 * address (trace_ctx_key), and their time is that of the record before.
 *
 *   CTX_SAVE key   the current stack can be resumed through `key`
 *                  (getcontext, or swapcontext's first argument)
 *   CTX_LOAD key   the thread goes on on the stack saved under `key`, or on
 *                  a new one when no SAVE or NEW named it (setcontext,
 *                  swapcontext's second argument, a coroutine's uc_link
 *                  when its function returns)
 *   CTX_NEW key    `key` now names a new, empty stack (makecontext)
 */
static inline int trace_event_has_key(uint32_t ev)
{
	return ev == TRACE_EV_CTX_SAVE || ev == TRACE_EV_CTX_LOAD || ev == TRACE_EV_CTX_NEW;
}

static inline uint64_t trace_ctx_key(const void *ucp)
{
	return ((uint64_t)(uintptr_t)ucp * 0x9e3779b97f4a7c15ull) >> (64 - TRACE_TSC_LOW_BITS);
}

/* The header of a ring file.  The agent keeps `count` current after every
 * record, so a reader of a crashed process's ring knows where the newest
 * record is. */
typedef struct trace_ring_header {
	uint64_t magic;          /* TRACE_RING_MAGIC */
	uint32_t version;        /* TRACE_FORMAT_VERSION */
	uint32_t header_size;    /* bytes before the first record: TRACE_RING_HEADER_SIZE */
	uint64_t capacity;       /* records in the ring (a power of two) */
	volatile uint64_t count; /* records ever written; newest at (count-1) % capacity */
	uint64_t mask;           /* capacity - 1 (the writer's fast path uses it) */
	uint64_t epoch;          /* TSC bits 38..63 of the last SYNC written */
	uint32_t pid, tid;
	uint64_t start_tsc;      /* TSC when the ring was created */
	uint64_t flags;          /* TRACE_RING_* */
	char thread_name[16];
	uint8_t reserved[4096 - 88];
} trace_ring_header;

#define TRACE_RING_HEADER_SIZE 4096
_Static_assert(sizeof(trace_ring_header) == TRACE_RING_HEADER_SIZE, "ring header size");
/* Offsets the agent's generated code uses (checked by static asserts there). */
#define TRACE_RING_OFF_COUNT 24
#define TRACE_RING_OFF_MASK 32
#define TRACE_RING_OFF_EPOCH 40

enum {
	TRACE_RING_CLOSED = 1,   /* the thread ended or the trace was stopped cleanly */
};

/* One chunk of a seg.<tid> file, followed by its n records.  Chunks come in
 * the order of their records; a gap between two (the ring came round before
 * they were drained) is records lost. */
#define TRACE_SEG_MAGIC 0x31474553505354ull /* "TSPSEG1" little-endian */
typedef struct trace_seg_chunk {
	uint64_t magic;          /* TRACE_SEG_MAGIC */
	uint64_t first;          /* index of its first record among all the ring's */
	uint64_t n;              /* records that follow */
	uint64_t epoch;          /* the ring's last SYNC (TSC bits 38..63) when it was
				  * drained: a reader that lost the records before
				  * uses it until the chunk's own SYNC */
} trace_seg_chunk;

/*
 * The sites file: record i describes site id i.  Ids start at 1; record 0 is
 * not a site: its first 4 bytes are the agents' shared next-id counter.  A direct site names its callee by module and address; an indirect
 * one names the callee the agent found when it instrumented the site.
 */
typedef struct trace_site {
	uint32_t caller_module;  /* index of a "module" line in meta */
	uint32_t callee_module;  /* UINT32_MAX when not known */
	uint64_t site_addr;      /* link-time address of the call instruction */
	uint64_t caller_func;    /* link-time entry of the calling function */
	uint64_t callee_func;    /* link-time entry of the callee */
	uint32_t kind;           /* enum ca_site_kind */
	uint32_t flags;          /* TRACE_SITE_* */
} trace_site;

enum {
	TRACE_SITE_ROOT = 1,     /* not a call site: the function where tracing began */
	TRACE_SITE_NO_EXIT = 2,  /* the callee returns straight to the caller (it looks
	                          * at its return address: dlsym, dlopen): ENTRY only */
};

/* A meta file larger than this is corrupt rather than large: readers
 * refuse it (a sparse file of 1 TB would take them minutes). */
#define TRACE_META_MAX_BYTES (16u << 20)

/* meta keys (text file, "key value" per line; values run to end of line). */
#define TRACE_META_VERSION "version"     /* TRACE_FORMAT_VERSION */
#define TRACE_META_PID "pid"
#define TRACE_META_PROGRAM "program"     /* path of the executable */
#define TRACE_META_ARGS "args"
#define TRACE_META_HOST "host"
#define TRACE_META_TSC_HZ "tsc_hz"       /* TSC ticks per second (calibrated) */
#define TRACE_META_TSC0 "tsc0"           /* TSC at the clock reading below */
#define TRACE_META_MONO0 "mono0_ns"      /* CLOCK_MONOTONIC then */
#define TRACE_META_REAL0 "real0_ns"      /* CLOCK_REALTIME then */
#define TRACE_META_EVENT "activation"    /* the --on event */
#define TRACE_META_ACTIVATED "activated" /* TSC and cause, each time tracing began */
#define TRACE_META_STOPPED "stopped"     /* TSC and cause, each time it was stopped */
#define TRACE_META_EXEC "exec"           /* SUBDIR PID PATH: process PID (the traced one, or a
					    child sharing the trace) exec'd; the new image's
					    trace is in SUBDIR */
#define TRACE_META_EXEC_FAILED "exec_failed" /* SUBDIR: ... and the exec failed */
#define TRACE_META_EXEC_OF "exec_of"     /* DIR: this image was exec'd by the one traced in DIR */
#define TRACE_META_ATTACHED "attached"   /* TSC: the agent was loaded into the running process */
#define TRACE_META_FATAL "fatal"         /* signal tid si_code address TSC: a deadly signal */
#define TRACE_META_END "end"             /* why the trace ended */
#define TRACE_META_MODULE "module"       /* index path key bias */
#define TRACE_META_RUNTIME "runtime"     /* index kind lo hi: run-time code range of module
                                          * `index` a language runtime manages (kind: go,
                                          * v8), left alone by the agent */
#define TRACE_META_UNTRACED "untraced"  /* MODULE WHY...: a module the program's
                                          * calls into are not traced, and why (the
                                          * agent uses it itself; no room for areas) */
#define TRACE_META_CHANGED "changed"   /* index N: N more call sites of module `index`
                                          * left alone: their bytes are not those its
                                          * analysis saw (agent/instrument.c) */
#define TRACE_META_TSC1 "tsc1"           /* TSC at the end of the trace */
#define TRACE_META_MONO1 "mono1_ns"      /* CLOCK_MONOTONIC then */

#endif
