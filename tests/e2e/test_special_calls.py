#!/usr/bin/env python3
"""test_special_calls.py SPTRACE UNSTRIPPED STRIPPED — noreturn calls, .cold
fragments and tail calls in tests/progs/callgraph.c.

Ground truth from the unstripped binary (symbols and objdump):
  - every call to exit@plt, abort@plt or die (declared noreturn; it ends
    in exit) is flagged noreturn, and die itself is a noreturn function;
  - every FOO.cold symbol is a fragment whose parent is FOO: by name in the
    unstripped analysis, by the parent's address (sub_<hex>) in the
    stripped one;
  - every `jmp tail_target` is a call site of kind tail-direct whose target
    is tail_target.
At -O2 the program must really contain .cold parts and the tail jump (gcc
could silently stop emitting them); at -O0 there are none.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (callsites, check, fail, func_symbols, functions, objdump_direct_calls,  # noqa: E402
                    objdump_function)

NORETURN_CALLEES = ("exit@plt", "abort@plt", "die")


def truth(unstripped):
    syms = func_symbols(unstripped)
    addr = {n: a for a, names in syms.items() for n in names}
    noret = {site: name for site, (_, name) in objdump_direct_calls(unstripped).items()
             if name in NORETURN_CALLEES}
    cold = {addr[n]: addr[n[:-len(".cold")]] for n in addr if n.endswith(".cold")}
    tails = [a for a, text in objdump_function(unstripped, "tail_caller")
             if re.match(r"jmp\s+[0-9a-f]+ <tail_target>", text)]
    return addr, noret, cold, tails


def check_binary(exe, path, addr, noret, cold, tails):
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
    if die is None or "noreturn" not in die["flags"].split(","):
        errors.append("%s: die at %#x always ends in exit() but is not flagged noreturn "
                      "(flags %r)" % (label, addr["die"], die and die["flags"]))

    for frag, parent in sorted(cold.items()):
        f, p = funcs.get(frag), funcs.get(parent)
        if f is None or p is None:
            errors.append("%s: fragment %#x or its parent %#x not found" % (label, frag, parent))
        elif "fragment" not in f["flags"].split(",") or f["parent"] != p["name"]:
            errors.append("%s: %#x (%s) should be a fragment of %s at %#x; flags %r parent %r"
                          % (label, frag, f["name"], p["name"], parent, f["flags"], f["parent"]))

    for site in tails:
        row = sites.get(site)
        if row is None or row["kind"] != "tail-direct" or \
                int(row["target"], 16) != addr["tail_target"]:
            errors.append("%s: the tail jump at %#x to tail_target (%#x) should be a "
                          "tail-direct site; got %s" % (label, site, addr["tail_target"], row))
    if not errors:
        print("%s: %d noreturn calls, %d fragments, %d tail calls as expected"
              % (label, len(noret), len(cold), len(tails)))
    return errors


def main():
    check(len(sys.argv) == 4, "usage: test_special_calls.py SPTRACE UNSTRIPPED STRIPPED")
    exe, unstripped, stripped = sys.argv[1:]
    addr, noret, cold, tails = truth(unstripped)
    check(set(noret.values()) >= {"exit@plt", "abort@plt", "die"},
          "%s: objdump shows calls to %s only; the program lost its noreturn calls"
          % (unstripped, sorted(set(noret.values()))))
    if not unstripped.endswith("-O0"):
        check(len(cold) >= 2, "%s: gcc emitted %d .cold parts, expected hot_work.cold and "
              "check_args.cold" % (unstripped, len(cold)))
        check(tails, "%s: tail_caller has no `jmp tail_target`" % unstripped)

    errors = check_binary(exe, unstripped, addr, noret, cold, tails)
    errors += check_binary(exe, stripped, addr, noret, cold, tails)
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
