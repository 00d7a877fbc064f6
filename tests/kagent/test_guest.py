#!/usr/bin/env python3
"""The contract of tests/kagent/guest.sh (README, "The kernel guest"):

  status     the commands' exit status is the script's; their stdout and
             stderr come out on its own; each --add FILE is in the guest's
             /tmp (the commands' cwd) with its mode
  timeout    a guest that does not finish within SPTRACE_GUEST_TIMEOUT is
             stopped: status 124, and no qemu of it is left
  signal     SIGTERM to guest.sh (a test runner's timeout; Ctrl-C is
             SIGINT, the same path) stops it and its qemu

usage: test_guest.py GUEST_SH
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def qemus_of(tmpdir):
    """qemu processes whose command line names a file under tmpdir."""
    out = subprocess.run(['ps', '-eo', 'pid=,args='], stdout=subprocess.PIPE, text=True).stdout
    return [l for l in out.splitlines() if 'qemu-system' in l and tmpdir in l]


def main():
    guest = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        add = os.path.join(tmp, 'payload.sh')
        with open(add, 'w') as f:
            f.write('#!/bin/sh\necho "payload $1"\n')
        os.chmod(add, 0o755)

        # status
        p = subprocess.run([guest, '--add', add, 'pwd; ./payload.sh ran; echo to-stderr >&2; exit 7'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=600)
        check(p.returncode == 7, f'exit status of the commands: {p.returncode}')
        check(p.stdout.split() == ['/tmp', 'payload', 'ran'], f'stdout: {p.stdout!r}')
        check('to-stderr' in p.stderr and 'to-stderr' not in p.stdout, f'stderr: {p.stderr[-200:]!r}')

        # timeout
        t0 = time.time()
        p = subprocess.run([guest, 'echo started; sleep 600'], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=300,
                           env=dict(env, SPTRACE_GUEST_TIMEOUT='25'))
        took = time.time() - t0
        check(p.returncode == 124 and 'did not finish' in p.stderr,
              f'timeout: status {p.returncode} after {took:.0f} s: {p.stderr[:120]!r}')
        check(took < 120, f'stopped at the timeout ({took:.0f} s)')
        check(not qemus_of(tmp), 'no qemu left after the timeout')

        # signal
        proc = subprocess.Popen([guest, 'sleep 600'], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        deadline = time.time() + 120
        while not qemus_of(tmp) and time.time() < deadline:
            time.sleep(0.2)
        check(bool(qemus_of(tmp)), 'qemu started')
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        time.sleep(1)
        check(proc.returncode not in (None, 0), f'guest.sh ended by SIGTERM: {proc.returncode}')
        check(not qemus_of(tmp), 'no qemu left after SIGTERM')
        for l in qemus_of(tmp):
            os.kill(int(l.split()[0]), signal.SIGKILL)
    print(f'{len(failures)} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
