#!/usr/bin/env python3
"""test_hotkey.py — `--on key CHORD` with the X11 backend, under Xvfb, the
chord typed by xdotool (issue 15).  tests/progs/ticker.c calls tick() every
10 ms until its standard input closes and says how many ticks it made.

  run     `sptrace run --on key Ctrl-Alt-T -- ticker`: says it waits for the
          chord (X11); nothing is traced before it; the chord starts tracing
          (meta's activated line), a second press stops it (stopped line):
          report counts tick() calls, more than 5 and fewer than the ticks
          the program made
  attach  `sptrace attach PID --on key Ctrl-Alt-T` on a running ticker: it
          waits for the chord, which starts tracing; it ends when the
          process does
  errors  no $DISPLAY: run fails before starting anything, naming $DISPLAY
          and what else it looked for; a chord with an unknown modifier, and
          one without a modifier, are refused by name

usage: test_hotkey.py SPTRACE TICKER CASE
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, run  # noqa: E402


def xvfb():
    """An Xvfb on a free display: (process, ":N")."""
    for prog in ("Xvfb", "xdotool"):
        check(shutil.which(prog), "%s is not installed (scripts/install-deps.sh installs "
              "xvfb and xdotool)" % prog)
    r, w = os.pipe()
    p = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-nolisten", "tcp", "-noreset"],
                         pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    num = b""
    deadline = time.monotonic() + 30
    while not num.endswith(b"\n") and time.monotonic() < deadline:
        d = os.read(r, 16)
        if not d:
            break
        num += d
    os.close(r)
    check(num.strip().isdigit(), "Xvfb did not say its display (%r)" % num)
    return p, ":" + num.decode().strip()


def press(display):
    r = run(["xdotool", "key", "ctrl+alt+t"], env=dict(os.environ, DISPLAY=display))
    check(r.returncode == 0, "xdotool: %r" % r.stderr)


def meta_lines(d, key):
    try:
        with open(os.path.join(d, "meta")) as f:
            return [line for line in f if line.startswith(key + " ")]
    except OSError:
        return []


def wait_meta(d, key, n, what):
    deadline = time.monotonic() + 20
    while len(meta_lines(d, key)) < n:
        if time.monotonic() > deadline:
            fail("%s: no %d '%s' line in %s/meta: %r" % (what, n, key, d, meta_lines(d, key)))
        time.sleep(0.05)


def tick_calls(sptrace, d):
    r = run([sptrace, "report", d])
    check(r.returncode == 0, "report: %r" % r.stderr)
    m = re.search(r"^ +\S+ +\S+ +\S+ +\S+ +(\d+)  tick$", r.stdout, re.M)
    return int(m.group(1)) if m else 0, r.stdout


def case_run(sptrace, ticker, tmp, display):
    out = os.path.join(tmp, "trace")
    p = subprocess.Popen([sptrace, "run", "--on", "key", "Ctrl-Alt-T", "-o", out, "--", ticker],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, DISPLAY=display))
    try:
        check(p.stdout.readline() == "ready\n", "ticker did not start")
        line = p.stderr.readline()
        check("waits for Ctrl-Alt-T (X11)" in line, "run does not say it waits for the chord: "
              "%r" % line)
        time.sleep(0.3)
        check(not meta_lines(out, "activated"), "tracing began before the chord")
        press(display)
        wait_meta(out, "activated", 1, "the first press")
        time.sleep(0.4)
        press(display)
        wait_meta(out, "stopped", 1, "the second press")
        time.sleep(0.3)
        p.stdin.close()
        p.wait(timeout=60)
        rest, err = p.stdout.read(), line + p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, "run: %d %r" % (p.returncode, err))
    check(err.count("Ctrl-Alt-T pressed") == 2, "two presses are not said: %r" % err)
    ticks = int(re.search(r"ticks (\d+)", rest).group(1))
    n, text = tick_calls(sptrace, out)
    check(5 < n < ticks, "tick() traced %d times of %d: only between the presses expected\n%s"
          % (n, ticks, text))


def case_attach(sptrace, ticker, tmp, display):
    out = os.path.join(tmp, "trace")
    prog = subprocess.Popen([ticker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    a = None
    try:
        check(prog.stdout.readline() == "ready\n", "ticker did not start")
        a = subprocess.Popen([sptrace, "attach", str(prog.pid), "--on", "key", "Ctrl-Alt-T",
                              "-o", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, DISPLAY=display))
        line = a.stdout.readline()
        check("tracing starts when Ctrl-Alt-T is pressed (X11)" in line,
              "attach does not say it waits for the chord: %r %r" %
              (line, a.stderr.read() if a.poll() is not None else ""))
        check(not meta_lines(out, "activated"), "tracing began before the chord")
        press(display)
        wait_meta(out, "activated", 1, "the press")
        time.sleep(0.4)
        prog.stdin.close()
        prog.wait(timeout=60)
        rest, err = a.communicate(timeout=60)
    finally:
        for p in (prog, a):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    check(a.returncode == 0 and "has ended" in rest, "attach: %d %r %r" %
          (a.returncode, rest, err))
    n, text = tick_calls(sptrace, out)
    check(n > 5, "tick() traced %d times after the press\n%s" % (n, text))


def case_errors(sptrace, ticker, tmp):
    env = dict(os.environ)
    env.pop("DISPLAY", None)
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "--on", "key", "Ctrl-Alt-T", "-o", out, "--", ticker], env=env)
    check(r.returncode == 2 and "$DISPLAY is not set" in r.stderr and "evdev" in r.stderr and
          not os.path.exists(os.path.join(out, "meta")),
          "run --on key without a display: %d %r" % (r.returncode, r.stderr))
    r = run([sptrace, "run", "--on", "key Ctrl-Hyper-T", "-o", out, "--", ticker])
    check(r.returncode == 2 and "'Ctrl' " not in r.stderr and "'Hyper' in 'Ctrl-Hyper-T' is not "
          "a modifier" in r.stderr, "an unknown modifier: %d %r" % (r.returncode, r.stderr))
    r = run([sptrace, "attach", "1", "--on", "key", "T"])
    check(r.returncode == 2 and "no modifier" in r.stderr,
          "a chord without a modifier: %d %r" % (r.returncode, r.stderr))


def main():
    if len(sys.argv) != 4:
        fail(__doc__)
    sptrace, ticker, case = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    tmp = tempfile.mkdtemp(prefix="sptrace-hotkey-")
    x = None
    try:
        if case == "errors":
            case_errors(sptrace, ticker, tmp)
        else:
            x, display = xvfb()
            {"run": case_run, "attach": case_attach}[case](sptrace, ticker, tmp, display)
    finally:
        if x:
            x.send_signal(signal.SIGTERM)
            x.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
