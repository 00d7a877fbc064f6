#!/usr/bin/env python3
"""test_repo_roundtrip.py SPTRACE PROG — the repository entry of one module.

With an empty temporary --repo:
  1. the first analysis exits 0, says 'stored' and leaves exactly one
     entry file and its calls image (KEY.spr, KEY.spc: codeanalysis/image.c)
     in the repository and nothing else (no temporary files);
  2. a second run exits 0 and says 'loaded from' (no re-analysis);
  3. the dumps of the loaded entry (functions, callsites, cfg=main) equal
     the dumps of a fresh --no-store analysis, so nothing is lost on the way;
  4. --force analyses again, exits 0 and still leaves one entry.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, describe_exit, fail, run  # noqa: E402


def files_in(repo):
    out = []
    for root, _, files in os.walk(repo):
        out += [os.path.relpath(os.path.join(root, n), repo) for n in files]
    return sorted(out)


def main():
    check(len(sys.argv) == 3, "usage: test_repo_roundtrip.py SPTRACE PROG")
    exe, prog = sys.argv[1:]
    repo = tempfile.mkdtemp(prefix="sptrace-e2e-repo-")
    errors = []
    try:
        def sp(*args):
            p = run([exe, "analyze-binary"] + list(args))
            if p.returncode != 0:
                tail = p.stdout.strip().splitlines()[-1:] or [""]
                errors.append("sptrace analyze-binary %s: %s\n  last line of stdout: %s\n"
                              "  stderr: %s" % (" ".join(args), describe_exit(p.returncode),
                                                tail[0], p.stderr.strip() or "(empty)"))
            return p

        first = sp("--repo", repo, prog)
        entries = files_in(repo)
        print("first run: %s; repository holds %s" % (describe_exit(first.returncode), entries))
        if "stored" not in first.stdout:
            errors.append("first run does not say 'stored':\n%s" % first.stdout)
        if len(entries) != 2 or [os.path.splitext(e)[1] for e in entries] != [".spc", ".spr"] \
                or os.path.splitext(entries[0])[0] != os.path.splitext(entries[1])[0]:
            errors.append("repository should hold one entry and its image, holds %s" % entries)

        second = sp("--repo", repo, prog)
        print("second run: %s" % describe_exit(second.returncode))
        if "loaded from" not in second.stdout:
            errors.append("second run does not say 'loaded from':\n%s" % second.stdout)

        for what in ("functions", "callsites", "cfg=main"):
            loaded = sp("--repo", repo, "--dump", what, prog).stdout
            fresh = sp("--no-store", "--dump", what, prog).stdout
            if loaded != fresh:
                lo, fr = loaded.splitlines(), fresh.splitlines()
                diff = [(a, b) for a, b in zip(lo, fr) if a != b][:5]
                errors.append("--dump %s differs between the stored entry (%d lines) and a "
                              "fresh analysis (%d lines); first differences: %s"
                              % (what, len(lo), len(fr), diff))
            else:
                print("--dump %s: stored entry equals a fresh analysis (%d lines)"
                      % (what, len(loaded.splitlines())))

        sp("--repo", repo, "--force", "-q", prog)
        if files_in(repo) != entries:
            errors.append("after --force the repository holds %s, expected %s"
                          % (files_in(repo), entries))
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    if errors:
        fail("\n".join(errors))
    print("ok")


if __name__ == "__main__":
    main()
