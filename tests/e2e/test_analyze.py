#!/usr/bin/env python3
"""test_analyze.py — `sptrace analyze` on traces whose culprit is known
(issue 14's ground truth): tests/progs/workers.c forks 16 identical workers
under `sptrace run`; worker 5 goes wrong.

  loop   it enters spin_forever(), a loop that calls nothing (the parent
         kills it once the others are done): ranked first, by the earliest
         last timestamp, spin_forever named
  crash  it writes through a null pointer in crash_here(): ranked first by
         the earliest last timestamp, crash_here named
  slow   it also calls slow_path() every round: ranked first by its suspect
         score (k-th nearest neighbour), the culprit path through slow_path

Each checks the JSON of the Contract: anomalies ranked from 1, kind
"process", the culprit's function the last of its path.

usage: test_analyze.py SPTRACE WORKERS CASE
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, run  # noqa: E402


def main():
    if len(sys.argv) != 4:
        fail(__doc__)
    sptrace, workers, case = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="sptrace-analyze-")
    try:
        out = os.path.join(tmp, "trace")
        r = run([sptrace, "run", "-o", out, "--", workers, "16", "5", case], timeout=300)
        check(r.returncode == 0, "workers under sptrace run: %d %r" % (r.returncode, r.stderr))
        m = re.search(r"^worker 5 pid (\d+)$", r.stdout, re.M)
        check(m, "workers did not name worker 5: %r" % r.stdout)
        bad = int(m.group(1))
        a = run([sptrace, "analyze", "--json", out], timeout=300)
        check(a.returncode == 0, "sptrace analyze --json: %d %r" % (a.returncode, a.stderr))
        doc = json.loads(a.stdout)
        top = doc["anomalies"]
        check(len(top) >= 16, "analyze ranked %d processes, not the 16 workers and the parent" %
              len(top))
        for i, x in enumerate(top):
            check(x["rank"] == i + 1 and x["kind"] == "process" and x["flow"] is None and
                  isinstance(x["host"], str) and isinstance(x["pid"], int) and
                  isinstance(x["score"], (int, float)) and isinstance(x["method"], str) and
                  isinstance(x["causes"], list), "anomaly %d does not have the Contract's "
                  "shape: %r" % (i + 1, x))
            if x["culprit"] is not None:
                check(x["culprit"]["path"] and x["culprit"]["function"] ==
                      x["culprit"]["path"][-1], "a culprit's function is not its path's last: %r"
                      % x["culprit"])
            for k, c in enumerate(x["causes"]):
                check(c["rank"] == k + 1 and isinstance(c["path"], list) and c["why"],
                      "a cause without rank, path or why: %r" % c)
        first = top[0]
        want = {"loop": ("earliest-last-timestamp", "spin_forever"),
                "crash": ("earliest-last-timestamp", "crash_here"),
                "slow": ("knn-manhattan", "slow_path")}[case]
        check(first["pid"] == bad, "the worker that went wrong (pid %d) is not ranked first:\n%s"
              % (bad, run([sptrace, "analyze", out]).stdout[:3000]))
        check(first["method"] == want[0], "found by %s, not %s" % (first["method"], want[0]))
        check(want[1] in first["culprit"]["path"], "the culprit path %r does not go through %s" %
              (first["culprit"]["path"], want[1]))
        if case != "slow":
            check(first["culprit"]["function"] == want[1], "the culprit is %s, not %s" %
                  (first["culprit"]["function"], want[1]))
        text = run([sptrace, "analyze", "--top", "2", out]).stdout
        check(" 1. " in text and "pid %d" % bad in text and " 3. " not in text,
              "the table (--top 2): %r" % text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
