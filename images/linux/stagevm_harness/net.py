"""The test's own network: a network namespace with a tap in it (the VM's
virtio-net card goes on the tap), link-local addresses, and the peer on the
namespace's side of the tap. Nothing leaves the namespace."""

import ctypes
import os
import socket
import subprocess
import threading

TAP = "svmtap0"
GUEST_MAC = "52:54:00:5e:00:02"
PEER_ADDR, GUEST_ADDR, PREFIX = "169.254.77.1", "169.254.77.2", 16
# Bytes the peer sends the guest's echo server (tcp port 7, netecho.c).
ECHO_BYTES = 12 << 10
CLONE_NEWNET = 0x40000000


def netns_tap() -> str | None:
    """Moves this process into a new network namespace and makes TAP there
    with PEER_ADDR; returns None, or why it cannot be done here."""
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"cannot create a network namespace: {os.strerror(ctypes.get_errno())}"
    for args in (
        ["link", "set", "lo", "up"],
        ["tuntap", "add", "dev", TAP, "mode", "tap"],
        ["addr", "add", f"{PEER_ADDR}/{PREFIX}", "dev", TAP],
        ["link", "set", TAP, "up"],
    ):
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            return f"ip {' '.join(args)}: {r.stderr.strip()}"
    return None


class TcpEcho:
    """The peer's TCP echo round trip with the guest, in a thread of its own:
    connects to GUEST_ADDR port 7, sends ECHO_BYTES random bytes and reads
    them back. `ok` and `detail` say how it went once `join` returned (None
    while it runs)."""

    def __init__(self) -> None:
        self.ok: bool | None = None
        self.detail: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        data = os.urandom(ECHO_BYTES)
        try:
            with socket.create_connection((GUEST_ADDR, 7), timeout=120) as s:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                back = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    back += chunk
            self.ok = back == data
            self.detail = f"{len(back)} of {len(data)} bytes back, {'equal' if back == data else 'DIFFERENT'}"
        except OSError as e:
            self.ok = False
            self.detail = f"{type(e).__name__}: {e}"

    def join(self, timeout: float) -> None:
        """Waits up to `timeout` seconds for the round trip to end."""
        self._thread.join(timeout=timeout)
