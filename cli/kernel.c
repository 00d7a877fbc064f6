/*
 * kernel.c — `sptrace run --kernel`: the kernel part of a trace, through
 * the kernel module's /dev/sptrace (kagent/sptrace_kagent.h).
 *
 *  1. Prepare (before the program starts; the module's protocol is in
 *     kagent/probes.c): read the live kernel's symbols (/proc/kallsyms)
 *     and code (/proc/kcore), follow the direct calls and tail jumps from
 *     the entry functions of the system calls asked for (__x64_sys_NAME)
 *     to a bounded depth with capstone, and hand the functions reached to
 *     the module, which hooks each through ftrace.
 *  2. Scope: the program's pid joins the module's scope before it execs
 *     (the child waits for it); its forks join by themselves.
 *  3. While it runs, the per-CPU rings (mapped read-only) are copied out
 *     before they come round; what a ring overwrote first is counted.
 *  4. At the end the device is closed (every probe is removed) and the
 *     records are written into the trace: each traced thread's in
 *     kernel.<tid>, in time order, as calls of sites of a "[kernel]"
 *     module (sites file, a module line in meta, names in kernel.syms), so
 *     that readers merge them with the thread's own records by TSC and a
 *     system call's kernel functions nest under the call that made it.
 *     Kept are the records of a system call's entry function and of what
 *     runs nested in it; the probed functions also run when the thread
 *     enters the kernel otherwise (a page fault, a signal's delivery, an
 *     interrupt's softirq work): those, records from before the trace's
 *     activation, and those of threads the trace has no ring for are
 *     counted and said, not written.
 */
#include "cli.h"

#include <capstone/capstone.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis.h"
#include "codeanalysis.h"
#include "trace_format.h"
#include "../kagent/sptrace_kagent.h"

/* The system calls followed when --kernel names none. */
static const char default_calls[] =
	"read,write,pread64,pwrite64,readv,writev,openat,close,newfstat,newfstatat,lseek,"
	"getppid,getpid,gettid,pipe2,nanosleep,clock_nanosleep,sendto,recvfrom,sendmsg,"
	"recvmsg,connect,accept4,ppoll,epoll_wait";
#define DEPTH 4                 /* calls followed below a system call's entry */
#define MAX_FUNC_BYTES 16384    /* longer functions are read this far */

typedef struct ksym {
	uint64_t addr, end;
	char *name;
} ksym;

typedef struct krec {
	uint64_t tsc;
	uint32_t tid, func;
} krec;

typedef struct kcore {
	int fd;
	Elf64_Phdr *ph;
	size_t nph;
} kcore;

typedef struct graph {
	const ksym **funcs;     /* reached, in order: the first ncalls are entries */
	int *depth;
	size_t n, cap;
} graph;

struct cli_kernel {
	int fd;
	const char *cmd;
	uint32_t nrings;
	void **rings;
	uint64_t *pos;          /* per ring: the next record to copy */
	uint64_t lost;
	krec *recs;
	size_t nrecs, caprecs;
	uint64_t *func_addr;    /* function index -> address */
	char **func_name;
	uint8_t *func_root;     /* a system call's entry function */
	uint32_t nfuncs;
	size_t ncalls;          /* system calls prepared */
	/* The live kernel, kept for the functions found while it runs. */
	ksym *syms;
	size_t nsyms;
	kcore kc;
	csh cs;
	int has_kc, has_cs;
	graph g;                /* every function handed to the module */
	size_t sent;            /* g's functions handed so far */
	struct spk_site *sites; /* indirect calls found */
	size_t nsites, capsites, sites_sent, watched;
	size_t found;           /* functions found through indirect calls */
	/* the module core's counts when it was opened (one opener at a time) */
	uint64_t core_misses0, core_reached0, core_ids0;
	int indirect;           /* --kernel-indirect: watch the indirect calls */
};

/* ---- /proc/kallsyms ---- */

static int sym_cmp(const void *a, const void *b)
{
	const ksym *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The kernel's own text symbols (no module's), sorted, each with the start
 * of the next as its end. */
static int read_kallsyms(const char *cmd, ksym **out, size_t *n)
{
	FILE *f = fopen("/proc/kallsyms", "re");
	char line[512], name[256], type;
	unsigned long long a;
	ksym *s = NULL;
	size_t cap = 0, k = 0, nonzero = 0;

	if (!f)
		return cli_error("%s: --kernel: cannot read /proc/kallsyms: %s", cmd, strerror(errno));
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "%llx %c %255s", &a, &type, name) != 3 || strchr(line, '[') ||
		    (type != 't' && type != 'T'))
			continue;
		if (k == cap) {
			ksym *ns = realloc(s, (cap = cap ? 2 * cap : 65536) * sizeof *s);

			if (!ns)
				break;
			s = ns;
		}
		s[k].addr = a;
		s[k].name = strdup(name);
		if (!s[k].name)
			break;
		nonzero += a != 0;
		k++;
	}
	fclose(f);
	if (!nonzero) {
		for (size_t i = 0; i < k; i++)
			free(s[i].name);
		free(s);
		return cli_error("%s: --kernel: /proc/kallsyms shows no addresses: run as root "
				 "(and kernel.kptr_restrict below 2)", cmd);
	}
	qsort(s, k, sizeof *s, sym_cmp);
	for (size_t i = 0; i < k; i++)
		s[i].end = i + 1 < k ? s[i + 1].addr : s[i].addr;
	*out = s;
	*n = k;
	return 0;
}

static const ksym *sym_at(const ksym *s, size_t n, uint64_t addr)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (s[mid].addr < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && s[lo].addr == addr ? &s[lo] : NULL;
}

static const ksym *sym_named(const ksym *s, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(s[i].name, name) == 0)
			return &s[i];
	return NULL;
}

/* Not followed: thunks and the instrumentation's own hooks, which are not
 * calls of the kernel's flow, and the locking and scheduling primitives
 * every path of the kernel takes (a probe there would cost every process
 * on the machine, and their returns are what the module itself runs on). */
static int left_out(const char *name)
{
	static const char *const prefix[] = {
		"__x86_", "__fentry__", "__SCT__", "__sanitizer", "__ubsan", "__stack_chk",
		"__kasan", "__tsan", "_raw_", "__raw_", "preempt_", "__preempt", "rcu_",
		"__rcu_", "__cond_resched", "_cond_resched", "__might_", "lock_", "__lock",
		"mutex_", "down_", "up_", "__warn", "warn_", "__fortify", "kprobe", "__kprobe",
		"ftrace", "__ftrace", "__put_user", "__get_user", "copy_user", "__copy_user",
		"rep_movs", "memcpy", "memset", "memmove", "__memcpy", "__memset", "__memmove",
		"native_", "__native_", "__schedule", "schedule", "__switch_to", "finish_task_switch",
	};

	for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
		if (strncmp(name, prefix[i], strlen(prefix[i])) == 0)
			return 1;
	return 0;
}

/* ---- /proc/kcore ---- */

static int kcore_open(const char *cmd, kcore *kc)
{
	Elf64_Ehdr eh;

	kc->fd = open("/proc/kcore", O_RDONLY | O_CLOEXEC);
	if (kc->fd < 0)
		return cli_error("%s: --kernel: cannot read /proc/kcore (the kernel's code): %s%s",
				 cmd, strerror(errno), errno == EACCES || errno == EPERM ?
				 " (run as root)" : "");
	if (pread(kc->fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_phentsize != sizeof(Elf64_Phdr) ||
	    eh.e_phnum == 0 || eh.e_phnum > 4096) {
		close(kc->fd);
		return cli_error("%s: --kernel: /proc/kcore is not the ELF file it should be", cmd);
	}
	kc->nph = eh.e_phnum;
	kc->ph = calloc(kc->nph, sizeof *kc->ph);
	if (!kc->ph || pread(kc->fd, kc->ph, kc->nph * sizeof *kc->ph, (off_t)eh.e_phoff) !=
		       (ssize_t)(kc->nph * sizeof *kc->ph)) {
		free(kc->ph);
		close(kc->fd);
		return cli_error("%s: --kernel: cannot read /proc/kcore's program headers", cmd);
	}
	return 0;
}

static ssize_t kcore_read(const kcore *kc, uint64_t addr, uint8_t *buf, size_t len)
{
	for (size_t i = 0; i < kc->nph; i++) {
		const Elf64_Phdr *p = &kc->ph[i];

		if (p->p_type != PT_LOAD || addr < p->p_vaddr || addr >= p->p_vaddr + p->p_memsz)
			continue;
		if (len > p->p_vaddr + p->p_memsz - addr)
			len = p->p_vaddr + p->p_memsz - addr;
		return pread(kc->fd, buf, len, (off_t)(p->p_offset + (addr - p->p_vaddr)));
	}
	return -1;
}

static void kcore_close(kcore *kc)
{
	free(kc->ph);
	close(kc->fd);
}

/* ---- the call graph (step 1) ---- */

/* 1 if f joined, 0 if it was there, -1 out of memory. */
static int graph_add(graph *g, const ksym *f, int depth)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->funcs[i] == f)
			return 0;
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 256;
		const ksym **nf = realloc(g->funcs, cap * sizeof *nf);
		int *nd;

		if (!nf)
			return -1;
		g->funcs = nf;
		if (!(nd = realloc(g->depth, cap * sizeof *nd)))
			return -1;
		g->depth = nd;
		g->cap = cap;
	}
	g->funcs[g->n] = f;
	g->depth[g->n++] = depth;
	return 1;
}

/* The register an indirect call or jump takes its target from
 * (SPK_REG_*), or -1: `call *%reg`, or a call of the retpoline thunk
 * __x86_indirect_thunk_REG (the form the kernel keeps when retpolines are
 * on; alternatives turn it into `call *%reg` otherwise). */
static int indirect_reg(const cli_kernel *k, const cs_x86 *x, const ksym *t)
{
	static const char *const names[SPK_NREGS] = {
		"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
		"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
	};
	static const x86_reg regs[SPK_NREGS] = {
		X86_REG_RAX, X86_REG_RCX, X86_REG_RDX, X86_REG_RBX, X86_REG_RSP, X86_REG_RBP,
		X86_REG_RSI, X86_REG_RDI, X86_REG_R8, X86_REG_R9, X86_REG_R10, X86_REG_R11,
		X86_REG_R12, X86_REG_R13, X86_REG_R14, X86_REG_R15,
	};
	static const char prefix[] = "__x86_indirect_thunk_";

	if (x->op_count != 1)
		return -1;
	for (int r = 0; r < SPK_NREGS; r++)
		if (x->operands[0].type == X86_OP_REG && x->operands[0].reg == regs[r])
			return r;
	/* Symbols at the thunk's address: __x86_indirect_thunk_array too. */
	for (; t && t < k->syms + k->nsyms && t->addr == (uint64_t)x->operands[0].imm; t++)
		for (int r = 0; r < SPK_NREGS; r++)
			if (strncmp(t->name, prefix, sizeof prefix - 1) == 0 &&
			    strcmp(t->name + sizeof prefix - 1, names[r]) == 0)
				return r;
	return -1;
}

static int site_add(cli_kernel *k, uint64_t addr, int reg)
{
	if (k->nsites == k->capsites) {
		size_t cap = k->capsites ? 2 * k->capsites : 256;
		struct spk_site *ns = realloc(k->sites, cap * sizeof *ns);

		if (!ns)
			return -1;
		k->sites = ns;
		k->capsites = cap;
	}
	k->sites[k->nsites++] = (struct spk_site){ addr, (uint32_t)reg, 0 };
	return 0;
}

/* The direct callees of f (calls and jumps to another function's entry)
 * join the graph; its indirect calls and jumps join k->sites. */
static int follow(cli_kernel *k, const ksym *f, int depth)
{
	size_t len = f->end > f->addr ? f->end - f->addr : 0;
	uint8_t *buf;
	const uint8_t *code;
	uint64_t pc;
	cs_insn *in;
	ssize_t got;

	if (len > MAX_FUNC_BYTES)
		len = MAX_FUNC_BYTES;
	if (!len || !(buf = malloc(len)))
		return 0;
	got = kcore_read(&k->kc, f->addr, buf, len);
	if (got <= 0 || !(in = cs_malloc(k->cs))) {
		free(buf);
		return 0;
	}
	code = buf;
	len = (size_t)got;
	pc = f->addr;
	while (cs_disasm_iter(k->cs, &code, &len, &pc, in)) {
		const cs_x86 *x = &in->detail->x86;
		const ksym *t = NULL;
		int reg;

		if (!cs_insn_group(k->cs, in, CS_GRP_CALL) && !cs_insn_group(k->cs, in, CS_GRP_JUMP))
			continue;
		if (x->op_count == 1 && x->operands[0].type == X86_OP_IMM)
			t = sym_at(k->syms, k->nsyms, (uint64_t)x->operands[0].imm);
		if ((reg = indirect_reg(k, x, t)) >= 0 && reg != SPK_REG_RSP) {
			if (k->indirect && site_add(k, in->address, reg) < 0)
				break;
			continue;
		}
		if (t && t != f && !left_out(t->name) && graph_add(&k->g, t, depth + 1) < 0)
			break;
	}
	cs_free(in, 1);
	free(buf);
	return 0;
}

/* Follow what joined the graph from `from` on, breadth first (g grows
 * while it is walked), to DEPTH below the system calls. */
static void expand(cli_kernel *k, size_t from)
{
	for (size_t i = from; i < k->g.n && k->g.n < SPK_MAX_PROBES; i++)
		if (k->g.depth[i] < DEPTH)
			follow(k, k->g.funcs[i], k->g.depth[i]);
	if (k->g.n > SPK_MAX_PROBES)
		k->g.n = SPK_MAX_PROBES;
}

/* Hand the module what joined the graph since the last call (functions to
 * hook) and the indirect calls found since (sites to watch).  0, or 1
 * after saying why. */
static int hook_new(cli_kernel *k, size_t *refused)
{
	size_t from = k->sent, n = k->g.n - from;
	uint64_t *addrs;
	int32_t *res;
	struct spk_probe_req req;

	*refused = 0;
	if (n) {
		uint64_t *fa = realloc(k->func_addr, k->g.n * sizeof *fa);
		char **fn;
		uint8_t *fr;

		if (fa)
			k->func_addr = fa;
		fn = fa ? realloc(k->func_name, k->g.n * sizeof *fn) : NULL;
		if (fn)
			k->func_name = fn;
		fr = fn ? realloc(k->func_root, k->g.n) : NULL;
		if (!fr)
			return cli_error("%s: out of memory preparing the kernel's functions", k->cmd);
		k->func_root = fr;
		for (size_t i = k->nfuncs; i < k->g.n; i++) {
			k->func_addr[i] = 0;
			k->func_name[i] = NULL;
			k->func_root[i] = 0;
		}
		addrs = calloc(n, sizeof *addrs);
		res = calloc(n, sizeof *res);
		if (!addrs || !res) {
			free(addrs);
			free(res);
			return cli_error("%s: out of memory preparing the kernel's functions", k->cmd);
		}
		for (size_t i = 0; i < n; i++)
			addrs[i] = k->g.funcs[from + i]->addr;
		req = (struct spk_probe_req){ (uintptr_t)addrs, (uintptr_t)res, (uint32_t)n, 0 };
		if (ioctl(k->fd, SPK_IOC_PROBE, &req) != 0) {
			cli_error("%s: --kernel: %s: the module refused the %zu functions: %s",
				  k->cmd, SPK_DEVICE, n, strerror(errno));
			free(addrs);
			free(res);
			return 1;
		}
		for (size_t i = 0; i < n; i++) {
			if (res[i] < 0 || (size_t)res[i] >= k->g.n) {
				(*refused)++;
				continue;
			}
			k->func_addr[res[i]] = addrs[i];
			k->func_root[res[i]] = k->g.depth[from + i] == 0;
			if (!k->func_name[res[i]] &&
			    !(k->func_name[res[i]] = strdup(k->g.funcs[from + i]->name))) {
				free(addrs);
				free(res);
				return cli_error("%s: out of memory", k->cmd);
			}
			if ((uint32_t)res[i] + 1 > k->nfuncs)
				k->nfuncs = (uint32_t)res[i] + 1;
		}
		free(addrs);
		free(res);
		k->sent = k->g.n;
	}
	if (k->nsites > k->sites_sent) {
		size_t m = k->nsites - k->sites_sent;
		struct spk_sites_req sr;

		if (m > SPK_MAX_SITES)
			m = SPK_MAX_SITES;
		sr = (struct spk_sites_req){ (uintptr_t)&k->sites[k->sites_sent], (uint32_t)m, 0 };
		if (ioctl(k->fd, SPK_IOC_SITES, &sr) == 0)
			for (size_t i = 0; i < m; i++)
				k->watched += k->sites[k->sites_sent + i].result == 0;
		k->sites_sent = k->nsites;
	}
	return 0;
}

/* Step 3's other half: the targets of indirect calls the module saw a
 * traced thread take towards functions not hooked yet are looked up and
 * hooked, with what they call (kagent/indirect.c). */
static void discover(cli_kernel *k)
{
	uint64_t t[32];
	struct spk_targets_req req = { (uintptr_t)t, 32, 0 };
	size_t from = k->g.n, refused;

	if (!k->watched || ioctl(k->fd, SPK_IOC_TARGETS, &req) != 0)
		return;
	for (uint32_t i = 0; i < req.n; i++) {
		const ksym *s = sym_at(k->syms, k->nsyms, t[i]);

		/* Below an indirect call: its callees two calls deep. */
		if (s && !left_out(s->name) && graph_add(&k->g, s, DEPTH - 2) == 1)
			k->found++;
	}
	if (k->g.n == from)
		return;
	expand(k, from);
	hook_new(k, &refused);
}

static int prepare(cli_kernel *k, const char *calls)
{
	size_t missing = 0, refused;
	char *list = strdup(calls), *save = NULL, miss[256] = "";
	int rc = 1;

	if (!list)
		return cli_error("%s: out of memory", k->cmd);
	if (read_kallsyms(k->cmd, &k->syms, &k->nsyms)) {
		free(list);
		return 1;
	}
	if (kcore_open(k->cmd, &k->kc))
		goto out;
	k->has_kc = 1;
	if (cs_open(CS_ARCH_X86, CS_MODE_64, &k->cs) != CS_ERR_OK) {
		cli_error("%s: --kernel: capstone cannot decode x86-64", k->cmd);
		goto out;
	}
	k->has_cs = 1;
	cs_option(k->cs, CS_OPT_DETAIL, CS_OPT_ON);
	for (char *c = strtok_r(list, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
		char name[300];
		const ksym *s;

		snprintf(name, sizeof name, "__x64_sys_%s", c);
		if (!(s = sym_named(k->syms, k->nsyms, name))) {
			if (missing++ < 4 && strlen(miss) + strlen(c) + 3 < sizeof miss)
				snprintf(miss + strlen(miss), sizeof miss - strlen(miss), "%s%s",
					 miss[0] ? ", " : "", c);
			continue;
		}
		if (graph_add(&k->g, s, 0) < 0) {
			cli_error("%s: out of memory preparing the kernel's functions", k->cmd);
			goto out;
		}
		k->ncalls++;
	}
	if (missing)
		fprintf(stderr, "sptrace: --kernel: %zu system call%s not in this kernel (%s%s)\n",
			missing, missing == 1 ? "" : "s", miss, missing > 4 ? ", ..." : "");
	if (!k->ncalls) {
		cli_error("%s: --kernel: none of the system calls '%s' is in this kernel", k->cmd,
			  calls);
		goto out;
	}
	expand(k, 0);
	if (hook_new(k, &refused))
		goto out;
	fprintf(stderr, "sptrace: kernel: %u functions probed below %zu system call%s "
		"(depth %d)", k->nfuncs, k->ncalls, k->ncalls == 1 ? "" : "s", DEPTH);
	if (refused)
		fprintf(stderr, "; %zu refused by ftrace (no __fentry__ call)", refused);
	if (k->indirect)
		fprintf(stderr, "; %zu indirect calls watched", k->watched);
	fputc('\n', stderr);
	rc = 0;
out:
	free(list);
	return rc;
}

/* ---- the device ---- */

static int open_device(cli_kernel *k)
{
	struct stat st;
	struct spk_info info;

	k->fd = open(SPK_DEVICE, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (k->fd < 0) {
		int e = errno;

		if (e == ENOENT || e == ENXIO || e == ENODEV)
			return cli_error("%s: --kernel: %s: %s: sptrace's kernel module is not "
					 "loaded; build it with 'kagent/build.sh DIR' and load it "
					 "with 'insmod DIR/sptrace_kagent.ko' (as root)", k->cmd,
					 SPK_DEVICE, strerror(e));
		if (e == EBUSY)
			return cli_error("%s: --kernel: %s is in use by another sptrace (one at a "
					 "time)", k->cmd, SPK_DEVICE);
		return cli_error("%s: --kernel: cannot open %s: %s%s", k->cmd, SPK_DEVICE,
				 strerror(e), e == EACCES ? " (it is root's)" : "");
	}
	/* Root never uses a device someone else could have planted. */
	if (fstat(k->fd, &st) != 0 || !S_ISCHR(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 0077)) {
		close(k->fd);
		return cli_error("%s: --kernel: %s is not the module's device (a character device "
				 "of root's, mode 0600): not used", k->cmd, SPK_DEVICE);
	}
	if (ioctl(k->fd, SPK_IOC_INFO, &info) != 0) {
		close(k->fd);
		return cli_error("%s: --kernel: %s does not answer as sptrace's module: %s", k->cmd,
				 SPK_DEVICE, strerror(errno));
	}
	if (info.version != SPK_VERSION || info.ring_bytes != SPK_RING_BYTES ||
	    info.nrings == 0 || info.nrings > 8192) {
		close(k->fd);
		return cli_error("%s: --kernel: the loaded module speaks version %u (rings of %u "
				 "bytes); this sptrace wants version %d: load the module built with "
				 "it", k->cmd, info.version, info.ring_bytes, SPK_VERSION);
	}
	k->nrings = info.nrings;
	k->core_misses0 = info.core_misses;
	k->core_reached0 = info.core_reached;
	k->core_ids0 = info.core_ids;
	k->rings = calloc(k->nrings, sizeof *k->rings);
	k->pos = calloc(k->nrings, sizeof *k->pos);
	if (!k->rings || !k->pos) {
		close(k->fd);
		return cli_error("%s: out of memory", k->cmd);
	}
	for (uint32_t c = 0; c < k->nrings; c++) {
		void *m = mmap(NULL, SPK_RING_BYTES, PROT_READ, MAP_SHARED, k->fd,
			       (off_t)c * SPK_RING_BYTES);

		if (m == MAP_FAILED) {
			cli_error("%s: --kernel: cannot map ring %u of %s: %s", k->cmd, c, SPK_DEVICE,
				  strerror(errno));
			for (uint32_t i = 0; i < c; i++)
				munmap(k->rings[i], SPK_RING_BYTES);
			close(k->fd);
			return 1;
		}
		k->rings[c] = m;
	}
	return 0;
}

cli_kernel *cli_kernel_start(const char *cmd, const char *calls, int indirect)
{
	cli_kernel *k = calloc(1, sizeof *k);

	if (!k) {
		cli_error("%s: out of memory", cmd);
		return NULL;
	}
	k->cmd = cmd;
	k->indirect = indirect;
	if (open_device(k)) {
		free(k);
		return NULL;
	}
	if (prepare(k, calls && *calls ? calls : default_calls)) {
		cli_kernel_abandon(k);
		return NULL;
	}
	return k;
}

int cli_kernel_trace(cli_kernel *k, pid_t pid)
{
	int32_t p = pid;

	if (ioctl(k->fd, SPK_IOC_SCOPE_ADD, &p) != 0)
		return cli_error("%s: --kernel: cannot trace pid %d in the kernel: %s", k->cmd,
				 (int)pid, strerror(errno));
	return 0;
}

/* Step 3: the records of each ring since the last poll.  The writer never
 * waits: a record is taken only if the count, read again after the copy,
 * shows its slot was not written over meanwhile. */
int cli_kernel_poll(cli_kernel *k)
{
	int found = 0;

	if (k)
		discover(k);

	for (uint32_t c = 0; k && c < k->nrings; c++) {
		const struct spk_ring_header *h = k->rings[c];
		const struct spk_rec *r = (const void *)((const char *)h + SPK_RING_HEADER);
		uint64_t count = __atomic_load_n(&h->count, __ATOMIC_ACQUIRE), from = k->pos[c], after;
		size_t base = k->nrecs;

		if (count - from > SPK_RING_RECS) {
			k->lost += count - from - SPK_RING_RECS;
			from = count - SPK_RING_RECS;
		}
		if (count == from)
			continue;
		if (k->nrecs + (count - from) > k->caprecs) {
			size_t cap = k->caprecs ? k->caprecs : 65536;
			krec *nr;

			while (cap < k->nrecs + (count - from))
				cap *= 2;
			if (!(nr = realloc(k->recs, cap * sizeof *nr))) {
				k->lost += count - from;
				k->pos[c] = count;
				continue;
			}
			k->recs = nr;
			k->caprecs = cap;
		}
		for (uint64_t i = from; i < count; i++) {
			const struct spk_rec *s = &r[i & (SPK_RING_RECS - 1)];

			k->recs[k->nrecs++] = (krec){ s->tsc, s->tid, s->func };
		}
		after = __atomic_load_n(&h->count, __ATOMIC_ACQUIRE);
		if (after - from > SPK_RING_RECS) {
			/* Overwritten while copied: the oldest ones are not theirs. */
			uint64_t bad = after - from - SPK_RING_RECS;

			if (bad > count - from)
				bad = count - from;
			memmove(&k->recs[base], &k->recs[base + bad],
				(k->nrecs - base - bad) * sizeof *k->recs);
			k->nrecs -= bad;
			k->lost += bad;
		}
		k->pos[c] = count;
		found = 1;
	}
	return found;
}

static void device_close(cli_kernel *k)
{
	for (uint32_t c = 0; c < k->nrings; c++)
		if (k->rings[c])
			munmap(k->rings[c], SPK_RING_BYTES);
	if (k->fd >= 0)
		close(k->fd);   /* the module removes every probe (kagent/probes.c, step 5) */
	k->fd = -1;
	k->nrings = 0;
}

void cli_kernel_abandon(cli_kernel *k)
{
	if (!k)
		return;
	device_close(k);
	for (size_t i = 0; i < k->nsyms; i++)
		free(k->syms[i].name);
	free(k->syms);
	if (k->has_kc)
		kcore_close(&k->kc);
	if (k->has_cs)
		cs_close(&k->cs);
	free(k->g.funcs);
	free(k->g.depth);
	free(k->sites);
	for (uint32_t i = 0; i < k->nfuncs; i++)
		free(k->func_name[i]);
	free(k->func_name);
	free(k->func_addr);
	free(k->func_root);
	free(k->recs);
	free(k->rings);
	free(k->pos);
	free(k);
}

/* ---- writing into the trace (step 4) ---- */

#define DROPPED UINT32_MAX      /* a record not written */

static int rec_cmp(const void *a, const void *b)
{
	const krec *x = a, *y = b;

	if (x->tid != y->tid)
		return x->tid < y->tid ? -1 : 1;
	return x->tsc < y->tsc ? -1 : x->tsc > y->tsc;
}

/* When the trace was active: meta's activated and stopped lines (TSC
 * first), as spans [from, to).  Records outside them are not the traced
 * program's flow as the trace shows it: the loader and the agent's start
 * before the first activation, or time while `sptrace stop` (or a chord
 * freezing a flight recorder) held it.  No activated line: one span, all. */
typedef struct span {
	uint64_t from, to;
} span;

static int ev_cmp(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;

	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static size_t active_spans(const char *dir, span **out)
{
	an_meta *m = NULL;
	sp_err e;
	uint64_t (*ev)[2] = NULL;
	size_t nev = 0, n = 0;
	span *sp;

	*out = NULL;
	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	ev = calloc(an_meta_nlines(m) + 1, sizeof *ev);
	for (size_t l = 0; ev && l < an_meta_nlines(m); l++) {
		unsigned long long t;
		int act = strcmp(an_meta_key(m, l), TRACE_META_ACTIVATED) == 0;

		if ((act || strcmp(an_meta_key(m, l), TRACE_META_STOPPED) == 0) &&
		    sscanf(an_meta_val(m, l), "%llu", &t) == 1) {
			ev[nev][0] = t;
			ev[nev++][1] = (uint64_t)act;
		}
	}
	an_meta_free(m);
	sp = ev ? calloc(nev + 1, sizeof *sp) : NULL;
	if (!sp) {
		free(ev);
		return 0;
	}
	qsort(ev, nev, sizeof *ev, ev_cmp);
	for (size_t i = 0; i < nev; i++) {
		if (ev[i][1] && (n == 0 || sp[n - 1].to != UINT64_MAX))
			sp[n++] = (span){ ev[i][0], UINT64_MAX };
		else if (!ev[i][1] && n && sp[n - 1].to == UINT64_MAX)
			sp[n - 1].to = ev[i][0];
	}
	free(ev);
	if (!n)
		sp[n++] = (span){ 0, UINT64_MAX };
	*out = sp;
	return n;
}

static int in_spans(const span *sp, size_t n, uint64_t tsc)
{
	for (size_t i = 0; i < n; i++)
		if (tsc >= sp[i].from && tsc < sp[i].to)
			return 1;
	return 0;
}

/* The index the kernel's module line takes: one past the meta's largest. */
static uint32_t next_module_index(const char *dir)
{
	an_meta *m = NULL;
	sp_err e;
	uint32_t next = 0;

	if (an_meta_read(dir, &m, &e) < 0)
		return 0;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		unsigned idx;

		if (strcmp(an_meta_key(m, l), TRACE_META_MODULE) == 0 &&
		    sscanf(an_meta_val(m, l), "%u", &idx) == 1 && idx + 1 > next)
			next = idx + 1;
	}
	an_meta_free(m);
	return next;
}

static int ring_exists(const char *dir, uint32_t tid)
{
	char path[4200];
	struct stat st;

	snprintf(path, sizeof path, "%s/ring.%u", dir, tid);
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int write_all(int fd, const void *buf, size_t len, off_t off)
{
	while (len) {
		ssize_t w = pwrite(fd, buf, len, off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		buf = (const char *)buf + w;
		len -= (size_t)w;
		off += w;
	}
	return 0;
}

/* Sites for the functions used: one each, ids from the sites file's
 * counter.  site[f] = 0 for a function no record uses. */
static int write_sites(cli_kernel *k, const char *dir, uint32_t module, uint32_t *site)
{
	int fd = cli_trace_file(dir, "sites", O_RDWR);
	uint32_t next = 0;

	if (fd < 0)
		return cli_error("%s: --kernel: cannot write %s/sites: %s", k->cmd, dir,
				 strerror(errno));
	if (pread(fd, &next, sizeof next, 0) != (ssize_t)sizeof next || next == 0)
		next = 1;
	for (uint32_t f = 0; f < k->nfuncs; f++) {
		trace_site s = { 0 };

		if (!site[f])
			continue;
		if (next > TRACE_ID_MAX) {
			close(fd);
			return cli_error("%s: --kernel: %s/sites is full", k->cmd, dir);
		}
		s.caller_module = s.callee_module = module;
		s.site_addr = s.caller_func = s.callee_func = k->func_addr[f];
		s.kind = CA_SITE_DIRECT;
		if (write_all(fd, &s, sizeof s, (off_t)next * (off_t)sizeof s) < 0) {
			close(fd);
			return cli_error("%s: --kernel: cannot write %s/sites: %s", k->cmd, dir,
					 strerror(errno));
		}
		site[f] = next++;
	}
	if (write_all(fd, &next, sizeof next, 0) < 0) {
		close(fd);
		return cli_error("%s: --kernel: cannot write %s/sites: %s", k->cmd, dir,
				 strerror(errno));
	}
	close(fd);
	return 0;
}

static int write_names(cli_kernel *k, const char *dir, uint32_t module, const uint32_t *site)
{
	int fd = cli_trace_file(dir, "kernel.syms", O_WRONLY | O_TRUNC);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	int mfd;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return cli_error("%s: --kernel: cannot write %s/kernel.syms: %s", k->cmd, dir,
				 strerror(errno));
	}
	for (uint32_t i = 0; i < k->nfuncs; i++)
		if (site[i])
			fprintf(f, "%016" PRIx64 " %s\n", k->func_addr[i], k->func_name[i]);
	if (fclose(f) != 0)
		return cli_error("%s: --kernel: cannot write %s/kernel.syms", k->cmd, dir);
	mfd = cli_trace_file(dir, "meta", O_WRONLY | O_APPEND);
	if (mfd < 0)
		return cli_error("%s: --kernel: cannot write %s/meta: %s", k->cmd, dir,
				 strerror(errno));
	dprintf(mfd, "%s %u %s %s 0\n", TRACE_META_MODULE, module, TRACE_KERNEL_MODULE_PATH,
		TRACE_KERNEL_MODULE_KEY);
	close(mfd);
	return 0;
}

int cli_kernel_finish(cli_kernel *k, const char *dir)
{
	span *spans = NULL;
	size_t nspans = active_spans(dir, &spans);
	uint64_t early = 0, paused = 0, stray = 0, outside = 0, kept = 0, lost;
	uint32_t tid = 0, in_call = 0, stray_tids[8];
	size_t nstray_tids = 0;
	int has_ring = 0;
	uint32_t module = next_module_index(dir), *site;
	size_t nthreads = 0;
	struct spk_info info = { 0 };
	int rc = 0;

	cli_kernel_poll(k);
	ioctl(k->fd, SPK_IOC_INFO, &info);
	device_close(k);
	lost = k->lost;
	qsort(k->recs, k->nrecs, sizeof *k->recs, rec_cmp);
	site = calloc(k->nfuncs ? k->nfuncs : 1, sizeof *site);
	if (!site) {
		cli_kernel_abandon(k);
		return cli_error("%s: out of memory", "run");
	}
	/* Which records are kept, and the functions they use. */
	for (size_t i = 0; i < k->nrecs; i++) {
		krec *r = &k->recs[i];
		uint32_t f = r->func & ~SPK_EXIT;

		if (r->tid != tid) {
			tid = r->tid;
			in_call = 0;
			has_ring = ring_exists(dir, tid);
		}
		if (f >= k->nfuncs || !has_ring) {
			/* A thread of the scope the trace has no ring for (the
			 * agent's own, one that never reached traced code) */
			if (nstray_tids < 8 && (!nstray_tids || stray_tids[nstray_tids - 1] != r->tid))
				stray_tids[nstray_tids++] = r->tid;
			stray++;
			r->func = DROPPED;
			continue;
		}
		if (k->func_root[f]) {
			if (!(r->func & SPK_EXIT))
				in_call++;
			else if (in_call)
				in_call--;
			else
				goto outside;   /* its entry was lost */
		} else if (!in_call) {
outside:
			outside++;
			r->func = DROPPED;
			continue;
		}
		if (!in_spans(spans, nspans, r->tsc)) {
			if (!nspans || r->tsc < spans[0].from)
				early++;
			else
				paused++;
			r->func = DROPPED;
			continue;
		}
		site[f] = 1;
	}
	if (write_sites(k, dir, module, site) || write_names(k, dir, module, site))
		rc = 1;
	for (size_t i = 0; !rc && i < k->nrecs;) {
		size_t j = i, n;
		char name[32];
		int fd;

		while (j < k->nrecs && k->recs[j].tid == k->recs[i].tid)
			j++;
		for (n = i; n < j && k->recs[n].func == DROPPED; n++)
			;
		if (n == j) {
			i = j;
			continue;
		}
		snprintf(name, sizeof name, "kernel.%u", k->recs[i].tid);
		fd = cli_trace_file(dir, name, O_WRONLY | O_TRUNC);
		if (fd < 0) {
			rc = cli_error("%s: --kernel: cannot write %s/%s: %s", k->cmd, dir, name,
				       strerror(errno));
			break;
		}
		{
			FILE *f = fdopen(fd, "w");

			for (n = i; f && n < j; n++) {
				if (k->recs[n].func == DROPPED)
					continue;
				trace_kernel_rec kr = {
					k->recs[n].tsc, site[k->recs[n].func & ~SPK_EXIT],
					(k->recs[n].func & SPK_EXIT) ? TRACE_EXIT : TRACE_ENTRY,
				};
				fwrite(&kr, sizeof kr, 1, f);
				kept++;
			}
			if (!f || fclose(f) != 0)
				rc = cli_error("%s: --kernel: cannot write %s/%s", k->cmd, dir, name);
		}
		nthreads++;
		i = j;
	}
	fprintf(stderr, "sptrace: kernel: %" PRIu64 " records of %zu thread%s kept in the trace",
		kept, nthreads, nthreads == 1 ? "" : "s");
	if (early)
		fprintf(stderr, "; %" PRIu64 " from before the activation left out", early);
	if (paused)
		fprintf(stderr, "; %" PRIu64 " from while tracing was stopped left out", paused);
	if (outside)
		fprintf(stderr, "; %" PRIu64 " outside the followed system calls left out", outside);
	if (stray) {
		fprintf(stderr, "; %" PRIu64 " of threads the trace has no ring for left out (tid",
			stray);
		for (size_t i = 0; i < nstray_tids; i++)
			fprintf(stderr, " %u", stray_tids[i]);
		fprintf(stderr, "%s)", nstray_tids == 8 ? " ..." : "");
	}
	if (k->found)
		fprintf(stderr, "; %zu functions found through indirect calls while it ran and "
			"hooked from their next call on", k->found);
	if (info.core_misses > k->core_misses0)
		fprintf(stderr, "; the module's propagation core (agent/core) took %" PRIu64
			" misses of indirect sites' caches, kept %" PRIu64 " targets to hook, "
			"gave %" PRIu64 " (site, callee) ids", (uint64_t)info.core_misses - k->core_misses0,
			(uint64_t)info.core_reached - k->core_reached0,
			(uint64_t)info.core_ids - k->core_ids0);
	if (lost)
		fprintf(stderr, "; %" PRIu64 " lost (a ring came round before it was read)", lost);
	if (info.missed_depth)
		fprintf(stderr, "; %llu traced calls went unrecorded (a thread's shadow stack "
			"in the module was full)", (unsigned long long)info.missed_depth);
	fputc('\n', stderr);
	free(site);
	free(spans);
	cli_kernel_abandon(k);
	return rc;
}
