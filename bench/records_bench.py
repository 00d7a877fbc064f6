#!/usr/bin/env python3
"""records_bench.py — every record kept (issue 16), measured side by side.

    bench/records_bench.py [--rounds N] [--old OLD_SPTRACE] [--earlier FILE] BUILD \
        > bench/RECORDS.md

BUILD is a meson build directory of this tree (cli/sptrace,
tests/progs/hotthreads).  For each workload, rounds of: the program alone,
`sptrace run --flight-recorder`, `sptrace run` (every record kept, packed
into packed.<tid> while the program runs), `sptrace run --no-compact` (every
record kept as the agent writes it, 8 bytes each), and with --old the same
`sptrace run` of an older sptrace (OLD_SPTRACE: e.g. main's, before the
packing), one after the other in each round, on this shared, noisy machine.
Times are of the whole command (wall clock, medians, minimums; the packing
of the records left when the program ends included); records come from the
ring headers (trace_format.h): written = the counts, kept = what the files
hold, lost = the rest; bytes per call = the records' files' allocated size
(ring.<tid>, packed.<tid>, seg.<tid>) divided by the calls the records
describe (records / 2).  --earlier FILE: the results of an earlier run
(the RECORDS.md this one replaces) are kept below, under "Earlier runs".
--modes flight,keep,old (flight always) and --workloads hotthreads|python:
fewer runs per round, so more rounds in the same time (the fast-path part
is then left out).  --note TEXT: what BUILD and OLD are (a line under the
command).

A third part compares the fast path alone: bench/agent/calls.c `flat`
(one empty function called N times, its loop timed by the thread's CPU
clock) under --flight-recorder with this sptrace and with OLD: the window
check this sptrace adds to every record (cmp + jae after the xadd).

Workloads: tests/progs/hotthreads 8 threads x 10 M calls (the case that lost
79 % of its records to the drain), /usr/bin/python3.11 bench/agent/workload.py 2.
"""

import argparse
import glob
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from e2elib import packed_records  # noqa: E402

HEADER = struct.Struct("<QIIQQQQIIQQ16sQQQi")   # trace_ring_header
NO_END = (1 << 64) - 1


def ring_chunk(path):
    """The header's chunk: 0 for a ring (trace_format.h)."""
    with open(path, "rb") as f:
        v = HEADER.unpack(f.read(HEADER.size))
    return v[13] if v[1] >= 2 else 0


def ring_stats(tdir):
    """(written, kept, allocated bytes) over every ring.<tid> (and seg.<tid>
    of an old trace) below tdir."""
    written = kept = size = 0
    for path in glob.glob(os.path.join(tdir, "**", "ring.*"), recursive=True):
        with open(path, "rb") as f:
            v = HEADER.unpack(f.read(HEADER.size))
        version, hsize, cap, count = v[1], v[2], v[3], v[4]
        chunk, kept_end = (v[13], v[14]) if version >= 2 else (0, NO_END)
        st = os.stat(path)
        size += st.st_blocks * 512
        written += count
        if chunk:
            held = (st.st_size - hsize) // 8
            packed = os.path.join(os.path.dirname(path), "packed." + os.path.basename(path)[5:])
            if os.path.exists(packed):
                size += os.stat(packed).st_blocks * 512
                held = max(held, packed_records(packed))
            kept += min(count, kept_end, held)
        else:
            seg = os.path.join(os.path.dirname(path), "seg." + os.path.basename(path)[5:])
            segn, end = 0, 0
            if os.path.exists(seg):
                size += os.stat(seg).st_blocks * 512
                with open(seg, "rb") as f:
                    while True:
                        h = f.read(32)
                        if len(h) < 32:
                            break
                        _, first, n, _ = struct.unpack("<QQQQ", h)
                        segn += n
                        end = first + n
                        f.seek(n * 8, 1)
            ring_from = max(count - cap if count > cap else 0, end)
            kept += segn + (count - min(ring_from, count))
    return written, kept, size


def timed(cmd, env, cwd):
    """(wall s, CompletedProcess with .user and .sys: CPU s of the command's
    process tree, from wait4)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        secs = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        r = subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), out.read(),
                                        err.read())
    p.returncode = r.returncode       # reaped above
    r.user, r.sys = ru.ru_utime, ru.ru_stime
    return secs, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", help="an older sptrace (with the copying drain)")
    ap.add_argument("--calls", type=int, default=10000000, help="per thread")
    ap.add_argument("--earlier", help="an earlier RECORDS.md, kept below")
    ap.add_argument("--modes", help="the modes to run besides native, comma-separated "
                    "(default: flight,keep,raw and old with --old)")
    ap.add_argument("--workloads", help="hotthreads, python or both (default)")
    ap.add_argument("--note", help="what BUILD and OLD are, said under the command")
    a = ap.parse_args()
    sptrace = os.path.abspath(os.path.join(a.build, "cli", "sptrace"))
    hot = os.path.abspath(os.path.join(a.build, "tests", "progs", "hotthreads"))
    work = tempfile.mkdtemp(prefix="sptrace-records-bench-")
    env = dict(os.environ, SPTRACE_REPO=os.path.join(work, "repo"))
    loads = [("hotthreads 8 x %d M" % (a.calls // 1000000), [hot, "8", str(a.calls)],
              8 * a.calls)]
    if os.path.exists("/usr/bin/python3.11"):
        loads.append(("python3.11 workload.py 2",
                      ["/usr/bin/python3.11", os.path.join(HERE, "agent", "workload.py"), "2"],
                      None))
    modes = [("native", None), ("flight", [sptrace, "run", "--flight-recorder"]),
             ("keep", [sptrace, "run"]), ("raw", [sptrace, "run", "--no-compact"])]
    if a.old:
        modes.append(("old", [os.path.abspath(a.old), "run"]))
    if a.modes:
        modes = modes[:1] + [m for m in modes[1:] if m[0] in a.modes.split(",")]
        if "flight" not in a.modes.split(","):
            sys.exit("--modes: flight is the baseline of the ratios: name it")
    if a.workloads:
        loads = [x for x in loads if x[0].split()[0].startswith(a.workloads[:6])]
    started = time.time()
    # Warm the repositories (the first run analyses every module).
    for name, argv, _ in loads:
        for mode, pre in modes[1:]:
            shutil.rmtree(os.path.join(work, "t"), ignore_errors=True)
            timed(pre + ["-o", os.path.join(work, "t"), "--"] + argv, env, work)
    res = {}
    for r in range(a.rounds):
        for name, argv, calls in loads:
            for mode, pre in modes:
                tdir = os.path.join(work, "t")
                shutil.rmtree(tdir, ignore_errors=True)
                cmd = argv if pre is None else pre + ["-o", tdir, "--"] + argv
                secs, p = timed(cmd, env, work)
                if p.returncode != 0:
                    sys.exit("%s: exit %d: %s" % (" ".join(cmd), p.returncode,
                                                  p.stderr.decode()[-2000:]))
                w, k, size = ring_stats(tdir) if pre else (0, 0, 0)
                res.setdefault((name, mode), []).append((secs, w, k, size, p.user, p.sys))
                shutil.rmtree(tdir, ignore_errors=True)
    # The fast path alone: calls flat, this sptrace and OLD, flight-recorder.
    fast = {}
    if a.old and not a.modes:
        calls_bin = os.path.join(work, "calls")
        subprocess.run(["gcc", "-O2", "-o", calls_bin, os.path.join(HERE, "agent", "calls.c")],
                       check=True)
        for r in range(5):
            for mode, exe in (("new", sptrace), ("old", os.path.abspath(a.old))):
                tdir = os.path.join(work, "t")
                shutil.rmtree(tdir, ignore_errors=True)
                _, p = timed([exe, "run", "--flight-recorder", "-o", tdir, "--", calls_bin,
                              "flat", "50000000"], env, work)
                f = p.stdout.decode().split()
                fast.setdefault(mode, []).append(int(f[f.index("cpu_ns") + 1]) / 50e6)
    shutil.rmtree(work, ignore_errors=True)

    w = sys.stdout.write
    w("# Every record kept (issue 16)\n\n")
    w("Written by `bench/records_bench.py` (see its header); do not edit by hand.\n\n")
    w("- date: %s UTC; took %.0f s; %d rounds, each mode run one after the other in a "
      "round\n" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                   time.time() - started, a.rounds))
    w("- machine: %d CPUs, shared with other jobs (load average when done: %s)\n" %
      (os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])))
    w("- command: `bench/records_bench.py --rounds %d%s --calls %d%s%s%s %s > "
      "bench/RECORDS.md`%s\n" %
      (a.rounds, " --old OLD" if a.old else "", a.calls,
       " --modes " + a.modes if a.modes else "",
       " --workloads " + a.workloads if a.workloads else "",
       " --earlier bench/RECORDS.md.old" if a.earlier else "", a.build,
       "; OLD: %s" % a.old if a.old else ""))
    if a.note:
        w("- note: %s\n" % a.note)
    w("\n")
    w("Modes: **native** (the program alone), **flight** (`sptrace run --flight-recorder`: "
      "each thread's newest 16 MB), **keep** (`sptrace run`: every record, the agent "
      "growing each thread's file itself, `sptrace run` packing each finished chunk into "
      "packed.<tid>: trace_format.h, \"Packed blocks\"), **raw** (`sptrace run "
      "--no-compact`: every record as the agent wrote it, 8 bytes each)%s.\n\n" %
      (", **old** (`sptrace run` of OLD, an older sptrace)" if a.old else ""))
    w("| workload | mode | wall s median (min) | ÷ native | ÷ flight | user s | system s | "
      "records written | kept | lost | bytes per call on disk |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for name, _, calls in loads:
        nat = statistics.median(x[0] for x in res[(name, "native")])
        fl = statistics.median(x[0] for x in res[(name, "flight")])
        for mode, pre in modes:
            xs = res[(name, mode)]
            t = statistics.median(x[0] for x in xs)
            line = "| %s | %s | %.2f (%.2f) | %.2f | %s | %.2f | %.2f |" % (
                name, mode, t, min(x[0] for x in xs), t / nat,
                "%.2f" % (t / fl) if pre else "", statistics.median(x[4] for x in xs),
                statistics.median(x[5] for x in xs))
            if pre:
                wr = int(statistics.median(x[1] for x in xs))
                kp = int(statistics.median(x[2] for x in xs))
                lost = int(statistics.median(x[1] - x[2] for x in xs))
                size = statistics.median(x[3] for x in xs)
                line += " %d | %d (%.1f %%) | %d (%.1f %%) | %.2f |" % (
                    wr, kp, 100.0 * kp / wr, lost, 100.0 * lost / wr, size / (wr / 2))
            else:
                line += " | | | |"
            w(line + "\n")
    w("\nUser and system s: CPU time of the command's whole process tree (medians): "
      "the program's, the agent's and sptrace run's (its packing).  The system time of "
      "**raw** over **flight** is the kernel's work for the pages of the growing files "
      "(allocating page-cache pages, faulting them in, writing them back), 16 bytes per "
      "call; **keep** frees each chunk before it is written back (its pages are dropped "
      "from the page cache by the punched hole).\n")
    w("\nPer round (wall s):\n\n")
    for name, _, _ in loads:
        w("- %s: %s\n" % (name, "; ".join(
            "%s %s" % (mode, " ".join("%.2f" % x[0] for x in res[(name, mode)]))
            for mode, _ in modes)))
    if fast:
        n, o = statistics.median(fast["new"]), statistics.median(fast["old"])
        w("\nThe fast path alone (`calls flat 50000000` under `--flight-recorder`, the "
          "loop's thread CPU time per call, 5 rounds): this sptrace %.2f ns (min %.2f), "
          "old %.2f ns (min %.2f): ratio %.3f (min ÷ min %.3f).\n" %
          (n, min(fast["new"]), o, min(fast["old"]), n / o,
           min(fast["new"]) / min(fast["old"])))
    if a.earlier:
        w("\n## Earlier runs\n\n")
        with open(a.earlier) as f:
            lines = f.read().splitlines()
        for line in lines[1:]:
            w(("#" + line if line.startswith("#") else line) + "\n")


if __name__ == "__main__":
    main()
