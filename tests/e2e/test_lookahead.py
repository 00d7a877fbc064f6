#!/usr/bin/env python3
"""test_lookahead.py SPTRACE PROG — the look-ahead guided by earlier runs
(codeanalysis/profile.c, agent/lookahead.c, cli/lookahead.c).

PROG is tests/progs/lookahead.c: pick() has 40 direct callees and calls 3,
main 20 more it never calls.  In a fresh repository:
  1. the first `sptrace run` has no profile (agent.log says so) and writes
     one beside the executable's entry;
  2. the second instruments fewer sites (agent.log's "sites instrumented"),
     says it used the profile and how many functions it lists, and its
     replay is the first's;
  3. `--lookahead all` instruments what the first did, whatever the profile;
  4. a profile of the wrong size, one others may write, one of another
     user's, and a symbolic link to a good one are ignored (agent.log says
     why): the executable's whole look-ahead, as without its profile;
  5. a repository that is not the caller's own (another user's directory)
     gets no profile from root's run;
  6. nor root's from a user's run (uid 61001), which says nothing of it.
"""

import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, fail, reachable_sptrace, run  # noqa: E402

OTHER_UID = 61001


def traced(exe, prog, tmp, env, name, extra=()):
    """Run PROG under sptrace into tmp/name; (sites instrumented, agent.log)."""
    out = os.path.join(tmp, name)
    p = run([exe, "run", "-o", out] + list(extra) + ["--", prog], env=env)
    if p.returncode != 0:
        fail("sptrace run %s: exit %d\n%s" % (name, p.returncode, p.stderr))
    log = open(os.path.join(out, "agent.log")).read()
    m = re.search(r"end \(\w+\): (\d+) sites instrumented", log)
    check(m is not None, "%s: no 'sites instrumented' in agent.log:\n%s" % (name, log))
    return int(m.group(1)), log, out


def replay(exe, out, env):
    """The call trees without durations and thread ids."""
    p = run([exe, "replay", out], env=env)
    check(p.returncode == 0, "replay %s: %s" % (out, p.stderr))
    lines = []
    for line in p.stdout.splitlines():
        line = re.sub(r"^\s*[0-9.]+ [mun]?s ", "", line)
        lines.append(re.sub(r"\[\s*\d+\]", "", line).strip())
    return lines


def module0_log(log):
    """agent.log's look-ahead line for module 0 (the executable)."""
    for line in log.splitlines():
        if line.startswith("module 0: ") and "look-ahead" in line:
            return line
    fail("agent.log says nothing of module 0's look-ahead:\n" + log)
    return None


def profile_path(out, repo):
    for line in open(os.path.join(out, "meta")):
        p = line.split()
        if len(p) >= 5 and p[0] == "module" and p[1] == "0":
            key = p[-2]
            return os.path.join(repo, key[:2], key + ".spp")
    fail("%s/meta names no module 0" % out)
    return None


def main():
    check(len(sys.argv) == 3, "usage: test_lookahead.py SPTRACE PROG")
    exe, prog = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="sptrace-lookahead-")
    try:
        os.chmod(tmp, 0o755)
        repo = os.path.join(tmp, "repo")
        env = dict(os.environ, SPTRACE_REPO=repo)

        # 1. No profile yet; the run writes one.
        first, log, out1 = traced(exe, prog, tmp, env, "t1")
        check("no look-ahead profile" in module0_log(log),
              "first run: " + module0_log(log))
        prof = profile_path(out1, repo)
        check(os.path.isfile(prof), "first run wrote no profile %s" % prof)
        good = open(prof, "rb").read()

        # 2. Fewer sites, the same trace.
        second, log, out2 = traced(exe, prog, tmp, env, "t2")
        line = module0_log(log)
        m = re.search(r"look-ahead profile \S+: (\d+) of (\d+) functions reached", line)
        check(m is not None, "second run did not use the profile: " + line)
        check(0 < int(m.group(1)) < int(m.group(2)), "second run: " + line)
        print("sites instrumented: %d without a profile, %d with (%s of %s functions)"
              % (first, second, m.group(1), m.group(2)))
        check(second < first - 30, "second run instrumented %d sites, the first %d: the "
              "profile should have kept ~40 never-called callees out" % (second, first))
        r1, r2 = replay(exe, out1, env), replay(exe, out2, env)
        check(r1 == r2, "replays differ:\n--- first\n%s\n--- second\n%s"
              % ("\n".join(r1), "\n".join(r2)))
        check(sum("c39" in x for x in r1) == 0 and sum("c2()" in x for x in r1) == 1,
              "the program's calls changed: %s" % r1)

        # 3. --lookahead all: as without a profile.
        whole, log, _ = traced(exe, prog, tmp, env, "t3", ["--lookahead", "all"])
        check("SPTRACE_LOOKAHEAD=all" in module0_log(log), "--lookahead all: " + module0_log(log))
        check(whole == first, "--lookahead all instrumented %d sites, the first run %d"
              % (whole, first))

        # 4. Profiles the agent must not use: as without the executable's
        # (the libraries keep theirs).
        os.unlink(prof)
        none, log, _ = traced(exe, prog, tmp, env, "t4")
        check("no look-ahead profile" in module0_log(log), "t4: " + module0_log(log))
        check(none > second, "without the executable's profile %d sites, with it %d"
              % (none, second))

        def bad(name, make, why):
            if os.path.lexists(prof):
                os.unlink(prof)
            make()
            n, log, _ = traced(exe, prog, tmp, env, name)
            line = module0_log(log)
            check("ignored" in line and why in line,
                  "%s: agent.log should say the profile is ignored (%s): %s" % (name, why, line))
            check(n == none, "%s: %d sites instrumented, want %d (the executable's whole "
                  "look-ahead)" % (name, n, none))

        def write(data, mode=0o644, uid=0):
            with open(prof, "wb") as f:
                f.write(data)
            os.chmod(prof, mode)
            os.chown(prof, uid, -1)

        bad("size", lambda: write(good + b"\0"), "bytes, not the")
        bad("writable", lambda: write(good, 0o666), "writable by every user")
        bad("owner", lambda: write(good, 0o644, OTHER_UID), "owned by uid %d" % OTHER_UID)

        def link():
            target = os.path.join(tmp, "elsewhere.spp")
            with open(target, "wb") as f:
                f.write(good)
            os.symlink(target, prof)
        bad("link", link, "a symbolic link")

        # 5. Another user's repository: root writes no profile there.
        theirs = os.path.join(tmp, "theirs")
        shutil.copytree(repo, theirs, symlinks=True)
        for d, dirs, files in os.walk(theirs):
            for x in dirs + files:
                os.lchown(os.path.join(d, x), OTHER_UID, -1)
        os.chown(theirs, OTHER_UID, -1)
        their_prof = os.path.join(theirs, os.path.relpath(prof, repo))
        if os.path.lexists(their_prof):
            os.unlink(their_prof)
        traced(exe, prog, tmp, dict(env, SPTRACE_REPO=theirs), "t5")
        check(not os.path.lexists(their_prof),
              "root's run wrote a profile into uid %d's repository" % OTHER_UID)

        # 6. A user's run never writes root's repository (and says nothing).
        # (sptrace and the program copied where the user can run them: a
        # fresh clone's build directory may be private.)
        os.unlink(prof)
        udir = os.path.join(tmp, "user")
        os.mkdir(udir)
        os.chown(udir, OTHER_UID, OTHER_UID)
        user_prog = os.path.join(tmp, os.path.basename(prog))
        shutil.copyfile(prog, user_prog)
        os.chmod(user_prog, 0o755)
        p = run(["setpriv", "--reuid", str(OTHER_UID), "--regid", str(OTHER_UID),
                 "--clear-groups", reachable_sptrace(exe, tmp), "run", "-o",
                 os.path.join(udir, "t6"), "--", user_prog],
                env=dict(env, HOME=udir))
        check(p.returncode == 0, "uid %d's run: exit %d\n%s" % (OTHER_UID, p.returncode, p.stderr))
        module0_log(open(os.path.join(udir, "t6", "agent.log")).read())
        check(not os.path.lexists(prof), "uid %d's run wrote a profile into root's repository"
              % OTHER_UID)
        check("look-ahead profile" not in p.stderr, "uid %d's run complained about root's "
              "repository:\n%s" % (OTHER_UID, p.stderr))
        print("look-ahead profiles: used, ignored when unusable, never written into "
              "another user's repository")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
