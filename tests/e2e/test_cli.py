#!/usr/bin/env python3
"""test_cli.py SPTRACE help|usage-errors — the sptrace command line itself.

help          `sptrace --help` and `sptrace analyze-binary --help` exit 0 and
              print their usage (the latter naming its options).
usage-errors  an unknown command, an unknown option, a missing FILE and an
              unknown --dump exit non-zero, with an error whose first line
              starts with 'sptrace: ' (STYLE.md: 'sptrace: <what>: <why>');
              for a missing FILE the usage text itself will do.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, describe_exit, fail, run  # noqa: E402

OPTIONS = ["--all-loaded", "--repo", "--force", "--no-store", "--no-lines", "--dump",
           "--quiet", "--help"]


def help_(exe):
    errors = []
    for args, want in ((["--help"], ["usage: sptrace", "analyze-binary"]),
                       (["analyze-binary", "--help"],
                        ["usage: sptrace analyze-binary"] + OPTIONS)):
        p = run([exe] + args)
        label = "sptrace " + " ".join(args)
        if p.returncode != 0:
            errors.append("%s: %s" % (label, describe_exit(p.returncode)))
        lacking = [w for w in want if w not in p.stdout]
        if lacking:
            errors.append("%s: stdout lacks %s:\n%s" % (label, lacking, p.stdout))
        print("%s: %s, %d lines" % (label, describe_exit(p.returncode),
                                    len(p.stdout.splitlines())))
    if errors:
        fail("\n".join(errors))
    print("ok")


def usage_errors(exe):
    errors = []
    for args in (["frobnicate"], ["analyze-binary", "--bogus-option", "/usr/bin/ls"],
                 ["analyze-binary"], ["analyze-binary", "--no-store", "--dump", "nonsense",
                                      "/usr/bin/ls"]):
        p = run([exe] + args)
        label = "sptrace " + " ".join(args)
        first = (p.stderr.splitlines() or [""])[0]
        print("%s: %s: %s" % (label, describe_exit(p.returncode), first))
        if p.returncode <= 0:
            errors.append("%s: %s, expected a non-zero exit" % (label,
                                                                describe_exit(p.returncode)))
        if not first.startswith("sptrace: ") and \
                not (args == ["analyze-binary"] and first.startswith("usage: sptrace")):
            errors.append("%s: the first line of stderr does not start with 'sptrace: ': %r"
                          % (label, first))
    if errors:
        fail("\n".join(errors))
    print("ok")


def main():
    check(len(sys.argv) == 3 and sys.argv[2] in ("help", "usage-errors"),
          "usage: test_cli.py SPTRACE help|usage-errors")
    (help_ if sys.argv[2] == "help" else usage_errors)(sys.argv[1])


if __name__ == "__main__":
    main()
