#!/usr/bin/env python3
"""`just bench-native-server`: a real server staged and timed natively.

Debian's mariadbd runs on the host (no VM: the host's kernel is native
here) with a datadir in a temporary folder and a private port on loopback;
sysbench drives it. Cells, side by side in every round, in a shuffled order:

  unpatched   mariadbd alone
  hooks       with the preload library, its stage points installed, gate off
  srpt        the temporal gate, SRPT visit order
  cohort      the temporal gate, Cohort visit order

The hooked cells share one server (the gate is switched through the control
page, `stagevm-gatectl`); `unpatched` is its own server. Layouts: `split`
puts the server on CPU 1 and sysbench on CPU 0 (one lane); `shared` lets
both use both CPUs (two lanes). Each cell: a warm-up, then a steady window
in which throughput (sysbench), p50/p99 (sysbench's histogram), mariadbd's
CPU (utime+stime from /proc) per transaction and the background load (CPU
of everything but mariadbd and sysbench, /proc/stat) are measured.

The mechanism's costs are measured in the same run (`point_bench.c`): a
stage point with the gate off, a uprobe hit on the same function (tracefs;
mounted for the run when it is not), a gate handoff, and the futex handoff
floor. Prints met / not met for N1 (hooks) and N2 (the verdict).
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from native_common import CELLS, HERE, ROOT, Measurement, Results, Rows, cpu_total, proc_cpu, run, say
from native_model import cache_geometry, predictions, report

LIB = ROOT / "target/release/libstagevm_preload.so"
GATECTL = ROOT / "target/release/stagevm-gatectl"
TRACEFS = Path("/sys/kernel/tracing")


# ---------------------------------------------------------------- mechanism


def file_offset(binary: Path, symbol: str) -> int:
    """The file offset of `symbol` in `binary` (for a uprobe)."""
    nm = run(["nm", binary]).stdout
    addr = next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" " + symbol))
    for line in run(["readelf", "-lW", binary]).stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            off, vaddr, filesz = int(f[1], 16), int(f[2], 16), int(f[4], 16)
            if vaddr <= addr < vaddr + filesz:
                return addr - vaddr + off
    raise RuntimeError(f"{symbol} not in a LOAD segment of {binary}")


def tracefs_append(line: str) -> None:
    """Appends one line to tracefs' uprobe_events (no seek: tracefs refuses it)."""
    fd = os.open(TRACEFS / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def ensure_tracefs() -> bool:
    """True when uprobes can be used; mounts tracefs for the run if needed."""
    if (TRACEFS / "uprobe_events").exists():
        return True
    if TRACEFS.is_dir():
        r = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)
        if r.returncode == 0 and (TRACEFS / "uprobe_events").exists():
            say(f"tracefs was not mounted: mounted it at {TRACEFS} for the run")
            return True
    return False


def mechanism(work: Path, rounds: int, calls: int) -> dict[str, Any]:
    """Measures hook, uprobe, gate-handoff and futex-handoff costs (ns)."""
    pb = work / "point_bench"
    run(["cc", "-O2", "-pthread", "-o", str(pb), str(HERE / "point_bench.c")])
    pmap = work / "point_bench.stagemap"
    pmap.write_text(f"stagemap 1\nbinary {pb}\nstage a probe_a\nstage b probe_b\n")
    ctl = work / "point_bench.control"
    base_env = dict(os.environ, STAGEVM_PRELOAD_QUIET="1")
    # The gate-off cells use an anonymous control page (STAGEVM_CONTROL
    # unset): a page left by the gate cells would still say "temporal".
    pre_env = dict(base_env, LD_PRELOAD=str(LIB), STAGEVM_STAGEMAP=str(pmap))

    def per_call(env: dict[str, str]) -> float:
        out = run([str(pb), "calls", str(calls)], env=env).stdout
        return float(out.split()[1])

    uprobes = ensure_tracefs()
    res: dict[str, Any] = {"plain": [], "hook": [], "run_on": [], "uprobe": [], "handoff": [], "futex": []}
    for r in range(rounds):
        plain = per_call(base_env)
        hooked = per_call(pre_env)
        res["plain"].append(plain)
        # Two stage points per iteration, one per call: the cost per point.
        res["hook"].append(hooked - plain)
        # The gate on with one thread: every point runs the gate and the
        # thread runs on (work-conserving, no handoff).
        res["run_on"].append(per_call(dict(pre_env, STAGEVM_GATE="temporal", STAGEVM_LANES="1")) - plain)
        if uprobes:
            tracefs_append(f"p:stagevm_bench/probe_a {pb}:{file_offset(pb, 'probe_a'):#x}")
            (TRACEFS / "events/stagevm_bench/enable").write_text("1\n")
            try:
                n = max(calls // 20, 100000)
                out = run([str(pb), "calls", str(n)], env=base_env).stdout
                # One probed call in two: the hit costs 2 × the increase.
                res["uprobe"].append(2 * (float(out.split()[1]) - plain))
            finally:
                (TRACEFS / "events/stagevm_bench/enable").write_text("0\n")
                tracefs_append("-:stagevm_bench/probe_a")
        # Gate handoffs: 4 threads on one CPU, every call a stage switch.
        n = calls // 20
        cpu = ["taskset", "-c", "1"]
        off = run(cpu + [str(pb), "threads", str(n), "4"], env=base_env).stdout
        if ctl.exists():
            ctl.unlink()
        gate_env = dict(
            pre_env, STAGEVM_CONTROL=str(ctl), STAGEVM_GATE="temporal", STAGEVM_LANES="1", STAGEVM_MAX_WAIT_US="1000"
        )
        on = run(cpu + [str(pb), "threads", str(n), "4"], env=gate_env).stdout
        show = json.loads(run([str(GATECTL), "--control", str(ctl), "show", "--json"]).stdout)
        handoffs = sum(lane["handoffs"] for lane in show["lanes"])
        extra = int(on.split()[1]) - int(off.split()[1])
        if handoffs:
            res["handoff"].append(extra / handoffs)
        fut = run(cpu + [str(pb), "futex", str(n)]).stdout
        res["futex"].append(float(fut.split()[1]))
        say(
            f"mechanism round {r + 1}/{rounds}: call {plain:.2f} ns, stage point +{res['hook'][-1]:.2f} ns "
            f"(gate on, alone: +{res['run_on'][-1]:.0f} ns), "
            f"uprobe {res['uprobe'][-1] if uprobes else float('nan'):.0f} ns, gate handoff "
            f"{res['handoff'][-1] if res['handoff'] else float('nan'):.0f} ns, futex handoff {res['futex'][-1]:.0f} ns"
        )
    res["uprobes_available"] = uprobes
    return res


# ------------------------------------------------------------------ mariadb


class Server:
    """A mariadbd on a private port with a datadir under `work`."""

    def __init__(self, work: Path, port: int, cpus: str | None, preload: dict[str, str] | None = None) -> None:
        self.work, self.port, self.cpus, self.preload = work, port, cpus, preload
        self.sock = work / "mysqld.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def opts(self) -> list[str]:
        return [
            "--no-defaults",
            f"--datadir={self.work / 'data'}",
            f"--socket={self.sock}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--user=root",
            f"--pid-file={self.work / 'mysqld.pid'}",
            f"--log-error={self.work / 'error.log'}",
            "--skip-name-resolve",
            "--innodb-use-native-aio=0",
            "--innodb-buffer-pool-size=512M",
            "--max-connections=128",
            "--performance-schema=OFF",
        ]

    def start(self) -> None:
        env = dict(os.environ)
        if self.preload:
            env.update(self.preload)
        cmd = (["taskset", "-c", self.cpus] if self.cpus else []) + [shutil.which("mariadbd")] + self.opts()
        log = open(self.work / "mariadbd.out", "a")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while subprocess.run(self.admin("ping"), capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.time() - t0 > 120:
                tail = (self.work / "error.log").read_text()[-2000:]
                raise RuntimeError(f"mariadbd did not start:\n{tail}")
            time.sleep(0.5)

    def admin(self, *args: str) -> list[str]:
        return ["mariadb-admin", "--no-defaults", f"--socket={self.sock}", "-uroot", *args]

    def sql(self, q: str) -> None:
        run(["mariadb", "--no-defaults", f"--socket={self.sock}", "-uroot", "-e", q])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            subprocess.run(self.admin("shutdown"), capture_output=True)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def sysbench_args(workload: str, port: int, threads: int, seconds: int) -> list[str]:
    common = [
        "--db-driver=mysql",
        "--mysql-host=127.0.0.1",
        f"--mysql-port={port}",
        "--mysql-user=sbtest",
        "--mysql-password=sbtest",
        f"--threads={threads}",
        f"--time={seconds}",
        "--rand-seed=1",
        "--db-ps-mode=disable",
        "--percentile=99",
        "--histogram=on",
    ]
    if workload == "tpcc":
        return [str(ROOT / "bench/capture/tpcc.lua"), "--mysql-db=tpcc", "--warehouses=2", *common]
    return [workload, "--mysql-db=sbtest", "--tables=4", "--table-size=10000", *common]


def prepare(work: Path, port: int, workloads: Sequence[str]) -> None:
    say(f"creating the datadir in {work} (mariadb-install-db, sysbench prepare)")
    run(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={work / 'data'}",
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ]
    )
    s = Server(work, port, None)
    s.start()
    try:
        s.sql(
            "CREATE DATABASE sbtest; CREATE DATABASE tpcc;"
            "CREATE USER sbtest@'127.0.0.1' IDENTIFIED BY 'sbtest';"
            "GRANT ALL ON sbtest.* TO sbtest@'127.0.0.1'; GRANT ALL ON tpcc.* TO sbtest@'127.0.0.1';"
        )
        a = sysbench_args("oltp_read_write", port, 2, 0)
        run(["sysbench", *a, "prepare"])
        if "tpcc" in workloads:
            a = sysbench_args("tpcc", port, 2, 0)
            run(["sysbench", *a, "prepare"])
    finally:
        s.stop()


def histogram_percentile(text: str, p: float) -> float:
    """The p-th percentile (ms) of sysbench's latency histogram."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9.]+)\s*\|\s*\**\s*(\d+)\s*$", line)
        if m:
            rows.append((float(m.group(1)), int(m.group(2))))
    total = sum(c for _, c in rows)
    if not total:
        return float("nan")
    acc = 0
    for v, c in rows:
        acc += c
        if acc >= p / 100 * total:
            return v
    return rows[-1][0]


def measure(server: Server, workload: str, threads: int, seconds: int, client_cpus: str | None) -> Measurement:
    """One steady window: tps, CPU per transaction (ms), p50/p99 (ms), background (cores)."""
    a = sysbench_args(workload, server.port, threads, seconds)
    cmd = (["taskset", "-c", client_cpus] if client_cpus else []) + ["sysbench", *a, "run"]
    b0, t0 = cpu_total()
    c0 = proc_cpu(server.proc.pid)
    w0 = time.time()
    sb = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sb_cpu = 0
    while sb.poll() is None:
        sb_cpu = max(sb_cpu, proc_cpu(sb.pid))
        time.sleep(0.5)
    out = sb.stdout.read()
    wall = time.time() - w0
    c1 = proc_cpu(server.proc.pid)
    b1, t1 = cpu_total()
    m = re.search(r"transactions:\s+(\d+)\s+\(([0-9.]+) per sec", out)
    if not m:
        raise RuntimeError(f"sysbench failed:\n{out[-3000:]}")
    tx, tps = int(m.group(1)), float(m.group(2))
    hz = os.sysconf("SC_CLK_TCK")
    server_cores = (c1 - c0) / hz / wall
    background = max(0.0, ((b1 - b0) - (c1 - c0) - sb_cpu) / hz / wall)
    return {
        "tps": tps,
        "cpu_ms_per_tx": (c1 - c0) / hz * 1000 / tx,
        "p50_ms": histogram_percentile(out, 50),
        "p99_ms": histogram_percentile(out, 99),
        "server_cores": server_cores,
        "background_cores": background,
    }


def gatectl(ctl: Path, *args: str) -> str:
    return run([str(GATECTL), "--control", str(ctl), *args]).stdout


def gate_counts(ctl: Path) -> dict[str, int]:
    d = json.loads(gatectl(ctl, "show", "--json"))
    lanes = d["lanes"]
    return {
        "visits": sum(d["stage_visits"]),
        "requests": d["requests"],
        "handoffs": sum(x["handoffs"] for x in lanes),
        "timeouts": sum(x["timeouts"] for x in lanes),
        "cohorts": sum(x["cohorts"] for x in lanes),
        "cohort_threads": sum(x["cohort_threads"] for x in lanes),
    }


def config_rounds(
    args: argparse.Namespace,
    work: Path,
    workload: str,
    threads: int,
    layout: str,
    stagemap: Path,
    out: Results,
) -> Rows:
    """Interleaved rounds of every cell for one configuration."""
    server_cpus, client_cpus, lanes = ("1", "0", "1") if layout == "split" else (None, None, "0-1")
    ctl = work / "control"
    preload = {
        "LD_PRELOAD": str(LIB),
        "STAGEVM_STAGEMAP": str(stagemap),
        "STAGEVM_CONTROL": str(ctl),
        "STAGEVM_LANES": lanes,
        "STAGEVM_MAX_WAIT_US": str(args.max_wait_us),
        "STAGEVM_PRELOAD_QUIET": "1",
    }
    rng = random.Random(args.seed)
    rows: Rows = {c: [] for c in CELLS}
    cells = [c for c in CELLS if c in args.cells.split(",")]
    for r in range(args.rounds):
        hooked = [c for c in cells if c != "unpatched"]
        rng.shuffle(hooked)
        groups = [g for g in (["unpatched"] if "unpatched" in cells else [], hooked) if g]
        rng.shuffle(groups)
        for group in groups:
            if ctl.exists():
                ctl.unlink()
            s = Server(work, args.port, server_cpus, None if group == ["unpatched"] else preload)
            s.start()
            try:
                for cell in group:
                    if cell != "unpatched":
                        gate = "off" if cell == "hooks" else "temporal"
                        visit = [] if cell == "hooks" else ["--visit", cell]
                        gatectl(ctl, "set", "--gate", gate, *visit)
                    measure(s, workload, threads, args.warmup, client_cpus)
                    g0 = gate_counts(ctl) if cell != "unpatched" else None
                    m = measure(s, workload, threads, args.seconds, client_cpus)
                    if g0:
                        g1 = gate_counts(ctl)
                        m["gate"] = {k: g1[k] - g0[k] for k in g1}
                    m["round"] = r
                    rows[cell].append(m)
                    gs = m.get("gate", {})
                    cohort = gs.get("cohort_threads", 0) / gs["cohorts"] if gs.get("cohorts") else 0
                    say(
                        f"{workload} {threads} conn {layout} round {r + 1}/{args.rounds} {cell:9}: "
                        f"{m['tps']:8.1f} tx/s, {m['cpu_ms_per_tx']:.3f} ms CPU/tx, p50 {m['p50_ms']:.2f} ms, "
                        f"p99 {m['p99_ms']:.2f} ms, server {m['server_cores']:.2f} cores, background "
                        f"{m['background_cores']:.2f} cores"
                        + (
                            f"; {gs['visits'] / max(1, gs['requests']):.2f} visits/request, "
                            f"{gs['handoffs']} handoffs, {gs['timeouts']} timeouts, cohort {cohort:.2f}"
                            if gs
                            else ""
                        )
                    )
            finally:
                s.stop()
    out[f"{workload}/{threads}/{layout}"] = rows
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per configuration (default 5)")
    ap.add_argument("--seconds", type=int, default=30, help="steady window per cell, s (default 30)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up per cell, s (default 10)")
    ap.add_argument("--workloads", default="oltp_read_only,oltp_read_write,tpcc")
    ap.add_argument("--connections", default="16,32")
    ap.add_argument("--layouts", default="split,shared", help="split (server CPU 1, client CPU 0) and/or shared")
    ap.add_argument("--map", type=Path, help="the stage map (default: stagevm-discover's for oltp_read_only)")
    ap.add_argument("--cells", default=",".join(CELLS), help="cells to run (default: all four)")
    ap.add_argument("--max-wait-us", type=int, default=1000)
    ap.add_argument("--mech-rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20_000_000, help="calls per mechanism round")
    ap.add_argument("--mechanism-only", action="store_true")
    ap.add_argument("--port", type=int, default=33927)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=ROOT / "target/native-bench/results.json")
    args = ap.parse_args()
    for tool in ("mariadbd", "sysbench", "cc", "taskset", "nm", "readelf"):
        if not shutil.which(tool):
            sys.exit(
                f"bench-native-server: {tool} is missing "
                "(just bench-native-server installs mariadb-server and sysbench)"
            )
    if not LIB.exists() or not GATECTL.exists():
        sys.exit(f"bench-native-server: build first: cargo build --release -p stagevm-preload ({LIB})")
    stagemap = args.map
    if stagemap is None:
        for cand in (
            ROOT / "target/stagesim/mariadb-oltp_read_only.stagemap",
            ROOT / "bench/native/mariadb-oltp_read_only.stagemap",
        ):
            if cand.exists():
                stagemap = cand
                break
    if stagemap is None or not stagemap.exists():
        sys.exit(f"bench-native-server: no stage map ({stagemap}); give --map")
    lscpu = run(["lscpu"]).stdout
    model = re.search(r"Model name:\s+(.*)", lscpu).group(1).strip()
    l2 = re.search(r"L2 cache:\s+(.*)", lscpu).group(1).strip()
    l2_kib, l2_ways = cache_geometry(2)
    machine = f"{model}, {os.cpu_count()} CPUs, L2 {l2_kib} KiB {l2_ways}-way per core ({l2} in all)"
    load = os.getloadavg()[0]
    say(f"{machine}; load average {load:.2f} at start (the benchmark should run alone); map {stagemap}")
    work = Path(tempfile.mkdtemp(prefix="stagevm-native-"))
    results: Results = {}
    try:
        mech = mechanism(work, args.mech_rounds, args.calls)
        if not args.mechanism_only:
            workloads = args.workloads.split(",")
            prepare(work, args.port, workloads)
            for wl in workloads:
                for conn in [int(x) for x in args.connections.split(",")]:
                    for layout in args.layouts.split(","):
                        config_rounds(args, work, wl, conn, layout, stagemap, results)
        preds = predictions(results, mech, stagemap) if results else None
        verdict = report(results, mech, args, machine, preds)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"machine": machine, "mechanism": mech, "cells": results, "model": preds, "verdict": verdict}, indent=1
            )
        )
        say(f"results in {args.json}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
