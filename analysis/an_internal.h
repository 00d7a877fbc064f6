/*
 * an_internal.h — the analysis library's private structures, shared by its
 * source files and by nothing else (analysis.h is the interface).
 *
 *   trace.c     an_trace_open/close, accessors, clocks, helpers for printers
 *   meta.c      the meta file: an_meta (every command's one reader) and the
 *               trace's own parse of it (clocks, module lines)
 *   modules.c   the code analysis of every traced module
 *   demangle.c  C++ names as uftrace shows them
 *   names.c     the sites file; functions and sites by name
 *   msgs.c      the channels file; message and channel texts
 *   rings.c     ring headers and drained segments (seg.<tid>)
 *   iter.c      a thread's records, streamed, with full timestamps
 *   pack.c      packed.<tid>: sptrace run's compact blocks, written and read
 *   calls.c     entries paired with exits: a thread's call tree
 *   session.c   processes of a trace: exec'd images, children, hosts
 *   flows.c     flows: activations followed across threads and messages
 *   profile.c   the units of an analysis (flows, processes, hosts) and their
 *               profiles: time, coverage, communication; roles; distances
 *   anomaly.c   which unit behaved differently (fail-stop, suspect scores)
 *   cause.c     the likely cause: evidence, culprit, when
 *   export.c    a session as a trace viewer's file; the writers:
 *   export_perfetto.c, export_chrome.c
 *   map.c       a small hash map
 */
#ifndef AN_INTERNAL_H
#define AN_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "analysis.h"

/* Limits past which a file is corrupt rather than large. */
#define RING_MAX_CAPACITY (1ull << 36)   /* 512 GiB of records */
#define RING_MAX_COUNT (1ull << 56)      /* 2 years at 10^9 records/s */
#define RING_MAX_HEADER (1u << 20)
#define RING_FIXED_HEADER offsetof(trace_ring_header, reserved)

/* ---- map.c: (a, b) -> uint32, for function identities and the open calls ---- */

typedef struct map_slot {
	uint64_t a, b;
	uint32_t val;
	uint32_t used;
} map_slot;

typedef struct map {
	map_slot *slot;
	size_t cap, n;           /* cap: a power of two or 0 */
} map;

typedef struct meta_kv {
	char *key, *val;
	size_t line;             /* its line number in the file */
} meta_kv;

typedef struct module {
	an_module pub;
	ca_module *ca;
	size_t line;             /* of its line in meta */
	/* The kernel's module line (TRACE_KERNEL_MODULE_PATH): its functions'
	 * names from kernel.syms, sorted by address (modules.c). */
	struct an_kname { uint64_t addr; char *name; } *knames;
	size_t nknames;
} module;
typedef struct an_kname an_kname;

/* Distinct bad site ids given their own "?site N" entry; more share one. */
#define MAX_BAD_SITES 4096

struct an_trace {
	char *dir;
	an_meta *meta;           /* the meta file; module paths point into it */
	uint64_t tsc_hz, tsc0;
	int64_t mono0, real0;
	int64_t align_ns;        /* added to CLOCK_REALTIME: flows.c rule 7 */
	module *mods;            /* sorted by index */
	size_t nmods, capmods;
	trace_site *raw_sites;
	an_site_info *sites;     /* nsites entries; id 0 is never valid */
	size_t nsites;
	map bad_ids;             /* bad site id -> 1 + index in bad[] */
	an_site_info **bad;      /* "?site N" entries, made on first use */
	size_t nbad, capbad;
	an_site_info *bad_many;  /* "?site": beyond MAX_BAD_SITES */
	an_func **funcs;         /* each allocated once, so pointers stay valid */
	size_t nfuncs, capfuncs;
	map func_ids;            /* (module, addr) -> function index */
	int demangle;            /* enum an_demangle */
	map demangled_ids;       /* (module, ca_func index) -> 1 + index in demangled[] */
	char **demangled;        /* symbols as shown, each demangled once */
	size_t ndemangled, capdemangled;
	an_thread *threads;
	size_t nthreads, capthreads;
	char **warn;
	size_t nwarn, capwarn;
	uint64_t start_tsc;
	trace_channel *chans;    /* the channels file; nchans records, [0] no channel */
	size_t nchans;
	an_msg *msgs;            /* message events of the call trees built so far */
	size_t nmsgs, capmsgs;
	int64_t *values;         /* value events (TRACE_EV_VALUE) of the call trees so far */
	size_t nvalues, capvalues;
	an_budget *budget;       /* budget events of the call trees built so far */
	size_t nbudget, capbudget;
};

/* A position in a thread's records where the TSC's high bits are known. */
struct reset {
	size_t pos;
	uint64_t epoch;
};

typedef struct seg_chunk {
	off_t off;               /* file offset of its first record */
	size_t pos;              /* its first record among the thread's kept ones */
	uint64_t n;
	uint64_t epoch;          /* trace_seg_chunk.epoch */
	int after_gap;           /* records were lost just before it */
} seg_chunk;

typedef struct seg_data {
	size_t n;                /* records kept */
	uint64_t end;            /* index after the last chunk's last record */
	seg_chunk *chunks;       /* with want_chunks */
	size_t nchunks, capchunks;
	int fd;                  /* with want_chunks: the file, else -1 */
} seg_data;

/* ---- map.c ---- */
map_slot *an_map_find(const map *m, uint64_t a, uint64_t b);
map_slot *an_map_get(map *m, uint64_t a, uint64_t b);
void an_map_free(map *m);

/* ---- trace.c ---- */
/* Remember a warning (printf style).  Out of memory loses the warning only. */
__attribute__((format(printf, 2, 3)))
void an_warn(an_trace *t, const char *fmt, ...);
/* Read a whole small regular file (never a FIFO, a device or a link: see
 * sp_open_regular).  0 and *buf (NUL-terminated) or -1 with errno. */
int an_slurp(const char *path, size_t max, char **buf, size_t *len);
const char *an_errno_text(int e);

/* ---- meta.c ---- */
int an_parse_u64(const char *s, int base, uint64_t *out);
int an_read_meta(an_trace *t, sp_err *err);
module *an_module_by_index(an_trace *t, uint32_t index);

/* ---- modules.c, demangle.c, names.c, msgs.c ---- */
void an_load_module(an_trace *t, module *m, const char *repo);
const char *an_kernel_name(const module *m, uint64_t addr);  /* NULL: not known */
void an_module_free(module *m);
const char *an_symbol_name(an_trace *t, const module *m, uint32_t fi);
int an_read_sites(an_trace *t, sp_err *err);
int an_name_sites(an_trace *t, sp_err *err);
int an_read_channels(an_trace *t, sp_err *err);

/* ---- rings.c ---- */
int an_read_rings(an_trace *t, sp_err *err);
int an_read_full(int fd, void *buf, size_t len, off_t off);
int an_ring_open(const char *path, trace_ring_header *h, uint64_t *said, sp_err *err);
int an_is_sync(uint64_t r);
int an_add_reset(struct reset **r, size_t *n, size_t pos, uint64_t epoch);
int an_seg_read(const char *ring_path, seg_data *sd, int want_chunks, sp_err *err);
void an_dir_lost_add(const char *dir, an_lost *l);

/* ---- pack.c: packed.<tid> (trace_format.h, "Packed blocks") ---- */
typedef struct pack_blk {
	off_t off;               /* file offset of its header */
	trace_pack_block h;
	int bad;                 /* damaged: its records are read raw, or lost */
} pack_blk;

typedef struct pack_data {
	char path[PATH_MAX];     /* packed.<tid> */
	int fd;                  /* open while blocks are read; -1: no file */
	pack_blk *blks;          /* the whole blocks, in order */
	size_t nblks, cap;
	uint64_t end;            /* index after the last valid block's records */
	off_t size, valid_len;   /* the file's bytes; those of the valid blocks */
	off_t bad;               /* the first invalid block's offset; -1: none */
	char why[96];            /* ... what is wrong with it */
	int cut;                 /* ... it is the file's last, cut short */
} pack_data;

void an_pack_path(const char *ring_path, char *out, size_t len);
int an_pack_scan(const char *ring_path, pack_data *pd, int check, int fd_rw, sp_err *err);
int an_pack_decode(const pack_data *pd, size_t k, uint64_t *rec, const char **why);
uint64_t an_pack_raw_from(int ring_fd, const trace_ring_header *h, uint64_t end, uint64_t top);
void an_pack_free(pack_data *pd);

/* ---- profile.c, anomaly.c, cause.c: the units of an analysis, their
 * profiles, scores and causes (the rules: anomaly.c's numbered points) ---- */

#define TIME_CLEAR 0.10              /* point 6: a time culprit's share; point 5 */

typedef struct node {
	uint32_t parent;                 /* AN_NONE: a root */
	uint32_t name;                   /* index in names */
} node;

typedef struct entry {
	uint32_t node;
	double ns;
} entry;

/* A unit's messages through one call path, one way (point 2). */
typedef struct comm {
	uint32_t node;                   /* the innermost call open at the message */
	uint32_t recv;                   /* 1 received, 0 sent */
	uint64_t n, bytes;
} comm;

/* A unit's time in a program (point 4, hosts). */
typedef struct prog_time {
	uint32_t prog;                   /* a name */
	double ns;
} prog_time;

typedef struct unit {
	char *host;
	uint32_t pid;
	char *flow;                      /* a flow's id, NULL otherwise */
	int normal;                      /* from --normal REF */
	map idx;                         /* node -> 1 + index in e: its coverage */
	entry *e;
	size_t ne, cap;
	double total;
	map cidx;                        /* (node, recv) -> 1 + index in cm */
	comm *cm;                        /* by (node, recv) once profiled */
	size_t ncm, capcm;
	uint64_t sends, bytes;           /* all its messages sent, bytes either way */
	prog_time *pt;                   /* the programs it ran, their time */
	size_t npt;
	uint32_t prog;                   /* point 4: the program it spent most time in */
	int64_t first_ns, last_ns;
	uint32_t last_node;              /* point 3's culprit */
	uint32_t role;                   /* point 4: a root node, AN_NONE if none */
	uint64_t last_open_t0;           /* the innermost open call's entry, or 0 */
	uint64_t last_t1;
	uint32_t dense, row;             /* its row in the dense profiles of its role */
} unit;

/*
 * The profiles of a role's units as dense rows, for the distances (point
 * 2): a column per call path any unit of the role entered, the time shares
 * in fixed point (SHARE_ONE = all of a unit's time) and the coverage as a
 * bit set.  A role's distances then cost a pass over two rows each, not a
 * hash lookup per path.
 */
#define SHARE_ONE (1u << 24)

typedef struct dense {
	uint32_t role, prog;
	map col;                         /* node -> 1 + column */
	size_t ncols, words, nrows;
	uint32_t *share;                 /* nrows x ncols */
	uint64_t *bits;                  /* nrows x words */
	uint32_t *pop;                   /* nrows: paths entered */
	uint32_t *unit_of;               /* nrows: each row's unit */
	map ccol;                        /* (node, recv) -> 1 + communication column */
	size_t nccols;
	uint8_t *crecv;                  /* nccols: the column's messages were received */
	uint32_t *cn;                    /* nrows x nccols: messages */
	uint64_t *cb;                    /* nrows x nccols: bytes */
	double threshold;                /* point 5, computed once */
	int has_threshold;
} dense;

/* The part of a thread's time that belongs to a unit (point 2). */
typedef struct window {
	int64_t t0, t1;
	uint32_t unit;
} window;

/* A thread's window, kept for point 7. */
typedef struct part_ref {
	size_t image;
	uint32_t tid;
	window w;
} part_ref;

/* The kinds of evidence (point 6). */
enum cause_kind { K_TIME, K_COVER, K_COMM, NKINDS };

/* Point 7: a second sweep of one unit collects where its culprit's time
 * went. */
typedef struct stretch {
	int64_t t0, t1;
} stretch;

typedef struct collect {
	int kind;                        /* K_TIME: the time in the path itself; K_COVER:
					    under it; K_COMM: its messages one way */
	uint32_t node;
	int recv;
	stretch *s;
	size_t n, cap;
} collect;

struct an_anomalies {
	int kind;
	int profile;                     /* enum an_profile */
	int sites;                       /* call paths name call sites (point 2) */
	an_flows_opts flow_opts;         /* start functions */
	char **names;
	size_t nnames;
	map name_ids;                    /* (hash, 0) -> 1 + name index */
	node *nodes;
	size_t nnodes;
	map node_ids;                    /* (parent + 1, name) -> 1 + node index */
	unit *units;
	size_t nunits;
	dense *dn;
	size_t ndn;
	an_suspect *sus;
	size_t nsus;
	part_ref *parts;                 /* the session's units' windows (not REF's), by
					    thread and start, for point 7 */
	size_t nparts, capparts;
};

/* The culprit of point 6, for point 7. */
typedef struct culprit {
	int kind;                        /* enum cause_kind, -1: none */
	uint32_t node;
	int recv;                        /* communication: the messages' way */
	double share;                    /* time: the compared unit's share of the path */
} culprit;

/* profile.c: units and their profiles (points 1, 2 and 4's roles) */
uint32_t an_name_id(an_anomalies *a, const char *name);
int an_units_profile(an_anomalies *a, an_session *s, int normal, sp_err *err);
/* Point 7's second sweep of one thread: collects into col, profiles nothing. */
int an_thread_profile(an_anomalies *a, an_trace *t, const an_thread *th, const window *w,
		      size_t nw, int whole, collect *col, sp_err *err);
int an_unit_role(const an_anomalies *a, unit *u);
bool an_same_role(const unit *x, const unit *y);
int an_make_dense(an_anomalies *a);
double an_distance(const an_anomalies *a, const unit *x, const unit *y);
double an_time_of(const unit *u, uint32_t nd);
bool an_covers(const unit *u, uint32_t nd);
const comm *an_comm_of(const unit *u, uint32_t nd, int recv);
int an_path_of(const an_anomalies *a, uint32_t nd, const char ***out, size_t *n);
const char *an_unit_name(const unit *u, char *buf, size_t len);

/* cause.c: the causes and the culprit (point 6), when (point 7) */
__attribute__((format(printf, 3, 4)))
void an_say(char *buf, size_t len, const char *fmt, ...);
int an_causes(const an_anomalies *a, const unit *u, const unit *v, const map *count,
	      int self_counted, size_t npeers, const char *others, an_suspect *s,
	      culprit *cul);
int an_add_interval(an_anomalies *a, an_session *s, uint32_t ui, const culprit *cul,
		    an_suspect *sp, sp_err *err);

/* ---- export.c and its writers, one file per format (export_perfetto.c,
 * export_chrome.c).
 *
 * export.c walks the session, thread after thread, and calls a writer's
 * functions in an order every format can rely on:
 *   - a process before any of its threads, a thread before any of its
 *     events (each once, ids unique per host: remapped, see cmd_export.c);
 *   - on one thread, times never go back: each begin is matched by one end
 *     (nested as calls are), an instant lies between them.
 * Times are CLOCK_REALTIME nanoseconds of each record's host.  A writer
 * returns 0, or -1 with errno set (EFBIG: the output passed the size limit).
 */

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
	/* a call: entered at t0, ends at t1 (given again to end); `corr`: the
	 * number of the flow it belongs to (f3: 3), 0 if none */
	int (*begin)(ex_writer *w, uint64_t track, const char *name, int64_t t0, int64_t t1,
		     uint64_t corr);
	int (*end)(ex_writer *w, uint64_t track, int64_t t1);
	/* an event; a message starts the flows `out` and ends the flows `in` */
	int (*instant)(ex_writer *w, uint64_t track, const char *name, int64_t t, uint64_t corr,
		       const uint64_t *out, size_t nout, const uint64_t *in, size_t nin);
	/* 0 after the last bytes were written; frees w either way */
	int (*close)(ex_writer *w);
	uint64_t (*bytes)(const ex_writer *w);
} ex_format;

extern const ex_format ex_perfetto;
extern const ex_format ex_chrome;

#endif
