#!/usr/bin/env python3
"""test_programs.py SPTRACE CASE — real programs that met the agent badly (issue 11).

  gdb-run        `sptrace run -- gdb --batch -ex 'break f' -ex run ...` on a
                 small program built into a temporary directory: gdb's output
                 (breakpoint hits, backtrace, the inferior's own output and
                 exit code) and exit status are the same as natively -- the
                 agent in the inferior, which a debugger traces from its
                 start, stays out of the way and the summary says so; gdb's
                 own process is traced (its main is in the replay)
  postgres-attach  Debian's postgres: a cluster made by initdb, the postmaster
                 attached (tracing at once) while a client runs queries, each
                 in a new connection (a forked backend that exits); then
                 `sptrace activate` and `sptrace stop` work, and after the stop
                 the postmaster's code is byte-identical to its files; the
                 queries all succeed, before and after
"""
import os
import pwd
import re
import subprocess
import sys
import tempfile
import threading
import time

from e2elib import (check, describe_exit, fail, need_program, private_repo_env, run,  # noqa: E402
                    text_diff_bytes)

PG_BIN = "/usr/lib/postgresql/15/bin"

PROG_C = r"""
#include <stdio.h>
__attribute__((noinline)) int f(int x) { return x * 3 + 1; }
__attribute__((noinline)) int g(int x) { return f(x) + f(x + 1); }
int main(void)
{
	int s = 0;

	for (int i = 0; i < 5; i++)
		s += g(i);
	printf("sum %d\n", s);
	return s & 7;
}
"""




# ---- gdb ----

def normalise_gdb(text):
    """gdb's output without what differs from run to run: process and thread ids."""
    text = re.sub(r"process \d+", "process N", text)
    text = re.sub(r"LWP \d+", "LWP N", text)
    return text


def case_gdb_run(sptrace, tmp):
    gdb = need_program("gdb", "gdb")
    gcc = need_program("gcc", "gcc")
    src = os.path.join(tmp, "prog.c")
    prog = os.path.join(tmp, "prog")
    with open(src, "w") as f:
        f.write(PROG_C)
    r = run([gcc, "-O2", "-g", "-o", prog, src])
    check(r.returncode == 0, "cannot build the test program: %s" % r.stderr)
    cmd = [gdb, "--batch", "-nx", "-ex", "break f", "-ex", "run", "-ex", "bt", "-ex", "continue",
           "-ex", "delete", "-ex", "continue", prog]
    native = run(cmd, cwd=tmp, timeout=120)
    check(native.returncode == 0 and "Breakpoint 1, f (" in native.stdout and
          "#2  " in native.stdout and "exited with code 05" in native.stdout,
          "native gdb run: %s\n%s%s" % (describe_exit(native.returncode), native.stdout,
                                        native.stderr))
    trace = os.path.join(tmp, "trace")
    traced = run([sptrace, "run", "-o", trace, "--"] + cmd, cwd=tmp, env=private_repo_env(tmp),
                 timeout=280)
    log = ""
    for root, _, files in os.walk(trace):
        if "agent.log" in files:
            with open(os.path.join(root, "agent.log")) as f:
                log += "--- %s\n%s" % (root, f.read()[-1500:])
    check(traced.returncode == native.returncode,
          "gdb under sptrace run: %s, natively %s\n%s%s\n%s" %
          (describe_exit(traced.returncode), describe_exit(native.returncode), traced.stdout,
           traced.stderr, log))
    check(normalise_gdb(traced.stdout) == normalise_gdb(native.stdout),
          "gdb's output differs under sptrace run\n--- native\n%s--- traced\n%s--- stderr\n%s\n%s"
          % (native.stdout, traced.stdout, traced.stderr, log))
    # gdb's own stderr, without sptrace's summary lines.
    theirs = "".join(l for l in traced.stderr.splitlines(True) if not l.startswith("sptrace: "))
    check(normalise_gdb(theirs) == normalise_gdb(native.stderr),
          "gdb's stderr differs under sptrace run\n--- native\n%s--- traced\n%s" %
          (native.stderr, theirs))
    check(re.search(r"sptrace: pid \d+ \(%s\) was not traced: traced by gdb \(pid \d+\), a "
                    r"debugger" % re.escape(prog), traced.stderr),
          "the summary does not say the inferior was left alone:\n%s" % traced.stderr)
    # gdb itself is traced: its main is in the replay (read as far as it).
    p = subprocess.Popen([sptrace, "replay", trace], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=private_repo_env(tmp))
    seen = False
    try:
        for i, line in enumerate(p.stdout):
            if line.rstrip().endswith("main() {"):
                seen = True
                break
            if i > 2000:
                break
    finally:
        p.kill()
        p.wait()
    check(seen, "gdb's own trace has no main() in its first 2000 lines")
    print("gdb-run: same gdb output and exit status as natively; the inferior left alone, "
          "gdb traced")


# ---- postgres ----

def as_user(user):
    """preexec_fn: become `user` (postgres refuses to run as root)."""
    pw = pwd.getpwnam(user)

    def become():
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    return become


def queries_go_on(results, n, when):
    """The client's next n queries (results: its counts) succeed, within 60 s."""
    before = results["ok"]
    deadline = time.time() + 60
    while results["ok"] < before + n and time.time() < deadline and not results["bad"]:
        time.sleep(0.1)
    check(results["ok"] >= before + n and not results["bad"],
          "queries %s: %d ok, failed: %r" % (when, results["ok"] - before, results["bad"][:3]))


def case_postgres_attach(sptrace, tmp):
    initdb = need_program(os.path.join(PG_BIN, "initdb"), "postgresql-15")
    postgres = need_program(os.path.join(PG_BIN, "postgres"), "postgresql-15")
    psql = need_program("psql", "postgresql-client-15")
    user = None
    if os.geteuid() == 0:
        user = "postgres" if any(p.pw_name == "postgres" for p in pwd.getpwall()) else "nobody"
        os.chmod(tmp, 0o755)
    pre = as_user(user) if user else None
    data, sock = os.path.join(tmp, "data"), os.path.join(tmp, "sock")
    os.mkdir(sock)
    if user:
        pw = pwd.getpwnam(user)
        os.chown(sock, pw.pw_uid, pw.pw_gid)
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    r = subprocess.run([initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"],
                       capture_output=True, text=True, timeout=180, preexec_fn=pre,
                       stdin=subprocess.DEVNULL)
    check(r.returncode == 0, "initdb: %s\n%s%s" % (describe_exit(r.returncode), r.stdout, r.stderr))
    port = "54%03d" % (os.getpid() % 1000)
    # Its log goes to a file: a pipe nobody reads while it runs could fill.
    pglog = os.path.join(tmp, "postgres.log")
    with open(pglog, "w") as logf:
        pg = subprocess.Popen([postgres, "-D", data, "-k", sock, "-p", port, "-c",
                               "listen_addresses=", "-c", "fsync=off"], stdin=subprocess.DEVNULL,
                              stdout=logf, stderr=subprocess.STDOUT, preexec_fn=pre)

    def pg_log():
        with open(pglog) as f:
            return f.read()[-3000:]
    stop_client = threading.Event()
    results = {"ok": 0, "bad": []}

    def query(sql):
        q = subprocess.run([psql, "-h", sock, "-p", port, "-U", "postgres", "-At", "-c", sql,
                            "postgres"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        return q.returncode, q.stdout.strip(), q.stderr.strip()

    def client():
        n = 0
        while not stop_client.is_set():
            n += 1
            rc, out, err = query("select count(*), sum(i) from generate_series(1, %d) i" % (100 * n))
            want = "%d|%d" % (100 * n, 100 * n * (100 * n + 1) // 2)
            if rc == 0 and out == want:
                results["ok"] += 1
            else:
                results["bad"].append((n, rc, out, err))
            time.sleep(0.05)

    trace = os.path.join(tmp, "trace")
    th = None
    try:
        for _ in range(300):
            if query("select 1")[0] == 0:
                break
            if pg.poll() is not None:
                fail("postgres did not start: %s\n%s" % (describe_exit(pg.returncode), pg_log()))
            time.sleep(0.1)
        first = query("select 1")
        check(first[1] == "1", "postgres does not answer: %r\n%s" % (first, pg_log()))
        th = threading.Thread(target=client)
        th.start()
        time.sleep(0.5)
        a = run([sptrace, "attach", "-o", trace, str(pg.pid)], env=private_repo_env(tmp),
                timeout=280)
        check(a.returncode == 0 and "tracing" in a.stdout,
              "sptrace attach %d: %s\n%s%s" % (pg.pid, describe_exit(a.returncode), a.stdout,
                                              a.stderr))
        # Backends come and go meanwhile: forked by the traced postmaster,
        # each exits after its query.
        queries_go_on(results, 10, "after the attach")
        patched = text_diff_bytes(pg.pid)
        check(patched, "the postmaster's code was not patched at all after the attach")
        r = run([sptrace, "activate", str(pg.pid)], env=private_repo_env(tmp), timeout=60)
        check(r.returncode == 0 and "tracing" in r.stdout,
              "sptrace activate %d (%d): %s%s" % (pg.pid, r.returncode, r.stdout, r.stderr))
        r = run([sptrace, "stop", str(pg.pid)], env=private_repo_env(tmp), timeout=60)
        check(r.returncode == 0 and "code restored" in r.stdout,
              "sptrace stop %d (%d): %s%s\n(patched before: %r)" %
              (pg.pid, r.returncode, r.stdout, r.stderr, patched))
        diff = text_diff_bytes(pg.pid)
        check(not diff, "after sptrace stop the postmaster's code differs from its files "
              "(bytes): %r" % diff)
        queries_go_on(results, 5, "after the stop")
    finally:
        stop_client.set()
        if th:
            th.join(timeout=70)
        if pg.poll() is None:
            pg.send_signal(2)             # SIGINT: fast shutdown
            try:
                pg.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pg.kill()
                pg.wait()
    check(pg.returncode == 0, "postgres ended with %s:\n%s" % (describe_exit(pg.returncode),
                                                             pg_log()))
    print("postgres-attach: %d queries, all right; activate and stop worked; the postmaster's "
          "code was %r bytes patched, identical to its files after the stop" %
          (results["ok"], patched))


CASES = {"gdb-run": case_gdb_run, "postgres-attach": case_postgres_attach}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        fail("usage: test_programs.py SPTRACE %s" % "|".join(CASES))
    with tempfile.TemporaryDirectory(prefix="sptrace-programs-") as tmp:
        CASES[sys.argv[2]](os.path.abspath(sys.argv[1]), tmp)


if __name__ == "__main__":
    main()
