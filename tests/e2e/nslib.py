"""nslib.py — hosts made of network namespaces, for the tests of following
requests across hosts.

Hosts(n) makes n named network namespaces ("spt<pid>h<i>"), each with one
veth leg on a bridge and the address 10.77.0.<i+1>/24.  The bridge lives
in the calling process's own network namespace: call in_own_netns() first,
so the test's hosts and addresses are the test's alone.  close() removes
them (namespaces left by a killed test are removed by the next one).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from e2elib import fail


def in_own_netns():
    """Re-run this script in a new network namespace (loopback up)."""
    if os.environ.get("SPTRACE_TEST_NETNS") != "1":
        env = dict(os.environ, SPTRACE_TEST_NETNS="1")
        os.execvpe("unshare", ["unshare", "-n", "--", sys.executable] + sys.argv, env)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def build_workdir(build, prefix, progs=()):
    """For a script that runs hosts from a build directory (the daemon
    benches, the demo): this process in a network namespace of its own
    (in_own_netns), sptrace's and spdaemon's paths, a work directory others
    may enter (the test users run what is in it) holding copies of the
    build's tests/progs named in progs.  Returns (sptrace, spdaemon, tmp,
    [the copies' paths])."""
    build = os.path.abspath(build)
    in_own_netns()
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tmp, 0o755)
    copies = []
    for name in progs:
        copies.append(os.path.join(tmp, name))
        shutil.copy(os.path.join(build, "tests", "progs", name), copies[-1])
        os.chmod(copies[-1], 0o755)
    return (os.path.join(build, "cli", "sptrace"), os.path.join(build, "spdaemon", "spdaemon"),
            tmp, copies)


def _ip(*args):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def _remove_stale():
    """Namespaces of earlier test processes that are gone."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = re.match(r"spt(\d+)h\d+", line.split()[0] if line.split() else "")
        if m and not os.path.exists("/proc/%s" % m.group(1)):
            subprocess.run(["ip", "netns", "delete", m.group(0)], capture_output=True)


class Hosts:
    def __init__(self, n):
        _remove_stale()
        self.names = ["spt%dh%d" % (os.getpid(), i) for i in range(n)]
        self.addrs = ["10.77.0.%d" % (i + 1) for i in range(n)]
        self.made = []
        try:
            _ip("link", "add", "sptbr0", "type", "bridge")
            _ip("link", "set", "sptbr0", "up")
            for i, name in enumerate(self.names):
                _ip("netns", "add", name)
                self.made.append(name)
                _ip("link", "add", "sptv%d" % i, "type", "veth", "peer", "name", "eth0",
                    "netns", name)
                _ip("link", "set", "sptv%d" % i, "master", "sptbr0", "up")
                self.run(i, ["ip", "addr", "add", self.addrs[i] + "/24", "dev", "eth0"])
                self.run(i, ["ip", "link", "set", "eth0", "up"])
                self.run(i, ["ip", "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise

    def cmd(self, i, argv):
        """argv run in host i."""
        return ["ip", "netns", "exec", self.names[i]] + list(argv)

    def run(self, i, argv, timeout=60, **kw):
        r = subprocess.run(self.cmd(i, argv), capture_output=True, text=True, timeout=timeout,
                           **kw)
        return r

    def popen(self, i, argv, **kw):
        return subprocess.Popen(self.cmd(i, argv), **kw)

    def start_daemons(self, sptrace, spdaemon, tmp):
        """Cluster keys in tmp/keys and a spdaemon on each host (state in
        tmp/state<i>), started when this returns; their Popen objects."""
        kd = os.path.join(tmp, "keys")
        subprocess.run([sptrace, "keys", "init", kd], check=True, capture_output=True)
        for a in self.addrs:
            subprocess.run([sptrace, "keys", "issue", kd, a], check=True, capture_output=True)
        daemons = []
        for i, a in enumerate(self.addrs):
            state = os.path.join(tmp, "state%d" % i)
            daemons.append(self.popen(i, [spdaemon, "--keys", kd, "--name", a, "--state-dir",
                                          state, "--foreground"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            log = os.path.join(state, "spdaemon.log")
            deadline = time.monotonic() + 30
            while not (os.path.exists(log) and "started" in open(log).read()):
                if time.monotonic() > deadline:
                    fail("spdaemon did not start on host %s" % a)
                time.sleep(0.05)
        return daemons

    def close(self):
        for name in self.made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        self.made = []
