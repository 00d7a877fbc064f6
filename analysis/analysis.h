/*
 * analysis.h — the analysis library: read trace directories (format:
 * common/trace_format.h) and analyse them.  Its files, by job, are listed in
 * an_internal.h.
 *
 * an_trace_open() reads and checks everything a reader needs before it prints
 * a line: the meta file, the sites file, the header of every ring file, and
 * the code analysis of every module (from the repository, else by analysing
 * the module's file).  A malformed meta, a missing sites file or a truncated
 * or corrupt ring is an error naming the file.  Damage that costs only part of
 * the trace (a site id the sites file does not have, a module whose file is
 * gone) is a warning, kept in the trace (an_trace_warning) and repeated to
 * whoever prints.
 *
 * Records are streamed one thread at a time (a ring is 16 MiB by default):
 * an_iter yields a thread's records oldest first with the full TSC rebuilt
 * from the 38 stored bits and the SYNC records, and an_thread_calls() pairs
 * entries with exits into a call tree.  Time conversions use the clocks in
 * meta.  Names come from an_site() and an_func().
 *
 * Nothing here is thread-safe: one an_trace per thread of the reader.
 */
#ifndef ANALYSIS_H
#define ANALYSIS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "codeanalysis.h"
#include "sp.h"
#include "trace_format.h"

#define AN_NONE UINT32_MAX

typedef struct an_trace an_trace;

/*
 * How C++ symbols (those starting with _Z) are shown, as uftrace's
 * --demangle does; its default is "simple".  A clone suffix (".cold",
 * ".part.0") and a PLT or version suffix ("@plt") are kept:
 *   AN_DEMANGLE_SIMPLE  the qualified name without parameters, template
 *                       arguments, return type or ABI tags:
 *                       "ns::Box::get", "ns::Box::get.cold"
 *   AN_DEMANGLE_FULL    the C++ runtime's demangling (as c++filt):
 *                       "int ns::Box<int>::get<int>(int) const",
 *                       "ns::Box<int>::get(int) [clone .cold]"
 *   AN_DEMANGLE_NO      the symbol as it is: "_ZNK2ns3BoxIiE3getIiEET_i"
 * A symbol the runtime cannot demangle, or one over 16 KiB, is shown as it
 * is.
 */
enum an_demangle {
	AN_DEMANGLE_SIMPLE = 0,
	AN_DEMANGLE_FULL,
	AN_DEMANGLE_NO,
};

typedef struct an_open_opts {
	const char *repo;        /* repository directory; NULL: ca_repo_default_dir() */
	int no_modules;          /* skip code analysis: name functions by address */
	int demangle;            /* enum an_demangle (0: simple) */
} an_open_opts;

/* ---- meta (meta.c; trace_format.h: one "key value" line each, TRACE_META_*) ---- */

/*
 * The one reader of a trace's meta file, for every command: the lines of
 * DIR/meta as they are now (the agent appends while it runs: read again to
 * see more).  Empty lines and '#' lines are skipped; a line without a space
 * is a key with an empty value.  The file must be a regular file (no link,
 * FIFO or device) of at most TRACE_META_MAX_BYTES with no NUL byte.
 * -1 with err naming the file (errno says why: ENOENT no meta there).
 */
typedef struct an_meta an_meta;

int an_meta_read(const char *dir, an_meta **out, sp_err *err);
void an_meta_free(an_meta *m);
size_t an_meta_nlines(const an_meta *m);
/* Line i's key, value and line number in the file (NULL, 0 past the end). */
const char *an_meta_key(const an_meta *m, size_t i);
const char *an_meta_val(const an_meta *m, size_t i);
size_t an_meta_lineno(const an_meta *m, size_t i);
/* The value of the first / the last line with this key, NULL if none. */
const char *an_meta_get(const an_meta *m, const char *key);
const char *an_meta_last(const an_meta *m, const char *key);
/* How many lines have this key. */
size_t an_meta_count(const an_meta *m, const char *key);

/* ---- the trace (trace.c) ---- */

/* Open the trace directory `dir`.  Returns 0 and *out, or -1 with err naming
 * the file and the problem.  an_trace_open uses the default options. */
int an_trace_open(const char *dir, an_trace **out, sp_err *err);
int an_trace_open_opts(const char *dir, const an_open_opts *opt, an_trace **out, sp_err *err);
void an_trace_close(an_trace *t);

const char *an_trace_dir(const an_trace *t);
/* The value of the first meta line with this key, NULL if there is none.
 * (Module lines are read through an_trace_module.) */
const char *an_trace_meta(const an_trace *t, const char *key);
/* Warnings: damage that costs part of the trace, each naming its file. */
size_t an_trace_nwarnings(const an_trace *t);
const char *an_trace_warning(const an_trace *t, size_t i);

/* ---- modules (meta.c, modules.c: "module <index> <path> <key> <bias-hex>") ---- */

typedef struct an_module {
	uint32_t index;          /* as in meta; trace_site refers to it */
	const char *path;
	const char *key;         /* build-id hex or "sha256-<hex>" */
	uint64_t bias;           /* run-time address = link-time address + bias */
	const ca_module *ca;     /* NULL when no analysis of this module was found */
} an_module;

size_t an_trace_nmodules(const an_trace *t);
const an_module *an_trace_module(const an_trace *t, size_t i);
/* A "module" line's value cut into its fields in place (path and key point
 * into v; ca NULL), for readers of meta without a whole trace: 0, -1 if it
 * is malformed, -2 if its key is not a build-id or content hash. */
int an_module_line(char *v, an_module *out);

/* ---- threads (rings.c: one ring file each), sorted by tid ---- */

typedef struct an_thread {
	uint32_t tid, pid;
	char name[17];           /* thread name from the ring header, "" if none */
	const char *path;        /* the ring file */
	uint64_t capacity;       /* records the ring holds (chunk: the agent's window) */
	uint64_t count;          /* records ever written */
	uint64_t chunk;          /* 0: a ring; else a file of every record (trace_format.h) */
	uint64_t lost;           /* records written but not in the trace */
	int lost_why;            /* enum an_lost_why, when lost */
	int lost_errno;          /* AN_LOST_GROW: why the file could not grow */
	uint64_t drained;        /* version 1: records kept in seg.<tid> (sptrace run's
				    copying drain) */
	uint64_t flags;          /* TRACE_RING_* */
	uint64_t start_tsc;      /* TSC when the ring was created */
	uint64_t epoch;          /* TSC bits 38..63 of the last SYNC written */
} an_thread;

/* Why a thread lost records. */
enum an_lost_why {
	AN_LOST_RING = 1,        /* a full ring overwrote its oldest (flight-recorder mode) */
	AN_LOST_DRAIN,           /* version 1: sptrace run's copying drain fell behind */
	AN_LOST_GROW,            /* the file could not grow (lost_errno: a full disk) */
	AN_LOST_CUT,             /* the file ends before its records do (cut or damaged) */
	AN_LOST_NWHY
};

/*
 * Records lost, summed over threads (an_trace_lost) or over every image of
 * a session (an_session_lost, from the ring headers alone: cheap).  Every
 * command that reads a trace says it first, before its output
 * (an_lost_text).
 */
typedef struct an_lost {
	uint64_t written;        /* records written */
	uint64_t lost;           /* of which not in the trace */
	size_t threads, threads_lost;
	uint64_t by_why[AN_LOST_NWHY];
	int grow_errno;          /* an AN_LOST_GROW thread's reason */
} an_lost;

void an_trace_lost(const an_trace *t, an_lost *l);
/* One sentence, no newline: "N of M records lost in T of U threads: why". */
void an_lost_text(const an_lost *l, char *buf, size_t len);

/* `sptrace run`'s compaction (pack.c; trace_format.h, "Packed blocks"): the records
 * of the ring file ring_path (a file of every record) that the agent is
 * done with -- all of them when the file is process `gone`'s (0: none;
 * AN_PACK_DEAD: any process no longer running), which can write no more --
 * are encoded into packed.<tid> beside it and
 * punched out of it.  Returns the records packed by this call (0: none, or
 * not such a file), or -1 (err). */
#define AN_PACK_DEAD (-1)
int64_t an_pack_ring(const char *ring_path, int gone, sp_err *err);
/* The site ids of which an_pack_ring met an ENTRY record in the trace
 * directory `dir` (any path to it) in this process: a bitmap of *nbits bits
 * (bit i: byte i / 8, bit i % 8), NULL if it packed no record there.  For
 * sptrace run's look-ahead profiles. */
const uint8_t *an_pack_entered(const char *dir, size_t *nbits);

size_t an_trace_nthreads(const an_trace *t);
const an_thread *an_trace_thread(const an_trace *t, size_t i);
/* The thread with this tid, NULL if the trace has none. */
const an_thread *an_trace_thread_by_tid(const an_trace *t, uint32_t tid);

/* ---- records (iter.c) ---- */

/* A message event (trace_format.h, "Message events"). */
typedef struct an_msg {
	uint32_t chan;           /* channel id: an_channel() */
	unsigned call;           /* enum trace_msg_call */
	unsigned flags;          /* TRACE_MSG_* */
	int recv;                /* 1 received, 0 sent */
	uint64_t off, len;       /* bytes [off, off+len) of its direction; a datagram:
				    its number and its size */
} an_msg;

/* One record with its full timestamp.  SYNC records are consumed by the
 * iterator and never returned; a message's data records come with its
 * head, as one record. */
/* An overhead-budget event (trace_format.h): site `site` is counted or
 * timed from here on (TRACE_EV_BUDGET: mode, n 0), or the thread made n
 * more calls through it without records (TRACE_EV_COUNT). */
typedef struct an_budget {
	uint32_t site;
	uint32_t mode;           /* TRACE_BUDGET_TIMED or TRACE_BUDGET_COUNTED */
	uint64_t n;
} an_budget;

typedef struct an_record {
	uint64_t tsc;            /* the full TSC (a context event: the record before's) */
	uint32_t id;             /* site id (ENTRY, EXIT) or enum trace_event (EVENT) */
	uint32_t kind;           /* TRACE_ENTRY, TRACE_EXIT or TRACE_EVENT */
	uint64_t key;            /* context events (trace_event_has_key): the key */
	union {
		an_msg msg;      /* TRACE_EV_MSG_SEND, TRACE_EV_MSG_RECV: the message */
		an_budget budget; /* TRACE_EV_BUDGET, TRACE_EV_COUNT: what it says */
	};
	int64_t value;           /* TRACE_EV_VALUE: a join directive's value (the record's
				    id field is taken apart: id is TRACE_EV_VALUE) */
	unsigned value_arg;      /* ... argument 1..6 (after its call's ENTRY), or 0: the
				    return value (before its EXIT) */
} an_record;

/* What an iteration found, complete once an_iter_next() returned 0. */
typedef struct an_iter_stats {
	size_t nrecords;         /* records returned */
	size_t nguessed;         /* records whose TSC bits 38..63 were inferred (below) */
	size_t nbad_sites;       /* ENTRY/EXIT records naming no site of the sites file */
	size_t nbad_syncs;       /* SYNC records with stray bits set (ignored) */
	size_t nbad_msgs;        /* message heads without all their data (dropped) */
	size_t nbad_counts;      /* COUNT records without their data (dropped) */
	size_t nstray_data;      /* message data without their head (skipped) */
	size_t nunread;          /* records a failed read left unread (the end) */
	size_t nholes;           /* zero slots: taken but never written (skipped) */
	uint64_t last_tsc;       /* TSC of the newest record returned */
} an_iter_stats;

/*
 * Rebuilding the full TSC.  A record holds TSC bits 0..37; the writer puts a
 * SYNC record (bits 38..63) before any record whose high bits differ from the
 * last SYNC, and one at the start of every ring.  Every record after a
 * surviving SYNC is therefore exact.  Only in a ring that wrapped can records
 * precede the oldest surviving SYNC:
 *   - with no SYNC left at all, their high bits are the header's `epoch` (the
 *     last SYNC written), which is exact;
 *   - otherwise they are taken as one less than that SYNC's, which is exact
 *     unless the thread wrote nothing for more than 2^38 cycles (~90 s) just
 *     there; these records are counted in nguessed.
 */
typedef struct an_iter an_iter;

/* Iterate over the records of thread `th`: its drained chunks (seg.<tid>),
 * then its ring.  The records are streamed, a window of a few thousand at a
 * time, never the whole thread in memory (iter.c).  Which records are
 * covered is fixed when it opens: a live agent may go on writing. */
int an_iter_open(an_trace *t, const an_thread *th, an_iter **out, sp_err *err);
/* 1 and *r: the next record; 0: no more. */
int an_iter_next(an_iter *it, an_record *r);
const an_iter_stats *an_iter_stats_get(const an_iter *it);
void an_iter_close(an_iter *it);

/* ---- clocks (trace.c: meta tsc_hz, tsc0, mono0_ns, real0_ns) ---- */

/* Nanoseconds from TSC a to TSC b (0 if b < a). */
uint64_t an_tsc_ns(const an_trace *t, uint64_t a, uint64_t b);
/* CLOCK_REALTIME / CLOCK_MONOTONIC nanoseconds at TSC `tsc`. */
int64_t an_realtime_ns(const an_trace *t, uint64_t tsc);
int64_t an_monotonic_ns(const an_trace *t, uint64_t tsc);
/* When tracing began: the earliest ring creation (meta tsc0 if no ring). */
uint64_t an_trace_start_tsc(const an_trace *t);

/* ---- names (names.c) ---- */

/*
 * A function: a callee or caller of some site.  Its name is the symbol
 * (demangled as an_open_opts.demangle says) or the analyser's sub_<addr>; when the module has no analysis, "<file>+0x<addr>";
 * when meta has no module of that index, "?module<N>+0x<addr>"; an indirect
 * call whose callee the agent did not know is "<indirect@<caller>+0x<off>>";
 * a site id the sites file does not hold is "?site <N>".
 */
typedef struct an_func {
	const char *name;
	const char *src;         /* "file:line" of its entry, "" if unknown */
	uint32_t module;         /* meta module index, AN_NONE if not a function */
	uint64_t addr;           /* link-time entry address */
	int signature;           /* the name holds its parameter list (demangled
				    in full): a printer adds no "()" */
} an_func;

typedef struct an_site_info {
	uint32_t callee;         /* an_func index: what an ENTRY of this site enters */
	uint32_t caller;         /* an_func index, AN_NONE for a root or a bad id */
	const char *src;         /* "file:line" of the call instruction, "" if unknown */
	uint64_t addr;           /* link-time address of the call instruction */
	uint32_t kind;           /* enum ca_site_kind (0 for a root or a bad id) */
	uint32_t flags;          /* TRACE_SITE_* */
	int valid;               /* 0: the sites file has no such id */
	uint32_t canon;          /* the first id of the same call instruction: an
	                          * indirect site has an id per callee, and its
	                          * EXIT may carry another callee's id than its
	                          * ENTRY (the agent's per-site cache moved on) */
} an_site_info;

/* A tail jump: the agent records its ENTRY only (see an_thread_calls). */
int an_site_is_tail(const an_site_info *s);

/* Site `id`, never NULL: an id the sites file lacks (beyond its end, or a
 * record still all zero: the agent writes records at their offsets, so a
 * crash can leave holes) gets a "?site N" entry, made on first use.  After
 * 4096 such ids, further ones share one entry named "?site".  Pointers from
 * an_site and an_func stay valid until an_trace_close. */
const an_site_info *an_site(an_trace *t, uint32_t id);
size_t an_nsites(const an_trace *t);     /* valid ids are 1 .. an_nsites()-1 */
size_t an_nfuncs(const an_trace *t);
const an_func *an_func_get(const an_trace *t, uint32_t i);
/* The name of a TRACE_EVENT id: "activate", "signal", ...; "event <N>"
 * for one this reader does not know (buf is used then). */
const char *an_event_name(uint32_t id, char *buf, size_t len);

/* ---- channels and messages (msgs.c: the channels file) ---- */

/* Channel `id`, NULL when the channels file has no such record (or none). */
const trace_channel *an_channel(const an_trace *t, uint32_t id);
size_t an_nchannels(const an_trace *t);  /* ids are below this */
/* "tcp 127.0.0.1:40112 -> 127.0.0.1:7000" (recv: "<-" and the same order:
 * this process's address first), "pipe 123456", "unix 4567 /run/s -> ?",
 * "channel N" for an unknown id.  Returns buf. */
char *an_channel_text(const an_trace *t, uint32_t id, int recv, char *buf, size_t len);
/* "send(tcp A -> B, bytes 0..118)", "recvfrom(udp A <- B, datagram 0, 12
 * bytes)".  Returns buf. */
char *an_msg_text(const an_trace *t, const an_msg *m, char *buf, size_t len);
/* Message i of the call trees built so far (an_call's `end`), NULL if none. */
const an_msg *an_trace_msg(const an_trace *t, uint32_t i);
/* Value i of the call trees built so far (an_call's `end` of a TRACE_EV_VALUE
 * item): 0 and *value, -1 if none. */
int an_trace_value(const an_trace *t, uint32_t i, int64_t *value);
/* Budget event i of the call trees built so far (an_call's `end`), NULL if none. */
const an_budget *an_trace_budget(const an_trace *t, uint32_t i);

/* ---- for printers (demangle.c, trace.c) ---- */

/* The enum an_demangle for "simple", "full" or "no"; -1 for anything else. */
int an_demangle_style(const char *name);
/* Symbol `sym` shown in `style` (enum an_demangle), malloc'ed; NULL only
 * when out of memory.  The trace does this once per function. */
char *an_demangle(const char *sym, int style);

/* Mark in sel[] (an_trace_nthreads entries) the threads of a list of thread
 * ids "TID[,TID...]".  -1 with err for a malformed list or a tid the trace
 * does not have. */
int an_select_threads(const an_trace *t, const char *list, unsigned char *sel, sp_err *err);
/* A string's 64-bit hash (FNV-1a, map.c), for tables of names. */
uint64_t an_hash_str(const char *s);
/* A duration as uftrace prints it, 11 characters wide: "   0.512 us",
 * " 120.000 ms", "   2.500  s".  Returns buf. */
char *an_fmt_duration(uint64_t ns, char buf[24]);

/* ---- calls (calls.c) ---- */

enum an_call_kind {
	AN_CALL = 1,             /* an ENTRY, with its EXIT or closed otherwise */
	AN_EVENT,                /* a TRACE_EVENT record */
	AN_EXIT_ONLY,            /* an EXIT matching no open entry */
};

enum an_call_end {
	AN_END_EXIT = 1,         /* its EXIT record */
	AN_END_TRACE,            /* no exit: the thread's records end first */
	AN_END_UNWOUND,          /* no exit: an outer call's EXIT came first
				    (longjmp or exception); t1 is that exit */
	AN_END_TAIL,             /* entered by a tail jump: it returned to its
				    caller's caller, at the caller's EXIT (t1) */
	AN_END_STOPPED,          /* no exit: tracing was stopped (sptrace stop)
				    while it ran; t1 is the stop */
	AN_END_SWITCHED,         /* suspended: the thread switched to another
				    stack (swapcontext); t1 is the switch.  It
				    goes on in an AN_CONTINUED item when the
				    thread switches back */
};

enum an_call_flags {
	AN_CONTINUED = 1,        /* AN_CALL: a suspended call going on after the
				    thread switched back to its stack: the same
				    call, not a new one; t0 is the switch */
	AN_NEW_STACK = 2,        /* AN_EVENT TRACE_EV_CTX_LOAD: a stack never run
				    on before */
};
/* An AN_EVENT TRACE_EV_VALUE item's argument: 1..6, or 0 the return value. */
#define AN_VALUE_ARG(c) ((unsigned)(c)->flags >> 8)

typedef struct an_call {
	uint16_t kind;           /* enum an_call_kind */
	uint16_t flags;          /* enum an_call_flags */
	uint32_t end;            /* AN_CALL: enum an_call_end; AN_EVENT
				    TRACE_EV_CTX_LOAD: the stack switched to
				    (0 the thread's own, then in order of use);
				    AN_EVENT TRACE_EV_MSG_SEND/RECV: the
				    message, an_trace_msg(t, end); AN_EVENT
				    TRACE_EV_VALUE: an_trace_value(t, end), the
				    argument in flags >> 8 (AN_VALUE_ARG);
				    AN_EVENT TRACE_EV_BUDGET/COUNT: the
				    event, an_trace_budget(t, end) */
	uint32_t id;             /* site id, or event id for AN_EVENT */
	uint32_t depth;          /* 0 = outermost */
	size_t last;             /* AN_CALL: index one past its last nested item */
	uint64_t t0, t1;         /* TSC of the entry and the end (t1 == t0 if not AN_CALL) */
} an_call;

/*
 * The thread's records as a call tree in pre-order: an AN_CALL item is
 * followed by the items nested in it, up to index `last`.  An EXIT closes the
 * innermost open call of the same site.  Calls opened after that one end
 * with it: those entered by a tail jump directly on top of it are AN_END_TAIL
 * (a tail jump has no EXIT of its own: its callee returns for the caller);
 * all others are AN_END_UNWOUND.  An EXIT of a site with no open call is
 * AN_EXIT_ONLY (its entry was overwritten, or happened before tracing began).
 * Calls still open at the end are AN_END_TRACE with t1 = the thread's last
 * record.  A DEACTIVATE event (sptrace stop) ends the calls still open as
 * AN_END_STOPPED, and the records up to the next ACTIVATE are dropped: they
 * are calls finishing after the stop, which the agent cannot silence
 * without a test on the hot path.
 * Context events (trace_format.h) give each stack the thread runs on its own
 * open calls.  The stacks entered form a chain, each nested under the call
 * that switched to it: switching to a stack not in the chain adds it on top
 * (an AN_EVENT item for the CTX_LOAD, then its suspended calls again as
 * AN_CONTINUED items); switching to one lower in the chain suspends the
 * calls of the stacks above it (AN_END_SWITCHED).  Only CTX_LOAD events
 * that change stacks become items.
 * *out is malloc'ed (free it); *stats, if not NULL, gets the iteration's.
 */
int an_thread_calls(an_trace *t, const an_thread *th, an_call **out, size_t *n,
		    an_iter_stats *stats, sp_err *err);


/* ---- sessions: every image of a trace, or of a collected tree (session.c) ---- */

/*
 * A session is what one command reads: the trace directory DIR with the
 * images exec'd from it (by the process, or by a forked child sharing DIR:
 * meta's exec lines, recursively), or a tree made by `sptrace collect`,
 * OUT/<host>/<pid>/..., every process of every host with its exec'd
 * images.  Images come in that order: hosts by name, processes by pid, each
 * image before those exec'd from it.  A forked child that did not exec
 * shares its parent's image: its threads are among the image's, with their
 * own pid (an_thread.pid).  A process of a collected tree whose meta cannot be
 * read is an image all the same (pid 0, program "?"; an_session_trace fails).
 */
typedef struct an_image {
	const char *dir;         /* its trace directory */
	const char *host;        /* collected: the OUT/<host> name; else meta's host, "" */
	uint32_t pid;            /* meta's pid */
	const char *program;     /* meta's program, "?" if none */
	size_t exec_of;          /* the image that exec'd it, AN_NONE for a first one */
} an_image;

typedef struct an_session an_session;

/* -1 with err when DIR is neither a trace (DIR/meta) nor a collected tree
 * with at least one trace.  An image that cannot be read is a warning. */
int an_session_open(const char *dir, const an_open_opts *opt, an_session **out, sp_err *err);
void an_session_close(an_session *s);
int an_session_collected(const an_session *s);       /* 1: a tree of `sptrace collect` */
size_t an_session_nimages(const an_session *s);
const an_image *an_session_image(const an_session *s, size_t i);
/* Image i's trace, opened on first use with the session's options; NULL
 * when it cannot be opened (a warning says why).  Closed with the session. */
an_trace *an_session_trace(an_session *s, size_t i);
size_t an_session_nwarnings(const an_session *s);
/* The records lost in all the session's images (their ring headers only). */
void an_session_lost(an_session *s, an_lost *l);
const char *an_session_warning(const an_session *s, size_t i);

/* The records of every thread of every image, merged in time order: by
 * CLOCK_REALTIME (each image's clocks, an_realtime_ns: hosts' clocks are
 * only as close as they are synchronised), ties by image then tid.  One
 * streaming iterator per thread is open meanwhile. */
typedef struct an_event {
	size_t image;
	const an_thread *thread;
	an_record rec;
	int64_t ns;              /* an_realtime_ns of rec.tsc */
} an_event;

typedef struct an_merge an_merge;

int an_merge_open(an_session *s, an_merge **out, sp_err *err);
/* 1 and *ev: the next record; 0: no more. */
int an_merge_next(an_merge *m, an_event *ev);
void an_merge_close(an_merge *m);


/* ---- flows (flows.c) ---- */

/*
 * A session's records separated into flows, one per request or job: a flow
 * starts at a start event (an activation, or the accept or receive tracing
 * began at; a receive from outside the session: a new request) and follows
 * its thread; a receive of bytes a traced send of the session sent joins
 * the sender's flow, in another process or on another host.  The rules, in
 * full, are above their code in flows.c.
 */
typedef struct an_flow_proc {
	const char *host;        /* an_image.host */
	uint32_t pid;
} an_flow_proc;

/* A run of one thread's records in a flow. */
typedef struct an_flow_part {
	size_t image;            /* an image of the session */
	uint32_t pid, tid;
	int64_t start_ns, end_ns; /* CLOCK_REALTIME of its first and last records */
	uint64_t events;
	int64_t work_start_ns;   /* the time of its first message when that was a
				    receive (a request arrived: what the thread did
				    before was waiting for it), else start_ns */
	int64_t work_end_ns;     /* the return of its last message's call when that
				    was a send (a request answered: what the thread
				    does after, until its next flow, is waiting),
				    else end_ns */
} an_flow_part;

typedef struct an_flow {
	char id[24];             /* "f1", "f2", ... in the order of their start */
	size_t image;            /* where it starts: an image of the session, */
	const char *host;        /* its host, */
	uint32_t pid, tid;       /* the process and thread, */
	const char *event;       /* and the event: "start", "call", "timer", "signal",
				    "accept", "recv", "activate", "attach",
				    "thread" (a thread that began tracing on its own)
				    or "func" (a call of a start function) */
	int64_t start_ns, end_ns; /* CLOCK_REALTIME of its first and last records */
	uint64_t events;         /* its records (an_record: calls' entries and exits,
				    events, messages) */
	uint32_t starts;         /* the request starts it holds (an accept, a receive
				    from outside, a start function's call, an
				    activation but the program's start, which a
				    child's continuation shares): more than 1 breaks
				    rule 8 */
	an_flow_proc *procs;     /* the processes it crossed, its start's first */
	size_t nprocs;
	an_flow_part *parts;     /* its runs of records, by start */
	size_t nparts;
} an_flow;

typedef struct an_flows an_flows;

/*
 * A receive joined to the send whose bytes it read (rule 5 of flows.c): the
 * edges of the session's graph, for exports' arrows.  Each end is a message
 * record (an_record.tsc) of a thread of an image; a send read in several
 * receives has a match per receive, a receive of several sends one match,
 * with the first of them.
 */
typedef struct an_msg_match {
	size_t send_image;
	uint32_t send_tid;
	uint64_t send_tsc;
	size_t recv_image;
	uint32_t recv_tid;
	uint64_t recv_tsc;
	int64_t send_ns, recv_ns; /* their CLOCK_REALTIME, clocks aligned (rule 7);
				    INT64_MIN if an image cannot be read */
} an_msg_match;

/*
 * A host whose clock was aligned to another's from the messages between
 * them (rule 7 of flows.c): an_flows_build moves the session's clocks (every
 * an_realtime_ns after it) by these offsets.
 */
typedef struct an_clock {
	const char *host;
	int64_t offset_ns;       /* added to its CLOCK_REALTIME */
	const char *to;          /* the host it was aligned to */
	size_t messages;         /* the messages between the two */
	int both_ways;           /* messages went both ways (else: one bound only) */
} an_clock;

/* Start functions (`--start FUNC`): each outermost call of one of these
 * functions (by name, as replay prints it) starts a flow of its own, event
 * "func", which ends at its return (rule 1 of flows.c). */
typedef struct an_flows_opts {
	const char *const *start;
	size_t nstart;
	/* Join directives beside those of the traces' meta (rules 9 and 10 of
	 * flows.c): FUNC:scope ones make scopes; value ones (FUNC:entry:argN,
	 * FUNC:exit:ret) add nothing: their values are those the agent
	 * recorded. */
	const char *const *join;
	size_t njoin;
} an_flows_opts;

int an_flows_build(an_session *s, an_flows **out, sp_err *err);
int an_flows_build_opts(an_session *s, const an_flows_opts *o, an_flows **out, sp_err *err);
size_t an_flows_nclocks(const an_flows *f);
/* Rule 8: matched receives that precede their sends, after rule 7. */
size_t an_flows_nbackwards(const an_flows *f);
/* Rule 9: join values taken (their taker joined the giver's flow), and
 * values given that nothing took (rule 8's breach). */
size_t an_flows_ntakes(const an_flows *f);
size_t an_flows_nuntaken(const an_flows *f);

/*
 * The critical path of flow i (flows.c, "Critical path"): where its time
 * went from its start to the last record of the thread it started on,
 * across threads, processes and hosts, as runs of one thread each,
 * earliest first; the runs cover that span once (but for what no thread of
 * the flow did: messages in flight).  *out is malloc'ed.
 */
typedef struct an_crit_step {
	size_t image;
	uint32_t pid, tid;
	int64_t from_ns, to_ns;  /* CLOCK_REALTIME, aligned (rule 7) */
	int via;                 /* it ends where a message left for the next step */
} an_crit_step;

int an_flows_critical_path(const an_flows *f, size_t i, an_crit_step **out, size_t *n,
			   sp_err *err);
const an_clock *an_flows_clock(const an_flows *f, size_t i);
size_t an_flows_count(const an_flows *f);
const an_flow *an_flows_get(const an_flows *f, size_t i);
/* The flow of this id ("f3"), its index in *index (may be NULL); NULL if
 * none. */
const an_flow *an_flows_find(const an_flows *f, const char *id, size_t *index);
size_t an_flows_nmatches(const an_flows *f);
const an_msg_match *an_flows_match(const an_flows *f, size_t i);
void an_flows_free(an_flows *f);


/* ---- anomalies (anomaly.c) ---- */

/*
 * Which request, process or host of a session behaved differently, and the
 * call path most likely the cause: a fail-stop (the earliest last record),
 * else suspect scores over call-path time and coverage profiles (k-th
 * nearest neighbour, Manhattan distance; with `normal`, the distance to the
 * nearest known-normal unit, against a threshold learnt from `normal`
 * itself).  The rules are above their code in anomaly.c.  Paths run from
 * the outermost function to the culprit, by name; the strings live as long
 * as the result.
 */
enum an_unit_kind {
	AN_UNITS_AUTO = 0,       /* flows when the session has 3 or more, else processes */
	AN_UNITS_PROCESS,
	AN_UNITS_FLOW,
	AN_UNITS_HOST,
};

typedef struct an_cause {
	const char **path;
	size_t npath;
	const char *kind;        /* "time" (a share of time), "coverage" (a path
				    taken, or not taken, unlike the others),
				    "communication" (messages sent or received
				    through a path) or "interval" (when the
				    culprit showed) */
	char why[256];
} an_cause;

#define AN_MAX_CAUSES 6

typedef struct an_suspect {
	int kind;                /* enum an_unit_kind: process, flow or host */
	const char *flow;        /* a flow: its id (an_flow.id); else NULL */
	const char *host;
	uint32_t pid;            /* a flow: the process it started in; a host: 0 */
	double score;            /* seconds (earliest-last-timestamp), else a distance */
	const char *method;      /* "earliest-last-timestamp", "knn-manhattan",
				    "nearest-normal" */
	int failstop;
	int flagged;             /* nearest-normal: score above the threshold; a
				    fail-stop: 1; knn-manhattan: -1 (no reference) */
	double threshold;        /* nearest-normal: the farthest a unit of the
				    reference is from its nearest other one */
	const char **path;       /* the culprit's call path (npath 0: none) */
	size_t npath;
	const char *nearest;     /* flows: the id of the flow it was compared with (its
				    nearest neighbour, or with `normal` the nearest
				    flow of the reference), else NULL */
	an_cause causes[AN_MAX_CAUSES]; /* the evidence, the culprit's first; then, for
					   the most suspect, when the culprit showed
					   (kind "interval") */
	size_t ncauses;
	int64_t first_ns;           /* the unit's first record (CLOCK_REALTIME, clocks
				       aligned), where the interval's offsets count from */
	int64_t interval_from_ns, interval_to_ns; /* the "interval" cause's, absolute; 0, 0:
						     none */
} an_suspect;

typedef struct an_anomalies an_anomalies;

/* Which profiles the distance compares (anomaly.c, point 2). */
enum an_profile {
	AN_PROFILE_COMPOSITE = 0,  /* time, coverage and communication */
	AN_PROFILE_TIME,
	AN_PROFILE_COVERAGE,
	AN_PROFILE_COMMUNICATION,
};

typedef struct an_anomaly_opts {
	int units;               /* enum an_unit_kind */
	int profile;             /* enum an_profile */
	int sites;               /* call paths name each call's site: "callee@caller+0xOFF"
				    (two calls of f from one function are two paths) */
	an_flows_opts flows;     /* start functions: each call a flow, and the
				    root of the call paths under it */
} an_anomaly_opts;

/* The session's units, most suspect first; `normal`: known-normal traces
 * or NULL; `o` NULL: the defaults (all zero). */
int an_anomalies_find(an_session *s, an_session *normal, const an_anomaly_opts *o,
		      an_anomalies **out, sp_err *err);
/* The kind of unit chosen (AN_UNITS_AUTO resolved). */
int an_anomalies_kind(const an_anomalies *a);
size_t an_anomalies_count(const an_anomalies *a);
const an_suspect *an_anomalies_get(const an_anomalies *a, size_t i);
void an_anomalies_free(an_anomalies *a);


/* ---- exports (export.c; writers export_perfetto.c, export_chrome.c) ---- */

/*
 * The session as a file a trace viewer opens: "perfetto" (Perfetto's
 * TrackEvent protobuf: a track per process and thread, a slice per call, an
 * instant per event and message, a flow arrow from each send to the receive
 * that read it) or "chrome" (Trace Event JSON).  Pids unique per file (a
 * second host's pid gets a number above the kernel's largest), the host in
 * each process's name, times each host's CLOCK_REALTIME (aligned, rule 7).
 */
typedef struct an_export_opts {
	const char *format;      /* "perfetto" or "chrome" */
	const char *flow;        /* only this flow's records (an_flow.id), or NULL */
	uint64_t max_bytes;      /* refuse to write more; 0: no limit */
	/* about once a second while it runs, and at the end when it took one at
	 * least (NULL: none) */
	void (*progress)(void *arg, uint64_t done, uint64_t total, uint64_t bytes);
	void *arg;
} an_export_opts;

#define AN_EXPORT_TOO_BIG (-2)

/* 0; -1 with err (an unknown format or flow, out of memory, a write's
 * error); AN_EXPORT_TOO_BIG: the file would pass max_bytes (refused before
 * any work when the records alone would, else stopped: what out holds is
 * not a whole file). */
int an_export(an_session *s, FILE *out, const an_export_opts *o, sp_err *err);

#endif
