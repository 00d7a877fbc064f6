#!/usr/bin/env python3
"""start_bench.py — instant start (issue 16, section 2), measured side by side.

    bench/start_bench.py [--rounds N] [--old OLD_SPTRACE] SPTRACE > bench/START.md

Each workload runs natively, under `sptrace run` of SPTRACE and, with --old,
under an older sptrace, one after the other in every round (this machine is
shared and noisy: minimums and medians of the rounds, ratios to the native
run of the same rounds).  Each sptrace has a repository of its own, in the
bench's temporary directory (two builds may store their calls images in two
formats, and each would make the other's again at every run); it is warm:
one untimed traced run of each workload first.

  true       /bin/true alone: the whole command, sptrace's own start included
  execs      bash running /bin/true 50 times: (traced - native) / 50 is what
             one more traced process costs -- fork, exec, the agent's start,
             its exit -- the issue's "reaches main in <= 2 ms more than native"
             plus the way out
  pipeline   bash: 30 times `echo $i | cat | wc -c` in a subshell-free loop
  make       make -j2 of a generated 13-file C project (clean first)

and `sptrace attach PID --on signal` to a sleeping process (a fresh `sleep`
each round): the time the command reports ("attached ... in X ms") and the
agent's own start to dormant (agent.log's "started in X ms").
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MAKE_FILES = 13


def make_project(d):
    """13 small C files, a Makefile: cc per file, one link."""
    for i in range(MAKE_FILES):
        with open(os.path.join(d, f"f{i}.c"), "w") as f:
            f.write(f"#include <stdio.h>\n#include <string.h>\n"
                    f"int f{i}(int x) {{ char b[64]; snprintf(b, sizeof b, \"%d\", x);"
                    f" return (int)strlen(b) + {i}; }}\n")
    with open(os.path.join(d, "main.c"), "w") as f:
        f.write("".join(f"int f{i}(int);\n" for i in range(MAKE_FILES)))
        f.write("int main(void) { int s = 0;\n")
        f.write("".join(f" s += f{i}(s);\n" for i in range(MAKE_FILES)))
        f.write(" return s == 12345; }\n")
    objs = " ".join(f"f{i}.o" for i in range(MAKE_FILES)) + " main.o"
    with open(os.path.join(d, "Makefile"), "w") as f:
        f.write(f"prog: {objs}\n\tcc -o $@ $^\n%.o: %.c\n\tcc -O2 -c -o $@ $<\n"
                f"clean:\n\trm -f prog *.o\n")


def workloads(tmp):
    proj = os.path.join(tmp, "proj")
    os.makedirs(proj)
    make_project(proj)
    return [
        ("true", ["/bin/true"], None, None),
        ("execs", ["bash", "-c", "for i in $(seq 1 50); do /bin/true; done"], None, 50),
        ("pipeline", ["bash", "-c",
                      "for i in $(seq 1 30); do echo $i | cat | wc -c; done >/dev/null"],
         None, None),
        ("make", ["make", "-s", "-j2", "-C", proj], ["make", "-s", "-C", proj, "clean"], None),
    ]


def timed(cmd, pre, env=None):
    """Seconds of cmd.  Its trace directory is new (a run into an old
    trace would time its removal) and stays until the bench ends: on a file
    system without a journal, ext4 skips every inode freed in the last 30 s
    when it makes a new one, one buffer lookup each (bench/START.md, the
    fifteenth session), so a removal before each run made every file the
    next run makes dearer -- most of one more process's cost, for both
    builds alike."""
    if pre:
        subprocess.run(pre, check=True, stdout=subprocess.DEVNULL)
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"start_bench: {' '.join(cmd)} failed ({r.returncode})")
    return dt


def attach_once(sptrace, tmp, env=None):
    """(ms the command reports, ms the agent took to dormant)."""
    out = tempfile.mkdtemp(prefix="attach.", dir=tmp)
    os.rmdir(out)                       # (sptrace attach makes it)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        time.sleep(0.1)
        r = subprocess.run([sptrace, "attach", str(sleeper.pid), "-o", out, "--on", "signal"],
                           capture_output=True, text=True, env=env)
        cmd = re.search(r"attached to pid \d+ in ([0-9.]+) ms", r.stderr + r.stdout)
        with open(os.path.join(out, "agent.log")) as f:
            agent = re.search(r"started in ([0-9.]+) ms", f.read())
        if not cmd or not agent:
            sys.exit(f"start_bench: attach: {r.stderr.strip()}")
        return float(cmd.group(1)), float(agent.group(1))
    finally:
        sleeper.kill()
        sleeper.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sptrace")
    ap.add_argument("--old", help="an older sptrace, measured in the same rounds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", help="also `sptrace run --budget BUDGET` (issue 16, section 3)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="start-bench.")
    try:
        wl = workloads(tmp)
        tools = [("native", None)] + [("sptrace run", a.sptrace)] + \
            ([("old sptrace run", a.old)] if a.old else []) + \
            ([(f"sptrace run --budget {a.budget}", a.sptrace)] if a.budget else [])
        runs = iter(range(1 << 30))
        repos = {}
        for label, tool in tools[1:]:
            repos.setdefault(tool, os.path.join(tmp, f"repo.{len(repos)}"))
        envs = {label: dict(os.environ, SPTRACE_REPO=repos[tool]) if tool else None
                for label, tool in tools}

        def cmd_of(tool, cmd, label=""):
            if not tool:
                return cmd
            budget = ["--budget", a.budget] if "--budget" in label else []
            out = os.path.join(tmp, f"trace.{next(runs)}")
            return [tool, "run", "-o", out] + budget + ["--"] + cmd

        time.sleep(31)                         # (the 30 s of timed() above, gone)
        for name, cmd, pre, _ in wl:           # warm the repository
            for label, tool in tools[1:]:
                timed(cmd_of(tool, cmd, label), pre, envs[label])
        times = {(n, l): [] for n, _, _, _ in wl for l, _ in tools}
        attach = {l: [] for l, _ in tools[1:] if "--budget" not in l}
        for rnd in range(a.rounds):
            for name, cmd, pre, _ in wl:
                # every other round in the other order: a machine that
                # gets quieter or busier favours neither
                for label, tool in (tools if rnd % 2 == 0 else tools[::-1]):
                    times[(name, label)].append(timed(cmd_of(tool, cmd, label), pre,
                                                      envs[label]))
            for label, tool in tools[1:]:
                if label in attach:
                    attach[label].append(attach_once(tool, tmp, envs[label]))
        load = os.getloadavg()[0]
        print(f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
              f"{a.rounds} rounds, load average {load:.1f} at the end\n")
        print("| workload | run by | median ms | min ms | median ÷ native median |")
        print("|---|---|---:|---:|---:|")
        for name, cmd, pre, per in wl:
            nat = statistics.median(times[(name, "native")])
            for label, _ in tools:
                v = times[(name, label)]
                print(f"| {name} | {label} | {statistics.median(v) * 1e3:.1f} | "
                      f"{min(v) * 1e3:.1f} | {statistics.median(v) / nat:.2f}x |")
        print()
        print("| sptrace attach to a sleeping process | run by | command median ms | min ms | "
              "agent to dormant median ms | min ms |")
        print("|---|---|---:|---:|---:|---:|")
        for label in attach:
            c = [x for x, _ in attach[label]]
            g = [y for _, y in attach[label]]
            print(f"| attach --on signal | {label.replace(' run', ' attach')} | "
                  f"{statistics.median(c):.1f} | {min(c):.1f} | {statistics.median(g):.1f} | "
                  f"{min(g):.1f} |")
        print()
        for name, cmd, pre, per in wl:
            if not per:
                continue
            for label, _ in tools[1:]:
                extra = [(t - n) / per * 1e3 for t, n in
                         zip(times[(name, label)], times[(name, "native")])]
                print(f"- {name}, {label}: one more traced process costs "
                      f"{statistics.median(extra):.2f} ms (median of the rounds' "
                      f"(traced - native) / {per}; min {min(extra):.2f} ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
