"""test_run.py — `sptrace run` end to end: the agent traces real programs and
`sptrace replay` prints the call trees, which must be exactly the ones
written below; the traced program's output and exit status must not change.

usage: test_run.py SPTRACE CASE [PROGRAM...]
"""

import contextlib
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from e2elib import check, fail, func_symbols, patched_soon, text_differences

# Expected trees of tests/progs/trace_conf.c, the same at -O0 and -O2
# (";" separates replay lines; the indentation after it is the replay's).
CONF = {
    "nest": "main() {;  top() {;    mid() {;      leaf();;      leaf();;    } /* mid */;"
            "    leaf();;  } /* top */;  top() {;    mid() {;      leaf();;      leaf();;"
            "    } /* mid */;    leaf();;  } /* top */;} /* main */",
    "recursion": "main() {;  even() {;    odd() {;      even() {;        odd();;"
                 "      } /* even */;    } /* odd */;  } /* even */;  fact() {;    fact() {;"
                 "      fact() {;        fact();;      } /* fact */;    } /* fact */;"
                 "  } /* fact */;} /* main */",
    # a direct and an indirect tail jump: the callee closes with its caller
    "tail": "main() {;  tail_caller() {;    tail_target();;  } /* tail_caller */;"
            "  dispatch() {;    tail_op_a() {;      leaf();;    } /* tail_op_a */;"
            "  } /* dispatch */;  dispatch() {;    tail_op_b() {;      leaf();;"
            "    } /* tail_op_b */;  } /* dispatch */;} /* main */",
    # longjmp out of three frames: they end "unwound", the caller goes on.
    "longjmp": "main() {;  jumper() {;    jump_a() {;      jump_b() {;        jump_c() {;"
               "          leaf();;"
               "        } /* jump_c (no exit: unwound by longjmp or exception) */;"
               "      } /* jump_b (no exit: unwound by longjmp or exception) */;"
               "    } /* jump_a (no exit: unwound by longjmp or exception) */;    leaf();;"
               "  } /* jumper */;} /* main */",
    # exit() deep in the stack: the open calls have no exit record (the calls
    # into libc under deep_exit and crash are left out, see only()).
    "exit": "main() {;  deep2() {;    leaf();;    deep_exit() {;"
            "    } /* deep_exit (no exit: the trace ended) */;"
            "  } /* deep2 (no exit: the trace ended) */;} /* main (no exit: the trace ended) */",
    # abort() in a nested call: the trace is kept up to the crash.
    "abort": "main() {;  crash2() {;    leaf();;    crash() {;"
             "    } /* crash (no exit: the trace ended) */;"
             "  } /* crash2 (no exit: the trace ended) */;} /* main (no exit: the trace ended) */",
    # short sites (assembly): a relocated window, a trap and a window with
    # a rip-relative load, all traced; flags returned by callees survive the
    # exit records.
    "short": "main() {;  short_sites() {;    leaf();;    leaf();;    leaf();;    leaf();;"
             "  } /* short_sites */;  short_sites() {;    leaf();;    leaf();;    leaf();;"
             "    leaf();;  } /* short_sites */;} /* main */",
    "flags": "main() {;  flags_probe() {;    flag_setter();;    flag_zero();;"
             "  } /* flags_probe */;} /* main */",
    "segv": "main() {;  segv_outer() {;    leaf();;    segv_inner() {;      leaf();;"
            "    } /* segv_inner (no exit: the trace ended) */;"
            "  } /* segv_outer (no exit: the trace ended) */;} /* main (no exit: the trace ended) */",
}


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120, **kw)


def traced(sptrace, tdir, argv, on=None, ring_mb=None, options=()):
    cmd = [sptrace, "run", "-o", tdir] + list(options)
    if on:
        cmd += ["--on", on]
    if ring_mb:
        cmd += ["--ring-size", str(ring_mb)]
    return run(cmd + ["--"] + argv, env=repo_env(tdir))


# For a stripped program: its functions' names by address, from the
# unstripped file next to it (the agent names them sub_<address>).
SYMBOLS = {}


def load_symbols(prog):
    if not prog.endswith(".stripped"):
        return
    # Demangled and without parameters, as the replay shows names.
    out = subprocess.run(["nm", "-C", "--defined-only", prog[:-len(".stripped")]],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        p = line.split(" ", 2)
        if len(p) == 3 and p[1] in "tTwW":
            SYMBOLS.setdefault(int(p[0], 16), p[2].split("(")[0])


def unstrip(text):
    if not SYMBOLS:
        return text
    return re.sub(r"\bsub_([0-9a-f]+)\b", lambda m: SYMBOLS.get(int(m.group(1), 16), m.group(0)), text)


def repo_env(tdir):
    """The repository the traced run used (beside the trace directory): a
    stripped and an unstripped build share a build-id, so a repository shared
    by several tests would name one's functions from the other's analysis."""
    return dict(os.environ, SPTRACE_REPO=os.path.join(tdir, "..", "repo"))


def replay(sptrace, tdir, env=None):
    """sptrace replay DIR, with a stripped program's sub_<address> names
    turned back into its symbols (env: the trace's, if not repo_env's)."""
    r = run([sptrace, "replay", tdir], env=env or repo_env(tdir))
    return subprocess.CompletedProcess(r.args, r.returncode, unstrip(r.stdout), r.stderr)


def replay_tree(sptrace, tdir, env=None):
    r = replay(sptrace, tdir, env)
    check(r.returncode == 0, "sptrace replay %s failed (%d): %s" % (tdir, r.returncode, r.stderr))
    lines = []
    for line in r.stdout.splitlines():
        if line.startswith("#") or "|" not in line:
            continue
        text = line.split("| ", 1)[1] if "| " in line else ""
        if text.strip().startswith("/*"):
            continue                      # events: /* activate */
        lines.append(text.rstrip())
    return lines


def only(tree, allowed):
    """The tree restricted to the functions in `allowed` (with the calls they
    make into other modules -- libc, the loader -- left out): the expected
    trees below name only the test program's own functions."""
    out, skip_until = [], None
    for line in tree:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        text = line.strip()
        if skip_until is not None:
            if depth == skip_until and text.startswith("}"):
                skip_until = None
            continue
        name = text[5:].split(" ")[0] if text.startswith("} /* ") else text.split("(")[0]
        if name in allowed:
            out.append(line)
        elif text.endswith("{"):
            skip_until = depth
    return out


def same_behaviour(native, trace, what):
    check(native.returncode == trace.returncode,
          "%s: exit status %d native, %d traced" % (what, native.returncode, trace.returncode))
    check(native.stdout == trace.stdout,
          "%s: output differs:\n--- native\n%s\n--- traced\n%s" % (what, native.stdout, trace.stdout))


def case_conf(sptrace, prog, scenario, tmp):
    tdir = os.path.join(tmp, "trace")
    native = run([prog, scenario])
    trace = traced(sptrace, tdir, [prog, scenario])
    same_behaviour(native, trace, "%s %s" % (os.path.basename(prog), scenario))
    allowed = {"main", "top", "mid", "leaf", "fact", "even", "odd", "tail_caller",
               "tail_target", "deep2", "deep_exit", "crash2", "crash", "spin", "jumper",
               "jump_a", "jump_b", "jump_c", "segv_outer", "segv_inner", "short_sites",
               "flags_probe", "flag_setter", "flag_zero", "dispatch", "tail_op_a", "tail_op_b"}
    got = ";".join(only(replay_tree(sptrace, tdir), allowed))
    want = CONF[scenario]
    if scenario == "flags":
        check(trace.stdout == "flags 0x8950044\n",
              "flags: the callees' flags were not seen by their caller: %r" % trace.stdout)
    check(got == want, "%s %s: call tree differs\n--- want\n%s\n--- got\n%s" %
          (os.path.basename(prog), scenario, want.replace(";", "\n"), got.replace(";", "\n")))
    with open(os.path.join(tdir, "meta")) as f:
        meta = f.read()
    if scenario in ("abort", "segv"):
        sig = 6 if scenario == "abort" else 11
        check("end killed by signal %d" % sig in meta, "%s: meta does not say the program was "
              "killed by signal %d:\n%s" % (scenario, sig, meta))
        # The agent recorded the signal before it took effect: a "fatal"
        # line in meta, a signal event last in the crashing thread.
        check(re.search(r"\nfatal %d \d+ " % sig, meta), "%s: no 'fatal %d' line in meta:\n%s" %
              (scenario, sig, meta))
        r = replay(sptrace, tdir)
        events = [l for l in r.stdout.splitlines() if "/* " in l and "{" not in l and "}" not in l
                  and "();" not in l]
        check(events and events[-1].endswith("/* signal */"),
              "%s: the replay does not end with the signal: %r" % (scenario, events))
    else:
        check("\nend " in meta, "meta has no 'end' line:\n" + meta)


def per_thread_trees(sptrace, tdir, allowed):
    r = replay(sptrace, tdir)
    check(r.returncode == 0, "replay failed: " + r.stderr)
    per_tid = {}
    for line in r.stdout.splitlines():
        if "[" not in line or "| " not in line:
            continue
        tid = line.split("[", 1)[1].split("]", 1)[0].strip()
        text = line.split("| ", 1)[1].rstrip()
        if not text.strip().startswith("/*"):
            per_tid.setdefault(tid, []).append(text)
    return sorted(";".join(only(t, allowed)) for t in per_tid.values())


def case_churn(sptrace, prog, scenario, tmp):
    """Two threads start threads without pause while main's first setjmp
    (churn) or first pthread_join (churn-detached) has the agent patch the
    C library's _setjmp or __nptl_free_tcb, with every batch's int3s held
    30 ms (SPTRACE_TEST_PATCH_DELAY_MS).  Each new thread runs _setjmp with
    every signal blocked before its start routine, and each detached one
    frees its descriptor with every signal blocked at its end: one meeting
    an int3 there was killed by SIGTRAP (patch.c, threads being started).
    The program runs as it does natively and every started thread is
    traced."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, scenario])
    trace = run([sptrace, "run", "-o", tdir, "--", prog, scenario],
                env=dict(repo_env(tdir), SPTRACE_TEST_PATCH_DELAY_MS="30"))
    same_behaviour(native, trace, scenario)
    trees = per_thread_trees(sptrace, tdir, {"main", "churn", "churner", "churn_child",
                                             "jumper", "jump_a", "join_once", "leaf"})
    children = sum(1 for t in trees if t.startswith("churn_child()"))
    check(children >= 200, "%s: %d started threads traced, expected 200 or more" %
          (scenario, children))
    with open(os.path.join(tdir, "agent.log")) as f:
        log = f.read()
    # An instrumentation that waited 2 ms for the threads being started is
    # left for a later call (patch.c, step 3): then jump_a's first call may
    # be recorded without its calls, and agent.log says so.
    put_off = re.search(r"end: [1-9]\d* instrumentations were put off", log)
    trigger = ("join_once()" if scenario == "churn-detached"
               else "jumper() {;      jump_a()" + ("" if put_off else " {;"))
    check(any(t.startswith("main() {;  churn() {;    " + trigger) for t in trees),
          "%s: main's tree lacks churn -> %s:\n%s\nagent.log:\n%s" %
          (scenario, trigger, "\n".join(t for t in trees if t.startswith("main")),
           log[-3000:]))


def case_ends_barrier(sptrace, prog, tmp):
    """300 threads end at once, each one's destructor waiting at a barrier
    for all the others: more ends than the agent has slots to announce
    them (patch.c, step 7).  An end never waits for a slot -- an agent
    whose ends waited for one hung here, the holders waiting for the
    waiters -- and agent.log says one went unannounced."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "ends-barrier"])
    trace = traced(sptrace, tdir, [prog, "ends-barrier"])
    same_behaviour(native, trace, "ends-barrier")
    with open(os.path.join(tdir, "agent.log")) as f:
        log = f.read()
    check("threads were starting or ending at once" in log,
          "ends-barrier: agent.log does not say an end went unannounced:\n%s" % log)


def case_short_hot(sptrace, prog, tmp):
    """A trap on a hot call (short_sites' `call *%rbx`, 2 x 2,000 times with
    a pause between) is put back after 64 hits: the program's output is the
    same, the agent says so, the calls until then went through the trap and
    are traced, those after the pause are not."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "short-hot"])
    trace = traced(sptrace, tdir, [prog, "short-hot"])
    same_behaviour(native, trace, "short-hot")
    with open(os.path.join(tdir, "agent.log")) as f:
        log = f.read()
    check(re.search(r"\d+ trap\(s\) on calls hit 64 times put back", log),
          "short-hot: the hot trap was not put back:\n%s" % log[-2000:])
    tree = only(replay_tree(sptrace, tdir), {"main", "short_sites", "leaf"})
    leaves = sum(1 for l in tree if l.strip() == "leaf();")
    check(3 * 4000 + 64 <= leaves <= 3 * 4000 + 2000,
          "short-hot: %d leaf calls traced; want every call through the two windows and the "
          "direct site (12,000), the "
          "trap's calls until it went (64 or more, at most the first 2,000), none after "
          "the pause" % leaves)


def case_fork(sptrace, prog, tmp):
    """fork: the child goes on tracing into its own ring."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "fork"])
    trace = traced(sptrace, tdir, [prog, "fork"])
    same_behaviour(native, trace, "fork")
    rings = [f for f in os.listdir(tdir) if f.startswith("ring.")]
    check(len(rings) == 2, "fork: expected a ring for the parent and one for the child: %r" % rings)
    trees = per_thread_trees(sptrace, tdir, {"main", "forked", "child_work", "parent_work", "leaf"})
    want = sorted(["child_work() {;  leaf();;  leaf();;} /* child_work */",
                   "main() {;  forked() {;    parent_work() {;      leaf();;"
                   "    } /* parent_work */;  } /* forked */;} /* main */"])
    check(trees == want, "fork: trees differ\n--- want\n%s\n--- got\n%s" %
          ("\n".join(want), "\n".join(trees)))


def case_fork_areas(sptrace, prog, tmp):
    """fork: the child makes patch areas after its parent made new ones in
    the pool they share (agent/pool.c), and the parent runs its own again:
    each side's calls go where its own areas say."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "fork-areas"])
    check(native.stdout == "parent 8 8, child 66\n", "fork-areas native: %r" % native.stdout)
    trace = traced(sptrace, tdir, [prog, "fork-areas"])
    same_behaviour(native, trace, "fork-areas")
    trees = per_thread_trees(sptrace, tdir, {"main", "fork_areas", "parent_late", "child_late",
                                             "mid", "leaf"})
    want = sorted(["child_late() {;  mid() {;    leaf();;    leaf();;  } /* mid */;"
                   "  mid() {;    leaf();;    leaf();;  } /* mid */;} /* child_late */",
                   "main() {;  fork_areas() {;    parent_late() {;      leaf();;"
                   "    } /* parent_late */;    parent_late() {;      leaf();;"
                   "    } /* parent_late */;  } /* fork_areas */;} /* main */"])
    check(trees == want, "fork-areas: trees differ\n--- want\n%s\n--- got\n%s" %
          ("\n".join(want), "\n".join(trees)))


def sites_of(tdir):
    """The trace's site descriptions (common/trace_format.h, trace_site):
    (caller_module, callee_module, site_addr, caller_func, callee_func,
    kind, flags) per id, id 0 first."""
    with open(os.path.join(tdir, "sites"), "rb") as f:
        data = f.read()
    n, = struct.unpack_from("<I", data, 0)
    return [struct.unpack_from("<IIQQQII", data, 40 * i) for i in range(1, n)]


def case_fork_hints(sptrace, prog, tmp):
    """20 children forked in turn each call child_only(), which the parent
    never calls: the first child's instrumentation is a hint the parent
    follows before its next fork (agent/instrument.c), so child_only's two
    sites get ids once or twice, not once per child (the old agent: 40),
    and every child's calls are still traced."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "fork-hints"])
    check(native.stdout.startswith("children said "), "fork-hints native: %r" % native.stdout)
    trace = traced(sptrace, tdir, [prog, "fork-hints"])
    same_behaviour(native, trace, "fork-hints")
    addr = [a for a, names in func_symbols(prog).items() if "child_only" in names]
    check(len(addr) == 1, "fork-hints: child_only not found in %s's symbols" % prog)
    ids = [s for s in sites_of(tdir) if s[3] == addr[0] and s[0] == 0]
    check(2 <= len(ids) <= 6, "fork-hints: child_only's 2 call sites got %d ids in 20 children "
          "(each child instrumented it again?)" % len(ids))
    trees = per_thread_trees(sptrace, tdir, {"child_only", "leaf"})
    want = "child_only() {;  leaf();;  leaf();;} /* child_only */"
    check(sum(1 for t in trees if t == want) == 20,
          "fork-hints: want 20 children's %r, got:\n%s" % (want, "\n".join(trees)))


def case_fork_stubs(sptrace, prog, tmp):
    """A pre-forking server under --on accept: two workers forked before any
    activation are each activated by their accept, and the frames of their
    different chains get return stubs.  Nothing was written into the
    return-stub pool before the fork, so it is not copied at the fork
    (agent/pool.c, point 4): each worker maps memory of its own over it
    before its first stub.  Without that, the second worker's stubs took
    the first one's slots in the parent's pool and sent its returns into
    the other chain ("workers 21 26")."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "fork-stubs"])
    check(native.stdout == "fork-stubs workers 13 26\n", "fork-stubs native: %r" % native.stdout)
    trace = traced(sptrace, tdir, [prog, "fork-stubs"], on="accept")
    same_behaviour(native, trace, "fork-stubs")
    log = open(os.path.join(tdir, "agent.log")).read()
    stubs = re.findall(r"pid (\d+): activation: thread \d+ walked \d+ frames, \d+ traced functions "
                       r"entered, ([1-9]\d*) return stubs", log)
    check(len({pid for pid, _ in stubs}) == 2,
          "fork-stubs: want return stubs in both workers, agent.log says:\n" + log)


def case_signals(sptrace, prog, tmp):
    """Timer signals arriving while traced code runs (in patch areas too):
    same behaviour; the handler is traced from its start, like a thread's
    start routine; the program's own SIGTRAP handler still gets its traps."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "signals"])
    # ~20 ms of calls between the alarms: a ring big enough to keep them all
    trace = traced(sptrace, tdir, [prog, "signals"], ring_mb=512)
    check(native.stdout == "alarms 320\n", "native: %r" % native.stdout)
    same_behaviour(native, trace, "signals")
    tree = replay_tree(sptrace, tdir)
    names = [l.strip().split("(")[0] for l in tree]
    check(names.count("on_alarm") >= 20 and names.count("on_alarm_work") >= 20,
          "signals: %d handler calls traced, expected 20" % names.count("on_alarm"))


def case_spawn(sptrace, prog, tmp):
    """posix_spawn, system() and vfork+exec: the same output and status,
    and each child traced."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "spawn"])
    trace = traced(sptrace, tdir, [prog, "spawn"])
    check("spawned" in native.stdout and "vforked" in native.stdout and "spawn 30" in native.stdout,
          "native: %r" % native.stdout)
    same_behaviour(native, trace, "spawn")
    names = [l.strip().split("(")[0] for l in replay_tree(sptrace, tdir)]
    check("spawn_all" in names and "posix_spawn" in names, "spawn: calls missing from the trace")
    # The vfork child's exec is traced in a subdirectory of its own, and
    # does not pass for the traced process's exec.
    r = run([sptrace, "replay", tdir], env=repo_env(tdir))
    check(re.search(r"# child pid \d+ exec'd /bin/echo: its trace is in .*/exec\.\d+\.\d+", r.stdout)
          and "# exec: the process went on" not in r.stdout,
          "spawn: the vfork child's exec is not reported as the child's:\n" +
          "\n".join(l for l in r.stdout.splitlines() if l.startswith("#")))
    # The posix_spawn child is traced too, from echo's main, in its own
    # subdirectory; so is system()'s shell (the agent's own system: the C
    # library's spawns past the posix_spawn interposer).
    for who, path in (("the posix_spawn child", "/bin/echo"), ("system()'s shell", "/bin/sh")):
        m = re.search(r"# child pid \d+ exec'd %s: its trace is in (.*/spawn\.\d+\.\d+)" % path,
                      r.stdout)
        check(m, "spawn: %s is not traced:\n" % who +
              "\n".join(l for l in r.stdout.splitlines() if l.startswith("#")))
        child = replay(sptrace, m.group(1))
        check(child.returncode == 0 and "main() {" in child.stdout,
              "spawn: the trace of %s has no main:\n%s%s" %
              (who, child.stdout[:2000], child.stderr))


def case_system(sptrace, prog, tmp):
    """system(): the command's SIGINT to its parent is ignored while it runs,
    the program's handler is back after, the exit status comes through; a
    thread cancelled in system() kills and reaps its shell and puts SIGINT's
    handler back -- traced as natively; and the shell is traced."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "system"])
    check(native.stdout == "from-the-shell\nduring 0\nsystem 41\n"
          "cancelled yes, shell reaped, handler back\n", "native: %r" % native.stdout)
    trace = traced(sptrace, tdir, [prog, "system"])
    same_behaviour(native, trace, "system")
    r = run([sptrace, "replay", tdir], env=repo_env(tdir))
    check(re.search(r"# child pid \d+ exec'd /bin/sh: its trace is in .*/spawn\.\d+\.\d+", r.stdout),
          "system: the shell is not traced:\n" + r.stdout[:2000])


def case_dl(sptrace, prog, tmp):
    """dlsym(RTLD_NEXT) and dlopen find their caller from their return
    address: tracing must not change what they find."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "dl"])
    trace = traced(sptrace, tdir, [prog, "dl"])
    check(native.stdout == "tail found, call found, dlopen ok\n", "native: %r" % native.stdout)
    same_behaviour(native, trace, "dl")
    names = [l.strip().split("(")[0] for l in replay_tree(sptrace, tdir)]
    check("next_sym_tail" in names and "next_sym_call" in names and "dlsym" in names,
          "dl: the calls are missing from the trace")


def case_unwind(sptrace, prog, case, tmp):
    """The process's unwinder, libgcc_s, is loaded only when the program needs
    it, as natively: a C program that never unwinds does not get it from the
    agent (the old agent loaded it into every process).  When glibc's
    backtrace() loads it (unwind-bt), or a library dlopen'd brings it and its
    walk runs at once (unwind-dl), the walk still goes through every traced
    call to main and the C library's start: the areas' unwind information
    reached it first (agent/x86_64/unwind.c, step 3)."""
    tdir = os.path.join(tmp, "trace")
    walk = "backtrace" if case == "unwind-bt" else "_Unwind_Backtrace"
    native = run([prog, case])
    check(native.returncode == 3 and native.stdout ==
          "libgcc_s at start: no\n%s through traced calls: deep\nlibgcc_s now: yes\n" % walk,
          "%s natively: %d %r" % (case, native.returncode, native.stdout))
    trace = traced(sptrace, tdir, [prog, case])
    same_behaviour(native, trace, case)
    log = open(os.path.join(tdir, "agent.log")).read()
    why = "backtrace" if case == "unwind-bt" else "dlopen"
    check(re.search(r"unwind: %s: the areas' unwind information \(\d+ registrations\) given "
                    r"to libgcc_s" % why, log),
          "%s: agent.log does not say the areas went to libgcc_s at %s:\n%s" % (case, why, log))
    names = [l.strip().split("(")[0] for l in replay_tree(sptrace, tdir)]
    check("bt_leaf" in names and "bt_top" in names, "%s: the walk's callers are not traced:\n%s"
          % (case, "\n".join(names[:60])))


def case_threads(sptrace, prog, tmp):
    """Threads created after activation are traced from their start routine;
    pthread_exit unwinds through traced calls without harm."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "threads"])
    trace = traced(sptrace, tdir, [prog, "threads"])
    same_behaviour(native, trace, "threads")
    trees = per_thread_trees(sptrace, tdir, {"main", "threads", "worker", "worker_exit", "leaf"})
    want = sorted(["main() {;  threads() {;  } /* threads */;} /* main */",
                   "worker() {;  leaf();;  leaf();;} /* worker */",
                   "worker() {;  leaf();;  leaf();;} /* worker */",
                   "worker() {;  leaf();;  leaf();;} /* worker */",
                   "worker_exit() {;  leaf();;} /* worker_exit (no exit: the trace ended) */"])
    check(trees == want, "threads: per-thread trees differ\n--- want\n%s\n--- got\n%s" %
          ("\n".join(want), "\n".join(trees)))


def case_exceptions(sptrace, prog, tmp):
    tdir = os.path.join(tmp, "trace")
    native = run([prog])
    trace = traced(sptrace, tdir, [prog])
    same_behaviour(native, trace, os.path.basename(prog))
    check("caught: deep 1" in trace.stdout and "~f5" in trace.stdout,
          "the exception was not caught with destructors run:\n" + trace.stdout)
    tree = replay_tree(sptrace, tdir)
    # Names may be shown mangled (_Z2f1i) or demangled (f1(int)).
    def plain(line):
        return re.sub(r"_Z\d+([a-z0-9]+?)i\(\)", r"\1()", line)
    tree = [plain(l) for l in tree]
    for depth, fn in enumerate(["catcher() {", "f1() {", "f2() {", "f3() {", "f4() {"]):
        check(any(l == "  " * (depth + 1) + fn for l in tree),
              "no '%s' at depth %d in the replay:\n%s" % (fn, depth + 1, "\n".join(tree)))
    check(any(l.strip().startswith("f5()") for l in tree), "f5 missing from the replay")
    check(any("unwound by longjmp or exception" in l for l in tree),
          "the frames the exception unwound are not marked in the replay")


def case_exceptions_midrun(sptrace, prog, tmp):
    """Tracing begins while s3 sleeps under s2, s1 and catcher_slow, whose
    return addresses become return stubs; s3 then throws: the exception
    must unwind through the stubs (their unwind information), run every
    destructor and be caught, and the replay must show the frames unwound."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "midrun"])
    check("caught: late 1" in native.stdout and native.returncode == 5,
          "native: %d %r" % (native.returncode, native.stdout))
    trace = traced(sptrace, tdir, [prog, "midrun"], on="timer 0.3")
    same_behaviour(native, trace, os.path.basename(prog) + " midrun")
    log = open(os.path.join(tdir, "agent.log")).read()
    check(re.search(r"walked \d+ frames, \d+ traced functions entered, [1-9]\d* return stubs", log),
          "no return stubs were placed:\n" + log)
    tree = [re.sub(r"_Z\d+([a-z0-9_]+?)i\(\)", r"\1()", l) for l in replay_tree(sptrace, tdir)]
    # main() opens the tree at -O0; at -O2 it tail-calls catcher_slow.
    top = [l for l in tree if l.strip() == "catcher_slow() {"]
    check(top, "catcher_slow is missing from the replay:\n" + "\n".join(tree))
    pad = top[0][:len(top[0]) - len(top[0].lstrip())]
    for depth, fn in enumerate(["s1() {", "s2() {", "s3() {"]):
        check(any(l == pad + "  " * (depth + 1) + fn for l in tree),
              "no '%s' under catcher_slow in the replay:\n%s" % (fn, "\n".join(tree)))
    check(any("/* s1 (no exit: unwound by longjmp or exception) */" in l for l in tree),
          "s1, unwound by the exception, is not marked:\n" + "\n".join(tree))
    check(any(l == pad + "} /* catcher_slow */" for l in tree),
          "catcher_slow's return (through its stub) is missing:\n" + "\n".join(tree))
    check(any(l.strip() == "catcher() {" for l in tree),
          "the handler's call of catcher() is not traced:\n" + "\n".join(tree))


def case_python(sptrace, tmp):
    py = "/usr/bin/python3.11"
    if not os.path.exists(py):
        fail("%s is missing; install the Debian package python3.11 (test.sh does)" % py)
    script = os.path.join(tmp, "s.py")
    with open(script, "w") as f:
        f.write("import json\n"
                "def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)\n"
                "print(fib(15), json.dumps({'a': [1, 2, 3]}, sort_keys=True))\n"
                "raise SystemExit(3)\n")
    tdir = os.path.join(tmp, "trace")
    native = run([py, script])
    trace = traced(sptrace, tdir, [py, script])
    same_behaviour(native, trace, "python3.11")
    tree = replay_tree(sptrace, tdir)
    check(len(tree) > 1000, "python3.11: only %d replay lines" % len(tree))
    check(tree[0] == "main() {", "python3.11: the trace does not start at main: %r" % tree[:3])
    check(any(l.strip().startswith("Py_BytesMain") for l in tree[:5]),
          "python3.11: no Py_BytesMain under main: %r" % tree[:5])


def python_dlopening(sptrace, tmp, script_text, lib_globs, what):
    """python3.11 running script_text natively and traced, the same; the
    extension module and library it dlopen's (lib_globs) already in the
    repository, as after their first traced run: their analysis (seconds)
    does not race the script's sleep.  The traced run and its directory."""
    import glob
    py = "/usr/bin/python3.11"
    script = os.path.join(tmp, "script.py")
    with open(script, "w") as f:
        f.write(script_text)
    libs = [lib for g in lib_globs for lib in glob.glob(g)]
    check(len(libs) == len(lib_globs), "%s: a module is missing: %r" % (what, libs))
    r = run([sptrace, "analyze-binary", "-q", "--repo", os.path.join(tmp, "repo")] + libs)
    check(r.returncode == 0, "analyze-binary failed: " + r.stderr)
    tdir = os.path.join(tmp, "trace")
    native = run([py, script])
    trace = traced(sptrace, tdir, [py, script])
    same_behaviour(native, trace, what)
    return trace, tdir


def case_python_dlopen(sptrace, tmp):
    """Modules loaded with dlopen after the start (a Python C extension and
    the library under it) are found, analysed off the program's threads and
    traced from then on."""
    trace, tdir = python_dlopening(
        sptrace, tmp,
        "import sqlite3, time\n"
        "time.sleep(1.0)   # the agent's control thread looks every 200 ms\n"
        "c = sqlite3.connect(':memory:')\n"
        "c.execute('create table t(a)')\n"
        "c.executemany('insert into t values (?)', [(i,) for i in range(100)])\n"
        "print(c.execute('select sum(a) from t').fetchone()[0])\n",
        ["/usr/lib/python3.11/lib-dynload/_sqlite3*.so",
         "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0"], "python3.11 with sqlite3")
    with open(os.path.join(tdir, "meta")) as f:
        meta = f.read()
    check("libsqlite3.so" in meta and "_sqlite3" in meta,
          "the dlopen'd modules are not in meta:\n" + meta)
    r = run([sptrace, "report", tdir])
    check(r.returncode == 0 and "sqlite3_prepare_v2" in r.stdout,
          "no call into libsqlite3 was traced: %s" % r.stdout[:800])


def case_python_libcrypto(sptrace, tmp):
    """Libraries the agent used to keep for itself (issue 11, item 7):
    python3.11's hashlib calls into the program's own libcrypto, and its
    zlib module into libz, which the agent once shared: both are traced, and
    the summary names neither."""
    trace, tdir = python_dlopening(
        sptrace, tmp,
        "import hashlib, time, zlib\n"
        "time.sleep(1.0)   # the agent's control thread looks every 200 ms\n"
        "print(sum(len(hashlib.sha256(b'x' * i).hexdigest()) for i in range(100)),\n"
        "      zlib.crc32(b'sptrace'), len(zlib.compress(b'sptrace' * 100)))\n",
        ["/usr/lib/python3.11/lib-dynload/_hashlib*.so",
         "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"], "python3.11 with hashlib")
    check("not traced" not in trace.stderr, "the summary names a library: %r" % trace.stderr)
    r = run([sptrace, "report", tdir])
    check(r.returncode == 0 and "EVP_DigestInit_ex" in r.stdout,
          "no call into libcrypto was traced: %s" % r.stdout[:800])
    check(re.search(r"\bdeflate\b", r.stdout),
          "no call into libz (deflate) was traced: %s" % r.stdout[:800])


# What the agent may share with the program (issue 11, item 7): the C
# library and the loader.  Everything else it needs is linked in
# (agent/meson.build).
AGENT_SHARED = {"libc.so.6", "ld-linux-x86-64.so.2", "linux-vdso.so.1"}


def dynamic_symbols(path):
    """The names a shared object defines in its dynamic symbol table."""
    r = run(["nm", "-D", "--defined-only", path])
    check(r.returncode == 0, "nm -D %s: %s" % (path, r.stderr))
    return {line.split()[-1].split("@")[0] for line in r.stdout.splitlines() if line.strip()}


def case_agent_libraries(agent):
    """The agent loads no library but the C library and the loader (ldd, and
    its own NEEDED entries), and exports nothing of the libraries linked into
    it: only its interposers, which bear C library names, and its attach
    entry point.  A library it loaded, or a symbol of capstone, libelf,
    zlib, protobuf-c or libgcc it exported, would be shared with the
    program: the program's calls into it untraced, or bound to the agent's
    copy."""
    r = run(["ldd", agent])
    check(r.returncode == 0, "ldd %s: %s" % (agent, r.stderr))
    libs = {line.split()[0].rsplit("/", 1)[-1] for line in r.stdout.splitlines() if line.strip()}
    extra = sorted(libs - AGENT_SHARED)
    check(not extra, "the agent loads %s: the program's own copies would be shared with it; "
          "link them in (agent/meson.build)" % extra)
    r = run(["readelf", "-dW", agent])
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout))
    check(needed <= AGENT_SHARED, "the agent needs %s" % sorted(needed - AGENT_SHARED))
    libc = dynamic_symbols("/lib/x86_64-linux-gnu/libc.so.6")
    foreign = sorted(dynamic_symbols(agent) - libc - {"sptrace_agent_attach"})
    check(not foreign, "the agent exports %d symbols that are no C library function's: %s"
          % (len(foreign), foreign[:20]))


@contextlib.contextmanager
def spinning(sptrace, prog, tmp, tdir, options=()):
    """`sptrace run OPTIONS -- prog spin` running: yields (the sptrace run
    process, the pid of the spinning program); kills the program at the end
    and waits for sptrace run."""
    p = subprocess.Popen([sptrace, "run", "-o", tdir] + list(options) + ["--", prog, "spin"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo")))
    child = None
    try:
        check(p.stdout.readline().strip() == "spinning", "the spinning program did not start")
        children = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
        check(len(children) == 1, "expected one child of sptrace run, found %r" % children)
        child = int(children[0])
        yield p, child
    finally:
        try:
            os.kill(child, signal.SIGKILL) if child else p.kill()
        except ProcessLookupError:
            pass
        p.communicate(timeout=60)


def case_kill9(sptrace, prog, tmp):
    """kill -9 of the traced process: the records written so far are kept.
    The ring is 1 MiB in flight-recorder mode, so it wraps: the replay must
    say how much was lost."""
    tdir = os.path.join(tmp, "trace")
    with spinning(sptrace, prog, tmp, tdir, ["--ring-size", "1", "--flight-recorder"]) as (p, child):
        time.sleep(0.3)
        os.kill(child, signal.SIGKILL)
    check(p.returncode == -signal.SIGKILL,
          "sptrace run should end like the program (SIGKILL), got %d" % p.returncode)
    with open(os.path.join(tdir, "meta")) as f:
        meta = f.read()
    check("end killed by signal 9" in meta, "meta does not record the kill:\n" + meta)
    r = run([sptrace, "replay", tdir], env=repo_env(tdir))
    check(r.returncode == 0, "kill -9: replay failed: " + r.stderr)
    check("records lost: the ring was full" in r.stdout,
          "kill -9: the wrapped ring's losses are not reported:\n" + r.stdout[:500])
    leaves = sum(1 for l in replay_tree(sptrace, tdir) if l.strip() == "leaf();")
    check(leaves > 50000, "kill -9: only %d leaf() calls survived in a 1 MiB ring" % leaves)


def report_calls(sptrace, tdir):
    """{function: calls} and the report's text."""
    r = run([sptrace, "report", tdir], env=repo_env(tdir))
    check(r.returncode == 0, "report %s failed: %s" % (tdir, r.stderr))
    calls = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*[\d.]+ +\w+\s+[\d.]+ +\w+\s+(\d+)  (\S+)$", line)
        if m:
            calls[m.group(2)] = int(m.group(1))
    return calls, r.stdout


def case_keep_all(sptrace, prog, tmp):
    """Every record kept: each thread's ring.<tid> grows as it writes (here
    through a 4 MiB window, 512 Ki records), so 500,000 paced calls (two
    million records, four windows) are all in the report, and no seg.<tid>
    file is made.  With --flight-recorder only the newest are kept, and the
    report says first how many records were lost."""
    n = 500000
    native = run([prog, "paced", str(n)])
    check(native.returncode == 3 and native.stdout.startswith("paced %d " % n),
          "native paced run: %r" % native.stdout)
    for flight in (False, True):
        tdir = os.path.join(tmp, "trace-flight" if flight else "trace")
        trace = traced(sptrace, tdir, [prog, "paced", str(n)], ring_mb=4,
                       options=["--flight-recorder"] if flight else [])
        same_behaviour(native, trace, "paced")
        segs = [f for f in os.listdir(tdir) if f.startswith("seg.")]
        check(not segs, "seg.<tid> files in %s: %r" % (tdir, segs))
        calls, text = report_calls(sptrace, tdir)
        if not flight:
            check("records lost" not in text and calls.get("paced") == n and
                  calls.get("leaf") == n,
                  "keep-all: the trace does not hold all %d calls:\n%s" % (n, text[:1500]))
        else:
            check(text.startswith("# WARNING: ") and "records lost" in text.splitlines()[0]
                  and 0 < calls.get("paced", 0) < n,
                  "--flight-recorder: expected the oldest records lost, said first:\n%s" %
                  text[:1500])


def case_stop(sptrace, prog, tmp):
    """sptrace stop PID: every patched byte back, the trace completed, the
    program running on."""
    tdir = os.path.join(tmp, "trace")
    with spinning(sptrace, prog, tmp, tdir) as (p, child):
        check(text_differences(child), "the traced program's code was not patched at all")
        r = run([sptrace, "stop", str(child)])
        check(r.returncode == 0 and "tracing stopped, code restored" in r.stdout,
              "sptrace stop failed (%d): %s %s" % (r.returncode, r.stdout, r.stderr))
        diff = text_differences(child)
        check(not diff, "after sptrace stop the code still differs from the files: %r" % diff)
        time.sleep(0.2)
        check(p.poll() is None, "the program did not survive sptrace stop")
        # A stopped agent is dormant: stop again is harmless, activate
        # patches again, and the next stop restores again.
        r = run([sptrace, "stop", str(child)])
        check(r.returncode == 0, "second stop: %r" % r.stderr)
        r = run([sptrace, "activate", str(child)])
        check(r.returncode == 0 and "tracing" in r.stdout, "activate after stop: %r" % r.stderr)
        check(patched_soon(child), "activate after stop patched nothing")
        r = run([sptrace, "activate", str(child)])
        check(r.returncode == 0 and "already tracing" in r.stdout, "activate twice: %r" % r.stdout)
        r = run([sptrace, "stop", str(child)])
        check(r.returncode == 0 and not text_differences(child), "third stop: %r" % r.stderr)
        # Whatever meta says -- here an end line no agent wrote -- a stop
        # restores the code of a process that has the agent; an activation
        # is refused.
        r = run([sptrace, "activate", str(child)])
        check(r.returncode == 0 and patched_soon(child), "activate again: %r" % r.stderr)
        with open(os.path.join(tdir, "meta"), "a") as f:
            f.write("end said by someone else\n")
        r = run([sptrace, "stop", str(child)])
        check(r.returncode == 0 and "code restored" in r.stdout and not text_differences(child),
              "stop with an end line in meta (%d): %s %s; differs: %r" %
              (r.returncode, r.stdout, r.stderr, text_differences(child)))
        r = run([sptrace, "activate", str(child)])
        check(r.returncode != 0 and "tracing already ended" in r.stderr,
              "activate with an end line in meta: %r %r" % (r.stdout, r.stderr))
    with open(os.path.join(tdir, "meta")) as f:
        m = f.read()
        check(m.count("\nstopped ") == 4 and m.count("\nactivated ") == 3,
              "meta does not record the stops and activations:\n" + m)
    tree = only(replay_tree(sptrace, tdir), {"main", "spin", "leaf"})
    wrapped = "records lost" in run([sptrace, "replay", tdir], env=repo_env(tdir)).stdout
    # The spinning program fills its 16 MB ring in a fraction of a second;
    # if it wrapped, the beginning is gone (and said so), the calls are not.
    check(tree[:3] == ["main() {", "  spin() {", "    leaf();"] or
          (wrapped and tree.count("leaf();") + tree.count("    leaf();") > 1000),
          "stop: trace does not begin main/spin/leaf: %r" % tree[:3])
    r = run([sptrace, "stop", str(os.getpid())])
    check(r.returncode != 0 and "is not traced by sptrace" in r.stderr, "stop untraced: %r" % r.stderr)
    r = run([sptrace, "stop", "999999999"])
    check(r.returncode != 0 and "no such process" in r.stderr, "stop missing pid: %r" % r.stderr)


# Real Debian programs: [Debian package, command, stdin text or None].  The
# input file in.txt (2000 shuffled numbers) is made by the test.
DEBIAN = {
    "sort": ["coreutils", ["sort", "in.txt"], None],
    "sort-n": ["coreutils", ["sort", "-n", "in.txt"], None],
    "uniq": ["coreutils", ["uniq", "-c", "in.txt"], None],
    "wc": ["coreutils", ["wc", "in.txt"], None],
    "gzip": ["gzip", ["gzip", "-n", "-c", "in.txt"], None],
    "xz": ["xz-utils", ["xz", "-c", "in.txt"], None],
    "sqlite3": ["sqlite3", ["sqlite3", ":memory:"],
                "create table t(a integer, b text);\n"
                "insert into t values (3,'c'),(1,'a'),(2,'b');\n"
                "select sum(a), group_concat(b) from (select * from t order by a);\n"
                "select count(*) from t where b > 'a';\n"],
    # execvp searching PATH (failed execs first), then a shell
    "env": ["coreutils", ["env", "sh", "-c", "echo $((6 * 7)) $0; exit 3"], None],
    # a C++ program (libprotoc): generates C code from a .proto file
    "protoc-c": ["protobuf-c-compiler", ["protoc-c", "--c_out=OUT", "t.proto"], None],
}


def case_debian(sptrace, name, tmp):
    """Differential: a real Debian program gives the same output and exit
    status with and without tracing, and a well-formed trace."""
    package, argv, stdin = DEBIAN[name]
    exe = subprocess.run(["which", argv[0]], stdout=subprocess.PIPE, text=True).stdout.strip()
    if not exe:
        fail("%s is missing; install the Debian package '%s' (test.sh does)" % (argv[0], package))
    with open(os.path.join(tmp, "in.txt"), "w") as f:
        f.write("".join("%d\n" % ((i * 7919) % 2000) for i in range(2000)))
    with open(os.path.join(tmp, "t.proto"), "w") as f:
        f.write('syntax = "proto3";\nmessage A { int32 x = 1; string y = 2; repeated A kids = 3; }\n')
    outs = []
    for traced_run in (False, True):
        out = os.path.join(tmp, "out-%d" % traced_run)
        os.mkdir(out)
        args = [a.replace("OUT", out) for a in argv]
        cmd = [sptrace, "run", "-o", os.path.join(tmp, "trace"), "--"] + args if traced_run else args
        r = subprocess.run(cmd, cwd=tmp, input=stdin.encode() if stdin else None,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=300, env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo")))
        files = {f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out))}
        outs.append((r.returncode, r.stdout, files))
    check(outs[0] == outs[1], "%s: output, files or exit status differ with tracing:\n"
          "native: %r\ntraced: %r" % (name, outs[0][:2], outs[1][:2]))
    tree = replay_tree(sptrace, os.path.join(tmp, "trace"))
    check(len(tree) > 1000 and tree[0] == "main() {",
          "%s: the trace is too small or does not start at main (%d lines: %r)" %
          (name, len(tree), tree[:3]))


def case_dormant(sptrace, prog, tmp):
    """Before its activation event the agent changes no byte of code: the
    trap on the --on function is a hardware breakpoint."""
    tdir = os.path.join(tmp, "trace")
    with spinning(sptrace, prog, tmp, tdir, ["--on", "call tail_target"]) as (p, child):
        time.sleep(0.2)
        diff = text_differences(child)
        check(not diff, "a dormant agent changed the code of %r" % diff)
        check(not [f for f in os.listdir(tdir) if f.startswith("ring.")],
              "a dormant agent wrote records")


def case_stress(sptrace, prog, tmp):
    """16 threads reach functions and sites while they are being patched:
    five traced runs give the native checksum, and every thread's ring holds
    its calls."""
    native = run([prog])
    check(native.returncode == 0 and native.stdout.strip(), "native stress run failed")
    for i in range(5):
        tdir = os.path.join(tmp, "trace%d" % i)
        trace = traced(sptrace, tdir, [prog])
        same_behaviour(native, trace, "stress run %d" % i)
        rings = [f for f in os.listdir(tdir) if f.startswith("ring.")]
        check(len(rings) == 17, "stress run %d: %d rings, expected 17" % (i, len(rings)))


def case_stress_sigblock(sptrace, prog, tmp):
    """The same with every worker blocking every signal, SIGTRAP included
    (the sigwait pattern): a thread meeting a pending int3 with SIGTRAP
    blocked would be killed by the kernel, so the agent keeps SIGTRAP open
    underneath while the program still sees the mask it set."""
    native = run([prog, "sigblock"])
    check(native.returncode == 0 and native.stdout.endswith("mask kept\n"),
          "native sigblock run failed: %r" % native.stdout)
    for i in range(3):
        tdir = os.path.join(tmp, "trace%d" % i)
        trace = traced(sptrace, tdir, [prog, "sigblock"])
        same_behaviour(native, trace, "sigblock stress run %d" % i)
        rings = [f for f in os.listdir(tdir) if f.startswith("ring.")]
        check(len(rings) == 17, "sigblock stress run %d: %d rings, expected 17" % (i, len(rings)))
    # Activation on a function only the blocking workers reach: the
    # breakpoint's SIGTRAP must be delivered in one of them.
    for i in range(3):
        tdir = os.path.join(tmp, "late%d" % i)
        trace = traced(sptrace, tdir, [prog, "sigblock"], on="call f0")
        same_behaviour(native, trace, "sigblock stress run --on 'call f0' %d" % i)
        rings = [f for f in os.listdir(tdir) if f.startswith("ring.")]
        check(rings, "sigblock stress --on 'call f0' run %d: never activated" % i)


MIDRUN_FUNCS = {"main", "midrun", "outer", "middle", "after", "reader", "napper", "after_wake"}
MIDRUN_WANT = sorted([
    "main() {;  midrun() {;    outer() {;      middle() {;      } /* middle */;"
    "    } /* outer */;    after() {;    } /* after */;  } /* midrun */;} /* main */",
    "reader() {;  after_wake() {;  } /* after_wake */;} /* reader */",
    "napper() {;  after_wake() {;  } /* after_wake */;} /* napper */"])


def check_midrun(sptrace, tdir, native, trace, what):
    """Activation while main is inside outer() -> middle() and two threads
    sleep in read() and nanosleep(): the sleepers see no EINTR and sleep
    their full time (the output says so), the functions already running open
    the trees and close with their real returns (return stubs), and what
    runs afterwards is traced."""
    same_behaviour(native, trace, what)
    trees = per_thread_trees(sptrace, tdir, MIDRUN_FUNCS)
    check(trees == MIDRUN_WANT, "%s: per-thread trees\n%s\nwant\n%s" %
          (what, "\n".join(trees), "\n".join(MIDRUN_WANT)))
    log = open(os.path.join(tdir, "agent.log")).read()
    check("breakpoint after its system call" in log,
          "%s: no sleeping thread was reached by a breakpoint:\n%s" % (what, log))


def case_midrun(sptrace, prog, tmp):
    native = run([prog, "midrun"])
    check(native.stdout == "midrun 471\n", "native midrun: %r" % native.stdout)
    tdir = os.path.join(tmp, "timer")
    trace = traced(sptrace, tdir, [prog, "midrun"], on="timer 0.3")
    check_midrun(sptrace, tdir, native, trace, "--on 'timer 0.3'")
    check("activated" in open(os.path.join(tdir, "meta")).read(), "no 'activated' line in meta")

    # --on signal: nothing happens until `sptrace activate PID`.
    tdir = os.path.join(tmp, "signal")
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--on", "signal", "--", prog, "midrun"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo")))
    pid = None
    for _ in range(500):
        try:
            pid = [l.split()[1] for l in open(os.path.join(tdir, "meta")) if l.startswith("pid ")][0]
            break
        except (OSError, IndexError):
            time.sleep(0.01)
    check(pid, "--on signal: the agent never wrote its pid")
    time.sleep(0.3)
    check(not [f for f in os.listdir(tdir) if f.startswith("ring.")],
          "--on signal: records before sptrace activate")
    a = run([sptrace, "activate", pid])
    check(a.returncode == 0 and "tracing" in a.stdout,
          "sptrace activate %s: %d %r %r" % (pid, a.returncode, a.stdout, a.stderr))
    out, err = p.communicate(timeout=60)
    trace = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    check_midrun(sptrace, tdir, native, trace, "--on signal + sptrace activate")
    a = run([sptrace, "activate", pid])
    check(a.returncode == 1 and ("no such process" in a.stderr or "has exited" in a.stderr),
          "sptrace activate of an exited pid: %d %r" % (a.returncode, a.stderr))


def meta_count(tdir, key):
    with open(os.path.join(tdir, "meta")) as f:
        return sum(1 for l in f if l.startswith(key + " "))


def case_cycles(sptrace, prog, tmp, cycles=1000):
    """16 threads call through 400 functions while the agent is activated
    (each thread walks its stack, the code is patched) and stopped (every
    byte put back) a thousand times: no crash, every round of calls gives
    the same sum, and after the last stop the code is the files' again.
    The cycles are driven through the control FIFO (what sptrace activate
    and stop write) to keep them quick; the first and last use the CLI."""
    native = subprocess.run([prog, "cycles"], input="", capture_output=True, text=True)
    check(native.returncode == 0 and native.stdout.endswith("rounds ok\n"),
          "native cycles run: %r" % native.stdout)
    tdir = os.path.join(tmp, "trace")
    p = subprocess.Popen([sptrace, "run", "-o", tdir, "--on", "signal", "--", prog, "cycles"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, SPTRACE_REPO=os.path.join(tmp, "repo")))
    try:
        check(p.stdout.readline() == "running\n", "the cycles program did not start")
        pid = [l.split()[1] for l in open(os.path.join(tdir, "meta")) if l.startswith("pid ")][0]
        fifo = os.path.join(tdir, "control")

        def died(when):
            """The program is gone: say how, with the agent's last words."""
            log = os.path.join(tdir, "agent.log")
            tail = open(log).read().splitlines()[-25:] if os.path.exists(log) else []
            ends = [l for l in open(os.path.join(tdir, "meta")) if l.startswith("end")]
            fail("the program died during %s: status %s, %r\nmeta: %s\nagent.log:\n%s" %
                 (when, p.returncode, p.stderr.read(), "".join(ends).strip(), "\n".join(tail)))

        def send(word):
            """One command line, by a writer of its own (as sptrace does)."""
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, (word + "\n").encode())
            os.close(fd)

        def command(word, key):
            n = meta_count(tdir, key)
            send(word)
            deadline = time.monotonic() + 30
            while meta_count(tdir, key) == n:
                if p.poll() is not None:
                    died(word)
                check(time.monotonic() < deadline, "no answer to '%s'" % word)
                time.sleep(0.001)

        r = run([sptrace, "activate", pid])
        check(r.returncode == 0 and "tracing" in r.stdout, "sptrace activate: %r" % r.stderr)
        time.sleep(0.05)
        check(text_differences(int(pid)), "activation patched nothing")
        r = run([sptrace, "stop", pid])
        check(r.returncode == 0 and "tracing stopped" in r.stdout, "sptrace stop: %r" % r.stderr)
        check(not text_differences(int(pid)), "the code differs from the files after a stop")
        for i in range(cycles - 2):
            command("activate", "activated")
            if i % 3 == 0:
                time.sleep(0.002)
            command("stop", "stopped")
        # A burst: commands written one after another, each by its own
        # writer, without waiting for answers -- none may be lost (the
        # FIFO's buffer went with its last reader once), a read bringing
        # several is handled line by line.
        burst = 20
        before = meta_count(tdir, "activated")
        for i in range(burst):
            send("activate")
            send("stop")
        deadline = time.monotonic() + 60
        while meta_count(tdir, "stopped") < before + burst:
            if p.poll() is not None:
                died("the burst")
            check(time.monotonic() < deadline, "a burst of %d activate/stop commands: %d "
                  "answered" % (2 * burst, meta_count(tdir, "activated") - before
                                + meta_count(tdir, "stopped") - before))
            time.sleep(0.01)
        cycles += burst
        r = run([sptrace, "activate", pid])
        check(r.returncode == 0, "last sptrace activate: %r" % r.stderr)
        r = run([sptrace, "stop", pid])
        check(r.returncode == 0, "last sptrace stop: %r" % r.stderr)
        diff = text_differences(int(pid))
        check(not diff, "after %d cycles the code still differs from the files: %r" % (cycles, diff))
        out, err = p.communicate(input="", timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    check(p.returncode == 0 and out == native.stdout.replace("running\n", ""),
          "cycles: status %d, output %r, native %r; %s" % (p.returncode, out, native.stdout, err))
    check(meta_count(tdir, "activated") == cycles and meta_count(tdir, "stopped") == cycles,
          "meta does not record %d activations and stops" % cycles)
    r = run([sptrace, "replay", tdir], env=repo_env(tdir))
    check(r.returncode == 0 and "tracing stopped" in r.stdout and "f3" in r.stdout,
          "replay after the cycles: %d %s" % (r.returncode, r.stderr[-2000:]))


def case_exec(sptrace, prog, scenario, tmp):
    """exec (from main, or from a second thread, which then takes over the
    process): the agent comes back in the new image, whose trace is in a
    subdirectory; the replay goes on into it; both metas end properly."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, scenario])
    check(native.stdout == "26\n", "native %s: %r" % (scenario, native.stdout))
    trace = traced(sptrace, tdir, [prog, scenario])
    same_behaviour(native, trace, scenario)
    subs = [d for d in os.listdir(tdir) if d.startswith("exec.")]
    check(len(subs) == 1, "%s: expected one exec subdirectory, found %r" % (scenario, subs))
    meta = open(os.path.join(tdir, "meta")).read()
    check("\nexec %s " % subs[0] in meta and "\nend exec: the process went on in %s" % subs[0] in meta,
          "%s: the first image's meta does not say where the process went:\n%s" % (scenario, meta))
    sub_meta = open(os.path.join(tdir, subs[0], "meta")).read()
    check("\nend exit" in sub_meta and "\nexec_of " in sub_meta,
          "%s: the new image's meta:\n%s" % (scenario, sub_meta))
    # The counter's rate as sptrace measured it, handed on to the new image
    # (neither agent spends 2 ms measuring it again).
    rates = [re.search(r"^tsc_hz (\d+)$", m, re.M) for m in (meta, sub_meta)]
    check(all(rates) and rates[0].group(1) == rates[1].group(1) and
          1e8 < int(rates[0].group(1)) < 1e11,
          "%s: each image measured its own TSC rate: %s" %
          (scenario, [r.group(1) if r else None for r in rates]))
    r = replay(sptrace, tdir)
    check(r.returncode == 0 and "# exec: the process went on" in r.stdout,
          "%s: replay does not follow the exec: %s" % (scenario, r.stderr))
    before, after = r.stdout.split("# exec: the process went on", 1)
    check("do_exec() {" in before, "%s: the exec call is not in the first image's trace" % scenario)
    names = [l.split("| ", 1)[1].strip() for l in after.splitlines() if "| " in l]
    check("top() {" in names and "mid() {" in names, "%s: the new image's calls are missing:\n%s" %
          (scenario, after[:3000]))
    if scenario == "exec-thread":
        check("exec_thread() {" in before, "exec-thread: the exec'ing thread is not traced")


def case_ucontext(sptrace, prog, tmp):
    """A coroutine made by makecontext, entered and left by swapcontext:
    same result, the coroutine's own calls are traced (it is started like a
    thread's start routine), and the tree is exact: calls on the
    coroutine's stack are suspended at a switch and continued after."""
    tdir = os.path.join(tmp, "trace")
    native = run([prog, "ucontext"])
    check(native.stdout == "contexts 158\n", "native ucontext: %r" % native.stdout)
    trace = traced(sptrace, tdir, [prog, "ucontext"])
    same_behaviour(native, trace, "ucontext")
    names = [l.strip() for l in replay_tree(sptrace, tdir)]
    check(names.count("co_work() {") == 3 and "coroutine() {" in names,
          "ucontext: the coroutine's calls are not traced:\n" + "\n".join(names))
    # The calls left open on the coroutine's stack are suspended and go on
    # when swapcontext comes back to it: never unwound, no exit without entry.
    r = replay(sptrace, tdir)
    lines = [l.split("| ", 1)[1].rstrip() for l in r.stdout.splitlines() if "| " in l]
    start = [i for i, l in enumerate(lines) if l.strip() == "contexts() {"]
    check(len(start) == 1, "ucontext: contexts() not in the trace once:\n" + r.stdout[:3000])
    end = next(i for i in range(start[0], len(lines)) if lines[i].strip() == "} /* contexts */")
    indent = len(lines[start[0]]) - len(lines[start[0]].lstrip())
    got = [l[indent:] for l in lines[start[0]:end + 1]]
    resume = ["  swapcontext() {",
              "    /* switched to stack 1 */",
              "    coroutine() { /* continued */",
              "      swapcontext(); /* continued */"]
    suspend = ["      co_work() {",
               "        leaf();",
               "      } /* co_work */",
               "      swapcontext(); /* suspended: the thread switched stacks */",
               "    } /* coroutine (suspended: the thread switched stacks) */",
               "    /* switched to the thread's own stack */",
               "  } /* swapcontext */",
               "  leaf();"]
    want = (["contexts() {", "  getcontext();", "  makecontext();", "  swapcontext() {",
             "    /* switched to stack 1 (new) */", "    coroutine() {"] + suspend +
            resume + suspend + resume + suspend + resume +
            ["    } /* coroutine */", "    /* switched to the thread's own stack */",
             "  } /* swapcontext */", "  leaf();", "} /* contexts */"])
    check(got == want, "ucontext: the tree across swapcontext is not consistent:\n%s\nwanted:\n%s"
          % ("\n".join(got), "\n".join(want)))


def case_daemon(sptrace, prog, tmp):
    """daemon(): the parent returns at once (sptrace run ends with it), the
    daemon goes on in the background and is traced into the same trace."""
    tdir = os.path.join(tmp, "trace")
    out = os.path.join(tmp, "daemon.out")
    trace = traced(sptrace, tdir, [prog, "daemon", out])
    check(trace.returncode == 0 and trace.stdout == "daemonizing\n",
          "daemon: %d %r %r" % (trace.returncode, trace.stdout, trace.stderr))
    deadline = time.monotonic() + 20
    while not (os.path.exists(out) and open(out).read().endswith("\n")):
        check(time.monotonic() < deadline, "the daemon never wrote %s" % out)
        time.sleep(0.05)
    check(open(out).read() == "daemon 15\n", "daemon output: %r" % open(out).read())
    # The daemon's agent ends its part of the trace at its exit (its
    # parent left with _exit, without the agent's exit handler).
    while "end (exit)" not in open(os.path.join(tdir, "agent.log")).read():
        check(time.monotonic() < deadline, "the daemon's agent never finished the trace")
        time.sleep(0.05)
    trees = per_thread_trees(sptrace, tdir, {"main", "daemon_work", "top", "mid", "leaf"})
    check(any(t.startswith("daemon_work() {") or "daemon_work() {" in t for t in trees),
          "daemon: the daemon's calls are not in the trace:\n" + "\n".join(trees))


def case_errors(sptrace, tmp):
    r = run([sptrace, "run", "-o", os.path.join(tmp, "t"), "--", os.path.join(tmp, "no-such")])
    check(r.returncode == 127, "missing program: status %d, want 127" % r.returncode)
    check(r.stderr.startswith("sptrace: run: cannot execute") and "no-such" in r.stderr,
          "missing program: unclear message %r" % r.stderr)
    check(not os.path.exists(os.path.join(tmp, "t")), "missing program: a trace directory was left")
    r = run([sptrace, "run", "--on", "bogus", "--", "/bin/true"])
    check(r.returncode == 2 and "unknown event 'bogus'" in r.stderr, "bad --on: %r" % r.stderr)
    r = run([sptrace, "run", "--on", "timer soon", "--", "/bin/true"])
    check(r.returncode == 2 and "give the delay in seconds" in r.stderr, "bad timer: %r" % r.stderr)
    r = run([sptrace, "run"])
    check(r.returncode == 2 and "no program given" in r.stderr, "no program: %r" % r.stderr)
    r = run([sptrace, "activate", "abc"])
    check(r.returncode == 1 and "'abc' is not a process id" in r.stderr, "activate abc: %r" % r.stderr)
    r = run([sptrace, "activate", "1"])
    check(r.returncode == 1 and "pid 1 is not traced by sptrace" in r.stderr,
          "activate 1: %r" % r.stderr)
    r = run([sptrace, "activate", "--help"])
    check(r.returncode == 0 and "usage: sptrace activate" in r.stdout, "activate --help")
    r = run([sptrace, "run", "--help"])
    check(r.returncode == 0 and "usage: sptrace run" in r.stdout, "run --help")


# The shell's own view of itself: its threads, its registry link (<pid>-<start time>,
# registry.h), its descriptors.
SELF_VIEW = ('d=/tmp/sptrace-$(id -u); [ -n "$XDG_RUNTIME_DIR" ] && d=$XDG_RUNTIME_DIR/sptrace; '
             'echo threads $(ls /proc/$$/task | wc -l); '
             'st=$(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20); '
             'if [ -L "$d/$$-$st" ]; then echo links 1; else echo links 0; fi; '
             'for f in /proc/$$/fd/*; do echo fd $(readlink $f); done')


def failed_start_leaves_nothing(sptrace, tmp):
    """A start that fails after the control thread was made (agent/control.c,
    point 4: the activation function is not in the program) leaves no thread,
    registry link, FIFO or descriptor of the control thread's."""
    tdir = os.path.join(tmp, "t-call")
    r = traced(sptrace, tdir, ["/bin/sh", "-c", SELF_VIEW], on="call no_such_function_here")
    check(r.returncode == 0 and "has no function 'no_such_function_here'" in r.stderr,
          "failed start: status %d, stderr %r" % (r.returncode, r.stderr))
    check("threads 1\n" in r.stdout, "failed start: the shell has a thread of the agent's "
          "left:\n" + r.stdout)
    check("links 0\n" in r.stdout, "failed start: a registry link was left:\n" + r.stdout)
    held = [l for l in r.stdout.splitlines() if l.startswith("fd ") and
            ("socket:" in l or "/task" in l or l.endswith("/control") or "eventfd" in l
             or re.search(r"/sptrace(-\d+)?$", l))]
    check(not held, "failed start: the control thread's descriptors were left: %r" % held)
    check(not os.path.exists(os.path.join(tdir, "control")),
          "failed start: the control FIFO was left in " + tdir)
    shutil.rmtree(tdir)


def case_not_traced(sptrace, static_prog, tmp):
    """A program the agent cannot be preloaded into: said so, not 'trace of pid N'
    (issue 11): a static one, and a set-user-ID one run by someone else.  And a
    start that fails once begun leaves nothing behind."""
    failed_start_leaves_nothing(sptrace, tmp)
    tdir = os.path.join(tmp, "t")
    native = run([static_prog, "0"])
    r = run([sptrace, "run", "-o", tdir, "--", static_prog, "0"])
    check(r.returncode == native.returncode and r.stdout == native.stdout,
          "static program: status %d / %r, natively %d / %r"
          % (r.returncode, r.stdout, native.returncode, native.stdout))
    check("nothing was traced in pid" in r.stderr and "statically linked" in r.stderr
          and "trace of pid" not in r.stderr, "static program: unclear message %r" % r.stderr)
    check(not os.path.exists(tdir), "static program: an empty trace directory was left")
    if os.geteuid() != 0:
        fail("the set-user-ID case needs root (test.sh runs as root)")
    setuid = os.path.join(tmp, "true-setuid")
    with open("/bin/true", "rb") as src, open(setuid, "wb") as dst:
        dst.write(src.read())
    os.chmod(tmp, 0o755)
    os.chown(setuid, 65534, 65534)           # nobody
    os.chmod(setuid, 0o4755)
    r = run([sptrace, "run", "-o", tdir, "--", setuid])
    check(r.returncode == 0, "set-user-ID program: status %d: %s" % (r.returncode, r.stderr))
    check("nothing was traced in pid" in r.stderr and "set-user-ID" in r.stderr,
          "set-user-ID program: unclear message %r" % r.stderr)


def main():
    sptrace, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    if len(sys.argv) > 3:
        load_symbols(sys.argv[3])
    with tempfile.TemporaryDirectory(prefix="sptrace-run-") as tmp:
        if case == "signals":
            case_signals(sptrace, sys.argv[3], tmp)
        elif case == "spawn":
            case_spawn(sptrace, sys.argv[3], tmp)
        elif case == "system":
            case_system(sptrace, sys.argv[3], tmp)
        elif case == "dl":
            case_dl(sptrace, sys.argv[3], tmp)
        elif case == "fork":
            case_fork(sptrace, sys.argv[3], tmp)
        elif case == "fork-areas":
            case_fork_areas(sptrace, sys.argv[3], tmp)
        elif case == "threads":
            case_threads(sptrace, sys.argv[3], tmp)
        elif case in ("unwind-bt", "unwind-dl"):
            case_unwind(sptrace, sys.argv[3], case, tmp)
        elif case == "short-hot":
            case_short_hot(sptrace, sys.argv[3], tmp)
        elif case == "ends-barrier":
            case_ends_barrier(sptrace, sys.argv[3], tmp)
        elif case == "fork-hints":
            case_fork_hints(sptrace, sys.argv[3], tmp)
        elif case == "fork-stubs":
            case_fork_stubs(sptrace, sys.argv[3], tmp)
        elif case in ("churn", "churn-detached"):
            case_churn(sptrace, sys.argv[3], case, tmp)
        elif case in CONF:
            case_conf(sptrace, sys.argv[3], case, tmp)
        elif case == "exceptions":
            case_exceptions(sptrace, sys.argv[3], tmp)
        elif case == "exceptions-midrun":
            case_exceptions_midrun(sptrace, sys.argv[3], tmp)
        elif case == "python-dlopen":
            case_python_dlopen(sptrace, tmp)
        elif case == "python":
            case_python(sptrace, tmp)
        elif case == "stress":
            case_stress(sptrace, sys.argv[3], tmp)
        elif case == "cycles":
            case_cycles(sptrace, sys.argv[3], tmp, int(os.environ.get("SPTRACE_CYCLES", "1000")))
        elif case in ("exec", "exec-thread"):
            case_exec(sptrace, sys.argv[3], case, tmp)
        elif case == "ucontext":
            case_ucontext(sptrace, sys.argv[3], tmp)
        elif case == "daemon":
            case_daemon(sptrace, sys.argv[3], tmp)
        elif case == "midrun":
            case_midrun(sptrace, sys.argv[3], tmp)
        elif case == "stress-sigblock":
            case_stress_sigblock(sptrace, sys.argv[3], tmp)
        elif case == "debian":
            case_debian(sptrace, sys.argv[3], tmp)
        elif case == "dormant":
            case_dormant(sptrace, sys.argv[3], tmp)
        elif case == "stop":
            case_stop(sptrace, sys.argv[3], tmp)
        elif case == "keep-all":
            case_keep_all(sptrace, sys.argv[3], tmp)
        elif case == "kill9":
            case_kill9(sptrace, sys.argv[3], tmp)
        elif case == "errors":
            case_errors(sptrace, tmp)
        elif case == "agent-libraries":
            case_agent_libraries(sys.argv[3])
        elif case == "python-libcrypto":
            case_python_libcrypto(sptrace, tmp)
        elif case == "not-traced":
            case_not_traced(sptrace, sys.argv[3], tmp)
        else:
            fail("unknown case " + case)


if __name__ == "__main__":
    main()
