#!/usr/bin/env python3
"""demo_hosts.py BUILD — the second half of ./demo.sh: a request followed
across hosts.

Three hosts made of network namespaces on a bridge (tests/e2e/nslib.py), a
spdaemon in each, and a small 3-tier application (tests/progs/tier.c): a
client on host 0, started by `sptrace run`, asks a frontend on host 1, which
asks a backend on host 2 (and a helper child over a pipe, and sends UDP
heartbeats to a monitor on host 2).  A decoy backend on host 2 is never
asked.  The servers run as `nobody`, untraced, until the request reaches
them.  Then `sptrace collect` gathers every host's traces and
`sptrace replay` shows them.  Everything it makes is removed at the end.
"""

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from nslib import Hosts, build_workdir  # noqa: E402

NOBODY = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]


def say(text):
    print(text, flush=True)


def main():
    sptrace, spdaemon, tmp, (tier,) = build_workdir(sys.argv[1], "sptrace-demo-hosts.",
                                                    ["tier"])
    hosts = Hosts(3)
    daemons, servers = [], []
    try:
        say("== three hosts (network namespaces) %s, a spdaemon in each" %
            ", ".join(hosts.addrs))
        daemons = hosts.start_daemons(sptrace, spdaemon, tmp)

        def start(i, argv):
            p = hosts.popen(i, NOBODY + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
            p.stdout.readline()
            servers.append(p)
            return p

        start(2, [tier, "monitor", "7001"])
        start(2, [tier, "backend", "7002"])
        start(2, [tier, "backend", "7003"])
        start(1, [tier, "frontend", "7000", hosts.addrs[2], "7002", hosts.addrs[2], "7001"])
        say("   host %s: frontend :7000 (and its helper)   host %s: backend :7002, "
            "monitor :7001 (UDP), decoy :7003" % (hosts.addrs[1], hosts.addrs[2]))
        say("")
        trace = os.path.join(tmp, "client")
        say("== sptrace run --on start -o client -- tier client %s 7000 3 5   (on host %s)" %
            (hosts.addrs[1], hosts.addrs[0]))
        r = hosts.run(0, [sptrace, "run", "--on", "start", "-o", trace, "--", tier, "client",
                          hosts.addrs[1], "7000", "3", "5"], timeout=300)
        sys.stdout.write(r.stdout + r.stderr)
        say("")
        out = os.path.join(tmp, "collected")
        say("== sptrace collect -o collected client: every host's traces of the session")
        r = hosts.run(0, [sptrace, "collect", "-o", out, trace], timeout=300)
        sys.stdout.write(r.stdout + r.stderr)
        for name in sorted(n for n in os.listdir(out) if not n.startswith(".")) \
                if os.path.isdir(out) else []:
            say("   %s/: %s" % (name, " ".join(sorted(os.listdir(os.path.join(out, name))))))
        say("")
        say("== sptrace replay collected   (each process from the receive of the request; "
            "only its application's calls and messages shown here)")
        r = subprocess.run([sptrace, "replay", out], capture_output=True, text=True, timeout=300)
        keep = re.compile(r"== host|main\(\) \{|serve_line\(|ask_backend\(|ask_helper\(|"
                          r"heartbeat\(|backend_line\(|helper\(|monitor_main|client\(|"
                          r"/\* (send|sendto|write|recv|read)\(")
        shown = 0
        for line in r.stdout.splitlines():
            if line.startswith("== host"):
                shown = 0
                say(line)
            elif keep.search(line) and shown < 14:
                shown += 1
                say(line)
        if r.returncode != 0:
            say(r.stderr)
        say("")
        say("   (the decoy on :7003 was never asked, so it was never traced)")
    finally:
        for p in servers:
            try:
                p.stdin.close()
                p.wait(timeout=10)
            except Exception:
                p.kill()
        for p in daemons:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        hosts.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
