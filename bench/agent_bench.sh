#!/bin/sh
# bench/agent_bench.sh — measure the agent; prints the "Agent" part of
# bench/RESULTS.md on stdout (bench/run.sh --agent puts it there).
#
#   bench/agent_bench.sh [BUILD_DIR]      (default: build, built if needed)
#
# Takes a private copy of BUILD_DIR's sptrace and libsptrace-agent.so first,
# so a rebuild in the working tree during the run (it takes 5-10 minutes)
# cannot change what is measured.  REV=<git revision> measures that commit
# instead: it is exported with `git archive` and built in the scratch
# directory, untouched by work in progress.
#
# Installs uftrace and sqlite3 with apt-get when they are missing.  The
# harness is bench/agent/agent_bench.py; see bench/README.md for the method.
#
# Environment: ROUNDS (microbenchmark and startup rounds, default 5), CALLS
# (default 50000000), DORMANT_ROUNDS (default 15), WARM_ROUNDS (default 11),
# WL_ROUNDS (workload rounds, default 5), NO_UFTRACE=1, NO_CALLGRIND=1,
# NO_WORKLOADS=1, REV, KEEP=1 (keep the scratch directory).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-build}

cd "$root"
work=$(mktemp -d /tmp/sptrace-agent-bench.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
echo "agent-bench: scratch directory $work" >&2

# The binaries to measure, and a description of where they come from.
if [ -n "${REV:-}" ]; then
	commit=$(git rev-parse --verify "$REV^{commit}")
	mkdir "$work/src"
	git archive "$commit" | tar -x -C "$work/src"
	echo "agent-bench: building $commit in $work/src" >&2
	(cd "$work/src" && meson setup build >/dev/null &&
		ninja -C build cli/sptrace agent/libsptrace-agent.so >&2)
	from="$work/src/build"
	source_desc="commit \`$(git rev-parse --short "$commit")\` ($(git log -1 --format=%s "$commit" | cut -c1-80)…), exported with git archive and built with meson defaults (buildtype=debugoptimized)"
else
	[ -d "$build" ] || meson setup "$build" >&2
	ninja -C "$build" cli/sptrace agent/libsptrace-agent.so >&2
	from=$build
	dirty=$(git status --porcelain -- agent cli common codeanalysis 2>/dev/null | awk '{ print $2 }' | tr '\n' ' ')
	source_desc="working tree at \`$(git rev-parse --short HEAD 2>/dev/null || echo '?')\`${dirty:+ with uncommitted changes in: $dirty}, build \`$build\`"
fi
mkdir -p "$work/snap/cli" "$work/snap/agent"
cp "$from/cli/sptrace" "$work/snap/cli/sptrace"
cp "$from/agent/libsptrace-agent.so" "$work/snap/agent/libsptrace-agent.so"
agent_sum=$(sha256sum "$work/snap/agent/libsptrace-agent.so" | cut -c1-16)

# Tools.  Benchmarks may install what they measure against; tests never run
# this script.
need=""
[ -n "${NO_UFTRACE:-}" ] || command -v uftrace >/dev/null || need="$need uftrace"
[ -n "${NO_WORKLOADS:-}" ] || [ -x /usr/bin/sqlite3 ] || need="$need sqlite3"
if [ -n "$need" ]; then
	echo "agent-bench: installing$need" >&2
	apt-get install -y $need >&2 || { apt-get update >&2 && apt-get install -y $need >&2; }
fi

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
tsc=$(grep -q constant_tsc /proc/cpuinfo && echo "constant_tsc" || echo "no constant_tsc")
machine="$(nproc) CPUs, $cpu ($tsc), $(awk '/MemTotal/ { printf "%.0f GB RAM", $2 / 1048576 }' /proc/meminfo), $(uname -sr)"

set -- --sptrace "$work/snap/cli/sptrace" --agent "$work/snap/agent/libsptrace-agent.so" \
	--work "$work" --rounds "${ROUNDS:-5}" --calls "${CALLS:-50000000}" \
	--dormant-rounds "${DORMANT_ROUNDS:-15}" --warm-rounds "${WARM_ROUNDS:-11}" \
	--wl-rounds "${WL_ROUNDS:-5}"
[ -z "${NO_UFTRACE:-}" ] || set -- "$@" --no-uftrace
[ -z "${NO_CALLGRIND:-}" ] || set -- "$@" --no-callgrind
[ -z "${NO_WORKLOADS:-}" ] || set -- "$@" --no-workloads
python3 "$here/agent/agent_bench.py" "$@" \
	--meta "machine=$machine" \
	--meta "sptrace measured=$source_desc; agent sha256 $agent_sum…" \
	--meta "command=\`bench/agent_bench.sh\` (ROUNDS=${ROUNDS:-5} CALLS=${CALLS:-50000000} DORMANT_ROUNDS=${DORMANT_ROUNDS:-15} WARM_ROUNDS=${WARM_ROUNDS:-11} WL_ROUNDS=${WL_ROUNDS:-5}${REV:+ REV=$REV})"
