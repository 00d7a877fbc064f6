#!/usr/bin/env python3
"""start_phases.py — where a traced bash's fork+exec of /bin/true goes,
from the system calls (issue 16, section 2; bench/START.md).

    bench/start_phases.py [--loops N] SPTRACE [OLD_SPTRACE] > phases.md

Runs `perf trace -T` (kernel tracepoints: the agent does not see it, as it
would see strace's ptrace) on `SPTRACE run -- bash -c 'for i in 1..N; do
/bin/true; done'`, then the same under OLD_SPTRACE, one after the other, and
prints per child of bash (the first two left out: they make the areas of the
loop) the medians of:

  fork copy ms     bash, from its first memfd_create after the last fork to
                   the clone: the patch-area pools copied for the child
  pool MB copied   bytes written into pool memfds there
  child mmaps      MAP_FIXED mappings of pools the child made before exec
  pre-exec calls   the child's system calls before execve, and their ms
  post-exec calls  the new image's system calls (the agent's start, /bin/true,
                   its exit), and their ms
  files made       mkdir, mknod and creating opens over the child's life,
                   and their ms
  pools made       memfd_create in the new image

System call times include perf trace's own cost and whatever the machine's
load adds; compare the columns of one run, not figures of different runs.
Needs root (perf trace).
"""

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"\s*([\d.]+) \(\s*([\d.]*)(?: ms)?\s*\): (\S+)/(\d+) (\w+)\((.*)")
CLONE = re.compile(r"\s*[\d.]+ \(\s*[\d.]* ms\): \S+/(\d+)(?: clone\(clone_flags: CHILD_CLEARTID"
                   r".*| +\.\.\. \[continued\]: clone\(\)\)) += (\d+)")


def trace(sptrace, loops, tmp):
    out = f"{tmp}/trace"
    log = f"{tmp}/perf.txt"
    shutil.rmtree(out, ignore_errors=True)
    loop = f"for i in $(seq 1 {loops}); do /bin/true; done"
    subprocess.run(["perf", "trace", "-T", "-o", log, "--", sptrace, "run", "-o", out, "--",
                    "bash", "-c", loop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    with open(log) as f:
        return f.read().splitlines()


def phases(lines):
    ev = []
    kids = []
    for ln in lines:
        m = LINE.match(ln)
        if m:
            t, d, _, pid, sc, rest = m.groups()
            ev.append((float(t), float(d or 0), pid, sc, rest))
        m = CLONE.match(ln)
        if m:
            kids.append((m.group(1), m.group(2)))
    # bash: the process that forked most
    parents = [p for p, _ in kids]
    bash = max(set(parents), key=parents.count)
    kids = [k for p, k in kids if p == bash]
    rows = []
    for kid in kids[2:]:
        k = [e for e in ev if e[2] == kid]
        ex = [i for i, e in enumerate(k) if e[3] == "execve"]
        if not ex:
            continue
        pre, post = k[:ex[0]], k[ex[0] + 1:]
        start = k[0][0]
        before = [e for e in ev if e[2] == bash and e[0] < start]
        fork = max([i for i, e in enumerate(before) if e[3] == "clone"] or [len(before)])
        last = max([i for i, e in enumerate(before[:fork]) if e[3] in ("wait4", "clone")] or [-1])
        copy = [e for e in before[last + 1:fork] if e[3] == "memfd_create" or
                (e[3] == "pwrite64" and "sptrace-pool" in e[4])]
        fork_t = before[fork][0] if fork < len(before) else start
        made = [e for e in k if e[3] in ("mkdir", "mknodat") or
                (e[3] == "openat" and "CREAT" in e[4] and ("TRUNC" in e[4] or e[1] > 0.1))]
        rows.append({
            "fork copy ms": fork_t - copy[0][0] if copy else 0.0,
            "pool MB copied": sum(int(m.group(1)) for e in copy
                                  for m in [re.search(r"count: (\d+)", e[4])] if m) / 1e6,
            "child mmaps": sum(1 for e in pre if e[3] == "mmap" and "SHARED|FIXED" in e[4]),
            "pre-exec calls": len(pre),
            "pre-exec ms": sum(e[1] for e in pre),
            "post-exec calls": len(post),
            "post-exec ms": sum(e[1] for e in post),
            "files made": len(made),
            "files ms": sum(e[1] for e in made),
            "pools made": sum(1 for e in post if e[3] == "memfd_create"),
        })
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sptrace")
    ap.add_argument("old", nargs="?")
    ap.add_argument("--loops", type=int, default=10)
    a = ap.parse_args()
    tools = [("this", a.sptrace)] + ([("old", a.old)] if a.old else [])
    tmp = tempfile.mkdtemp(prefix="start-phases.")
    try:
        res = {label: phases(trace(s, a.loops, tmp)) for label, s in tools}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = list(next(iter(res.values()))[0].keys())
    print("| per child of bash (median of %s) | %s |" %
          (", ".join(f"{len(res[lb])} {lb}" for lb, _ in tools),
           " | ".join(lb for lb, _ in tools)))
    print("|---|" + "---:|" * len(tools))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{statistics.median(r[k] for r in res[lb]):.2f}"
                                       for lb, _ in tools) + " |")


if __name__ == "__main__":
    sys.exit(main())
