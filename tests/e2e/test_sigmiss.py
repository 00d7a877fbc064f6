#!/usr/bin/env python3
"""test_sigmiss.py — an indirect call's miss interrupted by a signal whose
handler misses too (tests/progs/sigmiss.c): under `sptrace run` every call
still reaches the function its pointer named.  The agent passes a missed
call's target through ag_tls_target while it looks it up; a handler's own
miss used to leave its target there, and the interrupted call went to the
handler's function (about 1 call in 100 on the session that found it).

usage: test_sigmiss.py SPTRACE SIGMISS
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, run  # noqa: E402


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    sptrace, prog = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="sptrace-sigmiss-") as tmp:
        r = run([sptrace, "run", "--flight-recorder", "-o", os.path.join(tmp, "trace"), "--",
                 prog, "2000000"], timeout=300)
        check(r.returncode == 0 and r.stdout == "calls 2000000 wrong 0 bad_in_handler 0\n",
              "calls went to the wrong function under sptrace run: %d %r %r" %
              (r.returncode, r.stdout, r.stderr[-1000:]))
    print("ok")


if __name__ == "__main__":
    main()
