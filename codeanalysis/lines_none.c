/*
 * lines_none.c — ca_lines_read for the agent's build of the analyser.
 *
 * Inside a traced program the agent analyses only without source lines
 * (ca_options.no_lines): reading DWARF forks a child, and libdwarf would be
 * one more library the agent shares with the program.  This file stands in
 * for lines.c there, so the agent does not link libdwarf at all; the lines
 * of an entry it makes are filled in outside, when the trace is read.
 */
#include "ca_internal.h"

int ca_lines_read(ca_module *m, const ca_elf *e, const ca_options *opt, sp_err *err)
{
	m->nlines = 0;
	m->stats.nlines = 0;
	m->lines_source[0] = '\0';
	if (opt && opt->no_lines)
		return 0;
	return sp_fail(err, "%s: source lines are not read inside a traced program", e->path);
}
