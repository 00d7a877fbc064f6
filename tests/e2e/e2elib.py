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
import shutil
import struct
import subprocess
import sys
import time


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


def need_program(path, package):
    """Fail (never skip) when a program the test needs is missing: a path,
    or a name looked up in PATH.  Its path."""
    import shutil
    found = path if os.path.isabs(path) else shutil.which(path)
    if not found or not os.access(found, os.X_OK):
        fail("'%s' is not installed; install the Debian package '%s' "
             "(scripts/install-deps.sh does)" % (path, package))
    return found


def reachable_sptrace(sptrace, tmp):
    """A copy of sptrace and of its agent that another user can run, under
    tmp (made 0755), laid out as the build is (cli/, agent/): the build
    itself may be in a directory only root can enter (a fresh clone in a
    mktemp directory).  Its path."""
    os.chmod(tmp, 0o755)
    top = os.path.join(tmp, "sptrace-tools")
    agent = os.path.join(os.path.dirname(os.path.realpath(sptrace)), "..", "agent",
                         "libsptrace-agent.so")
    for sub, src in (("cli", sptrace), ("agent", agent)):
        d = os.path.join(top, sub)
        os.makedirs(d, exist_ok=True)
        os.chmod(top, 0o755)
        os.chmod(d, 0o755)
        dst = os.path.join(d, os.path.basename(src))
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o755)
    return os.path.join(top, "cli", os.path.basename(sptrace))


def free_port():
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def private_repo_env(tmp):
    """The environment with a code-analysis repository of the test's own."""
    return dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo"))


def describe_exit(rc):
    return "killed by signal %d" % -rc if rc < 0 else "exit status %d" % rc


def pct(n, total):
    """n as a percentage of total (100 when total is 0)."""
    return 100.0 * n / total if total else 100.0


def hexlist(addrs, names=None, limit=40):
    """Sorted addresses as '0x.. (name), ...', at most limit of them."""
    items = []
    for a in sorted(addrs)[:limit]:
        items.append("%#x%s" % (a, " (%s)" % "/".join(sorted(names[a])) if names and a in names
                                 else ""))
    more = len(addrs) - limit
    return ", ".join(items) + (", ... %d more" % more if more > 0 else "")


_SANITIZER = re.compile(r"runtime error:|AddressSanitizer|LeakSanitizer|"
                        r"UndefinedBehaviorSanitizer")


def packed_records(path):
    """The records packed.<tid>'s blocks hold (trace_format.h, "Packed
    blocks": a 48-byte header, magic, first, n, zlen, ...), counted from 0."""
    end = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(48)
            if len(b) < 48:
                return end
            magic, first, n, zlen = struct.unpack_from("<QQII", b)
            if magic != 0x314b434150505354 or first != end:
                return end
            end = first + n
            f.seek(zlen, 1)


def check_sanitizers(cmd, stderr):
    """Fail if a sanitizer (test build: ASan+UBSan) reported anything."""
    if _SANITIZER.search(stderr or ""):
        fail("sanitizer report from %s:\n%s" % (" ".join(cmd), stderr))


def run(cmd, timeout=240, **kw):
    """Run cmd, return the CompletedProcess (text mode).

    Fails on a timeout and on any sanitizer report in stderr.
    """
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        fail("timed out after %d s: %s" % (timeout, " ".join(cmd)))
    check_sanitizers(cmd, p.stderr)
    return p


def text_diff_bytes(pid):
    """{path: how many bytes differ} for the executable mappings of `pid`
    whose bytes differ from their files."""
    bad = {}
    for line in open("/proc/%d/maps" % pid):
        p = line.split()
        if len(p) < 6 or "x" not in p[1] or not p[5].startswith("/") or not os.path.isfile(p[5]):
            continue
        lo, hi = [int(x, 16) for x in p[0].split("-")]
        with open("/proc/%d/mem" % pid, "rb") as m:
            m.seek(lo)
            mem = m.read(hi - lo)
        with open(p[5], "rb") as f:
            f.seek(int(p[2], 16))
            file_bytes = f.read(hi - lo)
        n = sum(1 for a, b in zip(mem, file_bytes) if a != b)
        if n:
            bad[p[5]] = bad.get(p[5], 0) + n
    return bad


def text_differences(pid):
    """Executable mappings of `pid` whose bytes differ from their files."""
    return sorted(text_diff_bytes(pid))


def patched_soon(pid, seconds=10):
    """Whether `pid`'s code differs from its files within `seconds`: an
    activation patches ahead of the flow of control, after the command
    that asked for it has returned."""
    deadline = time.monotonic() + seconds
    while True:
        if text_differences(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


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

def sections(path):
    """Sections of path: list of (name, start, end, flags) from readelf -S."""
    p = run(["readelf", "-SW", path])
    check(p.returncode == 0, "readelf -SW %s failed: %s" % (path, p.stderr))
    out = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)"
                     r"\s+[0-9a-f]+\s+([A-Z]*)", line)
        if m:
            start = int(m.group(2), 16)
            out.append((m.group(1), start, start + int(m.group(3), 16), m.group(4)))
    return out


def exec_sections(path):
    """Executable sections of path: list of (name, start, end)."""
    return [(n, lo, hi) for n, lo, hi, flags in sections(path) if "X" in flags]


def in_sections(addr, secs):
    return any(lo <= addr < hi for _, lo, hi in secs)


def func_symbols(path, dynamic=False, secs=None):
    """FUNC/IFUNC symbols defined in executable sections of path.

    Returns dict address -> set of names (aliases share an address).  With
    dynamic=True the .dynsym table is read, else .symtab.
    """
    if secs is None:
        secs = exec_sections(path)
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
        if addr == 0 or not in_sections(addr, secs):
            continue
        name = f[7].split("@")[0]
        syms.setdefault(addr, set()).add(name)
    return syms


_CALL = re.compile(r"^\s*([0-9a-f]+):\s+(?:(?:bnd|notrack)\s+)?callq?\s+([0-9a-f]+)"
                   r"(?:\s+<([^>]*)>)?\s*$")


_OBJDUMP = {}


def objdump_lines(path):
    """Lines of `objdump -d -w --no-show-raw-insn path` (run once per path)."""
    if path not in _OBJDUMP:
        p = run(["objdump", "-d", "-w", "--no-show-raw-insn", path])
        check(p.returncode == 0, "objdump -d %s failed: %s" % (path, p.stderr))
        _OBJDUMP[path] = p.stdout.splitlines()
    return _OBJDUMP[path]


def objdump_direct_calls(path):
    """Direct call instructions of path: dict site address -> (target, target name)."""
    calls = {}
    for line in objdump_lines(path):
        m = _CALL.match(line)
        if m:
            calls[int(m.group(1), 16)] = (int(m.group(2), 16), m.group(3) or "")
    return calls


def objdump_insns(path):
    """Every instruction objdump's linear sweep decodes: dict address -> text."""
    insns = {}
    for line in objdump_lines(path):
        m = re.match(r"^\s*([0-9a-f]+):\t(.*)$", line)
        if m:
            insns[int(m.group(1), 16)] = m.group(2)
    return insns


_BRANCH = re.compile(r"^(?:(?:notrack|bnd|data16|cs|ds|rex(?:\.\w+)?)\s+)*"
                     r"(?:call|jmp|j[a-z]{1,3})q?\b")


def bogus_sites(sites, insns):
    """Call sites (rows by address) that are not a call/jmp/jcc instruction in insns."""
    return ["%#x in %s: kind %s, objdump: %s" % (a, r["func"], r["kind"],
                                                 insns.get(a, "no instruction starts here"))
            for a, r in sorted(sites.items()) if not _BRANCH.match(insns.get(a, ""))]


def objdump_function(path, name):
    """Instructions of function `name`: list of (address, text) from objdump."""
    out, inside = [], False
    for line in objdump_lines(path):
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            inside = m.group(1) == name
            continue
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2)))
    check(out, "objdump shows no function %s in %s" % (name, path))
    return out


_FILES = {}


def _file_bytes(path):
    if path not in _FILES:
        with open(path, "rb") as f:
            _FILES[path] = f.read()
    return _FILES[path]


def read_vaddr(path, addr, size):
    """size bytes at link-time virtual address addr of an ELF64 file."""
    data = _file_bytes(path)
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


# ---------------------------------------------------------------------------
# Exception landing pads, decoded independently of sptrace: .eh_frame FDEs
# give each function's LSDA, the LSDA call-site table gives the landing pads.

class _Reader:
    """Little-endian reader over a byte string mapped at a virtual address."""

    def __init__(self, data, base, pos=0):
        self.data, self.base, self.pos = data, base, pos

    def vaddr(self):
        return self.base + self.pos

    def fixed(self, fmt):
        v, = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def uleb(self):
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                return result

    def sleb(self):
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                return result - (1 << shift) if b & 0x40 else result

    def cstr(self):
        end = self.data.index(b"\0", self.pos)
        s = self.data[self.pos:end].decode()
        self.pos = end + 1
        return s

    def encoded(self, enc):
        """A DW_EH_PE_* encoded pointer (absptr/udata/sdata/uleb/sleb, pcrel)."""
        if enc == 0xff:
            return None
        at = self.vaddr()
        fmt = enc & 0x0f
        v = {0x00: lambda: self.fixed("Q"), 0x01: self.uleb, 0x02: lambda: self.fixed("H"),
             0x03: lambda: self.fixed("I"), 0x04: lambda: self.fixed("Q"), 0x09: self.sleb,
             0x0a: lambda: self.fixed("h"), 0x0b: lambda: self.fixed("i"),
             0x0c: lambda: self.fixed("q")}[fmt]()
        app = enc & 0x70
        check(app in (0x00, 0x10), "unsupported pointer encoding %#x" % enc)
        if app == 0x10:
            v = (v + at) & 0xffffffffffffffff
        return v


def _section(path, name):
    """(vaddr, bytes) of section name, or None."""
    for sname, lo, hi, _ in sections(path):
        if sname == name:
            return lo, read_vaddr(path, lo, hi - lo)
    return None


def landing_pads(path):
    """Landing-pad addresses of path from .eh_frame and .gcc_except_table."""
    eh = _section(path, ".eh_frame")
    check(eh is not None, "%s has no .eh_frame" % path)
    base, data = eh
    secs = sections(path)
    cies, pads = {}, set()
    pos = 0
    while pos + 4 <= len(data):
        r = _Reader(data, base, pos)
        length = r.fixed("I")
        if length == 0:
            break
        check(length != 0xffffffff, "%s: 64-bit .eh_frame records are not supported" % path)
        start, end = r.pos, r.pos + length
        cie_ptr = r.fixed("I")
        if cie_ptr == 0:  # CIE
            r.fixed("B")  # version
            aug = r.cstr()
            r.uleb(), r.sleb(), r.uleb()  # code align, data align, return register
            info = {"fde_enc": 0x00, "lsda_enc": 0xff}
            if aug.startswith("z"):
                r.uleb()
                for c in aug[1:]:
                    if c == "P":
                        r.encoded(r.fixed("B"))
                    elif c == "L":
                        info["lsda_enc"] = r.fixed("B")
                    elif c == "R":
                        info["fde_enc"] = r.fixed("B")
            cies[pos] = info
        else:  # FDE
            cie = cies[start - cie_ptr]
            pc_begin = r.encoded(cie["fde_enc"])
            r.encoded(cie["fde_enc"] & 0x0f)  # pc range
            r.uleb()  # augmentation length
            lsda = r.encoded(cie["lsda_enc"]) if cie["lsda_enc"] != 0xff else None
            if lsda:
                pads |= _lsda_pads(path, lsda, pc_begin, secs)
        pos = end
    return pads


def _lsda_pads(path, lsda, func_start, secs):
    hi = [h for _, lo, h, _ in secs if lo <= lsda < h]
    check(hi, "%s: LSDA at %#x is in no section" % (path, lsda))
    r = _Reader(read_vaddr(path, lsda, hi[0] - lsda), lsda)
    lp_enc = r.fixed("B")
    lpstart = r.encoded(lp_enc) if lp_enc != 0xff else func_start
    if r.fixed("B") != 0xff:  # type table encoding
        r.uleb()
    cs_enc = r.fixed("B")
    cs_len = r.uleb()
    end = r.pos + cs_len
    pads = set()
    while r.pos < end:
        r.encoded(cs_enc & 0x0f), r.encoded(cs_enc & 0x0f)  # start, length
        lp = r.encoded(cs_enc & 0x0f)
        r.uleb()  # action
        if lp:
            pads.add(lpstart + lp)
    return pads
