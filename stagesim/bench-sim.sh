#!/usr/bin/env bash
# `just bench-sim`: the cache-simulator benchmark of issue 7, end to end.
#
#   1. a synthetic trace (sanity check of the model),
#   2. the traces in target/traces/ (captured by bench/capture/capture.sh once,
#      then reused; STAGESIM_CAPTURE=0 skips even trying to capture, and
#      stagevm-discover's whole path on oltp_read_only, its map and report
#      in target/stagesim/mariadb-oltp_read_only{.stagemap,-discover.txt}):
#      footprint-host: every model × 2/4/8/16 cores × slices 10 000/100 000/
#      1 000 000 and a migration-cost sweep up to sched_setaffinity's cost;
#      MariaDB traces (issue 16): automatic stage discovery (stagesim
#      discover), stage-visit statistics, then every model (baseline,
#      captured, pinned, static, proportional, auto) at 2/4/8 cores, slice
#      100 000, the hand map and the discovered 4 groups, 1700 (measured) and
#      4250 (seed) cycles per migration, with 512 and 256 KiB L2; the baseline
#      with 4 more seeds and as it was before issue 16 (lockstep); baseline
#      and auto over 4 laps of the trace; the independent simulation of the
#      captured order (bench/capture/cachesim.c);
#      a migration-cost × grouping sweep at 4 cores (the two OLTP traces);
#      issue 25's verdict on every MariaDB trace (TPC-C too): seed 004's
#      request-level discovery, then the hand and the discovered map under
#      static, proportional and auto at 4/6/8 cores × L2 512/256 KiB × three
#      migration mechanisms, with the cross-core transfer cost,
#   3. the stagesim section of bench/RESULTS.md (stagesim results), and copies
#      of the key plots to stagesim/plots/.
#
#   `--temporal` (or STAGESIM_PART=temporal) runs issue 40's part alone
#   instead: temporal staging (visit orders) beside spatial on the MariaDB
#   traces, written to its own section of bench/RESULTS.md (see temporal()).
#
# Replays run two at a time, one per core of the project's 2-core machine
# (--jobs ${STAGESIM_JOBS:-2}; nothing else may run). While a `headline-bench` process runs, it waits before each
# replay so the two benchmarks do not share the machine. Extra arguments go to
# the main `stagesim replay` of every trace (e.g. --cores 4,8).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${STAGESIM_PART:-all}
if [ "${1:-}" = --temporal ]; then
    part=temporal
    shift
fi

cargo build --release -q -p stagesim
sim=target/release/stagesim
out=target/stagesim
mkdir -p "$out"
cc -O2 -o "$out/cachesim" bench/capture/cachesim.c
jobs="${STAGESIM_JOBS:-2}"
mkdir -p "$out/plots" stagesim/plots
log="$out/commands.txt"
[ "$part" = temporal ] && log="$out/temporal-commands.txt"
: >"$log"

# The stage grouping issue 7's follow-up asked for (MariaDB stage names from
# bench/capture/mariadb-stages.toml): 4 groups instead of 9 stages.
G4="front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send"

quiet() {
    while pgrep -x headline-bench >/dev/null 2>&1; do
        echo "bench-sim: headline-bench is running; waiting 30 s" >&2
        sleep 30
    done
}
# Runs a command with its stdout to file $1, and logs it.
run_to() {
    local file=$1
    shift
    quiet
    echo "$* > ${file#"$PWD"/}" >>"$log"
    "$@" >"$file"
}
# Runs a command and logs it (for the RESULTS.md section).
run() {
    quiet
    local a line=""
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:,=+-]+$ ]]; then line+="$a "; else line+="'$a' "; fi
    done
    echo "${line% }" >>"$log"
    "$@"
}

# Appends the `stagesim replay` options "$@" (after the batch file $1) as
# one line of that batch file (`stagesim replay-batch`: the trace is
# loaded once for all of its lines) and logs the line as the replay it is.
add() {
    local file=$1
    shift
    echo "$*" >>"$file"
    echo "$sim replay $* (one line of $(basename "$file"))" >>"$log"
}

# The model of issues 7 and 16: a migration's whole cost on the source core,
# no latency, no transfers (what the older sections below measure).
OLD=(--migration-target-cycles 0 --migration-latency 0)

# Issue 25, the verdict: seed 004's request-level discovery on the trace
# (function entries of mariadbd), then the hand map and the discovered map
# under static, proportional and auto at 4/6/8 cores, L2 512/256 KiB and
# three migration mechanisms (stagesim/src/results/verdict.rs), with
# the cross-core transfer cost.
XFER=(--transfer-cycles 150)
MECH_unikernel=(--migration-cycles 500 --migration-target-cycles 500 --migration-latency 1700)
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in verdict()
MECH_seed000=(--migration-cycles 500 --migration-target-cycles 500 --migration-latency 3250)
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in verdict()
MECH_linux=(--migration-cycles 25000 --migration-target-cycles 0 --migration-latency 0)
MARIADBD=${MARIADBD:-/usr/sbin/mariadbd}
verdict() {
    local t=$1 name=$2 l2 mech map maps
    local batch="$out/$name-verdict.batch"
    : >"$batch"
    if [ ! -x "$MARIADBD" ]; then
        echo "bench-sim: $MARIADBD missing: no request-level discovery for $name" >&2
    else
        run "$sim" discover --trace "$t" --binary "$MARIADBD" --cores 4 "${MECH_unikernel[@]}" "${XFER[@]}" \
            --prefix-pct 20 --map-out "$out/$name-points" --json "$out/$name-points.json"
        # The discovered map through the Linux agent's own parser (issue 25).
        if [ -x target/linux-agent/stagectl/stagectl ] && [ -f "$out/$name-points-best.stagemap" ]; then
            run_to "$out/$name-points-best.stagectl.txt" target/linux-agent/stagectl/stagectl \
                --map-file "$out/$name-points-best.stagemap"
        fi
    fi
    # The independent simulation of the captured order, and stagesim's.
    run_to "$out/$name-cachesim.json" "$out/cachesim" --json "$t"
    run_to "$out/$name-cachesim-256.json" "$out/cachesim" --l2 256:8 --json "$t"
    run "$sim" replay --trace "$t" --policy captured --cores 1 --json "$out/$name-verdict-captured.json"
    for l2 in 512 256; do
        # shellcheck disable=SC2054 # comma lists (--cores 2,4,8) are single arguments, as on the add lines
        local v=(--trace "$t" --cores 4,6,8 --slice 100000 --l2 "$l2:8" "${XFER[@]}" --jobs "$jobs"
            --static-weights load)
        add "$batch" "${v[@]}" --policy baseline,pinned --json "$out/$name-verdict-$l2-base.json"
        add "$batch" "${v[@]}" --policy baseline,pinned --repeat 2 --json "$out/$name-verdict-$l2-base2.json"
        for mech in unikernel seed000 linux; do
            local ref="MECH_${mech}[@]"
            local m=("${!ref}")
            maps=(hand)
            [ -f "$out/$name-points-best.stagemap" ] && maps+=(points)
            for map in "${maps[@]}"; do
                local sm=()
                [ "$map" = points ] && sm=(--stage-map "$out/$name-points-best.stagemap" --binary "$MARIADBD")
                add "$batch" "${v[@]}" "${m[@]}" "${sm[@]}" --policy static,proportional \
                    --json "$out/$name-verdict-$l2-$mech-$map.json"
                add "$batch" "${v[@]}" "${m[@]}" "${sm[@]}" --policy auto --repeat 2 \
                    --json "$out/$name-verdict-$l2-$mech-$map-auto.json"
            done
        done
    done
    run "$sim" replay-batch "$batch"
}

# Issue 40: temporal staging (visit orders of OS threads) beside spatial on
# the MariaDB traces. Per trace and L2 (256, 512, 2048 KiB): the references
# (baseline, pinned, pinned with idle stealing) at 2/4/6/8 cores; per map —
# the hand map, the request-level map `discover --binary` scores best for
# spatial staging (`best`) and the one it scores best for temporal staging
# (`tbest`, up to 6 stages) — and mechanism (results/temporal.rs documents
# each cost): temporal (pinned, stealing, a visit policy), spatial (static)
# and both (static with SRPT); auto trialling all four modes over $TLAPS
# whole laps at 4 cores; and a switch-cost sweep at 4 cores. Cut to fit the
# hour on one job (the section says so): the grid replays the first $TPCT % (default 25)
# of each trace in replay order (STAGESIM_TEMPORAL_PCT; auto and its
# references run whole laps); all five visit policies at 4 cores only, and
# not on `tbest`; the sched_ext and Linux mechanisms with SRPT only, not at
# 512 KiB; `both` with SRPT and the unikernel; auto and the sweep at 256
# KiB and 2 MiB; auto on the hand and `best` maps, the sweep on `best` and
# `tbest`; discovery on $TDISC_PCT % of every thread (default 5). The run of
# 2026-11-28 (bench/RESULTS.md) took 42 min on one job: read-only with
# P = 50, D = 10 (18 min), read-write and TPC-C with the defaults.
SW_unikernel=163
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in temporal_trace()
SW_scx=2000
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in temporal_trace()
SW_linux=3500
TMECH_unikernel=(--migration-cycles 500 --migration-target-cycles 500 --migration-latency 1700)
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in temporal_trace()
TMECH_scx=(--migration-cycles 25000 --migration-target-cycles 0 --migration-latency 0)
# shellcheck disable=SC2034 # read by name (${!ref}, ${!sw}) in temporal_trace()
TMECH_linux=(--migration-cycles 25000 --migration-target-cycles 0 --migration-latency 0)
TPCT=${STAGESIM_TEMPORAL_PCT:-25}
TLAPS=${STAGESIM_TEMPORAL_LAPS:-4}
TDISC_PCT=${STAGESIM_TEMPORAL_DISCOVER_PCT:-5}
temporal_trace() {
    local t=$1 name=$2 l2 map mech
    local batch="$out/$name-temporal.batch"
    : >"$batch"
    # Each trace's commands apart: a later invocation that skips a done
    # trace keeps them for the section.
    log="$out/$name-temporal-commands.txt"
    : >"$log"
    if [ ! -f "$out/$name-points-best.stagemap" ] && [ -x "$MARIADBD" ]; then
        run "$sim" discover --trace "$t" --binary "$MARIADBD" --cores 4 "${MECH_unikernel[@]}" "${XFER[@]}" \
            --prefix-pct "$TDISC_PCT" --map-out "$out/$name-points" --json "$out/$name-points.json"
    fi
    # Maps scored by the temporal replay (SRPT, the unikernel's switch):
    # finer choices allowed (up to 6 stages, each ≥ 5 % of a request).
    if [ "${STAGESIM_TEMPORAL_DISCOVER:-1}" != 0 ] && [ ! -f "$out/$name-tpoints-best.stagemap" ] \
        && [ -x "$MARIADBD" ]; then
        run "$sim" discover --trace "$t" --binary "$MARIADBD" --cores 4 --policy pinned --visit srpt \
            --switch-cycles "$SW_unikernel" "${TMECH_unikernel[@]}" "${XFER[@]}" --prefix-pct "$TDISC_PCT" \
            --keep 7 --max-parts 6 --min-stage-pct 5 --map-out "$out/$name-tpoints" --json "$out/$name-tpoints.json"
    fi
    local instrs=() laps=(--repeat "$TLAPS") total=""
    if [ "$TPCT" != 100 ]; then
        # The first line: `TRACE: N instructions, …` (read whole: no broken pipe).
        total=$("$sim" info --trace "$t" | sed -n '1s/.*: \([0-9][0-9]*\) instructions.*/\1/p')
        instrs=(--instrs $((total * TPCT / 100)))
    fi
    for l2 in 256 512 2048; do
        local v=(--trace "$t" --slice 100000 --l2 "$l2:8" "${XFER[@]}" --jobs "$jobs" --static-weights load)
        add "$batch" "${v[@]}" "${instrs[@]}" --cores 2,4,6,8 --policy baseline,pinned --steal off,on \
            --json "$out/$name-t$l2-ref.json"
        [ "$l2" != 512 ] && add "$batch" "${v[@]}" "${laps[@]}" --cores 4 --policy baseline,pinned --steal on \
            --json "$out/$name-t$l2-ref4.json"
        local maps=(hand)
        [ -f "$out/$name-points-best.stagemap" ] && maps+=(best)
        [ -f "$out/$name-tpoints-best.stagemap" ] && maps+=(tbest)
        for map in "${maps[@]}"; do
            local sm=()
            [ "$map" = best ] && sm=(--stage-map "$out/$name-points-best.stagemap" --binary "$MARIADBD")
            [ "$map" = tbest ] && sm=(--stage-map "$out/$name-tpoints-best.stagemap" --binary "$MARIADBD")
            for mech in unikernel scx linux; do
                [ "$mech" != unikernel ] && [ "$l2" = 512 ] && continue
                local ref="TMECH_${mech}[@]" sw="SW_$mech"
                local m=("${!ref}")
                local f="$out/$name-t$l2-$mech-$map"
                local tv=(--policy pinned --steal on --switch-cycles "${!sw}")
                local r=("${v[@]}" "${instrs[@]}" "${m[@]}" "${sm[@]}")
                case "$mech" in
                unikernel)
                    add "$batch" "${r[@]}" "${tv[@]}" --cores 2,4,6,8 --visit cohort,srpt --json "$f.json"
                    [ "$map" != tbest ] && add "$batch" "${r[@]}" "${tv[@]}" --cores 4 --visit dbr,mg1,color \
                        --json "$f-v.json"
                    add "$batch" "${r[@]}" --cores 2,4,6,8 --policy static --visit fifo,srpt \
                        --switch-cycles "${!sw}" --json "$f-s.json"
                    if [ "$l2" != 512 ] && [ "$map" != tbest ]; then
                        add "$batch" "${v[@]}" "${laps[@]}" "${m[@]}" "${sm[@]}" --cores 4 --policy auto \
                            --visit srpt --switch-cycles "${!sw}" --json "$f-auto.json"
                    fi
                    ;;
                scx)
                    add "$batch" "${r[@]}" "${tv[@]}" --cores 2,4,6,8 --visit srpt --json "$f.json"
                    ;;
                linux)
                    add "$batch" "${r[@]}" "${tv[@]}" --cores 2,4,6,8 --visit srpt --json "$f.json"
                    add "$batch" "${r[@]}" --cores 2,4,6,8 --policy static --json "$f-s.json"
                    ;;
                esac
            done
            if [ "$l2" != 512 ] && [ "$map" != hand ]; then
                add "$batch" "${v[@]}" "${instrs[@]}" "${TMECH_unikernel[@]}" "${sm[@]}" --cores 4 \
                    --policy pinned --steal on --visit srpt --switch-cycles 0,500,1000,2000,3500,6000,10000 \
                    --json "$out/$name-tsweep-$l2-$map.json"
            fi
        done
    done
    run "$sim" replay-batch "$batch"
}

temporal() {
    local started names=() t name
    started=$(date +%s)
    if [ -x bench/capture/capture.sh ] && [ "${STAGESIM_CAPTURE:-1}" != 0 ]; then
        bench/capture/capture.sh || echo "bench-sim: capture failed; replaying cached traces only" >&2
    fi
    shopt -s nullglob
    # A trace whose grid is done (its .done file holds the seconds it took)
    # is not replayed again unless STAGESIM_TEMPORAL_REDO=1: a trace
    # captured later joins the section without replaying the others.
    local secs=0 t0
    for t in target/traces/mariadb-*.strace.zst; do
        name=$(basename "$t" .strace.zst)
        names+=("$name")
        if [ "${STAGESIM_TEMPORAL_REDO:-0}" = 1 ] || [ ! -f "$out/$name-temporal.done" ]; then
            t0=$(date +%s)
            temporal_trace "$t" "$name"
            echo "$(( $(date +%s) - t0 )) $TPCT $TDISC_PCT" >"$out/$name-temporal.done"
        fi
        secs=$(( secs + $(cut -d' ' -f1 "$out/$name-temporal.done") ))
    done
    {
        echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs;" \
            "run $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
            "$(git diff --quiet HEAD -- stagesim 2>/dev/null || echo '(stagesim modified)');" \
            "replays $jobs at a time; each replay runs the first P % of its trace in replay order (\`auto\` and its references $TLAPS whole laps), discovery the first D % of every thread." \
            "Total replay and discovery time: $(( (secs + 30) / 60 )) min ($(for n in "${names[@]}"; do read -r sec p d <"$out/$n-temporal.done"; printf '%s: %s min, P = %s, D = %s; ' "${n#mariadb-}" $(( (sec + 30) / 60 )) "$p" "$d"; done | sed 's/; $//'))." \
            "This invocation: $(( ($(date +%s) - started + 30) / 60 )) min."
    } >"$out/temporal-env.txt"
    local list notes=()
    for name in "${names[@]}"; do
        cat "$out/$name-temporal-commands.txt" 2>/dev/null
    done >"$out/temporal-commands.txt"
    list=$(IFS=,; echo "${names[*]}")
    [ -f stagesim/RESULTS-temporal-notes.md ] && notes=(--notes stagesim/RESULTS-temporal-notes.md)
    "$sim" results --temporal --dir "$out" --traces "$list" --out bench/RESULTS.md "${notes[@]}"
}
if [ "$part" = temporal ]; then
    temporal
    exit 0
fi

{
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs," \
        "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr);" \
        "run $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
        "$(git diff --quiet HEAD -- stagesim 2>/dev/null || echo '(stagesim modified)');" \
        "replays $jobs at a time (--jobs $jobs)."
} >"$out/env.txt"

started=$(date +%s)
run "$sim" synth --out "$out/synth.stz" --visit-weights 2,1,1,1
run "$sim" replay --trace "$out/synth.stz" --migration-cycles 1700,4250 "${OLD[@]}" --json "$out/synth.json" --jobs "$jobs"
run "$sim" plot --json "$out/synth.json" --out-dir "$out/plots"

if [ -x bench/capture/capture.sh ] && [ "${STAGESIM_CAPTURE:-1}" != 0 ]; then
    bench/capture/capture.sh || echo "bench-sim: capture failed; replaying cached traces only" >&2
    # The operator's path on MariaDB (issue 41): stagevm-discover's capture,
    # discovery and report at this host's cores and L2, as README step 1.
    echo "bench/capture/capture.sh --discover-map $out --workloads oltp_read_only" >>"$out/commands.txt"
    bench/capture/capture.sh --discover-map "$out" --workloads oltp_read_only \
        || echo "bench-sim: stagevm-discover on MariaDB failed" >&2
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
    if [ "$name" = footprint-host ]; then
        run "$sim" replay --trace "$t" "${side[@]}" --migration-cycles 1700,4250 "${OLD[@]}" --json "$out/$name.json" \
            --jobs "$jobs" "$@"
        run "$sim" plot --json "$out/$name.json" --out-dir "$out/plots"
        # The workload built for staging: which migration costs does it tolerate?
        run "$sim" replay --trace "$t" "${side[@]}" "${OLD[@]}" --cores 2,4 --slice 100000 --policy baseline,static,proportional \
            --migration-cycles 0,1700,4250,35000,100000,300000 --jobs "$jobs" --json "$out/$name-sweep.json"
        run "$sim" plot --sweep --json "$out/$name-sweep.json" --out-dir "$out/plots"
        continue
    fi
    case "$name" in mariadb-*) ;; *) continue ;; esac
    verdict "$t" "$name"
    # The issue-16 matrices below are for the two OLTP traces.
    case "$name" in mariadb-oltp_*) ;; *) continue ;; esac

    # Automatic stage discovery: greedy merging of the 9 stages, scored by
    # busy cycles per instruction with free migrations (the caches alone).
    run "$sim" discover --trace "$t" --cores 4 --migration-cycles 0 "${OLD[@]}" --prefix-pct 20 \
        --out "$out/$name-discover.txt" --json "$out/$name-discover.json"
    D4=$(awk -F'\t' '$1 == 4 { print $2 }' "$out/$name-discover.txt")
    groups=(--stage-groups -)
    [ -n "$D4" ] && groups+=(--stage-groups "$D4")
    run "$sim" stats --trace "$t" "${groups[@]}" --stage-groups "$G4" --json "$out/$name-stats.json" >/dev/null

    # Issue 16: every model at 2/4/8 cores, both L2 sizes, both groupings,
    # the measured and the seed's migration cost; all in one batch (the
    # trace loaded once).
    batch="$out/$name-issue16.batch"
    : >"$batch"
    # shellcheck disable=SC2054 # comma lists (--cores 2,4,8) are single arguments, as on the add lines
    matrix=(--cores 2,4,8 --slice 100000 --policy baseline,captured,pinned,static,proportional,auto
        --migration-cycles 1700,4250 "${OLD[@]}" "${groups[@]}" --jobs "$jobs")
    add "$batch" --trace "$t" "${matrix[@]}" --json "$out/$name.json" "$@"
    add "$batch" --trace "$t" "${matrix[@]}" --l2 256:8 --json "$out/$name-l2-256.json" "$@"
    # The baseline is random: 4 more seeds; and as it was (fixed slices, no blocking).
    for seed in 2 3 4 5; do
        add "$batch" --trace "$t" --cores 2,4,8 --slice 100000 --policy baseline --seed "$seed" \
            --jobs "$jobs" --json "$out/$name-seed$seed.json"
        add "$batch" --trace "$t" --cores 2,4,8 --slice 100000 --policy baseline --seed "$seed" \
            --l2 256:8 --jobs "$jobs" --json "$out/$name-seed$seed-256.json"
    done
    add "$batch" --trace "$t" --cores 2,4,8 --slice 100000 --policy baseline --slice-jitter 0 --block-at - \
        --jobs "$jobs" --json "$out/$name-lockstep.json"
    add "$batch" --trace "$t" --cores 2,4,8 --slice 100000 --policy baseline --slice-jitter 0 --block-at - \
        --l2 256:8 --jobs "$jobs" --json "$out/$name-lockstep-256.json"
    # auto over 4 laps of the trace (its trials take a fixed number of policy
    # periods, which one 100-transaction window cannot amortize), with the
    # baseline of the same run.
    # shellcheck disable=SC2054 # comma lists (--cores 2,4,8) are single arguments, as on the add lines
    autorun=(--cores 2,4,8 --slice 100000 --policy baseline,auto --repeat 4 --migration-cycles 1700,4250 "${OLD[@]}"
        "${groups[@]}" --jobs "$jobs")
    add "$batch" --trace "$t" "${autorun[@]}" --json "$out/$name-auto.json"
    add "$batch" --trace "$t" "${autorun[@]}" --l2 256:8 --json "$out/$name-auto-256.json"
    # Migration cost × grouping at 4 cores.
    add "$batch" --trace "$t" --cores 4 --slice 100000 --policy baseline,static,proportional,auto "${OLD[@]}" \
        --migration-cycles 0,500,1700,4250,35000 "${groups[@]}" --stage-groups "$G4" --jobs "$jobs" \
        --json "$out/$name-sweep.json"
    run "$sim" replay-batch "$batch"
    run "$sim" plot --json "$out/$name.json" --out-dir "$out/plots"
    run "$sim" plot --sweep --json "$out/$name-sweep.json" --out-dir "$out/plots"
done

# Key plots, small enough to commit.
for p in mariadb-oltp_read_only-l2i-mpki mariadb-oltp_read_only-sweep-cpu; do
    [ -f "$out/plots/$p.png" ] && cp "$out/plots/$p.png" stagesim/plots/
done
echo "Total time of this run: $(( ($(date +%s) - started + 30) / 60 )) min." >>"$out/env.txt"

list=$(IFS=,; echo "${names[*]}")
notes=()
[ -f stagesim/RESULTS-notes.md ] && notes=(--notes stagesim/RESULTS-notes.md)
"$sim" results --dir "$out" --traces "$list" --out bench/RESULTS.md "${notes[@]}"
