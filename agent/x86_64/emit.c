/*
 * emit.c — x86-64 code of the per-site patch areas.
 *
 * A call site S is replaced by `jmp area`.  The area runs in the caller's
 * state at S, where the red zone below rsp is dead (the call itself would
 * overwrite it) and so are the flags (the SysV ABI: undefined at a call).  Every register is
 * preserved -- r11 too: calls with private conventions (TLS descriptors,
 * glibc's own asm) may keep values in it:
 *
 *   area:  endbr64
 *          cmpb $0, flag               callee instrumented yet?
 *          je   slow_instr             -> instrument(callee), come back
 *   entry: <record ENTRY, site id>     uses rax, rdx, r11 (spilled below rsp)
 *          call G  |  call *slot(%rip) the callee returns into the area
 *   exit:  <record EXIT, site id>      rax, rdx hold G's results: spilled
 *          jmp  S+len
 *          ...slow paths...
 *   (the slot's last 8 bytes: S+len-1, for the unwinder; see unwind.c)
 *
 * Recording a record (the writer side of trace_format.h):
 *
 *          mov  %rax,-16(%rsp); mov %rdx,-24(%rsp); mov %r11,-32(%rsp)
 *          [exit: lahf; seto %al; mov %ax,-48(%rsp)]   the callee's flags
 *   again: mov  %fs:ag_tls_ring,%r11   the thread's ring, NULL if none (yet)
 *          test %r11,%r11; je no_ring
 *          rdtsc; shl $32,%rdx; or %rdx,%rax
 *          mov  %rax,%rdx; shr $38,%rdx; cmp EPOCH(%r11),%rdx; jne sync
 *          shl  $26,%rax; or $(id<<2|kind),%rax
 *          mov  $1,%edx; xadd %rdx,COUNT(%r11)   the slot, taken in one instruction
 *          cmp  LIMIT(%r11),%rdx; jae move       the window's end (~0 in a ring)
 *   store: and  MASK(%r11),%rdx; mov %rax,4096(%r11,%rdx,8)
 *   done:  [exit: mov -48(%rsp),%ax; add $0x7f,%al; sahf]
 *          mov  -16(%rsp),%rax; mov -24(%rsp),%rdx; mov -32(%rsp),%r11
 *
 * no_ring and sync call the slow-path trampoline with r11 = the request,
 * 128 bytes below rsp so the spills survive; it answers in r11: non-zero to
 * retry the record, zero to skip it (the agent itself is running, or the
 * thread cannot get a ring).  move (a file that keeps every record reached
 * the end of its window, trace_format.h) keeps the header at -56(%rsp) and
 * asks with the record's index in the request; the trampoline keeps rax and
 * rdx, so the answer says store (non-zero: the slot of that index is
 * mapped) or skip.  The trampoline saves every register, the
 * flags and the whole XSAVE state, so slow paths change nothing the program
 * sees.  The exit record keeps the flags too: the area returns to the
 * caller with every register and flag as the callee left them.
 */
#include <stddef.h>
#include <string.h>

#include "../agent.h"

_Static_assert(offsetof(trace_ring_header, count) == TRACE_RING_OFF_COUNT, "header layout");
_Static_assert(offsetof(trace_ring_header, mask) == TRACE_RING_OFF_MASK, "header layout");
_Static_assert(offsetof(trace_ring_header, epoch) == TRACE_RING_OFF_EPOCH, "header layout");
_Static_assert(offsetof(trace_ring_header, limit) == TRACE_RING_OFF_LIMIT, "header layout");

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

/* lea -128(%rsp),%rsp; mov $request,%r11; call trampoline; lea 128(%rsp),%rsp
 * The call happens below the red zone, so the spills there survive it. */
static void slow_call(buf *b, const ag_area_spec *s, uint64_t request)
{
	b1(b, 0x48); b1(b, 0x8d); b1(b, 0x64); b1(b, 0x24); b1(b, 0x80);  /* lea -128(%rsp),%rsp */
	b1(b, 0x49); b1(b, 0xbb); b64(b, request);
	b1(b, 0xe8); brel32(b, s->slow_instr);
	b1(b, 0x48); b1(b, 0x8d); b1(b, 0xa4); b1(b, 0x24);              /* lea 128(%rsp),%rsp */
	b32(b, 128);
}

static const uint8_t save_r11[] = { 0x4c, 0x89, 0x5c, 0x24, 0xe0 };    /* mov %r11,-32(%rsp) */
static const uint8_t load_r11[] = { 0x4c, 0x8b, 0x5c, 0x24, 0xe0 };    /* mov -32(%rsp),%r11 */

static const uint8_t spill[] = { 0x48, 0x89, 0x44, 0x24, 0xf0,   /* mov %rax,-16(%rsp) */
				 0x48, 0x89, 0x54, 0x24, 0xe8,   /* mov %rdx,-24(%rsp) */
				 0x4c, 0x89, 0x5c, 0x24, 0xe0 }; /* mov %r11,-32(%rsp) */
static const uint8_t unspill[] = { 0x48, 0x8b, 0x44, 0x24, 0xf0,   /* mov -16(%rsp),%rax */
				   0x48, 0x8b, 0x54, 0x24, 0xe8,   /* mov -24(%rsp),%rdx */
				   0x4c, 0x8b, 0x5c, 0x24, 0xe0 }; /* mov -32(%rsp),%r11 */

/* Where a record's slow paths must jump back to. */
typedef struct rec_fix {
	size_t no_ring, sync, move; /* rel32 fields to point at the slow paths */
	uint64_t retry;         /* past the spills, to try again */
	uint64_t done;          /* the restores at the end, to skip the record */
} rec_fix;

/* The flags, kept across an exit record (with rax spilled):
 * lahf takes SF ZF AF PF CF into ah, seto OF into al; sahf puts the five
 * back and `add $0x7f,%al` overflows exactly when OF was set. */
static const uint8_t save_flags[] = { 0x9f,                             /* lahf */
				      0x0f, 0x90, 0xc0,                 /* seto %al */
				      0x66, 0x89, 0x44, 0x24, 0xd0 };   /* mov %ax,-48(%rsp) */
static const uint8_t load_flags[] = { 0x66, 0x8b, 0x44, 0x24, 0xd0,     /* mov -48(%rsp),%ax */
				      0x04, 0x7f,                       /* add $0x7f,%al */
				      0x9e };                           /* sahf */

/* Record `kind` for the site; with `idword` non-zero the (id << 2 | kind)
 * word is loaded from there (an indirect site's cache) instead. */
static void record_id(buf *b, const ag_area_spec *s, unsigned kind, uint64_t idword, rec_fix *f);

/* and MASK(%r11),%rdx; mov %rax,4096(%r11,%rdx,8) */
static void store(buf *b)
{
	static const uint8_t st[] = {
		0x49, 0x23, 0x53, TRACE_RING_OFF_MASK,  /* and MASK(%r11),%rdx */
		0x49, 0x89, 0x84, 0xd3, 0x00, 0x10, 0x00, 0x00, /* mov %rax,4096(%r11,%rdx,8) */
	};

	_Static_assert(TRACE_RING_HEADER_SIZE == 4096, "the store encodes 4096");
	bn(b, st, sizeof st);
}

static void record(buf *b, const ag_area_spec *s, unsigned kind, rec_fix *f)
{
	record_id(b, s, kind, 0, f);
}

static void record_id(buf *b, const ag_area_spec *s, unsigned kind, uint64_t idword, rec_fix *f)
{
	static const uint8_t tsc[] = {
		0x0f, 0x31,                     /* rdtsc */
		0x48, 0xc1, 0xe2, 0x20,         /* shl $32,%rdx */
		0x48, 0x09, 0xd0,               /* or %rdx,%rax */
		0x48, 0x89, 0xc2,               /* mov %rax,%rdx */
		0x48, 0xc1, 0xea, 0x26,         /* shr $38,%rdx */
		0x49, 0x3b, 0x53, TRACE_RING_OFF_EPOCH, /* cmp EPOCH(%r11),%rdx */
	};
	/* The slot is taken with one instruction (xadd): a signal handler that
	 * records on this thread in between gets the next slots, never ours. */
	static const uint8_t take[] = {
		0xba, 0x01, 0x00, 0x00, 0x00,           /* mov $1,%edx */
		0x49, 0x0f, 0xc1, 0x53, TRACE_RING_OFF_COUNT, /* xadd %rdx,COUNT(%r11) */
		0x49, 0x3b, 0x53, TRACE_RING_OFF_LIMIT, /* cmp LIMIT(%r11),%rdx */
	};
	uint32_t imm = (uint32_t)(((uint64_t)(s->site_id & TRACE_ID_MAX) << 2) | kind);
	/* After a call the flags are the callee's result, which code with a
	 * private convention may use; before one they are undefined (ABI). */
	bool keep = kind == TRACE_EXIT;

	bn(b, spill, sizeof spill);
	if (keep)
		bn(b, save_flags, sizeof save_flags);
	f->retry = here(b);
	b1(b, 0x64); b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x25); /* mov %fs:disp32,%r11 */
	b32(b, (uint32_t)(int32_t)s->tls_offset);
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                            /* test %r11,%r11 */
	b1(b, 0x0f); b1(b, 0x84); f->no_ring = b->n; b32(b, 0);           /* je no_ring */
	bn(b, tsc, sizeof tsc);
	b1(b, 0x0f); b1(b, 0x85); f->sync = b->n; b32(b, 0);              /* jne sync */
	b1(b, 0x48); b1(b, 0xc1); b1(b, 0xe0); b1(b, TRACE_TSC_SHIFT);   /* shl $26,%rax */
	if (idword) {
		b1(b, 0x48); b1(b, 0x0b); b1(b, 0x05); brel32(b, idword); /* or word(%rip),%rax */
	} else {
		b1(b, 0x48); b1(b, 0x0d); b32(b, imm);                    /* or $imm,%rax */
	}
	bn(b, take, sizeof take);
	b1(b, 0x0f); b1(b, 0x83); f->move = b->n; b32(b, 0);             /* jae move */
	store(b);
	f->done = here(b);
	if (keep)
		bn(b, load_flags, sizeof load_flags);
	bn(b, unspill, sizeof unspill);
}

/* One slow path of a record: ask, then retry (the record reloads rax, rdx
 * and r11 itself) or skip to the restores (the spills below rsp survive
 * the call, made 128 bytes further down). */
static void record_slow_one(buf *b, const ag_area_spec *s, size_t field, unsigned op,
			    const rec_fix *f)
{
	fix_rel32(b, field);
	slow_call(b, s, (uint64_t)op << 56);
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                            /* test %r11,%r11 */
	b1(b, 0x0f); b1(b, 0x85); brel32(b, f->retry);                    /* jnz retry */
	b1(b, 0xe9); brel32(b, f->done);                                  /* jmp done */
}

/*
 * The move slow path: rax holds the record, rdx its index, r11 the header.
 *
 *   move:  mov %r11,-56(%rsp)
 *          lea -128(%rsp),%rsp; movabs $(ROTATE << 56),%r11; or %rdx,%r11
 *          call trampoline; lea 128(%rsp),%rsp
 *          test %r11,%r11; mov -56(%rsp),%r11; je done
 *          <store>; jmp done
 */
static void record_slow_move(buf *b, const ag_area_spec *s, const rec_fix *f)
{
	size_t je;

	fix_rel32(b, f->move);
	b1(b, 0x4c); b1(b, 0x89); b1(b, 0x5c); b1(b, 0x24); b1(b, 0xc8);  /* mov %r11,-56(%rsp) */
	b1(b, 0x48); b1(b, 0x8d); b1(b, 0x64); b1(b, 0x24); b1(b, 0x80);  /* lea -128(%rsp),%rsp */
	b1(b, 0x49); b1(b, 0xbb); b64(b, (uint64_t)AG_SLOW_ROTATE << 56); /* movabs $req,%r11 */
	b1(b, 0x49); b1(b, 0x09); b1(b, 0xd3);                            /* or %rdx,%r11 */
	b1(b, 0xe8); brel32(b, s->slow_instr);                            /* call trampoline */
	b1(b, 0x48); b1(b, 0x8d); b1(b, 0xa4); b1(b, 0x24); b32(b, 128);  /* lea 128(%rsp),%rsp */
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                            /* test %r11,%r11 */
	b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x5c); b1(b, 0x24); b1(b, 0xc8);  /* mov -56(%rsp),%r11 */
	b1(b, 0x0f); b1(b, 0x84); je = b->n; b32(b, 0);                   /* je done */
	store(b);
	b1(b, 0xe9); brel32(b, f->done);                                  /* jmp done */
	{
		int32_t rel = (int32_t)(int64_t)(f->done - (b->rx + je + 4));

		memcpy(b->p + je, &rel, 4);
	}
}

static void record_slow(buf *b, const ag_area_spec *s, const rec_fix *f)
{
	record_slow_one(b, s, f->no_ring, AG_SLOW_RING, f);
	record_slow_one(b, s, f->sync, AG_SLOW_SYNC, f);
	record_slow_move(b, s, f);
}

/*
 * A value record (trace_format.h, "Values"): argument `arg` (1..6) right
 * after a call's ENTRY, or the return value (arg 0) right before its EXIT,
 * the flags kept then as for the EXIT.  Like a record, with the value in
 * place of the TSC: no SYNC needed, so no sync slow path; and no ring slow
 * path either: the ENTRY just before made the thread's ring if it could,
 * and without one it was skipped too (the agent runs on this thread), so
 * the value is skipped with it.
 *
 *          <spills as a record>
 *          mov %fs:ag_tls_ring,%r11; test %r11,%r11; je done
 *          mov VALUE,%rax              the register, or its spill (rax, rdx)
 *          mov %rax,%rdx; shl $26,%rax
 *          shr $25,%rdx; and $(0x1fff << 13),%edx; or %rdx,%rax
 *          or $(trace_value_id(arg, 0) << 2 | TRACE_EVENT),%rax
 *          <take, store (move: as a record), restores as a record>
 */
static void record_value(buf *b, const ag_area_spec *s, unsigned arg, rec_fix *f)
{
	static const uint8_t from[7][5] = {
		{ 0x48, 0x8b, 0x44, 0x24, 0xf0 },       /* ret: mov -16(%rsp),%rax */
		{ 0x48, 0x89, 0xf8 },                   /* arg1: mov %rdi,%rax */
		{ 0x48, 0x89, 0xf0 },                   /* arg2: mov %rsi,%rax */
		{ 0x48, 0x8b, 0x44, 0x24, 0xe8 },       /* arg3: mov -24(%rsp),%rax */
		{ 0x48, 0x89, 0xc8 },                   /* arg4: mov %rcx,%rax */
		{ 0x4c, 0x89, 0xc0 },                   /* arg5: mov %r8,%rax */
		{ 0x4c, 0x89, 0xc8 },                   /* arg6: mov %r9,%rax */
	};
	static const uint8_t pack[] = {
		0x48, 0x89, 0xc2,                       /* mov %rax,%rdx */
		0x48, 0xc1, 0xe0, TRACE_TSC_SHIFT,      /* shl $26,%rax */
		0x48, 0xc1, 0xea, 0x19,                 /* shr $25,%rdx */
		0x81, 0xe2, 0x00, 0xe0, 0xff, 0x03,     /* and $0x3ffe000,%edx */
		0x48, 0x09, 0xd0,                       /* or %rdx,%rax */
	};
	static const uint8_t take[] = {
		0xba, 0x01, 0x00, 0x00, 0x00,           /* mov $1,%edx */
		0x49, 0x0f, 0xc1, 0x53, TRACE_RING_OFF_COUNT, /* xadd %rdx,COUNT(%r11) */
		0x49, 0x3b, 0x53, TRACE_RING_OFF_LIMIT, /* cmp LIMIT(%r11),%rdx */
	};
	uint32_t imm = trace_value_id(arg, 0) << 2 | TRACE_EVENT;
	bool keep = arg == 0;

	_Static_assert(TRACE_TSC_SHIFT == 26 && TRACE_TSC_LOW_BITS == 38, "the packing encodes them");
	/* An argument comes right after the ENTRY record, whose spills below rsp
	 * still hold rax, rdx and r11 as they are: not spilled again (room: an
	 * area with both values fills most of its slot). */
	if (keep)
		bn(b, spill, sizeof spill);
	if (keep)
		bn(b, save_flags, sizeof save_flags);
	b1(b, 0x64); b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x25); /* mov %fs:disp32,%r11 */
	b32(b, (uint32_t)(int32_t)s->tls_offset);
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                            /* test %r11,%r11 */
	b1(b, 0x0f); b1(b, 0x84); f->no_ring = b->n; b32(b, 0);           /* je done */
	bn(b, from[arg], from[arg][2] == 0x44 ? 5 : 3);
	bn(b, pack, sizeof pack);
	b1(b, 0x48); b1(b, 0x0d); b32(b, imm);                            /* or $imm,%rax */
	bn(b, take, sizeof take);
	b1(b, 0x0f); b1(b, 0x83); f->move = b->n; b32(b, 0);             /* jae move */
	store(b);
	f->done = here(b);
	fix_rel32(b, f->no_ring);
	if (keep)
		bn(b, load_flags, sizeof load_flags);
	bn(b, unspill, sizeof unspill);
}

/* cmpb $0,flag(%rip); je <returned field> */
static size_t flag_test(buf *b, const ag_area_spec *s)
{
	size_t je;

	b1(b, 0x80); b1(b, 0x3d);
	b32(b, (uint32_t)(int32_t)(int64_t)((uint64_t)(uintptr_t)s->callee_flag - (here(b) + 5)));
	b1(b, 0x00);
	b1(b, 0x0f); b1(b, 0x84); je = b->n; b32(b, 0);
	return je;
}

/* The instrument slow path: ask, then go on to the entry record whatever
 * the answer (if the agent could not instrument G -- re-entered from a
 * signal handler, say -- the call goes on untraced inside G). */
static void instr_slow(buf *b, const ag_area_spec *s, size_t je, uint64_t entry)
{
	fix_rel32(b, je);
	bn(b, save_r11, sizeof save_r11);
	slow_call(b, s, ((uint64_t)AG_SLOW_INSTRUMENT << 56) | (uint64_t)(uintptr_t)s->callee_ref);
	bn(b, load_r11, sizeof load_r11);
	b1(b, 0xe9); brel32(b, entry);
}

/*
 * Before a tail jump to a caller-sensitive function: if the return address
 * on the stack is in a call area (F was called through one), put back the
 * real one, S+len of that call, read from the area's slot (found by masking:
 * slots are AG_AREA_MAX-aligned; the magic word says it is one).  The call
 * through that area then has no exit record: the reader closes it with its
 * caller... acceptable for the rare dlsym/dlopen tail call.
 *
 *   mov %rax,-16(%rsp); mov %r11,-8(%rsp)      both dead below rsp here
 *   mov (%rsp),%r11; and $-AG_AREA_MAX,%r11
 *   movabs $MAGIC,%rax; cmp MAGIC(%r11),%rax; jne 1f
 *   mov RET(%r11),%rax; mov %rax,(%rsp)
 * 1: mov -16(%rsp),%rax; mov -8(%rsp),%r11
 */
static void fix_return(buf *b)
{
	size_t jne;

	b1(b, 0x48); b1(b, 0x89); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);   /* mov %rax,-16(%rsp) */
	b1(b, 0x4c); b1(b, 0x89); b1(b, 0x5c); b1(b, 0x24); b1(b, 0xf8);   /* mov %r11,-8(%rsp) */
	b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x24);                /* mov (%rsp),%r11 */
	b1(b, 0x49); b1(b, 0x81); b1(b, 0xe3); b32(b, (uint32_t)-AG_AREA_MAX); /* and $-N,%r11 */
	b1(b, 0x48); b1(b, 0xb8); b64(b, AG_SLOT_MAGIC_VALUE);             /* movabs $MAGIC,%rax */
	b1(b, 0x49); b1(b, 0x3b); b1(b, 0x83); b32(b, AG_SLOT_MAGIC);      /* cmp MAGIC(%r11),%rax */
	b1(b, 0x75); jne = b->n; b1(b, 0);                                 /* jne 1f */
	b1(b, 0x49); b1(b, 0x8b); b1(b, 0x83); b32(b, AG_SLOT_RET);        /* mov RET(%r11),%rax */
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
	rec_fix in;
	size_t je, jne_counted = 0, je_untable;
	uint64_t entry, timed;
	bool budget = s->budget_mode && !s->fix_return;

	endbr64(&b);
	if (s->cond) {
		b1(&b, 0x0f); b1(&b, (uint8_t)(0x80 | s->cond_code));      /* jcc rel32 taken */
		b32(&b, 5);
		b1(&b, 0xe9); brel32(&b, s->site + s->site_len);           /* not taken: back */
	}
	je = flag_test(&b, s);
	timed = here(&b);
	if (budget)
		jne_counted = mode_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY, &in);
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
	instr_slow(&b, s, je, timed);
	record_slow(&b, s, &in);
	return b.n;
}

size_t ag_emit_call(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };
	rec_fix in, out, vin, vout;
	size_t je;
	uint64_t entry;

	endbr64(&b);
	je = flag_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY, &in);
	if (s->value_arg)
		record_value(&b, s, s->value_arg, &vin);
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x15); brel32(&b, s->slot);           /* call *slot(%rip) */
	} else {
		b1(&b, 0xe8); brel32(&b, s->callee);                       /* call G */
	}
	if (s->value_ret)
		record_value(&b, s, 0, &vout);
	record(&b, s, TRACE_EXIT, &out);
	b1(&b, 0xe9); brel32(&b, s->site + s->site_len);                   /* jmp S+len */
	instr_slow(&b, s, je, entry);
	record_slow(&b, s, &in);
	record_slow(&b, s, &out);
	if (s->value_arg)
		record_slow_move(&b, s, &vin);
	if (s->value_ret)
		record_slow_move(&b, s, &vout);
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
 *   miss:  cmp  cache.untraced(%rip),%r11
 *          je   untraced
 *          mov  %r11,%fs:ag_tls_target; <slow path>; mov %fs:ag_tls_target,%r11
 *          jmp  hit                     (answer 0 or 2: to untraced)
 *   untraced: mov %r11,-40(%rsp); mov -32(%rsp),%r11
 *          push S+len(%rip); jmp *-32(%rsp)     the caller's own return address
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
 * saved at -40(%rsp) and r11 restored: the id of the cached target (its
 * entry word >> 2) indexes the budget's mode table, absolute (data far
 * from the pool), and the counters.  Counted: the call is made here and the
 * area left; else (timed, a sample, no table) it falls through to the
 * ENTRY record.  rax is spilled where the records spill it.  The cache
 * another thread refills meanwhile can at worst count one call for the
 * previous target (as it can mislabel a record, see above).  At an indirect
 * tail jump (s->tail_jump) a counted jump is `jmp *-40(%rsp)` in place of
 * the call and the jmp back, as a timed one after its ENTRY.
 *
 *   mov  %rax,-16(%rsp); mov cache.entry(%rip),%rax; shr $2,%rax
 *   cmp  $AG_BUDGET_SITES,%rax; jae timed
 *   movabs $modes,%r11; cmpb $0,(%r11,%rax); je timed
 *   subb $1,%fs:ag_tls_tick; je timed
 *   mov  %fs:ag_tls_counts,%r11; test %r11,%r11; je timed
 *   addq $1,(%r11,%rax,8)
 *   mov  -16(%rsp),%rax; mov -32(%rsp),%r11
 *   call *-40(%rsp); jmp S+len
 * timed: mov -16(%rsp),%rax; mov -32(%rsp),%r11
 */
static void budget_indirect(buf *b, const ag_area_spec *s)
{
	size_t jt[4];

	b1(b, 0x48); b1(b, 0x89); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);    /* mov %rax,-16(%rsp) */
	b1(b, 0x48); b1(b, 0x8b); b1(b, 0x05); brel32(b, s->cache + 8);     /* mov entry(%rip),%rax */
	b1(b, 0x48); b1(b, 0xc1); b1(b, 0xe8); b1(b, 0x02);                 /* shr $2,%rax */
	b1(b, 0x48); b1(b, 0x3d); b32(b, AG_BUDGET_SITES);                  /* cmp $N,%rax */
	b1(b, 0x0f); b1(b, 0x83); jt[0] = b->n; b32(b, 0);                 /* jae timed */
	b1(b, 0x49); b1(b, 0xbb); b64(b, (uint64_t)(uintptr_t)s->budget_modes); /* movabs */
	b1(b, 0x41); b1(b, 0x80); b1(b, 0x3c); b1(b, 0x03); b1(b, 0x00);   /* cmpb $0,(%r11,%rax) */
	b1(b, 0x0f); b1(b, 0x84); jt[1] = b->n; b32(b, 0);                 /* je timed */
	b1(b, 0x64); b1(b, 0x80); b1(b, 0x2c); b1(b, 0x25);                 /* subb $1,%fs:tick */
	b32(b, (uint32_t)(int32_t)s->tls_tick_offset); b1(b, 0x01);
	b1(b, 0x0f); b1(b, 0x84); jt[2] = b->n; b32(b, 0);                 /* je timed */
	b1(b, 0x64); b1(b, 0x4c); b1(b, 0x8b); b1(b, 0x1c); b1(b, 0x25);    /* mov %fs:d32,%r11 */
	b32(b, (uint32_t)(int32_t)s->tls_counts_offset);
	b1(b, 0x4d); b1(b, 0x85); b1(b, 0xdb);                               /* test %r11,%r11 */
	b1(b, 0x0f); b1(b, 0x84); jt[3] = b->n; b32(b, 0);                 /* je timed */
	b1(b, 0x49); b1(b, 0x83); b1(b, 0x04); b1(b, 0xc3); b1(b, 0x01);   /* addq $1,(%r11,%rax,8) */
	b1(b, 0x48); b1(b, 0x8b); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);    /* mov -16(%rsp),%rax */
	bn(b, load_r11, sizeof load_r11);
	if (s->tail_jump) {
		jmp_saved_target(b);                                        /* jmp *-40(%rsp) */
	} else {
		b1(b, 0xff); b1(b, 0x54); b1(b, 0x24); b1(b, 0xd8);         /* call *-40(%rsp) */
		b1(b, 0xe9); brel32(b, s->site + s->site_len);              /* jmp S+len */
	}
	for (size_t i = 0; i < 4; i++)
		fix_rel32(b, jt[i]);                                         /* timed: */
	b1(b, 0x48); b1(b, 0x8b); b1(b, 0x44); b1(b, 0x24); b1(b, 0xf0);    /* mov -16(%rsp),%rax */
	bn(b, load_r11, sizeof load_r11);
}

size_t ag_emit_indirect(const ag_area_spec *s, uint8_t *rw, uint64_t rx)
{
	buf b = { rw, rx, 0 };
	rec_fix in, out;
	size_t jne, jz, je2, je_untraced;
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

		if (s->budget_modes)
			budget_indirect(&b, s);         /* counted jumps stop there */
		b1(&b, 0x48); b1(&b, 0x83); b1(&b, 0x3d);                 /* cmpq $0,entry(%rip) */
		b32(&b, (uint32_t)(int32_t)(int64_t)(s->cache + 8 - (here(&b) + 5)));
		b1(&b, 0x00);
		b1(&b, 0x74); je = b.n; b1(&b, 0);                          /* je 1f */
		record_id(&b, s, TRACE_ENTRY, s->cache + 8, &in);
		b.p[je] = (uint8_t)(b.n - (je + 1));
		jmp_saved_target(&b);                                      /* 1: jmp *-40(%rsp) */
	} else {
		if (s->budget_modes)
			budget_indirect(&b, s);         /* counted calls stop there */
		record_id(&b, s, TRACE_ENTRY, s->cache + 8, &in);
		b1(&b, 0xff); b1(&b, 0x54); b1(&b, 0x24); b1(&b, 0xd8);  /* call *-40(%rsp) */
		record_id(&b, s, TRACE_EXIT, s->cache + 16, &out);
		b1(&b, 0xe9); brel32(&b, s->site + s->site_len);           /* jmp S+len */
	}
	fix_rel32(&b, jne);
	b1(&b, 0x4c); b1(&b, 0x3b); b1(&b, 0x1d); brel32(&b, s->cache + 24); /* cmp untraced(%rip),%r11 */
	b1(&b, 0x0f); b1(&b, 0x84); je_untraced = b.n; b32(&b, 0);        /* je untraced */
	b1(&b, 0x64); b1(&b, 0x4c); b1(&b, 0x89); b1(&b, 0x1c); b1(&b, 0x25); /* mov %r11,%fs:tmp */
	b32(&b, (uint32_t)(int32_t)s->tls_target_offset);
	slow_call(&b, s, ((uint64_t)AG_SLOW_INDIRECT << 56) | (uint64_t)(uintptr_t)s->indirect_ref);
	b1(&b, 0x4d); b1(&b, 0x85); b1(&b, 0xdb);                            /* test %r11,%r11 */
	b1(&b, 0x0f); b1(&b, 0x84); jz = b.n; b32(&b, 0);                 /* jz skip */
	b1(&b, 0x49); b1(&b, 0x83); b1(&b, 0xfb); b1(&b, 0x02);            /* cmp $2,%r11 */
	b1(&b, 0x0f); b1(&b, 0x84); je2 = b.n; b32(&b, 0);                /* je skip */
	b1(&b, 0x64); b1(&b, 0x4c); b1(&b, 0x8b); b1(&b, 0x1c); b1(&b, 0x25); /* mov %fs:tmp,%r11 */
	b32(&b, (uint32_t)(int32_t)s->tls_target_offset);
	b1(&b, 0xe9); brel32(&b, hit);
	/* The slow path said skip (the agent runs on this thread), or the
	 * target is runtime-managed code (answer 2): the call as the program
	 * made it, without records -- the callee sees the caller's return
	 * address, S+len, pushed from the slot's word (the cache may not be
	 * for this target). */
	fix_rel32(&b, jz);
	fix_rel32(&b, je2);
	b1(&b, 0x64); b1(&b, 0x4c); b1(&b, 0x8b); b1(&b, 0x1c); b1(&b, 0x25); /* mov %fs:tmp,%r11 */
	b32(&b, (uint32_t)(int32_t)s->tls_target_offset);
	fix_rel32(&b, je_untraced);
	b1(&b, 0x4c); b1(&b, 0x89); b1(&b, 0x5c); b1(&b, 0x24); b1(&b, 0xd8); /* mov %r11,-40(%rsp) */
	bn(&b, load_r11, sizeof load_r11);                                /* r11 as it was */
	if (s->tail_jump) {
		jmp_saved_target(&b);
	} else {
		b1(&b, 0xff); b1(&b, 0x35); brel32(&b, rx + AG_SLOT_RET);  /* push S+len */
		b1(&b, 0xff); b1(&b, 0x64); b1(&b, 0x24); b1(&b, 0xe0);  /* jmp *-32(%rsp) */
	}
	record_slow(&b, s, &in);
	if (!s->tail_jump)
		record_slow(&b, s, &out);
	return b.n;
}

/*
 * A call to a function that looks at its return address to find its caller
 * (dlsym(RTLD_NEXT), dlopen's search path): the callee must see S+len, not
 * an address in the area.  The area records the entry, pushes S+len itself
 * and jumps; the callee returns straight to the caller, so there is no exit
 * record (the sites file says TRACE_SITE_NO_EXIT).
 *
 *   area:  endbr64; cmpb $0,flag; je slow_instr
 *   entry: <record ENTRY>
 *          push ret(%rip)               ret: a word holding S+len
 *          jmp G  |  jmp *slot(%rip)
 */
size_t ag_emit_call_noexit(const ag_area_spec *s, uint8_t *rw, uint64_t rx, uint64_t ret_word)
{
	buf b = { rw, rx, 0 };
	rec_fix in;
	size_t je;
	uint64_t entry;

	endbr64(&b);
	je = flag_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY, &in);
	b1(&b, 0xff); b1(&b, 0x35); brel32(&b, ret_word);                 /* push ret(%rip) */
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x25); brel32(&b, s->slot);           /* jmp *slot(%rip) */
	} else {
		b1(&b, 0xe9); brel32(&b, s->callee);                       /* jmp G */
	}
	instr_slow(&b, s, je, entry);
	record_slow(&b, s, &in);
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
 *   area:  endbr64; cmpb $0,flag; je slow_instr
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
	rec_fix in, out;
	size_t je, jne_counted, je_untable;
	uint64_t entry, timed;
	uint32_t disp = (uint32_t)s->site_id * 8;

	endbr64(&b);
	je = flag_test(&b, s);
	timed = here(&b);
	jne_counted = mode_test(&b, s);
	entry = here(&b);
	record(&b, s, TRACE_ENTRY, &in);
	if (s->slot) {
		b1(&b, 0xff); b1(&b, 0x15); brel32(&b, s->slot);           /* call *slot(%rip) */
	} else {
		b1(&b, 0xe8); brel32(&b, s->callee);                       /* call G */
	}
	record(&b, s, TRACE_EXIT, &out);
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

	instr_slow(&b, s, je, timed);
	record_slow(&b, s, &in);
	record_slow(&b, s, &out);
	return b.n;
}

/* A return stub in the slot at rx (activate.c): a frame returns to
 * rx + AG_STUB_RETURN, past the nop, so that the unwinder's "return
 * address - 1" is the stub's own. */
void ag_emit_return_stub(uint8_t *rw, uint64_t rx, uint64_t tramp)
{
	buf b = { rw, rx, 0 };

	b1(&b, 0x90);                                                      /* nop */
	b1(&b, 0x49); b1(&b, 0xbb); b64(&b, rx);                           /* movabs $slot, %r11 */
	b1(&b, 0xff); b1(&b, 0x25); b32(&b, 0);                            /* jmp *0(%rip) */
	b64(&b, tramp);
}
