/*
 * pool.c — executable memory for patch areas, within +-2 GiB of the module
 * whose sites jump there (a 5-byte jmp reaches only that far).
 *
 * A pool holds one fixed-size slot (AG_AREA_MAX bytes) per area, so that the
 * unwind information of every slot can be registered when the pool is made.
 * It is one memfd mapped three times:
 *
 *   [ code ........................ ][ data ...... ]   memfd
 *     RX at X (near the module)        RW at X+code  (flags the code tests
 *     RW anywhere (where we write)                    rip-relative)
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
	size_t used, data_used;
	volatile int lock;
	uint64_t tramp;   /* rx address of `jmp *ag_tramp_slow`, reachable by rel32 */
	int snap_fd;      /* its copy for a fork in progress, -1 */
};

/* Read /proc/self/maps without stdio: is [a, a+len) free? */
static int read_maps(char *buf, size_t cap)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t n = 0;
	ssize_t k;

	if (fd < 0)
		return -1;
	while (n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0)
		n += (size_t)k;
	close(fd);
	buf[n] = '\0';
	return (int)n;
}

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

/* The free gap nearest to [lo, hi) that holds `size` bytes, all of it within
 * +-2 GiB of both ends.  0 if none. */
static uint64_t find_gap(uint64_t lo, uint64_t hi, size_t size)
{
	static char maps[1 << 20];
	uint64_t prev_end = 0x10000, best = 0, bestd = UINT64_MAX;
	uint64_t min = hi > TWO_GIB ? hi - TWO_GIB + size : 0x10000;
	uint64_t max = lo + TWO_GIB - size;
	const char *p;

	if (read_maps(maps, sizeof maps) <= 0)
		return 0;
	for (p = maps;; ) {
		uint64_t start = 0, end = 0, cand;
		bool last = !*p;

		if (!last) {
			start = hex(&p);
			p++;
			end = hex(&p);
		} else {
			start = 0x7ffffffff000ull;
		}
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
		prev_end = end;
		while (*p && *p != '\n')
			p++;
		if (*p)
			p++;
	}
	return best;
}

ag_pool *ag_pool_near(uint64_t lo, uint64_t hi, size_t slots, size_t data)
{
	size_t code_size = ((slots + 1) * AG_AREA_MAX + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t data_size = (data + 65536 + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t total = code_size + data_size;
	ag_pool *pool = ag_alloc(sizeof *pool);
	int fd;

	if (!pool)
		return NULL;
	pool->code_size = code_size;
	pool->data_size = data_size;
	pool->snap_fd = -1;
	fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)total) < 0) {
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
		if (rx == MAP_FAILED)
			continue;       /* raced with another mapping: look again */
		data = mmap((uint8_t *)rx + pool->code_size, pool->data_size, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_FIXED_NOREPLACE, fd, pool->code_size);
		if (data == MAP_FAILED) {
			munmap(rx, pool->code_size);
			continue;
		}
		pool->rw = mmap(NULL, pool->code_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (pool->rw == MAP_FAILED) {
			munmap(rx, pool->code_size);
			munmap(data, pool->data_size);
			break;
		}
		pool->rx = rx;
		pool->data = data;
		close(fd);
		pool->next = all_pools;
		all_pools = pool;
		/* The first bytes: jmp *0(%rip); .quad ag_tramp_slow */
		{
			static const uint8_t jmp[6] = { 0xff, 0x25, 0, 0, 0, 0 };
			uint64_t target = (uint64_t)(uintptr_t)ag_tramp_slow;

			memcpy(pool->rw, jmp, 6);
			memcpy(pool->rw + 6, &target, 8);
			pool->tramp = (uint64_t)(uintptr_t)pool->rx;
			pool->used = AG_AREA_MAX;       /* areas fill whole slots after it */
		}
		/* Unwind info for every slot, now, in a safe context: registering
		 * later (from a slow path) could deadlock on the unwinder's lock when
		 * the slow path runs inside the unwinder's own malloc. */
		if (ag_unwind_register_slots((uint64_t)(uintptr_t)pool->rx + AG_AREA_MAX, slots)) {
			ag_log("pool: no unwind information for %zu areas (out of memory)", slots);
			return NULL;
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

bool ag_pool_code(ag_pool *p, size_t n, uint8_t **rx, uint8_t **rw)
{
	bool ok;

	if (n > AG_AREA_MAX)
		return false;
	n = AG_AREA_MAX;                        /* one slot: its FDE is ready */
	lock(p);
	ok = p->used + n <= p->code_size;
	if (ok) {
		*rx = p->rx + p->used;
		*rw = p->rw + p->used;
		p->used += n;
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

uint64_t ag_pool_tramp(ag_pool *p)
{
	return p->tramp;
}

bool ag_pool_holds(uint64_t addr)
{
	for (ag_pool *p = all_pools; p; p = p->next)
		if (addr >= (uint64_t)(uintptr_t)p->rx && addr < (uint64_t)(uintptr_t)p->rx + p->code_size)
			return true;
	return false;
}

/*
 * fork: the pools are the parent's memfd, mapped shared, so the child needs
 * copies of its own -- and copies of the pools as they were at the fork:
 * the child's code (a copy-on-write image of the parent's) jumps into areas
 * that must be there, and nothing the parent writes afterwards may show.
 * So the parent copies the used part of every pool into a new memfd just
 * before the fork, with the instrument lock held (areas and patches are
 * made only under it), and the child maps the copies over its pools.
 * Only what is used is copied: a fork costs a copy of the areas, not of
 * the pools' full reservations.
 */
void ag_pools_snapshot(void)
{
	for (ag_pool *p = all_pools; p; p = p->next) {
		int fd = (int)syscall(SYS_memfd_create, "sptrace-pool", MFD_CLOEXEC);

		if (fd >= 0 && (ftruncate(fd, (off_t)(p->code_size + p->data_size)) < 0 ||
				pwrite(fd, p->rw, p->used, 0) != (ssize_t)p->used ||
				pwrite(fd, p->data, p->data_used, (off_t)p->code_size) !=
					(ssize_t)p->data_used)) {
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

/* The child: its pools become the copies.  System calls only (an atfork
 * handler). */
void ag_pools_after_fork(void)
{
	for (ag_pool *p = all_pools; p; p = p->next) {
		int fd = p->snap_fd;

		if (fd < 0 ||
		    mmap(p->rw, p->code_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
			    MAP_FAILED ||
		    mmap(p->data, p->data_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
			 (off_t)p->code_size) == MAP_FAILED ||
		    mmap(p->rx, p->code_size, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) ==
			    MAP_FAILED) {
			/* Without a private pool the child must not instrument. */
			ag_log("fork: no copy of a patch-area pool: %s; the child stops tracing",
			       strerror(errno));
			p->used = p->code_size;
		}
		if (fd >= 0)
			close(fd);
		p->snap_fd = -1;
	}
}
