#!/usr/bin/env python3
"""lookahead_bench.py NEW OLD — the look-ahead guided by earlier runs
(codeanalysis/profile.c), side by side with OLD, a build without it.

    bench/lookahead_bench.py [--reps 2] build/cli/sptrace /work/base/build/cli/sptrace

On the default repository (as a user's `sptrace run` finds it), warm: every
command runs twice first (entries analysed, profiles learnt).  Then, REPS
times, one after the other:
  cc       `perf stat -r 5 -e task-clock` of `SPTRACE run -- cc -O2 -c f0.c`
           (a 3-line file; cc1 runs ~10 ms natively)
  python   the same of `SPTRACE run -- /usr/bin/python3.11 -c 'import json,
           decimal, argparse'`
  make     the same (-r 3) of `make clean; SPTRACE run -- make -j2` of
           start_bench.py's 13-file project (CPU time of every process: the
           wall time of start_bench.py's make row is the noisier figure)
  warmup   bench/agent/warmup_gen.py 2000 4 (2000 functions reached once,
           4 call sites each, called in order by one function: the case the
           look-ahead was made for), 1 round: its own CLOCK_MONOTONIC time of
           that round, natively and under each (median of 5)
each by NEW (profiles: the default), NEW --lookahead all (today's look-ahead
whole) and OLD; with agent.log's sites instrumented (all images of the run).
Prints markdown.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PY = ["/usr/bin/python3.11", "-c", "import json, decimal, argparse"]


def sites(tdir):
    n = 0
    for d, _, files in os.walk(tdir):
        if "agent.log" in files:
            m = re.search(r"end \(\w+\): (\d+) sites instrumented",
                          open(os.path.join(d, "agent.log")).read())
            n += int(m.group(1)) if m else 0
    return n


def task_clock(cmd, out, reps=5):
    subprocess.run(["perf", "stat", "-r", str(reps), "-x,", "-e", "task-clock", "-o", out, "--"] + cmd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    for line in open(out):
        if ",task-clock," in line:
            return float(line.split(",")[0])
    sys.exit("no task-clock in " + out)


def warmup_ns(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(re.search(r" ns (\d+)", p.stdout).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("new")
    ap.add_argument("old")
    a = ap.parse_args()
    a.new, a.old = os.path.abspath(a.new), os.path.abspath(a.old)
    w = tempfile.mkdtemp(prefix="lookahead-bench-")
    os.chdir(w)
    with open("f0.c", "w") as f:
        f.write("int f(int x)\n{ return x * 2; }\nint g(void) { return f(3); }\n")
    with open("warmup.c", "w") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "agent", "warmup_gen.py"), "2000", "4"],
                       stdout=f, check=True)
    subprocess.run(["gcc", "-O2", "-o", "warmup", "warmup.c"], check=True)
    who = [("NEW", [a.new, "run"]), ("NEW --lookahead all", [a.new, "run", "--lookahead", "all"]),
           ("OLD", [a.old, "run"])]
    sys.path.insert(0, HERE)
    import start_bench
    os.makedirs("proj")
    start_bench.make_project("proj")
    work = [("cc", ["cc", "-O2", "-c", "f0.c"]), ("python", PY), ("make", None),
            ("warmup", ["./warmup", "1"])]
    load0 = open("/proc/loadavg").read().split()[:3]
    print("## %s UTC: load average %s at the start"
          % (subprocess.run(["date", "-u", "+%Y-%m-%d %H:%M"], capture_output=True,
                            text=True).stdout.strip(), " ".join(load0)))
    print()
    print("NEW: %s, OLD: %s\n" % (a.new, a.old))
    def traced(s, wn, cmd):
        if wn == "make":
            return ["sh", "-c", 'make -s -C proj clean >/dev/null; exec "$@"', "sh"] + s + \
                ["-o", "t", "--", "make", "-s", "-j2", "-C", "proj"]
        return s + ["-o", "t", "--"] + cmd

    nsites = {}
    for wn, cmd in work:
        for sn, s in who:
            for _ in range(2):
                subprocess.run(traced(s, wn, cmd), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=True)
            nsites[(wn, sn)] = sites("t")
    res = {}
    for rep in range(a.reps):
        for wn, cmd in work[:3]:
            for sn, s in who:
                res.setdefault((wn, sn), []).append(task_clock(traced(s, wn, cmd), "perf.txt",
                                                               3 if wn == "make" else 5))
    wu = {}
    for _ in range(5):
        wu.setdefault("native", []).append(warmup_ns(["./warmup", "1"]))
        for sn, s in who:
            wu.setdefault(sn, []).append(warmup_ns(s + ["-o", "t", "--", "./warmup", "1"]))
    print("| workload | run by | sites instrumented (every image) | task-clock ms (perf stat "
          "-r 5, make -r 3), each repetition | ÷ OLD |")
    print("|---|---|---:|---|---:|")
    for wn, _ in work[:3]:
        old = statistics.mean(res[(wn, "OLD")])
        for sn, _ in who:
            v = res[(wn, sn)]
            print("| %s | %s | %d | %s | %.2fx |" % (wn, sn, nsites[(wn, sn)],
                                                   " / ".join("%.0f" % x for x in v),
                                                   statistics.mean(v) / old))
    print()
    print("| warm-up program (2000 functions, 4 sites each, 1 round) | sites instrumented | "
          "run_all ms, median of 5 | min | ÷ OLD (median) |")
    print("|---|---:|---:|---:|---:|")
    old = statistics.median(wu["OLD"])
    for sn in ["native"] + [x[0] for x in who]:
        v = wu[sn]
        print("| %s | %s | %.2f | %.2f | %s |" % (sn, nsites.get(("warmup", sn), "-"),
                                                  statistics.median(v) / 1e6, min(v) / 1e6,
                                                  "%.2fx" % (statistics.median(v) / old)
                                                  if sn != "native" else "-"))
    print()
    print("load average at the end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
