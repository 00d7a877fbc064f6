#!/usr/bin/env python3
"""test_jumptables.py SPTRACE UNSTRIPPED STRIPPED SOURCE — switch jump tables.

SOURCE (tests/progs/switch.c) names its dense switch functions and their
number of distinct case bodies on a 'SWITCH_FUNCS:' line.  For each of them
the ground truth is read from the unstripped binary: objdump gives the
`jmp *%reg` of the switch, the table address (the last rip-relative lea
before it) and the bound (the last `cmp $K`); the K+1 int32 entries of the
table, read from the file, give the case targets.

In both the unstripped and the stripped analysis (`--dump cfg=FUNC`):
  - the block that ends in that jmp has `table` successors whose addresses
    are exactly the case targets (at least as many as the case bodies),
  - the summary reports at least one jump table per dense switch,
  - sparse_switch (a compare tree) has no table successors.
"""

import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import (check, dump, fail, func_symbols, hexlist, objdump_function,  # noqa: E402
                    read_vaddr, summary)


def switch_funcs(source):
    with open(source) as f:
        m = re.search(r"SWITCH_FUNCS:((?:\s+\w+=\d+)+)", f.read())
    check(m is not None, "%s has no 'SWITCH_FUNCS:' line" % source)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def table_truth(path, name):
    """(jmp address, set of case targets) of the switch in function name."""
    insns = objdump_function(path, name)
    jmp = lea = bound = None
    for addr, text in insns:
        if re.match(r"(notrack\s+)?jmp\s+\*%r\w+$", text):
            jmp = addr
            break
        m = re.match(r"lea\s+-?0x[0-9a-f]+\(%rip\),%r\w+\s+# ([0-9a-f]+)", text)
        if m:
            lea = int(m.group(1), 16)
        m = re.match(r"cmpl?\s+\$0x([0-9a-f]+),", text)
        if m:
            bound = int(m.group(1), 16)
    check(jmp is not None and lea is not None and bound is not None,
          "%s: cannot find the jump-table pattern of %s in objdump "
          "(jmp %s, table %s, bound %s)" % (path, name, jmp, lea, bound))
    n = bound + 1
    entries = struct.unpack("<%di" % n, read_vaddr(path, lea, 4 * n))
    return jmp, {(lea + e) & 0xffffffffffffffff for e in entries}


def cfg_tables(exe, path, func):
    """Blocks of func with table successors: dict block address -> (size, set of targets)."""
    rows = dump(exe, "cfg=" + func, path)
    blocks = [r for r in rows if "block" in r]
    addr_of = {r["block"]: int(r["addr"], 16) for r in blocks}
    out = {}
    for r in blocks:
        targets = {addr_of[s.split(":")[0]] for s in r["successors"].split()
                   if s.endswith(":table")}
        if targets:
            out[int(r["addr"], 16)] = (int(r["size"]), targets)
    return out


def check_binary(exe, path, label, dense, truth, func_arg):
    errors = []
    s = summary(exe, path)
    print("%s: %d jump tables (%d targets)" % (label, s["jump_tables"], s["jump_table_targets"]))
    if s["jump_tables"] < len(dense):
        errors.append("%s: summary reports %d jump tables, the program has %d dense switches"
                      % (label, s["jump_tables"], len(dense)))
    for name, bodies in sorted(dense.items()):
        jmp, targets = truth[name]
        tables = cfg_tables(exe, path, func_arg(name))
        got = None
        for baddr, (size, succ) in tables.items():
            if baddr <= jmp < baddr + size:
                got = succ
        if got is None:
            errors.append("%s: %s: the block ending in the switch's `jmp *` at %#x has no "
                          "table successors (blocks with table edges: %s)"
                          % (label, name, jmp, hexlist(tables) or "none"))
            continue
        if got != targets or len(got) < bodies:
            errors.append("%s: %s: table successors of the jmp at %#x differ from the table in "
                          "the file (%d case bodies written)\n  missing: %s\n  unexpected: %s"
                          % (label, name, jmp, bodies, hexlist(targets - got) or "-",
                             hexlist(got - targets) or "-"))
        else:
            print("  %s: %d table targets, all case blocks covered" % (name, len(got)))
    sparse = cfg_tables(exe, path, func_arg("sparse_switch"))
    if sparse:
        errors.append("%s: sparse_switch has table successors at %s, but gcc emitted compares"
                      % (label, hexlist(sparse)))
    return errors


def main():
    check(len(sys.argv) == 5, "usage: test_jumptables.py SPTRACE UNSTRIPPED STRIPPED SOURCE")
    exe, unstripped, stripped, source = sys.argv[1:]
    dense = switch_funcs(source)
    truth = {}
    for name, bodies in dense.items():
        truth[name] = table_truth(unstripped, name)
        check(len(truth[name][1]) >= bodies,
              "%s: the table of %s has %d distinct targets, fewer than the %d case bodies "
              "switch.c declares: did gcc merge cases?" % (unstripped, name,
                                                           len(truth[name][1]), bodies))
    addr = {n: a for a, names in func_symbols(unstripped).items() for n in names}

    errors = check_binary(exe, unstripped, os.path.basename(unstripped), dense, truth,
                          lambda n: n)
    errors += check_binary(exe, stripped, os.path.basename(stripped), dense, truth,
                           lambda n: "%#x" % addr[n])
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
