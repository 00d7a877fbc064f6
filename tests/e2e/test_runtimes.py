#!/usr/bin/env python3
"""test_runtimes.py SPTRACE CASE — programs whose runtime reads return addresses.

A language runtime that walks its own stacks (Go's traceback for the GC and
stack growth, V8's GC stack walk) aborts on a return address in a patch
area.  The agent leaves that code alone (codeanalysis/runtimes.c) and says so
in agent.log and in the command's summary; the rest is traced.

  node-run     Debian's node (nodejs) under sptrace run, allocating enough to
               collect garbage many times: the same output and exit status as
               natively; agent.log and the summary name the V8 builtins; the
               replay holds calls into libc
  node-attach  a node http server on 127.0.0.1, attached (tracing at once)
               while it serves requests that allocate: no request fails, the
               server lives on and its answers are right; libuv's functions
               are in the replay after 'sptrace stop'
  go-cgo-run   tests/progs/cgo_gc.go built with Debian's go (golang-go) into
               a temporary directory: goroutines call C while the GC runs;
               the same output and exit status (3) as natively; Go's text is
               named as left alone, and the C side's libc calls are traced
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from e2elib import check, describe_exit, fail, need_program, private_repo_env, run

HERE = os.path.dirname(os.path.abspath(__file__))
PROGS = os.path.join(HERE, "..", "progs")

GC_JS = ("let a=[];for(let i=0;i<2e5;i++)a.push({i,s:'x'+i});"
         "let m=new Map();for(let i=0;i<1e5;i++)m.set(i,[i]);"
         "console.log(a.length, m.size);process.exitCode=7")

SERVER_JS = r"""
const http = require('http');
let n = 0;
const srv = http.createServer((req, res) => {
  let a = []; for (let i = 0; i < 20000; i++) a.push({i, s: 'x' + i});
  n++;
  res.end('ok ' + n + ' ' + a.length + '\n');
});
srv.listen(0, '127.0.0.1', () => { console.log('port ' + srv.address().port); });
"""




def agent_log(trace):
    with open(os.path.join(trace, "agent.log")) as f:
        return f.read()


def replay_has(sptrace, trace, e, pattern):
    """Does `sptrace replay TRACE` print a line matching pattern?  Read as a
    stream and stopped at the first match: node's full replay runs to
    gigabytes."""
    rx = re.compile(pattern)
    p = subprocess.Popen([sptrace, "replay", trace], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=e)
    deadline = time.monotonic() + 240
    found = None
    try:
        for line in p.stdout:
            if rx.search(line):
                found = line.strip()
                break
            if time.monotonic() > deadline:
                fail("sptrace replay %s: no line matching %s within 240 s" % (trace, pattern))
    finally:
        p.kill()
        p.wait()
    check(found, "no line matching %s in the replay of %s" % (pattern, trace))
    return found


def check_left_alone(trace, summary, kind, module_part):
    """agent.log and the command's summary name the runtime's code."""
    log = agent_log(trace)
    check(re.search(r"module \S*%s\S*: %s at 0x[0-9a-f]+-0x[0-9a-f]+ \(.*\): its code is not "
                    r"patched" % (re.escape(module_part), re.escape(kind)), log),
          "agent.log does not name the %s code of %s as left alone:\n%s" %
          (kind, module_part, log[-3000:]))
    check(re.search(r"sptrace: not traced: %s code in \S*%s" % (re.escape(kind),
                                                               re.escape(module_part)), summary),
          "the summary does not name the %s code of %s:\n%s" % (kind, module_part, summary))
    check("fatal signal" not in log, "agent.log reports a fatal signal:\n%s" % log[-3000:])


def same_as_native(native, traced, what):
    check(traced.returncode == native.returncode,
          "%s: %s traced, %s natively\nstderr (traced):\n%s" %
          (what, describe_exit(traced.returncode), describe_exit(native.returncode),
           traced.stderr[-4000:]))
    check(traced.stdout == native.stdout, "%s: output differs:\nnative: %r\ntraced: %r" %
          (what, native.stdout, traced.stdout))


def case_node_run(sptrace, tmp):
    node = need_program("node", "nodejs")
    e = private_repo_env(tmp)
    native = run([node, "-e", GC_JS], env=e, timeout=120)
    check(native.returncode == 7, "node natively: %s\n%s" % (describe_exit(native.returncode),
                                                           native.stderr))
    trace = os.path.join(tmp, "t")
    traced = run([sptrace, "run", "-o", trace, "--", node, "-e", GC_JS], env=e, timeout=280)
    same_as_native(native, traced, "node under sptrace run")
    check_left_alone(trace, traced.stderr, "V8 builtins", "node")
    replay_has(sptrace, trace, e, r"\b(malloc|memcpy|pthread_mutex_lock)\(")


def case_node_attach(sptrace, tmp):
    node = need_program("node", "nodejs")
    e = private_repo_env(tmp)
    script = os.path.join(tmp, "server.js")
    with open(script, "w") as f:
        f.write(SERVER_JS)
    srv = subprocess.Popen([node, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=e)
    try:
        line = srv.stdout.readline()
        m = re.match(r"port (\d+)", line)
        check(m, "the node server did not say its port: %r" % line)
        url = "http://127.0.0.1:%s/" % m.group(1)

        def ask(i):
            with urllib.request.urlopen(url, timeout=20) as r:
                body = r.read().decode()
            check(re.fullmatch(r"ok %d 20000\n" % i, body), "answer %d: %r" % (i, body))

        # No request before the attach: the handler's first runs go through
        # the builtins and the runtime's C++ (the old agent died there).
        n = 0
        trace = os.path.join(tmp, "ta")
        p = run([sptrace, "attach", "-o", trace, str(srv.pid)], env=e, timeout=280)
        check(p.returncode == 0, "sptrace attach: %s\n%s%s" % (describe_exit(p.returncode),
                                                              p.stdout, p.stderr))
        attach_out = p.stdout
        # Requests that allocate, so the GC walks stacks with traced frames.
        for _ in range(300):
            n += 1
            try:
                ask(n)
            except OSError as err:
                srv.poll()
                fail("request %d failed (%s); the server %s:\n%s" %
                     (n, err, "died: " + describe_exit(srv.returncode)
                      if srv.returncode is not None else "lives", agent_log(trace)[-3000:]))
        if srv.poll() is not None:
            fail("the node server died: %s" % describe_exit(srv.returncode))
        check_left_alone(trace, attach_out, "V8 builtins", "node")
        p = run([sptrace, "stop", str(srv.pid)], env=e, timeout=120)
        check(p.returncode == 0, "sptrace stop: %s\n%s" % (describe_exit(p.returncode), p.stderr))
        for _ in range(20):
            n += 1
            ask(n)
        replay_has(sptrace, trace, e, r"\buv_\w+\(")
    finally:
        srv.kill()
        out, err = srv.communicate(timeout=30)
    check("Check failed" not in err and "Fatal" not in err, "node said:\n%s" % err[-3000:])


def case_go_cgo_run(sptrace, tmp):
    go = need_program("go", "golang-go")
    e = private_repo_env(tmp)
    src = os.path.join(tmp, "cgo_gc.go")
    shutil.copy(os.path.join(PROGS, "cgo_gc.go"), src)
    exe = os.path.join(tmp, "cgo_gc")
    build_env = dict(e, GOCACHE=os.path.join(tmp, "gocache"), GOPATH=os.path.join(tmp, "gopath"),
                     GO111MODULE="off", CGO_ENABLED="1", GOFLAGS="")
    p = run([go, "build", "-o", exe, src], env=build_env, timeout=280)
    check(p.returncode == 0, "go build: %s\n%s" % (describe_exit(p.returncode), p.stderr))
    native = run([exe], env=e, timeout=120)
    check(native.returncode == 3 and native.stdout.startswith("total "),
          "the Go program natively: %s\n%s%s" % (describe_exit(native.returncode),
                                                 native.stdout, native.stderr))
    trace = os.path.join(tmp, "t")
    traced = run([sptrace, "run", "-o", trace, "--", exe], env=e, timeout=280)
    same_as_native(native, traced, "the Go program under sptrace run")
    check_left_alone(trace, traced.stderr, "Go runtime", "cgo_gc")
    replay_has(sptrace, trace, e, r"\b(__)?snprintf\(")
    replay_has(sptrace, trace, e, r"\bmalloc\(")


CASES = {"node-run": case_node_run, "node-attach": case_node_attach,
         "go-cgo-run": case_go_cgo_run}


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    if case not in CASES:
        fail("unknown case '%s' (known: %s)" % (case, ", ".join(CASES)))
    tmp = tempfile.mkdtemp(prefix="sptrace-runtimes-")
    try:
        CASES[case](sptrace, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok: runtime-%s" % case)


if __name__ == "__main__":
    main()
