/*
 * mapcost.c — what a process's mappings cost its fork and its exit, one kind
 * at a time (issue 16, section 2: bench/START.md).  Untraced, natively.
 *
 *   mapcost DIR
 *
 * For each kind below, 41 times: a child is forked (the parent times its
 * fork(): the address space copied), makes what the kind makes for itself
 * (the exit cases), says it is ready and waits; the parent writes it a byte
 * and times until waitpid returns (its exit: the address space torn down,
 * its files closed).  Medians, and the difference to `none`:
 *
 *   none            nothing more than this small program
 *   vmas 60         60 more mappings (one page of a shared memfd each), the
 *                   parent's: copied at the fork
 *   shared 2x640M   two 640 MB MAP_SHARED|MAP_NORESERVE files of DIR, 48
 *                   and 2 pages touched (the agent's sites and channels)
 *   anon 1000       1000 pages of private anonymous memory the parent wrote
 *                   (a fork copies their page-table entries)
 *   memfd-own 1000  the child's own memfd, 1000 pages written: freed at its
 *                   exit (the agent's patch-area pools in an exec'd image)
 *   memfd-kept 1000 1000 written pages of a memfd the parent also keeps:
 *                   the child's exit only unmaps them
 *   file-ro 1000    1000 pages of a file of DIR mapped read-only and read
 *                   (the repository's images): unmapped at the exit
 *
 * A kind's own setup is outside both timings.  Prints a Markdown table.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUNS 41
#define PAGE 4096
#define NPAGES 1000

enum kind { NONE, VMAS, SHARED, ANON, MEMFD_OWN, MEMFD_KEPT, FILE_RO, NKINDS };
static const char *names[NKINDS] = { "none", "vmas 60", "shared 2x640M", "anon 1000",
				     "memfd-own 1000", "memfd-kept 1000", "file-ro 1000" };
static const char *dir;
static int kept_fd = -1;

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void *map_file(const char *name, size_t size, int prot, int flags, size_t touch)
{
	char path[4200];
	int fd;
	char *p;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		die(path);
	p = mmap(NULL, size, prot, flags, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < touch; i++) {
		if (prot & PROT_WRITE)
			p[i * PAGE] = 1;
		else
			(void)*(volatile char *)(p + i * PAGE);
	}
	return p;
}

/* The parent's part of a kind, made once before its runs. */
static void parent_setup(enum kind k)
{
	switch (k) {
	case VMAS:
		for (int i = 0; i < 60; i++) {
			int fd = memfd_create("mapcost", MFD_CLOEXEC);
			char *p;

			if (fd < 0 || ftruncate(fd, PAGE) < 0)
				die("memfd");
			p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p == MAP_FAILED)
				die("mmap");
			p[0] = 1;
			close(fd);
		}
		break;
	case SHARED:
		map_file("mapcost.sites", 640u << 20, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_NORESERVE, 48);
		map_file("mapcost.channels", 640u << 20, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_NORESERVE, 2);
		break;
	case ANON: {
		char *p = mmap(NULL, NPAGES * PAGE, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			die("mmap");
		for (int i = 0; i < NPAGES; i++)
			p[i * PAGE] = 1;
		break;
	}
	case MEMFD_KEPT:
		kept_fd = memfd_create("mapcost", MFD_CLOEXEC);
		if (kept_fd < 0 || ftruncate(kept_fd, NPAGES * PAGE) < 0)
			die("memfd");
		break;
	case FILE_RO: {
		char path[4200], page[PAGE];
		int fd;

		snprintf(path, sizeof path, "%s/mapcost.image", dir);
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fd < 0)
			die(path);
		memset(page, 1, sizeof page);
		for (int i = 0; i < NPAGES; i++)
			if (write(fd, page, sizeof page) != (ssize_t)sizeof page)
				die("write");
		close(fd);
		break;
	}
	default:
		break;
	}
}

/* The child's part of an exit kind. */
static void child_setup(enum kind k)
{
	char *p;

	if (k == MEMFD_OWN || k == MEMFD_KEPT) {
		int fd = k == MEMFD_KEPT ? kept_fd : memfd_create("mapcost", MFD_CLOEXEC);

		if (fd < 0 || (k == MEMFD_OWN && ftruncate(fd, NPAGES * PAGE) < 0))
			_exit(2);
		p = mmap(NULL, NPAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			_exit(2);
		close(fd);
		for (int i = 0; i < NPAGES; i++)
			p[i * PAGE] = 1;
	} else if (k == FILE_RO) {
		map_file("mapcost.image", NPAGES * PAGE, PROT_READ, MAP_PRIVATE, NPAGES);
	}
}

static void measure(enum kind k, double *fork_us, double *exit_us)
{
	double f[RUNS], e[RUNS];

	for (int i = 0; i < RUNS; i++) {
		int go[2], ready[2];
		double t0, t1;
		pid_t c;
		char b;

		if (pipe(go) < 0 || pipe(ready) < 0)
			die("pipe");
		t0 = now_us();
		c = fork();
		if (c < 0)
			die("fork");
		if (c == 0) {
			child_setup(k);
			if (write(ready[1], "r", 1) != 1 || read(go[0], &b, 1) != 1)
				_exit(2);
			syscall(SYS_exit_group, 0);
		}
		f[i] = now_us() - t0;
		if (read(ready[0], &b, 1) != 1)
			die("child");
		usleep(1000);
		t1 = now_us();
		if (write(go[1], "g", 1) != 1 || waitpid(c, NULL, 0) != c)
			die("wait");
		e[i] = now_us() - t1;
		close(go[0]);
		close(go[1]);
		close(ready[0]);
		close(ready[1]);
	}
	qsort(f, RUNS, sizeof *f, cmp);
	qsort(e, RUNS, sizeof *e, cmp);
	*fork_us = f[RUNS / 2];
	*exit_us = e[RUNS / 2];
}

int main(int argc, char **argv)
{
	double base_f, base_e;

	if (argc != 2) {
		fprintf(stderr, "usage: mapcost DIR (a scratch directory on the trace's file system)\n");
		return 2;
	}
	dir = argv[1];
	printf("| kind (median of %d) | fork us | exit to wait us | fork - none | exit - none |\n",
	       RUNS);
	printf("|---|---:|---:|---:|---:|\n");
	/* Each kind in a process of its own: kinds do not add up. */
	for (int k = 0; k < NKINDS; k++) {
		int out[2];
		double r[2];
		pid_t c;

		if (pipe(out) < 0)
			die("pipe");
		c = fork();
		if (c == 0) {
			parent_setup((enum kind)k);
			measure((enum kind)k, &r[0], &r[1]);
			if (write(out[1], r, sizeof r) != (ssize_t)sizeof r)
				_exit(1);
			_exit(0);
		}
		if (read(out[0], r, sizeof r) != (ssize_t)sizeof r || waitpid(c, NULL, 0) != c)
			die("kind");
		close(out[0]);
		close(out[1]);
		if (k == NONE) {
			base_f = r[0];
			base_e = r[1];
		}
		printf("| %s | %.1f | %.1f | %+.1f | %+.1f |\n", names[k], r[0], r[1], r[0] - base_f,
		       r[1] - base_e);
	}
	return 0;
}
