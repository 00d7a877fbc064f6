#!/bin/sh
# kagent_bench.sh — what `sptrace run --kernel` costs, measured in Debian's
# kernel under qemu (tests/kagent/guest.sh: TCG, one vCPU), one boot, the
# configurations interleaved over ROUNDS rounds; prints the Markdown of
# bench/KAGENT.md.  Usage, from the source tree:
#   bench/kagent_bench.sh > bench/KAGENT.md      (N=100000 ROUNDS=7 by default)
#   SPTRACE_GUEST_ICOUNT=0 ROUNDS=3 bench/kagent_bench.sh
#       the same with qemu's -icount shift=0: the guest's clock counts
#       instructions (1 ns each), so the figures are instruction counts,
#       the same from run to run whatever the host's load
#
# Each configuration times N getppid calls in one process (kcalls loop N):
#   untraced   the module loaded, no probe in the kernel
#   user       under `sptrace run` (the agent records the getppid call)
#   kernel     under `sptrace run --kernel` (and the kernel's functions below it)
#   bystander  not traced, while another process is traced with --kernel
#              (it sleeps: the cost is spk_direct's scope test on
#              __x64_sys_getppid and its callees)
#   ibystander the same while the other is traced with --kernel-indirect
#              (kprobes on the probed functions' indirect calls too)
# and N/4 write+read pairs on a pipe (kcalls ploop), untraced and as both
# bystanders: vfs_read and vfs_write hold indirect calls.
# The untraced figures are taken at the start and at the end of each round
# and each other figure is divided by their mean, so a machine whose load
# changes between rounds still gives comparable ratios; the medians of the
# rounds' ratios are quoted.  Under TCG every figure is an emulated
# machine's: ratios between them mean more than the nanoseconds.
set -eu
N=${N:-100000}
ROUNDS=${ROUNDS:-7}
P=$((N / 4))
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -g -o "$tmp/kcalls" "$root/tests/kagent/kcalls.c"
"$root/tests/kagent/guest.sh" --add "$tmp/kcalls" "
set -u
for r in \$(seq $ROUNDS); do
	echo \"@@round \$r\"
	echo \"@@untraced \$(./kcalls loop $N)\"
	echo \"@@puntraced \$(./kcalls ploop $P)\"
	echo \"@@user \$(sptrace run --flight-recorder -o u.\$r -- ./kcalls loop $N 2>/dev/null)\"
	echo \"@@kernel \$(sptrace run --flight-recorder --kernel -o k.\$r -- ./kcalls loop $N 2>k.err)\"
	sed -n 's/.*kernel: \\([0-9]*\\) records of.*/@@krecords \\1/p' k.err
	rm -f stop stop.ready
	sptrace run --kernel -o i.\$r -- ./kcalls idle stop 2>/dev/null &
	while [ ! -e stop.ready ]; do sleep 0.1; done
	echo \"@@probes \$(grep -c '^[^[:space:]]' /sys/kernel/debug/tracing/enabled_functions)\"
	echo \"@@bystander \$(./kcalls loop $N)\"
	echo \"@@pbystander \$(./kcalls ploop $P)\"
	touch stop; wait
	rm -f stop stop.ready
	sptrace run --kernel-indirect -o j.\$r -- ./kcalls idle stop 2>/dev/null &
	while [ ! -e stop.ready ]; do sleep 0.1; done
	echo \"@@sites \$(grep -c . /sys/kernel/debug/kprobes/list)\"
	echo \"@@optimized \$(grep -c OPTIMIZED /sys/kernel/debug/kprobes/list)\"
	echo \"@@ibystander \$(./kcalls loop $N)\"
	echo \"@@pibystander \$(./kcalls ploop $P)\"
	touch stop; wait
	echo \"@@untraced \$(./kcalls loop $N)\"
	echo \"@@puntraced \$(./kcalls ploop $P)\"
	rm -rf u.\$r k.\$r i.\$r j.\$r
done
" > "$tmp/out"
python3 - "$tmp/out" "$N" "$ROUNDS" "$P" "${SPTRACE_GUEST_ICOUNT:-}" <<'PY'
import statistics, sys, datetime
out, n, rounds, p = open(sys.argv[1]).read().splitlines(), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
icount = sys.argv[5]
med = statistics.median
rs = []                                   # per round: {key: [values]}
for l in out:
    if l.startswith('@@round '):
        rs.append({})
    elif l.startswith('@@') and rs and len(l.split()) > 1:
        k, v = l[2:].split()[0], l.split()[1]
        try:
            rs[-1].setdefault(k, []).append(float(v))
        except ValueError:
            pass
keys = ('untraced', 'puntraced', 'user', 'kernel', 'bystander', 'pbystander', 'ibystander',
        'pibystander', 'krecords')
rs = [r for r in rs if all(k in r for k in keys)]
if not rs:
    sys.exit('kagent_bench: the guest did not give every figure:\n' + '\n'.join(out[-20:]))
def ratio(r, key, base):
    return r[key][0] / statistics.mean(r[base])
def col(key):
    return [r[key][0] for r in rs]
base = [statistics.mean(r['untraced']) for r in rs]
pbase = [statistics.mean(r['puntraced']) for r in rs]
kcalls = med(col('krecords')) / 2 / n          # kernel functions recorded per getppid
print('# sptrace --kernel: cost (bench/kagent_bench.sh)\n')
clock = (f'with -icount shift={icount}: the guest\'s clock counts instructions, '
         f'{2 ** int(icount)} ns each, so every figure is an instruction count, the same '
         f'whatever the host\'s load' if icount else
         'emulated: compare ratios, not nanoseconds')
print(f'Measured {datetime.date.today()} in Debian\'s 6.1 kernel under qemu TCG '
      f'(one vCPU; {clock}), {len(rs)} rounds, '
      f'N = {n} getppid calls and {p} pipe write+read pairs each.  Each round '
      f'measures the untraced loops at its start and its end; every other figure '
      f'is divided by their mean.  Medians over the rounds (each round in brackets).\n')
print('| configuration | ns per getppid | vs untraced (per round) |')
print('|---|---|---|')
print(f'| untraced (module loaded, no probes) | {med(base):.0f} '
      f'({", ".join(f"{x:.0f}" for x in base)}) | 1 |')
for name, key in (('`sptrace run` (user space only)', 'user'), ('`sptrace run --kernel`', 'kernel'),
                  ('untraced, another process traced with --kernel', 'bystander'),
                  ('untraced, another process traced with --kernel-indirect', 'ibystander')):
    rr = [ratio(r, key, 'untraced') for r in rs]
    print(f'| {name} | {med(col(key)):.0f} | {med(rr):.3f} ({", ".join(f"{x:.3f}" for x in rr)}) |')
print()
print('| configuration | ns per pipe write+read | vs untraced (per round) |')
print('|---|---|---|')
print(f'| untraced (module loaded, no probes) | {med(pbase):.0f} '
      f'({", ".join(f"{x:.0f}" for x in pbase)}) | 1 |')
for name, key in (('untraced, another process traced with --kernel', 'pbystander'),
                  ('untraced, another process traced with --kernel-indirect', 'pibystander')):
    rr = [ratio(r, key, 'puntraced') for r in rs]
    print(f'| {name} | {med(col(key)):.0f} | {med(rr):.3f} ({", ".join(f"{x:.3f}" for x in rr)}) |')
print()
kr = [ratio(r, 'kernel', 'untraced') - ratio(r, 'user', 'untraced') for r in rs]
print(f'- Kernel functions recorded per traced getppid: {kcalls:.1f} '
      f'(records kept ÷ 2 ÷ N); {med(col("probes")) if all("probes" in r for r in rs) else 0:.0f} '
      f'functions hooked, {med(col("sites")) if all("sites" in r for r in rs) else 0:.0f} '
      f'indirect calls watched by kprobes ({med(col("optimized")) if all("optimized" in r for r in rs) else 0:.0f} '
      f'of them optimised into jumps).')
print(f'- Per traced kernel call (--kernel minus user space only, in untraced getppids, '
      f'÷ the above): {med(kr) / kcalls:.2f} untraced getppids, '
      f'{med(kr) * med(base) / kcalls:.0f} ns.')
def over(key, base):
    return med([100 * (ratio(r, key, base) - 1) for r in rs])
print(f'- Overhead on the untraced bystander, another process traced with --kernel: getppid '
      f'{over("bystander", "untraced"):+.1f}%, pipe write+read {over("pbystander", "puntraced"):+.1f}% '
      f'(spk_direct\'s bit test in each hooked function it calls).')
print(f'- With --kernel-indirect: getppid {over("ibystander", "untraced"):+.1f}%, pipe write+read '
      f'{over("pibystander", "puntraced"):+.1f}% (and a kprobe hit at each watched indirect call it '
      f'passes: vfs_read\'s and vfs_write\'s).')
PY
