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
 *   ring.<tid>      one file per traced thread: a trace_ring_header, then
 *                   its 8-byte records, mapped shared by the agent so the
 *                   records survive a crash of the process.  Two layouts
 *                   (the header's `chunk`, see "Rings and chunks" below):
 *                   a ring (flight-recorder mode) or every record in order
 *                   (`sptrace run`, the default).
 *   packed.<tid>    `sptrace run` (the default mode, unless --no-compact):
 *                   ring.<tid>'s records re-encoded compactly, in blocks
 *                   (trace_pack_block, "Packed blocks" below); the raw
 *                   records a block holds are punched out of ring.<tid>.
 *   channels        the channel table: one fixed-size trace_channel record
 *                   per channel id (a socket or pipe the program sent or
 *                   received on), appended like sites; empty in a process
 *                   (family) that met none; absent in traces of agents
 *                   without message events.
 *   seg.<tid>       traces of format version 1 only: the records `sptrace
 *                   run` copied from ring.<tid> before the ring came round
 *                   to them: chunks of a trace_seg_chunk and its records.
 *                   The thread's records are the chunks', then the ring's
 *                   from where the last chunk ends.  Version 2 writes none
 *                   (the agent keeps every record in ring.<tid> itself).
 *   kernel.<tid>    `sptrace run --kernel`: the kernel functions thread tid
 *                   ran, recorded by the kernel module (kagent/): an array
 *                   of trace_kernel_rec in time order, written by sptrace
 *                   after the program ended.  Their sites are those of the
 *                   module line whose path is TRACE_KERNEL_MODULE_PATH
 *                   (added to meta then), named by kernel.syms.  Readers
 *                   merge them with the thread's records by TSC (the
 *                   kernel and the agent read the same TSC), so a system
 *                   call's kernel functions nest under the call.
 *   kernel.syms     text, one "ADDR-HEX NAME" per line: the kernel
 *                   functions of those sites, by their run-time address
 *                   (the module line's bias is 0).
 *   .spare          `sptrace run` only, while it runs (a killed run may
 *                   leave it): empty files, directories and FIFOs made
 *                   ahead (spare.f.N, spare.d.N, spare.p.N), which an agent
 *                   renames into place instead of creating its own
 *                   (agent/spare.c).  No reader looks into it; it holds no
 *                   records.
 *
 * Records are written without locks or system calls.  A full ring overwrites
 * its oldest records; the header's write count says how many were ever
 * written, so a reader knows how many were lost (count - capacity).  In the
 * keep-every-record layout nothing is overwritten: the lost records, if
 * any, are those from `kept_end` on (the file could not grow).
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
#include <string.h>

/* The stock of spare inodes (agent/spare.c explains the protocol): its
 * directory in the top trace directory and how many slots of each kind,
 * named TRACE_SPARE_PREFIX KIND "." N with KIND f (file), d (directory) or
 * p (FIFO) and N below the kind's count. */
#define TRACE_SPARE_DIR ".spare"
#define TRACE_SPARE_PREFIX "spare."
#define TRACE_SPARE_FILES 16
#define TRACE_SPARE_DIRS 4
#define TRACE_SPARE_FIFOS 4

#define TRACE_RING_MAGIC 0x31474e4952505354ull /* "TSPRING1" little-endian */
#define TRACE_FORMAT_VERSION 2
/* Readers take versions 1 (rings, and seg.<tid> drained by sptrace run)
 * and 2 (the header's chunk, limit and kept_end: the layouts below). */
#define TRACE_FORMAT_VERSION_MIN 1

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
	TRACE_EV_MSG_SEND = 10,  /* message events: see below */
	TRACE_EV_MSG_RECV = 11,
	TRACE_EV_MSG_DATA = 12,
	TRACE_EV_AGENT_BEGIN = 13, /* the agent's own work on this thread: see below */
	TRACE_EV_AGENT_END = 14,
	TRACE_EV_VALUE = 15,     /* a join directive's value: see below */
	TRACE_EV_BUDGET = 16,    /* overhead budget events: see below */
	TRACE_EV_COUNT = 17,
	TRACE_EV_COUNT_DATA = 18,
};

/*
 * Values (join directives, `sptrace run --join`): the agent records an
 * integer argument of a named function at its call's entry (FUNC:entry:argN,
 * the SysV register of argument N, 1..6), or its return value (FUNC:exit:ret,
 * rax), in one TRACE_EVENT record written right after the call's ENTRY, or
 * right before its EXIT (agent/x86_64/emit.c).  One record, so that it
 * takes one slot like any other: its id field is not a bare event id.
 *
 *   id bits 0..7    TRACE_EV_VALUE
 *   id bits 8..10   the argument: 1..6, or 0 for the return value
 *   id bits 11..23  value bits 38..50
 *   timestamp bits  value bits 0..37
 *
 * The value is bits 0..50, sign-extended from bit 50: pointers of user
 * space and integers in [-2^50, 2^50) come back exact; others lose their
 * bits 51..63 (equal values still compare equal).  An argument's time is
 * the record before's (its call's ENTRY), a return value's the EXIT's after
 * it (a SYNC may come between).  Readers take a record whose id's low 8
 * bits are TRACE_EV_VALUE as a value (trace_value_unpack).
 */
#define TRACE_VALUE_BITS 51

/* A join directive (meta's "join" lines, `--join`): "FUNC:entry:argN" (N
 * 1..6), "FUNC:exit:ret" or "FUNC:scope"; FUNC as replay names it (it may
 * hold "::": the fields are taken from the right).  Returns the kind and
 * sets *name_len (FUNC's length) and *arg (N; 0 for the others), or -1
 * when the directive is malformed. */
enum trace_join_kind { TRACE_JOIN_ENTRY = 1, TRACE_JOIN_EXIT, TRACE_JOIN_SCOPE };

static inline int trace_join_parse(const char *d, unsigned long *name_len, unsigned *arg)
{
	static const char scope[] = ":scope", ret[] = ":exit:ret", entry[] = ":entry:arg";
	unsigned long n = strlen(d);

	*arg = 0;
	if (n > 6 && strcmp(d + n - 6, scope) == 0) {
		*name_len = n - 6;
		return TRACE_JOIN_SCOPE;
	}
	if (n > 9 && strcmp(d + n - 9, ret) == 0) {
		*name_len = n - 9;
		return TRACE_JOIN_EXIT;
	}
	if (n > 11 && strncmp(d + n - 11, entry, 10) == 0 && d[n - 1] >= '1' && d[n - 1] <= '6') {
		*name_len = n - 11;
		*arg = (unsigned)(d[n - 1] - '0');
		return TRACE_JOIN_ENTRY;
	}
	return -1;
}

static inline uint32_t trace_value_id(unsigned arg, uint64_t value)
{
	return TRACE_EV_VALUE | (arg & 7) << 8 | (uint32_t)((value >> 38) & 0x1fff) << 11;
}

static inline int trace_event_is_value(uint32_t id)
{
	return (id & 0xff) == TRACE_EV_VALUE;
}

static inline int64_t trace_value_unpack(uint32_t id, uint64_t payload, unsigned *arg)
{
	uint64_t v = (payload & ((1ull << 38) - 1)) | (uint64_t)((id >> 11) & 0x1fff) << 38;

	*arg = (id >> 8) & 7;
	return (int64_t)(v << (64 - TRACE_VALUE_BITS)) >> (64 - TRACE_VALUE_BITS);
}

/*
 * The agent's own time: a thread that reaches a function not instrumented
 * yet instruments it (and waits for another thread doing so) between an
 * AGENT_BEGIN and an AGENT_END, inside whatever call it was making.  That
 * time is the tracer's, not the program's: readers that profile leave it
 * out (analysis/anomaly.c), replay does not show the pair.  No calls are
 * recorded between the two.  The same pair brackets the agent's other work
 * on a program's thread that makes system calls: the rest of a start
 * activation after the root's ENTRY, classifying a descriptor the first
 * time a message moves on it, and fork's handlers in the parent.  Kernel
 * records (kernel.<tid>) that fall between the two are the agent's and
 * are not read.
 */

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

/*
 * The overhead budget (`sptrace run --budget PERCENT`, agent/budget.c).
 * The agent may demote a site whose calls are short and frequent from
 * timing (an ENTRY and an EXIT per call) to counting (a per-thread counter,
 * no record), and promote it back.  Like the context events these carry a
 * 38-bit payload in place of the timestamp; their time is that of the
 * record before.
 *
 *   BUDGET p       from here on (in every thread of the process) the calls
 *                  through site trace_budget_site(p) are
 *                  trace_budget_mode(p): TRACE_BUDGET_COUNTED or, promoted
 *                  back, TRACE_BUDGET_TIMED.  Written into the ring of the
 *                  thread that decided.
 *   COUNT site     followed by one COUNT_DATA n, the pair taken at once:
 *                  n more calls through `site` were made by this thread
 *                  without records since its last COUNT of that site.  A
 *                  thread writes its counts now and then (when its file moves
 *                  on a chunk), when it ends and when the trace ends; a
 *                  process killed in between loses its unwritten counts.
 *
 * 1 counted call in 256 of a thread is timed instead (a sample: its ENTRY and EXIT
 * are written as usual and not counted): a sampled call of 1 us or more
 * promotes the site back.  So the calls through a site are its ENTRY
 * records plus its COUNT records' sums, exactly.
 */
enum { TRACE_BUDGET_TIMED = 0, TRACE_BUDGET_COUNTED = 1 };

static inline uint64_t trace_budget_pack(uint32_t site, unsigned mode)
{
	return (uint64_t)(site & TRACE_ID_MAX) | (uint64_t)(mode & 3) << TRACE_ID_BITS;
}

static inline uint32_t trace_budget_site(uint64_t p) { return (uint32_t)(p & TRACE_ID_MAX); }
static inline unsigned trace_budget_mode(uint64_t p) { return (unsigned)(p >> TRACE_ID_BITS) & 3; }

static inline int trace_event_is_budget(uint32_t ev)
{
	return ev == TRACE_EV_BUDGET || ev == TRACE_EV_COUNT || ev == TRACE_EV_COUNT_DATA;
}

static inline int trace_event_is_msg(uint32_t ev)
{
	return ev == TRACE_EV_MSG_SEND || ev == TRACE_EV_MSG_RECV;
}

static inline int trace_event_is_agent(uint32_t ev)
{
	return ev == TRACE_EV_AGENT_BEGIN || ev == TRACE_EV_AGENT_END;
}

static inline uint64_t trace_ctx_key(const void *ucp)
{
	return ((uint64_t)(uintptr_t)ucp * 0x9e3779b97f4a7c15ull) >> (64 - TRACE_TSC_LOW_BITS);
}

/*
 * Message events: the program sent or received bytes on a socket or a pipe
 * (agent/msgs.c writes them, analysis/trace_read.c reads them).
 *
 *  1. One message is five records, taken with one atomic add so that a
 *     signal handler recording on the same thread cannot come between them:
 *     a head, TRACE_EVENT TRACE_EV_MSG_SEND or TRACE_EV_MSG_RECV, whose
 *     timestamp is, for a send, the time the call began (after any wait of
 *     the agent's own: propagation), for a receive the time it returned --
 *     so a receive never shows before the send of its bytes (a reader woken
 *     within the writer's call often returns first); then TRACE_MSG_NDATA records
 *     TRACE_EVENT TRACE_EV_MSG_DATA whose 38 timestamp bits carry payload
 *     (as the context events carry keys), in this order:
 *       data 0  bits 0..31 channel id (the channels file), 32..37 the call
 *               (enum trace_msg_call)
 *       data 1  bits 0..37 of the start offset
 *       data 2  bits 0..25 offset bits 38..63, bits 26..37 TRACE_MSG_* flags
 *       data 3  the length in bytes (bits 0..37)
 *  2. A stream's message is the byte range [offset, offset + length) of its
 *     direction of the channel.  On TCP the offsets are absolute when the
 *     agent could read them from the kernel when it first saw the channel
 *     (flag TRACE_MSG_RELATIVE clear; the channel's TRACE_CHAN_ABS_SEND or
 *     TRACE_CHAN_ABS_RECV and base[]): byte 0 is the first byte the sender
 *     ever wrote on the connection, whoever was traced then, so a send in
 *     one trace and its receive in another name the same range.  Otherwise
 *     (flag TRACE_MSG_RELATIVE) they count the bytes this process saw in
 *     that direction since the channel was first seen: a reader matching a
 *     send with its receive lines the two up by their first common message.
 *     Never the kernel's sequence numbers.
 *  3. A datagram (TRACE_MSG_DGRAM) is one message: offset is its number in
 *     its direction of the channel (0, 1, ...), length its size.
 *  4. Only calls that moved bytes are recorded (a return value > 0); each
 *     datagram of sendmmsg/recvmmsg is a message of its own.  Two calls are
 *     recorded with length 0, at the offset where they happen: a successful
 *     shutdown(2) (TRACE_CALL_SHUTDOWN; a send message for SHUT_WR, a receive
 *     one for SHUT_RD, both for SHUT_RDWR) and the end of a stream, a
 *     receive that returned 0 on a TCP or UNIX stream or a pipe when asked
 *     for bytes (TRACE_CALL_EOF, a receive message).
 *  5. A reader takes a head with its four data records; a head without all
 *     four (a crash, the end of the ring) is dropped, and data records
 *     without their head (a ring that came round over it) are skipped.
 *
 * The channel of a message is named by the pair of addresses of a socket
 * (local and peer, per direction: what a receiver on the peer sees as its
 * own pair reversed), or by the inode of a pipe, which both ends share, or
 * for a connected UNIX socket by its inode and its peer's (the other end's
 * channel has the two reversed).
 * For TCP a later matcher pairs a send with its receive by the 4-tuple
 * and the byte ranges; for UDP by the pair and the datagram's number.
 */
#define TRACE_MSG_NDATA 4

enum trace_msg_call {
	TRACE_CALL_SEND = 1, TRACE_CALL_SENDTO, TRACE_CALL_SENDMSG, TRACE_CALL_SENDMMSG,
	TRACE_CALL_WRITE, TRACE_CALL_WRITEV, TRACE_CALL_RECV, TRACE_CALL_RECVFROM,
	TRACE_CALL_RECVMSG, TRACE_CALL_RECVMMSG, TRACE_CALL_READ, TRACE_CALL_READV,
	TRACE_CALL_SPLICE, TRACE_CALL_SENDFILE,
	TRACE_CALL_SHUTDOWN,     /* length 0: the program shut its direction down */
	TRACE_CALL_EOF,          /* length 0: a receive found the end of the stream */
	TRACE_CALL_MAX = TRACE_CALL_EOF,
};

enum {
	TRACE_MSG_DGRAM = 1,     /* a datagram: offset is its number */
	TRACE_MSG_RELATIVE = 2,  /* offsets count from the first byte this process saw;
				  * clear: absolute stream offsets (point 2) */
};

#define TRACE_PAYLOAD_MASK ((1ull << TRACE_TSC_LOW_BITS) - 1)

/* The payload of a message's data records (point 1 above). */
static inline void trace_msg_pack(uint64_t data[TRACE_MSG_NDATA], uint32_t chan, unsigned call,
				  unsigned flags, uint64_t off, uint64_t len)
{
	data[0] = (uint64_t)chan | (uint64_t)(call & 63) << 32;
	data[1] = off & TRACE_PAYLOAD_MASK;
	data[2] = (off >> TRACE_TSC_LOW_BITS) | (uint64_t)(flags & 0xfff) << 26;
	data[3] = len & TRACE_PAYLOAD_MASK;
}

static inline void trace_msg_unpack(const uint64_t data[TRACE_MSG_NDATA], uint32_t *chan,
				    unsigned *call, unsigned *flags, uint64_t *off, uint64_t *len)
{
	*chan = (uint32_t)data[0];
	*call = (unsigned)(data[0] >> 32) & 63;
	*off = data[1] | (data[2] & ((1ull << 26) - 1)) << TRACE_TSC_LOW_BITS;
	*flags = (unsigned)(data[2] >> 26) & 0xfff;
	*len = data[3];
}

/*
 * Rings and chunks.  The writer (agent/x86_64/emit.c, agent/ring.c) takes
 * record index c = count++ and stores the record at slot c & mask of the
 * `capacity` slots mapped after the header.  Two layouts share that:
 *
 *   a ring (chunk 0: flight-recorder mode, and every version 1 file):
 *     the file holds the capacity slots; record c is at slot c % capacity,
 *     so a full ring overwrites its oldest records.  limit is ~0.
 *
 *   every record kept (chunk != 0: `sptrace run` without
 *     --flight-recorder): the file holds the records in order, record c at
 *     byte header_size + 8c, and grows a chunk of `chunk` records at a
 *     time.  The agent maps a window of two chunks (capacity = 2 chunk
 *     slots): the chunk being written and the next one.  When a record's
 *     index reaches `limit` (the first index of the next chunk), the writer
 *     itself maps the chunk after it in place of the one it has just
 *     finished (a slow path: the file grows, one mmap) and moves limit on by
 *     a chunk.  The file starts shorter: 256 KiB of records, limit at half
 *     of them, and the first move grows it to the whole window (then limit
 *     is one chunk), so a process that records little reserves little
 *     (agent/ring.c).  The page cache writes the records to the file; nothing is
 *     copied and nothing overwritten.  If the file cannot grow (a full
 *     disk), the agent maps memory instead and sets kept_end: records from
 *     kept_end on are lost, and said so by every reader.  When the process
 *     is gone, `sptrace run` cuts the file to its count (the chunk mapped
 *     ahead is zeros); a file shorter than its count (a cut copy) has lost
 *     the records past its end.
 *
 * A slot taken but not written (a crash right between, or a record a
 * nested signal handler could not store while the window moved) stays zero: the
 * agent writes no zero record (kind ENTRY needs a site id, and 0 is none),
 * so readers skip zero records.
 */

/*
 * Packed blocks (packed.<tid>).  `sptrace run` (cli/cmd_run.c, with
 * analysis/pack.c) re-encodes the chunks a thread has finished -- those
 * below limit - chunk, which the agent has unmapped -- and, once the
 * process is gone, the rest.  Nothing in the traced thread's path changes.
 *
 *  1. packed.<tid> is a sequence of blocks, each a trace_pack_block and its
 *     zlen bytes; block k holds records [first, first + n) of ring.<tid>,
 *     the first block's first is 0 and each next one starts where the one
 *     before ended.
 *  2. A block is written whole (pwrite at the file's end), then the bytes of
 *     its records in ring.<tid> are freed (fallocate PUNCH_HOLE, KEEP_SIZE:
 *     the file keeps its size and reads zeros there).  So a record is always
 *     in one of the two: in a valid block, or still raw.  A writer that dies
 *     between leaves a block whose records are also raw (readers take the
 *     block); one that dies while writing leaves a partial block, which
 *     fails point 3 and is cut off by the next writer.
 *  3. A block is valid when all its bytes are in the file, its magic is
 *     TRACE_PACK_MAGIC, its first is the end of the block before, and crc
 *     (zlib crc32 of the header with crc 0, then the zlen bytes) matches.
 *     Readers take the valid blocks from the start, then ring.<tid>'s raw
 *     records from the end of the last one; an invalid block is reported
 *     (file, offset) and its records are read raw, or counted lost where
 *     they were punched.
 *  4. The zlen bytes are a zstd frame of four columns, of ncol[0..3] bytes,
 *     one after the other:
 *       kinds     one byte per record: TRACE_PACK_* below
 *       ids       LEB128 varints: the site id of ENTRY and unmatched EXIT
 *                 records, the id field of EVENT and SYNC records
 *       deltas    LEB128 varints: ENTRY and EXIT records' TSC bits 0..37
 *                 minus the previous ENTRY or EXIT's in the block, modulo
 *                 2^38 (the first: minus 0)
 *       payloads  LEB128 varints: the 38 high bits of EVENT and SYNC records
 *     An EXIT whose site is that of one of the last 16 ENTRY records not yet
 *     exited (a stack kept by encoder and decoder alike, TRACE_PACK_STACK
 *     deep, reset at each block) names it by depth instead of by id.  The
 *     decoded records are the raw 64-bit ones exactly, zero slots included.
 *  5. Once the process is gone and all of a file's records are packed,
 *     ring.<tid> is cut to its header: records a file does not hold are
 *     lost only if no valid block holds them either.  The blocks written
 *     once the process is gone are not punched one by one: the cut frees
 *     their records (or, where no cut can be made, one punch after them).
 */
#define TRACE_PACK_MAGIC 0x314b434150505354ull /* "TSPPACK1" little-endian */
#define TRACE_PACK_STACK 4096
#define TRACE_PACK_MAX_RECORDS (1u << 24)   /* a block holds at most this many */
enum {
	TRACE_PACK_ENTRY = 0,     /* ENTRY: an id, a delta; pushed on the stack */
	TRACE_PACK_EXIT_TOP = 1,  /* EXIT of the stack's top entry: a delta; popped */
	TRACE_PACK_EVENT = 2,     /* EVENT: an id, a payload */
	TRACE_PACK_SYNC = 3,      /* SYNC: an id, a payload */
	TRACE_PACK_ZERO = 4,      /* a zero slot (taken, never written) */
	TRACE_PACK_EXIT_ID = 5,   /* EXIT of no entry on the stack: an id, a delta */
	TRACE_PACK_EXIT_DEEP = 16, /* + d (1..15): EXIT of the entry d below the top:
				   * a delta; d + 1 entries popped */
};

typedef struct trace_pack_block {
	uint64_t magic;          /* TRACE_PACK_MAGIC */
	uint64_t first;          /* index of its first record in ring.<tid> */
	uint32_t n;              /* records, 1..TRACE_PACK_MAX_RECORDS */
	uint32_t zlen;           /* bytes that follow */
	uint32_t ncol[4];        /* bytes of each column, decompressed */
	uint32_t crc;            /* point 3 */
	uint32_t reserved;       /* 0 */
} trace_pack_block;
_Static_assert(sizeof(trace_pack_block) == 48, "pack block header size");

/* The header of a ring file.  The agent keeps `count` current after every
 * record, so a reader of a crashed process's ring knows where the newest
 * record is. */
typedef struct trace_ring_header {
	uint64_t magic;          /* TRACE_RING_MAGIC */
	uint32_t version;        /* TRACE_FORMAT_VERSION */
	uint32_t header_size;    /* bytes before the first record: TRACE_RING_HEADER_SIZE */
	uint64_t capacity;       /* slots mapped after the header (a power of two) */
	volatile uint64_t count; /* records ever written; newest at (count-1) % capacity */
	uint64_t mask;           /* capacity - 1 (the writer's fast path uses it) */
	uint64_t epoch;          /* TSC bits 38..63 of the last SYNC written */
	uint32_t pid, tid;
	uint64_t start_tsc;      /* TSC when the ring was created */
	uint64_t flags;          /* TRACE_RING_* */
	char thread_name[16];
	/* version 2: */
	volatile uint64_t limit; /* the writer moves the window when count reaches
				  * it; ~0 in a ring */
	uint64_t chunk;          /* records per chunk; 0: a ring */
	volatile uint64_t kept_end; /* chunks: records from this index on are lost
				  * (the file could not grow); ~0: none */
	int32_t kept_errno;      /* ... why (an errno value) */
	uint32_t reserved0;
	uint8_t reserved[4096 - 120];
} trace_ring_header;

#define TRACE_RING_HEADER_SIZE 4096
_Static_assert(sizeof(trace_ring_header) == TRACE_RING_HEADER_SIZE, "ring header size");
/* Offsets the agent's generated code uses (checked by static asserts there). */
#define TRACE_RING_OFF_COUNT 24
#define TRACE_RING_OFF_MASK 32
#define TRACE_RING_OFF_EPOCH 40
#define TRACE_RING_OFF_LIMIT 88
/* Bytes of a version 1 header that mean anything (the rest was zero). */
#define TRACE_RING_V1_FIXED 88

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

/*
 * The channels file: record i describes channel id i, written by the agent
 * when the program first sends or receives on it (msgs.c).  Record 0 is not
 * a channel: its `proto` is the shared next-id counter, as in the sites
 * file (a forked child hands out ids from the same counter), and its `pid`
 * the size of a record, sizeof(trace_channel).  Files of the first layout
 * have 0 there and records of TRACE_CHANNEL_V1_SIZE bytes, which end at
 * `reserved`: a reader takes them with the later fields zero.  A record of
 * zeros is a hole (a crash between taking an id and writing it).  An
 * empty file: no channel (its first chunk and record 0 are written with the
 * first channel).
 */
enum trace_proto {
	TRACE_PROTO_TCP = 1,
	TRACE_PROTO_UDP = 2,
	TRACE_PROTO_UNIX_STREAM = 3,
	TRACE_PROTO_UNIX_DGRAM = 4,
	TRACE_PROTO_UNIX_SEQPACKET = 5,
	TRACE_PROTO_PIPE = 6,    /* a pipe or FIFO: both ends share its inode */
	TRACE_PROTO_MAX = TRACE_PROTO_PIPE,
};

typedef struct trace_channel {
	uint32_t proto;          /* enum trace_proto; 0: a hole */
	uint32_t pid;            /* the process that first saw it */
	uint64_t inode;          /* the socket's or the pipe's inode */
	uint16_t family;         /* AF_INET, AF_INET6, AF_UNIX; 0 for a pipe */
	uint16_t local_port;     /* host byte order */
	uint16_t peer_port;
	uint16_t flags;          /* TRACE_CHAN_* */
	uint8_t local_addr[16];  /* IPv4: the first 4 bytes; network order */
	uint8_t peer_addr[16];
	char local_path[32];     /* AF_UNIX: the bound names, NUL-padded, cut */
	char peer_path[32];      /* at 31 bytes; abstract ones start with '@' */
	int32_t fd;              /* the descriptor it was first seen on */
	uint32_t reserved;
	/* (the first layout ends here: TRACE_CHANNEL_V1_SIZE) */
	uint64_t base[2];        /* TCP, TRACE_CHAN_ABS_SEND / _RECV: the absolute offset
				  * (message events, point 2) of the first byte this
				  * process counted, sent [0] and received [1] */
	uint64_t peer_inode;     /* TRACE_CHAN_PEER_INODE: a connected UNIX socket's
				  * peer (the other end's `inode`) */
	uint64_t reserved2;
} trace_channel;

#define TRACE_CHANNEL_V1_SIZE 128
_Static_assert(sizeof(trace_channel) == 160, "channel record size");

enum {
	TRACE_CHAN_PEER = 1,     /* the peer address is known */
	TRACE_CHAN_ABS_SEND = 2, /* base[0] and the sent offsets are absolute */
	TRACE_CHAN_ABS_RECV = 4, /* base[1] and the received offsets are absolute */
	TRACE_CHAN_PEER_INODE = 8, /* peer_inode is known */
};

/* A record of kernel.<tid>: a call (TRACE_ENTRY) or return (TRACE_EXIT)
 * of the kernel function of `site`, at `tsc` (all 64 bits). */
typedef struct trace_kernel_rec {
	uint64_t tsc;
	uint32_t site;
	uint32_t kind;           /* TRACE_ENTRY or TRACE_EXIT */
} trace_kernel_rec;
_Static_assert(sizeof(trace_kernel_rec) == 16, "kernel record size");

#define TRACE_KERNEL_MODULE_PATH "[kernel]"   /* the module line of kernel sites */
#define TRACE_KERNEL_MODULE_KEY "kallsyms"    /* ... its key: names from kernel.syms */
#define TRACE_KERNEL_MAX_BYTES (1ull << 32)   /* a larger kernel.<tid> is corrupt */

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
#define TRACE_META_SESSION "session"   /* NAME: the propagation session (spdaemon keeps the
                                          * traces it injected for it under
                                          * STATE/sessions/NAME) */
#define TRACE_META_PROPAGATED "propagated" /* TSC KIND SRC DST offset N host NAME targets K
                                          * [mark oob]: a traced send asked the daemon of
                                          * NAME to follow the channel; K processes got the
                                          * agent; "mark oob": an urgent byte went first */
#define TRACE_META_EXPECT "expect"     /* tcp SRC SPORT DST DPORT OFFSET|- [oob]: spdaemon asked
                                          * this agent to start at the receive of a traced
                                          * send (agent/propagate.c) */
#define TRACE_META_JOIN "join"         /* DIRECTIVE: a join directive the agent was given
                                          * (FUNC:entry:argN, FUNC:exit:ret: it records their
                                          * values; FUNC:scope), read by analysis/flows.c */
#define TRACE_META_MARK "mark"         /* oob|offset LINE: how this agent awaits the receive
                                          * of TRACE_META_EXPECT's LINE (written before it;
                                          * agent/propagate.c, point 9) */
#define TRACE_META_MATCHED "matched"   /* KIND SRC -> DST (or KIND INODE) by HOW: the awaited
                                          * receive of a TRACE_META_EXPECT line was found, by
                                          * HOW: offset, oob, ipopt, hash, ... (the words of
                                          * agent/propagate.c); `sptrace replay` prints it */
#define TRACE_META_TSC1 "tsc1"           /* TSC at the end of the trace */
#define TRACE_META_MONO1 "mono1_ns"      /* CLOCK_MONOTONIC then */

#endif
