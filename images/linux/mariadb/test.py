#!/usr/bin/env python3
"""`just test-mariadb`: MariaDB in a stagevm guest, staged without changing its
source (images/linux/mariadb/README.md). Prints one line per check and the
time of each step.

    images/linux/mariadb/test.py [--queries N] [--timeout S]

In a network namespace of its own (a tap with a link-local address,
169.254.77.1/16; nothing leaves the namespace) it boots the MariaDB image
with 2 vCPUs, 512 MiB, the root disk on virtio-blk, a virtio-net card,
`--serial pty`, an API socket and `--policy static` with budgets for the
stages of the map (MAP, the request-level map `stagesim discover` chose for
oltp_read_only, issue 25). The guest's /init mounts the disk, starts
Debian's mariadbd and answers commands typed on the console (mariadb.c).
Then:

 1. `stagectl attach` the map to the unmodified /usr/sbin/mariadbd; N point
    selects over TCP, every row compared with the table dumped when the
    image was built; `stagectl probes`;
 2. `stagevm-remote policy off`, N more; 3. `policy auto`, N more;
 4. maps that must be refused (a missing symbol, a symbol of another
    binary, an empty stage, more stages than registered), each with a
    message naming it, the server still answering;
 5. `stagectl detach`, `rmmod`, N more queries; `exit` (mariadbd stopped,
    the kernel log's oops/BUG/WARNING lines counted).

Checks: every query answered correctly; per-stage hits of the module equal
the stage counts in the VMM's report; migrations under static, none under
off; auto's periods in the report's timeline; the refusals; mariadbd
answering after detach and rmmod; 0 oops/BUG/WARNING lines.

Then the preload path, a second boot (`--path preload` runs it alone,
`--path uprobes` the first alone): mariadbd starts with the preload library
(stagevm.mariadb=preload), which registers the map's stages with the stage
device and reports its stage points through libstage, and the VM runs
`pinned` with `cohort` visits. N queries over CONNECTIONS connections at
once under that first map (the gate on, read with `stagevm-gatectl`), under
`policy pinned --visit fifo` (off) and under `auto`. Checks: every answer
correct; the library says the channel is open; the map set the gate
(temporal, cohort); cohorts of more than one thread; off released every
thread; the VMM's per-stage counts equal the library's visits; requests and
their latency in the report; auto's decisions; 0 oops/BUG/WARNING lines.

Exit status: 0 when every check held, 1 when one failed, 2 when the image or
stagevm is missing. Without /dev/net/tun or the right to make a network
namespace it says "skipped" and why, and exits 0.
"""

import argparse
import os
import re
import sys
import time
from typing import Any

# The harness package is in images/linux, beside this directory.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mariadb_guest import (
    GUEST_BINARY,
    GUEST_MAP,
    MAP,
    OUT,
    RATES,
    VMS,
    MariadbConsole,
    api,
    auto_decisions,
    boot_until_ready,
    exit_vm,
    log,
    mariadbd_crash,
    queries,
)
from preload_path import preload_path
from stagevm_harness.checks import Check, Checks
from stagevm_harness.net import netns_tap
from stagevm_harness.vm import missing, read_json

# Maps that must be refused (refused/*.stagemap, on the root disk), each
# with a message naming what is wrong: the file's name, what it is, the
# words stagectl's message must hold.
REFUSED = {
    "missing-symbol": ("a missing symbol", "no_such_function_here"),
    "other-binary": ("a symbol of another binary", "__libc_start_main"),
    "empty-stage": ("an empty stage", "line 4: expected a name and at least one symbol"),
    "more-stages": ("more stages than registered", "the guest registered 2"),
}

# `stagectl probes` as a dict: hits (a list, per stage), migrations, ...
Probes = dict[str, Any]


def probes(con: MariadbConsole) -> Probes | None:
    """`stagectl probes` as a dict: hits (per stage), migrations, ..."""
    rc, out = con.command("stagectl probes")
    for line in out:
        m = re.search(
            r"probes attached (\d+), hits ([\d ]+), counted (\d+), not counted (\d+), migrations (\d+), "
            r"affinity failures (\d+)",
            line,
        )
        if m:
            return dict(
                attached=int(m.group(1)),
                hits=[int(x) for x in m.group(2).split()],
                counted=int(m.group(3)),
                not_counted=int(m.group(4)),
                migrations=int(m.group(5)),
                affinity_failures=int(m.group(6)),
            )
    return None


def attached(rc: int | None, out: list[str]) -> Check:
    said = "; ".join(line.split("stagevm-linux: ")[-1] for line in out if "stagectl" in line)
    return Check(rc == 0, f"stagectl attach: exit {rc}; " + said[:400])


def policy_phases(
    con: MariadbConsole, sock: str, expected: dict[int, str], n: int, checks: Checks
) -> dict[str, Probes]:
    """n queries under static, then under off and auto (switched through the
    API); the module's counts of each phase."""
    phases = {}
    for phase, seed in (("static", 1), ("off", 2), ("auto", 3)):
        if phase != "static":
            code, text = api(sock, "policy", phase)
            checks.check(code == 0, f"stagevm-remote policy {phase}: exit {code} {text[:120]}")
            time.sleep(1)
        before = probes(con)
        ok, detail = queries(n, expected, seed)
        after = probes(con)
        checks.check(ok, f"{phase}: {n} point selects: {detail}")
        if before and after:
            phases[phase] = {
                k: (after[k] - before[k])
                if k != "hits"
                else [a - b for a, b in zip(after["hits"], before["hits"], strict=False)]
                for k in after
            }
            log(
                f"{phase}: hits per stage {phases[phase]['hits']}, migrations {phases[phase]['migrations']}, "
                f"not counted {phases[phase]['not_counted']}"
            )
    return phases


def static_migrations(phases: dict[str, Probes]) -> Check:
    return Check(
        "static" in phases and phases["static"]["migrations"] > 0,
        f"migrations under static: {phases.get('static', {}).get('migrations')}",
    )


def off_no_migrations(phases: dict[str, Probes]) -> Check:
    return Check(
        "off" in phases and phases["off"]["migrations"] == 0,
        f"no migrations under off: {phases.get('off', {}).get('migrations')}",
    )


def refused(what: str, needle: str, rc: int | None, out: list[str]) -> Check:
    """A bad map's attach failed with a message holding `needle`."""
    said = " ".join(line for line in out if line.startswith("stagectl:"))
    return Check(rc == 1 and needle in said, f"refused {what}: exit {rc}, {said[:200]!r}")


def counts_equal(guest: dict[str, int], host: dict[str, int], stage_names: list[str]) -> Check:
    return Check(
        bool(guest) and all(guest[s] == host.get(s) for s in stage_names),
        "per-stage counts in the VMM's report equal the module's uprobe hits",
    )


def print_rates(phases: dict[str, Probes], stage_names: list[str], n: int) -> None:
    """Queries per second, uprobe hits and migrations per query, per phase."""
    print(
        "\n  phase                 queries/s   hits per query (" + ", ".join(stage_names) + ")   migrations per query"
    )
    for seed, name in (
        (1, "static, map attached"),
        (2, "off, map attached"),
        (3, "auto, map attached"),
        (5, "no map (detached)"),
    ):
        ph = phases.get(name.split(",")[0], {})
        per = ", ".join(f"{h / n:.2f}" for h in ph.get("hits", [])) or "-"
        mig = f"{ph['migrations'] / n:.2f}" if ph else "-"
        print(f"  {name:<21} {RATES.get(seed, float('nan')):>9.1f}   {per:>28}   {mig:>20}")
    print("  (guest kernel mode is emulated here, ~400 µs per system call: these figures show function, not speed)\n")


def uprobe_path(opts: argparse.Namespace, expected: dict[int, str], stage_names: list[str], checks: Checks) -> bool:
    """The uprobe path (steps 1-5 of the module docs); False when the VM or
    mariadbd did not come up."""
    sock, report_path = os.path.join(OUT, "api.sock"), os.path.join(OUT, "report.json")

    booted = boot_until_ready(stage_names, sock, report_path, opts.timeout, checks)
    if booted is None:
        return False
    proc, con, start, steps = booted

    checks.record(attached(*con.command(f"stagectl attach --map {GUEST_MAP} --binary {GUEST_BINARY}")))
    phases = policy_phases(con, sock, expected, opts.queries, checks)
    checks.record(static_migrations(phases))
    checks.record(off_no_migrations(phases))
    final = probes(con)

    # The maps that must be refused, while the real map is detached.
    con.command("stagectl detach")
    for name, (what, needle) in REFUSED.items():
        checks.record(
            refused(
                what,
                needle,
                *con.command(f"stagectl attach --map /mnt/etc/mysql/refused/{name}.stagemap --binary {GUEST_BINARY}"),
            )
        )
    con.command(f"stagectl attach --map {GUEST_MAP} --binary {GUEST_BINARY}")
    ok, detail = queries(20, expected, 4)
    checks.check(ok and con.command("alive")[0] == 0, f"mariadbd answers after the refusals: {detail}")
    # The module's hits start at 0 with each attach: the VMM counted both.
    again = probes(con)

    rc, _ = con.command("stagectl detach")
    checks.check(rc == 0, f"stagectl detach: exit {rc}")
    rc, _ = con.command("rmmod")
    checks.check(rc == 0, f"rmmod stagevm_agent: exit {rc}")
    ok, detail = queries(opts.queries, expected, 5)
    checks.check(ok, f"after detach and rmmod: {detail}")
    exit_vm(con, proc, checks)

    report = read_json(report_path)
    host = {s["name"]: s["events"] for s in (report.get("stage_channel") or {}).get("stages", [])}
    guest = {
        s: a + b
        for s, a, b in zip(stage_names, (final or {}).get("hits", []), (again or {}).get("hits", []), strict=False)
    }
    print("  stage   module uprobe hits (both attaches)   VMM report events")
    for s in stage_names:
        print(f"  {s:<7} {guest.get(s, '-'):>34}   {host.get(s, '-'):>17}")
    checks.record(counts_equal(guest, host, stage_names))
    checks.record(auto_decisions(report))
    print_rates(phases, stage_names, opts.queries)
    log(
        "steps: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items() if v is not None)
        + f", whole run {time.monotonic() - start:.1f} s"
    )
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--queries", type=int, default=200, help="point selects per phase")
    ap.add_argument("--timeout", type=float, default=900, help="seconds from boot to mariadbd ready")
    ap.add_argument(
        "--path",
        choices=("uprobes", "preload", "both"),
        default="both",
        help="stage mariadbd through uprobes (stagectl attach), the preload library, or both (two boots)",
    )
    opts = ap.parse_args()
    why = missing(
        OUT,
        ("vmlinux", "initramfs.cpio", "cmdline", "root.ext4", "expected.tsv"),
        "images/linux/mariadb/build.sh (just mariadb-image)",
    )
    if why:
        log(why)
        return 2
    why = netns_tap()
    if why:
        log(f"skipped: {why} (the clients reach the guest only through a tap in a namespace of ours)")
        return 0
    expected = {}
    with open(os.path.join(OUT, "expected.tsv")) as f:
        for row in f:
            expected[int(row.split("\t", 1)[0])] = row.rstrip("\n")
    with open(MAP) as f:
        stage_names = re.findall(r"^stage (\S+)", f.read(), re.M)
    checks = Checks()
    paths = [
        (name, fn) for name, fn in (("uprobes", uprobe_path), ("preload", preload_path)) if opts.path in (name, "both")
    ]
    for name, fn in paths:
        for attempt in (1, 2):
            mine = Checks()
            up = fn(opts, expected, stage_names, mine)
            crash = mariadbd_crash()
            if (mine.failed or not up) and crash and attempt == 1:
                log(
                    f"{name} path: mariadbd died of {crash}; booting once more with a fresh copy of the disk "
                    "(this machine's KVM zeroes a thread's memory now and then: images/linux/README.md, "
                    "'zeroed TLS'; the checks above are discarded)"
                )
                continue
            checks.failed += mine.failed
            if not up:
                return 1
            break
    log("all checks held" if not checks.failed else f"{len(checks.failed)} check(s) failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for vm in VMS:
            if vm.poll() is None:
                vm.terminate()
                vm.wait()
