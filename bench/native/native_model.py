"""The model beside the native cells (stagesim replays) and the report of
`just bench-native-server` (bench_native_server.py)."""

import argparse
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

from native_common import CELLS, ROOT, Results, med, run, say

# -------------------------------------------------------------------- model


def cache_geometry(index: int) -> tuple[int, int]:
    """(KiB, ways) of this host's cache `index` (sysfs; index0 L1d, 1 L1i, 2 L2)."""
    d = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}")
    kib = int((d / "size").read_text().strip().rstrip("K"))
    ways = int((d / "ways_of_associativity").read_text())
    return kib, ways


def mhz() -> float:
    """The CPU clock, MHz (/proc/cpuinfo)."""
    for line in open("/proc/cpuinfo"):
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1])
    return 2500.0


def model(
    workload: str,
    stagemap: Path,
    cores: int,
    l2: tuple[int, int],
    switch_cycles: int,
    l1i: tuple[int, int],
) -> dict[str, float | None] | None:
    """stagesim's prediction (its ×base column), temporal ÷ the better unstaged model, per visit
    policy: {"srpt": x, "cohort": y}; None without a trace."""
    trace = ROOT / f"target/traces/mariadb-{workload}.strace.zst"
    sim = ROOT / "target/release/stagesim"
    if not trace.exists() or not sim.exists():
        return None
    cmd = [
        str(sim),
        "replay",
        "--trace",
        str(trace),
        "--stage-map",
        str(stagemap),
        "--binary",
        shutil.which("mariadbd"),
        "--cores",
        str(cores),
        "--policy",
        "baseline,pinned",
        "--visit",
        "fifo,srpt,cohort",
        "--steal",
        "on",
        "--switch-cycles",
        str(switch_cycles),
        "--l1i",
        f"{l1i[0]}:{l1i[1]}",
        "--l2",
        f"{l2[0]}:{l2[1]}",
        "--slice",
        "100000",
    ]
    out = run(cmd).stdout
    tput: dict[str, float] = {}
    ipc = None
    for line in out.splitlines():
        f = line.split()
        # model… STAGES(n) cores slice migcyc L1i L2i L1d L2d migr kept steal IPC util tput ×base ΔL1i ΔL2i
        idx = next((i for i, x in enumerate(f) if re.search(r"\(\d+\)$", x)), None)
        if idx and len(f) >= idx + 15 and f[0].startswith(("baseline", "pinned")):
            tput[" ".join(f[:idx])] = float(f[idx + 14])
            if f[0] == "baseline":
                ipc = float(f[idx + 11])
    unstaged = max(v for k, v in tput.items() if "visit" not in k)
    ratios: dict[str, float | None] = {
        v: tput[k] / unstaged for k in tput for v in ("srpt", "cohort") if k.endswith("visit " + v)
    }
    ratios["ipc"] = ipc
    return ratios


def instructions_per_request(stagemap: Path) -> float | None:
    """Instructions per request from stagevm-discover's comment in the map
    (`# V visits per request, N instructions per visit`), or None."""
    m = re.search(r"([0-9.]+) visits per request, (\d+) instructions per visit", Path(stagemap).read_text())
    return float(m.group(1)) * int(m.group(2)) if m else None


def predictions(results: Results, mech: dict[str, Any], stagemap: Path) -> dict[str, Any]:
    """The model's ratios for every configuration run, at this host's L1i
    and L2 and at 512 KiB: with the gate handoff measured in this run as
    the switch cost, and with no switch cost (the cache effect alone)."""
    cyc = int(statistics.median(mech["handoff"]) * mhz() / 1000) if mech["handoff"] else 3500
    l1i, l2 = cache_geometry(1), cache_geometry(2)
    out: dict[str, dict[str, float | None] | None] = {}
    for cfg in results:
        wl, _, layout = cfg.split("/")
        cores = 1 if layout == "split" else 2
        for geo in (l2, (512, 8)):
            for sw in (cyc, 0):
                say(f"model: {wl}, {cores} core(s), L2 {geo[0]} KiB, switch {sw} cycles")
                out[f"{cfg}@{geo[0]}@{sw}"] = model(wl, stagemap, cores, geo, sw, l1i)
    return {
        "by": out,
        "switch_cycles": cyc,
        "l2_kib": l2[0],
        "mhz": mhz(),
        "instructions_per_request": instructions_per_request(stagemap),
    }


def fmt_pred(preds: dict[str, Any] | None, cfg: str, cell: str, kib: int, sw: int) -> float | None:
    p = (preds or {}).get("by", {}).get(f"{cfg}@{kib}@{sw}")
    if p is None:
        return None
    return p.get(cell)


def report(
    results: Results,
    mech: dict[str, Any],
    args: argparse.Namespace,
    machine: str,
    preds: dict[str, Any] | None = None,
) -> dict[str, bool]:
    """Prints the mechanism table, the cells beside the model, and N1/N2."""
    print()
    print(f"## Native MariaDB, staged by the preload library ({machine})")
    print()
    print("Mechanism costs, median (min-max) of", len(mech["plain"]), "rounds, ns:")
    print(f"  stage point, gate off:  {med(mech['hook'])}   (the call itself: {med(mech['plain'])})")
    print(f"  gate on, thread alone:  {med(mech['run_on'])}   (every point through the gate, no handoff)")
    up = med(mech["uprobe"]) if mech["uprobes_available"] else "skipped (no uprobes on this host)"
    print(f"  uprobe hit, same call:  {up}")
    print(f"  gate handoff:           {med(mech['handoff'])}")
    print(f"  futex handoff (floor):  {med(mech['futex'])}")
    print()
    kib = (preds or {}).get("l2_kib", 0)
    sw = (preds or {}).get("switch_cycles", 0)
    print(
        "Cells: median (min-max) over rounds of the ratio to `unpatched` in the same round. Model: stagesim's "
        f"temporal ÷ better unstaged at this host's L2 ({kib} KiB) with the measured handoff ({sw} cycles) as "
        "the switch cost, [at 512 KiB], {cache effect alone: no switch cost}; error = measured − model."
    )
    print()
    print(
        "| config | cell | tx/s ÷ unpatched | CPU/tx ÷ unpatched | p50 ms | p99 ÷ unpatched | tx/s | model | error "
        "| background cores |"
    )
    print("|" + "---|" * 10)
    verdict, hooks_ratio, goes = [], [], []
    for cfg, rows in results.items():
        base = {m["round"]: m for m in rows["unpatched"]}
        for cell in CELLS:
            ms = [m for m in rows.get(cell, []) if m["round"] in base]
            if not ms:
                continue
            tr = [m["tps"] / base[m["round"]]["tps"] for m in ms]
            cr = [m["cpu_ms_per_tx"] / base[m["round"]]["cpu_ms_per_tx"] for m in ms]
            pr = [m["p99_ms"] / base[m["round"]]["p99_ms"] for m in ms]
            model_txt, err_txt = "-", "-"
            if cell in ("srpt", "cohort"):
                here, small, free = (fmt_pred(preds, cfg, cell, k, w) for k, w in ((kib, sw), (512, sw), (kib, 0)))
                if here is not None:
                    model_txt = f"{here:.3f} [{small:.3f}] {{{free:.3f}}}"
                    err_txt = f"{(statistics.median(tr) - here) * 100:+.1f} pp"
            elif cell == "hooks":
                # No cache change; the points' CPU: visits/tx × the measured cost per point.
                g = [m.get("gate", {}) for m in ms]
                per_tx = statistics.median(
                    x["visits"] / max(1, m["tps"] * args.seconds) for x, m in zip(g, ms, strict=True) if x
                )
                cpu_ms = statistics.median(m["cpu_ms_per_tx"] for m in rows["unpatched"])
                here = 1 / (1 + per_tx * statistics.median(mech["hook"]) * 1e-6 / cpu_ms)
                model_txt, err_txt = f"{here:.4f}", f"{(statistics.median(tr) - here) * 100:+.1f} pp"
            elif cell == "unpatched":
                model_txt = "1"
            print(
                f"| {cfg} | {cell} | {med(tr)} | {med(cr)} | {statistics.median(m['p50_ms'] for m in ms):.2f} | "
                f"{med(pr)} | {statistics.median(m['tps'] for m in ms):.0f} | {model_txt} | {err_txt} | "
                f"{max(m['background_cores'] for m in ms):.2f} |"
            )
            if cell == "hooks":
                hooks_ratio.append(statistics.median(tr))
            if cell in ("srpt", "cohort"):
                verdict.append((cfg, cell, statistics.median(tr), statistics.median(cr), statistics.median(pr)))
                g = [m["gate"] for m in ms if "gate" in m]
                txs = [m["tps"] * args.seconds for m in ms if "gate" in m]
                ucpu = statistics.median(m["cpu_ms_per_tx"] for m in rows["unpatched"]) * 1000
                handoffs_tx = statistics.median(x["handoffs"] / t for x, t in zip(g, txs, strict=True))
                handoff_ns = statistics.median(mech["handoff"])
                visits_tx = statistics.median(x["visits"] / t for x, t in zip(g, txs, strict=True))
                timeouts_tx = statistics.median(x["timeouts"] / t for x, t in zip(g, txs, strict=True))
                cohort_threads = statistics.median(x["cohort_threads"] / max(1, x["cohorts"]) for x in g)
                goes.append(
                    f"  {cfg} {cell}: {handoffs_tx:.1f} handoffs/tx × {handoff_ns / 1000:.2f} µs = "
                    f"{handoffs_tx * handoff_ns / 1000:.1f} µs/tx; {visits_tx:.1f} gated points/tx × "
                    f"{statistics.median(mech['run_on']):.0f} ns; {timeouts_tx:.3f} timeouts/tx; "
                    f"cohort {cohort_threads:.2f} threads; "
                    f"CPU/tx {ucpu:.0f} µs unpatched, {(statistics.median(cr) - 1) * ucpu:+.0f} µs staged"
                )
                # The model's request against the measured one: a request the
                # model makes longer weighs the same switch cost less.
                hk = [m for m in rows.get("hooks", []) if "gate" in m]
                ipr = (preds or {}).get("instructions_per_request")
                mp = fmt_pred(preds, cfg, "ipc", kib, sw)
                if hk and ipr and mp and cell == "srpt":
                    req_tx = statistics.median(m["gate"]["requests"] / (m["tps"] * args.seconds) for m in hk)
                    cyc_req = ucpu / req_tx * preds["mhz"]
                    goes.append(
                        f"  {cfg} model against measured: {ipr:.0f} instructions per request (stagevm-discover); "
                        f"measured {req_tx:.1f} requests/tx, {cyc_req:.0f} cycles/request (IPC {ipr / cyc_req:.2f}); "
                        f"the model's IPC {mp:.2f}: its requests are {ipr / mp / cyc_req:.2f}x as long, so it weighs "
                        f"a switch {ipr / mp / cyc_req:.2f}x too lightly"
                    )
    print()
    if goes:
        print("Where the temporal cells' time goes (per transaction):")
        print("\n".join(goes))
        print()
    hook_ns = statistics.median(mech["hook"])
    n1 = hook_ns <= 20 and hooks_ratio and min(hooks_ratio) >= 0.99
    print(
        f"N1 hooks: {hook_ns:.1f} ns per stage point (target <= 20), hooked/unpatched throughput "
        f"{', '.join(f'{x:.3f}' for x in hooks_ratio)} (target >= 0.99): {'met' if n1 else 'not met'}"
    )
    best = max(verdict, key=lambda v: v[2]) if verdict else None
    n2 = any((t >= 1.10 or c <= 0.90) and p <= 1.10 for _, _, t, c, p in verdict)
    if best:
        print(
            f"N2 verdict ({machine}): best temporal cell {best[0]} {best[1]}: {best[2]:.3f}x throughput, "
            f"{best[3]:.3f}x CPU/tx, p99 {best[4]:.3f}x (target >= 1.10x or CPU <= 0.90x, p99 <= 1.10x): "
            f"{'met' if n2 else 'not met'}"
        )
    return {"n1": bool(n1), "n2": bool(n2)}
