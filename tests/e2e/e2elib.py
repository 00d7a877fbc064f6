"""e2elib.py — helpers shared by the end-to-end tests in this folder.

The tests run the real `sptrace` binary on real ELF files and compare what
it reports with the ground truth that binutils (readelf, objdump) give for
the same files.  Everything here is plain Python 3 with no third-party
modules; each test script imports it from its own directory.

Failures go through fail(), which prints 'FAIL: ...' and exits 1, so meson
shows a clear reason in the test log.
"""

import os
import re
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def need_file(path, package):
    """Fail (never skip) when a real Debian binary the test needs is missing."""
    if not os.path.exists(path):
        fail("%s is missing; install the Debian package '%s' (test.sh does)" % (path, package))


def run(cmd, timeout=240, **kw):
    """Run cmd, return the CompletedProcess (text mode); fail on a timeout."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        fail("timed out after %d s: %s" % (timeout, " ".join(cmd)))


def describe_exit(rc):
    return "killed by signal %d" % -rc if rc < 0 else "exit status %d" % rc


def sptrace(exe, args, ok=True, timeout=240):
    """Run `sptrace ARGS`; with ok=True fail unless it exits 0."""
    p = run([exe] + args, timeout=timeout)
    if ok and p.returncode != 0:
        fail("sptrace %s: %s\nstderr:\n%s" % (" ".join(args), describe_exit(p.returncode),
                                              p.stderr))
    return p


# ---------------------------------------------------------------------------
# What sptrace analyze-binary reports

def parse_dump(text):
    """Parse a tab-separated dump into a list of dicts.

    A '#' line with tabs is a header naming the columns of the lines after
    it (--dump cfg has one for blocks and one for sites); a '#' line without
    tabs is a comment.
    """
    rows, cols = [], None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            if "\t" in line:
                cols = line[1:].strip().split("\t")
            continue
        check(cols is not None, "dump has data before its '#' header: %r" % line)
        fields = line.split("\t")
        check(len(fields) == len(cols),
              "dump line has %d fields, header has %d: %r" % (len(fields), len(cols), line))
        rows.append(dict(zip(cols, fields)))
    check(cols is not None, "dump has no '#' header line")
    return rows


def dump(exe, what, path, extra=()):
    """`sptrace analyze-binary --no-store --dump WHAT PATH` as a list of dicts."""
    p = sptrace(exe, ["analyze-binary", "--no-store"] + list(extra) +
                ["--dump", what, path])
    return parse_dump(p.stdout)


def functions(exe, path):
    """Analysed functions of path: dict address -> row of --dump functions."""
    return {int(r["addr"], 16): r for r in dump(exe, "functions", path)}


def callsites(exe, path):
    """Analysed call sites of path: dict address -> row of --dump callsites."""
    return {int(r["addr"], 16): r for r in dump(exe, "callsites", path)}


def parse_summary(text):
    """Parse the summary printed for one module into a dict of numbers.

    Keys: functions, fragments, noreturn, jump_tables, jump_table_targets,
    landing_pads, blocks, sites, site_<kind>, plan_<method> (counts).
    """
    s = {}

    def grab(key, pattern):
        m = re.search(pattern, text, re.M)
        check(m is not None, "summary has no %s (pattern %r):\n%s" % (key, pattern, text))
        return m

    m = grab("functions", r"^\s*functions\s+(\d+) \(.*\); (\d+) fragments, (\d+) noreturn")
    s["functions"], s["fragments"], s["noreturn"] = (int(x) for x in m.groups())
    m = grab("cfg", r"^\s*cfg\s+(\d+) blocks, (\d+) edges, (\d+) jump tables \((\d+) targets\), "
                    r"(\d+) landing pads")
    (s["blocks"], s["edges"], s["jump_tables"], s["jump_table_targets"],
     s["landing_pads"]) = (int(x) for x in m.groups())
    m = grab("call sites", r"^\s*call sites\s+(\d+): (.*)$")
    s["sites"] = int(m.group(1))
    for kind, n in re.findall(r"([\w-]+) (\d+) \(", m.group(2)):
        s["site_" + kind] = int(n)
    m = grab("patch plan", r"^\s*patch plan\s+(.*)$")
    for method, n in re.findall(r"([\w-]+) (\d+) \(", m.group(1)):
        s["plan_" + method] = int(n)
    return s


def summary(exe, path, extra=()):
    p = sptrace(exe, ["analyze-binary", "--no-store"] + list(extra) + [path])
    return parse_summary(p.stdout)


# ---------------------------------------------------------------------------
# Ground truth from binutils

def exec_sections(path):
    """Executable sections of path: list of (name, start, end)."""
    p = run(["readelf", "-SW", path])
    check(p.returncode == 0, "readelf -SW %s failed: %s" % (path, p.stderr))
    out = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)"
                     r"\s+[0-9a-f]+\s+(\S*)", line)
        if m and "X" in m.group(4):
            start, size = int(m.group(2), 16), int(m.group(3), 16)
            out.append((m.group(1), start, start + size))
    return out


def in_sections(addr, sections):
    return any(lo <= addr < hi for _, lo, hi in sections)


def func_symbols(path, dynamic=False, sections=None):
    """FUNC/IFUNC symbols defined in executable sections of path.

    Returns dict address -> set of names (aliases share an address).  With
    dynamic=True the .dynsym table is read, else .symtab.
    """
    if sections is None:
        sections = exec_sections(path)
    p = run(["readelf", "--dyn-syms" if dynamic else "-sW", "-W", path])
    check(p.returncode == 0, "readelf on %s failed: %s" % (path, p.stderr))
    syms, table = {}, None
    for line in p.stdout.splitlines():
        m = re.match(r"Symbol table '([^']+)'", line)
        if m:
            table = m.group(1)
            continue
        if table != (".dynsym" if dynamic else ".symtab"):
            continue
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":") or f[3] not in ("FUNC", "IFUNC"):
            continue
        if f[6] in ("UND", "ABS"):
            continue
        addr = int(f[1], 16)
        if addr == 0 or not in_sections(addr, sections):
            continue
        name = f[7].split("@")[0]
        syms.setdefault(addr, set()).add(name)
    return syms


_CALL = re.compile(r"^\s*([0-9a-f]+):\s+(?:(?:bnd|notrack)\s+)?callq?\s+([0-9a-f]+)(?:\s+<([^>]*)>)?\s*$")


def objdump_direct_calls(path):
    """Direct call instructions of path: dict site address -> (target, target name)."""
    p = run(["objdump", "-d", "-w", "--no-show-raw-insn", path])
    check(p.returncode == 0, "objdump -d %s failed: %s" % (path, p.stderr))
    calls = {}
    for line in p.stdout.splitlines():
        m = _CALL.match(line)
        if m:
            calls[int(m.group(1), 16)] = (int(m.group(2), 16), m.group(3) or "")
    return calls


def pct(n, total):
    return 100.0 * n / total if total else 100.0


def hexlist(addrs, names=None, limit=40):
    items = []
    for a in sorted(addrs)[:limit]:
        items.append("%#x%s" % (a, " (%s)" % "/".join(sorted(names[a])) if names and a in names
                                 else ""))
    more = len(addrs) - limit
    return ", ".join(items) + (", ... %d more" % more if more > 0 else "")


def read_vaddr(path, addr, size):
    """size bytes at link-time virtual address addr of an ELF64 file."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    check(data[:5] == b"\x7fELF\x02", "%s is not an ELF64 file" % path)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_vaddr <= addr and addr + size <= p_vaddr + p_filesz:
            off = p_offset + addr - p_vaddr
            return data[off:off + size]
    fail("%s: address %#x is in no PT_LOAD segment" % (path, addr))


def objdump_function(path, name):
    """Instructions of function `name`: list of (address, text) from objdump."""
    p = run(["objdump", "-d", "-w", "--no-show-raw-insn", path])
    check(p.returncode == 0, "objdump -d %s failed: %s" % (path, p.stderr))
    out, inside = [], False
    for line in p.stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            inside = m.group(1) == name
            continue
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2)))
    check(out, "objdump shows no function %s in %s" % (name, path))
    return out
