/*
 * cli.h — what the `sptrace` subcommands share.  One file per subcommand
 * (cmd_<name>.c), each a thin user of the library headers.
 */
#ifndef SPTRACE_CLI_H
#define SPTRACE_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

/* A subcommand: `run` gets argv with argv[0] = the subcommand's name. */
typedef struct cli_cmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} cli_cmd;

int cmd_analyze_binary(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_flows(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_activate(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_keys(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_collect(int argc, char **argv);

/* cmd_pack.c: the directories of the trace at DIR (it and its exec'd
 * images' and spawned children's subdirectories), each opened without
 * following a link and taken only if the caller's and no one else's to
 * write: visit(dfd, shown, NULL, arg), then visit(dfd, shown, NAME, arg) for
 * each of its other entries; a directory refused: visit(-1, shown, WHY,
 * arg).  A visit's -1 ends the walk.  0, or -1. */
typedef int (*cli_trace_visit)(int dfd, const char *shown, const char *name, void *arg);
int cli_trace_walk(const char *dir, cli_trace_visit visit, void *arg);
/* cmd_pack.c: pack the files of every record in the trace's directories
 * (cli_trace_walk; an_pack_ring): their finished chunks, and every record of
 * a process no longer running; only directories of the caller's that no one
 * else may write (the others are said when `last`: the pass nothing
 * repeats).  Errors are said as `cmd`'s.  The records packed, or -1 once
 * an error was said. */
int64_t cli_pack_rings(const char *cmd, const char *dir, bool last);
/* lookahead.c: after a run whose records were packed, the functions it
 * reached into each module's look-ahead profile (codeanalysis/profile.c). */
void cli_learn_lookahead(const char *cmd, const char *dir);

/* lost.c: say the records the trace lost, first: a warning on stderr and,
 * with `out`, a "# WARNING: ..." line there.  1 when some were lost.  The
 * _dir form reads the ring headers of DIR's every image (or collected
 * tree). */
struct an_lost;
int cli_say_lost(const char *cmd, const struct an_lost *l, FILE *out);
int cli_say_lost_dir(const char *cmd, const char *dir, FILE *out);

/* cmd_status.c: this host's spdaemon answered, its name in `name`: 0;
 * -1 when none serves this host (network namespace). */
int cli_local_daemon(char *name, size_t len);
/* ... and then a new session's name (its daemon's in `daemon`): 0; -1
 * when no daemon serves this host. */
int cli_start_session(char *session, size_t len, char *daemon, size_t dlen);
/* --propagate-wait MS into `out` (as text); 0, or 2 after the message. */
int cli_propagate_wait(const char *cmd, const char *arg, char *out, size_t len);
int cli_propagate_mark(const char *cmd, const char *arg, char *out, size_t len);   /* --mark */

/* trace_dir.c.  `cmd` names the command in messages. */
int cli_find_agent(const char *cmd, char *out, size_t len);   /* libsptrace-agent.so */
/* Whom a new trace is for: its owner (the caller, or the user whose process
 * root attaches to: the agent writes as that user) and the group it is
 * shared with ((gid_t)-1: none, the default). */
typedef struct cli_trace_owner {
	uid_t uid;
	gid_t gid;
	gid_t group;
} cli_trace_owner;
/* DIR made fresh (an existing one kept as DIR.old), its absolute path in
 * abs (PATH_MAX): 0, or 1 after the message. */
int cli_prepare_trace_dir(const char *cmd, const char *dir, const cli_trace_owner *o,
			  char *abs);
/* Remove the trace DIR (absolute; one this command made) if it holds only
 * a trace's files, all of one owner (`owner` or the caller), without
 * following links; else -1. */
int cli_remove_trace_dir(const char *dir, uid_t owner);
/* --group NAME|GID: 0, or 2 after the message. */
int cli_trace_group(const char *cmd, const char *arg, gid_t *gid);
/* spare.c: `sptrace run`'s stock of ready-made files, directories and
 * FIFOs in DIR/.spare, kept full by a thread until cli_spares_end removes
 * it (agent/spare.c: the protocol).  NULL when it cannot be made: the
 * agents create their files themselves. */
typedef struct cli_spares cli_spares;
cli_spares *cli_spares_start(const char *absdir);
const char *cli_spares_path(const cli_spares *s);     /* for SPTRACE_SPARE */
void cli_spares_end(cli_spares *s);                   /* NULL: nothing */
/* Create (or open) the file `name` of the trace in `dir` with the trace's
 * mode (0600, or 0640 for a shared trace), never through a link; the fd. */
int cli_trace_file(const char *dir, const char *name, int flags);
/* Options for the agent: 0, or 2 after the message.  --ring-size MB into
 * ring as bytes; --threads; --on, where `first` is the command's own first
 * event (run: start; attach: now). */
int cli_ring_size(const char *cmd, const char *arg, char *ring, size_t len);
/* --budget PERCENT (0..1000) into budget, as the agent reads it. */
int cli_budget(const char *cmd, const char *arg, char *budget, size_t len);
int cli_check_threads(const char *cmd, const char *arg);
/* --join DIRECTIVE (trace_format.h, "Values"), checked and added to
 * room[*n] (room holds CLI_JOIN_MAX). */
#define CLI_JOIN_MAX 16
int cli_add_join(const char *cmd, const char **room, size_t *n, const char *arg);
int cli_check_event(const char *cmd, const char *on, const char *first);


/* kernel.c: `run --kernel`, through the kernel module's /dev/sptrace (the
 * steps are in kernel.c).  start: open the device and probe the kernel
 * functions below the system calls `calls` (comma-separated names; NULL:
 * a default set); NULL after the message.  trace: a pid joins the scope
 * (0, or 1 after the message).  poll: copy the rings (1: found records).
 * finish: close the device (the probes go) and write the records into the
 * trace DIR, then free; abandon: free without writing. */
typedef struct cli_kernel cli_kernel;
cli_kernel *cli_kernel_start(const char *cmd, const char *calls, int indirect);
int cli_kernel_trace(cli_kernel *k, pid_t pid);
int cli_kernel_poll(cli_kernel *k);
int cli_kernel_finish(cli_kernel *k, const char *dir);
void cli_kernel_abandon(cli_kernel *k);

/* Print "sptrace: <message>" to stderr (printf style); returns 1. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An output file written beside itself (PATH.XXXXXX, *tmp) and renamed over
 * PATH once complete, so that a failure leaves PATH as it was: NULL after
 * a message naming `cmd`.  cli_finish_beside closes f and, when `ok`,
 * renames it (0; 1 after a message when it cannot); else removes it (1). */
FILE *cli_create_beside(const char *cmd, const char *path, char **tmp);
int cli_finish_beside(const char *cmd, FILE *f, char *tmp, const char *path, int ok);

/* One line on `out` per region of code the agent left alone because a
 * language runtime manages it (meta's "runtime" lines), and per module the
 * program's calls into are not traced ("untraced" lines); how many. */
int cli_print_left_alone(FILE *out, const char *dir);
/* Each process of the trace in DIR (and its exec'd and spawned images'
 * subdirectories) whose agent did not trace, and why (meta's "end not
 * tracing: ..."), one line each; how many. */
int cli_print_untraced(FILE *out, const char *dir);
/* The trace's "end" line (why it ended) from DIR/meta: 1 and *why, or 0. */
int cli_meta_end(const char *dir, char *why, size_t len);
/* The image traced in DIR exec'd another: 1 and the directory of its trace
 * (DIR/exec.PID.N, the last exec that did not fail) in *sub, else 0. */
int cli_exec_successor(const char *dir, char *sub, size_t len);
/* The "KEY value" lines of DIR/meta (an_meta_read, analysis.h): how many, and
 * the last value in *val. */
int cli_meta_get(const char *dir, const char *key, char *val, size_t len);
/* Wait until DIR/meta has more than `before` KEY lines (1), the trace ends
 * (-1, the reason in *why: an end line that was not there when the wait
 * began) or `timeout` seconds pass (0); *ms: how long. */
int cli_meta_wait(const char *dir, const char *key, int before, double timeout, double *ms,
		  char *why, size_t len);

/* preanalyze.c: the code analyses the agent will need, made in this process
 * (see there).  Lists of paths are freed with cli_free_list. */
void cli_free_list(char **v, size_t n);
/* The modules PID maps executable, as /proc/PID/root/<path>: 0, or 1 after
 * a message naming `cmd`. */
int cli_loaded_modules(const char *cmd, const char *pid, char ***out, size_t *n);
/* The file execvp would run for `name` (PATH searched): 0, -1 none. */
int cli_find_program(const char *name, char *out, size_t len);
/* The ELF interpreter (PT_INTERP) of a 64-bit ELF file: 1, else 0 (static,
 * or not ELF). */
int cli_elf_interpreter(const char *path, char *interp, size_t len);
/* The program execvp would run for `name` (a script's interpreter), its ELF
 * interpreter and the libraries that loader will map: 0, -1 not found. */
int cli_program_modules(const char *name, char ***out, size_t *n);
/* The library the agent loads into every program itself (libgcc_s), its
 * path under root ("" or /proc/PID/root); none if not found.  0 or -1. */
int cli_agent_modules(const char *root, char ***out, size_t *n);
/* Analyse and store those of `paths` the repository lacks (a line on stderr
 * for big ones; failures are reported, not fatal: the agent analyses them).
 * `strip` bytes of each path are not shown.  Returns how many were made. */
int cli_analyze_missing(const char *cmd, const char *repo, char **paths, size_t n,
			size_t strip);
/* The same for the modules the traces under DIR name (meta). */
int cli_analyze_traced_modules(const char *cmd, const char *repo, const char *dir);

/* collected.c: a tree made by `sptrace collect` (OUT/HOST/PID/...)?  Then
 * fn for each of its processes, host by host, pid by pid, after a line
 * "== host NAME: pid N (program)" on stdout: whether one failed. */
int cli_collected_tree(const char *dir);
typedef int (*cli_collected_fn)(const char *dir, void *arg);
int cli_collected_each(const char *dir, cli_collected_fn fn, void *arg);

/* A one-line progress indicator on stderr when it is a terminal. */
void cli_progress(const char *what, size_t done, size_t total);
void cli_progress_end(void);

/* report_html.c: `sptrace analyze --html PATH`: the page for the anomalies
 * of session s (trace directory dir; ref: its --normal reference or NULL),
 * its `top` first units, and the timed diff (cli_analyze_diff); PATH written
 * whole or not at all.  0, or -1 after an error on stderr. */
struct an_session;
struct an_anomalies;
struct an_flows_opts;
struct an_flows;
int cli_analyze_html(const char *path, const char *dir, struct an_session *s,
		     struct an_session *ref, const struct an_anomalies *a,
		     const struct an_flows_opts *fo, size_t top);

/* cmd_flows.c: one more --start FUNC of `cmd` into o, its names kept in
 * room[0..CLI_MAX_START).  0, or 2 after an error (too many). */
#define CLI_MAX_START 16
/* Whether the trace DIR's meta has FUNC:scope join lines (1 too when it
 * has no meta: a collected tree), so its function names are needed. */
int cli_has_scopes(const char *dir);
int cli_add_start(const char *cmd, struct an_flows_opts *o, const char **room,
		  const char *name);

/* cmd_control.c: what `sptrace activate PID` (activate 1) or `sptrace stop
 * PID` (0) does, its answer on stderr.  0, or 1 after an error on stderr. */
int cli_control_pid(int activate, pid_t pid, double timeout);

/* hotkey.c: `--on key CHORD` (the rules are above its code).  check: 0, or
 * 2 after an error naming the chord.  open: the chord grabbed, or NULL
 * after an error saying which backends were looked for.  fd: to poll;
 * pressed: how many presses arrived; wait: pressed, after at most
 * timeout_ms for one. */
typedef struct cli_hotkey cli_hotkey;
int cli_hotkey_check(const char *cmd, const char *chord);
cli_hotkey *cli_hotkey_open(const char *cmd, const char *chord);
const char *cli_hotkey_backend(const cli_hotkey *h);
int cli_hotkey_fd(const cli_hotkey *h);
int cli_hotkey_pressed(cli_hotkey *h);
int cli_hotkey_wait(cli_hotkey *h, int timeout_ms);
void cli_hotkey_close(cli_hotkey *h);
/* keychord.c: one keyboard's side of a chord, fed its input events (the
 * rules are above its code).  code: the chord's key, a KEY_* code; mods:
 * SPK_MOD_* (kagent/sptrace_kagent.h).  event: 1 when this event presses
 * the chord, -1 when the keys' state must be read again (EVIOCGKEY) and
 * given to sync, else 0.  sync: the modifiers held, from EVIOCGKEY's bits.
 * fits: a keyboard whose keys (EVIOCGBIT's bits) has the chord's key and,
 * for each of its modifiers, the left or the right one. */
struct cli_keychord {
	unsigned code, mods;
	unsigned held;           /* bit i: the i-th modifier key is down */
	int dropped;             /* events lost: skipping to the next SYN_REPORT */
};
void cli_keychord_init(struct cli_keychord *k, unsigned code, unsigned mods);
int cli_keychord_event(struct cli_keychord *k, unsigned type, unsigned code, int value);
void cli_keychord_sync(struct cli_keychord *k, const unsigned char *keys, size_t len);
int cli_keychord_fits(const struct cli_keychord *k, const unsigned char *keys, size_t len);
/* The key chord of an --on value ("key CHORD"), or of "key" followed by
 * argv[*optind] (which it then takes); NULL if the event is not a key. */
const char *cli_key_chord(const char *on, int argc, char **argv, int *optind);

/* replay_diff.c: `sptrace replay --diff DIR2 DIR`: DIR's threads' calls
 * aligned with DIR2's; min_change: the percent a duration must change by to
 * be shown.  0, or 1 after an error on stderr. */
struct an_open_opts;
/* The calls of flow `id` of fl (session s) aligned with those of flow id2
 * of fl2 (session s2: the same, or a --normal reference), as replay --diff
 * aligns two threads: '-' calls of id2 only, '+' of id only, each with both
 * durations; written to out.  0, or -1 after a message. */
int cli_flow_diff(FILE *out, struct an_session *s, const struct an_flows *fl, const char *id,
		  struct an_session *s2, const struct an_flows *fl2, const char *id2,
		  double min_change);
/* cmd_analyze.c: the timed diff of the most suspect flow against the flow
 * it was compared with (cli_flow_diff), with its header; nothing when the
 * most suspect is no flow or was compared with none.  0, or -1. */
int cli_analyze_diff(FILE *out, struct an_session *s, struct an_session *ref,
		     const struct an_anomalies *a, const struct an_flows_opts *fo);
int cli_replay_diff(const char *dir, const char *dir2, const struct an_open_opts *oo,
		    double min_change);

/* main.c: s as a JSON string, quoted and escaped, on stdout. */
void cli_json_str(const char *s);

/* run's and attach's --help for --kernel-calls and --kernel-indirect. */
#define CLI_HELP_KERNEL_CALLS \
	"  --kernel-calls LIST the system calls followed into the kernel, by name,\n" \
	"                      comma-separated (default: read, write, openat, close,\n" \
	"                      getppid and 20 more common ones); implies --kernel\n" \
	"  --kernel-indirect   with --kernel, also follow the kernel's calls through\n" \
	"                      function pointers (vfs_read's f_op->read_iter, ...):\n" \
	"                      kprobes on the indirect calls of the functions probed\n" \
	"                      find their targets as the program runs, hooked from\n" \
	"                      their next call on.  Every process passing one of\n" \
	"                      those calls pays a kprobe hit meanwhile (see\n" \
	"                      bench/KAGENT.md); implies --kernel\n"

#endif
