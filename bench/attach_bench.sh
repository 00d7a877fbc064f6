#!/bin/sh
# bench/attach_bench.sh — sptrace attach on a live redis-server under
# redis-benchmark (attach/attach/attach_bench.py): attach latency, the
# target's pause, activation latency, throughput, p99 and max latency native,
# dormant, traced and after stop.  Writes bench/ATTACH.md.
#
#   bench/attach_bench.sh [BUILD_DIR]        (default: build)
#
# Environment: ROUNDS (default 5), REQUESTS (per redis-benchmark test,
# default 100000).  Installs redis-server and redis-tools if missing: a
# benchmark may install what it measures against; tests never run this.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
[ -x "$build/cli/sptrace" ] || { echo "attach-bench: build $build first (meson/ninja)" >&2; exit 2; }
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
	echo "attach-bench: installing redis-server redis-tools" >&2
	apt-get install -y redis-server redis-tools >&2 ||
		{ apt-get update >&2 && apt-get install -y redis-server redis-tools >&2; }
fi
work=$(mktemp -d /tmp/sptrace-attach-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
rev=$(git -C "$root" log -1 --format='%h (%s)' 2>/dev/null | cut -c1-90)
start=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
python3 "$here/attach/attach_bench.py" --sptrace "$build/cli/sptrace" --work "$work" \
	--rounds "${ROUNDS:-5}" --requests "${REQUESTS:-100000}" \
	--meta "machine=$(nproc) CPUs, $cpu, $(uname -sr)" \
	--meta "sptrace measured=commit $rev, build $build" \
	--meta "redis=$(redis-server --version | cut -d' ' -f1-3)" \
	--meta "date=$start" > "$work/ATTACH.md"
mv "$work/ATTACH.md" "$here/ATTACH.md"
echo "attach-bench: wrote $here/ATTACH.md" >&2
