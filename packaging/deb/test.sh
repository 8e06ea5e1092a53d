#!/usr/bin/env bash
# The packages, end to end on this machine (root; `just test-packages`):
# installs the five packages of target/debian/ with apt (which brings DKMS),
# checks each one does its job, and purges them, checking nothing is left.
#   stagevm              --version; the units pass systemd-analyze verify
#                        and score at most 3.5 (`systemd-analyze security
#                        --offline`); the `stagevm` user exists, in `kvm`;
#                        the default /etc/stagevm/budgets.toml boots the
#                        test guest, as root and as the units run it (the
#                        `stagevm` user, no capability, no new privileges);
#                        stagevm-discover (with its stagesim and
#                        stgtrace tool from /usr/lib/stagevm) maps the test
#                        server (discover/tests/server), stagectl accepts it
#   stagevm-agent-dkms   DKMS built and installed stagevm_agent.ko for the
#                        Debian cloud kernel headers `just setup` installs;
#                        the stagevm group and the udev rule for /dev/stagevm
#   libstage-dev         pkg-config --cflags --libs libstage links a program
#   stagevm-guest-tools  stagectl --map-file accepts a stage-map file
#   stagevm-preload      stagevm-gatectl measures the gate; the test server
#                        runs its discovered map under LD_PRELOAD (by name)
#                        with the gate on, and gatectl reads its counters
# Prints "N passed, 0 failed" at the end; exits non-zero at the first check
# that fails, after purging.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
debs=(stagevm_"$version"_"$arch".deb stagevm-agent-dkms_"$version"_all.deb
    stagevm-guest-tools_"$version"_"$arch".deb libstage-dev_"$version"_"$arch".deb
    stagevm-preload_"$version"_"$arch".deb)
packages=(stagevm stagevm-agent-dkms stagevm-guest-tools libstage-dev stagevm-preload)
if [ "$(id -u)" != 0 ]; then
    echo "skipped: the package test installs packages and needs root" >&2
    exit 0
fi
work=$(mktemp -d)
passed=0
purge() {
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${packages[@]}" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap purge EXIT
check() {
    local what=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        echo "ok: $what"
        passed=$((passed + 1))
    else
        echo "FAILED: $what" >&2
        cat "$work/out" >&2
        echo "$passed passed, 1 failed"
        exit 1
    fi
}

paths=()
for d in "${debs[@]}"; do paths+=("$root/target/debian/$d"); done
for p in "${paths[@]}"; do
    dpkg-deb --info "$p" >/dev/null
    echo "package: $(basename "$p") $(du -k "$p" | cut -f1) KiB"
done
apt-get update -q >/dev/null
check "the five packages install (apt resolves dkms)" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${paths[@]}"

# stagevm
check "stagevm --version says $version" sh -c "stagevm --version | grep -qx 'stagevm $version'"
check "stagevm-remote and stagevm-hostd are installed" sh -c \
    'stagevm-remote --version && stagevm-hostd --version'
check "the units pass systemd-analyze verify" systemd-analyze verify \
    /lib/systemd/system/stagevm-hostd.service /lib/systemd/system/stagevm@.service
check "/etc/stagevm/budgets.toml boots the test guest" \
    stagevm --kernel images/testguest/target/x86_64-unknown-none/release/testguest \
    --cpus boot=2 --memory size=128M --stages /etc/stagevm/budgets.toml \
    --cmdline "iters=100 threads=2 requests=200 work=50"
# Each unit's exposure (0 safe .. 10 unsafe) at most 3.5.
score() {
    local unit=$1 line level
    line=$(systemd-analyze security --offline=yes "$unit" 2>&1 | grep 'Overall exposure level')
    echo "$line"
    level=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')
    awk -v l="$level" 'BEGIN { exit !(l != "" && l <= 3.5) }'
}
for unit in stagevm@.service stagevm-hostd.service; do
    check "$unit scores at most 3.5 in systemd-analyze security" score "/lib/systemd/system/$unit"
    grep -h 'Overall exposure' "$work/out"
done
check "the stagevm user exists, in the kvm group" sh -c \
    "getent passwd stagevm && id -nG stagevm | tr ' ' '\n' | grep -qx kvm"
# The hardened unit's identity without systemd as PID 1 (this machine's
# containers have none): the `stagevm` user and its groups, an empty
# capability bounding set and no new privileges, as User=, SupplementaryGroups=,
# CapabilityBoundingSet= and NoNewPrivileges= give it; the mount and
# namespace sandboxing needs systemd. /dev/kvm gets udev's Debian ownership
# (root:kvm 0660) for the run where no udev gave it, and its own back after.
kvm_was=$(stat -c '%U:%G %a' /dev/kvm)
chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
install -d -o stagevm -g stagevm -m 0750 "$work/vms"
chmod 0711 "$work"
unprivileged_boot() {
    setpriv --reuid=stagevm --regid=stagevm --init-groups --inh-caps=-all --bounding-set=-all \
        --no-new-privs -- stagevm --kernel images/testguest/target/x86_64-unknown-none/release/testguest \
        --cpus boot=2 --memory size=128M --stages /etc/stagevm/budgets.toml \
        --api-socket "$work/vms/db.sock" --cmdline "iters=100 threads=2 requests=200 work=50"
}
booted=0
unprivileged_boot >"$work/boot.out" 2>&1 || booted=$?
chown "${kvm_was%% *}" /dev/kvm && chmod "${kvm_was##* }" /dev/kvm
check "/etc/stagevm/budgets.toml boots the test guest as the units run it (user stagevm, no capability)" \
    sh -c "cat '$work/boot.out'; [ $booted = 0 ] && grep -q 'stage' '$work/boot.out'"

# stagevm-agent-dkms: built for the Debian cloud kernel whose headers are here
# shellcheck disable=SC2012 # sort -V orders kernel versions; the directory names are plain
kernel=$(basename "$(ls -d /usr/src/linux-headers-*-cloud-amd64 | sort -V | tail -n 1)" | sed 's/^linux-headers-//')
check "dkms installed stagevm-agent/$version for $kernel" sh -c \
    "dkms status -m stagevm-agent -v $version -k $kernel | grep -q installed"
check "stagevm_agent.ko is in $kernel's module tree and names the agent" sh -c \
    "modinfo -k $kernel stagevm_agent | grep -q '^filename:.*updates/dkms/stagevm_agent.ko'"
check "the stagevm group exists and the udev rule gives /dev/stagevm to it, mode 0660" sh -c \
    "getent group stagevm && grep -q 'KERNEL==\"stagevm\".*GROUP=\"stagevm\", MODE=\"0660\"' /usr/lib/udev/rules.d/60-stagevm.rules"

# libstage-dev
cat >"$work/user.c" <<'EOF'
#include <stage.h>
#include <stdio.h>
int main(void)
{
	/* Linked, not run: there is no stage device on the host. */
	printf("%p %p\n", (void *)stage_enter, (void *)stage_exit);
	return 0;
}
EOF
check "pkg-config --cflags --libs libstage links a program" sh -c \
    "cc -o '$work/user' '$work/user.c' \$(pkg-config --cflags --libs libstage) && '$work/user'"

# stagevm-guest-tools
cat >"$work/server.stagemap" <<'EOF'
stagemap 1
binary /usr/sbin/server
stage parse parse_request
stage execute run_query
request parse handle_client
EOF
check "stagectl --map-file accepts a stage-map file" stagectl --map-file "$work/server.stagemap"

# stagevm-preload
check "stagevm-gatectl measures the stage point and the gate's handoff" sh -c \
    "stagevm-gatectl measure --rounds 1 --calls 50000 | tee /dev/stderr | grep -q 'switch with a handoff'"

# The test server under its discovered map and the installed preload
# library (found by name), the gate on; gatectl reads the counters.
preload_run() {
    local port pid
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    LD_PRELOAD=libstagevm_preload.so STAGEVM_STAGEMAP="$work/stageserver.stagemap" \
        STAGEVM_CONTROL="$work/gate" STAGEVM_GATE=temporal "$work/stageserver" serve "$port" 2>"$work/serve.log" &
    pid=$!
    sleep 1
    "$work/stageserver" load "$port" 2 50 >/dev/null || { kill "$pid"; return 1; }
    kill "$pid"
    wait "$pid" || true
    cat "$work/serve.log"
    grep -q 'stage points for 2 stages' "$work/serve.log" || return 1
    stagevm-gatectl --control "$work/gate" show --json | tee "$work/gate.json"
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
sys.exit(not (j["gate"] == "temporal" and j["requests"] >= 100 and sum(x["visits"] for x in j["lanes"]) > 0))' \
        "$work/gate.json"
}

# stagevm-discover, installed, on the test server (loopback; needs valgrind)
if command -v valgrind >/dev/null; then
    cc -O1 -pthread -o "$work/stageserver" discover/tests/server/stageserver.c
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    check "stagevm-discover maps the test server and stagectl accepts the map" sh -c "
        cd '$work' && stagevm-discover --stages 2..2 --cores 2 \
            --load '$work/stageserver load $port 2 50' -- '$work/stageserver' serve $port | grep 'verdict:' &&
        stagectl --map-file '$work/stageserver.stagemap'"
    check "the test server runs its map under the installed preload library, the gate on" preload_run
else
    echo "skipped: stagevm-discover on the test server (valgrind is not installed; just setup installs it)"
fi

# Purge: nothing left behind.
check "the packages purge" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${packages[@]}"
check "nothing is left (binaries, units, /etc/stagevm, DKMS source, module)" sh -c "
    ! command -v stagevm && ! command -v stagectl && ! command -v stagevm-gatectl && [ ! -e /usr/lib/stagevm ] &&
    ! ls /usr/lib/*/libstagevm_preload.so 2>/dev/null &&
    [ ! -e /lib/systemd/system/stagevm@.service ] && [ ! -e /etc/stagevm ] &&
    [ ! -e /usr/src/stagevm-agent-$version ] && [ ! -e /usr/include/stagevm ] &&
    [ ! -e /usr/lib/udev/rules.d/60-stagevm.rules ] &&
    ! dkms status -m stagevm-agent | grep -q . &&
    ! ls /lib/modules/$kernel/updates/dkms/stagevm_agent.ko* 2>/dev/null"
echo "$passed passed, 0 failed"
