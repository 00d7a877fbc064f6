#!/usr/bin/env python3
"""`--on key CHORD` through evdev, in Debian's kernel under qemu
(tests/kagent/guest.sh), one boot: the guest has no $DISPLAY; its
sptrace_kagent module is unloaded first (no /dev/sptrace: not the module's
notifier) and the kernel's evdev.ko loaded, which gives qemu's PS/2
keyboard a /dev/input/eventN.  The chords are typed on that keyboard
through qemu's monitor (guest.sh --sendkey).  tests/progs/ticker.c calls
tick() every 10 ms until its standard input closes.

  backend   `sptrace run --on key Ctrl-Alt-T -- ticker` says it waits for
            the chord through "evdev: /dev/input/eventN (AT Translated Set
            2 keyboard)"; a symbolic link planted beside it
            (/dev/input/event99 -> eventN) is not followed, so not named
  exact     Ctrl-Alt-Shift-T and Ctrl-T (more and fewer modifiers) start
            nothing: no activated line in meta, no "pressed"
  press     Ctrl-Alt-T starts tracing: meta's activated line, "Ctrl-Alt-T
            pressed" once; the program ends normally and replay shows its
            tick() calls, fewer than the ticks it made (only after the press)
  attach    `sptrace attach PID --on key Ctrl-Alt-T` on a running ticker:
            it waits through evdev, the chord starts tracing, attach ends
            with the process and replay shows tick()
  fds       the traced program holds none of the keyboards (close-on-exec):
            no /dev/input link among /proc/PID/fd while sptrace waits
  plug      uinput loaded: a keyboard vkbd plugs in while `run --on key`
            waits is read too (said once); on it, Ctrl-T and
            Ctrl-Alt-Shift-T start nothing and Ctrl-Alt-T starts tracing;
            unplugged, it is said gone once, and the PS/2 keyboard's
            Ctrl-Alt-T still stops tracing
  kernel    the module loaded again: `run --kernel --on key` still waits
            through evdev (the module's one opener is --kernel's side), the
            chord starts tracing and replay shows the program's system
            calls followed into the kernel (__x64_sys_*)
  katt      `sptrace attach PID --kernel --on key Ctrl-Alt-T` on a running
            ticker: it waits through evdev, the chord starts tracing,
            attach ends with the process and replay shows tick() and the
            system calls in the kernel

usage: test_kagent_evdev.py GUEST_SH TICKER VKBD
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kagent import (  # noqa: E402  (the guest's @@ lines)
    CHORD_RUN_ATTACH, GUEST_WAIT_FOR, boot_chords, check, check_chord_run, failures, one,
    values)

# the chord typed on the guest's PS/2 keyboard, read through evdev; the
# traced program never holds an input device
AFTER_WAITING = r'''T=$(pidof ticker)
[ -n "$T" ] && echo "@@ticker-input-fds $(ls -l /proc/$T/fd | grep -c /dev/input)"
'''
GUEST = 'set -u\n' + GUEST_WAIT_FOR + r'''
rmmod sptrace_kagent; echo "@@rmmod $? $(ls /dev/sptrace 2>&1)"
insmod /lib/modules/evdev.ko; echo "@@insmod $?"
n=0; until ls /dev/input/event* > /dev/null 2>&1 || [ $n -ge 100 ]; do sleep 0.1; n=$((n + 1)); done
ls -l /dev/input | sed 's/^/@@dev /'
grep '^N: ' /proc/bus/input/devices | sed 's/^/@@input /'
first=$(cd /dev/input && ls event* | head -1)
ln -s "$first" /dev/input/event99
''' + CHORD_RUN_ATTACH.replace('#@after-waiting\n', AFTER_WAITING) + r'''
insmod /lib/modules/uinput.ko; echo "@@insmod-uinput $?"
mkfifo in4 vk
sptrace run --on key Ctrl-Alt-T -o hot.data -- ./ticker < in4 > ticker4.out 2> hot.err &
H=$!
exec 6<> in4
wait_for ticker4.out ready 1200 $H
wait_for hot.err 'waits for' 600 $H
./vkbd < vk > vkbd.out 2>&1 &
V=$!
exec 7<> vk
wait_for hot.err 'plugged in' 200 $H
echo ctrl-t >&7
echo ctrl-alt-shift-t >&7
wait_for vkbd.out 'typed 4' 200 $V
sleep 1
echo "@@hot-activated-wrong $(grep -c '^activated ' hot.data/meta 2>/dev/null)"
echo ctrl-alt-t >&7
wait_for hot.data/meta '^activated ' 200 $H
echo "@@hot-activated $(grep -c '^activated ' hot.data/meta 2>/dev/null)"
exec 7>&-
wait $V
echo "@@vkbd-status $?"
wait_for hot.err 'is gone' 200 $H
sleep 1
echo "@@press-hot"
wait_for hot.data/meta '^stopped ' 300 $H
echo "@@hot-stopped $(grep -c '^stopped ' hot.data/meta 2>/dev/null)"
exec 6>&-
wait $H
echo "@@hot-status $?"
sed 's/^/@@hot-err /' hot.err
sed 's/^/@@vkbd /' vkbd.out
insmod /lib/modules/sptrace_kagent.ko; echo "@@insmod-kagent $?"
mkfifo in3
sptrace run --kernel --on key Ctrl-Alt-T -o kern.data -- ./ticker < in3 > ticker3.out 2> kern.err &
K=$!
exec 5<> in3
wait_for ticker3.out ready 1200 $K
wait_for kern.err 'waits for' 600 $K
sed 's/^/@@kern-waiting /' kern.err
echo "@@press-kernel"
wait_for kern.data/meta '^activated ' 900 $K
echo "@@kern-activated $(grep -c '^activated ' kern.data/meta 2>/dev/null)"
sleep 2
exec 5>&-
wait $K
echo "@@kern-status $?"
sed 's/^/@@kern-err /' kern.err
sptrace replay kern.data > kern.txt 2>&1
echo "@@kern-tick-calls $(grep -c 'tick();' kern.txt)"
echo "@@kern-kernel-calls $(grep -c '__x64_sys_' kern.txt)"
mkfifo in5
./ticker < in5 > ticker5.out &
T5=$!
exec 8<> in5
wait_for ticker5.out ready 600
sptrace attach $T5 --kernel --on key Ctrl-Alt-T -o katt.data > katt.out 2> katt.err 8>&- &
KA=$!
wait_for katt.out 'tracing starts when' 1200 $KA
sed 's/^/@@katt-waiting /' katt.out
echo "@@press-katt"
wait_for katt.data/meta '^activated ' 900 $KA
echo "@@katt-activated $(grep -c '^activated ' katt.data/meta 2>/dev/null)"
sleep 2
exec 8>&-
wait $T5
wait $KA
echo "@@katt-status $?"
sed 's/^/@@katt-out /' katt.out
sed 's/^/@@katt-err /' katt.err
sptrace replay katt.data > katt.txt 2>&1
echo "@@katt-tick-calls $(grep -c 'tick();' katt.txt)"
echo "@@katt-kernel-calls $(grep -c '__x64_sys_' katt.txt)"
'''


def main():
    guest, ticker, vkbd = sys.argv[1], sys.argv[2], sys.argv[3]
    out = boot_chords([guest, '--add', ticker, '--add', vkbd],
                      ['@@press-hot', '@@press-kernel', '@@press-katt'], GUEST)
    if out is None:
        return 1
    err = ' / '.join(values(out, 'run-err'))
    setup = '\n'.join(values(out, 'dev') + values(out, 'input'))
    check((one(out, 'rmmod') or '').startswith('0 ') and one(out, 'insmod') == '0',
          f'the module unloaded ({one(out, "rmmod")}), evdev loaded ({one(out, "insmod")})')

    # backend
    waiting = ' '.join(values(out, 'waiting'))
    m = re.search(r'waits for Ctrl-Alt-T \(evdev: (/dev/input/event\d+) \(AT Translated Set 2 '
                  r'keyboard\)\)', waiting)
    check(m is not None, 'run waits for the chord through evdev and names the keyboard: ' +
          (waiting or err) + '\n' + setup)
    check(m is not None and 'event99' not in waiting, 'the planted link /dev/input/event99 is not followed: ' +
          waiting)
    check(one(out, 'ticker-input-fds') == '0', 'the traced program holds no /dev/input device '
          f'({one(out, "ticker-input-fds")} fds)')
    check_chord_run(out, err)
    # attach
    att = ' / '.join(values(out, 'att-out') + values(out, 'att-err'))
    check(re.search(r'tracing starts when Ctrl-Alt-T is pressed \(evdev: /dev/input/event\d+ '
                    r'\(AT Translated Set 2 keyboard\)\)', ' '.join(values(out, 'att-waiting')))
          is not None, 'attach waits for the chord through evdev: ' + att)
    check(one(out, 'att-activated') == '1', f'the chord starts tracing the attached process '
          f'({one(out, "att-activated")} activated lines)')
    check(one(out, 'att-status') == '0' and 'has ended' in att, 'attach ends with the process: '
          f'{one(out, "att-status")} {att}')
    n = int(one(out, 'att-tick-calls') or 0)
    check(n > 5, f'replay of the attached trace shows tick() {n} times')

    # plug
    hot = ' / '.join(values(out, 'hot-err'))
    check(one(out, 'insmod-uinput') == '0' and
          hot.count('(sptrace test keyboard) plugged in: read too') == 1,
          'a keyboard plugged in while run waits is read too: ' + hot)
    check(one(out, 'hot-activated-wrong') == '0', 'on it, Ctrl-T and Ctrl-Alt-Shift-T start '
          f'nothing ({one(out, "hot-activated-wrong")} activated lines)')
    check(one(out, 'hot-activated') == '1', 'on it, Ctrl-Alt-T starts tracing '
          f'({one(out, "hot-activated")} activated lines)')
    check(one(out, 'vkbd-status') == '0' and hot.count('(sptrace test keyboard) is gone') == 1,
          'unplugged, it is said gone once (its descriptor out of the epoll set): ' + hot +
          ' / vkbd: ' + ' / '.join(values(out, 'vkbd')))
    check(one(out, 'hot-stopped') == '1' and one(out, 'hot-status') == '0' and
          hot.count('Ctrl-Alt-T pressed') == 2, 'the PS/2 keyboard still read after the '
          f'unplug: its Ctrl-Alt-T stops tracing ({one(out, "hot-stopped")} stopped lines, '
          f'status {one(out, "hot-status")}): ' + hot)
    # kernel
    kern = ' / '.join(values(out, 'kern-err'))
    check(one(out, 'insmod-kagent') == '0' and
          re.search(r'waits for Ctrl-Alt-T \(evdev: /dev/input/event\d+ ',
                    ' '.join(values(out, 'kern-waiting'))) is not None,
          'with the module loaded again, run --kernel --on key waits through evdev (the '
          'module\'s device is --kernel\'s): ' + kern)
    n, k = int(one(out, 'kern-tick-calls') or 0), int(one(out, 'kern-kernel-calls') or 0)
    check(one(out, 'kern-activated') == '1' and one(out, 'kern-status') == '0' and n > 5 and k > 0,
          f'the chord starts tracing, kernel calls included ({one(out, "kern-activated")} '
          f'activated lines, status {one(out, "kern-status")}, {n} tick() and {k} system '
          'calls in replay): ' + kern)
    # attach --kernel --on key: one loop waits for the chord and copies the
    # module's rings
    katt = ' / '.join(values(out, 'katt-out') + values(out, 'katt-err'))
    check(re.search(r'tracing starts when Ctrl-Alt-T is pressed \(evdev: /dev/input/event\d+ ',
                    ' '.join(values(out, 'katt-waiting'))) is not None,
          'attach --kernel --on key waits for the chord through evdev: ' + katt)
    n, k = int(one(out, 'katt-tick-calls') or 0), int(one(out, 'katt-kernel-calls') or 0)
    check(one(out, 'katt-activated') == '1' and one(out, 'katt-status') == '0' and n > 5 and
          k > 0 and 'the process has ended' in katt,
          f'the chord starts tracing the attached process, kernel calls included '
          f'({one(out, "katt-activated")} activated lines, status {one(out, "katt-status")}, '
          f'{n} tick() and {k} system calls in replay): ' + katt)

    print(f'{len(failures)} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
