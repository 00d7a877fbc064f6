/*
 * agent.h — the injected agent's private interface (libsptrace-agent.so).
 *
 * The agent is dormant until its activation event.  Then it propagates: when
 * a function F is first reached, instrument(F) patches every call site of F
 * so that a call goes through a per-site patch area (record entry, make sure
 * the callee is instrumented, call it, record exit, jump back).  Tracing thus
 * moves ahead of the flow of control, one function at a time.
 *
 *   main.c        configuration, activation, slow paths, the end of the trace
 *   modules.c     loaded modules and their code analysis (the repository)
 *   core/         the propagation core, freestanding: which sites of F are
 *                 patched and how, the look-ahead, site ids, indirect-call
 *                 caches (core.h: its platform interface)
 *   instrument.c  the core's user-space platform: patch areas for F's
 *                 sites, the sites file, glibc policy, join directives
 *   patch.c       live code patching (int3-first protocol), SIGTRAP, the
 *                 activation trap (hardware breakpoint)
 *   pool.c        executable memory within +-2 GiB of a module
 *   ring.c        per-thread trace rings in shared files
 *   threads.c     threads started after activation; coroutines and
 *                 context switches; fork
 *   signals.c     signal handlers traced from their start
 *   tsc.c         threads that cannot read the TSC (PR_SET_TSC, strict
 *                 seccomp): they go quiet
 *   budget.c      the overhead budget: hot, short callees counted, not timed
 *   activate.c    activation in mid-run: stack walks, return stubs
 *   control.c     sptrace stop/activate, the timer; modules dlopen'd later
 *   creds.c       the control thread's capabilities follow the program's
 *   exec.c        the agent carried into an exec'd image
 *   hooks.c       the interposers' table; GOT hooks when attached
 *   fds.c         the agent's descriptors, out of the program's reach
 *   msgs.c        message events: sends and receives on sockets and pipes
 *   propagate.c   a traced send followed to its receivers through spdaemon
 *   arch.h        what the portable files ask of the processor: the thread
 *                 pointer, raw system calls, the cycle counter, a signal
 *                 context's registers, the trap byte (x86_64/arch.h)
 *   x86_64/       the instruction-level parts: area code and return stubs
 *                 (emit.c), the sites' jumps, traps and decoding (sites.c),
 *                 trampolines (tramp.S), unwind information (unwind.c),
 *                 the context-switch stubs (context.S), arch.h, what the
 *                 trampolines need to know of the CPU (cpu.c)
 *
 * Nothing on the hot path allocates or makes a system call; the slow paths
 * (first call of a function, a thread's first record) may run in a signal
 * handler or with the application's locks held, so they use only mmap-based
 * memory and async-signal-safe system calls, never malloc or stdio.
 *
 * THE RULE: the program never notices the agent.  What the agent needs and
 * the program could meet, and where each is kept out of its sight:
 *
 *  1. Descriptors: high numbers, closes and dups of them answered as for a
 *     number never opened, every write checked (fds.c).
 *  2. Signals: the agent's SIGTRAP is never really blocked, never seen by
 *     the program's handlers, masks, signalfd or sigwait (signals.c, and the
 *     injector for threads that blocked it before an attach).
 *  3. Threads: one control thread, which takes none of the program's
 *     signals (control.c) and holds the capabilities the program's thread
 *     holds, so glibc's process-wide setuid finds it agree (creds.c); no
 *     other.
 *  4. Child processes: none -- no analysis with a child process inside the
 *     program (modules.c: source lines are read outside).
 *  5. Return addresses: a runtime that walks its stacks by them (Go, V8)
 *     has its code left alone (modules.c, instrument.c); areas carry unwind
 *     information for everyone else (x86_64/unwind.c).
 *  6. Libraries: none is shared with the program but the C library and
 *     the loader -- the agent's own are linked in, their symbols hidden
 *     (agent/meson.build) -- so every library the program loads is traced;
 *     one that cannot be (no analysis, no pool within reach) is said
 *     (modules.c).  The process's unwinder, libgcc_s, is loaded for the
 *     areas' unwind information, and traced as the program's.
 *  7. Files: the trace directory only; a program that cannot have a ring
 *     records nothing, said once (ring.c).
 *  8. Debuggers and what forbids the agent's clock (PR_SET_TSC, strict
 *     seccomp): the agent stands aside in that process or thread.
 *
 * Whatever cannot be done safely is skipped and reported in agent.log and
 * in the command's summary (meta's "untraced", "runtime" and "changed"
 * lines), never attempted.  Every function the agent interposes is in
 * hooks.c's table.
 *
 * The declarations that name the C library's signal and thread types
 * (siginfo_t, pthread_t) are in agent_os.h, so that this header brings in
 * neither <signal.h> nor <pthread.h>.
 */
#ifndef AGENT_H
#define AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "codeanalysis.h"
#include "core/core.h"
#include "trace_format.h"

#define AG_EXPORT __attribute__((visibility("default")))
#define AG_HIDDEN __attribute__((visibility("hidden")))

/* ---- main.c: memory that never goes through malloc ---- */
void *ag_alloc(size_t n);          /* zeroed, never freed; NULL when out of memory */

/* ---- main.c: logging to the trace directory's agent.log (async-signal-safe) ---- */
void ag_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the trace's files (main.c): made with the trace's mode, 0600 or,
 * in a directory shared with a group (sptrace --group), 0640; never
 * through a link.  open(2)'s flags (O_CREAT and O_CLOEXEC added); the fd. */
int ag_trace_open(const char *path, int flags);

/* ---- spare.c: sptrace run's stock of ready-made files, directories and
 * FIFOs (the protocol is explained there) ---- */
enum { AG_SPARE_FILE, AG_SPARE_DIR, AG_SPARE_FIFO };
struct stat;
void ag_spare_init(const char *dir);    /* SPTRACE_SPARE, before the first file */
void ag_spare_log_start(void);          /* why the stock is not used, once the log is open */
void ag_spare_log_end(void);            /* how many were taken and created */
const char *ag_spare_dir(void);         /* SPTRACE_SPARE for an exec'd image, or NULL */
/* A spare renamed onto path: 1; path exists already: 0; none (create path): -1. */
int ag_spare_take(int kind, const char *path);
/* After a take: is what path now holds (st: its fstat) a spare of that kind?
 * If not, it is removed, said in agent.log, and false: create path. */
bool ag_spare_check(int kind, const struct stat *st, const char *path);
/* ag_spare_take, then ag_spare_check on what path holds (lstat): for a
 * directory or a FIFO, which the caller does not open first. */
int ag_spare_take_node(int kind, const char *path);
void ag_spare_made(void);               /* one made by the agent itself */

/* ---- modules.c ---- */
typedef struct ag_module {
	uint32_t index;          /* "module" line in meta */
	char path[4096];
	uint64_t bias;           /* run-time address = link-time address + bias */
	uint64_t text_lo, text_hi; /* run-time range of its executable segments */
	ca_module *ca;           /* functions and sites (read only once loaded; NULL
	                          * until then when deferred, see modules.c) */
	char key[160];           /* its build-id (or content hash) */
	uint8_t *func_state;     /* one byte per function: AG_FUNC_* */
	struct ag_pool *pool;    /* patch areas for this module's sites */
	/* A function's .cold/.part fragments (its code, placed elsewhere): the
	 * first, then each one's next; CA_NONE ends.  NULL when unknown. */
	uint32_t *first_fragment, *next_fragment;
	void **site_saved;       /* per site: its patch, kept across activations
	                          * (instrument.c's site_saved; core.h: cp_view.saved) */
	volatile bool no_pool;   /* no room for areas near it: not traced, said once */
	/* Sites left alone because their bytes are not those the analysis saw
	 * (instrument.c), and how many of them meta has been told about. */
	uint64_t sites_changed, sites_changed_said;
	/* The functions earlier runs reached (lookahead.c); NULL: none, the
	 * whole look-ahead.  Set once, as the entry comes in. */
	struct ca_profile *profile;
} ag_module;

enum {
	AG_FUNC_INSTRUMENTED = CP_FUNC_INSTRUMENTED,
};

extern char ag_repo_dir[4096];               /* "" : the default repository */
extern char ag_prepared_dir[4096];           /* "" : none (modules.c) */
/* defer: register the modules only; their entries come with ag_modules_load. */
int ag_modules_init(char *err, size_t errlen, bool defer);
/* The calls images checked whole before (SPTRACE_IMAGES), before the first;
 * and the list for an exec'd image's environment (false: none, or too long). */
void ag_modules_images_init(const char *env);
bool ag_modules_images_env(char *out, size_t len);
void ag_modules_load(void);                  /* read deferred entries (waits for a reader) */
bool ag_modules_loaded(void);
void ag_modules_after_fork(void);
void ag_modules_fork_lock(void);     /* fork handlers: no loader walk across a fork */
void ag_modules_fork_unlock(void);
bool ag_module_ready(ag_module *m);          /* pool and function states exist */
/* lookahead.c: SPTRACE_LOOKAHEAD ("all": no profiles); map module m's
 * look-ahead profile and say in agent.log whether it has one. */
void ag_lookahead_init(const char *how);
bool ag_lookahead_whole(void);
void ag_lookahead_profile(ag_module *m);
void ag_modules_refresh(void);               /* look for dlopen'd modules (control thread) */
void ag_modules_register_late(void);         /* at exit: name the ones not seen yet in meta */
ag_module *ag_module_of(uint64_t addr);      /* module whose code holds addr */
bool ag_agent_code_holds(uint64_t addr);     /* addr is in the agent's own code */
/* addr is in code a language runtime manages (never patched or stubbed) */
bool ag_runtime_code(uint64_t addr);
/* addr is in some loaded object's code or the agent's pools: not a JIT's */
bool ag_code_known(uint64_t addr);
uint32_t ag_module_count(void);
ag_module *ag_module_at(uint32_t index);
void ag_modules_untraced_meta(void);        /* meta lines for the modules not traced */

/* ---- ring.c ---- */
/* The TLS slot the generated code reads: the ring header of this thread, or
 * NULL until the thread's first record. */
extern __thread trace_ring_header *ag_tls_ring __attribute__((tls_model("initial-exec")));
trace_ring_header *ag_ring_create(void);   /* for the calling thread */
void ag_ring_put(trace_ring_header *r, unsigned kind, uint32_t id); /* from C */
/* The same with a given time, for records of a fresh ring only (a ring's
 * records must not go back in time). */
void ag_ring_put_at(trace_ring_header *r, unsigned kind, uint32_t id, uint64_t tsc);

void ag_ring_sync(trace_ring_header *r, uint64_t tsc); /* SYNC record + epoch */
void ag_ring_put_key(trace_ring_header *r, uint32_t event, uint64_t key); /* CTX_* events */
/* Two payload records (events ev1 and ev2) taken at once: a COUNT pair. */
void ag_ring_put_pair(trace_ring_header *r, uint32_t ev1, uint64_t key1, uint32_t ev2,
		      uint64_t key2);
/* A message event: its head and data records, in one piece (trace_format.h). */
void ag_ring_put_msg(trace_ring_header *r, uint32_t event, const uint64_t data[TRACE_MSG_NDATA],
		     uint64_t tsc);
void ag_rings_close_all(void);
void ag_rings_event_all(uint32_t event);   /* an event in every ring */
int ag_rings_init(void);
void ag_forked_child(void);                /* atfork: drop the parent's rings */
/* Ring size in bytes (SPTRACE_RING_BYTES); outside 8 KiB..64 GiB: logged,
 * the default kept. */
void ag_ring_set_size(uint64_t bytes);
/* SPTRACE_RECORDS=all: every record kept, the window moving over a growing
 * file (trace_format.h, "Rings and chunks"); else rings. */
void ag_ring_keep_all(bool on);
bool ag_ring_keeps_all(void);
/* Record index c reached r's limit: move the window (the owner thread;
 * raw system calls only).  Whether c's slot is mapped to its place. */
bool ag_ring_rotate(trace_ring_header *r, uint64_t c);
/* ... with the thread not marked busy, a signal handler then traced? */
bool ag_ring_moves_alone(const trace_ring_header *r);

/* ---- pool.c ---- */
typedef struct ag_pool ag_pool;
/* Code reachable from [lo, hi): `slots` areas and `data` bytes of data.
 * `reused`: slots are written again after use (return stubs), so a fork
 * copies the pool; else a forked child shares the slots in use (pool.c). */
/* A pool near [lo, hi): room for `small` and `big` areas (agent.h), `data`
 * bytes of data; reused: its slots are written again (return stubs). */
ag_pool *ag_pool_near(uint64_t lo, uint64_t hi, size_t small, size_t big, size_t data,
		      bool reused);
/* Room for `n` bytes of code: *rx is where it runs, *rw where it is written. */
/* A slot for an area of n bytes of code (small if it fits, else big): its
 * start in *rx and *rw (the words; the code at + AG_SLOT_WORDS). */
bool ag_pool_code(ag_pool *p, size_t n, uint8_t **rx, uint8_t **rw);
bool ag_pool_writing(ag_pool *p);   /* a reused pool's slot is written next (fork) */
uint64_t ag_pool_slot_of(uint64_t addr);       /* the slot addr lies in, 0: none */
uint8_t *ag_pool_data(ag_pool *p, size_t n);   /* zeroed, rip-reachable from the code */
uint64_t ag_pool_stubs(ag_pool *p);            /* its table of AG_STUBS stub addresses */
bool ag_pool_holds(uint64_t addr);             /* addr is in some pool's code */
void ag_pools_snapshot(void);       /* fork: copy the reused pools (instrument lock held) */
void ag_pools_snapshot_done(void);  /* ... the parent afterwards */
void ag_pools_after_fork(void);     /* ... the child maps the copies */
void ag_pools_keep_maps(bool on);   /* the start: one read of /proc/self/maps */

/* ---- patch.c ---- */
/* One patch: where, the old and new bytes, where a thread hitting the
 * pending int3 goes (core.h). */
typedef cp_patch ag_patch;

/* defer_membarrier: the control thread registers (ag_patch_register) */
int ag_patch_init(char *err, size_t errlen, bool defer_membarrier);
void ag_patch_register(void);          /* membarrier, if not yet: before the first patch */
/* Apply patches with the int3-first protocol (see the comment in patch.c),
 * in batches of the pending table's size. */
int ag_patch_apply(ag_patch *p, size_t n);
/* Undo and forget the patches at these addresses (sorted in place). */
int ag_patch_revert(uint64_t *addrs, size_t n);
/* Restore the original bytes of every patch ever applied. */
int ag_patch_restore_all(void);
/* Threads being started with every signal blocked (the protocol in
 * patch.c): a slot each while the C library runs them so, and the writers'
 * side.  ag_patch_hold: false if some thread was still being started after
 * wait_ns; each true hold is ended by ag_patch_release. */
typedef struct ag_start_slot {
	int i;
	uint64_t token;
} ag_start_slot;
void ag_start_begin(ag_start_slot *s, int n);   /* s[0]: the caller's own */
void ag_start_end(ag_start_slot s, bool own_slot);
void ag_thread_known(void);            /* this thread is past its first steps */
void ag_thread_ending(void);           /* its start routine returned, or pthread_exit */
bool ag_start_self(void);              /* it may be one being started now */
bool ag_patch_hold(uint64_t wait_ns);
void ag_patch_release(void);
/* A site whose int3 stays: a thread hitting it goes to `redirect`;
 * may_retire: a call's trap, put back once hot (ag_traps_retire_hot). */
int ag_trap_site_add(uint64_t addr, uint64_t redirect, bool may_retire);
bool ag_trap_site_retired(uint64_t addr);
void ag_traps_retire_hot(void);        /* the control thread, instrument lock held */
uint64_t ag_traps_retired(void);
/* Write bytes to code we own (pool) or the app's text through /proc/self/mem. */
int ag_write_text(uint64_t addr, const void *buf, size_t n);
void ag_serialize_cores(void);
/* A one-shot int3 at a function entry; `handler` runs in the trapping
 * thread's signal context and must call ag_trap_disarm() first. */
struct ucontext_t;
int ag_perf_breakpoint(uint64_t addr, int tid, bool inherit, bool disabled);
/* every_thread: on each thread now running too (an attached agent; a
 * preloaded one starts with one thread, whose breakpoint new threads inherit) */
int ag_trap_arm(uint64_t addr, void (*handler)(struct ucontext_t *uc), bool every_thread);
void ag_trap_disarm(void);
struct sigaction;
int ag_trap_chain(const struct sigaction *act, struct sigaction *old); /* the program's SIGTRAP */
void ag_patch_after_fork(void);
bool ag_trap_nested(void);                  /* patch.c: a SIGTRAP inside the agent's SIGTRAP handler */

/* ---- activate.c: activation in the middle of a run ---- */
int ag_activate_init(void);            /* return-stub pool (at start) */
/* Every other thread walks its stack (new_round: a new activation). */
void ag_activate_running(bool new_round);
void ag_activation_round(void);        /* a new activation */
/* The calling thread walks now (an event); from the interrupted context of
 * a SIGTRAP handler if uc is not NULL. */
void ag_walk_self(struct ucontext_t *uc);
/* Attached: threads already in accept/recv get a breakpoint at its return;
 * `stopped`, the thread the injector stopped (0: none), by what the
 * injector said: the call it goes back into (stopped_nr, -1: none) and the
 * address that call returns to. */
void ag_watch_blocked_calls(const char *event, int stopped, long stopped_nr,
			    uint64_t stopped_pc);
void ag_activate_quiesce(void);        /* at a stop: walks finished, breakpoints out */
uint64_t ag_retpoint(uint64_t slot) AG_HIDDEN;   /* a return stub ran */

/* ---- relocate.c: relocated windows, trap first, jump later ---- */
typedef struct ag_reloc {
	uint64_t start, end;     /* the window: [start, site end) */
	uint64_t copy;           /* its copy in the area (same layout) */
	ag_patch jump;           /* the 5-byte jmp at start, old = the original bytes */
} ag_reloc;
void ag_reloc_queue(ag_reloc *r);      /* its int3 is in: upgrade later (instrument lock held) */
void ag_reloc_forget(void);            /* a stop (instrument lock held) */
bool ag_reloc_gave_up(void);           /* a round failed: windows are not used */
void ag_reloc_upgrade(void);           /* control thread: now and then, after ag_control_wake */
void ag_reloc_stats(uint64_t *queued, uint64_t *upgraded);

/* ---- signals.c ---- */
void ag_signals_init(void);            /* the C library's mask functions */
void ag_signals_fatal_init(void);      /* record fatal signals (default actions) */
void ag_signals_stay_out(void);        /* a debugged process: pass every call on */
bool ag_trap_program_blocked(void);    /* this thread's program believes SIGTRAP blocked */
void ag_trap_hold(void);               /* raise SIGTRAP again when it unblocks it */
uint8_t ag_trap_view_get(void);        /* threads.c: the creator's belief ... */
void ag_trap_view_set(uint8_t blocked); /* ... is the new thread's */
void ag_signals_attached(const char *trapblocked); /* main.c: threads that blocked SIGTRAP before the attach */
int ag_real_sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/* ---- instrument.c: the core's platform (core/core.h) ---- */
int ag_instrument(ag_module *m, uint32_t func);   /* patch F's sites; 0 ok */
int ag_instrument_root(ag_module *m, uint32_t func); /* a thread's start routine */
/* The same, F first reached from a call in `caller` (of module cm): the
 * caller's other callees are likely next and join the batch. */
int ag_instrument_from(ag_module *m, uint32_t func, ag_module *cm, uint32_t caller);
int ag_instrument_stop(void);      /* deactivation: restore all, forget states */
void ag_instrument_restart(void);  /* before a new activation */
void ag_instrument_lock(void);     /* hold off every change of code and areas (fork) */
void ag_instrument_after_fork(void); /* the child: locks the parent's threads held */
/* Functions forked children reached, instrumented in the parent before its
 * next fork (instrument.c's protocol): the page at start, the hints at fork. */
void ag_instrument_hints_init(void);
void ag_instrument_hints_apply(void);
void ag_instrument_unlock(void);
void ag_instrument_stats(uint64_t *sites, uint64_t *skipped_kind, uint64_t *skipped_plan,
			 uint64_t *skipped_unresolved, uint64_t *tail_internal);
uint32_t ag_site_root(ag_module *m, uint32_t func); /* site id for a root entry */
/* Join directives (trace_format.h, "Values"): the values of FUNC:entry:argN
 * and FUNC:exit:ret are recorded at direct call sites of FUNC; FUNC:scope
 * is only kept for meta.  -1 with err for a malformed one or too many. */
#define AG_JOIN_MAX 16
int ag_join_add(const char *directive, char *err, size_t errlen);
size_t ag_join_count(void);
const char *ag_join_get(size_t i);
const char *ag_join_env(void);     /* all of them, one a line (exec.c: SPTRACE_JOIN) */
uint32_t ag_instrument_runtime_entries(void); /* activation: what a runtime calls (cgo) */
/* Sites left alone: they call runtime code; *indirect: indirect calls that
 * met a new such target (and went untraced). */
uint64_t ag_instrument_skipped_runtime(uint64_t *indirect);
uint64_t ag_instrument_deferred(void);  /* put off: threads being started (patch.c) */
int ag_sites_open(const char *dir);

/* ---- tsc.c: threads that cannot read the TSC ---- */
enum { AG_QUIET_TSC = 1,       /* rdtsc faults (PR_SET_TSC): records nothing */
       AG_QUIET_STRICT = 2 };  /* ... and no system call either (strict seccomp) */
/* This thread's: 0, or how quiet it must be. */
extern __thread uint8_t ag_tls_quiet __attribute__((tls_model("initial-exec")));
uint64_t ag_rdtsc(void);               /* the TSC; another clock for a quiet thread */
uint64_t ag_tsc_fallback(void);
void ag_tsc_calibrated(uint64_t hz, uint64_t tsc0, uint64_t mono0); /* main.c */
uint64_t ag_tsc_hz(void);       /* as calibrated, 0 before */
bool ag_tsc_usable(int tid);           /* before a ring: may go quiet (a system call) */
bool ag_quiet_tid(int tid);            /* a thread known quiet (the activation skips it) */

/* ---- budget.c: the overhead budget (SPTRACE_BUDGET) ---- */
#define AG_BUDGET_LONG_NS 1000     /* a call this long is always timed */
/* The tracer's estimated cost of a record (in a ring; with every record
 * kept), and of a counted call (bench/BUDGET.md). */
#define AG_BUDGET_REC_NS_RING 8
#define AG_BUDGET_REC_NS_KEEP 14
#define AG_BUDGET_COUNT_NS 1
#define AG_BUDGET_SITES (1u << 19) /* site ids the budget can count */
/* The thread's counters of counted calls, indexed by site id, which the
 * areas use: NULL when it has none, and while agent code runs on it. */
extern __thread uint64_t *ag_tls_counts __attribute__((tls_model("initial-exec")));
/* Counted calls until the thread's next sample (wraps: 1 in 256 timed). */
extern __thread uint8_t ag_tls_tick __attribute__((tls_model("initial-exec")));
void ag_budget_init(const char *percent);  /* SPTRACE_BUDGET or attach's budget= */
unsigned ag_budget_percent(void);          /* 0: no budget */
void ag_budget_clock(uint64_t tsc_hz);     /* once calibrated */
int64_t ag_tls_counts_offset(void);
int64_t ag_tls_tick_offset(void);
/* The mode byte of site id's budget area (in its pool), or NULL: a plain
 * area; tail: a direct tail jump (ENTRY only, closed by its caller's EXIT). */
uint8_t *ag_budget_site(struct ag_pool *pool, uint32_t id, bool tail);
/* An id that an indirect call records from now on. */
void ag_budget_indirect_id(uint32_t id, bool tail);
void ag_budget_thread(trace_ring_header *r);   /* a new ring: the thread's counters */
uint64_t *ag_budget_counts(void);          /* the thread's counters (NULL: none) */
/* The thread's records [from, to) of r: demote, promote, write its counts. */
void ag_budget_scan(trace_ring_header *r, uint64_t from, uint64_t to);
void ag_budget_thread_end(trace_ring_header *r);
void ag_budget_end(void);                  /* the end of the trace: every count out */
void ag_budget_forked_child(void);
void ag_budget_reset(void);                /* a deactivation: every site timed */

/* ---- x86_64/emit.c: the per-site patch area ---- */
/* What the instrument slow path needs to know about a callee. */
typedef struct ag_callee {
	uint32_t module, func;   /* instrument this function ... */
	uint8_t *flag;           /* ... then set this byte (NULL: the function's own state) */
	uint32_t caller_module, caller; /* the function making the call (look-ahead) */
} ag_callee;

typedef struct ag_area_spec {
	uint64_t site;           /* run-time address of the call */
	uint8_t site_len;
	uint64_t callee;         /* run-time entry of the callee */
	uint64_t slot;           /* non-zero: call through this GOT slot (PLT, -fno-plt) */
	uint32_t site_id;
	uint8_t *callee_flag;    /* byte the area tests: non-zero once the callee is instrumented */
	uint64_t stubs;          /* the pool's table of stub addresses (ag_pool_stubs) */
	bool cond;               /* tail jump: conditional (jcc) */
	bool tail_jump;          /* indirect: `jmp *OP` in tail position, ENTRY only */
	uint8_t cond_code;       /* its condition (low nibble of 0f 8x) */
	bool fix_return;         /* tail jump to a caller-sensitive function (instrument.c) */
	/* indirect calls */
	uint8_t load[16];        /* `mov OP,%r11` re-encoded from the call */
	uint8_t load_len;
	uint8_t load_rip_at;     /* non-zero: offset of a rip-relative disp32 in load */
	uint64_t load_rip_target;/* ... which must point here */
	uint64_t cache;          /* the site's cache: target, entry word, exit word */
	uint8_t prefix[16];      /* a relocated window: instructions run before the call */
	uint8_t prefix_len;
	/* join directives (ag_emit_call only): record a value record */
	uint8_t value_arg;       /* after the ENTRY: argument 1..6; 0 none */
	bool value_ret;          /* before the EXIT: the return value (rax) */
	/* budget areas (ag_emit_call_budget) */
	uint8_t *budget_mode;    /* the site's mode byte: TRACE_BUDGET_* */
	bool budget_indirect;    /* indirect: counted through tramp.S's ag_budget_stub */
	int64_t tls_counts_offset; /* %fs offset of ag_tls_counts */
	int64_t tls_tick_offset; /* %fs offset of ag_tls_tick */
} ag_area_spec;

size_t ag_emit_call(const ag_area_spec *s, uint8_t *rw, uint64_t rx);
/* A call area that times or counts the call, as its mode byte says (budget.c). */
size_t ag_emit_call_budget(const ag_area_spec *s, uint8_t *rw, uint64_t rx);
size_t ag_emit_tail(const ag_area_spec *s, uint8_t *rw, uint64_t rx);
size_t ag_emit_indirect(const ag_area_spec *s, uint8_t *rw, uint64_t rx);
size_t ag_emit_call_noexit(const ag_area_spec *s, uint8_t *rw, uint64_t rx, uint64_t ret_word);
/* A return stub (activate.c) in the slot at rx (its code after the slot's
 * words), which jumps to tramp; a frame given the stub returns to
 * rx + AG_STUB_RETURN. */
void ag_emit_return_stub(uint8_t *rw, uint64_t rx, uint64_t tramp);
#define AG_STUB_RETURN (AG_SLOT_WORDS + 1)

/* ---- what the areas use besides their code: indirect sites' caches
 * (core/core.h) and their miss (instrument.c), ag_tls_target (main.c),
 * the slots' layout ---- */
/* An indirect site's cache (pool data, rip-reachable from its area), and
 * what the indirect slow path needs about the site (its mod: the caller's
 * ag_module): core.h, whose cp_indirect_miss fills the cache. */
typedef cp_indirect_cache ag_indirect_cache;
typedef cp_indirect_site ag_indirect_site;

extern __thread uint64_t ag_tls_target __attribute__((tls_model("initial-exec")));
/* A call through an indirect site to a target its cache lacks (instrument.c,
 * through core.c's cp_indirect_miss). */
uint64_t ag_indirect_miss(ag_indirect_site *is, uint64_t target);
/* Area slots: two sizes, each in a region of the pool aligned to it (so an
 * address in an area finds its slot by masking, pool.c), five words first,
 * then the code.  A plain call's area fits a small slot; an indirect call's
 * or one with a budget or a value needs a big one.  (tramp.S has its own
 * copies of the sizes and of AG_SLOT_REF.) */
#define AG_SLOT_SMALL 128
#define AG_SLOT_BIG 256
#define AG_SLOT_RA 0                     /* S+len-1: the unwinder's return address */
#define AG_SLOT_MAGIC 8                  /* AG_SLOT_MAGIC_VALUE: this is a call area */
#define AG_SLOT_RET 16                   /* S+len: the caller's real return address */
#define AG_SLOT_SITE 24                  /* the site id its exit records (0: varies) */
#define AG_SLOT_REF 32                   /* the ag_callee or ag_indirect_site of its stubs */
#define AG_SLOT_WORDS 40                 /* the code starts here */
#define AG_SLOT_CODE(size) ((size) - AG_SLOT_WORDS)  /* room for code */
/* Where an area is emitted first, to be checked against the room of its
 * slot (no area comes near it: the largest, an indirect call's with a
 * budget and a 16-byte window, is 178 bytes). */
#define AG_AREA_SCRATCH 1024
#define AG_SLOT_MAGIC_VALUE 0x5350545241524541ull /* "AERARTPS" */

/* ---- x86_64/sites.c: encoding and decoding at the sites themselves ---- */
uint64_t ag_x86_plt_slot(uint64_t stub);       /* the GOT slot a PLT stub jumps through */
/* `call/jmp *OP` at `at` as `mov OP,%r11` into spec->load*; false: not that form */
bool ag_x86_load_of_call(const uint8_t *c, size_t len, uint64_t at, bool jump,
			 ag_area_spec *spec);
/* buf's rel32 at `at`, moved from address `from` to `to`; false: out of reach */
bool ag_x86_reaim_rel32(uint8_t *buf, size_t at, uint64_t from, uint64_t to);
bool ag_x86_one_byte_insn(uint8_t b);          /* a window may not start with one */
bool ag_x86_outermost_frame(const uint8_t *code, uint64_t size); /* [endbr64] xor %ebp,%ebp */
/* A tail jump's form (rel8 with a springboard, else rel32; *cond: a jcc) */
bool ag_x86_tail_jump(const uint8_t *code, bool springboard, bool *cond, uint8_t *cc);
/* The site's jump to rx (board non-zero: through a springboard, *sb): 0, 1, -1 */
int ag_x86_site_patch(uint64_t site, uint8_t len, uint64_t board, uint64_t rx, ag_patch *p,
		      ag_patch *sb);
/* An int3 at `at` redirected to rx; jump: a relocated window's later jmp */
bool ag_x86_trap_patch(uint64_t at, uint64_t rx, ag_patch *p, ag_patch *jump);
/* a slot's words (rw: its start); ref: the ag_callee or ag_indirect_site */
void ag_x86_slot_words(uint8_t *rw, uint64_t ret, uint32_t site, const void *ref);

/* ---- x86_64/unwind.c: unwind info that makes areas transparent ---- */
/* Find the process's unwinder (libgcc_s) if loaded, before the first pool;
 * false: not loaded (yet). */
bool ag_unwind_init(void);
/* The areas' unwind information given to libgcc_s once it is there, found
 * (or loaded, if `load` and there are areas) now; `why` says where, in
 * agent.log. */
void ag_unwind_need(bool load, const char *why);
/* context.S's stubs: dlopen, dlmopen, backtrace.  libgcc_s first, then the
 * C library's function, returned for the stub to jump to. */
enum { AG_UNWIND_DLOPEN, AG_UNWIND_DLMOPEN, AG_UNWIND_BACKTRACE, AG_UNWIND_STUBS };
void *ag_unwind_before(int which);
/* Around a walk with the agent's private unwinder (activate.c); false: not
 * now, unwind information is being registered (the walk is skipped). */
bool ag_unwind_walk_begin(void);
void ag_unwind_walk_end(void);
/* Unwind information for `n` area slots of `size` bytes from `first`
 * (aligned to `size`); each slot's first 8 bytes hold S + len - 1 for
 * its call (written with the area).  -1: none (out of memory, misaligned). */
int ag_unwind_register_slots(uint64_t first, size_t n, size_t size);

/* ---- x86_64/tramp.S ---- */
extern char ag_tramp_slow[];      /* save all state, ag_slow(op, arg), restore */
extern char ag_tramp_return[];    /* root function's return: exit record */
extern char ag_tramp_retpoint[];  /* a return stub's common part (activate.c) */
extern char ag_tramp_end[];       /* after the three (ag_tramp_slow comes first) */
/* The stubs the areas call (emit.c), through a table in each pool's data
 * (ag_pool_stubs), in this order. */
enum { AG_STUB_ENTRY, AG_STUB_EXIT, AG_STUB_VALUE, AG_STUB_INSTRUMENT, AG_STUB_INDIRECT,
       AG_STUB_BUDGET, AG_STUBS };
extern char ag_record_entry[], ag_record_exit[], ag_record_value[];
extern char ag_instrument_stub[], ag_indirect_stub[], ag_budget_stub[];
extern char ag_records_end[];     /* after ag_record_entry and ag_record_exit, which read the TSC */
extern uint8_t *ag_budget_modes;   /* budget.c's mode table of indirect ids (NULL: none) */

/* ---- x86_64/context.S: getcontext, setcontext, swapcontext ---- */
enum { AG_CTX_GET = 0, AG_CTX_SET = 1, AG_CTX_SWAP = 2 };

/* ---- the slow-path requests (tramp.S hands them to main.c's ag_slow) ---- */
/* AG_SLOW_ROTATE carries the record's index in the request's low 56 bits;
 * its answer: store the record (1) or not (0). */
enum { AG_SLOW_RING = 1, AG_SLOW_INSTRUMENT = 2, AG_SLOW_SYNC = 3, AG_SLOW_INDIRECT = 4,
       AG_SLOW_ROTATE = 5 };

/* ---- control.c ---- */
int ag_control_start(void);            /* FIFO, control thread (its start overlaps ours) */
void ag_control_ready(void);           /* wait for its start, then let it go on */
void ag_control_abandon(void);         /* the start failed: it ends, FIFO and link go */
void ag_control_stop(void);
int ag_control_tid(void);              /* the control thread's id, 0 before it runs */
bool ag_control_serving(void);         /* it runs in this process: creds.c mirrors to it */
void ag_control_wake(void);            /* the control thread looks at relocated windows soon */
void ag_control_wake_to_populate(void); /* ... faults in rings' next chunks (raw calls only) */
void ag_rings_populate(void);          /* control thread: ring.c, point 4 */
void ag_rings_populate_log(void);      /* its figures, at the end (agent.log) */

/* ---- creds.c: the control thread holds the program thread's capabilities ---- */
void ag_creds_serve(void);             /* control thread: make the posted call on itself */
extern uint64_t ag_real_syscall;       /* the C library's syscall(), for x86_64/context.S */
/* context.S's syscall() jumps to these: SYS_capset and SYS_prctl; any
 * call before the C library's syscall() is known */
long ag_syscall_creds(long nr, long a, long b, long c, long d, long e, long f);
long ag_syscall_raw(long nr, long a, long b, long c, long d, long e, long f);
struct __user_cap_header_struct;
struct __user_cap_data_struct;
int capset(struct __user_cap_header_struct *head, struct __user_cap_data_struct *data) AG_EXPORT;

/* ---- main.c ---- */
void ag_deactivate(const char *why);   /* restore all code; dormant again */
void ag_activate_now(const char *why); /* mid-run activation (timer, sptrace activate) */
extern uint64_t ag_activation_tsc;     /* when it happened */
extern char ag_dir[4096];              /* the trace directory */
double ag_timer_seconds(void);         /* --on timer S: S, else < 0 */
const char *ag_on_event(void);         /* the activation event, as given */
/* meta: "exec SUB PID PATH" (pid: the image's process, this one or a child) */
void ag_note_exec(const char *sub, const char *path, pid_t pid);
void ag_note_exec_failed(const char *sub);
void ag_meta_module(const ag_module *m);     /* its "module" line in meta */
void ag_meta_untraced(const char *name, const char *why); /* main.c: an "untraced" line */
void ag_meta_runtimes(const ag_module *m);   /* its "runtime" lines (main.c), once loaded */
void ag_meta_changed(void);  /* "changed" lines for sites left alone since the last (main.c) */
/* Agent code running on an application thread brackets itself with these:
 * meanwhile the thread's TLS ring is NULL, so traced code the agent calls
 * (libc) records nothing, and nested slow paths answer "skip" (in
 * ag_tramp_slow, before it saves anything: ag_tls_busy).  ag_enter
 * returns the thread's ring (NULL if none yet); ag_leave installs one. */
extern __thread int ag_tls_busy __attribute__((tls_model("initial-exec")));
trace_ring_header *ag_enter(void);
void ag_leave(trace_ring_header *ring);
bool ag_active(void);                      /* activated and not stopped */
bool ag_busy(void);                        /* agent code runs on this thread */
void ag_note_fatal(int sig, int code, uint64_t addr, uint64_t pc, uint64_t sp); /* main.c: a "fatal" line in meta */
uint64_t ag_slow(uint64_t request) AG_HIDDEN;   /* the answer goes back in r11 */
uint64_t ag_root_return(void) AG_HIDDEN;
bool ag_event_wanted(const char *what);   /* the agent waits for this event */
/* main.c; uc: the SIGTRAP context when the event was caught by a breakpoint */
void ag_activate_on_event(const char *what, int fd, struct ucontext_t *uc);
void ag_meta_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* main.c */
/* CLOCK_MONOTONIC through the system call: the vDSO reads the TSC, which
 * some threads cannot (tsc.c); async-signal-safe. */
uint64_t ag_mono_ns(void);

/* ---- events.c: activation by what a thread does (accept, recv; the
 * interposers are msgs.c's) ---- */
bool ag_may_trace(void);                  /* --threads event: this thread may record */
bool ag_may_trace_get(void);              /* ... as it was set for this thread */
void ag_may_trace_set(bool yes);
void ag_event_only(bool yes);             /* only threads set so may record */
/* msgs.c's interposers returned; data: the rc bytes received, or NULL */
void ag_event_after(const char *what, long rc, int fd, const void *data);
bool ag_event_fires(const char *what, int fd, long rc, const void *data);   /* events.c */

/* ---- hooks.c ---- */
void ag_hooks_install(void);           /* attached: GOT slots to the interposers */
void ag_hooks_init(bool attached);     /* find the C library's functions behind them */
uint64_t ag_hook_real(uint64_t addr);  /* ... the one behind the interposer at addr, or 0 */

/* ---- propagate.c: following a traced send to its receivers (the
 * protocol: propagate.c) ---- */
enum { AG_FLOW_TCP = 1, AG_FLOW_UDP, AG_FLOW_PIPE, AG_FLOW_UNIX, AG_FLOW_UNIXFROM,
       AG_FLOW_UNIXDGRAM };
#define AG_FLOW_HASH0 0xcbf29ce484222325ull   /* FNV-1a's offset basis */
typedef struct ag_flow_chan {
	int kind;                      /* AG_FLOW_* */
	int family;                    /* AF_INET, AF_INET6 */
	uint8_t local[16], peer[16];   /* network order */
	uint16_t lport, pport;
	uint64_t inode;                /* a pipe's; a UNIX socket's peer's (0: not
	                                * accepted yet, then: ) */
	uint64_t src_inode;            /* UNIX: the sending socket's */
	char path[108];                /* UNIX: the listener's path ('@': abstract) */
	bool at_offset;                /* offset is known */
	uint32_t mark_seq;             /* UDP: the IP option's sequence number
	                                * (ag_propagate_ask sets it) */
	uint64_t offset;               /* TCP: the stream's absolute offset of the send's
	                                * first byte; UDP, UNIX datagrams: the datagram's
	                                * content hash; a pipe, a UNIX stream: the writers'
	                                * count of it (ag_propagate_ask may set it: point 16) */
	volatile uint64_t *sent;       /* a pipe, a UNIX stream: the count its traced writers
	                                * share, or NULL (ag_propagate_ask sets it: point 16) */
} ag_flow_chan;
uint64_t ag_flow_hash(const void *data, size_t n, uint64_t h);   /* FNV-1a, from h (propagate.c) */
void ag_propagate_init(const char *session, const char *wait_ms, const char *mark);
const char *ag_propagate_session(void);   /* NULL: no session */
const char *ag_propagate_wait(void);      /* milliseconds, as text */
const char *ag_propagate_mark(void);      /* "offset" or "oob": how TCP sends are marked */
bool ag_propagating(void);
/* Before the send; waits.  AG_MARK_OOB: the receivers await the urgent
 * byte, send it now (ag_mark_send); AG_MARK_IPOPT: they await the IP option
 * ch->mark_seq, put it on the datagram (ag_mark_udp); else 0, or -1. */
int ag_propagate_ask(ag_flow_chan *ch);
/* The count the traced writers of pipe `inode` (kind AG_FLOW_PIPE), or of
 * the UNIX stream from socket `inode` (AG_FLOW_UNIX: the sending one's),
 * share (propagate.c, points 17 and 18), mapped by this process or the one
 * that forked it; NULL: none yet. */
volatile uint64_t *ag_pipe_sent(int kind, uint64_t inode);
enum { AG_MARK_OOB = 1, AG_MARK_IPOPT = 2 };
int ag_mark_send(int fd);                 /* the urgent byte, before a traced send: 0 or -1 */
void ag_mark_udp(int fd, uint32_t seq);   /* the IP option on fd until its next send ends */
extern volatile int ag_udp_marking;       /* some thread's send carries it: */
void ag_mark_udp_sent(int fd);            /* ... after each send: taken off fd */
struct msghdr;
extern volatile int ag_recvopts_on;       /* the agent asked IP_RECVOPTS of some socket: */
void ag_mark_strip(int fd, struct msghdr *m);   /* ... its options out of a program's recvmsg */
void ag_mark_program_oob(void);           /* msgs.c: the program itself used MSG_OOB */
void ag_expect_before(int fd);            /* msgs.c: before a receive, while a mark is awaited */
int ag_expect_add(const char *line);      /* "tcp SRC SPORT DST DPORT OFFSET|- [oob]" */
bool ag_expecting(void);                  /* some awaited receive is still awaited */
bool ag_expect_mode(void);                /* only awaited receives start tracing */
bool ag_expect_match(int fd, long rc, const void *data); /* the awaited receive? (uses it up) */
void ag_came_from_fd(int fd);             /* tracing began at a receive on fd */

/* ---- fds.c: the agent's own descriptors (the rules: fds.c) ---- */
void ag_fds_init(void);                /* the C library's close, dup2, ... */
/* Protect the agent's descriptor *where: moved to a high number, registered;
 * *where follows it when it moves.  `path` and `flags` reopen it if a raw
 * system call took it (path NULL: it cannot be; path must stay valid). */
int ag_fd_keep(volatile int *where, const char *path, int flags);
/* *where, checked to be still the agent's file (else reopened, or -1):
 * before every write through it. */
int ag_fd_checked(volatile int *where);
void ag_fd_drop(int fd);               /* the agent closes one of its own */
bool ag_fd_is_ours(int fd);            /* one of the agent's (no system call) */
bool ag_fd_still_ours(int fd);         /* ... and still its file (one raw fstat) */
void ag_fds_fork_lock(void);           /* fork handlers: the table whole in the child */
void ag_fds_fork_unlock(void);
/* The interposers of fcntl by both its names, whatever _FILE_OFFSET_BITS
 * makes of `fcntl` in the C library's headers. */
int ag_fcntl(int fd, int cmd, ...) __asm__("fcntl") AG_EXPORT;
int ag_fcntl64(int fd, int cmd, ...) __asm__("fcntl64") AG_EXPORT;

/* ---- msgs.c: message events (trace_format.h) ---- */
void ag_msgs_init(void);               /* the C library's send, recv, ... */
int ag_channels_open(const char *dir); /* the channels file */
void ag_msgs_forget(int fd);           /* fd's number no longer names its channel */
void ag_msgs_forget_range(unsigned lo, unsigned hi);
void ag_msgs_forked(void);             /* the child: channels of its own */
/* The bytes this process has received from pipe or UNIX stream `inode`, as
 * its count names them (the writer's offsets once lined up): false if it
 * has received none (msgs.c). */
bool ag_msgs_recv_count(uint64_t inode, uint64_t *count);
/* The next byte received on fd (a pipe or UNIX stream) is the sender's byte
 * `off` (propagate.c: an awaited receive lines the two ends up); with
 * `shared`, every receive's first byte is base + what *shared counted
 * (the readers of one pipe share it). */
void ag_msgs_recv_at(int fd, uint64_t off, volatile uint64_t *shared, uint64_t base);
void ag_msgs_preopen(void);            /* its netlink socket, while the program waits */
void ag_msgs_preopen_undo(void);       /* a start that failed: it goes */
/* sendfile by both its names, whatever _FILE_OFFSET_BITS makes of it */
ssize_t ag_sendfile(int out, int in, off_t *off, size_t n) __asm__("sendfile") AG_EXPORT;
ssize_t ag_sendfile64(int out, int in, off_t *off, size_t n) __asm__("sendfile64") AG_EXPORT;
void ag_msgs_received(int fd, long nr, long rc);   /* msgs.c: a receive no interposer saw */
bool ag_fd_is_socket(int fd);             /* msgs.c: one fstat, errno kept */
uint64_t ag_unix_peer(uint64_t inode);    /* msgs.c: a UNIX socket's peer's inode, 0 unknown */
/* msgs.c: where a TCP socket's received stream stands now (the next byte
 * the program reads, as an absolute offset); 0, or -1 when unknown. */
int ag_tcp_received(int fd, uint64_t *end);
/* msgs.c: fd's received offset is `end` after a receive of rc bytes (a mark
 * the program never saw came before them): its channel's count follows. */
void ag_msgs_resync(int fd, uint64_t end, long rc);

/* ---- exec.c ---- */
void ag_exec_resolve(void);             /* the C library's exec and spawn, when loaded */
void ag_exec_init(const char *ring_bytes);

/* ---- threads.c: the program's threads (their start, where each stands) ---- */
int ag_threads_init(void);                 /* atfork handler */
extern pid_t ag_self_pid;                  /* getpid(); a vfork child sees its parent's */
/* fn(tid) for every thread but this one and the control thread, until it
 * returns non-zero; how many it was called for. */
int ag_for_other_threads(int (*fn)(int tid, void *arg), void *arg);
void ag_threads_preopen(void);             /* their /proc files, opened now (control.c) */
void ag_threads_preopen_undo(void);        /* a start that failed: they go */
/* Where thread tid stands: 1 blocked in the kernel (*nr: its system call
 * or -1; *pc: where it returns to), 0 running, -1 gone (threads.c). */
int ag_thread_where(int tid, long *nr, uint64_t *pc);
bool ag_queue_sigtrap(int tid, const void *magic); /* an agent request (SI_QUEUE) */
/* threads.c: record the switch; returns the C library's function to go on to */
uint64_t ag_context_note(unsigned which, const void *a, const void *b) AG_HIDDEN;

#endif
