#!/usr/bin/env bash
# Traces the headline's footprint workload built for the host (footprint-host)
# with the stgtrace tool: target/traces/footprint-host.strace.zst + sidecar.
# Arguments after the script go to footprint-host (defaults: 8 threads x 200
# requests, 2 stages, 1024 KiB of code, 400 calls, 512 data words).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$ROOT/target/capture-build/footprint"
OUT="$ROOT/target/traces/footprint-host.strace.zst"
mkdir -p "$BUILD" "$ROOT/target/traces"
command -v zstd >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zstd; }
VALGRIND_LIB="$("$ROOT/discover/stgtrace/build_tool.sh")"; export VALGRIND_LIB
echo "capture-footprint: building footprint-host" >&2
(cd "$ROOT" && cargo build --release -q -p stagevm-bench --bin footprint-host)
PROG="$ROOT/target/release/footprint-host"
python3 "$HERE/resolve_stages.py" "$HERE/footprint-stages.toml" "$PROG" \
  --table "$BUILD/stages.tbl" --json "$BUILD/stages.json" >/dev/null
rm -f "$BUILD/fifo"; mkfifo "$BUILD/fifo"
zstd -q -T1 -3 -f -o "$OUT" <"$BUILD/fifo" &
zp=$!
echo "capture-footprint: tracing footprint-host $* under stgtrace" >&2
start=$(date +%s)
valgrind --log-file="$BUILD/vg.log" --tool=stgtrace --out="$BUILD/fifo" --stages="$BUILD/stages.tbl" \
  --exe=footprint-host --start-on=yes --stats-file="$BUILD/tool.stats" "$PROG" "$@" >"$BUILD/checksums.txt"
wait $zp
echo "capture-footprint: traced in $(( $(date +%s) - start )) s; checking the trace" >&2
"$HERE/trace_stats.py" --json "$BUILD/stats.json" "$OUT" >/dev/null
python3 - "$BUILD/stats.json" "$BUILD/tool.stats" "$HERE/footprint-stages.toml" "$OUT" "$*" <<'PY'
import json, sys, tomllib
stats = json.load(open(sys.argv[1]))
tool = dict((k.strip(), int(v)) for k, v in (l.split("=") for l in open(sys.argv[2]) if "=" in l))
stages = tomllib.load(open(sys.argv[3], "rb"))["stage"]
inline = tool["window_instructions_inline_counter"]
ok = stats["instructions"] == inline
with open(sys.argv[4].removesuffix(".strace.zst") + ".stages.toml", "w") as f:
    f.write("# footprint-host trace (bench/capture/capture-footprint.sh)\n")
    f.write(f'workload = "footprint-host {sys.argv[5]}"\ntool = "stgtrace (valgrind)"\n')
    f.write(f"instructions = {stats['instructions']}\n\n")
    for s in stages:
        f.write(f'[[stage]]\nid = {s["id"]}\nname = "{s["name"]}"\nsymbols = {json.dumps(s["symbols"])}\n\n')
    f.write(f"[validation]\ntrace_instructions = {stats['instructions']}\n")
    f.write(f"tool_inline_counter = {inline}\ntrace_equals_inline_counter = {str(ok).lower()}\n")
print(f"capture-footprint: {stats['instructions']} instructions, inline counter {inline}: {'equal' if ok else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
PY
ls -la "$OUT"
