/*
 * cmd_analyze_binary.c — `sptrace analyze-binary`: analyse ELF modules, store
 * them in the repository, print a summary or dump functions, call sites or a
 * function's CFG.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codeanalysis.h"

static const char help[] =
	"usage: sptrace analyze-binary [OPTIONS] FILE...\n"
	"       sptrace analyze-binary [OPTIONS] --all-loaded PID\n"
	"\n"
	"Analyse x86-64 ELF modules (executables and shared objects, stripped or\n"
	"not): functions, basic blocks, call graph, call sites and how the agent\n"
	"will patch each, source lines.  Results go to the repository, one entry\n"
	"per module keyed by build-id, so tracing never disassembles on the hot path.\n"
	"\n"
	"options:\n"
	"  --all-loaded PID    analyse every module mapped executable by process PID\n"
	"  --repo DIR          repository directory (default: $SPTRACE_REPO, else\n"
	"                      /var/lib/sptrace/repo as root, ~/.cache/sptrace/repo)\n"
	"  --force             analyse again even if the repository has the module\n"
	"  --no-store          analyse only; leave the repository alone\n"
	"  --no-lines          skip DWARF source lines (implies --no-store)\n"
	"  --dump WHAT         print details instead of the summary:\n"
	"                        functions      one line per function\n"
	"                        callsites      one line per call site and its patch plan\n"
	"                        cfg=FUNC       basic blocks and edges of FUNC (name or 0xADDR)\n"
	"                        undecodable    regions capstone could not decode\n"
	"  -q, --quiet         print nothing but errors\n"
	"  -h, --help          this text\n"
	"\n"
	"Dumps are tab-separated with a '#' header line; addresses are link-time\n"
	"virtual addresses as in the file.\n";

typedef struct opts {
	const char *repo;
	const char *dump;
	const char *pid;
	int force, no_store, quiet;
	ca_options ca;
} opts;

static void print_pct(const char *label, uint32_t n, uint32_t total, int *first)
{
	printf("%s%s %u (%.1f%%)", *first ? "" : ", ", label, n, total ? 100.0 * n / total : 0.0);
	*first = 0;
}

static void print_summary(const ca_module *m, const char *repo_note)
{
	const ca_stats *s = ca_module_stats(m);
	static const char *const src[] = { "symtab", "dynsym", "eh_frame", "call targets",
					   "endbr64", "plt", "entry", "jump targets" };
	double secs = (double)s->analyze_ns / 1e9;
	int first = 1;

	printf("%s\n", ca_module_path(m));
	printf("  key          %s\n", ca_module_key(m));
	printf("  functions    %u (", s->nfuncs);
	for (int i = 0; i < 8; i++)
		printf("%s%s %u", i ? ", " : "", src[i], s->nfuncs_by_source[i]);
	printf("); %u fragments, %u noreturn\n", s->nfragments, s->nnoreturn);
	printf("  code         %.2f MB in code sections, %" PRIu32 " instructions, %.1f%% of bytes decoded\n",
	       (double)s->text_bytes / 1e6, s->ninsns,
	       s->text_bytes ? 100.0 * (double)s->decoded_bytes / (double)s->text_bytes : 0.0);
	printf("  undecodable  %" PRIu64 " bytes in %u regions (no patch planned there)\n",
	       s->undecodable_bytes, s->nundecodable);
	{
		size_t nr;
		const ca_runtime *r = ca_module_runtimes(m, &nr);

		for (size_t i = 0; i < nr; i++)
			printf("  runtime      %s at %#" PRIx64 "-%#" PRIx64 " (%s): not patched, calls "
			       "into it not traced\n", ca_runtime_kind_name(r[i].kind), r[i].lo, r[i].hi,
			       ca_str(m, r[i].how));
	}
	printf("  cfg          %u blocks, %u edges, %u jump tables (%u targets), %u landing pads\n",
	       s->nblocks, s->nedges, s->njump_tables, s->njump_table_targets, s->nlanding_pads);
	printf("  call sites   %u: ", s->nsites);
	for (unsigned k = 1; k < CA_SITE_KIND_MAX; k++)
		print_pct(ca_site_kind_name(k), s->nsites_by_kind[k], s->nsites, &first);
	printf("\n  patch plan   ");
	first = 1;
	for (unsigned k = 1; k < CA_PATCH_METHOD_MAX; k++)
		print_pct(ca_patch_method_name(k), s->nsites_by_method[k], s->nsites, &first);
	if (*ca_module_lines_error(m))
		printf("\n  lines        none: %s\n", ca_module_lines_error(m));
	else if (ca_module_lines_pending(m))
		printf("\n  lines        not read (analysed inside a traced program)\n");
	else
		printf("\n  lines        %u rows%s%s\n", s->nlines,
		       *ca_module_lines_source(m) ? " from " : " (no DWARF found)",
		       ca_module_lines_source(m));
	printf("  time         %.3f s (%.0f functions/s, %.2f MB/s of code; lines %.3f s)\n",
	       secs, secs > 0 ? s->nfuncs / secs : 0.0,
	       secs > 0 ? (double)s->text_bytes / 1e6 / secs : 0.0, (double)s->lines_ns / 1e9);
	if (repo_note)
		printf("  repository   %s\n", repo_note);
}

static void source_of(const ca_module *m, uint64_t addr, char *buf, size_t len)
{
	const ca_line *l = ca_line_at(m, addr);
	size_t n;

	if (!l || !ca_module_lines(m, &n) || n == 0) {
		snprintf(buf, len, "-");
		return;
	}
	snprintf(buf, len, "%s:%u", ca_str(m, l->file), l->line);
}

static void func_flags(uint16_t f, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s%s%s%s%s", f & CA_FUNC_NORETURN ? "noreturn," : "",
		 f & CA_FUNC_PLT ? "plt," : "", f & CA_FUNC_FRAGMENT ? "fragment," : "",
		 f & CA_FUNC_UNDECODABLE ? "undecodable," : "", f & CA_FUNC_IFUNC ? "ifunc," : "",
		 f & CA_FUNC_RUNTIME ? "runtime," : "", f & CA_FUNC_RUNTIME_ENTRY ? "runtime-entry," : "");
	if (*buf)
		buf[strlen(buf) - 1] = '\0';
	else
		snprintf(buf, len, "-");
}

static void func_sources(uint16_t s, char *buf, size_t len)
{
	static const char *const n[] = { "symtab", "dynsym", "eh_frame", "call", "endbr", "plt",
					 "entry", "jump" };
	buf[0] = '\0';
	for (int i = 0; i < 8; i++)
		if (s & (1u << i)) {
			strncat(buf, n[i], len - strlen(buf) - 1);
			strncat(buf, ",", len - strlen(buf) - 1);
		}
	if (*buf)
		buf[strlen(buf) - 1] = '\0';
}

static void dump_functions(const ca_module *m)
{
	size_t n;
	const ca_func *f = ca_module_funcs(m, &n);
	char fl[128], src[128], line[4200];

	printf("# addr\tsize\tname\tsources\tflags\tblocks\tsites\tinsns\tparent\tsource\n");
	for (size_t i = 0; i < n; i++) {
		func_flags(f[i].flags, fl, sizeof fl);
		func_sources(f[i].sources, src, sizeof src);
		source_of(m, f[i].addr, line, sizeof line);
		printf("%#" PRIx64 "\t%#" PRIx64 "\t%s\t%s\t%s\t%u\t%u\t%u\t%s\t%s\n", f[i].addr,
		       f[i].size, ca_str(m, f[i].name), src, fl, f[i].nblocks, f[i].nsites,
		       f[i].ninsns, f[i].parent == CA_NONE ? "-" : ca_str(m, f[f[i].parent].name),
		       line);
	}
}

static void dump_callsites(const ca_module *m)
{
	size_t n, nf;
	const ca_site *s = ca_module_sites(m, &n);
	const ca_func *f = ca_module_funcs(m, &nf);

	printf("# addr\tlen\tfunc\tkind\ttarget\tcallee\tmethod\tpatch_addr\tpatch_len\tflags\treason\n");
	for (size_t i = 0; i < n; i++) {
		const char *callee = s[i].callee != CA_NONE ? ca_str(m, f[s[i].callee].name)
				     : s[i].import != CA_NONE ? ca_str(m, s[i].import) : "-";
		char fl[64];

		snprintf(fl, sizeof fl, "%s%s%s%s%s", s[i].flags & CA_SITEF_NORETURN ? "noreturn," : "",
			 s[i].flags & CA_SITEF_COND ? "cond," : "",
			 s[i].flags & CA_SITEF_OUTSIDE ? "outside," : "",
			 s[i].flags & CA_SITEF_TAILPOS ? "tailpos," : "",
			 s[i].reloc_rip == CA_RELOC_RIP_UNKNOWN ? "riprel-unknown,"
			 : s[i].reloc_rip ? "riprel," : "");
		if (*fl)
			fl[strlen(fl) - 1] = '\0';
		else
			strcpy(fl, "-");
		printf("%#" PRIx64 "\t%u\t%s\t%s\t%#" PRIx64 "\t%s\t%s\t%#" PRIx64 "\t%u\t%s\t%s\n",
		       s[i].addr, s[i].len, ca_str(m, f[s[i].func].name), ca_site_kind_name(s[i].kind),
		       s[i].target, callee, ca_patch_method_name(s[i].method), s[i].patch_addr,
		       s[i].patch_len, fl, ca_patch_reason_text(s[i].reason));
	}
}

static void dump_undecodable(const ca_module *m)
{
	size_t n, nf;
	const ca_undecodable *u = ca_module_undecodable(m, &n);
	const ca_func *f = ca_module_funcs(m, &nf);

	printf("# addr\tsize\tfunc\n");
	for (size_t i = 0; i < n; i++)
		printf("%#" PRIx64 "\t%u\t%s\n", u[i].addr, u[i].size,
		       u[i].func == CA_NONE ? "-" : ca_str(m, f[u[i].func].name));
}

static void block_flags(uint16_t f, char *buf, size_t len)
{
	static const char *const n[] = { "entry", "ret", "tail", "noreturn", "indirect",
					 "landing-pad", "swept", "undecodable" };
	buf[0] = '\0';
	for (int i = 0; i < 8; i++)
		if (f & (1u << i)) {
			strncat(buf, n[i], len - strlen(buf) - 1);
			strncat(buf, ",", len - strlen(buf) - 1);
		}
	if (*buf)
		buf[strlen(buf) - 1] = '\0';
	else
		snprintf(buf, len, "-");
}

static int dump_cfg(const ca_module *m, const char *which)
{
	size_t nf, nb, ne, ns;
	const ca_func *f = ca_module_funcs(m, &nf);
	const ca_block *b = ca_module_blocks(m, &nb);
	const ca_edge *e = ca_module_edges(m, &ne);
	const ca_site *s = ca_module_sites(m, &ns);
	uint32_t fi = ca_func_by_name(m, which);
	char *end;

	if (fi == CA_NONE && which[0] == '0' && tolower((unsigned char)which[1]) == 'x') {
		uint64_t a = strtoull(which, &end, 16);
		if (*end == '\0')
			fi = ca_func_at(m, a);
	}
	if (fi == CA_NONE)
		return cli_error("analyze-binary: %s: no function named or containing '%s'; "
				 "'--dump functions' lists them", ca_module_path(m), which);
	printf("# function %s at %#" PRIx64 ", %#" PRIx64 " bytes, %u blocks, %u call sites\n",
	       ca_str(m, f[fi].name), f[fi].addr, f[fi].size, f[fi].nblocks, f[fi].nsites);
	printf("# block\taddr\tsize\tinsns\tflags\tsuccessors\n");
	for (uint32_t i = 0; i < f[fi].nblocks; i++) {
		const ca_block *bb = &b[f[fi].first_block + i];
		char fl[128];

		block_flags(bb->flags, fl, sizeof fl);
		printf("%u\t%#" PRIx64 "\t%u\t%u\t%s\t", i, bb->addr, bb->size, bb->ninsns, fl);
		for (uint32_t k = 0; k < bb->nedges; k++) {
			const ca_edge *ed = &e[bb->first_edge + k];
			printf("%s%u:%s", k ? " " : "", ed->to - f[fi].first_block,
			       ca_edge_kind_name(ed->kind));
		}
		printf("%s\n", bb->nedges ? "" : "-");
	}
	printf("# site\taddr\tkind\tcallee\tmethod\n");
	for (uint32_t i = 0; i < f[fi].nsites; i++) {
		const ca_site *ss = &s[f[fi].first_site + i];
		printf("site\t%#" PRIx64 "\t%s\t%s\t%s\n", ss->addr, ca_site_kind_name(ss->kind),
		       ss->callee != CA_NONE ? ca_str(m, f[ss->callee].name)
		       : ss->import != CA_NONE ? ca_str(m, ss->import) : "-",
		       ca_patch_method_name(ss->method));
	}
	return 0;
}

/* Analyse (or load) one file and print what was asked.  0 ok, 1 failed. */
static int do_file(const char *path, const char *shown, const opts *o)
{
	ca_module *m = NULL;
	sp_err err = { "" };
	char key[160], stored[4200], note[4400];
	const char *repo_note = NULL;
	int rc = 0;

	if (!o->no_store && !o->force) {
		if (ca_module_key_of(path, key, sizeof key, &err))
			return cli_error("analyze-binary: %s", err.msg);
		int lr = ca_repo_load(o->repo, key, &m, &err);

		if (lr == 0 && ca_module_lines_pending(m) && !o->ca.no_lines) {
			/* Made inside a traced program, without source lines:
			 * analysed again here with them, and replaced. */
			ca_module_free(m);
			m = NULL;
		} else if (lr == 0 && ca_module_code_matches(m, path, &err) != 1) {
			/* Made from other code under the same build-id (stale, or
			 * from a file built to carry it): analysed again. */
			if (!o->quiet)
				fprintf(stderr, "sptrace: analyze-binary: the repository's entry for "
					"%s was made from other code than the file's; analysing it "
					"again\n", shown);
			ca_module_free(m);
			m = NULL;
		} else if (lr == 0) {
			snprintf(note, sizeof note, "loaded from %s", o->repo ? o->repo : ca_repo_default_dir());
			repo_note = note;
		} else if (lr < 0 && !o->quiet) {
			fprintf(stderr, "sptrace: analyze-binary: %s; analysing %s again\n", err.msg, shown);
		}
	}
	if (!m) {
		if (ca_analyze(path, &o->ca, &m, &err))
			return cli_error("analyze-binary: %s", err.msg);
		if (!o->no_store) {
			if (ca_repo_store(m, o->repo, stored, sizeof stored, &err)) {
				cli_error("analyze-binary: %s", err.msg);
				rc = 1;
				repo_note = "NOT stored (see the error above)";
			} else {
				snprintf(note, sizeof note, "stored %s", stored);
				repo_note = note;
			}
		}
	}
	if (o->quiet)
		;
	else if (!o->dump)
		print_summary(m, repo_note);
	else if (strcmp(o->dump, "functions") == 0)
		dump_functions(m);
	else if (strcmp(o->dump, "callsites") == 0)
		dump_callsites(m);
	else if (strcmp(o->dump, "undecodable") == 0)
		dump_undecodable(m);
	else if (strncmp(o->dump, "cfg=", 4) == 0)
		rc |= dump_cfg(m, o->dump + 4);
	ca_module_free(m);
	return rc ? 1 : 0;
}

int cmd_analyze_binary(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "all-loaded", required_argument, 0, 'p' }, { "repo", required_argument, 0, 'r' },
		{ "force", no_argument, 0, 'f' },            { "no-store", no_argument, 0, 'n' },
		{ "no-lines", no_argument, 0, 'L' },         { "dump", required_argument, 0, 'd' },
		{ "quiet", no_argument, 0, 'q' },            { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o;
	int c, failed = 0;
	char **files = NULL;
	size_t nfiles = 0;

	memset(&o, 0, sizeof o);
	optind = 1;
	opterr = 0;     /* our own messages, with the "sptrace: " prefix */
	while ((c = getopt_long(argc, argv, ":qh", lo, NULL)) != -1) {
		switch (c) {
		case 'p': o.pid = optarg; break;
		case 'r': o.repo = optarg; break;
		case 'f': o.force = 1; break;
		case 'n': o.no_store = 1; break;
		case 'L': o.ca.no_lines = 1; o.no_store = 1; break; /* keep the repository complete */
		case 'd': o.dump = optarg; break;
		case 'q': o.quiet = 1; break;
		case 'h': fputs(help, stdout); return 0;
		case ':':
			cli_error("analyze-binary: option '%s' needs a value; see "
				  "'sptrace analyze-binary --help'", argv[optind - 1]);
			return 2;
		default:
			cli_error("analyze-binary: unknown option '%s'; see "
				  "'sptrace analyze-binary --help'", argv[optind - 1]);
			return 2;
		}
	}
	if (o.dump && strcmp(o.dump, "functions") && strcmp(o.dump, "callsites") &&
	    strcmp(o.dump, "undecodable") && strncmp(o.dump, "cfg=", 4))
		return cli_error("analyze-binary: unknown --dump '%s'; use functions, callsites, "
				 "undecodable or cfg=FUNC", o.dump), 2;
	if (o.pid && optind < argc) {
		cli_error("analyze-binary: --all-loaded %s takes no file, but '%s' was given; "
			  "analyse files in a command of their own", o.pid, argv[optind]);
		return 2;
	}
	if (o.pid && cli_loaded_modules("analyze-binary", o.pid, &files, &nfiles))
		return 1;
	if (o.pid && nfiles == 0) {
		cli_error("analyze-binary: pid %s maps no executable file (a kernel thread or a "
			  "zombie): nothing to analyse", o.pid);
		return 1;
	}
	if (!o.pid && optind >= argc) {
		cli_error("analyze-binary: no file given; see 'sptrace analyze-binary --help'");
		return 2;
	}
	if (o.pid) {
		for (size_t i = 0; i < nfiles; i++) {
			const char *shown = files[i] + strlen("/proc//root") + strlen(o.pid);
			cli_progress(shown, i, nfiles);
			failed |= do_file(files[i], shown, &o);
			free(files[i]);
		}
		free(files);
	} else {
		for (int i = optind; i < argc; i++) {
			cli_progress(argv[i], (size_t)(i - optind), (size_t)(argc - optind));
			failed |= do_file(argv[i], argv[i], &o);
		}
	}
	cli_progress_end();
	return failed ? 1 : 0;
}
