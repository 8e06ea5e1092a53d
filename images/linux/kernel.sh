#!/usr/bin/env bash
# Builds the minimal test kernel of images/linux/README.md from Debian's
# packaged kernel source, once, into target/linux-kernel/<version>-<key>/:
#   vmlinux          the kernel (ELF with the PVH entry note stagevm boots)
#   linux/           the configured and built tree (KDIR for the agent module)
#   build.log        make's output
# <key> is a hash of the source version, the settings of
# images/linux/kernel/stagevm.config (not its comments) and
# images/linux/kernel/*.patch: a change to any of them builds anew (and
# removes the older trees); otherwise nothing is done. Prints the tree's path
# on stdout.
#
# Steps: install the source package (apt, when missing), unpack it, apply the
# patches, `make tinyconfig`, merge the fragment, `make olddefconfig`, check
# that every option of the fragment is in the final .config (an option that
# does not exist or whose dependencies are off would be dropped silently by
# Kconfig), `make vmlinux modules` (modules: Module.symvers for the agent).
#
# Environment: LINUX_SOURCE (package, default linux-source-6.1), OUT
# (default target/linux-kernel), JOBS (default: the number of CPUs),
# FRAGMENTS (more config fragments merged after stagevm.config, e.g.
# images/linux/kernel/mariadb.config; they are part of the key, and a kernel
# with other fragments belongs in another OUT, since older trees in OUT are
# removed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pkg="${LINUX_SOURCE:-linux-source-6.1}"
out="${OUT:-$repo/target/linux-kernel}"
jobs="${JOBS:-$(nproc)}"
fragments=("$here/kernel/stagevm.config")
for extra in ${FRAGMENTS:-}; do
    [ -f "$extra" ] || { echo "linux-kernel: FRAGMENTS names $extra, which is not a file" >&2; exit 1; }
    fragments+=("$(cd "$(dirname "$extra")" && pwd)/$(basename "$extra")")
done
log() { echo "linux-kernel: $*" >&2; }

# The source package and what building a kernel needs, each checked.
deps=()
dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || deps+=("$pkg")
for tool in gcc:build-essential make:build-essential bc:bc bison:bison flex:flex xz:xz-utils python3:python3; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || deps+=("${tool#*:}")
done
[ -f /usr/include/gelf.h ] || deps+=(libelf-dev)
[ -f /usr/include/openssl/opensslv.h ] || deps+=(libssl-dev)
if [ ${#deps[@]} -gt 0 ]; then
    log "installing ${deps[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${deps[@]}" >/dev/null
fi
version="$(dpkg-query -W -f '${Version}' "$pkg")"
tarball="$(dpkg -L "$pkg" | grep -E '/usr/src/linux-source-[^/]*\.tar\.(xz|bz2|gz)$' | head -n 1)"
[ -f "$tarball" ] || { log "$pkg has no source tarball in /usr/src"; exit 1; }

# The fragment's settings (not its comments) and the patches make the key.
key="$( { echo "$pkg $version"; grep -hE '^CONFIG_|^# CONFIG_.* is not set' "${fragments[@]}"; cat "$here"/kernel/*.patch; } | sha256sum | cut -c1-12)"
dir="$out/$version-$key"
if [ -f "$dir/vmlinux" ]; then
    log "cached: $dir/vmlinux ($pkg $version, config and patches $key)"
    echo "$dir"
    exit 0
fi

start=$(date +%s)
mkdir -p "$out"
for old in "$out"/*/; do
    [ -d "$old" ] && [ "${old%/}" != "$dir" ] && { log "removing the older tree ${old%/}"; rm -rf "$old"; }
done
rm -rf "$dir" && mkdir -p "$dir"
log "unpacking $tarball"
tar -xf "$tarball" -C "$dir"
mv "$dir"/linux-source-* "$dir/linux"
tree="$dir/linux"
for p in "$here"/kernel/*.patch; do
    log "applying $(basename "$p")"
    patch -d "$tree" -p1 --forward --quiet < "$p"
done

log "configuring: tinyconfig + $(cat "${fragments[@]}" | grep -c '^CONFIG_\|^# CONFIG_.* is not set') options of ${fragments[*]##*/}"
make -C "$tree" -s tinyconfig >/dev/null
"$tree/scripts/kconfig/merge_config.sh" -m -O "$tree" "$tree/.config" "${fragments[@]}" >/dev/null
make -C "$tree" -s olddefconfig >/dev/null
missing=()
while IFS= read -r line; do
    case "$line" in
    CONFIG_*=*) grep -qx "$line" "$tree/.config" || missing+=("$line") ;;
    "# CONFIG_"*" is not set")
        opt="${line#\# }" && opt="${opt%% *}"
        grep -q "^$opt=" "$tree/.config" && missing+=("$line")
        ;;
    esac
done < <(cat "${fragments[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    log "the fragment's options did not all take (missing dependency or unknown option): ${missing[*]}"
    exit 1
fi

log "building vmlinux with $jobs jobs (about 5 minutes on 2 cores; log: $dir/build.log)"
if ! make -C "$tree" -j"$jobs" vmlinux modules > "$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log" >&2
    log "build failed: $dir/build.log"
    exit 1
fi
cp "$tree/vmlinux" "$dir/vmlinux"
log "built $pkg $version ($key) in $(($(date +%s) - start)) s: vmlinux $(stat -c %s "$dir/vmlinux") bytes"
echo "$dir"
