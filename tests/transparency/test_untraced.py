#!/usr/bin/env python3
"""test_untraced.py AGENT PROG — the agent loaded without sptrace run (no
SPTRACE_DIR: a preload left in an environment, a program started outside
the trace) stays out of the way: PROG (tp_untraced.c: every function the
agent interposes, called once) prints the same natively and with AGENT in
LD_PRELOAD, and leaves no file behind.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from e2elib import check  # noqa: E402


def main():
    agent, prog = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPTRACE_") and k != "LD_PRELOAD"}
    with tempfile.TemporaryDirectory(prefix="sptrace-untraced-") as tmp:
        outs = []
        for preload in (None, agent):
            e = dict(env, LD_PRELOAD=preload) if preload else env
            r = subprocess.run([prog], env=e, cwd=tmp, capture_output=True, text=True,
                               timeout=60)
            outs.append((r.returncode, r.stdout, r.stderr))
        check(outs[0][0] == 0 and "execve         7" in outs[0][1],
              "the program fails natively: %r" % (outs[0],))
        check(outs[1] == outs[0], "with the agent preloaded but not started, the program "
              "behaves differently:\n--- native (exit %d)\n%s%s\n--- preloaded (exit %d)\n%s%s" %
              (outs[0][0], outs[0][1], outs[0][2], outs[1][0], outs[1][1], outs[1][2]))
        check(not os.listdir(tmp), "the agent left files: %r" % os.listdir(tmp))
    print("ok: %d calls alike natively and with the agent preloaded, not started" %
          len(outs[0][1].splitlines()))


if __name__ == "__main__":
    main()
