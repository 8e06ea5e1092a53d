# stagevm task runner. `just --list` shows the recipes.

guest_dir := "images/testguest"
guest := guest_dir / "target/x86_64-unknown-none/release/testguest"
stagevm := "target/release/stagevm"

# Show the recipes.
default:
    @just --list

# Install what a fresh Debian machine lacks (needs root and a Rust toolchain from rustup).
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    # shellcheck and linux-source-6.1 (the kernel's scripts/checkpatch.pl) for `just lint`.
    for pkg in build-essential util-linux linux-headers-cloud-amd64 zstd python3 python3-venv strace iproute2 pkg-config kmod valgrind shellcheck linux-source-6.1; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
    # promtool (Prometheus' linter) checks the /metrics exposition; the
    # package's server is not started here (no init system runs it).
    if ! command -v promtool >/dev/null; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
    fi
    rustup target list --installed | grep -qx x86_64-unknown-none || rustup target add x86_64-unknown-none

# Build the test unikernel (x86_64-unknown-none, its own cargo config).
guest: setup
    cd {{guest_dir}} && cargo build --release

# Build the VMM (release) and the test guest.
build: guest
    cargo build --release -p stagevm

# The default disk the run command attaches (images/mkdisk/src/lib.rs documents its content).
disk := "target/default-disk.img"

# Boot the default test guest (2 vCPUs, the default disk read-only) and print its output and report; extra arguments go to stagevm.
run *ARGS: build
    test -f {{disk}} || cargo run --release -q -p stagevm-mkdisk --bin mkdisk -- {{disk}} --mib 4
    {{stagevm}} --kernel {{guest}} --cpus boot=2 --memory size=256M --disk path={{disk}},readonly=on {{ARGS}}

# Run every test (unit, property and end-to-end tests that boot VMs on /dev/kvm).
test: guest linux-agent
    cargo test --workspace

# Debian packages into target/debian/ (packaging/deb/build.sh): stagevm (host, cargo-deb), stagevm-agent-dkms,
# stagevm-guest-tools and libstage-dev (guest). Installs cargo-deb (crates.io) when missing.
packages: build linux-agent
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release -q -p stagevm-hostd -p stagevm-discover -p stagesim -p stagevm-preload
    discover/stgtrace/build_tool.sh >/dev/null
    command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --version 3.7.0
    packaging/deb/build.sh

# The packages end to end (packaging/deb/test.sh; root): install with apt (DKMS builds the agent for the cloud
# kernel headers), --version, systemd-analyze verify, the default budgets boot the test guest, pkg-config links
# libstage, stagectl reads a stage-map file; purge and check nothing is left.
test-packages: packages
    packaging/deb/test.sh

# Build the Linux guest agent into target/linux-agent: the kernel module against Debian's cloud kernel headers (or KDIR), libstage and stagectl.
linux-agent: setup
    #!/usr/bin/env bash
    set -euo pipefail
    kdir="${KDIR:-$(ls -d /usr/src/linux-headers-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1)}"
    if [ -z "$kdir" ] || [ ! -f "$kdir/Makefile" ]; then
        echo "linux-agent: no kernel build tree (just setup installs linux-headers-cloud-amd64; or set KDIR)" >&2
        exit 1
    fi
    make -s -C guest-agent/linux BUILD="$PWD/target/linux-agent" KDIR="$kdir"
    echo "linux-agent: target/linux-agent/module/stagevm_agent.ko built against $(basename "$kdir"); libstage.a, stagectl"

# The Linux test image (images/linux/README.md): a minimal kernel from Debian's linux-source-6.1 (tinyconfig +
# images/linux/kernel/stagevm.config + the syscall-completion patch; built once, ~5.5 min on 2 cores, cached in
# target/linux-kernel by source version, settings and patch), the guest agent built against it, and a 945 KB
# initramfs (one static binary that is /init, the staged program and the hostile sequence; and the module).
linux-image: setup
    images/linux/build.sh

# Boot the Linux test image under stagevm and check it end to end (user space, serial output, virtio-blk, the
# agent module, the staged program under static then off, guest counts = VMM report, rmmod; images/linux/test.py).
test-linux: linux-image
    cargo build --release -q -p stagevm --bins
    images/linux/test.py

# The MariaDB guest image (images/linux/mariadb/README.md): the test kernel plus kernel/mariadb.config (ext4, unix
# sockets, epoll, uprobes; cached in target/linux-kernel-mariadb), the test image's /init and agent against it, and
# a root disk from Debian's own mariadb-server-core package and the libraries it links, with a data directory
# initialised on the host (sysbench's sbtest table). Cached; the first build takes ~10 min on 2 cores.
mariadb-image: setup
    images/linux/mariadb/build.sh

# MariaDB in a stagevm guest, staged through uprobes: attach the stage map to the unmodified mariadbd, query it
# over virtio-net from a namespace of the test's own under static, off and auto, refused maps, detach, rmmod;
# then a second boot staged through the preload library (its gate set by the VMM's map: temporal, off, auto)
# (images/linux/mariadb/test.py; QUERIES per phase, default 200).
test-mariadb QUERIES="200": mariadb-image
    cargo build --release -q -p stagevm --bins
    images/linux/mariadb/test.py --queries {{QUERIES}}

# MariaDB in a guest as a benchmark: test-mariadb with QUERIES per phase (default 500) and its table of queries/s per
# policy and uprobe hits and migrations per query. Run alone; on this machine the guest kernel is emulated (every
# system call ~400 µs), so the figures show function, not speed; on hardware KVM it is the same recipe.
bench-mariadb QUERIES="500": mariadb-image
    cargo build --release -q -p stagevm --bins
    images/linux/mariadb/test.py --queries {{QUERIES}}

# Linux guest boot time: 3 boots of the test image to user space, median against the 60 s target (run alone).
bench-linux-boot: linux-image
    cargo build --release -q -p stagevm --bins
    images/linux/test.py --boots 3 --only-boots

# Boot-time and peak-RSS benchmark (median of 9 runs).
bench-boot: build
    cargo run --release -q -p stagevm-bench --bin boot-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# Stage-channel mechanism costs measured in the guest (stage_enter, doorbell exit).
bench-channel: build
    cargo run --release -q -p stagevm-bench --bin channel-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# Guest thread migration between vCPUs (hopper, seed 000): latency on owned/shared cores × spinning/parked targets, then the CPU a migration costs when both vCPUs are busy (saturated mode).
bench-migration *ARGS: build
    cargo run --release -q -p stagevm-bench --bin migration-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# virtio-net throughput, test guest <-> a peer on its tap, each direction at 64 and 1514 bytes, next to a veth pair
# between two namespaces in the same rounds; exits and interrupts per frame (namespaces of its own; run alone).
bench-net *ARGS: build
    cargo run --release -q -p stagevm-bench --bin net-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# The operator API's cost: GET /api/v1/stages latency and the VMM's CPU with a client polling at 10 Hz, against nobody polling.
bench-api *ARGS: build
    cargo run --release -q -p stagevm-bench --bin api-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# The staged guest under each --policy side by side, plus re-pin latency.
bench-policies: build
    cargo run --release -q -p stagevm-bench --bin policy-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# virtio-blk throughput and latency (4 KiB, 64 KiB) next to dd on the host.
bench-disk: build
    cargo run --release -q -p stagevm-bench --bin disk-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# The headline: guest requests/s across code footprints × policies (pinned and static also × stage-visit
# policies, `--visits`) × {2,4} vCPUs next to the native host references (whole, spatial, cohort), each run ≥ 5 s
# and judged in steady state (~2 h for the 10 footprints; `--footprints` to narrow, `--section temporal` to keep
# the headline section); prints the tables and targets, writes bench/RESULTS.md's section and bench/headline.png.
bench-headline *ARGS: build
    cargo run --release -q -p stagevm-bench --bin headline-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# auto's decision procedure (issue 49): O1 (the mode auto holds, replayed in full, against the best mode, in
# stagesim over the MariaDB traces x maps x L2 256/512/2048 KiB x 2 and 4 cores), O2 (unstaged against itself:
# no false switches), O4 (a VM whose load alternates 90 % and 30 % every 20 s for 2 minutes); O3 is bench-open's.
# Writes bench/RESULTS.md's auto-decisions section (~41 min: 35 in stagesim, 6 in the VM; run alone).
bench-auto *ARGS: build guest
    cargo build --release -q -p stagesim -p stagevm-bench --bin auto-bench
    target/release/auto-bench {{ARGS}}

# Open loop (issue 35): the headline's shapes (127 KiB: staging loses; 4 MiB: it wins) at 2 and 4 vCPUs, closed
# loop and open loop at 30/60/90 % of the unstaged capacity measured in the run, every cell (off, pinned,
# pinned+srpt, static, proportional, auto) in 5 interleaved rounds next to native open-loop references: rate, CPU
# per request, p50/p99 latency, targets A1-A5; then a short-visit 64 KiB shape (staging loses 2.5x) under off,
# pinned and auto; writes bench/RESULTS.md's open-loop sections and bench/open-loop*.png (~1 h 50 min; run alone).
bench-open *ARGS: build
    cargo run --release -q -p stagevm-bench --bin open-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}
    cargo run --release -q -p stagevm-bench --bin open-bench -- --stagevm {{stagevm}} --kernel {{guest}} --shapes 64:10:64 --cells off,pinned,auto --section open-loop-short --plot bench/open-loop-short.png {{ARGS}}

# Several VMs (issue 38): two VMs (4 MiB and 128 KiB shapes) busy in turn on the 2 cores, stagevm-hostd (default
# rules, and lend_when_idle) against a fixed half-and-half split (and a fixed-api control), 3 interleaved rounds:
# requests served, p99, core moves, periods waited; targets H1-H3; writes bench/RESULTS.md's section (~5 min; run alone).
bench-host *ARGS: build
    cargo build --release -q -p stagevm-hostd
    cargo run --release -q -p stagevm-bench --bin host-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# A real server staged natively (issue 48): Debian's mariadbd on the host with the preload library
# (guest-agent/preload) against unpatched, sysbench on loopback; cells unpatched / hooks (gate off) / srpt /
# cohort, interleaved rounds; the mechanism's costs (stage point, uprobe hit, gate and futex handoffs) in the same
# run; stagesim's prediction beside each cell (traces captured once by capture.sh); N1/N2 met / not met
# (bench/native/bench_native_server.py --help; defaults: 3 workloads x 16,32 connections x split,shared, 5 rounds
# of 30 s: ~3 h; run alone). Needs root for tracefs (the uprobe cell is skipped without it).
bench-native-server *ARGS: setup
    #!/usr/bin/env bash
    set -euo pipefail
    need=()
    command -v mariadbd >/dev/null || need+=(mariadb-server)
    command -v sysbench >/dev/null || need+=(sysbench)
    if [ ${#need[@]} -gt 0 ]; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
    fi
    cargo build --release -q -p stagevm-preload -p stagesim -p stagevm-discover
    for wl in oltp_read_only oltp_read_write tpcc; do
        test -s "target/traces/mariadb-$wl.strace.zst" || bench/capture/capture.sh --workloads "$wl" --no-validate
    done
    python3 bench/native/bench_native_server.py {{ARGS}}

# Interrupt delivery vs MMIO exit into a ring-3 guest (raw KVM probe).
bench-irq:
    cargo run --release -q -p stagevm-bench --bin irq-probe

# Cache simulator (issue 7), stagesim/bench-sim.sh: a synthetic trace and the traces in target/traces/
# (captured by bench/capture/capture.sh once, then reused; STAGESIM_CAPTURE=0 skips capturing) under baseline,
# pinned, static, proportional at 2,4,8,16 cores; MariaDB also: migration-cost and stage-grouping sweep, stage
# discovery, variants. Writes JSON and PNGs to target/stagesim/ and the stagesim section of bench/RESULTS.md.
# ~20 min with one replay at a time (STAGESIM_JOBS=2 runs two); extra arguments go to the main replay of each trace.
bench-sim *ARGS:
    stagesim/bench-sim.sh {{ARGS}}

# Fuzz every guest-facing parser (fuzz/, bolero on stable): 1,000,000 cases per target in debug and release, then a table.
fuzz *ARGS:
    fuzz/run.sh {{ARGS}}

# Ruff, PyPI's Python linter and formatter, for the Python harness and scripts (ruff.toml): this version, in a
# venv of its own under target/ (Debian's python3 refuses `pip install` outside one).
ruff_version := "0.17.6"
ruff := "target/ruff-venv/bin/ruff"

# Formatting, lints (the workspace's [workspace.lints] and the guest's copy of them) and rustdoc links, warnings as
# errors; the Python with ruff (installed into target/ruff-venv on first use); the shell scripts with shellcheck and
# the C with the kernel's checkpatch.pl (tests/lint/).
lint: setup
    cargo fmt --all --check
    cd {{guest_dir}} && cargo fmt --check
    cargo clippy --workspace --all-targets -- -D warnings
    # Imports run one way (docs/architecture.md, Layering).
    cargo run -q -p stagevm-layering
    cd {{guest_dir}} && cargo clippy --release -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace -q
    {{ruff}} --version 2>/dev/null | grep -qx "ruff {{ruff_version}}" || { python3 -m venv target/ruff-venv && target/ruff-venv/bin/pip install -q "ruff=={{ruff_version}}"; }
    {{ruff}} check .
    {{ruff}} format --check .
    # Every C source and header names its licence (SPDX, as the kernel's).
    ! git ls-files '*.c' '*.h' | xargs grep -L 'SPDX-License-Identifier' | grep . || { echo "lint: the files above have no SPDX-License-Identifier line" >&2; exit 1; }
    # Every tracked shell script (*.sh and sh/bash shebangs) passes shellcheck.
    tests/lint/shellcheck.sh
    # The C in the kernel's style: scripts/checkpatch.pl from Debian's linux-source-6.1 tarball (extracted into
    # target/checkpatch once), with the checks each group of files skips listed in the script.
    tests/lint/checkpatch.sh
