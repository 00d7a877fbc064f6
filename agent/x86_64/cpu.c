/*
 * cpu.c — what the x86-64 trampolines need to know of the processor.
 *
 * ag_tramp_slow (tramp.S) saves the whole extended state with XSAVE below
 * the stack pointer: ag_xsave_size bytes, as CPUID leaf 0xd sub-leaf 0
 * gives them for the features enabled in XCR0 (plus 64 for the
 * alignment), at least the legacy area and header; 4096 until asked.
 *
 * CPUID exits to the hypervisor in a virtual machine: 40-60 us here, a
 * twentieth of a traced process's start.  So an exec'd image takes the
 * size its parent image found (SPTRACE_CPU, the same machine and XCR0);
 * a value outside what the legacy area and the largest state allow is
 * not taken.
 */
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../agent.h"
#include "../arch.h"

uint64_t ag_xsave_size AG_HIDDEN = 4096;

void ag_arch_init(const char *given)
{
	unsigned long long v = given ? strtoull(given, NULL, 10) : 0;
	unsigned a, b, c, d;

	if (v >= 576 + 64 && v <= (1u << 20)) {
		ag_xsave_size = v;
		return;
	}
	if (__get_cpuid_count(0xd, 0, &a, &b, &c, &d) && b >= 576)
		ag_xsave_size = b + 64;
}

const char *ag_arch_env(void)
{
	static char text[24];

	snprintf(text, sizeof text, "%llu", (unsigned long long)ag_xsave_size);
	return text;
}
