#!/usr/bin/env python3
"""test_attach.py SPTRACE CASE [PROG...] — `sptrace attach` on running processes.

  blocked PROG      attach_target: threads blocked in accept, read, epoll_wait,
                    nanosleep and a condition variable, 16 busy threads; attach
                    (tracing at once), stop, activate, stop while a client
                    keeps asking: no EINTR, no early wake-up, no wrong answer,
                    no failed request; code restored after each stop
  accept PROG       --on accept (attached and under sptrace run): the thread
                    whose accept returns traces from there, alone
  recv-read PROG    --on recv (attached and under sptrace run) when the
                    server read()s its connection: a read of its standard
                    input (a pipe) starts nothing, the first read of a socket
                    starts the serving thread's trace, alone
  http              Debian's python3.11 -m http.server under a load of HTTP
                    requests: attach, stop, activate, stop; no request fails
  redis             Debian's redis-server under redis-benchmark: attach --on
                    accept, stop, activate, stop; no request fails
  haproxy           Debian's haproxy, four threads that block every signal, under
                    HTTP load: attach, stop, activate, stop; it lives on
  nginx             Debian's nginx (master, two pre-forked workers) under HTTP
                    load: attach --on accept to one worker, stop, activate, stop
  errors SLEEPER STATIC
                    the refusals, each naming the pid and what to do
  stopped SLEEPER   a process stopped by SIGSTOP: refused at once, saying to
                    send SIGCONT; nothing loads later, and after SIGCONT attach
                    and stop work
  own-syscalls PROG rawwait: every thread waits in a system call made from the
                    program's own code: refused, naming each thread, its call
                    and the module it was made from; nothing loaded
  go-cgo            a Go net/http server with cgo (tests/progs/cgo_http.go),
                    whose threads wait in system calls made by the Go runtime:
                    attach under requests, stop; no request fails
"""
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from e2elib import check, fail, free_port, patched_soon, private_repo_env

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_run import text_differences  # noqa: E402


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300, **kw)


def http_asker(url, body):
    """A request for Load: GET url, which must answer body."""
    def ask():
        with urllib.request.urlopen(url, timeout=10) as r:
            if r.read() != body:
                raise ValueError("wrong body")
    return ask


class Load(threading.Thread):
    """Asks `ask()` again and again until stopped; counts answers and failures."""

    def __init__(self, ask):
        super().__init__(daemon=True)
        self.ask, self.ok, self.failed, self.errors = ask, 0, 0, []
        self.stopping = False

    def run(self):
        while not self.stopping:
            try:
                self.ask()
                self.ok += 1
            except Exception as e:  # noqa: BLE001 - every failure counts
                self.failed += 1
                self.errors.append(repr(e))
            time.sleep(0.005)

    def stop(self):
        self.stopping = True
        self.join(30)


def cycle(sptrace, pid, tdir, tmp, load):
    """attach (tracing at once), stop, activate, stop -- under load."""
    r = run([sptrace, "attach", "-o", tdir, str(pid)], env=private_repo_env(tmp))
    check(r.returncode == 0 and "attached to pid %d" % pid in r.stdout,
          "sptrace attach %d: %d %r %r" % (pid, r.returncode, r.stdout, r.stderr))
    m = re.search(r"in ([\d.]+) ms \(thread \d+ stopped for ([\d.]+) ms\)", r.stdout)
    check(m, "attach does not say how long it took: %r" % r.stdout)
    print("attach %s ms, pause %s ms" % (m.group(1), m.group(2)))
    # Right after the activation the target instruments what it reaches
    # first: on a loaded 2-CPU machine that can take a while.  It must
    # go on answering.
    before = load.ok
    deadline = time.monotonic() + 20
    while load.ok <= before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    check(load.ok > before + 2, "the target stopped answering while traced")
    check(patched_soon(pid), "attached and tracing, yet no code is patched")
    r = run([sptrace, "stop", str(pid)])
    check(r.returncode == 0, "sptrace stop: %r" % r.stderr)
    diff = text_differences(pid)
    check(not diff, "after sptrace stop the code differs from the files: %r" % diff)
    r = run([sptrace, "activate", str(pid)])
    check(r.returncode == 0, "sptrace activate: %r" % r.stderr)
    time.sleep(0.3)
    r = run([sptrace, "stop", str(pid)])
    check(r.returncode == 0 and not text_differences(pid), "second stop: %r" % r.stderr)
    r = run([sptrace, "attach", str(pid)], env=private_repo_env(tmp))
    check(r.returncode == 1 and "already has the sptrace agent" in r.stderr,
          "attach twice: %r" % r.stderr)
    check(load.failed == 0, "%d requests failed: %s" % (load.failed, load.errors[:5]))


def case_blocked(sptrace, prog, tmp):
    p = subprocess.Popen([prog], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        check(p.stdout.readline() == "ready\n", "attach_target did not start")

        def ask():
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"1000")
                s.shutdown(socket.SHUT_WR)
                got = s.recv(100)
                if got != b"%d\n" % sum(i * 7 % 13 for i in range(1000)):
                    raise ValueError("answer %r" % got)

        load = Load(ask)
        load.start()
        tdir = os.path.join(tmp, "trace")
        cycle(sptrace, p.pid, tdir, tmp, load)
        load.stop()
        out, _ = p.communicate(input="", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    m = re.match(r"eintr (\d+) early (\d+) wrong (\d+) served (\d+)", out)
    check(m, "attach_target's report: %r" % out)
    check(m.group(1) == "0", "a system call of the target failed with EINTR: %r" % out)
    check(m.group(2) == "0", "a sleep or a timed wait of the target ended early: %r" % out)
    check(m.group(3) == "0", "the target computed a wrong result: %r" % out)
    check(p.returncode == 0, "attach_target exited with %d" % p.returncode)
    # Busy threads were caught running and walked; sleeping ones on waking.
    log = open(os.path.join(tdir, "agent.log")).read()
    check("reached by signal" in log and "reached by breakpoint after its system call" in log,
          "the activation did not reach both running and sleeping threads:\n" + log)
    r = run([sptrace, "replay", tdir], env=private_repo_env(tmp))
    check(r.returncode == 0 and "busy() {" in r.stdout and "serve() {" in r.stdout,
          "the replay lacks the busy threads or the served requests: %s" % r.stderr[-500:])


def start_dormant(sptrace, prog, tmp, how, event, tdir):
    """attach_target waiting for `event`: attached to (how "attach") or
    started under sptrace run; the Popen and its port."""
    if how == "attach":
        p = subprocess.Popen([prog], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    else:
        p = subprocess.Popen([sptrace, "run", "--on", event, "-o", tdir, "--", prog],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=private_repo_env(tmp))
    try:
        port = int(p.stdout.readline())
        check(p.stdout.readline() == "ready\n", "attach_target did not start")
        if how == "attach":
            r = run([sptrace, "attach", "--on", event, "-o", tdir, str(p.pid)],
                    env=private_repo_env(tmp))
            check(r.returncode == 0 and "dormant until the event" in r.stdout,
                  "attach --on %s: %r %r" % (event, r.stdout, r.stderr))
    except BaseException:
        p.kill()
        p.communicate()
        raise
    return p, port


def ask_work(port):
    """One request to attach_target: 100, whose answer it computes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"100")
        s.shutdown(socket.SHUT_WR)
        check(s.recv(100) == b"%d\n" % sum(i * 7 % 13 for i in range(100)), "wrong answer")


def one_thread_tree(sptrace, tmp, tdir, what):
    """The replay of the one thread recorded in tdir, as lines."""
    rings = [f for f in os.listdir(tdir) if f.startswith("ring.")]
    check(len(rings) == 1, "%s: %d threads recorded, want the server's only: %r"
          % (what, len(rings), rings))
    r = run([sptrace, "replay", tdir], env=private_repo_env(tmp))
    check(r.returncode == 0, "%s: replay failed: %r" % (what, r.stderr[-500:]))
    return [l.split("| ", 1)[1].strip() for l in r.stdout.splitlines() if "| " in l]


def case_accept(sptrace, prog, tmp):
    """--on accept: the agent waits (dormant, attached or under sptrace run)
    until a thread's accept returns a connection; that thread traces from
    there, the accept recorded first; with --threads event (the default) the
    16 busy threads record nothing."""
    for how in ("attach", "run"):
        tdir = os.path.join(tmp, how)
        p, port = start_dormant(sptrace, prog, tmp, how, "accept", tdir)
        try:
            time.sleep(0.3)
            check(not [f for f in os.listdir(tdir) if f.startswith("ring.")],
                  "%s --on accept: records before any connection" % how)
            for _ in range(3):
                ask_work(port)
            if how == "attach":
                # After a stop the event is spent: the next accept does not
                # start tracing again (sptrace activate does).
                r = run([sptrace, "stop", str(p.pid)])
                check(r.returncode == 0, "stop: %r" % r.stderr)
                ask_work(port)
                time.sleep(0.2)
                check(open(os.path.join(tdir, "meta")).read().count("\nactivated ") == 1 and
                      not text_differences(p.pid), "an accept after the stop traced again")
            out, _ = p.communicate(input="", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        check(re.match(r"eintr 0 early 0 wrong 0 served [34]\n", out), "%s: report %r" % (how, out))
        lines = one_thread_tree(sptrace, tmp, tdir, "%s --on accept" % how)
        check("acceptor() {" in lines and "/* accept */" in lines and
              lines.count("serve() {") >= 3,
              "%s --on accept: the acceptor's trace (%d serve() calls, want 3):\n%s\n...\n%s"
              "\nagent.log:\n%s" % (how, lines.count("serve() {"), "\n".join(lines[:20]),
                                    "\n".join(lines[-30:]),
                                    open(os.path.join(tdir, "agent.log")).read()[-3000:]))
        check(lines.index("/* accept */") < lines.index("serve() {"),
              "%s: the accept is not the start of the flow" % how)


def case_http(sptrace, tmp):
    py = "/usr/bin/python3.11"
    if not os.path.exists(py):
        fail("%s is missing; install the Debian package python3.11 (test.sh does)" % py)
    root = os.path.join(tmp, "www")
    os.mkdir(root)
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write("hello from http.server\n")
    p = subprocess.Popen([py, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                          "--directory", root], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"port (\d+)", line)
        check(m, "http.server did not say its port: %r" % line)
        url = "http://127.0.0.1:%s/index.html" % m.group(1)

        ask = http_asker(url, b"hello from http.server\n")

        ask()
        load = Load(ask)
        load.start()
        tdir = os.path.join(tmp, "trace")
        cycle(sptrace, p.pid, tdir, tmp, load)
        load.stop()
        check(load.ok > 20, "only %d requests were answered" % load.ok)
    finally:
        p.kill()
        p.wait()
    r = run([sptrace, "replay", tdir], env=private_repo_env(tmp))
    check(r.returncode == 0 and "_PyEval_EvalFrameDefault() {" in r.stdout,
          "the replay of http.server shows no interpreter calls: %s" % r.stderr[-500:])


def case_redis(sptrace, tmp):
    """Debian's redis-server (an epoll event loop) under redis-benchmark and
    a client of our own that opens a new connection per request: attach
    --on accept -- the event loop's accept of the next connection starts
    tracing on its thread --, stop, activate, stop.  No request fails, and
    the code is the files' after each stop."""
    for tool in ("redis-server", "redis-benchmark"):
        if not shutil.which(tool):
            fail("%s is missing; install the Debian packages redis-server and redis-tools "
                 "(scripts/install-deps.sh does)" % tool)
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", tmp, "--daemonize", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench = None
    try:
        for _ in range(250):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)

        def ask():
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                c.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
                got = b""
                while got.count(b"\r\n") < 3:
                    chunk = c.recv(100)
                    if not chunk:
                        break
                    got += chunk
                if got != b"+OK\r\n$1\r\nv\r\n":
                    raise ValueError("answer %r" % got)

        ask()
        bench = subprocess.Popen(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n",
                                  "2000000", "-c", "20", "-t", "get,set", "-q"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        load = Load(ask)
        load.start()
        time.sleep(0.5)
        tdir = os.path.join(tmp, "trace")
        r = run([sptrace, "attach", "--on", "accept", "-o", tdir, str(p.pid)],
                env=private_repo_env(tmp))
        check(r.returncode == 0 and "attached to pid %d" % p.pid in r.stdout,
              "sptrace attach --on accept redis-server: %r %r" % (r.stdout, r.stderr))
        print(r.stdout.strip())
        deadline = time.monotonic() + 20
        while not [f for f in os.listdir(tdir) if f.startswith("ring.")]:
            check(time.monotonic() < deadline, "no connection accepted after attach was traced")
            time.sleep(0.05)
        check(patched_soon(p.pid), "tracing, yet no code of redis-server is patched")
        r = run([sptrace, "stop", str(p.pid)])
        check(r.returncode == 0 and not text_differences(p.pid), "stop: %r" % r.stderr)
        r = run([sptrace, "activate", str(p.pid)])
        check(r.returncode == 0, "activate: %r" % r.stderr)
        time.sleep(0.3)
        r = run([sptrace, "stop", str(p.pid)])
        check(r.returncode == 0 and not text_differences(p.pid), "second stop: %r" % r.stderr)
        load.stop()
        check(load.failed == 0 and load.ok > 10, "%d of our requests failed, %d answered: %s" %
              (load.failed, load.ok, load.errors[:3]))
        check(bench.poll() is None or bench.returncode == 0,
              "redis-benchmark failed: %r" % bench.stderr.read() if bench.poll() else "")
    finally:
        if bench and bench.poll() is None:
            bench.kill()
            bench.wait()
        p.kill()
        p.wait()
    # The event loop records fast: its 16 MB ring may have wrapped past the
    # accept itself, which meta keeps.
    meta = open(os.path.join(tdir, "meta")).read()
    check(re.search(r"\nactivated \d+ accept fd \d+ tid %d\n" % p.pid, meta),
          "meta does not say that an accept on redis's event loop started tracing:\n" + meta)
    r = run([sptrace, "replay", tdir], env=private_repo_env(tmp))
    check(r.returncode == 0 and r.stdout.count("\n") > 100,
          "the replay of redis-server: %s" % r.stderr[-300:])


def wait_answering(url):
    """Until the server at url answers (at most 5 s: the test's own checks say
    what failed if it never does)."""
    for _ in range(250):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
            return
        except OSError:
            time.sleep(0.02)


def case_haproxy(sptrace, tmp):
    """Debian's haproxy with four threads that block every signal, answering
    HTTP itself, under load: attach (tracing at once), stop, activate, stop.
    Its threads blocked SIGTRAP long before the attach; the agent's first
    breakpoint killed it (issue 11, case 2).  No request fails, it lives on,
    and its code is the files' after each stop."""
    if not shutil.which("haproxy"):
        fail("haproxy is missing; install the Debian package haproxy "
             "(scripts/install-deps.sh does)")
    port = free_port()
    conf = os.path.join(tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write("global\n  nbthread 4\n"
                "defaults\n  mode http\n  timeout client 10s\n  timeout connect 5s\n"
                "  timeout server 10s\n"
                "frontend web\n  bind 127.0.0.1:%d\n"
                "  http-request return status 200 content-type text/plain string hello\n"
                % port)
    p = subprocess.Popen(["haproxy", "-db", "-f", conf], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d/" % port
    try:
        wait_answering(url)

        ask = http_asker(url, b"hello")

        load = Load(ask)
        load.start()
        time.sleep(0.3)
        blocked = [t for t in os.listdir("/proc/%d/task" % p.pid)
                   if int(re.search(r"SigBlk:\s*([0-9a-f]+)",
                                    open("/proc/%d/task/%s/status" % (p.pid, t)).read())
                          .group(1), 16) & (1 << (signal.SIGTRAP - 1))]
        check(blocked, "no haproxy thread blocks SIGTRAP: the case would prove nothing")
        print("%d of haproxy's threads block SIGTRAP" % len(blocked))
        try:
            cycle(sptrace, p.pid, os.path.join(tmp, "trace"), tmp, load)
        finally:
            load.stop()
        check(p.poll() is None, "haproxy died: %s" % p.returncode)
        check(load.failed == 0 and load.ok > 10, "%d requests failed, %d answered: %s" %
              (load.failed, load.ok, load.errors[:3]))
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def case_nginx(sptrace, tmp):
    """Debian's nginx, a master and two pre-forked worker processes, under a
    load of HTTP requests: attach --on accept to one worker, which starts
    tracing at its next accepted connection; stop, activate, stop.  No
    request fails, the worker's code is the files' after each stop, and the
    other worker and the master are not touched."""
    if not shutil.which("nginx"):
        fail("nginx is missing; install the Debian package nginx-light "
             "(scripts/install-deps.sh does)")
    port = free_port()
    os.chmod(tmp, 0o755)          # the workers run as nobody
    www = os.path.join(tmp, "www")
    os.mkdir(www)
    with open(os.path.join(www, "index.html"), "w") as f:
        f.write("hello from nginx\n")
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write("daemon off;\nmaster_process on;\nworker_processes 2;\npid %s/nginx.pid;\n"
                "error_log %s/error.log;\nevents { worker_connections 256; }\n"
                "http { access_log off; server { listen 127.0.0.1:%d; root %s; } }\n"
                % (tmp, tmp, port, www))
    p = subprocess.Popen(["nginx", "-c", conf, "-p", tmp], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d/index.html" % port
    try:
        wait_answering(url)
        workers = []
        for _ in range(100):
            workers = [int(c) for c in
                       open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()]
            if len(workers) == 2:
                break
            time.sleep(0.05)
        check(len(workers) == 2, "nginx did not start two workers: %r" % workers)
        worker, other = workers

        ask = http_asker(url, b"hello from nginx\n")

        load = Load(ask)
        load.start()
        time.sleep(0.3)
        # The worker runs as nobody: its agent writes the trace (sptrace
        # attach gives it the directory) and keeps its own repository.
        tdir = os.path.join(tmp, "trace")
        noenv = {k: v for k, v in os.environ.items() if k != "SPTRACE_REPO"}
        r = run([sptrace, "attach", "--on", "accept", "-o", tdir, str(worker)], env=noenv)
        check(r.returncode == 0 and "attached to pid %d" % worker in r.stdout,
              "sptrace attach --on accept (nginx worker): %r %r" % (r.stdout, r.stderr))
        print(r.stdout.strip())
        deadline = time.monotonic() + 20
        while "\nactivated " not in open(os.path.join(tdir, "meta")).read():
            check(time.monotonic() < deadline, "the worker accepted nothing after the attach")
            time.sleep(0.05)
        check(patched_soon(worker), "tracing, yet no code of the worker is patched")
        check(not text_differences(other) and not text_differences(p.pid),
              "the other worker or the master was changed")
        r = run([sptrace, "stop", str(worker)])
        check(r.returncode == 0 and not text_differences(worker), "stop: %r" % r.stderr)
        r = run([sptrace, "activate", str(worker)])
        check(r.returncode == 0, "activate: %r" % r.stderr)
        time.sleep(0.3)
        r = run([sptrace, "stop", str(worker)])
        check(r.returncode == 0 and not text_differences(worker), "second stop: %r" % r.stderr)
        load.stop()
        check(load.failed == 0 and load.ok > 10, "%d requests failed, %d answered: %s" %
              (load.failed, load.ok, load.errors[:3]))
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    meta = open(os.path.join(tdir, "meta")).read()
    check(re.search(r"\nactivated \d+ accept fd \d+ tid %d\n" % worker, meta),
          "meta does not say an accept in the worker started tracing:\n" + meta)


def case_errors(sptrace, sleeper, static, tmp):
    r = run([sptrace, "attach", "999999999"])
    check(r.returncode == 1 and "pid 999999999: no such process" in r.stderr,
          "missing pid: %r" % r.stderr)
    r = run([sptrace, "attach", "abc"])
    check(r.returncode == 2 and "'abc' is not a process id" in r.stderr, "bad pid: %r" % r.stderr)
    r = run([sptrace, "attach"])
    check(r.returncode == 2 and "no process id given" in r.stderr, "no pid: %r" % r.stderr)
    r = run([sptrace, "attach", "--on", "bogus", "1"])
    check(r.returncode == 2 and "unknown event 'bogus'" in r.stderr, "bad event: %r" % r.stderr)
    r = run([sptrace, "attach", "--help"])
    check(r.returncode == 0 and "usage: sptrace attach" in r.stdout, "attach --help")

    # A statically linked program: refused before anything is touched.
    p = subprocess.Popen([static], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        r = run([sptrace, "attach", "-o", os.path.join(tmp, "s"), str(p.pid)])
        check(r.returncode == 1 and "does not use the GNU C library" in r.stderr and
              str(p.pid) in r.stderr, "static program: %r" % r.stderr)
        check(not os.path.exists(os.path.join(tmp, "s")), "a refused attach left a directory")
    finally:
        p.kill()
        p.wait()

    # A process another tracer holds (a child that asked its parent, this
    # script, to trace it).
    libc = ctypes.CDLL(None, use_errno=True)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(rfd, 0)                          # stdin stays open: it waits
        libc.ptrace(0, 0, None, None)            # PTRACE_TRACEME
        os.execv(sleeper, [sleeper])
    os.close(rfd)
    try:
        os.waitpid(pid, 0)                       # stopped at the exec
        libc.ptrace(7, pid, None, None)          # PTRACE_CONT
        time.sleep(0.2)
        r = run([sptrace, "attach", str(pid)])
        check(r.returncode == 1 and ("pid %d is already traced by pid %d" % (pid, os.getpid()))
              in r.stderr, "traced process: %r" % r.stderr)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(wfd)

    # Another user's process, attached to as an unprivileged user.
    p = subprocess.Popen([sleeper], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        if os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv"):
            r = run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                     sptrace, "attach", "-o", "/tmp/sptrace-nobody-%d" % os.getpid(), str(p.pid)])
            check(r.returncode == 1 and "pid %d: permission denied" % p.pid in r.stderr,
                  "another user's process: %r" % r.stderr)
    finally:
        p.kill()
        p.wait()


def maps_have_agent(pid):
    with open("/proc/%d/maps" % pid) as f:
        return "sptrace-agent" in f.read()


def case_stopped(sptrace, sleeper, tmp):
    """A stopped process (kill -STOP) could load the agent only after a
    SIGCONT, long after attach gave up: refused up front, and no load stays
    pending behind the refusal."""
    p = subprocess.Popen([sleeper], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline() == "ready\n", "sleeper did not start")
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open("/proc/%d/stat" % p.pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            time.sleep(0.01)
        tdir = os.path.join(tmp, "stopped")
        r = run([sptrace, "attach", "--timeout", "10", "-o", tdir, str(p.pid)],
                env=private_repo_env(tmp))
        check(r.returncode == 1 and ("pid %d is stopped" % p.pid) in r.stderr and
              ("kill -CONT %d" % p.pid) in r.stderr, "stopped process: %d %r" % (r.returncode,
                                                                               r.stderr))
        check(not os.path.exists(tdir), "a refused attach left a directory")
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(1.5)
        check(not maps_have_agent(p.pid), "after SIGCONT the refused agent loaded anyway")
        r = run([sptrace, "attach", "-o", tdir, str(p.pid)], env=private_repo_env(tmp))
        check(r.returncode == 0 and ("attached to pid %d" % p.pid) in r.stdout,
              "attach after SIGCONT: %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run([sptrace, "stop", str(p.pid)])
        check(r.returncode == 0, "stop after SIGCONT: %r" % r.stderr)
    finally:
        p.kill()
        p.wait()


def case_own_syscalls(sptrace, prog, tmp):
    """Threads waiting only in system calls the program makes itself: no safe
    point for the C library; the message says what was found."""
    prog = os.path.realpath(prog)
    p = subprocess.Popen([prog], stdout=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline() == "ready\n", "rawwait did not start")
        time.sleep(0.2)
        tids = sorted(os.listdir("/proc/%d/task" % p.pid))
        check(len(tids) == 2, "rawwait has threads %r" % tids)
        tdir = os.path.join(tmp, "own")
        r = run([sptrace, "attach", "-o", tdir, str(p.pid)], env=private_repo_env(tmp))
        check(r.returncode == 1 and "no thread was waiting in a system call made by the C "
              "library or a Go runtime" in r.stderr and "not supported" in r.stderr,
              "own system calls: %d %r" % (r.returncode, r.stderr))
        for tid in tids:
            check("thread %s in futex from %s" % (tid, prog) in r.stderr,
                  "the message does not say thread %s waits in futex from %s: %r"
                  % (tid, prog, r.stderr))
        check(not os.path.exists(tdir), "a refused attach left a directory")
        check(not maps_have_agent(p.pid), "a refused attach loaded the agent")
        check(p.poll() is None, "rawwait died: %r" % p.returncode)
    finally:
        p.kill()
        p.wait()


def case_go_cgo(sptrace, tmp):
    go = shutil.which("go")
    check(go, "go not found: install golang-go")
    src = os.path.join(tmp, "cgo_http.go")
    shutil.copy(os.path.join(HERE, "..", "progs", "cgo_http.go"), src)
    exe = os.path.join(tmp, "cgo_http")
    build_env = dict(os.environ, GOCACHE=os.path.join(tmp, "gocache"),
                     GOPATH=os.path.join(tmp, "gopath"), GO111MODULE="off", CGO_ENABLED="1",
                     GOFLAGS="")
    b = run([go, "build", "-o", exe, src], env=build_env)
    check(b.returncode == 0, "go build: %d %s" % (b.returncode, b.stderr))
    p = subprocess.Popen([exe], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())

        def ask():
            with urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=10) as u:
                got = u.read()
                if got != b"42\n":
                    raise ValueError("answer %r" % got)

        load = Load(ask)
        load.start()
        time.sleep(0.3)
        tdir = os.path.join(tmp, "trace")
        r = run([sptrace, "attach", "-o", tdir, str(p.pid)], env=private_repo_env(tmp))
        check(r.returncode == 0 and "attached to pid %d" % p.pid in r.stdout,
              "sptrace attach %d (Go with cgo): %d %r %r" % (p.pid, r.returncode, r.stdout,
                                                            r.stderr))
        before = load.ok
        deadline = time.monotonic() + 20
        while load.ok <= before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        check(load.ok > before + 2, "the Go server stopped answering while traced")
        r = run([sptrace, "stop", str(p.pid)])
        check(r.returncode == 0, "sptrace stop: %r" % r.stderr)
        check(not text_differences(p.pid), "after sptrace stop the code differs from the files")
        before = load.ok
        deadline = time.monotonic() + 20
        while load.ok <= before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        load.stop()
        check(load.ok > before + 2, "the Go server stopped answering after the stop")
        check(load.failed == 0, "%d requests failed: %s" % (load.failed, load.errors[:5]))
        check(p.poll() is None, "the Go server died: %r" % p.returncode)
    finally:
        p.kill()
        p.wait()


def case_recv_read(sptrace, prog, tmp):
    """--on recv fires on read() of a socket, not of a pipe."""
    for how in ("attach", "run"):
        tdir = os.path.join(tmp, how)
        p, port = start_dormant(sptrace, prog, tmp, how, "recv", tdir)
        try:
            # main read()s its standard input, a pipe: no receive
            p.stdin.write("x\n")
            p.stdin.flush()
            time.sleep(0.5)
            check("\nactivated " not in open(os.path.join(tdir, "meta")).read(),
                  "%s --on recv: a read of a pipe started tracing" % how)
            for _ in range(3):
                ask_work(port)
            out, _ = p.communicate(input="", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        check(re.match(r"eintr 0 early 0 wrong 0 served 3\n", out), "%s: report %r" % (how, out))
        lines = one_thread_tree(sptrace, tmp, tdir, "%s --on recv" % how)
        check("/* recv */" in lines and lines.count("serve() {") >= 3,
              "%s --on recv: the server's trace (%d serve() calls):\n%s\nagent.log:\n%s" %
              (how, lines.count("serve() {"), "\n".join(lines[:30]),
               open(os.path.join(tdir, "agent.log")).read()[-3000:]))


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="sptrace-attach-") as tmp:
        if case == "blocked":
            case_blocked(sptrace, sys.argv[3], tmp)
        elif case == "accept":
            case_accept(sptrace, sys.argv[3], tmp)
        elif case == "recv-read":
            case_recv_read(sptrace, sys.argv[3], tmp)
        elif case == "http":
            case_http(sptrace, tmp)
        elif case == "redis":
            case_redis(sptrace, tmp)
        elif case == "nginx":
            case_nginx(sptrace, tmp)
        elif case == "haproxy":
            case_haproxy(sptrace, tmp)
        elif case == "errors":
            case_errors(sptrace, sys.argv[3], sys.argv[4], tmp)
        elif case == "stopped":
            case_stopped(sptrace, sys.argv[3], tmp)
        elif case == "own-syscalls":
            case_own_syscalls(sptrace, sys.argv[3], tmp)
        elif case == "go-cgo":
            case_go_cgo(sptrace, tmp)
        else:
            fail("unknown case %s" % case)


if __name__ == "__main__":
    main()
