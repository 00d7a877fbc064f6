#!/usr/bin/env python3
"""pagecost_bench.py — the traced thread's page-cache cost per record in a
file of every record, by how a chunk's pages are got (bench/pagecost.c, see
its header), measured side by side.

    bench/pagecost_bench.py [--rounds N] [--chunks N] [--dir DIR] > bench/PAGECOST.md

Each round runs every mode once, one after the other, on a file in DIR
(default: a temporary directory under /tmp, where sptrace run's traces go in
bench/records_bench.py).  Thread CPU time, so the machine's other jobs
matter less than for wall time; medians and minimums over the rounds.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["fresh", "populate", "recycle", "recycle-zero", "ring", "ring-zero", "anon"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=128, help="of 8 MiB")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sptrace-pagecost-", dir=a.dir)
    exe = os.path.join(work, "pagecost")
    subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HERE, "pagecost.c")], check=True)
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", work], capture_output=True,
                        text=True).stdout.strip()
    started = time.time()
    res = {}
    for _ in range(a.rounds):
        for m in MODES:
            out = subprocess.run([exe, m, os.path.join(work, "f"), str(a.chunks)],
                                 capture_output=True, text=True, check=True).stdout.split()
            res.setdefault(m, []).append((float(out[2]), float(out[4])))
    shutil.rmtree(work, ignore_errors=True)
    w = sys.stdout.write
    w("# The writer's page-cache cost per record (issue 16)\n\n")
    w("Written by `bench/pagecost_bench.py` (see bench/pagecost.c's header); do not edit "
      "by hand.\n\n")
    w("- date: %s UTC; took %.0f s; %d rounds, each mode once per round; %d chunks of "
      "8 MiB (%d M records) per run\n" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                                          time.time() - started, a.rounds, a.chunks,
                                          a.chunks))
    w("- machine: %d CPUs, shared with other jobs (load average when done: %s); kernel %s; "
      "file system of the files: %s\n\n" % (os.cpu_count(), " ".join(
          open("/proc/loadavg").read().split()[:3]), os.uname().release, fs))
    fresh = statistics.median(x[0] for x in res["fresh"])
    w("| mode | writer ns per record, median (min) | ÷ fresh | packer-side ns per record |\n"
      "|---|---:|---:|---:|\n")
    for m in MODES:
        xs = res[m]
        med = statistics.median(x[0] for x in xs)
        w("| %s | %.2f (%.2f) | %.2f | %.2f |\n" % (m, med, min(x[0] for x in xs), med / fresh,
                                                   statistics.median(x[1] for x in xs)))
    w("\nWriter: the thread CPU time of the stores and of getting the pages (fallocate, "
      "mmap, the page faults on the chunk's pages: not broken down here) per record.  "
      "Packer side: the time, apart, of what the packer would do "
      "with a chunk once it is done with it (punch it out; or empty it).  **fresh** is what "
      "agent/ring.c does today (with sptrace run punching the packed chunks); **populate** "
      "faults a chunk in with one call but does the same work per page; **recycle** reuses "
      "pages the page cache holds, but mapping them again costs a fault per page still; "
      "only a region of the file mapped once and written round and round (**ring**) brings "
      "the writer to the floor of anonymous memory (**anon**), and the packer can empty "
      "its chunks by writing zeros into them without taking the writer's pages away "
      "(**ring-zero**).\n")


if __name__ == "__main__":
    main()
