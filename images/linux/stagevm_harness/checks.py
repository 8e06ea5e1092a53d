"""Checks and their record: each check is a named function returning a
`Check`; `Checks` prints each one as it is recorded and keeps the failures."""

from collections.abc import Sequence
from typing import NamedTuple

# Lines of each log printed when a check fails.
TAIL_LINES = 30


class Check(NamedTuple):
    """One check's outcome: whether it held, and what it checked (with the
    values it saw)."""

    ok: bool
    what: str


class Checks:
    """The checks of one run: prints `ok` or `FAIL` and what for each, and
    keeps what failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        """Records a check that held when `ok`."""
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failed.append(what)

    def record(self, check: Check) -> None:
        """Records the outcome of a named check."""
        self.check(check.ok, check.what)


def print_tails(logs: Sequence[tuple[str, str]], lines: int = TAIL_LINES) -> None:
    """Prints the last `lines` lines of each (name, text) (CI keeps only the
    harness's output)."""
    for name, text in logs:
        tail = text.rstrip("\n").split("\n")[-lines:]
        print(f"last {len(tail)} lines of {name}:")
        for line in tail:
            print(f"  | {line.rstrip()}")
