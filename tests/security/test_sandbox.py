#!/usr/bin/env python3
"""test_sandbox.py SPTRACE CASE — root's sptrace against files and settings
another user controls (issue 12): the DWARF reader's sandbox, debug files
another user could have planted, and the messages for bad settings.

Cases:
  dwarf-reader-sandboxed  root's analyze-binary, watched by strace: the child
                          that runs libdwarf has become nobody, set
                          no_new_privs and installed a seccomp filter before
                          its first read of the DWARF, opens nothing after,
                          and the lines it sends back are right
  messages-misc           --all-loaded with a stray file or a PID that maps
                          no file; SPTRACE_REPO a dangling symlink, a FIFO,
                          a file: each refused with a message that says what
                          is wrong and what to do
  debuglink-fifo          a .gnu_debuglink naming a FIFO: analyze-binary and
                          sptrace run finish at once, without lines
  debuglink-planted       root's module in a sticky shared directory: a debug
                          file or a symlink to one that another user put
                          there is not read (said so); root's own debug file
                          there and a user's module with that user's debug
                          file are
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

from seclib import (as_user, check, check_sanitizers, cleanup, fail, refused, shared_tmp,
                    users)

# A program whose functions start at known lines (the numbers below).
PROG = """\
#include <stdio.h>

__attribute__((noinline)) int twice(int x)
{
	return 2 * x;
}

int main(int argc, char **argv)
{
	(void)argv;
	printf("%d\\n", twice(argc));
	return 0;
}
"""
PROG_LINES = {"twice": 4, "main": 9}


def build_prog(tmp, name="prog", flags=("-g", "-O0")):
    src = os.path.join(tmp, name + ".c")
    exe = os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(PROG)
    r = subprocess.run(["gcc"] + list(flags) + ["-o", exe, src], capture_output=True, text=True)
    check(r.returncode == 0, "gcc: %s" % r.stderr)
    return src, exe


def function_lines(sptrace, exe, env=None):
    """{function name: "file:line"} from analyze-binary --dump functions."""
    r = subprocess.run([sptrace, "analyze-binary", "--no-store", "--dump", "functions", exe],
                       capture_output=True, text=True, timeout=120, env=env)
    check_sanitizers([sptrace], r.stderr)
    check(r.returncode == 0, "analyze-binary %s: exit %d: %s" % (exe, r.returncode, r.stderr))
    out = {}
    for line in r.stdout.splitlines():
        cols = line.split("\t")
        if len(cols) >= 10 and not line.startswith("#"):
            out[cols[2]] = cols[9]
    return out, r.stderr


def split_debug(tmp, exe, link):
    """Move exe's DWARF to tmp/link (root's, 0644) and point a
    .gnu_debuglink at it; the debug file's path."""
    dbg = os.path.join(tmp, link)
    for cmd in (["objcopy", "--only-keep-debug", exe, dbg],
                ["objcopy", "--strip-debug", "--add-gnu-debuglink=" + dbg, exe]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 0, "%s: %s" % (" ".join(cmd), r.stderr))
    os.chmod(dbg, 0o644)
    return dbg


def lines_note(sptrace, exe):
    """The 'lines' line of analyze-binary's summary for exe."""
    r = subprocess.run([sptrace, "analyze-binary", "--no-store", exe], capture_output=True,
                       text=True, timeout=60)
    check_sanitizers([sptrace], r.stderr)
    check(r.returncode == 0, "analyze-binary %s: exit %d: %s" % (exe, r.returncode, r.stderr))
    m = re.search(r"^\s*lines\s+(.*)$", r.stdout, re.M)
    check(m is not None, "analyze-binary %s printed no lines note:\n%s" % (exe, r.stdout))
    return m.group(1)


def check_lines(got, src, what):
    for name, line in PROG_LINES.items():
        check(got.get(name) == "%s:%d" % (src, line),
              "%s: %s should be at %s:%d, analyze-binary says %r"
              % (what, name, src, line, got.get(name)))


# ---------------------------------------------------------------------------

CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
UNFINISHED = re.compile(r"^(\d+)\s+(.*) <unfinished \.\.\.>$")
RESUMED = re.compile(r"^(\d+)\s+<\.\.\. \w+ resumed>(.*)$")


def joined_calls(lines):
    """strace -f's lines, a call another process interrupted (its line cut
    into '<unfinished ...>' and '<... NAME resumed>') joined again."""
    pending = {}
    for line in lines:
        line = line.rstrip("\n")
        m = UNFINISHED.match(line)
        if m:
            pending[m.group(1)] = m.group(2)
            continue
        m = RESUMED.match(line)
        if m and m.group(1) in pending:
            yield "%s %s%s" % (m.group(1), pending.pop(m.group(1)), m.group(2))
            continue
        yield line


def case_dwarf_reader_sandboxed(sptrace):
    if shutil.which("strace") is None:
        fail("strace is missing: apt-get install strace (scripts/install-deps.sh)")
    tmp = tempfile.mkdtemp(prefix="sptrace-sec-dwarf.")
    try:
        src, exe = build_prog(tmp)
        log = os.path.join(tmp, "strace.log")
        cmd = ["strace", "-f", "-qq", "-o", log,
               "-e", "trace=setgroups,setresgid,setresuid,prctl,seccomp,openat,open,read,"
                     "pread64,lseek",
               sptrace, "analyze-binary", "--no-store", "--dump", "functions", exe]
        # LeakSanitizer cannot run under ptrace (the ASan build)
        env = dict(os.environ, ASAN_OPTIONS=":".join(
            filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"])))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        check_sanitizers(cmd, r.stderr)
        check(r.returncode == 0, "analyze-binary under strace: exit %d: %s"
              % (r.returncode, r.stderr))
        calls = {}
        with open(log) as f:
            for line in joined_calls(f):
                m = CALL.match(line)
                if m:
                    calls.setdefault(m.group(1), []).append(m.groups()[1:])
        readers = [pid for pid, cs in calls.items()
                   if any(c[0] == "seccomp" and c[2] == "0" for c in cs)]
        check(len(readers) == 1,
              "expected one process to install a seccomp filter (the DWARF reader), "
              "got %d; system calls by process:\n%s"
              % (len(readers), "\n".join("%s: %s" % (p, [c[0] for c in cs][:30])
                                         for p, cs in calls.items())))
        cs = calls[readers[0]]
        names = [c[0] for c in cs]
        at = names.index("seccomp")

        def before(name, args_re, what):
            ok = any(c[0] == name and re.search(args_re, c[1]) and c[2] == "0"
                     for c in cs[:at])
            check(ok, "the DWARF reader did not %s before its seccomp filter: %s"
                  % (what, cs[:at]))

        before("setgroups", r"^0,", "drop its supplementary groups")
        before("setresgid", r"^65534, 65534, 65534$", "become group 65534")
        before("setresuid", r"^65534, 65534, 65534$", "become user 65534 (nobody)")
        before("prctl", r"PR_SET_NO_NEW_PRIVS, 1", "set no_new_privs")
        reads_before = [c for c in cs[:at] if c[0] in ("read", "pread64", "lseek")]
        check(not reads_before, "the DWARF reader read before its sandbox: %s" % reads_before)
        reads_after = [c for c in cs[at:] if c[0] in ("read", "pread64", "lseek")]
        check(reads_after, "the DWARF reader read nothing after its sandbox: %s" % cs[at:])
        opens_after = [c for c in cs[at:] if c[0] in ("open", "openat")]
        check(not opens_after, "the DWARF reader opened files in its sandbox: %s" % opens_after)

        got, _ = function_lines(sptrace, exe)
        check_lines(got, src, "sandboxed DWARF reader")
    finally:
        cleanup(tmp)


def case_messages_misc(sptrace):
    tmp = tempfile.mkdtemp(prefix="sptrace-sec-msg.")
    try:
        env = dict(os.environ)

        # --all-loaded takes no file besides its PID
        r = subprocess.run([sptrace, "analyze-binary", "--no-store", "--all-loaded",
                            str(os.getpid()), "/bin/true"], capture_output=True, text=True,
                           timeout=120, env=env)
        refused(r, ["--all-loaded", "/bin/true"], "--all-loaded PID with a stray file")
        check(r.returncode == 2, "a usage error should exit 2, got %d" % r.returncode)

        # a PID that maps no file (kthreadd, a kernel thread) is not "nothing to do"
        r = subprocess.run([sptrace, "analyze-binary", "--no-store", "--all-loaded", "2"],
                           capture_output=True, text=True, timeout=120, env=env)
        refused(r, ["pid 2", "kernel thread"], "--all-loaded 2")

        # SPTRACE_REPO that is not a directory: say what it is and what to do
        dangling = os.path.join(tmp, "repo-link")
        target = os.path.join(tmp, "gone", "repo")
        os.symlink(target, dangling)
        fifo = os.path.join(tmp, "repo-fifo")
        os.mkfifo(fifo)
        plain = os.path.join(tmp, "repo-file")
        with open(plain, "w") as f:
            f.write("not a repository\n")
        for path, words in ((dangling, ["dangling symbolic link", target, "SPTRACE_REPO"]),
                            (fifo, ["FIFO", fifo, "SPTRACE_REPO"]),
                            (plain, ["regular file", plain, "SPTRACE_REPO"])):
            env = dict(os.environ, SPTRACE_REPO=path)
            r = subprocess.run([sptrace, "analyze-binary", "-q", "/bin/true"],
                               capture_output=True, text=True, timeout=120, env=env)
            refused(r, words, "SPTRACE_REPO=%s" % path)
        check(not os.path.exists(target), "the dangling link's target %s was created" % target)
    finally:
        cleanup(tmp)


def case_debuglink_fifo(sptrace):
    tmp = tempfile.mkdtemp(prefix="sptrace-sec-fifo.")
    try:
        src, exe = build_prog(tmp)
        dbg = split_debug(tmp, exe, "prog.debug")
        os.unlink(dbg)
        os.mkfifo(dbg)
        try:
            note = lines_note(sptrace, exe)
        except subprocess.TimeoutExpired:
            fail("analyze-binary hung on a .gnu_debuglink naming a FIFO (%s)" % dbg)
        check("no DWARF found" in note, "a FIFO is no debug file: %r" % note)
        env = dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))
        cmd = [sptrace, "run", "-o", os.path.join(tmp, "trace"), "--", exe]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            fail("sptrace run hung on a program whose .gnu_debuglink names a FIFO")
        check_sanitizers(cmd, r.stderr)
        check(r.returncode == 0 and r.stdout == "2\n",
              "sptrace run of the program: exit %d, stdout %r, stderr %r"
              % (r.returncode, r.stdout, r.stderr))
    finally:
        cleanup(tmp)


def give(src, dst, user):
    """Copy src to dst, owned by `user` as if they had written it."""
    shutil.copy2(src, dst)
    os.chown(dst, user.uid, user.gid)


def case_debuglink_planted(sptrace):
    hostile, _ = users()
    tmp = shared_tmp()                      # sticky and world-writable, like /tmp
    try:
        src, exe = build_prog(tmp)
        # root's real debug file, kept where nobody else can reach it
        private = os.path.join(tmp, "root-only")
        os.mkdir(private, 0o700)
        real = split_debug(private, exe, "prog.debug")
        planted = os.path.join(tmp, "prog.debug")   # <module dir>/<link>

        # 1. a copy (right crc: the same debug file, from the package) that
        # another user wrote (copied here, then given to that user)
        give(real, planted, hostile)
        note = lines_note(sptrace, exe)
        check("rows from" not in note and "planted" in note and planted in note and
              "uid %d" % hostile.uid in note,
              "root read a debug file %s wrote in a shared directory: %r" % (hostile, note))
        os.unlink(planted)

        # 2. a symlink, planted by another user, to root's own debug file
        r = as_user(hostile, ["ln", "-s", real, planted])
        check(r.returncode == 0, "%s could not plant a symlink: %s" % (hostile, r.stderr))
        note = lines_note(sptrace, exe)
        check("rows from" not in note and "planted" in note,
              "root followed a symlink %s planted: %r" % (hostile, note))
        os.unlink(planted)

        # 3. a .debug directory another user made
        r = as_user(hostile, ["mkdir", "-m", "755", os.path.join(tmp, ".debug")])
        check(r.returncode == 0, "%s could not make .debug: %s" % (hostile, r.stderr))
        give(real, os.path.join(tmp, ".debug", "prog.debug"), hostile)
        note = lines_note(sptrace, exe)
        check("rows from" not in note and "planted" in note,
              "root read a debug file under a directory %s made: %r" % (hostile, note))
        cleanup(os.path.join(tmp, ".debug"))

        # 4. root's own debug file there is read, and the lines are right
        shutil.copy2(real, planted)
        note = lines_note(sptrace, exe)
        check("rows from %s" % planted in note, "root's own debug file was not read: %r" % note)
        got, _ = function_lines(sptrace, exe)
        check_lines(got, src, "root's debug file in a sticky directory")
        os.unlink(planted)

        # 5. a user's module with that user's debug file is read
        udir = os.path.join(tmp, "user-prog")
        r = as_user(hostile, ["mkdir", "-m", "755", udir])
        check(r.returncode == 0, "mkdir as %s: %s" % (hostile, r.stderr))
        for f in (exe, real):
            give(f, os.path.join(udir, os.path.basename(f)), hostile)
        uexe = os.path.join(udir, "prog")
        note = lines_note(sptrace, uexe)
        check("rows from %s/prog.debug" % udir in note,
              "the debug file of %s's own module was not read: %r" % (hostile, note))
    finally:
        cleanup(tmp)


CASES = {
    "dwarf-reader-sandboxed": case_dwarf_reader_sandboxed,
    "messages-misc": case_messages_misc,
    "debuglink-fifo": case_debuglink_fifo,
    "debuglink-planted": case_debuglink_planted,
}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        fail("usage: test_sandbox.py SPTRACE {%s}" % "|".join(CASES))
    if os.geteuid() != 0:
        fail("the security tests run as root")
    CASES[sys.argv[2]](os.path.abspath(sys.argv[1]))
    print("ok: %s" % sys.argv[2])


if __name__ == "__main__":
    main()
