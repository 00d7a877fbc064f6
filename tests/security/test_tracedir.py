#!/usr/bin/env python3
"""test_tracedir.py SPTRACE CASE — trace directories against a hostile user
(issue 12, items 2 and 3, and private traces).  Root only.

  tracedir-old-link    in a shared sticky directory, user a plants links
                       where root's `sptrace run` rotates its trace:
                       sptrace.data.old/exec.1 -> a root-only directory, or
                       sptrace.data.old itself, or sptrace.data itself, a
                       link to it.  Root's command refuses, naming the link,
                       and the victim is untouched; root's own traces still
                       rotate (sptrace.data -> sptrace.data.old)
  tracedir-chown-race  root attaches to a's process with -o P/d, P a's
                       directory, while a swaps P/d for a link to a
                       root-owned directory as soon as it appears; over many
                       tries, the root directory's owner and content never
                       change
  tracedir-private     traces are their owner's: 0700 directories, 0600
                       files (umask 0 or not, exec'd images' subdirectories
                       too), for root's run and for root
                       attaching to a's process (the trace is then a's);
                       user b reads none of it.  --group G: 2750 and 0640 of
                       group G (under umask 077 too), a member reads, others
                       do not; a user not in G is refused
  tracedir-messages    attach 1 (init: refused, saying why), --on 'call '
                       (give a function name), run -- /tmp (a directory)
"""
import os
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seclib import (as_user, check, check_untouched, cleanup, fail, refused,  # noqa: E402
                    root_victim, shared_tmp, snapshot, spawn_as, user_env, user_sptrace,
                    users)


def root_env(tmp):
    """Root's environment with a repository of the test's own."""
    return dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo-root"))


def run_root(cmd, cwd, tmp, timeout=120, **kw):
    try:
        return subprocess.run(cmd, cwd=cwd, env=root_env(tmp), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        fail("timed out after %d s: %s" % (timeout, " ".join(cmd)))


def mode_of(path):
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def check_tree(top, dmode, fmode, uid, gid, what):
    """Every directory under top (top included) has dmode, every file fmode,
    all owned by uid (and gid unless None)."""
    n = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for p, want in [(dirpath, dmode)] + [(os.path.join(dirpath, f), fmode)
                                              for f in filenames]:
            st = os.lstat(p)
            if stat.S_ISFIFO(st.st_mode):
                want = 0o600                     # the control FIFO: the owner's only
            m = stat.S_IMODE(st.st_mode)
            check(m == want, "%s: %s has mode %o, expected %o" % (what, p, m, want))
            check(st.st_uid == uid, "%s: %s belongs to uid %d, expected %d"
                  % (what, p, st.st_uid, uid))
            check(gid is None or st.st_gid == gid, "%s: %s has group %d, expected %s"
                  % (what, p, st.st_gid, gid))
            n += 1
    check(n >= 3, "%s: %s holds almost nothing (%d entries)" % (what, top, n))
    return n


def user_sleeper(user, seconds=120):
    """A process of `user` that attach can take (it waits in nanosleep)."""
    p = spawn_as(user, ["/bin/sleep", str(seconds)], stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.2)
    return p


def stop_proc(p):
    if p and p.poll() is None:
        p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# ---- item 3: rotation and removal never follow links ----

def case_old_link(exe, tmp):
    a, b = users()
    shared = shared_tmp()
    try:
        mine = user_sptrace(exe, shared)
        victim = root_victim(shared)
        before = snapshot(victim)

        # Root's own traces rotate as before, private.
        work = os.path.join(shared, "root-own")
        os.mkdir(work, 0o755)
        for i in range(3):
            r = run_root([mine, "run", "--", "/bin/true"], work, tmp)
            check(r.returncode == 0, "root's own run %d: %s" % (i, r.stderr))
        check(os.path.isdir(os.path.join(work, "sptrace.data.old")),
              "root's second run did not keep the first trace as sptrace.data.old")

        variants = {
            # a's sptrace.data.old holding exec.1 -> the victim
            "old/exec.1": ("sptrace.data.old/exec.1", "sptrace.data.old"),
            # sptrace.data.old itself a link to the victim
            "old": ("sptrace.data.old", "sptrace.data.old"),
            # sptrace.data itself a link to the victim
            "data": ("sptrace.data", "sptrace.data"),
        }
        for name, (link, named) in variants.items():
            work = os.path.join(shared, "w-" + name.replace("/", "-"))
            os.mkdir(work)
            os.chmod(work, 0o1777)                   # a shared sticky directory
            if name != "data":
                # root's previous trace, as a root run there leaves it
                r = run_root([mine, "run", "--", "/bin/true"], work, tmp)
                check(r.returncode == 0, "%s: root's first run: %s" % (name, r.stderr))
            if name == "old/exec.1":
                as_user(a, ["mkdir", os.path.join(work, "sptrace.data.old")], timeout=30)
            r = as_user(a, ["ln", "-s", victim, os.path.join(work, link)], timeout=30)
            check(r.returncode == 0, "%s: user a cannot plant the link: %s" % (name, r.stderr))
            data_before = (snapshot(os.path.join(work, "sptrace.data"))
                           if name != "data" else None)
            for attempt in (1, 2):               # a second run deletes through a kept link
                r = run_root([mine, "run", "--", "/bin/true"], work, tmp)
                print("%s, run %d: exit %d, %s" % (name, attempt, r.returncode, r.stderr.strip()))
                check_untouched(victim, before, "%s, root's run %d" % (name, attempt))
                refused(r, [named], "%s: root's run %d with a planted link" % (name, attempt))
            check(os.path.islink(os.path.join(work, link)),
                  "%s: the link %s was not left alone" % (name, link))
            if data_before is not None:
                check_untouched(os.path.join(work, "sptrace.data"), data_before,
                                "%s: root's previous trace" % name)
    finally:
        cleanup(shared)


# ---- item 2: the new directory is given away through its descriptor ----

# Run as user a: the interpreter every user can reach (not a pyenv under /root).
SYSTEM_PYTHON = "/usr/bin/python3"

RACER = r"""
import ctypes, os, struct, sys, time
parent, victim, end = sys.argv[1], sys.argv[2], float(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC)
IN_CREATE, IN_MOVED_TO = 0x100, 0x80
if fd < 0 or libc.inotify_add_watch(fd, parent.encode(), IN_CREATE | IN_MOVED_TO) < 0:
    sys.exit("inotify: %d" % ctypes.get_errno())
target = os.path.join(parent, "d")
n = 0
while time.time() < end:
    buf = os.read(fd, 4096)
    off = 0
    while off < len(buf):
        wd, mask, cookie, ln = struct.unpack_from("iIII", buf, off)
        name = buf[off + 16:off + 16 + ln].rstrip(b"\0").decode()
        off += 16 + ln
        if name != "d" or os.path.islink(target):    # not the link made below
            continue
        try:
            n += 1
            os.rename(target, os.path.join(parent, "moved.%d" % n))
            os.symlink(victim, target)
        except OSError:
            pass
"""


def case_chown_race(exe, tmp):
    a, b = users()
    check(os.access(SYSTEM_PYTHON, os.X_OK), "%s is missing (Debian's python3)" % SYSTEM_PYTHON)
    shared = shared_tmp()
    racer = None
    try:
        mine = user_sptrace(exe, shared)
        victim = root_victim(shared)
        before = snapshot(victim)
        parent = os.path.join(shared, "a-dir")
        as_user(a, ["mkdir", "-m", "0755", parent], timeout=30)
        repo = os.path.join(shared, "repo-a")
        as_user(a, ["mkdir", "-m", "0700", repo], timeout=30)
        script = os.path.join(shared, "racer.py")
        with open(script, "w") as f:
            f.write(RACER)
        os.chmod(script, 0o644)
        deadline = time.time() + 60
        racer = spawn_as(a, [SYSTEM_PYTHON, script, parent, victim, str(deadline + 5)],
                         stdin=subprocess.DEVNULL)
        time.sleep(0.5)
        tries = 0
        while tries < 30 and time.time() < deadline:
            tries += 1
            target = user_sleeper(a)
            try:
                env = dict(root_env(tmp), SPTRACE_REPO=repo)
                r = subprocess.run([mine, "attach", "--on", "signal", "--timeout", "20", "-o",
                                    os.path.join(parent, "d"), str(target.pid)],
                                   env=env, capture_output=True, text=True, timeout=60,
                                   stdin=subprocess.DEVNULL)
                print("try %d: exit %d, %s" % (tries, r.returncode,
                                               (r.stderr or r.stdout).strip()[:200]))
            except subprocess.TimeoutExpired:
                fail("attach timed out after 60 s")
            finally:
                stop_proc(target)
            check_untouched(victim, before, "try %d of root's attach while a swaps the "
                            "directory for a link" % tries)
            # the next try starts with no d
            for n in os.listdir(parent):
                p = os.path.join(parent, n)
                if os.path.islink(p):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
                else:
                    subprocess.run(["rm", "-rf", "--one-file-system", p], timeout=30)
        print("%d tries, the victim untouched" % tries)
        check(tries >= 5, "only %d tries in 60 s" % tries)
    finally:
        stop_proc(racer)
        cleanup(shared)


# ---- private traces ----

# A program that execs another: the exec'd image's trace is a subdirectory.
EXECS = ["/bin/sh", "-c", "/bin/ls / >/dev/null; /bin/true"]


def readable_by(user, path):
    r = as_user(user, ["cat", path], timeout=30)
    return r.returncode == 0


def case_private(exe, tmp):
    a, b = users()
    shared = shared_tmp()
    target = None
    try:
        mine = user_sptrace(exe, shared)

        # root's run, with umask 0: still 0700/0600
        work = os.path.join(shared, "root-run")
        os.mkdir(work, 0o755)
        r = run_root([mine, "run", "--"] + EXECS, work, tmp, preexec_fn=lambda: os.umask(0))
        check(r.returncode == 0, "root's run: %s" % r.stderr)
        tdir = os.path.join(work, "sptrace.data")
        check_tree(tdir, 0o700, 0o600, 0, None, "root's run (umask 0)")
        check(any(n.startswith("exec.") for n in os.listdir(tdir)),
              "root's run of %s: no exec'd image's trace" % EXECS)
        check(not readable_by(b, os.path.join(tdir, "meta")), "user b reads root's trace")
        check(as_user(b, ["ls", tdir], timeout=30).returncode != 0, "user b lists root's trace")

        # root attaches to a's process: the trace is a's, 0700/0600
        repo = os.path.join(shared, "repo-a")
        as_user(a, ["mkdir", "-m", "0700", repo], timeout=30)
        env = dict(root_env(tmp), SPTRACE_REPO=repo)
        target = user_sleeper(a)
        tdir = os.path.join(work, "attached")
        r = subprocess.run([mine, "attach", "--on", "signal", "-o", tdir, str(target.pid)],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        check(r.returncode == 0, "root's attach to a's pid %d: %s%s" % (target.pid, r.stdout,
                                                                         r.stderr))
        check_tree(tdir, 0o700, 0o600, a.uid, None, "root's attach to a's process")
        check(readable_by(a, os.path.join(tdir, "meta")), "a cannot read its own trace")
        check(not readable_by(b, os.path.join(tdir, "meta")), "user b reads a's trace")
        stop_proc(target)

        # --group b's group: 2750/0640, b reads, a does not (root's run)
        tdir = os.path.join(work, "shared-run")
        r = run_root([mine, "run", "--group", str(b.gid), "-o", tdir, "--"] + EXECS, work, tmp,
                     preexec_fn=lambda: os.umask(0o077))
        check(r.returncode == 0, "root's run --group: %s" % r.stderr)
        check_tree(tdir, 0o2750, 0o640, 0, b.gid, "root's run --group %d" % b.gid)
        check(readable_by(b, os.path.join(tdir, "meta")), "b, in the group, cannot read")
        check(not readable_by(a, os.path.join(tdir, "meta")), "a, not in the group, reads")

        # --group on root's attach to a's process: a's trace, b's group
        target = user_sleeper(a)
        tdir = os.path.join(work, "shared-attach")
        r = subprocess.run([mine, "attach", "--on", "signal", "--group", "sptrace-sec-b", "-o",
                            tdir, str(target.pid)], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        check(r.returncode == 0, "root's attach --group: %s%s" % (r.stdout, r.stderr))
        check_tree(tdir, 0o2750, 0o640, a.uid, b.gid, "root's attach --group to a's process")
        check(readable_by(b, os.path.join(tdir, "meta")), "b, in the group, cannot read")
        stop_proc(target)

        # a's own run: 0700/0600; with --group of a group a is not in: refused
        awork = os.path.join(shared, "a-work")
        as_user(a, ["mkdir", "-m", "0755", awork], timeout=30)
        r = as_user(a, [mine, "run", "--", "/bin/true"], cwd=awork, timeout=120,
                    env=user_env(a, SPTRACE_REPO=repo))
        check(r.returncode == 0, "a's run: %s" % r.stderr)
        check_tree(os.path.join(awork, "sptrace.data"), 0o700, 0o600, a.uid, None, "a's run")
        r = as_user(a, [mine, "run", "--group", str(b.gid), "-o", "g", "--", "/bin/true"],
                    cwd=awork, timeout=120, env=user_env(a, SPTRACE_REPO=repo))
        refused(r, ["--group", "not a member"], "a's run --group of b's group")
        check(not os.path.exists(os.path.join(awork, "g")),
              "a's refused run --group left its directory")
    finally:
        stop_proc(target)
        cleanup(shared)


# ---- messages ----

def case_messages(exe, tmp):
    work = os.path.join(tmp, "msg")
    os.mkdir(work)
    r = run_root([exe, "attach", "1"], work, tmp, timeout=60)
    print("attach 1: %s" % r.stderr.strip())
    refused(r, ["pid 1", "init"], "attach 1")
    check("another user" not in r.stderr, "attach 1 (as root) says 'another user': %r"
          % r.stderr)
    sleeper = subprocess.Popen(["/bin/sleep", "120"], stdin=subprocess.DEVNULL)
    try:
        for cmd in (["run", "--on", "call ", "--", "/bin/true"],
                    ["attach", "--on", "call ", "-o", "a", str(sleeper.pid)]):
            r = run_root([exe] + cmd, work, tmp, timeout=60)
            print("%s: %s" % (" ".join(cmd), r.stderr.strip()))
            refused(r, ["give a function name"], " ".join(cmd))
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
    r = run_root([exe, "run", "--", "/tmp"], work, tmp, timeout=60)
    print("run -- /tmp: %s" % r.stderr.strip())
    refused(r, ["/tmp", "is a directory"], "run -- /tmp")
    check("Permission denied" not in r.stderr, "run -- /tmp: %r" % r.stderr)
    check(os.listdir(work) == [], "the refused commands left %s" % os.listdir(work))


CASES = {
    "tracedir-old-link": case_old_link,
    "tracedir-chown-race": case_chown_race,
    "tracedir-private": case_private,
    "tracedir-messages": case_messages,
}


def main():
    exe, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    if case not in CASES:
        fail("unknown case %s" % case)
    users()
    with tempfile.TemporaryDirectory(prefix="sptrace-tracedir-") as tmp:
        CASES[case](exe, tmp)
    print("ok")


if __name__ == "__main__":
    main()
