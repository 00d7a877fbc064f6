#!/usr/bin/env python3
"""attach_bench.py — `sptrace attach` on a live redis-server under load.

    attach_bench.py --sptrace SPTRACE --work DIR [--rounds N] [--requests N]

For each round, a fresh redis-server (no persistence, on a free port) and
redis-benchmark (GET and SET, 50 clients):

  native      redis-benchmark against the untouched server;
  attach      `sptrace attach --on signal PID`: the command's wall time (start
              to agent dormant in the target) and the time the target's
              stopped thread was held (both as sptrace attach prints them);
  dormant     redis-benchmark with the agent loaded and waiting;
  activating  `sptrace activate PID` 0.3 s into a redis-benchmark run: the
              command's wall time (command start to every thread walking its
              stack and the agent confirming), and that run's figures (the
              first activation: every function instrumented as first reached);
  traced      redis-benchmark while tracing;
  stopped     `sptrace stop PID`, then redis-benchmark again.

Throughput (requests/s) and p99 latency per phase, as ratios to the native
run of the same round, and the slowest request; medians over the rounds.  The repository is warmed
first (one attach on a throw-away server) so that attach time is not module
analysis.  Writes a Markdown report to stdout.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_redis(work):
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", work, "--daemonize", "no",
                          "--logfile", os.path.join(work, "redis.log")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            time.sleep(0.02)
    p.kill()
    sys.exit("redis-server did not start")


def bench_start(port, requests):
    return subprocess.Popen(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n",
                             str(requests), "-c", "50", "-t", "set,get", "--csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def bench_end(b):
    """requests/s, p99 and max latency (ms) per test (GET, SET), from
    redis-benchmark --csv (columns: test, rps, avg, min, p50, p95, p99, max)."""
    out_text, err = b.communicate(timeout=600)
    out = {}
    for line in out_text.splitlines():
        f = [x.strip('"') for x in line.split(",")]
        if len(f) >= 8 and f[0] in ("SET", "GET"):
            out[f[0]] = (float(f[1]), float(f[6]), float(f[7]))
    if len(out) != 2:
        sys.exit("redis-benchmark gave no figures: %r %r" % (out_text, err))
    return out


def bench(port, requests):
    return bench_end(bench_start(port, requests))


def timed(cmd, env=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    ms = (time.monotonic() - t0) * 1e3
    if r.returncode != 0:
        sys.exit("%s failed: %s %s" % (" ".join(cmd), r.stdout, r.stderr))
    return r, ms


def analyses_ms(tdir, timeout=30):
    """How long the agent took, after reporting itself dormant, to read the
    modules' repository entries (its log says so when done)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with open(os.path.join(tdir, "agent.log")) as f:
            m = re.search(r"code analyses of \d+ of \d+ modules in ([\d.]+) ms", f.read())
        if m:
            return float(m.group(1))
        time.sleep(0.05)
    sys.exit("the agent in %s never said its analyses were in" % tdir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sptrace", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    env = dict(os.environ, SPTRACE_REPO=os.path.join(a.work, "repo"))

    # Warm the repository: one attach on a throw-away server.
    p, port = start_redis(a.work)
    timed([a.sptrace, "attach", "--on", "signal", "-o", os.path.join(a.work, "warm"), str(p.pid)],
          env)
    p.kill()
    p.wait()

    rows = []
    for rnd in range(a.rounds):
        print("attach-bench: round %d/%d" % (rnd + 1, a.rounds), file=sys.stderr)
        p, port = start_redis(a.work)
        try:
            row = {"native": bench(port, a.requests)}
            tdir = os.path.join(a.work, "trace%d" % rnd)
            r, ms = timed([a.sptrace, "attach", "--on", "signal", "-o", tdir, str(p.pid)], env)
            m = re.search(r"in ([\d.]+) ms \(thread \d+ stopped for ([\d.]+) ms\)", r.stdout)
            row["attach_ms"], row["attach_cmd_ms"] = float(m.group(1)), ms
            row["pause_ms"] = float(m.group(2))
            row["analyses_ms"] = analyses_ms(tdir)
            row["dormant"] = bench(port, a.requests)
            # The first activation while redis-benchmark runs (its SET test
            # comes first): every thread walks its stack and the event loop
            # instruments each function as it first reaches it.
            b = bench_start(port, a.requests)
            time.sleep(0.3)
            r, row["activate_ms"] = timed([a.sptrace, "activate", str(p.pid)], env)
            row["activating"] = bench_end(b)
            row["traced"] = bench(port, a.requests)
            timed([a.sptrace, "stop", str(p.pid)], env)
            row["stopped"] = bench(port, a.requests)
            rows.append(row)
        finally:
            p.kill()
            p.wait()

    med = statistics.median
    o = []
    o.append("# sptrace attach on a live redis-server\n")
    o.append("Written by `bench/attach_bench.sh`; do not edit by hand.\n")
    for m in a.meta:
        k, _, v = m.partition("=")
        o.append("- %s: %s" % (k, v))
    o.append("- redis-benchmark: %d requests per test, 50 clients, GET and SET; %d rounds, "
             "medians (min … max)\n" % (a.requests, a.rounds))

    def span(xs, fmt="%.1f"):
        return (fmt + " (" + fmt + " … " + fmt + ")") % (med(xs), min(xs), max(xs))

    o.append("## Attach and activation\n")
    o.append("| what | ms |\n|---|---:|")
    o.append("| attach: `sptrace attach` start → agent dormant in the target (as it reports) | %s |"
             % span([r["attach_ms"] for r in rows]))
    o.append("| attach: the whole command, wall | %s |" % span([r["attach_cmd_ms"] for r in rows]))
    o.append("| then, in the target's agent thread: the modules' repository entries read "
             "(an activation before that waits for them) | %s |"
             % span([r["analyses_ms"] for r in rows]))
    o.append("| pause: the target's stopped thread held | %s |" % span([r["pause_ms"] for r in rows],
                                                                       "%.2f"))
    o.append("| activation: `sptrace activate` command, wall (until the agent confirms) | %s |\n"
             % span([r["activate_ms"] for r in rows]))
    o.append("## Served throughput and latency, as ratios to native\n")
    o.append("Per test: requests/s, its ratio to the same round's native run, the p99 latency's "
             "ratio, and the slowest request in ms.\n")
    o.append("| phase | SET rps | ratio | p99 ratio | max ms | GET rps | ratio | p99 ratio "
             "| max ms |")
    o.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for phase in ("native", "dormant", "activating", "traced", "stopped"):
        cells = []
        for t in ("SET", "GET"):
            rps = [r[phase][t][0] for r in rows]
            ratio = [r[phase][t][0] / r["native"][t][0] for r in rows]
            p99 = [r[phase][t][1] / r["native"][t][1] for r in rows]
            mx = [r[phase][t][2] for r in rows]
            cells += ["%.0f" % med(rps), "%.3f" % med(ratio), "%.2f" % med(p99), span(mx)]
        o.append("| %s | %s |" % (phase, " | ".join(cells)))
    o.append("")
    o.append("\"dormant\": agent loaded, waiting for `sptrace activate` (no code changed); "
             "\"activating\": `sptrace activate` 0.3 s into the run (in its SET test), the "
             "first activation of this server: threads walk their stacks and every function "
             "is instrumented as it is first reached; \"traced\": every call recorded; "
             "\"stopped\": after `sptrace stop` (code restored).  (Before 2026-11-23 the "
             "\"p99\" column held the maximum latency: redis-benchmark's CSV has p99 in its "
             "7th column and the maximum in its 8th.)")
    print("\n".join(o))


if __name__ == "__main__":
    main()
