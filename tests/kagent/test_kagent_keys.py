#!/usr/bin/env python3
"""`--on key CHORD` through the kernel module's keyboard notifier, in
Debian's kernel under qemu (tests/kagent/guest.sh), one boot: the guest has
no $DISPLAY, so `sptrace run --on key Ctrl-Alt-T -- ticker` takes the
module's backend; the chords are typed on qemu's PS/2 keyboard through its
monitor (guest.sh --sendkey).  tests/progs/ticker.c calls tick() every
10 ms until its standard input closes.

  backend   run says it waits for Ctrl-Alt-T (the kernel module's keyboard
            notifier)
  exact     Ctrl-Alt-Shift-T and Ctrl-T (more and fewer modifiers) start
            nothing: no activated line in meta, no "pressed"
  press     Ctrl-Alt-T starts tracing: meta's activated line, "Ctrl-Alt-T
            pressed" once; the program ends normally and replay shows its
            tick() calls
  attach    `sptrace attach PID --on key Ctrl-Alt-T` on a running ticker
            (the device free again after run's close): it waits through the
            notifier, the chord starts tracing, attach ends with the process
            and replay shows tick()
  freeze    `run --flight-recorder --on key Ctrl-Alt-T`: traced from the
            start (activated before any press); the chord freezes the
            flight recorder (meta's stopped line, "frozen" said): replay
            shows the ticks before the press and not the 3 s after it
  unload    the notifier is gone with the device's close: rmmod succeeds

usage: test_kagent_keys.py GUEST_SH TICKER
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kagent import (  # noqa: E402  (the guest's @@ lines)
    CHORD_RUN_ATTACH, GUEST_WAIT_FOR, boot_chords, check, check_chord_run, failures, one,
    values)

GUEST = 'set -u\n' + GUEST_WAIT_FOR + CHORD_RUN_ATTACH.replace('#@after-waiting\n', '') + r'''
mkfifo in3
sptrace run --flight-recorder --on key Ctrl-Alt-T -o fr.data -- ./ticker < in3 > ticker3.out 2> fr.err &
F=$!
exec 5> in3
wait_for ticker3.out ready 1200
wait_for fr.err 'flight recorder' 600
sleep 2
echo "@@fr-activated-before $(grep -c '^activated ' fr.data/meta 2>/dev/null)"
echo "@@press-freeze"
wait_for fr.data/meta '^stopped ' 900
echo "@@fr-stopped $(grep -c '^stopped ' fr.data/meta 2>/dev/null)"
sleep 3
exec 5>&-
wait $F
echo "@@fr-status $?"
sed 's/^/@@fr-err /' fr.err
sed 's/^/@@fr-ticker /' ticker3.out
echo "@@fr-tick-calls $(sptrace replay fr.data 2>&1 | grep -c 'tick();')"
rmmod sptrace_kagent; echo "@@rmmod $?"
'''



def main():
    guest, ticker = sys.argv[1], sys.argv[2]
    out = boot_chords([guest, '--add', ticker], ['@@press-freeze'], GUEST)
    if out is None:
        return 1
    err = ' / '.join(values(out, 'run-err'))

    # backend
    waiting = ' '.join(values(out, 'waiting'))
    check('waits for Ctrl-Alt-T (the kernel module\'s keyboard notifier)' in waiting,
          'run waits for the chord through the module: ' + (waiting or err))
    check_chord_run(out, err)
    # attach
    att = ' / '.join(values(out, 'att-out') + values(out, 'att-err'))
    check('tracing starts when Ctrl-Alt-T is pressed (the kernel module\'s keyboard notifier)'
          in ' '.join(values(out, 'att-waiting')), 'attach waits for the chord through the '
          'module: ' + att)
    check(one(out, 'att-activated') == '1', f'the chord starts tracing the attached process '
          f'({one(out, "att-activated")} activated lines)')
    check(one(out, 'att-status') == '0' and 'has ended' in att, 'attach ends with the process: '
          f'{one(out, "att-status")} {att}')
    n = int(one(out, 'att-tick-calls') or 0)
    check(n > 5, f'replay of the attached trace shows tick() {n} times')
    # freeze
    fr = ' / '.join(values(out, 'fr-err'))
    check(one(out, 'fr-activated-before') == '1', f'--flight-recorder --on key traces from the '
          f'start ({one(out, "fr-activated-before")} activated lines before the press): ' + fr)
    check(one(out, 'fr-stopped') == '1' and 'the flight recorder is frozen' in fr,
          f'the chord froze it ({one(out, "fr-stopped")} stopped lines): ' + fr)
    ticks = re.search(r'ticks (\d+)', ' '.join(values(out, 'fr-ticker')))
    n = int(one(out, 'fr-tick-calls') or 0)
    check(one(out, 'fr-status') == '0' and ticks and 50 < n < int(ticks.group(1)) - 100,
          f'replay shows tick() {n} times of {ticks.group(1) if ticks else "?"}: the ticks '
          'before the press, not the 3 s after')

    # unload
    check(one(out, 'rmmod') == '0', 'rmmod after the run: the notifier is gone')

    print(f'{len(failures)} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
