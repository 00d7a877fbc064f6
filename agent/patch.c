/*
 * patch.c — changing the program's code while its threads run.
 *
 * x86 allows another core to execute bytes we are changing only if the
 * change is a single byte, or if every core is made to re-fetch (serialised)
 * between steps (Intel SDM vol. 3, 8.1.3, "cross-modifying code").  The
 * protocol, after Linux's text_poke_bp (arch/x86/kernel/alternative.c):
 *
 *   1. Write int3 (0xcc) over the first byte of every site in the batch.
 *      A thread that now reaches a site traps; the SIGTRAP handler finds the
 *      site in the pending table and sends the thread to where the new code
 *      would have taken it (`redirect`, the site's patch area), as if the
 *      patch were complete.
 *   2. Serialise all cores: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_
 *      SYNC_CORE), registered once at start.  No core can still hold the old
 *      first byte in its pipeline.
 *   3. Write the tail bytes (all but the first).  Nobody executes them: the
 *      first byte is int3.
 *   4. Serialise again, so the tail is visible before the head changes.
 *   5. Write the new first byte; the instruction is now complete.
 *   6. Serialise again; only now may the pending table forget the sites
 *      (a thread may have trapped on the int3 just before step 5).
 *
 * Code is written through /proc/self/mem, which the kernel allows even into
 * read-only mappings, so the program's text is never made writable.  If
 * /proc/self/mem cannot be opened, mprotect(RWX-free: RW, write, RX) is the
 * fallback, and the log says so.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/membarrier.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent.h"
#include "agent_os.h"
#include "arch.h"


#define MAX_PENDING 4096
#define MAX_APPLIED (1u << 20)

static volatile int mem_fd = -1;
static bool have_membarrier;
/*
 * membarrier's registration costs a multithreaded process about 15 ms
 * (measured attached, on this machine's kernel) and is not needed before
 * the first patch: attached, the control thread makes it after the agent is
 * dormant (ag_patch_register), and the first ag_serialize_cores waits for
 * it.  0: not made, 1: being made, 2: made (have_membarrier says how).
 */
static volatile int mb_state;
static struct sigaction old_trap;

/* Sites whose first byte is int3 while a batch is applied (step 1..6). */
static ag_patch *volatile pending;
static volatile size_t npending;
static volatile int patch_lock;

/* Every patch ever applied, so that deactivation restores every byte. */
static ag_patch *applied;
static size_t napplied;

/*
 * Sites whose int3 stays after the batch: a relocated window until every
 * thread is known to be outside it (relocate.c), and the call of a TRAP
 * plan until it gets hot (ag_traps_retire_hot).  A thread hitting one goes where the table says, as for a
 * pending site.  Entries are only ever added, under the patch lock; the
 * handler reads without it (redirect is stored before the address that
 * makes the entry visible).  An entry whose byte was restored is never
 * looked at: nothing traps there any more.
 */
#define TRAP_SLOTS 16384                /* a power of two */
#define TRAP_HOT 64                     /* hits before a call's trap goes */
static struct trap_site {
	uint64_t addr, redirect;
	uint32_t hits;
	uint8_t may_retire, retired;
} *trap_sites;
static size_t ntrap_sites;
static volatile int traps_hot;          /* some trap reached TRAP_HOT */
static uint64_t traps_retired;

/*
 * Threads being started.  The C library blocks every signal with raw
 * system calls while it starts a thread: the creator around the clone (the
 * end of pthread_create, clone3's return path), the new thread in its first
 * steps up to the start routine (start_thread: _setjmp, __sigsetjmp,
 * __ctype_init), posix_spawn's child until its exec.  The program's other
 * threads run that code too, so the agent patches it; a thread that meets a
 * batch's int3 (step 1 above) with SIGTRAP blocked is killed by the kernel.
 * The agent's pthread_create and posix_spawn (threads.c, exec.c) and every
 * writer of code keep out of each other's way:
 *
 *   1. Before calling the C library's function, the starter takes a slot in
 *      `starting` (a token: the time, odd) for itself and, for a thread,
 *      one for the new thread -- unless code is being written (`writing`):
 *      then it gives its slot back, waits for the writer to finish and tries
 *      again.  The starter stores its slot and then reads `writing`; the
 *      writer stores `writing` and then reads the slots, both sequentially
 *      consistent: at least one of the two sees the other.
 *   2. The new thread gives its slot back first thing in ag_thread_start
 *      (the C library restored its mask just before calling it); the
 *      starter gives its own back when the C library's function returns,
 *      and the new thread's too if none was made.  A token is given back
 *      only if the slot still holds it (see 4).
 *   3. A writer raises `writing` (a count: writers on several threads),
 *      then waits until no slot is taken, then writes, then lowers it.
 *      Instrumentation waits 2 ms at most and otherwise leaves the function
 *      for a later call (the writer may hold a lock, malloc's say, that a
 *      starter needs before its clone); restoring and relocated windows
 *      wait as long as 4 allows.  A starter does not wait for its own
 *      slots (its new thread does not exist before the clone, and after
 *      it the starter runs only the end of pthread_create, none of the new
 *      thread's first steps).  A thread not yet known to be past its first
 *      steps (`maybe_new`: 1 in every new thread's TLS image, cleared in
 *      ag_thread_start, in the agent's own threads and in the preloaded
 *      agent's first thread) does not instrument while a slot is taken: it
 *      might be waiting for itself.
 *   4. A slot held for a second is taken back, and agent.log says so (a
 *      thread cancelled before its start routine never reaches
 *      ag_thread_start).
 *   5. A forked child starts with no slot taken and nothing being written.
 *   6. A thread's end is a window too: after its start routine the C
 *      library blocks every signal, and a detached thread frees its
 *      descriptor (free, when the stack cache is full).  A thread whose
 *      start routine returned (ag_thread_start) or that calls pthread_exit
 *      takes a slot (as in 1) with its tid, its own from then on, and never
 *      gives it back: a writer, or a starter finding every slot taken, frees
 *      it once tgkill(tid, 0) says the thread is gone.
 *   7. Every slot taken (STARTING_SLOTS starts and ends at once): an end
 *      goes on without one at once -- the holders may be ends whose
 *      destructors wait for it -- and a start after FULL_TRIES yields; the
 *      first such says so in agent.log.
 * Not covered: threads the C library starts by itself (timer and AIO
 * helpers, popen's child), a thread started while the agent was dormant
 * that is still in its first steps when the activation patches, and the
 * end of such a thread when it returns from its start routine.
 */
#define STARTING_SLOTS 256
#define FULL_TRIES 1000                 /* step 7: a start's yields for a free slot */
#define STARTING_STALE_NS 1000000000ull
/* A start's token: the time, odd; an end's: its tid << 32 | ENDING | 1. */
#define ENDING 2u
static volatile uint64_t starting[STARTING_SLOTS];
static volatile int writing;
static __thread unsigned writing_depth __attribute__((tls_model("initial-exec")));
static __thread int own_slots[2] __attribute__((tls_model("initial-exec"))) = { -1, -1 };
static __thread uint8_t maybe_new __attribute__((tls_model("initial-exec"))) = 1;
static uint64_t start_slots_reclaimed;
static uint64_t unannounced;            /* step 7 */

/* Test knob (SPTRACE_TEST_PATCH_DELAY_MS): hold every batch's int3s that
 * long, so that a test can make threads meet them. */
static uint64_t test_delay_ns;

/* Step 6: slot i, holding t, is a thread's end and the thread is gone:
 * free it.  True if so. */
static bool reclaim_ended(int i, uint64_t t)
{
	if (!(t & ENDING) || syscall(SYS_tgkill, getpid(), (int)(t >> 32), 0) == 0 ||
	    errno != ESRCH)
		return false;
	__atomic_compare_exchange_n(&starting[i], &t, 0, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
	return true;
}

static int take_slot(uint64_t token)
{
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < STARTING_SLOTS; i++) {
			uint64_t zero = 0;

			if (__atomic_compare_exchange_n(&starting[i], &zero, token, false,
							__ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
				return i;
		}
		/* every slot taken: some may be ended threads' */
		for (int i = 0; i < STARTING_SLOTS; i++) {
			uint64_t t = __atomic_load_n(&starting[i], __ATOMIC_SEQ_CST);

			if (t)
				reclaim_ended(i, t);
		}
	}
	return -1;
}

static void give_back(ag_start_slot s)
{
	uint64_t t = s.token;

	if (s.i >= 0)
		__atomic_compare_exchange_n(&starting[s.i], &t, 0, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED);
}

/* The new thread's slot (from ag_thread_start, which calls it first), or
 * the starter's: own_slot.  Either way this thread is past its first steps. */
void ag_start_end(ag_start_slot s, bool own_slot)
{
	give_back(s);
	if (own_slot)
		own_slots[0] = own_slots[1] = -1;
	maybe_new = 0;
}

void ag_thread_known(void)
{
	maybe_new = 0;
}

static bool own(int i)
{
	return i == own_slots[0] || i == own_slots[1];
}

/* Might this thread be one being started, that a writer would wait for? */
bool ag_start_self(void)
{
	if (maybe_new)
		for (int i = 0; i < STARTING_SLOTS; i++)
			if (!own(i) && __atomic_load_n(&starting[i], __ATOMIC_SEQ_CST))
				return true;
	return false;
}

static void begin(ag_start_slot *s, int n, uint64_t end_token)
{
	unsigned tries = 0;

	for (int k = 0; k < n; k++)
		s[k] = (ag_start_slot){ -1, 0 };
	if (writing_depth)
		return;                 /* the writer itself (never the case today) */
	for (;;) {
		uint64_t token;
		int k = 0;

		while (__atomic_load_n(&writing, __ATOMIC_ACQUIRE))
			sched_yield();
		token = end_token ? end_token : (ag_mono_ns() & ~(uint64_t)ENDING) | 1;
		for (; k < n; k++) {
			s[k].token = token;
			if ((s[k].i = take_slot(token)) < 0)
				break;
		}
		if (k == n && !__atomic_load_n(&writing, __ATOMIC_SEQ_CST)) {
			for (k = 0; k < n && k < 2; k++)
				own_slots[k] = s[k].i;
			return;
		}
		bool full = k < n;

		while (k-- > 0)
			give_back(s[k]);
		/* Every slot taken (step 7): an end never waits for one (the
		 * holders may be ends waiting for it, in their destructors); a
		 * start waits a while, then goes without. */
		if (full && (end_token || ++tries > FULL_TRIES)) {
			for (k = 0; k < n; k++)
				s[k] = (ag_start_slot){ -1, 0 };
			if (__atomic_fetch_add(&unannounced, 1, __ATOMIC_RELAXED) == 0)
				ag_log("patch: %d threads were starting or ending at once: one went "
				       "unannounced (code written meanwhile could meet it with every "
				       "signal blocked)", STARTING_SLOTS);
			return;
		}
		sched_yield();          /* a writer came, or every slot is taken */
	}
}

void ag_start_begin(ag_start_slot *s, int n)
{
	begin(s, n, 0);
}

/* Step 6, on the ending thread. */
void ag_thread_ending(void)
{
	ag_start_slot s;
	int tid = (int)syscall(SYS_gettid);

	if (own_slots[0] >= 0 || tid == getpid())
		return;         /* taken already (pthread_exit, then the wrapper), or main's */
	begin(&s, 1, (uint64_t)(uint32_t)tid << 32 | ENDING | 1);
}

/* Step 3: `writing` raised and no thread being started; false (and
 * `writing` down again) if some still are after wait_ns.  Nested holds (a
 * batch inside an instrumentation) are free. */
bool ag_patch_hold(uint64_t wait_ns)
{
	uint64_t t0 = 0;

	if (writing_depth++)
		return true;
	__atomic_add_fetch(&writing, 1, __ATOMIC_SEQ_CST);
	for (;;) {
		uint64_t now = 0;
		bool busy = false;

		for (int i = 0; i < STARTING_SLOTS; i++) {
			uint64_t t = __atomic_load_n(&starting[i], __ATOMIC_SEQ_CST);

			if (!t || own(i) || reclaim_ended(i, t))
				continue;
			if (!now)
				now = ag_mono_ns();
			if (!(t & ENDING) && now > t && now - t > STARTING_STALE_NS &&
			    __atomic_compare_exchange_n(&starting[i], &t, 0, false, __ATOMIC_SEQ_CST,
							__ATOMIC_RELAXED)) {
				if (start_slots_reclaimed++ == 0)
					ag_log("patch: a thread started %lu ms ago never reached its "
					       "start routine; code is written without waiting for it",
					       (unsigned long)((now - t) / 1000000));
				continue;
			}
			busy = true;
		}
		if (!busy)
			return true;
		if (!t0)
			t0 = now;
		else if (now - t0 > wait_ns)
			break;
		sched_yield();
	}
	ag_patch_release();
	return false;
}

void ag_patch_release(void)
{
	if (--writing_depth == 0)
		__atomic_sub_fetch(&writing, 1, __ATOMIC_RELEASE);
}

/* The activation trap: a hardware breakpoint on a function entry (the code
 * stays byte-identical to the file), or an int3 there when the CPU or the
 * kernel offers no breakpoint. */
static volatile uint64_t act_addr;
static volatile uint8_t act_old;
static volatile int act_fd = -1;          /* perf breakpoint, -1: the int3 */
static volatile uint64_t act_was;         /* the perf breakpoint's address, once disarmed */
static void (*act_handler)(struct ucontext_t *uc);

static void register_membarrier(void)
{
	have_membarrier = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
				  0, 0) == 0;
	if (!have_membarrier)
		ag_log("patch: membarrier SYNC_CORE unavailable (%s); serialising with cpuid on "
		       "this core only", strerror(errno));
}

/* The registration, if nobody made it yet; returns when it is made. */
void ag_patch_register(void)
{
	int zero = 0;
	struct timespec nap = { 0, 50000 };

	if (__atomic_load_n(&mb_state, __ATOMIC_ACQUIRE) == 2)
		return;
	if (__atomic_compare_exchange_n(&mb_state, &zero, 1, false, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		register_membarrier();
		__atomic_store_n(&mb_state, 2, __ATOMIC_RELEASE);
		return;
	}
	while (__atomic_load_n(&mb_state, __ATOMIC_ACQUIRE) != 2)
		nanosleep(&nap, NULL);     /* the control thread is making it */
}

void ag_serialize_cores(void)
{
	ag_patch_register();
	if (have_membarrier)
		syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
	else
		ag_arch_sync_core();
}

int ag_write_text(uint64_t addr, const void *buf, size_t n)
{
	if (mem_fd >= 0) {
		ssize_t k = pwrite(ag_fd_checked(&mem_fd), buf, n, (off_t)addr);
		return k == (ssize_t)n ? 0 : -1;
	} else {
		uintptr_t page = addr & ~(uintptr_t)4095;
		size_t span = (addr + n - page + 4095) & ~(size_t)4095;

		if (mprotect((void *)page, span, PROT_READ | PROT_WRITE))
			return -1;
		memcpy((void *)(uintptr_t)addr, buf, n);
		return mprotect((void *)page, span, PROT_READ | PROT_EXEC);
	}
}

static size_t trap_hash(uint64_t addr)
{
	return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 50) & (TRAP_SLOTS - 1);
}

static struct trap_site *trap_site_at(uint64_t addr)
{
	for (size_t h = trap_hash(addr), k = 0; k < TRAP_SLOTS; k++, h = (h + 1) & (TRAP_SLOTS - 1)) {
		uint64_t a = __atomic_load_n(&trap_sites[h].addr, __ATOMIC_ACQUIRE);

		if (a == addr)
			return &trap_sites[h];
		if (a == 0)
			return NULL;
	}
	return NULL;
}

/* A thread hit the trap at addr: where it goes (0: not one of them).  A
 * trap on a call counts its hits; a hot one is retired by the control
 * thread (ag_traps_retire_hot): a signal per call costs microseconds. */
static uint64_t trap_site_find(uint64_t addr)
{
	struct trap_site *t = trap_site_at(addr);

	if (!t)
		return 0;
	if (t->may_retire && __atomic_add_fetch(&t->hits, 1, __ATOMIC_RELAXED) == TRAP_HOT) {
		__atomic_store_n(&traps_hot, 1, __ATOMIC_RELEASE);
		ag_control_wake();
	}
	return t->redirect;
}

/* Where an int3 of ours at pc sends the thread (a site being patched, or
 * one whose int3 stays), 0 if none is ours. */
static uint64_t our_int3(uint64_t pc)
{
	size_t n = __atomic_load_n(&npending, __ATOMIC_ACQUIRE);

	for (size_t i = 0; i < n; i++)
		if (pending[i].addr == pc)
			return pending[i].redirect;
	return trap_site_find(pc);
}

/*
 * The handler runs with SA_NODEFER (an int3 pending in C library code it
 * calls must trap again), so a queued request -- an activation's walk, a
 * windows round -- can arrive while the thread is inside it.  The context
 * such a nested signal carries is the handler's, not the program's: the
 * program stands in the outer signal's frame.  A walk from there unwound
 * through the handler and the signal frame and set return stubs by the
 * outer frame's guesses; a round would have judged the thread outside every
 * window while the outer context, resumed later, stood inside one.  So a
 * nested request is not served here: the walk is skipped (the thread joins
 * at its next traced call), the round is not answered (it asks again).
 */
static __thread int trap_depth __attribute__((tls_model("initial-exec")));

bool ag_trap_nested(void)
{
	return trap_depth > 1;
}

static void on_trap_body(int sig, siginfo_t *si, void *ctx);

static void on_trap(int sig, siginfo_t *si, void *ctx)
{
	trap_depth++;
	on_trap_body(sig, si, ctx);
	trap_depth--;
}

/*
 * SIGTRAP: a thread hit a pending site (go where the patch leads), or the
 * activation trap; anything else belongs to the program (or a debugger) and
 * goes to the handler that was there before us.
 */
static void on_trap_body(int sig, siginfo_t *si, void *ctx)
{
	ucontext_t *uc = ctx;
	uint64_t stand = ag_uc_pc(uc), pc = ag_arch_trap_at(stand);

	/* An exec breakpoint stops before the instruction (rip = the entry);
	 * an int3 after it (rip = entry + 1).  Either way the handler runs,
	 * then the entry's own instruction. */
	if (act_addr && ((act_fd >= 0 && si->si_code == TRAP_PERF && stand == act_addr) ||
			 (act_fd < 0 && (si->si_code == SI_KERNEL || si->si_code == TRAP_BRKPT) &&
			  pc == act_addr))) {
		uint64_t entry = act_addr;

		/* A thread that cannot read the TSC (tsc.c) does not activate:
		 * it passes the breakpoint, which stays for the others. */
		if (ag_tls_quiet && act_fd >= 0)
			return;
		act_handler(uc);
		ag_uc_set_pc(uc, entry);
		return;
	}
	/* The breakpoint fired on other threads too, at the same moment, and
	 * their signals come after the first one disarmed it: nothing to do
	 * but run the entry's instruction (a default SIGTRAP would kill). */
	if (si->si_code == TRAP_PERF && act_was && stand == act_was)
		return;
	/*
	 * SIGTRAP is not a real-time signal: while one is pending, another is
	 * dropped.  A thread that executes one of our int3s while the agent's
	 * queued request (or a breakpoint's signal) is pending gets only that
	 * one, and stands after the int3: first do what the int3 asked.  (No
	 * thread stands legitimately right after one of these bytes: a site's
	 * int3 covers the first byte of a longer instruction, and a window
	 * never starts with a one-byte instruction, see x86_64/sites.c.)
	 */
	if (si->si_code == SI_QUEUE || si->si_code == TRAP_PERF) {
		uint64_t to = our_int3(pc);

		if (to && *(volatile uint8_t *)(uintptr_t)pc == AG_TRAP_BYTE)
			ag_uc_set_pc(uc, to);
	}
	/* A thread asked where it stands (relocated windows). */
	if (ag_reloc_trap(si, uc))
		return;
	/* A thread asked to walk its stack (activation in mid-run). */
	if ((si->si_code == SI_QUEUE || si->si_code == TRAP_PERF) && ag_activation_trap(si, uc))
		return;
	/* Only an int3 can be one of the agent's (si_code SI_KERNEL; TRAP_BRKPT
	 * under valgrind); a SIGTRAP sent by kill/raise or a single step is not. */
	bool int3 = si->si_code == SI_KERNEL || si->si_code == TRAP_BRKPT;

	uint64_t to = int3 ? our_int3(pc) : 0;

	if (to) {
		ag_uc_set_pc(uc, to);
		return;
	}
	/* Not ours.  Our int3 may also have been removed just now by another
	 * thread (step 5/6 raced with the trap): the byte is no longer int3. */
	if (int3 && *(volatile uint8_t *)(uintptr_t)pc != AG_TRAP_BYTE) {
		ag_uc_set_pc(uc, pc);
		return;
	}
	/* The program believes SIGTRAP blocked (signals.c): one it sent itself
	 * waits for the unblock; a trap of its own code would kill it, as the
	 * kernel does with a blocked synchronous trap. */
	bool dfl = old_trap.sa_handler == SIG_DFL && !(old_trap.sa_flags & SA_SIGINFO);

	if (ag_trap_program_blocked()) {
		if (si->si_code <= 0) {
			ag_trap_hold();
			return;
		}
		dfl = true;
	}
	if (dfl) {
		/* Let the default action happen: restore it and re-raise. */
		struct sigaction sa;

		ag_log("SIGTRAP not the agent's (code %d, pc %#lx, value %#lx, from pid %d): the "
		       "default action", si->si_code, (unsigned long)pc + 1,
		       (unsigned long)(uintptr_t)si->si_value.sival_ptr, (int)si->si_pid);
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = SIG_DFL;
		ag_real_sigaction(SIGTRAP, &sa, NULL);
		raise(SIGTRAP);
	} else if (old_trap.sa_flags & SA_SIGINFO) {
		if (old_trap.sa_sigaction)
			old_trap.sa_sigaction(sig, si, ctx);
	} else if (old_trap.sa_handler != SIG_IGN) {
		old_trap.sa_handler(sig);
	}
}

int ag_patch_init(char *err, size_t errlen, bool defer_membarrier)
{
	struct sigaction sa;

	mem_fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	ag_fd_keep(&mem_fd, "/proc/self/mem", O_RDWR);
	if (mem_fd < 0)
		ag_log("patch: /proc/self/mem: %s; falling back to mprotect", strerror(errno));
	if (!defer_membarrier)
		ag_patch_register();
	if (getenv("SPTRACE_TEST_PATCH_DELAY_MS"))
		test_delay_ns = strtoull(getenv("SPTRACE_TEST_PATCH_DELAY_MS"), NULL, 10) % 1000 *
				1000000u;
	pending = ag_alloc(MAX_PENDING * sizeof *pending);
	applied = ag_alloc(MAX_APPLIED * sizeof *applied);
	trap_sites = ag_alloc(TRAP_SLOTS * sizeof *trap_sites);
	if (!pending || !applied || !trap_sites) {
		snprintf(err, errlen, "out of memory for the patch tables");
		return -1;
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_trap;
	sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (ag_real_sigaction(SIGTRAP, &sa, &old_trap)) {
		snprintf(err, errlen, "cannot install the SIGTRAP handler: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static void lock(void)
{
	while (__atomic_exchange_n(&patch_lock, 1, __ATOMIC_ACQUIRE))
		ag_arch_relax();
}

static void unlock(void)
{
	__atomic_store_n(&patch_lock, 0, __ATOMIC_RELEASE);
}

/*
 * One step of the protocol for a whole batch, with as few writes as
 * possible: sites close together are written as one span, the bytes
 * between them copied from memory unchanged.  Writing a byte with its own
 * value is no change to the code another core may be running; and only
 * this thread writes code (the patch lock), so the copy is current.
 *
 * Each write through /proc/self/mem costs about 1.6 us whatever its length
 * (the system call, a bounce page, a page lookup per page; bench/WARMUP.md:
 * 16 % of a traced cc1's CPU time), so a span goes on to the next site if
 * that site starts on the same page as the span's end or on the page after:
 * every page a span covers then holds a site of the step, and a page with
 * none (a page of the file the process still shares, its text unchanged)
 * is never written, so never copied on write.  The activation trap's int3
 * byte (its fallback without a breakpoint) is not ours to rewrite: no span
 * crosses it.
 */
enum step { STEP_HEAD_INT3, STEP_TAIL, STEP_HEAD };

#define SPAN_MAX 16384
#define PAGE_OF(a) ((a) >> 12)

/* By address; a heap sort: no allocation (qsort may call malloc, and this
 * can run in a signal handler or inside malloc). */
static void sift(ag_patch **a, size_t root, size_t n)
{
	for (size_t child; (child = 2 * root + 1) < n; root = child) {
		if (child + 1 < n && a[child + 1]->addr > a[child]->addr)
			child++;
		if (a[root]->addr >= a[child]->addr)
			return;
		ag_patch *t = a[root];
		a[root] = a[child];
		a[child] = t;
	}
}

static void sort_by_addr(ag_patch **a, size_t n)
{
	size_t k = 1;

	/* A batch usually comes in address order already (a function's sites,
	 * functions laid out in the order they are reached): O(n) then. */
	while (k < n && a[k - 1]->addr <= a[k]->addr)
		k++;
	if (k >= n)
		return;
	for (size_t i = n / 2; i-- > 0;)
		sift(a, i, n);
	for (size_t end = n; end-- > 1;) {
		ag_patch *t = a[0];
		a[0] = a[end];
		a[end] = t;
		sift(a, 0, end);
	}
}

static void step_bytes(const ag_patch *q, enum step st, uint8_t *buf, uint64_t lo)
{
	uint8_t *at = buf + (q->addr - lo);

	if (st == STEP_HEAD_INT3)
		at[0] = AG_TRAP_BYTE;
	else if (st == STEP_TAIL)
		memcpy(at + 1, q->new + 1, q->len - 1u);
	else
		at[0] = q->new[0];
}

static int write_step(ag_patch **order, size_t n, enum step st)
{
	static uint8_t buf[SPAN_MAX];       /* under the patch lock */
	uint64_t act = act_fd < 0 ? act_addr : 0;

	for (size_t i = 0; i < n;) {
		uint64_t lo = order[i]->addr, hi = lo + order[i]->len;
		size_t j = i + 1;

		while (j < n && PAGE_OF(order[j]->addr) <= PAGE_OF(hi - 1) + 1 &&
		       order[j]->addr + order[j]->len - lo <= SPAN_MAX &&
		       !(act && act >= hi && act < order[j]->addr)) {
			if (order[j]->addr + order[j]->len > hi)
				hi = order[j]->addr + order[j]->len;
			j++;
		}
		if (st == STEP_TAIL && j == i + 1 && order[i]->len <= 1) {
			i = j;
			continue;
		}
		memcpy(buf, (const void *)(uintptr_t)lo, hi - lo);
		for (size_t k = i; k < j; k++)
			step_bytes(order[k], st, buf, lo);
		if (ag_write_text(lo, buf, hi - lo))
			return -1;
		i = j;
	}
	return 0;
}

/* One batch of at most MAX_PENDING patches (the pending table's size). */
static int apply_batch(ag_patch *p, size_t n)
{
	static ag_patch *order[MAX_PENDING];     /* under the patch lock */
	static const uint8_t int3 = AG_TRAP_BYTE;
	bool held;
	int rc = 0;

	if (n == 0)
		return 0;
	if (napplied + n > MAX_APPLIED)
		return -1;
	held = ag_patch_hold(2 * STARTING_STALE_NS);
	lock();
	memcpy((void *)pending, p, n * sizeof *p);
	__atomic_store_n(&npending, n, __ATOMIC_RELEASE);
	for (size_t i = 0; i < n; i++)
		order[i] = &p[i];
	sort_by_addr(order, n);
	rc = write_step(order, n, STEP_HEAD_INT3);                  /* 1 */
	if (test_delay_ns) {
		struct timespec d = { 0, (long)test_delay_ns };

		nanosleep(&d, NULL);
	}
	ag_serialize_cores();                                       /* 2 */
	if (!rc)
		rc = write_step(order, n, STEP_TAIL);               /* 3 */
	ag_serialize_cores();                                       /* 4 */
	if (!rc)
		rc = write_step(order, n, STEP_HEAD);               /* 5 */
	ag_serialize_cores();                                       /* 6 */
	if (rc) {
		/* Put back whatever was changed: the old bytes, head last. */
		for (size_t i = 0; i < n; i++)
			ag_write_text(p[i].addr, &int3, 1);
		ag_serialize_cores();
		for (size_t i = 0; i < n; i++)
			ag_write_text(p[i].addr + 1, p[i].old + 1, p[i].len - 1u);
		ag_serialize_cores();
		for (size_t i = 0; i < n; i++)
			ag_write_text(p[i].addr, p[i].old, 1);
		ag_serialize_cores();
		ag_log("patch: writing code failed: %s; batch of %zu sites undone", strerror(errno), n);
	} else {
		memcpy(applied + napplied, p, n * sizeof *p);
		napplied += n;
	}
	__atomic_store_n(&npending, 0, __ATOMIC_RELEASE);
	unlock();
	if (held)
		ag_patch_release();
	return rc;
}

/* Any number of patches: batches of MAX_PENDING, in order, until one fails. */
int ag_patch_apply(ag_patch *p, size_t n)
{
	int rc = 0;

	for (size_t i = 0; i < n && rc == 0; i += MAX_PENDING)
		rc = apply_batch(p + i, n - i < MAX_PENDING ? n - i : MAX_PENDING);
	return rc;
}

bool ag_trap_site_retired(uint64_t addr)
{
	struct trap_site *t = trap_site_at(addr);

	return t && t->retired;
}

/*
 * The control thread, instrument lock held: put back the original byte of
 * every trap on a call that reached TRAP_HOT hits and forget its patch;
 * the call goes on untraced (and stays so after a new activation).
 */
void ag_traps_retire_hot(void)
{
	static uint64_t addrs[1024];
	size_t n = 0;

	if (!__atomic_exchange_n(&traps_hot, 0, __ATOMIC_ACQ_REL))
		return;
	for (size_t h = 0; h < TRAP_SLOTS && n < sizeof addrs / sizeof *addrs; h++)
		if (trap_sites[h].addr && trap_sites[h].may_retire && !trap_sites[h].retired &&
		    __atomic_load_n(&trap_sites[h].hits, __ATOMIC_RELAXED) >= TRAP_HOT) {
			trap_sites[h].retired = 1;
			addrs[n++] = trap_sites[h].addr;
		}
	if (n && ag_patch_revert(addrs, n) == 0) {
		traps_retired += n;
		ag_log("patch: %zu trap(s) on calls hit %d times put back: those calls go on "
		       "untraced (%lu so far)", n, TRAP_HOT, (unsigned long)traps_retired);
	}
}

uint64_t ag_traps_retired(void)
{
	return traps_retired;
}

int ag_trap_site_add(uint64_t addr, uint64_t redirect, bool may_retire)
{
	size_t h = trap_hash(addr);
	int rc = 0;

	lock();
	if (ntrap_sites >= TRAP_SLOTS / 2) {
		rc = -1;                        /* keep probes short */
	} else {
		while (trap_sites[h].addr && trap_sites[h].addr != addr)
			h = (h + 1) & (TRAP_SLOTS - 1);
		if (!trap_sites[h].addr)
			ntrap_sites++;
		trap_sites[h].redirect = redirect;
		trap_sites[h].may_retire = may_retire;
		__atomic_store_n(&trap_sites[h].addr, addr, __ATOMIC_RELEASE);
	}
	unlock();
	return rc;
}

/*
 * Turn applied patches into the patches that undo them: the same protocol
 * with old and new swapped; a thread that traps on the int3 of a site
 * being restored continues at the original code -- but at a springboard,
 * whose original bytes are padding (a thread there took the site's jump
 * just before the site's int3), at the area the springboard jumped to
 * (areas stay: pool.c); sent back to the padding, it ran it once restored
 * (run-cycles: SIGSEGV at a board in the padding after f0, 3 runs in 7).
 * Last applied, first undone: a relocated window has two patches at one address, its int3 and
 * later its jump (relocate.c); the jump's undo restores all five bytes,
 * and must not come in a batch after the int3's, which puts back the first
 * byte only (the others would still be the jump's, in between: not an
 * instruction).
 */
static void make_undo(ag_patch *p, size_t n)
{
	for (size_t i = 0; i < n / 2; i++) {
		ag_patch t = p[i];

		p[i] = p[n - 1 - i];
		p[n - 1 - i] = t;
	}
	for (size_t i = 0; i < n; i++) {
		uint8_t tmp[16];

		memcpy(tmp, p[i].new, sizeof tmp);
		memcpy(p[i].new, p[i].old, sizeof tmp);
		memcpy(p[i].old, tmp, sizeof tmp);
		if (!p[i].board)
			p[i].redirect = p[i].addr;
	}
}

/* Ascending; a heap sort (no allocation, as for sort_by_addr). */
static void sort_u64(uint64_t *a, size_t n)
{
	for (size_t i = n / 2, end = n; end > 1;) {
		size_t root;

		if (i > 0) {
			root = --i;
		} else {
			uint64_t t = a[0];

			a[0] = a[--end];
			a[end] = t;
			root = 0;
		}
		for (size_t child; (child = 2 * root + 1) < end; root = child) {
			if (child + 1 < end && a[child + 1] > a[child])
				child++;
			if (a[root] >= a[child])
				break;
			uint64_t t = a[root];

			a[root] = a[child];
			a[child] = t;
		}
	}
}

/* Is x among the n sorted addresses? */
static bool among(const uint64_t *sorted, size_t n, uint64_t x)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (sorted[mid] == x)
			return true;
		if (sorted[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/*
 * Put back the original bytes of every patch applied at these addresses
 * (sorted here, in place) and forget them, as if they had never been
 * applied: relocated windows whose jumps cannot be written (relocate.c),
 * hot traps (ag_traps_retire_hot).  The instrument lock is held, so nothing
 * else applies meanwhile.
 */
int ag_patch_revert(uint64_t *addrs, size_t n)
{
	static ag_patch undo[MAX_PENDING];      /* under the instrument lock */
	const uint64_t *sorted = addrs;
	size_t k = 0, kept = 0;
	int rc = 0;

	if (n == 0)
		return 0;
	sort_u64(addrs, n);
	lock();
	for (size_t i = 0; i < napplied; i++) {
		if (among(sorted, n, applied[i].addr) && k < MAX_PENDING)
			undo[k++] = applied[i];
		else
			applied[kept++] = applied[i];
	}
	napplied = kept;
	unlock();
	make_undo(undo, k);
	for (size_t i = 0; i < k; i++) {
		/* One at a time: two patches at one address in a batch would
		 * write their first bytes in no set order. */
		if (ag_patch_apply(&undo[i], 1) == 0) {
			lock();
			napplied--;         /* apply() recorded the undo: forget it */
			unlock();
		} else {
			rc = -1;
		}
	}
	return rc;
}

int ag_patch_restore_all(void)
{
	int rc;
	ag_patch *undo;
	size_t n;

	lock();
	n = napplied;
	/* A copy (apply() appends to `applied`), unmapped after: a stop may
	 * come a thousand times, ag_alloc never gives memory back. */
	undo = n ? mmap(NULL, n * sizeof *undo, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
	if (undo == MAP_FAILED)
		undo = NULL;
	if (undo)
		memcpy(undo, applied, n * sizeof *undo);
	napplied = 0;
	unlock();
	if (n && !undo)
		return -1;
	make_undo(undo, n);
	rc = ag_patch_apply(undo, n);
	if (undo)
		munmap(undo, n * sizeof *undo);
	lock();
	napplied = 0;       /* the restore batches were recorded as applied: forget them */
	unlock();
	return rc;
}

/*
 * Arm a one-shot trap at a function entry; `handler` runs in the trapping
 * thread's signal context (it disarms the trap first).  A hardware execute
 * breakpoint (perf_event_open, sigtrap, inherited by threads created later)
 * leaves every byte of code alone while the agent is dormant; without one
 * the entry's first byte becomes int3.
 */
/* Attached: the breakpoint on each thread there was (each one's inherited
 * by the threads it creates later). */
#define MAX_THREAD_BPS 4096
static volatile int thread_bps[MAX_THREAD_BPS];
static int nthread_bps;

/* An execute breakpoint at addr for thread tid (0: the calling thread) that
 * raises SIGTRAP in it (Linux >= 5.13); `inherit`: threads it creates get
 * one too; `disabled`: armed later with PERF_EVENT_IOC_ENABLE.  -1 if the
 * CPU or the kernel has none. */
int ag_perf_breakpoint(uint64_t addr, int tid, bool inherit, bool disabled)
{
	struct perf_event_attr a;

	memset(&a, 0, sizeof a);
	a.type = PERF_TYPE_BREAKPOINT;
	a.size = sizeof a;
	a.bp_type = HW_BREAKPOINT_X;
	a.bp_addr = addr;
	a.bp_len = sizeof(long);
	a.sample_period = 1;
	a.sigtrap = 1;
	a.remove_on_exec = 1;
	a.inherit = inherit;
	a.disabled = disabled;
	a.exclude_kernel = 1;
	a.exclude_hv = 1;
	return (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

static int arm_on_thread(int tid, void *arg)
{
	int f = ag_perf_breakpoint(*(uint64_t *)arg, tid, true, false);

	if (f >= 0) {
		thread_bps[nthread_bps] = f;
		ag_fd_keep(&thread_bps[nthread_bps++], NULL, 0);
	}
	else
		ag_log("activation: no breakpoint on thread %d (%s); it will not activate tracing",
		       tid, strerror(errno));
	return nthread_bps >= MAX_THREAD_BPS;
}

int ag_trap_arm(uint64_t addr, void (*handler)(struct ucontext_t *uc), bool every_thread)
{
	static const uint8_t int3 = AG_TRAP_BYTE;
	uint8_t old;
	int fd;

	act_handler = handler;
	fd = ag_perf_breakpoint(addr, 0, true, false);
	if (fd >= 0 && every_thread)
		ag_for_other_threads(arm_on_thread, &addr);
	if (fd >= 0) {
		act_fd = fd;
		ag_fd_keep(&act_fd, NULL, 0);
		act_addr = addr;
		return 0;
	}
	ag_log("activation: no hardware breakpoint (%s); using an int3 at %#lx",
	       strerror(errno), (unsigned long)addr);
	memcpy(&old, (void *)(uintptr_t)addr, 1);
	act_old = old;
	act_addr = addr;
	if (ag_write_text(addr, &int3, 1))
		return -1;
	ag_serialize_cores();
	return 0;
}

/* Remove the activation trap (its handler calls this first). */
void ag_trap_disarm(void)
{
	uint8_t old = act_old;

	if (!act_addr)
		return;
	for (int i = 0; i < nthread_bps; i++) {
		ioctl(thread_bps[i], PERF_EVENT_IOC_DISABLE, 0);
		ag_fd_drop(thread_bps[i]);
	}
	nthread_bps = 0;
	if (act_fd >= 0) {
		act_was = act_addr;
		ioctl(act_fd, PERF_EVENT_IOC_DISABLE, 0);
		ag_fd_drop(act_fd);
		act_fd = -1;
	} else {
		ag_write_text(act_addr, &old, 1);
		ag_serialize_cores();
	}
	act_addr = 0;
}

/* In a forked child: /proc/self/mem opened by the parent still means the
 * parent's memory.  Reopen it (and register membarrier for the new mm). */
void ag_patch_after_fork(void)
{
	if (mem_fd >= 0) {
		ag_fd_drop(mem_fd);
		mem_fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
		ag_fd_keep(&mem_fd, "/proc/self/mem", O_RDWR);
	}
	/* the child's mm is new: registered at its first need (a registration
	 * the parent's control thread was making is not the child's) */
	mb_state = 0;
	have_membarrier = false;
	patch_lock = 0;
	npending = 0;
	memset((void *)starting, 0, sizeof starting);     /* 5 */
	writing = 0;
	writing_depth = 0;
	own_slots[0] = own_slots[1] = -1;
}

/*
 * The program installs or asks for a SIGTRAP handler (signals.c): the
 * agent's stays in the kernel and passes on what is not its own to the
 * program's, which is only recorded here.
 */
int ag_trap_chain(const struct sigaction *act, struct sigaction *old)
{
	struct sigaction prev = old_trap;

	if (act)
		old_trap = *act;
	if (old)
		*old = prev;
	return 0;
}
