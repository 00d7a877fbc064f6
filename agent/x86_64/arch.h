/*
 * x86_64/arch.h — the x86-64 answers to agent/arch.h: the thread pointer
 * (%fs), raw system calls, rdtsc, cpuid, pause, a signal context's
 * registers, int3.  Included through agent/arch.h only.
 */
#ifndef AGENT_X86_64_ARCH_H
#define AGENT_X86_64_ARCH_H

#include <stdbool.h>
#include <stdint.h>
#include <ucontext.h>

/* A TLS variable's offset from the thread pointer (%fs:0 holds the
 * pointer itself): the generated code reads it as %fs:offset. */
static inline int64_t ag_arch_tls_offset(const void *var)
{
	uint64_t fs;

	__asm__("mov %%fs:0, %0" : "=r"(fs));
	return (int64_t)((uint64_t)(uintptr_t)var - fs);
}

/* A system call without the C library: -errno on failure, errno kept. */
static inline long ag_arch_syscall6(long nr, long a, long b, long c, long d, long e, long f)
{
	long rc;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;

	__asm__ volatile("syscall" : "=a"(rc) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8),
			 "r"(r9) : "rcx", "r11", "memory");
	return rc;
}

/* The time-stamp counter. */
static inline uint64_t ag_arch_cycles(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

/* Serialise this core (cpuid): the fallback without membarrier SYNC_CORE. */
static inline void ag_arch_sync_core(void)
{
	__asm__ volatile("cpuid" ::"a"(0) : "rbx", "rcx", "rdx", "memory");
}

/* Inside a spin loop. */
static inline void ag_arch_relax(void)
{
	__builtin_ia32_pause();
}

/* ---- a signal's context ---- */
static inline uint64_t ag_uc_pc(const ucontext_t *uc)
{
	return (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
}

static inline void ag_uc_set_pc(ucontext_t *uc, uint64_t pc)
{
	uc->uc_mcontext.gregs[REG_RIP] = (greg_t)pc;
}

static inline uint64_t ag_uc_sp(const ucontext_t *uc)
{
	return (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
}

/* At a system call's return: its result, and its first argument (rdi is
 * preserved by the kernel). */
static inline long ag_uc_syscall_ret(const ucontext_t *uc)
{
	return (long)uc->uc_mcontext.gregs[REG_RAX];
}

static inline long ag_uc_syscall_arg0(const ucontext_t *uc)
{
	return (long)uc->uc_mcontext.gregs[REG_RDI];
}

/* At a function's first instruction: where its return address is kept
 * (the call pushed it: the top of the stack). */
static inline uint64_t *ag_uc_entry_return(const ucontext_t *uc)
{
	return (uint64_t *)(uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
}

/* ---- traps ---- */
/* int3: one byte, so a site's first byte alone makes it trap (patch.c). */
#define AG_TRAP_BYTE 0xcc

/* The trap instruction a thread that executed one stands after (SIGTRAP
 * reports the pc past an int3). */
static inline uint64_t ag_arch_trap_at(uint64_t pc)
{
	return pc - 1;
}

/* ---- a faulting clock read (tsc.c) ---- */
/* pc holds rdtsc (0f 31). */
static inline bool ag_arch_cycles_insn_at(uint64_t pc)
{
	const uint8_t *c = (const uint8_t *)(uintptr_t)pc;

	return c[0] == 0x0f && c[1] == 0x31;
}

/* In a record stub, at its rdtsc: the thread's ring (the stub loaded it
 * into r11 first, x86_64/tramp.S). */
static inline uint64_t ag_arch_stub_ring(const ucontext_t *uc)
{
	return (uint64_t)uc->uc_mcontext.gregs[REG_R11];
}

/* Resume past the rdtsc at the context's pc as if it had read `value`. */
static inline void ag_arch_cycles_resume(ucontext_t *uc, uint64_t value)
{
	uc->uc_mcontext.gregs[REG_RAX] = (greg_t)(uint32_t)value;
	uc->uc_mcontext.gregs[REG_RDX] = (greg_t)(value >> 32);
	uc->uc_mcontext.gregs[REG_RIP] += 2;
}

#endif
