#!/bin/bash
# tests/kagent/guest.sh [--add FILE]... [--sendkey MARKER KEYS]... 'SHELL COMMANDS'
#
# Run shell commands as root in a Debian bookworm kernel booted under
# qemu (TCG), with sptrace's kernel module loaded and `sptrace` on PATH:
# each --add FILE is copied into the guest's /tmp, the commands run there
# (cwd /tmp), their stdout and stderr are printed here on ours, and this
# script exits with their status.
#
# --sendkey MARKER KEYS: once a line of the commands' stdout is MARKER,
# press KEYS on the guest's keyboard (qemu's PS/2 keyboard, through its
# monitor: `sendkey KEYS`, qemu's names joined by '-': ctrl-alt-t).  Each
# is sent once, in the order given: the second waits for its marker after
# the first was sent.  Without it qemu has no monitor at all.
#
# What it builds, each only when its inputs changed (so a second call
# boots at once), under $SPTRACE_GUEST_CACHE (default build-kagent/):
#   - sptrace itself: ninja in build/ (meson setup build if missing)
#   - the module: kagent/build.sh against the installed
#     linux-headers-6.1.0-NN-amd64 (NN: the newest installed)
#   - vmlinux-6.1.0-NN-amd64: the ELF inside /boot/vmlinuz-6.1.0-NN-amd64
#     (its xz stream); the kernel has CONFIG_PVH, so qemu boots it directly
#   - base.cpio: busybox-static, the module, sptrace and its agent, and the
#     shared libraries ldd names for them; and the kernel's own evdev.ko
#     and uinput.ko at /lib/modules/, not loaded (without evdev the guest
#     has no /dev/input: `insmod /lib/modules/evdev.ko` gives the PS/2
#     keyboard's /dev/input/eventN, which devtmpfs makes; uinput lets a
#     test plug in a keyboard of its own)
# Each call appends a small archive with the commands and the --add files.
#
# Exit status: the commands'; 124 when the guest did not finish within
# $SPTRACE_GUEST_TIMEOUT seconds (default 600); 125 when it did not boot or
# the commands could not run (the guest's console is printed then).  qemu is
# killed on every way out: a normal end, a timeout, SIGINT/SIGTERM (Ctrl-C,
# meson's test timeout), and -- through PR_SET_PDEATHSIG -- this script
# being killed outright.
#
# Guest: $SPTRACE_GUEST_MEM MiB of memory (default 1024), $SPTRACE_GUEST_CPUS
# CPUs (default 1).  $SPTRACE_GUEST_ICOUNT=SHIFT runs qemu with -icount
# shift=SHIFT: the guest's clocks count instructions (2^SHIFT ns each), not
# the host's time, so timings inside do not depend on the host's load
# (bench/kagent_bench.sh).  Needs scripts/install-deps.sh's qemu-system-x86,
# linux-image-amd64, linux-headers-amd64, busybox-static and cpio.
set -euo pipefail

die() { echo "guest.sh: $*" >&2; exit 125; }

root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SPTRACE_GUEST_CACHE:-$root/build-kagent}
limit=${SPTRACE_GUEST_TIMEOUT:-600}
mem=${SPTRACE_GUEST_MEM:-1024}
cpus=${SPTRACE_GUEST_CPUS:-1}
build=${SPTRACE_BUILD_DIR:-$root/build}

adds=()
sendkeys=()    # MARKER KEYS MARKER KEYS ...
while [ $# -gt 0 ]; do
	case "$1" in
	--add)
		[ $# -ge 2 ] || die "--add needs a FILE"
		[ -f "$2" ] || die "--add $2: no such file"
		adds+=("$2"); shift 2 ;;
	--add=*)
		f=${1#--add=}; [ -f "$f" ] || die "--add $f: no such file"
		adds+=("$f"); shift ;;
	--sendkey)
		[ $# -ge 3 ] || die "--sendkey needs a MARKER and KEYS"
		[ -n "$2" ] && [ -n "$3" ] || die "--sendkey: empty MARKER or KEYS"
		case "$3" in *[!a-z0-9_-]*) die "--sendkey $2 $3: KEYS are qemu key names joined by '-' (ctrl-alt-t)" ;; esac
		sendkeys+=("$2" "$3"); shift 3 ;;
	--) shift; break ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) die "unknown option $1 (usage: guest.sh [--add FILE]... [--sendkey MARKER KEYS]... 'SHELL COMMANDS')" ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || die "usage: guest.sh [--add FILE]... 'SHELL COMMANDS' (one argument of commands)"
commands=$1

for tool in qemu-system-x86_64 cpio xz make; do
	command -v $tool >/dev/null || die "$tool is missing: run scripts/install-deps.sh"
done
[ -x /bin/busybox ] && file -L /bin/busybox | grep -q "statically linked" ||
	die "/bin/busybox is missing or not static: run scripts/install-deps.sh (busybox-static)"

# ---- the kernel: the newest installed headers and the image of the same version
kdir=$(ls -d /usr/src/linux-headers-6.1.0-*-amd64 2>/dev/null | sort -V | tail -1 || true)
[ -n "$kdir" ] || die "no linux-headers-6.1.0-*-amd64 installed: run scripts/install-deps.sh"
kver=${kdir#/usr/src/linux-headers-}
vmlinuz=/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "$vmlinuz is missing (headers $kver are installed): install linux-image-$kver"

mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
lock="$cache/.lock"
exec 9>"$lock"
flock 9     # one build at a time; boots run in parallel once built

# ---- sptrace
if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" >&2 || die "meson setup $build failed"
fi
ninja -C "$build" ${NINJA_JOBS:+-j"$NINJA_JOBS"} >/dev/null || die "ninja -C $build failed"
sptrace_bin=$build/cli/sptrace
agent_so=$build/agent/libsptrace-agent.so
[ -x "$sptrace_bin" ] && [ -f "$agent_so" ] || die "$sptrace_bin or $agent_so was not built"

# ---- the module
ko=$("$root/kagent/build.sh" "$cache/kagent") || die "the module did not build (kagent/build.sh)"

# ---- vmlinux out of the bzImage: the xz stream's first byte on
vmlinux=$cache/vmlinux-$kver
if [ ! -s "$vmlinux" ]; then
	off=$(python3 -c 'import sys; print(open(sys.argv[1], "rb").read().find(b"\xfd7zXZ\x00"))' "$vmlinuz")
	[ "$off" -ge 0 ] || off=
	[ -n "$off" ] || die "$vmlinuz: no xz stream found (this script knows Debian's xz-compressed images)"
	# xz complains of the bytes after the stream; the ELF is whole before them.
	tail -c +"$((off + 1))" "$vmlinuz" | xz -dc > "$vmlinux.tmp" 2>/dev/null || true
	head -c 4 "$vmlinux.tmp" | grep -q 'ELF' || die "$vmlinuz: the xz stream is not an ELF"
	mv "$vmlinux.tmp" "$vmlinux"
fi

# ---- the base initramfs
base=$cache/base.cpio
kmods=(/usr/lib/modules/"$kver"/kernel/drivers/input/{evdev.ko,misc/uinput.ko})
for m in "${kmods[@]}"; do
	[ -f "$m" ] || die "$m is missing (one of the kernel's modules, in linux-image-$kver)"
done
inputs=("$sptrace_bin" "$agent_so" "$ko" "$0" /bin/busybox "${kmods[@]}")
stale=0
[ -f "$base" ] || stale=1
for f in "${inputs[@]}"; do
	[ "$f" -nt "$base" ] && stale=1
done
if [ $stale = 1 ]; then
	stage=$(mktemp -d "$cache/stage.XXXXXX")
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,usr/local/lib/sptrace,lib/modules,proc,sys,dev,tmp,root,etc,var/lib,run,add}
	cp /bin/busybox "$stage/bin/busybox"
	cp "$sptrace_bin" "$stage/usr/local/bin/sptrace"
	cp "$agent_so" "$stage/usr/local/lib/sptrace/libsptrace-agent.so"
	cp "$ko" "$stage/lib/modules/sptrace_kagent.ko"
	cp "${kmods[@]}" "$stage/lib/modules/"
	# The shared libraries, at the paths the loader looks for them.
	for lib in $( { ldd "$sptrace_bin"; ldd "$agent_so"; } | grep -o '/[^ ]*' | sort -u); do
		mkdir -p "$stage$(dirname "$lib")"
		cp -L "$lib" "$stage$lib"
	done
	echo 'root:x:0:0:root:/root:/bin/sh' > "$stage/etc/passwd"
	echo 'root:x:0:' > "$stage/etc/group"
	cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t debugfs debugfs /sys/kernel/debug
mount -t tmpfs tmpfs /tmp
hostname guest
cp -a /add/. /tmp/
if ! insmod /lib/modules/sptrace_kagent.ko; then
	echo "@@SPTRACE-GUEST-FAILED insmod@@"
	poweroff -f
fi
stty -F /dev/ttyS1 raw -echo 2>/dev/null
stty -F /dev/ttyS2 raw -echo 2>/dev/null
cd /tmp
echo "@@SPTRACE-GUEST-BEGIN@@"
sh /cmd.sh </dev/null >/dev/ttyS1 2>/dev/ttyS2
echo "@@SPTRACE-GUEST-EXIT $?@@"
poweroff -f
INIT
	chmod +x "$stage/init"
	(cd "$stage" && find . | cpio -o -H newc -R 0:0 --quiet) > "$base.tmp"
	mv "$base.tmp" "$base"
	rm -rf "$stage"
	trap - EXIT
fi
flock -u 9

# ---- this call's archive: the commands and the files to add
run=$(mktemp -d "${TMPDIR:-/tmp}/sptrace-guest.XXXXXX")
qpid=
kpid=
cleanup() {
	if [ -n "$kpid" ]; then
		kill -TERM "$kpid" 2>/dev/null || true
		wait "$kpid" 2>/dev/null || true
	fi
	if [ -n "$qpid" ]; then
		kill -TERM "$qpid" 2>/dev/null || true
		wait "$qpid" 2>/dev/null || true
	fi
	rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$run/extra/add"
printf '%s\n' "$commands" > "$run/extra/cmd.sh"
for f in "${adds[@]}"; do
	cp -p "$f" "$run/extra/add/$(basename "$f")"
done
(cd "$run/extra" && find . | cpio -o -H newc -R 0:0 --quiet) > "$run/extra.cpio"
cat "$base" "$run/extra.cpio" > "$run/initrd"

# ---- boot
: > "$run/console"; : > "$run/out"; : > "$run/err"
icount=()
if [ -n "${SPTRACE_GUEST_ICOUNT:-}" ]; then
	case "$SPTRACE_GUEST_ICOUNT" in *[!0-9]*) die "SPTRACE_GUEST_ICOUNT=$SPTRACE_GUEST_ICOUNT: a shift (0..10)" ;; esac
	icount=(-icount "shift=$SPTRACE_GUEST_ICOUNT")
fi
monitor=(-monitor none)
if [ ${#sendkeys[@]} -gt 0 ]; then
	monitor=(-monitor "unix:$run/monitor,server=on,wait=off")
fi
setpriv --pdeathsig KILL -- timeout -s KILL "$limit" \
	setpriv --pdeathsig KILL -- qemu-system-x86_64 -accel tcg -machine q35 -cpu max \
	-m "$mem" -smp "$cpus" -nographic -no-reboot -nodefaults \
	-kernel "$vmlinux" -initrd "$run/initrd" \
	-append "console=ttyS0 quiet loglevel=3 panic=-1 oops=panic rdinit=/init" \
	-serial "file:$run/console" -serial "file:$run/out" -serial "file:$run/err" \
	"${icount[@]}" "${monitor[@]}" </dev/null >"$run/qemu.log" 2>&1 &
qpid=$!

# --sendkey: watch the commands' stdout for each marker in turn, then
# type its keys through the monitor.  Ends with qemu (cleanup kills it).
sendkey() {
	python3 - "$run/monitor" "$1" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
for _ in range(100):
    try:
        s.connect(sys.argv[1])
        break
    except OSError:
        time.sleep(0.1)
s.sendall(("sendkey %s\n" % sys.argv[2]).encode())
time.sleep(0.5)       # qemu reads the line before we hang up
s.close()
PY
}
if [ ${#sendkeys[@]} -gt 0 ]; then
	(
		set +e
		for ((i = 0; i < ${#sendkeys[@]}; i += 2)); do
			until tr -d '\r' < "$run/out" | grep -qxF -- "${sendkeys[i]}"; do
				kill -0 "$qpid" 2>/dev/null || exit 0
				sleep 0.2
			done
			sendkey "${sendkeys[i + 1]}" ||
				echo "guest.sh: --sendkey ${sendkeys[i]} ${sendkeys[i + 1]}: the monitor did not take it" >&2
		done
	) &
	kpid=$!
fi
set +e
wait "$qpid"
qrc=$?
set -e
qpid=
if [ -n "$kpid" ]; then
	kill -TERM "$kpid" 2>/dev/null || true
	wait "$kpid" 2>/dev/null || true
	kpid=
fi

cat "$run/out"
cat "$run/err" >&2
status=$(grep -ao "@@SPTRACE-GUEST-EXIT [0-9]*@@" "$run/console" | head -1 | tr -dc 0-9 || true)
if [ -n "$status" ]; then
	exit "$status"
fi
if [ $qrc = 137 ]; then
	echo "guest.sh: the guest did not finish within ${limit}s (SPTRACE_GUEST_TIMEOUT); its console:" >&2
	tail -n 40 "$run/console" >&2
	exit 124
fi
echo "guest.sh: the guest ended without running the commands (qemu status $qrc); its console:" >&2
tail -n 60 "$run/console" >&2
cat "$run/qemu.log" >&2
exit 125
