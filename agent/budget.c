/*
 * budget.c — the overhead budget (`sptrace run --budget PERCENT`,
 * SPTRACE_BUDGET): hot, short callees go from timing to counting.
 *
 * With a budget every direct or PLT call site (with an exit) and every direct
 * tail jump gets a budget area (x86_64/emit.c, ag_emit_call_budget,
 * ag_emit_tail) that tests a mode byte of its own
 * after the callee-instrumented flag: 0, the call is timed as everywhere
 * else; 1, it only adds 1 to this thread's counter of the site (a table
 * indexed by site id, ag_tls_counts) and calls, with no record, but 1
 * counted call in 256 of the thread takes the timed path instead (a
 * sample, ag_tls_tick).  Demoting or promoting a site is
 * one byte stored into data: no code changes, so none of patch.c's
 * protocol is needed; a thread that tested the byte before the store makes
 * that one call the old way, entry and exit alike (both paths are whole).
 *
 * Deciding (ag_budget_scan), on the thread's own records, each time its
 * file moves on a chunk (ring.c; in a ring, every 1 M records, or half
 * the ring if smaller: limit marks the next scan), the first one only to
 * start the thread's account,
 * from the newest SCAN_MAX records of the chunk (reading all would cost a
 * third of the time of writing them):
 *
 *   1. Pair the ENTRY and EXIT records written since the last scan (a
 *      small stack; a direct tail jump's ENTRY with the EXIT of the call
 *      it ended, which closes it too): per site, the calls seen and those that lasted
 *      AG_BUDGET_LONG_NS (1 us) or more, less the tracer's time for the
 *      records written inside them; calls with the agent's own work
 *      inside or a record that faulted in a new page of the file are not
 *      timed.  A site whose long calls are more than 1 in LONG_RARE
 *      (fewer are taken for noise: a call the scheduler interrupted) is
 *      "long": never demoted, and a counted one whose sample makes it
 *      long is promoted back at once.
 *   2. The tracer's cost over the records written since the last scan
 *      is estimated at AG_BUDGET_REC_NS_* per record (bench/RECORDS.md:
 *      8 ns in a ring, 14 with every record kept, the kernel's page work
 *      of the growing file included); the program's own time is the
 *      thread's CPU time since the last scan minus that (wall time would
 *      count the time the thread waited for a CPU).  Within the budget
 *      (cost <= PERCENT % of the program's time): nothing more.
 *   3. Else the sites seen, not long, are demoted most frequent first
 *      until the estimated saving (AG_BUDGET_COUNT_NS for a counted call
 *      in place of two records) covers the excess.  Each demotion and
 *      promotion is a TRACE_EV_BUDGET event in this thread's ring.
 *   4. The thread's counters of every site ever demoted are written as
 *      COUNT records and zeroed (an exchange: a signal handler counting on
 *      this thread in between is not lost).
 *
 * Indirect calls and tail jumps (ag_emit_indirect) have an id per callee
 * (tail_of says which are tail jumps, ag_budget_indirect_id): their mode
 * bytes are in one table by id (`ag_budget_modes`), which the area reads through
 * the cached callee's entry word.
 *
 * Counters are per thread (no locked instruction on the fast path) and
 * only their owner changes them, but at the trace's end every table still
 * registered is written out by the ending thread (a thread still running
 * then may lose a count or two it adds meanwhile).  Sites with ids of
 * BUDGET_SITES and more, tail jumps to a caller-sensitive function and
 * calls without an exit are always timed.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#include "agent.h"
#include "arch.h"

#define BUDGET_SITES AG_BUDGET_SITES
#define SCAN_MAX (1u << 18)          /* a scan reads the newest this many */
#define MAX_SEEN 8192                /* distinct sites one scan considers */
#define MAX_DEPTH 256                /* pairing stack */
#define MAX_THREADS 65536
#define MIN_CALLS 64                 /* fewer calls in a scan: not worth a demotion */
#define PAGE_RECS 512                /* records in a page of the file */
#define LONG_RARE 4096               /* fewer long calls than 1 in this many: noise */

__thread uint64_t *ag_tls_counts __attribute__((tls_model("initial-exec")));
__thread uint8_t ag_tls_tick __attribute__((tls_model("initial-exec")));

static unsigned budget_pct;          /* 0: no budget */
static uint64_t long_ticks, rec_ns, rec_ticks;
static uint8_t **mode_of;            /* [site id]: its area's mode byte */
/* [site id]: indirect calls' mode bytes (tramp.S's ag_budget_stub reads them) */
uint8_t *ag_budget_modes;
/* [site id]: calls whose duration was measured, and those of >= 1 us */
static uint64_t *timed_calls, *long_calls;
static uint8_t *listed;              /* [site id]: in demoted[] */
static uint8_t *tail_of;             /* [site id]: a direct tail jump */
static uint32_t *demoted;            /* every site ever demoted */
static volatile uint32_t ndemoted;
static volatile uint64_t ndemotions, npromotions;

/* Every thread's table and ring, for the end of the trace. */
typedef struct counts_owner {
	uint64_t *counts;
	trace_ring_header *ring;
} counts_owner;
static counts_owner *owners;
static volatile uint32_t nowners;
static __thread uint32_t own_slot __attribute__((tls_model("initial-exec")));
/* The thread's table; ag_tls_counts, which the areas use, is NULL while
 * agent code runs on the thread (ag_enter): the agent's own calls are
 * neither recorded nor counted. */
static __thread uint64_t *own_counts __attribute__((tls_model("initial-exec")));

uint64_t *ag_budget_counts(void)
{
	return own_counts;
}

static void *table(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void ag_budget_init(const char *pct)
{
	char *end;
	unsigned long v;

	if (!pct || !*pct)
		return;
	v = strtoul(pct, &end, 10);
	if (*end || v > 1000) {
		ag_log("budget: SPTRACE_BUDGET '%s' is not a percentage (0-1000): no budget", pct);
		return;
	}
	if (v == 0)
		return;
	mode_of = table(BUDGET_SITES * sizeof *mode_of);
	ag_budget_modes = table(BUDGET_SITES);
	timed_calls = table(BUDGET_SITES * sizeof *timed_calls);
	long_calls = table(BUDGET_SITES * sizeof *long_calls);
	listed = table(BUDGET_SITES);
	tail_of = table(BUDGET_SITES);
	demoted = table(BUDGET_SITES * sizeof *demoted);
	owners = table(MAX_THREADS * sizeof *owners);
	if (!mode_of || !ag_budget_modes || !timed_calls || !long_calls || !listed || !tail_of || !demoted || !owners) {
		ag_log("budget: no memory for its tables: no budget");
		return;
	}
	budget_pct = (unsigned)v;
}

unsigned ag_budget_percent(void)
{
	return budget_pct;
}

/* The TSC's rate is known once calibrated (main.c). */
void ag_budget_clock(uint64_t hz)
{
	long_ticks = hz / (1000000000ull / AG_BUDGET_LONG_NS);
	rec_ns = ag_ring_keeps_all() ? AG_BUDGET_REC_NS_KEEP : AG_BUDGET_REC_NS_RING;
	rec_ticks = hz * rec_ns / 1000000000ull;
	if (budget_pct)
		ag_log("budget: %u %% of the program's time (calls shorter than %d ns may be "
		       "counted rather than timed)", budget_pct, AG_BUDGET_LONG_NS);
}

int64_t ag_tls_counts_offset(void)
{
	return ag_arch_tls_offset(&ag_tls_counts);
}

int64_t ag_tls_tick_offset(void)
{
	return ag_arch_tls_offset(&ag_tls_tick);
}

uint8_t *ag_budget_site(ag_pool *pool, uint32_t id, bool tail)
{
	uint8_t *mode;

	if (!budget_pct || id >= BUDGET_SITES || !(mode = ag_pool_data(pool, 1)))
		return NULL;
	if (tail)
		__atomic_store_n(&tail_of[id], 1, __ATOMIC_RELAXED);
	__atomic_store_n(&mode_of[id], mode, __ATOMIC_RELEASE);
	return mode;
}

typedef struct seen {
	uint32_t id, calls;
} seen;

/* Per scan: the sites seen and their calls (thread-local scratch). */
static __thread seen *scratch __attribute__((tls_model("initial-exec")));
static __thread uint32_t *slot_of __attribute__((tls_model("initial-exec")));
/* The thread's CPU time and record count at its last scan. */
static __thread uint64_t last_cpu __attribute__((tls_model("initial-exec")));
static __thread uint64_t last_to __attribute__((tls_model("initial-exec")));

void ag_budget_indirect_id(uint32_t id, bool tail)
{
	if (budget_pct && id < BUDGET_SITES && !mode_of[id]) {
		if (tail)
			__atomic_store_n(&tail_of[id], 1, __ATOMIC_RELAXED);
		__atomic_store_n(&mode_of[id], &ag_budget_modes[id], __ATOMIC_RELEASE);
	}
}

/* A new ring: its thread's counters (its first record, ring.c). */
void ag_budget_thread(trace_ring_header *r)
{
	uint32_t slot;

	if (!budget_pct || own_counts)
		return;
	/* Here, not in a scan: a scan runs where ring.c moves the window,
	 * where no C library code may run (mmap's own sites may hold an int3). */
	if (!scratch) {
		scratch = table(MAX_SEEN * sizeof *scratch);
		slot_of = table(BUDGET_SITES * sizeof *slot_of);
	}
	own_counts = table(BUDGET_SITES * sizeof(uint64_t));
	if (!own_counts || !scratch || !slot_of) {
		if (own_counts)
			munmap(own_counts, BUDGET_SITES * sizeof(uint64_t));
		own_counts = NULL;
		return;
	}
	last_cpu = last_to = 0;     /* a new ring (a forked child's too) */
	slot = __atomic_fetch_add(&nowners, 1, __ATOMIC_ACQ_REL);
	if (slot < MAX_THREADS) {
		owners[slot].ring = r;
		__atomic_store_n(&owners[slot].counts, own_counts, __ATOMIC_RELEASE);
		own_slot = slot + 1;
	}
}

/* Write a table's non-zero counters into ring r as COUNT pairs (step 4). */
static void flush(uint64_t *counts, trace_ring_header *r)
{
	uint32_t n = __atomic_load_n(&ndemoted, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < n; i++) {
		uint32_t id = demoted[i];
		uint64_t v;

		if (!__atomic_load_n(&counts[id], __ATOMIC_RELAXED))
			continue;
		v = __atomic_exchange_n(&counts[id], 0, __ATOMIC_RELAXED);
		while (v) {
			uint64_t part = v > TRACE_PAYLOAD_MASK ? TRACE_PAYLOAD_MASK : v;

			ag_ring_put_pair(r, TRACE_EV_COUNT, id, TRACE_EV_COUNT_DATA, part);
			v -= part;
		}
	}
}

static void set_mode(trace_ring_header *r, uint32_t id, unsigned mode)
{
	__atomic_store_n(mode_of[id], (uint8_t)mode, __ATOMIC_RELEASE);
	ag_ring_put_key(r, TRACE_EV_BUDGET, trace_budget_pack(id, mode));
	if (mode == TRACE_BUDGET_COUNTED) {
		__atomic_add_fetch(&ndemotions, 1, __ATOMIC_RELAXED);
		if (!__atomic_exchange_n(&listed[id], 1, __ATOMIC_ACQ_REL)) {
			uint32_t k = __atomic_fetch_add(&ndemoted, 0, __ATOMIC_RELAXED);

			/* Its slot written before the count that shows it. */
			demoted[k] = id;
			__atomic_store_n(&ndemoted, k + 1, __ATOMIC_RELEASE);
		}
	} else {
		__atomic_add_fetch(&npromotions, 1, __ATOMIC_RELAXED);
	}
}

/* A site whose calls last 1 us or more, but for the rare one (a call the
 * scheduler interrupted, say): LONG_RARE. */
static bool site_long(uint32_t id)
{
	return long_calls[id] && long_calls[id] * LONG_RARE >= timed_calls[id];
}

/* CLOCK_THREAD_CPUTIME_ID with a raw system call (the scan runs where
 * ring.c moves a window: no C library code there). */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts = { 0, 0 };
	long rc = ag_arch_syscall6(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, (long)&ts, 0, 0, 0, 0);

	return rc == 0 ? (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec : 0;
}

/* Step 1 for one call of site id, from its ENTRY at index at to the EXIT
 * at i that closed it (its own, or its caller's for a tail jump), dur ticks
 * apart; dirty, the last index of the agent's own work. */
static void account(trace_ring_header *r, uint32_t id, uint64_t dur, uint64_t at, uint64_t i,
		    uint64_t dirty, uint32_t *nseen)
{
	if (id >= BUDGET_SITES || !mode_of[id])
		return;
	if (!slot_of[id] || slot_of[id] > *nseen || scratch[slot_of[id] - 1].id != id) {
		if (*nseen == MAX_SEEN)
			return;
		scratch[*nseen] = (seen){ id, 0 };
		slot_of[id] = ++*nseen;
	}
	scratch[slot_of[id] - 1].calls++;
	/* Not the program's time: a call with the agent's work inside,
	 * or a store that faulted in a new page of the file (the
	 * record's page: 512 records, the first at index 0). */
	if (i - at < PAGE_RECS && (dirty >= at || (at | (PAGE_RECS - 1)) < i ||
				   at % PAGE_RECS == 0))
		return;
	/* The program's time: less the records written inside. */
	dur = dur > (i - at - 1) * rec_ticks ? dur - (i - at - 1) * rec_ticks : 0;
	timed_calls[id]++;
	if (dur >= long_ticks || i - at >= PAGE_RECS) {
		long_calls[id]++;
		if (*mode_of[id] != TRACE_BUDGET_TIMED && site_long(id))
			set_mode(r, id, TRACE_BUDGET_TIMED);    /* promoted back */
	}
}

void ag_budget_scan(trace_ring_header *r, uint64_t from, uint64_t to)
{
	const uint64_t *recs = (const uint64_t *)((const char *)r + TRACE_RING_HEADER_SIZE);
	struct { uint32_t id; uint64_t t0, at; } stack[MAX_DEPTH];
	uint32_t depth = 0, nseen = 0;
	uint64_t n = 0, dirty = 0;
	static volatile int scan_lock;

	if (!budget_pct || !own_counts || !long_ticks)
		return;
	if (to - from > SCAN_MAX)
		from = to - SCAN_MAX;
	/* Step 1. */
	for (uint64_t i = from; i < to; i++) {
		uint64_t rec = recs[i & r->mask], t = trace_rec_tsc_low(rec);
		unsigned kind = trace_rec_kind(rec);
		uint32_t id = trace_rec_id(rec);

		if (!rec || kind == TRACE_SYNC || kind == TRACE_EVENT) {
			dirty = i;       /* the agent's own work, or a new epoch */
			continue;
		}
		n++;
		if (kind == TRACE_ENTRY) {
			if (depth < MAX_DEPTH)
				stack[depth] = (typeof(stack[0])){ id, t, i };
			depth++;
			continue;
		}
		/* EXIT: the innermost open call of the site (tail jumps and
		 * calls cut short leave entries above it). */
		uint32_t k = depth < MAX_DEPTH ? depth : MAX_DEPTH;
		while (k > 0 && stack[k - 1].id != id && depth - k < 8)
			k--;
		if (k == 0 || stack[k - 1].id != id)
			continue;
		/* Direct tail jumps above it: this EXIT closes them too. */
		for (uint32_t j = k; j < depth && j < MAX_DEPTH; j++)
			if (stack[j].id < BUDGET_SITES && tail_of[stack[j].id])
				account(r, stack[j].id, (t - stack[j].t0) & TRACE_PAYLOAD_MASK,
					stack[j].at, i, dirty, &nseen);
		account(r, id, (t - stack[k - 1].t0) & TRACE_PAYLOAD_MASK, stack[k - 1].at, i,
			dirty, &nseen);
		depth = k - 1;
	}
	/* Step 2: the thread's CPU time since its last scan (time it waited
	 * for a CPU is nobody's), the tracer's share of it and the program's. */
	uint64_t cpu = thread_cpu_ns(), span = cpu - last_cpu, nfull = to - last_to;
	uint64_t cost = nfull * rec_ns, prog = span > cost ? span - cost : 1;
	bool first_scan = !last_cpu;

	last_cpu = cpu;
	last_to = to;
	if (!first_scan && n && cost * 100 > (uint64_t)budget_pct * prog &&
	    !__atomic_exchange_n(&scan_lock, 1, __ATOMIC_ACQUIRE)) {
		/* Step 3: most frequent first, until the saving covers the
		 * excess.  The calls seen are those of the records read, of the
		 * nfull since the last scan: scaled. */
		uint64_t excess = cost - (uint64_t)budget_pct * prog / 100, saved = 0;

		while (saved < excess) {
			uint32_t best = MAX_SEEN;

			for (uint32_t k = 0; k < nseen; k++) {
				uint32_t id = scratch[k].id;

				if (scratch[k].calls >= MIN_CALLS && !site_long(id) &&
				    *mode_of[id] == TRACE_BUDGET_TIMED &&
				    (best == MAX_SEEN || scratch[k].calls > scratch[best].calls))
					best = k;
			}
			if (best == MAX_SEEN)
				break;
			set_mode(r, scratch[best].id, TRACE_BUDGET_COUNTED);
			saved += (2 * rec_ns - AG_BUDGET_COUNT_NS) * scratch[best].calls * nfull /
				 (to - from);
			scratch[best].calls = 0;
		}
		__atomic_store_n(&scan_lock, 0, __ATOMIC_RELEASE);
	}
	/* Step 4. */
	flush(own_counts, r);
}

/* The calling thread ends: its counts go out, its table away. */
void ag_budget_thread_end(trace_ring_header *r)
{
	uint64_t *c = own_counts;

	if (!c || ag_tls_quiet == AG_QUIET_STRICT)     /* no system call there */
		return;
	own_counts = NULL;
	ag_tls_counts = NULL;
	if (scratch) {
		munmap(scratch, MAX_SEEN * sizeof *scratch);
		munmap(slot_of, BUDGET_SITES * sizeof *slot_of);
		scratch = NULL;
		slot_of = NULL;
	}
	if (own_slot &&
	    !__atomic_exchange_n(&owners[own_slot - 1].counts, NULL, __ATOMIC_ACQ_REL))
		return;              /* the end of the trace took it */
	if (r)
		flush(c, r);
	munmap(c, BUDGET_SITES * sizeof(uint64_t));
}

/* The end of the trace: every table still registered goes out. */
void ag_budget_end(void)
{
	uint32_t n = nowners < MAX_THREADS ? nowners : MAX_THREADS;

	if (!budget_pct)
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t *c = __atomic_exchange_n(&owners[i].counts, NULL, __ATOMIC_ACQ_REL);

		if (c)
			flush(c, owners[i].ring);
	}
	ag_log("budget: %lu demotions to counting, %lu promotions back to timing, %u sites "
	       "counted at some time", (unsigned long)ndemotions, (unsigned long)npromotions,
	       (unsigned)ndemoted);
	/* What stays timed (bench/BUDGET.md): the sites never demoted for
	 * their calls of 1 us or more, and their share of the calls the
	 * scans measured. */
	uint64_t all = 0, kept = 0, nkept = 0, nlong = 0;

	for (uint32_t id = 0; id < BUDGET_SITES; id++) {
		if (!timed_calls[id])
			continue;
		all += timed_calls[id];
		if (site_long(id)) {
			kept += timed_calls[id];
			nlong += long_calls[id];
			nkept++;
		}
	}
	ag_log("budget: %lu sites kept timed for their calls of 1 us or more (%lu of them, 1 in "
	       "%lu): %lu of the %lu calls the scans measured", (unsigned long)nkept,
	       (unsigned long)nlong, (unsigned long)(nlong ? kept / nlong : 0),
	       (unsigned long)kept, (unsigned long)all);
}

/* A forked child: the parent's counts are the parent's; the child's
 * thread starts from zero with a table of its own (its ring is new). */
void ag_budget_forked_child(void)
{
	uint64_t *c = own_counts;

	if (!c)
		return;
	nowners = 0;
	own_slot = 0;
	own_counts = NULL;
	ag_tls_counts = NULL;
	munmap(c, BUDGET_SITES * sizeof(uint64_t));
}

/* A deactivation: every site timed again (propagation starts afresh). */
void ag_budget_reset(void)
{
	uint32_t n = __atomic_load_n(&ndemoted, __ATOMIC_ACQUIRE);

	if (!budget_pct)
		return;
	for (uint32_t i = 0; i < n; i++)
		__atomic_store_n(mode_of[demoted[i]], TRACE_BUDGET_TIMED, __ATOMIC_RELEASE);
}
