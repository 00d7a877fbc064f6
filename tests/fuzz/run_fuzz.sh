#!/bin/sh
# tests/fuzz/run_fuzz.sh — run a libFuzzer target briefly from its seeds.
#
#   run_fuzz.sh FUZZER SECONDS SEED...
#
# The seeds are copied into a temporary corpus (libFuzzer adds new inputs to
# it), so the build tree stays as it was.  Exits non-zero on any crash, leak,
# sanitizer report or input slower than 20 s; the reproducer is kept and its
# path printed.  Extra libFuzzer flags may be given in FUZZ_ARGS.
set -u
fuzzer=$1 seconds=$2
shift 2

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sptrace-fuzz.XXXXXX")
mkdir "$tmp/corpus" "$tmp/artifacts"
cp "$@" "$tmp/corpus/"
# UBSan only prints by default; make a report stop the run like a crash
# (meson test sets UBSAN_OPTIONS too; later settings win).  ubsan.supp lists
# findings reported but not fixed yet.
here=$(cd "$(dirname "$0")" && pwd)
UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:print_stacktrace=1:suppressions=$here/ubsan.supp"
export UBSAN_OPTIONS

"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
	-print_final_stats=1 -artifact_prefix="$tmp/artifacts/" ${FUZZ_ARGS:-} "$tmp/corpus"
rc=$?
if [ "$rc" -ne 0 ]; then
	echo "run_fuzz.sh: $fuzzer failed (exit $rc); reproducers kept in $tmp/artifacts:" >&2
	ls -l "$tmp/artifacts" >&2
	echo "run_fuzz.sh: reproduce with: $fuzzer $tmp/artifacts/<file>" >&2
	exit 1
fi
rm -rf "$tmp"
