#!/bin/bash
# Build sptrace's kernel module against the installed Debian bookworm
# kernel headers (linux-headers-amd64 -> linux-headers-6.1.0-NN-amd64; NN
# is whatever is installed, the newest if several are).
#
#   kagent/build.sh OUTDIR     -> OUTDIR/sptrace_kagent.ko; prints its path
#
# kbuild writes beside the sources, so they are copied into OUTDIR first.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: kagent/build.sh OUTDIR}

kdir=$(ls -d /usr/src/linux-headers-6.1.0-*-amd64 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$kdir" ]; then
	echo "kagent/build.sh: no /usr/src/linux-headers-6.1.0-*-amd64: install linux-headers-amd64 (scripts/install-deps.sh)" >&2
	exit 1
fi
mkdir -p "$out/core_shim"
# The propagation core is the agent's own (agent/core/core.c; see
# kagent/core_plat.c for what the module takes from it).
for f in Kbuild kagent.h sptrace_kagent.h main.c scope.c probes.c shadow.c return.S indirect.c \
	ring.c keys.c core_plat.c core_shim/stdint.h core_shim/stdbool.h core_shim/stddef.h \
	../agent/core/core.c ../agent/core/core.h ../codeanalysis/ca_records.h; do
	case $f in ../*) to=$out/$(basename "$f") ;; *) to=$out/$f ;; esac
	cmp -s "$src/$f" "$to" || cp "$src/$f" "$to"
done
make -s -C "$kdir" M="$(cd "$out" && pwd)" modules >&2
echo "$(cd "$out" && pwd)/sptrace_kagent.ko"
