#!/usr/bin/env python3
"""Print 'N passed, N failed' from meson's JSON test log (testlog.json).

Exit status 0 only if nothing failed and at least one test ran.  Expected
failures count as passed, unexpected passes and timeouts as failed, skips are
reported as skipped."""
import json
import sys

passed = failed = skipped = 0
try:
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            result = json.loads(line).get("result", "")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:
                failed += 1
except OSError as e:
    print(f"count-tests: cannot read the meson test log: {e}", file=sys.stderr)
    failed += 1
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(0 if failed == 0 and passed > 0 else 1)
