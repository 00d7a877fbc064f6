/*
 * lost.c — every command that reads a trace says first, before any other
 * output, how many records the trace lost and why (analysis.h, an_lost):
 * on stderr as a warning, and as the first line of a text output.
 */
#include "cli.h"

#include "analysis.h"

int cli_say_lost(const char *cmd, const an_lost *l, FILE *out)
{
	char text[1024];

	if (!l->lost)
		return 0;
	an_lost_text(l, text, sizeof text);
	fprintf(stderr, "sptrace: %s: warning: %s\n", cmd, text);
	if (out)
		fprintf(out, "# WARNING: %s\n", text);
	return 1;
}

int cli_say_lost_dir(const char *cmd, const char *dir, FILE *out)
{
	an_session *s;
	an_lost l;
	sp_err err;

	/* Whatever is wrong with the directory, the command's own opening
	 * says it: nothing to add here. */
	if (an_session_open(dir, NULL, &s, &err) < 0)
		return 0;
	an_session_lost(s, &l);
	an_session_close(s);
	return cli_say_lost(cmd, &l, out);
}
