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
  normal       a reference run where 3 requests of 24 are "rare"
               (rare_report: half again the work), then a run with one rare
               request and one slow one: with --normal REF the slow flow
               ranks first and is flagged, the rare one is not flagged;
               without REF the rare one is among the 3 most suspect (so
               REF is what spares it)

And the page (`--html FILE`), rendered by Debian's headless Chromium:

  html         the flow-poll trace's page: the ranked table (24 rows, the
               slow flow first, its culprit through slow_path), its causes,
               a timeline bar per flow; opened as FILE#u=FLOW, that flow's
               row and bars highlighted by the page's script; a screenshot
               left in meson-logs/ (its path printed).  Then msgs.c's trace
               (threads talking over TCP, a pipe, UDP, a socketpair): arrows
               for its messages.  A page that cannot be written is an error
               naming it, and leaves no file.

usage: test_analyze.py SPTRACE WORKERS|REQSERVER CASE [MSGS]
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, free_port, run  # noqa: E402

REQUESTS = 24


def serve(sptrace, reqserver, mode, out, kinds):
    """reqserver under `sptrace run --on accept -o out`, one request per
    connection, in turn: request i is "i kinds[i]"."""
    port = free_port()
    p = subprocess.Popen([sptrace, "run", "--on", "accept", "-o", out, "--", reqserver, mode,
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
                        answer = b""
                        while not answer.endswith(b"\n"):
                            d = c.recv(100)
                            if not d:
                                break
                            answer += d
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
    elif case == "normal":
        ref = os.path.join(tmp, "ref")
        serve(sptrace, reqserver, "poll", ref,
              ["rare" if i in (4, 12, 20) else "normal" for i in range(REQUESTS)])
        kinds = ["rare" if i == 8 else "slow" if i == 16 else "normal" for i in range(REQUESTS)]
        serve(sptrace, reqserver, "poll", out, kinds)
        rare, slow = flow_of(sptrace, out, 8), flow_of(sptrace, out, 16)
        alone = analyze(sptrace, out)
        check(alone[0]["flow"] == slow and rare in [x["flow"] for x in alone[1:3]],
              "without a reference, the slow request (%s) is not the most suspect, or the rare "
              "one (%s) not among the next two:\n%s" % (slow, rare, show(sptrace, out)))
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


def main():
    if len(sys.argv) == 5 and sys.argv[3] == "html":
        tmp = tempfile.mkdtemp(prefix="sptrace-analyze-")
        try:
            case_html(sys.argv[1], sys.argv[2], sys.argv[4], tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if len(sys.argv) != 4:
        fail(__doc__)
    sptrace, workers, case = sys.argv[1:]
    if case in ("flow-thread", "flow-poll", "coverage", "normal"):
        tmp = tempfile.mkdtemp(prefix="sptrace-analyze-")
        try:
            case_flows(sptrace, workers, case, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
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
