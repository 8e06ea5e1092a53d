"""Launching stagevm on a Linux image and talking to the VM: the one
launcher of the Python harness, its serial console on a pty, its API
socket through stagevm-remote."""

import json
import os
import re
import select
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

# images/linux/stagevm_harness -> the repository.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.path.join(REPO, "target", "release")
# stagevm's --log-level for the logs the harness reads: the VMM's own info
# lines, and every crate's warnings (the stage device's are in the
# stage_device crate, which a filter of `stagevm=info` alone leaves out).
LOG_LEVEL = "warn,stagevm=info"


def logger(prefix: str) -> Callable[[str], None]:
    """A function printing each message as `prefix: message` at once."""

    def log(msg: str) -> None:
        print(f"{prefix}: {msg}", flush=True)

    return log


def missing(out: str, files: Sequence[str], build: str) -> str | None:
    """Why a run cannot start: the first of `files` missing from `out` (with
    `build`, the command that makes it) or of stagevm's binaries; None when
    every one is there."""
    for f in files:
        if not os.path.exists(os.path.join(out, f)):
            return f"{out}/{f} is missing: run {build}"
    for b in ("stagevm", "stagevm-remote"):
        if not os.path.exists(os.path.join(BIN, b)):
            return f"{BIN}/{b} is missing: cargo build --release -p stagevm --bins"
    return None


def read_json(path: str) -> dict[str, Any]:
    """The JSON object in `path` (stagevm's --report), {} when there is none."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def launch_stagevm(
    out: str,
    extra_cmdline: str,
    *,
    cpus: int,
    memory_mib: int,
    serial: str,
    args: Sequence[str] = (),
    log_level: str | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> "subprocess.Popen[str]":
    """Starts stagevm on the image in `out` (vmlinux, initramfs.cpio and the
    kernel command line in `cmdline`, followed by `extra_cmdline`) with
    `cpus` vCPUs, `memory_mib` MiB of RAM, `--serial serial`, `--log-level
    log_level` when given and then `args`; stdout and stderr go where
    subprocess.Popen sends them (text mode for pipes)."""
    with open(os.path.join(out, "cmdline")) as f:
        cmdline = f"{f.read().strip()} {extra_cmdline}".strip()
    cmd = [
        os.path.join(BIN, "stagevm"),
        "--kernel", os.path.join(out, "vmlinux"),
        "--initramfs", os.path.join(out, "initramfs.cpio"),
        "--cmdline", cmdline,
        "--cpus", f"boot={cpus}",
        "--memory", f"size={memory_mib}M",
        "--serial", serial,
        *(["--log-level", log_level] if log_level else []),
        *args,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)


def pty_path(proc: "subprocess.Popen[str]", sink: Callable[[str], object]) -> str | None:
    """For a stagevm started with `--serial pty` and stderr=PIPE: reads its
    stderr until it names the pty ("stagevm: serial on pty PATH"), hands
    every line to `sink`, and goes on handing the rest to `sink` from a
    thread of its own; returns PATH, or None when stagevm ended first."""
    assert proc.stderr is not None
    stderr = proc.stderr
    path = None
    for line in stderr:
        sink(line)
        if line.startswith("stagevm: serial on pty "):
            path = line.split()[-1]
            break

    def drain() -> None:
        for line in stderr:
            sink(line)

    threading.Thread(target=drain, daemon=True).start()
    return path


def remote(sock: str, *args: str, timeout: float | None = None) -> "subprocess.CompletedProcess[str]":
    """`stagevm-remote --api-socket sock args...`, its output captured."""
    cmd = [os.path.join(BIN, "stagevm-remote"), "--api-socket", sock, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class Console:
    """The guest's serial console through stagevm's pty: the lines read, each
    with the seconds since `start` (and written to `log_path` with them when
    given), and text typed into it. A thread of its own reads the pty until
    it fails (the VM ended) or `close()`."""

    def __init__(self, path: str, start: float, log_path: str | None = None) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        self.start = start
        self.lines: list[tuple[float, str]] = []
        self.ended = False
        self._buf = b""
        self._closing = False
        self._cond = threading.Condition()
        self._log = open(log_path, "w") if log_path else None  # closed by close()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closing:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.5)
                if not r:
                    continue
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self.ended = True
                    self._cond.notify_all()
                    return
                self._buf += chunk
                while b"\n" in self._buf:
                    raw, self._buf = self._buf.split(b"\n", 1)
                    line = raw.decode("utf-8", "replace").strip("\r")
                    t = time.monotonic() - self.start
                    self.lines.append((t, line))
                    if self._log:
                        self._log.write(f"{t:7.1f} {line}\n")
                        self._log.flush()
                self._cond.notify_all()

    def count(self) -> int:
        """The number of lines read so far (an index for `wait_for`)."""
        with self._cond:
            return len(self.lines)

    def wait_for(self, pattern: str, limit: float, since: int = 0) -> tuple[int, "re.Match[str]"] | None:
        """The first line from index `since` matching `pattern` (re.search),
        as (index, match); None after `limit` seconds or once the pty has
        ended without one."""
        deadline = time.monotonic() + limit
        rx = re.compile(pattern)
        with self._cond:
            while True:
                for i in range(since, len(self.lines)):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return i, m
                since = max(since, len(self.lines))
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    return None
                self._cond.wait(min(left, 1.0))

    def text(self, start: int, end: int | None = None) -> list[str]:
        """The text of lines `start` to `end` (to the last one read when None)."""
        with self._cond:
            return [line for _, line in self.lines[start:end]]

    def type(self, text: str) -> None:
        """Types `text` and a carriage return."""
        os.write(self.fd, text.encode() + b"\r")

    def close(self) -> None:
        """Stops the reader and closes the pty (and the log)."""
        self._closing = True
        self._thread.join()
        os.close(self.fd)
        if self._log:
            self._log.close()
