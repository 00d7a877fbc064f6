"""test_analyses.py — code analyses root's agent trusts (issue 12, item 4).

The agent patches the addresses a repository entry names, and an entry is
found by build-id.  A user who builds a file with the build-id of a program
of root's, and gets an analysis of it stored, makes root's agent patch that
program at the wrong addresses.  codeanalysis/trust.c has three guards; each
case plays one attack:

  analysis-planted      user A's trace names A's own ELF, built with the
                        victim's build-id; root replays it (guard 1: the
                        analysis of a file A could write is not stored),
                        then traces the victim, which must run and be traced
                        as if nothing happened.
  analysis-other-code   an entry under the victim's build-id made from other
                        code (a root-owned copy of A's file, as a container
                        image's layer would be): sptrace run makes the
                        victim's entry again (guard 2: the code hash).
  analysis-stale-bytes  a library dlopen'd late, whose entry was made for an
                        earlier build with the same build-id: the agent
                        reads the entry itself, and must leave every site
                        whose bytes differ alone and say so (guard 3).

usage: test_analyses.py SPTRACE CASE
"""

import os
import shutil
import subprocess
import sys
import tempfile

from seclib import (as_user, check, cleanup, fail, shared_tmp, user_env, user_sptrace,
                    users)

BUILD_ID = "5eca11ed" + "0123456789abcdef" * 2          # 20 bytes, as GNU ld's sha1

# The victim: main first, so that it starts where the impostor's main does
# (the same crt code precedes both), then a 10-byte movabs where the
# impostor has its calls.
VICTIM = r"""
#include <stdio.h>
int add(int a, int b);
int mul(int a, int b);
int main(void)
{
	volatile long k = 0x1122334455667788L;
	int s = 0;

	for (int i = 0; i < 3; i++)
		s = add(s, mul(i, 2));
	printf("victim: %d %lx\n", s, (unsigned long)k);
	return 0;
}
__attribute__((noinline)) int add(int a, int b) { return a + b; }
__attribute__((noinline)) int mul(int a, int b) { return a * b; }
"""

# The impostor: other code, the same build-id.
IMPOSTOR = r"""
#include <stdio.h>
void f(void);
int main(void)
{
	f(); f(); f(); f(); f(); f(); f(); f();
	puts("impostor");
	return 0;
}
__attribute__((noinline)) void f(void) { __asm__ volatile(""); }
"""

# A plug-in, two builds with one build-id: plug first, so that it starts at
# the same address in both; the second has other code where the first calls.
PLUG_V1 = r"""
static int a(int x);
static int b(int x);
int plug(int x) { return b(a(x)); }
__attribute__((noinline)) static int a(int x) { return x + 1; }
__attribute__((noinline)) static int b(int x) { return x * 3; }
"""
PLUG_V2 = r"""
static int a(int x);
static int b(int x);
int plug(int x)
{
	volatile long k = 0x1122334455667788L;
	volatile int y = x;

	y += (int)(k & 0);
	return b(a(y));
}
__attribute__((noinline)) static int a(int x) { return x + 1; }
__attribute__((noinline)) static int b(int x) { return x * 3; }
"""
# Calls plug through a pointer (an indirect call: traced into plug if the
# agent has its module's entry by the first call, read after the dlopen).
HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	void *h = dlopen(argv[1], RTLD_NOW);
	int (*volatile fp)(int);
	long sum = 0;

	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 2;
	}
	fp = (int (*)(int))dlsym(h, "plug");
	usleep(500000);         /* the agent reads the module's entry meanwhile */
	for (int i = 0; i < 10; i++)
		sum += fp(i);
	printf("host: %ld\n", sum);
	return 0;
}
"""


def cc(src_text, out, extra=(), build_id=BUILD_ID):
    """Compile src_text into out (mode 0755) with the given build-id (None:
    one of its own)."""
    src = out + ".c"
    with open(src, "w") as f:
        f.write(src_text)
    bid = "-Wl,--build-id=0x" + build_id if build_id else "-Wl,--build-id"
    r = subprocess.run(["gcc", "-O0", "-fno-inline", bid, "-o", out, src] + list(extra),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail("gcc %s: %s" % (src, r.stderr))
    os.chmod(out, 0o755)
    return out


def run(cmd, env, timeout=120):
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("timed out after %d s: %s" % (timeout, " ".join(cmd)))


def root_env(repo):
    return dict(os.environ, SPTRACE_REPO=repo)


def entry_of(repo):
    return os.path.join(repo, BUILD_ID[:2], BUILD_ID + ".spr")


def root_dir(path):
    os.makedirs(path)
    os.chmod(path, 0o755)
    return path


def traced_correctly(sptrace, victim, repo, tmp, what):
    """root's `sptrace run` of the victim: the output of a run without
    sptrace, exit 0, and add and mul in the trace."""
    native = run([victim], dict(os.environ))
    check(native.returncode == 0, "%s: the victim itself failed: %r" % (what, native.stderr))
    out = os.path.join(tmp, "victim-trace")
    r = run([sptrace, "run", "-o", out, "--", victim], root_env(repo))
    check(r.returncode == 0 and r.stdout == native.stdout,
          "%s: root's traced victim went wrong (the agent patched it where the entry said):"
          " exit %d, stdout %r (without sptrace: %r), stderr %r" %
          (what, r.returncode, r.stdout, native.stdout, r.stderr[-2000:]))
    rp = run([sptrace, "replay", out], root_env(repo))
    check(rp.returncode == 0 and "add(" in rp.stdout and "mul(" in rp.stdout,
          "%s: the victim's trace lacks its calls: %r %r" % (what, rp.stdout[-2000:],
                                                             rp.stderr[-2000:]))
    return out


def case_planted(sptrace, tmp):
    a, _b = users()
    shared = shared_tmp()
    try:
        repo = root_dir(os.path.join(tmp, "repo"))
        victim = cc(VICTIM, os.path.join(root_dir(os.path.join(tmp, "bin")), "victim"))
        # User A builds the impostor in a directory of A's, and traces it
        # with A's own repository: a genuine trace whose meta names A's
        # file under the victim's build-id.
        usp = user_sptrace(sptrace, shared)
        home = os.path.join(shared, "a")
        os.mkdir(home, 0o755)
        os.chown(home, a.uid, a.gid)
        impostor_src = cc(IMPOSTOR, os.path.join(shared, "impostor-src"))
        r = as_user(a, ["cp", impostor_src, os.path.join(home, "impostor")], timeout=30)
        check(r.returncode == 0, "cp as %s: %s" % (a, r.stderr))
        impostor = os.path.join(home, "impostor")
        trace = os.path.join(home, "trace")
        r = as_user(a, [usp, "run", "-o", trace, "--", impostor],
                    env=user_env(a, SPTRACE_REPO=os.path.join(home, "repo")), timeout=120)
        check(r.returncode == 0 and "impostor" in r.stdout,
              "the impostor's run as %s: exit %d, %r %r" % (a, r.returncode, r.stdout, r.stderr))
        meta = open(os.path.join(trace, "meta")).read()
        check(impostor in meta and BUILD_ID in meta,
              "the user's meta does not name %s with key %s:\n%s" % (impostor, BUILD_ID, meta))

        # Root replays the user's trace: the impostor is analysed for the
        # replay, never stored, and the replay says so.
        r = run([sptrace, "replay", trace], root_env(repo))
        check(r.returncode == 0, "root's replay of the user's trace: exit %d: %s" %
              (r.returncode, r.stderr))
        check(not os.path.exists(entry_of(repo)),
              "root's replay stored the analysis of %s (owned by %s) under the victim's "
              "build-id: %s" % (impostor, a, entry_of(repo)))
        check("not stored" in r.stderr and impostor in r.stderr,
              "root's replay did not say the impostor's analysis was not stored: %r" % r.stderr)

        # Root's next run of the victim is traced as ever.
        traced_correctly(sptrace, victim, repo, tmp, "after the replay")

        # Root runs A's program itself: analysed, never stored (said once),
        # the victim's entry stays; the agent, which finds that entry by
        # the build-id, patches no site of it in A's code.
        with open(entry_of(repo), "rb") as f:
            victims = f.read()
        native = run([impostor], dict(os.environ))
        out = os.path.join(tmp, "impostor-trace")
        r = run([sptrace, "run", "-o", out, "--", impostor], root_env(repo))
        check(r.returncode == 0 and r.stdout == native.stdout,
              "root's traced run of %s: exit %d, stdout %r (without sptrace: %r), stderr %r" %
              (impostor, r.returncode, r.stdout, native.stdout, r.stderr[-2000:]))
        said = r.stderr.count("its analysis is not stored")
        check(said == 1 and "owned by uid %d" % a.uid in r.stderr,
              "root's run of %s did not say once that its analysis is not stored "
              "(%d times): %r" % (impostor, said, r.stderr))
        with open(entry_of(repo), "rb") as f:
            check(f.read() == victims, "root's run of %s replaced the victim's entry" % impostor)
        check("call sites in %s: their code differs from the analysis" % impostor in r.stderr,
              "the sites of the victim's entry were not left alone in %s: %r" %
              (impostor, r.stderr))
    finally:
        cleanup(shared)


def case_other_code(sptrace, tmp):
    repo = root_dir(os.path.join(tmp, "repo"))
    bindir = root_dir(os.path.join(tmp, "bin"))
    victim = cc(VICTIM, os.path.join(bindir, "victim"))
    # A root-owned file whose bytes someone else chose (a container image's
    # layer): trusted by guard 1, so its analysis is stored.
    layer = cc(IMPOSTOR, os.path.join(bindir, "layer"))
    r = run([sptrace, "analyze-binary", "--repo", repo, layer], dict(os.environ))
    check(r.returncode == 0 and os.path.exists(entry_of(repo)),
          "analyze-binary of the root-owned impostor: exit %d %r" % (r.returncode, r.stderr))
    with open(entry_of(repo), "rb") as f:
        planted = f.read()
    out = traced_correctly(sptrace, victim, repo, tmp, "with an entry made from other code")
    with open(entry_of(repo), "rb") as f:
        check(f.read() != planted, "the entry made from other code is still there")
    log = open(os.path.join(out, "agent.log")).read()
    check("code differs" not in log,
          "the victim's entry was not made again before the run (the agent met other "
          "code):\n" + log[-3000:])


def case_stale_bytes(sptrace, tmp):
    repo = root_dir(os.path.join(tmp, "repo"))
    bindir = root_dir(os.path.join(tmp, "bin"))
    v1 = cc(PLUG_V1, os.path.join(bindir, "libplug-v1.so"), ["-shared", "-fPIC"])
    r = run([sptrace, "analyze-binary", "--repo", repo, v1], dict(os.environ))
    check(r.returncode == 0 and os.path.exists(entry_of(repo)),
          "analyze-binary of v1: exit %d %r" % (r.returncode, r.stderr))
    # The file changes, its build-id does not.
    plug = cc(PLUG_V2, os.path.join(bindir, "libplug.so"), ["-shared", "-fPIC"])
    host = cc(HOST, os.path.join(bindir, "host"), ["-ldl"], build_id=None)
    native = run([host, plug], dict(os.environ))
    check(native.returncode == 0, "the host itself failed: %r" % native.stderr)
    out = os.path.join(tmp, "trace")
    r = run([sptrace, "run", "-o", out, "--", host, plug], root_env(repo))
    log = open(os.path.join(out, "agent.log")).read() if os.path.exists(out) else ""
    check(r.returncode == 0 and r.stdout == native.stdout,
          "the host went wrong under sptrace (the stale entry was used): exit %d, stdout %r "
          "(without sptrace: %r), stderr %r\nagent.log:\n%s" %
          (r.returncode, r.stdout, native.stdout, r.stderr[-2000:], log[-3000:]))
    check("sites skipped in %s: code differs from the analysis" % plug in log,
          "agent.log does not count the sites left alone:\n" + log[-3000:])
    check("call sites in %s: their code differs from the analysis" % plug in r.stderr,
          "sptrace run's summary does not name the sites left alone: %r" % r.stderr)


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    cases = {"analysis-planted": case_planted, "analysis-other-code": case_other_code,
             "analysis-stale-bytes": case_stale_bytes}
    if case not in cases:
        fail("unknown case %s" % case)
    tmp = tempfile.mkdtemp(prefix="sptrace-sec-analyses.")
    os.chmod(tmp, 0o755)
    try:
        cases[case](sptrace, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
