#!/bin/bash
# Install what is missing, build, run every test.  The last line printed is
# "N passed, N failed", counted from meson's test log.
#
#   build/       gcc, -O2 -Werror: the binaries demo.sh and bench/ use
#   build-test/  clang with ASan+UBSan and the libFuzzer targets: every test
set -euo pipefail
cd "$(dirname "$0")"

scripts/install-deps.sh

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null

if [ ! -f build-test/build.ninja ]; then
	CC=clang meson setup build-test -Db_sanitize=address,undefined -Db_lundef=false \
		-Dfuzzing=true >/dev/null
fi
ninja -C build-test >/dev/null

rm -f build-test/meson-logs/testlog.json
meson test -C build-test --print-errorlogs --num-processes 2 || true
exec python3 scripts/count-tests.py build-test/meson-logs/testlog.json
