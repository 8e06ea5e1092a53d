"""The MariaDB guest and its clients, shared by both paths of `just
test-mariadb` (test.py: uprobes; preload_path.py: the preload library):
the image's files, booting it with a policy, the console's commands,
point selects checked against the table build.sh dumped, the API, and
how mariadbd died when it did."""

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
from stagevm_harness.net import GUEST_ADDR, GUEST_MAC, PREFIX, TAP
from stagevm_harness.vm import LOG_LEVEL, REPO, Console, launch_stagevm, logger, pty_path, remote

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
log = logger("test-mariadb")
# Queries per second of each phase, by the phase's seed.
RATES: dict[int, float] = {}
# The VM, stopped at exit whatever happened (an exception included).
VMS: list["subprocess.Popen[str]"] = []
# Every boot's console, the last one last.
CONSOLES: list["MariadbConsole"] = []


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


def api(sock: str, *args: str) -> tuple[int, str]:
    """stagevm-remote's exit code and output."""
    r = remote(sock, *args, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def boot(
    stage_names: list[str], sock: str, report_path: str, policy: str = 'name = "static"', cmdline: str = ""
) -> tuple["subprocess.Popen[str]", MariadbConsole | None, float]:
    """Starts the VM with `policy` (the `[policy]` section's lines), budgets
    for `stage_names`, `cmdline` added to the kernel's, its API on `sock`
    and its report to `report_path` (its stderr to OUT/stagevm.log, its
    console through the pty); returns stagevm, the console (None when
    stagevm ended before its pty was up) and the second it started."""
    stages_toml = os.path.join(OUT, "stages.toml")
    with open(stages_toml, "w") as f:
        f.write(f"[policy]\n{policy}\n" + "".join(f'[[stage]]\nname = "{s}"\n' for s in stage_names))
    for p in (sock, report_path):
        if os.path.exists(p):
            os.remove(p)
    # Each boot writes a copy of the root disk: a run changes its data
    # directory (and a crashed mariadbd leaves it to recover), and the
    # built image stays as build.sh made it.
    disk = os.path.join(OUT, "root-run.ext4")
    subprocess.run(["cp", "--sparse=always", os.path.join(OUT, "root.ext4"), disk], check=True)
    start = time.monotonic()
    vmmlog = open(os.path.join(OUT, "stagevm.log"), "w")  # written until the VM ends
    proc = launch_stagevm(
        OUT,
        f"stagevm.net={GUEST_ADDR}/{PREFIX} {cmdline}".strip(),
        cpus=2,
        memory_mib=512,
        serial="pty",
        log_level=LOG_LEVEL,
        args=["--disk", f"path={disk}", "--net", f"tap={TAP},mac={GUEST_MAC}"]
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
    con = MariadbConsole(path, start, os.path.join(OUT, "serial-times.log"))
    CONSOLES.append(con)
    return proc, con, start


def boot_until_ready(
    stage_names: list[str],
    sock: str,
    report_path: str,
    timeout: float,
    checks: Checks,
    policy: str = 'name = "static"',
    cmdline: str = "",
) -> tuple["subprocess.Popen[str]", MariadbConsole, float, dict[str, float | None]] | None:
    """`boot` with these arguments, then `wait_ready` within `timeout`:
    stagevm, its console, the second it started and each step's second;
    None (said, and a failed check when mariadbd was not ready, with the
    console's last lines) when the VM or mariadbd did not come up."""
    proc, con, start = boot(stage_names, sock, report_path, policy, cmdline)
    if con is None:
        log(f"stagevm ended before its console was up (exit {proc.returncode}); {OUT}/stagevm.log")
        return None
    steps = wait_ready(con, timeout)
    if steps is None:
        checks.check(False, f"mariadbd ready within {timeout:.0f} s of the start")
        proc.terminate()
        proc.wait()
        for _, line in con.lines[-TAIL_LINES:]:
            print(f"    | {line}")
        return None
    return proc, con, start, steps


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


def kernel_log_clean(got: "tuple[int, re.Match[str]] | None") -> Check:
    return Check(
        got is not None and got[1].group(1) == "0",
        f"kernel log: {got[1].group(1) if got else '?'} oops/BUG/WARNING lines",
    )


def exit_vm(con: MariadbConsole, proc: "subprocess.Popen[str]", checks: Checks) -> None:
    """`exit` on the console (mariadbd stopped, the kernel log's oops/BUG/
    WARNING lines counted), then stagevm's end: both checked."""
    con.type("exit")
    checks.record(kernel_log_clean(con.wait_for(r"kernel log: (-?\d+) oops", 300)))
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
    checks.check(proc.returncode == 0, f"stagevm exit status {proc.returncode}")


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


def mariadbd_crash() -> str | None:
    """How mariadbd died in the last boot ("signal 11 at …, thread pointer
    0x0"), from its own crash report on the console; None when it did not."""
    lines = [line for _, line in CONSOLES[-1].lines] if CONSOLES else []
    sig = next((m for line in lines if (m := re.search(r"mariadbd got signal (\d+)", line))), None)
    if sig is None:
        return None
    tp = next((m.group(1) for line in lines if (m := re.search(r"Thread pointer: (0x[0-9a-f]+)", line))), "?")
    frames = [line.strip() for line in lines if re.match(r"\s*mariadbd\(_Z", line)][:2]
    return f"signal {sig.group(1)} (thread pointer {tp}) in {' < '.join(frames) or 'an unknown frame'}"
