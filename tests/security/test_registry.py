"""test_registry.py — `sptrace stop` and `sptrace activate` write only into
the agent's own FIFO, found in a registry no other user could have written
(issue 12, items 1 and 5; common/registry.h states the rules).

    test_registry.py SPTRACE CASE

Cases, each an attack by sptrace-sec-a (the hostile user):

  registry-control-link  root attached to a's process; a replaces the trace
                         directory's `control` FIFO by a link to a root file
                         (then by a root-owned FIFO's trace directory) before
                         root's stop and activate.
  registry-xdg-planted   a's untraced process has an XDG_RUNTIME_DIR of a's
                         whose registry leads to a `control` link to a root
                         file, or to a root daemon's FIFO; root activates it.
  registry-foreign-dir   a makes /tmp/sptrace-<b> (0777, then a link) before
                         b's first use and plants an entry leading to b's
                         file: b's agent must not register there, b's stop
                         must refuse the dir.
  registry-root-dir      root runs sptrace with the XDG_RUNTIME_DIR of a's
                         (as `su` without `-` leaves it): root's agent must
                         not register there, root's stop must refuse it.
                         (/tmp/sptrace-0 itself is shared by every root test
                         on the machine and is not planted here: it passes
                         through the same check.)
  control-messages       --timeout -1 / abc / 0, an empty pid, a pid with
                         leading zeros, and b stopping a's traced process.
  registry-dropped-privileges
                         no attack: root's traced program that dropped to
                         a's uid (its FIFO root's) still takes root's
                         commands, and b is told it is another user's.

Each checks the refusal and its message, that the victim is untouched, and
(where the attack left something to stop) that the command works once the
plant is gone, so no case passes by stop being broken.
"""

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import check, check_sanitizers, fail, refused  # noqa: E402

TIMEOUT = 60          # every command of the test


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def entry_name(pid):
    """The registry entry of process `pid`: <pid>-<start time>."""
    return "%d-%s" % (pid, start_time(pid))


def cmd_as(user, cmd, env=None):
    """Run an sptrace command as `user` (None: root); the CompletedProcess."""
    try:
        if user is None:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
                               stdin=subprocess.DEVNULL)
        else:
            r = seclib.as_user(user, cmd, env=env, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("timed out after %d s: %s" % (TIMEOUT, " ".join(cmd)))
    check_sanitizers(cmd, r.stderr)
    return r


def ok(r, words, what):
    check(r.returncode == 0 and all(w in r.stdout for w in words),
          "%s: expected success with %r, got exit %d: %r %r" %
          (what, words, r.returncode, r.stdout, r.stderr))


def kill(p):
    if p and p.poll() is None:
        p.kill()
    if p:
        try:
            p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pass


def wait_for(cond, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            fail("%s: not within %d s" % (what, seconds))
        time.sleep(0.05)


def agent_ready(tdir):
    """The agent in tdir is dormant, its control thread listening."""
    try:
        with open(os.path.join(tdir, "agent.log")) as f:
            return "dormant" in f.read()
    except OSError:
        return False


def log_of(tdir):
    with open(os.path.join(tdir, "agent.log")) as f:
        return f.read()


def sleeper_as(user, env=None):
    """`sleep 120` as `user` (None: root); the Popen."""
    if user is None:
        return subprocess.Popen(["/bin/sleep", "120"], env=env or {"PATH": "/usr/bin:/bin"})
    return seclib.spawn_as(user, ["/bin/sleep", "120"], env=env)


@contextlib.contextmanager
def traced_run(user, usp, tmp, tdir, env, errs=None):
    """`sptrace run --on signal -o tdir -- sleep 120` as `user` (None:
    root), its agent dormant: yields the pid of the traced program.  Its
    stderr is appended to errs at the end."""
    cmd = [usp, "run", "--on", "signal", "-o", tdir, "--", "/bin/sleep", "120"]
    env = dict(env, SPTRACE_REPO=os.path.join(tmp, "repo-%s" % (user.name if user else "root")))
    if user is None:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    else:
        p = seclib.spawn_as(user, cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    child = None
    try:
        def started():
            nonlocal child
            if p.poll() is not None:
                fail("sptrace run ended early: %s" % p.stderr.read())
            try:
                kids = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
            except OSError:
                return False
            child = int(kids[0]) if kids else None
            return child is not None and agent_ready(tdir)
        wait_for(started, "sptrace run's agent dormant in %s" % tdir, 120)
        yield child
    finally:
        for pid in (child, p.pid):
            try:
                if pid:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            err = p.communicate(timeout=TIMEOUT)[1]
        except subprocess.TimeoutExpired:
            err = ""
        if errs is not None:
            errs.append(err)


def attach(usp, tmp, tdir, pid):
    r = cmd_as(None, [usp, "attach", "--on", "signal", "-o", tdir, str(pid)],
               env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo-root")))
    ok(r, ["dormant until"], "attach to pid %d" % pid)
    wait_for(lambda: agent_ready(tdir), "the attached agent dormant")


def read_fifo(fd):
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def root_fifo(tmp, name):
    """A root daemon's command FIFO, DIR/control in a root-only directory,
    with a reader holding it open (so a writer would get through): the
    directory and the reader's descriptor."""
    d = os.path.join(tmp, name)
    os.mkdir(d, 0o700)
    os.mkfifo(os.path.join(d, "control"), 0o600)
    return d, os.open(os.path.join(d, "control"), os.O_RDONLY | os.O_NONBLOCK)


def case_control_link(usp, tmp, a, b):
    """Item 1a: the trace directory is a's; a swaps its `control`."""
    victim = seclib.root_victim(tmp)
    before = seclib.snapshot(victim)
    tdir = os.path.join(tmp, "trace")
    p = sleeper_as(a)
    try:
        attach(usp, tmp, tdir, p.pid)
        ctl = os.path.join(tdir, "control")
        r = seclib.as_user(a, ["sh", "-c", 'mv "$1" "$1.real" && ln -s "$2" "$1"', "-",
                               ctl, os.path.join(victim, "secret")])
        check(r.returncode == 0, "a could not plant the link: %r" % r.stderr)
        for what in ("stop", "activate"):
            r = cmd_as(None, [usp, what, "--timeout", "3", str(p.pid)])
            seclib.check_untouched(victim, before, "root's %s through a planted link" % what)
            refused(r, ["refused", ctl, "symbolic link", "nothing written"],
                    "root's %s through a planted control link" % what)
        # A FIFO is not enough: a root daemon's FIFO is not the agent's.
        daemon, reader = root_fifo(tmp, "daemon")
        try:
            r = seclib.as_user(a, ["sh", "-c", 'rm "$1" && ln -s "$2" "$1"', "-", ctl,
                                   os.path.join(daemon, "control")])
            check(r.returncode == 0, "a could not plant the second link: %r" % r.stderr)
            r = cmd_as(None, [usp, "stop", "--timeout", "3", str(p.pid)])
            check(read_fifo(reader) == b"", "root's stop reached the root daemon's FIFO")
            refused(r, ["refused", ctl], "root's stop through a link to a root FIFO")
        finally:
            os.close(reader)
        r = seclib.as_user(a, ["sh", "-c", 'rm "$1" && mv "$1.real" "$1"', "-", ctl])
        check(r.returncode == 0, "could not put control back: %r" % r.stderr)
        # The plant gone, the commands work (the refusals were not a broken stop).
        ok(cmd_as(None, [usp, "activate", str(p.pid)]), ["tracing"], "activate, control restored")
        ok(cmd_as(None, [usp, "stop", str(p.pid)]), ["tracing stopped"], "stop, control restored")
    finally:
        kill(p)
    seclib.check_untouched(victim, before, "root's commands")


def plant_registry(user, registry, pid, target):
    """As `user`: registry/<pid>-<start> -> target."""
    r = seclib.as_user(user, ["ln", "-sfn", target, os.path.join(registry, entry_name(pid))])
    check(r.returncode == 0, "%s could not plant an entry in %s: %r" % (user.name, registry,
                                                                         r.stderr))


def fake_trace_dir(user, tmp, name, control_to):
    """A directory of `user`'s whose `control` is a link to control_to."""
    d = os.path.join(tmp, name)
    r = seclib.as_user(user, ["sh", "-c", 'mkdir -m 755 "$1" && ln -s "$2" "$1/control"', "-",
                              d, control_to])
    check(r.returncode == 0, "%s could not make %s: %r" % (user.name, d, r.stderr))
    return d


def case_xdg_planted(usp, tmp, a, b):
    """Item 1b: no trace at all; a's process names a registry of a's."""
    victim = seclib.root_victim(tmp)
    before = seclib.snapshot(victim)
    xdg = os.path.join(tmp, "xdg-a")
    r = seclib.as_user(a, ["mkdir", "-m", "700", "-p", os.path.join(xdg, "sptrace")])
    check(r.returncode == 0, "a could not make its XDG_RUNTIME_DIR: %r" % r.stderr)
    p = sleeper_as(a, seclib.user_env(a, XDG_RUNTIME_DIR=xdg))
    daemon, reader = root_fifo(tmp, "daemon")
    try:
        fake = fake_trace_dir(a, tmp, "fake", os.path.join(victim, "secret"))
        plant_registry(a, os.path.join(xdg, "sptrace"), p.pid, fake)
        r = cmd_as(None, [usp, "activate", "--timeout", "3", str(p.pid)])
        seclib.check_untouched(victim, before, "root's activate through a's registry")
        refused(r, ["refused", os.path.join(fake, "control"), "symbolic link"],
                "root's activate through a's registry")
        # The entry leads straight to a root daemon's directory and FIFO.
        plant_registry(a, os.path.join(xdg, "sptrace"), p.pid, daemon)
        for what in ("activate", "stop"):
            r = cmd_as(None, [usp, what, "--timeout", "3", str(p.pid)])
            check(read_fifo(reader) == b"", "root's %s reached the root daemon's FIFO" % what)
            refused(r, ["refused", os.path.join(daemon, "control"), "owned by uid 0"],
                    "root's %s into a root FIFO named by a's registry" % what)
    finally:
        kill(p)
        os.close(reader)
    seclib.check_untouched(victim, before, "root's commands")


@contextlib.contextmanager
def foreign_registry(path):
    """`path`, a global registry dir (of a user only the tests use), removed
    before and after; a lock keeps two tests from planting it at once."""
    with open("/tmp/sptrace-sec-registry.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(2):
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            shutil.rmtree(path, ignore_errors=True)
        try:
            yield path
        finally:
            if os.path.islink(path):
                os.unlink(path)
            shutil.rmtree(path, ignore_errors=True)


def b_victim(tmp, b):
    """A file of b's own, 0600, in a directory of b's."""
    d = os.path.join(tmp, "b-files")
    os.mkdir(d, 0o700)
    with open(os.path.join(d, "notes"), "w") as f:
        f.write("b's notes, not to be touched\n")
    os.chmod(os.path.join(d, "notes"), 0o600)
    os.chown(os.path.join(d, "notes"), b.uid, b.gid)
    os.chown(d, b.uid, b.gid)
    return d


def case_foreign_dir(usp, tmp, a, b):
    """Item 5: a makes b's /tmp/sptrace-<uid> before b does."""
    victim = b_victim(tmp, b)
    before = seclib.snapshot(victim)
    fake = fake_trace_dir(a, tmp, "fake", os.path.join(victim, "notes"))
    env = seclib.user_env(b)
    with foreign_registry("/tmp/sptrace-%d" % b.uid) as reg:
        r = seclib.as_user(a, ["sh", "-c", 'mkdir "$1" && chmod 777 "$1"', "-", reg])
        check(r.returncode == 0, "a could not make %s: %r" % (reg, r.stderr))
        tdir = os.path.join(tmp, "trace-b")
        errs = []
        with traced_run(b, usp, tmp, tdir, env, errs) as pid:
            check(not os.listdir(reg), "b's agent registered in a's %s: %r" %
                  (reg, os.listdir(reg)))
            log = log_of(tdir)
            check("not registered" in log and reg in log and "uid %d" % a.uid in log,
                  "agent.log does not say why the agent did not register:\n" + log)
            plant_registry(a, reg, pid, fake)
            for what in ("stop", "activate"):
                r = cmd_as(b, [usp, what, "--timeout", "3", str(pid)], env=env)
                seclib.check_untouched(victim, before, "b's %s through a's registry" % what)
                refused(r, [reg, "owned by uid %d" % a.uid, "mode 0777", "remove it"],
                        "b's %s through a's registry dir" % what)
            r = cmd_as(b, [usp, "stop", "--all"], env=env)
            seclib.check_untouched(victim, before, "b's stop --all")
            refused(r, [reg, "owned by uid %d" % a.uid], "b's stop --all in a's registry dir")
            # A link named like the dir, to a's dir: refused as well.
            shutil.rmtree(reg)
            os.symlink(os.path.join(tmp, "a-reg"), reg)
            r = seclib.as_user(a, ["mkdir", "-m", "777", os.path.join(tmp, "a-reg")])
            check(r.returncode == 0, "a could not make its dir: %r" % r.stderr)
            plant_registry(a, reg, pid, fake)
            r = cmd_as(b, [usp, "stop", "--timeout", "3", str(pid)], env=env)
            seclib.check_untouched(victim, before, "b's stop through a registry link")
            refused(r, [reg, "symbolic link"], "b's stop through a registry link")
        check("warning: %s is owned by uid %d" % (reg, a.uid) in errs[0] and
              "will not find the program" in errs[0],
              "sptrace run did not warn of a's registry dir: %r" % errs[0])
        # b's own registry, made by b's agent: the commands work.
        os.unlink(reg)
        with traced_run(b, usp, tmp, os.path.join(tmp, "trace-b2"), env) as pid:
            st = os.lstat(reg)
            check(stat.S_ISDIR(st.st_mode) and st.st_uid == b.uid and
                  stat.S_IMODE(st.st_mode) == 0o700,
                  "b's agent made %s with owner %d mode %o" % (reg, st.st_uid, st.st_mode))
            ok(cmd_as(b, [usp, "activate", str(pid)], env=env), ["tracing"], "b's own activate")
            ok(cmd_as(b, [usp, "stop", str(pid)], env=env), ["tracing stopped"], "b's own stop")
            # stop --all stops what is registered, and removes nothing else.
            r = seclib.as_user(b, ["touch", os.path.join(reg, "not-an-entry")])
            check(r.returncode == 0, "b could not make a file in its registry: %r" % r.stderr)
            ok(cmd_as(b, [usp, "stop", "--all"], env=env), ["pid %d: tracing stopped" % pid],
               "b's own stop --all")
            check(os.path.exists(os.path.join(reg, "not-an-entry")),
                  "b's stop --all removed a file that is no entry")
    seclib.check_untouched(victim, before, "b's commands")


def case_root_dir(usp, tmp, a, b):
    """Item 5 for root: root's sptrace with XDG_RUNTIME_DIR of a's."""
    victim = seclib.root_victim(tmp)
    before = seclib.snapshot(victim)
    xdg = os.path.join(tmp, "xdg-a")
    r = seclib.as_user(a, ["mkdir", "-m", "700", "-p", os.path.join(xdg, "sptrace")])
    check(r.returncode == 0, "a could not make its XDG_RUNTIME_DIR: %r" % r.stderr)
    fake = fake_trace_dir(a, tmp, "fake", os.path.join(victim, "secret"))
    env = dict(os.environ, XDG_RUNTIME_DIR=xdg)
    tdir = os.path.join(tmp, "trace-root")
    errs = []
    with traced_run(None, usp, tmp, tdir, env, errs) as pid:
        check(not os.listdir(os.path.join(xdg, "sptrace")),
              "root's agent registered in a's %s/sptrace" % xdg)
        log = log_of(tdir)
        check("not registered" in log and xdg in log,
              "agent.log does not say why the agent did not register:\n" + log)
        plant_registry(a, os.path.join(xdg, "sptrace"), pid, fake)
        r = cmd_as(None, [usp, "stop", "--timeout", "3", str(pid)], env=env)
        seclib.check_untouched(victim, before, "root's stop through a's XDG_RUNTIME_DIR")
        refused(r, [xdg, "owned by uid %d" % a.uid], "root's stop through a's XDG_RUNTIME_DIR")
        r = cmd_as(None, [usp, "stop", "--all"], env=env)
        seclib.check_untouched(victim, before, "root's stop --all")
        refused(r, [xdg, "owned by uid %d" % a.uid], "root's stop --all in a's XDG_RUNTIME_DIR")
    check("warning: %s is owned by uid %d" % (xdg, a.uid) in errs[0],
          "sptrace run did not warn of a's XDG_RUNTIME_DIR: %r" % errs[0])
    seclib.check_untouched(victim, before, "root's commands")


def case_messages(usp, tmp, a, b):
    """The messages of stop and activate (issue 12)."""
    for what in ("stop", "activate"):
        for t in ("-1", "abc", "0", "inf"):
            r = cmd_as(None, [usp, what, "--timeout", t, "1"])
            refused(r, ["--timeout", "positive number of seconds", "'%s'" % t],
                    "%s --timeout %s" % (what, t))
        r = cmd_as(None, [usp, what, ""])
        refused(r, ["'' is not a process id"], "%s ''" % what)
        r = cmd_as(None, [usp, what, "0"])
        refused(r, ["'0' is not a process id"], "%s 0" % what)
    env = seclib.user_env(a)
    with traced_run(a, usp, tmp, os.path.join(tmp, "trace-a"), env) as pid:
        r = cmd_as(b, [usp, "stop", str(pid)])
        refused(r, ["pid %d is owned by another user" % pid, a.name, "as root"],
                "b's stop of a's traced process")
        # Leading zeros name the same process.
        ok(cmd_as(a, [usp, "activate", "00%d" % pid], env=env),
           ["pid %d: tracing" % pid], "activate 00PID")
        ok(cmd_as(None, [usp, "stop", "000%d" % pid]),
           ["pid %d: tracing stopped" % pid], "root's stop 000PID")


def case_dropped(usp, tmp, a, b):
    """Not an attack: a program root started under sptrace that dropped to
    a's uid since.  Its FIFO is root's, its entry in root's registry: root's
    commands still reach it (the FIFO's owner made the entry), b's do not."""
    tdir = os.path.join(tmp, "trace-dropped")
    prog = "import os, time; os.setuid(%d); print('dropped', flush=True); time.sleep(120)" % a.uid
    p = subprocess.Popen([usp, "run", "--on", "signal", "-o", tdir, "--", "/usr/bin/python3", "-c",
                          prog], env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo-root")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        check(p.stdout.readline().strip() == "dropped", "the program did not drop to a's uid")
        child = int(open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()[0])
        wait_for(lambda: agent_ready(tdir), "the agent dormant")
        # The agent, now a's, cannot append to root's meta (so the command
        # waits for a confirmation in vain): agent.log says it was reached.
        for what, said in (("activate", "(sptrace activate)"), ("stop", "stopped (sptrace stop)")):
            r = cmd_as(None, [usp, what, "--timeout", "2", str(child)])
            check("refused" not in r.stderr,
                  "root's %s after setuid refused: %r" % (what, r.stderr))
            wait_for(lambda: said in log_of(tdir), "root's %s reached the agent" % what, 10)
        r = cmd_as(b, [usp, "stop", str(child)])
        refused(r, ["owned by another user", a.name], "b's stop of the dropped program")
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        kill(p)


CASES = {
    "registry-control-link": case_control_link,
    "registry-xdg-planted": case_xdg_planted,
    "registry-foreign-dir": case_foreign_dir,
    "registry-root-dir": case_root_dir,
    "control-messages": case_messages,
    "registry-dropped-privileges": case_dropped,
}


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    if case not in CASES:
        fail("unknown case %s" % case)
    a, b = seclib.users()
    tmp = seclib.shared_tmp()
    try:
        usp = seclib.user_sptrace(sptrace, tmp)
        CASES[case](usp, tmp, a, b)
    finally:
        seclib.cleanup(tmp)


if __name__ == "__main__":
    main()
