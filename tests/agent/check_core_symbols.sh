#!/bin/sh
# check_core_symbols.sh ARCHIVE CORE_H — the freestanding propagation core
# (ARCHIVE) may refer only to its platform interface: the cp_plat_*
# functions CORE_H declares, and the memcpy/memset it names (what GCC and
# clang emit for struct copies even freestanding).  Prints any other
# undefined symbol and fails.
set -eu
archive=$1 header=$2
allowed=$(grep -oE '\b(cp_plat_[a-z_]+|memcpy|memset)\(' "$header" | tr -d '(' | sort -u)
undefined=$(nm -u "$archive" | awk 'NF == 2 && $1 == "U" { print $2 } NF == 1 { print $1 }' |
	grep -v ':$' | sort -u)
if [ -z "$undefined" ]; then
	echo "core-symbols: $archive refers to nothing at all: not the core?" >&2
	exit 1
fi
bad=$(printf '%s\n' "$undefined" | grep -vxF "$allowed" || true)
if [ -n "$bad" ]; then
	echo "core-symbols: $archive refers to symbols outside its platform interface ($header):" >&2
	printf '  %s\n' $bad >&2
	exit 1
fi
echo "core-symbols: $(printf '%s\n' "$undefined" | wc -l) undefined symbols, all in core.h's platform interface"
