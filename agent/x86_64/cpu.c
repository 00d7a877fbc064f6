/*
 * cpu.c — what the x86-64 trampolines need to know of the processor.
 *
 * ag_tramp_slow (tramp.S) saves the whole extended state with XSAVE below
 * the stack pointer: ag_xsave_size bytes, as CPUID leaf 0xd sub-leaf 0
 * gives them for the features enabled in XCR0 (plus 64 for the
 * alignment), at least the legacy area and header; 4096 until asked.
 */
#include <cpuid.h>
#include <stdint.h>

#include "../agent.h"
#include "../arch.h"

uint64_t ag_xsave_size AG_HIDDEN = 4096;

void ag_arch_init(void)
{
	unsigned a, b, c, d;

	if (__get_cpuid_count(0xd, 0, &a, &b, &c, &d) && b >= 576)
		ag_xsave_size = b + 64;
}
