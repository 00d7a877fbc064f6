#!/usr/bin/env python3
"""test_bad_traces.py SPTRACE CASE — `sptrace replay` and `sptrace report` on
damaged trace directories (issue 12: hostile input never hangs).

Each CASE makes a small real trace (`sptrace run -o DIR -- /bin/true`, 1 MiB
rings, its own repository), damages it, and runs `sptrace replay DIR` and
`sptrace report DIR`, each with a 10 s limit.  Each must:
  - finish within the limit (the old reader blocked for ever on a FIFO, read
    /dev/urandom or a sparse 1 TiB meta for minutes or for ever, or replayed
    an exec loop again and again);
  - not be killed by a signal, and leave no sanitizer report;
  - print at most 1 MiB (a ring of 1 MiB once made a replay of 535 MB);
  - for the cases that cannot be read: exit non-zero with an error starting
    'sptrace: ' that names the damaged file; for the others: exit 0 and warn
    on stderr, naming the file.
The case ring-bytes-huge instead runs `sptrace run` with SPTRACE_RING_BYTES
2^63 (the agent spun for ever in its size loop): the run must end within the
limit and agent.log must say the size was refused.
"""

import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, check_sanitizers, describe_exit, fail  # noqa: E402

LIMIT = 10            # seconds: anything longer is a hang
MAX_OUT = 1 << 20     # bytes of stdout: the intact trace prints about 100


def ring_of(tdir):
    rings = glob.glob(os.path.join(tdir, "ring.*"))
    check(len(rings) == 1, "%s: expected one ring file, found %s" % (tdir, rings))
    return rings[0]


def meta_fifo(tdir):
    p = os.path.join(tdir, "meta")
    os.unlink(p)
    os.mkfifo(p)
    return p


def seg_fifo(tdir):
    """seg.<tid>: the copying drain's file of format version 1, still read
    beside a ring (the flight-recorder trace made for this case)."""
    ring = ring_of(tdir)
    p = os.path.join(tdir, "seg." + os.path.basename(ring)[len("ring."):])
    os.mkfifo(p)
    return p


def meta_urandom(tdir):
    p = os.path.join(tdir, "meta")
    os.unlink(p)
    os.symlink("/dev/urandom", p)
    return p


def meta_huge(tdir):
    """meta made a sparse file of 1 TiB: read through, it takes minutes."""
    p = os.path.join(tdir, "meta")
    os.truncate(p, 1 << 40)
    return p


def exec_loop(tdir):
    """An exec line whose subdirectory is the trace directory itself."""
    p = os.path.join(tdir, "meta")
    with open(p) as f:
        pid = [ln.split()[1] for ln in f if ln.startswith("pid ")][0]
    with open(p, "a") as f:
        f.write("exec . %s /usr/bin/true\n" % pid)
    return p


def exec_link(tdir):
    """An exec line naming a subdirectory that is a link back to the trace."""
    exec_loop(tdir)
    p = os.path.join(tdir, "meta")
    with open(p) as f:
        text = f.read().replace("exec . ", "exec back ")
    with open(p, "w") as f:
        f.write(text)
    os.symlink(".", os.path.join(tdir, "back"))
    return os.path.join(tdir, "back")


def ring_count(tdir):
    """Bit 17 of the ring's count flipped: 131072 more records than written."""
    p = ring_of(tdir)
    with open(p, "r+b") as f:
        f.seek(24)                         # trace_ring_header.count
        count, = struct.unpack("<Q", f.read(8))
        f.seek(24)
        f.write(struct.pack("<Q", count ^ (1 << 17)))
    return p


# case -> (damage, must the commands fail?, words one of which the message says)
CASES = {
    "meta-fifo": (meta_fifo, True, ["not a regular file"]),
    "seg-fifo": (seg_fifo, True, ["not a regular file"]),
    "meta-urandom": (meta_urandom, True, ["symbolic link", "not a regular file"]),
    "meta-huge": (meta_huge, True, ["implausibly large"]),
    "exec-loop": (exec_loop, False, ["exec line"]),
    "exec-link": (exec_link, True, ["shown already"]),
    "ring-count": (ring_count, False, ["corrupt header"]),
    "ring-bytes-huge": (None, False, []),
}


def timed(cmd, env):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=LIMIT, env=env)
    except subprocess.TimeoutExpired as e:
        fail("%s: still running after %d s (hung); %d bytes of output by then" %
             (" ".join(cmd), LIMIT, len(e.stdout or b"")))
    return p, time.monotonic() - t0


def make_trace(exe, work, env, ring_bytes=None, flight=False):
    tdir = os.path.join(work, "trace")
    cmd = [exe, "run", "-o", tdir] + (["--flight-recorder"] if flight else [])
    if ring_bytes is None:
        cmd += ["--ring-size", "1"]
    else:
        env = dict(env, SPTRACE_RING_BYTES=str(ring_bytes))
    p, secs = timed(cmd + ["--", "/bin/true"], env)
    err = p.stderr.decode(errors="replace")
    print("run: %s in %.2f s" % (describe_exit(p.returncode), secs))
    check_sanitizers(cmd, err)
    check(p.returncode == 0, "sptrace run: %s\n%s" % (describe_exit(p.returncode), err))
    return tdir


def main():
    check(len(sys.argv) == 3 and sys.argv[2] in CASES,
          "usage: test_bad_traces.py SPTRACE %s" % "|".join(CASES))
    exe, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    damage, must_fail, words = CASES[case]
    work = tempfile.mkdtemp(prefix="sptrace-e2e-badtrace-")
    env = dict(os.environ, SPTRACE_REPO=os.path.join(work, "repo"))
    try:
        if case == "ring-bytes-huge":
            tdir = make_trace(exe, work, env, ring_bytes=1 << 63)
            with open(os.path.join(tdir, "agent.log")) as f:
                log = f.read()
            check("SPTRACE_RING_BYTES %d is outside" % (1 << 63) in log,
                  "agent.log does not say the ring size was refused:\n" + log)
            print("ok")
            return
        tdir = make_trace(exe, work, env, flight=case == "seg-fifo")
        path = damage(tdir)
        errors = []
        for sub in ("replay", "report"):
            cmd = [exe, sub, tdir]
            p, secs = timed(cmd, env)
            err = p.stderr.decode(errors="replace").strip()
            print("%s %s: %s in %.2f s, %d bytes out\n  stderr: %s" %
                  (sub, case, describe_exit(p.returncode), secs, len(p.stdout), err[:2000]))
            check_sanitizers(cmd, err)
            if p.returncode < 0:
                errors.append("%s crashed: %s" % (sub, describe_exit(p.returncode)))
            elif must_fail and p.returncode == 0 and not (case.startswith("exec-") and
                                                          sub == "report"):
                errors.append("%s: exit status 0 on a trace it cannot read" % sub)
            elif not must_fail and p.returncode != 0:
                errors.append("%s: %s, expected 0 with a warning" %
                              (sub, describe_exit(p.returncode)))
            if len(p.stdout) > MAX_OUT:
                errors.append("%s printed %d bytes (over %d)" % (sub, len(p.stdout), MAX_OUT))
            # report does not follow exec lines: nothing to warn of there.
            if case.startswith("exec-") and sub == "report":
                continue
            if not err.startswith("sptrace: "):
                errors.append("%s: stderr does not start with 'sptrace: '" % sub)
            if path not in err:
                errors.append("%s: the message does not name the file %s" % (sub, path))
            why = err.replace(path, "<path>").lower()
            if not any(w in why for w in words):
                errors.append("%s: the message says none of %s" % (sub, words))
        if errors:
            fail("%s: %s" % (case, "; ".join(errors)))
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
