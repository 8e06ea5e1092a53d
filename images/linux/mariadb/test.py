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

Exit status: 0 when every check held, 1 when one failed, 2 when the image or
stagevm is missing. Without /dev/net/tun or the right to make a network
namespace it says "skipped" and why, and exits 0.
"""

import argparse
import os
import random
import re
import subprocess
import sys
import time
from typing import Any

# The harness package is in images/linux, beside this directory.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stagevm_harness.checks import TAIL_LINES, Check, Checks
from stagevm_harness.net import GUEST_ADDR, GUEST_MAC, PREFIX, TAP, netns_tap
from stagevm_harness.vm import LOG_LEVEL, REPO, Console, launch_stagevm, logger, missing, pty_path, read_json, remote

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", os.path.join(REPO, "target", "mariadb-image"))
# The map build.sh installed as GUEST_MAP (STAGEVM_MARIADB_MAP, e.g. the one
# stagevm-discover wrote; README "Stage your own server", step 2).
MAP = os.environ.get("STAGEVM_MARIADB_MAP") or os.path.join(HERE, "oltp_read_only.stagemap")
GUEST_MAP = "/mnt/etc/mysql/stages.map"
GUEST_BINARY = "/mnt/usr/sbin/mariadbd"
# The guest's progress lines up to its commands, each awaited in turn: the
# step's name, the pattern (which may match a failure too).
READY_STEPS = (
    ("user space", r"stagevm-linux: user space reached"),
    ("mariadbd started", r"mariadb: mariadbd started"),
    ("mariadbd ready", r"mariadb: (ready after|not ready|mariadbd ended|FAILED)|Kernel panic"),
    ("costs", r"mariadb: mariadbd at ready|FAILED"),
    ("commands", r"mariadb: commands|FAILED"),
)
# Maps that must be refused (refused/*.stagemap, on the root disk), each
# with a message naming what is wrong: the file's name, what it is, the
# words stagectl's message must hold.
REFUSED = {
    "missing-symbol": ("a missing symbol", "no_such_function_here"),
    "other-binary": ("a symbol of another binary", "__libc_start_main"),
    "empty-stage": ("an empty stage", "line 4: expected a name and at least one symbol"),
    "more-stages": ("more stages than registered", "the guest registered 2"),
}

log = logger("test-mariadb")
# Queries per second of each phase, by the phase's seed.
RATES: dict[int, float] = {}
# The VM, stopped at exit whatever happened (an exception included).
VMS: list["subprocess.Popen[str]"] = []
# `stagectl probes` as a dict: hits (a list, per stage), migrations, ...
Probes = dict[str, Any]


class MariadbConsole(Console):
    """The guest's console with mariadb.c's commands (a line each, answered
    by `mariadb: COMMAND -> STATUS`)."""

    def command(self, cmd: str, limit: float = 300) -> tuple[int | None, list[str]]:
        """Types `cmd`; returns (exit status or None, the console lines it
        printed)."""
        since = self.count()
        self.type(cmd)
        got = self.wait_for(r"stagevm-linux: mariadb: " + re.escape(cmd) + r" -> (\d+)", limit, since)
        return (int(got[1].group(1)) if got else None), self.text(since, got[0] if got else None)


def queries(n: int, expected: dict[int, str], seed: int) -> tuple[bool, str]:
    """n point selects over one client connection; (correct, detail)."""
    ids = random.Random(seed).sample(sorted(expected), min(n, len(expected)))
    sql = "".join(f"SELECT id,k,c,pad FROM sbtest1 WHERE id={i};" for i in ids)
    t0 = time.monotonic()
    r = subprocess.run(
        ["mariadb", "-h", GUEST_ADDR, "-u", "sbtest", "-psbtest", "-N", "-B", "--connect-timeout=60", "sbtest"]
        + ["-e", sql],
        capture_output=True,
        text=True,
        timeout=600,
    )
    dt = time.monotonic() - t0
    rows = r.stdout.splitlines()
    # zip stops at the shorter: a missing row is not correct.
    good = sum(1 for i, row in zip(ids, rows, strict=False) if row == expected[i])
    RATES.setdefault(seed, len(ids) / dt)
    err = " " + r.stderr.strip() if r.returncode else ""
    return (
        good == len(ids) and len(rows) == len(ids) and r.returncode == 0,
        f"{good} of {len(ids)} rows correct in {dt:.1f} s ({len(ids) / dt:.1f} queries/s){err}",
    )


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


def api(sock: str, *args: str) -> tuple[int, str]:
    """stagevm-remote's exit code and output."""
    r = remote(sock, *args, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def boot(
    stage_names: list[str], sock: str, report_path: str
) -> tuple["subprocess.Popen[str]", MariadbConsole | None, float]:
    """Starts the VM with budgets for `stage_names`, its API on `sock` and
    its report to `report_path` (its stderr to OUT/stagevm.log, its console
    through the pty); returns stagevm, the console (None when stagevm ended
    before its pty was up) and the second it started."""
    stages_toml = os.path.join(OUT, "stages.toml")
    with open(stages_toml, "w") as f:
        f.write('[policy]\nname = "static"\n' + "".join(f'[[stage]]\nname = "{s}"\n' for s in stage_names))
    for p in (sock, report_path):
        if os.path.exists(p):
            os.remove(p)
    start = time.monotonic()
    vmmlog = open(os.path.join(OUT, "stagevm.log"), "w")  # written until the VM ends
    proc = launch_stagevm(
        OUT,
        f"stagevm.net={GUEST_ADDR}/{PREFIX}",
        cpus=2,
        memory_mib=512,
        serial="pty",
        log_level=LOG_LEVEL,
        args=["--disk", f"path={os.path.join(OUT, 'root.ext4')}", "--net", f"tap={TAP},mac={GUEST_MAC}"]
        + ["--stages", stages_toml, "--api-socket", sock, "--report", report_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    VMS.append(proc)
    log(f"booting: {' '.join(proc.args)}")

    def to_log(line: str) -> None:
        vmmlog.write(line)
        vmmlog.flush()

    path = pty_path(proc, to_log)
    if path is None:
        proc.wait()
        return proc, None, start
    return proc, MariadbConsole(path, start, os.path.join(OUT, "serial-times.log")), start


def wait_ready(con: MariadbConsole, timeout: float) -> dict[str, float | None] | None:
    """The second of each of READY_STEPS; None when one did not come within
    `timeout` or mariadbd did not become ready."""
    steps: dict[str, float | None] = {}
    for key, pat in READY_STEPS:
        got = con.wait_for(pat, timeout)
        steps[key] = con.lines[got[0]][0] if got else None
        said = f" ({con.lines[got[0]][1].split('stagevm-linux: ')[-1]})" if got else ""
        log(f"{key}: {f'{steps[key]:.1f} s after start' if got else 'not reached'}" + said)
        if not got or key == "mariadbd ready" and "ready after" not in con.lines[got[0]][1]:
            return None
    return steps


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


def kernel_log_clean(got: "tuple[int, re.Match[str]] | None") -> Check:
    return Check(
        got is not None and got[1].group(1) == "0",
        f"kernel log: {got[1].group(1) if got else '?'} oops/BUG/WARNING lines",
    )


def counts_equal(guest: dict[str, int], host: dict[str, int], stage_names: list[str]) -> Check:
    return Check(
        bool(guest) and all(guest[s] == host.get(s) for s in stage_names),
        "per-stage counts in the VMM's report equal the module's uprobe hits",
    )


def auto_decisions(report: dict[str, Any]) -> Check:
    """After the switch to auto through the API, auto's own decisions."""
    timeline = (report.get("sched") or {}).get("timeline", [])
    at = next(
        (i for i, e in enumerate(timeline) if e.get("source") == "api" and "policy auto" in (e.get("decision") or "")),
        None,
    )
    own = (
        [e["decision"] for e in timeline[at:] if e.get("decision") and e.get("source") != "api"]
        if at is not None
        else []
    )
    return Check(
        at is not None and bool(own),
        f"the switch to auto and auto's own decisions in the timeline: {len(own)} after the switch"
        + (f", first {own[0]!r}, last {own[-1]!r}" if own else ""),
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


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--queries", type=int, default=200, help="point selects per phase")
    ap.add_argument("--timeout", type=float, default=900, help="seconds from boot to mariadbd ready")
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
    sock, report_path = os.path.join(OUT, "api.sock"), os.path.join(OUT, "report.json")

    proc, con, start = boot(stage_names, sock, report_path)
    if con is None:
        log(f"stagevm ended before its console was up (exit {proc.returncode}); {OUT}/stagevm.log")
        return 1
    steps = wait_ready(con, opts.timeout)
    if steps is None:
        checks.check(False, f"mariadbd ready within {opts.timeout:.0f} s of the start")
        proc.terminate()
        proc.wait()
        for _, line in con.lines[-TAIL_LINES:]:
            print(f"    | {line}")
        return 1

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
    con.type("exit")
    checks.record(kernel_log_clean(con.wait_for(r"kernel log: (-?\d+) oops", 300)))
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
    checks.check(proc.returncode == 0, f"stagevm exit status {proc.returncode}")

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
