/*
 * calls.c — the empty-function microbenchmark of the agent benchmark
 * (bench/agent_bench.sh).  Built by the script with the system gcc -O2, and
 * once more with -pg for uftrace; not part of the meson build, because the
 * compiler flags are part of what is measured.
 *
 *   calls flat N     one noinline empty function called N times from main
 *   calls tree N     N/3 times: a noinline function that calls two noinline
 *                    empty leaves (three calls per round)
 *   calls empty      returns at once (startup cost of a traced program)
 *   calls rdtsc N    N back-to-back rdtsc (the agent reads the TSC twice per
 *                    traced call)
 *
 * Each mode prints one line: "<mode> calls <calls made> ns <wall> cpu_ns
 * <cpu>": CLOCK_MONOTONIC and CLOCK_THREAD_CPUTIME_ID around the loop only,
 * so the startup of a traced run (module analysis, activation) is not in
 * the per-call figure.  On a shared machine the thread's CPU time is the
 * steadier of the two: it leaves out the time other tenants run.
 *
 * --text-diff (after the mode) then compares the executable segments of
 * every loaded module with the bytes of its file and prints how many bytes
 * differ: the dormant agent is supposed to leave them alone.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

/* The empty asm keeps gcc from proving the functions pure and dropping the
 * calls; noinline keeps the calls. */
__attribute__((noinline)) void flat_leaf(void) { __asm__ volatile(""); }
__attribute__((noinline)) void tree_leaf_a(void) { __asm__ volatile(""); }
__attribute__((noinline)) void tree_leaf_b(void) { __asm__ volatile(""); }

/* The asm after the second call keeps it a call (not a tail jump), so a round
 * is three complete calls. */
__attribute__((noinline)) void tree_node(void)
{
	tree_leaf_a();
	tree_leaf_b();
	__asm__ volatile("");
}

static uint64_t now_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- --text-diff ---- */

static unsigned long diff_bytes;
static int diff_modules;

static int text_diff_one(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *path = info->dlpi_name;
	int fd;

	(void)size;
	(void)arg;
	if (!path || !*path)
		path = "/proc/self/exe";
	if (strstr(path, "linux-vdso"))
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		const unsigned char *mem = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
		unsigned char buf[65536];
		unsigned long d = 0;

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		for (size_t off = 0; off < ph->p_filesz; off += sizeof buf) {
			size_t n = ph->p_filesz - off < sizeof buf ? ph->p_filesz - off : sizeof buf;

			if (pread(fd, buf, n, (off_t)(ph->p_offset + off)) != (ssize_t)n)
				break;
			for (size_t j = 0; j < n; j++)
				d += mem[off + j] != buf[j];
		}
		if (d) {
			fprintf(stderr, "text-diff: %s: %lu bytes differ\n", path, d);
			diff_modules++;
		}
		diff_bytes += d;
	}
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	long n = argc > 2 ? atol(argv[2]) : 0, calls = 0;
	uint64_t t0, t1, c0, c1;

	if (strcmp(mode, "empty") == 0)
		return 0;
	if (n <= 0) {
		fprintf(stderr, "usage: calls flat|tree|rdtsc N [--text-diff] | calls empty\n");
		return 2;
	}
	c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
	t0 = now_ns(CLOCK_MONOTONIC);
	if (strcmp(mode, "flat") == 0) {
		for (long i = 0; i < n; i++)
			flat_leaf();
		calls = n;
	} else if (strcmp(mode, "tree") == 0) {
		for (long i = 0; i < n / 3; i++)
			tree_node();
		calls = n / 3 * 3;
	} else if (strcmp(mode, "rdtsc") == 0) {
		uint64_t sum = 0;

		for (long i = 0; i < n; i++)
			sum += __rdtsc();
		__asm__ volatile("" : : "r"(sum));
		calls = n;
	} else {
		fprintf(stderr, "calls: unknown mode '%s'\n", mode);
		return 2;
	}
	t1 = now_ns(CLOCK_MONOTONIC);
	c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
	printf("%s calls %ld ns %llu cpu_ns %llu\n", mode, calls, (unsigned long long)(t1 - t0),
	       (unsigned long long)(c1 - c0));
	if (argc > 3 && strcmp(argv[3], "--text-diff") == 0) {
		dl_iterate_phdr(text_diff_one, NULL);
		printf("text-diff bytes %lu modules %d\n", diff_bytes, diff_modules);
	}
	return 0;
}
