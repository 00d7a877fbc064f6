#!/usr/bin/env python3
"""fork_exit_phases.py — a traced bash's fork of a child and the end of that
child, from kernel tracepoints (issue 16, section 2; bench/START.md).

    bench/fork_exit_phases.py [--loops N] [--runs R] SPTRACE [OLD_SPTRACE] > phases.md

Runs `perf record -a` with scheduler and system-call tracepoints (the agent
does not see them) on `SPTRACE run -- bash -c 'for i in 1..N; do /bin/true;
done'`, natively, under SPTRACE and under OLD_SPTRACE, R times each one after
the other, and prints per child of bash (the first two left out: they make the
areas of the loop) the medians of:

  fork ms          bash's clone(), from its entry to the child's creation
                   (sched_process_fork): the address space copied
  clone ms         bash's clone(), entry to return
  exit ms          the child (the exec'd /bin/true), from its exit_group to
                   bash's wait4 returning its pid
  exit to last     exit_group to the last of its threads' sched_process_exit
  last to wait     from there to wait4's return: the last thread's teardown
                   (the address space when it is the last user), the parent
                   woken
  last's end       the last thread's sched_process_exit to its switch out as
                   a dead task (its teardown, and any time it was preempted)
  threads          the child's threads at its end
  last is ctl      the share of children whose last thread out is the agent's
                   control thread (a mean, not a median)

With --child, another command in the loop, and --prog the program whose
processes are measured, with the process that forked each (default: the
command's first word; e.g. --child 'gcc -c -o x.o x.c' --prog
/usr/lib/gcc/x86_64-linux-gnu/12/cc1: each cc1 and its gcc).

Times include perf's own cost and whatever the machine's load adds; compare
the columns of one run.  Needs root.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

EVENTS = ["sched:sched_process_exit", "sched:sched_process_fork", "sched:sched_process_exec",
          "syscalls:sys_exit_wait4", "syscalls:sys_enter_exit_group",
          "syscalls:sys_enter_clone", "syscalls:sys_exit_clone", "sched:sched_switch"]
LINE = re.compile(r"\s*(.+?)\s+(-?\d+)/(-?\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)")


def record(cmd, tmp):
    data = f"{tmp}/perf.data"
    args = ["perf", "record", "-q", "-a", "-o", data]
    for e in EVENTS:
        args += ["-e", e]
    # the command's pid, to tell its processes from the machine's others
    wrap = ["sh", "-c", f'echo $$ > {tmp}/pid; exec "$@"', "sh"]
    subprocess.run(args + ["--"] + wrap + cmd, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    with open(f"{tmp}/pid") as f:
        root = int(f.read())
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                         capture_output=True, text=True, check=True).stdout
    return root, out.splitlines()


def phases(root, lines, prog):
    ev = []
    for ln in lines:
        m = LINE.match(ln)
        if m:
            comm, pid, tid, t, name, rest = m.groups()
            ev.append((float(t) * 1000, comm, int(pid), int(tid), name.split(":")[1], rest))
    # Only the command's own processes (perf -a sees the whole machine): the
    # descendants of the command.
    ev.sort(key=lambda e: e[0])
    ours = {root}
    forks = {}
    execd = set()
    for e in ev:
        if e[4] == "sched_process_fork" and e[2] in ours:
            m = re.search(r" pid=(\d+) .*child_pid=(\d+)", e[5])
            ours.add(int(m.group(2)))
            forks[int(m.group(2))] = (int(m.group(1)), e[0])
        elif e[4] == "sched_process_exec" and e[2] in ours and f"filename={prog} " in e[5]:
            execd.add(e[2])
    switches = [e for e in ev if e[4] == "sched_switch"]  # a dead task's pid is -1
    ev = [e for e in ev if e[2] in ours]
    # each child with the thread that forked it (bash, or gcc for cc1)
    kids = sorted((forks[c][1], c, forks[c][0]) for c in execd if c in forks)
    rows = []
    for t_fork, kid, bash_tid in kids[2:]:
        enter = max((e[0] for e in ev if e[3] == bash_tid and e[4] == "sys_enter_clone"
                     and e[0] <= t_fork), default=None)
        ret = min((e[0] for e in ev if e[3] == bash_tid and e[4] == "sys_exit_clone"
                   and e[0] >= t_fork), default=None)
        group = [e for e in ev if e[2] == kid]
        eg = [e[0] for e in group if e[4] == "sys_enter_exit_group"]
        ends = [e for e in group if e[4] == "sched_process_exit"]
        wait = [e[0] for e in ev if e[3] == bash_tid and e[4] == "sys_exit_wait4"
                and int(e[5], 16) == kid]
        if not eg or not ends or not wait:
            continue
        last = max(ends, key=lambda e: e[0])
        # the last thread's end: its switch out as a dead task
        dead = [e[0] for e in switches if e[0] >= last[0] and
                f" prev_pid={last[3]} " in e[5] and re.search(r"prev_state=[XZ]", e[5])]
        if not dead:
            continue
        row = {} if enter is None or ret is None else {    # (clone3: posix_spawn)
            "fork ms": t_fork - enter, "clone ms": ret - enter}
        rows.append(row | {"exit ms": wait[0] - eg[-1], "exit to last": last[0] - eg[-1],
                     "last to wait": wait[0] - last[0], "last's end": dead[0] - last[0],
                     "threads": len(ends),
                     "last is ctl": 1 if last[1].startswith("sptrace-ctl") else 0})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", type=int, default=22, help="children per bash (default 22)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each, alternating (default 1)")
    ap.add_argument("--child", default="/bin/true",
                    help="the command bash runs N times (default /bin/true)")
    ap.add_argument("--prog", help="the program measured, as exec'd (default: --child's "
                    "first word)")
    ap.add_argument("sptrace")
    ap.add_argument("old", nargs="?")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("fork_exit_phases.py: needs root (perf record -a on tracepoints)")
    loop = f"for i in $(seq 1 {a.loops}); do {a.child}; done"
    tmp = tempfile.mkdtemp(prefix="sptrace-forkexit.")
    runs = [("native", [])]
    runs.append(("this", [a.sptrace, "run", "-o", f"{tmp}/t", "--"]))
    if a.old:
        runs.append(("old", [a.old, "run", "-o", f"{tmp}/t", "--"]))
    rows = {name: [] for name, _ in runs}
    try:
        for _ in range(a.runs):
            for name, pre in runs:
                shutil.rmtree(f"{tmp}/t", ignore_errors=True)
                rows[name] += phases(*record(pre + ["bash", "-c", loop], tmp),
                                     a.prog or a.child.split()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ["fork ms", "clone ms", "exit ms", "exit to last", "last to wait", "last's end",
            "threads",
            "last is ctl"]
    names = [n for n, _ in runs]
    print("| per child of bash (median of " +
          ", ".join(f"{len(rows[n])} {n}" for n in names) + ") | " +
          " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k in keys:
        vals = [[r[k] for r in rows[n] if k in r] for n in names]
        if k == "last is ctl":   # a share, not a median
            cells = [f"{statistics.mean(v):.2f}" if v else "-" for v in vals]
        else:
            cells = [f"{statistics.median(v):.3f}" if v else "-" for v in vals]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
