"""test-linux's second boot (images/linux/test.py): the test image with
more RAM than fits below the 32-bit MMIO hole and its serial console on a
pty, typed into; and its checks, one named function each."""

import re
import subprocess
import time
from collections.abc import Callable
from typing import NamedTuple

from .checks import Check
from .vm import Console, launch_stagevm, pty_path

# RAM of the console boot: 256 MiB above the 3 GiB below the hole.
CONSOLE_MEMORY_MIB = 3328


class ConsoleRun(NamedTuple):
    """What the console boot left: the console lines read, the guest's
    MemTotal in kB, stagevm's exit code, the seconds to the shell and
    stagevm's stderr."""

    lines: list[str]
    mem_kib: int | None
    code: int | None
    ready_s: float | None
    stderr: str


def console_boot(out: str, timeout: float) -> ConsoleRun:
    """Boots the image with CONSOLE_MEMORY_MIB of RAM and --serial pty
    (stagevm.test=console), types into the pty and reads the guest's
    answers."""
    start = time.monotonic()
    proc = launch_stagevm(
        out,
        "stagevm.test=console",
        cpus=1,
        memory_mib=CONSOLE_MEMORY_MIB,
        serial="pty",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    err: list[str] = []
    path = pty_path(proc, err.append)
    if path is None:
        proc.wait()
        return ConsoleRun([], None, proc.returncode, None, "".join(err))
    con = Console(path, start)
    after = 0

    def wait_for(prefix: str, limit: float) -> tuple[float, str] | None:
        """The next line starting with prefix, with its second."""
        nonlocal after
        got = con.wait_for("^" + re.escape(prefix), limit, after)
        if got is None:
            return None
        after = got[0] + 1
        return con.lines[got[0]]

    mem, ready_s = None, None
    ready = wait_for("stagevm-linux: console ready", timeout)
    if ready:
        ready_s = ready[0]
        con.type("meminfo")
        got = wait_for("stagevm-linux: console: MemTotal:", 60)
        if got:
            mem = int(got[1].split("MemTotal:")[1].split()[0])
        con.type("hello stagevm")
        wait_for("stagevm-linux: console got 'hello stagevm'", 60)
        con.type("exit")
        wait_for("stagevm-linux: done", 60)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
    con.close()
    return ConsoleRun([line for _, line in con.lines], mem, proc.returncode, ready_s, "".join(err))


def console_shell(c: ConsoleRun) -> Check:
    return Check(
        c.ready_s is not None
        and any(line.startswith("stagevm-linux: console got 'hello stagevm'") for line in c.lines),
        "lines typed on the pty reach the guest's console shell and its answers come back",
    )


def ram_above_4g(c: ConsoleRun) -> Check:
    # More than all the RAM below the hole (3 GiB) can only come from above 4 GiB.
    return Check(
        c.mem_kib is not None and c.mem_kib * 1024 > 3072 << 20,
        f"the guest sees its RAM above 4 GiB: MemTotal {c.mem_kib} kB of {CONSOLE_MEMORY_MIB} MiB, "
        "more than the 3 GiB below the hole",
    )


def console_exit_status(c: ConsoleRun) -> Check:
    return Check(c.code == 0, f"the console boot ends with exit status 0 after 'exit' (got {c.code})")


def check_console_run(c: ConsoleRun, record: Callable[[Check], None]) -> None:
    """Records every check of the console boot in order."""
    for check in (console_shell, ram_above_4g, console_exit_status):
        record(check(c))
