#!/usr/bin/env python3
"""marks_bench.py BUILD [ROUNDS] — the two ways a traced TCP send is matched
to its receive (issue 13: `sptrace run --mark offset|oob`), side by side.

Three hosts (network namespaces on a bridge, tests/e2e/nslib.py), a spdaemon
in each, as tests/e2e/test_propagate.py sets them up.  Each round, for each
method in turn and each server: a fresh, untraced server on host 1 (a
user's) and on host 0 its client under `sptrace run --mark METHOD`: `tier
backend` (tests/progs/tier.c: poll, then read) and a python3 server (its
thread blocked in recv when the agent comes), each asked by `tier client
HOST1 PORT 3 5` (two requests on one connection); `tier monitor` (UDP: poll,
then recv) sent two datagrams by a python3 client (with --mark oob the first
carries the IP option, after the daemons' probe).  Prints Markdown:

1. Correct matches (the ground truth): the server was traced, its first
   traced receive is the request's first byte (stream offset 0 by offset;
   1 with the mark, whose byte comes first), its agent.log says it found the
   request by the method asked (UDP: replay says ipopt, or hash), and every
   byte it received is the untraced run's ("3\\n5\\n", "beat 3\\nbeat 5\\n").
2. Send intercepted -> receiving agent armed: the "answered in" of the
   client's agent.log (the traced send waits exactly that long).
3. The client's whole run (`sptrace run` included), wall clock.
4. The mark's own cost at the sender: one send(MSG_OOB|MSG_MORE) of a byte
   before a send, against the send alone, on a loopback connection in one
   namespace (N pairs each, alternating batches; a thread drains the
   receiving end), per send, in microseconds; UDP: setsockopt(IP_OPTIONS),
   sendto, setsockopt(IP_OPTIONS, none) against sendto alone.

Root only.  The machine is shared: compare the two columns of one run.
"""

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))
from nslib import Hosts, build_workdir  # noqa: E402

USER = ["setpriv", "--reuid", "61001", "--regid", "61001", "--clear-groups"]
METHODS = ("offset", "oob")
# A server whose thread blocks in recv (the mark comes while it is in the
# call): accepts one connection, answers each line, prints what it got.
PYSERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
got = b""
while True:
    b = c.recv(4096)
    if not b:
        break
    got += b
    for line in b.split(b"\n")[:-1]:
        c.sendall(b"py " + line + b"\n")
print("backend got " + got.hex(), flush=True)
"""
# A UDP client: two datagrams to the monitor.
PYUDP = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in (3, 5):
    s.sendto(b"beat %d\n" % n, (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.05)
"""
SERVERS = ("tier", "python3", "monitor")


def med(v):
    return "%.1f | %.1f | %.1f" % (statistics.median(v), min(v), max(v)) if v else "- | - | -"


def one_round(hosts, sptrace, tier, tmp, method, port, r, server):
    """(correct, why, armed ms, client s) of one round."""
    addrs = hosts.addrs
    argv = ([tier, "backend", str(port)] if server == "tier" else
            [tier, "monitor", str(port)] if server == "monitor" else
            ["/usr/bin/python3", "-c", PYSERVER, str(port)])
    p = hosts.popen(1, USER + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    out = os.path.join(tmp, "c%d%s%s" % (r, method, server))
    t0 = time.monotonic()
    client = ([tier, "client", addrs[1], str(port), "3", "5"] if server != "monitor" else
              ["/usr/bin/python3", "-c", PYUDP, addrs[1], str(port)])
    c = hosts.run(0, [sptrace, "run", "--mark", method, "-o", out, "--"] + client, timeout=300)
    secs = time.monotonic() - t0
    got, _ = p.communicate("", timeout=60)
    with open(os.path.join(out, "agent.log")) as f:
        clog = f.read()
    m = re.search(r"answered in ([\d.]+) ms: 1 of 1", clog)
    armed = float(m.group(1)) if m else None
    session = re.search(r"session (\S+);", clog)
    bdir = os.path.join(tmp, "state1", "sessions", session.group(1) if session else "-",
                        str(p.pid))
    why = ""
    if c.returncode != 0 or not m:
        why = "not followed: %s" % c.stderr[-300:]
    elif server == "monitor" and "monitor got %s" % b"beat 3\nbeat 5\n".hex() not in got:
        why = "the monitor received other bytes: %r" % got
    elif server != "monitor" and "backend got %s" % b"3\n5\n".hex() not in got:
        why = "the backend received other bytes: %r" % got
    elif not os.path.isdir(bdir):
        why = "the backend was not traced"
    else:
        with open(os.path.join(bdir, "agent.log")) as f:
            blog = f.read()
        rp = subprocess.run([sptrace, "replay", bdir], capture_output=True, text=True)
        if server == "monitor":
            how = "ipopt" if method == "oob" else "hash"
            if not re.search(r"^# followed from a traced send: the receive of udp \S+ -> \S+ "
                             r"by %s$" % how, rp.stdout, re.M):
                why = "the monitor's datagram was not found by %s" % how
            shutil.rmtree(out, ignore_errors=True)
            return not why, why, armed, secs
        first = re.search(r"(?:recv\w*|read)\(tcp [0-9.:]+ <- %s:\d+, bytes (\d+)\.\." %
                          re.escape(addrs[0]), rp.stdout)
        want = "1" if method == "oob" else "0"
        found = ("urgent byte" in blog and "the traced send's" in blog if method == "oob"
                 else "at stream offset 0" in blog)
        if not first or first.group(1) != want:
            why = "the first traced receive is not the request's first byte"
        elif not found:
            why = "its agent.log does not say it found the request by %s" % method
    shutil.rmtree(out, ignore_errors=True)
    return not why, why, armed, secs


def mark_cost(pairs):
    """Microseconds per send: (send alone, mark + send), loopback."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    a = socket.create_connection(ls.getsockname())
    b, _ = ls.accept()
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stop = threading.Event()

    def drain():
        b.settimeout(0.2)
        while not stop.is_set():
            try:
                b.recv(65536)
            except socket.timeout:
                pass
            except OSError:
                return

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    times = {"send": [], "mark": []}
    batch = 1000
    for _ in range(pairs // batch):
        for kind in ("send", "mark"):
            t0 = time.perf_counter()
            for _ in range(batch):
                if kind == "mark":
                    a.send(b"\xa5", socket.MSG_OOB | socket.MSG_MORE)
                a.send(b"x")
            times[kind].append((time.perf_counter() - t0) / batch * 1e6)
    stop.set()
    a.close()
    t.join()
    b.close()
    ls.close()
    # UDP: the option on for one datagram and off again
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.bind(("127.0.0.1", 0))
    r.setblocking(False)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    opt = bytes([7, 11, 12]) + b"SPTR" + (1).to_bytes(4, "big") + b"\0"
    dst = r.getsockname()
    for _ in range(pairs // batch):
        for kind in ("udp", "udpmark"):
            t0 = time.perf_counter()
            for _ in range(batch):
                if kind == "udpmark":
                    u.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, opt)
                u.sendto(b"x", dst)
                if kind == "udpmark":
                    u.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, b"")
            times.setdefault(kind, []).append((time.perf_counter() - t0) / batch * 1e6)
            try:
                while True:
                    r.recv(64)
            except BlockingIOError:
                pass
    u.close()
    r.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    sptrace, spdaemon, tmp, (tier,) = build_workdir(sys.argv[1], "sptrace-marks-bench.",
                                                    ["tier"])
    hosts = Hosts(3)
    daemons = []
    res = {(m, k): {"ok": 0, "armed": [], "secs": [], "why": []} for m in METHODS
           for k in SERVERS}
    try:
        daemons = hosts.start_daemons(sptrace, spdaemon, tmp)
        port = 7300
        for r in range(rounds):
            for server in SERVERS:
                for method in (METHODS if r % 2 == 0 else METHODS[::-1]):
                    port += 1
                    ok, why, armed, secs = one_round(hosts, sptrace, tier, tmp, method, port, r,
                                                     server)
                    v = res[(method, server)]
                    v["ok"] += ok
                    if why:
                        v["why"].append(why)
                    if armed is not None:
                        v["armed"].append(armed)
                    v["secs"].append(secs * 1000)
        cost = mark_cost(100000)
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
        hosts.close()
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("| server | --mark | correct matches | armed: median ms | min | max | client run: "
          "median ms | min | max |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in SERVERS:
        for m in METHODS:
            v = res[(m, k)]
            print("| %s | %s | %d of %d | %s | %s |" % (
                "tier backend (poll, then read)" if k == "tier" else
                "UDP: tier monitor (poll, then recv)" if k == "monitor" else
                "python3 (blocked in recv)", m, v["ok"], rounds, med(v["armed"]), med(v["secs"])))
    print()
    print("| loopback, per send (median of %d batches of 1000) | us |" % (100000 // 1000))
    print("|---|---:|")
    print("| TCP send(1 byte) | %.2f |" % cost["send"])
    print("| TCP send(MSG_OOB\\|MSG_MORE, the mark) + send(1 byte) | %.2f |" % cost["mark"])
    print("| the urgent byte's own cost | %.2f |" % (cost["mark"] - cost["send"]))
    print("| UDP sendto(1 byte) | %.2f |" % cost["udp"])
    print("| UDP IP_OPTIONS on, sendto(1 byte), off | %.2f |" % cost["udpmark"])
    print("| the IP option's own cost | %.2f |" % (cost["udpmark"] - cost["udp"]))
    for (m, k), v in res.items():
        for w in v["why"]:
            print("\n%s, %s: %s" % (k, m, w))


if __name__ == "__main__":
    main()
