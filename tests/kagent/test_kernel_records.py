#!/usr/bin/env python3
"""test_kernel_records.py SPTRACE KCALLS — the readers' side of
`run --kernel`, on the host (no module needed): a real trace of kcalls gets
kernel records written the way cli/kernel.c writes them (trace_format.h:
kernel.<tid>, a [kernel] module line, sites, kernel.syms), then:

  nest      `replay` shows them nested under the call they fall in
            (read() { fake_sys_read() { fake_vfs_read(); } }), and leaves
            out those before any traced call is open and those inside the
            agent's own time (AGENT_BEGIN..AGENT_END)
  hostile   damaged kernel files never crash or hang a reader: a record of
            a bad kind or site, a file cut mid-record, kernel.syms of
            garbage and of 200000 names, a kernel.<tid> that is a FIFO
"""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'e2e'))
from e2elib import check, private_repo_env, run  # noqa: E402

SITE = struct.Struct('<IIQQQII')   # trace_site
KREC = struct.Struct('<QII')       # trace_kernel_rec
ENTRY, EXIT, EVENT, SYNC = 0, 1, 2, 3
AGENT_BEGIN, AGENT_END = 13, 14


def ring_records(path):
    """(kind, id, full tsc) of a ring, SYNCs applied."""
    data = open(path, 'rb').read()
    count, = struct.unpack_from('<Q', data, 24)
    start_tsc, = struct.unpack_from('<Q', data, 64)
    high = start_tsc >> 38
    out = []
    for i in range(count):
        r, = struct.unpack_from('<Q', data, 4096 + 8 * i)
        kind, rid = r & 3, (r >> 2) & 0xffffff
        if kind == SYNC:
            high = (r >> 2) & ((1 << 26) - 1)
            continue
        out.append((kind, rid, high << 38 | r >> 26))
    return out


def libc_read_addr():
    out = subprocess.run(['nm', '-D', '--defined-only', '/lib/x86_64-linux-gnu/libc.so.6'],
                         capture_output=True, text=True).stdout
    for line in out.split('\n'):
        f = line.split()
        if len(f) == 3 and f[2] in ('read', 'read@@GLIBC_2.2.5'):
            return int(f[0], 16)
    return None


def main():
    sptrace, kcalls = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix='sptrace-krec-')
    env = private_repo_env(tmp)
    d = os.path.join(tmp, 'trace')
    # the ring is read raw here (ring_records): not packed
    p = run([sptrace, 'run', '-o', d, '--no-compact', '--', kcalls], env=env)
    check(p.returncode == 0, 'sptrace run: ' + p.stderr)
    meta = open(os.path.join(d, 'meta')).read().splitlines()
    mods = {int(l.split()[1]): l.split()[2] for l in meta if l.startswith('module ')}
    libc = [i for i, path in mods.items() if 'libc.so' in path]
    check(len(libc) == 1, 'libc in the trace: %s' % mods)
    rings = [f for f in os.listdir(d) if f.startswith('ring.')]
    check(len(rings) == 1, 'one ring: %s' % rings)
    tid = rings[0][5:]
    recs = ring_records(os.path.join(d, rings[0]))
    sites = open(os.path.join(d, 'sites'), 'rb').read()
    nsites, = struct.unpack_from('<I', sites, 0)
    read = libc_read_addr()
    read_ids = [i for i in range(1, nsites) if SITE.unpack_from(sites, i * SITE.size)[1] == libc[0]
                and SITE.unpack_from(sites, i * SITE.size)[4] == read]
    check(read_ids, 'a site calling libc read (%#x)' % (read or 0))
    t_in = [t for k, i, t in recs if k == ENTRY and i in read_ids]
    t_out = [t for k, i, t in recs if k == EXIT and i in read_ids]
    check(t_in and t_out, 'the read call in the ring')
    t0, t1 = t_in[0], t_out[0]
    agent = [(t, k) for k, i, t in recs if k == EVENT and i in (AGENT_BEGIN, AGENT_END)]
    first = recs[0][2]

    # The kernel's sites and names, as cli/kernel.c adds them.
    kmod = max(mods) + 1
    names = {0xffffffff81000100: 'fake_sys_read', 0xffffffff81000200: 'fake_vfs_read',
             0xffffffff81000300: 'fake_before', 0xffffffff81000400: 'fake_agent'}
    ids = {}
    with open(os.path.join(d, 'sites'), 'r+b') as f:
        for n, addr in enumerate(sorted(names)):
            ids[names[addr]] = nsites + n
            f.seek((nsites + n) * SITE.size)
            f.write(SITE.pack(kmod, kmod, addr, addr, addr, 1, 0))
        f.seek(0)
        f.write(struct.pack('<I', nsites + len(names)))
    with open(os.path.join(d, 'kernel.syms'), 'w') as f:
        for addr in sorted(names):
            f.write('%016x %s\n' % (addr, names[addr]))
    with open(os.path.join(d, 'meta'), 'a') as f:
        f.write('module %d [kernel] kallsyms 0\n' % kmod)
    krecs = [(first - 10, ids['fake_before'], ENTRY), (first - 5, ids['fake_before'], EXIT)]
    if agent and agent[0][1] == AGENT_BEGIN and len(agent) > 1:
        krecs += [(agent[0][0] + 1, ids['fake_agent'], ENTRY),
                  (agent[0][0] + 2, ids['fake_agent'], EXIT)]
    # In the widest gap between read's own records: where its system call was
    # -- not the agent's own time (instrumenting read's callees at its first
    # call), whose kernel records readers leave out: under load that gap was
    # once the widest, and the replay showed none under read().
    spans, began = [], None
    for t, k in agent:
        if k == AGENT_BEGIN:
            began = t
        elif began is not None:
            spans.append((began, t))
            began = None
    inside = sorted(t for _, _, t in recs if t0 <= t <= t1)
    lo, hi = max((g for g in zip(inside, inside[1:])
                  if not any(b <= g[0] and g[1] <= e for b, e in spans)),
                 key=lambda g: g[1] - g[0])
    step = (hi - lo) // 5
    check(step > 0, 'room inside read() for kernel records')
    krecs += [(lo + step, ids['fake_sys_read'], ENTRY), (lo + 2 * step, ids['fake_vfs_read'], ENTRY),
              (lo + 3 * step, ids['fake_vfs_read'], EXIT), (lo + 4 * step, ids['fake_sys_read'], EXIT)]
    krecs.sort()
    kfile = os.path.join(d, 'kernel.' + tid)
    good = b''.join(KREC.pack(*r) for r in krecs)
    open(kfile, 'wb').write(good)

    # nest
    p = run([sptrace, 'replay', d], env=env)
    check(p.returncode == 0, 'replay: ' + p.stderr)
    lines = [l.split('|', 1)[1] for l in p.stdout.splitlines() if '|' in l]
    text = '\n'.join(lines)
    depth = {}
    for l in lines:
        name = l.strip().split('(')[0]
        if name in ('read', 'fake_sys_read', 'fake_vfs_read') and name not in depth:
            depth[name] = len(l) - len(l.lstrip())
    check(len(depth) == 3 and depth['read'] < depth['fake_sys_read'] < depth['fake_vfs_read'] and
          text.index('read() {') < text.index('fake_sys_read') < text.index('} /* read */'),
          'the kernel records nested under read(): %s\n%s' % (depth, text[:3000]))
    check('fake_before' not in text, 'records before any traced call left out')
    check('fake_agent' not in text, 'records in the agent\'s own time left out')
    p = run([sptrace, 'report', d], env=env)
    check(p.returncode == 0 and 'fake_vfs_read' in p.stdout, 'report names the kernel functions')

    # hostile
    def readers_survive(what):
        for cmd in (['replay', d], ['report', d]):
            p = run([sptrace] + cmd, env=env, timeout=20)
            check(p.returncode >= 0, '%s: %s killed by a signal' % (what, cmd[0]))
            check(p.returncode == 0 or p.stderr.startswith('sptrace: '),
                  '%s: %s failed without a clear error: %r' % (what, cmd[0], p.stderr[:300]))
        return p

    open(kfile, 'wb').write(good + KREC.pack(t0 + 1, 0xffffff, ENTRY) +
                            KREC.pack(t0 + 2, ids['fake_vfs_read'], 7) + b'\x01\x02\x03')
    readers_survive('bad kind, bad site, a cut record')
    open(kfile, 'wb').write(good)
    open(os.path.join(d, 'kernel.syms'), 'wb').write(b'zz\n\xff\xfe garbage\n 12 \n' * 1000)
    p = readers_survive('kernel.syms of garbage')
    with open(os.path.join(d, 'kernel.syms'), 'w') as f:
        for i in range(200000, 0, -1):
            f.write('%016x name%d\n' % (0xffffffff81000000 + i * 16, i))
    readers_survive('kernel.syms of 200000 names, backwards')
    os.unlink(kfile)
    os.mkfifo(kfile)
    readers_survive('kernel.<tid> a FIFO')
    print('ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
