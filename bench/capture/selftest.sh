#!/usr/bin/env bash
# Self-test of the stgtrace tool on a small program with a known call
# structure (selftest/staged.c): checks the stage-marker rule (entries per
# stage, longjmp unwinding), that the trace's instruction count equals the
# tool's inline counter, and that it equals lackey's count of the same program.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$ROOT/target/capture-build/selftest"
mkdir -p "$BUILD"
VALGRIND_LIB="$("$HERE/build_tool.sh")"; export VALGRIND_LIB
gcc -O1 -fno-inline -fno-optimize-sibling-calls -rdynamic -o "$BUILD/staged" "$HERE/selftest/staged.c"
python3 "$HERE/resolve_stages.py" "$HERE/selftest/staged-stages.toml" "$BUILD/staged" \
  --table "$BUILD/stages.tbl" --json "$BUILD/stages.json" 2>/dev/null
rm -f "$BUILD/fifo"; mkfifo "$BUILD/fifo"
zstd -q -T1 -3 -f -o "$BUILD/staged.strace.zst" <"$BUILD/fifo" &
zp=$!
valgrind --log-file="$BUILD/vg.log" --tool=stgtrace --out="$BUILD/fifo" --stages="$BUILD/stages.tbl" --exe=staged \
  --start-on=yes --stats-file="$BUILD/tool.stats" "$BUILD/staged" >/dev/null
wait $zp
python3 "$HERE/trace_stats.py" --json "$BUILD/stats.json" "$BUILD/staged.strace.zst" >/dev/null
lackey=$(valgrind --tool=lackey "$BUILD/staged" 2>&1 >/dev/null | sed -n 's/.*guest instrs: *\([0-9,]*\).*/\1/p' | tr -d ,)
python3 - "$BUILD/stats.json" "$BUILD/tool.stats" "$lackey" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
tool = dict((k.strip(), int(v)) for k, v in (l.split("=") for l in open(sys.argv[2]) if "=" in l))
lackey = int(sys.argv[3])
st = d["stages"]
ent = lambda s: st.get(str(s), {}).get("entries", 0)
checks = [
    ("stage a entries (100 calls + 300 returns from b + 100 from c)", ent(0), 500),
    ("stage b entries", ent(1), 300),
    ("stage c entries (recursion adds none)", ent(2), 100),
    ("stage jump entries", ent(3), 1),
    ("no-stage entries (100 returns from a + 1 after longjmp)", ent(65535), 101),
    ("trace instructions == tool inline counter", d["instructions"], tool["window_instructions_inline_counter"]),
    ("trace instructions == lackey guest instrs", d["instructions"], lackey),
    ("END record present", d["end"], True),
]
passed = failed = 0
for name, got, want in checks:
    ok = got == want
    passed += ok; failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {got} (expected {want})")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
