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
    for pkg in build-essential util-linux linux-headers-cloud-amd64; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
    rustup target list --installed | grep -qx x86_64-unknown-none || rustup target add x86_64-unknown-none

# Build the test unikernel (x86_64-unknown-none, its own cargo config).
guest: setup
    cd {{guest_dir}} && cargo build --release

# Build the VMM (release) and the test guest.
build: guest
    cargo build --release -p stagevm

# The default disk the run command attaches (bench/src/diskimage.rs documents its content).
disk := "target/default-disk.img"

# Boot the default test guest (2 vCPUs, the default disk read-only) and print its output and report; extra arguments go to stagevm.
run *ARGS: build
    test -f {{disk}} || cargo run --release -q -p stagevm-bench --bin mkdisk -- {{disk}} --mib 4
    {{stagevm}} --kernel {{guest}} --cpus boot=2 --memory size=256M --disk path={{disk}},readonly=on {{ARGS}}

# Run every test (unit, property and end-to-end tests that boot VMs on /dev/kvm).
test: guest linux-agent
    cargo test --workspace

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

# Boot-time and peak-RSS benchmark (median of 9 runs).
bench-boot: build
    cargo run --release -q -p stagevm-bench --bin boot-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# Stage-channel mechanism costs measured in the guest (stage_enter, doorbell exit).
bench-channel: build
    cargo run --release -q -p stagevm-bench --bin channel-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# The staged guest under each --policy side by side, plus re-pin latency.
bench-policies: build
    cargo run --release -q -p stagevm-bench --bin policy-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# virtio-blk throughput and latency (4 KiB, 64 KiB) next to dd on the host.
bench-disk: build
    cargo run --release -q -p stagevm-bench --bin disk-bench -- --stagevm {{stagevm}} --kernel {{guest}}

# The headline: guest requests/s across code footprints × policies × {2,4} vCPUs next to the native
# host reference; prints the table and targets, writes bench/RESULTS.md's section and bench/headline.png.
bench-headline *ARGS: build
    cargo run --release -q -p stagevm-bench --bin headline-bench -- --stagevm {{stagevm}} --kernel {{guest}} {{ARGS}}

# Interrupt delivery vs MMIO exit into a ring-3 guest (raw KVM probe).
bench-irq:
    cargo run --release -q -p stagevm-bench --bin irq-probe

# Formatting and lints.
lint:
    cargo fmt --all --check
    cd {{guest_dir}} && cargo fmt --check
    cargo clippy --workspace --all-targets -- -D warnings

# Replays a synthetic trace and, when bench/capture/capture.sh exists, the traces it leaves in
# target/traces/ (captured once, then reused) under baseline, pinned, static, proportional at 2,4,8,16
# cores. STAGESIM_CAPTURE=0 skips running the capture (cached traces are still replayed); extra
# arguments go to every `stagesim replay` (e.g. --cores 4,8 --slice 100000).
# Cache simulator (issue 7): MPKI and modelled throughput per policy; tables, JSON, PNG plots in target/stagesim/.
bench-sim *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release -q -p stagesim
    sim=target/release/stagesim
    out=target/stagesim
    mkdir -p "$out/plots"
    "$sim" synth --out "$out/synth.stz" --visit-weights 2,1,1,1
    "$sim" replay --trace "$out/synth.stz" --json "$out/synth.json" {{ARGS}}
    "$sim" plot --json "$out/synth.json" --out-dir "$out/plots"
    if [ -x bench/capture/capture.sh ] && [ "${STAGESIM_CAPTURE:-1}" != 0 ]; then
        bench/capture/capture.sh || echo "bench-sim: capture failed; replaying cached traces only" >&2
    fi
    shopt -s nullglob
    for t in target/traces/*.strace.zst; do
        name=$(basename "$t" .strace.zst)
        "$sim" replay --trace "$t" --json "$out/$name.json" --jobs 2 {{ARGS}}
        "$sim" plot --json "$out/$name.json" --out-dir "$out/plots"
    done
