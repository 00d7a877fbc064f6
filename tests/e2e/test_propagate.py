#!/usr/bin/env python3
"""test_propagate.py — a request followed across processes and hosts.

Three hosts made of network namespaces (nslib.Hosts), a spdaemon in each.
tests/progs/tier.c is the application: a client on host 0, run by
`sptrace run --on start`, asks a frontend on host 1, which asks a backend
on host 2 over one kept connection (and a helper child over a pipe, and
sends UDP heartbeats to a monitor on host 2); a decoy backend on host 2
is never asked.  The servers run as an unprivileged user (remote-inject
users).

  tiers   every process on the request's path is traced and starts at the
          receive of the request (the frontend at the client's first line,
          the backend at the frontend's first forwarded line, the helper at
          the pipe's, the monitor at the first heartbeat's datagram), the
          decoy is not; every byte the servers received is the same as in an
          untraced run of the same requests; the client's summary names
          the hosts; `sptrace collect` gathers every host's traces (not the
          decoy's) and `sptrace replay OUT` shows each under its host.
  chain   curl -> nginx (a root master, two workers as nobody, proxy_pass) ->
          python3 -m http.server: one worker and the python server traced
          from the request, the master not; two URLs on one connection; the
          second upstream connection asked over the daemons' kept connection
  redis   redis-cli -> redis-server: traced from the first command
  policy  a user's client asking for root's server on its host: refused,
          said in its agent.log and the daemon's log; the server untouched
  killed  the traced backend killed with SIGKILL mid-request: its daemon
          completes the trace's meta, every call up to the kill is kept,
          also in what `sptrace collect` gathers after that daemon restarted
  unix    a UNIX stream socket: a python3 client -> a user's python3 server
          that accepts the connection only after the request was sent (its
          receiving socket has no inode yet: found by the listener's path),
          traced from the request's receive; its answer, back to where the
          request came from, asks nothing; the client's standard output,
          a pipe this test reads, is not followed
  attach  `sptrace attach --on accept` to a running frontend: it follows an
          untraced client's request into the backend of another host
  silent  the peer host's port 7470 accepts and never answers: the send waits
          at most --propagate-wait, and the daemon remembers the host for
          the next request, which does not wait
  late    tiers with every injection holding its stopped thread 400 ms
          after the agent's thread was made (SPTRACE_TEST_INJECT_HOLD_MS):
          the agents start before the thread is back in its receive, as on
          a busy machine; the helper, stopped in its read of the pipe, is
          watched there all the same and traces every request from the
          first (each check of tiers holds: its three reads of the pipe)
  nodaemon  without a spdaemon `run` traces the client alone, says nothing
          of propagation, and the requests are answered.
  unixdgram  a UNIX datagram socket: a python3 client sends to the path of a
          user's python3 server (after an untraced datagram); the server
          starts at the traced datagram's receive, found by the socket bound
          there and the datagram's content hash (meta, replay).
  oob     tiers with `run --mark oob`: each TCP send that propagates is
          marked by an urgent byte, which the receiving agents take out (the
          servers receive the same bytes as untraced), and each receiver
          starts at the receive after it (the frontend at the request's
          first byte, which follows the mark's in the stream)
          (the monitor's heartbeat carries an IP option with a sequence
          number, across hosts after the daemons' probe; replay says the
          monitor was found by it; without --mark, in tiers, by content hash)
  oobinline  oob with every server's listener SO_OOBINLINE: the receiving
          agents cannot take an urgent byte, say so, await by offset, no
          mark is sent, and no server receives an extra byte; the monitor
          reads with recvmsg and IP_PKTINFO: the IP option marks its
          heartbeat all the same, and it sees the control messages of an
          untraced run, no more.
  forked  a backend that forks a child per connection after the agent came
          (tier forkbackend): the child is traced from the request's receive,
          its records are in the parent's trace on the daemon's host, `sptrace
          collect` brings them and the client's flow goes through the child
  pipe-backlog  a pipe with bytes of an untraced writer queued when the
          traced writer's first write injects the reader: both ends name
          each byte alike, flows matches each read to its write
          (tests/progs/pipes.c)
  pipe-fifo  pipe-backlog over a named pipe (mkfifo)
  pipe-writers  two writers of one pipe forked by a traced process: each
          read names the bytes of its write
  pipe-fifo-writers  two writers of one named pipe that share no memory
          (a traced shell's children, exec'd apart), taking turns: each
          read names the bytes of its write, whichever writer's
  pipe-users-writers  pipe-fifo-writers with writers of two users (61001,
          61002): they count the pipe's bytes together all the same
  unix-writers  two writers of one connected UNIX stream socket (one end of
          a socketpair), exec'd one after the other by a traced shell, to an
          injected reader of the other end: they count its bytes together
          (the session's count, the daemon's), so each read names the bytes of its
          write, whichever writer's
  unix-readers  pipe-readers over a connected UNIX stream socket (a
          socketpair): the readers hold one end, the writer the other
  unix-forked-writers  a traced writer of a UNIX stream socket and the child
          it forks after its first write: the child, which knows no peer,
          counts with its parent, so each read names the bytes of its write
  unix-early-writers  unix-forked-writers with the child forked before its
          parent's first write: it asks the daemon by its own socket, whose
          peer the daemon finds, and counts with its parent all the same
  pipe-readers  two pre-forked readers of one pipe (a user's), a traced
          writer: both traced, each read names the bytes of its write
  pipe-users-readers  pipe-readers with readers of two users (61001,
          61002): they count the pipe's bytes together all the same
  unix-users-readers  unix-readers with readers of two users
  pipe-readers-slow  the same with the daemon's injector slowed (nice 19
          on CPU 0 beside a busy loop, the readers on the other CPUs): a
          reader's agent mostly starts while the injector still holds its
          thread, blocked in its first read, and that read is seen all the
          same

usage: test_propagate.py CASE SPTRACE SPDAEMON TIER [PIPES [SPD_INJECT]]
"""

import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, reachable_sptrace, run  # noqa: E402
from nslib import Hosts, in_own_netns  # noqa: E402
from test_daemon import Daemon  # noqa: E402

USER = ["setpriv", "--reuid", "61001", "--regid", "61001", "--clear-groups"]


def start(hosts, i, argv, user=True):
    p = hosts.popen(i, (USER if user else []) + argv, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    check(line.startswith("ready "), "%s did not start: %r" % (argv, line))
    return p


def finish(p):
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        fail("a server did not end when its input closed")
    return out


def servers(hosts, tier, tmp, env=()):
    """Monitor and backend and decoy on host 2, frontend on host 1 (env:
    VAR=VALUE for each)."""
    tier = ["env"] + list(env) + [tier]
    mon = start(hosts, 2, tier + ["monitor", "7001"])
    back = start(hosts, 2, tier + ["backend", "7002"])
    decoy = start(hosts, 2, tier + ["backend", "7003"])
    front = start(hosts, 1, tier + ["frontend", "7000", hosts.addrs[2], "7002",
                                    hosts.addrs[2], "7001"])
    return {"monitor": mon, "backend": back, "decoy": decoy, "frontend": front}


def stop_all(procs):
    outs = {}
    for name, p in procs.items():
        outs[name] = finish(p)
    return outs


def traces(state, session):
    """{pid: dir} of the traces a daemon keeps for the session."""
    d = os.path.join(state, "sessions", session)
    if not os.path.isdir(d):
        return {}
    return {int(n): os.path.join(d, n) for n in os.listdir(d) if n.isdigit()}


def collected(sptrace, hosts, tmp, trace, want, never, origin=0):
    """`sptrace collect` of the session started in `trace` (on host
    `origin`): OUT
    has each host's traced processes (want: {host: [pid]}) and none of
    `never`; `sptrace replay OUT` shows each under its host."""
    out = os.path.join(tmp, "collected")
    r = hosts.run(origin, [sptrace, "collect", "-o", out, trace], timeout=300)
    check(r.returncode == 0, "sptrace collect: %d %r %r" % (r.returncode, r.stdout, r.stderr))
    rr = run([sptrace, "replay", out], timeout=300)
    check(rr.returncode == 0, "sptrace replay OUT: %r" % rr.stderr[-1000:])
    for host, pids in want.items():
        for pid in pids:
            check(os.path.exists(os.path.join(out, host, str(pid), "meta")),
                  "OUT/%s/%d is missing: %s" % (host, pid, os.listdir(out)))
            check(re.search(r"== host %s: pid %d\b" % (re.escape(host), pid), rr.stdout),
                  "replay OUT does not show pid %d of host %s" % (pid, host))
    for pid in never:
        for host in os.listdir(out):
            check(not os.path.exists(os.path.join(out, host, str(pid))),
                  "OUT has pid %d, which the request never reached" % pid)
    return out


def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(x) for x in f.read().split()]


def meta(d):
    with open(os.path.join(d, "meta")) as f:
        return f.read()


def case_tiers(sptrace, spdaemon, tier, tmp, mark=None, oobinline=False, hold_ms=0):
    """mark: `run --mark`; oobinline: every server's listener SO_OOBINLINE, and
    the monitor reads with recvmsg, asking IP_PKTINFO; hold_ms: the daemons'
    injector holds the stopped thread that long after it made the agent's."""
    env = ["TIER_OOBINLINE=1", "TIER_PKTINFO=1"] if oobinline else []
    if hold_ms:
        os.environ["SPTRACE_TEST_INJECT_HOLD_MS"] = str(hold_ms)   # the daemons inherit it
    oob = mark == "oob" and not oobinline    # the urgent byte is sent
    prog = reachable_copy(tier, tmp)
    kd = os.path.join(tmp, "keys")
    hosts = Hosts(3)
    daemons = []
    procs = {}
    try:
        run([sptrace, "keys", "init", kd])
        for a in hosts.addrs:
            run([sptrace, "keys", "issue", kd, a])
        requests = ["3", "5", "8"]
        # Untraced first: the bytes every server receives natively.
        procs = servers(hosts, prog, tmp, env)
        r = hosts.run(0, [prog, "client", hosts.addrs[1], "7000"] + requests)
        check(r.returncode == 0, "the untraced client: %r" % r.stderr)
        native_answers = r.stdout
        native = stop_all(procs)
        procs = {}
        for i in range(3):
            daemons.append(Daemon(spdaemon, kd, os.path.join(tmp, "state%d" % i),
                                  name=hosts.addrs[i], wrap=hosts.cmd(i, [])))
        procs = servers(hosts, prog, tmp, env)
        out = os.path.join(tmp, "client.trace")
        r = hosts.run(0, [sptrace, "run", "--on", "start", "-o", out] +
                      (["--mark", mark] if mark else []) + ["--", prog, "client",
                      hosts.addrs[1], "7000"] + requests, timeout=300)
        logs = "\n".join("host %d:\n%s" % (i, d.text()[-3000:]) for i, d in enumerate(daemons))
        check(r.returncode == 0, "the traced client failed: %r\n%s" % (r.stderr, logs))
        check(r.stdout == native_answers, "traced answers differ: %r vs %r" %
              (r.stdout, native_answers))
        m = re.search(r"session (\S+)\)", r.stderr)
        check(m, "run did not say it propagates: %r" % r.stderr)
        session = m.group(1)
        check("session %s\n" % session in meta(out), "the client's meta has no session line")
        check("hosts: %s" % hosts.addrs[1] in r.stderr,
              "the summary does not name the frontend's host: %r" % r.stderr)
        pids = {name: p.pid for name, p in procs.items()}
        t1 = traces(os.path.join(tmp, "state1"), session)
        t2 = traces(os.path.join(tmp, "state2"), session)
        check(pids["frontend"] in t1, "the frontend (pid %d) was not traced: %s\n%s" %
              (pids["frontend"], t1, logs))
        check(pids["backend"] in t2, "the backend (pid %d) was not traced: %s\n%s" %
              (pids["backend"], t2, logs))
        check(pids["monitor"] in t2, "the monitor (pid %d), sent UDP heartbeats, was not "
              "traced: %s\n%s" % (pids["monitor"], t2, logs))
        helper = children(pids["frontend"])
        check(len(helper) == 1 and helper[0] in t1, "the frontend's helper %s (over a pipe) was "
              "not traced: %s\n%s" % (helper, t1, logs))
        check(pids["decoy"] not in t2, "the decoy was traced")
        # the frontend connected to the backend before it had the agent: its
        # sent offsets are absolute all the same (sock_diag said it connected)
        with open(os.path.join(t2[pids["backend"]], "agent.log")) as f:
            blog = f.read()
        with open(os.path.join(t1[pids["frontend"]], "agent.log")) as f:
            flog = f.read()
        with open(os.path.join(out, "agent.log")) as f:
            clog = f.read()
        if oob:
            # every receiver took the urgent byte, every sender sent it
            for who, log in (("frontend", flog), ("backend", blog)):
                check(re.search(r"expecting the receive of tcp \S+ -> \S+ after its urgent "
                                r"byte \(oob mark\)", log) and
                      "the mark's urgent byte read before the program's receive" in log and
                      "the receive that begins at the mark's urgent byte: the traced send's"
                      in log,
                      "the %s did not await and find the mark:\n%s" % (who, log))
            for who, log in (("client", clog), ("frontend", flog)):
                check("follow; marked by an urgent byte (oob)" in log,
                      "the %s's traced send was not marked:\n%s" % (who, log))
        else:
            check(re.search(r"expecting the receive of tcp %s:\d+ -> %s:7002 at stream offset "
                            r"0" % (re.escape(hosts.addrs[1]), re.escape(hosts.addrs[2])), blog),
                  "the backend did not await the request at its absolute offset:\n%s" % blog)
        # the monitor's heartbeat: by its IP option with the mark (across
        # hosts, after the daemons' probe), else by its content hash; replay
        # says which
        how = "ipopt" if mark == "oob" else "hash"
        mon = t2[pids["monitor"]]
        check(re.search(r"\nmatched udp \S+ -> %s:7001 by %s\n" % (re.escape(hosts.addrs[2]),
                                                                  how), meta(mon)),
              "the monitor's heartbeat was not found by %s:\n%s" % (how, meta(mon)[-1500:]))
        rr = run([sptrace, "replay", mon]).stdout
        check(re.search(r"^# followed from a traced send: the receive of udp \S+ -> %s:7001 by "
                        r"%s$" % (re.escape(hosts.addrs[2]), how), rr, re.M),
              "replay does not say how the monitor's heartbeat was found:\n%s" % rr[-1500:])
        if mark == "oob":
            check("follow; marked by an IP option (ipopt)" in flog,
                  "the frontend's heartbeat was not marked:\n%s" % flog)
        if oobinline:
            # the receivers refused the urgent byte, said why; nothing sent
            for who, log in (("frontend", flog), ("backend", blog)):
                check(re.search(r"no urgent byte here: fd \d+ has SO_OOBINLINE .*; awaiting "
                                r"the receive by its stream offset instead", log),
                      "the %s did not say it falls back to offsets:\n%s" % (who, log))
            for who, log in (("client", clog), ("frontend", flog)):
                check("follow; marked by offset (a follower cannot take an urgent byte)" in log
                      and "follow; marked by an urgent byte" not in log,
                      "the %s did not fall back to offsets:\n%s" % (who, log))
        outs = stop_all(procs)
        procs = {}
        for name in ("frontend", "backend", "monitor", "decoy"):
            got = [l for l in outs[name].splitlines() if " got " in l]
            want = [l for l in native[name].splitlines() if " got " in l]
            check(got == want, "%s received other bytes traced: %r vs %r" % (name, got, want))
        # Each starts at the receive of the request, and shows the work.
        for name, d, funcs in (("frontend", t1[pids["frontend"]], ["serve_line", "ask_backend"]),
                               ("backend", t2[pids["backend"]], ["backend_line", "work"]),
                               ("helper", t1[helper[0]], ["helper"]),
                               ("monitor", t2[pids["monitor"]], ["monitor_main"])):
            text = meta(d)
            check("\nactivated " in text and " recv " in text.split("\nactivated ", 1)[1],
                  "the %s did not start at a receive:\n%s" % (name, text[-1500:]))
            rr = run([sptrace, "replay", d])
            check(rr.returncode == 0 and all(f in rr.stdout for f in funcs),
                  "the %s's replay lacks %s: %r" % (name, funcs, (rr.stdout + rr.stderr)[-1500:]))
            if name == "helper":
                # stopped by the injector in its read of the pipe, it is
                # watched there: the first request is traced too (missed, its
                # counts named the next one's bytes: `flows` matched a
                # receive to a send seconds after it)
                reads = re.findall(r"read\(pipe \d+, bytes \d+\.\.\d+\)", rr.stdout)
                with open(os.path.join(d, "agent.log")) as f:
                    hlog = f.read()
                check(len(reads) == len(requests) and
                      "recv: 1 thread(s) already waiting in it are watched" in hlog,
                      "the helper traced %d reads of its pipe for %d requests %s:\n%s" %
                      (len(reads), len(requests), reads, hlog[-2000:]))
        collected(sptrace, hosts, tmp, out, {
            hosts.addrs[1]: [pids["frontend"], helper[0]],
            hosts.addrs[2]: [pids["backend"], pids["monitor"]]}, [pids["decoy"]])
        fr = run([sptrace, "replay", t1[pids["frontend"]]]).stdout
        # the client's first request is the frontend's first traced receive
        # (with the mark, its byte is the stream's first)
        first = re.search(r"(?:recv|read)\(tcp [0-9.:]+ <- %s:\d+, bytes (\d+)\.\." %
                          re.escape(hosts.addrs[0]), fr)
        check(first and first.group(1) == ("1" if oob else "0"),
              "the frontend's first traced receive is not the request's first byte:\n%s" %
              fr[-1500:])
    finally:
        kill_all(procs.values())
        for d in daemons:
            d.stop()
        hosts.close()


class Cluster:
    """n namespace hosts, keys, a spdaemon in each (remote-inject users)."""

    def __init__(self, sptrace, spdaemon, tmp, n):
        self.hosts = Hosts(n)
        self.daemons = []
        self.tmp = tmp
        self.spdaemon = spdaemon
        self.kd = kd = os.path.join(tmp, "keys")
        try:
            run([sptrace, "keys", "init", kd])
            for a in self.hosts.addrs:
                run([sptrace, "keys", "issue", kd, a])
            for i in range(n):
                self.daemons.append(Daemon(spdaemon, kd, self.state(i), name=self.hosts.addrs[i],
                                           wrap=self.hosts.cmd(i, [])))
        except BaseException:
            self.close()
            raise

    def restart(self, i):
        self.daemons[i].stop()
        self.daemons[i] = Daemon(self.spdaemon, self.kd, self.state(i), name=self.hosts.addrs[i],
                                 wrap=self.hosts.cmd(i, []))

    def state(self, i):
        return os.path.join(self.tmp, "state%d" % i)

    def logs(self):
        return "\n".join("host %d:\n%s" % (i, d.text()[-3000:]) for i, d in enumerate(self.daemons))

    def close(self):
        for d in self.daemons:
            d.stop()
        self.hosts.close()


def reachable_copy(prog, tmp):
    """prog (tier, pipes) copied where the servers' user can run it (tmp
    made 0755): a fresh clone's build directory may be private."""
    os.chmod(tmp, 0o755)
    copy = os.path.join(tmp, os.path.basename(prog))
    shutil.copy(prog, copy)
    os.chmod(copy, 0o755)
    return copy


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def terminate(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def session_of(stderr):
    m = re.search(r"session (\S+)\)", stderr)
    check(m, "run did not say it propagates: %r" % stderr)
    return m.group(1)


def wait_port(hosts, i, addr, port, what):
    deadline = time.monotonic() + 60
    while True:
        r = hosts.run(i, [sys.executable, "-c", "import socket; socket.create_connection(('%s', %d), "
                          "timeout=2).close()" % (addr, port)])
        if r.returncode == 0:
            return
        check(time.monotonic() < deadline, "%s does not answer on %s:%d" % (what, addr, port))
        time.sleep(0.2)


def case_chain(sptrace, spdaemon, tier, tmp):
    """curl on host 0, under sptrace run -> nginx on host 1 (a root master, two
    workers as nobody; proxy_pass) -> python3 -m http.server on host 2 (a
    user's).  Two URLs on one kept connection."""
    for prog, pkg in (("nginx", "nginx-light"), ("curl", "curl")):
        if not shutil.which(prog):
            fail("%s is missing; install the Debian package %s (scripts/install-deps.sh does)" %
                 (prog, pkg))
    os.chmod(tmp, 0o755)
    www = os.path.join(tmp, "www")
    os.mkdir(www)
    for name in ("a", "b"):
        with open(os.path.join(www, name + ".txt"), "w") as f:
            f.write(("file %s\n" % name) * 50)
    cl = Cluster(sptrace, spdaemon, tmp, 3)
    addrs = cl.hosts.addrs
    procs = []
    try:
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write("daemon off;\nmaster_process on;\nworker_processes 2;\nuser nobody nogroup;\n"
                    "pid %s/nginx.pid;\nerror_log %s/error.log;\n"
                    "events { worker_connections 256; }\n"
                    "http { access_log off; server { listen %s:8080; "
                    "location / { proxy_pass http://%s:8000; } } }\n" % (tmp, tmp, addrs[1], addrs[2]))
        py = cl.hosts.popen(2, USER + ["/usr/bin/python3", "-m", "http.server", "8000", "--bind", addrs[2],
                                       "--directory", www],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(py)
        ng = cl.hosts.popen(1, ["nginx", "-c", conf, "-p", tmp], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
        procs.append(ng)
        wait_port(cl.hosts, 0, addrs[2], 8000, "python3 -m http.server")
        wait_port(cl.hosts, 0, addrs[1], 8080, "nginx")
        urls = ["http://%s:8080/a.txt" % addrs[1], "http://%s:8080/b.txt" % addrs[1]]
        native = cl.hosts.run(0, ["curl", "-sS"] + urls)
        check(native.returncode == 0 and native.stdout.startswith("file a"),
              "curl untraced: %r %r" % (native.stdout[:200], native.stderr))
        out = os.path.join(tmp, "curl.trace")
        r = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", "curl", "-sS"] + urls, timeout=600)
        check(r.returncode == 0 and r.stdout == native.stdout,
              "curl traced: %d %r %r\n%s" % (r.returncode, r.stdout[:200], r.stderr, cl.logs()))
        session = session_of(r.stderr)
        workers = children(ng.pid)
        t1 = traces(cl.state(1), session)
        t2 = traces(cl.state(2), session)
        check(ng.pid not in t1, "nginx's root master was traced by another host's request")
        traced_workers = [w for w in workers if w in t1 and "\nactivated " in meta(t1[w])]
        check(len(traced_workers) == 1, "not one nginx worker traced from the request: workers %s, "
              "traces %s\n%s" % (workers, t1, cl.logs()))
        check(py.pid in t2 and "\nactivated " in meta(t2[py.pid]),
              "python3 http.server (pid %d) was not traced: %s\n%s" % (py.pid, t2, cl.logs()))
        wr = run([sptrace, "replay", t1[traced_workers[0]]])
        check(wr.returncode == 0 and re.search(r"\((?:tcp %s:8080 <- %s:\d+)" %
                                                (re.escape(addrs[1]), re.escape(addrs[0])), wr.stdout),
              "the nginx worker's replay shows no receive from curl:\n%s" %
              (wr.stdout + wr.stderr)[-2000:])
        check(re.search(r"\(tcp %s:\d+ -> %s:8000" % (re.escape(addrs[1]), re.escape(addrs[2])),
                        wr.stdout),
              "the nginx worker's replay shows no send to the python server")
        # nginx's second connection to the python server: its daemon asked
        # host 2's daemon again over the connection kept from the first
        cl.daemons[1].wait_log(["forwarded to the spdaemon of %s" % addrs[2],
                                "kept from before"], "the kept connection between daemons")
        pr = run([sptrace, "replay", t2[py.pid]])
        check(pr.returncode == 0 and re.search(r"\(tcp %s:8000 <- %s:\d+, bytes 0\.\." %
                                                (re.escape(addrs[2]), re.escape(addrs[1])), pr.stdout),
              "the python server's replay does not start at nginx's request:\n%s" %
              (pr.stdout + pr.stderr)[-2000:])
    finally:
        terminate(procs)
        cl.close()


def case_redis(sptrace, spdaemon, tier, tmp):
    """redis-cli on host 0 under sptrace run -> redis-server on host 1 (a
    user's): three commands on one connection."""
    for prog, pkg in (("redis-server", "redis-server"), ("redis-cli", "redis-tools")):
        if not shutil.which(prog):
            fail("%s is missing; install the Debian package %s (scripts/install-deps.sh does)" %
                 (prog, pkg))
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 2)
    addrs = cl.hosts.addrs
    procs = []
    try:
        rdir = os.path.join(tmp, "redis")
        os.mkdir(rdir)
        os.chown(rdir, 61001, 61001)
        rs = cl.hosts.popen(1, USER + ["redis-server", "--port", "6400", "--bind", addrs[1],
                                       "--save", "", "--appendonly", "no", "--dir", rdir,
                                       "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(rs)
        wait_port(cl.hosts, 0, addrs[1], 6400, "redis-server")
        script = "SET k1 v1\nINCR n\nGET k1\n"
        native = cl.hosts.run(0, ["redis-cli", "-h", addrs[1], "-p", "6400"], input=script)
        check(native.returncode == 0 and "v1" in native.stdout, "redis-cli untraced: %r %r" %
              (native.stdout, native.stderr))
        out = os.path.join(tmp, "cli.trace")
        r = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", "redis-cli", "-h", addrs[1], "-p",
                             "6400"], input=script, timeout=600)
        want = native.stdout.replace("\n1\n", "\n2\n")     # INCR n a second time
        check(r.returncode == 0 and r.stdout == want,
              "redis-cli traced: %d %r (want %r) %r\n%s" % (r.returncode, r.stdout, want,
                                                           r.stderr, cl.logs()))
        session = session_of(r.stderr)
        t1 = traces(cl.state(1), session)
        check(rs.pid in t1 and "\nactivated " in meta(t1[rs.pid]),
              "redis-server (pid %d) was not traced: %s\n%s" % (rs.pid, t1, cl.logs()))
        rr = run([sptrace, "replay", t1[rs.pid]])
        check(rr.returncode == 0 and "processCommand" in rr.stdout and
              re.search(r"\(tcp %s:6400 <- %s:\d+, bytes 0\.\." % (re.escape(addrs[1]),
                                                                   re.escape(addrs[0])), rr.stdout),
              "redis-server's replay does not start at redis-cli's first command:\n%s" %
              (rr.stdout + rr.stderr)[-2000:])
        check(rr.stdout.count("processCommand()") >= 3 or rr.stdout.count("processCommand") >= 3,
              "redis-server's replay lacks the three commands")
    finally:
        terminate(procs)
        cl.close()


def case_policy(sptrace, spdaemon, tier, tmp):
    """A user's traced client asks for root's server on the same host: the
    daemon refuses (a user may have only its own processes traced), says
    why, and root's server never gets the agent; the request is answered."""
    prog = reachable_copy(tier, tmp)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    addr = cl.hosts.addrs[0]
    procs = []
    try:
        back = start(cl.hosts, 0, [prog, "backend", "7002"], user=False)
        procs.append(back)
        mine = os.path.join(tmp, "mine")
        os.mkdir(mine)
        os.chown(mine, 61001, 61001)
        out = os.path.join(mine, "client.trace")
        r = cl.hosts.run(0, USER + ["env", "HOME=" + mine, reachable_sptrace(sptrace, tmp), "run",
                                    "-o", out, "--", prog,
                                    "client", addr, "7002", "4"], timeout=300)
        check(r.returncode == 0 and r.stdout.startswith("backend 4 -> "),
              "the user's client: %d %r %r" % (r.returncode, r.stdout, r.stderr))
        session_of(r.stderr)
        with open("/proc/%d/maps" % back.pid) as f:
            check("sptrace-agent" not in f.read(), "root's server got the agent for a user")
        with open(os.path.join(out, "agent.log")) as f:
            log = f.read()
        check("not traced: pid %d runs as uid 0 and the requester is uid 61001" % back.pid in log,
              "the client's agent.log does not say why root's server was not traced:\n%s" % log)
        cl.daemons[0].wait_log(["inject session", "pid %d: refused: pid %d runs as uid 0" %
                                (back.pid, back.pid)], "the refusal in the daemon's log")
        finish(back)
    finally:
        kill_all(procs)
        cl.close()


def case_killed(sptrace, spdaemon, tier, tmp):
    """The backend, traced from the request, is killed with SIGKILL in the
    middle of it: its daemon completes the trace (meta's end), which keeps
    every call up to the kill; the frontend answers without it."""
    prog = reachable_copy(tier, tmp)
    cl = Cluster(sptrace, spdaemon, tmp, 3)
    procs = {}
    try:
        procs = servers(cl.hosts, prog, tmp)
        out = os.path.join(tmp, "client.trace")
        client = cl.hosts.popen(0, [sptrace, "run", "-o", out, "--", prog, "client",
                                    cl.hosts.addrs[1], "7000", "3", "2000000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        back = procs["backend"].pid
        deadline = time.monotonic() + 120
        tdir = None
        while True:
            check(time.monotonic() < deadline, "the backend was not traced:\n" + cl.logs())
            found = [d for s in os.listdir(os.path.join(cl.state(2), "sessions"))
                     for d in [os.path.join(cl.state(2), "sessions", s, str(back))]
                     if os.path.exists(os.path.join(d, "meta"))] if os.path.isdir(os.path.join(cl.state(2), "sessions")) \
                else []
            if found and meta(found[0]).count("\nactivated ") and "work" in \
                    run([sptrace, "replay", found[0]]).stdout.split("backend_line", 2)[-1]:
                tdir = found[0]
                break
            time.sleep(0.05)
        procs["backend"].kill()          # SIGKILL, in the second request's work()
        procs["backend"].wait()
        o, e = client.communicate(timeout=120)
        check("front(no backend" in o, "the frontend did not answer without its backend: %r %r" %
              (o, e))
        cl.daemons[2].wait_log(["pid %d (session" % back, "is gone without its agent finishing"],
                               "the daemon's reaper")
        text = meta(tdir)
        check("\nend the process ended before its agent finished" in text and "\ntsc1 " in text,
              "the killed backend's meta was not completed:\n%s" % text[-800:])
        rr = run([sptrace, "replay", tdir])
        check(rr.returncode == 0 and rr.stdout.count("backend_line") >= 2 and "work" in rr.stdout,
              "the killed backend's trace lost its calls:\n%s" % (rr.stdout + rr.stderr)[-2000:])
        # ... and after the backend's daemon restarted, and collect
        cl.restart(2)
        col = collected(sptrace, cl.hosts, tmp, out, {cl.hosts.addrs[2]: [back]}, [])
        check("backend_line" in run([sptrace, "replay", os.path.join(col, cl.hosts.addrs[2],
                                                                     str(back))]).stdout,
              "the collected trace of the killed backend lost its calls")
        del procs["backend"]
        stop_all(procs)
        procs = {}
    finally:
        kill_all(procs.values())
        cl.close()


UNIX_SERVER = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
s.listen()
print("ready", flush=True)
early, _ = s.accept()
early.sendall(b"early")
time.sleep(1)        # the request is sent before it is accepted
c, _ = s.accept()
got = c.recv(100)
c.sendall(b"echo:" + got)
sys.stdin.read()
print("got", got.hex(), flush=True)
"""

UNIX_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"hello over unix")
print(s.recv(100).decode())
"""


def user_unix_server(cl, tmp, code, name, procs):
    """A user's python3 server (`code`, which prints "ready") on host 0,
    listening at tmp/srv/NAME in a directory of the user's; (its Popen, the
    path).  Appended to procs."""
    sdir = os.path.join(tmp, "srv")
    os.mkdir(sdir)
    os.chown(sdir, 61001, 61001)
    path = os.path.join(sdir, name)
    srv = cl.hosts.popen(0, USER + ["/usr/bin/python3", "-c", code, path],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs.append(srv)
    check(srv.stdout.readline() == "ready\n", "the UNIX server (%s) did not start" % name)
    return srv, path


def case_unix(sptrace, spdaemon, tier, tmp):
    """A UNIX stream socket: python3 under sptrace run asks a user's python3
    server on the same host; the server starts at the receive of the
    request (an earlier connection it served is not traced)."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    try:
        srv, path = user_unix_server(cl, tmp, UNIX_SERVER, "srv.sock", procs)
        r = cl.hosts.run(0, ["/usr/bin/python3", "-c", "import socket; s = socket.socket("
                             "socket.AF_UNIX); s.connect(%r); print(s.recv(10))" % path])
        check(r.returncode == 0 and "early" in r.stdout, "the untraced first client: %r" % r.stderr)
        out = os.path.join(tmp, "client.trace")
        r = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", "/usr/bin/python3", "-c", UNIX_CLIENT,
                             path], timeout=600)
        check(r.returncode == 0 and r.stdout.strip() == "echo:hello over unix",
              "the traced client: %d %r %r\n%s" % (r.returncode, r.stdout, r.stderr, cl.logs()))
        session = session_of(r.stderr)
        # the client printed into a pipe this test reads: not the request's way
        with open("/proc/self/maps") as f:
            check("sptrace-agent" not in f.read(),
                  "the agent followed the client's standard output into the test itself")
        t = traces(cl.state(0), session)
        check(srv.pid in t and "\nactivated " in meta(t[srv.pid]),
              "the UNIX server (pid %d) was not traced: %s\n%s" % (srv.pid, t, cl.logs()))
        o, _ = srv.communicate(input="", timeout=60)
        check("got " + b"hello over unix".hex() in o, "the server received other bytes: %r" % o)
        rr = run([sptrace, "replay", t[srv.pid]])
        check(rr.returncode == 0 and re.search(r"recv\w*\(unix \d+ [^<]*<- [^,]*, bytes 0\.\.15\)",
                                                rr.stdout),
              "the server's replay does not start at the request's receive:\n%s" %
              (rr.stdout + rr.stderr)[-2000:])
        check("early" not in rr.stdout and "bytes 0..5)" not in rr.stdout.split("recv(unix")[0],
              "the server was traced before the request")
        with open(os.path.join(t[srv.pid], "agent.log")) as f:
            slog = f.read()
        check("propagation: unix" not in slog, "the server's answer, back over the connection "
              "the request came on, asked the daemon to follow it:\n%s" % slog)
    finally:
        kill_all(procs)
        cl.close()


UNIX_DGRAM_SERVER = """
import os, select, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
print("ready", flush=True)
got = []
while True:
    r, _, _ = select.select([s, sys.stdin], [], [])
    if s in r:
        d, a = s.recvfrom(100)
        got.append(d)
        if a:
            s.sendto(b"echo:" + d, a)
    elif sys.stdin in r:
        break
print("got", b"|".join(got).hex(), flush=True)
"""

UNIX_DGRAM_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")           # an abstract name of its own, for the answer
s.sendto(sys.argv[2].encode(), sys.argv[1])
print(s.recv(100).decode())
"""


def case_unixdgram(sptrace, spdaemon, tier, tmp):
    """A UNIX datagram socket: python3 under sptrace run sends a datagram to
    the path of a user's python3 server on the same host (an earlier,
    untraced datagram came first); the server starts at the receive of the
    traced one, found by the socket bound to the path and the datagram's
    content hash, which its meta and replay say; it receives the same bytes
    as untraced."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    try:
        srv, path = user_unix_server(cl, tmp, UNIX_DGRAM_SERVER, "dgram.sock", procs)
        r = cl.hosts.run(0, ["/usr/bin/python3", "-c", UNIX_DGRAM_CLIENT, path, "early"])
        check(r.returncode == 0 and "echo:early" in r.stdout,
              "the untraced first client: %r %r" % (r.stdout, r.stderr))
        out = os.path.join(tmp, "client.trace")
        r = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", "/usr/bin/python3", "-c",
                             UNIX_DGRAM_CLIENT, path, "hello over unix dgram"], timeout=600)
        check(r.returncode == 0 and r.stdout.strip() == "echo:hello over unix dgram",
              "the traced client: %d %r %r\n%s" % (r.returncode, r.stdout, r.stderr, cl.logs()))
        session = session_of(r.stderr)
        t = traces(cl.state(0), session)
        check(srv.pid in t and "\nactivated " in meta(t[srv.pid]),
              "the UNIX datagram server (pid %d) was not traced: %s\n%s" % (srv.pid, t, cl.logs()))
        o, _ = srv.communicate(input="", timeout=60)
        check("got " + b"early|hello over unix dgram".hex() in o,
              "the server received other bytes: %r" % o)
        m = re.search(r"\nmatched unixdgram (\d+) by hash\n", meta(t[srv.pid]))
        check(m, "the server's meta does not say its datagram was found by hash:\n%s" %
              meta(t[srv.pid])[-1500:])
        inode = int(m.group(1))
        with open(os.path.join(out, "agent.log")) as f:
            clog = f.read()
        check(re.search(r"propagation: unixdgram -> %s: host \S+ answered in [\d.]+ ms: 1 of 1 "
                        % re.escape(path), clog),
              "the client did not ask for the datagram's receiver by its path:\n%s" % clog)
        rr = run([sptrace, "replay", t[srv.pid]])
        check(rr.returncode == 0 and re.search(r"recv\w*\(unix-dgram %d [^,]*, datagram" % inode,
                                                rr.stdout) and
              "# followed from a traced send: the receive of unixdgram %d by hash" % inode
              in rr.stdout,
              "the server's replay does not start at the datagram's receive, or does not say "
              "how it was found:\n%s" % (rr.stdout + rr.stderr)[-2000:])
        check("early" not in rr.stdout, "the server was traced before the request")
    finally:
        kill_all(procs)
        cl.close()


def case_attach(sptrace, spdaemon, tier, tmp):
    """`sptrace attach --on accept` to the running frontend on host 1: an
    untraced client's request starts it, and it follows the request into
    the backend on host 2; collect from the attach's trace."""
    prog = reachable_copy(tier, tmp)
    cl = Cluster(sptrace, spdaemon, tmp, 3)
    procs = {}
    try:
        procs = servers(cl.hosts, prog, tmp)
        front = procs["frontend"].pid
        out = os.path.join(tmp, "front.trace")
        r = cl.hosts.run(1, [sptrace, "attach", "--on", "accept", "-o", out, str(front)],
                         timeout=300)
        check(r.returncode == 0 and "(session " in r.stdout,
              "attach with a daemon: %d %r %r" % (r.returncode, r.stdout, r.stderr))
        session = re.search(r"\(session (\S+)\)", r.stdout).group(1)
        c = cl.hosts.run(0, [prog, "client", cl.hosts.addrs[1], "7000", "6"])
        check(c.returncode == 0 and c.stdout.startswith("front(backend 6 -> "),
              "the client of the attached frontend: %r %r" % (c.stdout, c.stderr))
        t2 = traces(cl.state(2), session)
        back = procs["backend"].pid
        check(back in t2 and "\nactivated " in meta(t2[back]),
              "the attached frontend did not follow into the backend: %s\n%s" % (t2, cl.logs()))
        check("session %s\n" % session in meta(out), "the attach's meta has no session line")
        stop_all(procs)
        procs = {}
        collected(sptrace, cl.hosts, tmp, out, {cl.hosts.addrs[1]: [front],
                                                cl.hosts.addrs[2]: [back]}, [], origin=1)
    finally:
        kill_all(procs.values())
        cl.close()


SILENT = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7470))
s.listen()
print("ready", flush=True)
held = []
while True:
    held.append(s.accept()[0])       # accepted, never answered
"""


def case_silent(sptrace, spdaemon, tier, tmp):
    """The peer's host has something on port 7470 that never answers: the
    traced send waits at most --propagate-wait, and the daemon remembers the
    host, so the next request does not wait again."""
    cl = Cluster(sptrace, spdaemon, tmp, 2)
    hosts = cl.hosts
    procs = []
    try:
        cl.daemons[1].stop()
        silent = hosts.popen(1, [sys.executable, "-c", SILENT], stdout=subprocess.PIPE, text=True)
        procs.append(silent)
        check(silent.stdout.readline() == "ready\n", "the silent listener did not start")
        procs.append(start(hosts, 1, [tier, "backend", "7002"], user=False))
        for i in range(2):
            out = os.path.join(tmp, "client%d" % i)
            r = hosts.run(0, [sptrace, "run", "--propagate-wait", "1500", "-o", out, "--", tier,
                              "client", hosts.addrs[1], "7002", "2"], timeout=120)
            check(r.returncode == 0 and r.stdout.startswith("backend 2 -> "),
                  "client run %d: %r %r" % (i, r.stdout, r.stderr))
        with open(os.path.join(tmp, "client0", "agent.log")) as f:
            first = f.read()
        with open(os.path.join(tmp, "client1", "agent.log")) as f:
            second = f.read()
        check("not followed" in first or "refused" in first,
              "the first run's agent does not say its send went on:\n%s" % first)
        m = re.search(r"the spdaemon refused: .*asked again after 30 s\) \(after ([\d.]+) ms\)",
                      second)
        check(m and float(m.group(1)) < 500,
              "the daemon did not remember the silent host, or the second send waited:\n%s\n%s"
              % (second, cl.logs()))
    finally:
        kill_all(procs)
        cl.close()


def pipe_ranges(sptrace, d, call, ino, chan=None):
    """The byte ranges of trace d's `call`s (read, write) on pipe ino (or
    on the channel replay names `chan`: "unix 5 -> 6")."""
    r = run([sptrace, "replay", d], timeout=300)
    check(r.returncode == 0, "replay %s: %r" % (d, r.stderr[-1000:]))
    return [(int(a), int(b)) for a, b in
            re.findall(r"%s\(%s, bytes (\d+)\.\.(\d+)\)" % (call, re.escape(
                chan or "pipe %d" % ino)), r.stdout)]


def agent_logs(t, pids):
    """The agent.log of each of pids traced in t ({pid: dir}), for a
    failure's message."""
    out = []
    for pid in pids:
        try:
            with open(os.path.join(t[pid], "agent.log")) as f:
                out.append("agent.log of %d:\n%s" % (pid, f.read()[-4000:]))
        except (KeyError, OSError) as e:
            out.append("agent.log of %d: %s" % (pid, e))
    return "\n".join(out)


def pipe_flows_clean(sptrace, cl, tmp, out, readers):
    """The pipe's session collected (the writer's trace `out`, the readers'
    on host 0): `sptrace flows` finds no property it violates."""
    coll = collected(sptrace, cl.hosts, tmp, out, {cl.hosts.addrs[0]: readers}, [])
    fl = run([sptrace, "flows", coll], timeout=300)
    check(fl.returncode == 0 and "property:" not in fl.stdout,
          "flows of the pipe's session: %r\n%s" % (fl.stderr[-1000:], fl.stdout[:2000]))


def case_pipe_backlog(sptrace, spdaemon, tier, tmp, pipes, fifo=False):
    """A pipe holding 2 bytes of an untraced writer when a traced one writes
    3 messages of 2 bytes: the reader, injected then, reads the 2 queued
    bytes with the first message in one read, then one message a read.
    Both ends name the same bytes alike (the writer's first byte is 2,
    after the queued ones; the reader's first read 0..4), and flows
    matches each read to the write of its bytes, none before it.  fifo: a
    named pipe, which each end opens by its path."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    wfd = -1
    try:
        if fifo:
            path = os.path.join(tmp, "fifo")
            os.mkfifo(path)
            ino = os.stat(path).st_ino
            rd = cl.hosts.popen(0, [pipes, "reader", path, "1"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        else:
            # a pipe of this script's: the reader gets its read end (this
            # script keeps none), the writer its write end
            rfd, wfd = os.pipe()
            ino = os.fstat(rfd).st_ino
            try:
                rd = cl.hosts.popen(0, [pipes, "reader", "/dev/fd/%d" % rfd, "1"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    pass_fds=[rfd])
            finally:
                os.close(rfd)
            path = "/dev/fd/%d" % wfd
        procs.append(rd)
        check(rd.stdout.readline() == "ready\n", "the reader did not start")
        if fifo:
            wfd = os.open(path, os.O_WRONLY)     # the reader has it open: no wait
        os.write(wfd, b"xy")              # queued before the traced writer comes
        out = os.path.join(tmp, "writer.trace")
        w = cl.hosts.popen(0, [sptrace, "run", "-o", out, "--", pipes, "writer", path, "ab",
                               "cd", "ef"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, pass_fds=[] if fifo else [wfd])
        procs.append(w)
        check(w.stdout.readline() == "wrote 1\n", "the writer did not write")
        rd.stdin.write("go\n")
        rd.stdin.flush()
        wout, werr = w.communicate(timeout=300)
        check(w.returncode == 0, "the traced writer: %r %r\n%s" % (wout, werr, cl.logs()))
        os.close(wfd)
        wfd = -1
        rout, _ = rd.communicate(timeout=60)
        got = [l.split()[2] for l in rout.splitlines() if l.startswith("got ")]
        check(got == [b"xyab".hex(), b"cd".hex(), b"ef".hex()],
              "the reader read %r, not the queued bytes with the first message, then one "
              "message a read" % got)
        session = session_of(werr)
        t = traces(cl.state(0), session)
        check(rd.pid in t, "the reader (pid %d) was not traced: %s\n%s" % (rd.pid, t, cl.logs()))
        with open(os.path.join(t[rd.pid], "agent.log")) as f:
            rlog = f.read()
        check(re.search(r"expecting the read of pipe %d past its 2 bytes queued now \(the "
                        r"writer's byte 2\)" % ino, rlog),
              "the reader did not await the writer's byte 2 past 2 queued:\n%s" % rlog)
        wr = pipe_ranges(sptrace, out, "write", ino)
        rr = pipe_ranges(sptrace, t[rd.pid], "read", ino)
        check(wr == [(2, 4), (4, 6), (6, 8)] and rr == [(0, 4), (4, 6), (6, 8)],
              "the writer's writes %s and the reader's reads %s do not name the same bytes"
              % (wr, rr))
        pipe_flows_clean(sptrace, cl, tmp, out, [rd.pid])
    finally:
        if wfd >= 0:
            os.close(wfd)
        kill_all(procs)
        cl.close()


class SlowInjector:
    """The daemon (its injector) made slow beside the processes it injects:
    its threads at nice 19 on CPU 0, where a busy loop runs 20 ms and
    rests 1 ms; the processes given to spare() run on the other CPUs.  The
    injector then lets the thread it stopped go milliseconds after it made
    the agent's loader thread, whose agent starts meanwhile
    (agent/activate.c, ag_watch_blocked_calls).  Slower, never starved
    (not SCHED_IDLE: other load on CPU 0 would stop it for long)."""

    BUSY = ("import time\n"
            "while True:\n"
            "    t = time.monotonic()\n"
            "    while time.monotonic() - t < 0.02:\n"
            "        pass\n"
            "    time.sleep(0.001)\n")

    def __init__(self, daemon_pid):
        self.pid = daemon_pid
        self.busy = subprocess.Popen([sys.executable, "-c", self.BUSY],
                                     preexec_fn=lambda: os.sched_setaffinity(0, {0}))
        self.daemon(19, {0})

    def daemon(self, nice, cpus):
        for tid in os.listdir("/proc/%d/task" % self.pid):
            try:
                os.sched_setaffinity(int(tid), cpus)
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except ProcessLookupError:
                pass                    # a thread that ended meanwhile

    @staticmethod
    def spare(pids):
        others = os.sched_getaffinity(0) - {0}
        for pid in pids:
            if others:
                os.sched_setaffinity(pid, others)

    def close(self):
        """The daemon as it was (collect, replay at full speed)."""
        if self.busy.poll() is None:
            self.busy.kill()
            self.busy.wait()
            self.daemon(0, os.sched_getaffinity(0))


def case_pipe_readers(sptrace, spdaemon, tier, tmp, pipes, slow=False, unix=False,
                      users=False):
    """Two pre-forked readers of one pipe (a user's server's workers) and a
    traced writer (root's) of 4 messages, each taken whole by one of them: both readers are
    injected, and each read names the bytes of the write that carried what
    it read (their agents share the pipe's count), none before it.  unix:
    the readers hold one end of a connected UNIX stream socketpair, the
    writer the other (the readers' count of the receiving socket; each
    reader counting alone, the second one named its first read 0..2 as the
    first one had).  slow:
    the daemon's injector slowed beside them (SlowInjector): a reader's
    agent mostly starts while the injector still holds its thread, blocked in its
    read before (the agent that waited for that thread to be back in its
    call missed the first read: 10 runs in 10).  users (spd_inject's
    path): the two readers are of two users, 61001 and 61002 (pipes
    usersreader): their agents share the count all the same (the count file
    the daemon made for the first reader's user was refused by the other's
    agent, which counted alone); the daemon gives the count to a process
    that holds the channel's receiving end (a pipe's: opened through the
    reader's /proc/PID/fd), to no other."""
    pipes = reachable_copy(pipes, tmp)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    wfd = -1
    slow_inj = None
    try:
        if slow:
            slow_inj = SlowInjector(cl.daemons[0].p.pid)
        if unix:
            a, b = socketpair_in(cl.hosts, 0)
            rfd, wfd = b.detach(), a.detach()
            wino, ino = os.fstat(wfd).st_ino, os.fstat(rfd).st_ino
            rchan, wchan = "unix %d <- %d" % (ino, wino), "unix %d -> %d" % (wino, ino)
        else:
            rfd, wfd = os.pipe()
            ino = os.fstat(rfd).st_ino
            rchan = wchan = None
        try:
            argv = ([pipes, "usersreader", str(rfd), "61001", "61002"] if users
                    else USER + [pipes, "reader", str(rfd), "2"])
            rd = cl.hosts.popen(0, argv,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                pass_fds=[rfd])
        finally:
            os.close(rfd)
        procs.append(rd)
        check(rd.stdout.readline() == "ready\n", "the readers did not start")
        rd.stdin.write("go\n")
        rd.stdin.flush()
        readers = [rd.pid] + children(rd.pid)
        check(len(readers) == 2, "the readers: %s" % readers)
        if users:
            uids = sorted(os.stat("/proc/%d" % pid).st_uid for pid in readers)
            check(uids == [61001, 61002], "the readers' users: %s" % uids)
        if slow_inj:
            slow_inj.spare(readers)
        msgs = ["ab", "cd", "ef", "gh"]
        out = os.path.join(tmp, "writer.trace")
        # slow: the writer waits for the slowed injector as long as it takes
        wait = ["--propagate-wait", "120000"] if slow else []
        w = cl.hosts.run(0, [sptrace, "run", "-o", out] + wait + ["--", pipes, "writer",
                                                                   str(wfd)] + msgs,
                         timeout=300, pass_fds=[wfd])
        if slow_inj:
            slow_inj.close()
        check(w.returncode == 0, "the traced writer: %r %r\n%s" % (w.stdout, w.stderr,
                                                                    cl.logs()))
        if users:
            session = session_of(w.stderr)
            # the readers are still there (this script holds the write end)
            what = ["unix" if unix else "pipe", str(ino)]
            r = cl.hosts.run(0, [users, "count", session] + what, timeout=60)
            check(r.returncode == 1 and re.search(r"error: pid \d+ holds no (read end of pipe|"
                                                  r"UNIX socket) %d" % ino, r.stdout),
                  "a process without the receiving end asked for the readers' count: "
                  "%r %r" % (r.stdout, r.stderr))
            if not unix:
                with open("/proc/%d/fd/%d" % (rd.pid, rfd), "rb", buffering=0) as held:
                    r = cl.hosts.run(0, [users, "count", session] + what, timeout=60,
                                     stdin=held)
                check(r.returncode == 0 and "count session %s's pipe-%d-read" % (session, ino)
                      in r.stdout, "a holder of the read end asked for the readers' count: "
                      "%r %r" % (r.stdout, r.stderr))
        os.close(wfd)
        wfd = -1
        rout, _ = rd.communicate(timeout=60)
        got = {}
        for line in rout.splitlines():
            if line.startswith("got "):
                _, pid, data = line.split()
                got.setdefault(int(pid), []).append(bytes.fromhex(data).decode())
        t = traces(cl.state(0), session_of(w.stderr))
        check(sorted(sum(got.values(), [])) == msgs and len(got) == 2,
              "the readers read %r, not each message whole, each some (their exit: %s)\n"
              "%s\n%s" % (got, rd.returncode, agent_logs(t, readers), cl.logs()))
        wr = pipe_ranges(sptrace, out, "write", ino, wchan)
        check(len(wr) == len(msgs), "the writer's writes: %s" % wr)
        sent = dict(zip(wr, msgs))
        named = {pid: pipe_ranges(sptrace, t[pid], "read", ino, rchan) for pid in readers
                 if pid in t}
        for pid in readers:
            check(pid in t, "reader %d was not traced: %s\n%s" % (pid, t, cl.logs()))
            rr = named[pid]
            check([sent.get(r) for r in rr] == got.get(pid, []),
                  "reader %d read %r, but its reads name %s, the writer's writes %s\n"
                  "every reader's reads: %s, named %s\n%s\n%s" %
                  (pid, got.get(pid), rr, sent, got, named, agent_logs(t, readers),
                   cl.logs()))
        if users:
            logs = cl.logs()
            for pid in readers:
                check(re.search(r"pid %d \(uid \d+\) gets the count the readers of" % pid, logs),
                      "reader %d did not get its readers' count from the daemon:\n%s"
                      % (pid, logs))
        pipe_flows_clean(sptrace, cl, tmp, out, readers)
    finally:
        if slow_inj:
            slow_inj.close()
        if wfd >= 0:
            os.close(wfd)
        kill_all(procs)
        cl.close()


def case_forked(sptrace, spdaemon, tier, tmp):
    """A backend that forks a child per connection, after the agent came:
    the request's connection, not accepted yet when the client sends, gets
    the agent into the listening parent, whose child serves it.  The child
    is traced from the request's receive (its records in the parent's
    trace, on the daemon's host), `sptrace collect` brings them, and the
    client's flow goes through the child's work."""
    prog = reachable_copy(tier, tmp)
    cl = Cluster(sptrace, spdaemon, tmp, 2)
    procs = {}
    try:
        back = start(cl.hosts, 1, [prog, "forkbackend", "7002"])
        procs["backend"] = back
        out = os.path.join(tmp, "client.trace")
        r = cl.hosts.run(0, [sptrace, "run", "--on", "start", "-o", out, "--", prog, "client",
                             cl.hosts.addrs[1], "7002", "3", "5"], timeout=300)
        check(r.returncode == 0 and r.stdout.startswith("backend 3 -> "),
              "the traced client: %r %r\n%s" % (r.stdout, r.stderr, cl.logs()))
        session = session_of(r.stderr)
        o = finish(back)
        procs = {}
        m = re.search(r"^child (\d+) got (\S+)$", o, re.M)
        check(m and bytes.fromhex(m.group(2)) == b"3\n5\n", "the child's bytes: %r" % o)
        child = int(m.group(1))
        t = traces(cl.state(1), session)
        check(back.pid in t, "the backend (pid %d) was not traced: %s\n%s" %
              (back.pid, t, cl.logs()))
        rr = run([sptrace, "replay", t[back.pid]], timeout=300)
        check(rr.returncode == 0 and re.search(r"\[ *%d\] .*backend_line" % child, rr.stdout),
              "the child %d's work is not in the backend's trace:\n%s" %
              (child, (rr.stdout + rr.stderr)[-3000:]))
        coll = collected(sptrace, cl.hosts, tmp, out, {cl.hosts.addrs[1]: [back.pid]}, [])
        fl = run([sptrace, "flows", "--json", coll], timeout=300)
        check(fl.returncode == 0, "flows: %r" % fl.stderr[-1000:])
        import json
        flows = json.loads(fl.stdout)["flows"]
        procs_of = [{(p["host"], p["pid"]) for p in f["processes"]} for f in flows]
        check(len(flows) == 1 and (cl.hosts.addrs[1], child) in procs_of[0],
              "the client's flow does not go through the child %d: %s" % (child, fl.stdout))
    finally:
        kill_all(procs.values())
        cl.close()


def case_pipe_writers(sptrace, spdaemon, tier, tmp, pipes):
    """Two writers of one pipe, forked one after the other by a traced
    process (pre-forked workers sharing its descriptor), 2 messages each,
    to an injected reader: the writers count the pipe's bytes together, so
    every write names bytes of its own and each read the bytes of the write
    that carried them."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    wfd = -1
    try:
        rfd, wfd = os.pipe()
        ino = os.fstat(rfd).st_ino
        try:
            rd = cl.hosts.popen(0, [pipes, "reader", str(rfd), "1"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, pass_fds=[rfd])
        finally:
            os.close(rfd)
        procs.append(rd)
        check(rd.stdout.readline() == "ready\n", "the reader did not start")
        rd.stdin.write("go\n")
        rd.stdin.flush()
        msgs = ["ab", "cd", "ef", "gh"]
        out = os.path.join(tmp, "writer.trace")
        w = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", pipes, "writers", str(wfd), "2"] +
                         msgs, timeout=300, pass_fds=[wfd])
        check(w.returncode == 0, "the traced writers: %r %r\n%s" % (w.stdout, w.stderr,
                                                                     cl.logs()))
        os.close(wfd)
        wfd = -1
        rout, _ = rd.communicate(timeout=60)
        got = [bytes.fromhex(l.split()[2]).decode() for l in rout.splitlines()
               if l.startswith("got ")]
        check(got == msgs[0::2] + msgs[1::2], "the reader read %r" % got)
        t = traces(cl.state(0), session_of(w.stderr))
        check(rd.pid in t, "the reader (pid %d) was not traced: %s\n%s" % (rd.pid, t, cl.logs()))
        r = run([sptrace, "replay", out], timeout=300)
        by_tid = {}
        for tid, a, b in re.findall(r"\[ *(\d+)\] .*write\(pipe %d, bytes (\d+)\.\.(\d+)\)" %
                                    ino, r.stdout):
            by_tid.setdefault(int(tid), []).append((int(a), int(b)))
        check(len(by_tid) == 2, "the writers' writes, by thread: %s" % by_tid)
        first, second = [by_tid[k] for k in sorted(by_tid)]
        sent = dict(zip(first, msgs[0::2]))
        sent.update(zip(second, msgs[1::2]))
        rr = pipe_ranges(sptrace, t[rd.pid], "read", ino)
        check(len(sent) == 4 and [sent.get(x) for x in rr] == got,
              "the reads %s name other bytes than the writes: %s and %s" % (rr, first, second))
        pipe_flows_clean(sptrace, cl, tmp, out, [rd.pid])
    finally:
        if wfd >= 0:
            os.close(wfd)
        kill_all(procs)
        cl.close()


def socketpair_in(hosts, i):
    """A connected UNIX stream socketpair of host i's network namespace
    (sock_diag, the agents' and the daemon's, sees only its own): made with
    this thread in it for the instant, then back."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open("/run/netns/" + hosts.names[i], os.O_RDONLY)
    try:
        if libc.setns(there, 0x40000000) != 0:          # CLONE_NEWNET
            fail("setns %s: %s" % (hosts.names[i], os.strerror(ctypes.get_errno())))
        try:
            return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        finally:
            check(libc.setns(own, 0x40000000) == 0, "setns back: %s" %
                  os.strerror(ctypes.get_errno()))
    finally:
        os.close(own)
        os.close(there)


def start_unix_reader(cl, pipes, rsock, procs):
    """`pipes reader` on host 0 reading rsock, the socketpair end it alone
    then holds, started and told to go (it reads once the writers write)."""
    rfd = rsock.fileno()
    rd = cl.hosts.popen(0, [pipes, "reader", str(rfd), "1"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True, pass_fds=[rfd])
    rsock.close()
    procs.append(rd)
    check(rd.stdout.readline() == "ready\n", "the reader did not start")
    rd.stdin.write("go\n")
    rd.stdin.flush()
    return rd


def case_unix_writers(sptrace, spdaemon, tier, tmp, pipes):
    """Two writers of one connected UNIX stream socket -- programs a traced
    shell exec'd one after the other, sharing no memory, 2 messages each --
    to an injected reader of its peer (a socketpair's two ends): the second
    one's request gets the count the session's writers share
    (the daemon's), so each read names the bytes of the write
    that carried them (each writer counting alone, the second one named its
    first write 0..2, as the first one had)."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    wsock, rsock = socketpair_in(cl.hosts, 0)
    try:
        wino, rino = os.fstat(wsock.fileno()).st_ino, os.fstat(rsock.fileno()).st_ino
        rd = start_unix_reader(cl, pipes, rsock, procs)
        msgs = ["ab", "cd", "ef", "gh"]
        out = os.path.join(tmp, "writers.trace")
        wfd = wsock.fileno()
        sh = "%s writer %d %s %s & echo $!; wait; %s writer %d %s %s & echo $!; wait" % (
            pipes, wfd, msgs[0], msgs[1], pipes, wfd, msgs[2], msgs[3])
        w = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", "sh", "-c", sh], timeout=300,
                         pass_fds=[wfd])
        check(w.returncode == 0, "the traced writers: %r %r\n%s" % (w.stdout, w.stderr,
                                                                     cl.logs()))
        wsock.close()                 # the reader's end of stream
        rout, _ = rd.communicate(timeout=60)
        got = [bytes.fromhex(l.split()[2]).decode() for l in rout.splitlines()
               if l.startswith("got ")]
        check(got == msgs, "the reader read %r" % got)
        pids = [int(l) for l in w.stdout.splitlines() if l.isdigit()]
        check(len(pids) == 2, "the writers' pids: %r" % w.stdout)
        t = traces(cl.state(0), session_of(w.stderr))
        check(rd.pid in t, "the reader (pid %d) was not traced: %s\n%s" % (rd.pid, t, cl.logs()))
        sent, each = {}, {}
        for pid, ms in zip(pids, (msgs[:2], msgs[2:])):
            # an image the shell exec'd: OUT/exec.PID.N
            d = [os.path.join(out, n) for n in os.listdir(out)
                 if re.match(r"exec\.%d\.\d+$" % pid, n)]
            check(len(d) == 1, "writer %d's trace in %s: %s" % (pid, out, os.listdir(out)))
            each[pid] = pipe_ranges(sptrace, d[0], "write", wino, "unix %d -> %d" % (wino, rino))
            check(len(each[pid]) == len(ms), "writer %d's writes: %s" % (pid, each[pid]))
            sent.update(zip(each[pid], ms))
        reads = pipe_ranges(sptrace, t[rd.pid], "read", rino, "unix %d <- %d" % (rino, wino))
        check(len(sent) == 4 and [sent.get(x) for x in reads] == got,
              "the reads %s name other bytes than the writes %s (writer: its writes)\n%s\n%s" %
              (reads, each, agent_logs(t, [rd.pid]), cl.logs()))
        pipe_flows_clean(sptrace, cl, tmp, out, [rd.pid])
    finally:
        wsock.close()
        rsock.close()
        kill_all(procs)
        cl.close()


def case_unix_forked_writers(sptrace, spdaemon, tier, tmp, pipes, early=False):
    """A traced process writes one message into a connected UNIX stream
    socket (one end of a socketpair), then forks a child that writes two
    more, to an injected reader of its peer: the child knows no peer
    (msgs.c, unix_peer) and asks nothing, but takes the writers' count its
    parent took (the daemon's), so each read names the bytes of
    its write (counting alone, the child named its first write 0..2, as the
    parent had).  early: the child is forked before the parent's first
    write (pipes earlywriters): it takes no count from its parent, and asks
    the daemon with its own socket alone, whose peer the daemon finds
    (counting alone, the child named its first write 0..2, as the parent
    had)."""
    os.chmod(tmp, 0o755)
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    wsock, rsock = socketpair_in(cl.hosts, 0)
    try:
        wino, rino = os.fstat(wsock.fileno()).st_ino, os.fstat(rsock.fileno()).st_ino
        rd = start_unix_reader(cl, pipes, rsock, procs)
        msgs = ["ab", "cd", "ef"]
        out = os.path.join(tmp, "writers.trace")
        wfd = wsock.fileno()
        mode = ["earlywriters", str(wfd)] if early else ["leadwriters", str(wfd), "1"]
        w = cl.hosts.run(0, [sptrace, "run", "-o", out, "--", pipes] + mode + msgs,
                         timeout=300, pass_fds=[wfd])
        check(w.returncode == 0, "the traced writers: %r %r\n%s" % (w.stdout, w.stderr,
                                                                     cl.logs()))
        wsock.close()                 # the reader's end of stream
        rout, _ = rd.communicate(timeout=60)
        got = [bytes.fromhex(l.split()[2]).decode() for l in rout.splitlines()
               if l.startswith("got ")]
        check(got == msgs, "the reader read %r" % got)
        t = traces(cl.state(0), session_of(w.stderr))
        check(rd.pid in t, "the reader (pid %d) was not traced: %s\n%s" % (rd.pid, t, cl.logs()))
        r = run([sptrace, "replay", out], timeout=300)
        by_tid = {}
        for tid, a, b in re.findall(r"\[ *(\d+)\] .*write\(unix %d(?: -> %d)?, bytes "
                                    r"(\d+)\.\.(\d+)\)" % (wino, rino), r.stdout):
            by_tid.setdefault(int(tid), []).append((int(a), int(b)))
        check(sorted(len(v) for v in by_tid.values()) == [1, 2],
              "the writes, by thread (the parent's one, the child's two): %s" % by_tid)
        parent, child = sorted(by_tid.values(), key=len)
        if early:
            logs = cl.logs()
            check(len(re.findall(r"gets the count its writers share", logs)) == 2,
                  "the parent and the child did not each get the writers' count:\n%s" % logs)
        sent = dict(zip(parent + child, msgs))
        reads = pipe_ranges(sptrace, t[rd.pid], "read", rino, "unix %d <- %d" % (rino, wino))
        check(len(sent) == 3 and [sent.get(x) for x in reads] == got,
              "the reads %s name other bytes than the writes: the parent's %s, the child's %s"
              "\n%s\n%s" % (reads, parent, child, agent_logs(t, [rd.pid]), cl.logs()))
        pipe_flows_clean(sptrace, cl, tmp, out, [rd.pid])
    finally:
        wsock.close()
        rsock.close()
        kill_all(procs)
        cl.close()


def case_pipe_fifo(sptrace, spdaemon, tier, tmp, pipes):
    """pipe-backlog over a named pipe (mkfifo): its holders' descriptors name
    its path, not its inode."""
    case_pipe_backlog(sptrace, spdaemon, tier, tmp, pipes, fifo=True)


def open_turns(path, proc):
    """The write end of control FIFO `path`, once `proc`'s side opened it to
    read (bounded: proc may have ended first)."""
    for _ in range(3000):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        if proc.poll() is not None:
            fail("%s ended before it read %s: %r" % (proc.args, path,
                                                      proc.communicate(timeout=60)))
        time.sleep(0.1)
    fail("no one opened %s to read within 300 s" % path)


def fifo_writers(sptrace, spdaemon, tmp, pipes, writers, reader_prefix, flows_clean):
    """Two traced writers of one named pipe, programs a traced shell exec'd
    apart (`pipes WRITER PATH MSG MSG`, WRITER each of `writers`), taking
    turns, 2 messages each, to a reader (`reader_prefix` + `pipes reader`)
    that the first one's first write injects: each read must name the bytes
    of the write that carried them, whichever writer's."""
    cl = Cluster(sptrace, spdaemon, tmp, 1)
    procs = []
    turns = []
    wfd = -1
    try:
        path = os.path.join(tmp, "fifo")
        os.mkfifo(path)
        os.chmod(path, 0o666)
        ino = os.stat(path).st_ino
        rd = cl.hosts.popen(0, reader_prefix + [pipes, "reader", path, "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(rd)
        check(rd.stdout.readline() == "ready\n", "the reader did not start")
        # a write end of this script's (it writes nothing): no end of file
        # for the reader between the writers
        wfd = os.open(path, os.O_WRONLY)
        rd.stdin.write("go\n")
        rd.stdin.flush()
        ctl = [os.path.join(tmp, "turn%d" % i) for i in (1, 2)]
        for c in ctl:
            os.mkfifo(c)
        out = os.path.join(tmp, "writers.trace")
        msgs = ["ab", "cd", "ef", "gh"]
        sh = "%s %s %s %s %s <%s & %s %s %s %s %s <%s; wait" % (
            pipes, writers[0], path, msgs[0], msgs[2], ctl[0],
            pipes, writers[1], path, msgs[1], msgs[3], ctl[1])
        w = cl.hosts.popen(0, [sptrace, "run", "-o", out, "--", "sh", "-c", sh],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(w)
        turns = [open_turns(c, w) for c in ctl]
        wrote = {}
        got = []
        for i, m in enumerate(msgs):
            os.write(turns[i % 2], b"\n")
            line = w.stdout.readline()
            mm = re.match(r"wrote (\d+) \d+$", line)
            if not mm:
                w.kill()
                fail("writer %d did not write %s: %r %r" % (i % 2 + 1, m, line,
                                                            w.communicate()[1][-2000:]))
            wrote.setdefault(int(mm.group(1)), []).append(m)
            line = rd.stdout.readline()
            check(line.startswith("got "), "the reader did not read %s: %r" % (m, line))
            got.append(bytes.fromhex(line.split()[2]).decode())
        for fd in turns:
            os.close(fd)
        turns = []
        wout, werr = w.communicate(timeout=300)
        os.close(wfd)
        wfd = -1
        check(w.returncode == 0, "the traced writers: %r %r\n%s" % (wout, werr, cl.logs()))
        rd.communicate(timeout=60)
        check(got == msgs and len(wrote) == 2,
              "the reader read %r, the writers wrote %s" % (got, wrote))
        t = traces(cl.state(0), session_of(werr))
        check(rd.pid in t, "the reader (pid %d) was not traced: %s\n%s" % (rd.pid, t, cl.logs()))
        sent, each = {}, {}
        for pid, ms in wrote.items():
            # an image the shell exec'd: OUT/exec.PID.N
            d = [os.path.join(out, n) for n in os.listdir(out)
                 if re.match(r"exec\.%d\.\d+$" % pid, n)]
            check(len(d) == 1, "writer %d's trace in %s: %s" % (pid, out, os.listdir(out)))
            each[pid] = pipe_ranges(sptrace, d[0], "write", ino)
            check(len(each[pid]) == len(ms), "writer %d's writes: %s" % (pid, each[pid]))
            sent.update(zip(each[pid], ms))
        rr = pipe_ranges(sptrace, t[rd.pid], "read", ino)
        check(len(sent) == 4 and [sent.get(x) for x in rr] == got,
              "the reads %s name other bytes than the writes %s (writer: its writes)\n%s\n%s" %
              (rr, each, agent_logs(t, [rd.pid]), cl.logs()))
        if flows_clean:
            pipe_flows_clean(sptrace, cl, tmp, out, [rd.pid])
    finally:
        for fd in turns + [wfd]:
            if fd >= 0:
                os.close(fd)
        kill_all(procs)
        cl.close()


def case_pipe_fifo_writers(sptrace, spdaemon, tier, tmp, pipes):
    """Two unrelated traced writers of one named pipe -- programs a traced
    shell exec'd apart, sharing no memory, each opening the pipe by its
    path -- taking turns, 2 messages each, to a reader (untraced) that the
    first one's first write injects: the second one's request gets the
    count the session's writers share (the daemon's), so each
    read names the bytes of the write that carried them, whichever
    writer's (each writer counting alone, the second one named its first
    write 0..2, as the first one had)."""
    os.chmod(tmp, 0o755)
    fifo_writers(sptrace, spdaemon, tmp, pipes, ["stepwriter", "stepwriter"], [], True)


def case_pipe_users_writers(sptrace, spdaemon, tier, tmp, pipes):
    """pipe-fifo-writers with writers of two users: a traced shell (root's)
    runs two writers that become uid 61001 and uid 61002, taking
    turns on one named pipe, to a reader of uid 61001 that the first one's
    first write injects.  The second user's request gets the writers'
    count all the same (a sealed memfd of the daemon's, passed with the
    answer), so each read names the bytes of the write that carried them,
    whichever user's (with a count file of the first user's, the second
    user's agent counted alone and named its first write 0..2, as the first
    one had)."""
    pipes = reachable_copy(pipes, tmp)
    fifo_writers(sptrace, spdaemon, tmp, pipes, ["userwriter 61001", "userwriter 61002"], USER,
                 False)


class TiersSession:
    """The tiers application over three namespace hosts, a request of the
    client on host 0 followed (`sptrace run --on start`), its servers
    stopped and the session collected: for the analyses' tests (flows,
    export).  .out is the collected tree, .trace the client's trace, .pids
    the servers' ({"frontend": pid, ...}), .helper the frontend's helper's
    pid, .addrs the hosts' addresses.  close() removes the hosts.  mark:
    `run --mark`."""

    def __init__(self, sptrace, spdaemon, tier, tmp, requests=("3", "5", "8"), mark=None):
        prog = reachable_copy(tier, tmp)
        self.cl = Cluster(sptrace, spdaemon, tmp, 3)
        self.addrs = self.cl.hosts.addrs
        procs = {}
        try:
            procs = servers(self.cl.hosts, prog, tmp)
            self.trace = os.path.join(tmp, "client.trace")
            r = self.cl.hosts.run(0, [sptrace, "run", "--on", "start", "-o", self.trace] +
                                  (["--mark", mark] if mark else []) +
                                  ["--", prog, "client", self.addrs[1], "7000"] + list(requests),
                                  timeout=300)
            check(r.returncode == 0, "the traced client: %r" % r.stderr[-2000:])
            self.pids = {name: p.pid for name, p in procs.items()}
            helper = children(self.pids["frontend"])
            check(len(helper) == 1, "the frontend's helper: %s" % helper)
            self.helper = helper[0]
            stop_all(procs)
            procs = {}
            self.out = os.path.join(tmp, "collected")
            r = self.cl.hosts.run(0, [sptrace, "collect", "-o", self.out, self.trace],
                                  timeout=300)
            check(r.returncode == 0, "sptrace collect: %r %r" % (r.stdout, r.stderr))
        except BaseException:
            kill_all(procs.values())
            self.cl.close()
            raise

    def close(self):
        self.cl.close()


def case_nodaemon(sptrace, spdaemon, tier, tmp):
    hosts = Hosts(2)
    procs = {}
    try:
        back = start(hosts, 1, [tier, "backend", "7002"], user=False)
        out = os.path.join(tmp, "client.trace")
        r = hosts.run(0, [sptrace, "run", "-o", out, "--", tier, "client", hosts.addrs[1],
                          "7002", "4"], timeout=300)
        check(r.returncode == 0 and r.stdout.startswith("backend 4 -> "),
              "the client without a daemon: %r %r" % (r.stdout, r.stderr))
        check("session" not in r.stderr and "session" not in meta(out),
              "run speaks of a session with no daemon: %r" % r.stderr)
        finish(back)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        hosts.close()


def main():
    if len(sys.argv) not in (5, 6, 7):
        fail(__doc__)
    in_own_netns()
    case, sptrace, spdaemon, tier = sys.argv[1:5]
    # PIPES, for the pipe-* cases; SPD_INJECT too, for the *-users-readers ones
    progs = [os.path.abspath(p) for p in sys.argv[5:]]
    tmp = tempfile.mkdtemp(prefix="sptrace-prop-")
    try:
        {"tiers": case_tiers, "nodaemon": case_nodaemon,
         "oob": lambda *a: case_tiers(*a, mark="oob"), "unixdgram": case_unixdgram,
         "late": lambda *a: case_tiers(*a, hold_ms=400),
         "oobinline": lambda *a: case_tiers(*a, mark="oob", oobinline=True), "chain": case_chain,
         "redis": case_redis, "policy": case_policy, "killed": case_killed,
         "unix": case_unix, "attach": case_attach, "silent": case_silent,
         "pipe-backlog": case_pipe_backlog, "pipe-readers": case_pipe_readers,
         "pipe-readers-slow": lambda *a: case_pipe_readers(*a, slow=True),
         "forked": case_forked, "pipe-fifo": case_pipe_fifo,
         "pipe-writers": case_pipe_writers, "unix-writers": case_unix_writers,
         "unix-readers": lambda *a: case_pipe_readers(*a, unix=True),
         "pipe-users-readers": lambda *a: case_pipe_readers(*a[:5], users=a[5]),
         "unix-users-readers": lambda *a: case_pipe_readers(*a[:5], unix=True, users=a[5]),
         "unix-forked-writers": case_unix_forked_writers,
         "unix-early-writers": lambda *a: case_unix_forked_writers(*a, early=True),
         "pipe-fifo-writers": case_pipe_fifo_writers,
         "pipe-users-writers": case_pipe_users_writers}[case](
            os.path.abspath(sptrace), os.path.abspath(spdaemon), os.path.abspath(tier), tmp,
            *progs)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
