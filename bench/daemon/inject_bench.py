#!/usr/bin/env python3
"""inject_bench.py BUILD [ROUNDS] — how long spdaemon's inject request takes,
from the request to the answer that the agent is in (issue 13's "remote
agent armed" figure, measured at the daemon: the agent itself does not send
the request yet).

Two hosts (network namespaces on a bridge, tests/e2e/nslib.py), a daemon in
each.  Each round starts a fresh server (tests/progs/attach_target --any, a
user's, 21 threads) on host 1 and asks, through tests/spdaemon/spd_inject:
  local   from host 1 itself (local socket);
  remote  from host 0 (its daemon forwards over mutual TLS);
alternating, so both see the same machine.  Prints Markdown: median, min
and max wall time of the request in ms, and the agent's own "started in"
time from its log.  Root only.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))
from nslib import Hosts, build_workdir  # noqa: E402


def main():
    build = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    sptrace, spdaemon, tmp, _ = build_workdir(build, "sptrace-inject-bench.")
    tool = os.path.join(build, "tests", "spdaemon", "spd_inject")
    target = os.path.join(build, "tests", "progs", "attach_target")
    hosts = Hosts(2)
    daemons, times = [], {"local": [], "remote": []}
    agent_ms = []
    try:
        daemons = hosts.start_daemons(sptrace, spdaemon, tmp)[:2]
        user = ["setpriv", "--reuid", "61001", "--regid", "61001", "--clear-groups"]
        for r in range(rounds):
            for where in ("local", "remote"):
                p = hosts.popen(1, user + [target, "--any"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
                port = int(p.stdout.readline())
                p.stdout.readline()
                src = hosts.addrs[1 if where == "local" else 0]
                t0 = time.monotonic()
                out = hosts.run(1 if where == "local" else 0,
                                [tool, "%s:40000" % src, "%s:%d" % (hosts.addrs[1], port),
                                 "bench%d%s" % (r, where)], timeout=120)
                t = (time.monotonic() - t0) * 1000
                if " injected " not in out.stdout:
                    sys.exit("inject failed: %r %r" % (out.stdout, out.stderr))
                times[where].append(t)
                tdir = out.stdout.split()[2]
                m = re.search(r"started in ([\d.]+) ms", open(os.path.join(tdir, "agent.log")).read())
                if m:
                    agent_ms.append(float(m.group(1)))
                p.stdin.close()
                p.wait(timeout=60)
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
        hosts.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("| request | rounds | median ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for where in ("local", "remote"):
        v = times[where]
        print("| %s | %d | %.1f | %.1f | %.1f |" % (
            "from the server's host (local socket)" if where == "local"
            else "from another host (forwarded over TLS)", len(v), statistics.median(v),
            min(v), max(v)))
    if agent_ms:
        print("\nThe agent's own start (its log's \"started in\"), median %.1f ms of %d." %
              (statistics.median(agent_ms), len(agent_ms)))


if __name__ == "__main__":
    main()
