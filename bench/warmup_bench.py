#!/usr/bin/env python3
"""warmup_bench.py — the warm-up per newly reached function, for one or more
builds side by side (bench/README.md item 6; bench/WARMUP.md has results).

    bench/warmup_bench.py [--rounds 11] [--funcs 2000] [--sites 0,1,4]
                          [--calls 20000000] [--prefill N] LABEL=BUILD_DIR...

Each BUILD_DIR is a meson build: BUILD_DIR/cli/sptrace runs the program with
SPTRACE_AGENT=BUILD_DIR/agent/libsptrace-agent.so, in flight-recorder mode.
Each build has a repository of its own in the scratch directory (its
analyses and look-ahead profiles, made by a first traced run of each
program before the rounds).  The programs are bench/agent/warmup_gen.py's
(K functions, S call sites each) and bench/agent/calls.c (the flat
per-call cost), built with gcc -O2 in the scratch directory.  Every round runs, for each S and for 1 and 2
rounds of the program, the native program and then each build traced, so
that the builds share the machine's moods; medians over the rounds, of the
thread's CPU time around run_all() (the program's own clock).

  W  = (traced - native, 1 round) - (traced calls of a round x the build's
       flat per-call cost, measured here the same interleaved way)
  W' = (traced - native, 1 round) - ((2 rounds) - (1 round))   (the steady
       cost of a round taken from the program itself)
  per function = W / the functions first reached in the timed region
       (the K f_i, run_all, and leaf when S > 0)

Prints a markdown table on stdout; progress on stderr.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(rb"(?:warmup funcs \d+ sites \d+ rounds \d+|flat calls \d+) ns (\d+) cpu_ns (\d+)\n")


def log(msg):
    print("warmup-bench: " + msg, file=sys.stderr, flush=True)


def run(argv, env, cwd):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                       timeout=600)
    m = LINE.fullmatch(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit("warmup-bench: `%s` exited %d and printed %r; stderr: %s" %
                 (" ".join(argv), p.returncode, p.stdout[:200],
                  p.stderr[-400:].decode(errors="replace")))
    return int(m.group(2))          # the thread's CPU ns around the loop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", metavar="LABEL=BUILD_DIR")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--funcs", type=int, default=2000)
    ap.add_argument("--sites", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 4])
    ap.add_argument("--calls", type=int, default=20000000,
                    help="calls of the flat microbenchmark (per-call cost)")
    ap.add_argument("--cc", default="gcc")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="calls before the timed region (warmup_gen.py PREFILL): 8192 takes "
                         "the ring past its first 64 KB, whose read-ahead is then not counted")
    a = ap.parse_args()

    builds = []
    for b in a.builds:
        label, _, d = b.partition("=")
        d = os.path.abspath(d)
        exe, agent = os.path.join(d, "cli", "sptrace"), os.path.join(d, "agent",
                                                                     "libsptrace-agent.so")
        for f in (exe, agent):
            if not os.path.exists(f):
                sys.exit("warmup-bench: %s: missing; build it first (ninja -C %s)" % (f, d))
        builds.append((label, exe, agent))

    work = tempfile.mkdtemp(prefix="sptrace-warmup-bench.")
    try:
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "SPTRACE_DIR", "SPTRACE_ON"):
            env.pop(k, None)
        progs = {}
        for s in a.sites:
            src = os.path.join(work, "warmup-%d.c" % s)
            with open(src, "w") as f:
                subprocess.run([sys.executable, os.path.join(HERE, "agent", "warmup_gen.py"),
                                str(a.funcs), str(s), str(a.prefill)], stdout=f, check=True)
            progs[s] = os.path.join(work, "warmup-%d" % s)
            subprocess.run([a.cc, "-O2", "-o", progs[s], src], check=True)
        calls = os.path.join(work, "calls")
        subprocess.run([a.cc, "-O2", "-o", calls, os.path.join(HERE, "agent", "calls.c")],
                       check=True)

        def traced(b, argv):
            label, exe, agent = b
            tdir = os.path.join(work, "trace")
            shutil.rmtree(tdir, ignore_errors=True)
            e = dict(env, SPTRACE_AGENT=agent, SPTRACE_REPO=os.path.join(work, "repo-" + label))
            return run([exe, "run", "-o", tdir, "--flight-recorder", "--"] + argv, e, work)

        for b in builds:                # the repository warm, the profiles learnt
            for p in progs.values():
                traced(b, [p, "1"])
            traced(b, [calls, "flat", "1000"])
        res = {}
        for rnd in range(a.rounds):
            log("round %d/%d" % (rnd + 1, a.rounds))
            argv = [calls, "flat", str(a.calls)]
            res.setdefault(("flat", "native"), []).append(run(argv, env, work))
            for b in builds:
                res.setdefault(("flat", b[0]), []).append(traced(b, argv))
            for s, p in progs.items():
                for reps in (1, 2):
                    argv = [p, str(reps)]
                    res.setdefault((s, reps, "native"), []).append(run(argv, env, work))
                    for b in builds:
                        res.setdefault((s, reps, b[0]), []).append(traced(b, argv))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print("%d functions, %d interleaved rounds, medians of the thread's CPU time around "
          "run_all(); flat per-call cost from `calls flat %d`; %d calls before the timed "
          "region.\n" % (a.funcs, a.rounds, a.calls, a.prefill))
    print("| build | S | native 1 round µs | traced 1 round µs | native 2 rounds µs | "
          "traced 2 rounds µs | per-call ns | W ms | **µs per new function** | "
          "µs per patched site | W' per function µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nat_flat = med(res[("flat", "native")])
    for s in a.sites:
        for label, _, _ in builds:
            per_call = (med(res[("flat", label)]) - nat_flat) / a.calls
            n1, t1 = med(res[(s, 1, "native")]) / 1e3, med(res[(s, 1, label)]) / 1e3
            n2, t2 = med(res[(s, 2, "native")]) / 1e3, med(res[(s, 2, label)]) / 1e3
            d1, d2 = t1 - n1, t2 - n2
            ncalls = a.funcs * (1 + s)
            W = d1 - ncalls * per_call / 1e3
            W2 = d1 - (d2 - d1)
            funcs = a.funcs + (2 if s > 0 else 1)
            sites = a.funcs * (1 + s)
            print("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.1f | %.2f | **%.2f** | %.2f | %.2f |" %
                  (label, s, n1, t1, n2, t2, per_call, W / 1e3, W / funcs, W / sites,
                   W2 / funcs))


main()
