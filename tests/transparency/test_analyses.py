#!/usr/bin/env python3
"""test_analyses.py SPTRACE MODE PROG [LIB] — code analyses are made outside the program.

The agent must not analyse modules inside the traced program when the
sptrace command can do it first, and a finished analysis is never lost
(issue 11, item 6).  Every case starts from an empty repository.

  run          `sptrace run PROG` (tp_sigwait): the program's modules are
               read from the repository by the agent (the CLI analysed them
               before the start); the library it dlopen's later is analysed
               inside (no lines), and `sptrace replay` gives it its source
               lines afterwards.
  attach       `sptrace attach` to PROG (tp_sigwait) waiting in fgets(stdin):
               the attach returns (it hung: the agent's DWARF reader forked
               on the control thread and glibc's fork waited for the stdin
               lock), and the agent read every entry from the repository.
  early-exit   `sptrace run PROG` (dl_exit) dlopen's LIB and exits at once:
               LIB's analysis is in the repository afterwards, with lines.
  untraced     `sptrace run PROG` (tp_sigwait) beside a copy of LIB whose
               section headers point past its end: the loader needs none,
               the analysis fails, and the library is named as not traced,
               with why, in agent.log and in the summary (issue 11, item 7);
               the program behaves as natively.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from e2elib import check, check_sanitizers, fail  # noqa: E402
sys.path.insert(0, HERE)
from test_transparency import agent_log  # noqa: E402

TIMEOUT = 120


def start_modules_from_repo(log, what):
    """The modules present at the agent's start: every one read from the repository."""
    mods = re.findall(r"^module (\d+): (\S+) bias \S+, .*\((.*)\)$", log, re.M)
    check(mods, "%s: agent.log names no module:\n%s" % (what, log))
    late = [m for m in mods if "libtp_sigwait_dl" in m[1]]
    early = [m for m in mods if m not in late]
    bad = [m for m in early if m[2] != "from the repository"]
    check(not bad, "%s: modules the agent analysed itself although the sptrace command "
          "could have first: %s\nagent.log:\n%s" % (what, bad, log))
    return late


def entry_state(sptrace, repo, lib):
    """analyze-binary's 'repository' and 'lines' lines for lib in repo."""
    r = subprocess.run([sptrace, "analyze-binary", "--repo", repo, lib], capture_output=True,
                       text=True, timeout=TIMEOUT)
    check_sanitizers(r.args, r.stderr)
    check(r.returncode == 0, "analyze-binary %s: %d %s" % (lib, r.returncode, r.stderr))
    return r.stdout


def case_run(sptrace, prog, tmp, env):
    tdir = os.path.join(tmp, "trace")
    scratch = os.path.join(tmp, "scratch")
    os.mkdir(scratch)
    p = subprocess.run([sptrace, "run", "-o", tdir, "--", prog, scratch], input="go\n",
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    check_sanitizers(p.args, p.stderr)
    check(p.returncode == 0, "sptrace run: %d\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    log = agent_log(tdir)
    late = start_modules_from_repo(log, "run")
    check(late and "analysed now, without source lines" in late[0][2],
          "run: the dlopen'd library was not analysed inside without lines: %s\n%s" % (late, log))
    r = subprocess.run([sptrace, "replay", "--srcline", tdir], capture_output=True, text=True,
                       timeout=TIMEOUT, env=env)
    check_sanitizers(r.args, r.stderr)
    check(r.returncode == 0 and re.search(r"tpdl_mix\(\).*tp_sigwait_lib\.c:\d+", r.stdout),
          "run: replay --srcline has no source line for the library's tpdl_mix: %d %s\n%s"
          % (r.returncode, r.stderr, "\n".join(l for l in r.stdout.splitlines()
                                               if "tpdl" in l)[:2000]))
    print("run: the program's modules came from the repository; the library's lines were "
          "read outside")


def case_attach(sptrace, prog, tmp, env):
    tdir = os.path.join(tmp, "trace")
    scratch = os.path.join(tmp, "scratch")
    os.mkdir(scratch)
    p = subprocess.Popen([prog, scratch], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline() == "ready\n", "attach: the program did not get ready")
        t0 = time.monotonic()
        try:
            a = subprocess.run([sptrace, "attach", "-o", tdir, str(p.pid)], capture_output=True,
                               text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            fail("attach: sptrace attach did not return within 60 s while the program waits "
                 "in fgets(stdin)\nagent.log:\n%s" % agent_log(tdir))
        check_sanitizers(a.args, a.stderr)
        check(a.returncode == 0, "attach: %d %s %s" % (a.returncode, a.stdout, a.stderr))
        took = time.monotonic() - t0
        out, err = p.communicate("go\n", timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    start_modules_from_repo(agent_log(tdir), "attach")
    print("attach: returned in %.1f s; the agent read every entry from the repository" % took)


def case_early_exit(sptrace, prog, lib, tmp, env):
    repo = env["SPTRACE_REPO"]
    tdir = os.path.join(tmp, "trace")
    p = subprocess.run([sptrace, "run", "-o", tdir, "--", prog], capture_output=True, text=True,
                       timeout=TIMEOUT, env=env)
    check_sanitizers(p.args, p.stderr)
    check(p.returncode == 0, "early-exit: sptrace run: %d\n%s" % (p.returncode, p.stderr))
    state = entry_state(sptrace, repo, lib)
    check("loaded from" in state and re.search(r"lines +[1-9]\d* rows", state),
          "early-exit: after the run the repository has no complete entry for %s:\n%s\n"
          "agent.log:\n%s" % (lib, state, agent_log(tdir)))
    print("early-exit: the library's analysis, with lines, was stored after the program ended")


def case_untraced(sptrace, prog, lib, tmp, env):
    here = os.path.join(tmp, "bin")
    os.mkdir(here)
    prog = shutil.copy(prog, here)
    bad = shutil.copy(lib, here)
    with open(bad, "r+b") as f:
        f.seek(0x28)                                  # e_shoff
        f.write(struct.pack("<Q", 1 << 40))
    scratch = os.path.join(tmp, "scratch")
    os.mkdir(scratch)
    native = subprocess.run([prog, scratch], input="go\n", capture_output=True, text=True,
                            timeout=TIMEOUT)
    check(native.returncode == 0, "untraced: the native run failed: %d %s"
          % (native.returncode, native.stdout))
    tdir = os.path.join(tmp, "trace")
    p = subprocess.run([sptrace, "run", "-o", tdir, "--", prog, scratch], input="go\n",
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    check_sanitizers(p.args, p.stderr)
    check(p.returncode == 0 and p.stdout == native.stdout,
          "untraced: sptrace run: %d, stdout %r, natively %r\n%s"
          % (p.returncode, p.stdout, native.stdout, p.stderr))
    want = re.compile(r"^sptrace: not traced: %s: .*section headers.*past the end" % re.escape(bad),
                      re.M)
    check(want.search(p.stderr), "untraced: the summary does not name %s with why:\n%s"
          % (bad, p.stderr))
    check(re.search(r"^module %s not traced: .*section headers" % re.escape(bad),
                    agent_log(tdir), re.M),
          "untraced: agent.log does not name %s:\n%s" % (bad, agent_log(tdir)))
    print("untraced: the library that cannot be analysed is named in agent.log and the summary")


def main():
    if len(sys.argv) < 4:
        fail("usage: test_analyses.py SPTRACE run|attach|early-exit|untraced PROG [LIB]")
    sptrace, mode, prog = sys.argv[1:4]
    with tempfile.TemporaryDirectory(prefix="sptrace-an-") as tmp:
        env = dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))
        if mode == "run":
            case_run(sptrace, prog, tmp, env)
        elif mode == "attach":
            case_attach(sptrace, prog, tmp, env)
        elif mode == "early-exit":
            case_early_exit(sptrace, prog, sys.argv[4], tmp, env)
        elif mode == "untraced":
            case_untraced(sptrace, prog, sys.argv[4], tmp, env)
        else:
            fail("unknown mode %s" % mode)


if __name__ == "__main__":
    main()
