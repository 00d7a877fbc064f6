#!/usr/bin/env python3
"""test_flows.py — `sptrace flows DIR [--json]` on real traces, against
the known requests.

Cases:
  server  tests/progs/tier.c's backend under `sptrace run --on accept`
          serves three connections of a client that is not traced, with
          1, 2 and 3 requests ("N\\n" lines, each answered before the next is
          sent): one flow per request, six, the first starting at the
          accept and the others at the receive of their request, each in
          the server's process and thread alone, in the order sent; the
          table lists the same six; `--flow f3` shows the third request's
          read (the second connection's bytes 2..) and its work; --help, an
          unknown flow, a missing directory.
  exec    `sh -c 'ls / >/dev/null; true'` under `sptrace run`: the shell's
          children exec'd programs traced in subdirectories; one flow,
          the shell's, crossing the shell and each child.
  tiers   the propagated session of test_propagate.py's tiers case (a client
          under `sptrace run --on start` on host 0 asks a frontend on host
          1, which asks a backend, a pipe helper and a UDP monitor on host 2;
          a decoy is never asked), gathered by `sptrace collect`: the
          client's requests are one job of its one thread, so one flow,
          starting at the client's start and crossing exactly the client,
          the frontend, its helper, the backend and the monitor (matched by
          TCP byte ranges, the pipe's inode, datagram numbers), never the
          decoy; `--flow f1` shows each one's work under its host.
  tiers-oob  the same with `run --mark oob`: each followed TCP connection's
          first send marked by an urgent byte, which takes a byte of the
          stream at both ends' offsets (the same flow, matched the same way).

usage: test_flows.py CASE SPTRACE [SPDAEMON] [TIER]
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, free_port, private_repo_env, run  # noqa: E402


def meta_value(d, key):
    with open(os.path.join(d, "meta")) as f:
        for line in f:
            if line.startswith(key + " "):
                return line[len(key) + 1:].rstrip("\n")
    return None


def flows_json(sptrace, d, env=None):
    r = run([sptrace, "flows", "--json", d], env=env)
    check(r.returncode == 0, "sptrace flows --json %s: %d %r" % (d, r.returncode, r.stderr))
    try:
        doc = json.loads(r.stdout)
    except ValueError as e:
        fail("sptrace flows --json is not JSON (%s): %r" % (e, r.stdout[:500]))
    check(set(doc) == {"flows"}, "the JSON's keys are %s" % sorted(doc))
    for f in doc["flows"]:
        check(set(f) == {"id", "start", "processes", "duration_ns", "events"} and
              set(f["start"]) == {"host", "pid", "tid", "event"} and
              all(set(p) == {"host", "pid"} for p in f["processes"]) and
              isinstance(f["id"], str) and isinstance(f["duration_ns"], int) and
              f["duration_ns"] >= 0 and isinstance(f["events"], int) and f["events"] > 0,
              "a flow not as the contract says: %r" % f)
    check(len({f["id"] for f in doc["flows"]}) == len(doc["flows"]), "flow ids repeat")
    return doc["flows"]


def case_server(sptrace, tier, tmp):
    env = private_repo_env(tmp)
    out = os.path.join(tmp, "trace")
    port = free_port()
    p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out, "--", tier, "backend",
                          str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    check(line.startswith("ready "), "the backend did not start: %r" % line)
    sent = []
    for conn in (["3"], ["5", "8"], ["2", "4", "6"]):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        f = s.makefile("rw")
        for n in conn:
            f.write(n + "\n")
            f.flush()
            answer = f.readline()
            check(answer.startswith("backend %s -> " % n), "request %s: %r" % (n, answer))
            sent.append(n)
        f.close()
        s.close()
    try:
        _, err = p.communicate(input="", timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("the traced backend did not end when its input closed")
    check(p.returncode == 0, "sptrace run: %d %r" % (p.returncode, err[-1000:]))
    pid = int(meta_value(out, "pid"))
    host = meta_value(out, "host")
    flows = flows_json(sptrace, out, env)
    check(len(flows) == len(sent), "%d flows for %d requests: %s" % (len(flows), len(sent),
                                                                     json.dumps(flows)))
    for i, f in enumerate(flows):
        want = "accept" if i == 0 else "recv"
        check(f["start"] == {"host": host, "pid": pid, "tid": pid, "event": want},
              "flow %d starts at %r, expected the %s of request %s in %s:%d" %
              (i + 1, f["start"], want, sent[i], host, pid))
        check(f["processes"] == [{"host": host, "pid": pid}],
              "flow %d crosses %r" % (i + 1, f["processes"]))
        check(f["events"] >= 10, "flow %d has %d events: the request's work is missing" %
              (i + 1, f["events"]))
    # the table: a header and one line per flow, by the same ids
    r = run([sptrace, "flows", out], env=env)
    check(r.returncode == 0, "sptrace flows: %r" % r.stderr)
    rows = [l.split() for l in r.stdout.splitlines() if not l.startswith("#")]
    check(r.stdout.startswith("# %d flows in %s\n" % (len(sent), out)) and
          [row[0] for row in rows] == [f["id"] for f in flows] and
          [row[1] for row in rows] == [f["start"]["event"] for f in flows],
          "the table does not list the flows:\n%s" % r.stdout)
    # one flow's records: the third request's (the second connection's second
    # line, its bytes 2..4) read and its work
    r = run([sptrace, "flows", "--flow", "f3", out], env=env)
    head = "# flow f3: recv at %s:%d/%d" % (host, pid, pid)
    check(r.returncode == 0 and r.stdout.startswith(head) and
          "backend_line() {" in r.stdout and "work() {" in r.stdout and
          re.search(r"read\(tcp 127\.0\.0\.1:%d <- 127\.0\.0\.1:\d+, bytes 2\.\.3\)" % port,
                    r.stdout), "flows --flow f3:\n%s%s" % (r.stdout[:3000], r.stderr))
    r = run([sptrace, "flows", "--flow", "f99", out], env=env)
    check(r.returncode == 2 and "no such flow" in r.stderr, "flows --flow f99: %r" % r.stderr)
    r = run([sptrace, "flows", "--help"])
    check(r.returncode == 0 and "--json" in r.stdout and "duration_ns" in r.stdout,
          "flows --help: %r" % r.stdout)
    r = run([sptrace, "flows", os.path.join(tmp, "none")])
    check(r.returncode != 0 and r.stderr.startswith("sptrace: flows: ") and
          os.path.join(tmp, "none") in r.stderr, "flows of no directory: %r" % r.stderr)


def case_exec(sptrace, tmp):
    env = private_repo_env(tmp)
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", out, "--", "/bin/sh", "-c", "/bin/ls / >/dev/null; /bin/true"],
            env=env)
    check(r.returncode == 0, "sptrace run sh: %r" % r.stderr[-1000:])
    pid = int(meta_value(out, "pid"))
    host = meta_value(out, "host")
    with open(os.path.join(out, "meta")) as f:
        children = [int(l.split()[2]) for l in f if l.startswith("exec ")]
    check(len(children) == 2, "the shell's exec lines: %s" % children)
    flows = flows_json(sptrace, out, env)
    check(len(flows) == 1, "%d flows, expected the shell's one: %s" % (len(flows),
                                                                     json.dumps(flows)))
    check(flows[0]["start"] == {"host": host, "pid": pid, "tid": pid, "event": "start"},
          "the flow starts at %r" % flows[0]["start"])
    check(flows[0]["processes"] == [{"host": host, "pid": p} for p in [pid] + children],
          "the flow crosses %r, expected the shell %d then %s" % (flows[0]["processes"], pid,
                                                                 children))


def case_tiers(sptrace, spdaemon, tier, tmp, mark=None):
    import test_propagate as tp

    ts = tp.TiersSession(sptrace, spdaemon, tier, tmp, mark=mark)
    try:
        client = int(meta_value(ts.trace, "pid"))
        _, a1, a2 = ts.addrs
        client_host = [h for h in os.listdir(ts.out)
                       if os.path.isdir(os.path.join(ts.out, h, str(client)))]
        check(len(client_host) == 1, "OUT has the client %d under %s" % (client, client_host))
        want = {(client_host[0], client), (a1, ts.pids["frontend"]), (a1, ts.helper),
                (a2, ts.pids["backend"]), (a2, ts.pids["monitor"])}
        flows = flows_json(sptrace, ts.out)
        got = [{(p["host"], p["pid"]) for p in f["processes"]} for f in flows]
        check(len(flows) == 1, "%d flows, expected the client's one: %s" % (len(flows),
                                                                          json.dumps(flows)))
        f = flows[0]
        check(f["start"] == {"host": client_host[0], "pid": client, "tid": client,
                             "event": "start"}, "the flow starts at %r" % f["start"])
        check(got[0] == want and len(f["processes"]) == len(want),
              "the flow crosses %s, expected %s" % (sorted(got[0]), sorted(want)))
        check((a2, ts.pids["decoy"]) not in got[0], "the flow crosses the decoy")
        # rule 8: every receive after the send it matched (a send is stamped
        # when its call began, each trace's TSC rate taken over its life)
        r = run([sptrace, "flows", ts.out], timeout=300)
        check(r.returncode == 0 and "property:" not in r.stdout,
              "flows finds receives before their sends:\n%s" % r.stdout[:2000])
        pipes_agree(sptrace, os.path.join(ts.out, a1, str(ts.pids["frontend"])),
                    os.path.join(ts.out, a1, str(ts.helper)))
        # its records: each process's work, under its host
        r = run([sptrace, "flows", "--flow", "f1", ts.out], timeout=300)
        check(r.returncode == 0, "flows --flow f1: %r" % r.stderr[-1000:])
        for host, pid, func in ((client_host[0], client, "main"),
                                (a1, ts.pids["frontend"], "serve_line"),
                                (a1, ts.helper, "helper"),
                                (a2, ts.pids["backend"], "backend_line"),
                                (a2, ts.pids["monitor"], "monitor_main")):
            check(re.search(r"^ +[0-9.-]+  %s:%d/\d+ +%s\(\) \{" % (re.escape(host), pid,
                                                                  re.escape(func)),
                            r.stdout, re.M) or
                  re.search(r"^ +[0-9.-]+  %s:%d/\d+ +.*%s" % (re.escape(host), pid,
                                                              re.escape(func)), r.stdout, re.M),
                  "flows --flow f1 lacks %s in %s:%d:\n%s" % (func, host, pid, r.stdout[-3000:]))
        if os.environ.get("SPTRACE_KEEP_TREE"):
            shutil.copytree(ts.out, os.environ["SPTRACE_KEEP_TREE"], symlinks=True)
        # where the request's time went: client, frontend, backend, back
        crit = [l for l in r.stdout.splitlines() if re.match(r"^# +[0-9.-]+ +[0-9.-]+ ", l)]
        hosts = [re.search(r"  (\S+):(\d+)/\d+(  -> a message)?$", l).group(1) for l in crit]
        print("critical path: %s" % " ".join(hosts))
        check(crit and hosts[0] == client_host[0] and hosts[-1] == client_host[0] and
              a1 in hosts and a2 in hosts and hosts.index(a1) < hosts.index(a2),
              "the critical path of f1 does not go client -> frontend -> backend -> ... -> "
              "client:\n%s" % "\n".join(crit))
        skewed_clock(sptrace, ts.out, a2, f["duration_ns"], tmp)
    finally:
        ts.close()


def pipe_msgs(sptrace, d):
    """{(inode, "read"|"write"): [(start, end)]} of the trace d's pipe messages."""
    r = run([sptrace, "replay", d], timeout=300)
    check(r.returncode == 0, "replay %s: %r" % (d, r.stderr[-1000:]))
    out = {}
    for call, ino, a, b in re.findall(r"(read|write)\(pipe (\d+), bytes (\d+)\.\.(\d+)\)",
                                       r.stdout):
        out.setdefault((ino, call), []).append((int(a), int(b)))
    return out


def pipes_agree(sptrace, front, helper):
    """The frontend and its helper read and write each answer whole over two
    pipes: each read names the bytes of exactly one write at the other end."""
    f, h = pipe_msgs(sptrace, front), pipe_msgs(sptrace, helper)
    down = [ino for ino, call in f if call == "write"]
    up = [ino for ino, call in f if call == "read"]
    check(len(down) == 1 and len(up) == 1, "the frontend's pipes: %s" % sorted(f))
    for ino, writer, reader in ((down[0], f, h), (up[0], h, f)):
        w, rd = writer.get((ino, "write"), []), reader.get((ino, "read"), [])
        check(w and w == rd, "pipe %s: the writes %s and the reads %s name other bytes" %
              (ino, w, rd))


def skewed_clock(sptrace, out, host, duration, tmp):
    """The same tree with host's clock 7 s ahead (its traces' meta say
    CLOCK_REALTIME was 7 s later at the same TSC: what a host whose clock
    is off writes).  The messages between the hosts bound the difference:
    flows aligns it back (a line says by how much), so the flow lasts as
    long as before, not 7 s more."""
    skewed = os.path.join(tmp, "skewed")
    shutil.copytree(out, skewed, symlinks=True)
    shifted = 0
    for root, _, files in os.walk(os.path.join(skewed, host)):
        if "meta" not in files:
            continue
        path = os.path.join(root, "meta")
        lines = open(path).read().split("\n")
        for i, line in enumerate(lines):
            if line.startswith("real0_ns "):
                lines[i] = "real0_ns %d" % (int(line.split()[1]) + 7 * 10**9)
                shifted += 1
        with open(path, "w") as fh:
            fh.write("\n".join(lines))
    check(shifted >= 2, "no meta of host %s to shift (%d)" % (host, shifted))
    r = run([sptrace, "flows", skewed], timeout=300)
    check(r.returncode == 0, "flows of the skewed tree: %r" % r.stderr[-1000:])
    m = re.search(r"^# clock of host %s: ([-+][0-9.]+) s to host " % re.escape(host), r.stdout,
                  re.M)
    check(m and -7.1 < float(m.group(1)) < -6.9, "host %s's clock, 7 s ahead, was not aligned "
          "back:\n%s" % (host, r.stdout[:2000]))
    print(m.group(0))
    got = flows_json(sptrace, skewed)
    check(len(got) == 1, "%d flows in the skewed tree" % len(got))
    check(abs(got[0]["duration_ns"] - duration) < max(duration // 5, 50 * 10**6),
          "the flow lasts %d ns with %s's clock 7 s ahead, %d ns as it was" %
          (got[0]["duration_ns"], host, duration))


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    case, sptrace = sys.argv[1], os.path.abspath(sys.argv[2])
    if case in ("tiers", "tiers-oob"):
        from nslib import in_own_netns
        in_own_netns()           # re-runs this script: before the scratch directory
    tmp = tempfile.mkdtemp(prefix="sptrace-flows-")
    try:
        if case == "server":
            case_server(sptrace, os.path.abspath(sys.argv[3]), tmp)
        elif case == "exec":
            case_exec(sptrace, tmp)
        elif case in ("tiers", "tiers-oob"):
            case_tiers(sptrace, os.path.abspath(sys.argv[3]), os.path.abspath(sys.argv[4]), tmp,
                       mark="oob" if case == "tiers-oob" else None)
        else:
            fail("no case %r" % case)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
