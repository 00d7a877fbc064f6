#!/bin/sh
# kagent_bench.sh — what `sptrace run --kernel` costs, measured in Debian's
# kernel under qemu (tests/kagent/guest.sh: TCG, one vCPU), one boot, the
# configurations interleaved over ROUNDS rounds; prints the Markdown of
# bench/KAGENT.md.  Usage, from the source tree:
#   bench/kagent_bench.sh > bench/KAGENT.md      (N=100000 ROUNDS=5 by default)
#
# Each configuration times N getppid calls in one process (kcalls loop N):
#   untraced   the module loaded, no probe in the kernel
#   user       under `sptrace run` (the agent records the getppid call)
#   kernel     under `sptrace run --kernel` (and the kernel's functions below it)
#   bystander  not traced, while another process is traced with --kernel
#              (it sleeps: the cost is ftrace's call into the module's
#              callback on __x64_sys_getppid and its callees, and the
#              scope test that turns it away)
# Under TCG every figure is an emulated machine's: ratios between them
# mean more than the nanoseconds.
set -eu
N=${N:-100000}
ROUNDS=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -g -o "$tmp/kcalls" "$root/tests/kagent/kcalls.c"
"$root/tests/kagent/guest.sh" --add "$tmp/kcalls" "
set -u
for r in \$(seq $ROUNDS); do
	echo \"@@untraced \$(./kcalls loop $N)\"
	echo \"@@user \$(sptrace run --flight-recorder -o u.\$r -- ./kcalls loop $N 2>/dev/null)\"
	echo \"@@kernel \$(sptrace run --flight-recorder --kernel -o k.\$r -- ./kcalls loop $N 2>k.err)\"
	sed -n 's/.*kernel: \\([0-9]*\\) records of.*/@@krecords \\1/p' k.err
	rm -f stop stop.ready
	sptrace run --kernel -o i.\$r -- ./kcalls idle stop 2>/dev/null &
	while [ ! -e stop.ready ]; do sleep 0.1; done
	echo \"@@probes \$(grep -c '^[^[:space:]]' /sys/kernel/debug/tracing/enabled_functions)\"
	echo \"@@bystander \$(./kcalls loop $N)\"
	touch stop; wait
	rm -rf u.\$r k.\$r i.\$r
done
" > "$tmp/out"
python3 - "$tmp/out" "$N" "$ROUNDS" <<'PY'
import statistics, sys, datetime
out, n, rounds = open(sys.argv[1]).read().splitlines(), int(sys.argv[2]), int(sys.argv[3])
def vals(key):
    return [float(l.split()[1]) for l in out if l.startswith('@@' + key + ' ') and len(l.split()) > 1]
med = statistics.median
u, us, k, b = vals('untraced'), vals('user'), vals('kernel'), vals('bystander')
recs, probes = vals('krecords'), vals('probes')
if not (u and us and k and b and recs):
    sys.exit('kagent_bench: the guest did not give every figure:\n' + '\n'.join(out[-20:]))
kcalls = med(recs) / 2 / n          # kernel functions recorded per getppid
print('# sptrace --kernel: cost (bench/kagent_bench.sh)\n')
print(f'Measured {datetime.date.today()} in Debian\'s 6.1 kernel under qemu TCG '
      f'(one vCPU, emulated: compare ratios, not nanoseconds), {rounds} rounds '
      f'interleaved, N = {n} getppid calls each; medians (all rounds in brackets).\n')
print('| configuration | ns per getppid | vs untraced |')
print('|---|---|---|')
for name, v in (('untraced (module loaded, no probes)', u), ('`sptrace run` (user space only)', us),
                ('`sptrace run --kernel`', k), ('untraced, another process traced with --kernel', b)):
    print(f'| {name} | {med(v):.0f} ({", ".join(f"{x:.0f}" for x in v)}) | {med(v) / med(u):.3f} |')
print()
print(f'- Kernel functions recorded per traced getppid: {kcalls:.1f} '
      f'(records kept ÷ 2 ÷ N); {med(probes):.0f} functions probed.')
print(f'- Per traced kernel call (--kernel minus user space only, ÷ the above): '
      f'{(med(k) - med(us)) / kcalls:.0f} ns.')
print(f'- Overhead on the untraced bystander: {100 * (med(b) / med(u) - 1):+.1f}% '
      f'(ftrace\'s call into the callback on __x64_sys_getppid and its callees, and the '
      f'scope test).')
PY
