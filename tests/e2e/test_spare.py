"""test_spare.py — `sptrace run`'s stock of spare files, directories and FIFOs
(agent/spare.c, cli/spare.c): a traced shell forks and execs a program
several times; each new image takes its files from the stock (its agent.log
counts them), its trace reads back the same, the stock is gone at the end,
and a stock that is not private (world-writable, a link, another user's) is
ignored: the agent creates its files itself and says so.  A stock a killed
run left behind confuses no reader and does not stop the next run from
removing the old trace.

usage: test_spare.py SPTRACE TRACE_CONF_PROGRAM
"""

import os
import re
import stat
import sys
import tempfile

from e2elib import check
from test_run import CONF, only, replay_tree, run

TAKEN = re.compile(r"end: (\d+) files, directories and FIFOs taken from sptrace run's spares, "
                   r"(\d+) created here")
NEST_FUNCS = {"main", "top", "mid", "leaf"}


def counts(log):
    m = TAKEN.search(log)
    check(m, "agent.log has no line counting the spares taken:\n" + log[-3000:])
    return int(m.group(1)), int(m.group(2))


def images(tdir, prog):
    """The images of `prog` the top trace exec'd, in the order of their
    execs (meta: "exec SUB PID PATH")."""
    with open(os.path.join(tdir, "meta")) as f:
        subs = [l.split()[1] for l in f
                if l.startswith("exec exec.") and l.split(" ", 3)[3].strip() == prog]
    return [os.path.join(tdir, s) for s in subs]


def main():
    sptrace, prog = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="sptrace-spare-") as tmp:
        tdir = os.path.join(tmp, "trace")
        env = dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))
        sp = os.path.join(tdir, ".spare")
        real = os.path.join(tdir, "spare.moved")
        # The stock is made once the program has a second traced process
        # (cli/spare.c): the first image makes its own files.  Before each
        # image meant to take from it the shell waits (10 s at most) for the
        # stock to be full: its thread runs beside the shell, and under load
        # a slot may be late.
        script = "\n".join([
            'P="$1"; S="$2"; R="$3"',
            'full() { for i in $(seq 1 1000); do [ -e "$S/spare.f.15" ] && [ -e "$S/spare.d.3" ]'
            ' && [ -e "$S/spare.p.3" ] && [ -z "$(ls -A "$S/spare.new" 2>/dev/null)" ]'
            ' && [ "$(ls "$S" | wc -l)" -ge 25 ] && return; sleep 0.01; done; }',
            '"$P" nest; full; "$P" nest; full; "$P" nest',
            # not private: world-writable, a link, another user's
            'chmod o+w "$S"; "$P" nest; chmod o-w "$S"',
            'mv "$S" "$R"; ln -s spare.moved "$S"; "$P" nest; rm "$S"; mv "$R" "$S"',
            ('chown 61001 "$S"; "$P" nest; chown 0 "$S"' if root else '"$P" nest'),
            'full; "$P" nest; exit 0',
        ])
        r = run([sptrace, "run", "-o", tdir, "--", "bash", "-c", script, "sh", prog, sp, real],
                env=env)
        check(r.returncode == 0 and r.stdout == "26\n" * 7,
              "the traced shell failed (%d): %s\n%s" % (r.returncode, r.stdout, r.stderr[-3000:]))
        imgs = images(tdir, prog)
        check(len(imgs) == 7, "expected 7 exec'd images, meta names %r" % imgs)
        logs = [open(os.path.join(d, "agent.log")).read() for d in imgs]
        got = [counts(l) for l in logs]
        # 1. From the stock: every image after the first of a private stock
        # took some of its files from it, and one at least all of them (the
        # first may have found it being made).
        good = [1, 2, 6]
        for i in good:
            check(got[i][0] > 0, "image %d (%s) took no spare: %r\n%s" %
                  (i + 1, imgs[i], got[i], logs[i][-2000:]))
        check(any(got[i][1] == 0 and got[i][0] >= 5 for i in good),
              "no image took all its files from the stock: %r" % got)
        # 2. Not private: ignored, said, every file created.
        why = {3: "others may write into it", 4: "not a directory (or a link)"}
        if root:
            why[5] = "another user's"
        for i, w in why.items():
            check("spares: %s ignored: %s" % (sp, w) in logs[i],
                  "image %d: the agent did not say it ignored the stock (%s):\n%s" %
                  (i + 1, w, logs[i][-2000:]))
            check(got[i][0] == 0 and got[i][1] >= 5,
                  "image %d: a stock that is not private was used: %r" % (i + 1, got[i]))
        # 3. The traces read back the same, taken or created.
        for i in (0, 3, 6):
            tree = ";".join(only(replay_tree(sptrace, imgs[i], env), NEST_FUNCS))
            check(tree == CONF["nest"], "image %d: call tree differs\n--- want\n%s\n--- got\n%s" %
                  (i + 1, CONF["nest"].replace(";", "\n"), tree.replace(";", "\n")))
        # 4. The stock is gone, nothing of it left anywhere in the trace.
        left = [os.path.join(d, n) for d, ds, fs in os.walk(tdir) for n in ds + fs
                if n == ".spare" or n.startswith("spare.")]
        check(not left, "the stock was left in the trace: %r" % left[:10])
        # 5. A stock left by a killed run: readers do not see it, and the
        # next runs move the trace aside and then remove it.
        before = run([sptrace, "replay", tdir], env=env)
        os.mkdir(sp, 0o700)
        os.mkdir(os.path.join(sp, "spare.new"), 0o700)
        os.mkdir(os.path.join(sp, "spare.d.0"), 0o700)
        open(os.path.join(sp, "spare.f.0"), "w").close()
        os.mkfifo(os.path.join(sp, "spare.p.0"), 0o600)
        open(os.path.join(sp, "spare.new", "spare.f.1"), "w").close()
        r = run([sptrace, "replay", tdir], env=env)
        check(r.returncode == 0 and (r.stdout, r.stderr) == (before.stdout, before.stderr),
              "replay with a stock left behind (%d) is not the same as without: %s" %
              (r.returncode, r.stderr[-2000:]))
        for n in range(2):
            r = run([sptrace, "run", "-o", tdir, "--", "/bin/true"],
                    env=env)
            check(r.returncode == 0 and "cannot make room" not in r.stderr,
                  "run %d over a trace with a stock left behind (%d): %s" %
                  (n + 1, r.returncode, r.stderr[-2000:]))
        check(not os.path.exists(sp) and stat.S_ISDIR(os.lstat(tdir + ".old").st_mode),
              "the runs over the old trace left: %r" % os.listdir(tdir))


if __name__ == "__main__":
    main()
