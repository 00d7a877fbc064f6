/*
 * unwind.c — unwind information for patch areas, so that C++ exceptions,
 * pthread_exit/pthread_cancel (forced unwinding) and backtrace() work
 * through instrumented calls.
 *
 * While G runs, its return address points into the area that called it, not
 * to S+5 in the caller F.  The unwinder must step from the area to F as if
 * the area were not there.  Each area gets an FDE that describes it as a
 * frame of size zero whose caller is F just after the call:
 *
 *   CFA = rsp + 0                      DW_CFA_def_cfa rsp, 0
 *   rip = S + len - 1                  DW_CFA_expression rip, DW_OP_addr slot
 *   every other register: unchanged    (the area saves nothing)
 *
 * where `slot` is the first 8 bytes of the area's slot, holding S + len - 1.
 * A pool's regions have fixed-size slots (small or big, pool.c), aligned to
 * their size, so one FDE covers every slot of a region: `slot` is computed
 * from the pc, whatever the slot -- the area's return address into it, or
 * the pc a signal interrupted in it (libgcc's reg 16 of the area's frame):
 *
 *   rip is saved at (pc & ~(SIZE - 1)) + AG_SLOT_RA
 *                  DW_CFA_expression rip, DW_OP_breg16 0, DW_OP_constu
 *                  SIZE - 1, DW_OP_not, DW_OP_and, DW_OP_plus_uconst
 *                  AG_SLOT_RA
 *
 * It is registered when the pool is made (pool.c), never from a slow path:
 * one FDE, where one per slot cost the C library's pool 14,000 FDEs, 0.3 ms
 * and 0.9 MB in every traced process.
 *
 * Two subtleties of libgcc's unwinder:
 *  - A frame of size zero has the same identity (its CFA) as its caller's
 *    callee, and phase 2 of a throw finds "the handler frame" by identity:
 *    it would stop at the area, which has no personality, and abort.  So
 *    the CIE says "S" (signal frame): a signal frame's identity is CFA - 1.
 *  - Below a signal frame the caller's pc is taken as exact, not as a
 *    return address (no "- 1" before the FDE and call-site lookups), so the
 *    slot holds S + len - 1, the last byte of the call: F's FDE and LSDA are
 *    searched at the same address as without tracing.
 * (A val_expression with the constant would say the same as the slot, but
 * libgcc then marks rip "by value", which its context installation rejects.)
 *
 * The unwinder then looks up F's own FDE and LSDA at S+len-1, inside F's
 * call-site range for the original call: F's cleanups run and its handlers
 * catch exactly as without tracing.
 *
 * The FDEs are registered twice, with storage we provide (registration
 * does not allocate):
 *  - with the process's unwinder, libgcc_s (C++ exceptions, glibc's
 *    pthread_exit, pthread_cancel and backtrace() all use it), once it is
 *    loaded -- the agent neither links nor loads it for itself: most C
 *    programs never do, and loading it cost every traced process's start
 *    about 0.5 ms (its load, its constructor, one more module to trace and
 *    fork).  The protocol:
 *     1. Every registration is kept in a list (reg_lock) and made with
 *        libgcc_s at once if `process_register` is known.
 *     2. ag_unwind_need finds libgcc_s (loading it if `load`), looks up
 *        __register_frame_info, makes every kept registration in order,
 *        then publishes `process_register` -- under reg_lock, so that a
 *        registration is made exactly once.  The load itself is outside
 *        the lock (the loader's lock is never taken under it).
 *     3. Where libgcc_s comes in or is first needed: at start (found
 *        loaded: a C++ program's), in the agent's pthread_exit,
 *        pthread_cancel and backtrace (glibc loads it there and unwinds at
 *        once: the agent loads it first), in its dlopen and dlmopen (a
 *        library may bring it and throw through areas made earlier: loaded
 *        first; x86_64/context.S jumps to the C library's, whose caller
 *        must stay the program's), and on the control thread when it
 *        finds new modules (one the C library loaded by itself, before
 *        they get pools).
 *     4. Left uncovered, until the control thread's next look (200 ms):
 *        libgcc_s loaded by the C library on its own (__libc_dlopen: its
 *        name service modules, its internal cancellation of its helper
 *        threads), or through a dlopen of the program's own that comes
 *        before the agent's in the symbol lookup, then an unwind through
 *        an area.
 *    Its code is the program's, traced like any library's;
 *  - with the agent's private copy of libgcc's unwinder (libgcc_eh, linked
 *    in with -static-libgcc), which walks the stacks at a mid-run
 *    activation (activate.c).  Each registration is looked up at once
 *    (_Unwind_Find_FDE), so that the copy sorts it here and never in a
 *    walk, which runs in a signal handler and may not allocate.  That
 *    sorting allocates under the copy's lock, which every walk takes: a
 *    walk on a thread interrupted inside malloc would wait for the lock
 *    while the registering thread waits for malloc's.  So the two exclude
 *    each other: a registration waits until no walk is inside the copy
 *    (ag_unwind_walk_begin/end), and a walk that would begin meanwhile is
 *    skipped (the thread joins at its next traced call).
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <time.h>

#include "../agent.h"

/* libgcc's registration entry point; `ob` is its opaque `struct object`
 * (6 pointers in libgcc 12; we give it more room).  Called directly, it is
 * the private copy's. */
extern void __register_frame_info(const void *begin, void *ob);
extern const void *_Unwind_Find_FDE(void *pc, void *bases);
typedef void (*register_fn)(const void *begin, void *ob);

/* Step 2's answer: libgcc_s's own, once every kept registration is made. */
static register_fn volatile process_register;
typedef struct registration {
	const void *buf;
	void *ob;
	struct registration *next;
} registration;
static registration *regs, **regs_end = &regs;    /* step 1, in order */
static volatile int reg_lock;
/* Walks inside the private copy; registrations waiting for it or under way. */
static volatile int unwinding, registering;

bool ag_unwind_walk_begin(void)
{
	__atomic_add_fetch(&unwinding, 1, __ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&registering, __ATOMIC_SEQ_CST))
		return true;
	__atomic_sub_fetch(&unwinding, 1, __ATOMIC_SEQ_CST);
	return false;
}

void ag_unwind_walk_end(void)
{
	__atomic_sub_fetch(&unwinding, 1, __ATOMIC_SEQ_CST);
}

#define OBJ_SIZE 128

static size_t put_uleb(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	do {
		uint8_t b = v & 0x7f;
		v >>= 7;
		p[n++] = b | (v ? 0x80 : 0);
	} while (v);
	return n;
}

/* CIE: version 1, "zR", code align 1, data align -8, RA column 16, pointers
 * absolute 8-byte. */
static size_t put_cie(uint8_t *p)
{
	static const uint8_t body[] = {
		0, 0, 0, 0,             /* CIE id */
		1,                      /* version */
		'z', 'R', 'S', 0,       /* augmentation: signal frame, see above */
		1,                      /* code alignment */
		0x78,                   /* data alignment -8 (sleb) */
		16,                     /* return address column */
		1,                      /* augmentation data length */
		0x00,                   /* FDE pointers: DW_EH_PE_absptr */
	};
	uint32_t len = (uint32_t)((sizeof body + 3) & ~3u);

	memcpy(p, &len, 4);
	memset(p + 4, 0, len);          /* padding = DW_CFA_nop */
	memcpy(p + 4, body, sizeof body);
	return 4 + len;
}

static size_t put_fde(uint8_t *p, size_t cie_off, uint64_t start, uint64_t size, size_t slot)
{
	uint8_t body[64], expr[16];
	size_t n = 0, k = 0;
	uint32_t len, ptr;

	expr[k++] = 0x80; expr[k++] = 0;                  /* DW_OP_breg16 0: the pc */
	expr[k++] = 0x10;                                 /* DW_OP_constu */
	k += put_uleb(expr + k, slot - 1);
	expr[k++] = 0x20;                                 /* DW_OP_not */
	expr[k++] = 0x1a;                                 /* DW_OP_and: its slot */
	expr[k++] = 0x23;                                 /* DW_OP_plus_uconst */
	k += put_uleb(expr + k, AG_SLOT_RA);              /* the slot's S + len - 1 */
	n += 4;                                           /* CIE pointer, below */
	memcpy(body + n, &start, 8); n += 8;
	memcpy(body + n, &size, 8); n += 8;
	body[n++] = 0;                                    /* augmentation length */
	body[n++] = 0x0c; body[n++] = 7; body[n++] = 0;   /* def_cfa rsp, 0 */
	body[n++] = 0x10;                                 /* DW_CFA_expression */
	n += put_uleb(body + n, 16);                      /* rip is saved at ... */
	body[n++] = (uint8_t)k;                           /* block length */
	memcpy(body + n, expr, k); n += k;
	while ((n + 4) % 8)
		body[n++] = 0;                            /* DW_CFA_nop */
	len = (uint32_t)n;
	ptr = (uint32_t)(cie_off + 4);                    /* from the pointer field back to the CIE */
	memcpy(body, &ptr, 4);
	memcpy(p, &len, 4);
	memcpy(p + 4, body, n);
	return 4 + n;
}

/* The C library's functions behind context.S's stubs (ag_unwind_before),
 * looked up at their first call: a library's constructor may call dlopen
 * before the agent's.  The agent's own dlopen goes to the C library's too
 * (-Bsymbolic-functions would bind it to the stub). */
static void *volatile real_fn[AG_UNWIND_STUBS];
static const char *const stub_names[AG_UNWIND_STUBS] = {
	[AG_UNWIND_DLOPEN] = "dlopen", [AG_UNWIND_DLMOPEN] = "dlmopen",
	[AG_UNWIND_BACKTRACE] = "backtrace",
};

static void *real_of(int which)
{
	void *f = __atomic_load_n(&real_fn[which], __ATOMIC_ACQUIRE);

	if (!f) {
		f = dlsym(RTLD_NEXT, stub_names[which]);
		__atomic_store_n(&real_fn[which], f, __ATOMIC_RELEASE);
	}
	return f;
}

/* Stands in for a C library function that cannot be found (never, with
 * glibc 2.34 and later): no library, no frame. */
static void *none(void)
{
	return NULL;
}

/* Step 3, context.S's dlopen, dlmopen and backtrace: libgcc_s first, then
 * the C library's function, which the stub jumps to. */
void *ag_unwind_before(int which)
{
	void *f;

	if (which < 0 || which >= AG_UNWIND_STUBS)
		return (void *)(uintptr_t)none;
	ag_unwind_need(true, stub_names[which]);
	f = real_of(which);
	return f ? f : (void *)(uintptr_t)none;
}

static int gcc_s_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;

	(void)size;
	(void)arg;
	return base && strcmp(base + 1, "libgcc_s.so.1") == 0;
}

/* Step 2. */
void ag_unwind_need(bool load, const char *why)
{
	void *(*open_fn)(const char *, int);
	register_fn fn;
	unsigned n = 0;
	void *h;

	if (__atomic_load_n(&process_register, __ATOMIC_ACQUIRE))
		return;
	/* No area yet (the agent not started): nothing to register, nothing
	 * loaded for it. */
	if (load && !__atomic_load_n(&regs, __ATOMIC_ACQUIRE))
		return;
	/* Not loaded: said by the loaded objects' names -- a dlopen with
	 * RTLD_NOLOAD would still look for the file (57 us at every start). */
	if (!load && dl_iterate_phdr(gcc_s_loaded, NULL) == 0)
		return;
	open_fn = (void *(*)(const char *, int))(uintptr_t)real_of(AG_UNWIND_DLOPEN);
	h = open_fn ? open_fn("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD))
		    : NULL;
	fn = h ? (register_fn)(uintptr_t)dlsym(h, "__register_frame_info") : NULL;
	if (!fn) {
		if (load)
			ag_log("unwind: the process's unwinder (libgcc_s.so.1) cannot be loaded "
			       "(%s): %s; a C++ exception or a thread's exit through a traced call "
			       "would end the program", why, h ? "no __register_frame_info" : dlerror());
		return;
	}
	cp_plat_lock(&reg_lock);
	if (!process_register) {
		for (registration *r = regs; r; r = r->next, n++)
			fn(r->buf, r->ob);
		__atomic_store_n(&process_register, fn, __ATOMIC_RELEASE);
	}
	cp_plat_unlock(&reg_lock);
	if (n)
		ag_log("unwind: %s: the areas' unwind information (%u registrations) given to "
		       "libgcc_s.so.1", why, n);
}

bool ag_unwind_init(void)
{
	ag_unwind_need(false, "at start");
	return process_register != NULL;
}

int ag_unwind_register_slots(uint64_t first, size_t n, size_t size)
{
	size_t off = 0;
	uint8_t *buf, *ob, *own_ob;
	void *bases[3];
	struct timespec nap = { 0, 50000 };

	if (n == 0)
		return 0;
	if (first % size)
		return -1;                              /* the FDE finds slots by alignment */
	buf = ag_alloc(32 + 64 + 8);
	ob = ag_alloc(OBJ_SIZE);
	own_ob = ag_alloc(OBJ_SIZE);
	if (!buf || !ob || !own_ob)
		return -1;
	off += put_cie(buf);
	off += put_fde(buf + off, off, first, n * size, size);
	memset(buf + off, 0, 4);                          /* terminator */
	{
		registration *r = ag_alloc(sizeof *r);

		if (!r)
			return -1;
		*r = (registration){ buf, ob, NULL };
		cp_plat_lock(&reg_lock);
		*regs_end = r;
		regs_end = &r->next;
		if (process_register)
			process_register(buf, ob);
		cp_plat_unlock(&reg_lock);
	}
	__atomic_add_fetch(&registering, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&unwinding, __ATOMIC_SEQ_CST))
		nanosleep(&nap, NULL);
	__register_frame_info(buf, own_ob);
	_Unwind_Find_FDE((void *)(uintptr_t)first, bases);
	__atomic_sub_fetch(&registering, 1, __ATOMIC_SEQ_CST);
	return 0;
}
