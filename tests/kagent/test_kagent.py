#!/usr/bin/env python3
"""The kernel module in Debian's kernel under qemu (tests/kagent/guest.sh),
one boot for every check (a boot under TCG costs seconds):

  chains     a program traced with `sptrace run --kernel`: its write(),
             read() and getppid() show the kernel's functions nested under
             them (write { __x64_sys_write { ksys_write { vfs_write } } },
             likewise read, getppid { __x64_sys_getppid }); every system
             call's entry sits under a call of the program, never at the
             top or under another kernel function
  fork       the program's forked child is in the scope too: its getppid
             shows __x64_sys_getppid under it, in the child's own thread
  untraced   a process spinning on getppid meanwhile, not traced, leaves no
             record (the module's scope): its pid is not among the threads
             whose records sptrace found and left out
  probes     the hooks are in while a traced program runs (it reads
             ftrace's enabled_functions itself), none is left once
             sptrace is done, nor after rmmod (enabled_functions, and the
             kprobes list)
  indirect   with --kernel-indirect, calls through function pointers, found
             while the program runs: after its first reads from a pipe, read { ... vfs_read {
             ... pipe_read } } (f_op->read_iter), likewise vfs_write {
             pipe_write }
  attach     `sptrace attach --kernel` on a running program: its write,
             read and getppid after the attach show the same chains, and
             attach ends with the program
  no-module  without the module --kernel fails, says how to load it, and
             the previous trace keeps its place; attach --kernel likewise,
             before touching the process (no agent in it)

usage: test_kagent.py GUEST_SH KCALLS
"""
import os
import re
import subprocess
import sys

GUEST = r'''
set -u
touch marker.none
./kcalls spin stop > spin.out &
U=$!
echo "@@untraced $U"
sptrace run --kernel -- ./kcalls > traced.out 2> run.err
echo "@@run-status $?"
touch stop; wait $U
sed 's/^/@@run-err /' run.err
sed 's/^/@@spin /' spin.out
sptrace run --kernel -o fork.data -- ./kcalls fork > fork.out 2>&1
echo "@@fork-status $?"
sptrace replay fork.data | sed 's/^/@@fork-replay /'
sptrace replay sptrace.data > replay.txt 2> replay.err
echo "@@replay-status $?"
sed 's/^/@@replay /' replay.txt
sed 's/^/@@syms /' sptrace.data/kernel.syms
sptrace run --kernel-indirect -o ind.data -- ./kcalls pipes 20 > ind.out 2> ind.err
echo "@@ind-status $?"
sed 's/^/@@ind-err /' ind.err
sptrace replay ind.data | sed 's/^/@@ind-replay /'
./kcalls wait go > att.out 2>&1 &
A=$!
while [ ! -e go.ready ]; do sleep 0.1; done
sptrace attach --kernel -o att.data $A > attach.out 2> attach.err &
S=$!
i=0; while ! grep -q 'recording pid' attach.out && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
# ... and until the agent is tracing (meta says "activated"): under load the
# program's calls could come first (the trace then had no thread at all)
i=0; while ! grep -q '^activated' att.data/meta 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
# ... and until the program's thread has its ring: "activated" is written when
# the breakpoint after its system call is armed, before the thread gets there
i=0; while ! ls att.data/ring.* > /dev/null 2>&1 && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "@@attach-ring-wait $i"
touch go
wait $S; echo "@@attach-status $?"
wait $A; echo "@@attached-status $?"
sed 's/^/@@attach-out /' attach.out
sed 's/^/@@attach-err /' attach.err
sptrace replay att.data | sed 's/^/@@attach-replay /'
sed 's/^/@@attach-log /' att.data/agent.log
echo "@@kprobes-after-close $(grep -c . /sys/kernel/debug/kprobes/list)"
echo "@@ftrace-after-close $(grep -c . /sys/kernel/debug/tracing/enabled_functions)"
sptrace run --kernel -o during.data -- ./kcalls cat /sys/kernel/debug/tracing/enabled_functions > during.out 2>/dev/null
echo "@@during-status $? $(grep -c . during.out)"
echo "@@ftrace-after-second $(grep -c . /sys/kernel/debug/tracing/enabled_functions)"
sptrace run --kernel -o during2.data -- ./kcalls cat /sys/kernel/debug/kprobes/list > during2.out 2>/dev/null
echo "@@kprobes-during-plain $? $(grep -c . during2.out)"
rmmod sptrace_kagent; echo "@@rmmod $?"
dmesg | grep -E 'WARNING:|BUG:' | sed 's/^/@@kwarn /'
echo "@@kprobes-after-rmmod $(grep -c . /sys/kernel/debug/kprobes/list)"
echo "@@ftrace-after-rmmod $(grep -c . /sys/kernel/debug/tracing/enabled_functions)"
sptrace run --kernel -- ./kcalls > nomod.out 2> nomod.err
echo "@@nomod-status $?"
sed 's/^/@@nomod-err /' nomod.err
echo "@@old-trace-kept $(test -f sptrace.data/kernel.syms && echo yes || echo no)"
./kcalls idle stop2 &
P=$!
while [ ! -e stop2.ready ]; do sleep 0.1; done
sptrace attach --kernel -o natt.data $P > natt.out 2> natt.err
echo "@@nomod-attach-status $?"
sed 's/^/@@nomod-attach-err /' natt.err
echo "@@nomod-attach-agent $(grep -c sptrace-agent /proc/$P/maps)"
echo "@@nomod-attach-dir $(test -e natt.data && echo yes || echo no)"
touch stop2; wait $P
'''

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def values(out, key):
    return [l[len(key) + 3:] for l in out.splitlines() if l.startswith('@@' + key + ' ')]


def one(out, key):
    v = values(out, key)
    return v[0] if v else None


# The guest's shell, shared by the key tests.  wait_for FILE PATTERN TENTHS
# [PID]: until FILE has PATTERN, at most TENTHS tenths of a second, and no
# longer once PID has ended.
GUEST_WAIT_FOR = r'''
wait_for() {  # FILE PATTERN TENTHS [PID: no longer once it has ended]
	n=0
	until grep -q "$2" "$1" 2>/dev/null || [ $n -ge $3 ]; do
		[ -z "${4:-}" ] || kill -0 "$4" 2>/dev/null || return 0
		sleep 0.1; n=$((n + 1))
	done
}
'''

# `sptrace run --on key Ctrl-Alt-T -- ./ticker`, typed the wrong chords at
# @@wrong-more and @@wrong-fewer, then the chord at @@press
# (check_chord_run reads it); then `sptrace attach PID --on key Ctrl-Alt-T`
# on a running ticker, the chord at @@press-attach (the @@att- lines).  A
# test puts lines of its own at #@after-waiting (once run waits).
CHORD_RUN_ATTACH = r'''
mkfifo in
sptrace run --on key Ctrl-Alt-T -o key.data -- ./ticker < in > ticker.out 2> run.err &
P=$!
exec 3<> in           # read-write: never blocks, should run fail before the program
wait_for ticker.out ready 1200 $P
wait_for run.err 'waits for' 600 $P
sed 's/^/@@waiting /' run.err
#@after-waiting
echo "@@wrong-more"
sleep 3
echo "@@wrong-fewer"
sleep 3
echo "@@activated-before $(grep -c '^activated ' key.data/meta 2>/dev/null)"
echo "@@press"
wait_for key.data/meta '^activated ' 900 $P
echo "@@activated-after $(grep -c '^activated ' key.data/meta 2>/dev/null)"
sleep 2
exec 3>&-
wait $P
echo "@@run-status $?"
sed 's/^/@@run-err /' run.err
sed 's/^/@@ticker /' ticker.out
sptrace replay key.data > replay.txt 2>&1
echo "@@replay-status $?"
echo "@@tick-calls $(grep -c 'tick();' replay.txt)"
head -20 replay.txt | sed 's/^/@@replay /'
mkfifo in2
./ticker < in2 > ticker2.out &
T=$!
exec 4<> in2
wait_for ticker2.out ready 600
sptrace attach $T --on key Ctrl-Alt-T -o att.data > att.out 2> att.err 4>&- &
A=$!
wait_for att.out 'tracing starts when' 1200 $A
sed 's/^/@@att-waiting /' att.out
echo "@@press-attach"
wait_for att.data/meta '^activated ' 900 $A
echo "@@att-activated $(grep -c '^activated ' att.data/meta 2>/dev/null)"
sleep 2
exec 4>&-
wait $T
wait $A
echo "@@att-status $?"
sed 's/^/@@att-out /' att.out
sed 's/^/@@att-err /' att.err
echo "@@att-tick-calls $(sptrace replay att.data 2>&1 | grep -c 'tick();')"
'''


def check_chord_run(out, err):
    """A guest's `sptrace run --on key Ctrl-Alt-T -- ticker` (its @@ lines,
    its stderr `err`), typed the wrong chords Ctrl-Alt-Shift-T and Ctrl-T and
    then Ctrl-Alt-T: nothing started before, one activation at the chord,
    tick() traced only after it."""
    check(one(out, 'activated-before') == '0',
          f'Ctrl-Alt-Shift-T and Ctrl-T start nothing ({one(out, "activated-before")} '
          'activated lines before Ctrl-Alt-T)')
    check(one(out, 'activated-after') == '1',
          f'Ctrl-Alt-T starts tracing ({one(out, "activated-after")} activated lines)')
    check(err.count('Ctrl-Alt-T pressed') == 1, 'one press said: ' + err)
    check(one(out, 'run-status') == '0', 'sptrace run --on key succeeded: ' + err)
    ticks = re.search(r'ticks (\d+)', ' '.join(values(out, 'ticker')))
    calls = int(one(out, 'tick-calls') or 0)
    check(one(out, 'replay-status') == '0' and calls > 5 and ticks and calls < int(ticks.group(1)),
          f'replay shows tick() {calls} times, of {ticks.group(1) if ticks else "?"} ticks: only '
          'after the press\n' + '\n'.join(values(out, 'replay')))


def calls(replay_lines):
    """Each call in the replay with the names of its ancestors, outermost
    first: [(tid, [ancestor..., name])]."""
    out = []
    stacks = {}
    pat = re.compile(r'^\s*(?:[\d.]+ \w+)?\s*\[\s*(\d+)\] \|( *)(.*)$')
    for line in replay_lines:
        m = pat.match(line)
        if not m:
            continue
        tid, indent, text = m.group(1), len(m.group(2)) - 1, m.group(3)
        depth = indent // 2
        st = stacks.setdefault(tid, [])
        call = re.match(r'^([^\s(]+)\(\)( \{|;)$', text)
        if call:
            del st[depth:]
            out.append((tid, st + [call.group(1)]))
            if call.group(2) == ' {':
                st.append(call.group(1))
        elif text.startswith('} /*'):
            del st[depth:]
    return out


def has_chain(all_calls, chain):
    n = len(chain)
    return any(path[-n:] == chain for _, path in all_calls)


def boot(args, env=None):
    """guest.sh ARGS: the guest's output, or None after saying why it ran
    no script to the end."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       errors='replace', env=env)
    if p.returncode != 0 or '@@run-status' not in p.stdout:
        print(p.stdout[-4000:])
        print(p.stderr[-4000:], file=sys.stderr)
        print(f'FAIL guest.sh exited {p.returncode}')
        return None
    return p.stdout


def boot_chords(args, presses, script):
    """boot() of guest.sh ARGS running `script`, which holds CHORD_RUN_ATTACH:
    its wrong chords and presses typed at its markers, then Ctrl-Alt-T at
    each of `presses` (markers the script echoes).  A stuck step fails in
    minutes (a run takes ~20 s), not guest.sh's 600 s."""
    keys = ['--sendkey', '@@wrong-more', 'ctrl-alt-shift-t',
            '--sendkey', '@@wrong-fewer', 'ctrl-t',
            '--sendkey', '@@press', 'ctrl-alt-t',
            '--sendkey', '@@press-attach', 'ctrl-alt-t']
    for marker in presses:
        keys += ['--sendkey', marker, 'ctrl-alt-t']
    return boot(args + keys + [script],
                env=dict(os.environ, SPTRACE_GUEST_TIMEOUT=os.environ.get(
                    'SPTRACE_GUEST_TIMEOUT', '240')))


def main():
    guest, kcalls = sys.argv[1], sys.argv[2]
    out = boot([guest, '--add', kcalls, GUEST])
    if out is None:
        return 1

    # chains
    check(one(out, 'run-status') == '0', 'sptrace run --kernel succeeded: ' +
          ' / '.join(values(out, 'run-err')))
    check(one(out, 'replay-status') == '0', 'sptrace replay succeeded')
    all_calls = calls(values(out, 'replay'))
    ksyms = {l.split(' ', 1)[1] for l in values(out, 'syms') if ' ' in l}
    for chain in (['main', 'write', '__x64_sys_write', 'ksys_write', 'vfs_write'],
                  ['main', 'read', '__x64_sys_read', 'ksys_read', 'vfs_read'],
                  ['ask_parent', 'getppid', '__x64_sys_getppid']):
        check(has_chain(all_calls, chain), 'the chain ' + ' { '.join(chain) + ' }')
    entries = [path for _, path in all_calls if path[-1].startswith('__x64_sys_')]
    check(len(entries) >= 3, f'{len(entries)} system calls seen in the kernel')
    bad = [path for path in entries if len(path) < 2 or path[-2] in ksyms]
    check(not bad, 'every system call sits under a call of the program' +
          (f' (not: {bad[:3]})' if bad else ''))

    # fork
    check(one(out, 'fork-status') == '0', 'sptrace run --kernel -- kcalls fork')
    fork_calls = calls(values(out, 'fork-replay'))
    tids = {tid for tid, path in fork_calls if path[-3:] == ['ask_parent', 'getppid', '__x64_sys_getppid']}
    main_tids = {tid for tid, path in fork_calls if path == ['main']}
    check(len(tids) == 1 and not tids & main_tids,
          f'the child\'s getppid {{ __x64_sys_getppid }} in its own thread (child {tids}, '
          f'parent {main_tids})')

    # untraced
    u = one(out, 'untraced')
    spun = one(out, 'spin') or ''
    check(spun.endswith('getppid calls') and int(spun.split()[0]) > 0,
          'the untraced process called getppid meanwhile: ' + spun)
    left = ' '.join(values(out, 'run-err'))
    m = re.search(r'no ring for left out \(tid([\d .]*)\)', left)
    tids = m.group(1).split() if m else []
    check(u is not None and u not in tids and '...' not in tids,
          f'no kernel record of the untraced pid {u} (threads left out: {tids or "none"})')

    # indirect
    check(one(out, 'ind-status') == '0', 'sptrace run --kernel-indirect -- kcalls pipes 20: ' +
          ' / '.join(values(out, 'ind-err')))
    ind_calls = calls(values(out, 'ind-replay'))
    for outer, inner, syscall in (('vfs_read', 'pipe_read', 'read'),
                                  ('vfs_write', 'pipe_write', 'write')):
        n = sum(1 for _, path in ind_calls if path[-1] == inner and outer in path and
                syscall in path and path.index(syscall) < path.index(outer))
        check(n > 0, f'{syscall} {{ ... {outer} {{ ... {inner} }} }}: {n} times '
              f'(of 20 calls; the first ones reveal the target)')
    check('found through indirect calls' in ' '.join(values(out, 'ind-err')),
          'the summary counts the functions found through indirect calls')
    # The module's indirect-call decisions are the propagation core's
    # (agent/core/core.c's cp_indirect_miss, kagent/core_plat.c): its counts.
    m = re.search(r'propagation core \(agent/core\) took (\d+) misses of indirect sites\' '
                  r'caches, kept (\d+) targets to hook, gave (\d+) \(site, callee\) ids',
                  ' '.join(values(out, 'ind-err')))
    check(m is not None and int(m.group(1)) > 0 and 0 < int(m.group(2)) <= int(m.group(1))
          and int(m.group(3)) > 0,
          'the summary names the module core\'s counts (misses, kept, ids): ' +
          (m.group(0) if m else 'no such line'))

    # The module's own warnings (core_plat.c's cp_plat_* that only
    # cp_instrument calls warn if ever reached) and the kernel's.
    check(not values(out, 'kwarn'), 'no kernel WARNING or BUG while the module ran: ' +
          (' / '.join(values(out, 'kwarn')) or 'none'))

    # attach
    check(one(out, 'attach-status') == '0' and one(out, 'attached-status') == '0',
          f'sptrace attach --kernel (status {one(out, "attach-status")}, the program\'s '
          f'{one(out, "attached-status")}): ' + ' / '.join(values(out, 'attach-err')))
    att_calls = calls(values(out, 'attach-replay'))
    wait = one(out, 'attach-ring-wait') or '?'
    check(wait.isdigit() and int(wait) < 600,
          f'attach: the program\'s thread had its ring {wait} tenths of a second after '
          f'meta said "activated"')
    # (agent.log said when a chain is missing)
    log = '' if all(has_chain(att_calls, c) for c in (
        ['write', '__x64_sys_write'], ['read', '__x64_sys_read'])) else \
        '; agent.log: ' + ' / '.join(values(out, 'attach-log'))
    for chain in (['write', '__x64_sys_write', 'ksys_write', 'vfs_write'],
                  ['read', '__x64_sys_read', 'ksys_read', 'vfs_read']):
        check(has_chain(att_calls, chain), 'attach: the chain ' + ' { '.join(chain) + ' }' +
              ('' if has_chain(att_calls, chain) else log))
    # Attached, libc's getppid is reached through a PLT slot bound lazily,
    # which the agent may not show as a call of its own.
    check(has_chain(att_calls, ['ask_parent', 'getppid', '__x64_sys_getppid']) or
          has_chain(att_calls, ['ask_parent', '__x64_sys_getppid']),
          'attach: the chain ask_parent { [getppid {] __x64_sys_getppid }')
    check(any('the process has ended' in l for l in values(out, 'attach-out')),
          'attach --kernel ended with the program: ' + ' / '.join(values(out, 'attach-out')))

    # probes
    during = (one(out, 'during-status') or '').split()
    check(len(during) == 2 and during[0] == '0' and int(during[1]) > 0,
          f'hooks in place while a traced program runs: {during[1:] or "?"} in enabled_functions')
    check(one(out, 'kprobes-during-plain') == '0 0',
          f'--kernel alone puts no kprobe in (status, kprobes: {one(out, "kprobes-during-plain")})')
    for key in ('kprobes-after-close', 'ftrace-after-close', 'ftrace-after-second'):
        check(one(out, key) == '0', f'{key}: {one(out, key)} left')
    check(one(out, 'rmmod') == '0', 'rmmod sptrace_kagent')
    for key in ('kprobes-after-rmmod', 'ftrace-after-rmmod'):
        check(one(out, key) == '0', f'{key}: {one(out, key)} left')

    # no-module
    err = ' '.join(values(out, 'nomod-err'))
    check(one(out, 'nomod-status') == '1', f'--kernel without the module fails (status '
          f'{one(out, "nomod-status")})')
    check('/dev/sptrace' in err and 'not loaded' in err and 'insmod' in err,
          'the error says the module is not loaded and how to load it: ' + err)
    check(one(out, 'old-trace-kept') == 'yes', 'the previous trace kept its place')
    err = ' '.join(values(out, 'nomod-attach-err'))
    check(one(out, 'nomod-attach-status') == '1' and 'not loaded' in err and 'insmod' in err,
          f'attach --kernel without the module fails the same way (status '
          f'{one(out, "nomod-attach-status")}): ' + err)
    check(one(out, 'nomod-attach-agent') == '0' and one(out, 'nomod-attach-dir') == 'no',
          'attach --kernel without the module leaves the process and the directory alone')

    print(f'{len(failures)} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
