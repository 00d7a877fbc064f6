#!/usr/bin/env python3
"""test_transparency.py SPTRACE MODE CASE PROG — the program never notices the agent.

MODE is `run` (sptrace run --on start) or `attach` (sptrace attach, tracing
at once).  PROG is one of the tp_*.c programs beside this file: it sets up,
prints "ready", waits for a line on stdin (an attached run is attached right
then), and does its work in tp_after_go().  The same program runs natively
and under the agent; these must be identical:

  - everything it prints on stdout, and its exit status or signal;
  - the files it leaves in its scratch directory (names, sizes, contents).

And the agent must have been there: the trace holds tp_after_go (a test that
passes because nothing was traced proves nothing).

A program may ask for `sptrace stop` or `sptrace activate` in the middle of
its work (tp_control: a line "control stop" on stdout, then it waits for a
line): traced, the command must succeed -- a stop leaves the text of every
module identical to its file -- natively nothing happens.
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from e2elib import (check, check_sanitizers, describe_exit, fail,  # noqa: E402
                    text_diff_bytes)

TIMEOUT = 120


def digest(scratch):
    """name -> (size, sha256 of at most the first MiB) for every file in scratch.
    Sizes are compared whole: a file the agent wrote code into at an address-sized
    offset is sparse and huge, and never read to its end."""
    out = {}
    for name in sorted(os.listdir(scratch)):
        path = os.path.join(scratch, name)
        st = os.lstat(path)
        h = hashlib.sha256()
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                h.update(f.read(1 << 20))
        out[name] = (st.st_size, h.hexdigest()[:16])
    return out


def handshake(p, what):
    line = p.stdout.readline()
    check(line == "ready\n", "%s: the program did not get ready (it printed %r; stderr %r)"
          % (what, line, p.stderr.read() if p.poll() is not None else ""))


def finish(p, what, control=None):
    """Send "go", answer the program's control requests (control(cmd) runs
    them when traced), and collect the rest: stdout, stderr, status."""
    timer = threading.Timer(TIMEOUT, p.kill)
    timer.start()
    out = []
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
        for line in p.stdout:
            out.append(line)
            if line.startswith("control "):
                if control:
                    control(line.split()[1])
                p.stdin.write("ok\n")
                p.stdin.flush()
        p.stdin.close()
        err = p.stderr.read()
        p.wait()
    except BrokenPipeError:
        p.kill()
        out.append(p.stdout.read())
        err = p.stderr.read()
        p.wait()
    finally:
        timeout = not timer.is_alive()
        timer.cancel()
    if timeout:
        fail("%s: no end within %d s; stdout so far %r" % (what, TIMEOUT, "".join(out)))
    return "".join(out), err, p.returncode


def meta_pid(tdir):
    with open(os.path.join(tdir, "meta")) as f:
        for line in f:
            if line.startswith("pid "):
                return int(line.split()[1])
    fail("no pid line in %s/meta" % tdir)


def controller(sptrace, env, tdir, pid_of):
    """What a traced run does at a program's "control CMD" line."""
    def control(cmd):
        pid = pid_of()
        r = subprocess.run([sptrace, cmd, str(pid)], capture_output=True, text=True,
                           timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)
        check_sanitizers(r.args, r.stderr)
        want = "tracing stopped, code restored" if cmd == "stop" else "tracing"
        check(r.returncode == 0 and want in r.stdout,
              "sptrace %s %d failed (%d): %s %s\nmeta:\n%s" % (cmd, pid, r.returncode, r.stdout,
                                                             r.stderr, read(tdir, "meta")))
        if cmd == "stop":
            diff = text_diff_bytes(pid)
            check(not diff, "after sptrace stop %d the code differs from the files (bytes): %r"
                  % (pid, diff))
    return control


def read(tdir, name):
    try:
        with open(os.path.join(tdir, name)) as f:
            return f.read()
    except OSError:
        return "(no %s)" % name


def start(argv, env=None):
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def native(prog, tmp):
    scratch = os.path.join(tmp, "native")
    os.mkdir(scratch)
    p = start([prog, scratch])
    handshake(p, "native run")
    out, err, rc = finish(p, "native run")
    return out, rc, digest(scratch)


def traced(sptrace, mode, prog, tmp, tdir):
    scratch = os.path.join(tmp, "traced")
    os.mkdir(scratch)
    env = dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))
    if mode == "run":
        p = start([sptrace, "run", "-o", tdir, "--", prog, scratch], env=env)
        handshake(p, "sptrace run")
        out, err, rc = finish(p, "sptrace run",
                              controller(sptrace, env, tdir, lambda: meta_pid(tdir)))
    else:
        p = start([prog, scratch])
        handshake(p, "the program to attach to")
        a = subprocess.run([sptrace, "attach", "-o", tdir, str(p.pid)], capture_output=True,
                           text=True, timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)
        check_sanitizers(a.args, a.stderr)
        if a.returncode != 0:
            p.kill()
            p.communicate()
            fail("sptrace attach %d failed (%d): %s %s" % (p.pid, a.returncode, a.stdout,
                                                           a.stderr))
        out, err, rc = finish(p, "the attached program", controller(sptrace, env, tdir, lambda: p.pid))
    check_sanitizers([sptrace, mode], err)
    return out, err, rc, digest(scratch)


def agent_log(tdir):
    return read(tdir, "agent.log")


def main():
    if len(sys.argv) != 5 or sys.argv[2] not in ("run", "attach"):
        fail("usage: test_transparency.py SPTRACE run|attach CASE PROG")
    sptrace, mode, case, prog = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="sptrace-tp-") as tmp:
        tdir = os.path.join(tmp, "trace")
        n_out, n_rc, n_files = native(prog, tmp)
        check(n_rc == 0, "%s: the native run itself failed: %s\n%s" % (case, describe_exit(n_rc),
                                                                       n_out))
        t_out, t_err, t_rc, t_files = traced(sptrace, mode, prog, tmp, tdir)
        log_tail = "\n".join(agent_log(tdir).splitlines()[-25:])
        check(t_rc == n_rc, "%s under %s: %s, natively %s\nstdout %r\nstderr %r\nagent.log:\n%s"
              % (case, mode, describe_exit(t_rc), describe_exit(n_rc), t_out, t_err, log_tail))
        check(t_out == n_out, "%s under %s: stdout differs\nnative:\n%s\ntraced:\n%s\nagent.log:\n%s"
              % (case, mode, n_out, t_out, log_tail))
        if t_files != n_files:
            diff = sorted(k for k in set(n_files) | set(t_files) if n_files.get(k) != t_files.get(k))
            fail("%s under %s: the files differ: %s\nnative %r\ntraced %r\nagent.log:\n%s"
                 % (case, mode, diff, {k: n_files.get(k) for k in diff},
                    {k: t_files.get(k) for k in diff}, log_tail))
        r = subprocess.run([sptrace, "replay", tdir], capture_output=True, text=True,
                           timeout=TIMEOUT, env=dict(os.environ,
                                                     SPTRACE_REPO=os.path.join(tmp, "repo")))
        check_sanitizers(r.args, r.stderr)
        check(r.returncode == 0 and "tp_after_go" in r.stdout,
              "%s under %s: the trace does not hold tp_after_go (was the agent there?): %d %s\n"
              "agent.log:\n%s" % (case, mode, r.returncode, r.stderr, log_tail))
        if case == "libs":
            # The libraries the agent uses too are the program's, traced
            # (issue 11, item 7), and not named as untraced.
            for fn in ("deflate", "inflate", "lzma_easy_buffer_encode", "elf_begin"):
                check(re.search(r"\b%s\(" % fn, r.stdout),
                      "libs under %s: no call of %s in the replay: the program's calls into "
                      "its library went untraced\nstderr %r\nagent.log:\n%s"
                      % (mode, fn, t_err, log_tail))
            check("not traced" not in t_err, "libs under %s: the summary names a library: %r"
                  % (mode, t_err))
        if case == "setuid":
            # The workers run as nobody and cannot write rings into root's
            # directory: said once, not once per call.
            n = agent_log(tdir).count("ring: cannot")
            check(n == 1, "setuid under %s: %d 'ring: cannot' lines in agent.log, want one:\n%s"
                  % (mode, n, log_tail))
        print("%s under %s: same output, exit status and files as natively; traced" % (case, mode))


if __name__ == "__main__":
    main()
