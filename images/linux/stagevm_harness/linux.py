"""test-linux (images/linux/test.py): booting the Linux test image, and
every check of the staged boot as a named function returning a `Check` from
what the boot left (`StagedRun`); the second boot is in `console_boot`."""

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .checks import Check
from .net import ECHO_BYTES, GUEST_ADDR, PREFIX, TcpEcho
from .vm import LOG_LEVEL, launch_stagevm, logger, remote

log = logger("test-linux")

STAGES = ["parse", "plan", "execute"]
# Seconds the VM keeps running after a kernel panic (its last lines).
PANIC_GRACE_S = 2
# The hostile sequence's cases on stage maps (images/linux/hostile_agent.c;
# issue 36, items 7-10; issue 50 S8: the device's group and the owner's
# UNREGISTER), each of which must print "ok": the item, the case.
HOSTILE_AGENT_CASES = [
    (10, "a binary with 16384 SHT_SYMTAB headers over one table is refused within 1 s"),
    (8, "attach probes the file it resolved though the path is swapped in between"),
    (50, "nobody outside the device's group cannot open /dev/stagevm"),
    (7, "nobody's UNREGISTER while root's map is attached"),
    (7, "nobody's DETACH_MAP of root's map"),
    (7, "root's map stays attached after nobody's attempts"),
    (50, "nobody's UNREGISTER of root's registration"),
    (50, "root unregisters its own registration"),
    (9, "a failed attach gives the thread its probes moved its affinity back"),
    (9, "a failed attach leaves no thread reference in the module"),
]
# The guest's progress lines whose first time `boot` records.
MARKERS = re.compile(
    r"stagevm-linux: (user space reached|net done|module loaded|staged start|staged done|module unloaded|done)"
)


class Boot(NamedTuple):
    """How a boot ended: stagevm's exit code, the first second of each of
    MARKERS, the serial text and stagevm's output."""

    code: int | None
    times: dict[str, float]
    serial: str
    vmm: str


def boot(
    out: str,
    extra_cmdline: str,
    timeout: float,
    on_line: Callable[[str, float], None] | None = None,
    args: Sequence[str] = (),
    tag: str = "",
) -> Boot:
    """Starts stagevm on the image in `out` (2 vCPUs, 128 MiB, serial to a
    file); calls on_line(line, t) for each new serial line (t: seconds since
    start); stops the VM PANIC_GRACE_S after a guest kernel panic or after
    `timeout` seconds. Logs: out/serial{tag}.log, serial{tag}-times.log (each
    line with its wall-clock second), stagevm{tag}.log."""
    serial = os.path.join(out, f"serial{tag}.log")
    if os.path.exists(serial):
        os.remove(serial)
    vmm_path = os.path.join(out, f"stagevm{tag}.log")
    with open(vmm_path, "w") as vmmlog, open(os.path.join(out, f"serial{tag}-times.log"), "w") as stamped:
        start = time.monotonic()
        proc = launch_stagevm(
            out,
            extra_cmdline,
            cpus=2,
            memory_mib=128,
            serial=f"file={serial}",
            log_level=LOG_LEVEL,
            args=args,
            stdout=vmmlog,
            stderr=subprocess.STDOUT,
        )
        seen = 0
        panic_at = None
        times: dict[str, float] = {}
        text = ""
        while True:
            done = proc.poll() is not None
            t = time.monotonic() - start
            try:
                with open(serial, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
            except FileNotFoundError:
                text = ""
            lines = text.split("\n")
            complete = lines if done else lines[:-1]
            for line in complete[seen:]:
                line = line.rstrip("\r")
                m = MARKERS.match(line)
                if m and m.group(1) not in times:
                    times[m.group(1)] = t
                stamped.write(f"{t:7.1f} {line}\n")
                if on_line:
                    on_line(line, t)
                if "Kernel panic - not syncing" in line and panic_at is None:
                    log(f"the guest kernel panicked after {t:.1f} s: {line.strip()}")
                    panic_at = t
            seen = len(complete)
            if done:
                break
            if panic_at is not None and t > panic_at + PANIC_GRACE_S:
                # A panicked kernel never shuts down: stop now, not at the limit.
                log("stopping the VM after the panic")
                proc.terminate()
                proc.wait()
                break
            if t > timeout:
                log(f"time limit of {timeout} s: stopping the VM")
                proc.terminate()
                proc.wait()
                break
            time.sleep(0.2)
    with open(vmm_path) as f:
        return Boot(proc.returncode, times, text, f.read())


def zeroed_tls(serial: str) -> str | None:
    """The serial log's line showing this machine's zeroed-TLS defect
    (images/linux/README.md): a program of stagevm-tools killed by a fault at
    address 0 or 8, the C library's NULL TLS pointer dereferenced, in init
    (the kernel panics) or in a child (init prints the kernel's line); None
    when there is none."""
    m = re.search(
        r"^(?:init\[1\]|stagevm-linux: \w+: killed by signal 11; kernel: \S+\[\d+\]): "
        r"segfault at [08] ip [0-9a-f]+ sp [0-9a-f]+ error \d+ in stagevm-tools\[.*$",
        serial,
        re.M,
    )
    return m.group(0).strip() if m else None


class StagedWatch:
    """The staged boot's on_line: prints the guest's own lines, starts the
    TCP echo once the guest's echo server listens, and switches the policy to
    off through the API socket `sock` when the staged program waits for it."""

    PREFIXES = ("stagevm-linux:", "staged:", "hostile:", "netecho:", "stagectl:")

    def __init__(self, sock: str) -> None:
        self.sock = sock
        self.echo: TcpEcho | None = None
        # stagevm-remote policy off's exit code and output, once run.
        self.switched: tuple[int, str] | None = None

    def __call__(self, line: str, t: float) -> None:
        if line.startswith(self.PREFIXES):
            print(f"  [{t:6.1f} s] {line}", flush=True)
        if line.startswith("netecho: eth0") and "listening" in line and self.echo is None:
            self.echo = TcpEcho()
        if "staged: waiting for policy off" in line and self.switched is None:
            r = remote(self.sock, "policy", "off")
            self.switched = (r.returncode, r.stdout.strip() + r.stderr.strip())
            print(
                f"  [{t:6.1f} s] stagevm-remote policy off: exit {r.returncode} {r.stdout.strip()}{r.stderr.strip()}",
                flush=True,
            )


@dataclass
class StagedRun:
    """What the staged boot left to check."""

    boot: Boot
    # stagevm's JSON report ({} when it wrote none).
    report: dict[str, Any]
    # The CRC-32 of the disk the VM had, as 8 hex digits.
    disk_crc: str
    # stagevm-remote policy off's exit code and output, None if never run.
    switched: tuple[int, str] | None
    # The TCP echo with the guest, None if the guest's server never listened.
    echo: TcpEcho | None

    @property
    def serial(self) -> str:
        """The serial console's text."""
        return self.boot.serial

    @property
    def vmm(self) -> str:
        """stagevm's log."""
        return self.boot.vmm

    @property
    def times(self) -> dict[str, float]:
        """The first second of each progress line (MARKERS)."""
        return self.boot.times

    @property
    def channel(self) -> dict[str, Any]:
        """The report's stage_channel section."""
        return self.report.get("stage_channel") or {}


# -- What the guest printed -------------------------------------------------


@dataclass
class Phase:
    """One phase of the staged program (`staged: phase NAME: ...`)."""

    enters: dict[str, int]
    affinity: int
    cpu_changes: int
    dropped: int
    violations: int
    errors: int


def counts(text: str) -> dict[str, int]:
    """`a=1 b=2` as {"a": 1, "b": 2}."""
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split())}


def phases(serial: str) -> dict[str, Phase]:
    """The staged program's phases by name."""
    out = {}
    for m in re.finditer(
        r"^staged: phase (\w+): .*?; enters (.*?); affinity_calls (\d+) cpu_changes (\d+) dropped (\d+) "
        r"violations (\d+) errors (\d+)",
        serial,
        re.M,
    ):
        out[m.group(1)] = Phase(
            enters=counts(m.group(2)),
            affinity=int(m.group(3)),
            cpu_changes=int(m.group(4)),
            dropped=int(m.group(5)),
            violations=int(m.group(6)),
            errors=int(m.group(7)),
        )
    return out


def guest_enters(serial: str) -> tuple[dict[str, int], int] | None:
    """The staged program's enters per stage and the switches it dropped."""
    m = re.search(r"^staged: total enters (.*) exits=(\d+) dropped=(\d+)", serial, re.M)
    return (counts(m.group(1)), int(m.group(3))) if m else None


def guest_migrations(serial: str) -> tuple[dict[str, int], dict[str, int]] | None:
    """The staged program's migrations into and out of each stage."""
    m = re.search(r"^staged: migrations in (.*) out (.*); mode", serial, re.M)
    return (counts(m.group(1)), counts(m.group(2))) if m else None


def host_migrations(run: StagedRun) -> tuple[dict[str, int], dict[str, int]]:
    """The report's migrations into and out of each stage."""
    stages = run.channel.get("stages", [])
    return {s["name"]: s["migrations_in"] for s in stages}, {s["name"]: s["migrations_out"] for s in stages}


def guest_vcpus(serial: str) -> dict[int, dict[str, int]]:
    """The staged program's switches and exits per vCPU."""
    m = re.search(r"^staged: vcpus (.*)$", serial, re.M)
    out = {}
    for item in m.group(1).split() if m else []:
        v, kv = item.split(":")
        out[int(v)] = counts(kv.replace(",", " "))
    return out


def guest_requests(serial: str) -> tuple[int, int, str] | None:
    """The requests libstage began and timed, and whether latency was on."""
    m = re.search(r"^staged: requests begun (\d+) timed (\d+) \(latency (\w+)\)", serial, re.M)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


# -- The staged boot's checks, in the order they print ----------------------


def user_space_reached(run: StagedRun) -> Check:
    return Check("user space reached" in run.times, "user space reached")


def serial_output(run: StagedRun) -> Check:
    return Check(
        re.search(r"^stagevm-linux: user space reached", run.serial, re.M) is not None,
        "user-space output on the serial console (ACPI on, 2 vCPUs)",
    )


def disk_read(run: StagedRun) -> Check:
    m = re.search(r"disk /dev/vda crc32 ([0-9a-f]{8})", run.serial)
    return Check(
        m is not None and m.group(1) == run.disk_crc,
        f"the guest read its virtio-blk disk (CRC-32 {run.disk_crc})",
    )


def net_echo(run: StagedRun) -> Check:
    """Waits up to 5 s for the echo to end."""
    if run.echo:
        run.echo.join(timeout=5)
    ok, detail = (run.echo.ok, run.echo.detail) if run.echo else (None, None)
    return Check(
        ok is True and "netecho: echoed" in run.serial,
        f"the guest configured eth0 ({GUEST_ADDR}/{PREFIX}) and echoed {ECHO_BYTES} bytes over TCP to the peer "
        f"in the test's namespace ({detail or 'no connection made'})",
    )


def net_frames(run: StagedRun) -> Check:
    n = (run.report.get("nets") or [{}])[0]
    return Check(
        n.get("rx_packets", 0) > 0
        and n.get("tx_packets", 0) > 0
        and n.get("bad_chains") == 0
        and n.get("rx_errors") == 0
        and n.get("tx_errors") == 0,
        f"the report counts the card's frames ({n.get('rx_packets')} rx, {n.get('tx_packets')} tx), no errors",
    )


def module_loaded(run: StagedRun) -> Check:
    return Check(
        "module loaded" in run.times and "/dev/stagevm present" in run.serial,
        "module loaded, /dev/stagevm present",
    )


def hostile_sequence(run: StagedRun) -> Check:
    # The program's own summary decides (a kernel message may split a line).
    held = len(re.findall(r"^hostile: .*: ok \(", run.serial, re.M))
    return Check(
        re.search(r"^hostile: 0 case\(s\) failed", run.serial, re.M) is not None and "FAILED" not in run.serial,
        f"hostile sequence: every case held ({held} reported ok)",
    )


def hostile_agent_case(run: StagedRun, item: int, case: str) -> Check:
    """One of HOSTILE_AGENT_CASES."""
    m = re.search(rf"^hostile: {re.escape(case)}: (ok|FAILED) \((.*)\)\r?$", run.serial, re.M)
    source = "issue 50 S8" if item == 50 else f"issue 36 item {item}"
    return Check(
        m is not None and m.group(1) == "ok",
        f"hostile, stage maps ({source}): {case} ({m.group(2) if m else 'not reported'})",
    )


def symtab_bomb_refused(run: StagedRun) -> Check:
    return Check(
        "more than one SHT_SYMTAB section" in run.serial,
        "stagectl's refusal of the resolution bomb names the bound (one SHT_SYMTAB)",
    )


def kernel_log_clean(run: StagedRun) -> Check:
    m = re.search(r"kernel log: (\d+) oops/BUG/WARNING lines", run.serial)
    return Check(m is not None and m.group(1) == "0", "no oops, BUG or WARNING in the kernel log")


def unknown_stage_survived(run: StagedRun) -> Check:
    return Check(
        "REGISTER: stage 'parse': unknown stage; the guest declared hostile-a, hostile-b" in run.vmm,
        "a guest registering stage names the config does not list keeps running (warning logged)",
    )


def forged_counters_clamped(run: StagedRun) -> Check:
    return Check(
        "stage counters: impossible values clamped" in run.vmm,
        "forged stage counters are clamped by the VMM (warning logged), the VM keeps running",
    )


def _registered_mode(run: StagedRun) -> "re.Match[str] | None":
    return re.search(r"^staged: registered 3 stages .*, mode (\w+)", run.serial, re.M)


def register_accepted(run: StagedRun) -> Check:
    return Check(_registered_mode(run) is not None, "REGISTER accepted")


def counters_mode(run: StagedRun) -> Check:
    m = _registered_mode(run)
    return Check(
        m is not None and m.group(1) == "counters",
        f"libstage reports through the stage counters (mode {m and m.group(1)})",
    )


def static_migrations(run: StagedRun) -> Check:
    st = phases(run.serial).get("static")
    return Check(
        st is not None and st.affinity > 0,
        f"migrations under static: {st and st.affinity} affinity calls, {st and st.cpu_changes} vCPU changes",
    )


def off_no_migrations(run: StagedRun) -> Check:
    off = phases(run.serial).get("off")
    return Check(
        off is not None and off.affinity == 0,
        f"no staging migrations under off: {off and off.affinity} affinity calls "
        f"({off and off.cpu_changes} vCPU changes by the guest's own scheduler)",
    )


def no_violations(run: StagedRun) -> Check:
    ph = phases(run.serial)
    st, off = ph.get("static"), ph.get("off")
    return Check(
        st is not None
        and off is not None
        and st.violations == 0
        and off.violations == 0
        and st.errors == 0
        and off.errors == 0,
        "every stage ran only on vCPUs the stage map gave it (0 violations)",
    )


def policy_switched(run: StagedRun) -> Check:
    return Check(run.switched is not None and run.switched[0] == 0, "policy switched to off through the API socket")


def timeline_api(run: StagedRun) -> Check:
    timeline = run.report.get("sched", {}).get("timeline", [])
    return Check(
        any(e.get("source") == "api" and "policy off" in (e.get("decision") or "") for e in timeline),
        "the timeline records the change with source api",
    )


def print_stage_table(run: StagedRun) -> None:
    """Guest enters and migrations per stage beside the report's."""
    guest = (guest_enters(run.serial) or ({}, 0))[0]
    host = {s["name"]: s["events"] for s in run.channel.get("stages", [])}
    guest_mig = guest_migrations(run.serial) or ({}, {})
    host_mig = host_migrations(run)
    print("  stage        guest enters   VMM events   guest migrations in/out   VMM migrations in/out")
    for s in STAGES:
        gm = f"{guest_mig[0].get(s, '-')}/{guest_mig[1].get(s, '-')}"
        hm = f"{host_mig[0].get(s, '-')}/{host_mig[1].get(s, '-')}"
        print(f"  {s:<12} {guest.get(s, '-'):>12} {host.get(s, '-'):>12} {gm:>25} {hm:>23}")


def vmm_read_counters(run: StagedRun) -> Check:
    mode = run.channel.get("mode")
    return Check(mode == "counters", f"the VMM read a counters guest (report mode {mode!r})")


def stage_counts_equal(run: StagedRun) -> Check:
    guest, dropped = guest_enters(run.serial) or ({}, None)
    host = {s["name"]: s["events"] for s in run.channel.get("stages", [])}
    return Check(
        bool(guest)
        and all(guest.get(s) == host.get(s) for s in STAGES)
        and dropped == 0
        and run.channel.get("dropped") == 0,
        f"guest per-stage counts equal the VMM's report, 0 drops (VMM dropped {run.channel.get('dropped')})",
    )


def stage_migrations_equal(run: StagedRun) -> Check:
    guest, host = guest_migrations(run.serial), host_migrations(run)
    return Check(
        guest is not None and all(guest[i].get(s) == host[i].get(s) for i in (0, 1) for s in STAGES),
        "guest per-stage migrations in and out equal the VMM's report",
    )


def _host_vcpus(run: StagedRun) -> dict[int, dict[str, Any]]:
    return {v["index"]: v for v in run.channel.get("vcpus", [])}


def print_vcpu_table(run: StagedRun) -> None:
    """Guest switches and exits per vCPU beside the report's events and exits."""
    guest, host = guest_vcpus(run.serial), _host_vcpus(run)
    print("  vCPU   guest switches/exits   VMM events/exits")
    for v in sorted(set(guest) | set(host)):
        g, h = guest.get(v, {}), host.get(v, {})
        print(
            f"  {v:<6} {g.get('switches', '-'):>12}/{g.get('exits', '-'):<10} "
            f"{h.get('events', '-'):>9}/{h.get('exits', '-')}"
        )


def vcpu_counts_equal(run: StagedRun) -> Check:
    # Per vCPU: switches (enters and exits) and exits (requests).
    guest, host = guest_vcpus(run.serial), _host_vcpus(run)
    return Check(
        bool(guest)
        and all(
            g["switches"] == host.get(v, {}).get("events") and g["exits"] == host.get(v, {}).get("exits")
            for v, g in guest.items()
        ),
        "guest per-vCPU switches and exits equal the VMM's report",
    )


def no_counter_clamps(run: StagedRun) -> Check:
    clamps = run.channel.get("counter_clamps")
    return Check(clamps == 0, f"no counter clamped for the staged program (got {clamps})")


# Requests (ABI minor 4): libstage times them into the latency blocks
# (implicit begins under static, stage_request_begin() under off); the VMM's
# histogram holds every one it recorded, with no clamp.


def requests_timed(run: StagedRun) -> Check:
    begun, timed, latency = guest_requests(run.serial) or (None, None, None)
    return Check(
        latency == "on" and timed is not None and timed > 0,
        f"libstage times requests (latency blocks, host minor 4, TSC rate): {begun} begun, {timed} timed "
        f"(latency {latency})",
    )


def latency_histogram(run: StagedRun) -> Check:
    timed = (guest_requests(run.serial) or (None, None, None))[1]
    lat = run.channel.get("latency") or {}
    return Check(
        lat.get("samples", 0) > 0 and lat.get("samples") == timed and lat.get("clamps") == 0,
        f"the VMM's latency histogram holds the guest's timed requests: {lat.get('samples')} samples "
        f"(guest timed {timed}), {lat.get('clamps')} clamped",
    )


def print_latency(run: StagedRun) -> None:
    """The report's request latencies, when it has them."""
    lat = run.channel.get("latency") or {}
    if lat:
        print(
            f"  latency (VMM report): {lat.get('samples')} timed requests, p50 {lat.get('p50_us', 0):.1f} us, "
            f"p99 {lat.get('p99_us', 0):.1f} us, mean {lat.get('mean_us', 0):.1f} us, clamps {lat.get('clamps')}",
            flush=True,
        )


def module_unloaded(run: StagedRun) -> Check:
    return Check("module unloaded" in run.times, "module unloaded")


def exit_status(run: StagedRun) -> Check:
    return Check(run.boot.code == 0, f"exit status 0 (got {run.boot.code})")


def check_staged_run(run: StagedRun, net_skip: str | None, record: Callable[[Check], None]) -> None:
    """Records every check of the staged boot in order, with the tables
    between them; the network's checks only when net_skip is None."""
    for check in (user_space_reached, serial_output, disk_read):
        record(check(run))
    if net_skip:
        print(f"  skipped: the network check ({net_skip})", flush=True)
    else:
        record(net_echo(run))
        record(net_frames(run))
    for check in (module_loaded, hostile_sequence):
        record(check(run))
    for item, case in HOSTILE_AGENT_CASES:
        record(hostile_agent_case(run, item, case))
    for check in (
        symtab_bomb_refused,
        kernel_log_clean,
        unknown_stage_survived,
        forged_counters_clamped,
        register_accepted,
        counters_mode,
        static_migrations,
        off_no_migrations,
        no_violations,
        policy_switched,
        timeline_api,
    ):
        record(check(run))
    # Guest counts against the VMM's report.
    print_stage_table(run)
    for check in (vmm_read_counters, stage_counts_equal, stage_migrations_equal):
        record(check(run))
    print_vcpu_table(run)
    for check in (vcpu_counts_equal, no_counter_clamps, requests_timed, latency_histogram):
        record(check(run))
    print_latency(run)
    for check in (module_unloaded, exit_status):
        record(check(run))
