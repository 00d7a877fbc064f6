#!/usr/bin/env python3
"""test_collect.py SPTRACE SPDAEMON SPD_INJECT ATTACH_TARGET TRACE_CONF CASE —
`sptrace collect -o OUT DIR` and `sptrace replay OUT` (issue 13).

The script runs itself in a network namespace of its own; its hosts are
network namespaces on a bridge (nslib.py), a spdaemon in each.  The session
S is made as tracing makes it: `sptrace run -o DIR` on host 0 (its meta gets
"session S", as the agent writes it), and inject requests (spd_inject, as
an agent sends them) that follow channels from host 0 to a server of host 1
and from host 1 to a server of host 2 -- so host 0's daemon knows host 1 as
a peer, and only host 1's daemon knows host 2.

  hosts     uid 61001 collects on host 0: OUT/<host>/<pid> for all three
            hosts (host 2 reached through host 1's peers), each file the
            same bytes as the daemon's; a trace of uid 61002 on host 1, a
            link and a hard link to someone else's file planted in a trace
            directory are not given; `sptrace replay OUT` and `sptrace
            report OUT` show each process under its host's header; a second collect fetches nothing; a
            truncated file and a torn .part are fetched again; with host 2's
            daemon down, a line names it, the exit status is 1 and the other
            hosts are collected.
  policy    uid 61002 collects on host 1 from a trace of its own in the
            session: it gets its own trace, not uid 61001's (on host 1 and on
            host 2, relayed); a DIR with no session is refused with a clear
            message; the daemons log each collect.
  stop      `sptrace stop --session S` on host 0: the agents of the servers
            on hosts 1 and 2 (host 2 through host 1's peers) stop, each host
            a line; another user's stop stops nothing; a host whose daemon
            is down is said, exit 1.
  hostile   a fake daemon on this namespace's socket: a file whose SHA-256
            does not match is named with its host and not kept, the file
            that arrived whole is; a peer's path out of OUT ("../..") is
            refused; exit 1.
"""

import hashlib
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, reachable_sptrace, run  # noqa: E402
from nslib import Hosts, in_own_netns  # noqa: E402
from test_daemon import Daemon, ask, end_target, start_target  # noqa: E402

USER, OTHER = 61001, 61002
SESSION = "flow7"


def as_user(uid):
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"]


def files_under(top):
    out = {}
    for root, dirs, names in os.walk(top):
        for n in names:
            p = os.path.join(root, n)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, top)] = f.read()
    return out


class World:
    """Three hosts, a daemon in each, the session made."""

    def __init__(self, tools, tmp, keep_servers=False):
        self.keep_servers = keep_servers
        self.sptrace, self.spdaemon, self.spd_inject, target, conf = tools
        self.tmp = tmp
        os.chmod(tmp, 0o755)
        # run as another user too: a copy it can reach
        self.sptrace = reachable_sptrace(self.sptrace, tmp)
        self.prog = os.path.join(tmp, "attach_target")
        self.conf = os.path.join(tmp, "trace_conf")
        self.tool = os.path.join(tmp, "spd_inject")
        for src, dst in ((target, self.prog), (conf, self.conf), (self.spd_inject, self.tool)):
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755)
        self.hosts = Hosts(3)
        self.daemons, self.servers = [], []
        kd = os.path.join(tmp, "keys")
        run([self.sptrace, "keys", "init", kd])
        for a in self.hosts.addrs:
            run([self.sptrace, "keys", "issue", kd, a])
        self.states = [os.path.join(tmp, "state%d" % i) for i in range(3)]
        for i in range(3):
            self.start_daemon(i)
        self.make_session()

    def start_daemon(self, i):
        kd = os.path.join(self.tmp, "keys")
        d = Daemon(self.spdaemon, kd, self.states[i], name=self.hosts.addrs[i],
                   wrap=self.hosts.cmd(i, []))
        if i < len(self.daemons):
            self.daemons[i] = d
        else:
            self.daemons.append(d)

    def sdir(self, i, pid=None):
        d = os.path.join(os.path.realpath(self.states[i]), "sessions", SESSION)
        return d if pid is None else os.path.join(d, str(pid))

    def make_session(self):
        a = self.hosts.addrs
        # Host 0: the trace where the flow starts, uid 61001's.
        self.start = os.path.join(self.tmp, "start")
        os.mkdir(self.start)
        os.chown(self.start, USER, USER)
        self.dir = os.path.join(self.start, "trace")
        repo = os.path.join(self.tmp, "repo")
        os.mkdir(repo)
        os.chown(repo, USER, USER)
        r = self.hosts.run(0, as_user(USER) + ["env", "SPTRACE_REPO=" + repo, self.sptrace,
                                                "run", "-o", self.dir, "--", self.conf, "nest"],
                           timeout=240)
        check(os.path.isfile(os.path.join(self.dir, "meta")),
              "sptrace run on host 0 left no trace: %d %s" % (r.returncode, r.stderr))
        with open(os.path.join(self.dir, "meta"), "a") as f:
            f.write("session %s\n" % SESSION)
        # Servers of uid 61001 on hosts 1 and 2, followed there by inject
        # requests: host 0 -> host 1, host 1 -> host 2.
        self.pids = {}
        for i in (1, 2):
            p, port = start_target(self.prog, wrap=self.hosts.cmd(i, as_user(USER)),
                                   args=["--any"])
            self.servers.append(p)
            self.pids[i] = (p.pid, port)
        for src, dst in ((0, 1), (1, 2)):
            pid, port = self.pids[dst]
            r = self.hosts.run(src, as_user(USER) + [self.tool, "%s:40000" % a[src],
                                                      "%s:%d" % (a[dst], port), SESSION],
                               timeout=180)
            check(r.returncode == 0 and r.stdout.startswith("%d injected " % pid),
                  "inject from host %d into host %d's server: %r %r\n%s" %
                  (src, dst, r.stdout, r.stderr, self.daemons[src].text()[-1500:]))
            # A connection: the server's trace starts.
            r = self.hosts.run(src, [sys.executable, "-c",
                                     "import socket; s = socket.create_connection(('%s', %d), "
                                     "timeout=30); s.sendall(b'7\\n'); print(s.recv(100))" %
                                     (a[dst], port)])
            check(r.returncode == 0, "host %d cannot ask host %d's server: %s" %
                  (src, dst, r.stderr))
            meta = os.path.join(self.sdir(dst, pid), "meta")
            deadline = time.monotonic() + 60
            while "\nactivated " not in open(meta).read():
                check(time.monotonic() < deadline, "host %d's server did not start tracing" % dst)
                time.sleep(0.1)
        if not self.keep_servers:
            self.end_servers()
        for i, want in ((0, a[1]), (1, a[2])):
            path = os.path.join(self.sdir(i), "peers")
            got = open(path).read() if os.path.exists(path) else None
            check(got == want + "\n", "host %d's daemon did not record %s as the session's "
                  "peer in %s: %r" % (i, want, path, got))

    def end_servers(self):
        for p in self.servers:
            out = end_target(p)
            check(out.startswith("eintr 0 early 0 wrong 0"), "a traced server saw the agent: " +
                  out)

    def collect(self, host, uid, out, start=None):
        return self.hosts.run(host, as_user(uid) + [self.sptrace, "collect", "-o", out,
                                                    start or self.dir], timeout=240)

    def close(self):
        for p in self.servers:
            if p.poll() is None:
                p.kill()
                p.wait()
        for d in self.daemons:
            d.stop()
        self.hosts.close()


def collected_ok(w, r, out, what):
    check(r.returncode == 0, "%s: sptrace collect failed (%d):\n%s%s" %
          (what, r.returncode, r.stdout, r.stderr))
    a = w.hosts.addrs
    got = files_under(out)
    for i in (1, 2):
        pid = w.pids[i][0]
        want = files_under(w.sdir(i, pid))
        check(want and "meta" in want, "no trace on host %d" % i)
        for rel, data in want.items():
            if rel == "hardlink":       # planted (case_hosts): not the user's file
                continue
            mine = got.get(os.path.join(a[i], str(pid), rel))
            check(mine == data, "%s: %s/%s/%d/%s is %s" % (what, out, a[i], pid, rel,
                  "missing" if mine is None else "not the daemon's bytes"))
    start = files_under(w.dir)
    pid = open(os.path.join(w.dir, "meta")).read().split("\npid ")[1].split()[0]
    for rel, data in start.items():
        check(got.get(os.path.join(a[0], pid, rel)) == data,
              "%s: DIR's %s is not in %s/%s/%s" % (what, rel, out, a[0], pid))
    check(not [p for p in got if p.endswith(".part")], "%s: .part files left: %s" %
          (what, [p for p in got if p.endswith(".part")]))
    return got


def case_hosts(w):
    a = w.hosts.addrs
    # Planted in the session: a trace of another user, and in uid 61001's
    # own trace on host 1 a link and a hard link to a file not its own.
    other = w.sdir(1, 99999)
    os.mkdir(other, 0o700)
    with open(os.path.join(other, "meta"), "w") as f:
        f.write("pid 99999\nprogram /secret/of/61002\n")
    os.chown(os.path.join(other, "meta"), OTHER, OTHER)
    os.chown(other, OTHER, OTHER)
    secret = os.path.join(w.tmp, "root-secret")
    with open(secret, "w") as f:
        f.write("root's secret\n")
    os.chmod(secret, 0o600)
    pid1 = w.pids[1][0]
    os.symlink(secret, os.path.join(w.sdir(1, pid1), "link"))
    os.link(secret, os.path.join(w.sdir(1, pid1), "hardlink"))
    out = os.path.join(w.start, "out")
    r = w.collect(0, USER, out)
    got = collected_ok(w, r, out, "first collect")
    st = os.stat(out)
    check(st.st_uid == USER and (st.st_mode & 0o777) == 0o700,
          "OUT is uid %d mode %o, not the caller's 0700" % (st.st_uid, st.st_mode & 0o777))
    check(sorted(os.listdir(out)) == sorted([".hosts"] + a),
          "OUT holds %s, not one directory per host" % os.listdir(out))
    check(not any("99999" in p or p.endswith("link") for p in got),
          "another user's trace, or a planted link, was collected: %s" %
          [p for p in got if "99999" in p or p.endswith("link")])
    for host in a:
        check("collect: host %s: " % host in r.stderr, "no line for host %s:\n%s" %
              (host, r.stderr))
    check("1 of other users not given" in r.stderr, "the withheld trace is not said:\n" +
          r.stderr)
    check("3 of 3 hosts whole," in r.stdout and "3 processes" in r.stdout,
          "the summary: %r" % r.stdout)
    w.daemons[0].wait_log(["collect session %s for uid %d" % (SESSION, USER),
                           "collect session %s: relayed from %s" % (SESSION, a[1]),
                           "collect session %s: relayed from %s" % (SESSION, a[2])],
                          "host 0's log")
    # Replay shows every process under its host.
    r = run([w.sptrace, "replay", out], env=dict(os.environ,
                                                  SPTRACE_REPO=os.path.join(w.tmp, "repo")))
    check(r.returncode == 0, "sptrace replay OUT: %d %s" % (r.returncode, r.stderr[-2000:]))
    pid0 = open(os.path.join(w.dir, "meta")).read().split("\npid ")[1].split()[0]
    headers = [ln for ln in r.stdout.splitlines() if ln.startswith("== host ")]
    want = ["== host %s: pid %s (" % (a[0], pid0)] + \
           ["== host %s: pid %d (" % (a[i], w.pids[i][0]) for i in (1, 2)]
    check(len(headers) == 3 and all(h.startswith(x) for h, x in zip(headers, want)),
          "replay's headers: %s, want %s" % (headers, want))
    check("/attach_target)" in headers[1] and "/trace_conf)" in headers[0],
          "the headers do not name the programs: %s" % headers)
    check(r.stdout.count("serve") >= 2 and "# DURATION" in r.stdout,
          "the replay does not show the servers' calls:\n" + r.stdout[-3000:])
    # So does report, each process's table under its header.
    r = run([w.sptrace, "report", out], env=dict(os.environ,
                                                  SPTRACE_REPO=os.path.join(w.tmp, "repo")))
    check(r.returncode == 0, "sptrace report OUT: %d %s" % (r.returncode, r.stderr[-2000:]))
    rheaders = [ln for ln in r.stdout.splitlines() if ln.startswith("== host ")]
    check(rheaders == headers and r.stdout.count("Total time") == 3,
          "report's headers: %s, want %s:\n%s" % (rheaders, headers, r.stdout[-2000:]))
    # Again: nothing is fetched.
    r = w.collect(0, USER, out)
    collected_ok(w, r, out, "second collect")
    check(re.search(r"\b0 bytes fetched", r.stdout), "a second collect fetched again: %r %r" %
          (r.stdout, r.stderr))
    # A truncated file and a torn .part (the file itself gone) are redone.
    pid2 = w.pids[2][0]
    meta1 = os.path.join(out, a[1], str(pid1), "meta")
    with open(meta1, "r+b") as f:
        f.truncate(10)
    meta2 = os.path.join(out, a[2], str(pid2), "meta")
    os.unlink(meta2)
    with open(meta2 + ".part", "wb") as f:
        f.write(b"torn")
    r = w.collect(0, USER, out)
    collected_ok(w, r, out, "collect after damage")
    check(not re.search(r"\b0 bytes fetched", r.stdout),
          "nothing was fetched again: %r" % r.stdout)
    # Host 2's daemon down: said, exit 1, the others collected.
    w.daemons[2].stop()
    shutil.rmtree(os.path.join(out, a[1]))
    r = w.collect(0, USER, out)
    check(r.returncode == 1, "with a host down the exit status is %d:\n%s%s" %
          (r.returncode, r.stdout, r.stderr))
    check("collect: host %s did not answer: " % a[2] in r.stderr and
          "cannot reach the spdaemon of %s" % a[2] in r.stderr,
          "no clear line for the host that is down:\n" + r.stderr)
    check(os.path.isfile(meta1) and "2 of 3 hosts whole (the others failed" in r.stdout,
          "the hosts that answered were not collected: %r %r" % (r.stdout, r.stderr))


def case_policy(w):
    a = w.hosts.addrs
    # uid 61002's own trace in the session, on host 1.
    mine = w.sdir(1, 4242)
    os.mkdir(mine)
    with open(os.path.join(mine, "meta"), "w") as f:
        f.write("pid 4242\nprogram /usr/bin/mine\nsession %s\n" % SESSION)
    os.chown(os.path.join(mine, "meta"), OTHER, OTHER)
    os.chown(mine, OTHER, OTHER)
    home = os.path.join(w.tmp, "other")
    os.mkdir(home)
    start = os.path.join(home, "4242")
    shutil.copytree(mine, start)
    for p in (home, start, os.path.join(start, "meta")):
        os.chown(p, OTHER, OTHER)
    out = os.path.join(home, "out")
    r = w.collect(1, OTHER, out, start)
    check(r.returncode == 0, "uid %d's collect: %d %s" % (OTHER, r.returncode, r.stderr))
    got = files_under(out)
    check(os.path.join(a[1], "4242", "meta") in got, "uid %d did not get its own trace: %s" %
          (OTHER, sorted(got)))
    for i in (1, 2):
        check(not any(p.startswith(os.path.join(a[i], str(w.pids[i][0]))) for p in got),
              "uid %d got uid %d's trace on host %d: %s" % (OTHER, USER, i, sorted(got)))
    check("collect: host %s: " % a[2] in r.stderr and "of other users not given" in r.stderr,
          "host 2 (relayed) did not answer as expected:\n" + r.stderr)
    w.daemons[2].wait_log(["collect session %s for uid %d: 0 processes (1 of other users "
                           "withheld)" % (SESSION, OTHER)], "host 2's log")
    # A DIR with no session.
    plain = os.path.join(w.tmp, "plain")
    os.mkdir(plain)
    with open(os.path.join(plain, "meta"), "w") as f:
        f.write("pid 1\n")
    r = run([w.sptrace, "collect", "-o", os.path.join(w.tmp, "o2"), plain])
    check(r.returncode != 0 and "%s was not traced with a spdaemon on this host: nothing to "
          "collect" % plain in r.stderr, "a DIR with no session: %r" % r.stderr)
    r = run([w.sptrace, "collect", "--help"])
    check(r.returncode == 0 and "sptrace collect -o OUT DIR" in r.stdout, "collect --help")


def case_stop(w):
    a = w.hosts.addrs
    metas = [os.path.join(w.sdir(i, w.pids[i][0]), "meta") for i in (1, 2)]
    # Another user stops nothing.
    r = w.hosts.run(0, as_user(OTHER) + [w.sptrace, "stop", "--session", SESSION])
    check(r.returncode == 0 and "host %s: 0 agents told to stop" % a[2] in r.stdout,
          "uid %d's stop: %d %r %r" % (OTHER, r.returncode, r.stdout, r.stderr))
    time.sleep(1)
    for m in metas:
        check("\nstopped " not in open(m).read(), "another user's stop stopped %s" % m)
    # The session's user stops both servers' agents, host 2 through host 1.
    r = w.hosts.run(0, as_user(USER) + [w.sptrace, "stop", "--session", SESSION])
    check(r.returncode == 0, "sptrace stop --session: %d %r" % (r.returncode, r.stderr))
    for i, want in ((0, 0), (1, 1), (2, 1)):
        check("stop: session %s: host %s: %d agents told to stop" % (SESSION, a[i], want)
              in r.stdout, "host %d's line:\n%s" % (i, r.stdout))
    for m in metas:
        deadline = time.monotonic() + 30
        while "\nstopped " not in open(m).read():
            check(time.monotonic() < deadline, "%s: the agent did not stop" % m)
            time.sleep(0.1)
    w.end_servers()
    w.daemons[0].wait_log(["stop session %s for uid %d" % (SESSION, USER),
                           "2 other hosts told"], "host 0's log")
    # A daemon that is down is said.
    w.daemons[2].stop()
    r = w.hosts.run(0, [w.sptrace, "stop", "--session", SESSION])
    check(r.returncode == 1 and "host %s did not answer" % a[2] in r.stderr,
          "stop with host 2 down: %d %r %r" % (r.returncode, r.stdout, r.stderr))


# ---- a hostile daemon (case hostile) ----------------------------------------

def _varint(n):
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _field(num, value):
    """One protobuf field: an int (varint) or bytes/str (length-delimited)."""
    if isinstance(value, bool) or isinstance(value, int):
        return _varint(num << 3) + _varint(int(value))
    if isinstance(value, str):
        value = value.encode()
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def chunk_frame(**kw):
    """A Frame with a CollectChunk (proto/spd.proto's field numbers)."""
    nums = {"path": 1, "offset": 2, "data": 3, "size": 4, "mode": 5, "eof": 6, "sha256": 7,
            "unchanged": 8, "last": 9, "host": 10, "processes": 12}
    body = b"".join(_field(nums[k], v) for k, v in kw.items() if k != "peers")
    body += b"".join(_field(11, p) for p in kw.get("peers", ()))
    f = _field(1, 1) + _field(2, 1) + _field(11, body)
    return struct.pack(">I", len(f)) + f


def fake_daemon(answers):
    """Serve this network namespace's daemon socket: each connection gets
    the next answer (bytes) after its request."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0sptrace-spdaemon")
    srv.listen(8)

    def serve():
        for a in answers:
            c, _ = srv.accept()
            n = struct.unpack(">I", c.recv(4, socket.MSG_WAITALL))[0]
            c.recv(n, socket.MSG_WAITALL)
            c.sendall(a)
            c.close()
        srv.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def case_hostile(sptrace, tmp):
    """A daemon that sends a file whose SHA-256 is wrong, then (as the
    peer it named) a path out of OUT: the good file is kept, the bad one
    named with its host and not kept, nothing is written outside OUT, exit
    1."""
    good = b"pid 1\nprogram /bin/fake\n"
    bad = b"tampered"
    first = (chunk_frame(path="1/meta", data=good, size=len(good), eof=True, host="fakehost",
                         sha256=hashlib.sha256(good).digest()) +
             chunk_frame(path="1/ring.1", data=bad, size=len(bad), eof=True, host="fakehost",
                         sha256=hashlib.sha256(b"original").digest()) +
             chunk_frame(last=True, host="fakehost", processes=1, peers=["peerhost"]))
    second = (chunk_frame(path="../../escaped", data=b"x", size=1, eof=True, host="peerhost",
                          sha256=hashlib.sha256(b"x").digest()) +
              chunk_frame(last=True, host="peerhost"))
    t = fake_daemon([first, second])
    start = os.path.join(tmp, "start")
    os.mkdir(start)
    with open(os.path.join(start, "meta"), "w") as f:
        f.write("pid 77\nsession fake1\n")
    out = os.path.join(tmp, "d", "out")
    os.mkdir(os.path.dirname(out))
    r = run([sptrace, "collect", "-o", out, start])
    t.join(10)
    check(r.returncode == 1, "a hostile daemon: exit status %d:\n%s%s" %
          (r.returncode, r.stdout, r.stderr))
    check(open(os.path.join(out, "fakehost", "1", "meta"), "rb").read() == good,
          "the file that arrived whole is not kept")
    check("host fakehost: 1/ring.1: the SHA-256 does not match" in r.stderr and
          not os.path.exists(os.path.join(out, "fakehost", "1", "ring.1")) and
          not os.path.exists(os.path.join(out, "fakehost", "1", "ring.1.part")),
          "a file whose SHA-256 is wrong: %r %s" % (r.stderr, os.listdir(os.path.join(
              out, "fakehost", "1"))))
    check("host peerhost: its answer broke off" in r.stderr and "'../../escaped'" in r.stderr,
          "a path out of OUT is not refused: %r" % r.stderr)
    check(not os.path.exists(os.path.join(tmp, "escaped")) and
          not os.path.exists(os.path.join(tmp, "d", "escaped")), "a file escaped OUT")
    check(os.path.isfile(os.path.join(out, "fakehost", "77", "meta")),
          "DIR was not copied under the daemon's host name")


def main():
    tools, case = sys.argv[1:6], sys.argv[6]
    in_own_netns()
    if case == "hostile":
        with tempfile.TemporaryDirectory(prefix="sptrace-collect.") as tmp:
            case_hostile(tools[0], tmp)
        print("ok")
        return
    with tempfile.TemporaryDirectory(prefix="sptrace-collect.") as tmp:
        w = World(tools, tmp, keep_servers=case == "stop")
        try:
            {"hosts": case_hosts, "policy": case_policy, "stop": case_stop}[case](w)
        finally:
            w.close()
    print("ok")


if __name__ == "__main__":
    main()
