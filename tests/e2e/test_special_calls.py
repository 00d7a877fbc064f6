#!/usr/bin/env python3
"""test_special_calls.py SPTRACE WHAT UNSTRIPPED STRIPPED — noreturn calls,
.cold fragments and tail calls in tests/progs/callgraph.c.

WHAT picks the behaviour checked, with ground truth from the unstripped
binary (symbols and objdump), in both the unstripped and the stripped
analysis:
  noreturn-import    every call to exit@plt or abort@plt is flagged noreturn
  noreturn-inferred  die (declared noreturn; its only exit is a call to
                     exit) is a noreturn function and calls to it are
                     flagged noreturn
  fragments          every FOO.cold symbol is a fragment whose parent is
                     FOO: by name unstripped, by the parent's address
                     (sub_<hex>) stripped
  tailcall           every `jmp tail_target` in tail_caller is a call site of
                     kind tail-direct whose target is tail_target
For fragments and tailcall the binary must really contain .cold parts and
the tail jump (gcc could silently stop emitting them): use -O2 builds.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (callsites, check, fail, func_symbols, functions,  # noqa: E402
                    objdump_direct_calls, objdump_function)

WHATS = ("noreturn-import", "noreturn-inferred", "fragments", "tailcall")
NORETURN_CALLEES = {"noreturn-import": ("exit@plt", "abort@plt"), "noreturn-inferred": ("die",)}


def truth(unstripped, what):
    syms = func_symbols(unstripped)
    addr = {n: a for a, names in syms.items() for n in names}
    noret = {site: name for site, (_, name) in objdump_direct_calls(unstripped).items()
             if name in NORETURN_CALLEES.get(what, ())}
    cold = {addr[n]: addr[n[:-len(".cold")]] for n in addr if n.endswith(".cold")}
    tails = [a for a, text in objdump_function(unstripped, "tail_caller")
             if re.match(r"jmp\s+[0-9a-f]+ <tail_target>", text)]
    return addr, noret, cold, tails


def check_binary(exe, path, what, addr, noret, cold, tails):
    label = os.path.basename(path)
    errors = []
    funcs, sites = functions(exe, path), callsites(exe, path)

    for site, callee in sorted(noret.items()):
        row = sites.get(site)
        if row is None:
            errors.append("%s: no call site at %#x (call %s)" % (label, site, callee))
        elif "noreturn" not in row["flags"].split(","):
            errors.append("%s: call site %#x calls %s (noreturn) but its flags are %r"
                          % (label, site, callee, row["flags"]))
    die = funcs.get(addr["die"])
    if what == "noreturn-inferred" and (die is None or "noreturn" not in die["flags"].split(",")):
        errors.append("%s: die at %#x always ends in exit() but is not flagged noreturn "
                      "(flags %r)" % (label, addr["die"], die and die["flags"]))

    for frag, parent in sorted(cold.items() if what == "fragments" else ()):
        f, p = funcs.get(frag), funcs.get(parent)
        if f is None or p is None:
            errors.append("%s: fragment %#x or its parent %#x not found" % (label, frag, parent))
        elif "fragment" not in f["flags"].split(",") or f["parent"] != p["name"]:
            errors.append("%s: %#x (%s) should be a fragment of %s at %#x; flags %r parent %r"
                          % (label, frag, f["name"], p["name"], parent, f["flags"], f["parent"]))

    for site in tails if what == "tailcall" else ():
        row = sites.get(site)
        if row is None or row["kind"] != "tail-direct" or \
                int(row["target"], 16) != addr["tail_target"]:
            errors.append("%s: the tail jump at %#x to tail_target (%#x) should be a "
                          "tail-direct site; got %s" % (label, site, addr["tail_target"], row))
    if not errors:
        n = {"fragments": len(cold), "tailcall": len(tails)}.get(what, len(noret))
        print("%s: %s: %d checked, as expected" % (label, what, n))
    return errors


def main():
    check(len(sys.argv) == 5 and sys.argv[2] in WHATS,
          "usage: test_special_calls.py SPTRACE %s UNSTRIPPED STRIPPED" % "|".join(WHATS))
    exe, what, unstripped, stripped = sys.argv[1:]
    addr, noret, cold, tails = truth(unstripped, what)
    if what in NORETURN_CALLEES:
        check(set(noret.values()) == set(NORETURN_CALLEES[what]),
              "%s: objdump shows calls to %s only, expected %s: the program lost its "
              "noreturn calls" % (unstripped, sorted(set(noret.values())),
                                  NORETURN_CALLEES[what]))
    if what == "fragments":
        check(len(cold) >= 2, "%s: gcc emitted %d .cold parts, expected hot_work.cold and "
              "check_args.cold" % (unstripped, len(cold)))
    if what == "tailcall":
        check(tails, "%s: tail_caller has no `jmp tail_target`" % unstripped)

    errors = check_binary(exe, unstripped, what, addr, noret, cold, tails)
    errors += check_binary(exe, stripped, what, addr, noret, cold, tails)
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
