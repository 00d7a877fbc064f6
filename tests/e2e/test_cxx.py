#!/usr/bin/env python3
"""test_cxx.py SPTRACE WHAT UNSTRIPPED STRIPPED — C++ with exceptions
(tests/progs/exceptions.cpp), in both the unstripped and stripped analysis.

WHAT:
  landing-pads  the summary reports landing pads; every landing pad of the
                LSDA call-site tables (decoded here from .eh_frame and
                .gcc_except_table) starts a block flagged landing-pad, and no
                other block carries that flag
  callsites     every direct call objdump shows is a call site of kind direct
                or plt with the same target, including the calls in cleanup
                and catch code (destructors, _Unwind_Resume, __cxa_*_catch)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (callsites, check, dump, fail, functions, hexlist, landing_pads,  # noqa: E402
                    objdump_direct_calls, summary)

EH_CALLS = ("_Unwind_Resume@plt", "__cxa_begin_catch@plt", "__cxa_end_catch@plt",
            "__cxa_throw@plt")


def check_pads(exe, path, truth):
    label = os.path.basename(path)
    errors = []
    s = summary(exe, path)
    if s["landing_pads"] <= 0:
        errors.append("%s: summary reports %d landing pads" % (label, s["landing_pads"]))
    funcs = functions(exe, path)
    owners = set()
    for pad in truth:
        owner = [a for a, f in funcs.items() if a <= pad < a + int(f["size"], 16)]
        if not owner:
            errors.append("%s: landing pad %#x lies in no function" % (label, pad))
        owners.update(owner)
    flagged = set()
    for a in sorted(owners):
        for r in dump(exe, "cfg=%#x" % a, path):
            if "block" in r and "landing-pad" in r["flags"].split(","):
                flagged.add(int(r["addr"], 16))
    missing, extra = truth - flagged, flagged - truth
    print("%s: %d landing pads in the LSDAs, %d blocks flagged landing-pad, summary says %d"
          % (label, len(truth), len(flagged), s["landing_pads"]))
    if missing:
        errors.append("%s: %d LSDA landing pads do not start a landing-pad block: %s"
                      % (label, len(missing), hexlist(missing)))
    if extra:
        errors.append("%s: %d blocks are flagged landing-pad but no LSDA names them "
                      "(blocks split off a landing pad?): %s" % (label, len(extra),
                                                                 hexlist(extra)))
    return errors


def check_calls(exe, path, truth):
    label = os.path.basename(path)
    sites = callsites(exe, path)
    bad = []
    for addr, (target, name) in sorted(truth.items()):
        row = sites.get(addr)
        if row is None or row["kind"] not in ("direct", "plt") or \
                int(row["target"], 16) != target:
            bad.append("%#x call %#x <%s>: got %s" % (addr, target, name,
                                                     row and (row["kind"], row["target"])))
    eh = sum(1 for _, name in truth.values() if name in EH_CALLS)
    dtors = sum(1 for _, name in truth.values() if name.split("@")[0].endswith(("D1Ev", "D2Ev")))
    print("%s: %d/%d direct call sites (%d exception-runtime calls, %d destructor calls)"
          % (label, len(truth) - len(bad), len(truth), eh, dtors))
    if bad:
        return ["%s: %d direct call sites missing or wrong:\n    %s"
                % (label, len(bad), "\n    ".join(bad[:40]))]
    return []


def main():
    check(len(sys.argv) == 5 and sys.argv[2] in ("landing-pads", "callsites"),
          "usage: test_cxx.py SPTRACE landing-pads|callsites UNSTRIPPED STRIPPED")
    exe, what, unstripped, stripped = sys.argv[1:]
    if what == "landing-pads":
        truth = landing_pads(unstripped)
        check(len(truth) >= 7, "%s: only %d landing pads in the LSDAs; exceptions.cpp has "
              "cleanups in 7 functions" % (unstripped, len(truth)))
        errors = check_pads(exe, unstripped, truth) + check_pads(exe, stripped, truth)
    else:
        truth = objdump_direct_calls(unstripped)
        names = {name for _, name in truth.values()}
        check(set(EH_CALLS) <= names, "%s: objdump shows no calls to %s"
              % (unstripped, sorted(set(EH_CALLS) - names)))
        errors = check_calls(exe, unstripped, truth) + check_calls(exe, stripped, truth)
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
