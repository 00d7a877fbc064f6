#!/usr/bin/env python3
"""test_callgraph.py SPTRACE UNSTRIPPED STRIPPED — the exact call graph of
tests/progs/callgraph.c.

Edges are (caller, callee) pairs from `--dump callsites`, kinds direct, plt
and tail-direct, restricted to the program's own functions; a call made
from a fragment (hot_work.cold) counts for its parent.  The unstripped
binary is compared by name; the stripped one by address, translated to
names through the unstripped symbol table.  Both must equal EXPECTED.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import callsites, check, fail, func_symbols, functions  # noqa: E402

# The call graph written in tests/progs/callgraph.c; keep the two in step.
EXPECTED = {
    ("main", "check_args"), ("main", "nest_a"), ("main", "fact"), ("main", "is_even"),
    ("main", "apply"), ("main", "tail_caller"), ("main", "hot_work"),
    ("check_args", "die"),
    ("nest_a", "nest_b"), ("nest_b", "nest_c"), ("nest_c", "leaf"),
    ("fact", "fact"),
    ("is_even", "is_odd"), ("is_odd", "is_even"),
    ("tail_caller", "tail_target"),
    ("hot_work", "report_problem"),
}
OWN = {"main", "check_args", "die", "nest_a", "nest_b", "nest_c", "leaf", "fact",
       "is_even", "is_odd", "square", "apply", "tail_caller", "tail_target",
       "hot_work", "report_problem"}
EDGE_KINDS = ("direct", "plt", "tail-direct")


def edges(exe, path, name_of):
    """Call-graph edges of path; name_of(function row) gives a function's name."""
    funcs = functions(exe, path)
    by_name = {r["name"]: r for r in funcs.values()}

    def owner(row):
        # A fragment's calls belong to its parent function.
        if row["parent"] != "-":
            check(row["parent"] in by_name, "%s: fragment %s has unknown parent %r"
                  % (path, row["name"], row["parent"]))
            return owner(by_name[row["parent"]])
        return name_of(row)

    out = set()
    for site in callsites(exe, path).values():
        if site["kind"] not in EDGE_KINDS:
            continue
        check(site["func"] in by_name, "%s: call site %s in unknown function %r"
              % (path, site["addr"], site["func"]))
        callee = funcs.get(int(site["target"], 16))
        if callee is None:
            continue  # e.g. an import through the GOT
        edge = (owner(by_name[site["func"]]), name_of(callee))
        if edge[0] in OWN and edge[1] in OWN:
            out.add(edge)
    return out


def compare(label, got):
    missing, extra = EXPECTED - got, got - EXPECTED
    if not missing and not extra:
        print("%s: call graph matches (%d edges)" % (label, len(got)))
        return None
    return ("%s: call graph differs:\n  missing: %s\n  unexpected: %s"
            % (label, sorted(missing) or "-", sorted(extra) or "-"))


def main():
    check(len(sys.argv) == 4, "usage: test_callgraph.py SPTRACE UNSTRIPPED STRIPPED")
    exe, unstripped, stripped = sys.argv[1:]

    syms = func_symbols(unstripped)

    def symbol_name(row):
        names = syms.get(int(row["addr"], 16))
        return min(names) if names else row["name"]

    errors = [compare(os.path.basename(unstripped), edges(exe, unstripped, lambda r: r["name"])),
              compare(os.path.basename(stripped), edges(exe, stripped, symbol_name))]
    errors = [e for e in errors if e]
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
