#!/usr/bin/env bash
# Builds stagevm's Debian packages into target/debian/ (run from anywhere;
# `just packages` runs it after building what it packs):
#   stagevm              host: the VMM, stagevm-remote, stagevm-hostd,
#                        stagevm-discover (with stagesim and the stgtrace
#                        Valgrind tool in /usr/lib/stagevm), the systemd
#                        units, /etc/stagevm/{host,budgets}.toml
#                        (cargo-deb, from vmm/Cargo.toml's [package.metadata.deb])
#   stagevm-agent-dkms   guest: the agent module's source under DKMS, built
#                        for every kernel with headers and on kernel updates;
#                        the udev rule that gives /dev/stagevm the group
#                        `stagevm` (mode 0660), which its postinst creates
#   stagevm-guest-tools  guest: stagectl
#   libstage-dev         guest: stage.h, libstage.a, libstage.pc
#   stagevm-preload      host or guest: libstagevm_preload.so (in the
#                        multiarch library folder, so LD_PRELOAD finds it by
#                        name) and stagevm-gatectl
# The guest packages are laid out here and packed with dpkg-deb (Debian's
# own tool; they hold C, not a cargo crate).
# Needs: target/release/{stagevm,stagevm-remote,stagevm-hostd,stagevm-discover,stagesim},
# target/capture-build/stgtrace-amd64-linux,
# target/linux-agent/{libstage/libstage.a,stagectl/stagectl},
# target/release/{libstagevm_preload.so,stagevm-gatectl}, cargo-deb.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
out=$root/target/debian
stage=$root/target/debian/staging
maintainer="stagevm developers <stagevm@localhost>"
for f in target/release/stagevm target/release/stagevm-remote target/release/stagevm-hostd \
    target/release/stagevm-discover target/release/stagesim target/capture-build/stgtrace-amd64-linux \
    target/linux-agent/libstage/libstage.a target/linux-agent/stagectl/stagectl \
    target/release/libstagevm_preload.so target/release/stagevm-gatectl; do
    [ -f "$f" ] || { echo "packaging: $f is missing (just packages builds it)" >&2; exit 1; }
done
command -v cargo-deb >/dev/null || { echo "packaging: cargo-deb is missing (cargo install cargo-deb)" >&2; exit 1; }
rm -rf "$stage"
mkdir -p "$out" "$stage"

# control FILE PACKAGE ARCH DEPENDS DESCRIPTION: a binary package's control file.
control() {
    local dir=$1 name=$2 pkg_arch=$3 depends=$4 summary=$5 size
    mkdir -p "$dir/DEBIAN"
    size=$(du -sk --exclude=DEBIAN "$dir" | cut -f1)
    {
        echo "Package: $name"
        echo "Version: $version"
        echo "Architecture: $pkg_arch"
        echo "Maintainer: $maintainer"
        echo "Installed-Size: $size"
        [ -n "$depends" ] && echo "Depends: $depends"
        echo "Section: admin"
        echo "Priority: optional"
        echo "Description: $summary"
        echo " Part of stagevm: stage scheduling of guest threads onto host cores"
        echo " through a paravirtual stage channel (guest-agent/linux/README.md)."
    } > "$dir/DEBIAN/control"
}

pack() {
    dpkg-deb --root-owner-group -Zxz --build "$1" "$out/$2_${version}_$3.deb" >/dev/null
    echo "packaging: $out/$2_${version}_$3.deb"
}

# --- stagevm-agent-dkms: the module's source for DKMS ---
src=$stage/dkms/usr/src/stagevm-agent-$version
mkdir -p "$src/module/compat" "$src/include" "$src/abi"
cp guest-agent/linux/module/{Kbuild,agent.c,agent.h,probes.c} "$src/"
cp guest-agent/linux/module/compat/*.h "$src/module/compat/"
cp guest-agent/linux/include/*.h "$src/include/"
cp hypercall-abi/include/stagevm_abi.h "$src/abi/"
sed "s/@VERSION@/$version/" packaging/dkms/dkms.conf.in > "$src/dkms.conf"
mkdir -p "$stage/dkms/usr/lib/udev/rules.d"
install -m 644 packaging/udev/60-stagevm.rules "$stage/dkms/usr/lib/udev/rules.d/"
mkdir -p "$stage/dkms/DEBIAN"
sed "s/@VERSION@/$version/" packaging/deb/agent-dkms.postinst > "$stage/dkms/DEBIAN/postinst"
sed "s/@VERSION@/$version/" packaging/deb/agent-dkms.prerm > "$stage/dkms/DEBIAN/prerm"
chmod 755 "$stage/dkms/DEBIAN/postinst" "$stage/dkms/DEBIAN/prerm"
control "$stage/dkms" stagevm-agent-dkms all "dkms (>= 2.1.0.0), make, gcc, passwd" \
    "stagevm guest agent kernel module (DKMS source)"
pack "$stage/dkms" stagevm-agent-dkms all

# --- stagevm-guest-tools: stagectl ---
mkdir -p "$stage/tools/usr/bin"
install -m 755 target/linux-agent/stagectl/stagectl "$stage/tools/usr/bin/"
control "$stage/tools" stagevm-guest-tools "$arch" "libc6" \
    "stagevm guest tools: stagectl (stage map, counters, stage-map files)"
pack "$stage/tools" stagevm-guest-tools "$arch"

# --- libstage-dev: headers, static library, pkg-config file ---
inc=$stage/dev/usr/include/stagevm
lib=$stage/dev/usr/lib/$multiarch
mkdir -p "$inc" "$lib/pkgconfig"
cp guest-agent/linux/libstage/stage.h guest-agent/linux/libstage/stagemap_file.h \
    hypercall-abi/include/stagevm_abi.h "$inc/"
install -m 644 target/linux-agent/libstage/libstage.a "$lib/"
sed -e "s/@VERSION@/$version/" -e "s|@MULTIARCH@|$multiarch|" packaging/deb/libstage.pc.in \
    > "$lib/pkgconfig/libstage.pc"
control "$stage/dev" libstage-dev "$arch" "libc6-dev" \
    "stagevm guest library libstage: stage_enter/stage_exit for servers (static, headers)"
pack "$stage/dev" libstage-dev "$arch"

# --- stagevm-preload: the preload library and its control tool ---
mkdir -p "$stage/preload/usr/lib/$multiarch" "$stage/preload/usr/bin"
install -m 644 target/release/libstagevm_preload.so "$stage/preload/usr/lib/$multiarch/"
install -m 755 target/release/stagevm-gatectl "$stage/preload/usr/bin/"
control "$stage/preload" stagevm-preload "$arch" "libc6" \
    "stagevm preload library: stage points and a temporal gate for unmodified servers"
pack "$stage/preload" stagevm-preload "$arch"

# --- stagevm: the host package, by cargo-deb ---
cargo deb -p stagevm --no-build --output "$out/stagevm_${version}_$arch.deb" >/dev/null
echo "packaging: $out/stagevm_${version}_$arch.deb"
rm -rf "$stage"
