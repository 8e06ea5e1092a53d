#!/usr/bin/env python3
"""Count the TPC-C transaction mix in a stagetrace v1 trace of tpcc.lua.

    python3 bench/capture/tpcc_mix.py TRACE.strace.zst --sysbench-log LOG
                                      [--json OUT] [--tolerance 5] [--pure]

The trace holds no SQL, but every statement is one dispatch_command: a
thread's stage goes from net_read (0) or none to dispatch (1).  A statement
that touches a table enters the innodb stage (6) (at least ha_innobase's
external_lock); BEGIN, COMMIT, ROLLBACK and tpcc.lua's retry marker "DO 0" do
not.  Per thread, a maximal run of table statements between two statements
without a table is one transaction attempt, and tpcc.lua shapes the five types
so the run length tells them apart (see tpcc.lua's header):

    2 Stock-Level, 3 Order-Status, 6 New-Order rolled back, 7 Payment,
    odd 17..37 New-Order (7 + 2 * order lines), 10 + 6k Delivery (k = districts
    with an order to deliver; 70 normally)

An attempt followed by three such statements (ROLLBACK, DO 0, BEGIN) instead
of two (COMMIT, BEGIN) failed (deadlock / lock-wait timeout) and was retried;
it is counted apart.  The script's own mix is the sum of the "tpcc-mix:" lines
tpcc.lua prints per thread.  Exit status 1 when a type's share differs by more
than --tolerance percentage points (default 5), 0 otherwise.

Decoding: by default the C helper stage_seq.c (compiled on demand into
target/capture-build/) extracts the stage sequence; --pure decodes in Python
(same result, slow: use on small traces).  Decompression uses zstd.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "target", "capture-build")
NET_READ, DISPATCH, INNODB = 0, 1, 6
NO_STAGE, THREAD_END = 0xFFFF, 0xFFFE
TYPES = ["new_order", "payment", "order_status", "delivery", "stock_level"]
NOMINAL = {"new_order": 45, "payment": 43, "order_status": 4, "delivery": 4, "stock_level": 4}


def classify(n):
    """Transaction type from the number of table statements (tpcc.lua's signature)."""
    if n == 2:
        return "stock_level"
    if n == 3:
        return "order_status"
    if n == 6:
        return "new_order"  # rolled back (unused item id)
    if n == 7:
        return "payment"
    if n % 2 == 1 and 17 <= n <= 37:
        return "new_order"
    if n >= 10 and (n - 10) % 6 == 0 and n <= 70:
        return "delivery"
    return None


def c_binary():
    exe = os.path.join(BUILD, "stage_seq")
    src = os.path.join(HERE, "stage_seq.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(BUILD, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    return exe


def seq_c(path):
    """(thread, stage, thread instructions so far) for every stage change, via stage_seq."""
    zp = subprocess.Popen(["zstd", "-dcq", path], stdout=subprocess.PIPE)
    r = subprocess.run([c_binary()], stdin=zp.stdout, stdout=subprocess.PIPE)
    zp.stdout.close()
    zp.wait()
    if r.returncode not in (0, 3):
        raise SystemExit(f"stage_seq failed ({r.returncode})")
    return [(t, s, n) for t, s, _, n in struct.iter_unpack("<IHHQ", r.stdout)]


def seq_pure(path):
    """The same sequence decoded in Python (reference; slow)."""
    zp = subprocess.Popen(["zstd", "-dcq", path], stdout=subprocess.PIPE)
    f = zp.stdout
    if f.read(8) != b"STGTRC01":
        raise SystemExit("bad magic")
    LEN = {1: 5, 2: 13, 3: 10, 4: 10, 5: 3, 6: 1}
    instrs, stage, order, out = {}, {}, [], []
    tid = None
    buf, pos = b"", 0
    while True:
        if len(buf) - pos < 16:
            buf = buf[pos:] + f.read(1 << 20)
            pos = 0
            if not buf:
                break
        tag = buf[pos]
        n = LEN.get(tag)
        if n is None:
            raise SystemExit(f"bad tag {tag:#x}")
        if len(buf) - pos < n:
            break
        if tag == 2:
            instrs[tid] += buf[pos + 11] | buf[pos + 12] << 8
        elif tag == 1:
            tid = struct.unpack_from("<I", buf, pos + 1)[0]
            if tid not in instrs:
                instrs[tid], stage[tid] = 0, NO_STAGE
                order.append(tid)
        elif tag == 5:
            s = buf[pos + 1] | buf[pos + 2] << 8
            if s != stage[tid]:
                stage[tid] = s
                out.append((tid, s, instrs[tid]))
        elif tag == 6:
            break
        pos += n
    zp.kill()
    zp.wait()
    out.extend((t, THREAD_END, instrs[t]) for t in order)
    return out


def statements(seq):
    """Per thread: list of [touches_innodb, instructions] per statement."""
    per, prev, cur = {}, {}, {}
    for t, s, n in seq:
        p = prev.get(t, NO_STAGE)
        stmts = per.setdefault(t, [])
        if s == THREAD_END:
            if t in cur:
                cur[t][1] = n - cur[t][1]
            continue
        if s == DISPATCH and p in (NET_READ, NO_STAGE):
            if t in cur:
                cur[t][1] = n - cur[t][1]  # the previous statement ends here
            cur[t] = [False, n]
            stmts.append(cur[t])
        elif s == INNODB and t in cur:
            cur[t][0] = True
        prev[t] = s
    return per


def transactions(per):
    """Runs of table statements between statements without a table, per thread."""
    txs, failed, open_runs = [], [], 0
    for stmts in per.values():
        run, pending, sep = [], None, 0
        for table, ins in stmts:
            if table:
                if pending is not None:
                    (failed if sep >= 3 else txs).append(pending)
                    pending = None
                run.append(ins)
            else:
                if run:
                    pending, run, sep = run, [], 0
                sep += 1
        if pending is not None:
            (failed if sep >= 3 else txs).append(pending)
        if run:
            open_runs += 1  # a thread ended inside a run (window cut)
    return txs, failed, open_runs


def script_mix(log):
    tot = {}
    threads = 0
    for line in open(log, errors="replace"):
        m = re.search(r"tpcc-mix: thread=\d+ (.*)", line)
        if not m:
            continue
        threads += 1
        for k, v in re.findall(r"(\w+)=(\d+)", m.group(1)):
            tot[k] = tot.get(k, 0) + int(v)
    if not threads:
        raise SystemExit(f"no 'tpcc-mix:' lines in {log}")
    mix = {k: tot.get(k, 0) for k in TYPES}
    mix["new_order"] += tot.get("new_order_rollback", 0)
    return mix, tot, threads


def pct(d):
    n = sum(d[k] for k in TYPES) or 1
    return {k: 100.0 * d[k] / n for k in TYPES}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--sysbench-log", required=True, help="log of the traced sysbench tpcc.lua run")
    ap.add_argument("--json", help="write both mixes as JSON")
    ap.add_argument("--tolerance", type=float, default=5.0, help="percentage points (default 5)")
    ap.add_argument("--warehouses", type=int)
    ap.add_argument("--pure", action="store_true", help="decode in Python")
    a = ap.parse_args()

    seq = seq_pure(a.trace) if a.pure else seq_c(a.trace)
    per = statements(seq)
    txs, failed, open_runs = transactions(per)
    trace = {k: 0 for k in TYPES}
    stmts = {k: 0 for k in TYPES}
    instr = {k: 0 for k in TYPES}
    rollback_no = 0
    unclassified = {}
    for run in txs:
        k = classify(len(run))
        if k is None:
            unclassified[len(run)] = unclassified.get(len(run), 0) + 1
            continue
        trace[k] += 1
        stmts[k] += len(run)
        instr[k] += sum(run)
        rollback_no += len(run) == 6
    sb, tot, sb_threads = script_mix(a.sysbench_log)
    ps, pt = pct(sb), pct(trace)
    diff = {k: pt[k] - ps[k] for k in TYPES}
    worst = max(abs(v) for v in diff.values())
    ok = worst <= a.tolerance and sum(trace.values()) > 0
    exact = (
        trace == sb
        and not unclassified
        and len(failed) == tot.get("retries", 0)
        and all(stmts[k] == tot.get("stmts_" + k, -1) for k in TYPES)
    )

    n_stmt = sum(len(s) for s in per.values())
    n_tab = sum(1 for s in per.values() for x in s if x[0])
    print(
        f"tpcc mix: {len(per)} threads, {n_stmt} statements in the trace ({n_tab} with a table), "
        f"{len(txs)} transactions + {len(failed)} failed attempts (script: {tot.get('retries', 0)} retries), "
        f"{sum(unclassified.values())} unclassified {dict(sorted(unclassified.items())) or ''}"
    )
    print(
        f"{'type':<14} {'nominal':>8} {'script':>8} {'share':>7} {'trace':>8} {'share':>7} {'diff pp':>8} "
        f"{'stmts script/trace':>19} {'instr/tx (trace)':>17}"
    )
    for k in TYPES:
        print(
            f"{k:<14} {NOMINAL[k]:>7}% {sb[k]:>8} {ps[k]:>6.2f}% {trace[k]:>8} {pt[k]:>6.2f}% {diff[k]:>+8.2f} "
            f"{tot.get('stmts_' + k, 0):>9}/{stmts[k]:<9} {instr[k] / max(trace[k], 1):>17,.0f}"
        )
    print(f"{'total':<14} {100:>7}% {sum(sb.values()):>8} {'':>7} {sum(trace.values()):>8}")
    print(
        f"New-Order rolled back: script {tot.get('new_order_rollback', 0)}, trace {rollback_no}; "
        f"largest difference {worst:.2f} pp (tolerance {a.tolerance:g}): {'OK' if ok else 'FAIL'}; "
        f"counts identical: {'yes' if exact else 'no'}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(
                    warehouses=a.warehouses,
                    nominal_percent=NOMINAL,
                    script=sb,
                    trace=trace,
                    script_percent={k: round(v, 3) for k, v in ps.items()},
                    trace_percent={k: round(v, 3) for k, v in pt.items()},
                    max_diff_pp=round(worst, 3),
                    tolerance_pp=a.tolerance,
                    ok=ok,
                    identical=exact,
                    new_order_rollback_script=tot.get("new_order_rollback", 0),
                    new_order_rollback_trace=rollback_no,
                    retries_script=tot.get("retries", 0),
                    failed_attempts_trace=len(failed),
                    unclassified_trace=sum(unclassified.values()),
                    open_runs_trace=open_runs,
                    statements_script={k: tot.get("stmts_" + k, 0) for k in TYPES},
                    statements_trace=stmts,
                    instructions_per_transaction_trace={k: round(instr[k] / max(trace[k], 1)) for k in TYPES},
                    script_counters=tot,
                    script_threads=sb_threads,
                ),
                f,
                indent=1,
            )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
