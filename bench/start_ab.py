#!/usr/bin/env python3
"""start_ab.py — what one more traced process costs, two sptrace builds
alternated (bench/STARTWORK.md).

    bench/start_ab.py [--runs N] [--loops L] SPTRACE OLD_SPTRACE

Runs `SPTRACE run -o DIR -- bash -c 'for i in $(seq 1 L); do /bin/true;
done'`, then the same under OLD_SPTRACE, then bash natively, N times in
turn, and prints per traced /bin/true (the run's figure minus native's, over
L) the median and minimum of the runs of:

  wall ms   the command's elapsed time
  cpu ms    user + system time of the command and everything it waited for
            (getrusage of the children): what the agent makes the machine
            do, less sensitive than wall time to the load beside it

A shared machine's load moves every figure: compare the two columns of one
run, not runs of different times.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time


def one(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1e3, cpu * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sptrace")
    ap.add_argument("old")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--loops", type=int, default=50)
    a = ap.parse_args()
    script = "for i in $(seq 1 %d); do /bin/true; done" % a.loops
    got = {"new": [], "old": [], "native": []}
    with tempfile.TemporaryDirectory(prefix="sptrace-ab-") as tmp:
        out = os.path.join(tmp, "t")
        repo = dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))
        os.environ.update(repo)
        for s in (a.sptrace, a.old):             # the repository warm
            shutil.rmtree(out, ignore_errors=True)
            one([s, "run", "-o", out, "--", "bash", "-c", script])
        for _ in range(a.runs):
            for name, s in (("new", a.sptrace), ("old", a.old)):
                shutil.rmtree(out, ignore_errors=True)
                got[name].append(one([s, "run", "-o", out, "--", "bash", "-c", script]))
            got["native"].append(one(["bash", "-c", script]))
    print("| per traced /bin/true (%d runs, load %.1f at the end) | this median | min | "
          "old median | min | this ÷ old (medians) |" % (a.runs, os.getloadavg()[0]))
    print("|---|---:|---:|---:|---:|---:|")
    for k, what in ((0, "wall ms"), (1, "cpu ms")):
        per = {n: [(r[k] - nat[k]) / a.loops for r, nat in zip(got[n], got["native"])]
               for n in ("new", "old")}
        mn, mo = statistics.median(per["new"]), statistics.median(per["old"])
        print("| %s | %.2f | %.2f | %.2f | %.2f | %.2fx |"
              % (what, mn, min(per["new"]), mo, min(per["old"]), mn / mo))


if __name__ == "__main__":
    main()
