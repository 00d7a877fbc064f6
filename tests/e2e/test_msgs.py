#!/usr/bin/env python3
"""test_msgs.py — message events: what a traced program sends and receives
on sockets and pipes, as `sptrace replay` and `sptrace report` show it.

Cases:
  prog PROG   tests/progs/msgs: TCP, UDP, a pipe and a UNIX socketpair with
              known byte counts, under `sptrace run`.  Its output (errno of
              failing writes included) is the same as natively; the replay
              shows each send and receive with its channel's addresses and
              byte range (or datagram number), under the function that made
              it; the report counts them per channel.  The end of the
              pipe and of the socketpair (after shutdown) are there, as
              `eof` and `shutdown` at the byte where they happened; the
              socketpair's two ends name each other (unix A -> B and
              unix B <- A), and the agent's netlink socket that learnt it
              never took a number the program sees.
              Then `msgs late` under `--on call late_traced`: a TCP
              connection that carried 1000 + 5 bytes before tracing began
              shows absolute offsets (the receiver's 300.. are the
              sender's bytes), not offsets from 0.
  forkfirst PROG
              the channels file: empty in a process that met no channel
              (/bin/true); `msgs forkfirst` (a child forked before its
              parent met any channel writes into a pipe its parent reads
              after, the parent writes into a pipe a child forked after
              reads) records all four messages, on two channels, in the
              family's one file: a record per process that met each, in
              the order they met it.
  redis       redis-server under `sptrace run`, asked SET and GET by a native
              redis-cli: the server's reads and writes of each request and
              answer on its connection, with the right port and byte range.
"""

import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, check_sanitizers, fail, free_port, need_program  # noqa: E402


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120, **kw)


def env_for(tmp):
    return dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))


def replay(sptrace, tdir, tmp):
    r = run([sptrace, "replay", tdir], env=env_for(tmp))
    check(r.returncode == 0, "replay %s failed: %s" % (tdir, r.stderr))
    check_sanitizers([sptrace, "replay", tdir], r.stderr)
    return r.stdout


MSG = re.compile(r"\[\s*(\d+)\] \|( *)/\* (\w+)\((.*), (?:bytes (\d+)\.\.(\d+)|datagram (\d+), "
                 r"(\d+) bytes|at byte (\d+))\) \*/$")


def messages(text):
    """[(tid, depth, call, channel, start, end or None, datagram number or None,
    enclosing function names innermost first)]"""
    out = []
    stacks = {}
    for line in text.splitlines():
        if "|" not in line or line.startswith("#"):
            continue
        tid = re.search(r"\[\s*(\d+)\]", line)
        if not tid:
            continue
        stack = stacks.setdefault(tid.group(1), [])
        body = line.split("| ", 1)[1] if "| " in line else ""
        depth = (len(body) - len(body.lstrip(" "))) // 2
        del stack[depth:]
        m = MSG.search(line)
        if m:
            if m.group(9) is not None:     # shutdown, eof: no bytes
                out.append((m.group(1), depth, m.group(3), m.group(4), int(m.group(9)),
                            int(m.group(9)), None, list(reversed(stack))))
            elif m.group(5) is not None:
                out.append((m.group(1), depth, m.group(3), m.group(4), int(m.group(5)),
                            int(m.group(6)), None, list(reversed(stack))))
            else:
                out.append((m.group(1), depth, m.group(3), m.group(4), None, int(m.group(8)),
                            int(m.group(7)), list(reversed(stack))))
            continue
        opened = re.match(r"\s*([\w.@]+)\(\) \{", body)
        if opened:
            stack.append(opened.group(1))
    return out


def covers(msgs, call, channel, total, where):
    """The messages of `call` on `channel` are contiguous ranges from 0 to
    total, each made inside function `where`."""
    got = sorted((m[4], m[5]) for m in msgs if m[2] == call and m[3] == channel)
    check(got, "no %s(%s, ...) in the replay; messages seen:\n%s"
          % (call, channel, "\n".join("%s(%s, %s..%s)" % (m[2], m[3], m[4], m[5]) for m in msgs)))
    pos = 0
    for a, b in got:
        check(a == pos and b > a, "%s on %s: byte ranges %s are not contiguous from 0"
              % (call, channel, got))
        pos = b
    check(pos == total, "%s on %s: %d bytes in the trace, %d sent" % (call, channel, pos, total))
    for m in msgs:
        if m[2] == call and m[3] == channel:
            check(where in m[7], "%s(%s) is not under %s() but under %s"
                  % (call, channel, where, " < ".join(m[7])))


def one(msgs, call, channel, where, dgram=None, size=None):
    found = [m for m in msgs if m[2] == call and m[3] == channel and
             (dgram is None or (m[6] == dgram and m[5] == size))]
    check(len(found) == 1, "expected one %s(%s%s) in the replay, found %d; messages:\n%s"
          % (call, channel, ", datagram %s, %s bytes" % (dgram, size) if dgram is not None else "",
             len(found), "\n".join("%s(%s) %s %s %s" % (m[2], m[3], m[4], m[5], m[6])
                                   for m in msgs)))
    check(where in found[0][7], "%s(%s) is not under %s() but under %s"
          % (call, channel, where, " < ".join(found[0][7])))
    return found[0]


def case_prog(sptrace, prog, tmp):
    native = run([prog])
    check(native.returncode == 0, "native %s failed: %s" % (prog, native.stderr))
    tdir = os.path.join(tmp, "trace")
    traced = run([sptrace, "run", "-o", tdir, "--", prog], env=env_for(tmp))
    check(traced.returncode == 0, "traced %s failed (%d): %s" % (prog, traced.returncode,
                                                                traced.stderr))
    check(traced.stdout == native.stdout, "output differs:\nnative:\n%straced:\n%s"
          % (native.stdout, traced.stdout))
    tcp = re.search(r"^tcp (\d+) (\d+)$", traced.stderr, re.M)
    udp = re.search(r"^udp (\d+) (\d+)$", traced.stderr, re.M)
    check(tcp and udp, "no ports in the program's stderr: %s" % traced.stderr)
    srv, cli = tcp.group(1), tcp.group(2)
    ua, ub = udp.group(1), udp.group(2)
    text = replay(sptrace, tdir, tmp)
    msgs = messages(text)
    lo = "127.0.0.1:"
    # TCP: the client's send and the server's receives of the 118 bytes,
    # the server's write and the client's reads of the 42.
    one(msgs, "send", "tcp %s%s -> %s%s" % (lo, cli, lo, srv), "client_tcp")
    covers(msgs, "send", "tcp %s%s -> %s%s" % (lo, cli, lo, srv), 118, "client_tcp")
    covers(msgs, "recv", "tcp %s%s <- %s%s" % (lo, srv, lo, cli), 118, "recv_all")
    covers(msgs, "write", "tcp %s%s -> %s%s" % (lo, srv, lo, cli), 42, "server_tcp")
    covers(msgs, "read", "tcp %s%s <- %s%s" % (lo, cli, lo, srv), 42, "client_tcp")
    # the pipe: one inode, both ends
    pw = [m for m in msgs if m[2] == "write" and m[3].startswith("pipe ")]
    pr = [m for m in msgs if m[2] == "read" and m[3].startswith("pipe ")]
    check(len(pr) == 1 and any(m[3] == pr[0][3] for m in pw),
          "the pipe's write and read are not one channel: %s / %s" % (pw, pr))
    covers(msgs, "write", pr[0][3], 5, "pipe_exchange")
    covers(msgs, "read", pr[0][3], 5, "pipe_exchange")
    # UDP: datagram 0 each way, each channel named by both ports
    one(msgs, "sendto", "udp %s%s -> %s%s" % (lo, ua, lo, ub), "udp_exchange", 0, 12)
    one(msgs, "recvfrom", "udp %s%s <- %s%s" % (lo, ub, lo, ua), "udp_exchange", 0, 12)
    one(msgs, "sendto", "udp %s%s -> %s%s" % (lo, ub, lo, ua), "udp_exchange", 0, 7)
    # the answer comes to a recvfrom without an address: the agent knows the peer
    one(msgs, "recvfrom", "udp %s%s <- %s%s" % (lo, ua, lo, ub), "udp_exchange", 0, 7)
    # the socketpair
    us = [m for m in msgs if m[2] == "sendmsg" and m[3].startswith("unix ")]
    ur = [m for m in msgs if m[2] == "recvmsg" and m[3].startswith("unix ")]
    check(len(us) == 1 and len(ur) == 1 and (us[0][4], us[0][5]) == (0, 9) ==
          (ur[0][4], ur[0][5]), "socketpair messages: %s / %s" % (us, ur))
    # ... its two ends name each other: unix A -> B, unix B <- A
    ends = re.match(r"unix (\d+) -> (\d+)$", us[0][3])
    check(ends and ur[0][3] == "unix %s <- %s" % (ends.group(2), ends.group(1)),
          "the socketpair's ends do not name each other: %s / %s" % (us[0][3], ur[0][3]))
    # the ends: the pipe's after its 5 bytes, the socketpair's shutdown and
    # its end after the 9
    one(msgs, "eof", pr[0][3], "pipe_exchange")
    check([m[4] for m in msgs if m[2] == "eof" and m[3] == pr[0][3]] == [5],
          "the pipe's end is not at byte 5: %s" % [m for m in msgs if m[2] == "eof"])
    check([m[4] for m in msgs if m[2] == "shutdown" and m[3] == us[0][3]] == [9] and
          [m[4] for m in msgs if m[2] == "eof" and m[3] == ur[0][3]] == [9],
          "socketpair: no shutdown and end at byte 9: %s"
          % [m for m in msgs if m[2] in ("eof", "shutdown")])
    # nothing recorded for the failing writes (errno: compared in the output)
    check(not [m for m in msgs if "errnos" in m[7]],
          "a failing call made a message: %s" % [m for m in msgs if "errnos" in m[7]])
    # the report: per channel and direction
    r = run([sptrace, "report", tdir], env=env_for(tmp))
    check(r.returncode == 0, "report failed: %s" % r.stderr)
    check(re.search(r"^\s+1\s+118  send tcp %s%s -> %s%s$" % (lo, cli, lo, srv), r.stdout, re.M),
          "report has no line for the 118 bytes sent:\n%s" % r.stdout)
    check(re.search(r"^\s+1\s+12  recv udp %s%s <- %s%s$" % (lo, ub, lo, ua), r.stdout, re.M),
          "report has no line for the datagram received:\n%s" % r.stdout)
    print("ok: %d messages, channels and ranges as sent" % len(msgs))
    case_late(sptrace, prog, tmp)


def case_late(sptrace, prog, tmp):
    native = run([prog, "late"])
    check(native.returncode == 0, "native %s late failed: %s" % (prog, native.stderr))
    tdir = os.path.join(tmp, "late")
    traced = run([sptrace, "run", "-o", tdir, "--on", "call late_traced", "--", prog, "late"],
                 env=env_for(tmp))
    check(traced.returncode == 0, "traced %s late failed (%d): %s"
          % (prog, traced.returncode, traced.stderr))
    check(traced.stdout == native.stdout, "late: output differs:\nnative:\n%straced:\n%s"
          % (native.stdout, traced.stdout))
    ports = re.search(r"^late (\d+) (\d+)$", traced.stderr, re.M)
    check(ports, "no ports in the program's stderr: %s" % traced.stderr)
    srv, cli = "127.0.0.1:" + ports.group(1), "127.0.0.1:" + ports.group(2)
    msgs = messages(replay(sptrace, tdir, tmp))
    # byte ranges per call and channel, contiguous ones merged (a recv may
    # take the 700 bytes in more than one piece)
    got = []
    for m in sorted((m[2], m[3], m[4], m[5]) for m in msgs):
        if got and got[-1][:2] == m[:2] and got[-1][3] == m[2] and m[2] < m[3]:
            got[-1] = (m[0], m[1], got[-1][2], m[3])
        else:
            got.append(m)
    # what the program sent, as absolute offsets of each direction: the
    # first 300 and 5 bytes went before tracing began
    want = sorted([
        ("recv", "tcp %s <- %s" % (srv, cli), 300, 1050),
        ("send", "tcp %s -> %s" % (srv, cli), 5, 12),
        ("send", "tcp %s -> %s" % (cli, srv), 1000, 1050),
        ("recv", "tcp %s <- %s" % (cli, srv), 5, 12),
        ("shutdown", "tcp %s -> %s" % (cli, srv), 1050, 1050),
        ("eof", "tcp %s <- %s" % (srv, cli), 1050, 1050),
        ("eof", "tcp %s <- %s" % (cli, srv), 12, 12),
    ])
    check(got == want, "late: the messages are not the absolute byte ranges sent:\n"
          "got:  %s\nwant: %s" % ("\n      ".join(map(str, got)),
                                   "\n      ".join(map(str, want))))
    print("ok: late TCP messages at the absolute offsets the other end sent")



def case_redis(sptrace, tmp):
    server = need_program("redis-server", "redis-server")
    cli = need_program("redis-cli", "redis-tools")
    port = free_port()
    tdir = os.path.join(tmp, "trace")
    log = open(os.path.join(tmp, "run.log"), "w")
    # --on accept: tracing starts on the thread that accepts the first
    # connection (the PING below); redis-server traced from main takes a
    # long time to start on a loaded machine.
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--on", "accept", "--", server, "--port", str(port),
                          "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", tmp], stdout=log, stderr=subprocess.STDOUT,
                         env=env_for(tmp))
    try:
        deadline = time.time() + 60
        while True:
            r = run([cli, "-p", str(port), "PING"])
            if r.stdout.strip() == "PONG":
                break
            check(p.poll() is None, "redis-server under sptrace run ended: %s"
                  % open(log.name).read())
            check(time.time() < deadline, "redis-server under sptrace run never answered")
            time.sleep(0.3)
        r = run([cli, "-p", str(port), "SET", "key", "value"])
        check(r.stdout.strip() == "OK", "SET answered %r" % r.stdout)
        r = run([cli, "-p", str(port), "GET", "key"])
        check(r.stdout.strip() == "value", "GET answered %r" % r.stdout)
        run([cli, "-p", str(port), "SHUTDOWN", "NOSAVE"])
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    check(p.returncode == 0, "sptrace run redis-server: exit %d: %s"
          % (p.returncode, open(log.name).read()))
    msgs = messages(replay(sptrace, tdir, tmp))
    recv = re.compile(r"tcp 127\.0\.0\.1:%d <- 127\.0\.0\.1:(\d+)$" % port)
    # SET key value: *3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n, answered +OK\r\n
    set_req = len("*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n")
    get_req = len("*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n")
    found = {}
    for m in msgs:
        g = recv.match(m[3])
        if m[6] is None and g and m[4] == 0:
            found.setdefault(m[5], []).append(g.group(1))
    check(set_req in found and get_req in found,
          "the server's reads of SET (%d bytes) and GET (%d bytes) from offset 0 are not in "
          "the replay; reads seen: %s" % (set_req, get_req, found))
    for length, answer in ((set_req, 5), (get_req, len("$5\r\nvalue\r\n"))):
        peer = found[length][0]
        ch = "tcp 127.0.0.1:%d -> 127.0.0.1:%s" % (port, peer)
        check([m for m in msgs if m[3] == ch and m[4] == 0 and m[5] == answer],
              "no answer of %d bytes on %s: %s" % (answer, ch, [m[:6] for m in msgs
                                                                  if m[3] == ch]))
    print("ok: redis-server's requests and answers on their connections")


def case_forkfirst(sptrace, prog, tmp):
    tdir = os.path.join(tmp, "none")
    r = run([sptrace, "run", "-o", tdir, "--", "/bin/true"], env=env_for(tmp))
    check(r.returncode == 0, "traced /bin/true failed (%d): %s" % (r.returncode, r.stderr))
    size = os.path.getsize(os.path.join(tdir, "channels"))
    check(size == 0, "a process that met no channel has a channels file of %d bytes, not 0"
          % size)
    tdir = os.path.join(tmp, "forkfirst")
    r = run([sptrace, "run", "-o", tdir, "--", prog, "forkfirst"], env=env_for(tmp))
    check(r.returncode == 0, "traced %s forkfirst failed (%d): %s"
          % (prog, r.returncode, r.stderr))
    pids = re.search(r"^forkfirst (\d+) (\d+) (\d+)$", r.stderr, re.M)
    check(pids, "no pids in the program's stderr: %s" % r.stderr)
    parent, c1, c2 = (int(x) for x in pids.groups())
    msgs = messages(replay(sptrace, tdir, tmp))
    w1 = one(msgs, "write", next((m[3] for m in msgs if m[2] == "write" and m[4:6] == (0, 5)),
                                 "pipe ?"), "child_writes")
    covers(msgs, "read", w1[3], 5, "fork_first")
    covers(msgs, "write", next((m[3] for m in msgs if m[2] == "write" and m[4:6] == (0, 3)),
                               "pipe ?"), 3, "fork_first")
    r3 = one(msgs, "read", next((m[3] for m in msgs if m[2] == "read" and m[4:6] == (0, 3)),
                                "pipe ?"), "child_reads")
    check(w1[3].startswith("pipe ") and r3[3].startswith("pipe ") and w1[3] != r3[3],
          "not two pipes: %s / %s" % (w1[3], r3[3]))
    with open(os.path.join(tdir, "channels"), "rb") as f:
        data = f.read()
    count, rec = struct.unpack_from("<II", data, 0)
    check(rec == 160 and len(data) >= count * rec, "channels file: %d records of %d bytes in "
          "%d bytes" % (count, rec, len(data)))
    seen = [struct.unpack_from("<IIQ", data, i * rec) for i in range(1, count)]
    by_inode = {}
    for proto, pid, inode in seen:
        if proto:
            by_inode.setdefault(inode, []).append(pid)
    inodes = [int(w1[3].split()[1]), int(r3[3].split()[1])]
    # each process records the channels it meets (a forked child's are its
    # own), in the order met: the parent's record after its child's did not
    # take the child's id
    check(by_inode.get(inodes[0]) == [c1, parent] and by_inode.get(inodes[1]) == [parent, c2],
          "channels file: want the first pipe met by %d then %d, the second by %d then %d; "
          "records (proto, pid, inode): %s" % (c1, parent, parent, c2, seen))
    print("ok: no channels in a process without one; a child's first channel before its "
          "parent's and one after are in the family's file")


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="sptrace-msgs-") as tmp:
        if case == "prog":
            case_prog(sptrace, os.path.abspath(sys.argv[3]), tmp)
        elif case == "forkfirst":
            case_forkfirst(sptrace, os.path.abspath(sys.argv[3]), tmp)
        elif case == "redis":
            case_redis(sptrace, tmp)
        else:
            fail("unknown case " + case)


if __name__ == "__main__":
    main()
