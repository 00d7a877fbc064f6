#!/usr/bin/env python3
"""budget_bench.py — the overhead budget (issue 16, section 3), side by side.

    bench/budget_bench.py [--rounds N] [--budget PCT] BUILD > bench/BUDGET.md

BUILD is a meson build directory of this tree (cli/sptrace,
bench/budget_check).  For each workload of bench/agent/agent_bench.py
(/usr/bin/python3.11 bench/agent/workload.py 2, and /usr/bin/sqlite3 on a
new database fed bench/agent/workload.sql), rounds of: the program alone
(native), `sptrace run` (every call timed, every record kept) and
`sptrace run --budget PCT`, one after the other in each round, on this
shared, noisy machine.  Times are of the whole command: wall clock and the
CPU time of its process tree (wait4), medians and minimums.  Records
written come from the ring headers (trace_format.h); outputs are compared
with the native run's.

The check (first round's two traces, by bench/budget_check): per function,
its calls in the --budget trace (timed + counted) against the plain
trace's -- equal for every function when the counts are exact (python runs
with PYTHONHASHSEED=0 so that both runs make the same calls) -- and the
timed calls of 1 us or more in each, with those of the plain trace whose
function the --budget run counted at some time (the calls of 1 us or more
the --budget tree may lack; durations in the plain trace include the
tracer's own time, so this is an upper bound).
"""

import argparse
import datetime
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import records_bench  # noqa: E402  (ring headers)


def log(msg):
    print("budget-bench: " + msg, file=sys.stderr, flush=True)


def timed(cmd, env, stdin_path):
    """(wall s, cpu s, rc, stdout bytes)."""
    t0 = time.monotonic()
    with open(stdin_path or os.devnull, "rb") as stdin, tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, env=env, stdin=stdin, stdout=out, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        out.seek(0)
        data = out.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, p.returncode, data


def check_table(build, plain, budget):
    """{name: [calls, counted, long, long in program time]} of both traces."""
    out = []
    for d in (plain, budget):
        r = subprocess.run([os.path.join(build, "bench", "budget_check"), d],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit("budget_check %s: %s" % (d, r.stderr))
        t = {}
        for line in r.stdout.splitlines():
            name, calls, counted, longc, longp = line.rsplit("\t", 4)
            c = t.setdefault(name, [0, 0, 0, 0])
            c[0] += int(calls)
            c[1] += int(counted)
            c[2] += int(longc)
            c[3] += int(longp)
        out.append(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", default="30")
    a = ap.parse_args()
    sptrace = os.path.abspath(os.path.join(a.build, "cli", "sptrace"))
    tmp = tempfile.mkdtemp(prefix="budget-bench-")
    db = os.path.join(tmp, "workload.db")
    env = dict(os.environ, PYTHONHASHSEED="0", SPTRACE_REPO=os.path.join(tmp, "repo"))
    loads = [("python3.11 workload.py 2",
              ["/usr/bin/python3.11", os.path.join(HERE, "agent", "workload.py"), "2"], None),
             ("sqlite3 < workload.sql", ["/usr/bin/sqlite3", db],
              os.path.join(HERE, "agent", "workload.sql"))]
    modes = [("native", None), ("plain", []), ("budget", ["--budget", a.budget])]
    started = time.monotonic()
    res, checks, problems = {}, {}, []

    def one(name, argv, stdin, mode, extra, keep):
        if os.path.exists(db):
            os.unlink(db)
        d = os.path.join(tmp, "trace-" + mode)
        for x in (d, d + ".old"):
            shutil.rmtree(x, ignore_errors=True)
        cmd = argv if extra is None else [sptrace, "run", "-o", d] + extra + ["--"] + argv
        wall, cpu, rc, out = timed(cmd, env, stdin)
        recs = records_bench.ring_stats(d)[0] if extra is not None else None
        if extra is not None and not keep:
            shutil.rmtree(d, ignore_errors=True)
        return dict(wall=wall, cpu=cpu, rc=rc, out=out, records=recs, dir=d)

    for name, argv, stdin in loads:      # warm the repository (analyses)
        log("%s: warming the repository" % name)
        one(name, argv, stdin, "plain", [], False)
    for rnd in range(a.rounds):
        for name, argv, stdin in loads:
            for mode, extra in modes:
                log("%s round %d/%d: %s" % (name, rnd + 1, a.rounds, mode))
                r = one(name, argv, stdin, mode, extra, keep=rnd == 0)
                res.setdefault((name, mode), []).append(r)
            if rnd == 0:
                log("%s: checking the two traces" % name)
                checks[name] = check_table(a.build, os.path.join(tmp, "trace-plain"),
                                           os.path.join(tmp, "trace-budget"))
                for m in ("plain", "budget"):
                    shutil.rmtree(os.path.join(tmp, "trace-" + m), ignore_errors=True)
            for mode, _ in modes[1:]:
                r, n = res[(name, mode)][-1], res[(name, "native")][-1]
                if r["rc"] != n["rc"] or r["out"] != n["out"]:
                    problems.append("%s round %d: %s differs from the native run" %
                                    (name, rnd + 1, mode))
    shutil.rmtree(tmp, ignore_errors=True)

    w = print
    load = os.getloadavg()
    w("# An overhead budget (issue 16, section 3)\n")
    w("Written by `bench/budget_bench.py` (see its header); the sections marked *(by hand)* "
      "were added after it from the same session.\n")
    w("- date: %s UTC; took %.0f s; %d rounds, the three modes one after the other in a round" %
      (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), time.monotonic() - started,
       a.rounds))
    w("- machine: %d CPUs, shared with other jobs (load average when done: %.2f %.2f %.2f)" %
      (os.cpu_count(), *load))
    w("- command: `bench/budget_bench.py --rounds %d --budget %s BUILD`\n" % (a.rounds, a.budget))
    w("Modes: **native** (the program alone), **plain** (`sptrace run`: every call timed, every "
      "record kept), **budget** (`sptrace run --budget %s`).\n" % a.budget)
    w("| workload | mode | wall s median (min) | ÷ native | CPU s median (min) | CPU ÷ native "
      "| records written | output identical |")
    w("|---|---|---:|---:|---:|---:|---:|---|")
    for name, _, _ in loads:
        nat = res[(name, "native")]
        nw = statistics.median(r["wall"] for r in nat)
        nc = statistics.median(r["cpu"] for r in nat)
        for mode, _ in modes:
            rs = res[(name, mode)]
            mw = statistics.median(r["wall"] for r in rs)
            mc = statistics.median(r["cpu"] for r in rs)
            same = all(r["out"] == n["out"] and r["rc"] == n["rc"] for r, n in zip(rs, nat))
            recs = "" if mode == "native" else "%d" % statistics.median(r["records"] for r in rs)
            w("| %s | %s | %.2f (%.2f) | **%.2f** | %.2f (%.2f) | %.2f | %s | %s |" %
              (name, mode, mw, min(r["wall"] for r in rs), mw / nw, mc,
               min(r["cpu"] for r in rs), mc / nc, recs, "yes" if same else "NO"))
    w("\nPer round (wall s):\n")
    for name, _, _ in loads:
        w("- %s: %s" % (name, "; ".join(
            "%s %s" % (m, " ".join("%.2f" % r["wall"] for r in res[(name, m)])) for m, _ in modes)))
    w("\n## The check (first round's traces, bench/budget_check)\n")
    w("Calls of 1 us or more: *trace*, the timed calls whose entry and exit are 1 us apart or "
      "more; *program*, those still 1 us or more once the tracer's cost of the records written "
      "inside them is taken off (14 ns each), an estimate of the calls that took 1 us of the "
      "program's own time.  *Missed*: the plain trace's calls of 1 us or more (program) of "
      "the functions the budget run counted at some time: the calls of 1 us or more its tree "
      "may lack (an upper bound: those functions' calls were also timed before their demotion "
      "and in samples).\n")
    w("| workload | functions | calls (plain) | calls (budget) | functions whose calls differ "
      "| counted (budget) | calls >= 1 us plain: trace, program | budget: trace, program | "
      "missed |")
    w("|---|---:|---:|---:|---:|---|---|---|---:|")
    for name, _, _ in loads:
        p, b = checks[name]
        z = [0, 0, 0, 0]
        names = set(p) | set(b)
        differ = sorted(f for f in names if p.get(f, z)[0] != b.get(f, z)[0])
        counted_f = [f for f in b if b[f][1]]
        missed = sum(p.get(f, z)[3] for f in counted_f)
        w("| %s | %d | %d | %d | %d | %d calls of %d functions | %d, %d | %d, %d | %d |" %
          (name, len(names), sum(v[0] for v in p.values()), sum(v[0] for v in b.values()),
           len(differ), sum(v[1] for v in b.values()), len(counted_f),
           sum(v[2] for v in p.values()), sum(v[3] for v in p.values()),
           sum(v[2] for v in b.values()), sum(v[3] for v in b.values()), missed))
        if differ:
            w("\n%s: functions whose calls differ (plain, budget): %s\n" % (name, ", ".join(
                "%s %d %d" % (f, p.get(f, z)[0], b.get(f, z)[0]) for f in differ[:20])))
        top = sorted(counted_f, key=lambda f: -p.get(f, z)[3])[:8]
        if top and missed:
            w("\n%s: counted functions with the most calls >= 1 us (program) in the plain "
              "trace (calls, counted in budget, >= 1 us plain, >= 1 us budget): %s\n" %
              (name, "; ".join("%s %d %d %d %d" % (f, b[f][0], b[f][1], p.get(f, z)[3], b[f][3])
                               for f in top)))
    if problems:
        w("\nProblems: " + "; ".join(problems))


if __name__ == "__main__":
    main()
