#!/usr/bin/env python3
"""test_all_loaded.py SPTRACE live|no-such-process — `analyze-binary --all-loaded`.

live             start `sleep 30`, analyse every module it maps executable
                 (--no-store): exit 0 and each file-backed r-x mapping of
                 /proc/PID/maps (sleep, libc, ld-linux) named in the output;
                 the sleep is killed afterwards.
no-such-process  --all-loaded 999999999: non-zero exit, 'sptrace: ' error
                 naming the pid and saying 'no such process'.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, describe_exit, fail, run  # noqa: E402

SLEEP = "/usr/bin/sleep"


def exec_modules(pid):
    mods = set()
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/"):
                mods.add(fields[5].strip())
    return mods


def wait_loaded(pid):
    """Wait until the child has exec'd sleep and the dynamic loader mapped libc."""
    deadline = time.time() + 10
    while time.time() < deadline:
        mods = exec_modules(pid)
        if any(m.endswith("/sleep") for m in mods) and any("/libc.so" in m for m in mods):
            return mods
        time.sleep(0.05)
    fail("sleep (pid %d) did not map sleep and libc within 10 s: %s" % (pid, exec_modules(pid)))


def live(exe):
    child = subprocess.Popen([SLEEP, "30"])
    try:
        mods = wait_loaded(child.pid)
        p = run([exe, "analyze-binary", "--no-store", "--all-loaded", str(child.pid)])
    finally:
        child.kill()
        child.wait()
    print("modules of pid %d: %s" % (child.pid, sorted(mods)))
    print(p.stdout[:3000])
    if p.returncode != 0:
        fail("--all-loaded %d: %s\nstderr:\n%s" % (child.pid, describe_exit(p.returncode),
                                                   p.stderr))
    shown = [line for line in p.stdout.splitlines() if line and not line.startswith(" ")]
    missing = [m for m in sorted(mods) if not any(s.endswith(m) for s in shown)]
    if missing:
        fail("--all-loaded %d did not analyse %s (modules shown: %s)"
             % (child.pid, missing, shown))
    print("ok")


def no_such_process(exe):
    p = run([exe, "analyze-binary", "--no-store", "--all-loaded", "999999999"])
    err = p.stderr.strip()
    print("stderr: %s" % err)
    if p.returncode <= 0:
        fail("--all-loaded 999999999: %s, expected a non-zero exit"
             % describe_exit(p.returncode))
    if not err.startswith("sptrace: ") or "999999999" not in err or \
            "no such process" not in err.lower():
        fail("--all-loaded 999999999: expected 'sptrace: ... 999999999 ... no such process', "
             "got %r" % err)
    print("ok")


def main():
    check(len(sys.argv) == 3 and sys.argv[2] in ("live", "no-such-process"),
          "usage: test_all_loaded.py SPTRACE live|no-such-process")
    (live if sys.argv[2] == "live" else no_such_process)(sys.argv[1])


if __name__ == "__main__":
    main()
