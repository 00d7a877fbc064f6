#!/usr/bin/env python3
"""test_export.py — `sptrace export DIR --format perfetto|chrome -o FILE` on
real traces, each file checked by a reader that owes nothing to ours.

Every Perfetto file is decoded by `protoc --decode=perfetto.protos.Trace`
against proto/perfetto_trace.proto (no unknown field may appear) and then
checked (check_perfetto): every track described before use, a process
track per (host, pid) with a pid no other process has and its host in its
name, thread tracks under a described process with that pid; names interned
before use; slices balanced per track, none ending before it began, times
never going back on a track; each flow id started exactly once and ended
exactly once, not before it started (but for the clocks' disagreement
described at that check; one that does fails with its evidence:
flow_evidence).  Every Chrome file (check_chrome):
JSON, every event with name, ph, ts, pid and tid, complete events with a
duration >= 0 and nested per thread; process names with their host.

Cases:
  server  tests/progs/tier.c's backend under `sptrace run --on accept`
          serving 6 requests of an untraced client: backend_line is 6
          slices in both files, 1 with --flow f3 (one request); the same
          trace copied under two host names as a collected tree
          (OUT/alpha/PID, OUT/beta/PID): one pid each, different in the
          file, both hosts named; --help, a missing format, an unknown
          format, a missing directory; a file over --max-size 0.001 (MB)
          refused and none left, 1 MB written; the Perfetto checker
          rejects a hand-made file with a slice never ended.
  msgs    tests/progs/msgs.c (TCP between two threads, a pipe, UDP, a UNIX
          socketpair, all in one traced process): flow arrows for its
          matched messages, each from a send to the receive that read it.
  tiers   the propagated session of test_propagate.py's tiers case
          gathered by `sptrace collect` (3 hosts): the three hosts' names
          in process names, the processes the request crossed, arrows
          between processes of different hosts.
  speedscope  msgs.c's Chrome file opened in speedscope (the npm package,
          tests/tools) by Debian's headless Chromium, both served over
          loopback by this script: the profile view with one profile per
          thread of the trace ("(1/2)"), the file's name as its title.

usage: test_export.py CASE SPTRACE [SPDAEMON] [TIER|MSGS] [TOOLS]
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

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")


def meta_value(d, key):
    with open(os.path.join(d, "meta")) as f:
        for line in f:
            if line.startswith(key + " "):
                return line[len(key) + 1:].rstrip("\n")
    return None


def export(sptrace, d, fmt, out, env=None, extra=()):
    r = run([sptrace, "export", d, "--format", fmt, "-o", out] + list(extra), env=env,
            timeout=300)
    check(r.returncode == 0 and os.path.isfile(out),
          "sptrace export %s --format %s: %d %r" % (d, fmt, r.returncode, r.stderr[-2000:]))
    return r


# ---- Perfetto ----

def parse_text(text):
    """protoc's text format as nested dicts: each key maps to a list of
    values (strings, or dicts for messages)."""
    root = {}
    stack = [root]
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s == "}":
            stack.pop()
            continue
        m = re.match(r"^([A-Za-z0-9_]+) \{$", s)
        if m:
            d = {}
            stack[-1].setdefault(m.group(1), []).append(d)
            stack.append(d)
            continue
        m = re.match(r"^([A-Za-z0-9_]+): (.*)$", s)
        check(m, "protoc --decode line %d: %r" % (n, line))
        v = m.group(2)
        if v.startswith('"'):
            v = json.loads(v) if "\\" not in v else v[1:-1]
        stack[-1].setdefault(m.group(1), []).append(v)
    check(len(stack) == 1, "protoc --decode: unbalanced braces")
    return root


def one(d, key, default=None):
    v = d.get(key)
    return v[0] if v else default


def decode_perfetto(path):
    with open(path, "rb") as f:
        r = subprocess.run(["protoc", "--decode=perfetto.protos.Trace",
                            "--proto_path=" + PROTO_DIR, "perfetto_trace.proto"],
                           stdin=f, capture_output=True, timeout=300)
    check(r.returncode == 0, "protoc --decode of %s: %r" % (path, r.stderr[-1000:]))
    text = r.stdout.decode()
    # a field our .proto does not declare is printed by its number
    unknown = re.findall(r"^\s*\d+(?:: .*| \{)$", text, re.M)
    check(not unknown, "%s has fields proto/perfetto_trace.proto does not declare: %s" %
          (path, unknown[:5]))
    return parse_text(text)["packet"]


CLOCK_KEYS = ("tsc_hz", "tsc0", "mono0_ns", "real0_ns", "tsc1", "mono1_ns", "attached",
              "activated", "end", "propagated", "expect", "matched")


def flow_evidence(sptrace, tree, procs, threads, fid, start, end):
    """What a flow that goes back in time came from: its two ends (host,
    pid, tid, event, time), each process's clock readings and propagation
    lines (meta) and what its agent said of receives awaited and watched
    (agent.log), and the hosts' clock alignment (`sptrace flows`)."""
    out = []
    for what, (track, ts, name) in (("start", start), ("end", end)):
        pid, tid, puuid = threads[track]
        pname = procs[puuid][1]
        out.append("flow %s %s: %s thread %d, %r at %d ns" % (fid, what, pname, tid, name, ts))
        m = re.match(r"^.+ \(host (.+), pid (\d+)\)$", pname)
        d = os.path.join(tree, m.group(1), m.group(2)) if m else None
        if not d or not os.path.isdir(d):
            d = tree
        for f, keep in (("meta", lambda l: l.split(" ", 1)[0] in CLOCK_KEYS),
                        ("agent.log", lambda l: re.search(r"await|watched|expect|stopped|"
                                                          r"propagation", l))):
            try:
                with open(os.path.join(d, f)) as fh:
                    out += ["  %s: %s" % (f, l.rstrip()) for l in fh if keep(l)][:40]
            except OSError as e:
                out.append("  %s: %s" % (f, e))
    if sptrace:
        r = subprocess.run([sptrace, "flows", tree], capture_output=True, text=True,
                           timeout=300)
        out += [l for l in r.stdout.splitlines() if l.startswith("# ")][:20]
    return "\n".join(out)


def check_perfetto(path, hosts=(), tree=None, sptrace=None):
    """The semantic checks (the docstring); returns what the tests look at:
    {"procs": {uuid: (pid, name)}, "threads": {uuid: (pid, tid, proc uuid)},
    "slices": {name: count}, "flows": {id: (start track, end track)}}.
    tree: the exported directory, for the evidence of a flow that goes back
    (flow_evidence; sptrace for its clock alignment)."""
    packets = decode_perfetto(path)
    check(packets, "%s: no packet" % path)
    procs, threads, names = {}, {}, {}
    stacks, last_ts, slices, corr = {}, {}, {}, {}
    flow_start, flow_end = {}, {}
    seqs = set()
    for i, p in enumerate(packets):
        seq = one(p, "trusted_packet_sequence_id")
        flags = int(one(p, "sequence_flags", "0"))
        check(seq is not None, "packet %d has no trusted_packet_sequence_id" % i)
        if seq not in seqs:
            check(flags & 1, "packet %d: the first of sequence %s does not clear its "
                  "incremental state" % (i, seq))
            seqs.add(seq)
        for idata in p.get("interned_data", []):
            for en in idata.get("event_names", []):
                iid = one(en, "iid")
                check(iid not in names, "packet %d: name iid %s interned twice" % (i, iid))
                names[iid] = one(en, "name")
        td = one(p, "track_descriptor")
        if td:
            uuid = one(td, "uuid")
            check(uuid and uuid not in procs and uuid not in threads,
                  "packet %d: track uuid %s missing or described twice" % (i, uuid))
            if "process" in td:
                pd = one(td, "process")
                procs[uuid] = (int(one(pd, "pid")), one(pd, "process_name", ""))
            else:
                th = one(td, "thread")
                check(th, "packet %d: a track neither process nor thread" % i)
                parent = one(td, "parent_uuid")
                check(parent in procs, "packet %d: thread track under %s, a process not "
                      "described before" % (i, parent))
                pid, tid = int(one(th, "pid")), int(one(th, "tid"))
                check(procs[parent][0] == pid, "packet %d: thread %d says pid %d under the "
                      "process of pid %d" % (i, tid, pid, procs[parent][0]))
                threads[uuid] = (pid, tid, parent)
        ev = one(p, "track_event")
        if not ev:
            continue
        if "name_iid" in ev:
            check(flags & 2, "packet %d: an interned name without SEQ_NEEDS_INCREMENTAL_STATE"
                  % i)
        track = one(ev, "track_uuid")
        check(track in threads, "packet %d: an event on track %s, not described before" %
              (i, track))
        ts = int(one(p, "timestamp"))
        check(ts >= last_ts.get(track, 0), "packet %d: time goes back on track %s" % (i, track))
        last_ts[track] = ts
        typ = one(ev, "type")
        name = None
        if "name_iid" in ev:
            check(one(ev, "name_iid") in names, "packet %d: name iid %s not interned before" %
                  (i, one(ev, "name_iid")))
            name = names[one(ev, "name_iid")]
        st = stacks.setdefault(track, [])
        if typ == "TYPE_SLICE_BEGIN":
            check(name, "packet %d: a slice without a name" % i)
            st.append((ts, name))
            slices[name] = slices.get(name, 0) + 1
            corr.setdefault(name, []).append(one(ev, "correlation_id"))
        elif typ == "TYPE_SLICE_END":
            check(st, "packet %d: a slice end with no slice open on track %s" % (i, track))
            t0, _ = st.pop()
            check(ts >= t0, "packet %d: a slice ends before it began" % i)
        else:
            check(typ == "TYPE_INSTANT" and name, "packet %d: event type %s" % (i, typ))
        for fid in ev.get("flow_ids", []):
            check(fid not in flow_start, "flow %s started twice" % fid)
            flow_start[fid] = (track, ts, name)
        for fid in ev.get("terminating_flow_ids", []):
            check(fid not in flow_end, "flow %s ended twice" % fid)
            flow_end[fid] = (track, ts, name)
    for track, st in stacks.items():
        check(not st, "track %s ends with %d slices open: %s" % (track, len(st), st[-3:]))
    check(set(flow_start) == set(flow_end),
          "flows started but not ended: %s; ended but not started: %s" %
          (sorted(set(flow_start) - set(flow_end))[:5],
           sorted(set(flow_end) - set(flow_start))[:5]))
    # A send is stamped when its call began, a receive when it returned
    # (trace_format.h, "Message events"), and the export writes each at its
    # time (analysis/export.c, send_hoists): an arrow points back only by what
    # the clocks disagree -- each process's TSC rate, the hosts' alignment
    # (analysis/flows.c, rule 7) --, never by more than 50 ms here (all
    # hosts are namespaces of one clock, but the machine may be busy).
    for fid in flow_start:
        if flow_end[fid][1] < flow_start[fid][1] - 50000000:
            fail("flow %s ends %d ns before it starts%s" %
                 (fid, flow_start[fid][1] - flow_end[fid][1],
                  "\n" + flow_evidence(sptrace, tree, procs, threads, fid, flow_start[fid],
                                       flow_end[fid]) if tree else ""))
    # one pid per process, each (host, real pid) once, the host named
    pids = [pid for pid, _ in procs.values()]
    check(len(pids) == len(set(pids)), "two processes share a pid: %s" % sorted(pids))
    real = []
    for pid, name in procs.values():
        m = re.match(r"^.+ \(host (.+), pid (\d+)\)$", name)
        check(m, "process name %r lacks its host and pid" % name)
        real.append((m.group(1), int(m.group(2))))
    check(len(real) == len(set(real)), "a process of a host described twice: %s" % real)
    tids = [tid for _, tid, _ in threads.values()]
    check(len(tids) == len(set(tids)), "two threads share a tid: %s" % sorted(tids))
    for h in hosts:
        check(any(r[0] == h for r in real), "no process of host %s in %s" % (h, real))
    return {"procs": procs, "threads": threads, "slices": slices, "corr": corr,
            "flows": {f: (flow_start[f][0], flow_end[f][0]) for f in flow_start},
            "real": real}


# ---- Chrome ----

def check_chrome(path, hosts=()):
    """Returns {"X": {name: count}, "procs": {pid: name}, "flows": n}."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        fail("%s is not JSON: %s" % (path, e))
    events = doc.get("traceEvents")
    check(isinstance(events, list) and events, "%s: no traceEvents" % path)
    xs, procs, per_thread, flows, xflows = {}, {}, {}, {}, {}
    for e in events:
        check(all(k in e for k in ("name", "ph", "ts", "pid", "tid")) and
              isinstance(e["name"], str) and e["name"] and isinstance(e["ts"], (int, float)) and
              e["ts"] >= 0, "an event without name, ph, ts, pid or tid: %r" % e)
        if e["ph"] == "X":
            check(isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0,
                  "a complete event without a duration >= 0: %r" % e)
            xs[e["name"]] = xs.get(e["name"], 0) + 1
            xflows.setdefault(e["name"], []).append(e.get("args", {}).get("flow"))
            per_thread.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e["ph"] == "M" and e["name"] == "process_name":
            check(e["pid"] not in procs, "pid %d named twice" % e["pid"])
            procs[e["pid"]] = e["args"]["name"]
        elif e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], []).append(e["ph"])
    for key, evs in per_thread.items():
        # in nanoseconds: the file's microseconds have three decimals
        ivs = sorted(((round(e["ts"] * 1000), -round(e["dur"] * 1000), e["name"]) for e in evs))
        stack = []
        for t0, mdur, name in ivs:
            t1 = t0 - mdur
            while stack and stack[-1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1]:
                fail("thread %s: %s [%d, %d] overlaps its caller's end %d without nesting" %
                     (key, name, t0, t1, stack[-1]))
            stack.append(t1)
    for fid, phs in flows.items():
        check(sorted(phs) == ["f", "s"], "flow %s has %s" % (fid, phs))
    for h in hosts:
        check(any(("(host %s," % h) in n for n in procs.values()),
              "no process of host %s in %s" % (h, procs))
    return {"X": xs, "procs": procs, "flows": len(flows), "xflows": xflows}


# ---- cases ----

BAD_TRACE = '''
packet { trusted_packet_sequence_id: 1 sequence_flags: 1
  track_descriptor { uuid: 1 process { pid: 5 process_name: "p (host h, pid 5)" } } }
packet { trusted_packet_sequence_id: 1
  track_descriptor { uuid: 2 parent_uuid: 1 thread { pid: 5 tid: 5 } } }
packet { trusted_packet_sequence_id: 1 sequence_flags: 2 timestamp: 10
  interned_data { event_names { iid: 1 name: "f" } }
  track_event { type: TYPE_SLICE_BEGIN name_iid: 1 track_uuid: 2 flow_ids: 7 } }
'''


def checker_rejects(tmp):
    """The Perfetto checker fails on a slice never ended and a flow never
    ended: it is not vacuous."""
    path = os.path.join(tmp, "bad.pftrace")
    with open(path, "wb") as f:
        r = subprocess.run(["protoc", "--encode=perfetto.protos.Trace", "--proto_path=" +
                            PROTO_DIR, "perfetto_trace.proto"], input=BAD_TRACE.encode(),
                           stdout=f, stderr=subprocess.PIPE, timeout=60)
    check(r.returncode == 0, "protoc --encode: %r" % r.stderr)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "check-perfetto", path],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "slices open" in r.stderr,
          "the checker accepted a slice never ended: %r %r" % (r.stdout, r.stderr))

def case_server(sptrace, tier, tmp):
    env = private_repo_env(tmp)
    out = os.path.join(tmp, "trace")
    port = free_port()
    p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out, "--", tier, "backend",
                          str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    check(line.startswith("ready "), "the backend did not start: %r" % line)
    for conn in (["3"], ["5", "8"], ["2", "4", "6"]):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        f = s.makefile("rw")
        for n in conn:
            f.write(n + "\n")
            f.flush()
            check(f.readline().startswith("backend %s -> " % n), "request %s unanswered" % n)
        f.close()
        s.close()
    try:
        _, err = p.communicate(input="", timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("the traced backend did not end when its input closed")
    check(p.returncode == 0, "sptrace run: %d %r" % (p.returncode, err[-1000:]))
    pid, host = int(meta_value(out, "pid")), meta_value(out, "host")

    pf = os.path.join(tmp, "server.pftrace")
    export(sptrace, out, "perfetto", pf, env)
    got = check_perfetto(pf, [host])
    check(got["slices"].get("backend_line") == 6, "backend_line: %s slices, expected 6" %
          got["slices"].get("backend_line"))
    # each request's slices carry its flow's number as their correlation id
    f = run([sptrace, "flows", "--json", out], env=env)
    ids = {fl["id"] for fl in json.loads(f.stdout)["flows"]}
    corr = got["corr"]["backend_line"]
    check(len(set(corr)) == 6 and all(c and "f" + c in ids for c in corr),
          "backend_line's correlation ids %r are not six of the flows %r" % (corr, sorted(ids)))
    check(got["real"] == [(host, pid)], "processes %s, expected %s:%d" % (got["real"], host, pid))
    js = os.path.join(tmp, "server.json")
    export(sptrace, out, "chrome", js, env)
    got = check_chrome(js, [host])
    check(got["X"].get("backend_line") == 6, "chrome backend_line: %s, expected 6" %
          got["X"].get("backend_line"))
    check(got["X"].get("work", 0) >= 6, "chrome work: %s" % got["X"].get("work"))
    check(len(set(got["xflows"]["backend_line"])) == 6 and
          all(f in ids for f in got["xflows"]["backend_line"]),
          "chrome backend_line's flows %r" % got["xflows"]["backend_line"])

    # one flow: the third request (tests/e2e/test_flows.py's f3)
    export(sptrace, out, "perfetto", pf, env, ["--flow", "f3"])
    got = check_perfetto(pf, [host])
    check(got["slices"].get("backend_line") == 1, "--flow f3: backend_line %s, expected 1" %
          got["slices"].get("backend_line"))
    check({c for cs in got["corr"].values() for c in cs} <= {"3", None} and
          got["corr"]["backend_line"] == ["3"],
          "--flow f3: correlation ids %r" % got["corr"])
    export(sptrace, out, "chrome", js, env, ["--flow", "f3"])
    got = check_chrome(js, [host])
    check(got["X"].get("backend_line") == 1, "chrome --flow f3: backend_line %s" %
          got["X"].get("backend_line"))
    r = run([sptrace, "export", out, "--format", "chrome", "-o", js, "--flow", "f99"], env=env)
    check(r.returncode == 1 and "no such flow" in r.stderr, "--flow f99: %r" % r.stderr)

    # the same pid on two hosts: a collected tree of two copies
    tree = os.path.join(tmp, "two-hosts")
    for h in ("alpha", "beta"):
        shutil.copytree(out, os.path.join(tree, h, str(pid)), symlinks=True)
    export(sptrace, tree, "perfetto", pf, env)
    got = check_perfetto(pf, ["alpha", "beta"])
    check(sorted(got["real"]) == [("alpha", pid), ("beta", pid)] and
          len({p for p, _ in got["procs"].values()}) == 2 and
          pid in {p for p, _ in got["procs"].values()},
          "two hosts' pid %d: %s" % (pid, got["procs"]))
    check(got["slices"].get("backend_line") == 12, "backend_line on two hosts: %s" %
          got["slices"].get("backend_line"))
    export(sptrace, tree, "chrome", js, env)
    got = check_chrome(js, ["alpha", "beta"])
    check(len(got["procs"]) == 2, "chrome processes: %s" % got["procs"])

    # help and errors
    r = run([sptrace, "export", "--help"])
    check(r.returncode == 0 and "perfetto" in r.stdout and "chrome" in r.stdout and
          "--max-size" in r.stdout, "export --help: %r" % r.stdout)
    r = run([sptrace, "export", out, "-o", pf])
    check(r.returncode == 2 and "--format" in r.stderr, "no format: %r" % r.stderr)
    r = run([sptrace, "export", out, "--format", "svg", "-o", pf])
    check(r.returncode == 2 and "svg" in r.stderr and "perfetto" in r.stderr,
          "an unknown format: %r" % r.stderr)
    r = run([sptrace, "export", os.path.join(tmp, "none"), "--format", "chrome", "-o", js])
    check(r.returncode != 0 and r.stderr.startswith("sptrace: export: ") and
          os.path.join(tmp, "none") in r.stderr, "export of no directory: %r" % r.stderr)
    big = os.path.join(tmp, "big.pftrace")
    r = run([sptrace, "export", out, "--format", "perfetto", "-o", big, "--max-size",
             "0.001"], env=env)
    check(r.returncode == 1 and "would be over 0.001 MB" in r.stderr and "--max-size" in r.stderr
          and not os.path.exists(big), "--max-size 0.001: %r" % r.stderr)
    # a file that existed is left as it was when the export fails
    with open(js, "rb") as f:
        before = f.read()
    for opts in (["--max-size", "0.001"], ["--flow", "f99"]):
        r = run([sptrace, "export", out, "--format", "chrome", "-o", js] + opts, env=env)
        with open(js, "rb") as f:
            check(r.returncode == 1 and f.read() == before and
                  not [n for n in os.listdir(tmp) if n.startswith("server.json.")],
                  "a failed export (%s) changed %s or left a file beside it: %r" %
                  (" ".join(opts), js, r.stderr))
    r = run([sptrace, "export", out, "--format", "perfetto", "-o", big, "--max-size", "1"],
            env=env)
    check(r.returncode == 0, "--max-size 1: %r" % r.stderr)
    os.unlink(big)
    checker_rejects(tmp)


def case_msgs(sptrace, msgs, tmp):
    env = private_repo_env(tmp)
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", out, "--", msgs], env=env)
    check(r.returncode == 0, "sptrace run msgs: %r" % r.stderr[-1000:])
    host = meta_value(out, "host")
    pf = os.path.join(tmp, "msgs.pftrace")
    export(sptrace, out, "perfetto", pf, env)
    got = check_perfetto(pf, [host], out, sptrace)
    # TCP both ways, the pipe, UDP both ways, the socketpair
    check(len(got["flows"]) >= 6, "%d message arrows, expected 6 or more" % len(got["flows"]))
    check(any(a != b for a, b in got["flows"].values()),
          "no arrow between the TCP client's thread and the server's")
    js = os.path.join(tmp, "msgs.json")
    export(sptrace, out, "chrome", js, env)
    got2 = check_chrome(js, [host])
    check(got2["flows"] == len(got["flows"]), "chrome flows %d, perfetto %d" %
          (got2["flows"], len(got["flows"])))


def case_speedscope(sptrace, msgs, tools, tmp):
    import http.server
    import threading
    import urllib.parse

    app = os.path.join(tools, "node_modules", "speedscope", "dist", "release")
    check(os.path.isfile(os.path.join(app, "index.html")),
          "speedscope is not installed in %s (scripts/install-deps.sh runs npm ci there)" % tools)
    exe = shutil.which("chromium")
    check(exe, "chromium is not installed (scripts/install-deps.sh installs it)")
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", out, "--", msgs], env=private_repo_env(tmp))
    check(r.returncode == 0, "sptrace run msgs: %r" % r.stderr[-1000:])
    threads = len([f for f in os.listdir(out) if f.startswith("ring.")])
    site = os.path.join(tmp, "site")
    shutil.copytree(app, site)
    export(sptrace, out, "chrome", os.path.join(site, "msgs.json"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=site, **kw)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    port = httpd.server_address[1]
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = "http://127.0.0.1:%d/index.html#profileURL=%s&title=msgs" % (
            port, urllib.parse.quote("http://127.0.0.1:%d/msgs.json" % port, safe=""))
        # speedscope alert()s on a file it cannot read, which blocks a
        # headless page: the timeout is that failure
        r = run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                 "--user-data-dir=" + os.path.join(tmp, "chromium-profile"),
                 "--virtual-time-budget=5000", "--dump-dom", url], timeout=90)
    finally:
        httpd.shutdown()
    check(r.returncode == 0, "chromium on speedscope: %d %r" % (r.returncode, r.stderr[-1500:]))
    dom = r.stdout
    check("Time Order" in dom and "<title>msgs - speedscope</title>" in dom,
          "speedscope did not open the profile view:\n%s" % dom[:3000])
    m = re.search(r"msgs <span[^>]*>\(1/(\d+)\)</span>", dom)
    check(m and int(m.group(1)) == threads, "speedscope shows %s profiles, the trace has %d "
          "threads:\n%s" % (m.group(1) if m else "no count of", threads, dom[:3000]))


def case_tiers(sptrace, spdaemon, tier, tmp):
    import test_propagate as tp

    ts = tp.TiersSession(sptrace, spdaemon, tier, tmp)
    try:
        names = sorted(h for h in os.listdir(ts.out) if os.path.isdir(os.path.join(ts.out, h)))
        check(len(names) == 3, "OUT has hosts %s" % names)
        _, a1, a2 = ts.addrs
        pf = os.path.join(tmp, "tiers.pftrace")
        export(sptrace, ts.out, "perfetto", pf)
        got = check_perfetto(pf, names, ts.out, sptrace)
        for host, pid in ((a1, ts.pids["frontend"]), (a2, ts.pids["backend"]),
                          (a2, ts.pids["monitor"])):
            check((host, pid) in got["real"], "no process %s:%d in %s" % (host, pid, got["real"]))
        proc_host = {u: re.search(r"\(host (.+), pid", n).group(1)
                     for u, (_, n) in got["procs"].items()}
        host_of = {u: proc_host[p] for u, (_, _, p) in got["threads"].items()}
        cross = [f for f, (a, b) in got["flows"].items() if host_of[a] != host_of[b]]
        check(len(cross) >= 6, "%d arrows between hosts, expected the client's 3 requests "
              "and answers at least: %s" % (len(cross), got["flows"]))
        check(got["slices"].get("backend_line") == 3 and got["slices"].get("serve_line") == 3,
              "backend_line %s, serve_line %s: expected 3 each" %
              (got["slices"].get("backend_line"), got["slices"].get("serve_line")))
        # the frontend's and the backend's slices of the client's requests
        # carry the same flow's correlation id, across hosts
        sc, bc = set(got["corr"]["serve_line"]), set(got["corr"]["backend_line"])
        check(None not in sc and sc == bc, "correlation ids: serve_line (frontend) %r, "
              "backend_line (backend) %r" % (sc, bc))
        js = os.path.join(tmp, "tiers.json")
        export(sptrace, ts.out, "chrome", js)
        got = check_chrome(js, names)
        check(got["X"].get("backend_line") == 3, "chrome backend_line: %s" %
              got["X"].get("backend_line"))
    finally:
        ts.close()


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    if sys.argv[1] == "check-perfetto":      # checker_rejects's
        check_perfetto(sys.argv[2])
        print("ok")
        return
    case, sptrace = sys.argv[1], os.path.abspath(sys.argv[2])
    if not shutil.which("protoc"):
        fail("protoc is missing: install protobuf-compiler (scripts/install-deps.sh)")
    if case == "tiers":
        from nslib import in_own_netns
        in_own_netns()           # re-runs this script: before the scratch directory
    tmp = tempfile.mkdtemp(prefix="sptrace-export-")
    try:
        if case == "server":
            case_server(sptrace, os.path.abspath(sys.argv[3]), tmp)
        elif case == "msgs":
            case_msgs(sptrace, os.path.abspath(sys.argv[3]), tmp)
        elif case == "speedscope":
            case_speedscope(sptrace, os.path.abspath(sys.argv[3]), os.path.abspath(sys.argv[4]),
                            tmp)
        elif case == "tiers":
            case_tiers(sptrace, os.path.abspath(sys.argv[3]), os.path.abspath(sys.argv[4]), tmp)
        else:
            fail("no case %r" % case)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
