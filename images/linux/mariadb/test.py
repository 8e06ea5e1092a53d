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
import importlib.util
import json
import os
import random
import re
import select
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
OUT = os.environ.get("OUT", os.path.join(REPO, "target", "mariadb-image"))
MAP = os.path.join(HERE, "oltp_read_only.stagemap")
GUEST_MAP = "/mnt/etc/mysql/stages.map"
GUEST_BINARY = "/mnt/usr/sbin/mariadbd"
_spec = importlib.util.spec_from_file_location("linux_test", os.path.join(HERE, "..", "test.py"))
linux = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(linux)
BIN = linux.BIN


def log(msg):
    print(f"test-mariadb: {msg}", flush=True)


class Console:
    """The guest's serial console through stagevm's pty: lines with the
    seconds since boot, and commands typed into it."""

    def __init__(self, path, start):
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        self.start, self.lines, self.buf = start, [], b""
        self.cond = threading.Condition()
        self.log = open(os.path.join(OUT, "serial-times.log"), "w")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            r, _, _ = select.select([self.fd], [], [], 0.5)
            if not r:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            with self.cond:
                self.buf += chunk
                while b"\n" in self.buf:
                    raw, self.buf = self.buf.split(b"\n", 1)
                    line = raw.decode("utf-8", "replace").strip("\r")
                    t = time.monotonic() - self.start
                    self.lines.append((t, line))
                    self.log.write(f"{t:7.1f} {line}\n")
                    self.log.flush()
                self.cond.notify_all()

    def wait_for(self, pattern, limit, since=0):
        """The first line from index `since` matching `pattern`, as (index,
        match); None after `limit` seconds."""
        deadline = time.monotonic() + limit
        rx = re.compile(pattern)
        with self.cond:
            while True:
                for i in range(since, len(self.lines)):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return i, m
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))

    def command(self, cmd, limit=300):
        """Types `cmd`; returns (exit status or None, the console lines it
        printed)."""
        with self.cond:
            since = len(self.lines)
        os.write(self.fd, cmd.encode() + b"\r")
        got = self.wait_for(r"stagevm-linux: mariadb: " + re.escape(cmd) + r" -> (\d+)", limit, since)
        with self.cond:
            out = [l for _, l in self.lines[since:(got[0] if got else len(self.lines))]]
        return (int(got[1].group(1)) if got else None), out


def queries(n, expected, seed):
    """n point selects over one client connection; (correct, detail)."""
    ids = random.Random(seed).sample(sorted(expected), min(n, len(expected)))
    sql = "".join(f"SELECT id,k,c,pad FROM sbtest1 WHERE id={i};" for i in ids)
    t0 = time.monotonic()
    r = subprocess.run(["mariadb", "-h", linux.GUEST_ADDR, "-u", "sbtest", "-psbtest", "-N", "-B",
                        "--connect-timeout=60", "sbtest", "-e", sql], capture_output=True, text=True, timeout=600)
    dt = time.monotonic() - t0
    rows = r.stdout.splitlines()
    good = sum(1 for i, row in zip(ids, rows) if row == expected[i])
    RATES.setdefault(seed, len(ids) / dt)
    return good == len(ids) and len(rows) == len(ids) and r.returncode == 0, \
        f"{good} of {len(ids)} rows correct in {dt:.1f} s ({len(ids) / dt:.1f} queries/s){' ' + r.stderr.strip() if r.returncode else ''}"


# Queries per second of each phase, by the phase's seed.
RATES = {}
# The VM, stopped at exit whatever happened (an exception included).
VMS = []


def probes(con):
    """`stagectl probes` as a dict: hits (per stage), migrations, ..."""
    rc, out = con.command("stagectl probes")
    for line in out:
        m = re.search(r"probes attached (\d+), hits ([\d ]+), counted (\d+), not counted (\d+), migrations (\d+), "
                      r"affinity failures (\d+)", line)
        if m:
            return dict(attached=int(m.group(1)), hits=[int(x) for x in m.group(2).split()],
                        counted=int(m.group(3)), not_counted=int(m.group(4)), migrations=int(m.group(5)),
                        affinity_failures=int(m.group(6)))
    return None


def api(sock, *args):
    r = subprocess.run([os.path.join(BIN, "stagevm-remote"), "--api-socket", sock, *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=200, help="point selects per phase")
    ap.add_argument("--timeout", type=float, default=900, help="seconds from boot to mariadbd ready")
    opts = ap.parse_args()
    why = linux.missing(OUT, ("vmlinux", "initramfs.cpio", "cmdline", "root.ext4", "expected.tsv"),
                        "images/linux/mariadb/build.sh (just mariadb-image)")
    if why:
        log(why)
        return 2
    why = linux.netns_tap()
    if why:
        log(f"skipped: {why} (the clients reach the guest only through a tap in a namespace of ours)")
        return 0
    expected = {}
    for row in open(os.path.join(OUT, "expected.tsv")):
        expected[int(row.split("\t", 1)[0])] = row.rstrip("\n")
    stage_names = re.findall(r"^stage (\S+)", open(MAP).read(), re.M)
    failed = []

    def check(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failed.append(what)

    stages_toml = os.path.join(OUT, "stages.toml")
    with open(stages_toml, "w") as f:
        f.write('[policy]\nname = "static"\n' + "".join(f'[[stage]]\nname = "{s}"\n' for s in stage_names))
    sock, report_path = os.path.join(OUT, "api.sock"), os.path.join(OUT, "report.json")
    for p in (sock, report_path):
        if os.path.exists(p):
            os.remove(p)
    cmdline = open(os.path.join(OUT, "cmdline")).read().strip() + f" stagevm.net={linux.GUEST_ADDR}/{linux.PREFIX}"
    cmd = [os.path.join(BIN, "stagevm"), "--kernel", os.path.join(OUT, "vmlinux"),
           "--initramfs", os.path.join(OUT, "initramfs.cpio"), "--cmdline", cmdline,
           "--cpus", "boot=2", "--memory", "size=512M", "--serial", "pty",
           "--disk", f"path={os.path.join(OUT, 'root.ext4')}", "--net", f"tap={linux.TAP},mac={linux.GUEST_MAC}",
           "--stages", stages_toml, "--api-socket", sock, "--report", report_path, "--log-level", "stagevm=info"]
    log(f"booting: {' '.join(cmd)}")
    start = time.monotonic()
    vmmlog = open(os.path.join(OUT, "stagevm.log"), "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    VMS.append(proc)
    path = None
    for line in proc.stderr:
        vmmlog.write(line)
        if line.startswith("stagevm: serial on pty "):
            path = line.split()[-1]
            break
    threading.Thread(target=lambda: [vmmlog.write(l) or vmmlog.flush() for l in proc.stderr], daemon=True).start()
    if path is None:
        proc.wait()
        log(f"stagevm ended before its console was up (exit {proc.returncode}); {OUT}/stagevm.log")
        return 1
    con = Console(path, start)
    steps = {}
    for key, pat in (("user space", r"stagevm-linux: user space reached"),
                     ("mariadbd started", r"mariadb: mariadbd started"),
                     ("mariadbd ready", r"mariadb: (ready after|not ready|mariadbd ended|FAILED)|Kernel panic"),
                     ("costs", r"mariadb: mariadbd at ready|FAILED"),
                     ("commands", r"mariadb: commands|FAILED")):
        got = con.wait_for(pat, opts.timeout)
        steps[key] = con.lines[got[0]][0] if got else None
        log(f"{key}: {'%.1f s after start' % steps[key] if got else 'not reached'}"
            + (f" ({con.lines[got[0]][1].split('stagevm-linux: ')[-1]})" if got else ""))
        if not got or key == "mariadbd ready" and "ready after" not in con.lines[got[0]][1]:
            check(False, f"mariadbd ready within {opts.timeout:.0f} s of the start")
            proc.terminate()
            proc.wait()
            for _, l in con.lines[-linux.TAIL_LINES:]:
                print(f"    | {l}")
            return 1

    rc, out = con.command(f"stagectl attach --map {GUEST_MAP} --binary {GUEST_BINARY}")
    check(rc == 0, f"stagectl attach: exit {rc}; " + "; ".join(l.split('stagevm-linux: ')[-1] for l in out if "stagectl" in l)[:400])
    phases = {}
    for phase, seed in (("static", 1), ("off", 2), ("auto", 3)):
        if phase != "static":
            code, text = api(sock, "policy", phase)
            check(code == 0, f"stagevm-remote policy {phase}: exit {code} {text[:120]}")
            time.sleep(1)
        before = probes(con)
        ok, detail = queries(opts.queries, expected, seed)
        after = probes(con)
        check(ok, f"{phase}: {opts.queries} point selects: {detail}")
        if before and after:
            phases[phase] = {k: (after[k] - before[k]) if k != "hits" else
                             [a - b for a, b in zip(after["hits"], before["hits"])] for k in after}
            log(f"{phase}: hits per stage {phases[phase]['hits']}, migrations {phases[phase]['migrations']}, "
                f"not counted {phases[phase]['not_counted']}")
    check("static" in phases and phases["static"]["migrations"] > 0,
          f"migrations under static: {phases.get('static', {}).get('migrations')}")
    check("off" in phases and phases["off"]["migrations"] == 0,
          f"no migrations under off: {phases.get('off', {}).get('migrations')}")
    final = probes(con)

    # Maps that must be refused (refused/*.stagemap, on the root disk), each
    # with a message naming what is wrong, while the real map is attached.
    bad = {
        "missing-symbol": ("a missing symbol", "no_such_function_here"),
        "other-binary": ("a symbol of another binary", "__libc_start_main"),
        "empty-stage": ("an empty stage", "line 4: expected a name and at least one symbol"),
        "more-stages": ("more stages than registered", "the guest registered 2"),
    }
    rc, _ = con.command("stagectl detach")
    for name, (what, needle) in bad.items():
        rc, out = con.command(f"stagectl attach --map /mnt/etc/mysql/refused/{name}.stagemap --binary {GUEST_BINARY}")
        said = " ".join(l for l in out if l.startswith("stagectl:"))
        check(rc == 1 and needle in said, f"refused {what}: exit {rc}, {said[:200]!r}")
    rc, out = con.command(f"stagectl attach --map {GUEST_MAP} --binary {GUEST_BINARY}")
    ok, detail = queries(20, expected, 4)
    check(ok and con.command("alive")[0] == 0, f"mariadbd answers after the refusals: {detail}")
    # The module's hits start at 0 with each attach: the VMM counted both.
    again = probes(con)

    rc, _ = con.command("stagectl detach")
    check(rc == 0, f"stagectl detach: exit {rc}")
    rc, _ = con.command("rmmod")
    check(rc == 0, f"rmmod stagevm_agent: exit {rc}")
    ok, detail = queries(opts.queries, expected, 5)
    check(ok, f"after detach and rmmod: {detail}")
    os.write(con.fd, b"exit\r")
    got = con.wait_for(r"kernel log: (-?\d+) oops", 300)
    check(got is not None and got[1].group(1) == "0", f"kernel log: {got[1].group(1) if got else '?'} oops/BUG/WARNING lines")
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
    check(proc.returncode == 0, f"stagevm exit status {proc.returncode}")

    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    host = {s["name"]: s["events"] for s in (report.get("stage_channel") or {}).get("stages", [])}
    guest = {s: a + b for s, a, b in zip(stage_names, (final or {}).get("hits", []), (again or {}).get("hits", []))}
    print("  stage   module uprobe hits (both attaches)   VMM report events")
    for s in stage_names:
        print(f"  {s:<7} {guest.get(s, '-'):>34}   {host.get(s, '-'):>17}")
    check(bool(guest) and all(guest[s] == host.get(s) for s in stage_names),
          "per-stage counts in the VMM's report equal the module's uprobe hits")
    timeline = (report.get("sched") or {}).get("timeline", [])
    at = next((i for i, e in enumerate(timeline) if e.get("source") == "api" and "policy auto" in (e.get("decision") or "")), None)
    own = [e["decision"] for e in timeline[at:] if e.get("decision") and e.get("source") != "api"] if at is not None else []
    check(at is not None and bool(own),
          f"the switch to auto and auto's own decisions in the timeline: {len(own)} after the switch"
          + (f", first {own[0]!r}, last {own[-1]!r}" if own else ""))
    print("\n  phase                 queries/s   hits per query (" + ", ".join(stage_names) + ")   migrations per query")
    for seed, name in ((1, "static, map attached"), (2, "off, map attached"), (3, "auto, map attached"),
                       (5, "no map (detached)")):
        ph = phases.get(name.split(",")[0], {})
        per = ", ".join(f"{h / opts.queries:.2f}" for h in ph.get("hits", [])) or "-"
        mig = f"{ph['migrations'] / opts.queries:.2f}" if ph else "-"
        print(f"  {name:<21} {RATES.get(seed, float('nan')):>9.1f}   {per:>28}   {mig:>20}")
    print("  (guest kernel mode is emulated here, ~400 µs per system call: these figures show function, not speed)\n")
    log("steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items() if v is not None)
        + f", whole run {time.monotonic() - start:.1f} s")
    log("all checks held" if not failed else f"{len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for vm in VMS:
            if vm.poll() is None:
                vm.terminate()
                vm.wait()
