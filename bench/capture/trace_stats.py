#!/usr/bin/env python3
"""Quick statistics of a "stagetrace v1" trace (.strace.zst).

    python3 bench/capture/trace_stats.py TRACE.strace.zst [--json OUT] [--pure]
                                          [--max-records N]

Prints per-stage and per-thread instructions, blocks (FETCH records), loads,
stores, stage entries and code footprint (distinct 64-byte instruction
lines).  By default the stream is decoded by the C twin trace_stats.c
(compiled on demand into target/capture-build/, ~40x faster); --pure decodes
in Python (reference implementation, same numbers; use --max-records on big
traces).  Decompression uses the zstd command.
"""

import argparse
import json
import os
import struct
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "target", "capture-build")
NO_STAGE = 0xFFFF


def c_binary():
    exe = os.path.join(BUILD, "trace_stats")
    src = os.path.join(HERE, "trace_stats.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(BUILD, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    return exe


class Acc:
    __slots__ = ("instrs", "fetches", "loads", "stores", "entries", "lines")

    def __init__(self):
        self.instrs = self.fetches = self.loads = self.stores = self.entries = 0
        self.lines = set()


def pure(path, max_records=None):
    zp = subprocess.Popen(["zstd", "-dcq", path], stdout=subprocess.PIPE)
    f = zp.stdout
    if f.read(8) != b"STGTRC01":
        raise SystemExit("bad magic")
    consumed = 8
    threads, stages, order = {}, {}, []
    cur_stage = {}
    tid = None
    t = None
    tot = dict(instructions=0, fetch_records=0, load_records=0, store_records=0, stage_records=0, thread_records=0)
    ended = False
    buf = b""
    pos = 0
    nrec = 0
    LEN = {1: 5, 2: 13, 3: 10, 4: 10, 5: 3, 6: 1}
    u32, fetch, u16 = (
        struct.Struct("<I").unpack_from,
        struct.Struct("<QHH").unpack_from,
        struct.Struct("<H").unpack_from,
    )
    while True:
        if len(buf) - pos < 16:
            chunk = f.read(1 << 20)
            buf = buf[pos:] + chunk
            pos = 0
            if not buf:
                break
        tag = buf[pos]
        n = LEN.get(tag)
        if n is None:
            raise SystemExit(f"bad tag {tag:#x} at byte {consumed}")
        if len(buf) - pos < n:
            break  # truncated
        if tag == 2:
            a, by, ins = fetch(buf, pos + 1)
            s = stages.setdefault(cur_stage[tid], Acc())
            tot["fetch_records"] += 1
            tot["instructions"] += ins
            t.fetches += 1
            t.instrs += ins
            s.fetches += 1
            s.instrs += ins
            if by:
                s.lines.update(range(a >> 6, ((a + by - 1) >> 6) + 1))
        elif tag == 3 or tag == 4:
            s = stages.setdefault(cur_stage[tid], Acc())
            if tag == 3:
                tot["load_records"] += 1
                t.loads += 1
                s.loads += 1
            else:
                tot["store_records"] += 1
                t.stores += 1
                s.stores += 1
        elif tag == 1:
            tid = u32(buf, pos + 1)[0]
            tot["thread_records"] += 1
            if tid not in threads:
                threads[tid] = Acc()
                order.append(tid)
                cur_stage[tid] = NO_STAGE
            t = threads[tid]
        elif tag == 5:
            st = u16(buf, pos + 1)[0]
            tot["stage_records"] += 1
            if st != cur_stage[tid]:
                stages.setdefault(st, Acc()).entries += 1
                t.entries += 1
            cur_stage[tid] = st
        else:
            ended = True
            consumed += n
            break
        pos += n
        consumed += n
        nrec += 1
        if max_records and nrec >= max_records:
            break
    zp.kill()
    zp.wait()
    out = dict(bytes=consumed, **tot, thread_count=len(threads), end=ended)
    out["stages"] = {
        str(k): dict(
            instructions=v.instrs,
            blocks=v.fetches,
            loads=v.loads,
            stores=v.stores,
            entries=v.entries,
            code_lines=len(v.lines),
        )
        for k, v in sorted(stages.items())
    }
    out["threads"] = {
        str(k): dict(
            instructions=threads[k].instrs,
            blocks=threads[k].fetches,
            loads=threads[k].loads,
            stores=threads[k].stores,
            stage_switches=threads[k].entries,
        )
        for k in order
    }
    return out


def show(d, name, stage_names):
    n = d["instructions"] or 1
    print(
        f"{name}: {d['bytes']} bytes, {d['instructions']} instructions, {d['fetch_records']} FETCH "
        f"({d['instructions'] / max(d['fetch_records'], 1):.2f} instrs/block), {d['load_records']} LOAD, "
        f"{d['store_records']} STORE, {d['stage_records']} STAGE, {d['thread_records']} THREAD records, "
        f"{d['thread_count']} threads, END {'yes' if d['end'] else 'NO'}"
    )
    print(
        f"{'stage':<18} {'instructions':>14} {'share':>7} {'blocks':>12} {'loads':>12} {'stores':>12} "
        f"{'entries':>10} {'code KiB':>9}"
    )
    for k, v in d["stages"].items():
        nm = "none" if int(k) == NO_STAGE else f"{k} {stage_names.get(int(k), '')}"
        print(
            f"{nm:<18} {v['instructions']:>14} {100 * v['instructions'] / n:>6.2f}% {v['blocks']:>12} "
            f"{v['loads']:>12} {v['stores']:>12} {v['entries']:>10} {v['code_lines'] * 64 / 1024:>9.1f}"
        )
    print(
        f"{'thread':<18} {'instructions':>14} {'share':>7} {'blocks':>12} {'loads':>12} {'stores':>12} "
        f"{'stage sw.':>10}"
    )
    for k, v in d["threads"].items():
        print(
            f"{k:<18} {v['instructions']:>14} {100 * v['instructions'] / n:>6.2f}% {v['blocks']:>12} "
            f"{v['loads']:>12} {v['stores']:>12} {v['stage_switches']:>10}"
        )


def stage_names_for(path):
    names = {}
    side = path + ".stages.toml"
    if os.path.exists(side):
        import tomllib

        with open(side, "rb") as f:
            for st in tomllib.load(f).get("stage", []):
                names[st["id"]] = st["name"]
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--json", help="write the statistics as JSON")
    ap.add_argument("--pure", action="store_true", help="decode in Python")
    ap.add_argument("--max-records", type=int, help="(with --pure) stop after N records")
    a = ap.parse_args()
    if a.pure:
        d = pure(a.trace, a.max_records)
    else:
        exe = c_binary()
        tmp = a.json or os.path.join(BUILD, "trace_stats.last.json")
        zp = subprocess.Popen(["zstd", "-dcq", a.trace], stdout=subprocess.PIPE)
        r = subprocess.run(
            [exe, "--json", tmp, "--name", os.path.basename(a.trace)], stdin=zp.stdout, stdout=subprocess.DEVNULL
        )
        zp.stdout.close()
        zp.wait()
        if r.returncode not in (0, 3):
            raise SystemExit(f"trace_stats failed ({r.returncode})")
        with open(tmp) as f:
            d = json.load(f)
    show(d, os.path.basename(a.trace), stage_names_for(a.trace))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(d, f, indent=1)


if __name__ == "__main__":
    main()
