#!/usr/bin/env python3
"""test_daemon.py SPTRACE SPDAEMON CASE — spdaemon, its local socket and its
TLS port, and `sptrace status` (issue 13).

The script runs itself in a network namespace of its own (unshare -n), so
the daemon's abstract socket and port 7470 are the test's alone, as on a
host of its own.

  serve     the daemon answers `sptrace status` on its local socket (naming
            the caller's pid and uid from SO_PEERCRED) and over mutual TLS
            1.3 (naming the caller's certificate); a client whose certificate
            another CA signed, or that dials a name the daemon's certificate
            does not hold, is refused; hostile frames -- a length of 4 GiB, a
            payload that does not parse, a body it does not know, a frame cut
            short, plain bytes on the TLS port -- each end that connection
            with a message in the log, and the daemon serves on; an idle
            connection does not hold others up; SIGTERM stops it, logged,
            its pid file gone.
  hosts     three hosts (network namespaces on a bridge), a daemon in each but
            the last: from the first, `sptrace status` reaches the second and
            the third over TLS, each naming itself and seeing the first by its
            certificate; the host without a daemon is a clear line and exit 1.
  inject    SPD_INJECT ATTACH_TARGET: the inject request (through
            tests/spdaemon/spd_inject, as an agent will send it) for a TCP
            channel whose receiving end is a listening server of uid 61001
            (attach_target): a requester of that uid gets the agent put into
            it, dormant until a receive, its trace in the daemon's state
            directory (sessions/SESSION/PID, the server's user's, 0700); a
            connection then traces the serving thread; asked again, the
            daemon says the process has the agent; a requester of uid 61002
            is refused a root server (policy), a bad session name and a port
            nothing listens on are answered, every request is logged.
  inject-hosts SPD_INJECT ATTACH_TARGET: two hosts (network namespaces),
            a daemon in each; a request made on the first for a channel to a
            server of uid 61001 on the second is forwarded over TLS, and the
            second's daemon puts the agent into that server (the reply names
            it), which then traces the connection the first host makes; a
            root server there is refused to the other host (remote-inject
            users); the second daemon refuses to relay to a third address.
  packaging the systemd unit passes `systemd-analyze verify` (with the
            built spdaemon in ExecStart), and the example configuration
            starts a daemon (with the test's keys and state directory given
            on the command line, which win).
  refusals  bad options and configuration, a state directory others may write
            or that is a link, a private key others may read, and a second
            daemon in the same network namespace are refused with messages
            naming what to do.
"""

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, check_sanitizers, fail, run  # noqa: E402
from nslib import Hosts, in_own_netns  # noqa: E402

SOCK = "\0sptrace-spdaemon"


def make_keys(sptrace, kd):
    for args in (["init", kd], ["issue", kd, "127.0.0.1"], ["issue", kd, "client1"]):
        r = run([sptrace, "keys"] + args)
        check(r.returncode == 0, "sptrace keys %s: %s" % (" ".join(args), r.stderr))


class Daemon:
    def __init__(self, spdaemon, kd, state, extra=(), name="127.0.0.1", wrap=()):
        self.state = state
        self.log = os.path.join(state, "spdaemon.log")
        # Its stderr (its log again, in the foreground, and a sanitizer's
        # report) into a file beside the state directory: a pipe nobody
        # reads while it runs fills at 64 KiB, and the daemon's next log
        # line then blocks it for good, SIGTERM unanswered.
        self.stderr_path = state.rstrip("/") + ".stderr"
        with open(self.stderr_path, "w") as err:
            self.p = subprocess.Popen(list(wrap) + [spdaemon, "--keys", kd, "--name", name,
                                                    "--state-dir", state, "--foreground"] +
                                      list(extra), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while "started" not in self.text():
            if self.p.poll() is not None:
                fail("spdaemon exited (%d): %s" % (self.p.returncode, self.stderr()))
            if time.monotonic() > deadline:
                fail("spdaemon did not start within 30 s")
            time.sleep(0.05)

    def text(self):
        try:
            with open(self.log) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stderr(self):
        with open(self.stderr_path) as f:
            return f.read()

    def wait_log(self, words, what):
        deadline = time.monotonic() + 10
        while not all(w in self.text() for w in words):
            if time.monotonic() > deadline:
                fail("%s: the daemon's log does not say %r:\n%s" % (what, words, self.text()))
            time.sleep(0.05)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                fail("spdaemon did not stop within 10 s of SIGTERM")
            check_sanitizers(["spdaemon"], self.stderr())


def status_ok(sptrace, what, *args):
    r = run([sptrace, "status"] + list(args), timeout=60)
    check(r.returncode == 0 and "spdaemon" in r.stdout and "host 127.0.0.1" in r.stdout,
          "%s: sptrace status %s failed (%d): %s %s" % (what, " ".join(args), r.returncode,
                                                      r.stdout, r.stderr))
    return r.stdout


def hostile(payload, what, tls_port=None):
    """Send `payload` to the daemon (its local socket, or plain bytes to its
    TLS port) and read what comes back until it closes the connection."""
    if tls_port:
        s = socket.create_connection(("127.0.0.1", tls_port), timeout=20)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(SOCK)
    got = b""
    try:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(65536)
            if not b:
                return got
            got += b
    except socket.timeout:
        fail("%s: the daemon kept the connection open for 20 s" % what)
    except OSError:
        return got     # the daemon hung up first (a reset, or not connected any more)
    finally:
        s.close()


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def case_serve(sptrace, spdaemon, tmp):
    kd = os.path.join(tmp, "keys")
    make_keys(sptrace, kd)
    d = Daemon(spdaemon, kd, os.path.join(tmp, "state"))
    try:
        out = status_ok(sptrace, "local")
        check("local pid" in out and "uid 0" in out, "local status does not name the caller: " + out)
        out = status_ok(sptrace, "TLS", "--keys", kd, "--name", "client1", "127.0.0.1")
        check("host client1" in out, "TLS status does not name the client's certificate: " + out)
        # A stranger's certificate, and a daemon dialled by a name its
        # certificate does not hold.
        other = os.path.join(tmp, "other")
        for args in (["init", other], ["issue", other, "intruder"]):
            run([sptrace, "keys"] + args)
        r = run([sptrace, "status", "--keys", other, "--name", "intruder", "127.0.0.1"])
        check(r.returncode != 0 and "sptrace: status:" in r.stderr,
              "a client of another CA was answered: %r %r" % (r.stdout, r.stderr))
        d.wait_log(["TLS handshake refused"], "another CA")
        r = run([sptrace, "status", "--keys", kd, "--name", "client1", "localhost"])
        check(r.returncode != 0 and "hostname mismatch" in r.stderr,
              "a daemon whose certificate does not name 'localhost' was accepted: %r" % r.stderr)
        # Hostile frames: an Error frame, the connection closed, a line logged.
        cases = [
            (struct.pack(">I", 0xffffffff), "announces a frame of 4294967295 bytes"),
            (frame(b"\xff\xfe\xfd\x01garbage"), "not a protocol message"),
            (frame(bytes([0x08, 0x01, 0x10, 0x07, 0xfa, 0x06, 0x00])), "no request or reply"),
            (struct.pack(">I", 100) + b"\x08\x01", "ended inside a frame"),
        ]
        for payload, words in cases:
            got = hostile(payload, words)
            check(words.encode() in got, "%s: the daemon's answer does not say so: %r" %
                  (words, got))
            d.wait_log([words, "connection closed"], words)
            status_ok(sptrace, "after a frame that " + words)
        hostile(b"GET / HTTP/1.0\r\n\r\n", "plain bytes on the TLS port", tls_port=7470)
        d.wait_log(["TLS handshake refused"], "plain bytes on the TLS port")
        # An idle client holds a thread, not the daemon.
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.connect(SOCK)
        idle.sendall(b"\x00\x00")
        status_ok(sptrace, "with an idle connection open")
        idle.close()
        check(d.p.poll() is None, "the daemon died")
        pid = open(os.path.join(d.state, "spdaemon.pid")).read().strip()
        check(pid == str(d.p.pid), "spdaemon.pid holds %r, not %d" % (pid, d.p.pid))
        d.stop()
        check(d.p.returncode == 0, "SIGTERM: exit status %d" % d.p.returncode)
        check("stopping" in d.text() and "stopped after" in d.text(), "the stop is not logged")
        check(not os.path.exists(os.path.join(d.state, "spdaemon.pid")), "spdaemon.pid left")
        r = run([sptrace, "status"])
        check(r.returncode != 0 and "no spdaemon serves this host" in r.stderr,
              "status without a daemon: %r" % r.stderr)
    finally:
        d.stop()


def case_hosts(sptrace, spdaemon, tmp):
    kd = os.path.join(tmp, "keys")
    hosts = Hosts(4)
    daemons = []
    try:
        run([sptrace, "keys", "init", kd])
        for a in hosts.addrs:
            r = run([sptrace, "keys", "issue", kd, a])
            check(r.returncode == 0, "keys issue %s: %s" % (a, r.stderr))
        for i in range(3):
            daemons.append(Daemon(spdaemon, kd, os.path.join(tmp, "state%d" % i),
                                  name=hosts.addrs[i], wrap=hosts.cmd(i, [])))
        r = hosts.run(0, [sptrace, "status", "--keys", kd, "--name", hosts.addrs[0],
                          "--timeout", "5"] + hosts.addrs[1:])
        lines = r.stdout.splitlines()
        for a in hosts.addrs[1:3]:
            check(any(ln.startswith(a + ": ") and "host %s," % a in ln and
                      "host %s (" % hosts.addrs[0] in ln for ln in lines),
                  "the daemon of %s did not answer as itself, seeing %s:\n%s%s" %
                  (a, hosts.addrs[0], r.stdout, r.stderr))
        check(r.returncode == 1 and "cannot reach the spdaemon of %s" % hosts.addrs[3] in r.stderr,
              "the host without a daemon: %d %r" % (r.returncode, r.stderr))
        for i in (1, 2):
            daemons[i].wait_log(["host %s (%s:" % (hosts.addrs[0], hosts.addrs[0]), ": status"],
                                "host %d" % i)
        r = hosts.run(1, [sptrace, "status"])
        check(r.returncode == 0 and "host %s," % hosts.addrs[1] in r.stdout,
              "each host's local socket reaches its own daemon: %r %r" % (r.stdout, r.stderr))
    finally:
        for d in daemons:
            d.stop()
        hosts.close()


def _demote(uid):
    def f():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return f


def start_target(prog, uid=None, wrap=(), args=()):
    p = subprocess.Popen(list(wrap) + [prog] + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, preexec_fn=_demote(uid) if uid is not None else None)
    port = int(p.stdout.readline())
    check(p.stdout.readline() == "ready\n", "attach_target did not start")
    return p, port


def end_target(p):
    try:
        p.stdin.close()
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        fail("attach_target did not end when its input closed")
    return p.stdout.read()


def ask(port, n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"%d\n" % n)
    answer = s.recv(100)
    s.close()
    return answer


def case_inject(sptrace, spdaemon, tmp, spd_inject, target):
    kd = os.path.join(tmp, "keys")
    make_keys(sptrace, kd)
    # The drivers run as other users: copies they can reach.
    os.chmod(tmp, 0o755)
    tool = os.path.join(tmp, "spd_inject")
    prog = os.path.join(tmp, "attach_target")
    for src, dst in ((spd_inject, tool), (target, prog)):
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
        os.chmod(dst, 0o755)
    state = os.path.join(tmp, "state")
    d = Daemon(spdaemon, kd, state)
    user, other = 61001, 61002
    servers = []
    try:
        p, port = start_target(prog, uid=user)
        servers.append(p)
        chan = ["127.0.0.1:40000", "127.0.0.1:%d" % port]
        r = subprocess.run([tool] + chan + ["sess1"], capture_output=True, text=True, timeout=180,
                           preexec_fn=_demote(user))
        want = "%d injected %s/sessions/sess1/%d" % (p.pid, os.path.realpath(state), p.pid)
        check(r.returncode == 0 and r.stdout.strip() == want,
              "inject by the server's own user: %d %r %r (want %r)\n%s" %
              (r.returncode, r.stdout, r.stderr, want, d.text()[-2000:]))
        tdir = want.split(" ", 2)[2]
        st = os.stat(tdir)
        check(st.st_uid == user and (st.st_mode & 0o777) == 0o700,
              "the trace directory is uid %d mode %o, not the server's user's 0700" %
              (st.st_uid, st.st_mode & 0o777))
        maps = open("/proc/%d/maps" % p.pid).read()
        check("sptrace-agent" in maps, "the server has no agent after the inject")
        check("activated" not in open(os.path.join(tdir, "meta")).read(),
              "the agent traces before any receive")
        check(ask(port, 5).strip(), "the traced server does not answer")
        deadline = time.monotonic() + 60
        while "\nactivated " not in open(os.path.join(tdir, "meta")).read():
            check(time.monotonic() < deadline, "a receive did not start tracing:\n" +
                  open(os.path.join(tdir, "agent.log")).read()[-2000:])
            time.sleep(0.1)
        check([f for f in os.listdir(tdir) if f.startswith("ring.")], "no ring in " + tdir)
        # Asked again: the process has the agent already.
        r = run([tool] + chan + ["sess1"], timeout=180)
        check("%d refused pid %d has the agent already" % (p.pid, p.pid) in r.stdout,
              "a second inject: %r %r" % (r.stdout, r.stderr))
        # Policy: uid 61002 may not have root's server traced.
        q, qport = start_target(prog)
        servers.append(q)
        r = subprocess.run([tool, "127.0.0.1:40001", "127.0.0.1:%d" % qport, "sess2"],
                           capture_output=True, text=True, timeout=180, preexec_fn=_demote(other))
        check(r.returncode == 0 and r.stdout.startswith("%d refused " % q.pid) and
              "runs as uid 0 and the requester is uid %d" % other in r.stdout,
              "uid %d asking for root's server: %r %r" % (other, r.stdout, r.stderr))
        check("sptrace-agent" not in open("/proc/%d/maps" % q.pid).read(),
              "the agent went into root's server for another user")
        # Bad requests are answered.
        r = run([tool] + chan + ["../escape"])
        check(r.returncode == 1 and "session name" in r.stdout, "a bad session name: %r" % r.stdout)
        r = run([tool, "127.0.0.1:40002", "127.0.0.1:9", "sess3"])
        check(r.returncode == 0 and r.stdout.strip() == "none", "no holder: %r" % r.stdout)
        d.wait_log(["inject session sess1 pid %d: agent in after" % p.pid,
                    "inject session sess2 pid %d: refused" % q.pid,
                    "inject refused: session name", "no process of this host holds"],
                   "the inject log")
        out = end_target(p)
        check(out.startswith("eintr 0 early 0 wrong 0"), "the traced server saw the agent: " + out)
        end_target(q)
        r = run([sptrace, "replay", tdir])
        check(r.returncode == 0 and "serve" in r.stdout,
              "the replay of the injected server shows no serving: %r" % r.stderr[-500:])
    finally:
        for sp in servers:
            if sp.poll() is None:
                sp.kill()
                sp.wait()
        d.stop()


def case_inject_hosts(sptrace, spdaemon, tmp, spd_inject, target):
    kd = os.path.join(tmp, "keys")
    os.chmod(tmp, 0o755)
    prog = os.path.join(tmp, "attach_target")
    with open(target, "rb") as f, open(prog, "wb") as g:
        g.write(f.read())
    os.chmod(prog, 0o755)
    hosts = Hosts(2)
    daemons, servers = [], []
    try:
        run([sptrace, "keys", "init", kd])
        for a in hosts.addrs:
            run([sptrace, "keys", "issue", kd, a])
        for i in range(2):
            daemons.append(Daemon(spdaemon, kd, os.path.join(tmp, "state%d" % i),
                                  name=hosts.addrs[i], wrap=hosts.cmd(i, [])))
        as_user = ["setpriv", "--reuid", "61001", "--regid", "61001", "--clear-groups"]
        p, port = start_target(prog, wrap=hosts.cmd(1, as_user), args=["--any"])
        servers.append(p)
        # ip netns exec and setpriv exec the server: it has their pid
        pid = p.pid
        check(os.readlink("/proc/%d/exe" % pid).endswith("/attach_target"),
              "the server is not pid %d" % pid)
        r = hosts.run(0, [spd_inject, "%s:40000" % hosts.addrs[0],
                          "%s:%d" % (hosts.addrs[1], port), "far1"], timeout=180)
        state1 = os.path.realpath(os.path.join(tmp, "state1"))
        want = "%d injected %s/sessions/far1/%d" % (pid, state1, pid)
        check(r.returncode == 0 and r.stdout.strip() == want,
              "a request on host 0 for host 1's server: %d %r %r (want %r)\nhost 0 log:\n%s\n"
              "host 1 log:\n%s" % (r.returncode, r.stdout, r.stderr, want,
                                   daemons[0].text()[-1500:], daemons[1].text()[-1500:]))
        daemons[0].wait_log(["inject session far1: forwarded to the spdaemon of %s" %
                             hosts.addrs[1]], "host 0's log")
        daemons[1].wait_log(["host %s (%s:" % (hosts.addrs[0], hosts.addrs[0]),
                             "inject session far1 pid %d: agent in after" % pid], "host 1's log")
        tdir = want.split(" ", 2)[2]
        r = hosts.run(0, [sys.executable, "-c",
                          "import socket; s = socket.create_connection(('%s', %d), timeout=30); "
                          "s.sendall(b'7\\n'); print(s.recv(100))" % (hosts.addrs[1], port)])
        check(r.returncode == 0 and r.stdout.strip(), "host 0 cannot ask host 1's server: %r" %
              r.stderr)
        deadline = time.monotonic() + 60
        while "\nactivated " not in open(os.path.join(tdir, "meta")).read():
            check(time.monotonic() < deadline, "the connection from host 0 was not traced")
            time.sleep(0.1)
        # Root's server on host 1: not for another host (remote-inject users).
        q, qport = start_target(prog, wrap=hosts.cmd(1, []), args=["--any"])
        servers.append(q)
        qpid = q.pid
        r = hosts.run(0, [spd_inject, "%s:40001" % hosts.addrs[0],
                          "%s:%d" % (hosts.addrs[1], qport), "far2"], timeout=180)
        check(r.returncode == 0 and r.stdout.startswith("%d refused pid %d runs as root" %
                                                        (qpid, qpid)),
              "another host asking for root's server: %r %r" % (r.stdout, r.stderr))
        # A daemon relays nothing: host 1 asked for host 0's address.
        r = hosts.run(1, [spd_inject, "%s:40002" % hosts.addrs[1], "10.77.0.99:80", "far3"])
        check(r.returncode == 1 and "cannot reach the spdaemon of 10.77.0.99" in r.stdout,
              "a request for an address no daemon serves: %r %r" % (r.stdout, r.stderr))
        out = end_target(p)
        check(out.startswith("eintr 0 early 0 wrong 0"), "the traced server saw the agent: " + out)
    finally:
        for sp in servers:
            if sp.poll() is None:
                sp.kill()
                sp.wait()
        for d in daemons:
            d.stop()
        hosts.close()


def case_packaging(sptrace, spdaemon, tmp):
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "packaging")
    unit = open(os.path.join(src, "spdaemon.service")).read()
    check("/usr/sbin/spdaemon --config /etc/sptrace/spdaemon.conf" in unit,
          "the unit does not start /usr/sbin/spdaemon with /etc/sptrace/spdaemon.conf")
    mine = os.path.join(tmp, "spdaemon.service")
    with open(mine, "w") as f:
        f.write(unit.replace("/usr/sbin/spdaemon", os.path.abspath(spdaemon)))
    r = run(["systemd-analyze", "verify", mine])
    check(r.returncode == 0 and not r.stderr.strip(),
          "systemd-analyze verify spdaemon.service: %d %s" % (r.returncode, r.stderr))
    kd = os.path.join(tmp, "keys")
    make_keys(sptrace, kd)
    d = Daemon(spdaemon, kd, os.path.join(tmp, "state"),
               ["--config", os.path.join(src, "spdaemon.conf")])
    try:
        status_ok(sptrace, "a daemon started with the example configuration")
    finally:
        d.stop()


def refused(r, words, what):
    check(r.returncode != 0 and all(w in r.stderr for w in words),
          "%s: expected a refusal with %r, got %d: %r" % (what, words, r.returncode, r.stderr))


def case_refusals(sptrace, spdaemon, tmp):
    kd = os.path.join(tmp, "keys")
    make_keys(sptrace, kd)
    state = os.path.join(tmp, "state")
    base = [spdaemon, "--keys", kd, "--name", "127.0.0.1", "--foreground"]
    refused(run([spdaemon, "--name", "x", "--state-dir", state]), ["--keys KEYDIR"], "no --keys")
    refused(run(base), ["--state-dir"], "no --state-dir")
    refused(run(base + ["--state-dir", state, "--port", "abc"]), ["port 'abc'"], "--port abc")
    refused(run([spdaemon, "--keys", kd, "--name", "bad name", "--state-dir", state]),
            ["is not a host name"], "--name 'bad name'")
    refused(run([spdaemon, "--keys", kd, "--name", "nohost", "--state-dir", state]),
            ["nohost.crt"], "--name without a certificate")
    conf = os.path.join(tmp, "conf")
    with open(conf, "w") as f:
        f.write("# spdaemon\nport 7470\nfrobnicate yes\n")
    refused(run(base + ["--state-dir", state, "--config", conf]),
            ["%s:3" % conf, "unknown setting 'frobnicate'"], "unknown config setting")
    shared = os.path.join(tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    refused(run(base + ["--state-dir", shared]), ["writable by no one else"], "state dir 0777")
    link = os.path.join(tmp, "link")
    os.symlink(tmp, link)
    refused(run(base + ["--state-dir", link]), ["link is not followed"], "state dir a link")
    os.chmod(os.path.join(kd, "127.0.0.1.key"), 0o644)
    refused(run(base + ["--state-dir", state]), ["others may read", "chmod 600"],
            "a private key others may read")
    os.chmod(os.path.join(kd, "127.0.0.1.key"), 0o600)
    # The configuration file can name everything.
    with open(conf, "w") as f:
        f.write("keys %s\nname 127.0.0.1\nstate-dir %s   # where the log goes\n" % (kd, state))
    d = Daemon(spdaemon, kd, state, ["--config", conf])
    try:
        r = run(base + ["--state-dir", os.path.join(tmp, "state2")])
        refused(r, ["another spdaemon serves this network namespace"], "a second daemon")
        status_ok(sptrace, "after a second daemon was refused")
    finally:
        d.stop()
    r = run([spdaemon, "--help"])
    check(r.returncode == 0 and "--state-dir DIR" in r.stdout, "spdaemon --help")


def main():
    sptrace, spdaemon, case = sys.argv[1], sys.argv[2], sys.argv[3]
    in_own_netns()
    with tempfile.TemporaryDirectory(prefix="sptrace-daemon.") as tmp:
        if case in ("inject", "inject-hosts"):
            {"inject": case_inject, "inject-hosts": case_inject_hosts}[case](
                sptrace, spdaemon, tmp, sys.argv[4], sys.argv[5])
            print("ok")
            return
        {"serve": case_serve, "hosts": case_hosts, "packaging": case_packaging,
         "refusals": case_refusals}[case](sptrace, spdaemon, tmp)
    print("ok")


if __name__ == "__main__":
    main()
