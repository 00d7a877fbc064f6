#!/bin/sh
# bench/run.sh — run the benchmarks and write bench/RESULTS.md.
#
#   bench/run.sh [--analysis] [--agent] [BUILD_DIR]   (default: both; build)
#
# --analysis: the code analyser (below).  --agent: the agent, by
# bench/agent_bench.sh (see there and README.md); its part of RESULTS.md
# starts at the line "<!-- agent: bench/agent_bench.sh -->".  A part that is
# not run is kept from the previous RESULTS.md.
#
# Benchmarks libc.so.6, the largest x86-64 ELF module on the machine (by bytes
# of executable sections, under /usr/bin /usr/lib/x86_64-linux-gnu
# /usr/libexec /usr/lib) and, when that one has no .eh_frame (a stripped Go
# binary, where the analyser finds almost nothing), also the largest one that
# has an .eh_frame.  Each file: capstone_baseline (the one-pass decoding floor)
# and analyze_bench (analysis with and without source lines, the same sweep in
# the same rounds, repository store and load).  Then libc once under callgrind
# for a deterministic instruction count.
#
# Environment: RUNS (rounds for libc, default 5), BIG_RUNS (for the large
# files, default 3), NO_CALLGRIND=1 to skip callgrind (in both parts); the
# agent part's variables are listed in agent_bench.sh.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
do_analysis=0 do_agent=0
while [ $# -gt 0 ]; do
	case $1 in
	--analysis) do_analysis=1 ;;
	--agent) do_agent=1 ;;
	-*) echo "usage: bench/run.sh [--analysis] [--agent] [BUILD_DIR]" >&2; exit 2 ;;
	*) break ;;
	esac
	shift
done
[ $do_analysis = 1 ] || [ $do_agent = 1 ] || do_analysis=1 do_agent=1
build=${1:-build}
marker="<!-- agent: bench/agent_bench.sh -->"
results=$here/RESULTS.md
runs=${RUNS:-5}
big_runs=${BIG_RUNS:-3}
dirs="/usr/bin /usr/lib/x86_64-linux-gnu /usr/libexec /usr/lib"

cd "$root"
out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT

# The agent part: run it, or keep the previous one.
if [ $do_agent = 1 ]; then
	"$here/agent_bench.sh" "$build" >"$out.agent"
elif [ -f "$results" ] && grep -qF "$marker" "$results"; then
	awk -v m="$marker" 'f { print } $0 == m { f = 1 }' "$results" >"$out.agent"
else
	: >"$out.agent"
fi

# write_results: the analysis part (from the previous file when it was not
# run) followed by the marker and the agent part.
write_results() {
	{
		cat "$out.analysis"
		if [ -s "$out.agent" ]; then
			echo "$marker"
			cat "$out.agent"
		fi
	} >"$results"
	echo "bench: wrote $results" >&2
}

if [ $do_analysis = 0 ]; then
	if [ -f "$results" ]; then
		awk -v m="$marker" '$0 == m { exit } { print }' "$results" >"$out.analysis"
	else
		echo "# Benchmark results" >"$out.analysis"
	fi
	write_results
	exit 0
fi

[ -d "$build" ] || meson setup "$build"
ninja -C "$build" bench/analyze_bench bench/capstone_baseline >&2
baseline=$build/bench/capstone_baseline
analyze=$build/bench/analyze_bench

libc=$(ldconfig -p 2>/dev/null | awk '/libc\.so\.6 \(libc6,x86-64/ { print $NF; exit }')
[ -n "$libc" ] || libc=/lib/x86_64-linux-gnu/libc.so.6
libc=$(readlink -f "$libc")

echo "bench: looking for the largest ELF module under $dirs ..." >&2
largest=$(python3 "$here/largest_elf.py" $dirs | awk '{ print $2 }')
largest_eh=$(python3 "$here/largest_elf.py" --eh-frame $dirs | awk '{ print $2 }')
echo "bench: libc: $libc" >&2
echo "bench: largest binary: $largest" >&2
[ "$largest_eh" = "$largest" ] || echo "bench: largest with .eh_frame: $largest_eh" >&2

now() { date -u '+%Y-%m-%d %H:%M:%S UTC'; }

# section TITLE FILE RUNS WHY: one benchmark section of RESULTS.md.
section() {
	title=$1 file=$2 n=$3 why=$4
	echo "bench: $title: $file ($n rounds)" >&2
	{
		echo "## $title"
		echo
		echo "- file: \`$file\` ($(stat -c %s "$file") bytes on disk)"
		[ -z "$why" ] || echo "- chosen: $why"
		echo "- date: $(now)"
		echo "- machine: $machine"
		echo "- commands: \`$baseline -n $n $file\`, \`$analyze -n $n $file\`"
		echo
		echo "### Capstone linear sweep alone"
		echo
		"$baseline" -n "$n" "$file"
		echo
		"$analyze" -n "$n" "$file"
		echo
	} >>"$out"
}

# callgrind_ir BINARY FUNCTION ARGS...: Ir inside FUNCTION, summed over the
# process and any child it forks inside FUNCTION (ca_analyze reads DWARF in a
# forked child), or "" if callgrind took over 3 minutes.
callgrind_ir() {
	bin=$1 fn=$2
	shift 2
	rm -f "$out".cg.*
	if timeout 180 valgrind --tool=callgrind --toggle-collect="$fn" \
		--callgrind-out-file="$out.cg.%p" "$bin" "$@" >/dev/null 2>"$out.cglog"; then
		cat "$out".cg.* | awk '/^summary:/ { s += $2 } END { if (s) printf "%.0f\n", s }'
	fi
}

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
opts=$(meson introspect --buildoptions "$build" 2>/dev/null | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print("buildtype=%s, optimization=%s, b_sanitize=%s" % (o["buildtype"], o["optimization"], o["b_sanitize"]))
' 2>/dev/null || echo "options unknown")
compiler=$(sed -n 's/^C compiler for the host machine: [^ ]* (\([^ ]* [^ ]*\) .*/\1/p' \
	"$build/meson-logs/meson-log.txt" 2>/dev/null | head -1)
machine="$(nproc) CPUs, $cpu, $(awk '/MemTotal/ { printf "%.0f GB RAM", $2 / 1048576 }' /proc/meminfo), $(uname -sr); build \`$build\` ($opts, $compiler)"

section "libc.so.6" "$libc" "$runs" ""
section "Largest binary on the machine" "$largest" "$big_runs" \
	"largest x86-64 ELF module by bytes of executable sections under $dirs (bench/largest_elf.py)"
if [ "$largest_eh" != "$largest" ]; then
	section "Largest binary with an .eh_frame" "$largest_eh" "$big_runs" \
		"the largest overall has no .eh_frame, so when stripped it gives the analyser hardly any function starts; this is the largest one with an .eh_frame, as C/C++ code normally has"
fi

if [ "${NO_CALLGRIND:-0}" != 1 ] && command -v valgrind >/dev/null; then
	echo "bench: callgrind on libc (up to 3 x 3 min) ..." >&2
	t0=$(date +%s)
	ir_analyze=$(callgrind_ir "$analyze" ca_analyze -n 1 --analyze-only "$libc")
	ir_nolines=$(callgrind_ir "$analyze" ca_analyze -n 1 --analyze-only --no-lines "$libc")
	ir_sweep=$(callgrind_ir "$baseline" bench_sweep_file -n 1 "$libc")
	t1=$(date +%s)
	{
		echo "## libc.so.6 under callgrind (deterministic instruction counts)"
		echo
		echo "- date: $(now); took $((t1 - t0)) s"
		echo "- commands: \`valgrind --tool=callgrind --toggle-collect=ca_analyze $analyze -n 1 --analyze-only [--no-lines] $libc\`,"
		echo "  \`valgrind --tool=callgrind --toggle-collect=bench_sweep_file $baseline -n 1 $libc\`"
		echo
		if [ -n "$ir_analyze" ] && [ -n "$ir_nolines" ] && [ -n "$ir_sweep" ]; then
			ratio() { awk -v a="$1" -v b="$ir_sweep" 'BEGIN { printf "%.2f", a / b }'; }
			echo "| what | Ir (instructions executed) | ÷ sweep |"
			echo "|---|---:|---:|"
			echo "| ca_analyze with lines (and its forked DWARF reader) | $ir_analyze | $(ratio "$ir_analyze") |"
			echo "| ca_analyze without lines | $ir_nolines | $(ratio "$ir_nolines") |"
			echo "| capstone linear sweep (bench_sweep_file) | $ir_sweep | 1.00 |"
		else
			echo "Not measured: callgrind took longer than 3 minutes or failed."
		fi
		echo
	} >>"$out"
fi

# Goals from the issue: all of libc in <= 1 s; libc's entry loads in <= 5 ms.
libc_s=$(awk -v f="$libc" -F' *\\| *' '$2 == f && $7 ~ /^with \(/ { print $8; exit }' "$out")
libc_load=$(awk -v f="$libc" -F' *\\| *' '$2 == f && $3 ~ /…$/ { print $6; exit }' "$out")
# Files where the analyser decoded less than half of the code: their speed
# figures say little about the analyser.
low_cover=$(awk -F' *\\| *' '$7 ~ /^with \(/ && $4 + 0 < 50 {
	printf "- `%s`: only %s of its code decoded (%s functions found), so its functions/s and MB/s say little about analysis speed; see the sweep for what a full pass costs.\n", $2, $4, $5 }' "$out")
verdict() { awk -v v="$1" -v g="$2" 'BEGIN { print (v != "" && v + 0 <= g) ? "met" : "NOT met" }'; }

{
	echo "# Benchmark results"
	echo
	echo "Written by \`bench/run.sh\` (see README.md); do not edit by hand."
	echo "The machine is shared and noisy: compare ratios measured in the same run"
	echo "(analysis ÷ capstone linear sweep) rather than absolute times across runs."
	echo
	echo "## Goals: code analysis"
	echo
	echo "(The agent's goals are in the Agent section at the end.)"
	echo
	echo "| goal | measured (median) | |"
	echo "|---|---:|---|"
	echo "| all of libc analysed (with source lines) in ≤ 1 s | $libc_s s | $(verdict "$libc_s" 1) |"
	echo "| libc's repository entry loads in ≤ 5 ms | $libc_load ms | $(verdict "$libc_load" 5) |"
	echo
	if [ -n "$low_cover" ]; then
		echo "Caveats:"
		echo
		echo "$low_cover"
		echo
	fi
	cat "$out"
} >"$out.analysis"
write_results
