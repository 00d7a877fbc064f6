#!/bin/sh
# msgs_bench.sh — the added cost of message events per traced send/recv
# (bench/agent/msgs_bench.c), natively and under `sptrace run`, from one
# run; prints the Markdown of bench/MSGS.md.  Usage, from the source tree
# with ./build built:
#   bench/msgs_bench.sh > bench/MSGS.md        (N=100000 ROUNDS=7 by default)
set -eu
N=${N:-100000}
ROUNDS=${ROUNDS:-7}
B=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -g -o "$tmp/msgs_bench" bench/agent/msgs_bench.c
"$tmp/msgs_bench" "$N" "$ROUNDS" > "$tmp/native"
SPTRACE_REPO="$tmp/repo" "$B/cli/sptrace" run --flight-recorder -o "$tmp/trace" -- \
	"$tmp/msgs_bench" "$N" "$ROUNDS" > "$tmp/traced"
# The same with propagation on: a spdaemon serves the (private) network
# namespace, so the run is a session; the socketpair's first send asks the
# daemon once (nobody else holds it), then each send costs a load and a test.
"$B/cli/sptrace" keys init "$tmp/keys" >/dev/null
"$B/cli/sptrace" keys issue "$tmp/keys" 127.0.0.1 >/dev/null
unshare -n sh -c '
	ip link set lo up
	"$1/spdaemon/spdaemon" --keys "$2/keys" --name 127.0.0.1 --state-dir "$2/state" \
		--foreground 2>/dev/null &
	d=$!
	while ! grep -q started "$2/state/spdaemon.log" 2>/dev/null; do sleep 0.05; done
	SPTRACE_REPO="$2/repo" "$1/cli/sptrace" run --flight-recorder -o "$2/trace2" -- \
		"$2/msgs_bench" "$3" "$4" > "$2/propagating" 2>"$2/run2.err"
	kill $d; wait $d
	grep -q "session " "$2/run2.err"' sh "$B" "$tmp" "$N" "$ROUNDS"
msgs=$("$B/cli/sptrace" report "$tmp/trace" 2>/dev/null | awk '/ (send|recv) unix/ {s += $1} END {print s + 0}')
python3 - "$tmp/native" "$tmp/traced" "$N" "$ROUNDS" "$msgs" "$tmp/propagating" <<'PY'
import statistics, sys, datetime, os
def load(p):
    rows = [l.split() for l in open(p)]
    return [float(r[1]) for r in rows], [float(r[3]) for r in rows]
nl, nr = load(sys.argv[1]); tl, tr = load(sys.argv[2]); pl, pr = load(sys.argv[6])
n, rounds, msgs = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
med = statistics.median
added = [((a - b) - (c - d)) / 2 for a, b, c, d in zip(tl, tr, nl, nr)]
padded = [((a - b) - (c - d)) / 2 for a, b, c, d in zip(pl, pr, nl, nr)]
print("# Message events: cost per traced send/recv\n")
print("Written by `bench/msgs_bench.sh` (%s, %s, N=%d pairs x %d rounds)." %
      (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "%d CPUs" % os.cpu_count(), n, rounds))
print("Thread CPU time per send+recv pair on a UNIX socketpair, 64 bytes; `raw` is the same pair")
print("through syscall(2) (no interposer, no event).  Added per call = ((traced libc - traced raw)")
print("- (native libc - native raw)) / 2, per round; goal <= 200 ns once the channel is known.\n")
print("| | libc pair (ns) | raw pair (ns) |")
print("|---|---:|---:|")
print("| native (median) | %.1f | %.1f |" % (med(nl), med(nr)))
print("| traced (median) | %.1f | %.1f |" % (med(tl), med(tr)))
print("| traced, propagating (median) | %.1f | %.1f |" % (med(pl), med(pr)))
print("\n**Added per traced send or recv: %.1f ns (median of %d rounds; min %.1f, max %.1f)** -- %s."
      % (med(added), rounds, min(added), max(added), "met" if med(added) <= 200 else "NOT met"))
print("\nWith propagation on (a session, the channel asked about once): %.1f ns added per "
      "call (median; min %.1f, max %.1f)." % (med(padded), min(padded), max(padded)))
print("\nMessage events in the trace: %d (the ring keeps the newest: flight recorder)." % msgs)
PY
