#!/usr/bin/env bash
# Boots the image of images/linux/build.sh under stagevm, bounded in time,
# watching the serial log, and reports how far the guest got:
#   - stagevm exits by itself: the guest ended the VM (exit status of init),
#     or failed (an emulation failure or triple fault: stagevm prints vCPU,
#     RIP and the instruction bytes, and exits 2);
#   - "Kernel panic" in the log, or the time limit: the VM is stopped (SIGTERM).
# Then prints the elapsed time, the last kernel log line and initcall, and,
# when /init ran, the time to user space and the guest agent's output.
# The full serial log is OUT/serial.log, stagevm's messages OUT/stagevm.log,
# the summary OUT/result.txt. Exit status 0 only when user space was reached
# and the VM ended with status 0.
#
# Environment: OUT (default target/linux-image), STAGEVM (default
# target/release/stagevm), TIMEOUT seconds (default 900), CPUS (default 2),
# MEMORY (default 256M), KERNEL=vmlinux|vmlinuz (default vmlinux: PVH boot;
# vmlinuz boots the bzImage), EXTRA_CMDLINE (appended), ACPI=on|off (default
# on: the kernel finds its vCPUs and I/O APIC in stagevm's ACPI MADT; off
# appends acpi=off, which leaves one CPU in PIC mode).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/target/linux-image}"
stagevm="${STAGEVM:-$repo/target/release/stagevm}"
timeout="${TIMEOUT:-900}"
kernel="$out/${KERNEL:-vmlinux}"
serial="$out/serial.log"
vmmlog="$out/stagevm.log"
result="$out/result.txt"
for f in "$stagevm" "$kernel" "$out/initramfs.cpio" "$out/cmdline"; do
    [ -e "$f" ] || { echo "boot-linux: $f is missing (run images/linux/build.sh and build stagevm)" >&2; exit 1; }
done
cmdline="$(cat "$out/cmdline") ${EXTRA_CMDLINE:-}"
acpi="${ACPI:-on}"
[ "$acpi" = off ] && cmdline="$cmdline acpi=off"
rm -f "$serial" "$vmmlog" "$result"

start=$(date +%s)
"$stagevm" --kernel "$kernel" --initramfs "$out/initramfs.cpio" --cmdline "$cmdline" \
    --cpus "boot=${CPUS:-2}" --memory "size=${MEMORY:-256M}" --serial "file=$serial" \
    --report "$out/report.json" --log-level stagevm=info >"$vmmlog" 2>&1 &
pid=$!
echo "boot-linux: stagevm pid $pid, $(basename "$kernel"), ${CPUS:-2} vCPU(s), ${MEMORY:-256M}, ACPI $acpi, limit ${timeout} s; serial log $serial"

userspace=""
stopped=""
last_report=0
while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    now=$(($(date +%s) - start))
    if [ -z "$userspace" ] && grep -aq 'stagevm-linux: user space reached' "$serial" 2>/dev/null; then
        userspace=$now
        echo "boot-linux: user space after ${now} s"
    fi
    if grep -aq 'Kernel panic' "$serial" 2>/dev/null; then
        stopped="kernel panic"
    elif [ "$now" -ge "$timeout" ]; then
        stopped="time limit of ${timeout} s"
    fi
    if [ -n "$stopped" ]; then
        echo "boot-linux: stopping the VM: $stopped"
        kill -TERM "$pid" 2>/dev/null
        break
    fi
    if [ $((now - last_report)) -ge 60 ]; then
        last_report=$now
        echo "boot-linux: ${now} s: $(grep -a . "$serial" 2>/dev/null | tail -n 1 | cut -c1-150)"
    fi
done
wait "$pid"
code=$?
elapsed=$(($(date +%s) - start))

last_line="$(grep -a . "$serial" 2>/dev/null | grep -av '^stagevm-linux' | tail -n 1 | tr -d '\r')"
last_initcall="$(grep -aoE 'calling  [^ ]+' "$serial" 2>/dev/null | tail -n 1 | awk '{print $2}')"
initcalls="$(grep -ac 'initcall .* returned' "$serial" 2>/dev/null || true)"
failure="$(grep -a 'guest failed' "$vmmlog" | head -n 1)"
{
    echo "kernel: $(cat "$out/kernel-version" 2>/dev/null) ($(basename "$kernel")), ${CPUS:-2} vCPU(s), ${MEMORY:-256M}, ACPI $acpi"
    echo "elapsed: ${elapsed} s; stagevm exit status ${code}${stopped:+ (stopped: $stopped)}"
    [ -n "$failure" ] && echo "failure: ${failure#stagevm: }"
    grep -a 'completed instructions KVM could not emulate' "$vmmlog" | sed 's/.*INFO [^ ]* /stagevm: /' || true
    echo "kernel log lines: $(grep -ac . "$serial" 2>/dev/null || echo 0); initcalls returned: ${initcalls:-0}; last initcall called: ${last_initcall:-none}"
    echo "last kernel log line: ${last_line:-none}"
    if [ -n "$userspace" ]; then
        echo "user space: after ${userspace} s (wall clock, polled every 2 s)"
        grep -a 'stagevm-linux:' "$serial"
        sed -n '/stagectl after the demo/,/stagevm-linux: done/p' "$serial"
        grep -a 'stagevm:   stage ' "$vmmlog" || true
    else
        echo "user space: not reached"
    fi
} | tee "$result"
[ -n "$userspace" ] && [ "$code" -eq 0 ]
