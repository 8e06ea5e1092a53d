#!/usr/bin/env bash
# Builds the Linux guest of `just test-linux` into OUT (default target/linux-image):
#   vmlinuz          Debian's cloud kernel (bzImage), from linux-image-cloud-amd64
#   vmlinux          the same kernel decompressed (ELF with a PVH entry note)
#   initramfs.cpio   uncompressed newc cpio: busybox-static, init, stagevm-exit,
#                    and, when present, the guest agent (kernel module, stagectl,
#                    a staged demo) from target/linux-agent (`just linux-agent`)
#   cmdline          the kernel command line with this KVM's workarounds (README.md)
#
# Debian packages are fetched with `apt-get download` (no installation); the
# downloads are cached in OUT/debs. Needs: apt, dpkg-deb, cpio, gcc (static
# glibc), and lz4/xz/gzip/zstd for the kernel's compression.
#
# Environment:
#   OUT=dir          output directory
#   AGENT_DIR=dir    guest-agent build (default target/linux-agent)
#   STAGE_DEMO=path  the staged demo program to run at boot (default: the first
#                    executable under AGENT_DIR/demo, if any)
#   DEMO_ARGS=...    its arguments
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/target/linux-image}"
agent="${AGENT_DIR:-$repo/target/linux-agent}"
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
need cpio:cpio lz4:lz4 xz:xz-utils zstd:zstd gcc:build-essential

# --- Debian packages ---------------------------------------------------------
# The versioned image package the metapackage depends on, e.g.
# linux-image-6.1.0-56-cloud-amd64.
kpkg="$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')"
if [ -z "$kpkg" ]; then
    apt-get update -q >/dev/null
    kpkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')"
fi
[ -n "$kpkg" ] || { log "no linux-image-cloud-amd64 in the apt lists"; exit 1; }
kver="${kpkg#linux-image-}"
(
    cd "$out/debs"
    for pkg in "$kpkg" busybox-static; do
        ls "${pkg}"_*.deb >/dev/null 2>&1 || {
            log "apt-get download $pkg"
            apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true
        }
        ls "${pkg}"_*.deb >/dev/null 2>&1 || { log "download of $pkg failed"; exit 1; }
    done
)

# --- kernel ------------------------------------------------------------------
kdir="$out/kernel"
if [ ! -f "$out/vmlinux" ] || [ ! -f "$out/vmlinuz" ] || [ "$(cat "$out/kernel-version" 2>/dev/null)" != "$kver" ]; then
    rm -rf "$kdir" && mkdir -p "$kdir"
    dpkg-deb -x "$out/debs/${kpkg}"_*.deb "$kdir"
    cp "$kdir/boot/vmlinuz-$kver" "$out/vmlinuz"
    cp "$kdir/boot/config-$kver" "$out/config"
    # Decompress the payload the way the kernel's scripts/extract-vmlinux does:
    # find each compressor's magic in the bzImage and try to unpack from there.
    try() { # magic (printf escapes), command
        local pos
        for pos in $(LC_ALL=C grep -aobUP "$1" "$out/vmlinuz" 2>/dev/null | cut -d: -f1 | head -n 5); do
            tail -c +$((pos + 1)) "$out/vmlinuz" | $2 > "$out/vmlinux.tmp" 2>/dev/null || true
            if [ "$(head -c 4 "$out/vmlinux.tmp" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
                mv "$out/vmlinux.tmp" "$out/vmlinux"
                return 0
            fi
        done
        return 1
    }
    try '\x02\x21\x4c\x18' 'lz4 -dc' ||
        try '\xfd\x37\x7a\x58\x5a\x00' 'xz -dc' ||
        try '\x28\xb5\x2f\xfd' 'zstd -dc' ||
        try '\x1f\x8b\x08' 'gzip -dc' || { log "cannot decompress vmlinuz"; exit 1; }
    rm -f "$out/vmlinux.tmp"
    echo "$kver" > "$out/kernel-version"
    rm -rf "$kdir"
fi
log "kernel $kver: vmlinuz $(stat -c %s "$out/vmlinuz") bytes, vmlinux $(stat -c %s "$out/vmlinux") bytes"

# --- initramfs ---------------------------------------------------------------
root="$out/initramfs"
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,lib/stagevm,usr/bin,usr/sbin}
bb="$out/busybox"
rm -rf "$bb" && mkdir -p "$bb"
dpkg-deb -x "$out/debs"/busybox-static_*.deb "$bb"
cp "$bb/bin/busybox" "$root/bin/busybox"
rm -rf "$bb"
gcc -static -Os -o "$root/bin/stagevm-exit" "$here/stagevm-exit.c"
cp "$here/init" "$root/init"
chmod 755 "$root/init"

# Copies an executable and the shared libraries it needs into the initramfs.
add_program() { # path, name in /bin
    install -m 755 "$1" "$root/bin/$2"
    if ldd "$1" >/dev/null 2>&1; then
        ldd "$1" | grep -o '/[^ ]*' | while read -r lib; do
            mkdir -p "$root$(dirname "$lib")"
            cp -L "$lib" "$root$lib"
        done
    fi
}
included=()
if [ -f "$agent/module/stagevm_agent.ko" ]; then
    modver="$(grep -aoE 'vermagic=[^ ]+' "$agent/module/stagevm_agent.ko" | head -n 1 | cut -d= -f2 || true)"
    if [ -n "$modver" ] && [ "$modver" != "$kver" ]; then
        log "warning: stagevm_agent.ko is built for $modver, the kernel is $kver: leaving it out"
    else
        cp "$agent/module/stagevm_agent.ko" "$root/lib/stagevm/"
        included+=(module)
    fi
fi
if [ -x "$agent/stagectl/stagectl" ]; then
    add_program "$agent/stagectl/stagectl" stagectl
    included+=(stagectl)
fi
demo="${STAGE_DEMO:-}"
if [ -z "$demo" ] && [ -d "$agent/demo" ]; then
    demo="$(find "$agent/demo" -maxdepth 1 -type f -perm -u+x | sort | head -n 1)"
fi
if [ -n "$demo" ]; then
    add_program "$demo" stage-demo
    printf '%s\n' "${DEMO_ARGS:-}" > "$root/lib/stagevm/demo-args"
    included+=("demo $(basename "$demo")")
fi
[ ${#included[@]} -gt 0 ] || log "no guest agent in $agent (run 'just linux-agent'): booting busybox only"

(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --owner=0:0 --quiet) > "$out/initramfs.cpio"
log "initramfs: $(stat -c %s "$out/initramfs.cpio") bytes (uncompressed: decompression would run in emulated kernel mode); agent: ${included[*]:-none}"

# --- command line ------------------------------------------------------------
# Every option and why is in images/linux/README.md.
# clearcpuid= takes at most 127 characters here (names get cut off after
# ~20 entries), so the bits are numbers (X86_FEATURE_* of
# arch/x86/include/asm/cpufeatures.h; the kernel logs their names as
# "Clearing CPUID bits: ..."): smap popcnt cx16 fsgsbase pcid invpcid rdrand
# rdseed sse4_2 sse4_1 ssse3 pni aes pclmulqdq movbe sha_ni clflushopt clwb
# rdpid avx avx2 xsave pku smep vaes vpclmulqdq abm bmi1 bmi2 adx. noxsave
# clears xsave and what depends on it (avx*, fma, f16c, xsaveopt/c/s) too.
clear="308,151,141,288,145,298,158,306,148,147,137,128,153,129,150,317,311,312,534,156,293,154,515,295,521,522,197,291,296,307"
echo "console=ttyS0 earlyprintk=serial,ttyS0,115200 noxsave nopv pci=off nokaslr mitigations=off io_delay=none tsc=reliable no_timer_check nowatchdog rcupdate.rcu_cpu_stall_suppress=1 8250.nr_uarts=1 initcall_debug loglevel=8 rdinit=/init clearcpuid=$clear" > "$out/cmdline"
log "done: $out"
