#!/usr/bin/env python3
"""start_probes.py — how long each step of the agent's start takes in a new
process, from uprobes on the agent's functions (issue 16, section 2;
bench/START.md).

    bench/start_probes.py [--loops N] [--rounds R] SPTRACE [OLD_SPTRACE] > probes.md

For each build (the agent beside it: SPTRACE/../../agent/libsptrace-agent.so),
puts a uprobe on the entry and the return of agent_start, ag_modules_init,
ag_control_start and ag_control_ready (those the build has), records them with
the exec of every process (`perf record`), runs `SPTRACE run -- bash -c 'for i
in 1..N; do /bin/true; done'`, and prints, over the exec'd /bin/true processes
of R rounds, the 10th percentile (the quietest processes), the median and
the mean of:

  exec to agent_start   from the exec (sched_process_exec) to the agent's start
  FUNC                  each function's time, entry to return (the first call)
  agent_start to ag_modules_init  the start up to the analysis (trace files,
                        patch tables; the thread made, where it is made there)
  thread made to ag_modules_init  (a build that makes the thread before the
                        analysis) nothing runs there: the main thread's time
                        off the CPU once the new thread runs
  ag_modules_init to the wait     from the analysis to ag_control_ready (or,
                        where there is none, ag_control_start): pools, hooks,
                        meta, fork handlers
  agent_start to main   the rest of the start: from ag_control_ready's return
                        (or ag_control_start's) to agent_start's return

Then, without perf (whose counters each new thread inherits: a first
pthread_create took 0.16-0.18 ms under `perf record` against 0.05 without, in a
small C program on this machine), the same loop --log-rounds times per build,
and over every process's agent.log the 10th, 25th, 50th and 90th percentiles
and the mean of the agent's own "started in X ms" (agent_start to dormant, to
0.1 ms).

The builds run one after the other in every round: compare the columns of one
run.  A uprobe costs a few microseconds per hit.  Needs root (perf probe).
"""

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

FUNCS = ["agent_start", "ag_modules_init", "ag_control_start", "ag_real_pthread_create",
         "ag_threads_preopen", "ag_msgs_preopen", "register_self", "ag_control_ready"]
LINE = re.compile(r"\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):")


def agent_of(sptrace):
    lib = os.path.join(os.path.dirname(os.path.abspath(sptrace)), "..", "agent",
                       "libsptrace-agent.so")
    return os.path.normpath(lib)


def symbols(lib):
    out = subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()}


def add_probes(group, lib):
    """The events added, as GROUP:NAME."""
    have = symbols(lib)
    events = []
    for f in FUNCS + ["control_main"]:
        if f not in have:
            continue
        specs = [("", f)] + ([("_ret", f + "%return")] if f != "control_main" else [])
        for suffix, spec in specs:
            ev = f"{group}:{f}{suffix}"
            subprocess.run(["perf", "probe", "-q", "-x", lib, "-a", f"{ev}={spec}"],
                           check=True, stdout=subprocess.DEVNULL)
            events.append(ev)
    return events


def del_probes(group):
    subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def record(sptrace, events, loops, tmp):
    data = f"{tmp}/perf.data"
    out = f"{tmp}/trace"
    shutil.rmtree(out, ignore_errors=True)
    loop = f"for i in $(seq 1 {loops}); do /bin/true; done"
    cmd = ["perf", "record", "-q", "-o", data, "-e", "sched:sched_process_exec"]
    cmd += ["-e", events[0].split(":")[0] + ":*"]
    cmd += ["--", sptrace, "run", "-o", out, "--", "bash", "-c", loop]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,event"],
                          capture_output=True, text=True, check=True).stdout
    return text


def phases(text, group):
    """{phase: [ms per /bin/true process]}"""
    procs = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, t, ev = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5)
        p = procs.setdefault(pid, {"comm": comm})
        p["comm"] = comm
        if ev == "sched:sched_process_exec":
            p["exec"] = t
            continue
        if not ev.startswith(group + ":"):
            continue
        name = ev[len(group) + 1:].removesuffix("__return")
        p.setdefault(name, t)           # the first call only
    out = {}
    for p in procs.values():
        if p["comm"] != "true" or "exec" not in p or "agent_start_ret" not in p:
            continue

        def put(name, a, b):
            if a in p and b in p:
                out.setdefault(name, []).append((p[b] - p[a]) * 1000)
        put("exec to agent_start", "exec", "agent_start")
        put("pthread_create to control_main", "ag_real_pthread_create", "control_main")
        put("control_main to its opens' end", "control_main", "register_self_ret")
        for f in FUNCS:
            put(f, f, f + "_ret")
        put("agent_start to ag_modules_init", "agent_start", "ag_modules_init")
        if "ag_control_ready" in p:
            put("thread made to ag_modules_init", "ag_control_start_ret", "ag_modules_init")
        wait = "ag_control_ready" if "ag_control_ready" in p else "ag_control_start"
        put("ag_modules_init to the wait", "ag_modules_init_ret", wait)
        last = wait + "_ret"
        put("agent_start to main", last, "agent_start_ret")
    return out


def started_in(sptrace, loops, tmp):
    """agent.log's start times (ms) of every process of one traced loop."""
    out = f"{tmp}/trace"
    shutil.rmtree(out, ignore_errors=True)
    loop = f"for i in $(seq 1 {loops}); do /bin/true; done"
    subprocess.run([sptrace, "run", "-o", out, "--", "bash", "-c", loop],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    times = []
    for log in glob.glob(f"{out}/exec.*/agent.log"):
        with open(log) as f:
            m = re.search(r"started in ([\d.]+) ms", f.read())
        if m:
            times.append(float(m.group(1)))
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--log-rounds", type=int, default=20)
    ap.add_argument("sptrace", nargs="+")
    a = ap.parse_args()
    builds = [(f"sp{i}", s, agent_of(s)) for i, s in enumerate(a.sptrace)]
    results = {g: {} for g, _, _ in builds}
    tmp = tempfile.mkdtemp(prefix="start-probes-")
    try:
        for _ in range(a.rounds):
            for group, sptrace, lib in builds:
                del_probes(group)
                events = add_probes(group, lib)
                try:
                    text = record(sptrace, events, a.loops, tmp)
                finally:
                    del_probes(group)
                for k, v in phases(text, group).items():
                    results[group].setdefault(k, []).extend(v)
        logged = {g: [] for g, _, _ in builds}
        for _ in range(a.log_rounds):
            for group, sptrace, _ in builds:
                logged[group] += started_in(sptrace, a.loops, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    names = (["exec to agent_start"] + FUNCS + ["pthread_create to control_main",
             "control_main to its opens' end", "agent_start to ag_modules_init",
             "thread made to ag_modules_init",
             "ag_modules_init to the wait", "agent_start to main"])
    print("| phase | " + " | ".join(f"{s} p10 ms | median | mean" for _, s, _ in builds) + " |")
    print("|---|" + "---:|---:|---:|" * len(builds))
    for n in names:
        cells = []
        for g, _, _ in builds:
            v = results[g].get(n)
            cells.append(f"{statistics.quantiles(v, n=10)[0]:.3f} | {statistics.median(v):.3f} | "
                         f"{statistics.mean(v):.3f}" if v and len(v) > 1 else "- | - | -")
        print(f"| {n} | " + " | ".join(cells) + " |")
    counts = ", ".join(f"{s}: {len(results[g].get('agent_start', []))}" for g, s, _ in builds)
    print(f"\n/bin/true processes measured: {counts}; load average {os.getloadavg()[0]:.1f}")
    print("\n| agent.log's \"started in\", no perf | processes | p10 ms | p25 | median | p90 | "
          "mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for g, s, _ in builds:
        v = logged[g]
        if len(v) < 2:
            continue
        d, q = statistics.quantiles(v, n=10), statistics.quantiles(v, n=4)
        print(f"| {s} | {len(v)} | {d[0]:.2f} | {q[0]:.2f} | {statistics.median(v):.2f} | "
              f"{d[-1]:.2f} | {statistics.mean(v):.3f} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
