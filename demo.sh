#!/bin/bash
# Install what is missing, build, and run the main job.  Until the agent
# lands, the main job is the offline code analysis that tracing relies on:
# analyse real Debian binaries, store them in the repository, load them back.
set -euo pipefail
cd "$(dirname "$0")"

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
sptrace=build/cli/sptrace
libc=$(ldd /bin/ls | awk '/libc.so.6/ {print $3}')

echo "== sptrace analyze-binary: libc and python3, analysed and stored"
$sptrace analyze-binary --force "$libc" /usr/bin/python3
echo
echo "== the same again: now loaded from the repository"
$sptrace analyze-binary "$libc" | grep -E '^/|repository|functions '
echo
echo "== a stripped program: call sites of /bin/ls and how each will be patched (first 12)"
$sptrace analyze-binary --dump callsites /bin/ls | head -13 | column -t -s $'\t'
echo
echo "== the CFG of libc's qsort_r"
$sptrace analyze-binary --dump cfg=qsort_r "$libc" | head -20 | column -t -s $'\t'
