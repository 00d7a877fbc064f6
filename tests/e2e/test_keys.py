#!/usr/bin/env python3
"""test_keys.py SPTRACE CASE — `sptrace keys init|issue` (issue 13's contract).

  tls       a CA, a host certificate by name and one by IP address: openssl
            verifies each against the CA, each names its host in
            subjectAltName, the keys are 0600 and KEYDIR 0700, and two hosts'
            certificates complete a mutual TLS 1.3 handshake (openssl s_server
            and s_client, each requiring the other's certificate); a client
            whose certificate another CA signed is refused.
  refusals  nothing existing is replaced (CA, host keys), bad names and
            --days are refused, a KEYDIR that is a link or that others may
            write is refused, and each message names what to do.
"""

import os
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import check, free_port, need_program, run  # noqa: E402


def keys(sptrace, *args):
    return run([sptrace, "keys"] + list(args), timeout=60)


def ok(r, what):
    check(r.returncode == 0, "%s failed (%d): %s" % (what, r.returncode, r.stderr))


def refused(r, words, what):
    check(r.returncode != 0 and r.stderr.startswith("sptrace: ") and
          all(w in r.stderr for w in words),
          "%s: expected a refusal with %r, got %d: %r" % (what, words, r.returncode, r.stderr))



def handshake(kd, server, client, ca_dir=None):
    """A mutual TLS 1.3 handshake on loopback between `server` and `client`
    (names of certificates in kd; the client's may come from ca_dir): 0 when
    both sides verified each other, else the client's output."""
    port = free_port()
    ca = os.path.join(kd, "ca.crt")
    srv = subprocess.Popen(["openssl", "s_server", "-tls1_3", "-accept", "127.0.0.1:%d" % port,
                            "-cert", os.path.join(kd, server + ".crt"),
                            "-key", os.path.join(kd, server + ".key"), "-CAfile", ca,
                            "-Verify", "1", "-verify_return_error", "-naccept", "1"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        cdir = ca_dir or kd
        # s_server says ACCEPT once it listens.
        said = ""
        while "ACCEPT" not in said and srv.poll() is None and len(said) < 4096:
            said += srv.stdout.readline()
        check("ACCEPT" in said, "openssl s_server did not start: %r" % said)
        c = subprocess.run(["openssl", "s_client", "-tls1_3", "-connect", "127.0.0.1:%d" % port,
                            "-cert", os.path.join(cdir, client + ".crt"),
                            "-key", os.path.join(cdir, client + ".key"), "-CAfile", ca,
                            "-verify_return_error", "-verify_hostname", server],
                           input="hello\n", capture_output=True, text=True, timeout=20)
        # In TLS 1.3 the client is done before the server has judged its
        # certificate: the server's side says whether it was accepted.
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
        said += srv.stdout.read()
        out = c.stdout + c.stderr
        return 0 if ("Verify return code: 0 (ok)" in out and "TLSv1.3" in out and
                     "Client certificate" in said and "CN = %s\n" % client in said and
                     "verify error" not in said) else out + said
    finally:
        srv.kill()
        srv.wait()


def case_tls(sptrace, tmp):
    need_program("openssl", "openssl")
    kd = os.path.join(tmp, "keys")
    ok(keys(sptrace, "init", kd), "keys init")
    ok(keys(sptrace, "issue", kd, "alpha.example"), "keys issue alpha.example")
    ok(keys(sptrace, "issue", kd, "10.0.0.2"), "keys issue 10.0.0.2")
    check(stat.S_IMODE(os.stat(kd).st_mode) == 0o700, "KEYDIR is not 0700")
    for f in ("ca.key", "alpha.example.key", "10.0.0.2.key"):
        m = stat.S_IMODE(os.stat(os.path.join(kd, f)).st_mode)
        check(m == 0o600, "%s has mode %o, not 0600" % (f, m))
    check(sorted(os.listdir(kd)) == sorted(["ca.crt", "ca.key", "alpha.example.crt",
                                            "alpha.example.key", "10.0.0.2.crt",
                                            "10.0.0.2.key"]),
          "unexpected files in KEYDIR: %r" % os.listdir(kd))
    for name, san in (("alpha.example", "DNS:alpha.example"), ("10.0.0.2", "IP Address:10.0.0.2")):
        crt = os.path.join(kd, name + ".crt")
        r = run(["openssl", "verify", "-CAfile", os.path.join(kd, "ca.crt"), crt])
        check(r.returncode == 0, "openssl verify %s: %s" % (crt, r.stdout + r.stderr))
        text = run(["openssl", "x509", "-in", crt, "-noout", "-text"]).stdout
        check(san in text, "%s does not name %s:\n%s" % (crt, san, text))
        check("CA:FALSE" in text and "TLS Web Client Authentication" in text and
              "TLS Web Server Authentication" in text, "%s: wrong extensions:\n%s" % (crt, text))
        pub_crt = run(["openssl", "x509", "-in", crt, "-noout", "-pubkey"]).stdout
        pub_key = run(["openssl", "pkey", "-in", os.path.join(kd, name + ".key"),
                       "-pubout"]).stdout
        check(pub_crt and pub_crt == pub_key, "%s.key is not the key of %s.crt" % (name, name))
    ca_text = run(["openssl", "x509", "-in", os.path.join(kd, "ca.crt"), "-noout",
                   "-text"]).stdout
    check("CA:TRUE" in ca_text and "Certificate Sign" in ca_text, "ca.crt is not a CA:\n" + ca_text)
    # Two hosts authenticate each other; a stranger's certificate is refused.
    r = handshake(kd, "alpha.example", "10.0.0.2")
    check(r == 0, "mutual TLS 1.3 between two issued certificates failed:\n%s" % r)
    other = os.path.join(tmp, "other")
    ok(keys(sptrace, "init", other), "keys init (another CA)")
    ok(keys(sptrace, "issue", other, "intruder"), "keys issue intruder")
    r = handshake(kd, "alpha.example", "intruder", ca_dir=other)
    check(r != 0, "a client certificate of another CA was accepted")


def case_refusals(sptrace, tmp):
    kd = os.path.join(tmp, "keys")
    ok(keys(sptrace, "init", kd), "keys init")
    ok(keys(sptrace, "issue", kd, "h1"), "keys issue h1")
    before = {f: open(os.path.join(kd, f), "rb").read() for f in os.listdir(kd)}
    refused(keys(sptrace, "init", kd), ["already holds a CA", "never replaced"], "init twice")
    refused(keys(sptrace, "issue", kd, "h1"), ["already has keys", "remove"], "issue twice")
    for bad in ("a..b", "x-", "x_y", "ca", "a" * 64 + ".com", "bad name"):
        refused(keys(sptrace, "issue", kd, bad), ["is not a host name"], "issue %r" % bad)
    for days in ("0", "abc", "-5", "99999"):
        refused(keys(sptrace, "issue", kd, "h2", "--days", days), ["--days"], "--days " + days)
    after = {f: open(os.path.join(kd, f), "rb").read() for f in os.listdir(kd)}
    check(before == after, "a refused command changed KEYDIR: %r -> %r" %
          (sorted(before), sorted(after)))
    refused(keys(sptrace, "issue", os.path.join(tmp, "nowhere"), "h1"),
            ["no such directory", "sptrace keys init"], "issue without a CA")
    refused(keys(sptrace, "frob", kd), ["unknown action"], "keys frob")
    refused(keys(sptrace, "init"), ["usage: sptrace keys init KEYDIR"], "keys init without DIR")
    # A KEYDIR that is a link, or that others may write, is not used.
    link = os.path.join(tmp, "link")
    os.symlink(kd, link)
    refused(keys(sptrace, "issue", link, "h3"), ["not a directory", "link"], "KEYDIR a link")
    shared = os.path.join(tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    refused(keys(sptrace, "init", shared), ["no one else may write"], "KEYDIR mode 0777")
    check(os.listdir(shared) == [], "keys were written into a directory others may write")
    r = keys(sptrace, "--help")
    check(r.returncode == 0 and "sptrace keys issue KEYDIR NAME" in r.stdout, "keys --help")


def main():
    sptrace, case = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="sptrace-keys.") as tmp:
        {"tls": case_tls, "refusals": case_refusals}[case](sptrace, tmp)
    print("ok")


if __name__ == "__main__":
    main()
