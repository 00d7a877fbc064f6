#!/usr/bin/env python3
"""bench/largest_elf.py — find the x86-64 ELF executable or shared object with
the most bytes of executable sections under the given directories.

    largest_elf.py [-k TOP] [--eh-frame] DIR...

Reads only ELF and section headers (no libelf, no subprocess per file), so a
walk over /usr/lib takes seconds.  Counts the same bytes as ca_stats.text_bytes:
allocated SHF_EXECINSTR sections that have file contents.  Skips symbolic
links, hard-link duplicates and /usr/lib/debug (separate debug files, whose
code sections are NOBITS anyway).  Prints "BYTES PATH" lines, largest first.
--eh-frame keeps only files with a non-empty .eh_frame (C/C++ code the
analyser can find functions in even when stripped; a stripped Go binary has
neither symbols nor .eh_frame).
"""
import os
import struct
import sys

SHF_ALLOC, SHF_EXECINSTR, SHT_NOBITS = 0x2, 0x4, 8
ET_EXEC, ET_DYN, EM_X86_64 = 2, 3, 62
SKIP = ("/usr/lib/debug",)


def code_bytes(path, need_ehframe=False):
    """Bytes of executable sections, or None if not an x86-64 ELF module
    (or, with need_ehframe, if it has no .eh_frame)."""
    try:
        with open(path, "rb") as f:
            eh = f.read(64)
            if len(eh) < 64 or eh[:4] != b"\x7fELF" or eh[4] != 2 or eh[5] != 1:
                return None
            e_type, e_machine = struct.unpack_from("<HH", eh, 16)
            if e_type not in (ET_EXEC, ET_DYN) or e_machine != EM_X86_64:
                return None
            shoff, = struct.unpack_from("<Q", eh, 40)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", eh, 58)
            if shoff == 0 or shentsize < 64 or shnum == 0:
                return None
            f.seek(shoff)
            sh = f.read(shentsize * shnum)
            names = b""
            if need_ehframe and shstrndx < len(sh) // shentsize:
                stroff, strsize = struct.unpack_from("<QQ", sh, shstrndx * shentsize + 24)
                f.seek(stroff)
                names = f.read(min(strsize, 1 << 20))
    except OSError:
        return None
    total, has_ehframe = 0, False
    for i in range(len(sh) // shentsize):
        sh_name, sh_type, sh_flags = struct.unpack_from("<IIQ", sh, i * shentsize)
        sh_size, = struct.unpack_from("<Q", sh, i * shentsize + 32)
        if sh_type != SHT_NOBITS and sh_flags & SHF_ALLOC and sh_flags & SHF_EXECINSTR:
            total += sh_size
        if names[sh_name:sh_name + 10] == b".eh_frame\0" and sh_size > 0:
            has_ehframe = True
    if need_ehframe and not has_ehframe:
        return None
    return total


def main():
    args = sys.argv[1:]
    top, need_ehframe = 1, False
    while args and args[0].startswith("-"):
        if args[0] == "-k" and len(args) >= 2:
            top, args = int(args[1]), args[2:]
        elif args[0] == "--eh-frame":
            need_ehframe, args = True, args[1:]
        else:
            sys.exit("usage: largest_elf.py [-k TOP] [--eh-frame] DIR...")
    seen, found = set(), []
    for root in args:
        for dirpath, dirnames, filenames in os.walk(root):
            if dirpath.startswith(SKIP):
                dirnames[:] = []
                continue
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not os.path.stat.S_ISREG(st.st_mode) or st.st_size < 64:
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                n = code_bytes(path, need_ehframe)
                if n:
                    found.append((n, path))
    found.sort(reverse=True)
    for n, path in found[:top]:
        print(n, path)


if __name__ == "__main__":
    main()
