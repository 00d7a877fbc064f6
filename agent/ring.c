/*
 * ring.c — per-thread trace rings: files in the trace directory mapped
 * shared, so every record written is in the page cache the moment it is
 * stored and survives kill -9 of the process.
 *
 * The generated code writes records itself (see x86_64/emit.c); this file
 * creates a thread's ring on its first record, writes the rare records (SYNC,
 * events) from C, moves the window of a file that keeps every record
 * (trace_format.h, "Rings and chunks"), and closes rings at the end.
 *
 * Moving the window (ag_ring_rotate), when record index c reaches limit:
 *
 *   1. The window holds chunk K-1 (finished: c >= limit = K * chunk) and
 *      chunk K (the one c is in, mapped ahead by the last move).  So the
 *      slot of c is already the right place in the file: the record is
 *      stored whatever the move below does.
 *   2. Grow the file by one chunk (fallocate, so that a full disk is an
 *      error here and never a SIGBUS at the program's next store), and map
 *      chunk K+1 over chunk K-1's half of the window (mmap MAP_FIXED
 *      replaces the old mapping in one step; its dirty pages stay in the
 *      page cache, which writes them to the file).
 *   3. limit += chunk.  Records of indices below the new limit plus one
 *      chunk now have their place mapped.
 *   If step 2 fails, that half is mapped to anonymous memory instead and
 *   kept_end says where the file's records end; at the next move the other
 *   half follows and limit goes to ~0: the thread's records go on into
 *   memory, lost but counted, and never over the records kept.
 *
 * The file starts shorter than its window: FIRST_PART bytes of records,
 * which most short processes never fill, and the first move (at limit =
 * FIRST_RECORDS, half of them) grows it to the two chunks the window maps
 * (grow_first).  A whole window reserved at once cost every process 16 MB
 * of blocks -- on a tmpfs, 16 MB of memory zeroed (3.7 ms) and freed again
 * (2 ms).  Until then the slots below FIRST_PART are the ones mapped to the
 * file (slot_mapped): as with the chunks, a record taken while the thread
 * grows the file still finds its slot there.  If that growth fails, the
 * whole window becomes memory and kept_end says the first part's end.
 *
 *   4. The chunk step 2 maps is faulted in by the control thread, not by
 *      the writer: the move leaves its address in `ahead` (one per ring;
 *      a newer move's replaces it) and wakes the control thread with one
 *      raw write (control.c), which makes the pages with
 *      MADV_POPULATE_WRITE, a piece at a time, while the writer fills
 *      chunk K.  A new page of the file cost the writer its fault, the
 *      page's allocation and zeroing and the file system's share: about
 *      4.3 ns a record (bench/PAGECOST.md), a quarter of python3's traced
 *      time, now spent on another core where there is one.  A page the
 *      writer reaches first it faults in itself, as before; a chunk the
 *      control thread never gets to costs nothing more.  From a thread's
 *      POPULATE_FROM-th chunk on, and not while as many threads move their
 *      windows as the process has CPUs (ag_rings_populate).  The window's
 *      halves are only ever the ring file's or, after a failed move,
 *      anonymous memory of the ring's: the control thread touches nothing
 *      of the program's.  A forked child has no control thread and asks
 *      for nothing.
 *
 * The moves use raw system calls only: no errno changes, no C library code
 * (which could hold one of the agent's int3s while this thread blocks
 * SIGTRAP), and the file's descriptor lives for three system calls.  Only
 * the owner thread moves its window.  A move the record stubs ask for
 * (main.c, ag_slow) holds no lock of the agent's, and the thread is not
 * marked busy meanwhile (ag_ring_moves_alone): a signal handler that runs
 * then is traced, and stores its records in the slots still mapped (those
 * past them are dropped); a handler that interrupts other work of the
 * agent's runs untraced (signals.c).  One that interrupts the two
 * instructions between taking an index and comparing it with limit moves
 * the window itself (the interrupted record's slot is then still mapped:
 * step 1).  A record written into another
 * thread's ring (ag_rings_event_all) is stored only if its slot is mapped.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

__thread trace_ring_header *ag_tls_ring __attribute__((tls_model("initial-exec")));

#define MAX_RINGS 65536
#define QUIET_START (1u << 20)          /* ag_ring_create */
#define FIRST_PART (256u << 10)         /* a file of every record, at first */
#define FIRST_SLOTS (FIRST_PART / 8)    /* ... its records */
#define FIRST_RECORDS (FIRST_SLOTS / 2) /* its first move */

static trace_ring_header **rings;
static volatile uint32_t nrings;
static uint64_t ring_records = 1u << 21;   /* 16 MiB of records per thread */
static bool keep_all;                      /* SPTRACE_RECORDS=all: chunked files */

/* The calling thread's own file, for moving its window: the ring it made
 * and the file's path. */
static __thread trace_ring_header *own_ring __attribute__((tls_model("initial-exec")));
static __thread char *own_path __attribute__((tls_model("initial-exec")));
static __thread uint8_t moving __attribute__((tls_model("initial-exec")));
static __thread uint32_t own_slot __attribute__((tls_model("initial-exec")));  /* in rings, + 1 */
/* Point 4: each ring's chunk mapped ahead, for the control thread to fault
 * in (its address; 0: none). */
static volatile uint64_t *ahead;
static volatile uint64_t *ahead_tsc;    /* ... and when it was asked for */
/* The first chunk the control thread faults in: a thread that records a
 * few chunks gains a few ms at most, and a program of many such processes
 * (a build: each cc1 fills 4) may need that core itself -- make -j2 took
 * 2.10 s with every chunk faulted in ahead, 1.97 for the build before
 * (bench/START.md, 05:39); from the 8th, 2.02 against 1.99.  Threads that
 * record on gain it back many times. */
#define POPULATE_FROM 8

/* The sizes sptrace run --ring-size allows (cli/trace_dir.c): 8 KiB of
 * records at least, 64 GiB at most.  Beyond that the doubling below would
 * overflow and spin for ever (a value near 2^64 is a mistake, not a wish). */
#define RING_MIN_BYTES (1024u * 8)
#define RING_MAX_BYTES (65536ull << 20)

void ag_ring_set_size(uint64_t bytes)
{
	uint64_t n = 1;

	if (bytes < RING_MIN_BYTES || bytes > RING_MAX_BYTES) {
		ag_log("SPTRACE_RING_BYTES %llu is outside %u..%llu: rings keep the default "
		       "%llu bytes", (unsigned long long)bytes, RING_MIN_BYTES,
		       (unsigned long long)RING_MAX_BYTES, (unsigned long long)ring_records * 8);
		return;
	}
	while (n * 2 * 8 <= bytes)
		n *= 2;
	ring_records = n;
}

void ag_ring_keep_all(bool on)
{
	keep_all = on;
}

bool ag_ring_keeps_all(void)
{
	return keep_all;
}

/* Make the file reach off + len.  With `reserve`, [off, off + len) becomes
 * real blocks (a file of every record fills them anyway): a full disk says
 * so now, not with a SIGBUS at a store; a file system without fallocate
 * gets the size alone.  A ring stays sparse, as it always was (a thousand
 * threads must not reserve 16 GB).  Never past the program's RLIMIT_FSIZE:
 * the kernel would send it SIGXFSZ. */
static long grow(int fd, uint64_t off, uint64_t len, bool reserve)
{
	struct { uint64_t cur, max; } lim;
	long rc;

	if (ag_arch_syscall6(SYS_prlimit64, 0, RLIMIT_FSIZE, 0, (long)&lim, 0, 0) == 0 &&
	    lim.cur != RLIM_INFINITY && off + len > lim.cur)
		return -EFBIG;
	rc = reserve ? ag_arch_syscall6(SYS_fallocate, fd, 0, (long)off, (long)len, 0, 0) : -EOPNOTSUPP;
	if (rc == -EOPNOTSUPP)
		rc = ag_arch_syscall6(SYS_ftruncate, fd, (long)(off + len), 0, 0, 0, 0);
	return rc;
}

/* Is slot c mapped to its own place (a ring: always)? */
static bool slot_mapped(const trace_ring_header *r, uint64_t c)
{
	uint64_t lim = __atomic_load_n(&r->limit, __ATOMIC_ACQUIRE);

	if (!r->chunk || lim == ~0ull)
		return true;
	if (lim < r->chunk)
		return c < FIRST_SLOTS;         /* the file's first part */
	return c + r->chunk >= lim && c < lim + r->chunk;
}

/* The file's first part is half full: the file grows to the whole window
 * (the comment at the top), or the window becomes memory. */
static void grow_first(trace_ring_header *r)
{
	long fd = -1, rc = -EIO;

	if (r->kept_end == ~0ull && own_path) {
		fd = ag_arch_syscall6(SYS_open, (long)own_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0, 0, 0, 0);
		rc = fd < 0 ? fd : grow((int)fd, TRACE_RING_HEADER_SIZE + FIRST_PART,
					(r->capacity - FIRST_SLOTS) * 8, true);
		if (fd >= 0)
			ag_arch_syscall6(SYS_close, fd, 0, 0, 0, 0, 0);
		if (rc == 0) {
			__atomic_store_n(&r->limit, r->chunk, __ATOMIC_RELEASE);
			return;
		}
	}
	r->kept_errno = (int32_t)-rc;
	__atomic_store_n(&r->kept_end, FIRST_SLOTS, __ATOMIC_RELEASE);
	ag_arch_syscall6(SYS_mmap, (long)((char *)r + TRACE_RING_HEADER_SIZE), (long)(r->capacity * 8),
			 PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	__atomic_store_n(&r->limit, ~0ull, __ATOMIC_RELEASE);
}

/* Steps 2 and 3 of the move (the comment at the top), once. */
static void move_once(trace_ring_header *r)
{
	uint64_t h = r->chunk, k = r->limit / h;       /* entering chunk k */
	char *half = (char *)r + TRACE_RING_HEADER_SIZE + ((k + 1) & 1) * h * 8;
	uint64_t off = TRACE_RING_HEADER_SIZE + (k + 1) * h * 8;
	long fd = -1, rc = -EIO;

	if (r->kept_end == ~0ull && own_path) {
		fd = ag_arch_syscall6(SYS_open, (long)own_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0, 0, 0, 0);
		rc = fd < 0 ? fd : grow((int)fd, off, h * 8, true);
		if (rc == 0)
			rc = ag_arch_syscall6(SYS_mmap, (long)half, (long)(h * 8), PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_FIXED, fd, (long)off);
		if (fd >= 0)
			ag_arch_syscall6(SYS_close, fd, 0, 0, 0, 0, 0);
		if (rc == (long)half) {
			__atomic_store_n(&r->limit, r->limit + h, __ATOMIC_RELEASE);
			if (ahead && own_slot && k + 1 >= POPULATE_FROM) {
				ahead_tsc[own_slot - 1] = ag_rdtsc();
				__atomic_store_n(&ahead[own_slot - 1], (uint64_t)(uintptr_t)half,
						 __ATOMIC_RELEASE);
				ag_control_wake_to_populate();
			}
			return;
		}
	}
	/* The file could not grow (or already could not): memory instead. */
	if (r->kept_end == ~0ull) {
		r->kept_errno = (int32_t)-rc;
		__atomic_store_n(&r->kept_end, (k + 1) * h, __ATOMIC_RELEASE);
	}
	ag_arch_syscall6(SYS_mmap, (long)half, (long)(h * 8), PROT_READ | PROT_WRITE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	/* Both halves are memory once the second move after the failure is
	 * done: from then on the window is a ring of memory. */
	__atomic_store_n(&r->limit, (k + 1) * h > r->kept_end ? ~0ull : r->limit + h,
			 __ATOMIC_RELEASE);
}

/* Records between two budget scans of a ring (ag_budget_scan). */
static uint64_t budget_scan_every(const trace_ring_header *r)
{
	return r->capacity / 2 < (1u << 20) ? r->capacity / 2 : (1u << 20);
}

bool ag_ring_rotate(trace_ring_header *r, uint64_t c)
{
	if (r == own_ring && !moving && !r->chunk) {
		/* A ring with a budget: limit only marks the next scan. */
		moving = 1;
		ag_budget_scan(r, c > r->capacity / 2 ? c - r->capacity / 2 : 0, c);
		__atomic_store_n(&r->limit, c + budget_scan_every(r), __ATOMIC_RELEASE);
		moving = 0;
	} else if (r == own_ring && !moving) {
		moving = 1;
		/* The chunk just finished is still mapped: the budget's look at it. */
		if (r->limit >= r->chunk)
			ag_budget_scan(r, r->limit - r->chunk, r->limit);
		if (r->limit < r->chunk)
			grow_first(r);
		while (__atomic_load_n(&r->limit, __ATOMIC_ACQUIRE) <= c)
			move_once(r);
		moving = 0;
	}
	return slot_mapped(r, c);
}

/* May r's window move with the thread not marked busy (the comment at the
 * top)?  A file of every record without a budget: the move is raw system
 * calls only, and no C library code of the agent's runs. */
bool ag_ring_moves_alone(const trace_ring_header *r)
{
	return r && r == own_ring && r->chunk && !ag_budget_percent();
}

/* Take a slot and fill it; taking it is one instruction, so a signal
 * handler recording on this thread meanwhile gets other slots. */
static void put(trace_ring_header *r, uint64_t rec)
{
	uint64_t *recs = (uint64_t *)((char *)r + TRACE_RING_HEADER_SIZE);
	uint64_t c = __atomic_fetch_add(&r->count, 1, __ATOMIC_RELAXED);

	if (c >= r->limit && !ag_ring_rotate(r, c))
		return;
	recs[c & r->mask] = rec;
}

void ag_ring_sync(trace_ring_header *r, uint64_t tsc)
{
	uint64_t high = tsc >> TRACE_TSC_LOW_BITS;

	put(r, trace_sync_rec(high));
	r->epoch = high;
}

/* A thread whose ring could not be made records nothing, and does not try
 * again at every call; the reason is logged once for the process (a program
 * that changed its user after the start could write no ring at all: that
 * was one identical line per call). */
static __thread uint8_t ring_failed __attribute__((tls_model("initial-exec")));
static volatile int ring_fail_said;

static trace_ring_header *ring_fails(const char *what, const char *path)
{
	int saved = errno;

	ring_failed = 1;
	if (!__atomic_exchange_n(&ring_fail_said, 1, __ATOMIC_ACQ_REL))
		ag_log("ring: cannot %s %s: %s%s; threads without a ring record nothing (said "
		       "once)", what, path, strerror(saved),
		       saved == EACCES && geteuid() != 0 ? " (the process runs as another user "
		       "than when it started?)" : "");
	return NULL;
}

/* A ring for the calling thread; the caller installs it (ag_leave).  With
 * every record kept, the same file starts as two chunks of half the ring
 * size, and the window moves on from there (the comment at the top). */
trace_ring_header *ag_ring_create(void)
{
	char path[4200];
	pid_t tid = ag_tls_quiet ? 0 : (pid_t)syscall(SYS_gettid);
	size_t size = TRACE_RING_HEADER_SIZE + ring_records * 8;
	/* A window no larger than twice the first part is reserved whole. */
	bool part = keep_all && FIRST_SLOTS < ring_records / 2;
	trace_ring_header *r;
	uint32_t slot;
	size_t plen;
	long rc;
	int fd;

	/* Not for a thread that cannot read the TSC (tsc.c): every record
	 * would fault.  Asked before anything else: a thread in strict
	 * seccomp mode may make no system call. */
	if (ring_failed || ag_tls_quiet || !ag_tsc_usable((int)tid))
		return NULL;
	plen = (size_t)snprintf(path, sizeof path, "%s/ring.%d", ag_dir, (int)tid);
	fd = ag_trace_open(path, O_RDWR | O_TRUNC);
	if (fd < 0)
		return ring_fails("create", path);
	if ((rc = grow(fd, 0, part ? TRACE_RING_HEADER_SIZE + FIRST_PART : size, keep_all)) < 0) {
		close(fd);
		errno = (int)-rc;
		return ring_fails("size", path);
	}
	r = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (r == MAP_FAILED)
		return ring_fails("map", path);
	/* The first fault of a file mapping reads ahead -- pages of zeros for
	 * this new file, as many as the device's read_ahead_kb (8 MB on some
	 * machines: 2-3 ms of zeroing, paid by every process that records more
	 * than the pages spared, whatever it records after them).  None in the
	 * first QUIET_START bytes, which most short processes never pass (an
	 * assembler's 460 KB, a compiler driver's 200 KB); a thread that
	 * records more meets the read-ahead further on, where it pays for
	 * itself. */
	madvise(r, size < QUIET_START ? size : QUIET_START, MADV_RANDOM);
	r->magic = TRACE_RING_MAGIC;
	r->version = TRACE_FORMAT_VERSION;
	r->header_size = TRACE_RING_HEADER_SIZE;
	r->capacity = ring_records;
	r->mask = ring_records - 1;
	r->kept_end = ~0ull;
	r->chunk = keep_all ? ring_records / 2 : 0;
	r->limit = !keep_all ? ~0ull : part ? FIRST_RECORDS : ring_records / 2;
	r->pid = (uint32_t)getpid();
	r->tid = (uint32_t)tid;
	r->start_tsc = ag_rdtsc();
	syscall(SYS_prctl, PR_GET_NAME, r->thread_name, 0, 0, 0);
	/* The path, for the moves (no formatting there); a thread's earlier
	 * one (a forked child's parent's thread) is left: paths are small. */
	own_path = keep_all ? ag_alloc(plen + 1) : NULL;
	if (own_path)
		memcpy(own_path, path, plen + 1);
	own_ring = r;
	if (ag_budget_percent() && !keep_all)
		r->limit = budget_scan_every(r);   /* the budget looks now and then */
	ag_budget_thread(r);
	ag_ring_sync(r, r->start_tsc);
	slot = __atomic_fetch_add(&nrings, 1, __ATOMIC_ACQ_REL);
	own_slot = 0;
	if (rings && slot < MAX_RINGS) {
		rings[slot] = r;
		own_slot = slot + 1;
	}
	return r;
}

void ag_ring_put(trace_ring_header *r, unsigned kind, uint32_t id)
{
	if (r)          /* no TSC read without a ring: a quiet thread has none */
		ag_ring_put_at(r, kind, id, ag_rdtsc());
}

void ag_ring_put_at(trace_ring_header *r, unsigned kind, uint32_t id, uint64_t tsc)
{
	if (!r)
		return;
	if ((tsc >> TRACE_TSC_LOW_BITS) != r->epoch)
		ag_ring_sync(r, tsc);
	put(r, trace_rec(kind, id, tsc));
}

/* A context event (trace_format.h): the key takes the timestamp's place. */
void ag_ring_put_key(trace_ring_header *r, uint32_t event, uint64_t key)
{
	if (r)
		put(r, trace_rec(TRACE_EVENT, event, key));
}

/* Two payload records taken at once (the budget's COUNT pairs). */
void ag_ring_put_pair(trace_ring_header *r, uint32_t ev1, uint64_t key1, uint32_t ev2,
		      uint64_t key2)
{
	uint64_t *recs = (uint64_t *)((char *)r + TRACE_RING_HEADER_SIZE);
	uint64_t c;

	if (!r)
		return;
	c = __atomic_fetch_add(&r->count, 2, __ATOMIC_RELAXED);
	if (c >= r->limit && !(ag_ring_rotate(r, c) && slot_mapped(r, c + 1)))
		return;
	recs[c & r->mask] = trace_rec(TRACE_EVENT, ev1, key1);
	recs[(c + 1) & r->mask] = trace_rec(TRACE_EVENT, ev2, key2);
}

/* Five slots taken at once: a signal handler's records cannot come between
 * a message's head and its data.  tsc: the head's time (0: now). */
void ag_ring_put_msg(trace_ring_header *r, uint32_t event, const uint64_t data[TRACE_MSG_NDATA],
		     uint64_t tsc)
{
	uint64_t *recs = (uint64_t *)((char *)r + TRACE_RING_HEADER_SIZE);
	uint64_t c;

	if (!tsc)
		tsc = ag_rdtsc();

	if ((tsc >> TRACE_TSC_LOW_BITS) != r->epoch)
		ag_ring_sync(r, tsc);
	c = __atomic_fetch_add(&r->count, 1 + TRACE_MSG_NDATA, __ATOMIC_RELAXED);
	/* Moved when the first index reaches limit, as for one record: then
	 * all five are in the chunk the move keeps.  Before that, all five are
	 * mapped already (they end below limit plus a chunk). */
	if (c >= r->limit && !(ag_ring_rotate(r, c) && slot_mapped(r, c + TRACE_MSG_NDATA)))
		return;
	recs[c & r->mask] = trace_rec(TRACE_EVENT, event, tsc);
	for (unsigned i = 0; i < TRACE_MSG_NDATA; i++)
		recs[(c + 1 + i) & r->mask] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[i]);
}

int ag_rings_init(void)
{
	rings = ag_alloc(MAX_RINGS * sizeof *rings);
	ahead = keep_all ? ag_alloc(MAX_RINGS * sizeof *ahead) : NULL;
	ahead_tsc = ahead ? ag_alloc(MAX_RINGS * sizeof *ahead_tsc) : NULL;
	if (!ahead_tsc)
		ahead = NULL;
	return rings ? 0 : -1;
}

/* Point 4, the control thread's side: fault in each chunk a move mapped
 * ahead, a piece at a time (each piece holds the address space's lock for
 * reading: another thread's mmap waits at most that long). */
#define POPULATE_PIECE (256u << 10)

static int populate_unsupported;
static uint64_t populated, populate_ns, populate_left;  /* chunks, their time; left */

/* Threads that moved their window in the last 100 ms: writers busy enough
 * to fill a chunk in a second or so. */
static uint32_t busy_writers(uint32_t n)
{
	uint64_t now = ag_rdtsc(), recent = ag_tsc_hz() / 10;
	uint32_t busy = 0;

	for (uint32_t i = 0; i < n; i++)
		if (ahead_tsc[i] && now - ahead_tsc[i] < recent)
			busy++;
	return busy;
}

/* The CPUs this process may run on (the control thread's set: the main
 * thread's when it was made), looked up once. */
static int cpus_allowed(void)
{
	static int n;
	cpu_set_t set;

	if (!n)
		n = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0
		    ? CPU_COUNT(&set) : 1;
	return n;
}

void ag_rings_populate(void)
{
	uint32_t n = nrings < MAX_RINGS ? nrings : MAX_RINGS;
	/* As many busy writers as the process has CPUs or more: no core is
	 * free for this work, which costs more here (3.4 us a page, through
	 * get_user_pages) than in the writer's own faults (2.2 us): each
	 * writer keeps its faults (8 threads on 2 cores: 2.37x the flight
	 * recorder's time with it, 2.20 without; bench/RECORDS.md). */
	bool skip = ahead && busy_writers(n) >= (uint32_t)cpus_allowed();

	for (uint32_t i = 0; ahead && !populate_unsupported && i < n; i++) {
		uint64_t at = __atomic_exchange_n(&ahead[i], 0, __ATOMIC_ACQ_REL);
		uint64_t len = rings[i] ? rings[i]->chunk * 8 : 0, t0;

		if (!at)
			continue;
		if (skip) {
			populate_left++;
			continue;
		}
		t0 = ag_mono_ns();
		for (uint64_t off = 0; off < len; off += POPULATE_PIECE)
			if (madvise((void *)(uintptr_t)(at + off), POPULATE_PIECE,
				    MADV_POPULATE_WRITE) != 0) {
				if (errno == EINVAL) {
					populate_unsupported = 1;
					ag_log("ring: no MADV_POPULATE_WRITE (%s): each thread "
					       "faults its own chunks in", strerror(errno));
				}
				break;
			}
		populated++;
		populate_ns += ag_mono_ns() - t0;
	}
}

void ag_rings_populate_log(void)
{
	if (populated || populate_left)
		ag_log("end: %lu chunks of every record faulted in ahead by the control thread "
		       "(%.1f ms), %lu left to their writers (as many busy writers as CPUs)",
		       (unsigned long)populated, (double)populate_ns / 1e6,
		       (unsigned long)populate_left);
}

void ag_rings_close_all(void)
{
	uint32_t n = nrings < MAX_RINGS ? nrings : MAX_RINGS;

	for (uint32_t i = 0; i < n; i++)
		if (rings[i])
			__atomic_or_fetch(&rings[i]->flags, TRACE_RING_CLOSED, __ATOMIC_RELEASE);
}

/* An event in every ring of the process (sptrace stop: DEACTIVATE).  Safe
 * next to the owner's records: a slot is taken with one atomic add. */
void ag_rings_event_all(uint32_t event)
{
	uint32_t n = nrings < MAX_RINGS ? nrings : MAX_RINGS;

	for (uint32_t i = 0; i < n; i++)
		if (rings[i])
			ag_ring_put(rings[i], TRACE_EVENT, event);
}

/* In a forked child: forget the parent's rings (still mapped, not ours). */
void ag_forked_child(void)
{
	nrings = 0;
	own_ring = NULL;
	ag_budget_forked_child();
}
