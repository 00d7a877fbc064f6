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

By flow, with tests/progs/reqserver.c under `sptrace run --on accept`
serving 24 requests of this script's, one connection each, in turn (so flow
f<N> is the N-th request, after the accept loop's own flow in thread mode):

  flow-thread  a thread per connection, request 11 "slow": its flow ranked
               first (kind "flow"), the culprit path through slow_path
  flow-poll    the same on one thread in a poll() loop, whose calls span the
               requests: time split between the flows at the switches
  coverage     poll, request 9 "cover" (a few microseconds through
               fallback_lookup, visible only in the call paths taken), by
               --profile coverage: its flow among the 3 most suspect, the
               path through fallback_lookup among its 3 first causes
  flow-hang    the threaded server, 12 requests, request 1 "loop": its thread
               spins in spin_forever() for good while the others are
               served (the process goes on); the test kills the server.
               That request's flow ranked first by the earliest last
               timestamp (a call it entered never returned), spin_forever
               named
  normal       a reference run where 3 requests of 24 are "rare"
               (rare_report: twice the work), then a run with one rare
               request and one slow one: with --normal REF the slow flow
               ranks first and is flagged, the rare one is not flagged;
               without REF the two are the most suspect (so REF is what
               spares the rare one)

A queue between threads, followed by join directives:

  queue        reqserver's queue mode (the accepting thread reads each
               request and calls enqueue(req); 2 workers take them from
               dequeue() and answer), 24 requests, request 11 slow.  Traced
               with --join enqueue:entry:arg1 --join dequeue:exit:ret:
               replay shows the values, and `flows` (the directives read
               from meta, not repeated) gives 24 flows, flow f<N+1> request
               N's: its parts on exactly the accepting thread and one
               worker, one enqueue and one handle in it, slow_path in
               request 11's only; analyze ranks that flow first with
               slow_path in its culprit path, and its timed diff against
               its nearest flow (text and --html page) shows slow_path as
               a call of its own, with its time.  Then lookup:entry:arg1 with
               lookup:exit:ret (the fullest area) and render:entry:arg3 (an
               argument in rdx): replay shows each request's id, and
               returns that differ from the ids by one constant.  Traced
               without directives:
               the flows are wrong -- the workers' work is in no request's
               flow, and slow_path shares a flow with other requests'.

  queue-attach the same server running, request 0 served (the workers made),
               then `sptrace attach --join ...` and 4 more requests: meta
               has the directives, replay the values of the calls made
               since, and flows joins at least 2 takes to their gives (the
               dequeue()s already waiting when tracing began record no
               value: their gives are said never taken, as a property).

And the page (`--html FILE`), rendered by Debian's headless Chromium:

  html         the flow-poll trace's page: the ranked table (24 rows, the
               slow flow first, its culprit through slow_path), its causes
               and critical path,
               a timeline bar per flow; opened as FILE#u=FLOW, that flow's
               row and bars highlighted by the page's script; a screenshot
               left in meson-logs/ (its path printed).  Then msgs.c's trace
               (threads talking over TCP, a pipe, UDP, a socketpair): arrows
               for its messages.  A page that cannot be written is an error
               naming it, and leaves no file.

And `sptrace report --diff` and `replay --diff`:

  diff         two runs of the poll server, 10 normal requests, then the
               same with request 3 slow and request 5 cover: report marks
               slow_path and fallback_lookup as the second run's only,
               compute called once more, the table sorted by the change;
               replay shows '+' slow_path() under handle() and '+'
               fallback_lookup() under lookup(), the handle() around it
               with both durations; a run against itself: no '+' or '-'
               line

And the flows of a poll() loop serving requests whose pieces interleave:

  interleave   the poll server, 4 clients at once, each request sent in two
               pieces 40 ms apart, all first pieces before any second one:
               the loop reads a piece of each in turn; `flows` gives 4
               flows, each with exactly one client's receives and its
               answer (every message of a flow names one client port, every
               client port is in one flow)

And across hosts (propagation, then collect):

  hosts        4 namespace hosts with 4 thread servers each (16 identical
               workers, another user's), a spdaemon on every host, a client
               on a fifth under `sptrace run` asking each server in turn for
               6 rounds; in round 2 one server gets a "loop" request and
               spins in spin_forever() for good (a poll loop: the server
               stops).  The agent follows the requests into the 16 servers;
               the session is collected; by process, that server is ranked
               first by the earliest last timestamp, spin_forever named

And `--start FUNC` (tests/progs/jobs.c: one thread runs 20 jobs in a loop,
no messages; job 13 also takes retry_slow()):

  start        without --start one flow; `flows --start process_job`: 21
               flows, the setup's and 20 of event "func"; `analyze --start
               process_job`: job 13's flow first, its culprit path from
               process_job through retry_slow

usage: test_analyze.py SPTRACE WORKERS|REQSERVER|JOBS CASE [MSGS|SPDAEMON]
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, free_port, run  # noqa: E402

REQUESTS = 24


def read_answer(c):
    """A server's answer line (up to its newline, or the end)."""
    answer = b""
    while not answer.endswith(b"\n"):
        d = c.recv(100)
        if not d:
            break
        answer += d
    return answer


def serve(sptrace, reqserver, mode, out, kinds, run_opts=()):
    """reqserver under `sptrace run --on accept -o out`, one request per
    connection, in turn: request i is "i kinds[i]"."""
    port = free_port()
    p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out] + list(run_opts) +
                         ["--", reqserver, mode,
                          str(port), str(len(kinds))], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline().strip() == "ready", "reqserver did not start: %r" %
              (p.stderr.read() if p.poll() is not None else ""))
        # The client runs at the lowest priority: woken by an answer, it
        # must not take the CPU from the server still in send() (on a busy
        # machine the wall time of that send would be the client's turn).
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.nice(19)
                for i, k in enumerate(kinds):
                    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
                        c.sendall(b"%d %s\n" % (i, k.encode()))
                        answer = read_answer(c)
                        if answer != b"ok %d\n" % i:
                            sys.stderr.write("FAIL: request %d answered %r\n" % (i, answer))
                            os._exit(1)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        check(status == 0, "the client's requests failed (status %#x)" % status)
        _, err = p.communicate(timeout=120)
        check(p.returncode == 0, "reqserver under sptrace run: %d %r" % (p.returncode, err))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def analyze(sptrace, out, *opts):
    a = run([sptrace, "analyze", "--json"] + list(opts) + [out], timeout=300)
    check(a.returncode == 0, "sptrace analyze --json %s: %d %r" % (" ".join(opts), a.returncode,
                                                                  a.stderr))
    doc = json.loads(a.stdout)
    for i, x in enumerate(doc["anomalies"]):
        check(x["rank"] == i + 1 and x["kind"] == "flow" and isinstance(x["flow"], str) and
              isinstance(x["pid"], int) and isinstance(x["causes"], list),
              "anomaly %d is not a flow of the Contract's shape: %r" % (i + 1, x))
    return doc["anomalies"]


def flow_of(sptrace, out, request):
    """The id of the flow of request `request` (flows are numbered by start;
    the requests came in turn, after the accept loop's flow if it has one)."""
    f = run([sptrace, "flows", "--json", out])
    check(f.returncode == 0, "sptrace flows --json: %r" % f.stderr)
    flows = json.loads(f.stdout)["flows"]
    extra = len(flows) - REQUESTS
    check(extra in (0, 1), "%d flows for %d requests: %r" % (len(flows), REQUESTS, flows))
    return "f%d" % (request + 1 + extra)


def show(sptrace, out, *opts):
    return run([sptrace, "analyze", "--top", "5"] + list(opts) + [out]).stdout[:4000]


def case_flows(sptrace, reqserver, case, tmp):
    out = os.path.join(tmp, "trace")
    if case in ("flow-thread", "flow-poll"):
        kinds = ["slow" if i == 11 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, case[5:], out, kinds)
        top = analyze(sptrace, out)
        bad = flow_of(sptrace, out, 11)
        check(top[0]["flow"] == bad, "the slow request's flow %s is not ranked first:\n%s" %
              (bad, show(sptrace, out)))
        check(top[0]["method"] == "knn-manhattan" and "slow_path" in top[0]["culprit"]["path"],
              "the slow flow's culprit: %r" % top[0])
        # When: slow_path's work, after lookup's (a quarter of the request's
        # work), to the end (the interval's bounds from the flow's start).
        spans = [c for c in top[0]["causes"] if c["kind"] == "interval"]
        f = run([sptrace, "flows", "--json", out])
        dur = [x["duration_ns"] for x in json.loads(f.stdout)["flows"] if x["id"] == bad]
        check(len(spans) == 1 and spans[0]["path"] == top[0]["culprit"]["path"] and dur,
              "the slow flow has no interval cause for its culprit: %r" % top[0]["causes"])
        lo, hi = spans[0]["from_ns"] / dur[0], spans[0]["to_ns"] / dur[0]
        # (bounds clear of a 30 ms preemption of lookup's work or of the answer)
        check(0.1 <= lo <= 0.5 and hi >= 0.7 and hi - lo >= 0.4,
              "the slow flow's interval is %.2f..%.2f of its %d ns, not slow_path's part "
              "(about 0.25..1): %r" % (lo, hi, dur[0], spans[0]))
    elif case == "comm":
        # A request answered byte by byte: the same work and call paths as
        # the others, only its messages differ.
        kinds = ["chatty" if i == 7 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, "thread", out, kinds)
        bad = flow_of(sptrace, out, 7)
        for opts in ((), ("--profile", "communication")):
            top = analyze(sptrace, out, *opts)
            # By the composite, a flow whose send the scheduler held for
            # milliseconds on a loaded machine is rightly an outlier by
            # time and may come first: only such flows may rank above.
            at = [i for i, x in enumerate(top) if x["flow"] == bad]
            above = top[:at[0]] if at else top
            check(at and (not above if opts else
                          at[0] < 3 and all(x["causes"][0]["kind"] == "time" for x in above)),
                  "the chatty request's flow %s is not ranked first (%s; above it only flows "
                  "anomalous by time may come, by the composite):\n%s" %
                  (bad, " ".join(opts) or "composite", show(sptrace, out, *opts)))
            # its 5 sends in reply(): the culprit path, with a communication
            # cause (first unless the scheduler also held those sends long
            # enough to move the path's share of time: then second)
            comm = [c for c in top[at[0]]["causes"] if c["kind"] == "communication"]
            check(comm and "reply" in comm[0]["path"] and "sent 5 messages" in comm[0]["why"] and
                  top[at[0]]["culprit"]["path"] == comm[0]["path"],
                  "the chatty flow's culprit is not its 5 sends in reply(): %r" % top[at[0]])
        check(top[0]["score"] >= 0.25 and all(x["score"] < 0.1 for x in top[1:]),
              "communication scores: the chatty flow %.3f, the next %.3f" %
              (top[0]["score"], top[1]["score"]))
    elif case == "sites":
        # lookup() called from another call site of handle(): the same call
        # paths by function, another by call site.
        kinds = ["alt" if i == 9 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, "thread", out, kinds)
        bad = flow_of(sptrace, out, 9)
        plain = {x["flow"]: x for x in analyze(sptrace, out)}
        check(not [c for c in plain[bad]["causes"] if c["kind"] == "coverage"],
              "without --sites, the other call site's flow %s has paths of its own: %r" %
              (bad, plain[bad]))
        top = analyze(sptrace, out, "--sites")
        check(top[0]["flow"] == bad, "with --sites, the flow (%s) whose lookup() was called from "
              "another site is not first:\n%s" % (bad, show(sptrace, out, "--sites")))
        taken = [c["path"] for c in top[0]["causes"] if c["kind"] == "coverage" and
                 c["why"].startswith("taken by")]
        check(len(taken) == 1 and taken[0][-1].startswith("lookup@handle+0x") and
              taken[0][0].startswith("serve@"),
              "the other call site is not a coverage cause of its own: %r" % top[0]["causes"])
        check("@" not in top[0]["culprit"]["function"] and
              top[0]["culprit"]["path"][-1].startswith(top[0]["culprit"]["function"] + "@"),
              "the culprit's function is not the callee's plain name: %r" % top[0]["culprit"])
    elif case == "coverage":
        kinds = ["cover" if i == 9 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, "poll", out, kinds)
        top = analyze(sptrace, out, "--profile", "coverage")
        bad = flow_of(sptrace, out, 9)
        mine = [x for x in top[:3] if x["flow"] == bad]
        check(mine, "the request that took fallback_lookup (%s) is not among the 3 most suspect "
              "flows:\n%s" % (bad, show(sptrace, out, "--profile", "coverage")))
        paths = [c["path"] for c in mine[0]["causes"][:3]]
        check(any(p and p[-1] == "fallback_lookup" for p in paths),
              "fallback_lookup is not among the first 3 causes of %s: %r" % (bad, paths))
        kind = [c["kind"] for c in mine[0]["causes"][:3] if c["path"][-1] == "fallback_lookup"]
        check("coverage" in kind, "fallback_lookup's causes are not coverage ones: %r" % kind)
    elif case == "flow-hang":
        port = free_port()
        p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out, "--", reqserver,
                              "thread", str(port), "12"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            check(p.stdout.readline().strip() == "ready", "reqserver did not start")
            for i in range(12):
                with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
                    c.sendall(b"%d %s\n" % (i, b"loop" if i == 1 else b"normal"))
                    if i == 1:
                        time.sleep(0.2)          # it never answers
                        continue
                    check(c.recv(100) == b"ok %d\n" % i, "request %d not answered" % i)
            time.sleep(0.2)
        finally:
            os.killpg(p.pid, signal.SIGKILL)       # sptrace run and the server
            p.communicate()
        hang = "f%d" % (1 + 2)                    # after the accept loop's flow and request 0's
        f = run([sptrace, "flows", "--json", out])
        check(f.returncode == 0 and len(json.loads(f.stdout)["flows"]) == 13,
              "flows of the stuck server: %r %r" % (f.stdout[:1500], f.stderr))
        top = analyze(sptrace, out)
        check(top[0]["flow"] == hang and top[0]["method"] == "earliest-last-timestamp" and
              top[0]["culprit"]["function"] == "spin_forever",
              "the stuck request's flow (%s) is not first by the earliest last timestamp with "
              "spin_forever named:\n%s" % (hang, show(sptrace, out)))
    elif case == "diff":
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        serve(sptrace, reqserver, "poll", a, ["normal"] * 10)
        serve(sptrace, reqserver, "poll", b, ["slow" if i == 3 else "cover" if i == 5 else
                                              "normal" for i in range(10)])
        r = run([sptrace, "report", "--diff", b, a])
        check(r.returncode == 0, "report --diff: %d %r" % (r.returncode, r.stderr))
        rows = {}
        for line in r.stdout.splitlines():
            m = re.match(r"^ +([0-9.]+ +[mun]?s) +([0-9.]+ +[mun]?s) +(=|[-+][0-9.]+ +[mun]?s) "
                         r".* +(\d+) +(\d+)  (\S+)(  \[(A|B) only\])?$", line)
            if m:
                rows[m.group(6)] = (int(m.group(4)), int(m.group(5)), m.group(8))
        check(rows.get("slow_path") == (0, 1, "B") and rows.get("fallback_lookup") == (0, 1, "B"),
              "slow_path and fallback_lookup are not the second run's only:\n%s" % r.stdout)
        check(rows.get("compute") == (10, 11, None) and rows.get("handle") == (10, 10, None),
              "compute and handle calls: %r %r\n%s" % (rows.get("compute"), rows.get("handle"),
                                                       r.stdout))
        unit = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1}
        changes = []
        for line in r.stdout.splitlines()[3:]:
            m = re.match(r"^ +[0-9.]+ +[mun]?s +[0-9.]+ +[mun]?s +(=|[-+]([0-9.]+) +([mun]?s)) ",
                         line)
            if m:
                changes.append(0 if m.group(1) == "=" else float(m.group(2)) *
                               unit[m.group(3)])
        check(len(changes) >= len(rows) and changes == sorted(changes, reverse=True),
              "the rows are not sorted by the change of total time:\n%s" % r.stdout)
        r = run([sptrace, "report", "--diff", b, "--sort", "calls", a])
        check(r.returncode == 0 and " 0           4  compare_entry  [B only]" in
              r.stdout.splitlines()[3], "report --diff --sort calls: compare_entry (4 calls "
              "more) is not first: %r" % r.stdout[:1500])
        r = run([sptrace, "replay", "--diff", b, a])
        check(r.returncode == 0, "replay --diff: %d %r" % (r.returncode, r.stderr))
        lines = r.stdout.splitlines()
        plus = [i for i, x in enumerate(lines) if x.startswith("+")]
        check(not [x for x in lines if x.startswith("-")],
              "replay --diff: calls of the first run only:\n%s" % r.stdout)
        names = [lines[i].split("| ", 1)[1] for i in plus]
        check("    slow_path()" in names and "      fallback_lookup()" in names,
              "replay --diff: the '+' calls are %r, not slow_path() under handle() and "
              "fallback_lookup() under lookup():\n%s" % (names, r.stdout))
        slow = [i for i in plus if lines[i].endswith("slow_path()")][0]
        above = [x for x in lines[:slow] if x.endswith("|   handle()")][-1]
        unit = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1}

        def ns(text):
            v, u = text.split()
            return float(v) * unit[u]
        m = re.match(r"^  +([0-9.]+ [mun]?s) +([0-9.]+ [mun]?s) +[-+]\d+% \|   handle\(\)$", above)
        sp = re.match(r"^\+ +- +([0-9.]+ [mun]?s) ", lines[slow])
        check(m and sp and ns(m.group(2)) >= ns(sp.group(1)),
              "replay --diff: the handle() around slow_path() is not shown with both "
              "durations, the second holding slow_path's: %r / %r" % (above, lines[slow]))
        r = run([sptrace, "replay", "--diff", a, a])
        check(r.returncode == 0 and not [x for x in r.stdout.splitlines() if x[:1] in "+-"],
              "replay --diff of a run with itself: %r" % r.stdout[:1500])
    elif case == "normal":
        ref = os.path.join(tmp, "ref")
        serve(sptrace, reqserver, "poll", ref,
              ["rare" if i in (4, 12, 20) else "normal" for i in range(REQUESTS)])
        kinds = ["rare" if i == 8 else "slow" if i == 16 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, "poll", out, kinds)
        rare, slow = flow_of(sptrace, out, 8), flow_of(sptrace, out, 16)
        alone = analyze(sptrace, out)
        check({x["flow"] for x in alone[:2]} == {slow, rare},
              "without a reference, the slow (%s) and the rare (%s) requests are not the two "
              "most suspect:\n%s" % (slow, rare, show(sptrace, out)))
        top = analyze(sptrace, out, "--normal", ref)
        by = {x["flow"]: x for x in top}
        check(top[0]["flow"] == slow and top[0]["flagged"] is True and
              top[0]["method"] == "nearest-normal",
              "with --normal, the slow request (%s) is not first and flagged:\n%s" %
              (slow, show(sptrace, out, "--normal", ref)))
        check(by[rare]["flagged"] is False and by[rare]["score"] <= by[rare]["threshold"],
              "with --normal, the rare but normal request (%s) is flagged: %r\n%s" %
              (rare, by[rare], show(sptrace, out, "--normal", ref)))
    print("ok")


def chromium(args, tmp):
    """Debian's Chromium, headless, on a profile of the test's own."""
    exe = shutil.which("chromium")
    check(exe, "chromium is not installed (scripts/install-deps.sh installs it)")
    r = run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--user-data-dir=" + os.path.join(tmp, "chromium-profile"),
             "--virtual-time-budget=3000"] + args, timeout=120)
    check(r.returncode == 0, "chromium %s: %d %r" % (" ".join(args), r.returncode,
                                                      r.stderr[-1500:]))
    return r.stdout


def case_html(sptrace, reqserver, msgs, tmp):
    out = os.path.join(tmp, "trace")
    serve(sptrace, reqserver, "poll", out, ["slow" if i == 11 else "normal"
                                            for i in range(REQUESTS)])
    page = os.path.join(tmp, "report.html")
    a = run([sptrace, "analyze", "--html", page, out])
    check(a.returncode == 0 and os.path.exists(page), "analyze --html: %d %r" %
          (a.returncode, a.stderr))
    check(not [f for f in os.listdir(tmp) if f.startswith("report.html.")],
          "a temporary file was left beside the page: %r" % os.listdir(tmp))
    text = open(page, encoding="utf-8").read()
    check("http://" not in text.replace("http://www.w3.org/2000/svg", "") and
          "https://" not in text and "<link" not in text and " src=" not in text,
          "the page fetches something: it must be self-contained")
    slow = flow_of(sptrace, out, 11)
    dom = chromium(["--dump-dom", "file://%s#u=%s" % (page, slow)], tmp)
    rows = re.findall(r'<tr class="u( hl)?" data-u="([^"]*)"', dom)
    check(len(rows) == REQUESTS, "the rendered table has %d rows, not %d:\n%s" %
          (len(rows), REQUESTS, dom[:3000]))
    check(rows[0][1] == slow, "the first row is %s, not the slow request's flow %s" %
          (rows[0][1], slow))
    check([r[1] for r in rows if r[0]] == [slow], "opened as #u=%s, the highlighted rows are "
          "%r" % (slow, [r[1] for r in rows if r[0]]))
    first = dom[dom.index('data-u="%s"' % slow):]
    first = first[:first.index("</tr>")]
    check("slow_path" in first, "the first row's culprit does not name slow_path: %r" % first)
    bars = re.findall(r'<rect class="part( hl)?" data-u="([^"]*)"', dom)
    check(len(bars) >= REQUESTS and {b[1] for b in bars if b[0]} == {slow},
          "timeline bars: %d, highlighted %r" % (len(bars), {b[1] for b in bars if b[0]}))
    check('id="selected">%s<' % slow in dom, "the page does not say %s is selected" % slow)
    bands = re.findall(r'<rect class="interval( hl)?" data-u="([^"]*)"', dom)
    check((" hl", slow) in bands, "no highlighted interval band under %s's bar: %r" %
          (slow, bands))
    check(re.search(r'<table class="crit( hl)?" data-u="%s"><caption>critical path of %s' %
                    (slow, slow), dom), "no critical path for %s on the page" % slow)
    # the screenshot, for whoever reads the test log
    logs = os.path.join(os.getcwd(), "meson-logs")
    shot = os.path.join(logs if os.path.isdir(logs) else tmp, "analyze-html.png")
    chromium(["--window-size=1400,1800", "--screenshot=" + shot, "file://%s#u=%s" %
              (page, slow)], tmp)
    with open(shot, "rb") as f:
        png = f.read()
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000,
          "the screenshot %s is not a picture of the page (%d bytes)" % (shot, len(png)))
    print("screenshot: %s" % shot)

    # messages: arrows between the threads of msgs.c
    mt = os.path.join(tmp, "msgs")
    r = run([sptrace, "run", "-o", mt, "--", msgs])
    check(r.returncode == 0, "sptrace run msgs: %r" % r.stderr[-1000:])
    mpage = os.path.join(tmp, "msgs.html")
    a = run([sptrace, "analyze", "--html", mpage, mt])
    check(a.returncode == 0, "analyze --html of msgs: %r" % a.stderr)
    dom = chromium(["--dump-dom", "file://" + mpage], tmp)
    arrows = re.findall(r'<line class="arrow"', dom)
    check(len(arrows) >= 6, "%d message arrows in the timeline, expected 6 or more (TCP both "
          "ways, the pipe, UDP both ways, the socketpair)" % len(arrows))

    # a page that cannot be written
    bad = os.path.join(tmp, "no-such-dir", "r.html")
    a = run([sptrace, "analyze", "--html", bad, out])
    check(a.returncode != 0 and bad in a.stderr, "--html to a missing directory: %d %r" %
          (a.returncode, a.stderr))
    print("ok")


def case_interleave(sptrace, reqserver, tmp):
    out = os.path.join(tmp, "trace")
    port = free_port()
    p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out, "--", reqserver, "poll",
                          str(port), "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    conns = []
    try:
        check(p.stdout.readline().strip() == "ready", "reqserver did not start")
        for i in range(4):
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=60))
            time.sleep(0.04)
        for i, c in enumerate(conns):           # every first piece ...
            c.sendall(b"%d no" % i)
            time.sleep(0.04)
        for i, c in enumerate(conns):           # ... before any second one
            c.sendall(b"rmal\n")
            time.sleep(0.04)
        ports = {}
        for i, c in enumerate(conns):
            answer = read_answer(c)
            check(answer == b"ok %d\n" % i, "request %d answered %r" % (i, answer))
            ports[c.getsockname()[1]] = i
        _, err = p.communicate(timeout=120)
        check(p.returncode == 0, "reqserver under sptrace run: %d %r" % (p.returncode, err))
    finally:
        for c in conns:
            c.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    f = run([sptrace, "flows", "--json", out])
    check(f.returncode == 0, "flows: %r" % f.stderr)
    flows = json.loads(f.stdout)["flows"]
    seen = {}
    for fl in flows:
        r = run([sptrace, "flows", "--flow", fl["id"], out])
        check(r.returncode == 0, "flows --flow %s: %r" % (fl["id"], r.stderr))
        mine = {int(m.group(1)) for m in
                re.finditer(r"/\* (?:recv|send)\(tcp 127\.0\.0\.1:%d [<-]> 127\.0\.0\.1:(\d+),"
                            % port, r.stdout)}
        check(len(mine) <= 1, "flow %s holds the messages of several clients (ports %s):\n%s" %
              (fl["id"], sorted(mine), r.stdout[-3000:]))
        for cp in mine:
            check(cp not in seen, "client port %d is in flows %s and %s" % (cp, seen.get(cp),
                                                                            fl["id"]))
            seen[cp] = fl["id"]
        if mine:
            n = len(re.findall(r"/\* recv\(", r.stdout))
            check(n == 2 and len(re.findall(r"/\* send\(", r.stdout)) == 1,
                  "flow %s: %d receives and %d sends, expected the request's 2 pieces and its "
                  "answer:\n%s" % (fl["id"], n, len(re.findall(r"/\* send\(", r.stdout)),
                                   r.stdout[-3000:]))
    check(set(seen) == set(ports) and len([x for x in flows if x["id"] in seen.values()]) == 4,
          "client ports %s in flows %s, expected %s in 4 flows" % (sorted(seen), seen,
                                                                   sorted(ports)))
    print("ok")


def case_hosts(sptrace, spdaemon, reqserver, tmp):
    import test_propagate as tp

    prog = os.path.join(tmp, "reqserver")
    client = os.path.join(tmp, "reqclient")      # a program of its own, as in life
    os.chmod(tmp, 0o755)
    for p in (prog, client):
        shutil.copy(reqserver, p)
        os.chmod(p, 0o755)
    cl = tp.Cluster(sptrace, spdaemon, tmp, 5)
    servers = []
    try:
        addrs = cl.hosts.addrs
        targets = []
        for h in range(1, 5):
            for port in range(7000, 7004):
                p = cl.hosts.popen(h, tp.USER + [prog, "poll", "%s:%d" % (addrs[h], port), "6"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                check(p.stdout.readline().strip() == "ready", "a server on %s:%d did not start"
                      % (addrs[h], port))
                servers.append(p)
                targets.append("%s:%d:%s" % (addrs[h], port, "loop@2" if (h, port) == (3, 7002)
                                             else "normal"))
        bad = servers[(3 - 1) * 4 + 2]
        trace = os.path.join(tmp, "client.trace")
        r = cl.hosts.run(0, [sptrace, "run", "--on", "start", "-o", trace, "--", client,
                             "client", "6"] + targets, timeout=600)
        check(r.returncode == 0 and r.stdout == "answered 92 of 93\n",
              "the traced client: %d %r %r" % (r.returncode, r.stdout, r.stderr[-2000:]))
        for p in servers:
            if p is not bad:
                p.communicate(timeout=60)
                check(p.returncode == 0, "a server ended with %d" % p.returncode)
        bad.kill()
        bad.wait()
        out = os.path.join(tmp, "collected")
        time.sleep(1)                    # the daemon's reaper completes the killed one's meta
        r = cl.hosts.run(0, [sptrace, "collect", "-o", out, trace], timeout=300)
        check(r.returncode == 0, "sptrace collect: %r %r" % (r.stdout, r.stderr))
        got = [(h, d) for h in os.listdir(out) if os.path.isdir(os.path.join(out, h))
               for d in os.listdir(os.path.join(out, h)) if d.isdigit()]
        check(len(got) == 17, "the collected tree has %d processes, not the client and the 16 "
              "servers: %r\n%s" % (len(got), got, cl.logs()))
        a = run([sptrace, "analyze", "--by", "process", "--json", out], timeout=300)
        check(a.returncode == 0, "analyze: %r" % a.stderr)
        top = json.loads(a.stdout)["anomalies"]
        text = run([sptrace, "analyze", "--by", "process", "--top", "3", out]).stdout
        check(top[0]["kind"] == "process" and top[0]["host"] == addrs[3] and
              top[0]["pid"] == bad.pid, "the server that looped (%s pid %d) is not ranked "
              "first:\n%s" % (addrs[3], bad.pid, text))
        check(top[0]["method"] == "earliest-last-timestamp" and
              top[0]["culprit"]["function"] == "spin_forever",
              "found by %s, culprit %r:\n%s" % (top[0]["method"], top[0]["culprit"], text))
        # By host: the four server hosts are one role; the one whose server
        # looped spent its time elsewhere.
        a = run([sptrace, "analyze", "--by", "host", "--json", out], timeout=300)
        check(a.returncode == 0, "analyze --by host: %r" % a.stderr)
        top = json.loads(a.stdout)["anomalies"]
        text = run([sptrace, "analyze", "--by", "host", "--top", "5", out]).stdout
        check(top[0]["kind"] == "host" and top[0]["host"] == addrs[3] and
              top[0]["culprit"]["function"] == "spin_forever",
              "the host whose server looped (%s) is not ranked first with spin_forever:\n%s" %
              (addrs[3], text))
        # The client's host runs another program: a role of its own, not
        # scored against the servers' hosts.
        mine = [x for x in top if x["host"] == addrs[0]]
        check(len(mine) == 1 and mine[0]["score"] == 0 and
              "not compared" in mine[0]["causes"][0]["why"],
              "the client's host (%s) was compared with the servers' hosts: %r\n%s" %
              (addrs[0], mine, text))
    finally:
        for p in servers:
            if p.poll() is None:
                p.kill()
                p.wait()
        cl.close()
    print("ok")


def flow_records(sptrace, out, fid):
    """`sptrace flows --flow fid`: its parts' tids and its records (tid, text)."""
    f = run([sptrace, "flows", "--flow", fid, out])
    check(f.returncode == 0, "sptrace flows --flow %s: %r" % (fid, f.stderr))
    tids = set()
    recs = []
    for line in f.stdout.splitlines():
        m = re.match(r"^# part: [^:]*:\d+/(\d+) ", line)
        if m:
            tids.add(int(m.group(1)))
        m = re.match(r"^\s*-?[0-9.]+\s+\S*:\d+/(\d+)\s+(.*)$", line)
        if m:
            recs.append((int(m.group(1)), m.group(2).strip()))
    return tids, recs


def case_queue(sptrace, reqserver, tmp):
    kinds = ["slow" if i == 11 else "normal" for i in range(REQUESTS)]
    out = os.path.join(tmp, "joined")
    serve(sptrace, reqserver, "queue", out, kinds,
          ["--join", "enqueue:entry:arg1", "--join", "dequeue:exit:ret"])
    with open(os.path.join(out, "meta")) as m:
        joins = [l.split(None, 1)[1].strip() for l in m if l.startswith("join ")]
    check(joins == ["enqueue:entry:arg1", "dequeue:exit:ret"], "meta's join lines: %r" % joins)
    r = run([sptrace, "replay", out])
    given = re.findall(r"enqueue\(arg1=(0x[0-9a-f]+)\)", r.stdout)
    taken = re.findall(r"\} = (0x[0-9a-f]+) /\* dequeue \*/", r.stdout)
    check(len(given) == REQUESTS and sorted(given) == sorted(taken),
          "replay's values: %d given %r, taken %r" % (len(given), given[:4], taken[:4]))
    f = run([sptrace, "flows", out])
    check(f.returncode == 0 and "# joins: %d values taken" % REQUESTS in f.stdout and
          "# property" not in f.stdout, "flows with the directives of meta:\n%s" % f.stdout[:3000])
    flows = json.loads(run([sptrace, "flows", "--json", out]).stdout)["flows"]
    check(len(flows) == REQUESTS, "%d flows for %d requests:\n%s" %
          (len(flows), REQUESTS, f.stdout[:3000]))
    receiver = flows[0]["start"]["tid"]
    workers = set()
    for i, fl in enumerate(flows):
        tids, recs = flow_records(sptrace, out, fl["id"])
        handles = [t for t, x in recs if x.startswith("handle() {")]
        enqueues = [t for t, x in recs if x.startswith("enqueue() {")]
        slow = [t for t, x in recs if x.startswith("slow_path")]
        check(fl["start"]["tid"] == receiver and len(tids) == 2 and receiver in tids and
              handles and len(handles) == 1 and handles[0] != receiver and
              enqueues == [receiver] and bool(slow) == (i == 11),
              "request %d's flow %s: threads %r (receiver %d), handle() on %r, enqueue() on "
              "%r, slow_path on %r" % (i, fl["id"], tids, receiver, handles, enqueues, slow))
        workers.add(handles[0])
    check(len(workers) == 2, "the requests were served by %r, not the 2 workers" % workers)
    top = analyze(sptrace, out)
    check(top[0]["flow"] == flows[11]["id"] and "slow_path" in top[0]["culprit"]["path"],
          "the slow request's flow %s is not first with slow_path named:\n%s" %
          (flows[11]["id"], show(sptrace, out)))
    # the timed diff: slow_path a call of the slow flow only, with its time
    text = run([sptrace, "analyze", "--html", os.path.join(tmp, "page.html"), out]).stdout
    diff = text[text.find("# timed diff of flow %s," % flows[11]["id"]):]
    check(diff and re.search(r"^\+\s+-\s+[0-9.]+\s+\S*s\s+\|\s+slow_path\(\)$", diff, re.M),
          "no timed diff of %s showing slow_path as its own:\n%s" %
          (flows[11]["id"], text[-3000:]))
    with open(os.path.join(tmp, "page.html")) as page:
        html = page.read()
    check("<h2>Timed diff</h2>" in html and "slow_path()" in html[html.find("<pre id=diff>"):],
          "the page has no timed diff with slow_path")

    # Both values of one function (the fullest area), and an argument in rdx:
    # lookup(id, miss) returns compute(WORK) + id, render(out, len, id).
    out = os.path.join(tmp, "values")
    serve(sptrace, reqserver, "queue", out, ["normal"] * 4,
          ["--join", "lookup:entry:arg1", "--join", "lookup:exit:ret",
           "--join", "render:entry:arg3"])
    text = run([sptrace, "replay", out]).stdout
    ids = [int(x, 16) for x in re.findall(r"lookup\(arg1=(0x[0-9a-f]+|0)\)", text)]
    rets = [int(x, 16) for x in re.findall(r"\} = (0x[0-9a-f]+) /\* lookup \*/", text)]
    rendered = [int(x, 16) for x in re.findall(r"render\(arg3=(0x[0-9a-f]+|0)\)", text)]
    check(sorted(ids) == [0, 1, 2, 3] and sorted(rendered) == [0, 1, 2, 3] and len(rets) == 4 and
          len(set(r - i for r, i in zip(rets, ids))) == 1,
          "lookup's and render's values: args %r, returns %r, render %r" % (ids, rets, rendered))
    with open(os.path.join(out, "agent.log")) as log:
        check("no room" not in log.read(), "an area had no room for both of lookup's values")

    # The same without directives: the workers' work is in no request's flow.
    out = os.path.join(tmp, "plain")
    serve(sptrace, reqserver, "queue", out, kinds)
    flows = json.loads(run([sptrace, "flows", "--json", out]).stdout)["flows"]
    whole = 0
    slow_with = None
    for fl in flows:
        tids, recs = flow_records(sptrace, out, fl["id"])
        handles = [x for t, x in recs if x.startswith("handle() {")]
        whole += len(tids) == 2 and len(handles) == 1 and \
            any(x.startswith("enqueue() {") for t, x in recs)
        if any(x.startswith("slow_path") for t, x in recs):
            slow_with = len(handles)
    check(whole == 0 and slow_with and slow_with > 1,
          "without directives, %d of %d flows hold a whole request, and slow_path's flow %r "
          "handles: the rules alone should not follow the queue" %
          (whole, len(flows), slow_with))
    print("ok")


def ask_one(port, i):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        c.sendall(b"%d normal\n" % i)
        answer = read_answer(c)
        check(answer == b"ok %d\n" % i, "request %d answered %r" % (i, answer))


def case_queue_attach(sptrace, reqserver, tmp):
    out = os.path.join(tmp, "attached")
    port = free_port()
    p = subprocess.Popen([reqserver, "queue", str(port), "5"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline().strip() == "ready", "reqserver did not start")
        ask_one(port, 0)
        a = run([sptrace, "attach", "--join", "enqueue:entry:arg1", "--join", "dequeue:exit:ret",
                 "-o", out, str(p.pid)], timeout=180)
        check(a.returncode == 0 and "tracing" in a.stdout, "sptrace attach --join: %d %r %r" %
              (a.returncode, a.stdout, a.stderr))
        for i in range(1, 5):
            ask_one(port, i)
        _, err = p.communicate(timeout=120)
        check(p.returncode == 0, "reqserver: %d %r" % (p.returncode, err))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    with open(os.path.join(out, "meta")) as m:
        joins = [l.split(None, 1)[1].strip() for l in m if l.startswith("join ")]
    check(joins == ["enqueue:entry:arg1", "dequeue:exit:ret"], "meta's join lines: %r" % joins)
    text = run([sptrace, "replay", out]).stdout
    given = re.findall(r"enqueue\(arg1=(0x[0-9a-f]+)\)", text)
    taken = re.findall(r"\} = (0x[0-9a-f]+) /\* dequeue \*/", text)
    check(len(given) == 4 and len(taken) >= 2 and set(taken) <= set(given),
          "replay's values after the attach: given %r, taken %r" % (given, taken))
    f = run([sptrace, "flows", out])
    m = re.search(r"^# joins: (\d+) value", f.stdout, re.M)
    check(f.returncode == 0 and m and int(m.group(1)) == len(taken),
          "flows of the attached trace:\n%s" % f.stdout[:2000])
    print("ok")


def case_start(sptrace, jobs, tmp):
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", out, "--", jobs, "20", "13"], timeout=300)
    check(r.returncode == 0 and r.stdout == "done\n", "jobs under sptrace run: %d %r" %
          (r.returncode, r.stderr))
    f = run([sptrace, "flows", "--json", out])
    check(f.returncode == 0 and len(json.loads(f.stdout)["flows"]) == 1,
          "without --start, flows: %r" % f.stdout[:500])
    f = run([sptrace, "flows", "--json", "--start", "process_job", out])
    check(f.returncode == 0, "flows --start: %r" % f.stderr)
    flows = json.loads(f.stdout)["flows"]
    check(len(flows) == 21 and [x["start"]["event"] for x in flows[1:]] == ["func"] * 20,
          "flows --start process_job: %d flows, events %r" %
          (len(flows), [x["start"]["event"] for x in flows]))
    a = run([sptrace, "analyze", "--json", "--start", "process_job", out], timeout=300)
    check(a.returncode == 0, "analyze --start: %r" % a.stderr)
    top = json.loads(a.stdout)["anomalies"]
    bad = flows[1 + 13]["id"]
    check(top[0]["kind"] == "flow" and top[0]["flow"] == bad,
          "job 13's flow (%s) is not the most suspect:\n%s" %
          (bad, run([sptrace, "analyze", "--top", "3", "--start", "process_job", out]).stdout))
    path = top[0]["culprit"]["path"]
    check(path[0] == "process_job" and "retry_slow" in path,
          "the culprit path does not run from process_job through retry_slow: %r" % path)
    print("ok")


def main():
    if len(sys.argv) not in (4, 5):
        fail(__doc__)
    sptrace, prog, case = sys.argv[1:4]
    extra = sys.argv[4:]
    cases = {"hosts": lambda tmp: case_hosts(sptrace, extra[0], prog, tmp),
             "interleave": lambda tmp: case_interleave(sptrace, prog, tmp),
             "queue": lambda tmp: case_queue(sptrace, prog, tmp),
             "queue-attach": lambda tmp: case_queue_attach(sptrace, prog, tmp),
             "start": lambda tmp: case_start(sptrace, prog, tmp),
             "html": lambda tmp: case_html(sptrace, prog, extra[0], tmp)}
    for c in ("flow-thread", "flow-poll", "coverage", "comm", "sites", "normal", "diff",
              "flow-hang"):
        cases[c] = lambda tmp, c=c: case_flows(sptrace, prog, c, tmp)
    for c in ("loop", "crash", "slow"):
        cases[c] = lambda tmp, c=c: case_workers(sptrace, prog, c, tmp)
    if case not in cases or len(extra) != (1 if case in ("hosts", "html") else 0):
        fail(__doc__)
    if case == "hosts":
        from nslib import in_own_netns
        in_own_netns()           # re-runs this script: before the scratch directory
    tmp = tempfile.mkdtemp(prefix="sptrace-analyze-")
    try:
        cases[case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_workers(sptrace, workers, case, tmp):
    """16 forked workers, worker 5 goes wrong (workers.c)."""
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
    print("ok")


if __name__ == "__main__":
    main()
