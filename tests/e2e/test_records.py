#!/usr/bin/env python3
"""test_records.py SPTRACE CASE HOTTHREADS — every record kept (issue 16).

`sptrace run` (without --flight-recorder) promises every record.  The agent
keeps them itself: each thread's ring.<tid> grows a chunk at a time
(common/trace_format.h, "Rings and chunks").  HOTTHREADS is
tests/progs/hotthreads.c: THREADS threads calling a small function.

  threads   8 threads x 1 M calls through a 1 MiB window, on this 2-core
            machine (the copying drain of format version 1 lost most of
            them): the records written (the ring headers' counts) are all
            in the files, and report counts every call.
  kill9     kill -9 of the program while 4 threads call for ever: the files
            hold every record up to the kill (a zero slot at most per
            thread, the one being written), nothing is said lost, and
            report counts a call for every ENTRY record in the files.
  lost      records lost anyway (--flight-recorder, a 1 MiB ring): replay,
            report, flows, analyze and export each say so first -- the
            first line on stderr, and the first line of a text output.
  fsize     the program's RLIMIT_FSIZE stops the file from growing: the
            program runs on as natively (no SIGXFSZ), the records up to the
            limit are kept, and the readers say first how many were lost
            and why; a limit below the window keeps the file's first part.
  compact   sptrace run packs the records (trace_format.h, "Packed
            blocks"): 4 threads x 1 M calls take at most 4 bytes a call on
            disk (the trace directory's allocated blocks), every call is
            read back; and a trace made with --no-compact (16 bytes a call),
            packed afterwards by `sptrace pack` (at most 4 bytes a call in
            the records' files), gives replay, report, flows
            and export the same output as before, byte for byte; and
            sptrace run killed -9 while it packs: the packed and the raw
            records are read together, every call once.
  early     the records of a process that has ended are packed while
            sptrace run still waits for the program (a traced shell runs
            hotthreads, then waits): its files are cut to their headers
            before the shell ends, and every call is read back once.
  first     (PROG: tests/progs/sleeper) a process that records little has
            a ring file of 256 KiB of records, not its whole window.
(kill9 reads the agent's raw files itself: it runs with --no-compact.)
"""

import glob
import re
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, packed_records, private_repo_env, run  # noqa: E402

# trace_ring_header (common/trace_format.h)
HEADER = struct.Struct("<QIIQQQQIIQQ16sQQQi")
NO_END = (1 << 64) - 1


def header(path):
    with open(path, "rb") as f:
        (magic, version, hsize, capacity, count, mask, epoch, pid, tid, start, flags, name,
         limit, chunk, kept_end, kept_errno) = HEADER.unpack(f.read(HEADER.size))
    return dict(version=version, hsize=hsize, capacity=capacity, count=count, chunk=chunk,
                kept_end=kept_end, kept_errno=kept_errno, size=os.path.getsize(path))


def records(path, h):
    """The records of a file that keeps every record, [0, count)."""
    with open(path, "rb") as f:
        f.seek(h["hsize"])
        data = f.read(h["count"] * 8)
    return struct.unpack("<%dQ" % (len(data) // 8), data)


def rings(tdir):
    found = sorted(glob.glob(os.path.join(tdir, "ring.*")))
    check(found, "no ring.<tid> file in %s: %r" % (tdir, os.listdir(tdir)))
    return found


def report_calls(sptrace, tdir, env):
    """{function: calls} and the report's stdout and stderr."""
    r = run([sptrace, "report", tdir], env=env)
    check(r.returncode == 0, "report %s failed: %s" % (tdir, r.stderr))
    calls = {}
    for line in r.stdout.splitlines():
        p = line.split()
        if len(p) == 6 and p[4].isdigit():
            calls[p[5]] = int(p[4])
    return calls, r


def check_kept(sptrace, tdir, env, what):
    """Every ring file keeps all the records its count says were written;
    the readers say nothing was lost.  Returns the files' headers."""
    for sub in ("replay", "report"):
        r = run([sptrace, sub, tdir], env=env)
        check(r.returncode == 0, "%s: %s failed: %s" % (what, sub, r.stderr))
        check("lost" not in r.stderr and "WARNING" not in r.stdout and
              "records lost" not in r.stdout,
              "%s: %s says records were lost:\n%s%s" % (what, sub, r.stderr[:1000],
                                                       r.stdout[:500]))
    heads = {}
    for path in rings(tdir):
        h = header(path)
        heads[path] = h
        check(h["chunk"] > 0, "%s: %s: not a file of every record (format version %d, "
              "chunk %d): the agent kept a ring" % (what, path, h["version"], h["chunk"]))
        check(h["kept_end"] == NO_END, "%s: %s: records from %d on lost (errno %d)" %
              (what, path, h["kept_end"], h["kept_errno"]))
        packed = os.path.join(tdir, "packed." + os.path.basename(path)[5:])
        check(h["size"] >= h["hsize"] + 8 * h["count"] or
              (os.path.exists(packed) and packed_records(packed) == h["count"]),
              "%s: %s: %d bytes cannot hold its %d records, and no packed.<tid> holds them" %
              (what, path, h["size"], h["count"]))
    return heads


def case_threads(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    threads, n = 8, 1000000
    tdir = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", tdir, "--ring-size", "1", "--", prog, str(threads), str(n)],
            env=env)
    check(r.returncode == 0 and r.stdout.startswith("hotthreads %d %d " % (threads, n)),
          "traced hotthreads: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr[-2000:]))
    check("lost" not in r.stderr, "sptrace run says records were lost:\n" + r.stderr[-2000:])
    heads = check_kept(sptrace, tdir, env, "threads")
    written = sum(h["count"] for h in heads.values())
    check(written >= 2 * threads * n, "only %d records written for %d calls" %
          (written, threads * n))
    calls, rep = report_calls(sptrace, tdir, env)
    check(calls.get("leaf") == threads * n,
          "report counts %s calls of leaf, expected %d:\n%s" %
          (calls.get("leaf"), threads * n, (rep.stderr + rep.stdout)[:3000]))
    print("threads: %d records written, %d kept, leaf called %d times" %
          (written, written, calls["leaf"]))


def case_kill9(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    tdir = os.path.join(tmp, "trace")
    # Analysed first, so that the run starts tracing at once.
    run([sptrace, "run", "-o", os.path.join(tmp, "warm"), "--", prog, "1", "10"], env=env)
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--ring-size", "1", "--no-compact", "--",
                          prog, "4", "0", "spin"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 60
    child = None
    while time.monotonic() < deadline and child is None:
        time.sleep(0.2)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                              text=True).stdout.split()
        if kids and len(glob.glob(os.path.join(tdir, "ring.*"))) >= 5:
            child = int(kids[0])
    if child is None:
        for k in kids:
            os.kill(int(k), signal.SIGKILL)
        p.kill()
        p.communicate()
        fail("kill9: the traced program did not get going within 60 s")
    time.sleep(0.4)          # four threads, each through many 1 MiB windows
    os.kill(child, signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    check(p.returncode == -signal.SIGKILL, "sptrace run should end like the program "
          "(SIGKILL), got %d: %s" % (p.returncode, err[-1000:]))
    heads = check_kept(sptrace, tdir, env, "kill9")
    entries = 0
    for path, h in heads.items():
        recs = records(path, h)
        zeros = sum(1 for x in recs if x == 0)
        check(len(recs) == h["count"], "kill9: %s: %d records readable of %d" %
              (path, len(recs), h["count"]))
        check(zeros <= 1, "kill9: %s: %d of its %d records were never written" %
              (path, zeros, h["count"]))
        entries += sum(1 for x in recs if x and x & 3 == 0)
    calls, rep = report_calls(sptrace, tdir, env)
    counted = sum(calls.values())
    check(counted == entries, "kill9: report counts %d calls, the files hold %d ENTRY "
          "records:\n%s" % (counted, entries, rep.stdout[:2000]))
    check(calls.get("leaf", 0) > 100000, "kill9: only %s calls of leaf" % calls.get("leaf"))
    print("kill9: %d records in %d files, %d calls, all readable" %
          (sum(h["count"] for h in heads.values()), len(heads), counted))


def check_said_first(sptrace, tdir, env, what, words):
    """Each reading command says first that records were lost."""
    export = os.path.join(os.path.dirname(tdir), "export.json")
    cmds = {
        "replay": ([sptrace, "replay", tdir], True),
        "report": ([sptrace, "report", tdir], True),
        "flows": ([sptrace, "flows", tdir], True),
        "analyze": ([sptrace, "analyze", tdir], True),
        "export": ([sptrace, "export", tdir, "--format", "chrome", "-o", export], False),
    }
    for name, (cmd, text_out) in cmds.items():
        r = run(cmd, env=env)
        check(r.returncode == 0, "%s: %s failed (%d): %s" % (what, name, r.returncode,
                                                             r.stderr[-2000:]))
        first = (r.stderr.splitlines() or [""])[0]
        check(first.startswith("sptrace: %s: warning: " % name) and "records lost" in first
              and all(w in first for w in words),
              "%s: %s: the first line on stderr does not say the records lost (%s):\n%s" %
              (what, name, ", ".join(words), r.stderr[:2000]))
        if text_out:
            top = (r.stdout.splitlines() or [""])[0]
            check(top.startswith("# WARNING: ") and "records lost" in top,
                  "%s: %s: the output does not begin with the records lost:\n%s" %
                  (what, name, r.stdout[:1000]))
        print("%s: %s: %s" % (what, name, first))


def case_lost(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    tdir = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", tdir, "--flight-recorder", "--ring-size", "1", "--", prog,
             "2", "300000"], env=env)
    check(r.returncode == 0, "traced hotthreads: %s" % r.stderr[-2000:])
    check_said_first(sptrace, tdir, env, "lost", ["overwritten in a full ring"])


def case_fsize(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    tdir = os.path.join(tmp, "trace")
    limit = 4 << 20
    native = run([prog, "2", "2000000", "fsize", str(limit)])
    check(native.returncode == 0, "native hotthreads with fsize: %s" % native.stderr)
    # Analysed first: the repository's files would meet the limit too.
    run([sptrace, "run", "-o", os.path.join(tmp, "warm"), "--", prog, "1", "10"], env=env)
    r = run([sptrace, "run", "-o", tdir, "--ring-size", "1", "--", prog, "2", "2000000",
             "fsize", str(limit)], env=env)
    check(r.returncode == native.returncode and r.stdout.split()[:2] == native.stdout.split()[:2],
          "fsize: traced exit %d (native %d): the program noticed the agent's file\n%s" %
          (r.returncode, native.returncode, r.stderr[-2000:]))
    grown = [h for h in map(header, rings(tdir)) if h["kept_end"] != NO_END]
    check(grown, "fsize: no ring file says where its records end")
    for h in grown:
        check(h["size"] <= limit and h["kept_end"] <= (h["size"] - h["hsize"]) // 8,
              "fsize: a file past the limit, or keeping more than it holds: %r" % h)
    check_said_first(sptrace, tdir, env, "fsize", ["could not grow", "File too large"])
    # A limit below the default window (16 MiB) but above a file's first
    # part (256 KiB, agent/ring.c): the first part is kept, the rest counted
    # lost -- the old agent, which reserved the whole window at once, could
    # make no ring at all.
    limit, tdir = 1 << 20, os.path.join(tmp, "trace-small")
    native = run([prog, "2", "2000000", "fsize", str(limit)])
    r = run([sptrace, "run", "-o", tdir, "--", prog, "2", "2000000", "fsize", str(limit)], env=env)
    check(r.returncode == native.returncode and r.stdout.split()[:2] == native.stdout.split()[:2],
          "fsize below the window: traced exit %d (native %d)\n%s" %
          (r.returncode, native.returncode, r.stderr[-2000:]))
    kept = [h for h in map(header, [f for f in rings(tdir) if os.path.getsize(f) >= HEADER.size])
            if h["kept_end"] != NO_END]
    check(len(kept) == 2 and all(h["kept_end"] == (256 << 10) // 8 and h["size"] <= limit
                                 for h in kept),
          "fsize below the window: the worker threads' rings do not keep their first "
          "256 KiB: %r" % kept)
    check_said_first(sptrace, tdir, env, "fsize", ["could not grow", "File too large"])


def disk_bytes(tdir, records_only=False):
    """Bytes the trace takes on disk: its files' allocated blocks (with
    records_only, those of the records' files, ring.* and packed.*, alone:
    a trace of few calls is mostly its sites and channels files)."""
    total = 0
    for base, _, files in os.walk(tdir):
        for name in files:
            if not records_only or name.startswith(("ring.", "packed.")):
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
    return total


def case_compact(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    threads, n = 4, 1000000
    tdir = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", tdir, "--", prog, str(threads), str(n)], env=env)
    check(r.returncode == 0, "compact: traced hotthreads: %s" % r.stderr[-2000:])
    heads = check_kept(sptrace, tdir, env, "compact")
    written = sum(h["count"] for h in heads.values())
    packed = glob.glob(os.path.join(tdir, "packed.*"))
    per_call = disk_bytes(tdir) / (written / 2)
    check(packed and per_call <= 4,
          "compact: %.2f bytes per call on disk (%d bytes, %d records written; packed "
          "files: %r), expected at most 4" % (per_call, disk_bytes(tdir), written, packed))
    calls, rep = report_calls(sptrace, tdir, env)
    check(calls.get("leaf") == threads * n,
          "compact: report counts %s calls of leaf, expected %d:\n%s" %
          (calls.get("leaf"), threads * n, (rep.stderr + rep.stdout)[:3000]))
    print("compact: %.3f bytes per call on disk, leaf called %d times" % (per_call, calls["leaf"]))

    # The same records raw and packed: every reader's output alike.
    raw = os.path.join(tmp, "raw")
    r = run([sptrace, "run", "-o", raw, "--no-compact", "--", prog, "2", "300000"], env=env)
    check(r.returncode == 0, "compact: --no-compact run: %s" % r.stderr[-2000:])
    check(not glob.glob(os.path.join(raw, "packed.*")), "compact: --no-compact packed")
    raw_per_call = disk_bytes(raw, True) / (sum(h["count"] for h in map(header, rings(raw))) / 2)
    packed_dir = os.path.join(tmp, "packed")
    shutil.copytree(raw, packed_dir, symlinks=True)
    r = run([sptrace, "pack", packed_dir], env=env)
    check(r.returncode == 0 and glob.glob(os.path.join(packed_dir, "packed.*")),
          "compact: sptrace pack: %d %s" % (r.returncode, r.stderr[-2000:]))
    pk_per_call = disk_bytes(packed_dir, True) / (sum(h["count"] for h in map(header,
                                                                         rings(packed_dir))) / 2)
    check(pk_per_call <= 4, "compact: sptrace pack left %.2f bytes per call in the records' "
          "files" % pk_per_call)
    for cmd in (["replay"], ["report"], ["flows"], ["export", "--format", "chrome", "-o"]):
        outs = []
        for d in (raw, packed_dir):
            args = [sptrace] + cmd
            if cmd[0] == "export":
                args += [d + ".json"]
            r = run(args + [d], env=env)
            check(r.returncode == 0, "compact: %s %s: %s" % (cmd[0], d, r.stderr[-2000:]))
            out = r.stdout
            if cmd[0] == "export":
                with open(d + ".json") as f:
                    out = f.read()
            outs.append(out.replace(d, "DIR").replace(os.path.basename(d), "DIR"))
        check(outs[0] == outs[1] and len(outs[0]) > 200,
              "compact: %s gives another output for the packed trace (%d and %d bytes)" %
              (cmd[0], len(outs[0]), len(outs[1])))
    print("compact: --no-compact %.2f bytes per call in the records' files, packed %.3f; "
          "replay, report, flows and export alike" % (raw_per_call, pk_per_call))

    # Root packs no directory another user controls (cmd_pack.c, point 1):
    # one of uid 61001's, and one of root's that others may write into, are
    # left as they are and said.
    if os.geteuid() == 0:
        for name, fix in (("theirs", lambda d: subprocess.run(["chown", "-R", "61001", d],
                                                              check=True)),
                          ("writable", lambda d: os.chmod(d, 0o777))):
            d = os.path.join(tmp, name)
            shutil.copytree(raw, d, symlinks=True)
            fix(d)
            before = {f: os.path.getsize(f) for f in rings(d)}
            r = run([sptrace, "pack", d], env=env)
            said = "not yours" if name == "theirs" else "others may write into it"
            check(r.returncode == 0 and not glob.glob(os.path.join(d, "packed.*")) and
                  before == {f: os.path.getsize(f) for f in rings(d)} and said in r.stderr,
                  "compact: root's sptrace pack wrote into %s (a directory %s): exit %d, "
                  "packed %r, stderr %r" % (d, said, r.returncode,
                                            glob.glob(os.path.join(d, "packed.*")),
                                            r.stderr[-1000:]))
        print("compact: root's sptrace pack leaves another user's directory, and one "
              "others may write, as they are")

    # sptrace run killed while it packs: what it packed and what it had not
    # yet (raw) are read together, every call once.
    died = os.path.join(tmp, "died")
    n = 4000000
    p = subprocess.Popen([sptrace, "run", "-o", died, "--", prog, "2", str(n)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    child = None
    while time.monotonic() < deadline and p.poll() is None:
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                              text=True).stdout.split()
        if kids and any(os.path.getsize(f) for f in glob.glob(os.path.join(died, "packed.*"))):
            child = int(kids[0])
            break
        time.sleep(0.02)
    check(child is not None, "compact: sptrace run packed nothing within 60 s (or the "
          "program ended first: exit %s)" % p.poll())
    p.kill()
    p.wait()
    while time.monotonic() < deadline and os.path.exists("/proc/%d" % child):
        time.sleep(0.1)
    check(not os.path.exists("/proc/%d" % child), "compact: the program did not end")
    calls, rep = report_calls(sptrace, died, env)
    check(calls.get("leaf") == 2 * n and "lost" not in rep.stderr,
          "compact: after sptrace run was killed, report counts %s calls of leaf, expected "
          "%d:\n%s" % (calls.get("leaf"), 2 * n, (rep.stderr + rep.stdout)[:3000]))
    print("compact: sptrace run killed while packing: %d calls read, from %d packed and %d "
          "raw files" % (calls["leaf"], len(glob.glob(os.path.join(died, "packed.*"))),
                         len(rings(died))))


def case_early(sptrace, prog, tmp):
    env = private_repo_env(tmp)
    threads, n = 2, 300000
    tdir = os.path.join(tmp, "trace")
    done, go = os.path.join(tmp, "done"), os.path.join(tmp, "go")
    # Windows of 1 MiB: chunks of 64 Ki records, about ten a thread, packed
    # as they are finished, and the rest once the process is gone.
    script = ('"$1" %d %d >/dev/null; touch "$2"; '
              'for i in $(seq 1 1200); do [ -e "$3" ] && exit 0; sleep 0.05; done; exit 3'
              % (threads, n))
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--ring-size", "1", "--", "bash", "-c",
                          script, "sh", prog, done, go], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not os.path.exists(done) and p.poll() is None:
            time.sleep(0.05)
        check(os.path.exists(done), "early: hotthreads did not end within 60 s (sptrace run "
              "exit %s)" % p.poll())
        with open(os.path.join(tdir, "meta")) as f:
            subs = [l.split()[1] for l in f if l.startswith("exec exec.") and
                    l.split(" ", 3)[3].strip() == os.path.abspath(prog)]
        check(len(subs) == 1, "early: expected one exec'd image of %s in meta, found %r" %
              (prog, subs))
        img = os.path.join(tdir, subs[0])
        # While the shell waits: the image's files of every record cut to
        # their headers, their records in packed.<tid> (30 s at most: sptrace
        # run looks every 50 ms).
        state = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            files = rings(img)
            state = {}
            for f in files:
                h = header(f)
                pk = os.path.join(img, "packed." + os.path.basename(f)[5:])
                state[os.path.basename(f)] = (h["size"], h["hsize"], h["count"],
                                              packed_records(pk) if os.path.exists(pk) else None)
            if len(files) >= threads and all(size == hsize and packed == count
                                             for size, hsize, count, packed in state.values()):
                break
            time.sleep(0.1)
        else:
            fail("early: 30 s after hotthreads ended, while the traced shell still runs, its "
                 "files are not all packed and cut to their headers: {ring: (size, header "
                 "size, records, records packed)} = %r" % state)
        check(p.poll() is None, "early: the traced shell ended before it was told to")
    finally:
        open(go, "w").close()
    out, err = p.communicate(timeout=120)
    check(p.returncode == 0, "early: sptrace run: exit %d\n%s" % (p.returncode, err[-2000:]))
    heads = check_kept(sptrace, img, env, "early")
    calls, rep = report_calls(sptrace, img, env)
    check(calls.get("leaf") == threads * n,
          "early: report counts %s calls of leaf, expected %d:\n%s" %
          (calls.get("leaf"), threads * n, (rep.stderr + rep.stdout)[:3000]))
    print("early: %d files packed and cut while the shell waited, %d records, leaf called %d "
          "times" % (len(heads), sum(h["count"] for h in heads.values()), calls["leaf"]))


def case_first(sptrace, prog, tmp):
    """A process that records little reserves little: its ring file starts
    with 256 KiB of records (agent/ring.c), not its whole 16 MiB window -- on
    a tmpfs, 16 MiB of memory zeroed and freed again in every process.  PROG
    is tests/progs/sleeper, which waits for its standard input to close."""
    env = private_repo_env(tmp)
    tdir = os.path.join(tmp, "trace")
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--", prog], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        check(p.stdout.readline() == "ready\n", "first: the sleeper did not start")
        files = rings(tdir)
        sizes = {f: (os.stat(f).st_size, os.stat(f).st_blocks * 512) for f in files}
        check(all(size <= 4096 + (256 << 10) and blocks <= 4096 + (256 << 10)
                  for size, blocks in sizes.values()),
              "first: a ring of a process that recorded little is larger than its first part "
              "(256 KiB and the header): %r" % sizes)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    check(p.returncode == 0, "first: sptrace run exit %d: %s" % (p.returncode, p.stderr.read()))
    rp = run([sptrace, "replay", tdir], env=env)
    check(rp.returncode == 0 and "main() {" in rp.stdout, "first: no main in the replay:\n%s"
          % (rp.stdout + rp.stderr)[:2000])
    print("first: rings while running %r" % sizes)


def case_ahead(sptrace, prog, tmp):
    """One busy thread on a machine of two CPUs or more: the control thread
    faults in each chunk a window's move maps ahead from the thread's 8th
    chunk on (agent/ring.c, point 4), and every record is still kept and
    counted.  With as many busy threads as CPUs the chunks are left to
    their writers.  (The old agent wrote no such line.)"""
    env = private_repo_env(tmp)
    n = 8000000                        # 16 M records: 16 chunks of a 16 MiB window,
                                       # from the 8th on faulted in ahead
    cpus = len(os.sched_getaffinity(0))
    for threads in (1, max(2, cpus)):
        tdir = os.path.join(tmp, "trace%d" % threads)
        r = run([sptrace, "run", "-o", tdir, "--", prog, str(threads), str(n)], env=env)
        check(r.returncode == 0 and r.stdout.startswith("hotthreads %d %d " % (threads, n)),
              "traced hotthreads %d: exit %d\n%s%s" % (threads, r.returncode, r.stdout,
                                                        r.stderr[-2000:]))
        heads = check_kept(sptrace, tdir, env, "ahead %d" % threads)
        written = sum(h["count"] for h in heads.values())
        calls, rep = report_calls(sptrace, tdir, env)
        check(calls.get("leaf") == threads * n,
              "ahead %d: report counts %s calls of leaf, expected %d" %
              (threads, calls.get("leaf"), threads * n))
        log = open(os.path.join(tdir, "agent.log")).read()
        m = re.search(r"end: (\d+) chunks of every record faulted in ahead by the control "
                      r"thread \(([\d.]+) ms\), (\d+) left to their writers", log)
        check(m, "ahead %d: agent.log does not say which chunks were faulted in ahead:\n%s" %
              (threads, log[-3000:]))
        ahead, left = int(m.group(1)), int(m.group(3))
        # (under load the control thread may come late: a newer chunk's request
        # then replaces an older one, which is neither faulted in nor left)
        if threads == 1 and cpus >= 2:
            check(ahead >= 1 and left == 0, "ahead 1: %d chunks faulted in ahead, %d left to "
                  "the writer: want them ahead" % (ahead, left))
        elif threads >= cpus:
            check(left >= 1, "ahead %d on %d CPUs: %d chunks faulted in ahead, %d left to "
                  "their writers: want some left" % (threads, cpus, ahead, left))
        print("ahead: %d threads, %d records, %d chunks faulted in ahead, %d left" %
              (threads, written, ahead, left))


def main():
    if len(sys.argv) != 4:
        fail("usage: test_records.py SPTRACE threads|kill9|lost|fsize|compact|early|first|ahead PROG")
    sptrace, case, prog = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    cases = {"threads": case_threads, "kill9": case_kill9, "lost": case_lost,
             "fsize": case_fsize, "compact": case_compact, "early": case_early,
             "first": case_first, "ahead": case_ahead}
    check(case in cases, "unknown case %s" % case)
    tmp = tempfile.mkdtemp(prefix="sptrace-e2e-records-")
    try:
        cases[case](sptrace, prog, tmp)
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
