#!/usr/bin/env python3
"""test_debian.py SPTRACE WHAT PATH PACKAGE — analyse a real Debian binary.

PATH must exist (else the test fails and names the Debian PACKAGE to
install; test.sh installs them).  `sptrace analyze-binary` must exit 0 and,
for WHAT=sanity, give sane counts:
  - at least as many functions as .dynsym has FUNC/IFUNC symbols (distinct
    addresses) in executable sections, and >= 99% of those starts found;
  - call sites > 0, and >= 95% of them planned direct, springboard or
    relocate (the rest need a trap or cannot be patched).
For WHAT=precision, every call site it reports must be a call, jmp or jcc
instruction that objdump's linear disassembly decodes at that very address:
a site elsewhere means code was decoded from a wrong offset, and patching
it would corrupt the program.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (bogus_sites, callsites, check, fail, func_symbols, functions,  # noqa: E402
                    hexlist, need_file, objdump_insns, pct, summary)

MIN_DYNSYM_RECALL = 99.0
MIN_PLANNED = 95.0


def precision(exe, path, label):
    sites = callsites(exe, path)
    bad = bogus_sites(sites, objdump_insns(path))
    print("%s: %d of %d call sites are not a branch instruction objdump decodes there"
          % (label, len(bad), len(sites)))
    if bad:
        fail("%s: call sites at addresses where objdump decodes no call/jmp:\n    %s"
             % (label, "\n    ".join(bad[:40])))
    print("ok")


def main():
    check(len(sys.argv) == 5 and sys.argv[2] in ("sanity", "precision"),
          "usage: test_debian.py SPTRACE sanity|precision PATH PACKAGE")
    exe, what, path, package = sys.argv[1:]
    need_file(path, package)
    path = os.path.realpath(path)
    label = os.path.basename(path)
    if what == "precision":
        return precision(exe, path, label)

    s = summary(exe, path)
    dyn = func_symbols(path, dynamic=True)
    funcs = functions(exe, path)
    missing = set(dyn) - set(funcs)
    recall = pct(len(dyn) - len(missing), len(dyn))
    planned = s.get("plan_direct", 0) + s.get("plan_springboard", 0) + s.get("plan_relocate", 0)
    planned_pct = pct(planned, s["sites"])
    print("%s: %d functions (%d dynsym FUNC starts, %.1f%% found), %d call sites, "
          "%.1f%% planned direct/springboard/relocate, %d jump tables, %d landing pads"
          % (label, s["functions"], len(dyn), recall, s["sites"], planned_pct,
             s["jump_tables"], s["landing_pads"]))

    errors = []
    if s["functions"] < len(dyn):
        errors.append("%s: %d functions found, fewer than the %d .dynsym FUNC symbols"
                      % (label, s["functions"], len(dyn)))
    if recall < MIN_DYNSYM_RECALL:
        errors.append("%s: %.1f%% of the .dynsym FUNC starts found (need >= %.0f%%); "
                      "missing: %s" % (label, recall, MIN_DYNSYM_RECALL, hexlist(missing, dyn)))
    if s["sites"] <= 0:
        errors.append("%s: no call sites found" % label)
    if planned_pct < MIN_PLANNED:
        errors.append("%s: only %.1f%% of %d call sites planned direct/springboard/relocate "
                      "(need >= %.0f%%)" % (label, planned_pct, s["sites"], MIN_PLANNED))
    if len(funcs) != s["functions"]:
        errors.append("%s: --dump functions lists %d functions, the summary says %d"
                      % (label, len(funcs), s["functions"]))
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
