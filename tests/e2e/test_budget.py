#!/usr/bin/env python3
"""test_budget.py SPTRACE CASE BUDGET — the overhead budget (issue 16).

`sptrace run --budget 30` lets the agent count, rather than time, the calls
of hot, short callees (agent/budget.c).  BUDGET is tests/progs/budget.c: 2
threads each call tiny() 2 M times directly, tiny_ptr() 2 M times through
a function pointer, and slow() (20 us) 50 times.

  keep    every record kept (the default): the agent decides at each chunk
  flight  --flight-recorder with a ring large enough to keep everything:
          the agent decides every 1 M records
  attach  `sptrace attach` (its default budget, 10) to the program running
          2 x 1.5 G calls: the calls from the attach on are mostly counted,
          slow's timed, both said by report and replay (an attached agent
          writes rings: the demotion itself may be overwritten)
  tail    as keep, with the program's hop() and hop_ptr() calls too, which end
          in a tail jump to tiny_tail() (direct) and tiny_tail_ptr()
          (indirect): both mostly counted, exactly, their demotions shown
          by replay (tail jumps have a mode byte of their own)
  errors  --budget with no percentage (run, attach) exits 2 with a clear
          error; run --help and attach --help document it (attach's
          default, 10)

Either way: report's Calls are exact for all three (tiny and tiny_ptr
mostly counted, marked '[N counted]'; slow never); replay shows where
each was demoted, how many calls each thread counted, and every call of
slow with its entry and exit (a duration of 20 us or more).
"""

import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, private_repo_env, run  # noqa: E402

THREADS, CALLS, SLOW = 2, 2000000, 50
DUR = re.compile(r"^\s*([0-9.]+) (ns|us|ms|s)\s+\[\s*\d+\] \|")
SCALE = {"ns": 1e-3, "us": 1, "ms": 1e3, "s": 1e6}


def report_calls(text):
    """{function: (calls, counted)} from `sptrace report`."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*[0-9.]+ +\w+ +[0-9.]+ +\w+ +(\d+)  (\S+)(?:  \[(\d+) counted\])?$", line)
        if m:
            out[m.group(2)] = (int(m.group(1)), int(m.group(3) or 0))
    return out


def check_all_calls(calls, funcs, rep):
    """report gives each of funcs every one of its THREADS * CALLS calls."""
    for f in funcs:
        n, counted = calls.get(f, (0, 0))
        check(n == THREADS * CALLS, "report: %s was called %d times, says %d (%d counted)\n%s"
              % (f, THREADS * CALLS, n, counted, rep.stdout[:3000]))


def check_slow_timed(calls):
    """slow (20 us) was called THREADS * SLOW times, every call timed."""
    n, counted = calls.get("slow", (0, 0))
    check(n == THREADS * SLOW and counted == 0,
          "report: slow (20 us) was called %d times, all timed; says %d, %d counted"
          % (THREADS * SLOW, n, counted))


def errors(sptrace, prog):
    for cmd in (["run", "--budget", "abc", "--", prog, "1", "100"],
                ["run", "--budget", "-5", "--", prog, "1", "100"],
                ["run", "--budget", "2000", "--", prog, "1", "100"],
                ["run", "--budget", "", "--", prog, "1", "100"],
                ["attach", "--budget", "x", "1"]):
        r = run([sptrace] + cmd)
        first = (r.stderr.splitlines() or [""])[0]
        check(r.returncode == 2 and first.startswith("sptrace: %s: --budget wants a percentage"
                                                     % cmd[0]),
              "sptrace %s: %d %r" % (" ".join(cmd), r.returncode, r.stderr))
    for sub, want in (("run", "--budget PERCENT"), ("attach", "overhead budget (default 10)")):
        r = run([sptrace, sub, "--help"])
        check(r.returncode == 0 and want in r.stdout,
              "sptrace %s --help does not document --budget (%r):\n%s" % (sub, want, r.stdout))
    print("ok")


def attach(sptrace, prog):
    with tempfile.TemporaryDirectory(prefix="sptrace-budget-") as tmp:
        env = private_repo_env(tmp)
        d = os.path.join(tmp, "trace")
        p = subprocess.Popen([prog, "2", "1500000000"], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)
            r = run([sptrace, "attach", "-o", d, str(p.pid)], env=env, timeout=300)
            check(r.returncode == 0, "attach failed: %r" % r.stderr[-2000:])
            out, _ = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        check(p.returncode == 0 and out.startswith("budget 2 1500000000 sum "),
              "the program under attach: %d %r" % (p.returncode, out))
        log = open(os.path.join(d, "agent.log")).read()
        check("budget: 10 %" in log, "agent.log does not say the default budget: %s" % log[-2000:])
        rep = run([sptrace, "report", d], env=env, timeout=600)
        calls = report_calls(rep.stdout)
        for f in ("tiny", "tiny_ptr"):
            n, counted = calls.get(f, (0, 0))
            check(counted > n // 2, "attach: %s's calls were not mostly counted (%d of %d):\n%s"
                  % (f, counted, n, rep.stdout[:3000]))
        check(calls.get("slow", (0, 1))[1] == 0, "attach: slow's calls were counted")
        rp = run([sptrace, "replay", d], env=env, timeout=600)
        # (a ring: the demotion itself may have been overwritten since)
        check("/* counted: tiny() x " in rp.stdout, "attach: replay shows no counted calls")
    print("ok")


def tail(sptrace, prog):
    with tempfile.TemporaryDirectory(prefix="sptrace-budget-") as tmp:
        env = private_repo_env(tmp)
        d = os.path.join(tmp, "trace")
        r = run([sptrace, "run", "--budget", "30", "-o", d, "--", prog, str(THREADS), str(CALLS),
                 "tail"], env=env, timeout=600)
        check(r.returncode == 0 and r.stdout.startswith("budget %d %d sum " % (THREADS, CALLS)),
              "the program did not run as natively under --budget: %d %r %r" %
              (r.returncode, r.stdout, r.stderr[-2000:]))
        rep = run([sptrace, "report", d], env=env, timeout=600)
        check(rep.returncode == 0, "report failed: %s" % rep.stderr[-2000:])
        calls = report_calls(rep.stdout)
        check_all_calls(calls, ("hop", "hop_ptr", "tiny_tail", "tiny_tail_ptr"), rep)
        for f in ("tiny_tail", "tiny_tail_ptr"):
            n, counted = calls[f]
            check(counted > THREADS * CALLS // 2,
                  "report: %s's calls (tail jumps) were not mostly counted (%d of %d)\n%s"
                  % (f, counted, n, rep.stdout[:3000]))
        check_slow_timed(calls)
        rp = run([sptrace, "replay", d], env=env, timeout=600)
        check(rp.returncode == 0, "replay failed: %s" % rp.stderr[-2000:])
        demoted, counted = set(), {"tiny_tail": 0, "tiny_tail_ptr": 0}
        for line in rp.stdout.splitlines():
            body = line.split("| ", 1)[-1].strip()
            m = re.match(r"/\* budget: (tiny_tail|tiny_tail_ptr)\(\) from (hop|hop_ptr) counted "
                         r"from here, not timed \*/$", body)
            if m:
                demoted.add(m.group(1))
            m = re.match(r"/\* counted: (tiny_tail|tiny_tail_ptr)\(\) x (\d+) \(from hop(_ptr)?\) \*/$",
                         body)
            if m:
                counted[m.group(1)] += int(m.group(2))
        check(demoted == {"tiny_tail", "tiny_tail_ptr"},
              "replay does not mark both tail jumps demoted (marked: %s)" % sorted(demoted))
        for f in counted:
            check(counted[f] == calls[f][1], "replay counts %d calls of %s, report %d"
                  % (counted[f], f, calls[f][1]))
    print("ok")


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in ("keep", "flight", "errors", "attach", "tail"):
        fail(__doc__)
    sptrace, case, prog = sys.argv[1:]
    if case == "errors":
        return errors(sptrace, prog)
    if case == "attach":
        return attach(sptrace, prog)
    if case == "tail":
        return tail(sptrace, prog)
    with tempfile.TemporaryDirectory(prefix="sptrace-budget-") as tmp:
        env = private_repo_env(tmp)
        d = os.path.join(tmp, "trace")
        mode = ["--flight-recorder", "--ring-size", "128"] if case == "flight" else []
        r = run([sptrace, "run", "--budget", "30", "-o", d] + mode +
                ["--", prog, str(THREADS), str(CALLS)], env=env, timeout=600)
        check(r.returncode == 0 and r.stdout.startswith("budget %d %d sum " % (THREADS, CALLS)),
              "the program did not run as natively under --budget: %d %r %r" %
              (r.returncode, r.stdout, r.stderr[-2000:]))
        log = open(os.path.join(d, "agent.log")).read()
        check("budget: 30 %" in log, "agent.log does not say the budget: %s" % log[-2000:])

        rep = run([sptrace, "report", d], env=env, timeout=600)
        check(rep.returncode == 0, "report failed: %s" % rep.stderr[-2000:])
        calls = report_calls(rep.stdout)
        check_all_calls(calls, ("tiny", "tiny_ptr"), rep)
        for f in ("tiny", "tiny_ptr"):
            n, counted = calls[f]
            check(counted > THREADS * CALLS // 2,
                  "report: %s's calls were not mostly counted (%d of %d): no demotion?\n%s"
                  % (f, counted, n, rep.stdout[:3000]))
        check_slow_timed(calls)
        check("calls of" in rep.stdout and "were counted, not timed" in rep.stdout,
              "report does not say that calls were counted:\n%s" % rep.stdout[-2000:])

        rp = run([sptrace, "replay", d], env=env, timeout=600)
        check(rp.returncode == 0, "replay failed: %s" % rp.stderr[-2000:])
        slow_lines = tiny_lines = 0
        counted = {"tiny": 0, "tiny_ptr": 0}
        demoted = set()
        for line in rp.stdout.splitlines():
            body = line.split("| ", 1)[-1].strip()
            if body in ("slow();", "} /* slow */"):
                m = DUR.match(line)
                check(m and float(m.group(1)) * SCALE[m.group(2)] >= 20,
                      "replay: a call of slow without its 20 us: %r" % line)
                slow_lines += 1
            elif body in ("tiny();", "} /* tiny */"):
                tiny_lines += 1      # (the agent's events may land inside a call)
            m = re.match(r"/\* counted: (tiny|tiny_ptr)\(\) x (\d+) \(from worker\) \*/$", body)
            if m:
                counted[m.group(1)] += int(m.group(2))
            m = re.match(r"/\* budget: (tiny|tiny_ptr)\(\) from worker counted from here, "
                         r"not timed \*/$", body)
            if m:
                demoted.add(m.group(1))
        check(slow_lines == THREADS * SLOW,
              "replay shows %d calls of slow with their exit, not %d" % (slow_lines, THREADS * SLOW))
        check(demoted == {"tiny", "tiny_ptr"},
              "replay does not mark both tiny sites demoted (marked: %s)" % sorted(demoted))
        check(counted["tiny"] + tiny_lines == THREADS * CALLS,
              "replay: %d timed calls of tiny + %d counted != %d" %
              (tiny_lines, counted["tiny"], THREADS * CALLS))
        check(counted["tiny_ptr"] == calls["tiny_ptr"][1],
              "replay counts %d calls of tiny_ptr, report %d" %
              (counted["tiny_ptr"], calls["tiny_ptr"][1]))
    print("ok")


if __name__ == "__main__":
    main()
