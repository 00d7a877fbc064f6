#!/usr/bin/env python3
"""test_recall.py SPTRACE UNSTRIPPED STRIPPED — stripped-binary recall.

Ground truth comes from the unstripped build (-g) of a test program:
  functions         FUNC symbols of .symtab in executable sections
  direct call sites every `call ADDR` objdump shows
The stripped copy (same code, same addresses) must give
  - >= 99% of the symbol-table function starts,
  - 100% of the direct call sites, each of kind direct or plt and with the
    target objdump shows.
The unstripped analysis must find every symbol-table function and name it
by its symbol (any alias at that address).  In both, every reported call
site must be a call/jmp/jcc that objdump decodes at that address.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (bogus_sites, callsites, check, fail, func_symbols, functions,  # noqa: E402
                    hexlist, objdump_direct_calls, objdump_insns, pct)

MIN_FUNC_RECALL = 99.0


def main():
    check(len(sys.argv) == 4, "usage: test_recall.py SPTRACE UNSTRIPPED STRIPPED")
    exe, unstripped, stripped = sys.argv[1:]
    label = os.path.basename(stripped)
    errors = []

    truth_funcs = func_symbols(unstripped)
    truth_calls = objdump_direct_calls(unstripped)
    check(truth_funcs, "no FUNC symbols in %s: was it built with symbols?" % unstripped)
    check(truth_calls, "objdump shows no direct calls in %s" % unstripped)

    # Stripped: function starts.
    sfuncs = functions(exe, stripped)
    missing = set(truth_funcs) - set(sfuncs)
    found = len(truth_funcs) - len(missing)
    frecall = pct(found, len(truth_funcs))

    # Stripped: direct call sites, present with the right kind and target.
    ssites = callsites(exe, stripped)
    absent, wrong = [], []
    for addr, (target, tname) in sorted(truth_calls.items()):
        site = ssites.get(addr)
        if site is None:
            absent.append(addr)
        elif site["kind"] not in ("direct", "plt") or int(site["target"], 16) != target:
            wrong.append("%#x: kind %s target %s, objdump says call %#x <%s>"
                         % (addr, site["kind"], site["target"], target, tname))
    cfound = len(truth_calls) - len(absent) - len(wrong)
    crecall = pct(cfound, len(truth_calls))

    print("RECALL %s: functions %d/%d (%.1f%%), direct call sites %d/%d (%.1f%%)"
          % (label, found, len(truth_funcs), frecall, cfound, len(truth_calls), crecall))

    if frecall < MIN_FUNC_RECALL:
        errors.append("%s: stripped analysis found %.1f%% of the symbol-table functions "
                      "(need >= %.0f%%); missing: %s"
                      % (label, frecall, MIN_FUNC_RECALL, hexlist(missing, truth_funcs)))
    if absent:
        errors.append("%s: %d direct call sites missing from --dump callsites: %s"
                      % (label, len(absent), hexlist(absent)))
    if wrong:
        errors.append("%s: %d direct call sites with a wrong kind or target:\n    %s"
                      % (label, len(wrong), "\n    ".join(wrong[:40])))

    # Unstripped: every symbol found and named after it.
    ufuncs = functions(exe, unstripped)
    umissing = set(truth_funcs) - set(ufuncs)
    if umissing:
        errors.append("%s: unstripped analysis lacks symbol-table functions: %s"
                      % (os.path.basename(unstripped), hexlist(umissing, truth_funcs)))
    misnamed = ["%#x: named %r, symbols %s" % (a, ufuncs[a]["name"], "/".join(sorted(names)))
                for a, names in sorted(truth_funcs.items())
                if a in ufuncs and ufuncs[a]["name"] not in names]
    if misnamed:
        errors.append("%s: functions not named after their symbol:\n    %s"
                      % (os.path.basename(unstripped), "\n    ".join(misnamed[:40])))

    insns = objdump_insns(unstripped)
    for path, sites in ((unstripped, callsites(exe, unstripped)), (stripped, ssites)):
        bad = bogus_sites(sites, insns)
        if bad:
            errors.append("%s: call sites where objdump decodes no call/jmp:\n    %s"
                          % (os.path.basename(path), "\n    ".join(bad[:40])))

    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
