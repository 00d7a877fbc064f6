/*
 * instrument.c — instrument(F): give every call site of F a patch area and
 * patch the sites, so the next call F makes is seen and propagates tracing
 * to the callee before the callee runs.
 *
 * Each site that gets an area also gets a trace site id, described in the
 * sites file (trace_format.h) before any record can name it.
 *
 * What is patched so far: direct calls (5-byte call rel32) to functions of
 * the same module.  Calls through the PLT, indirect calls, tail jumps and
 * the springboard / relocation / trap plans come next; such sites are left
 * untouched (and counted in the log), so their callees are not traced yet.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

static int sites_fd = -1;
static volatile uint32_t next_site = 1;   /* id 0 is never used */
static volatile int instr_lock;
static uint64_t skipped_kind, skipped_plan;

int ag_sites_open(const char *dir)
{
	char path[4200];

	snprintf(path, sizeof path, "%s/sites", dir);
	sites_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (sites_fd < 0) {
		ag_log("cannot create %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

static uint32_t new_site(const trace_site *ts)
{
	uint32_t id = __atomic_fetch_add(&next_site, 1, __ATOMIC_ACQ_REL);

	if (id > TRACE_ID_MAX)
		return 0;
	if (pwrite(sites_fd, ts, sizeof *ts, (off_t)id * (off_t)sizeof *ts) != (ssize_t)sizeof *ts) {
		ag_log("sites: write failed: %s", strerror(errno));
		return 0;
	}
	return id;
}

uint32_t ag_site_root(ag_module *m, uint32_t func)
{
	const ca_func *f = ca_module_funcs(m->ca, NULL) + func;
	trace_site ts = { .caller_module = m->index, .callee_module = m->index,
			  .site_addr = f->addr, .caller_func = f->addr, .callee_func = f->addr,
			  .flags = TRACE_SITE_ROOT };

	return new_site(&ts);
}

static void lock(void)
{
	while (__atomic_exchange_n(&instr_lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
}

static void unlock(void)
{
	__atomic_store_n(&instr_lock, 0, __ATOMIC_RELEASE);
}

/*
 * Build the area for one site and fill its patch.  A springboard site gets a
 * second patch, *sb: the 5-byte `jmp area` written into dead padding, which
 * must be in place before the site's 2-byte jump points to it.  0 ok, -1 skip.
 */
static int prepare_direct(ag_module *m, const ca_site *s, uint32_t si, ag_patch *p, ag_patch *sb,
			  ag_unwind_area *uw)
{
	const ca_func *funcs = ca_module_funcs(m->ca, NULL);
	ag_area_spec spec;
	trace_site ts;
	uint8_t *rx, *rw;
	size_t len;
	int64_t rel;

	memset(&ts, 0, sizeof ts);
	ts.caller_module = ts.callee_module = m->index;
	ts.site_addr = s->addr;
	ts.caller_func = funcs[s->func].addr;
	ts.callee_func = funcs[s->callee].addr;
	ts.kind = s->kind;
	m->site_ids[si] = new_site(&ts);
	if (!m->site_ids[si] || !ag_pool_code(m->pool, AG_AREA_MAX, &rx, &rw))
		return -1;
	spec = (ag_area_spec){
		.site = m->bias + s->addr, .site_len = s->len, .callee = m->bias + s->target,
		.site_id = m->site_ids[si], .callee_flag = &m->func_state[s->callee],
		.slow_instr = ag_pool_tramp(m->pool),
		.callee_ref = (const void *)(uintptr_t)(((uint64_t)m->index << 32) | s->callee),
		.tls_offset = ag_tls_offset(),
	};
	if (s->kind == CA_SITE_TAIL_DIRECT && s->method == CA_PATCH_SPRINGBOARD) {
		/* jmp rel8 (eb) or jcc rel8 (7x): the jump itself stays, retargeted
		 * to the springboard, so the area is reached only when taken. */
		const uint8_t *code = (const uint8_t *)(uintptr_t)spec.site;

		if (code[0] != 0xeb && (code[0] & 0xf0) != 0x70)
			return -1;
		len = ag_emit_tail(&spec, rw, (uint64_t)(uintptr_t)rx);
	} else if (s->kind == CA_SITE_TAIL_DIRECT) {
		const uint8_t *code = (const uint8_t *)(uintptr_t)spec.site;

		/* jmp rel32 (e9) or jcc rel32 (0f 8x); the plan guarantees >= 5 bytes. */
		if (code[0] == 0x0f && (code[1] & 0xf0) == 0x80) {
			spec.cond = true;
			spec.cond_code = code[1] & 0x0f;
		} else if (code[0] != 0xe9) {
			return -1;
		}
		len = ag_emit_tail(&spec, rw, (uint64_t)(uintptr_t)rx);
	} else {
		len = ag_emit_direct_call(&spec, rw, (uint64_t)(uintptr_t)rx);
	}
	/* The direct-call area ends with the word S + len - 1 (emit.c, unwind.c). */
	*uw = (ag_unwind_area){ (uint64_t)(uintptr_t)rx, len, (uint64_t)(uintptr_t)rx + len - 8 };
	if (len > AG_AREA_MAX) {
		ag_log("instrument: area of %zu bytes overflows its %d-byte slot", len, AG_AREA_MAX);
		return -1;
	}
	memset(p, 0, sizeof *p);
	p->addr = m->bias + s->addr;
	p->len = s->len;
	memcpy(p->old, (const void *)(uintptr_t)p->addr, s->len);
	if (s->method == CA_PATCH_SPRINGBOARD) {
		uint64_t at = m->bias + s->patch_addr;
		int64_t d8 = (int64_t)(at - (p->addr + 2));

		memset(sb, 0, sizeof *sb);
		sb->addr = at;
		sb->len = 5;
		memcpy(sb->old, (const void *)(uintptr_t)at, 5);
		rel = (int64_t)((uint64_t)(uintptr_t)rx - (at + 5));
		if (rel != (int32_t)rel || d8 != (int8_t)d8)
			return -1;
		sb->new[0] = 0xe9;
		memcpy(sb->new + 1, &(int32_t){ (int32_t)rel }, 4);
		sb->redirect = (uint64_t)(uintptr_t)rx;
		p->new[0] = p->old[0];                     /* same jmp/jcc rel8 ... */
		p->new[1] = (uint8_t)(int8_t)d8;           /* ... to the springboard */
		p->redirect = at;
		return 1;
	}
	rel = (int64_t)((uint64_t)(uintptr_t)rx - (p->addr + 5));
	if (rel != (int32_t)rel)
		return -1;
	p->new[0] = 0xe9;                                  /* jmp rel32 area */
	memcpy(p->new + 1, &(int32_t){ (int32_t)rel }, 4);
	memset(p->new + 5, 0xcc, s->len - 5u);             /* never executed */
	p->redirect = (uint64_t)(uintptr_t)rx;
	return 0;
}

/* Publish a batch: unwind info first (a thread may throw through an area
 * as soon as it enters one), then springboards (a site may jump to one only
 * once it is whole), then the sites. */
static int flush(ag_patch *batch, size_t nb, ag_patch *boards, size_t nsb, ag_unwind_area *uw)
{
	if (nb == 0)
		return 0;
	if (ag_unwind_register(uw, nb))
		return -1;
	return ag_patch_apply(boards, nsb) || ag_patch_apply(batch, nb);
}

int ag_instrument(ag_module *m, uint32_t func)
{
	size_t nfuncs, nsites;
	const ca_func *funcs = ca_module_funcs(m->ca, &nfuncs);
	const ca_site *sites = ca_module_sites(m->ca, &nsites);
	ag_patch batch[256], boards[256];
	ag_unwind_area uw[256];
	size_t nb = 0, nsb = 0;
	int rc = 0;

	if (func >= nfuncs)
		return -1;
	lock();
	if (m->func_state[func] & AG_FUNC_INSTRUMENTED) {
		unlock();
		return 0;
	}
	for (uint32_t i = 0; i < funcs[func].nsites; i++) {
		uint32_t si = funcs[func].first_site + i;
		const ca_site *s = &sites[si];

		if ((s->kind != CA_SITE_DIRECT && s->kind != CA_SITE_TAIL_DIRECT) ||
		    s->callee == CA_NONE) {
			skipped_kind++;
			continue;
		}
		if (!(s->method == CA_PATCH_DIRECT && s->len >= 5) &&
		    !(s->method == CA_PATCH_SPRINGBOARD && s->kind == CA_SITE_TAIL_DIRECT)) {
			skipped_plan++;
			continue;
		}
		switch (prepare_direct(m, s, si, &batch[nb], &boards[nsb], &uw[nb])) {
		case 1: nsb++; /* fall through */
		case 0: nb++; break;
		default: break;
		}
		if (nb == sizeof batch / sizeof *batch) {
			rc |= flush(batch, nb, boards, nsb, uw);
			nb = nsb = 0;
		}
	}
	rc |= flush(batch, nb, boards, nsb, uw);
	/* Published last: areas that test this flag now go straight to F. */
	__atomic_store_n(&m->func_state[func], AG_FUNC_INSTRUMENTED, __ATOMIC_RELEASE);
	unlock();
	return rc;
}

void ag_instrument_stats(uint64_t *sites, uint64_t *kind, uint64_t *plan)
{
	*sites = next_site - 1;
	*kind = skipped_kind;
	*plan = skipped_plan;
}
