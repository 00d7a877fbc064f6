#!/bin/bash
# Install what is missing, build, and run the main job: trace a real program
# from main on with the agent, then show what it did; then follow a request
# across three hosts (network namespaces with a spdaemon each).
set -euo pipefail
cd "$(dirname "$0")"

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
sptrace=$PWD/build/cli/sptrace
out=$(mktemp -d /tmp/sptrace-demo.XXXXXX)
py=/usr/bin/python3.11

echo "== sptrace run: python3.11 computing fib(18), traced from main into libc"
"$sptrace" run -o "$out/trace" -- "$py" -c 'def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)
print("fib(18) =", fib(18))'
echo
echo "== sptrace replay: the first calls of the main thread"
# (into files first: `head` closing a pipe early would fail the pipeline)
"$sptrace" replay --depth 4 "$out/trace" > "$out/replay.txt"
head -40 "$out/replay.txt"
echo "   ..."
echo
echo "== sptrace report: where the time went"
"$sptrace" report "$out/trace" > "$out/report.txt"
head -16 "$out/report.txt"
echo
echo "== the code analysis behind it: libc, from the repository"
libc=$(ldd /bin/ls | awk '/libc.so.6/ {print $3}')
"$sptrace" analyze-binary "$libc" | grep -E '^/|functions|call sites|patch plan|repository'
echo
echo "(trace kept in $out/trace)"
echo
echo "== following a request across hosts (network namespaces, a spdaemon in each)"
python3 scripts/demo_hosts.py build
