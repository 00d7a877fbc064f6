/*
 * tp_sigwait_lib.c — the library tp_sigwait dlopen's after the attach: a
 * module no repository holds, with DWARF lines (built with -g), so that the
 * agent meets it only once it is loaded.
 */
__attribute__((noinline)) static unsigned tpdl_mix(unsigned x)
{
	return (x ^ 0x5bd1e995u) * 2654435761u;
}

unsigned tpdl_work(unsigned n)
{
	unsigned s = 0;

	for (unsigned i = 0; i < n; i++)
		s += tpdl_mix(s + i);
	return s;
}
