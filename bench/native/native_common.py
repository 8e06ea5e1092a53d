"""Shared by bench_native_server.py and native_model.py: paths, the cells,
the result types, and small helpers."""

import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CELLS = ["unpatched", "hooks", "srpt", "cohort"]

# One cell's steady window (`measure`, plus "gate" and "round"); one
# configuration's windows by cell; every configuration's, by
# "workload/threads/layout".
Measurement = dict[str, Any]
Rows = dict[str, list[Measurement]]
Results = dict[str, Rows]


def say(msg: str) -> None:
    print(f"[bench-native {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def med(xs: Sequence[float]) -> str:
    """Median (min-max) as text."""
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def cpu_total() -> tuple[int, int]:
    """(busy, total) jiffies of the machine, /proc/stat."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


def proc_cpu(pid: int) -> int:
    """utime+stime of a process (all its threads), jiffies."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return 0
    f = text[text.rindex(")") + 2 :].split()
    return int(f[11]) + int(f[12])


def run(cmd: Sequence[str | Path], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
