"""The preload path of `just test-mariadb` (test.py's module docs): a boot
with mariadbd started under the preload library, its gate set by the VMM's
maps, read with `stagevm-gatectl` through the console."""

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mariadb_guest import (
    OUT,
    RATES,
    MariadbConsole,
    api,
    auto_decisions,
    boot_until_ready,
    exit_vm,
    log,
    queries,
)
from stagevm_harness.checks import Checks
from stagevm_harness.vm import read_json

# The preload path's client connections at once: threads queue at stage
# points only when several requests run together (cohorts of more than one).
CONNECTIONS = 8


def parallel_queries(n: int, expected: dict[int, str], seed: int) -> tuple[bool, str]:
    """n point selects over CONNECTIONS client connections at once, each
    checked as `queries` checks one; (all correct, detail)."""
    share = max(1, n // CONNECTIONS)
    t0 = time.monotonic()
    with ThreadPoolExecutor(CONNECTIONS) as pool:
        got = list(pool.map(lambda k: queries(share, expected, seed * 100 + k), range(CONNECTIONS)))
    dt = time.monotonic() - t0
    RATES[seed] = share * CONNECTIONS / dt
    bad = [d for ok, d in got if not ok]
    return not bad, (
        f"{share * CONNECTIONS} over {CONNECTIONS} connections in {dt:.1f} s "
        f"({share * CONNECTIONS / dt:.1f} queries/s)" + (f"; failed: {bad[0]}" if bad else "; every row correct")
    )


def gate(con: MariadbConsole) -> dict[str, Any]:
    """`stagevm-gatectl show --json` on mariadbd's control page ({} when it
    printed nothing)."""
    _, out = con.command("gatectl show --json")
    for line in out:
        if "{" in line:
            try:
                return json.loads(line[line.find("{") :])
            except json.JSONDecodeError:
                continue
    return {}


def cohorts(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """Cohorts ended, and the threads they served, between two gate reads."""

    def total(g: dict[str, Any], key: str) -> int:
        return sum(int(lane.get(key, 0)) for lane in g.get("lanes", []))

    return (
        total(after, "cohorts") - total(before, "cohorts"),
        total(after, "cohort_threads") - total(before, "cohort_threads"),
    )


def vmm_cohorts(sock: str) -> tuple[int, int]:
    """The cohorts and the entries they held, summed over the stages, in the
    VMM's live view (`stagevm-remote stages --json`); (0, 0) when it does
    not answer."""
    code, text = api(sock, "stages", "--json")
    try:
        view = json.loads(text) if code == 0 else {}
    except json.JSONDecodeError:
        view = {}
    stages = (view.get("stage_channel") or {}).get("stages", [])
    return sum(int(s.get("cohorts", 0)) for s in stages), sum(int(s.get("cohort_entries", 0)) for s in stages)


def preload_path(opts: argparse.Namespace, expected: dict[int, str], stage_names: list[str], checks: Checks) -> bool:
    """The preload path: mariadbd started with the preload library
    (stagevm.mariadb=preload), which registers its stages with the stage
    device and reports through libstage; the VMM's first map (`pinned`,
    `cohort` visits) turns its gate on, `policy pinned --visit fifo` turns it
    off, then `auto` (trialling unstaged against temporal only: `auto_modes`).
    False when the VM or mariadbd did not come up."""
    sock, report_path = os.path.join(OUT, "api-preload.sock"), os.path.join(OUT, "report-preload.json")
    log("the preload path: a second boot, mariadbd with LD_PRELOAD=libstagevm_preload.so")
    booted = boot_until_ready(
        stage_names,
        sock,
        report_path,
        opts.timeout,
        checks,
        'name = "pinned"\nvisit = "cohort"\nauto_modes = ["temporal"]',
        "stagevm.mariadb=preload",
    )
    if booted is None:
        return False
    proc, con, start, steps = booted
    said = [line for _, line in con.lines if "stagevm-preload:" in line]
    checks.check(
        any("stage channel open" in line for line in said),
        "preload: the library installed its stage points and opened the stage channel: "
        + "; ".join(line.split("stagevm-preload: ")[-1] for line in said)[:300],
    )
    # Every event traced, so the VMM counts the cohorts each vCPU served.
    code, text = api(sock, "trace", "on")
    checks.check(code == 0, f"stagevm-remote trace on: exit {code} {text[:120]}")
    v0 = vmm_cohorts(sock)
    g0 = gate(con)
    ok, detail = parallel_queries(opts.queries, expected, 11)
    g1 = gate(con)
    v1 = vmm_cohorts(sock)
    checks.check(ok, f"preload, temporal (the VMM's first map): {detail}")
    vn, ventries = v1[0] - v0[0], v1[1] - v0[1]
    checks.check(
        vn > 0 and ventries > vn,
        f"the VMM's report shows cohorts of more than one thread: {ventries} entries in {vn} cohorts "
        f"({ventries / max(vn, 1):.2f} per cohort, from the trace)",
    )
    n, served = cohorts(g0, g1)
    checks.check(
        g1.get("channel") is True and g1.get("gate") == "temporal" and g1.get("visit") == "cohort",
        f"the VMM's map set the gate: channel {g1.get('channel')}, gate {g1.get('gate')}, visit {g1.get('visit')}, "
        f"maps followed {g1.get('maps_followed')}",
    )
    checks.check(n > 0 and served > n, f"cohorts of more than one thread: {served} threads in {n} cohorts")
    code, text = api(sock, "policy", "pinned", "--visit", "fifo")
    checks.check(code == 0, f"stagevm-remote policy pinned --visit fifo: exit {code} {text[:120]}")
    time.sleep(1)
    ok, detail = parallel_queries(opts.queries, expected, 12)
    g2 = gate(con)
    checks.check(ok, f"preload, off (a FIFO map): {detail}")
    bound = sum(int(lane.get("threads", 0)) for lane in g2.get("lanes", []))
    checks.check(
        g2.get("gate") == "off" and int(g2.get("releases", 0)) >= 1 and bound == 0,
        f"staging off released everything: gate {g2.get('gate')}, releases {g2.get('releases')}, "
        f"threads still bound {bound}",
    )
    code, text = api(sock, "policy", "auto")
    checks.check(code == 0, f"stagevm-remote policy auto: exit {code} {text[:120]}")
    time.sleep(1)
    # Long enough for a trial: periods without a completed query say nothing.
    ok, detail = parallel_queries(max(2 * opts.queries, 100), expected, 13)
    checks.check(ok, f"preload, auto: {detail}")
    final = gate(con)
    exit_vm(con, proc, checks)
    report = read_json(report_path)
    channel = report.get("stage_channel") or {}
    host = {s["name"]: s["events"] for s in channel.get("stages", [])}
    guest = dict(zip(stage_names, final.get("stage_visits", []), strict=False))
    print("  stage   library visits (control page)   VMM report events")
    for s in stage_names:
        print(f"  {s:<7} {guest.get(s, '-'):>29}   {host.get(s, '-'):>17}")
    checks.check(
        bool(guest) and all(guest[s] == host.get(s) for s in stage_names),
        "per-stage counts in the VMM's report equal the library's visits",
    )
    latency = channel.get("latency") or {}
    checks.check(
        int(channel.get("requests", 0)) > 0 and int(latency.get("samples", 0)) > 0,
        f"requests and their latency in the VMM's report: {channel.get('requests')} requests, "
        f"{latency.get('samples')} timed, p99 {latency.get('p99_us')} µs",
    )
    checks.record(auto_decisions(report))
    last = ((report.get("sched") or {}).get("auto") or {}).get("last_trial") or {}
    checks.check(
        last.get("kept") in ("unstaged", "temporal") and bool(last.get("objective")),
        f"auto trialled off against temporal: kept {last.get('kept')} by {last.get('objective')}",
    )
    log(
        f"auto's last trial: kept {last.get('kept', '-')} by {last.get('objective', '-')}; "
        f"queries/s temporal {RATES.get(11, float('nan')):.1f}, off {RATES.get(12, float('nan')):.1f}, "
        f"auto {RATES.get(13, float('nan')):.1f} ({CONNECTIONS} connections)"
    )
    log(
        "preload steps: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items() if v is not None)
        + f", whole run {time.monotonic() - start:.1f} s"
    )
    return True
