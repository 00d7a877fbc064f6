/*
 * ring.c — per-thread trace rings: files in the trace directory mapped
 * shared, so every record written is in the page cache the moment it is
 * stored and survives kill -9 of the process.
 *
 * The generated code writes records itself (see x86_64/emit.c); this file
 * creates a thread's ring on its first record, writes the rare records (SYNC,
 * events) from C, and closes rings at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"

__thread trace_ring_header *ag_tls_ring __attribute__((tls_model("initial-exec")));

#define MAX_RINGS 65536

static trace_ring_header **rings;
static volatile uint32_t nrings;
static uint64_t ring_records = 1u << 21;   /* 16 MiB of records per thread */

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

/* Take a slot and fill it; taking it is one instruction, so a signal
 * handler recording on this thread meanwhile gets other slots. */
static void put(trace_ring_header *r, uint64_t rec)
{
	uint64_t *recs = (uint64_t *)((char *)r + TRACE_RING_HEADER_SIZE);
	uint64_t c = __atomic_fetch_add(&r->count, 1, __ATOMIC_RELAXED);

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

/* A ring for the calling thread; the caller installs it (ag_leave). */
trace_ring_header *ag_ring_create(void)
{
	char path[4200];
	pid_t tid = ag_tls_quiet ? 0 : (pid_t)syscall(SYS_gettid);
	size_t size = TRACE_RING_HEADER_SIZE + ring_records * 8;
	trace_ring_header *r;
	uint32_t slot;
	int fd;

	/* Not for a thread that cannot read the TSC (tsc.c): every record
	 * would fault.  Asked before anything else: a thread in strict
	 * seccomp mode may make no system call. */
	if (ring_failed || ag_tls_quiet || !ag_tsc_usable((int)tid))
		return NULL;
	snprintf(path, sizeof path, "%s/ring.%d", ag_dir, (int)tid);
	fd = ag_trace_open(path, O_RDWR | O_TRUNC);
	if (fd < 0)
		return ring_fails("create", path);
	if (ftruncate(fd, (off_t)size) < 0) {
		int saved = errno;

		close(fd);
		errno = saved;
		return ring_fails("size", path);
	}
	r = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (r == MAP_FAILED)
		return ring_fails("map", path);
	r->magic = TRACE_RING_MAGIC;
	r->version = TRACE_FORMAT_VERSION;
	r->header_size = TRACE_RING_HEADER_SIZE;
	r->capacity = ring_records;
	r->mask = ring_records - 1;
	r->pid = (uint32_t)getpid();
	r->tid = (uint32_t)tid;
	r->start_tsc = ag_rdtsc();
	syscall(SYS_prctl, PR_GET_NAME, r->thread_name, 0, 0, 0);
	ag_ring_sync(r, r->start_tsc);
	slot = __atomic_fetch_add(&nrings, 1, __ATOMIC_ACQ_REL);
	if (rings && slot < MAX_RINGS)
		rings[slot] = r;
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

/* Five slots taken at once: a signal handler's records cannot come between
 * a message's head and its data. */
void ag_ring_put_msg(trace_ring_header *r, uint32_t event, const uint64_t data[TRACE_MSG_NDATA])
{
	uint64_t *recs = (uint64_t *)((char *)r + TRACE_RING_HEADER_SIZE);
	uint64_t tsc = ag_rdtsc(), c;

	if ((tsc >> TRACE_TSC_LOW_BITS) != r->epoch)
		ag_ring_sync(r, tsc);
	c = __atomic_fetch_add(&r->count, 1 + TRACE_MSG_NDATA, __ATOMIC_RELAXED);
	recs[c & r->mask] = trace_rec(TRACE_EVENT, event, tsc);
	for (unsigned i = 0; i < TRACE_MSG_NDATA; i++)
		recs[(c + 1 + i) & r->mask] = trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[i]);
}

int ag_rings_init(void)
{
	rings = ag_alloc(MAX_RINGS * sizeof *rings);
	return rings ? 0 : -1;
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
}
