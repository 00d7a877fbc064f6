/*
 * arch.h — what the agent's portable C asks of the processor.
 *
 * The agent's files in agent/ hold no inline assembly and no register
 * names (the test portable-agent checks it); each architecture answers
 * these, as static inline functions, in agent/ARCH/arch.h:
 *
 *   the thread pointer     ag_arch_tls_offset(var): a TLS variable's offset
 *                          from it, which the generated code adds
 *   system calls           ag_arch_syscall6: one, raw -- no C library code,
 *                          errno untouched (-errno on failure)
 *   the clock, the core    ag_arch_cycles (the cycle counter the records
 *                          hold), ag_arch_sync_core (serialise this core),
 *                          ag_arch_relax (inside a spin loop)
 *   a signal's context     ag_uc_pc / ag_uc_set_pc / ag_uc_sp; at a system
 *                          call's return, ag_uc_syscall_ret and
 *                          ag_uc_syscall_arg0; at a function's first
 *                          instruction, ag_uc_entry_return (where its
 *                          return address is kept)
 *   traps                  AG_TRAP_BYTE, the first byte the patching
 *                          protocol writes (patch.c), and ag_arch_trap_at,
 *                          the trap instruction a thread stands after
 *   a faulting clock read  ag_arch_cycles_insn_at, ag_arch_stub_ring,
 *                          ag_arch_cycles_resume (tsc.c)
 *   the processor          ag_arch_init (at start): what the architecture's
 *                          trampolines need to know of it (ARCH/cpu.c),
 *                          asked of the processor or taken from the image
 *                          that exec'd this one (SPTRACE_CPU, ag_arch_env)
 *
 * The instruction-level work on code (areas, sites, trampolines, unwind
 * information) is declared in agent.h's x86_64/ sections.
 */
#ifndef AGENT_ARCH_H
#define AGENT_ARCH_H

/* given: SPTRACE_CPU from the image before, or NULL */
void ag_arch_init(const char *given);
const char *ag_arch_env(void);          /* SPTRACE_CPU for an exec'd image */

#if defined(__x86_64__)
#include "x86_64/arch.h"
#else
#error "the agent knows x86-64 only (agent/x86_64/arch.h)"
#endif

#endif
