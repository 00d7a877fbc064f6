/*
 * pool.c — executable memory for patch areas, within +-2 GiB of the module
 * whose sites jump there (a 5-byte jmp reaches only that far).
 *
 * A pool holds one fixed-size slot per area, so that the unwind information
 * of every slot can be registered when the pool is made: its code has two
 * regions, small slots (AG_SLOT_SMALL bytes, a plain call's area) and big
 * ones (AG_SLOT_BIG), each aligned to its slot size.  Only the slots written
 * take memory (a page of the memfd is made at its first write), so each
 * region has room for every site.  The code is a memfd mapped twice, its
 * data private memory beside it:
 *
 *   [ code: small slots | big slots ][ data ...... ]
 *     RX at X (near the module)        RW at X+code, private (flags the code
 *     RW anywhere (where we write)     tests rip-relative; a fork copies it
 *                                      page by page, as it copies the heap)
 *
 * so code memory is never writable and executable at once, writing a new
 * area is a memcpy, and the code reaches its data with rip-relative
 * operands.  Pools are never unmapped: a thread may still be inside an area
 * or about to return into one.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "arch.h"

#define TWO_GIB (2ull << 30)
#define PAGE 4096u

static struct ag_pool *all_pools;

struct ag_pool {
	struct ag_pool *next;       /* every pool, for fork (ag_pools_after_fork) */
	uint8_t *rx, *rw, *data;
	size_t code_size, data_size;
	size_t start[2], end[2];    /* the regions of small and big slots, in code */
	size_t used[2];             /* each one's first free slot, in code */
	size_t data_used;
	volatile int lock;
	uint64_t stubs;   /* its data's table of the stubs' addresses (emit.c) */
	pid_t owner;      /* the process whose memfd holds each region from `used` on */
	bool reused;      /* slots written again after use: copied at a fork */
	bool written;     /* ... and one was (ag_pool_writing) */
	bool snap_none;   /* ... not, at the fork in progress: no copy */
	int snap_fd;      /* its copy for a fork in progress (reused pools), -1 */
};

/*
 * Where the free address ranges are: /proc/self/maps, parsed into the
 * mappings' ranges.  A read costs an open, three reads and a close (0.1 ms
 * under perf trace for /bin/true's 60 mappings: the kernel formats every
 * line); the agent's start makes 5 pools one after the other, so there
 * the ranges are read once and kept (ag_pools_keep_maps):
 *
 *  1. Each pool made while they are kept adds its own mappings to them.
 *  2. Anything else mapped meanwhile (the repository's images, the
 *     allocator's chunks) is missing from them: a gap chosen there is
 *     mapped with MAP_FIXED_NOREPLACE, which fails on any mapping in the
 *     way; the ranges are then read again (the retry ag_pool_near already
 *     makes for a mapping raced by another thread).
 *  3. A range unmapped meanwhile only looks taken: a pool may land a little
 *     farther than it could have, never on anything.
 *  4. Kept only during the start of a process that is not attached (the
 *     main thread alone reads and writes them: the control thread, started
 *     meanwhile, makes no pool before the start is over, control.c point
 *     2); otherwise every pool reads the file, as before.
 */
#define MAX_RANGES 32768

static struct { uint64_t start, end; } ranges[MAX_RANGES];
static size_t nranges;
static bool ranges_kept, ranges_fresh;

static uint64_t hex(const char **p)
{
	uint64_t v = 0;

	for (;; (*p)++) {
		char c = **p;
		if (c >= '0' && c <= '9')
			v = v * 16 + (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v * 16 + (uint64_t)(c - 'a' + 10);
		else
			return v;
	}
}

/* Read /proc/self/maps without stdio into `ranges`; -1 if unreadable. */
static int read_ranges(void)
{
	static char maps[1 << 20];
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t n = 0;
	ssize_t k;
	const char *p;

	if (fd < 0)
		return -1;
	while (n + 1 < sizeof maps && (k = read(fd, maps + n, sizeof maps - 1 - n)) > 0)
		n += (size_t)k;
	close(fd);
	maps[n] = '\0';
	if (n == 0)
		return -1;
	nranges = 0;
	for (p = maps; *p && nranges < MAX_RANGES; ) {
		ranges[nranges].start = hex(&p);
		p++;
		ranges[nranges++].end = hex(&p);
		while (*p && *p != '\n')
			p++;
		if (*p)
			p++;
	}
	ranges_fresh = true;
	return 0;
}

/* Point 1: [start, end) is mapped now (the ranges stay sorted). */
static void range_taken(uint64_t start, uint64_t end)
{
	size_t i = nranges;

	if (!ranges_kept || nranges == MAX_RANGES) {
		ranges_fresh = false;
		return;
	}
	while (i > 0 && ranges[i - 1].start > start) {
		ranges[i] = ranges[i - 1];
		i--;
	}
	ranges[i].start = start;
	ranges[i].end = end;
	nranges++;
}

void ag_pools_keep_maps(bool on)
{
	ranges_kept = on;
	ranges_fresh = false;
}

/* The free gap nearest to [lo, hi) that holds `size` bytes, all of it within
 * +-2 GiB of both ends.  0 if none. */
static uint64_t find_gap(uint64_t lo, uint64_t hi, size_t size)
{
	uint64_t prev_end = 0x10000, best = 0, bestd = UINT64_MAX;
	uint64_t min = hi > TWO_GIB ? hi - TWO_GIB + size : 0x10000;
	uint64_t max = lo + TWO_GIB - size;

	if (!(ranges_kept && ranges_fresh) && read_ranges() != 0)
		return 0;
	for (size_t i = 0;; i++) {
		uint64_t start, cand;
		bool last = i == nranges;

		start = last ? 0x7ffffffff000ull : ranges[i].start;
		/* Gap [prev_end, start): try its top (below lo) or bottom (above hi). */
		if (start > prev_end && start - prev_end >= size) {
			uint64_t g0 = (prev_end + 0xffff) & ~0xffffull, g1 = (start - size) & ~0xffffull;

			if (g0 <= g1) {
				cand = g1 < lo ? g1 : g0;
				if (cand >= min && cand <= max) {
					uint64_t d = cand < lo ? lo - cand : cand - hi;
					if (d < bestd) {
						bestd = d;
						best = cand;
					}
				}
			}
		}
		if (last)
			break;
		if (ranges[i].end > prev_end)   /* a range of ours may lie inside a stale one */
			prev_end = ranges[i].end;
	}
	return best;
}

static size_t page_up(size_t n)
{
	return (n + PAGE - 1) & ~(size_t)(PAGE - 1);
}

static const size_t slot_size[2] = { AG_SLOT_SMALL, AG_SLOT_BIG };

ag_pool *ag_pool_near(uint64_t lo, uint64_t hi, size_t small, size_t big, size_t data,
		      bool reused)
{
	size_t small_size = page_up((small ? small : 1) * AG_SLOT_SMALL);
	size_t code_size = small_size + page_up(big * AG_SLOT_BIG);
	size_t data_size = (data + 65536 + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t total = code_size + data_size;
	ag_pool *pool = ag_alloc(sizeof *pool);
	int fd;

	if (!pool)
		return NULL;
	pool->code_size = code_size;
	pool->start[0] = pool->used[0] = 0;
	pool->end[0] = pool->start[1] = pool->used[1] = small_size;
	pool->end[1] = code_size;
	pool->data_size = data_size;
	pool->snap_fd = -1;
	pool->reused = reused;
	pool->owner = ag_self_pid ? ag_self_pid : getpid();   /* before ag_threads_init */
	fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)code_size) < 0) {
		ag_log("pool: memfd: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (int tries = 0; tries < 8; tries++) {
		uint64_t at = find_gap(lo, hi, total);
		void *rx, *data;

		if (!at)
			break;
		rx = mmap((void *)at, pool->code_size, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED_NOREPLACE,
			  fd, 0);
		/* (a kernel older than MAP_FIXED_NOREPLACE takes it for a hint) */
		if (rx != MAP_FAILED && rx != (void *)at) {
			munmap(rx, pool->code_size);
			rx = MAP_FAILED;
		}
		if (rx == MAP_FAILED) {
			ranges_fresh = false;   /* raced with another mapping: look again */
			continue;
		}
		data = mmap((uint8_t *)rx + pool->code_size, pool->data_size, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (data != MAP_FAILED && data != (uint8_t *)rx + pool->code_size) {
			munmap(data, pool->data_size);
			data = MAP_FAILED;
		}
		if (data == MAP_FAILED) {
			munmap(rx, pool->code_size);
			ranges_fresh = false;
			continue;
		}
		pool->rw = mmap(NULL, pool->code_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (pool->rw == MAP_FAILED) {
			munmap(rx, pool->code_size);
			munmap(data, pool->data_size);
			break;
		}
		range_taken(at, at + total);
		range_taken((uint64_t)(uintptr_t)pool->rw,
			    (uint64_t)(uintptr_t)pool->rw + pool->code_size);
		pool->rx = rx;
		pool->data = data;
		close(fd);
		pool->next = all_pools;
		all_pools = pool;
		/* The stubs the areas call through it, rip-relative (emit.c). */
		{
			const char *const stub[AG_STUBS] = {
				[AG_STUB_ENTRY] = ag_record_entry, [AG_STUB_EXIT] = ag_record_exit,
				[AG_STUB_VALUE] = ag_record_value, [AG_STUB_INSTRUMENT] = ag_instrument_stub,
				[AG_STUB_INDIRECT] = ag_indirect_stub,
				[AG_STUB_BUDGET] = ag_budget_stub,
			};
			uint64_t *table = (uint64_t *)(void *)ag_pool_data(pool, sizeof(uint64_t) * AG_STUBS);

			if (!table)     /* (the data's first bytes: never) */
				return NULL;
			for (int i = 0; i < AG_STUBS; i++)
				table[i] = (uint64_t)(uintptr_t)stub[i];
			pool->stubs = (uint64_t)(uintptr_t)table;
		}
		/* Unwind info for every slot, now, in a safe context: registering
		 * later (from a slow path) could deadlock on the unwinder's lock when
		 * the slow path runs inside the unwinder's own malloc.  (Every slot
		 * of the regions' pages: sites met again after a deactivation take
		 * new ones, past `small` and `big`.) */
		for (int r = 0; r < 2; r++) {
			size_t n = (pool->end[r] - pool->start[r]) / slot_size[r];

			if (ag_unwind_register_slots((uint64_t)(uintptr_t)pool->rx + pool->start[r], n,
						     slot_size[r])) {
				ag_log("pool: no unwind information for %zu areas (out of memory)", n);
				return NULL;
			}
		}
		return pool;
	}
	ag_log("pool: no free address range within 2 GiB of %#lx-%#lx", (unsigned long)lo,
	       (unsigned long)hi);
	close(fd);
	return NULL;
}

static void lock(ag_pool *p)
{
	while (__atomic_exchange_n(&p->lock, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
}

static void unlock(ag_pool *p)
{
	__atomic_store_n(&p->lock, 0, __ATOMIC_RELEASE);
}

static void take_rest(ag_pool *p);

bool ag_pool_code(ag_pool *p, size_t n, uint8_t **rx, uint8_t **rw)
{
	int r = n <= AG_SLOT_CODE(AG_SLOT_SMALL) ? 0 : 1;
	bool ok;

	if (n > AG_SLOT_CODE(AG_SLOT_BIG))
		return false;
	lock(p);
	if (p->owner != ag_self_pid && !p->reused)
		take_rest(p);
	ok = p->used[r] + slot_size[r] <= p->end[r];
	if (ok) {
		*rx = p->rx + p->used[r];
		*rw = p->rw + p->used[r];
		p->used[r] += slot_size[r];
	}
	unlock(p);
	return ok;
}

uint8_t *ag_pool_data(ag_pool *p, size_t n)
{
	uint8_t *r = NULL;

	lock(p);
	n = (n + 15) & ~(size_t)15;
	if (p->data_used + n <= p->data_size) {
		r = p->data + p->data_used;
		p->data_used += n;
	}
	unlock(p);
	return r;
}

uint64_t ag_pool_stubs(ag_pool *p)
{
	return p->stubs;
}

uint64_t ag_pool_slot_of(uint64_t addr)
{
	for (ag_pool *p = all_pools; p; p = p->next) {
		uint64_t off = addr - (uint64_t)(uintptr_t)p->rx;

		if (addr >= (uint64_t)(uintptr_t)p->rx && off < p->code_size)
			return addr & ~(uint64_t)(slot_size[off >= p->start[1]] - 1);
	}
	return 0;
}

bool ag_pool_holds(uint64_t addr)
{
	for (ag_pool *p = all_pools; p; p = p->next)
		if (addr >= (uint64_t)(uintptr_t)p->rx && addr < (uint64_t)(uintptr_t)p->rx + p->code_size)
			return true;
	return false;
}

/*
 * fork: the child's code is a copy-on-write image of the parent's, patched
 * sites included, so it jumps into the parent's areas -- which must be
 * there, unchanged, whatever the parent does afterwards.  They are:
 *
 *   1. An area's slot is written once, when it is made, before any site
 *      jumps there, and never again (a pool's used part only grows).  So the
 *      child keeps the parent's memfd mapped: the slots below `used` at the
 *      fork are the same bytes in both, for as long as either lives.
 *   2. The parent goes on making areas from its `used` on, into its memfd;
 *      the child's patched code never jumps there.  The child makes its
 *      first area (ag_pool_code, owner != ag_self_pid) only after mapping a
 *      memfd of its own over the rest of each region, from the first page
 *      boundary at or above its `used` (take_rest): from there on each
 *      writes only its own memory.  The slots of the page shared across that
 *      boundary are left to the parent (a few KB per child that makes areas).
 *   3. Data (function states, flags, caches) is private memory: the fork
 *      copies it page by page, as it copies the heap.
 *   4. The return-stub pool is different: a slot is written again each time
 *      it is reused (activate.c), so that pool is copied for the child as it
 *      is at the fork (`reused`: ag_pools_snapshot, with the instrument lock
 *      held), as every pool was before -- a copy of 6 MB for bash's areas,
 *      2 ms at every fork.  Unless nothing was ever written into it (no
 *      activation in the middle of the run: every process of `sptrace run`
 *      that is not activated later): then there is nothing the child could
 *      need, and no copy (a memfd, its size, two writes and two maps at
 *      every fork).  The child's pool stays its parent's memory until its
 *      first write (ag_pool_writing), which maps an empty memfd of its own
 *      over all of it first, as take_rest does for the rest of the others.
 *
 * A process that only forks and execs thus copies nothing, nor maps
 * anything.  A vfork child runs on its parent's memory (and pid in
 * ag_self_pid): its areas are the parent's, as its patches are.
 */
static void take_rest(ag_pool *p)
{
	size_t from[2], size[2];
	bool ok;
	int fd;

	p->owner = ag_self_pid;
	for (int r = 0; r < 2; r++) {
		from[r] = page_up(p->used[r]);
		size[r] = from[r] < p->end[r] ? p->end[r] - from[r] : 0;
	}
	if (!size[0] && !size[1]) {
		p->used[0] = p->end[0];
		p->used[1] = p->end[1];
		return;
	}
	/* One memfd for both rests: the small one's first, then the big one's. */
	fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);
	ok = fd >= 0 && ftruncate(fd, (off_t)(size[0] + size[1])) == 0;
	for (int r = 0; r < 2 && ok; r++) {
		off_t at = r ? (off_t)size[0] : 0;

		if (size[r] &&
		    (mmap(p->rw + from[r], size[r], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
			  at) == MAP_FAILED ||
		     mmap(p->rx + from[r], size[r], PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd,
			  at) == MAP_FAILED))
			ok = false;
	}
	for (int r = 0; r < 2; r++)
		/* Without its own memory, its parent's from `from` on: not to be
		 * written. */
		p->used[r] = ok ? from[r] : p->end[r];
	if (!ok)
		ag_log("fork: no patch-area pool of its own (%s); no new function is traced in "
		       "this process", strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Point 4: a reused pool's slot is about to be written.  False: no memory
 * of this process's own to write into (said in agent.log). */
bool ag_pool_writing(ag_pool *p)
{
	bool ok = true;
	int fd;

	lock(p);
	if (p->owner != ag_self_pid) {
		fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);
		ok = fd >= 0 && ftruncate(fd, (off_t)p->code_size) == 0 &&
		     mmap(p->rw, p->code_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) !=
			     MAP_FAILED &&
		     mmap(p->rx, p->code_size, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) !=
			     MAP_FAILED;
		if (fd >= 0)
			close(fd);
		if (ok)
			p->owner = ag_self_pid;
		else
			ag_log("fork: no return-stub pool of its own (%s); a mid-run activation "
			       "will not record the exits of the functions already running",
			       strerror(errno));
	}
	if (ok)
		p->written = true;
	unlock(p);
	return ok;
}

void ag_pools_snapshot(void)
{
	for (ag_pool *p = all_pools; p; p = p->next) {
		int fd;

		if (!p->reused)
			continue;
		p->snap_none = !p->written;
		if (p->snap_none)
			continue;
		fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);
		if (fd >= 0 && (ftruncate(fd, (off_t)p->code_size) < 0 ||
				pwrite(fd, p->rw, p->used[0], 0) != (ssize_t)p->used[0] ||
				pwrite(fd, p->rw + p->start[1], p->used[1] - p->start[1],
				       (off_t)p->start[1]) != (ssize_t)(p->used[1] - p->start[1]))) {
			close(fd);
			fd = -1;
		}
		p->snap_fd = fd;
	}
}

/* The parent, after the fork: the copies are the child's. */
void ag_pools_snapshot_done(void)
{
	for (ag_pool *p = all_pools; p; p = p->next)
		if (p->snap_fd >= 0) {
			close(p->snap_fd);
			p->snap_fd = -1;
		}
}

/* The child: its reused pools become the copies.  System calls only (an
 * atfork handler). */
void ag_pools_after_fork(void)
{
	for (ag_pool *p = all_pools; p; p = p->next) {
		int fd = p->snap_fd;

		if (!p->reused)
			continue;
		if (p->snap_none)
			continue;       /* point 4: its own memory at its first write */
		if (fd < 0 ||
		    mmap(p->rw, p->code_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
			    MAP_FAILED ||
		    mmap(p->rx, p->code_size, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) ==
			    MAP_FAILED) {
			/* Without a private pool the child must not write there. */
			ag_log("fork: no copy of the return-stub pool: %s; a mid-run activation in "
			       "the child will not record the exits of the functions it is in",
			       strerror(errno));
			p->used[0] = p->end[0];
			p->used[1] = p->end[1];
		}
		if (fd >= 0)
			close(fd);
		p->snap_fd = -1;
		p->owner = ag_self_pid;
	}
}
