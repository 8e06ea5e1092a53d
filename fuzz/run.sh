#!/usr/bin/env bash
# `just fuzz`: every fuzz target of fuzz/ (stagevm-fuzz) for STAGEVM_FUZZ_CASES
# cases (default 1,000,000 each), in debug mode (overflow checks, as CI builds)
# and in release mode (wrapping arithmetic), then a table: target, cases, mode,
# seconds, crashes, slowest case. Fails on a crash or a case slower than 1 s
# (a hang). A failing target's log (bolero's input and BOLERO_RANDOM_SEED to
# reproduce it) is printed. Extra arguments go to the test binary (e.g. a
# target name to run only that one).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
cases="${STAGEVM_FUZZ_CASES:-1000000}"
report="$(mktemp)"
trap 'rm -f "$report" "$report.log"' EXIT
failed=0
begin=$SECONDS
for mode in debug release; do
    flag=()
    [ "$mode" = release ] && flag=(--release)
    cargo build -q "${flag[@]}" -p stagevm-fuzz --tests || exit 1
    echo "fuzz: $mode, $cases cases per target ..." >&2
    if ! STAGEVM_FUZZ_CASES="$cases" STAGEVM_FUZZ_REPORT="$report" RUST_BACKTRACE=0 \
        cargo test -q "${flag[@]}" -p stagevm-fuzz --test targets -- --test-threads 2 "$@" \
        >"$report.log" 2>&1; then
        failed=1
        sed -n '/^failures:$/,$p' "$report.log" | head -n 200
    fi
done
echo
printf '%-16s %9s %-8s %8s %8s %17s\n' target cases mode seconds crashes "slowest case (s)"
awk '$1 == "fuzz-result" { printf "%-16s %9d %-8s %8.1f %8d %17.3f%s\n", $2, $3, $4, $5, $6, $7 / 1e6, ($7 >= 1e6 ? "  HANG?" : "") }' \
    "$report" | sort -k3,3 -k1,1
awk '$1 == "fuzz-result" && ($6 > 0 || $7 >= 1e6) { bad = 1 } END { exit bad }' "$report" || failed=1
echo "fuzz: $((SECONDS - begin)) s in all (builds included)"
exit "$failed"
