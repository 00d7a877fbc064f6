#!/usr/bin/env python3
"""propagate_bench.py BUILD [ROUNDS] — issue 13's propagation figures.

Three hosts (network namespaces on a bridge, tests/e2e/nslib.py), a spdaemon
in each, as tests/e2e/test_propagate.py sets them up.  Prints Markdown:

1. Send intercepted -> receiving agent armed: a client under `sptrace run`
   (tests/progs/tier.c) sends one request to a fresh, untraced backend (one
   thread, a user's); its agent.log says how long the daemon took to answer
   (the send waits exactly that long).  The backend on another host (the
   request forwarded over mutual TLS) and on the client's own host,
   alternating; the daemons' own split (looking for holders, putting the
   agents in, the TLS connection) from spdaemon.log.
2. Served throughput of real programs, traced / native, side by side in the
   same run: redis-benchmark -> redis-server on another host (GET, one
   connection), and curl -> nginx -> python3 http.server (60 URLs on one
   kept connection).  Traced: the client under `sptrace run`, the servers
   followed into by propagation.

Root only.  The machine is shared: quote ratios measured in one run.
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

USER = ["setpriv", "--reuid", "61001", "--regid", "61001", "--clear-groups"]


def wait_port(hosts, i, addr, port):
    for _ in range(300):
        r = hosts.run(i, [sys.executable, "-c", "import socket; socket.create_connection(('%s', %d), "
                          "timeout=2).close()" % (addr, port)])
        if r.returncode == 0:
            return
        time.sleep(0.1)
    sys.exit("nothing answers on %s:%d" % (addr, port))


def med(v):
    return "%.1f | %.1f | %.1f" % (statistics.median(v), min(v), max(v)) if v else "- | - | -"


def main():
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    sptrace, spdaemon, tmp, (tier,) = build_workdir(sys.argv[1], "sptrace-prop-bench.",
                                                    ["tier"])
    hosts = Hosts(3)
    addrs = hosts.addrs
    daemons = []
    answered = {"remote": [], "local": []}
    split = {"holders": [], "agents": [], "tls": []}
    out_lines = []
    try:
        daemons = hosts.start_daemons(sptrace, spdaemon, tmp)
        # 1. armed
        port = 7100
        for r in range(rounds):
            for where in ("remote", "local"):
                port += 1
                h = 1 if where == "remote" else 0
                p = hosts.popen(h, USER + [tier, "backend", str(port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
                p.stdout.readline()
                out = os.path.join(tmp, "c%d%s" % (r, where))
                c = hosts.run(0, [sptrace, "run", "-o", out, "--", tier, "client", addrs[h],
                                  str(port), "1"], timeout=300)
                p.stdin.close()
                p.wait(timeout=60)
                m = re.search(r"answered in ([\d.]+) ms: 1 of 1", open(os.path.join(out, "agent.log")).read())
                if not m:
                    sys.exit("round %d %s: not followed: %s" % (r, where, c.stderr))
                answered[where].append(float(m.group(1)))
                shutil.rmtree(out, ignore_errors=True)
        for i in range(3):
            for line in open(os.path.join(tmp, "state%d" % i, "spdaemon.log")):
                m = re.search(r"answered in [\d.]+ ms \(\d+ rounds? of looking for holders: "
                              r"([\d.]+) ms; the agents: ([\d.]+) ms\)", line)
                if m:
                    split["holders"].append(float(m.group(1)))
                    split["agents"].append(float(m.group(2)))
                m = re.search(r"in [\d.]+ ms \(([\d.]+) ms of it the TLS connection\)", line)
                if m:
                    split["tls"].append(float(m.group(1)))
        out_lines += ["| send intercepted -> agent armed | rounds | median ms | min ms | max ms |",
                      "|---|---:|---:|---:|---:|",
                      "| receiver on another host (forwarded over TLS) | %d | %s |" %
                      (len(answered["remote"]), med(answered["remote"])),
                      "| receiver on the sender's host | %d | %s |" %
                      (len(answered["local"]), med(answered["local"])),
                      "| (daemon) looking for the holders | %d | %s |" %
                      (len(split["holders"]), med(split["holders"])),
                      "| (daemon) putting the agent in | %d | %s |" %
                      (len(split["agents"]), med(split["agents"])),
                      "| (daemon) a new TLS connection to the peer's daemon (the others "
                      "kept) | %d | %s |" %
                      (len(split["tls"]), med(split["tls"])), ""]
        # 2. throughput
        rows = []
        if shutil.which("redis-server") and shutil.which("redis-benchmark"):
            rdir = os.path.join(tmp, "redis")
            os.mkdir(rdir)
            os.chown(rdir, 61001, 61001)
            for mode in ("native", "traced"):
                rs = hosts.popen(1, USER + ["redis-server", "--port", "6400", "--bind", addrs[1],
                                            "--save", "", "--appendonly", "no", "--dir", rdir,
                                            "--protected-mode", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait_port(hosts, 0, addrs[1], 6400)
                bench = ["redis-benchmark", "-h", addrs[1], "-p", "6400", "-c", "1", "-n",
                         "20000", "-t", "get", "-q"]
                if mode == "traced":
                    bench = [sptrace, "run", "-o", os.path.join(tmp, "rb"), "--"] + bench
                t0 = time.monotonic()
                r = hosts.run(0, bench, timeout=600)
                t = time.monotonic() - t0
                rs.terminate()
                rs.wait()
                m = re.search(r"GET: ([\d.]+) requests per second", r.stdout)
                rows.append(("redis-benchmark GET -> redis-server", mode,
                             float(m.group(1)) if m else None, t))
        if shutil.which("nginx") and shutil.which("curl"):
            www = os.path.join(tmp, "www")
            os.mkdir(www)
            with open(os.path.join(www, "a.txt"), "w") as f:
                f.write("x" * 2000)
            conf = os.path.join(tmp, "nginx.conf")
            with open(conf, "w") as f:
                f.write("daemon off;\nmaster_process on;\nworker_processes 2;\nuser nobody nogroup;\n"
                        "pid %s/nginx.pid;\nerror_log %s/error.log;\nevents { worker_connections 256; }\n"
                        "http { access_log off; server { listen %s:8080; location / { "
                        "proxy_pass http://%s:8000; } } }\n" % (tmp, tmp, addrs[1], addrs[2]))
            urls = ["http://%s:8080/a.txt" % addrs[1]] * 60
            for mode in ("native", "traced"):
                py = hosts.popen(2, USER + ["/usr/bin/python3", "-m", "http.server", "8000",
                                            "--bind", addrs[2], "--directory", www],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                ng = hosts.popen(1, ["nginx", "-c", conf, "-p", tmp], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
                wait_port(hosts, 0, addrs[2], 8000)
                wait_port(hosts, 0, addrs[1], 8080)
                cmd = ["curl", "-sS", "-o", "/dev/null"] + urls
                if mode == "traced":
                    cmd = [sptrace, "run", "-o", os.path.join(tmp, "cu"), "--"] + cmd
                t0 = time.monotonic()
                hosts.run(0, cmd, timeout=600)
                t = time.monotonic() - t0
                for p in (ng, py):
                    p.terminate()
                    p.wait()
                rows.append(("curl -> nginx -> python3 http.server, 60 URLs", mode, 60 / t, t))
        out_lines += ["| chain | native req/s | traced req/s | traced / native |",
                      "|---|---:|---:|---:|"]
        names = []
        for n, _, _, _ in rows:
            if n not in names:
                names.append(n)
        for n in names:
            v = {mode: rate for name, mode, rate, _ in rows if name == n}
            if v.get("native") and v.get("traced"):
                out_lines.append("| %s | %.0f | %.0f | %.2f |" % (n, v["native"], v["traced"],
                                                                  v["traced"] / v["native"]))
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
        hosts.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(out_lines))


if __name__ == "__main__":
    main()
