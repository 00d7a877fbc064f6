/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * sptrace_kagent.h — the interface between the kernel module (kagent/) and
 * user space (cli/kernel.c): the ioctls of /dev/sptrace and the layout of
 * the per-CPU rings it maps.  One source of truth: both sides include this
 * file; it uses only <linux/types.h> and <linux/ioctl.h>.
 *
 * /dev/sptrace is opened by one process at a time (EBUSY otherwise).  The
 * opener, in this order:
 *   1. SPK_IOC_INFO: the version, the number of rings (one per possible
 *      CPU) and their size;
 *   2. SPK_IOC_PROBE: the kernel functions to record (entry addresses as
 *      /proc/kallsyms shows them); each gets a function index, the
 *      position of its address in the module's table, used by records;
 *   3. SPK_IOC_SCOPE_ADD: a process (thread group) to trace; the processes
 *      it forks join the scope, and each leaves it when it exits;
 *   4. mmap of the rings, read-only: ring c at offset c * SPK_RING_BYTES;
 *   5. close: the scope is emptied and every hook and kprobe removed (the
 *      kernel's text is as it was before step 2).  Unloading the module
 *      does the same.
 * Calls through function pointers (kagent/indirect.c has the protocol):
 * SPK_IOC_SITES names indirect call instructions and the register that
 * holds their target; when a traced thread passes one towards a function
 * not hooked yet, the target is kept, and SPK_IOC_TARGETS hands the kept
 * ones over, so that the opener hooks them (SPK_IOC_PROBE, while the
 * program runs): later calls of theirs are recorded.
 * Independently of 2-4, the opener may wait for a key chord (`--on key`,
 * kagent/keys.c has the protocol): SPK_IOC_KEY_CHORD names it; the device
 * then polls readable once it was pressed, and read() of a __u64 returns
 * the presses since the previous read (and zeroes them), blocking while
 * there is none unless O_NONBLOCK (EAGAIN).  Close unregisters it.
 */
#ifndef SPTRACE_KAGENT_H
#define SPTRACE_KAGENT_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define SPK_DEVICE "/dev/sptrace"
#define SPK_VERSION 3
#define SPK_RING_MAGIC 0x31474e49524b5053ull  /* "SPKRING1" little-endian */
#define SPK_RING_HEADER 4096
#define SPK_RING_RECS (1u << 18)               /* 4 MiB of records per CPU */
#define SPK_RING_BYTES (SPK_RING_HEADER + SPK_RING_RECS * 16u) /* header included */
#define SPK_MAX_PROBES 4096                    /* functions per opener */
#define SPK_SCOPE_MAX 64                       /* traced thread groups at once */
#define SPK_MAX_SITES 4096                     /* indirect calls watched per opener */
#define SPK_MAX_TARGETS 256                    /* targets kept for SPK_IOC_TARGETS */

/* A ring: this header, then SPK_RING_RECS records (a power of two).  The
 * writer is the CPU's own kernel code, one at a time (task context,
 * preemption off); it fills slot count % SPK_RING_RECS, then publishes
 * count + 1 (release).  A full ring overwrites its oldest records: a
 * reader that finds count - its position > SPK_RING_RECS lost the
 * difference. */
struct spk_ring_header {
	__u64 magic;            /* SPK_RING_MAGIC */
	__u32 version;          /* SPK_VERSION */
	__u32 cpu;
	__u64 capacity;         /* SPK_RING_RECS */
	__u64 count;            /* records ever written (volatile: read it once) */
};

/* One record: a traced thread entered (or left, SPK_EXIT) function `func`. */
struct spk_rec {
	__u64 tsc;              /* rdtsc: the clock the user-space agent uses */
	__u32 tid;              /* the thread (its pid in the initial namespace) */
	__u32 func;             /* function index | SPK_EXIT */
};
#define SPK_EXIT 0x80000000u

struct spk_info {
	__u32 version;          /* SPK_VERSION */
	__u32 nrings;           /* nr_cpu_ids */
	__u32 ring_bytes;       /* SPK_RING_BYTES */
	__u32 nprobes;          /* functions registered by this opener */
	__u32 nscope;           /* thread groups in the scope */
	__u32 reserved;
	__u64 hits;             /* entries recorded */
	__u64 missed_depth;     /* traced calls not recorded: the thread's shadow
				 * stack (or the table of them) was full */
	__u64 missed_nested;    /* traced calls made while the module's own code
				 * ran on that thread (not recorded) */
	__u64 patched;          /* functions hooked now, all openers (0 after close) */
	/* The propagation core (agent/core/core.c, kagent/core_plat.c), since
	 * the module was loaded: */
	__u64 core_misses;      /* indirect calls whose site's cache lacked the target */
	__u64 core_reached;     /* of them, targets the core had kept for hooking */
	__u64 core_ids;         /* (site, callee) ids it handed out */
	__u64 core_pairs;       /* of them, in its shared table (beyond a site's eight) */
};

/* SPK_IOC_PROBE: hook each of n entry addresses (through ftrace: see
 * kagent/probes.c); again while threads are traced adds more.
 * result[i]: the function index (>= 0; the same for an address hooked
 * before) or a negative errno (ENOENT: ftrace cannot hook it -- no
 * __fentry__ call there; ENOSPC: SPK_MAX_PROBES reached). */
struct spk_probe_req {
	__u64 addrs;            /* user pointer to n __u64 */
	__u64 result;           /* user pointer to n __s32 */
	__u32 n;
	__u32 reserved;
};

/* SPK_IOC_KEY_CHORD: count key-downs of `code` (a Linux input key code,
 * KEY_* of <linux/input-event-codes.h>) while exactly the modifiers of
 * `mods` are held, left or right alike.  Again: replaces the chord and
 * zeroes the count.  EINVAL: code 0 or above KEY_MAX (0x2ff), mods empty
 * or with unknown bits. */
#define SPK_MOD_CTRL  0x1u
#define SPK_MOD_ALT   0x2u
#define SPK_MOD_SHIFT 0x4u
#define SPK_MOD_SUPER 0x8u      /* the Windows / Meta key */
/* The modifier keys (KEY_*) and the SPK_MOD_* each holds down, left and
 * right: an initializer of { code, mod } pairs, for the module's notifier
 * (kagent/keys.c) and the evdev backend's tracker (cli/keychord.c). */
#define SPK_MOD_KEYS \
	{ KEY_LEFTCTRL, SPK_MOD_CTRL },   { KEY_RIGHTCTRL, SPK_MOD_CTRL }, \
	{ KEY_LEFTALT, SPK_MOD_ALT },     { KEY_RIGHTALT, SPK_MOD_ALT }, \
	{ KEY_LEFTSHIFT, SPK_MOD_SHIFT }, { KEY_RIGHTSHIFT, SPK_MOD_SHIFT }, \
	{ KEY_LEFTMETA, SPK_MOD_SUPER },  { KEY_RIGHTMETA, SPK_MOD_SUPER }
struct spk_key_chord {
	__u32 code;
	__u32 mods;             /* SPK_MOD_* */
};

/* SPK_IOC_SITES: watch n indirect calls.  reg: the register holding the
 * target at the instruction (SPK_REG_*, the x86 encoding's order); result:
 * 0, or a negative errno (the kernel refused a kprobe there). */
enum {
	SPK_REG_RAX, SPK_REG_RCX, SPK_REG_RDX, SPK_REG_RBX, SPK_REG_RSP, SPK_REG_RBP,
	SPK_REG_RSI, SPK_REG_RDI, SPK_REG_R8, SPK_REG_R9, SPK_REG_R10, SPK_REG_R11,
	SPK_REG_R12, SPK_REG_R13, SPK_REG_R14, SPK_REG_R15, SPK_NREGS
};
struct spk_site {
	__u64 addr;             /* the call (or jump) instruction */
	__u32 reg;
	__s32 result;           /* out */
};
struct spk_sites_req {
	__u64 sites;            /* user pointer to n struct spk_site */
	__u32 n;
	__u32 reserved;
};

/* SPK_IOC_TARGETS: up to cap targets kept since the previous call (each
 * once; at most 32 a call), n of them written; the rest stay for the next
 * call. */
struct spk_targets_req {
	__u64 addrs;            /* user pointer to cap __u64 */
	__u32 cap;
	__u32 n;                /* out */
};

#define SPK_IOC_INFO _IOR('S', 1, struct spk_info)
#define SPK_IOC_PROBE _IOW('S', 2, struct spk_probe_req)
#define SPK_IOC_SCOPE_ADD _IOW('S', 3, __s32)
#define SPK_IOC_SCOPE_DEL _IOW('S', 4, __s32)
#define SPK_IOC_KEY_CHORD _IOW('S', 5, struct spk_key_chord)
#define SPK_IOC_SITES _IOWR('S', 6, struct spk_sites_req)
#define SPK_IOC_TARGETS _IOWR('S', 7, struct spk_targets_req)

#endif
