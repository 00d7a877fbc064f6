"""seclib.py — what the security tests (issue 12) share: two unprivileged
users, running a command as one of them, copies of sptrace they can run, and
snapshots that prove a victim file or directory was left untouched.

Each test plays a hostile local user against root's `sptrace` (or against
the other user's) and checks two things: the command refuses with a clear
message, and the victim is byte for byte and owner for owner as before.

The users are made once per machine with useradd (system users, no home,
no login shell); a lock file keeps two tests from running useradd at once.
"""

import fcntl
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2elib import check, check_sanitizers, describe_exit, fail  # noqa: E402,F401

USERS = ("sptrace-sec-a", "sptrace-sec-b")


class User:
    def __init__(self, name):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, pw.pw_uid, pw.pw_gid

    def __repr__(self):
        return "%s (uid %d)" % (self.name, self.uid)


def users():
    """The two unprivileged users (hostile and victim), made if missing."""
    if os.geteuid() != 0:
        fail("the security tests run as root (they play other users against root's sptrace)")
    with open("/tmp/sptrace-sec-users.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                r = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir",
                                    "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                                   capture_output=True, text=True)
                if r.returncode != 0 and "already exists" not in r.stderr:
                    fail("useradd %s: %s" % (name, r.stderr.strip()))
    return tuple(User(n) for n in USERS)


def user_env(user, **extra):
    """A minimal environment for `user`: no XDG_RUNTIME_DIR of root's."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "USER": user.name,
           "LANG": "C"}
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra)
    return env


def _demote(user):
    def f():
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)
    return f


def as_user(user, cmd, env=None, timeout=60, **kw):
    """Run `cmd` as `user` to its end; the CompletedProcess (text)."""
    return subprocess.run(cmd, env=env or user_env(user), preexec_fn=_demote(user),
                          capture_output=True, text=True, timeout=timeout, **kw)


def spawn_as(user, cmd, env=None, **kw):
    """Start `cmd` as `user`; the Popen."""
    return subprocess.Popen(cmd, env=env or user_env(user), preexec_fn=_demote(user), **kw)


def shared_tmp():
    """A fresh directory every user can enter and write, sticky like /tmp
    (removed by the caller with cleanup())."""
    d = tempfile.mkdtemp(prefix="sptrace-sec.")
    os.chmod(d, 0o1777)
    return d


def cleanup(path):
    shutil.rmtree(path, ignore_errors=True)


def user_sptrace(sptrace, tmp):
    """A copy of sptrace and its agent that every user can run (the build
    tree may sit in a directory other users cannot enter), in tmp."""
    root = os.path.join(tmp, "sptrace-bin")
    src_agent = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sptrace))),
                             "agent", "libsptrace-agent.so")
    for sub in ("", "cli", "agent"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        os.chmod(os.path.join(root, sub), 0o755)
    dst = os.path.join(root, "cli", "sptrace")
    shutil.copy2(sptrace, dst)
    shutil.copy2(src_agent, os.path.join(root, "agent", "libsptrace-agent.so"))
    os.chmod(dst, 0o755)
    os.chmod(os.path.join(root, "agent", "libsptrace-agent.so"), 0o755)
    return dst


def root_victim(tmp, name="victim"):
    """A root-only directory (0700) holding a root-only file (0600) with
    known content: what a hostile user must never get written, chowned or
    deleted.  The directory's path."""
    d = os.path.join(tmp, name)
    os.mkdir(d, 0o700)
    os.chmod(d, 0o700)
    for f in ("secret", "meta", "agent.log", "ring.1"):
        p = os.path.join(d, f)
        with open(p, "w") as fh:
            fh.write("root's %s, not to be touched\n" % f)
        os.chmod(p, 0o600)
    return d


def snapshot(path):
    """Every entry under `path` (not following links): its type, owner,
    mode and content hash."""
    snap = {}
    st = os.lstat(path)
    snap["."] = (stat.S_IFMT(st.st_mode), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), None)
    if stat.S_ISDIR(st.st_mode):
        for dirpath, dirnames, filenames in os.walk(path):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                s = os.lstat(p)
                h = None
                if stat.S_ISREG(s.st_mode):
                    with open(p, "rb") as fh:
                        h = hashlib.sha256(fh.read()).hexdigest()
                snap[os.path.relpath(p, path)] = (stat.S_IFMT(s.st_mode), s.st_uid, s.st_gid,
                                                  stat.S_IMODE(s.st_mode), h)
    elif stat.S_ISREG(st.st_mode):
        with open(path, "rb") as fh:
            snap["."] = snap["."][:4] + (hashlib.sha256(fh.read()).hexdigest(),)
    return snap


def check_untouched(path, before, what):
    """Fail, naming each difference, unless `path` is as `before`."""
    after = snapshot(path)
    if after != before:
        diffs = []
        for k in sorted(set(before) | set(after)):
            if before.get(k) != after.get(k):
                diffs.append("%s: %r -> %r" % (k, before.get(k), after.get(k)))
        fail("%s: the victim %s was changed:\n  %s" % (what, path, "\n  ".join(diffs[:20])))


def refused(r, words, what):
    """`r` (a CompletedProcess) failed with an 'sptrace: ' message holding
    each of `words`."""
    check(r.returncode != 0,
          "%s: accepted (exit 0); stdout %r stderr %r" % (what, r.stdout, r.stderr))
    check(r.returncode > 0, "%s: %s; stderr %r" % (what, describe_exit(r.returncode), r.stderr))
    check("sptrace: " in r.stderr and all(w in r.stderr for w in words),
          "%s: expected a message with %r, got: %r" % (what, words, r.stderr))
