#!/bin/bash
# Install the Debian bookworm packages sptrace needs to build, test and demo.
# Idempotent and quick when everything is present: apt runs only if a package
# is missing.  Run as root (CI and the Quick start do).
set -euo pipefail

packages=(
	# build (the agent links the static archives of libcapstone-dev,
	# libelf-dev, zlib1g-dev and libprotobuf-c-dev; libgcc's come with gcc)
	meson ninja-build gcc g++ clang libclang-rt-14-dev pkg-config
	libcapstone-dev libelf-dev libdwarf-dev
	libprotobuf-c-dev protobuf-c-compiler zlib1g-dev libssl-dev
	# sptrace run's packed records (analysis/pack.c: the CLI and readers only)
	libzstd-dev
	# tests: a program that uses the libraries the agent uses too (tp_libs)
	liblzma-dev
	# tests: binutils for objdump/readelf/strip, real programs to analyse,
	# libc's separate debug file for source lines
	binutils python3 coreutils libc6-dbg libstdc++6 procps file
	# real programs traced by the end-to-end tests (redis and nginx: attached
	# to under load)
	gzip xz-utils sqlite3 redis-server redis-tools nginx-light haproxy curl
	# runtimes that read return addresses (test_runtimes.py): node's V8, Go with cgo
	nodejs golang-go
	# programs that met the agent badly (test_programs.py): a debugger and its
	# inferior, postgres's forking postmaster
	gdb postgresql-15 postgresql-client-15
	# the security tests watch the DWARF reader's sandbox being entered
	strace
	# sptrace export's test decodes the Perfetto file with protoc --decode
	protobuf-compiler
	# sptrace analyze --html's page is rendered by headless Chromium
	chromium fonts-dejavu-core
	# --on key CHORD's X11 backend (libX11), tested under Xvfb with xdotool
	libx11-dev xvfb xdotool
	# spdaemon's tests: openssl checks the keys and plays TLS peers; hosts
	# are network namespaces (ip, unshare); its systemd unit is verified
	openssl iproute2 util-linux systemd
	# the kernel module (kagent/) and its guest (tests/kagent/guest.sh): the
	# headers and the image of Debian's kernel, qemu to boot it, busybox and
	# cpio for the initramfs
	linux-headers-amd64 linux-image-amd64 qemu-system-x86 busybox-static cpio make
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -ne 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: missing packages: ${missing[*]}" >&2
		echo "install-deps: run as root, or: sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Test tooling from npm (tests/tools/package-lock.json): speedscope, which
# test_export.py loads sptrace's Chrome JSON into.  npm comes with Node.js;
# Debian's own package if there is none.
tools="$(dirname "$0")/../tests/tools"
if [ ! -f "$tools/node_modules/speedscope/dist/release/index.html" ]; then
	if ! command -v npm >/dev/null; then
		if [ "$(id -u)" -ne 0 ]; then
			echo "install-deps: npm is missing: sudo apt-get install npm" >&2
			exit 1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
	fi
	echo "install-deps: npm ci in tests/tools (speedscope)"
	(cd "$tools" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
