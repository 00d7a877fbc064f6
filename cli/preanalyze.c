/*
 * preanalyze.c — the code analyses a traced program needs, made in the
 * sptrace process before the agent is there, and after the program ended.
 *
 * The agent reads each module's analysis from the repository.  Made inside
 * the program, an analysis costs the program: its memory, seconds of its
 * control thread (libjvm's, 24 MB: 1.7 s -O2, 3.5 s with ASan), and -- to
 * read DWARF lines -- a child process of the program's own (a SIGCHLD a server in sigwaitinfo() takes,
 * pthread_atfork handlers run, a fork that waits for stdio locks).  So:
 *
 *   - `sptrace attach PID` analyses every module PID has mapped that the
 *     repository lacks (cli_loaded_modules) before it injects the agent;
 *   - `sptrace run` analyses the program and the libraries the loader will
 *     give it (cli_program_modules: the program's own loader, asked with
 *     --list, resolves them exactly as it will at the start) before it
 *     starts the program;
 *   - after the program ended, `sptrace run` analyses the modules its trace
 *     names (meta's module lines, written before the agent analyses one)
 *     that the repository still lacks: a library dlopen'd late whose
 *     analysis the program's exit cut short is there for the next run.
 *
 * Both also analyse the one library the agent itself loads into every
 * program, the process's unwinder libgcc_s (agent/x86_64/unwind.c: a C
 * program has none until then), as the loader of this process finds it
 * (cli_agent_modules).
 *
 * The agent analyses what is left (modules dlopen'd later) without source
 * lines (agent/modules.c).  Analyses made here have their lines.
 *
 * An entry counts only if it was made from the code the file holds now
 * (in_repo), and the analysis of a file another user could have written is
 * not stored at all (codeanalysis/trust.c): said once per command, and the
 * agent analyses such a file for itself.
 */
#include "cli.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"
#include "codeanalysis.h"
#include "trace_format.h"

/* Files at least this big get a line on stderr while they are analysed:
 * seconds (libjvm, 24 MB: 1.7 s), where the user would otherwise see
 * nothing happen. */
#define LONG_ANALYSIS_BYTES (8u << 20)

/* ---- path lists ---- */

static bool list_has(char **v, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

static int list_add(char ***v, size_t *n, size_t *cap, const char *s)
{
	if (list_has(*v, *n, s))
		return 0;
	if (*n == *cap) {
		size_t nc = *cap ? 2 * *cap : 16;
		char **nv = realloc(*v, nc * sizeof **v);

		if (!nv)
			return -1;
		*v = nv;
		*cap = nc;
	}
	if (!((*v)[*n] = strdup(s)))
		return -1;
	(*n)++;
	return 0;
}

void cli_free_list(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* ---- the modules of a running process ---- */

int cli_loaded_modules(const char *cmd, const char *pid, char ***out, size_t *n)
{
	char path[64], line[4608];
	size_t cap = 0;
	FILE *f;

	*out = NULL;
	*n = 0;
	for (const char *p = pid; *p; p++)
		if (!isdigit((unsigned char)*p))
			return cli_error("%s: '%s' is not a process id", cmd, pid);
	if (!*pid)
		return cli_error("%s: an empty process id", cmd);
	snprintf(path, sizeof path, "/proc/%s/maps", pid);
	f = fopen(path, "re");
	if (!f) {
		if (errno == ENOENT)
			return cli_error("%s: pid %s: no such process", cmd, pid);
		return cli_error("%s: pid %s: cannot read %s: %s (run as the process's owner or "
				 "as root)", cmd, pid, path, strerror(errno));
	}
	while (fgets(line, sizeof line, f)) {
		char perms[8], file[4096] = "", *full;

		if (sscanf(line, "%*s %7s %*s %*s %*s %4095[^\n]", perms, file) < 2 || perms[2] != 'x' ||
		    file[0] != '/' || strstr(file, " (deleted)"))
			continue;
		/* Through /proc/PID/root: the target's mount namespace. */
		if (asprintf(&full, "/proc/%s/root%s", pid, file) < 0)
			break;
		if (list_add(out, n, &cap, full) < 0) {
			free(full);
			break;
		}
		free(full);
	}
	fclose(f);
	return 0;
}

/* ---- the modules a program will start with ---- */

int cli_find_program(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");

	if (strchr(name, '/')) {
		snprintf(out, len, "%s", name);
		return 0;
	}
	if (!path)
		path = "/bin:/usr/bin";
	for (const char *p = path;; p++) {
		const char *colon = strchr(p, ':');
		size_t dl = colon ? (size_t)(colon - p) : strlen(p);
		struct stat st;

		snprintf(out, len, "%.*s%s%s", (int)dl, p, dl ? "/" : "", name);
		if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
			return 0;
		if (!colon)
			return -1;
		p = colon;
	}
}

/* A "#!" script: its interpreter in *interp (1), else 0. */
static int script_interpreter(const char *path, char *interp, size_t len)
{
	char buf[256];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t i = 2, j = 0;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n < 3 || buf[0] != '#' || buf[1] != '!')
		return 0;
	buf[n] = '\0';
	while (buf[i] == ' ' || buf[i] == '\t')
		i++;
	while (buf[i] && !isspace((unsigned char)buf[i]) && j + 1 < len)
		interp[j++] = buf[i++];
	interp[j] = '\0';
	return interp[0] == '/';
}

int cli_elf_interpreter(const char *path, char *interp, size_t len)
{
	Elf64_Ehdr eh;
	int fd = open(path, O_RDONLY | O_CLOEXEC), found = 0;

	if (fd < 0)
		return 0;
	if (pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh &&
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
	    eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum < 256) {
		for (unsigned i = 0; i < eh.e_phnum && !found; i++) {
			Elf64_Phdr ph;

			if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) !=
			    (ssize_t)sizeof ph)
				break;
			if (ph.p_type != PT_INTERP || ph.p_filesz < 2 || ph.p_filesz >= len)
				continue;
			if (pread(fd, interp, ph.p_filesz, (off_t)ph.p_offset) == (ssize_t)ph.p_filesz) {
				interp[ph.p_filesz] = '\0';
				found = interp[0] == '/' && strlen(interp) == ph.p_filesz - 1;
			}
		}
	}
	close(fd);
	return found;
}

/* Loaders known to list dependencies with --list without running the
 * program (glibc's ld-linux*, musl's ld-musl*). */
static int lists_dependencies(const char *interp)
{
	const char *base = strrchr(interp, '/') ? strrchr(interp, '/') + 1 : interp;

	return strncmp(base, "ld-linux", 8) == 0 || strncmp(base, "ld-musl", 7) == 0;
}

/* One line of the loader's --list output: the path it names, if any.
 *   "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)"
 *   "\t/lib64/ld-linux-x86-64.so.2 (0x...)"
 *   "\tlinux-vdso.so.1 (0x...)", "\tlibfoo.so => not found"  (none) */
static int listed_path(char *line, const char **path)
{
	char *arrow = strstr(line, " => "), *p = arrow ? arrow + 4 : line, *addr;

	while (*p == ' ' || *p == '\t')
		p++;
	p[strcspn(p, "\n")] = '\0';
	addr = strstr(p, " (0x");
	if (addr)
		*addr = '\0';
	*path = p;
	return p[0] == '/';
}

/* Run `interp --list prog` and add each library it names. */
static int ask_loader(const char *interp, const char *prog, char ***v, size_t *n, size_t *cap)
{
	int fds[2], status, null;
	char line[4608];
	pid_t pid;
	FILE *f;

	if (pipe2(fds, O_CLOEXEC) < 0)
		return -1;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDERR_FILENO);
		}
		dup2(fds[1], STDOUT_FILENO);
		execl(interp, interp, "--list", prog, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	f = fdopen(fds[0], "r");
	if (!f) {
		close(fds[0]);
	} else {
		while (fgets(line, sizeof line, f)) {
			const char *path;

			if (listed_path(line, &path))
				list_add(v, n, cap, path);
		}
		fclose(f);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return 0;
}

int cli_program_modules(const char *name, char ***out, size_t *n)
{
	char prog[PATH_MAX], interp[PATH_MAX];
	size_t cap = 0;

	*out = NULL;
	*n = 0;
	if (cli_find_program(name, prog, sizeof prog) < 0)
		return -1;
	/* A script runs its interpreter (which may be a script, four deep). */
	for (int depth = 0; depth < 4 && script_interpreter(prog, interp, sizeof interp); depth++)
		snprintf(prog, sizeof prog, "%s", interp);
	if (list_add(out, n, &cap, prog) < 0)
		return -1;
	if (!cli_elf_interpreter(prog, interp, sizeof interp))
		return 0;                               /* static: nothing else loads */
	if (list_add(out, n, &cap, interp) < 0)
		return -1;
	if (lists_dependencies(interp))
		ask_loader(interp, prog, out, n, &cap);
	return 0;
}

/* ---- the library the agent loads itself ---- */

int cli_agent_modules(const char *root, char ***out, size_t *n)
{
	struct link_map *lm = NULL;
	void *h = dlopen("libgcc_s.so.1", RTLD_LAZY | RTLD_LOCAL);
	size_t cap = 0;
	char *full;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!h)
		return 0;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] == '/' &&
	    asprintf(&full, "%s%s", root, lm->l_name) >= 0) {
		rc = list_add(out, n, &cap, full);
		free(full);
	}
	dlclose(h);
	return rc;
}

/* ---- analysing what the repository lacks ---- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Is there a usable entry for `path` (its key in *key)?  1 yes, 0 no,
 * -1 the file is no module of ours (not ELF, gone).  Usable means made from
 * the code the file holds now (codeanalysis/trust.c, guard 2): an entry
 * under the same build-id made from other code -- a stale one, or one made
 * from a file built to carry this build-id -- is made again. */
static int in_repo(const char *repo, const char *path, char *key, size_t keylen)
{
	sp_err e = { "" };

	if (ca_module_key_of(path, key, keylen, &e) < 0)
		return -1;
	return ca_repo_code_matches(repo, key, path, &e) == 1;
}

/* The files whose analyses are not stored (see the header), by identity
 * (the same file is named by the command line and by meta): each is
 * analysed and named once per command. */
#define MAX_UNTRUSTED 64
static struct { dev_t dev; ino_t ino; } untrusted[MAX_UNTRUSTED];
static size_t nuntrusted;

static int known_untrusted(const struct stat *st)
{
	for (size_t i = 0; i < nuntrusted; i++)
		if (untrusted[i].dev == st->st_dev && untrusted[i].ino == st->st_ino)
			return 1;
	return 0;
}

/* Analyse one file and store it: 0, or -1 after a message. */
static int analyse_one(const char *cmd, const char *repo, const char *path, const char *shown)
{
	ca_options opt = { 0 };
	ca_module *m = NULL;
	sp_err e = { "" };
	struct stat st;
	double t0 = now_s();
	int have_st = stat(path, &st) == 0;
	int loud = have_st && st.st_size >= (off_t)LONG_ANALYSIS_BYTES;

	if (have_st && known_untrusted(&st))
		return -1;
	if (loud) {
		cli_progress_end();
		fprintf(stderr, "sptrace: %s: analysing %s (%.1f MB), which the code-analysis "
			"repository lacks: once per build of it\n", cmd, shown,
			(double)st.st_size / 1e6);
	}
	if (ca_analyze(path, &opt, &m, &e) == 0 && ca_module_untrusted(m)[0]) {
		if (have_st && nuntrusted < MAX_UNTRUSTED) {
			untrusted[nuntrusted].dev = st.st_dev;
			untrusted[nuntrusted++].ino = st.st_ino;
		}
		cli_progress_end();
		fprintf(stderr, "sptrace: %s: %s is %s: its analysis is not stored in the "
			"code-analysis repository (another user could have chosen its bytes); "
			"the agent analyses it inside the program, without source lines\n", cmd,
			shown, ca_module_untrusted(m));
		ca_module_free(m);
		return -1;
	}
	if (!m || ca_repo_store(m, repo, NULL, 0, &e) < 0) {
		cli_error("%s: %s; the agent will analyse it inside the program, without source "
			  "lines", cmd, e.msg);
		ca_module_free(m);
		return -1;
	}
	if (loud)
		fprintf(stderr, "sptrace: %s: analysed %s in %.1f s\n", cmd, shown, now_s() - t0);
	ca_module_free(m);
	return 0;
}

int cli_analyze_missing(const char *cmd, const char *repo, char **paths, size_t n,
			size_t strip)
{
	char key[160];
	int made = 0;

	for (size_t i = 0; i < n; i++) {
		const char *shown = strlen(paths[i]) > strip ? paths[i] + strip : paths[i];

		if (in_repo(repo, paths[i], key, sizeof key) != 0)
			continue;
		cli_progress(shown, i, n);
		if (analyse_one(cmd, repo, paths[i], shown) == 0)
			made++;
	}
	cli_progress_end();
	return made;
}

/* ---- after the program: the modules its trace names ---- */

/* What walk_traces found: the modules to analyse (v), and every module line
 * asked about already ("KEY PATH" in seen): a hundred exec'd images name the
 * same C library a hundred times, and each question hashes its code. */
typedef struct walk {
	char **v, **seen;
	size_t n, cap, nseen, capseen;
} walk;

/* The module lines of DIR/meta (an_module_line: the path may hold spaces,
 * the key and bias do not) whose key the repository lacks. */
static void missing_of_meta(const char *dir, const char *repo, walk *w)
{
	char line[PATH_MAX + 256], id[PATH_MAX + 256], key[160];
	an_meta *m;
	sp_err e;

	if (an_meta_read(dir, &m, &e) < 0)
		return;
	for (size_t l = 0; l < an_meta_nlines(m); l++) {
		an_module mod;

		if (strcmp(an_meta_key(m, l), TRACE_META_MODULE) != 0)
			continue;
		snprintf(line, sizeof line, "%s", an_meta_val(m, l));
		if (an_module_line(line, &mod) != 0)
			continue;
		snprintf(id, sizeof id, "%s %s", mod.key, mod.path);
		if (list_has(w->seen, w->nseen, id))
			continue;
		list_add(&w->seen, &w->nseen, &w->capseen, id);
		/* The file must still be the traced module. */
		if (in_repo(repo, mod.path, key, sizeof key) == 0 && strcmp(key, mod.key) == 0)
			list_add(&w->v, &w->n, &w->cap, mod.path);
	}
	an_meta_free(m);
}

/* DIR and the traces below it (forked children, exec'd images). */
static void walk_traces(const char *dir, const char *repo, int depth, walk *w)
{
	DIR *d;
	struct dirent *de;

	missing_of_meta(dir, repo, w);
	if (depth >= 16 || !(d = opendir(dir)))
		return;
	while ((de = readdir(d))) {
		char sub[PATH_MAX];

		if (de->d_name[0] == '.' || (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    (size_t)snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) >= sizeof sub)
			continue;
		if (de->d_type == DT_UNKNOWN) {
			struct stat st;

			if (lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode))
				continue;
		}
		walk_traces(sub, repo, depth + 1, w);
	}
	closedir(d);
}

int cli_analyze_traced_modules(const char *cmd, const char *repo, const char *dir)
{
	walk w = { 0 };
	int made;

	walk_traces(dir, repo, 0, &w);
	made = cli_analyze_missing(cmd, repo, w.v, w.n, 0);
	cli_free_list(w.v, w.n);
	cli_free_list(w.seen, w.nseen);
	return made;
}
