#!/usr/bin/env bash
# Self-test of the stgtrace tool on a small program with a known call
# structure (selftest/staged.c): checks the stage-marker rule (entries per
# stage, longjmp unwinding), that the trace's instruction count equals the
# tool's inline counter, and that it equals lackey's count of the same program.
# Also checks resolve_stages.py: symbols come from .dynsym (-rdynamic) or
# .symtab (not stripped), and a stage symbol that does not resolve (a name
# the program lacks, or a stripped build without -rdynamic) is an error that
# names it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$ROOT/target/capture-build/selftest"
mkdir -p "$BUILD"
VALGRIND_LIB="$("$ROOT/discover/stgtrace/build_tool.sh")"; export VALGRIND_LIB
CFLAGS=(-O1 -fno-inline -fno-optimize-sibling-calls)
gcc "${CFLAGS[@]}" -rdynamic -o "$BUILD/staged" "$HERE/selftest/staged.c"
# the same without -rdynamic: stage functions only in .symtab, and stripped (-s): nowhere
gcc "${CFLAGS[@]}" -o "$BUILD/staged-symtab" "$HERE/selftest/staged.c"
gcc "${CFLAGS[@]}" -s -o "$BUILD/staged-stripped" "$HERE/selftest/staged.c"
python3 "$HERE/resolve_stages.py" "$HERE/selftest/staged-stages.toml" "$BUILD/staged" \
  --table "$BUILD/stages.tbl" --json "$BUILD/stages.json"
rm -f "$BUILD/fifo"; mkfifo "$BUILD/fifo"
zstd -q -T1 -3 -f -o "$BUILD/staged.strace.zst" <"$BUILD/fifo" &
zp=$!
if ! valgrind --log-file="$BUILD/vg.log" --tool=stgtrace --out="$BUILD/fifo" --stages="$BUILD/stages.tbl" --exe=staged \
  --start-on=yes --stats-file="$BUILD/tool.stats" "$BUILD/staged" >/dev/null; then
  echo "selftest.sh: valgrind --tool=stgtrace failed; end of $BUILD/vg.log:" >&2
  tail -5 "$BUILD/vg.log" >&2
  kill "$zp" 2>/dev/null || true
  exit 1
fi
wait $zp
python3 "$HERE/trace_stats.py" --json "$BUILD/stats.json" "$BUILD/staged.strace.zst" >/dev/null
if ! lackey_log=$(valgrind --tool=lackey "$BUILD/staged" 2>&1 >/dev/null); then
  echo "selftest.sh: valgrind --tool=lackey failed:" >&2
  printf '%s\n' "$lackey_log" | tail -5 >&2
  exit 1
fi
lackey=$(printf '%s\n' "$lackey_log" | sed -n 's/.*guest instrs: *\([0-9,]*\).*/\1/p' | tr -d ,)
[ -n "$lackey" ] || { echo "selftest.sh: no 'guest instrs' count in lackey's output" >&2; exit 1; }
python3 - "$BUILD/stats.json" "$BUILD/tool.stats" "$lackey" "$HERE" "$BUILD" <<'PY'
import json, os, subprocess, sys
d = json.load(open(sys.argv[1]))
tool = dict((k.strip(), int(v)) for k, v in (l.split("=") for l in open(sys.argv[2]) if "=" in l))
lackey = int(sys.argv[3])
here, build = sys.argv[4], sys.argv[5]


def resolve(stage_map, binary, tag):
    """Runs resolve_stages.py: (exit status, stderr, table lines, JSON or None)."""
    tbl, js = f"{build}/{tag}.tbl", f"{build}/{tag}.json"
    for f in (tbl, js):
        if os.path.exists(f):
            os.remove(f)
    p = subprocess.run([sys.executable, f"{here}/resolve_stages.py", f"{here}/selftest/{stage_map}",
                        f"{build}/{binary}", "--table", tbl, "--json", js], capture_output=True, text=True)
    lines = [l for l in open(tbl) if not l.startswith("#")] if os.path.exists(tbl) else []
    return p.returncode, p.stderr, lines, json.load(open(js)) if os.path.exists(js) else None


def tables(js):
    return sorted({f.get("table") for s in (js or {}).get("stages", []) for f in s["functions"]})


def last_line(err):
    return (err.strip().splitlines() or [""])[-1]


rc_dyn, _, tbl_dyn, js_dyn = resolve("staged-stages.toml", "staged", "resolve-dynsym")
rc_sym, err_sym, tbl_sym, js_sym = resolve("staged-stages.toml", "staged-symtab", "resolve-symtab")
rc_mis, err_mis, tbl_mis, js_mis = resolve("missing-stages.toml", "staged", "resolve-missing")
rc_str, err_str, tbl_str, js_str = resolve("staged-stages.toml", "staged-stripped", "resolve-stripped")
for name, rc, err in (("missing symbol", rc_mis, err_mis), ("stripped build", rc_str, err_str)):
    print(f"     resolve_stages.py on the {name}: exit {rc}: {last_line(err)}")
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
    ("resolve -rdynamic build: 4 functions, all from .dynsym", (rc_dyn, len(tbl_dyn), tables(js_dyn)),
     (0, 4, [".dynsym"])),
    ("resolve build without -rdynamic: 4 functions, all from .symtab", (rc_sym, len(tbl_sym), tables(js_sym)),
     (0, 4, [".symtab"])),
    ("resolve map naming a missing symbol: exit 1, no table, message names it",
     (rc_mis, tbl_mis, "stage_does_not_exist" in last_line(err_mis), "stage_b (" in last_line(err_mis)),
     (1, [], True, False)),
    ("resolve stripped build without -rdynamic: exit 1, message names all 4 and hints -rdynamic",
     (rc_str, tbl_str, all(f"stage_{s} (" in last_line(err_str) for s in ("a", "b", "c", "jump")),
      "-rdynamic" in last_line(err_str)),
     (1, [], True, True)),
]
passed = failed = 0
for name, got, want in checks:
    ok = got == want
    passed += ok; failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {got} (expected {want})")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
