/* tracegen.c — see tracegen.h. */
#include "tracegen.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ca_module *prog_ca, *cxx_ca;

void tg_die(const char *fmt, ...)
{
	va_list ap;

	fputs("tracegen: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

const ca_module *tg_prog(void)
{
	return prog_ca;
}

const ca_module *tg_cxx_prog(void)
{
	return cxx_ca;
}

static uint64_t func_in(const ca_module *m, const char *name)
{
	size_t n;
	const ca_func *f = ca_module_funcs(m, &n);
	uint32_t i = ca_func_by_name(m, name);

	if (i == CA_NONE)
		tg_die("the traced program has no function '%s'", name);
	return f[i].addr;
}

uint64_t tg_func(const char *name)
{
	return func_in(prog_ca, name);
}

uint64_t tg_cxx_func(const char *symbol)
{
	return func_in(cxx_ca, symbol);
}

/* The address of the call in `caller` to `callee` (a name, or NULL for the
 * first indirect call). */
static uint64_t site_in(const ca_module *m, const char *caller, const char *callee)
{
	size_t ns, nf;
	const ca_site *s = ca_module_sites(m, &ns);
	const ca_func *f = ca_module_funcs(m, &nf);
	uint32_t fi = ca_func_by_name(m, caller);

	for (uint32_t i = 0; fi != CA_NONE && i < f[fi].nsites; i++) {
		const ca_site *x = &s[f[fi].first_site + i];
		const char *name = x->callee != CA_NONE ? ca_str(m, f[x->callee].name) : NULL;

		if (callee ? name && strcmp(name, callee) == 0
			   : x->kind == CA_SITE_INDIRECT_RIP || x->kind == CA_SITE_INDIRECT_REG ||
			     x->kind == CA_SITE_INDIRECT_MEM)
			return x->addr;
	}
	tg_die("the traced program has no call from %s to %s", caller, callee ? callee : "*");
}

static uint64_t site_addr(const char *caller, const char *callee)
{
	return site_in(prog_ca, caller, callee);
}

static trace_site direct_in(const ca_module *m, const char *caller, const char *callee)
{
	return (trace_site){ .caller_module = 0, .callee_module = 0,
			     .site_addr = site_in(m, caller, callee),
			     .caller_func = func_in(m, caller), .callee_func = func_in(m, callee),
			     .kind = CA_SITE_DIRECT };
}

static trace_site direct(const char *caller, const char *callee)
{
	return direct_in(prog_ca, caller, callee);
}

void tg_sites(const char *prog, trace_site out[S_COUNT])
{
	sp_err err;
	ca_options opt = { 0 };

	if (!prog_ca && ca_analyze(prog, &opt, &prog_ca, &err) < 0)
		tg_die("analysing %s: %s", prog, err.msg);
	memset(out, 0, S_COUNT * sizeof *out);
	out[S_MAIN] = (trace_site){ .caller_module = 0, .callee_module = 0,
				    .caller_func = tg_func("main"), .callee_func = tg_func("main"),
				    .site_addr = tg_func("main"), .flags = TRACE_SITE_ROOT };
	out[S_MIDDLE] = direct("main", "middle");
	out[S_LEAF] = direct("middle", "leaf");
	out[S_FACT] = direct("main", "fact");
	out[S_FACT_REC] = direct("fact", "fact");
	out[S_WORKER] = direct("main", "worker");
	out[S_W_MIDDLE] = direct("worker", "middle");
	out[S_W_LEAF] = direct("worker", "leaf");
	out[S_DEEP] = direct("main", "deep");
	out[S_DEEP_REC] = direct("deep", "deep");
	out[S_PRINTF] = direct("main", "printf@plt");
	out[S_PRINTF].kind = CA_SITE_PLT;
	out[S_TAIL] = direct("middle", "leaf");
	out[S_TAIL].kind = CA_SITE_TAIL_DIRECT;
	out[S_HOOK] = (trace_site){ .caller_module = 0, .callee_module = UINT32_MAX,
				    .site_addr = site_addr("main", NULL),
				    .caller_func = tg_func("main"),
				    .kind = CA_SITE_INDIRECT_RIP };
}

void tg_cxx_sites(const char *prog, trace_site out[X_COUNT])
{
	static const char *const callee[X_COUNT] = {
		[X_GET] = "_ZNK2ns3BoxIlE3getEi",
		[X_ADD] = "_ZN2ns3VecpLERKS0_",
		[X_LESS] = "_ZNK2ns3VecltERKS0_",
		[X_CALL] = "_ZNK2ns3VecclEi",
		[X_BIGGEST] = "_ZN2ns7biggestIlEET_S1_S1_",
		[X_LAMBDA] = "_ZZ4mainENKUliE_clEi",
		[X_HELPER] = "_ZN12_GLOBAL__N_16helperEi",
		[X_PLAIN] = "plain_c",
		[X_APPLY] = "_ZN2ns5applyEPFiiEi",
		[X_NEW] = "_Znwm@plt",
		[X_DELETE] = "_ZdlPvm@plt",
		[X_DTOR] = "_ZN2ns3VecD2Ev",
	};
	sp_err err;
	ca_options opt = { 0 };

	if (!cxx_ca && ca_analyze(prog, &opt, &cxx_ca, &err) < 0)
		tg_die("analysing %s: %s", prog, err.msg);
	memset(out, 0, X_COUNT * sizeof *out);
	out[X_MAIN] = (trace_site){ .caller_module = 0, .callee_module = 0,
				    .caller_func = func_in(cxx_ca, "main"),
				    .callee_func = func_in(cxx_ca, "main"),
				    .site_addr = func_in(cxx_ca, "main"), .flags = TRACE_SITE_ROOT };
	for (int i = X_GET; i < X_COUNT; i++)
		if (callee[i])
			out[i] = direct_in(cxx_ca, "main", callee[i]);
	out[X_NEW].kind = out[X_DELETE].kind = CA_SITE_PLT;
	out[X_APPLY_F] = (trace_site){ .caller_module = 0, .callee_module = UINT32_MAX,
				       .site_addr = site_in(cxx_ca, "_ZN2ns5applyEPFiiEi", NULL),
				       .caller_func = func_in(cxx_ca, "_ZN2ns5applyEPFiiEi"),
				       .kind = CA_SITE_INDIRECT_REG };
}

char *tg_dir(const char *root, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", root, name) < 0)
		tg_die("out of memory");
	tg_rmtree(p);
	if (mkdir(p, 0755) < 0)
		tg_die("mkdir %s: %s", p, strerror(errno));
	return p;
}

void tg_write(const char *dir, const char *file, const void *data, size_t len)
{
	char path[4200];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", dir, file);
	f = fopen(path, "w");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
		tg_die("writing %s: %s", path, strerror(errno));
}

void tg_meta(const char *dir, const char *prog, const char *extra)
{
	char key[160], *text;
	sp_err err;
	int n;

	if (ca_module_key_of(prog, key, sizeof key, &err) < 0)
		tg_die("%s", err.msg);
	n = asprintf(&text,
		     "version 1\n"
		     "pid 1234\n"
		     "program %s\n"
		     "args %s 1 2\n"
		     "host testhost\n"
		     "tsc_hz %llu\n"
		     "tsc0 %llu\n"
		     "mono0_ns 5000000000\n"
		     "real0_ns %lld\n"
		     "activation start\n"
		     "module 0 %s %s 555555554000\n"
		     "%s",
		     prog, prog, TG_HZ, TG_TSC0, TG_REAL0, prog, key, extra);
	if (n < 0)
		tg_die("out of memory");
	tg_write(dir, "meta", text, (size_t)n);
	free(text);
}

void tg_write_sites(const char *dir, const trace_site *s, size_t n)
{
	tg_write(dir, "sites", s, n * sizeof *s);
}

void tg_ring_init(tg_ring *r, uint32_t tid, uint64_t cap, uint64_t start_tsc)
{
	memset(r, 0, sizeof *r);
	r->tid = tid;
	r->cap = cap;
	r->start_tsc = start_tsc;
	r->slot = calloc(cap, sizeof *r->slot);
	if (!r->slot)
		tg_die("out of memory");
	r->epoch = start_tsc >> TRACE_TSC_LOW_BITS;
	tg_put_raw(r, TRACE_SYNC | r->epoch << 2);
}

void tg_put_raw(tg_ring *r, uint64_t rec)
{
	r->slot[r->count % r->cap] = rec;
	r->count++;
}

void tg_put_msg(tg_ring *r, uint32_t ev, uint64_t tsc, uint32_t chan, unsigned call,
		unsigned flags, uint64_t off, uint64_t len)
{
	uint64_t data[TRACE_MSG_NDATA];

	trace_msg_pack(data, chan, call, flags, off, len);
	tg_put(r, TRACE_EVENT, ev, tsc);
	for (unsigned i = 0; i < TRACE_MSG_NDATA; i++)
		tg_put_raw(r, trace_rec(TRACE_EVENT, TRACE_EV_MSG_DATA, data[i]));
}

void tg_put(tg_ring *r, unsigned kind, uint32_t id, uint64_t tsc)
{
	if (tsc >> TRACE_TSC_LOW_BITS != r->epoch) {
		r->epoch = tsc >> TRACE_TSC_LOW_BITS;
		tg_put_raw(r, TRACE_SYNC | r->epoch << 2);
	}
	tg_put_raw(r, trace_rec(kind, id, tsc));
}

void tg_ring_header(const tg_ring *r, trace_ring_header *h)
{
	memset(h, 0, sizeof *h);
	h->magic = TRACE_RING_MAGIC;
	h->version = TRACE_FORMAT_VERSION;
	h->header_size = TRACE_RING_HEADER_SIZE;
	h->capacity = r->cap;
	h->count = r->count;
	h->mask = r->cap - 1;
	h->epoch = r->epoch;
	h->pid = 1234;
	h->tid = r->tid;
	h->start_tsc = r->start_tsc;
	h->flags = r->flags;
	h->limit = ~0ull;        /* a ring (trace_format.h) */
	h->kept_end = ~0ull;
	snprintf(h->thread_name, sizeof h->thread_name, "t%u", r->tid);
}

void tg_ring_write(const tg_ring *r, const char *dir, const trace_ring_header *h, long size)
{
	char name[64];
	size_t len = TRACE_RING_HEADER_SIZE + r->cap * 8;
	char *buf = calloc(1, len);
	trace_ring_header own;

	if (!buf)
		tg_die("out of memory");
	if (!h) {
		tg_ring_header(r, &own);
		h = &own;
	}
	memcpy(buf, h, sizeof *h < TRACE_RING_HEADER_SIZE ? sizeof *h : TRACE_RING_HEADER_SIZE);
	memcpy(buf + TRACE_RING_HEADER_SIZE, r->slot, r->cap * 8);
	snprintf(name, sizeof name, "ring.%u", r->tid);
	tg_write(dir, name, buf, size >= 0 && (size_t)size < len ? (size_t)size : len);
	free(buf);
}

void tg_ring_free(tg_ring *r)
{
	free(r->slot);
	r->slot = NULL;
}

static char *slurp_fd(int fd)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	ssize_t n;

	if (!buf)
		tg_die("out of memory");
	lseek(fd, 0, SEEK_SET);
	while ((n = read(fd, buf + len, cap - len - 1)) > 0) {
		len += (size_t)n;
		if (cap - len < 2 && !(buf = realloc(buf, cap *= 2)))
			tg_die("out of memory");
	}
	buf[len] = '\0';
	close(fd);
	return buf;
}

int tg_run(char *const argv[], char **out, char **err)
{
	char po[] = "/tmp/tg-out-XXXXXX", pe[] = "/tmp/tg-err-XXXXXX";
	int fo = mkstemp(po), fe = mkstemp(pe), st;
	pid_t pid;

	if (fo < 0 || fe < 0)
		tg_die("mkstemp: %s", strerror(errno));
	unlink(po);
	unlink(pe);
	pid = fork();
	if (pid < 0)
		tg_die("fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(fo, 1);
		dup2(fe, 2);
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		tg_die("waitpid: %s", strerror(errno));
	*out = slurp_fd(fo);
	*err = slurp_fd(fe);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void tg_rmtree(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
