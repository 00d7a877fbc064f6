#!/usr/bin/env python3
"""test_bad_input.py SPTRACE CASE — `sptrace analyze-binary` on bad input.

Each CASE builds one bad input in a temporary directory and runs
`sptrace analyze-binary --repo REPO PATH` with an empty REPO.  It must:
  - exit non-zero, not be killed by a signal, not hang (30 s);
  - print an error starting with 'sptrace: ' that names PATH and contains a
    word saying what is wrong (CASES below lists the accepted words);
  - leave REPO empty: no partial entry, no temporary file.
"""

import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, check_sanitizers, describe_exit, fail  # noqa: E402

LS = "/usr/bin/ls"


def truncated_header(d):
    """The first 200 bytes of ls: an ELF header and part of the program headers."""
    p = os.path.join(d, "ls-200-bytes")
    with open(LS, "rb") as f, open(p, "wb") as out:
        out.write(f.read(200))
    return p


def truncated_shdrs(d):
    """ls cut in the middle of its section header table."""
    with open(LS, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3a)
    check(shoff + shentsize * shnum <= len(data), "%s has its section headers past EOF" % LS)
    p = os.path.join(d, "ls-cut-in-shdrs")
    with open(p, "wb") as out:
        out.write(data[:shoff + shentsize * (shnum // 2) + 7])
    return p


def random_bytes(d):
    p = os.path.join(d, "random.bin")
    rng = random.Random(1234)
    with open(p, "wb") as out:
        out.write(bytes(rng.getrandbits(8) for _ in range(65536)))
    return p


def text_file(d):
    p = os.path.join(d, "notes.txt")
    with open(p, "w") as out:
        out.write("This is a text file, not a program.\n" * 100)
    return p


def elf32(d):
    """A hand-made 32-bit i386 executable header (ELFCLASS32), padded to 4 KiB."""
    ident = b"\x7fELF" + bytes([1, 1, 1, 0]) + bytes(8)  # ELFCLASS32, LSB, version 1
    hdr = ident + struct.pack("<HHIIIIIHHHHHH", 2, 3, 1, 0x08048000 + 0x54, 0x34, 0,
                              0, 0x34, 0x20, 1, 0x28, 0, 0)
    phdr = struct.pack("<IIIIIIII", 1, 0, 0x08048000, 0x08048000, 4096, 4096, 5, 0x1000)
    p = os.path.join(d, "prog32")
    with open(p, "wb") as out:
        out.write((hdr + phdr + b"\xc3").ljust(4096, b"\0"))
    return p


def foreign_machine(d):
    """ls with e_machine changed to AArch64: a 64-bit ELF for another CPU."""
    with open(LS, "rb") as f:
        data = bytearray(f.read())
    struct.pack_into("<H", data, 0x12, 183)  # EM_AARCH64
    p = os.path.join(d, "ls-aarch64")
    with open(p, "wb") as out:
        out.write(data)
    return p


def directory(d):
    p = os.path.join(d, "a-directory")
    os.mkdir(p)
    return p


def missing(d):
    return os.path.join(d, "no-such-file")


def not_a_directory(d):
    """A path whose parent is a regular file (ENOTDIR, even for root)."""
    parent = text_file(d)
    return os.path.join(parent, "prog")


def fifo(d):
    """A FIFO: opening it for reading would block; it must be refused."""
    p = os.path.join(d, "a-fifo")
    os.mkfifo(p)
    return p


def empty(d):
    p = os.path.join(d, "empty")
    open(p, "wb").close()
    return p


def char_device(d):
    return "/dev/null"


def unreadable(d):
    """A copy of ls with mode 000 (run as nobody below when we are root)."""
    os.chmod(d, 0o755)
    p = os.path.join(d, "ls-mode-000")
    shutil.copy(LS, p)
    os.chmod(p, 0)
    return p


# case -> (make input, accepted words (any, case-insensitive))
CASES = {
    "truncated-header": (truncated_header, ["truncated", "corrupt"]),
    "truncated-shdrs": (truncated_shdrs, ["truncated", "corrupt"]),
    "random-bytes": (random_bytes, ["not an ELF"]),
    "text-file": (text_file, ["not an ELF"]),
    "elf32": (elf32, ["32-bit"]),
    "foreign-machine": (foreign_machine, ["x86-64", "x86_64", "machine", "architecture"]),
    "directory": (directory, ["directory"]),
    "missing": (missing, ["No such file"]),
    "not-a-directory": (not_a_directory, ["Not a directory"]),
    "fifo": (fifo, ["not a regular file"]),
    "char-device": (char_device, ["not a regular file"]),
    "empty": (empty, ["empty", "truncated", "not an ELF"]),
    "unreadable": (unreadable, ["Permission denied"]),
}


def leftovers(repo):
    found = []
    for root, dirs, files in os.walk(repo):
        found += [os.path.join(root, n) for n in dirs + files]
    return found


def main():
    check(len(sys.argv) == 3 and sys.argv[2] in CASES,
          "usage: test_bad_input.py SPTRACE %s" % "|".join(CASES))
    exe, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    make, words = CASES[case]
    work = tempfile.mkdtemp(prefix="sptrace-e2e-bad-")
    try:
        inputs = os.path.join(work, "in")
        os.mkdir(inputs)
        repo = os.path.join(work, "repo")
        os.mkdir(repo)
        path = make(inputs)
        cmd = [exe, "analyze-binary", "--repo", repo, path]
        if case == "unreadable" and os.geteuid() == 0:
            # root reads mode-000 files: drop to nobody, who may write the repo.
            os.chmod(work, 0o755)
            os.chmod(repo, 0o777)
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            fail("%s: sptrace hung for 30 s on %s" % (case, path))
        err = p.stderr.strip()
        print("%s: %s -> %s\n  stderr: %s" % (case, path, describe_exit(p.returncode), err))
        check_sanitizers(cmd, p.stderr)
        errors = []
        if p.returncode == 0:
            errors.append("exit status 0 on bad input")
        elif p.returncode < 0:
            errors.append("sptrace crashed: %s" % describe_exit(p.returncode))
        if not err.startswith("sptrace: "):
            errors.append("stderr does not start with 'sptrace: '")
        if path not in err:
            errors.append("the error does not name the file %s" % path)
        why = err.replace(path, "<path>").lower()  # the path itself may hold the words
        if not any(w.lower() in why for w in words):
            errors.append("the error says none of %s" % words)
        left = leftovers(repo)
        if left:
            errors.append("the repository is not empty afterwards: %s" % left)
        if errors:
            fail("%s: %s\n  stderr was: %r" % (case, "; ".join(errors), p.stderr))
        print("ok")
    finally:
        for root, dirs, files in os.walk(work):
            for n in dirs + files:
                try:
                    os.chmod(os.path.join(root, n), 0o700, follow_symlinks=False)
                except OSError:
                    pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
