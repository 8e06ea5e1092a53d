#!/usr/bin/env bash
# `just bench-sim`: the cache-simulator benchmark of issue 7, end to end.
#
#   1. a synthetic trace (sanity check of the model),
#   2. the traces in target/traces/ (captured by bench/capture/capture.sh once,
#      then reused; STAGESIM_CAPTURE=0 skips even trying to capture):
#      every trace: baseline, pinned, static, proportional × 2/4/8/16 cores ×
#      slices 10 000/100 000/1 000 000 (the acceptance rows are 4 and 8 cores,
#      slice 100 000), plus plots;
#      footprint-host also a migration-cost sweep up to sched_setaffinity's cost;
#      MariaDB traces also: stage-visit statistics, automatic stage discovery
#      (stagesim discover), a migration-cost × stage-grouping sweep, the seeds'
#      256 KiB L2; the read-only trace also the model variants (load weights,
#      idle stealing, min-visit),
#   3. the stagesim section of bench/RESULTS.md (stagesim results), and copies
#      of the key plots to bench/stagesim/plots/.
#
# Replays run one at a time (--jobs ${STAGESIM_JOBS:-1}); ~20 minutes on a
# 2-core AMD EPYC. While a `headline-bench` process runs, it waits before each
# replay so the two benchmarks do not share the machine. Extra arguments go to
# the main `stagesim replay` of every trace (e.g. --cores 4,8).
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo build --release -q -p stagesim
sim=target/release/stagesim
out=target/stagesim
jobs="${STAGESIM_JOBS:-1}"
mkdir -p "$out/plots" bench/stagesim/plots
: >"$out/commands.txt"

# The stage grouping issue 7's follow-up asked for (MariaDB stage names from
# bench/capture/mariadb-stages.toml): 4 groups instead of 9 stages.
G4="front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send"

quiet() {
    while pgrep -x headline-bench >/dev/null 2>&1; do
        echo "bench-sim: headline-bench is running; waiting 30 s" >&2
        sleep 30
    done
}
# Runs a command and logs it (for the RESULTS.md section).
run() {
    quiet
    local a line=""
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:,=+-]+$ ]]; then line+="$a "; else line+="'$a' "; fi
    done
    echo "${line% }" >>"$out/commands.txt"
    "$@"
}

{
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs," \
        "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr);" \
        "run $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
        "$(git diff --quiet HEAD -- bench/stagesim 2>/dev/null || echo '(bench/stagesim modified)');" \
        "replays one at a time (--jobs $jobs)."
} >"$out/env.txt"

started=$(date +%s)
run "$sim" synth --out "$out/synth.stz" --visit-weights 2,1,1,1
run "$sim" replay --trace "$out/synth.stz" --json "$out/synth.json" --jobs "$jobs"
run "$sim" plot --json "$out/synth.json" --out-dir "$out/plots"

if [ -x bench/capture/capture.sh ] && [ "${STAGESIM_CAPTURE:-1}" != 0 ]; then
    bench/capture/capture.sh || echo "bench-sim: capture failed; replaying cached traces only" >&2
fi

shopt -s nullglob
names=()
for t in target/traces/mariadb-*.strace.zst target/traces/footprint-host.strace.zst; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .strace.zst)
    names+=("$name")
    side=()
    if [ ! -f "$t.stages.toml" ] && [ -f "target/traces/$name.stages.toml" ]; then
        side=(--sidecar "target/traces/$name.stages.toml")
    fi
    run "$sim" replay --trace "$t" "${side[@]}" --json "$out/$name.json" --jobs "$jobs" "$@"
    run "$sim" plot --json "$out/$name.json" --out-dir "$out/plots"
    if [ "$name" = footprint-host ]; then
        # The workload built for staging: which migration costs does it tolerate?
        run "$sim" replay --trace "$t" "${side[@]}" --cores 2,4 --slice 100000 --policy baseline,static,proportional \
            --migration-cycles 0,4000,35000,100000,300000 --jobs "$jobs" --json "$out/$name-sweep.json"
        run "$sim" plot --sweep --json "$out/$name-sweep.json" --out-dir "$out/plots"
    fi
    case "$name" in mariadb-*) ;; *) continue ;; esac

    # Automatic stage discovery: greedy merging of the 9 stages, scored by
    # busy cycles per instruction with free migrations (the caches alone).
    run "$sim" discover --trace "$t" --cores 4 --migration-cycles 0 --prefix-pct 20 \
        --out "$out/$name-discover.txt" --json "$out/$name-discover.json"
    D4=$(awk -F'\t' '$1 == 4 { print $2 }' "$out/$name-discover.txt")
    groups=(--stage-groups - --stage-groups "$G4")
    [ -n "$D4" ] && groups+=(--stage-groups "$D4")

    run "$sim" stats --trace "$t" "${groups[@]}" --json "$out/$name-stats.json" >/dev/null
    run "$sim" replay --trace "$t" --cores 4,8 --slice 100000 --policy baseline,static,proportional \
        --migration-cycles 0,500,1000,4000,35000 "${groups[@]}" --jobs "$jobs" --json "$out/$name-sweep.json"
    run "$sim" plot --sweep --json "$out/$name-sweep.json" --out-dir "$out/plots"
    run "$sim" replay --trace "$t" --cores 4 --slice 100000 --l2 256:8 --migration-cycles 0,4000 \
        --stage-groups - --stage-groups "$G4" --jobs "$jobs" --json "$out/$name-l2-256.json"
    if [ "$name" = mariadb-oltp_read_only ]; then
        run "$sim" replay --trace "$t" --cores 4 --slice 100000 --policy baseline,static,proportional \
            --static-weights equal,load --steal off,on --migration-cycles 0,4000 \
            --stage-groups - --stage-groups "$G4" --jobs "$jobs" --json "$out/$name-variants.json"
        run "$sim" replay --trace "$t" --cores 4 --slice 100000 --policy baseline,static,proportional \
            --min-visit 2000,10000 --visit-rule oracle --migration-cycles 4000 \
            --stage-groups - --stage-groups "$G4" --jobs "$jobs" --json "$out/$name-variants-oracle.json"
        run "$sim" replay --trace "$t" --cores 4 --slice 100000 --policy baseline,static,proportional \
            --min-visit 2000,10000 --visit-rule history --migration-cycles 4000 \
            --stage-groups - --stage-groups "$G4" --jobs "$jobs" --json "$out/$name-variants-history.json"
    fi
done

# Key plots, small enough to commit.
for p in mariadb-oltp_read_only-l2i-mpki mariadb-oltp_read_only-sweep-cpu; do
    [ -f "$out/plots/$p.png" ] && cp "$out/plots/$p.png" bench/stagesim/plots/
done
echo "Total time of this run: $(( ($(date +%s) - started + 30) / 60 )) min." >>"$out/env.txt"

list=$(IFS=,; echo "${names[*]}")
notes=()
[ -f bench/stagesim/RESULTS-notes.md ] && notes=(--notes bench/stagesim/RESULTS-notes.md)
"$sim" results --dir "$out" --traces "$list" --out bench/RESULTS.md "${notes[@]}"
