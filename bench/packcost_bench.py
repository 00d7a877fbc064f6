#!/usr/bin/env python3
"""packcost_bench.py — the packer's CPU per record by part (bench/packcost.c:
analysis/pack.c's column encoder, and zstd at several levels), over the raw
records of a `sptrace run --no-compact` trace.

    bench/packcost_bench.py [--rounds N] BUILD > bench/PACKCOST.md

BUILD is a meson build directory of this tree (cli/sptrace,
tests/progs/hotthreads).  Workloads: hotthreads 8 x 5 M calls, and
/usr/bin/python3.11 bench/agent/workload.py 1 (one thread: its file's
records are read into memory whole, about 1.8 GB).  Thread CPU time, medians
over the rounds.
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-python", action="store_true", help="hotthreads only")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="sptrace-packcost-")
    exe = os.path.join(work, "packcost")
    inc = ["-I" + os.path.join(TOP, d) for d in ("analysis", "common", "codeanalysis")]
    subprocess.run(["gcc", "-O2", "-D_GNU_SOURCE", "-D_FILE_OFFSET_BITS=64"] + inc +
                   ["-I" + build, "-I/usr/include/libdwarf", "-o", exe,
                    os.path.join(HERE, "packcost.c"), "-lzstd", "-lz"], check=True)
    env = dict(os.environ, SPTRACE_REPO=os.path.join(work, "repo"))
    loads = [("hotthreads 8 x 5 M", [os.path.join(build, "tests", "progs", "hotthreads"), "8",
                                     "5000000"])]
    if not a.no_python and os.path.exists("/usr/bin/python3.11"):
        loads.append(("python3.11 workload.py 1", ["/usr/bin/python3.11",
                                                    os.path.join(HERE, "agent", "workload.py"),
                                                    "1"]))
    started = time.time()
    res = {}
    for name, argv in loads:
        tdir = os.path.join(work, "t")
        shutil.rmtree(tdir, ignore_errors=True)
        subprocess.run([os.path.join(build, "cli", "sptrace"), "run", "--no-compact", "-o", tdir,
                        "--"] + argv, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        files = glob.glob(os.path.join(tdir, "ring.*"))
        for _ in range(a.rounds):
            out = subprocess.run([exe] + files, capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                f = line.split()
                res.setdefault((name, int(f[1])), []).append(
                    (float(f[3]), float(f[5]), float(f[7]), float(f[9]), int(f[11])))
        shutil.rmtree(tdir, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    w = sys.stdout.write
    w("# The packer's CPU per record, by part (issue 16)\n\n")
    w("Written by `bench/packcost_bench.py` (see bench/packcost.c's header); do not edit by "
      "hand.\n\n")
    w("- date: %s UTC; took %.0f s; %d rounds\n" % (
        time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), time.time() - started, a.rounds))
    w("- machine: %d CPUs, shared with other jobs (load average when done: %s)\n\n" % (
        os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])))
    w("| workload | zstd level | encoder ns per record | zstd ns per record | columns, bytes "
      "per call | after zstd | records |\n|---|---:|---:|---:|---:|---:|---:|\n")
    for (name, level), xs in res.items():
        w("| %s | %d | %.2f | %.2f | %.2f | %.3f | %d |\n" % (
            name, level, statistics.median(x[0] for x in xs),
            statistics.median(x[1] for x in xs), xs[0][2], xs[0][3], xs[0][4]))
    w("\nLevel 1 is pack.c's (ZSTD_LEVEL).  Not counted here: reading the chunk (pread), "
      "writing the block, punching the chunk out (about 1.4 ns a record: bench/PAGECOST.md, "
      "packer side of **fresh**).\n")


if __name__ == "__main__":
    main()
