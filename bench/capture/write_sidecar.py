#!/usr/bin/env python3
"""Write the <trace>.stages.toml sidecar of a stagetrace v1 capture.

Top-level keys and a [capture] table say what was traced, [validation] holds
the instruction-count cross-checks, and one [[stage]] table per stage gives
id, name, the functions that define it (mangled, as resolved in the binary)
and the stage's share of the trace.
"""

import argparse
import json
import os
import re
import tomllib


def q(s):
    return json.dumps(str(s))  # a JSON string is a valid TOML basic string


def kv(f, k, v):
    if isinstance(v, bool):
        f.write(f"{k} = {'true' if v else 'false'}\n")
    elif isinstance(v, (int, float)):
        f.write(f"{k} = {v}\n")
    elif isinstance(v, list):
        f.write(f"{k} = [\n" + "".join(f"  {q(x) if isinstance(x, str) else x},\n" for x in v) + "]\n")
    else:
        f.write(f"{k} = {q(v)}\n")


def read_kv(path):
    out = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = int(v.strip())
    return out


def sb_num(log, field):
    if not log or not os.path.exists(log):
        return None
    m = re.search(rf"^\s*{field}:\s+(\d+)", open(log).read(), re.M)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    for k in (
        "stages-json",
        "stages-toml",
        "tool-stats",
        "trace-stats",
        "sysbench-log",
        "workload",
        "mariadb",
        "valgrind",
        "sysbench",
        "trace",
        "out",
        "vg-log",
    ):
        ap.add_argument("--" + k)
    for k in ("events", "threads", "tables", "table-size", "seed", "seconds", "warehouses", "load-seconds"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--mix-json", help="tpcc: tpcc_mix.py's JSON (script's and trace's mix)")
    ap.add_argument("--server-opts", help="buffer-pool options when not the default ones")
    ap.add_argument("--callgrind-ir", type=int)
    ap.add_argument("--callgrind-sysbench-log")
    ap.add_argument("--callgrind-threads", help="lines 'TID IR' of the callgrind window")
    a = ap.parse_args()

    resolved = json.load(open(a.stages_json))
    cfg = tomllib.load(open(a.stages_toml, "rb"))
    tool = read_kv(a.tool_stats)
    ts = json.load(open(a.trace_stats))
    bias = None
    if a.vg_log and os.path.exists(a.vg_log):
        m = re.search(r"text bias (0x[0-9a-f]+)", open(a.vg_log).read())
        bias = m.group(1) if m else None

    n = ts["instructions"]
    with open(a.out, "w") as f:
        f.write(
            "# Sidecar of a stagetrace v1 trace (bench/capture/README.md).\n"
            "# Stage 0xFFFF (65535) in the trace = no stage (outside every stage function).\n"
        )
        kv(f, "format", "stagetrace v1")
        kv(f, "trace", os.path.basename(a.trace))
        f.write("\n[capture]\n")
        tpcc = a.workload == "tpcc"
        kv(
            f,
            "workload",
            "sysbench bench/capture/tpcc.lua (TPC-C's five transactions)" if tpcc else f"sysbench {a.workload}",
        )
        kv(f, "server", f"mariadbd {a.mariadb}")
        kv(f, "transactions", sb_num(a.sysbench_log, "transactions") or a.events)
        kv(f, "queries", sb_num(a.sysbench_log, "queries") or 0)
        kv(f, "connections", a.threads)
        if tpcc:
            kv(f, "warehouses", a.warehouses)
            if a.load_seconds is not None:
                kv(f, "load_seconds_native", a.load_seconds)
        else:
            kv(f, "tables", a.tables)
            kv(f, "table_size", a.table_size)
        if a.server_opts:
            kv(f, "server_buffer_pool_options", a.server_opts)
        kv(f, "rand_seed", a.seed)
        kv(f, "db_ps_mode", "disable")
        kv(f, "instructions", n)
        kv(f, "fetch_records", ts["fetch_records"])
        kv(f, "load_records", ts["load_records"])
        kv(f, "store_records", ts["store_records"])
        kv(f, "stage_records", ts["stage_records"])
        kv(f, "thread_records", ts["thread_records"])
        kv(f, "threads", ts["thread_count"])
        kv(f, "uncompressed_bytes", ts["bytes"])
        kv(
            f,
            "compressed_bytes",
            os.path.getsize(a.trace + ".tmp") if os.path.exists(a.trace + ".tmp") else os.path.getsize(a.trace),
        )
        kv(f, "server_instructions_whole_run", tool["total_guest_instructions"])
        kv(
            f,
            "window",
            "from the first dispatch_command after the control file appeared (a 'DO 1' "
            "sent just before sysbench starts) to the first dispatch_command after it "
            "was removed (a COM_PING after sysbench ended); all server threads",
        )
        kv(f, "excluded", "server start-up, warm-up queries, table preparation (done natively before), shutdown")
        kv(f, "thread_ids", "Valgrind ThreadId (1 = mariadbd's main thread; ids of exited threads may be reused)")
        kv(f, "addresses", "guest virtual addresses under Valgrind; mariadbd file address = trace address - text_bias")
        if bias:
            kv(f, "text_bias", bias)
        kv(
            f,
            "memory_accesses",
            "LOAD/STORE per guest memory access; accesses > 64 bytes (e.g. XSAVE) are split into 64-byte records",
        )
        kv(f, "tool", "stgtrace (discover/stgtrace/st_main.c), a Valgrind tool")
        kv(f, "tool_version", f"stgtrace 1 on {a.valgrind}")
        kv(f, "sysbench", a.sysbench)
        kv(f, "capture_seconds", a.seconds)

        f.write("\n[validation]\n")
        kv(f, "trace_instructions_decoded", n)
        kv(f, "tool_window_instructions_inline_counter", tool["window_instructions_inline_counter"])
        kv(f, "tool_window_instructions_fetch_records", tool["window_instructions_fetch_records"])
        ok = n == tool["window_instructions_inline_counter"] == tool["window_instructions_fetch_records"]
        kv(f, "trace_equals_inline_counter", ok)
        if a.callgrind_ir:
            kv(f, "callgrind_ir_same_workload", a.callgrind_ir)
            kv(f, "callgrind_transactions", sb_num(a.callgrind_sysbench_log, "transactions") or 0)
            kv(f, "callgrind_vs_trace_percent", round(100.0 * (a.callgrind_ir - n) / n, 3))
            if a.callgrind_threads:
                # connection threads: those that switched stages often (the
                # background threads switch a handful of times at most)
                conn = {int(t) for t, v in ts["threads"].items() if v["stage_switches"] >= 100}
                # in callgrind's per-thread profiles: those that ran do_command
                cg_conn = cg_n = 0
                for line in open(a.callgrind_threads):
                    t, ir, c = line.split()
                    if c == "1":
                        cg_conn += int(ir)
                        cg_n += 1
                tr_conn = sum(v["instructions"] for t, v in ts["threads"].items() if int(t) in conn)
                kv(f, "connection_threads_trace", len(conn))
                kv(f, "connection_threads_callgrind", cg_n)
                kv(f, "trace_instructions_connection_threads", tr_conn)
                kv(f, "callgrind_ir_connection_threads", cg_conn)
                kv(
                    f,
                    "callgrind_vs_trace_connection_threads_percent",
                    round(100.0 * (cg_conn - tr_conn) / max(tr_conn, 1), 3),
                )
                kv(f, "trace_instructions_other_threads", n - tr_conn)
                kv(f, "callgrind_ir_other_threads", a.callgrind_ir - cg_conn)
            kv(
                f,
                "callgrind_method",
                "separate run of the same workload (same datadir copy, seed, "
                "transactions) under valgrind --tool=callgrind, counters zeroed "
                "(callgrind_control -z) before the 'DO 1' and dumped "
                "(callgrind_control -d) after sysbench; Ir of that part, per thread "
                "(--separate-threads=yes; same Valgrind thread ids)",
            )

        if a.mix_json:
            mix = json.load(open(a.mix_json))
            f.write("\n[tpcc]\n")
            kv(f, "warehouses", a.warehouses)
            kv(
                f,
                "mix_method",
                "script: sum of tpcc.lua's per-thread 'tpcc-mix:' lines; trace: "
                "tpcc_mix.py, per thread the number of table statements (dispatch_command "
                "entries that reach the innodb stage) between statements without a table "
                "(BEGIN/COMMIT/ROLLBACK): 2 Stock-Level, 3 Order-Status, 6 New-Order rolled "
                "back, 7 Payment, odd 17..37 New-Order, 10+6k Delivery",
            )
            kv(f, "mix_ok", mix["ok"])
            kv(f, "mix_identical", mix["identical"])
            kv(f, "mix_max_diff_pp", mix["max_diff_pp"])
            kv(f, "mix_tolerance_pp", mix["tolerance_pp"])
            kv(f, "new_order_rollback_script", mix["new_order_rollback_script"])
            kv(f, "new_order_rollback_trace", mix["new_order_rollback_trace"])
            kv(f, "retries_script", mix["retries_script"])
            kv(f, "failed_attempts_trace", mix["failed_attempts_trace"])
            kv(f, "unclassified_trace", mix["unclassified_trace"])
            for name in (
                "nominal_percent",
                "script",
                "script_percent",
                "trace",
                "trace_percent",
                "statements_script",
                "statements_trace",
                "instructions_per_transaction_trace",
            ):
                f.write(f"\n[tpcc.{name}]\n")
                for k, v in mix[name].items():
                    kv(f, k, v)

        by_id = {s["id"]: s for s in resolved["stages"]}
        for st in cfg["stage"]:
            sid = st["id"]
            f.write("\n[[stage]]\n")
            kv(f, "id", sid)
            kv(f, "name", st["name"])
            kv(f, "description", st.get("description", ""))
            fns = by_id.get(sid, {}).get("functions", [])
            kv(f, "symbols", [x["symbol"] for x in fns])
            kv(f, "file_addresses", [f"{x['addr']:#x}" for x in fns])
            if st.get("vtable_overrides"):
                kv(
                    f,
                    "defined_by",
                    "every virtual method "
                    + ", ".join(f"{v['class']} overrides from {v['base']}" for v in st["vtable_overrides"])
                    + " (vtable read from the binary; names reconstructed where an exported "
                    "sibling class names the slot)",
                )
            s = ts["stages"].get(str(sid), {})
            kv(f, "instructions", s.get("instructions", 0))
            kv(f, "share_percent", round(100.0 * s.get("instructions", 0) / max(n, 1), 3))
            kv(f, "code_kib", round(s.get("code_lines", 0) * 64 / 1024, 1))
        s = ts["stages"].get(str(0xFFFF), {})
        f.write("\n[no_stage]\n")
        kv(f, "id", 0xFFFF)
        kv(f, "instructions", s.get("instructions", 0))
        kv(f, "share_percent", round(100.0 * s.get("instructions", 0) / max(n, 1), 3))
    tomllib.load(open(a.out, "rb"))  # must parse


if __name__ == "__main__":
    main()
