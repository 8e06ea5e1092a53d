#!/usr/bin/env bash
# Builds the Linux test image (images/linux/README.md) into OUT (default
# target/linux-image):
#   vmlinux          the minimal kernel of kernel.sh (cached by source version,
#                    config fragment and patches)
#   initramfs.cpio   uncompressed newc cpio: the guest agent built against
#                    that kernel: stagevm_agent.ko and stagevm-tools, one
#                    static binary (multicall.c) that is /init (init.c), the
#                    staged test program and the hostile sequence (linked with
#                    libstage), stagevm-exit and stagectl
#   cmdline          the kernel command line (README.md says why each word)
# Prints the step times. Needs gcc with static glibc and cpio.
#
# Environment: OUT=dir, KERNEL_OUT and KERNEL_FRAGMENTS (kernel.sh's OUT and
# FRAGMENTS: images/linux/mariadb/build.sh builds its kernel so), STAGED_ARGS="THREADS ITERS WORK_US" (default
# "2 100 100": the staged program's threads, requests per phase and µs of
# work per stage).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/target/linux-image}"
mkdir -p "$out/debs"
out="$(cd "$out" && pwd)"
log() { echo "build-linux: $*" >&2; }

need() {
    local missing=()
    for tool in "$@"; do command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}"); done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}
need cpio:cpio gcc:build-essential

# --- kernel ------------------------------------------------------------------
t0=$(date +%s)
kdir="$(OUT="${KERNEL_OUT:-$repo/target/linux-kernel}" FRAGMENTS="${KERNEL_FRAGMENTS:-}" "$here/kernel.sh")"
tree="$kdir/linux"
cp "$kdir/vmlinux" "$out/vmlinux"
kernel_s=$(($(date +%s) - t0))

# --- guest agent against that kernel -----------------------------------------
t1=$(date +%s)
agent="$out/agent"
rm -rf "$agent" && mkdir -p "$agent"
make -s -C "$repo/guest-agent/linux/module" KDIR="$tree" BUILD="$agent/module" >"$agent/module.log" 2>&1 ||
    { cat "$agent/module.log" >&2; log "the agent module does not build against $tree"; exit 1; }
make -s -C "$repo/guest-agent/linux/libstage" BUILD="$agent/libstage" all >/dev/null
# One static multi-call binary (multicall.c): every byte of the initramfs is
# unpacked by emulated kernel code, and static glibc costs ~700 KB a program.
inc=(-I"$repo/guest-agent/linux/libstage" -I"$repo/guest-agent/linux/include" -I"$repo/guest-agent/linux/stagectl" -I"$repo/hypercall-abi/include")
cflags=(-O2 -pthread -Wall -Wextra -Werror "${inc[@]}")
objs=()
for src in "$here/init.c" "$here/staged.c" "$here/hostile.c" "$here/hostile_agent.c" "$here/stagevm-exit.c" "$here/netecho.c" "$here/mariadb.c" "$repo/guest-agent/linux/stagectl/stagectl.c" "$repo/guest-agent/linux/stagectl/attach.c" "$here/multicall.c"; do
    name="$(basename "$src" .c)"
    def=()
    [ "$name" = multicall ] || def=(-Dmain="${name//-/_}_main")
    gcc "${cflags[@]}" "${def[@]}" -c -o "$agent/$name.o" "$src"
    objs+=("$agent/$name.o")
done
gcc -static -pthread -o "$agent/stagevm-tools" "${objs[@]}" "$agent/libstage/libstage.a"
agent_s=$(($(date +%s) - t1))

# --- initramfs ---------------------------------------------------------------
# Only stagevm-tools and the module: /init is init.c (no busybox: every byte
# is unpacked by emulated kernel code, and every shell fork is emulated too).
root="$out/initramfs"
rm -rf "$root"
mkdir -p "$root"/{bin,dev,proc,sys,mnt,lib/stagevm}
install -m 755 "$agent/stagevm-tools" "$root/bin/"
strip "$root/bin/stagevm-tools"
for prog in staged hostile stagevm-exit stagectl tlsprobe; do ln -s stagevm-tools "$root/bin/$prog"; done
ln -s bin/stagevm-tools "$root/init"
install -m 644 "$agent/module/stagevm_agent.ko" "$root/lib/stagevm/"
strip --strip-debug "$root/lib/stagevm/stagevm_agent.ko"
echo "${STAGED_ARGS:-2 100 100}" > "$root/lib/stagevm/staged-args"
(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --owner=0:0 --quiet) > "$out/initramfs.cpio"

# --- command line ------------------------------------------------------------
# Every word and why: images/linux/README.md.
echo "console=ttyS0 earlyprintk=serial,ttyS0,115200 noxsave clearcpuid=151,308 pci=off io_delay=none tsc=reliable no_timer_check nowatchdog rcupdate.rcu_cpu_stall_suppress=1 8250.nr_uarts=1 quiet rdinit=/init" > "$out/cmdline"

log "kernel $(basename "$kdir") (${kernel_s} s), agent (${agent_s} s): vmlinux $(stat -c %s "$out/vmlinux") bytes, initramfs $(stat -c %s "$out/initramfs.cpio") bytes (uncompressed: decompression would be emulated kernel code)"
echo "kernel_s=$kernel_s agent_s=$agent_s" > "$out/build-times"
