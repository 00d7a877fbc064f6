/*
 * emit.c — x86-64 code of the per-site patch areas.
 *
 * A call site S is replaced by `jmp area`.  The area runs in the caller's
 * state at S, where the red zone below rsp is dead (the call itself would
 * overwrite it) and so are the flags (the SysV ABI: undefined at a call).
 * Every register is preserved -- r11 too: calls with private conventions
 * (TLS descriptors, glibc's own asm) may keep values in it:
 *
 *   area:  endbr64
 *          cmpb $0, flag               callee instrumented yet?
 *          jne  entry
 *          call *instrument_stub(%rip) -> instrument(callee), come back
 *   entry: <record ENTRY, site id>     a call to a record stub, below
 *          call G  |  call *slot(%rip) the callee returns into the area
 *   exit:  <record EXIT, site id>      the stub keeps G's results and flags
 *          jmp  S+len
 *   (before the code, the slot's first 40 bytes: words about the area,
 *   agent.h; the first, S+len-1, for the unwinder: see unwind.c)
 *
 * A record is a call to one of the record stubs in tramp.S (which say how
 * they keep every register and flag), with its word (id << 2 | kind) put
 * below the red zone's spills first:
 *
 *          movq $WORD,-64(%rsp)
 *          call *stub(%rip)            the stub's address: a pool data word
 *
 * 15 bytes in the area where the record itself is 116-133 bytes and its
 * three slow paths 145: one copy of those per process, in the agent's
 * text, instead of one per area.  The instrument slow path, an indirect
 * call's miss and its budget are stubs too.  The cost per record is the
 * same (the call and return are hidden by rdtsc's latency: bench/WARMUP.md),
 * and a plain call's area is 59 bytes, in a 128-byte slot (pool.c; 621
 * bytes in a 1 KB slot before): an eighth of the memory to write and map
 * when a function is first reached.
 */
#include <stddef.h>
#include <string.h>

#include "../agent.h"

_Static_assert(offsetof(trace_ring_header, count) == TRACE_RING_OFF_COUNT, "header layout");
_Static_assert(offsetof(trace_ring_header, mask) == TRACE_RING_OFF_MASK, "header layout");
_Static_assert(offsetof(trace_ring_header, epoch) == TRACE_RING_OFF_EPOCH, "header layout");
_Static_assert(offsetof(trace_ring_header, limit) == TRACE_RING_OFF_LIMIT, "header layout");
/* tramp.S's copies */
_Static_assert(TRACE_RING_OFF_COUNT == 24 && TRACE_RING_OFF_MASK == 32 &&
	       TRACE_RING_OFF_EPOCH == 40 && TRACE_RING_OFF_LIMIT == 88, "tramp.S: RING_*");
_Static_assert(AG_SLOT_SMALL == 128 && AG_SLOT_BIG == 256 && AG_SLOT_REF == 32, "tramp.S: slots");
_Static_assert(AG_SLOW_RING == 1 && AG_SLOW_INSTRUMENT == 2 && AG_SLOW_SYNC == 3 && AG_SLOW_INDIRECT == 4 &&
	       AG_SLOW_ROTATE == 5, "tramp.S: requests");
_Static_assert(AG_BUDGET_SITES == 1u << 19, "tramp.S: AG_BUDGET_SITES");

typedef struct buf {
	uint8_t *p;       /* where bytes are written (rw view) */
	uint64_t rx;      /* run-time address of p[0] */
	size_t n;
} buf;

static void b1(buf *b, uint8_t v) { b->p[b->n++] = v; }

static void bn(buf *b, const void *v, size_t n)
{
	memcpy(b->p + b->n, v, n);
	b->n += n;
}

static void b32(buf *b, uint32_t v) { bn(b, &v, 4); }
static void b64(buf *b, uint64_t v) { bn(b, &v, 8); }

static uint64_t here(const buf *b) { return b->rx + b->n; }

/* Every area starts with endbr64, so that under IBT it stays a valid
 * target should an indirect branch ever reach it. */
static void endbr64(buf *b) { bn(b, "\xf3\x0f\x1e\xfa", 4); }

/* rel32 from the end of a 4-byte field at the current position to `to`. */
static void brel32(buf *b, uint64_t to)
{
	b32(b, (uint32_t)(int32_t)(int64_t)(to - (here(b) + 4)));
}

/* Point a rel32 written earlier at offset `at` to the current spot. */
static void fix_rel32(buf *b, size_t at)
{
	int32_t rel = (int32_t)(int64_t)(here(b) - (b->rx + at + 4));

	memcpy(b->p + at, &rel, 4);
}

static const uint8_t save_r11[] = { 0x4c, 0x89, 0x5c, 0x24, 0xe0 };    /* mov %r11,-32(%rsp) */
static const uint8_t load_r11[] = { 0x4c, 0x8b, 0x5c, 0x24, 0xe0 };    /* mov -32(%rsp),%r11 */

/* call *stub(%rip): the stub's address is word `which` of the pool's table. */
static void call_stub(buf *b, const ag_area_spec *s, unsigned which)
{
	b1(b, 0xff); b1(b, 0x15); brel32(b, s->stubs + 8u * which);
}

/* movq $word,-64(%rsp): a record's word, where the stubs read it. */
static void put_word(buf *b, uint32_t word)
{
	bn(b, "\x48\xc7\x44\x24\xc0", 5);
	b32(b, word);
}

/* Record `kind` for the site. */
static void record(buf *b, const ag_area_spec *s, unsigned kind)
{
	put_word(b, (uint32_t)((s->site_id & TRACE_ID_MAX) << 2) | kind);
	call_stub(b, s, kind == TRACE_EXIT ? AG_STUB_EXIT : AG_STUB_ENTRY);
}

/* Record `kind` with the word loaded from `idword` (an indirect site's
 * cache), through r11, which is kept:
 *   mov %r11,-32(%rsp); mov word(%rip),%r11; mov %r11,-64(%rsp)
 *   mov -32(%rsp),%r11; call *stub(%rip) */
static void record_id(buf *b, const ag_area_spec *s, unsigned kind, uint64_t idword)
{
	bn(b, save_r11, sizeof save_r11);
	b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1d); brel32(b, idword);
	bn(b, "\x4c\x89\x5c\x24\xc0", 5);
	bn(b, load_r11, sizeof load_r11);
	call_stub(b, s, kind == TRACE_EXIT ? AG_STUB_EXIT : AG_STUB_ENTRY);
}

/*
 * A value record (trace_format.h, "Values"): argument `arg` (1..6) right
 * after a call's ENTRY, or the return value (arg 0) right before its EXIT:
 *   mov VALUE,-72(%rsp); movq $WORD,-64(%rsp); call *value_stub(%rip)
 */
static void record_value(buf *b, const ag_area_spec *s, unsigned arg)
{
	/* mov %REG,-72(%rsp): rax (the return value), rdi, rsi, rdx, rcx, r8, r9 */
	static const uint8_t from[7][5] = {
		{ 0x48, 0x89, 0x44, 0x24, 0xb8 }, { 0x48, 0x89, 0x7c, 0x24, 0xb8 },
		{ 0x48, 0x89, 0x74, 0x24, 0xb8 }, { 0x48, 0x89, 0x54, 0x24, 0xb8 },
		{ 0x48, 0x89, 0x4c, 0x24, 0xb8 }, { 0x4c, 0x89, 0x44, 0x24, 0xb8 },
		{ 0x4c, 0x89, 0x4c, 0x24, 0xb8 },
	};

	_Static_assert(TRACE_TSC_SHIFT == 26 && TRACE_TSC_LOW_BITS == 38, "tramp.S packs values so");
	bn(b, from[arg], 5);
	put_word(b, trace_value_id(arg, 0) << 2 | TRACE_EVENT);
	call_stub(b, s, AG_STUB_VALUE);
}

/*
 * Is the callee instrumented yet?  If not, tramp.S's ag_instrument_stub
 * asks the agent to (the callee is the slot's REF word), and the area goes
 * on whatever the answer (if the agent could not instrument G -- re-entered
 * from a signal handler, say -- the call goes on untraced inside G):
 *   cmpb $0,flag(%rip); jne 1f; call *instrument_stub(%rip); 1:
 */
static void flag_test(buf *b, const ag_area_spec *s)
{
	b1(b, 0x80); b1(b, 0x3d);
	b32(b, (uint32_t)(int32_t)(int64_t)((uint64_t)(uintptr_t)s->callee_flag - (here(b) + 5)));
	b1(b, 0x00);
	b1(b, 0x75); b1(b, 6);                                             /* jne 1f */
	call_stub(b, s, AG_STUB_INSTRUMENT);
}

/*
 * Before a tail jump to a caller-sensitive function: if the return address
 * on the stack is in a call area (F was called through one), put back the
 * real one, S+len of that call, read from the area's slot (found by masking,
 * the magic word says it is one).  The slot is small or big (agent.h): the
 * small mask finds a small slot, and a big one where the return address
 * lies in its first half; else the big mask.  (The memory read there is on
 * the return address's own page.)  The call through that area then has no
 * exit record: the reader closes it with its caller... acceptable for the
 * rare dlsym/dlopen tail call.
 *
 *   mov %rax,-16(%rsp); mov %r11,-8(%rsp)      both dead below rsp here
 *   movabs $MAGIC,%rax
 *   mov (%rsp),%r11; and $-SMALL,%r11; cmp MAGIC(%r11),%rax; je 1f
 *   mov (%rsp),%r11; and $-BIG,%r11; cmp MAGIC(%r11),%rax; jne 2f
 * 1: mov RET(%r11),%rax; mov %rax,(%rsp)
 * 2: mov -16(%rsp),%rax; mov -8(%rsp),%r11
 */
static void probe_slot(buf *b, uint32_t size)
{
	b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x24);                /* mov (%rsp),%r11 */
	b1(b, 0x49); b1(b, 0x81); b1(b, 0xe3); b32(b, (uint32_t)-size);    /* and $-size,%r11 */
	b1(b, 0x49); b1(b, 0x3b); b1(b, 0x43); b1(b, AG_SLOT_MAGIC);       /* cmp MAGIC(%r11),%rax */
}

static void fix_return(buf *b)
{
	size_t je, jne;

	b1(b, 0x48); b1(b, 0x89); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);   /* mov %rax,-16(%rsp) */
	b1(b, 0x4c); b1(b, 0x89); b1(b, 0x5c); b1(b, 0x24); b1(b, 0xf8);   /* mov %r11,-8(%rsp) */
	b1(b, 0x48); b1(b, 0xb8); b64(b, AG_SLOT_MAGIC_VALUE);             /* movabs $MAGIC,%rax */
	probe_slot(b, AG_SLOT_SMALL);
	b1(b, 0x74); je = b->n; b1(b, 0);                                  /* je 1f */
	probe_slot(b, AG_SLOT_BIG);
	b1(b, 0x75); jne = b->n; b1(b, 0);                                 /* jne 2f */
	b->p[je] = (uint8_t)(b->n - (je + 1));
	b1(b, 0x49); b1(b, 0x8b); b1(b, 0x43); b1(b, AG_SLOT_RET);         /* mov RET(%r11),%rax */
	b1(b, 0x48); b1(b, 0x89); b1(b, 0x04); b1(b, 0x24);                /* mov %rax,(%rsp) */
	b->p[jne] = (uint8_t)(b->n - (jne + 1));
	b1(b, 0x48); b1(b, 0x8b); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);   /* mov -16(%rsp),%rax */
	b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x5c); b1(b, 0x24); b1(b, 0xf8);   /* mov -8(%rsp),%r11 */
}

/* A direct site's budget test: cmpb $0,mode(%rip); jne counted.  Returns
 * the jne's rel32, for fix_rel32 at `counted`. */
static size_t mode_test(buf *b, const ag_area_spec *s)
{
	size_t jne;

	b1(b, 0x80); b1(b, 0x3d);                                          /* cmpb $0,mode(%rip) */
	b32(b, (uint32_t)(int32_t)(int64_t)((uint64_t)(uintptr_t)s->budget_mode - (here(b) + 5)));
	b1(b, 0x00);
	b1(b, 0x0f); b1(b, 0x85); jne = b->n; b32(b, 0);                  /* jne counted */
	return jne;
}

/* A direct site's counted path, up to the call or jump (ag_emit_tail,
 * ag_emit_call_budget):
 *   subb $1,%fs:ag_tls_tick; je entry          the sample
 *   mov  %r11,-32(%rsp)
 *   mov  %fs:ag_tls_counts,%r11; test %r11,%r11; je untable
 *   addq $1,disp(%r11)
 *   mov  -32(%rsp),%r11
 * Returns the je untable's rel32 (untable: mov -32(%rsp),%r11; jmp entry). */
static size_t count_direct(buf *b, const ag_area_spec *s, uint64_t entry, uint32_t disp)
{
	size_t je_untable;

	b1(b, 0x64); b1(b, 0x80); b1(b, 0x2c); b1(b, 0x25);                /* subb $1,%fs:d32 */
	b32(b, (uint32_t)(int32_t)s->tls_tick_offset); b1(b, 0x01);
	b1(b, 0x0f); b1(b, 0x84); brel32(b, entry);                        /* je entry */
	bn(b, save_r11, sizeof save_r11);
	b1(b, 0x64); b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x25);   /* mov %fs:d32,%r11 */
	b32(b, (uint32_t)(int32_t)s->tls_counts_offset);
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                              /* test %r11,%r11 */
	b1(b, 0x0f); b1(b, 0x84); je_untable = b->n; b32(b, 0);            /* je untable */
	b1(b, 0x49); b1(b, 0x83); b1(b, 0x83); b32(b, disp); b1(b, 0x01);  /* addq $1,d(%r11) */
	bn(b, load_r11, sizeof load_r11);
	return je_untable;
}

/*
 * A tail jump `jmp G` / `jcc G` at S: G will return straight to F's caller,
 * so the area records the entry only and jumps; the reader closes G when
 * F's exit arrives (the sites file says this site is a tail jump).  For a
 * conditional jump the condition is tested first, while the flags are live.
 *
 * With a budget (s->budget_mode, budget.c) the site's mode byte is tested
 * after the callee-instrumented flag, as in ag_emit_call_budget: counted,
 * the jump adds 1 to this thread's counter of the site and jumps with no
 * record (F's exit then closes F alone, G's time in F's); 1 counted jump
 * in 256 of the thread is recorded instead, a sample.  The flags are dead
 * at a jump to a function (the condition of a jcc is tested before).
 *
 *   timed: cmpb $0,mode(%rip); jne counted
 *   entry: <record ENTRY>; jmp G
 *   counted:
 *          subb $1,%fs:ag_tls_tick; je entry
 *          mov  %r11,-32(%rsp)
 *          mov  %fs:ag_tls_counts,%r11; test %r11,%r11; je untable
 *          addq $1,ID*8(%r11)
 *          mov  -32(%rsp),%r11; jmp G
 *   untable: mov -32(%rsp),%r11; jmp entry
 */
size_t ag_emit_tail(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };
	size_t jne_counted = 0, je_untable;
	uint64_t entry;
	bool budget = s->budget_mode && !s->fix_return;

	endbr64(&b);
	if (s->cond) {
		b1(&b, 0x0f); b1(&b, (uint8_t)(0x80 | s->cond_code));      /* jcc rel32 taken */
		b32(&b, 5);
		b1(&b, 0xe9); brel32(&b, s->site + s->site_len);           /* not taken: back */
	}
	flag_test(&b, s);
	if (budget)
		jne_counted = mode_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY);
	if (s->fix_return)
		fix_return(&b);
	b1(&b, 0xe9); brel32(&b, s->callee);                               /* jmp G */
	if (budget) {
		fix_rel32(&b, jne_counted);                                /* counted: */
		je_untable = count_direct(&b, s, entry, (uint32_t)s->site_id * 8);
		b1(&b, 0xe9); brel32(&b, s->callee);                       /* jmp G */
		fix_rel32(&b, je_untable);                                 /* untable: */
		bn(&b, load_r11, sizeof load_r11);
		b1(&b, 0xe9); brel32(&b, entry);                           /* jmp entry */
	}
	return b.n;
}

size_t ag_emit_call(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };

	endbr64(&b);
	flag_test(&b, s);
	record(&b, s, TRACE_ENTRY);
	if (s->value_arg)
		record_value(&b, s, s->value_arg);
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x15); brel32(&b, s->slot);           /* call *slot(%rip) */
	} else {
		b1(&b, 0xe8); brel32(&b, s->callee);                       /* call G */
	}
	if (s->value_ret)
		record_value(&b, s, 0);
	record(&b, s, TRACE_EXIT);
	b1(&b, 0xe9); brel32(&b, s->site + s->site_len);                   /* jmp S+len */
	return b.n;
}

/*
 * An indirect call `call *OP` (OP a register or memory operand) at S.  The
 * callee changes from call to call, so the area keeps a one-entry cache per
 * site (in pool data: target, entry word, exit word, see ag_indirect_cache):
 *
 *   area:  endbr64
 *          [the instructions of a relocated window, copied unchanged]
 *          mov  %r11,-32(%rsp)          keep r11 (see above)
 *          mov  OP,%r11                 the original operand, re-encoded
 *          cmp  cache.target(%rip),%r11
 *          jne  miss                    -> agent: instrument the callee, get
 *   hit:   mov  %r11,-40(%rsp)             its site id, fill the cache
 *          mov  -32(%rsp),%r11
 *          <record ENTRY, id from cache.entry>
 *          call *-40(%rsp)              the target saved above, never the cache
 *          <record EXIT, id from cache.exit>
 *          jmp  S+len
 *   miss:  call *indirect_stub(%rip)   tramp.S: the cache's untraced word,
 *          je   hit                        else the slow path; r11 = target
 *   untraced: mov %r11,-40(%rsp); mov -32(%rsp),%r11
 *          push S+len(%rip); jmp *-32(%rsp)     the caller's own return address
 *
 * (the stub finds the site, ag_indirect_site, in the slot's REF word).
 *
 * A target in code a language runtime manages (Go, V8: instrument.c) goes
 * untraced: the runtime reads its frames' return addresses, and must find
 * the caller's, never one in the area.  It has a cache word of its own,
 * `untraced`, which only ever holds such targets: a thread that matches it
 * cannot take a traced target's path, whatever other threads write.
 *
 * The call goes to the target computed from OP, so a cache another thread
 * is changing can at worst mislabel one record, never misdirect a call.
 *
 * An indirect tail jump `jmp *OP` (s->tail_jump; the analysis saw the frame
 * torn down: the red zone, r11 and the flags are dead, as at any function's
 * entry) records the ENTRY only and jumps on with `jmp *-40(%rsp)`.  A
 * target inside the jumping function itself (a computed goto after all)
 * leaves an entry word of 0 in the cache: no record, just the jump.
 */
static void jmp_saved_target(buf *b)
{
	b1(b, 0xff); b1(b, 0x64); b1(b, 0x24); b1(b, 0xd8);               /* jmp *-40(%rsp) */
}

/*
 * An indirect call's budget (budget.c), at its hit path once the target is
 * saved at -40(%rsp) and r11 restored: tramp.S's ag_budget_stub counts the
 * call for the cached target (and answers ZF) or says it is timed.
 *
 *   call *budget_stub(%rip); jne timed
 *   call *-40(%rsp); jmp S+len      |  jmp *-40(%rsp)   (a tail jump)
 * timed:
 */
static void budget_indirect(buf *b, const ag_area_spec *s)
{
	size_t jne;

	call_stub(b, s, AG_STUB_BUDGET);
	b1(b, 0x75); jne = b->n; b1(b, 0);                                 /* jne timed */
	if (s->tail_jump) {
		jmp_saved_target(b);                                        /* jmp *-40(%rsp) */
	} else {
		b1(b, 0xff); b1(b, 0x54); b1(b, 0x24); b1(b, 0xd8);         /* call *-40(%rsp) */
		b1(b, 0xe9); brel32(b, s->site + s->site_len);              /* jmp S+len */
	}
	b->p[jne] = (uint8_t)(b->n - (jne + 1));                           /* timed: */
}

size_t ag_emit_indirect(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };
	size_t jne;
	uint64_t hit;

	endbr64(&b);
	bn(&b, s->prefix, s->prefix_len);       /* a relocated window (relocate.c), unchanged */
	bn(&b, save_r11, sizeof save_r11);                                /* mov %r11,-32(%rsp) */
	bn(&b, s->load, s->load_len);                                     /* mov OP,%r11 */
	if (s->load_rip_at) {                                             /* re-aim rip-relative */
		size_t at = b.n - s->load_len + s->load_rip_at;
		int32_t d = (int32_t)(int64_t)(s->load_rip_target - here(&b));

		memcpy(b.p + at, &d, 4);
	}
	b1(&b, 0x4c); b1(&b, 0x3b); b1(&b, 0x1d); brel32(&b, s->cache);  /* cmp cache(%rip),%r11 */
	b1(&b, 0x0f); b1(&b, 0x85); jne = b.n; b32(&b, 0);               /* jne miss */
	hit = here(&b);
	b1(&b, 0x4c); b1(&b, 0x89); b1(&b, 0x5c); b1(&b, 0x24); b1(&b, 0xd8); /* mov %r11,-40(%rsp) */
	bn(&b, load_r11, sizeof load_r11);                                /* r11 as it was */
	if (s->tail_jump) {
		size_t je;

		if (s->budget_indirect)
			budget_indirect(&b, s);         /* counted jumps stop there */
		b1(&b, 0x48); b1(&b, 0x83); b1(&b, 0x3d);                 /* cmpq $0,entry(%rip) */
		b32(&b, (uint32_t)(int32_t)(int64_t)(s->cache + 8 - (here(&b) + 5)));
		b1(&b, 0x00);
		b1(&b, 0x74); je = b.n; b1(&b, 0);                          /* je 1f */
		record_id(&b, s, TRACE_ENTRY, s->cache + 8);
		b.p[je] = (uint8_t)(b.n - (je + 1));
		jmp_saved_target(&b);                                      /* 1: jmp *-40(%rsp) */
	} else {
		if (s->budget_indirect)
			budget_indirect(&b, s);         /* counted calls stop there */
		record_id(&b, s, TRACE_ENTRY, s->cache + 8);
		b1(&b, 0xff); b1(&b, 0x54); b1(&b, 0x24); b1(&b, 0xd8);  /* call *-40(%rsp) */
		record_id(&b, s, TRACE_EXIT, s->cache + 16);
		b1(&b, 0xe9); brel32(&b, s->site + s->site_len);           /* jmp S+len */
	}
	fix_rel32(&b, jne);                                                /* miss: */
	call_stub(&b, s, AG_STUB_INDIRECT);
	b1(&b, 0x0f); b1(&b, 0x84); brel32(&b, hit);                       /* je hit */
	/* Untraced (the agent runs on this thread, or the target is
	 * runtime-managed code): the call as the program made it, without
	 * records -- the callee sees the caller's return address, S+len,
	 * pushed from the slot's word (the cache may not be for this target). */
	b1(&b, 0x4c); b1(&b, 0x89); b1(&b, 0x5c); b1(&b, 0x24); b1(&b, 0xd8); /* mov %r11,-40(%rsp) */
	bn(&b, load_r11, sizeof load_r11);                                /* r11 as it was */
	if (s->tail_jump) {
		jmp_saved_target(&b);
	} else {
		b1(&b, 0xff); b1(&b, 0x35);                                /* push S+len */
		brel32(&b, rx - AG_SLOT_WORDS + AG_SLOT_RET);
		b1(&b, 0xff); b1(&b, 0x64); b1(&b, 0x24); b1(&b, 0xe0);  /* jmp *-32(%rsp) */
	}
	return b.n;
}

/*
 * A call to a function that looks at its return address to find its caller
 * (dlsym(RTLD_NEXT), dlopen's search path): the callee must see S+len, not
 * an address in the area.  The area records the entry, pushes S+len itself
 * and jumps; the callee returns straight to the caller, so there is no exit
 * record (the sites file says TRACE_SITE_NO_EXIT).
 *
 *   area:  endbr64; cmpb $0,flag; jne 1f; call *instrument_stub(%rip); 1:
 *   entry: <record ENTRY>
 *          push ret(%rip)               ret: a word holding S+len
 *          jmp G  |  jmp *slot(%rip)
 */
size_t ag_emit_call_noexit(const ag_area_spec *s, uint8_t *rw, uint64_t rx, uint64_t ret_word)
{
	buf b = { rw, rx, 0 };

	endbr64(&b);
	flag_test(&b, s);
	record(&b, s, TRACE_ENTRY);
	b1(&b, 0xff); b1(&b, 0x35); brel32(&b, ret_word);                 /* push ret(%rip) */
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x25); brel32(&b, s->slot);           /* jmp *slot(%rip) */
	} else {
		b1(&b, 0xe9); brel32(&b, s->callee);                       /* jmp G */
	}
	return b.n;
}

/*
 * A call area with a budget (budget.c): the call is timed as in
 * ag_emit_call, or counted, as the site's mode byte says.  Counting adds 1
 * to this thread's counter of the site, with no clock read and no record;
 * 1 counted call in 256 of the thread (its tick byte wraps) is timed
 * instead, a sample, and not counted.  The flags are dead before a call
 * (ABI), so the sub and the add may change them.
 *
 *   area:  endbr64; cmpb $0,flag; jne 1f; call *instrument_stub(%rip); 1:
 *   timed: cmpb $0,mode(%rip); jne counted
 *   entry: <record ENTRY>; call G | call *slot(%rip); <record EXIT>; jmp S+len
 *   counted:
 *          subb $1,%fs:ag_tls_tick; je entry          the sample
 *          mov  %r11,-32(%rsp)
 *          mov  %fs:ag_tls_counts,%r11; test %r11,%r11; je untable
 *          addq $1,ID*8(%r11)
 *          mov  -32(%rsp),%r11
 *          call G | call *slot(%rip)
 *          jmp  S+len
 *   untable: mov -32(%rsp),%r11; jmp entry   (no table yet: timed)
 */
size_t ag_emit_call_budget(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };
	size_t jne_counted, je_untable;
	uint64_t entry;
	uint32_t disp = (uint32_t)s->site_id * 8;

	endbr64(&b);
	flag_test(&b, s);
	jne_counted = mode_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY);
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x15); brel32(&b, s->slot);           /* call *slot(%rip) */
	} else {
		b1(&b, 0xe8); brel32(&b, s->callee);                       /* call G */
	}
	record(&b, s, TRACE_EXIT);
	b1(&b, 0xe9); brel32(&b, s->site + s->site_len);                   /* jmp S+len */

	fix_rel32(&b, jne_counted);                                        /* counted: */
	je_untable = count_direct(&b, s, entry, disp);
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x15); brel32(&b, s->slot);           /* call *slot(%rip) */
	} else {
		b1(&b, 0xe8); brel32(&b, s->callee);                       /* call G */
	}
	b1(&b, 0xe9); brel32(&b, s->site + s->site_len);                   /* jmp S+len */
	fix_rel32(&b, je_untable);                                         /* untable: */
	bn(&b, load_r11, sizeof load_r11);
	b1(&b, 0xe9); brel32(&b, entry);                                   /* jmp entry */

	return b.n;
}

/* A return stub in the slot at rx (activate.c): a frame returns to
 * rx + AG_STUB_RETURN, past the nop, so that the unwinder's "return
 * address - 1" is the stub's own. */
void ag_emit_return_stub(uint8_t *rw, uint64_t rx, uint64_t tramp)
{
	buf b = { rw + AG_SLOT_WORDS, rx + AG_SLOT_WORDS, 0 };

	b1(&b, 0x90);                                                      /* nop */
	b1(&b, 0x49); b1(&b, 0xbb); b64(&b, rx);                           /* movabs $slot, %r11 */
	b1(&b, 0xff); b1(&b, 0x25); b32(&b, 0);                            /* jmp *0(%rip) */
	b64(&b, tramp);
}
