"""Console at scale over real SSH, beside the same run over local Unix sockets (issue 14).

Runs ``benchmarks/console_scale.py`` twice at the same N, each in a process of its own, one
after the other: ``--transport local`` (the console's links are Unix sockets to the simulated
executors) and ``--transport ssh`` (every host an ssh host of the inventory, reached through
real OpenSSH sshd on loopback, host keys verified: one production ``SshTransport`` connection
per host, the link a streamlocal channel over it to the executor's socket; see
``scale_sshd.py``). Then it prints both side by side: console CPU, key latency, health
delivered and its lag, event loop stalls, the time to set every link up, and for ssh what sshd
spent (on the same cores here; each host's own in a fleet). The goals are the same for both:
the console within 25 % of one core, key to screen p95 within 100 ms.

    .venv/bin/python benchmarks/console_scale_ssh.py [--hosts 1000] [--seconds 30]
        [--presses 42] [--sshds 4] [--quick] [--json]

``--quick``: 50 hosts, a 10 s window, 14 presses per phase (a smoke check, about a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, at_least, at_most, emit, fmt_value

NAME = "console_scale_ssh"
HERE = Path(__file__).resolve().parent
SCALE = HERE / "console_scale.py"
CPU_TARGET_PCT = 25.0
LATENCY_TARGET_MS = 100.0
TRANSPORTS = (("socket", "local"), ("ssh", "ssh"))

ROWS: list[tuple[str, str, str]] = [
    # (figure in console_scale.py's output, {n}: the hosts; label here; goal: cpu, key or "")
    ("console CPU, {n} sims", "console CPU", "cpu"),
    (
        "console CPU at nominal rates (projected), {n} sims",
        "console CPU, projected to a core of its own",
        "",
    ),
    ("console waiting for a core, {n} sims", "console waiting for a core", ""),
    ("CPU outside redraws and updates", "console CPU outside redraws and updates", ""),
    ("console CPU, baseline (no traffic)", "console CPU, baseline (no links)", ""),
    ("key to screen p50, {n} sims", "key to screen p50", ""),
    ("key to screen p95, {n} sims", "key to screen p95", "key"),
    ("key to screen max, {n} sims", "key to screen max", ""),
    ("health observed by fleet", "health observed by fleet", "rate"),
    ("links up", "links up", "links"),
    ("health delivery lag p50", "health delivery lag p50", ""),
    ("health delivery lag p95", "health delivery lag p95", ""),
    ("event loop stall p99", "event loop stall p99", ""),
    ("event loop stall max", "event loop stall max", ""),
    ("  garbage collector", "garbage collector", ""),
    ("  longest collection", "longest garbage collection", ""),
    ("links set up, all {n} (wall)", "links set up, all (wall)", ""),
    ("link setup p50, each", "link setup p50, each", ""),
    ("link setup p95, each", "link setup p95, each", ""),
    ("console CPU setting up the links", "console CPU setting up the links", ""),
    ("sshd sessions held", "sshd sessions held", ""),
    ("sshd CPU, every process (the hosts' side)", "sshd CPU, every process (the hosts' side)", ""),
    ("sshd memory, every process (unique)", "sshd memory, every process (unique)", ""),
]


def goal(kind: str, value: float, n: int) -> tuple[str, bool | None]:
    if kind == "cpu":
        return f"<= {CPU_TARGET_PCT:g} %", at_most(value, CPU_TARGET_PCT)
    if kind == "key":
        return f"<= {LATENCY_TARGET_MS:g} ms", at_most(value, LATENCY_TARGET_MS)
    if kind == "rate":
        return f">= {0.95 * n:g}", at_least(value, 0.95 * n)
    if kind == "links":
        return f">= {n}", at_least(value, n)
    return "", None


def run_one(args: argparse.Namespace, transport: str) -> tuple[dict[str, Any] | None, str]:
    """One console_scale.py run; its JSON object (None if it failed) and its report's text."""
    cmd = [
        sys.executable, str(SCALE), "--sims", str(args.hosts), "--seconds", str(args.seconds),
        "--presses", str(args.presses), "--transport", transport, "--sshds", str(args.sshds),
        "--json",
    ]  # fmt: skip
    print(f"{NAME}: {transport}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=args.budget)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # it kills its executors and sshd, then exits
        out, err = proc.communicate()
        return None, f"{transport}: timed out after {args.budget:g} s\n{err[-2000:]}"
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.communicate()
        raise
    print(f"{NAME}: {transport}: done ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    # its human-readable detail: everything before the figures table
    detail = "\n".join(ln for ln in lines[:-1] if not ln.startswith(("|", "# ")))
    if proc.returncode != 0 or not lines:
        return None, f"{transport}: exit {proc.returncode}\n{detail}\n{err[-2000:]}"
    try:
        body = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None, f"{transport}: the last line is not JSON\n{detail}\n{err[-2000:]}"
    return body, detail


def values(body: dict[str, Any] | None, n: int) -> dict[str, float]:
    if body is None:
        return {}
    got = {f["name"]: f["value"] for f in body["figures"]}
    out: dict[str, float] = {}
    for theirs, _label, _goal in ROWS:
        v = got.get(theirs.format(n=n))
        if v is not None:
            out[theirs] = float(v)
    return out


def units(body: dict[str, Any] | None) -> dict[str, str]:
    return {f["name"]: f["unit"] for f in body["figures"]} if body else {}


def side_by_side(
    n: int, bodies: dict[str, dict[str, Any] | None]
) -> tuple[list[Figure], list[str]]:
    """Figures for the JSON (each transport's, named with it) and the table's lines."""
    figures: list[Figure] = []
    lines = [
        f"| figure, {n} hosts | socket | ssh | goal | met (socket / ssh) |",
        "|---|---|---|---|---|",
    ]
    vals = {k: values(b, n) for k, b in bodies.items()}
    unit_of = {**units(bodies.get("socket")), **units(bodies.get("ssh"))}
    for theirs, label, kind in ROWS:
        unit = unit_of.get(theirs.format(n=n), "")
        cells, mets = [], []
        for key, _ in TRANSPORTS:
            v = vals[key].get(theirs)
            if v is None:
                cells.append("")
                mets.append("")
                continue
            bar, ok = goal(kind, v, n)
            figures.append(Figure(f"{label}, {key}", v, unit, bar, ok))
            cells.append(f"{fmt_value(v)} {unit}")
            mets.append("" if ok is None else ("yes" if ok else "NO"))
        if not any(cells):
            continue
        bar = goal(kind, 0.0, n)[0]
        met = " / ".join(mets) if any(mets) else ""
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {bar} | {met} |")
    s, h = vals["socket"].get(ROWS[0][0]), vals["ssh"].get(ROWS[0][0])
    if s and h and math.isfinite(s) and math.isfinite(h) and s > 0:
        figures.append(Figure("console CPU, ssh / socket", round(h / s, 2), "x"))
    return figures, lines


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=None, help="hosts (default 1000)")
    p.add_argument("--seconds", type=float, default=None, help="loaded window (default 30)")
    p.add_argument("--presses", type=int, default=None, help="key presses per phase (default 42)")
    p.add_argument("--sshds", type=int, default=4, help="sshd listeners (default 4)")
    p.add_argument("--quick", action="store_true", help="50 hosts, 10 s, 14 presses")
    p.add_argument("--json", action="store_true", help="print the JSON line last")
    args = p.parse_args()
    hosts, seconds, presses = (50, 10.0, 14) if args.quick else (1000, 30.0, 42)
    args.hosts = hosts if args.hosts is None else args.hosts
    args.seconds = seconds if args.seconds is None else args.seconds
    args.presses = presses if args.presses is None else args.presses
    if args.hosts < 1 or args.seconds <= 0 or args.presses < 1 or args.sshds < 1:
        p.error("--hosts, --seconds, --presses and --sshds must be positive")
    # console_scale.py's own budget, and the time to set up N ssh connections
    args.budget = max(4.0, args.seconds / 3) + args.seconds + 4 * args.presses + 600 + 60
    return args


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    args = parse()
    bodies: dict[str, dict[str, Any] | None] = {}
    for key, transport in TRANSPORTS:
        body, detail = run_one(args, transport)
        bodies[key] = body
        print(f"--- {key} ({transport}) ---\n{detail}", flush=True)
    figures, table = side_by_side(args.hosts, bodies)
    print(f"\nconsole at scale, socket vs ssh, {args.hosts} hosts; load average {load_avg()}")
    print("\n".join(table), flush=True)
    failed = [k for k, b in bodies.items() if b is None]
    notes = (
        f"console_scale.py at {args.hosts} hosts, twice, one process each, one after the other: "
        f"--transport local (Unix sockets) then --transport ssh ({args.sshds} OpenSSH sshd "
        f"listeners on loopback, host keys verified against a known_hosts, one production "
        f"SshTransport connection per host, the link a streamlocal channel to the simulated "
        f"executor's socket; sshd on the same 2 shared cores); Heartbeat + 8-GPU Health at 1 Hz "
        f"per host; {args.seconds:g} s loaded window, {args.presses} key presses per phase; "
        f"load avg {load_avg()}" + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    print()
    emit(NAME, figures, notes, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
